#include "shardscope/sim/lowering/work_limits.h"

#include <algorithm>

#include <fmt/format.h>

#include "shardscope/sim/lowering/lowering.h"

namespace shardscope::sim {
namespace {

constexpr double kBytesPerGiB = 1073741824.0;
constexpr double kBytesPerMiB = 1048576.0;

// ---- Thresholds (policy, not model constants; docs/PLAN.md "How big a run may be").
// Memory: a warning past 1 GiB, a refusal past 8 GiB (a laptop's or a CI runner's memory;
// --force for a machine that has more).
constexpr int64_t kWarnMemoryBytes = int64_t{1} << 30;
constexpr int64_t kMaxMemoryBytes = int64_t{8} << 30;
// trace.json: a warning past 256 MiB, a refusal past 2 GiB. Perfetto's UI holds a trace in
// the browser's memory, "2gb is typical" as its limit, and a trace's in-memory form is 2-4x its
// file (perfetto.dev/docs/visualization/large-traces): a larger trace opens only with
// trace_processor --httpd.
constexpr int64_t kWarnTraceBytes = int64_t{256} << 20;
constexpr int64_t kMaxTraceBytes = int64_t{2} << 30;

// A grad_accum_steps up to this is lowered whole (the real lowering is no bigger than the
// two samples the extrapolation would need).
constexpr int32_t kSampledGradAccum = 2;

// ---- Sizes per op. ESTIMATES, measured with this build on examples/grad-accum/
// every-micro-batch.yaml (Llama-3-8B, FSDP2, 32 ranks, one program; GNU time's maximum RSS)
// at grad_accum_steps 100, 200 and 400 (1,147,341, 2,294,541 and 4,588,941 ops):
// - simulate --trace-ranks none: 1,033,812 KB at 200, 1,899,928 KB at 400: 386.5 bytes per op
//   (the schedule, the engine's per-op durations, the allocator's outcome log);
constexpr int64_t kBytesPerOp = 390;
// - simulate --trace-ranks 0: 5,337,940 KB at 100, 10,510,224 KB at 200: 4,617 bytes per op in
//   all, so 4,230 more per op of a traced rank (its memory history and trace spans);
constexpr int64_t kBytesPerTracedOp = 4230;
// - its trace.json: 330,998,711 bytes at 100, 666,647,011 at 200: 290 bytes per traced op;
constexpr int64_t kTraceBytesPerTracedOp = 290;
// - its memory snapshots (.json and .pickle): 301,434,977 bytes at 100: 263 per traced op.
constexpr int64_t kSnapshotBytesPerTracedOp = 263;

int64_t OpsOf(const traces::Schedule& schedule) {
  int64_t ops = 0;
  for (const traces::Program& program : schedule.programs) ops += static_cast<int64_t>(program.ops.size());
  return ops;
}

// a * b and a + b for non-negative terms, held at INT64_MAX: the estimates only compare.
int64_t SaturatingMul(int64_t a, int64_t b) {
  int64_t product = 0;
  return __builtin_mul_overflow(a, b, &product) ? INT64_MAX : product;
}
int64_t SaturatingAdd(int64_t a, int64_t b) {
  int64_t sum = 0;
  return __builtin_add_overflow(a, b, &sum) ? INT64_MAX : sum;
}

std::string Size(int64_t bytes) {
  return bytes >= int64_t{1} << 30 ? fmt::format("{:.1f} GiB", static_cast<double>(bytes) / kBytesPerGiB)
                                   : fmt::format("{:.0f} MiB", static_cast<double>(bytes) / kBytesPerMiB);
}

// The knob's name alone ("training.grad_accum_steps" of "training.grad_accum_steps 1000000").
std::string Knob(const std::string& driver) { return driver.substr(0, driver.find(' ')); }

int64_t LargestProgram(const traces::Schedule& schedule) {
  int64_t ops = 0;
  for (const traces::Program& program : schedule.programs) ops = std::max<int64_t>(ops, program.ops.size());
  return ops;
}

}  // namespace

WorkEstimate ScheduleWork(const traces::Schedule& schedule, std::string driver) {
  WorkEstimate work;
  work.ops = OpsOf(schedule);
  work.rank_ops = LargestProgram(schedule);
  work.bytes = SaturatingMul(work.ops, kBytesPerOp);
  work.driver = std::move(driver);
  return work;
}

std::string PlanWorkDriver(const Plan& plan) {
  return fmt::format("training.grad_accum_steps {}", plan.training.grad_accum_steps);
}

StatusOr<WorkEstimate> EstimatePlanWork(const Plan& plan) {
  const int64_t steps = plan.training.grad_accum_steps;
  WorkEstimate work;
  work.driver = PlanWorkDriver(plan);
  if (steps <= kSampledGradAccum) return work;  // lowered whole: ScheduleWork after it
  // Variants lower the same way; the samples leave them out, and each adds about one program.
  Plan sample = WithoutDivergence(plan);
  sample.training.grad_accum_steps = 1;
  SHARDSCOPE_ASSIGN_OR_RETURN(traces::Schedule one, LowerPlan(sample));
  sample.training.grad_accum_steps = 2;
  SHARDSCOPE_ASSIGN_OR_RETURN(traces::Schedule two, LowerPlan(sample));
  const int64_t base = OpsOf(one);
  const int64_t per_step = std::max<int64_t>(0, OpsOf(two) - base);
  int64_t ops = SaturatingAdd(base, SaturatingMul(per_step, steps - 1));
  const int64_t rank_base = LargestProgram(one);
  work.rank_ops = SaturatingAdd(
      rank_base, SaturatingMul(std::max<int64_t>(0, LargestProgram(two) - rank_base), steps - 1));
  const auto programs = static_cast<int64_t>(std::max<size_t>(one.programs.size(), 1));
  const auto variants = static_cast<int64_t>(plan.divergence.variants.size());
  ops = SaturatingAdd(ops, SaturatingMul(ops / programs, variants));
  work.ops = ops;
  work.bytes = SaturatingMul(ops, kBytesPerOp);
  return work;
}

Status CheckWork(const WorkEstimate& work, const std::string& source, const WorkLimits& limits) {
  const std::string what =
      fmt::format("{}: {} lowers to about {} ops (~{} in memory)", source, work.driver, work.ops, Size(work.bytes));
  if (work.bytes > kMaxMemoryBytes && !limits.force) {
    return Status::InvalidInput(fmt::format("{}, more than the {} limit; lower {}, or pass {} to go on", what,
                                            Size(kMaxMemoryBytes), Knob(work.driver), limits.force_flag));
  }
  if (work.bytes > kWarnMemoryBytes && limits.warn) limits.warn(fmt::format("warning: {}", what));
  return Status::Ok();
}

SimulateEstimate EstimateSimulate(const WorkEstimate& work, int64_t traced_ranks) {
  SimulateEstimate estimate;
  // The largest program stands for every traced rank (a traced rank runs one program).
  const int64_t traced_ops = SaturatingMul(work.rank_ops, std::max<int64_t>(traced_ranks, 0));
  estimate.memory_bytes = SaturatingAdd(work.bytes, SaturatingMul(traced_ops, kBytesPerTracedOp));
  estimate.trace_bytes = SaturatingMul(traced_ops, kTraceBytesPerTracedOp);
  estimate.snapshot_bytes = SaturatingMul(traced_ops, kSnapshotBytesPerTracedOp);
  return estimate;
}

Status CheckSimulate(const SimulateEstimate& estimate, int64_t traced_ranks, const std::string& driver,
                     const WorkLimits& limits) {
  const std::string memory = fmt::format("the simulation would hold about {} in memory with {} traced rank(s)",
                                         Size(estimate.memory_bytes), traced_ranks);
  const std::string trace = fmt::format("trace.json would be about {} ({} traced rank(s); memory snapshots {} more)",
                                        Size(estimate.trace_bytes), traced_ranks, Size(estimate.snapshot_bytes));
  const std::string fixes = fmt::format("trace fewer ranks ({}), lower {}, or pass {}", limits.fewer_ranks,
                                        Knob(driver), limits.force_flag);
  if (!limits.force && estimate.memory_bytes > kMaxMemoryBytes) {
    return Status::InvalidInput(fmt::format("{}, more than the {} limit; {} to go on", memory, Size(kMaxMemoryBytes),
                                            fixes));
  }
  if (!limits.force && estimate.trace_bytes > kMaxTraceBytes) {
    return Status::InvalidInput(fmt::format(
        "{}, more than the {} Perfetto's UI can open in a browser; {} to write it anyway (then open it with "
        "trace_processor --httpd)",
        trace, Size(kMaxTraceBytes), fixes));
  }
  if (!limits.warn) return Status::Ok();
  if (estimate.memory_bytes > kWarnMemoryBytes) limits.warn(fmt::format("warning: {}", memory));
  if (estimate.trace_bytes > kWarnTraceBytes) {
    limits.warn(fmt::format("warning: {}: Perfetto's UI may be slow; {} traces fewer", trace, limits.trace_ranks_flag));
  }
  return Status::Ok();
}

}  // namespace shardscope::sim

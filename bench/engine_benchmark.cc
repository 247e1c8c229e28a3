// Simulator speed: raw engine throughput (simulated ops per second on one core) and a
// whole Llama-3-70B FSDP2 step at 128, 1,024 and 8,192 GPUs, lowering and simulation timed
// separately, with the process's peak RSS. Run one world size per process for a clean RSS:
//   build/bin/shardscope_bench --benchmark_filter='Llama70bFsdp2Step/gpus:1024/allocator:1'
#include <sys/resource.h>

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <array>
#include <chrono>

#include "shardscope/sim/engine/engine.h"
#include "shardscope/sim/lowering/lowering.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/sim/report/report.h"

namespace shardscope::sim {
namespace {

double PeakRssMiB() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // Linux reports KiB
}

// A schedule of `ranks` ranks, each issuing `blocks` repetitions of: two kernels on the
// compute stream, an event handing over to a comm stream, an all-gather there, and a wait
// back: the op mix of an FSDP forward without the allocations.
traces::Schedule SyntheticSchedule(int32_t ranks, int32_t blocks) {
  traces::Schedule schedule;
  traces::Program program;
  program.name = "synthetic";
  program.streams = {{"compute", 0}, {"comm", -1}};
  program.events = {"ready", "done"};
  program.comm_slots = {"world"};
  int64_t id = 0;
  auto add = [&](traces::OpPayload payload) {
    traces::Op op;
    op.id = id++;
    op.payload = payload;
    program.ops.push_back(op);
  };
  for (int32_t b = 0; b < blocks; ++b) {
    add(traces::KernelOp{0, traces::FixedDurationDesc{20'000}});
    add(traces::EventRecordOp{0, 0});
    add(traces::StreamWaitEventOp{1, 0});
    traces::CollectiveOp coll;
    coll.type = traces::CollectiveType::kAllGather;
    coll.stream = 1;
    coll.bytes = 1 << 20;
    add(coll);
    add(traces::EventRecordOp{1, 1});
    add(traces::KernelOp{0, traces::FixedDurationDesc{30'000}});
    add(traces::StreamWaitEventOp{0, 1});
  }
  schedule.programs.push_back(std::move(program));
  traces::Communicator world{"world", {}};
  for (int32_t r = 0; r < ranks; ++r) {
    world.ranks.push_back(r);
    schedule.ranks.push_back({0, {}});
  }
  schedule.communicators.push_back(world);
  (void)schedule.ResolveBindings();
  return schedule;
}

class FixedCosts : public CostProvider {
 public:
  int64_t KernelNs(const traces::ComputeDesc& desc) const override {
    return std::get<traces::FixedDurationDesc>(desc).duration_ns;
  }
  int64_t MemcpyNs(traces::MemcpyKind, int64_t bytes) const override { return bytes; }
  CollectiveCost Collective(traces::CollectiveType, int64_t bytes, int32_t) const override {
    CollectiveCost cost;
    cost.duration_ns = bytes / 100;
    return cost;
  }
};

void BM_SimulatedOpsPerSecond(benchmark::State& state) {
  const auto ranks = static_cast<int32_t>(state.range(0));
  const traces::Schedule schedule = SyntheticSchedule(ranks, 2000);
  FixedCosts costs;
  EngineConfig config;
  config.reduce_symmetry = false;  // the engine's own throughput: every rank simulated
  config.launch_overhead_ns = 4000;
  config.compute_slowdown = 0.1;
  config.comm_slowdown = 0.1;
  int64_t ops = 0;
  for (auto _ : state) {
    auto result = Simulate(schedule, costs, config, nullptr);
    if (!result.ok()) state.SkipWithError(result.status().message().c_str());
    ops += result->ops_executed;
    benchmark::DoNotOptimize(result->makespan_ns);
  }
  state.SetItemsProcessed(ops);
  state.counters["ops_per_step"] = static_cast<double>(ops) / static_cast<double>(state.iterations());
}
BENCHMARK(BM_SimulatedOpsPerSecond)->Arg(8)->Arg(64)->Unit(benchmark::kMillisecond);

// Llama-3-70B, FSDP2 full shard, seq 8192, micro-batch 1, full activation checkpointing (without
// it every rank runs out of memory, as on real H100s), on `gpus` H100s (dgx-h100 nodes).
// range(1): 1 = the caching allocator simulated (the default), 0 = allocations ignored, to
// measure what the allocator model costs side by side. range(2): 1 = one rank simulated per
// class of identical ranks (the default, EngineConfig::reduce_symmetry), 0 = every rank (the
// full simulation, `--all-ranks`), side by side.
void BM_Llama70bFsdp2Step(benchmark::State& state) {
  const auto gpus = static_cast<int32_t>(state.range(0));
  const bool with_allocator = state.range(1) != 0;
  const bool reduced = state.range(2) != 0;
  const std::string yaml = fmt::format(
      "model: llama3-70b\n"
      "cluster: {{preset: dgx-h100, nodes: {}}}\n"
      "strategy: fsdp2\n"
      "training: {{seq_len: 8192, micro_batch_size: 1, activation_checkpointing: full}}\n",
      gpus / 8);
  StatusOr<Plan> plan = ParsePlan(yaml, "<bench>");
  if (!plan.ok()) {
    state.SkipWithError(plan.status().message().c_str());
    return;
  }
  double lower_s = 0, simulate_s = 0;
  int64_t ops = 0, events = 0;
  int32_t simulated = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    StatusOr<traces::Schedule> schedule = LowerPlan(*plan);
    const auto t1 = std::chrono::steady_clock::now();
    if (!schedule.ok()) {
      state.SkipWithError(schedule.status().message().c_str());
      return;
    }
    StatusOr<SimulationSetup> setup = SetupFromSchedule(*schedule, "<bench>");
    ClusterCostProvider costs(*schedule, setup->cluster);
    EngineConfig config = EngineConfigFor(*setup, *schedule);
    config.memory.enabled = with_allocator;
    config.reduce_symmetry = reduced;
    auto result = Simulate(*schedule, costs, config, nullptr);
    const auto t2 = std::chrono::steady_clock::now();
    if (!result.ok()) {
      state.SkipWithError(result.status().message().c_str());
      return;
    }
    lower_s += std::chrono::duration<double>(t1 - t0).count();
    simulate_s += std::chrono::duration<double>(t2 - t1).count();
    ops += result->ops_executed;
    events += result->events_processed;
    simulated = result->symmetry.simulated_ranks;
    benchmark::DoNotOptimize(result->makespan_ns);
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["simulated_ranks"] = simulated;
  state.counters["events_per_op"] = static_cast<double>(events) / static_cast<double>(ops);
  state.SetItemsProcessed(ops);
  state.counters["lower_ms"] = lower_s / n * 1e3;
  state.counters["simulate_ms"] = simulate_s / n * 1e3;
  state.counters["ops_per_rank"] = static_cast<double>(ops) / n / gpus;
  state.counters["peak_rss_MiB"] = PeakRssMiB();
}
BENCHMARK(BM_Llama70bFsdp2Step)
    ->ArgsProduct({{128, 1024, 8192}, {1, 0}, {0}})            // the full simulation, as before
    ->ArgsProduct({{128, 1024, 8192, 16384, 131072}, {1}, {1}})  // reduced (the default)
    ->Args({16384, 1, 0})                                      // 16,384 in full, beside it
    ->ArgNames({"gpus", "allocator", "reduced"})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);

// Lowering alone, per strategy, for Llama-3-70B on `gpus` H100s: what the strategy's
// lowering costs beside the simulation it feeds (BM_Llama70bFsdp2Step times both).
// range(1) indexes kLoweringPlans.
constexpr std::array<std::string_view, 6> kLoweringPlans = {
    "strategy: fsdp2\n",
    "strategy: fsdp2\nfsdp2: {mesh: {replicate: REPLICAS}}\n",
    "strategy: fsdp1\n",
    "strategy: zero2\n",
    "strategy: zero3\n",
    "strategy: ddp\n",
};
constexpr std::array<std::string_view, 6> kLoweringPlanNames = {"fsdp2", "hsdp", "fsdp1", "zero2", "zero3", "ddp"};

void BM_LowerLlama70b(benchmark::State& state) {
  const auto gpus = static_cast<int32_t>(state.range(0));
  const auto which = static_cast<size_t>(state.range(1));
  std::string strategy(kLoweringPlans[which]);
  if (const size_t at = strategy.find("REPLICAS"); at != std::string::npos) {
    strategy.replace(at, 8, std::to_string(gpus / 8));
  }
  const std::string yaml = fmt::format(
      "model: llama3-70b\n"
      "cluster: {{preset: dgx-h100, nodes: {}}}\n"
      "training: {{seq_len: 8192, micro_batch_size: 1, activation_checkpointing: full}}\n{}",
      gpus / 8, strategy);
  StatusOr<Plan> plan = ParsePlan(yaml, "<bench>");
  if (!plan.ok()) {
    state.SkipWithError(plan.status().message().c_str());
    return;
  }
  state.SetLabel(std::string(kLoweringPlanNames[which]));
  int64_t ops = 0;
  for (auto _ : state) {
    StatusOr<traces::Schedule> schedule = LowerPlan(*plan);
    if (!schedule.ok()) {
      state.SkipWithError(schedule.status().message().c_str());
      return;
    }
    ops = static_cast<int64_t>(schedule->ProgramOf(0).ops.size());
    benchmark::DoNotOptimize(schedule->ranks.data());
  }
  state.counters["ops_per_rank"] = static_cast<double>(ops);
}
BENCHMARK(BM_LowerLlama70b)
    ->ArgsProduct({{8192}, {0, 1, 2, 3, 4, 5}})
    ->ArgNames({"gpus", "plan"})
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace shardscope::sim

BENCHMARK_MAIN();

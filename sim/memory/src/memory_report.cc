// Memory breakdown at the reserved peak, and the fit search over micro-batch size and
// activation checkpointing (memory_report.h).
#include "shardscope/sim/memory/memory_report.h"

#include <algorithm>
#include <bit>
#include <utility>

#include <fmt/format.h>

#include "shardscope/sim/lowering/lowering.h"

namespace shardscope::sim {
namespace {

// The lowering's naming convention (memory_report.h). Prefixes end in '.', so "grad." never
// matches "grad_shard.x" by accident; bare names match exactly.
struct CategoryRule {
  std::string_view pattern;
  bool prefix;  // true: the name starts with `pattern`; false: equals it
  MemoryCategory category;
};

constexpr CategoryRule kCategoryRules[] = {
    {"param_shard.", true, MemoryCategory::kParameters},
    {"params", false, MemoryCategory::kParameters},
    {"params.", true, MemoryCategory::kParameters},  // DDP: one per parameter
    {"unsharded.", true, MemoryCategory::kParameters},
    {"weight_cast.", true, MemoryCategory::kParameters},
    {"grad.", true, MemoryCategory::kGradients},
    {"grad_tmp.", true, MemoryCategory::kGradients},
    {"grad_shard.", true, MemoryCategory::kGradients},
    {"exp_avg.", true, MemoryCategory::kOptimizerStates},
    {"exp_avg_sq.", true, MemoryCategory::kOptimizerStates},
    {"exp_avg", false, MemoryCategory::kOptimizerStates},
    {"exp_avg_sq", false, MemoryCategory::kOptimizerStates},
    // Activations and their gradients, and the kernels' workspaces (ActivationPlan's names).
    {"act.", true, MemoryCategory::kActivations},
    {"all_gather_output.", true, MemoryCategory::kCommunicationBuffers},
    {"cast.", true, MemoryCategory::kCommunicationBuffers},
    {"reduce_scatter_input.", true, MemoryCategory::kCommunicationBuffers},
    {"reduce_scatter_output.", true, MemoryCategory::kCommunicationBuffers},
    {"bucket.", true, MemoryCategory::kCommunicationBuffers},
    // FSDP1: the low-precision shard all-gathered from; ZeRO/fairscale reduction buckets;
    // the checkpoint's consolidation buffers.
    {"mp_shard.", true, MemoryCategory::kCommunicationBuffers},
    {"reduce_scatter_bucket.", true, MemoryCategory::kCommunicationBuffers},
    {"consolidate.", true, MemoryCategory::kCommunicationBuffers},
    // Gradients in every form the lowerings name them: low-precision per parameter, flat,
    // fp32 accumulation buffers, reduce-dtype copies, padded inputs to a reduction.
    {"grad_lowp.", true, MemoryCategory::kGradients},
    {"grad_flat.", true, MemoryCategory::kGradients},
    {"grad_new.", true, MemoryCategory::kGradients},
    {"grad_padded.", true, MemoryCategory::kGradients},
    {"grad_reduce_dtype.", true, MemoryCategory::kGradients},
    {"grad_norm.", true, MemoryCategory::kGradients},
    {"new_sharded_grad.", true, MemoryCategory::kGradients},
    {"fp32_grads.", true, MemoryCategory::kGradients},
    {"fp32_flat_grad.", true, MemoryCategory::kGradients},
};

// Names no rule lists fall back on the words they contain (split at '.' and '_'), so a
// lowering's new buffer lands in a sensible category rather than "other".
constexpr CategoryRule kCategoryFallbacks[] = {
    {"grad", true, MemoryCategory::kGradients},
    {"grads", true, MemoryCategory::kGradients},
    {"bucket", true, MemoryCategory::kCommunicationBuffers},
    {"gather", true, MemoryCategory::kCommunicationBuffers},
    {"scatter", true, MemoryCategory::kCommunicationBuffers},
    {"unsharded", true, MemoryCategory::kParameters},
};

bool HasWord(std::string_view name, std::string_view word) {
  size_t start = 0;
  while (start <= name.size()) {
    const size_t end = name.find_first_of("._", start);
    const std::string_view piece = name.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
    if (piece == word) return true;
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return false;
}

// Wants exactly the given ranks and records nothing itself: the engine keeps the live
// tensors at the reserved peak for the ranks an observer wants (with record_history).
class MemoryRanksObserver : public EngineObserver {
 public:
  MemoryRanksObserver(int32_t world_size, const std::vector<int32_t>& ranks)
      : wanted_(static_cast<size_t>(world_size), false) {
    for (int32_t rank : ranks) wanted_[static_cast<size_t>(rank)] = true;
  }
  bool WantsRank(int32_t rank) const override {
    return rank >= 0 && static_cast<size_t>(rank) < wanted_.size() && wanted_[static_cast<size_t>(rank)];
  }
  void OnHostSpan(const HostSpan& /*span*/) override {}
  void OnDeviceSpan(const DeviceSpan& /*span*/) override {}

 private:
  std::vector<bool> wanted_;
};

constexpr double kBytesPerGiB = double(int64_t{1} << 30);

StatusOr<SimulationResult> RunSimulation(const traces::Schedule& schedule, const SimulationSetup& setup,
                                         bool record_history, EngineObserver* observer) {
  SHARDSCOPE_ASSIGN_OR_RETURN(std::unique_ptr<CostProvider> costs, MakeCostProvider(schedule, setup));
  EngineConfig config = EngineConfigFor(setup, schedule);
  config.memory.record_history = record_history;
  return Simulate(schedule, *costs, config, observer);
}

// ---- Fit search

// Lowers and simulates one variant of the plan; summarizes it as a candidate.
StatusOr<FitCandidate> TryCandidate(const Plan& base, int64_t micro_batch, ActivationCheckpointing ac,
                                    int64_t* capacity_bytes) {
  Plan plan = base;
  plan.training.micro_batch_size = micro_batch;
  plan.training.activation_checkpointing = ac;
  const std::string what = fmt::format("micro_batch_size {}, activation_checkpointing {}", micro_batch,
                                       ActivationCheckpointingName(ac));
  auto schedule = LowerPlan(plan);
  if (!schedule.ok()) return schedule.status().WithContext(what);
  auto setup = SetupFromSchedule(*schedule, plan.source);
  if (!setup.ok()) return setup.status().WithContext(what);
  // Only statistics are needed, so nothing is recorded (histories grow with the run).
  auto result = RunSimulation(*schedule, *setup, /*record_history=*/false, nullptr);
  if (!result.ok()) return result.status().WithContext(what);

  FitCandidate c;
  c.micro_batch_size = micro_batch;
  c.ac = ac;
  const RankStats* first_oom = nullptr;
  int32_t first_oom_rank = -1;
  int64_t capacity = -1;
  for (size_t r = 0; r < result->ranks.size(); ++r) {
    const RankMemory& m = result->ranks[r].memory;
    c.peak_reserved_bytes = std::max(c.peak_reserved_bytes, m.stats.reserved_bytes_peak);
    c.num_alloc_retries += m.stats.num_alloc_retries;
    capacity = capacity < 0 ? m.capacity_bytes : std::min(capacity, m.capacity_bytes);
    if (m.oom) {
      ++c.oom_ranks;
      if (first_oom == nullptr) {
        first_oom = &result->ranks[r];
        first_oom_rank = static_cast<int32_t>(r);
      }
    }
  }
  if (capacity_bytes != nullptr) *capacity_bytes = std::max<int64_t>(capacity, 0);
  c.fits = c.oom_ranks == 0 && c.num_alloc_retries == 0 && !result->hung;
  // A job that runs out of memory while the framework builds it never reaches the step.
  const traces::ReportMemoryPhases phases = MemoryPhasesOf(*schedule, *setup, *result);
  for (const traces::ReportMemoryClass& phase : phases.classes) {
    if (!phase.init_oom) continue;
    c.fits = false;
    c.init_oom = true;
    c.note = fmt::format("init phase OOM on ranks {} ({}): {} needed {:.2f} GiB more", phase.ranks,
                         phases.init_framework, phase.init_oom_at, phase.init_oom_requested_bytes / kBytesPerGiB);
    break;
  }
  // A rank that stopped makes the makespan the time of the failure, not a step time.
  if (c.oom_ranks == 0 && !result->hung) {
    c.step_time_ns = result->makespan_ns;
    if (c.step_time_ns > 0) {
      c.tokens_per_second_per_gpu = static_cast<double>(setup->tokens_per_rank_step) * 1e9 /
                                    static_cast<double>(c.step_time_ns);
    }
  }
  if (c.init_oom) {
    c.step_time_ns = 0;
    c.tokens_per_second_per_gpu = 0;
  } else if (first_oom != nullptr) {
    const OomInfo& oom = *first_oom->memory.oom;
    c.note = fmt::format("OOM on {} rank(s); rank {} at op {}: tried {:.2f} GiB, {:.2f} GiB free", c.oom_ranks,
                         first_oom_rank, oom.op_id, oom.requested_bytes / kBytesPerGiB,
                         oom.free_bytes / kBytesPerGiB);
  } else if (result->hung) {
    c.note = "the simulation hung (no OOM): see `shardscope simulate`";
  } else if (c.num_alloc_retries > 0) {
    c.note = fmt::format("{} alloc retries: the allocator frees its cache and retries (thrashing)",
                         c.num_alloc_retries);
  }
  return c;
}

std::string NotFitReason(const FitCandidate& c) {
  return fmt::format("micro_batch_size {} with activation_checkpointing {} does not fit: {}", c.micro_batch_size,
                     ActivationCheckpointingName(c.ac), c.note);
}

// ceil(log2(n)) for n >= 1: bisection steps left over a gap of n.
int CeilLog2(int64_t n) {
  return n <= 1 ? 0 : static_cast<int>(std::bit_width(static_cast<uint64_t>(n - 1)));
}

StatusOr<FitResult> SearchMicroBatch(const Plan& base, int64_t max_micro_batch, const FitProgress& progress) {
  FitResult fit;
  fit.dimension = FitDimension::kMicroBatchSize;
  const ActivationCheckpointing ac = base.training.activation_checkpointing;
  const int doublings = CeilLog2(max_micro_batch) + 1;  // 1, 2, 4, ..., max (clamped)
  int64_t last_fit = 0;    // largest micro-batch known to fit (0: none yet)
  int64_t first_fail = 0;  // smallest micro-batch known not to fit (0: none yet)

  // Candidates still to try, given what is known: the doublings left, or the bisection steps.
  auto remaining = [&]() -> int {
    if (first_fail == 0) return last_fit == max_micro_batch ? 0 : doublings - 1 - CeilLog2(last_fit);
    return last_fit == 0 ? 0 : CeilLog2(first_fail - last_fit);
  };
  auto try_one = [&](int64_t micro_batch) -> Status {
    int64_t capacity = 0;
    SHARDSCOPE_ASSIGN_OR_RETURN(FitCandidate c, TryCandidate(base, micro_batch, ac, &capacity));
    fit.capacity_bytes = capacity;
    if (c.fits) {
      last_fit = std::max(last_fit, micro_batch);
    } else {
      first_fail = first_fail == 0 ? micro_batch : std::min(first_fail, micro_batch);
    }
    fit.candidates.push_back(std::move(c));
    const int done = static_cast<int>(fit.candidates.size());
    if (progress) progress(done, done + remaining(), fit.candidates.back());
    return Status::Ok();
  };

  // Doubling: the cost of a miss is one simulation, and memory grows about linearly with the
  // micro-batch, so doubling brackets the limit in log2(max) runs.
  for (int64_t mb = 1;; mb = std::min(mb * 2, max_micro_batch)) {
    SHARDSCOPE_RETURN_IF_ERROR(try_one(mb));
    if (first_fail != 0 || mb == max_micro_batch) break;
  }
  // Bisection between the last fit and the first failure.
  while (first_fail != 0 && last_fit != 0 && first_fail - last_fit > 1) {
    SHARDSCOPE_RETURN_IF_ERROR(try_one(last_fit + (first_fail - last_fit) / 2));
  }
  if (last_fit == 0) {
    fit.reason = NotFitReason(fit.candidates.front());
  } else {
    for (size_t i = 0; i < fit.candidates.size(); ++i) {
      if (fit.candidates[i].micro_batch_size == last_fit) fit.best = i;
    }
  }
  return fit;
}

StatusOr<FitResult> SearchActivationCheckpointing(const Plan& base, const FitProgress& progress) {
  FitResult fit;
  fit.dimension = FitDimension::kActivationCheckpointing;
  const ActivationCheckpointing kOrder[] = {ActivationCheckpointing::kNone, ActivationCheckpointing::kFull};
  for (ActivationCheckpointing ac : kOrder) {
    int64_t capacity = 0;
    SHARDSCOPE_ASSIGN_OR_RETURN(FitCandidate c, TryCandidate(base, base.training.micro_batch_size, ac, &capacity));
    fit.capacity_bytes = capacity;
    fit.candidates.push_back(std::move(c));
    if (progress) progress(static_cast<int>(fit.candidates.size()), 2, fit.candidates.back());
  }
  for (size_t i = 0; i < fit.candidates.size(); ++i) {
    const FitCandidate& c = fit.candidates[i];
    if (c.fits && (!fit.best || c.step_time_ns < fit.candidates[*fit.best].step_time_ns)) fit.best = i;
  }
  if (!fit.best) {
    // Full checkpointing is the most frugal option tried: its failure says the most.
    fit.reason = NotFitReason(fit.candidates.back());
  }
  return fit;
}

// The GPU outside the allocator and the init phase of `b.rank`.
void AddDeviceMemory(const traces::Schedule& schedule, const SimulationSetup& setup, MemoryBreakdown& b) {
  const DeviceMemorySetup& d = setup.device_memory;
  b.usable_bytes = setup.cluster.gpu.usable_bytes;
  b.cuda_context_bytes = d.cuda_context_bytes;
  b.nccl_bytes = d.NcclBytes(b.rank);
  b.cublas_workspace_bytes = d.cublas_workspace_bytes * d.cublas_workspaces;
  b.cublas_in_allocator = d.cublas_in_allocator;
  auto others = setup.memory.reserved_by_others_per_rank.find(b.rank);
  b.reserved_by_others_bytes =
      others != setup.memory.reserved_by_others_per_rank.end() ? others->second : setup.memory.reserved_by_others_bytes;
  // Workspaces the allocator serves are reserved blocks no tensor of the program names.
  if (b.cublas_in_allocator && b.peak_reserved_bytes >= b.cublas_workspace_bytes) {
    b.allocator_overhead_bytes -= b.cublas_workspace_bytes;
  }
  b.init = SimulateInitPhase(schedule, setup, b.rank);
}

}  // namespace

std::string_view MemoryCategoryName(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::kParameters: return "parameters";
    case MemoryCategory::kGradients: return "gradients";
    case MemoryCategory::kOptimizerStates: return "optimizer_states";
    case MemoryCategory::kActivations: return "activations";
    case MemoryCategory::kCommunicationBuffers: return "communication_buffers";
    case MemoryCategory::kOther: return "other";
  }
  return "other";
}

MemoryCategory CategoryOfTensor(std::string_view name) {
  for (const CategoryRule& rule : kCategoryRules) {
    if (rule.prefix ? name.starts_with(rule.pattern) : name == rule.pattern) return rule.category;
  }
  for (const CategoryRule& rule : kCategoryFallbacks) {
    if (HasWord(name, rule.pattern)) return rule.category;
  }
  return MemoryCategory::kOther;
}

MemoryBreakdown BreakdownAtPeak(const traces::Schedule& schedule, int32_t rank, const RankMemory& memory) {
  MemoryBreakdown b;
  b.rank = rank;
  b.capacity_bytes = memory.capacity_bytes;
  b.peak_reserved_bytes = memory.stats.reserved_bytes_peak;
  b.peak_allocated_bytes = memory.stats.allocated_bytes_peak;
  b.allocated_at_reserved_peak = memory.allocated_at_reserved_peak;
  const traces::Program& program = schedule.ProgramOf(rank);
  int64_t live = 0;
  // What the memory holds when it is fullest (the allocated peak); the rest of the reserved
  // peak is the allocator's: rounding, fragmentation and blocks cached for other streams.
  for (const auto& [tensor, bytes] : memory.live_at_allocated_peak) {
    const std::string_view name = tensor >= 0 && static_cast<size_t>(tensor) < program.tensors.size()
                                      ? std::string_view(program.tensors[static_cast<size_t>(tensor)])
                                      : std::string_view();
    b.bytes_by_category[static_cast<size_t>(CategoryOfTensor(name))] += bytes;
    live += bytes;
  }
  b.allocator_overhead_bytes = b.peak_reserved_bytes - live;
  b.headroom_bytes = b.capacity_bytes - b.peak_reserved_bytes;
  b.num_alloc_retries = memory.stats.num_alloc_retries;
  b.num_ooms = memory.stats.num_ooms;
  b.oom = memory.oom;
  return b;
}

StatusOr<std::vector<MemoryBreakdown>> SimulateMemory(const traces::Schedule& schedule, const SimulationSetup& setup,
                                                      std::vector<int32_t> ranks) {
  std::vector<int32_t> unique;
  for (int32_t rank : ranks) {
    if (rank < 0 || rank >= schedule.world_size()) {
      return Status::InvalidInput(
          fmt::format("{}: rank {} is outside the world of {} ranks", setup.label, rank, schedule.world_size()));
    }
    if (std::find(unique.begin(), unique.end(), rank) == unique.end()) unique.push_back(rank);
  }
  MemoryRanksObserver observer(schedule.world_size(), unique);
  SHARDSCOPE_ASSIGN_OR_RETURN(SimulationResult result,
                              RunSimulation(schedule, setup, /*record_history=*/true, &observer));
  std::vector<MemoryBreakdown> breakdowns;
  breakdowns.reserve(unique.size());
  for (int32_t rank : unique) {
    breakdowns.push_back(BreakdownAtPeak(schedule, rank, result.ranks[static_cast<size_t>(rank)].memory));
    AddDeviceMemory(schedule, setup, breakdowns.back());
  }
  return breakdowns;
}

StatusOr<std::vector<MemoryBreakdown>> SimulateMemoryDefaultRanks(const traces::Schedule& schedule,
                                                                  const SimulationSetup& setup) {
  const int32_t world = schedule.world_size();
  if (world == 0) return std::vector<MemoryBreakdown>{};
  const bool one_run = world <= kMemoryRanksInOneRun;
  std::vector<int32_t> all;
  if (one_run) {
    for (int32_t r = 0; r < world; ++r) all.push_back(r);
  }
  MemoryRanksObserver observer(world, all);
  SHARDSCOPE_ASSIGN_OR_RETURN(SimulationResult result,
                              RunSimulation(schedule, setup, /*record_history=*/one_run, &observer));

  std::vector<int32_t> chosen = {0};
  int32_t highest = 0;
  int32_t first_oom = -1;
  for (int32_t r = 0; r < world; ++r) {
    const RankMemory& m = result.ranks[static_cast<size_t>(r)].memory;
    if (m.stats.reserved_bytes_peak > result.ranks[static_cast<size_t>(highest)].memory.stats.reserved_bytes_peak) {
      highest = r;
    }
    if (m.oom && first_oom < 0) first_oom = r;
  }
  if (highest != 0) chosen.push_back(highest);
  const bool oom_shown = std::any_of(chosen.begin(), chosen.end(), [&](int32_t r) {
    return result.ranks[static_cast<size_t>(r)].memory.oom.has_value();
  });
  if (first_oom >= 0 && !oom_shown) chosen.push_back(first_oom);

  if (!one_run) return SimulateMemory(schedule, setup, chosen);
  std::vector<MemoryBreakdown> breakdowns;
  for (int32_t rank : chosen) {
    breakdowns.push_back(BreakdownAtPeak(schedule, rank, result.ranks[static_cast<size_t>(rank)].memory));
    AddDeviceMemory(schedule, setup, breakdowns.back());
  }
  return breakdowns;
}

std::string_view FitDimensionName(FitDimension dimension) {
  switch (dimension) {
    case FitDimension::kMicroBatchSize: return "micro_batch_size";
    case FitDimension::kActivationCheckpointing: return "activation_checkpointing";
  }
  return "micro_batch_size";
}

std::optional<FitDimension> ParseFitDimension(std::string_view name) {
  for (FitDimension d : {FitDimension::kMicroBatchSize, FitDimension::kActivationCheckpointing}) {
    if (name == FitDimensionName(d)) return d;
  }
  return std::nullopt;
}

std::string_view ActivationCheckpointingName(ActivationCheckpointing ac) {
  return ac == ActivationCheckpointing::kFull ? "full" : "none";
}

StatusOr<FitResult> FitSearch(const Plan& base, FitDimension dimension, int64_t max_micro_batch,
                              const FitProgress& progress) {
  if (dimension == FitDimension::kActivationCheckpointing) return SearchActivationCheckpointing(base, progress);
  if (max_micro_batch < 1) {
    return Status::InvalidInput(fmt::format("{}: the largest micro-batch to try must be at least 1, got {}",
                                            base.source, max_micro_batch));
  }
  return SearchMicroBatch(base, max_micro_batch, progress);
}

}  // namespace shardscope::sim

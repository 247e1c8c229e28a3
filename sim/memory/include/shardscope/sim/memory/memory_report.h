// Where a rank's device memory goes at its peak, and which batch sizes fit.
//
// BreakdownAtPeak splits the reserved memory of a rank at the moment it peaked into what the
// live tensors requested (by category: parameters, gradients, optimizer states,
// activations, communication buffers, other) and what the caching allocator holds beyond
// them (rounding, fragmentation, cached free blocks). SimulateMemory runs a schedule and
// returns that breakdown for the ranks asked for.
//
// FitSearch answers "what is the largest micro-batch that fits?" (or "does activation
// checkpointing have to be on?") by lowering and simulating copies of a plan. A candidate
// fits when no rank runs out of memory and no rank's allocator had to release its cache and
// retry (num_alloc_retries > 0): a retry synchronizes the device and means the allocator is
// thrashing, which Composer's automicrobatching treats as an OOM too.
//
//   SHARDSCOPE_ASSIGN_OR_RETURN(FitResult fit, FitSearch(plan, FitDimension::kMicroBatchSize,
//                                                         64, nullptr));
//   if (fit.best) Use(fit.candidates[*fit.best].micro_batch_size);
#ifndef SHARDSCOPE_SIM_MEMORY_REPORT_H_
#define SHARDSCOPE_SIM_MEMORY_REPORT_H_

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardscope/sim/engine/engine.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/sim/simulate/init_phase.h"
#include "shardscope/sim/simulate/simulate.h"
#include "shardscope/traces/schedule.h"
#include "shardscope/base/status.h"

namespace shardscope::sim {

enum class MemoryCategory : uint8_t {
  kParameters,
  kGradients,
  kOptimizerStates,
  kActivations,
  kCommunicationBuffers,
  kOther,
};
inline constexpr int kNumMemoryCategories = 6;

// "parameters", "gradients", "optimizer_states", "activations", "communication_buffers",
// "other" (also the JSON keys of `shardscope memory --json`).
std::string_view MemoryCategoryName(MemoryCategory category);

// The category of a tensor, by the naming convention of the lowering (sim/lowering/src/lowering.cc);
// a name matches a prefix "x." when it starts with it, and a bare name only exactly:
//   parameters:             param_shard.*, params, unsharded.*, weight_cast.*
//   gradients:              grad.*, grad_tmp.*, grad_shard.*
//   optimizer states:       exp_avg.*, exp_avg_sq.*, exp_avg, exp_avg_sq
//   activations:            activations.*, recomputed.*
//   communication buffers:  all_gather_output.*, cast.*, reduce_scatter_input.*,
//                           reduce_scatter_output.*, bucket.*
//   other:                  anything else (hand-written schedules, workspaces)
MemoryCategory CategoryOfTensor(std::string_view name);

// One rank's memory when its reserved memory peaked.
struct MemoryBreakdown {
  int32_t rank = 0;
  int64_t capacity_bytes = 0;          // what the allocator may use (AllocatorCapacity)
  int64_t peak_reserved_bytes = 0;     // torch.cuda.max_memory_reserved()
  int64_t peak_allocated_bytes = 0;    // torch.cuda.max_memory_allocated() (may be later)
  int64_t allocated_at_reserved_peak = 0;
  // Requested bytes of the tensors live when allocated memory peaked, by MemoryCategory.
  // All zero when the run did not record the rank's live tensors (record_history off, or
  // the observer did not want the rank): then everything counts as overhead.
  std::array<int64_t, kNumMemoryCategories> bytes_by_category{};
  // Reserved at the peak minus the live requested bytes: rounding, fragmentation and cached
  // free blocks. Categories + overhead == peak_reserved_bytes.
  int64_t allocator_overhead_bytes = 0;
  int64_t headroom_bytes = 0;          // capacity - peak reserved
  int64_t num_alloc_retries = 0;
  int64_t num_ooms = 0;
  std::optional<OomInfo> oom;
  // The GPU outside the allocator (lowering/schedule_metadata.h DeviceMemorySetup): capacity =
  // usable - context - NCCL - cuBLAS workspaces outside the allocator - others.
  int64_t usable_bytes = 0;
  int64_t cuda_context_bytes = 0;
  int64_t nccl_bytes = 0;
  int64_t cublas_workspace_bytes = 0;    // all of the rank's workspaces
  bool cublas_in_allocator = true;       // then part of peak_reserved_bytes, not of the overhead
  int64_t reserved_by_others_bytes = 0;
  InitPhaseResult init;                  // the job before its first step

  int64_t bytes(MemoryCategory category) const {
    return bytes_by_category[static_cast<size_t>(category)];
  }
};

// The breakdown of `rank` from its RankMemory (as Simulate filled it).
MemoryBreakdown BreakdownAtPeak(const traces::Schedule& schedule, int32_t rank, const RankMemory& memory);

// Simulates the schedule once, recording the live tensors of exactly `ranks`, and returns
// their breakdowns in the order given (duplicates removed). A rank outside the world is
// InvalidInput.
StatusOr<std::vector<MemoryBreakdown>> SimulateMemory(const traces::Schedule& schedule,
                                                      const SimulationSetup& setup,
                                                      std::vector<int32_t> ranks);

// Ranks worth showing by default: rank 0, the rank with the highest peak reserved memory
// (the lowest such rank on ties) and, when neither ran out of memory but some rank did, the
// first rank that did. Returns their breakdowns.
//
// Recording live tensors costs memory and time per wanted rank, so the choice depends on
// the world size: up to kMemoryRanksInOneRun ranks, one run records every rank and the
// breakdowns come from it; beyond, a first run records none (only statistics), and a second
// records the chosen ranks. The engine is deterministic, so both runs agree.
inline constexpr int32_t kMemoryRanksInOneRun = 64;
StatusOr<std::vector<MemoryBreakdown>> SimulateMemoryDefaultRanks(const traces::Schedule& schedule,
                                                                  const SimulationSetup& setup);

// ---- Fit search

enum class FitDimension : uint8_t { kMicroBatchSize, kActivationCheckpointing };
std::string_view FitDimensionName(FitDimension dimension);  // "micro_batch_size", ...
std::optional<FitDimension> ParseFitDimension(std::string_view name);
std::string_view ActivationCheckpointingName(ActivationCheckpointing ac);  // "none", "full"

// One plan variant that was lowered and simulated.
struct FitCandidate {
  int64_t micro_batch_size = 0;
  ActivationCheckpointing ac = ActivationCheckpointing::kNone;
  bool fits = false;                    // no OOM and no alloc retry on any rank
  int64_t peak_reserved_bytes = 0;      // max over ranks
  int64_t num_alloc_retries = 0;        // sum over ranks
  int32_t oom_ranks = 0;                // ranks that ran out of memory
  int64_t step_time_ns = 0;             // makespan; 0 when some rank stopped (OOM, hang)
  double tokens_per_second_per_gpu = 0; // tokens per rank per step / step time; 0 likewise
  bool init_oom = false;                // ran out of memory before the step (simulate/init_phase.h)
  std::string note;                     // why it does not fit, or empty
};

struct FitResult {
  FitDimension dimension = FitDimension::kMicroBatchSize;
  std::vector<FitCandidate> candidates;  // in the order they were tried
  std::optional<size_t> best;            // index into candidates; empty when nothing fits
  std::string reason;                    // why nothing fits (when best is empty)
  int64_t capacity_bytes = 0;            // the smallest allocator capacity over ranks
};

// Called after each candidate: candidates done so far, an estimate of the total (it can
// change as the search learns where the limit is), and the candidate.
using FitProgress = std::function<void(int done, int total_estimate, const FitCandidate& candidate)>;

// kMicroBatchSize: tries 1, 2, 4, ... (the last step clamped to max_micro_batch) until one
// does not fit or max_micro_batch fits, then bisects between the last fit and the first
// failure; best = the largest micro-batch that fits. Other knobs stay as in `base`.
// kActivationCheckpointing: tries none, then full, at base's micro-batch; best = the faster
// of those that fit. max_micro_batch is ignored.
// Errors: max_micro_batch < 1 (InvalidInput), and failures to lower or simulate a candidate.
// `progress` may be empty.
// The largest micro-batch a search tries unless told (`shardscope fit --max`).
inline constexpr int64_t kDefaultFitMaxMicroBatch = 256;
StatusOr<FitResult> FitSearch(const Plan& base, FitDimension dimension, int64_t max_micro_batch,
                              const FitProgress& progress);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_MEMORY_REPORT_H_

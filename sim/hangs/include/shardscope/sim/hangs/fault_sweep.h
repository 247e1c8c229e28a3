// `shardscope check`: a plan run once as it is, then once per injected fault, to find the
// faults that turn into hangs before the job does.
//
// The faults (engine.h, EngineConfig):
// - an out-of-memory on one rank at a module boundary: the first allocation of each
//   (phase, micro-batch, module) in that rank's program. Composer's FSDP deadlocks came from
//   module boundaries in forward and backward (issue 5); with the default policy (`raise`,
//   the rank leaves) the others wait at their next collective with it: a hang.
// - a straggler: one rank's kernels and copies slowed by a factor; it never hangs by itself,
//   and costs step time (reported as the delta to the baseline).
// - a divergence (issue 5, plan.h DivergenceConfig): one rank runs a different plan than its
//   peers: longer sequences (variable-length batches), more routed tokens (MoE routing
//   imbalance), one micro-batch fewer, a different prefetch setting or bucket layout. Order
//   and size divergences hang; the others cost time or memory (and may run out of it).
// - memory held by another process on one rank (a stray CUDA context, a second job).
// One rank per program class is enough: ranks sharing a program make the same calls.
#ifndef SHARDSCOPE_SIM_FAULT_SWEEP_H_
#define SHARDSCOPE_SIM_FAULT_SWEEP_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardscope/sim/engine/engine.h"
#include "shardscope/sim/hangs/hang.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/traces/schedule.h"
#include "shardscope/base/status.h"

namespace shardscope::sim {

enum class FaultKind : uint8_t { kOom, kStraggler, kDivergence, kMemoryHeld };

struct FaultCase {
  FaultKind kind = FaultKind::kOom;
  int32_t rank = 0;
  // kOom: the allocate op that fails, and where it is ("forward mb 0 layers.1").
  int64_t op_id = -1;
  int32_t op_index = -1;             // into the rank's Program::ops (sort key: program order)
  std::string boundary;
  double slowdown = 1;               // kStraggler
  // kDivergence: what the rank runs differently, and the whole job's schedule with it (its
  // own cost provider: its communicators may be numbered differently).
  std::string divergence;            // "seq_len x1.5 (training.seq_len 3072)"
  std::shared_ptr<const traces::Schedule> schedule;
  std::shared_ptr<const CostProvider> costs;
  int64_t held_bytes = 0;            // kMemoryHeld: device memory another process holds
  // "OOM rank 0 @ forward mb 0 layers.1 (op 36)", "straggler rank 0 x2",
  // "rank 0 runs seq_len x1.5 (training.seq_len 3072)", "rank 0: 1.00 GiB held by another process"
  std::string Label() const;
};

struct FaultSweepOptions {
  std::vector<int32_t> oom_ranks;            // empty: the first rank of each program
  std::map<int32_t, double> stragglers;      // empty: the first OOM rank at 2x
  HangOptions hang;
  // Divergence cases, on the first OOM rank (BuildDivergenceCases). Sizes of the sweep, not
  // of any framework: a batch of longer sequences, a hot expert rank, a stray process.
  double seq_len_factor = 1.5;
  double moe_load = 2.0;
  int64_t held_bytes = int64_t{1} << 30;     // a CUDA context (0.3-0.6 GiB) plus a small cache
};

// The cases, in a fixed order: OOMs by rank then program order, then stragglers by rank.
// Bad ranks or factors are kInvalidInput.
StatusOr<std::vector<FaultCase>> BuildFaultCases(const traces::Schedule& schedule, const FaultSweepOptions& options);

// The divergence cases of `plan` for `rank` (each re-lowered with that rank changed, starting
// from what the rank runs now), in a fixed order: seq_len, moe_load (expert parallel only),
// one micro-batch fewer (grad_accum_steps > 1), the prefetch setting flipped (fsdp2, fsdp1,
// zero3), the bucket layout changed (ddp, zero1/2), memory held by another process.
StatusOr<std::vector<FaultCase>> BuildDivergenceCases(const Plan& plan, int32_t rank,
                                                      const FaultSweepOptions& options);

// Module boundaries of one rank's program: the first allocate op of each change of
// (phase, micro-batch, module) among its allocations; untagged ops (the model states set up
// before the step) are not boundaries.
std::vector<FaultCase> ModuleBoundaries(const traces::Schedule& schedule, int32_t rank);

enum class FaultOutcome : uint8_t {
  kOk,       // the step completes
  kOomOnly,  // the injected rank stopped, every other rank finished: no hang
  kOomAgreed,  // catch_and_sync: every rank agreed on the OOM at a flag all-reduce and
               // stopped there (Composer retries with a smaller micro-batch): no hang
  kHang,     // some rank cannot finish
};
std::string_view FaultOutcomeName(FaultOutcome outcome);  // "ok", "oom-only", "hang"

struct FaultCaseResult {
  FaultCase fault;
  FaultOutcome outcome = FaultOutcome::kOk;
  std::string where;                 // hang: the explanation's first cause, shortened
  std::vector<int32_t> blocked_ranks;
  int64_t step_ns = 0;               // completed: the step time
  int64_t watchdog_fires_at_ns = -1; // hang: when a NCCL watchdog would fire (-1: none would)
  int64_t cost_ns = 0;               // step_ns - the baseline's (stragglers; completed cases)
  bool Safe() const { return outcome != FaultOutcome::kHang; }
};

// Runs one case: `base` with the fault added (its progress callback is dropped).
// `baseline_step_ns` is the fault-free step time. `costs` is only read (thread-safe when its
// methods are, as ClusterCostProvider's are).
StatusOr<FaultCaseResult> RunFaultCase(const traces::Schedule& schedule, const CostProvider& costs,
                                       const EngineConfig& base, const FaultCase& fault, int64_t baseline_step_ns,
                                       const HangOptions& hang = {});

// Every case on up to `threads` threads (<= 0: hardware concurrency). Results in case order
// (independent of the thread count). `progress` (may be empty) is called once per finished
// case, from the worker threads but never concurrently.
using FaultProgress = std::function<void(size_t done, size_t total, const FaultCaseResult& finished)>;
StatusOr<std::vector<FaultCaseResult>> RunFaultSweep(const traces::Schedule& schedule, const CostProvider& costs,
                                                     const EngineConfig& base, const std::vector<FaultCase>& cases,
                                                     int64_t baseline_step_ns, int threads,
                                                     const FaultProgress& progress = {},
                                                     const HangOptions& hang = {});

// The table `shardscope check` prints: fault, outcome, where, step time or watchdog time, cost.
std::string FaultTableText(const std::vector<FaultCaseResult>& results);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_FAULT_SWEEP_H_

// How big a run will be, known before it starts: the ops a plan lowers to (and the memory they
// take), and the size of the trace `simulate` would write. Past a limit the caller (a CLI
// command, the Python module) refuses and names the knob that drives the size and `--force`
// (force=True); past a lower threshold it warns. docs/PLAN.md ("How big a run may be") lists
// the thresholds. (Moved from cli/work_limits.h: LoadInput checks a plan here before lowering
// it, for the CLI and the Python module alike.)
//
// A plan's ops are not counted by lowering it whole (a plan with grad_accum_steps 1,000,000
// lowers to ~10^9 ops: tens of GB before the first check could run): it is lowered with
// grad_accum_steps 1 and 2, and the ops per further micro-batch extrapolated. Every lowering
// emits a fixed prologue and epilogue (optimizer, reductions) around one block per
// micro-batch, so the count is linear in grad_accum_steps (tests/cli/inputs_test.sh checks the
// estimate for 1,000,000 against real lowerings at 4 and 8). Memory and file sizes per op are
// measured figures (work_limits.cc).
#ifndef SHARDSCOPE_SIM_LOWERING_WORK_LIMITS_H_
#define SHARDSCOPE_SIM_LOWERING_WORK_LIMITS_H_

#include <cstdint>
#include <functional>
#include <string>

#include "shardscope/base/status.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::sim {

// The size of a lowered schedule: ops over its distinct programs and the memory a simulation
// of it holds without tracing.
struct WorkEstimate {
  int64_t ops = 0;
  int64_t rank_ops = 0;  // ops of the largest program (what one traced rank runs)
  int64_t bytes = 0;
  std::string driver;  // what drives the size, for messages ("training.grad_accum_steps 1000000")
};

// A plan's schedule, estimated without lowering it whole (see above). Fails only where the
// small lowerings fail, which the real one would too.
StatusOr<WorkEstimate> EstimatePlanWork(const Plan& plan);
// A loaded schedule's (after a plan was lowered whole, or a schedule JSON was read).
WorkEstimate ScheduleWork(const traces::Schedule& schedule, std::string driver);
// What drives a plan's size, as EstimatePlanWork names it ("training.grad_accum_steps 4").
std::string PlanWorkDriver(const Plan& plan);

// What the caller lets the checks below do, and how their messages name its knobs.
struct WorkLimits {
  bool force = false;  // go on past the limits
  // Each warning past a threshold ("warning: ..."); empty: none (the CLI's -q).
  std::function<void(const std::string&)> warn;
  // The knobs as the caller spells them (the CLI's flags; the Python module's arguments).
  std::string force_flag = "--force";                      // "... or pass --force to go on"
  std::string trace_ranks_flag = "--trace-ranks";          // "... --trace-ranks traces fewer"
  std::string fewer_ranks = "--trace-ranks 0, or none";    // "trace fewer ranks (--trace-ranks 0, or none)"
};

// Refuses (kInvalidInput, naming the driver and the force flag) past the memory limit unless
// `limits.force`; warns past the warning threshold.
Status CheckWork(const WorkEstimate& work, const std::string& source, const WorkLimits& limits);

// What `simulate` will hold and write for `traced_ranks` traced ranks: the schedule's memory
// plus each traced rank's spans and memory history, and trace.json plus the memory snapshots.
struct SimulateEstimate {
  int64_t memory_bytes = 0;
  int64_t trace_bytes = 0;     // trace.json
  int64_t snapshot_bytes = 0;  // memory_snapshot_rank<N>.json and .pickle
};
SimulateEstimate EstimateSimulate(const WorkEstimate& work, int64_t traced_ranks);
// Refuses past the memory or trace limit unless `limits.force`, warns past the thresholds;
// the message names the trace-ranks knob, the driver and the force flag.
Status CheckSimulate(const SimulateEstimate& estimate, int64_t traced_ranks, const std::string& driver,
                     const WorkLimits& limits);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_LOWERING_WORK_LIMITS_H_

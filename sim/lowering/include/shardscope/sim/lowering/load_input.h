// What every command that simulates or executes starts from: a plan (YAML, loaded and
// lowered) or a schedule JSON, with the setup its simulation reads from the schedule's
// metadata. The CLI's commands and the Python module load their inputs here. A plan whose
// schedule would be too big is refused before it is lowered (work_limits.h).
//
//   SHARDSCOPE_ASSIGN_OR_RETURN(LoadedInput input, LoadInput("examples/tiny-fsdp2-2gpu.yaml"));
//   ... input.schedule, input.setup, input.plan (set for a plan)
#ifndef SHARDSCOPE_SIM_LOWERING_LOAD_INPUT_H_
#define SHARDSCOPE_SIM_LOWERING_LOAD_INPUT_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "shardscope/base/status.h"
#include "shardscope/sim/lowering/schedule_metadata.h"
#include "shardscope/sim/lowering/work_limits.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::sim {

struct LoadedInput {
  traces::Schedule schedule;
  SimulationSetup setup;
  std::optional<Plan> plan;  // when the input was a plan (not a schedule JSON)
};

// What LoadInput may do with a big input (work_limits.h).
struct LoadOptions {
  WorkLimits limits;  // `force` goes on past the memory limit; `warn` gets the warnings
  // `simulate`: the ranks it will trace, given the world size and the GPUs per node (it may
  // fail on a bad --trace-ranks). When set, what the simulation will hold and write is checked
  // too (CheckSimulate), before a plan is lowered.
  std::function<StatusOr<int64_t>(int32_t world, int32_t gpus_per_node)> traced_ranks;
  // `--all-ranks`: the setup simulates every rank (SimulationSetup::simulate_every_rank).
  bool simulate_every_rank = false;
};

// A file whose first non-blank character is '{' is a schedule JSON; anything else is a YAML
// plan, which is loaded and lowered. (Moved from cli/inputs.cc.)
StatusOr<LoadedInput> LoadInput(const std::string& path, const LoadOptions& options = {});

// A plan already parsed (ParsePlan of a text that is not a file: the Python module's dicts),
// checked and lowered as LoadInput does a plan file; `label` names it in reports and messages
// (plan.source, e.g. "<dict>").
StatusOr<LoadedInput> LoadPlan(Plan plan, const std::string& label, const LoadOptions& options = {});

// What a simulation of a loaded input tracing `traced_ranks` ranks will hold and write,
// checked against the limits (CheckSimulate), for a caller that loaded the input before it
// knew which ranks it traces (the Python module: load_plan, then simulate).
Status CheckSimulateOf(const LoadedInput& input, int64_t traced_ranks, const WorkLimits& limits);

// The size of a loaded input's schedule (work_limits.h), its driver named as LoadInput names it
// ("training.grad_accum_steps 4" for a plan, "the schedule's ops" for a schedule JSON).
WorkEstimate LoadedWork(const LoadedInput& input);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_LOWERING_LOAD_INPUT_H_

// What every command that simulates or executes starts from: a plan (YAML, loaded and
// lowered) or a schedule JSON, with the setup its simulation reads from the schedule's
// metadata. The CLI's commands and the Python module load their inputs here.
//
//   SHARDSCOPE_ASSIGN_OR_RETURN(LoadedInput input, LoadInput("examples/tiny-fsdp2-2gpu.yaml"));
//   ... input.schedule, input.setup, input.plan (set for a plan)
#ifndef SHARDSCOPE_SIM_LOWERING_LOAD_INPUT_H_
#define SHARDSCOPE_SIM_LOWERING_LOAD_INPUT_H_

#include <optional>
#include <string>

#include "shardscope/base/status.h"
#include "shardscope/sim/lowering/schedule_metadata.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::sim {

struct LoadedInput {
  traces::Schedule schedule;
  SimulationSetup setup;
  std::optional<Plan> plan;  // when the input was a plan (not a schedule JSON)
};

// A file whose first non-blank character is '{' is a schedule JSON; anything else is a YAML
// plan, which is loaded and lowered. (Moved from cli/inputs.cc.)
StatusOr<LoadedInput> LoadInput(const std::string& path);

// A plan already parsed (ParsePlan of a text that is not a file: the Python module's dicts),
// lowered; `label` names it in reports (plan.source, e.g. "<dict>").
StatusOr<LoadedInput> LoadPlan(Plan plan, const std::string& label);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_LOWERING_LOAD_INPUT_H_

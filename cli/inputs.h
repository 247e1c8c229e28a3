// Input handling shared by the CLI's commands: loading a plan or a schedule JSON, and rank
// lists such as "0-7,12".
#ifndef SHARDSCOPE_CLI_INPUTS_H_
#define SHARDSCOPE_CLI_INPUTS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shardscope/sim/plan/plan.h"
#include "shardscope/sim/report/report.h"
#include "shardscope/traces/schedule.h"
#include "shardscope/base/status.h"

namespace shardscope::cli {

struct LoadedInput {
  traces::Schedule schedule;
  sim::SimulationSetup setup;
  std::optional<sim::Plan> plan;  // when the input was a plan (not a schedule JSON)
};

// A file whose first non-blank character is '{' is a schedule JSON; anything else is a YAML
// plan, which is loaded and lowered.
StatusOr<LoadedInput> LoadInput(const std::string& path);

// "0-7,12,100": ranks within a world of `world`; `option` names the flag in messages.
StatusOr<std::vector<int32_t>> ParseRankList(const std::string& text, int32_t world, const std::string& option);

}  // namespace shardscope::cli

#endif  // SHARDSCOPE_CLI_INPUTS_H_

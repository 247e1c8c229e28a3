// Input handling shared by the CLI's commands: loading a plan or a schedule JSON, and rank
// lists such as "0-7,12".
#ifndef SHARDSCOPE_CLI_INPUTS_H_
#define SHARDSCOPE_CLI_INPUTS_H_

#include <cstdint>
#include <functional>
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

// What LoadInput may do with a big input (work_limits.h): `force` goes on past the memory
// limit, `quiet` drops the warnings.
struct LoadOptions {
  bool force = false;
  bool quiet = false;
  // `simulate`: the ranks it will trace, given the world size and the GPUs per node (it may
  // fail on a bad --trace-ranks). When set, what the simulation will hold and write is checked
  // too (CheckSimulate), before a plan is lowered.
  std::function<StatusOr<int64_t>(int32_t world, int32_t gpus_per_node)> traced_ranks;

  static LoadOptions With(bool force, bool quiet) {
    LoadOptions options;
    options.force = force;
    options.quiet = quiet;
    return options;
  }
};

// A file whose first non-blank character is '{' is a schedule JSON; anything else is a YAML
// plan, which is loaded and lowered. A plan whose schedule would be too big is refused before
// it is lowered (CheckWork).
StatusOr<LoadedInput> LoadInput(const std::string& path, const LoadOptions& options = {});

// "0-7,12,100": ranks within a world of `world`; `option` names the flag in messages.
StatusOr<std::vector<int32_t>> ParseRankList(const std::string& text, int32_t world, const std::string& option);

}  // namespace shardscope::cli

#endif  // SHARDSCOPE_CLI_INPUTS_H_

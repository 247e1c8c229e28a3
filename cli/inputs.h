// Input handling shared by the CLI's commands: rank lists such as "0-7,12". Loading a plan
// or a schedule JSON is sim/'s (shardscope/sim/lowering/load_input.h), named here for the
// commands that call it, with the load options the CLI's -q and --force give.
#ifndef SHARDSCOPE_CLI_INPUTS_H_
#define SHARDSCOPE_CLI_INPUTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "shardscope/base/status.h"
#include "shardscope/sim/lowering/load_input.h"

namespace shardscope::cli {

using LoadedInput = sim::LoadedInput;
using LoadOptions = sim::LoadOptions;
using sim::LoadInput;

// The size limits (work_limits.h) as a command's flags set them: `force` goes on past the
// memory limit, `quiet` drops the warnings (printed through progress.h otherwise).
sim::WorkLimits WorkLimitsWith(bool force, bool quiet);
// LoadInput's options with those limits; `all_ranks` (`--all-ranks`): simulate every rank
// rather than one per class of identical ranks (the results are the same, only slower).
LoadOptions LoadOptionsWith(bool force, bool quiet, bool all_ranks = false);
// The help text of `--all-ranks`, one for every command that has it.
inline constexpr const char* kAllRanksHelp =
    "Simulate every rank, not one per class of ranks with identical timelines (same results, slower; "
    "for checking the reduction)";

// "0-7,12,100": ranks within a world of `world`; `option` names the flag in messages.
StatusOr<std::vector<int32_t>> ParseRankList(const std::string& text, int32_t world, const std::string& option);

}  // namespace shardscope::cli

#endif  // SHARDSCOPE_CLI_INPUTS_H_

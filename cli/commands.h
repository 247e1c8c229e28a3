// Commands that live outside main.cc. Each Add* function registers its subcommand on the
// app and returns a runner that, after parsing, runs it if it was chosen (nullopt if not).
#ifndef SHARDSCOPE_CLI_COMMANDS_H_
#define SHARDSCOPE_CLI_COMMANDS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "shardscope/traces/status.h"

namespace shardscope::cli {

using CommandRunner = std::function<std::optional<Status>()>;

CommandRunner AddMemoryCommand(CLI::App& app);  // shardscope memory PLAN
CommandRunner AddFitCommand(CLI::App& app);     // shardscope fit PLAN --search ...
CommandRunner AddCheckCommand(CLI::App& app);   // shardscope check PLAN (check_command.cc)
CommandRunner AddDiffCommand(CLI::App& app);    // shardscope diff PREDICTED MEASURED (diff_command.cc)

// `--straggler RANK:FACTOR` values (simulate, check) -> rank -> slowdown factor (>= 1).
StatusOr<std::map<int32_t, double>> ParseStragglers(const std::vector<std::string>& specs, int32_t world);
// The summary line: which ranks straggle and what they cost (step with vs without).
std::string StragglerSummary(const std::map<int32_t, double>& stragglers, int64_t with_ns, int64_t without_ns);

}  // namespace shardscope::cli

#endif  // SHARDSCOPE_CLI_COMMANDS_H_

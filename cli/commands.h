// Commands that live outside main.cc. Each Add* function registers its subcommand on the
// app and returns a runner that, after parsing, runs it if it was chosen (nullopt if not).
#ifndef SHARDSCOPE_CLI_COMMANDS_H_
#define SHARDSCOPE_CLI_COMMANDS_H_

#include <functional>
#include <optional>

#include <CLI/CLI.hpp>

#include "shardscope/traces/status.h"

namespace shardscope::cli {

using CommandRunner = std::function<std::optional<Status>()>;

CommandRunner AddMemoryCommand(CLI::App& app);  // shardscope memory PLAN
CommandRunner AddFitCommand(CLI::App& app);     // shardscope fit PLAN --search ...

}  // namespace shardscope::cli

#endif  // SHARDSCOPE_CLI_COMMANDS_H_

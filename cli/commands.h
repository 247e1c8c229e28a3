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

#include "shardscope/sim/engine/engine.h"
#include "shardscope/base/status.h"

namespace shardscope::cli {

using CommandRunner = std::function<std::optional<Status>()>;

CommandRunner AddMemoryCommand(CLI::App& app);  // shardscope memory PLAN
CommandRunner AddFitCommand(CLI::App& app);     // shardscope fit PLAN --search ...
CommandRunner AddCheckCommand(CLI::App& app);   // shardscope check PLAN (check_command.cc)
CommandRunner AddImportCommand(CLI::App& app);  // shardscope import TRACE... -o DIR (import_command.cc)
CommandRunner AddAnalyzeCommand(CLI::App& app);  // shardscope analyze TRACE... (analyze_command.cc)
CommandRunner AddCalibrateCommand(CLI::App& app);  // shardscope calibrate MEASURED... --schedule S (calibrate_command.cc)
CommandRunner AddDiffCommand(CLI::App& app);    // shardscope diff PREDICTED MEASURED (diff_command.cc)
CommandRunner AddRunCommand(CLI::App& app);     // shardscope run PLAN -o DIR (run_command.cc)
CommandRunner AddFlightRecorderCommand(CLI::App& app);  // shardscope flight-recorder DIR (flight_recorder_command.cc)
CommandRunner AddTuneCommand(CLI::App& app);    // shardscope tune PLAN --gpus N (tune_command.cc)
// shardscope alloc-replay --snapshot FILE.pickle (alloc_snapshot_command.cc); the option
// lives on main.cc's alloc-replay. Exit 0 exact, 1 diverges (kInternal), 2 bad input.
Status RunAllocReplaySnapshot(const std::string& path, bool json, int64_t device_memory_bytes);

// `--inject-oom RANK:OP_ID` (simulate, run): an allocate op of that rank; "" -> none.
StatusOr<std::optional<sim::InjectedOom>> ParseInjectedOom(const std::string& spec, const traces::Schedule& schedule);

// `--straggler RANK:FACTOR` values (simulate, check) -> rank -> slowdown factor (>= 1).
StatusOr<std::map<int32_t, double>> ParseStragglers(const std::vector<std::string>& specs, int32_t world);

}  // namespace shardscope::cli

#endif  // SHARDSCOPE_CLI_COMMANDS_H_

// `shardscope flight-recorder DIR [--json]`: reads every rank's NCCL Flight Recorder dump in
// DIR (PyTorch's pickle or JSON dumps, or those `simulate` and `run` write), matches the
// entries across ranks per process group and prints each hang in one line, then its details
// (traces/flight_recorder.h; docs/FLIGHT_RECORDER.md). Exit 0 when no hang is found, 1 when
// one is, 2 on bad input.
#include <iostream>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "commands.h"
#include "progress.h"
#include "shardscope/analysis/flight_recorder_analysis.h"

namespace shardscope::cli {
namespace {

struct FlightRecorderOptions {
  std::string dir;
  std::string prefix;
  bool json = false;
  bool quiet = false;
};

Status RunFlightRecorder(const FlightRecorderOptions& options) {
  Progress::Note(options.quiet, fmt::format("reading the dumps in {}", options.dir));
  traces::FlightRecorderDirOptions dir_options;
  dir_options.prefix = options.prefix;
  SHARDSCOPE_ASSIGN_OR_RETURN(std::vector<traces::FlightRecorderDump> dumps,
                              traces::ReadFlightRecorderDir(options.dir, dir_options));
  const traces::FlightRecorderAnalysis analysis = traces::AnalyzeFlightRecorder(dumps);
  std::cout << (options.json ? traces::FlightRecorderJsonReport(analysis) : traces::FlightRecorderText(analysis));
  if (analysis.hangs.empty()) return Status::Ok();
  // main() maps every error but bad input to exit code 1, which is what a hang must return.
  return Status::Internal(fmt::format("{} hang(s) found in the Flight Recorder dumps of {}", analysis.hangs.size(),
                                      options.dir));
}

}  // namespace

CommandRunner AddFlightRecorderCommand(CLI::App& app) {
  auto options = std::make_shared<FlightRecorderOptions>();
  CLI::App* cmd = app.add_subcommand(
      "flight-recorder",
      "Find the stuck collectives in NCCL Flight Recorder dumps (one file per rank: PyTorch's pickle or JSON, or "
      "what simulate and run write): the ranks missing from them and type/size/dtype mismatches. Exit 1 when a hang "
      "is found, 0 when none, 2 on bad input (docs/FLIGHT_RECORDER.md)");
  cmd->add_option("dir", options->dir,
                  "Folder of dumps named <prefix><rank> (nccl_trace_rank_0, _dump_0, flight_recorder_rank0.json, "
                  "or run's DIR holding flight_recorder/rank_0.json)")
      ->required();
  cmd->add_option("--prefix", options->prefix,
                  "Read only files named <prefix><rank>[.json|.pkl] (default: the prefix the dump names share)");
  cmd->add_flag("--json", options->json, "Print the hangs as JSON ({\"hangs\": [...]})");
  cmd->add_flag("-q,--quiet", options->quiet, "No progress messages on stderr");
  return [cmd, options]() -> std::optional<Status> {
    if (!*cmd) return std::nullopt;
    return RunFlightRecorder(*options);
  };
}

}  // namespace shardscope::cli

// `shardscope diff PREDICTED MEASURED -o DIR`: the predicted-vs-measured timeline diff
// (traces/diff.h). Each side is a trace file, a directory holding trace.json (what
// `shardscope simulate -o DIR` writes), or a directory of per-rank *.json traces. Writes
// DIR/trace.json (both timelines side by side for Perfetto), DIR/report.md and
// DIR/report.json, and prints the headline. Exit 0, 2 on bad input, 1 on I/O failure.
#include <iostream>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "commands.h"
#include "shardscope/analysis/trace_commands.h"

namespace shardscope::cli {
namespace {

struct DiffCommandOptions {
  std::string predicted;
  std::string measured;
  std::string out_dir = "shardscope-diff";
  int top_n = 20;
  int rank = -1;
  bool full = false;
  int64_t step = -1;
};

Status RunDiff(const DiffCommandOptions& options) {
  traces::DiffRequest request;
  request.predicted = options.predicted;
  request.measured = options.measured;
  request.out_dir = options.out_dir;
  request.top_n = options.top_n;
  request.rank = options.rank;
  request.full = options.full;
  request.step = options.step;
  const auto warn = [](const std::string& warning) { std::cerr << "shardscope diff: warning: " << warning << "\n"; };
  SHARDSCOPE_ASSIGN_OR_RETURN(traces::DiffRun run, traces::RunDiff(request, warn));
  if (!run.measured_step_note.empty()) std::cout << fmt::format("measured: {}\n", run.measured_step_note);
  if (!run.predicted_step_note.empty()) std::cout << fmt::format("predicted: {}\n", run.predicted_step_note);
  std::cout << run.headline;
  return Status::Ok();
}

}  // namespace

CommandRunner AddDiffCommand(CLI::App& app) {
  auto options = std::make_shared<DiffCommandOptions>();
  CLI::App* cmd = app.add_subcommand(
      "diff", "Compare a predicted and a measured timeline: matched ops, errors by class, critical paths (docs/DIFF.md)");
  cmd->add_option("predicted", options->predicted,
                  "Predicted trace: a file, a directory with trace.json, or a directory of per-rank *.json")
      ->required();
  cmd->add_option("measured", options->measured, "Measured trace (same forms)")->required();
  cmd->add_option("-o,--output", options->out_dir, "Directory for trace.json, report.md and report.json")
      ->capture_default_str();
  cmd->add_option("--top", options->top_n, "Ops listed by contribution to the step-time difference")
      ->capture_default_str();
  cmd->add_option("--rank", options->rank, "Compare this rank only");
  cmd->add_option("--step", options->step,
                  "Compare this step of a multi-step measured trace (default: its median measured step)");
  cmd->add_flag("--full", options->full,
                "report.json lists every critical-path step (default: the --top steps holding the most time)");
  return [cmd, options]() -> std::optional<Status> {
    if (!*cmd) return std::nullopt;
    return RunDiff(*options);
  };
}

}  // namespace shardscope::cli

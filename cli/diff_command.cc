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
#include "progress.h"
#include "shardscope/analysis/trace_commands.h"

namespace shardscope::cli {
namespace {

struct DiffCommandOptions {
  std::string predicted;
  std::string measured;
  std::string out_dir = "shardscope-diff";
  int top_n = 20;
  int rank = -1;  // -1: every rank (the flag not given; a given --rank must be >= 0)
  bool full = false;
  int64_t step = -1;  // -1: the median measured step (likewise)
  bool rank_given = false, step_given = false;
  bool quiet = false;
};

Status RunDiff(const DiffCommandOptions& options) {
  traces::DiffRequest request;
  request.predicted = options.predicted;
  request.measured = options.measured;
  request.out_dir = options.out_dir;
  request.top_n = options.top_n;
  if (options.rank_given) request.rank = options.rank;
  request.full = options.full;
  if (options.step_given) request.step = options.step;
  traces::TraceCommandOutput output;
  output.note = [&options](const std::string& note) { Progress::Note(options.quiet, note); };
  if (!options.quiet) {
    output.warn = [](const std::string& warning) { std::cerr << "shardscope diff: warning: " << warning << "\n"; };
  }
  output.print = [](const std::string& text) { std::cout << text; };
  SHARDSCOPE_ASSIGN_OR_RETURN(traces::DiffRun run, traces::RunDiff(request, output));
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
  CLI::Option* rank = cmd->add_option("--rank", options->rank, "Compare this rank only (>= 0)");
  CLI::Option* step = cmd->add_option(
      "--step", options->step, "Compare this step of a multi-step measured trace (default: its median measured step)");
  cmd->add_flag("-q,--quiet", options->quiet, "No progress messages or warnings on stderr");
  cmd->add_flag("--full", options->full,
                "report.json lists every critical-path step (default: the --top steps holding the most time)");
  return [cmd, options, rank, step]() -> std::optional<Status> {
    if (!*cmd) return std::nullopt;
    options->rank_given = rank->count() > 0;
    options->step_given = step->count() > 0;
    return RunDiff(*options);
  };
}

}  // namespace shardscope::cli

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
#include "shardscope/base/output_dir.h"
#include "shardscope/analysis/diff.h"

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
  if (options.top_n < 0) return Status::InvalidInput(fmt::format("--top: expected >= 0, got {}", options.top_n));
  // -1 is only the default's sentinel: `--rank -1` is a bad rank, not "all".
  if (options.rank_given && options.rank < 0) {
    return Status::InvalidInput(fmt::format("--rank: expected a rank >= 0, got {}", options.rank));
  }
  Progress::Note(options.quiet, fmt::format("reading the predicted side {}", options.predicted));
  SHARDSCOPE_ASSIGN_OR_RETURN(traces::DiffSide predicted, traces::LoadDiffSide(options.predicted));
  Progress::Note(options.quiet, fmt::format("reading the measured side {}", options.measured));
  SHARDSCOPE_ASSIGN_OR_RETURN(traces::DiffSide measured, traces::LoadDiffSide(options.measured));
  if (options.step_given && options.step < 0) {
    return Status::InvalidInput(fmt::format("--step: expected a step >= 0, got {}", options.step));
  }
  // One step against one step: a multi-step measured trace is cut to its median measured
  // step (or --step N) first (docs/DIFF.md, "Steps").
  SHARDSCOPE_RETURN_IF_ERROR(traces::SelectDiffStep(predicted, measured, options.step));
  for (const traces::DiffSide* side : {&predicted, &measured}) {
    if (options.quiet) break;
    for (const std::string& warning : side->warnings) std::cerr << "shardscope diff: warning: " << warning << "\n";
  }
  if (!measured.step_note.empty()) std::cout << fmt::format("measured: {}\n", measured.step_note);
  if (!predicted.step_note.empty()) std::cout << fmt::format("predicted: {}\n", predicted.step_note);
  traces::DiffOptions diff_options;
  diff_options.top_n = options.top_n;
  diff_options.rank = options.rank;
  diff_options.full_report = options.full;
  const auto slices = [](const traces::DiffSide& side) {
    size_t n = 0;
    for (const traces::Timeline& file : side.files) n += file.slices.size();
    return n;
  };
  Progress::Note(options.quiet,
                 fmt::format("matching {} predicted and {} measured slices", slices(predicted), slices(measured)));
  SHARDSCOPE_ASSIGN_OR_RETURN(traces::DiffResult diff, traces::Diff(predicted, measured, diff_options));
  if (diff.predicted.events.empty() && diff.measured.events.empty()) {
    return Status::InvalidInput(options.rank >= 0 ? fmt::format("--rank {}: neither trace has events of that rank", options.rank)
                                                  : fmt::format("{} and {}: neither trace has events", options.predicted,
                                                                options.measured));
  }
  // The three files replace the folder's previous set as one (base/output_dir.h).
  SHARDSCOPE_ASSIGN_OR_RETURN(std::unique_ptr<OutputDir> out,
                              OutputDir::Create(options.out_dir, {{"trace.json", "report.md", "report.json"}, "report.json"}));
  SHARDSCOPE_RETURN_IF_ERROR(
      traces::WriteDiffOutputs(predicted, measured, diff, out->StagingPath(""), diff_options));
  SHARDSCOPE_RETURN_IF_ERROR(out->Commit());
  const int64_t p = diff.predicted.step_ns;
  const int64_t m = diff.measured.step_ns;
  std::cout << fmt::format("step: predicted {:.3f} ms, measured {:.3f} ms, difference {:+.3f} ms ({:+.1f}%)\n",
                           static_cast<double>(p) * 1e-6, static_cast<double>(m) * 1e-6,
                           static_cast<double>(m - p) * 1e-6,
                           p > 0 ? 100.0 * static_cast<double>(m - p) / static_cast<double>(p) : 0.0);
  int64_t unmatched_p = 0;
  int64_t unmatched_m = 0;
  for (int32_t j : diff.predicted.match) unmatched_p += j < 0 ? 1 : 0;
  for (int32_t i : diff.measured.match) unmatched_m += i < 0 ? 1 : 0;
  std::cout << fmt::format("matched {} ops ({} by op id, {} anchors, {} by name); unmatched {} predicted, {} measured\n",
                           diff.matched(), diff.matched_by_op_id, diff.matched_by_anchor, diff.matched_by_name,
                           unmatched_p, unmatched_m);
  std::cout << fmt::format("wrote {0}/trace.json (open in https://ui.perfetto.dev), {0}/report.md, {0}/report.json\n",
                           options.out_dir);
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

// RunDiff and RunAnalyze: the bodies of `shardscope diff` and `shardscope analyze` (moved from
// cli/diff_command.cc and cli/analyze_command.cc; messages unchanged, they name the flags).
#include "shardscope/analysis/trace_commands.h"

#include <memory>

#include <fmt/format.h>

#include "shardscope/base/output_dir.h"

namespace shardscope::traces {
namespace {

void Say(const std::function<void(const std::string&)>& to, const std::string& text) {
  if (to) to(text);
}

size_t SlicesOf(const DiffSide& side) {
  size_t n = 0;
  for (const Timeline& file : side.files) n += file.slices.size();
  return n;
}

}  // namespace

StatusOr<DiffRun> RunDiff(const DiffRequest& request, const TraceCommandOutput& output) {
  if (request.top_n < 0) return Status::InvalidInput(fmt::format("--top: expected >= 0, got {}", request.top_n));
  // A given rank is a rank: "every rank" is the flag not given, not a negative one.
  if (request.rank && *request.rank < 0) {
    return Status::InvalidInput(fmt::format("--rank: expected a rank >= 0, got {}", *request.rank));
  }
  const int32_t rank = request.rank.value_or(-1);
  Say(output.note, fmt::format("reading the predicted side {}", request.predicted));
  SHARDSCOPE_ASSIGN_OR_RETURN(DiffSide predicted, LoadDiffSide(request.predicted));
  Say(output.note, fmt::format("reading the measured side {}", request.measured));
  SHARDSCOPE_ASSIGN_OR_RETURN(DiffSide measured, LoadDiffSide(request.measured));
  if (request.step && *request.step < 0) {
    return Status::InvalidInput(fmt::format("--step: expected a step >= 0, got {}", *request.step));
  }
  // One step against one step: a multi-step measured trace is cut to its median measured
  // step (or --step N) first (docs/DIFF.md, "Steps").
  SHARDSCOPE_RETURN_IF_ERROR(SelectDiffStep(predicted, measured, request.step.value_or(-1)));
  for (const DiffSide* side : {&predicted, &measured}) {
    for (const std::string& warning : side->warnings) Say(output.warn, warning);
  }
  DiffRun run;
  run.measured_step_note = measured.step_note;
  run.predicted_step_note = predicted.step_note;
  if (!measured.step_note.empty()) Say(output.print, fmt::format("measured: {}\n", measured.step_note));
  if (!predicted.step_note.empty()) Say(output.print, fmt::format("predicted: {}\n", predicted.step_note));
  DiffOptions diff_options;
  diff_options.top_n = request.top_n;
  diff_options.rank = rank;
  diff_options.full_report = request.full;
  Say(output.note,
      fmt::format("matching {} predicted and {} measured slices", SlicesOf(predicted), SlicesOf(measured)));
  SHARDSCOPE_ASSIGN_OR_RETURN(run.diff, Diff(predicted, measured, diff_options));
  const DiffResult& diff = run.diff;
  if (diff.predicted.events.empty() && diff.measured.events.empty()) {
    return Status::InvalidInput(rank >= 0 ? fmt::format("--rank {}: neither trace has events of that rank", rank)
                                          : fmt::format("{} and {}: neither trace has events", request.predicted,
                                                        request.measured));
  }
  // The three files replace the folder's previous set as one (base/output_dir.h).
  SHARDSCOPE_ASSIGN_OR_RETURN(
      std::unique_ptr<OutputDir> out,
      OutputDir::Create(request.out_dir, {{"trace.json", "report.md", "report.json"}, "report.json"}));
  SHARDSCOPE_RETURN_IF_ERROR(WriteDiffOutputs(predicted, measured, diff, out->StagingPath(""), diff_options));
  SHARDSCOPE_RETURN_IF_ERROR(out->Commit());
  const int64_t p = diff.predicted.step_ns;
  const int64_t m = diff.measured.step_ns;
  run.headline = fmt::format("step: predicted {:.3f} ms, measured {:.3f} ms, difference {:+.3f} ms ({:+.1f}%)\n",
                             static_cast<double>(p) * 1e-6, static_cast<double>(m) * 1e-6,
                             static_cast<double>(m - p) * 1e-6,
                             p > 0 ? 100.0 * static_cast<double>(m - p) / static_cast<double>(p) : 0.0);
  int64_t unmatched_p = 0;
  int64_t unmatched_m = 0;
  for (int32_t j : diff.predicted.match) unmatched_p += j < 0 ? 1 : 0;
  for (int32_t i : diff.measured.match) unmatched_m += i < 0 ? 1 : 0;
  run.headline += fmt::format("matched {} ops ({} by op id, {} anchors, {} by name); unmatched {} predicted, {} measured\n",
                              diff.matched(), diff.matched_by_op_id, diff.matched_by_anchor, diff.matched_by_name,
                              unmatched_p, unmatched_m);
  run.headline += fmt::format("wrote {0}/trace.json (open in https://ui.perfetto.dev), {0}/report.md, {0}/report.json\n",
                              request.out_dir);
  return run;
}

StatusOr<AnalyzeRun> RunAnalyze(const AnalyzeRequest& request, const TraceCommandOutput& output) {
  if (request.rank && *request.rank < 0) {
    return Status::InvalidInput(fmt::format("--rank: expected a rank >= 0, got {}", *request.rank));
  }
  if (!(request.kernel_wait_threshold_us >= 0) || request.kernel_wait_threshold_us > 1e9) {
    return Status::InvalidInput(
        fmt::format("--kernel-wait-threshold-us: expected a number of microseconds >= 0, got {}",
                    request.kernel_wait_threshold_us));
  }
  AnalyzeRun run;
  Say(output.note, fmt::format("reading {} trace path(s)", request.traces.size()));
  SHARDSCOPE_ASSIGN_OR_RETURN(DiffSide side, LoadTraceFiles(request.traces, &run.warnings));
  Say(output.note, fmt::format("computing the metrics of {} file(s)", side.files.size()));
  run.options.rank = request.rank.value_or(-1);
  run.options.kernel_wait_threshold_ns = static_cast<int64_t>(request.kernel_wait_threshold_us * 1000.0 + 0.5);
  run.options.include_last_profiler_step = request.include_last_step;
  run.options.round_to_whole_us = !request.exact_ns;
  run.ranks = ComputeHtaMetrics(side, run.options);
  if (run.ranks.empty()) {
    return Status::InvalidInput(run.options.rank >= 0 ? fmt::format("--rank {}: no events of that rank", run.options.rank)
                                                      : fmt::format("{}: no events", side.source));
  }
  return run;
}

}  // namespace shardscope::traces

// RunDiff and RunAnalyze: the bodies of `shardscope diff` and `shardscope analyze` (moved from
// cli/diff_command.cc and cli/analyze_command.cc; messages unchanged, they name the flags).
#include "shardscope/analysis/trace_commands.h"

#include <fmt/format.h>

namespace shardscope::traces {

StatusOr<DiffRun> RunDiff(const DiffRequest& request, const std::function<void(const std::string&)>& warn) {
  if (request.top_n < 0) return Status::InvalidInput(fmt::format("--top: expected >= 0, got {}", request.top_n));
  if (request.rank < -1) return Status::InvalidInput(fmt::format("--rank: expected a rank >= 0, got {}", request.rank));
  SHARDSCOPE_ASSIGN_OR_RETURN(DiffSide predicted, LoadDiffSide(request.predicted));
  SHARDSCOPE_ASSIGN_OR_RETURN(DiffSide measured, LoadDiffSide(request.measured));
  if (request.step < -1) return Status::InvalidInput(fmt::format("--step: expected a step >= 0, got {}", request.step));
  // One step against one step: a multi-step measured trace is cut to its median measured
  // step (or --step N) first (docs/DIFF.md, "Steps").
  SHARDSCOPE_RETURN_IF_ERROR(SelectDiffStep(predicted, measured, request.step));
  for (const DiffSide* side : {&predicted, &measured}) {
    for (const std::string& warning : side->warnings) {
      if (warn) warn(warning);
    }
  }
  DiffRun run;
  run.measured_step_note = measured.step_note;
  run.predicted_step_note = predicted.step_note;
  DiffOptions diff_options;
  diff_options.top_n = request.top_n;
  diff_options.rank = request.rank;
  diff_options.full_report = request.full;
  SHARDSCOPE_ASSIGN_OR_RETURN(run.diff, Diff(predicted, measured, diff_options));
  const DiffResult& diff = run.diff;
  if (diff.predicted.events.empty() && diff.measured.events.empty()) {
    return Status::InvalidInput(request.rank >= 0
                                    ? fmt::format("--rank {}: neither trace has events of that rank", request.rank)
                                    : fmt::format("{} and {}: neither trace has events", request.predicted,
                                                  request.measured));
  }
  SHARDSCOPE_RETURN_IF_ERROR(WriteDiffOutputs(predicted, measured, diff, request.out_dir, diff_options));
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

StatusOr<AnalyzeRun> RunAnalyze(const AnalyzeRequest& request) {
  if (request.rank < -1) return Status::InvalidInput(fmt::format("--rank: expected a rank >= 0, got {}", request.rank));
  if (!(request.kernel_wait_threshold_us >= 0) || request.kernel_wait_threshold_us > 1e9) {
    return Status::InvalidInput(
        fmt::format("--kernel-wait-threshold-us: expected a number of microseconds >= 0, got {}",
                    request.kernel_wait_threshold_us));
  }
  AnalyzeRun run;
  SHARDSCOPE_ASSIGN_OR_RETURN(DiffSide side, LoadTraceFiles(request.traces, &run.warnings));
  run.options.rank = request.rank;
  run.options.kernel_wait_threshold_ns = static_cast<int64_t>(request.kernel_wait_threshold_us * 1000.0 + 0.5);
  run.options.include_last_profiler_step = request.include_last_step;
  run.options.round_to_whole_us = !request.exact_ns;
  run.ranks = ComputeHtaMetrics(side, run.options);
  if (run.ranks.empty()) {
    return Status::InvalidInput(request.rank >= 0 ? fmt::format("--rank {}: no events of that rank", request.rank)
                                                  : fmt::format("{}: no events", side.source));
  }
  return run;
}

}  // namespace shardscope::traces

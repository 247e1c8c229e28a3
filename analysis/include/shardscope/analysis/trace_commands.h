// `shardscope diff` and `shardscope analyze` as library calls, for the CLI and the Python
// module alike: option checks, loading the traces, the step cut, the diff or the metrics.
// (Moved from cli/diff_command.cc RunDiff and cli/analyze_command.cc RunAnalyze.)
#ifndef SHARDSCOPE_ANALYSIS_TRACE_COMMANDS_H_
#define SHARDSCOPE_ANALYSIS_TRACE_COMMANDS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "shardscope/analysis/diff.h"
#include "shardscope/analysis/hta_metrics.h"
#include "shardscope/base/status.h"

namespace shardscope::traces {

struct DiffRequest {
  std::string predicted;  // a trace file, a directory holding trace.json, or of per-rank *.json
  std::string measured;   // the same forms
  std::string out_dir;    // trace.json, report.md, report.json are written here
  int32_t top_n = 20;     // --top
  int32_t rank = -1;      // --rank (-1: all)
  bool full = false;      // --full
  int64_t step = -1;      // --step (-1: the median measured step)
};

struct DiffRun {
  DiffResult diff;
  std::string predicted_step_note;  // what SelectDiffStep did to each side ("" : nothing)
  std::string measured_step_note;
  // The lines `shardscope diff` prints after the notes: step times and their difference, the
  // match counts, the files written.
  std::string headline;
};

// Loads both sides, cuts them to one step, diffs them and writes the outputs into
// request.out_dir. `warn` receives each side's warnings (time scale) as they are known.
StatusOr<DiffRun> RunDiff(const DiffRequest& request, const std::function<void(const std::string&)>& warn);

struct AnalyzeRequest {
  std::vector<std::string> traces;        // files or directories (LoadTraceFiles)
  int32_t rank = -1;                      // --rank (-1: all)
  double kernel_wait_threshold_us = 30;   // --kernel-wait-threshold-us
  bool include_last_step = false;         // --include-last-step
  bool exact_ns = false;                  // --exact-ns
};

struct AnalyzeRun {
  HtaOptions options;
  std::vector<HtaRankMetrics> ranks;
  std::vector<std::string> warnings;  // from reading the traces (a file's rank taken from its position)
};

// HTA's metrics of the traces; InvalidInput for bad options or when no rank has events.
StatusOr<AnalyzeRun> RunAnalyze(const AnalyzeRequest& request);

}  // namespace shardscope::traces

#endif  // SHARDSCOPE_ANALYSIS_TRACE_COMMANDS_H_

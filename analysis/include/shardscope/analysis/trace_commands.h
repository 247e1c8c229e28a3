// `shardscope diff` and `shardscope analyze` as library calls, for the CLI and the Python
// module alike: option checks, loading the traces, the step cut, the diff or the metrics.
// (Moved from cli/diff_command.cc RunDiff and cli/analyze_command.cc RunAnalyze.)
#ifndef SHARDSCOPE_ANALYSIS_TRACE_COMMANDS_H_
#define SHARDSCOPE_ANALYSIS_TRACE_COMMANDS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "shardscope/analysis/diff.h"
#include "shardscope/analysis/hta_metrics.h"
#include "shardscope/base/status.h"

namespace shardscope::traces {

struct DiffRequest {
  std::string predicted;  // a trace file, a directory holding trace.json, or of per-rank *.json
  std::string measured;   // the same forms
  // trace.json, report.md, report.json replace this folder's previous set as one
  // (base/output_dir.h).
  std::string out_dir;
  int32_t top_n = 20;                  // --top
  std::optional<int32_t> rank;         // --rank (nullopt: every rank; a given rank must be >= 0)
  bool full = false;                   // --full
  std::optional<int64_t> step;         // --step (nullopt: the median measured step; likewise >= 0)
};

// Where RunDiff and RunAnalyze say what they do as they do it. Any member may be empty.
struct TraceCommandOutput {
  std::function<void(const std::string&)> note;   // the next piece of work ("reading the measured side x")
  std::function<void(const std::string&)> warn;   // a side's warning (its time scale)
  // diff: the lines it prints before the diff is computed (which step of a multi-step trace
  // was taken: "measured: ...", "predicted: ..."), each with its newline.
  std::function<void(const std::string&)> print;
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
// request.out_dir.
StatusOr<DiffRun> RunDiff(const DiffRequest& request, const TraceCommandOutput& output);

struct AnalyzeRequest {
  std::vector<std::string> traces;        // files or directories (LoadTraceFiles)
  std::optional<int32_t> rank;            // --rank (nullopt: every rank; a given rank must be >= 0)
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
// `output.note` says what is being done; the warnings are returned, not passed to `warn`.
StatusOr<AnalyzeRun> RunAnalyze(const AnalyzeRequest& request, const TraceCommandOutput& output = {});

}  // namespace shardscope::traces

#endif  // SHARDSCOPE_ANALYSIS_TRACE_COMMANDS_H_

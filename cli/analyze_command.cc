// `shardscope analyze TRACE... [--json] [-o FILE]`: Holistic Trace Analysis's per-rank GPU
// metrics (traces/hta_metrics.h) of traces users already have: PyTorch-profiler files
// (`*.pt.trace.json[.gz]`, one per rank, any schema version), `shardscope simulate`'s and
// `shardscope run --profile`'s trace.json, or directories holding them. docs/ANALYZE.md.
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "commands.h"
#include "progress.h"
#include "shardscope/analysis/trace_commands.h"
#include "shardscope/base/file_io.h"
#include "shardscope/analysis/hta_metrics.h"

namespace shardscope::cli {
namespace {

struct AnalyzeOptions {
  std::vector<std::string> traces;
  bool json = false;
  std::string output;  // "" : standard output
  int rank = -1;  // -1: every rank (the flag not given; a given --rank must be >= 0)
  bool rank_given = false;
  double kernel_wait_threshold_us = 30;
  bool include_last_step = false;
  bool exact_ns = false;
  bool quiet = false;
};

Status RunAnalyze(const AnalyzeOptions& options) {
  traces::AnalyzeRequest request;
  request.traces = options.traces;
  if (options.rank_given) request.rank = options.rank;
  request.kernel_wait_threshold_us = options.kernel_wait_threshold_us;
  request.include_last_step = options.include_last_step;
  request.exact_ns = options.exact_ns;
  traces::TraceCommandOutput output;
  output.note = [&options](const std::string& note) { Progress::Note(options.quiet, note); };
  SHARDSCOPE_ASSIGN_OR_RETURN(traces::AnalyzeRun run, traces::RunAnalyze(request, output));
  if (!options.quiet) {
    for (const std::string& warning : run.warnings) std::cerr << "shardscope analyze: warning: " << warning << "\n";
  }
  const std::string text = options.json ? traces::HtaMetricsJson(run.ranks, run.options) : traces::HtaMetricsText(run.ranks);
  if (options.output.empty()) {
    std::cout << text;
    return Status::Ok();
  }
  SHARDSCOPE_RETURN_IF_ERROR(traces::WriteFileAtomically(options.output, text));
  std::cout << fmt::format("wrote {}\n", options.output);
  return Status::Ok();
}

}  // namespace

CommandRunner AddAnalyzeCommand(CLI::App& app) {
  auto options = std::make_shared<AnalyzeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "analyze",
      "Holistic Trace Analysis's metrics per rank: temporal breakdown (idle / compute / non-compute % of the "
      "GPU span), communication-computation overlap, idle time per stream (host wait, kernel wait, other) and "
      "kernel types (docs/ANALYZE.md)");
  cmd->add_option("traces", options->traces,
                  "PyTorch-profiler traces (*.pt.trace.json or .json.gz, one per rank; the rank is distributedInfo.rank, "
                  "else the position among these arguments), shardscope trace.json files, or directories holding them")
      ->required();
  cmd->add_flag("--json", options->json, "Print JSON ({\"ranks\":[{\"rank\",\"idle_pct\",...}]}) instead of tables");
  cmd->add_option("-o,--output", options->output, "Write to this file instead of standard output");
  CLI::Option* rank = cmd->add_option("--rank", options->rank, "Analyze this rank only (>= 0)");
  cmd->add_option("--kernel-wait-threshold-us", options->kernel_wait_threshold_us,
                  "A gap between kernels on a stream shorter than this is kernel wait (HTA's consecutive_kernel_delay "
                  "of 30, applied to Kineto's microsecond timestamps)")
      ->capture_default_str();
  cmd->add_flag("-q,--quiet", options->quiet, "No progress messages or warnings on stderr");
  cmd->add_flag("--include-last-step", options->include_last_step,
                "Keep the GPU work of the last ProfilerStep (HTA's include_last_profiler_step)");
  cmd->add_flag("--exact-ns", options->exact_ns,
                "Do not round fractional-microsecond timestamps inward to whole microseconds as HTA's parser does");
  return [cmd, options, rank]() -> std::optional<Status> {
    if (!*cmd) return std::nullopt;
    options->rank_given = rank->count() > 0;
    return RunAnalyze(*options);
  };
}

}  // namespace shardscope::cli

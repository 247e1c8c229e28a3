// `shardscope simulate` as a library call: one plan or schedule simulated with its trace,
// hang rendering, Flight Recorder dumps, memory snapshots, the cost of its divergence and
// report.json. The CLI writes the results into its output folder; the Python module does the
// same, or keeps them in memory.
//
//   SHARDSCOPE_ASSIGN_OR_RETURN(LoadedInput input, LoadInput(path));
//   traces::Timeline trace;                      // or a ChromeTraceWriter streaming to disk
//   SHARDSCOPE_ASSIGN_OR_RETURN(SimulateRun run, RunSimulation(input, {}, trace, write_file));
//   ... run.report_json, SimulateSummaryText(input, run)
#ifndef SHARDSCOPE_SIM_REPORT_SIMULATE_RUN_H_
#define SHARDSCOPE_SIM_REPORT_SIMULATE_RUN_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "shardscope/base/output_dir.h"
#include "shardscope/base/status.h"
#include "shardscope/sim/engine/engine.h"
#include "shardscope/sim/lowering/load_input.h"
#include "shardscope/sim/report/report.h"
#include "shardscope/traces/timeline.h"

namespace shardscope::sim {

struct SimulateRunOptions {
  // The ranks in the trace. nullopt: the default (the first node, then every rank whose
  // timeline differs from all ranks already shown; DefaultTraceRanks).
  std::optional<std::vector<int32_t>> trace_ranks;
  // Rank -> slowdown of its kernels and copies (>= 1); added to, and for its ranks replacing,
  // the plan's divergence.slowdown (`simulate --straggler`).
  std::map<int32_t, double> stragglers;
  std::optional<InjectedOom> inject_oom;  // InjectedOomAt (simulate.h) checks one
  std::function<void(double)> progress;   // the first run's fraction done (EngineConfig::progress)
  std::function<void()> progress_done;    // after the first run (a progress line is cleared)
  std::function<void(const std::string&)> note;  // a line about what is being done next
  // The cost provider (MakeCostProvider of the input), when the caller made it first to fail
  // before writing anything; null: RunSimulation makes it.
  const CostProvider* costs = nullptr;
};

// The files besides trace.json and report.json (flight_recorder_rank<N>.json,
// memory_snapshot_rank<N>.json / .pickle), handed over by name as each is made.
using SimulateFileWriter = std::function<Status(const std::string& name, const std::string& content)>;

// What `simulate -o DIR` writes, replaced as one set (base/output_dir.h): trace.json,
// report.json (renamed in last), the Flight Recorder dumps and the memory snapshots.
OutputSpec SimulateOutputs();

struct SimulateRun {
  SimulationResult result;
  std::optional<DivergenceCost> divergence;  // when stragglers or divergence variants ran
  std::vector<int32_t> flight_recorder_ranks;  // the blocked ranks given a dump (at most 64)
  std::string report_json;                     // report.json's text
};

// Runs `input` as `shardscope simulate` does. The traced ranks' events go to `trace` (the
// caller finishes its writer); `write_file` receives the dumps and snapshots.
StatusOr<SimulateRun> RunSimulation(const LoadedInput& input, const SimulateRunOptions& options,
                                    traces::TimelineSink& trace, const SimulateFileWriter& write_file);

// What `shardscope simulate` prints: SummaryText, then what the divergence costs.
std::string SimulateSummaryText(const LoadedInput& input, const SimulateRun& run);

// The summary line: which ranks straggle or run a different plan (variants: "rank(s) 5 run
// training.seq_len 12288"), and what it costs (step with it vs with every rank alike).
// (Moved from cli/check_command.cc.)
std::string DivergenceSummary(const std::vector<std::string>& sources, int64_t with_ns, int64_t without_ns);

// The loaded input simulated once, without a trace (`simulate --compare`).
StatusOr<SimulationResult> SimulateUntraced(const LoadedInput& input);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_REPORT_SIMULATE_RUN_H_

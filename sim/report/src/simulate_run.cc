// RunSimulation: the body of `shardscope simulate` (moved from cli/main.cc RunSimulate), so
// the CLI and the Python module run one pipeline. The order of the runs is the CLI's: the
// traced run, a second traced run for ranks whose timelines differ, the hang's rendering and
// its Flight Recorder run, the snapshots, and the run with every rank alike.
#include "shardscope/sim/report/simulate_run.h"

#include <algorithm>
#include <memory>

#include <fmt/format.h>

#include "shardscope/sim/hangs/hang.h"
#include "shardscope/sim/lowering/lowering.h"
#include "shardscope/sim/simulate/simulate.h"

namespace shardscope::sim {

OutputSpec SimulateOutputs() {
  return OutputSpec{{"trace.json", "report.json", "flight_recorder_rank*.json", "memory_snapshot_rank*.json",
                     "memory_snapshot_rank*.pickle"},
                    "report.json"};
}

StatusOr<SimulateRun> RunSimulation(const LoadedInput& loaded, const SimulateRunOptions& options,
                                    traces::TimelineSink& trace, const SimulateFileWriter& write_file) {
  const traces::Schedule& schedule = loaded.schedule;
  const SimulationSetup& setup = loaded.setup;
  std::unique_ptr<CostProvider> own_costs;
  if (options.costs == nullptr) {
    SHARDSCOPE_ASSIGN_OR_RETURN(own_costs, MakeCostProvider(schedule, setup));
  }
  const CostProvider& costs = options.costs != nullptr ? *options.costs : *own_costs;
  EngineConfig config = EngineConfigFor(setup, schedule);
  for (const auto& [rank, factor] : options.stragglers) config.rank_slowdown[rank] = factor;
  config.inject_oom = options.inject_oom;
  config.progress = options.progress;

  const bool by_default = !options.trace_ranks.has_value();
  std::vector<int32_t> first_ranks;
  if (by_default) {
    for (int32_t r = 0; r < std::min(schedule.world_size(), setup.cluster.gpus_per_node); ++r) first_ranks.push_back(r);
  } else {
    first_ranks = *options.trace_ranks;
  }

  SimulateRun run;
  // The default trace shows the first node, then any rank whose timeline differs from every
  // rank shown; that is only known after a run, so such ranks are traced in a second run
  // (the engine is deterministic, so both runs agree).
  TraceRecorder recorder(schedule, first_ranks, trace);
  SHARDSCOPE_ASSIGN_OR_RETURN(run.result, Simulate(schedule, costs, config, &recorder));
  const SimulationResult& result = run.result;
  if (options.progress_done) options.progress_done();
  if (by_default) {
    std::vector<int32_t> extra;
    for (int32_t r : DefaultTraceRanks(result, setup.cluster.gpus_per_node)) {
      if (r >= setup.cluster.gpus_per_node) extra.push_back(r);
    }
    if (!extra.empty()) {
      if (options.note) options.note(fmt::format("tracing {} rank(s) whose timelines differ", extra.size()));
      TraceRecorder extra_recorder(schedule, extra, trace);
      SHARDSCOPE_RETURN_IF_ERROR(Simulate(schedule, costs, config, &extra_recorder).status());
    }
  }
  // A hang: draw the wait-for graph on the traced ranks (slices where they wait, flows to what
  // they wait for), then write Flight Recorder dumps for the blocked ranks (a second,
  // deterministic run records their collectives).
  if (result.hung) {
    WriteHangTrace(schedule, result, AnalyzeHang(schedule, result),
                   by_default ? DefaultTraceRanks(result, setup.cluster.gpus_per_node) : first_ranks, trace);
    constexpr size_t kMaxFlightRecorderDumps = 64;
    run.flight_recorder_ranks = FlightRecorderRanks(result, kMaxFlightRecorderDumps);
    CollectiveRecorder collectives(schedule, run.flight_recorder_ranks);
    EngineConfig quiet_config = config;
    quiet_config.progress = nullptr;
    SHARDSCOPE_RETURN_IF_ERROR(Simulate(schedule, costs, quiet_config, &collectives).status());
    for (int32_t rank : run.flight_recorder_ranks) {
      SHARDSCOPE_RETURN_IF_ERROR(write_file(fmt::format("flight_recorder_rank{}.json", rank),
                                            FlightRecorderJson(schedule, result, rank, &collectives)));
    }
  }
  // The allocator's state per traced rank, in torch.cuda.memory._snapshot()'s layout.
  for (size_t rank = 0; rank < result.ranks.size(); ++rank) {
    const RankMemory& memory = result.ranks[rank].memory;
    if (memory.snapshot.empty() && memory.history.empty()) continue;
    SHARDSCOPE_RETURN_IF_ERROR(write_file(fmt::format("memory_snapshot_rank{}.json", rank),
                                          MemorySnapshotJson(memory, static_cast<int32_t>(rank))));
    // The same as a pickle, for PyTorch's memory_viz.
    SHARDSCOPE_RETURN_IF_ERROR(
        write_file(fmt::format("memory_snapshot_rank{}.pickle", rank), MemorySnapshotPickle(memory)));
  }
  // What the divergence costs: one more run with every rank alike (the plan without its
  // divergence section, no stragglers, no injected fault; no trace, no memory history).
  const bool has_variants = loaded.plan && !loaded.plan->divergence.variants.empty();
  if (!config.rank_slowdown.empty() || has_variants) {
    traces::Schedule uniform_schedule;
    if (has_variants) {
      SHARDSCOPE_ASSIGN_OR_RETURN(uniform_schedule, LowerPlan(WithoutDivergence(*loaded.plan)));
    }
    const traces::Schedule& baseline_schedule = has_variants ? uniform_schedule : schedule;
    SHARDSCOPE_ASSIGN_OR_RETURN(std::unique_ptr<CostProvider> baseline_costs,
                                MakeCostProvider(baseline_schedule, setup));
    EngineConfig baseline_config = config;
    baseline_config.rank_slowdown.clear();
    baseline_config.inject_oom.reset();
    baseline_config.progress = nullptr;
    baseline_config.memory.record_history = false;
    SHARDSCOPE_ASSIGN_OR_RETURN(SimulationResult baseline,
                                Simulate(baseline_schedule, *baseline_costs, baseline_config, nullptr));
    DivergenceCost& divergence = run.divergence.emplace();
    for (const auto& [rank, factor] : config.rank_slowdown) {
      divergence.sources.push_back(fmt::format("rank {} (kernels and copies x{:g})", rank, factor));
    }
    if (has_variants) {
      for (const RankVariant& variant : loaded.plan->divergence.variants) {
        divergence.sources.push_back(
            fmt::format("rank(s) {} run {}", CompressRanks(variant.ranks), variant.description));
      }
    }
    divergence.uniform_completed = !baseline.hung && !baseline.oom_agreed;
    divergence.uniform_step_ns = baseline.step_ns;
  }
  run.report_json = ReportJson(schedule, setup, result, run.divergence ? &*run.divergence : nullptr);
  return run;
}

std::string DivergenceSummary(const std::vector<std::string>& sources, int64_t with_ns, int64_t without_ns) {
  std::string joined;
  for (const std::string& source : sources) joined += (joined.empty() ? "" : ", ") + source;
  const double delta_ms = static_cast<double>(with_ns - without_ns) * 1e-6;
  const double percent = without_ns > 0 ? 100.0 * static_cast<double>(with_ns - without_ns) / static_cast<double>(without_ns) : 0;
  return fmt::format("  DIVERGENCE: {}: step {:.3f} ms, {:.3f} ms with every rank alike: costs {:+.3f} ms ({:+.1f}%)\n",
                     joined, static_cast<double>(with_ns) * 1e-6, static_cast<double>(without_ns) * 1e-6, delta_ms,
                     percent);
}

std::string SimulateSummaryText(const LoadedInput& input, const SimulateRun& run) {
  std::string out = SummaryText(input.schedule, input.setup, run.result);
  if (run.divergence) {
    if (run.result.hung || !run.divergence->uniform_completed) {
      out += fmt::format("  DIVERGENCE: no cost reported: the step {} not complete\n",
                         run.result.hung ? "does" : "with every rank alike does");
    } else {
      out += DivergenceSummary(run.divergence->sources, run.result.step_ns, run.divergence->uniform_step_ns);
    }
  }
  return out;
}

StatusOr<SimulationResult> SimulateUntraced(const LoadedInput& input) {
  SHARDSCOPE_ASSIGN_OR_RETURN(std::unique_ptr<CostProvider> costs, MakeCostProvider(input.schedule, input.setup));
  const EngineConfig config = EngineConfigFor(input.setup, input.schedule);
  return Simulate(input.schedule, *costs, config, nullptr);
}

}  // namespace shardscope::sim

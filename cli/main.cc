// shardscope: simulate sharded data-parallel training plans before renting the cluster.
//
// Only main() decides exit codes: 0 success, 1 internal or I/O failure, 2 bad input (plan,
// schedule, arguments). Files are written to a temporary name and renamed into place, so a
// failed run never leaves a half-written output.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <new>
#include <sstream>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "shardscope/sim/memory/alloc_trace.h"
#include "shardscope/sim/lowering/lowering.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/sim/hangs/hang.h"
#include "shardscope/sim/report/report.h"
#include "shardscope/sim/report/simulate_run.h"
#include "commands.h"
#include "inputs.h"
#include "launcher.h"
#include "progress.h"
#include "shardscope/base/output_dir.h"
#include "shardscope/sim/report/version.h"
#include "shardscope/traces/chrome_trace.h"
#include "shardscope/base/file_io.h"
#include "shardscope/traces/listing.h"
#include "shardscope/traces/schedule_json.h"

namespace {

using namespace shardscope;

int ExitCodeFor(const Status& status) {
  return status.code() == StatusCode::kInvalidInput ? 2 : 1;
}

// Under mpirun the message is printed once (launcher.h).
int Fail(const Status& status) {
  std::cerr << cli::ErrorLineForThisProcess(status);
  return ExitCodeFor(status);
}


// "all", "none", or a list like "0-7,12,100".
StatusOr<std::vector<int32_t>> ParseTraceRanks(const std::string& text, int32_t world) {
  if (text == "none") return std::vector<int32_t>{};
  if (text == "all") {
    std::vector<int32_t> ranks;
    for (int32_t r = 0; r < world; ++r) ranks.push_back(r);
    return ranks;
  }
  return cli::ParseRankList(text, world, "--trace-ranks");
}

struct SimulateOptions {
  std::string input;
  std::string out_dir = "shardscope-out";
  std::string trace_ranks = "default";
  std::vector<std::string> stragglers;  // RANK:FACTOR
  std::string inject_oom;               // RANK:OP_ID
  bool quiet = false;
  bool force = false;                   // past the work and trace-size limits (lowering/work_limits.h)
  bool all_ranks = false;               // every rank simulated (EngineConfig::reduce_symmetry off)
};

Status RunSimulate(const SimulateOptions& options) {
  cli::Progress::Note(options.quiet, fmt::format("loading {}", options.input));
  // The traced ranks decide what the run holds and writes: LoadInput checks it before lowering.
  const bool by_default = options.trace_ranks == "default";
  const auto traced_ranks = [&](int32_t world, int32_t gpus_per_node) -> StatusOr<int64_t> {
    if (by_default) return static_cast<int64_t>(std::min(world, gpus_per_node));
    SHARDSCOPE_ASSIGN_OR_RETURN(std::vector<int32_t> ranks, ParseTraceRanks(options.trace_ranks, world));
    return static_cast<int64_t>(ranks.size());
  };
  cli::LoadOptions load = cli::LoadOptionsWith(options.force, options.quiet, options.all_ranks);
  load.traced_ranks = traced_ranks;
  SHARDSCOPE_ASSIGN_OR_RETURN(cli::LoadedInput loaded, cli::LoadInput(options.input, load));
  const traces::Schedule& schedule = loaded.schedule;
  SHARDSCOPE_ASSIGN_OR_RETURN(std::unique_ptr<sim::CostProvider> costs, sim::MakeCostProvider(schedule, loaded.setup));
  sim::SimulateRunOptions run_options;
  run_options.costs = costs.get();
  // --straggler adds to (and for its ranks replaces) the plan's divergence.slowdown.
  SHARDSCOPE_ASSIGN_OR_RETURN(run_options.stragglers, cli::ParseStragglers(options.stragglers, schedule.world_size()));
  SHARDSCOPE_ASSIGN_OR_RETURN(run_options.inject_oom, cli::ParseInjectedOom(options.inject_oom, schedule));
  run_options.note = [&options](const std::string& note) { cli::Progress::Note(options.quiet, note); };

  // Everything that can reject the input happens before anything is written.
  if (!by_default) {
    SHARDSCOPE_ASSIGN_OR_RETURN(run_options.trace_ranks, ParseTraceRanks(options.trace_ranks, schedule.world_size()));
  }

  // Everything goes into a staging folder; the set replaces DIR's only when all is written.
  SHARDSCOPE_ASSIGN_OR_RETURN(std::unique_ptr<OutputDir> out, OutputDir::Create(options.out_dir, sim::SimulateOutputs()));
  traces::TraceInfo info;
  info.world_size = schedule.world_size();
  info.producer = fmt::format("shardscope {} simulate", sim::Version());
  const std::string trace_path = out->FinalPath("trace.json");
  SHARDSCOPE_ASSIGN_OR_RETURN(auto writer, traces::ChromeTraceWriter::Open(out->StagingPath("trace.json"), info));

  cli::Progress progress(fmt::format("simulating {} ranks, {} ops per rank", schedule.world_size(),
                                     schedule.programs.empty() ? 0 : schedule.ProgramOf(0).ops.size()),
                         options.quiet);
  if (!options.quiet) run_options.progress = [&progress](double fraction) { progress.Update(fraction); };
  run_options.progress_done = [&progress] { progress.Done(); };
  // The dumps and snapshots go into the staging folder beside trace.json.
  const auto write_file = [&](const std::string& name, const std::string& content) {
    return traces::WriteFileAtomically(out->StagingPath(name), content);
  };
  SHARDSCOPE_ASSIGN_OR_RETURN(sim::SimulateRun run, sim::RunSimulation(loaded, run_options, *writer, write_file));
  SHARDSCOPE_RETURN_IF_ERROR(writer->Finish());
  const std::string report_path = out->FinalPath("report.json");
  SHARDSCOPE_RETURN_IF_ERROR(traces::WriteFileAtomically(out->StagingPath("report.json"), run.report_json));
  SHARDSCOPE_RETURN_IF_ERROR(out->Commit());
  std::cout << sim::SimulateSummaryText(loaded, run);
  std::cout << fmt::format("  wrote {} (open in ui.perfetto.dev) and {}\n", trace_path, report_path);
  const std::vector<int32_t>& dumped = run.flight_recorder_ranks;
  if (!dumped.empty()) {
    std::cout << fmt::format("  wrote flight_recorder_rank<N>.json for {} of {} blocked rank(s) ({}; at most 64), "
                             "in PyTorch Flight Recorder's JSON layout\n",
                             dumped.size(), run.result.blocked.size(), sim::CompressRanks(dumped));
  }
  return Status::Ok();
}

// `simulate --compare A B`: both simulated without traces, the summaries side by side.
Status RunCompare(const std::vector<std::string>& inputs, bool quiet, bool force, bool all_ranks) {
  struct Run {
    cli::LoadedInput loaded;
    sim::SimulationResult result;
  };
  std::vector<Run> runs;
  for (const std::string& input : inputs) {
    cli::Progress::Note(quiet, fmt::format("simulating {}", input));
    SHARDSCOPE_ASSIGN_OR_RETURN(cli::LoadedInput loaded,
                                cli::LoadInput(input, cli::LoadOptionsWith(force, quiet, all_ranks)));
    SHARDSCOPE_ASSIGN_OR_RETURN(sim::SimulationResult result, sim::SimulateUntraced(loaded));
    runs.push_back(Run{std::move(loaded), std::move(result)});
  }
  const auto compared = [&](size_t i) {
    return sim::ComparedRun{inputs[i], &runs[i].loaded.schedule, &runs[i].loaded.setup, &runs[i].result};
  };
  std::cout << sim::CompareText(compared(0), compared(1));
  return Status::Ok();
}

Status RunSchedule(const std::string& input, const std::string& output, bool listing, int32_t rank, bool force) {
  SHARDSCOPE_ASSIGN_OR_RETURN(cli::LoadedInput loaded, cli::LoadInput(input, cli::LoadOptionsWith(force, false)));
  if (listing) {
    if (rank < 0 || rank >= loaded.schedule.world_size()) {
      return Status::InvalidInput(fmt::format("{}: --rank {} is outside the world of {} ranks", input, rank,
                                              loaded.schedule.world_size()));
    }
    const std::string text = traces::ScheduleListing(loaded.schedule, rank);
    if (output.empty() || output == "-") {
      std::cout << text;
      return Status::Ok();
    }
    return traces::WriteFileAtomically(output, text);
  }
  SHARDSCOPE_RETURN_IF_ERROR(traces::WriteScheduleFile(loaded.schedule, output.empty() ? "schedule.json" : output));
  std::cout << fmt::format("wrote {}: {} ranks, {} program(s), {} ops in the first program\n", output,
                           loaded.schedule.world_size(), loaded.schedule.programs.size(),
                           loaded.schedule.programs.empty() ? 0 : loaded.schedule.programs[0].ops.size());
  return Status::Ok();
}


// `alloc-replay`: replays an allocation trace through the caching-allocator model.
// `alloc-trace`: writes the allocation trace of one rank of a plan. Both exist to check the
// model against PyTorch's allocator on a GPU (docs/VALIDATION.md).
struct AllocTraceOptions {
  std::string replay_input;
  bool replay_json = false;
  std::string plan;
  std::string output;
  int32_t rank = 0;
  // 0: the plan's GPU as the simulator sees it (AllocatorCapacity: the preset's memory less
  // the CUDA context and what the plan reserves for others), so the trace OOMs where the
  // simulation does. Give a smaller figure to replay the trace on a GPU that has less.
  double device_memory_gb = 0;
};

Status RunAllocReplay(const AllocTraceOptions& options) {
  SHARDSCOPE_ASSIGN_OR_RETURN(sim::AllocTrace trace, sim::ReadAllocTraceFile(options.replay_input));
  SHARDSCOPE_ASSIGN_OR_RETURN(sim::AllocReplayResult result, sim::ReplayAllocTrace(trace));
  if (options.replay_json) {
    std::cout << sim::AllocReplayResultToJson(trace, result, options.replay_input);
    return Status::Ok();
  }
  constexpr double kBytesPerMiB = 1 << 20;
  const sim::MemoryStats& s = result.stats;
  std::cout << fmt::format("{}: {} ops, alloc_conf '{}', memory_fraction {}, device {} bytes\n", options.replay_input,
                           trace.ops.size(), trace.alloc_conf, trace.memory_fraction, trace.device_memory_bytes);
  std::cout << fmt::format("  peak reserved      {:>12.2f} MiB ({} B)\n", s.reserved_bytes_peak / kBytesPerMiB,
                           s.reserved_bytes_peak);
  std::cout << fmt::format("  peak allocated     {:>12.2f} MiB ({} B)\n", s.allocated_bytes_peak / kBytesPerMiB,
                           s.allocated_bytes_peak);
  std::cout << fmt::format("  num_alloc_retries  {:>12}\n", s.num_alloc_retries);
  std::cout << fmt::format("  num_ooms           {:>12}\n", s.num_ooms);
  std::cout << fmt::format("  segments           {:>12} (peak {})\n", s.segment, s.segment_peak);
  for (const sim::AllocReplayOom& oom : result.ooms) {
    std::cout << fmt::format("  OOM at ops[{}]: requested {} B, {} B free on the device\n", oom.op_index,
                             oom.outcome.requested_bytes, oom.outcome.device_free_bytes);
  }
  return Status::Ok();
}

Status RunAllocTrace(const AllocTraceOptions& options) {
  constexpr double kBytesPerGiB = double(int64_t{1} << 30);
  if (options.device_memory_gb < 0 || !std::isfinite(options.device_memory_gb) ||
      options.device_memory_gb * kBytesPerGiB > 9.0e18) {
    return Status::InvalidInput(
        fmt::format("--device-memory-gb: expected a positive number of GiB, got {}", options.device_memory_gb));
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(shardscope::cli::LoadedInput input, shardscope::cli::LoadInput(options.plan));
  const traces::Schedule& schedule = input.schedule;
  if (options.rank < 0 || options.rank >= schedule.world_size()) {
    return Status::InvalidInput(fmt::format("{}: --rank {} is outside the world of {} ranks", options.plan,
                                            options.rank, schedule.world_size()));
  }
  const int64_t device_bytes = options.device_memory_gb > 0
                                   ? static_cast<int64_t>(options.device_memory_gb * kBytesPerGiB)
                                   : sim::AllocatorCapacity(input.setup, options.rank);
  sim::AllocTrace trace = sim::AllocTraceFromSchedule(schedule, options.rank, device_bytes);
  trace.description = fmt::format("{}, rank {}: {}", std::filesystem::path(options.plan).filename().string(),
                                  options.rank, trace.description);
  SHARDSCOPE_RETURN_IF_ERROR(traces::WriteFileAtomically(options.output, sim::AllocTraceToJson(trace)));
  std::cout << fmt::format("wrote {}: {} ops, {} streams, device {} bytes\n", options.output, trace.ops.size(),
                           trace.streams, trace.device_memory_bytes);
  return Status::Ok();
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"shardscope: simulate sharded data-parallel training (FSDP1/FSDP2, HSDP, ZeRO-1/2/3, DDP) before you run it.\n"
               "Predicts step time, compute/communication overlap and hangs from a plan file."};
  app.set_version_flag("--version", std::string(shardscope::sim::Version()));
  app.require_subcommand(1);

  SimulateOptions simulate;
  CLI::App* simulate_cmd = app.add_subcommand(
      "simulate", "Simulate a plan (YAML) or a schedule (JSON): writes DIR/trace.json and DIR/report.json");
  std::vector<std::string> compare_inputs;
  CLI::Option* input_option =
      simulate_cmd->add_option("input", simulate.input, "Plan YAML or schedule JSON")->check(CLI::ExistingFile);
  CLI::Option* compare_option =
      simulate_cmd
          ->add_option("--compare", compare_inputs,
                       "Simulate two plans (A.yaml B.yaml) and print their summaries side by side with the "
                       "differences; writes nothing")
          ->expected(2)
          ->check(CLI::ExistingFile);
  input_option->excludes(compare_option);
  simulate_cmd->add_option("-o,--output", simulate.out_dir, "Output directory")->capture_default_str();
  simulate_cmd->add_option("--trace-ranks", simulate.trace_ranks,
                           "Ranks in the trace: 'default' (first node + every rank whose timeline differs), "
                           "'all', 'none', or a list like '0-7,12'")
      ->capture_default_str();
  simulate_cmd->add_option("--straggler", simulate.stragglers,
                           "RANK:FACTOR: that rank's kernels and copies run FACTOR (>= 1) x slower; repeatable. "
                           "The summary says what it costs (one more run without it)");
  simulate_cmd->add_option("--inject-oom", simulate.inject_oom,
                           "RANK:OP_ID: that allocate op fails as an out-of-memory (the fault of `check`; `run` takes the same)");
  simulate_cmd->add_flag("-q,--quiet", simulate.quiet, "No progress messages or warnings on stderr");
  simulate_cmd->add_flag("--force", simulate.force,
                         "Go on past the size limits (a schedule over 8 GiB in memory, a trace.json over 2 GiB)");
  simulate_cmd->add_flag("--all-ranks", simulate.all_ranks, cli::kAllRanksHelp);

  std::string schedule_input, schedule_output;
  bool schedule_listing = false;
  int32_t schedule_rank = 0;
  CLI::App* schedule_cmd = app.add_subcommand("schedule", "Lower a plan into its schedule JSON (the per-rank programs)");
  schedule_cmd->add_option("plan", schedule_input, "Plan YAML (or a schedule JSON to normalize)")
      ->required()
      ->check(CLI::ExistingFile);
  schedule_cmd->add_option("-o,--output", schedule_output,
                           "File to write (default: schedule.json; the listing goes to stdout)");
  schedule_cmd->add_flag("--listing", schedule_listing,
                         "Write a human-readable listing of one rank's program (ops, streams, waits, "
                         "allocations) instead of the JSON");
  schedule_cmd->add_option("--rank", schedule_rank, "Rank whose program --listing shows")->capture_default_str();
  bool schedule_force = false;
  schedule_cmd->add_flag("--force", schedule_force, "Go on past the size limit (a schedule over 8 GiB in memory)");

  AllocTraceOptions alloc;
  CLI::App* alloc_replay_cmd = app.add_subcommand(
      "alloc-replay", "Replay an allocation trace (JSON) or a real memory snapshot (--snapshot) through the "
                      "caching-allocator model (docs/ALLOC_TRACE.md)");
  CLI::Option* alloc_trace_input =
      alloc_replay_cmd->add_option("trace", alloc.replay_input, "Allocation trace JSON")->check(CLI::ExistingFile);
  alloc_replay_cmd->add_flag("--json", alloc.replay_json, "Print the statistics as JSON (torch.cuda.memory_stats() keys)");
  // --snapshot: a real memory snapshot compared decision by decision (alloc_snapshot_command.cc).
  std::string snapshot_input;
  int64_t snapshot_device_bytes = 0;
  CLI::Option* snapshot_option =
      alloc_replay_cmd
          ->add_option("--snapshot", snapshot_input,
                       "Replay a memory snapshot pickle (torch.cuda.memory._dump_snapshot) from the state when "
                       "recording began and compare every allocator action; exit 0 exact, 1 diverges")
          ->check(CLI::ExistingFile)
          ->excludes(alloc_trace_input);
  alloc_replay_cmd
      ->add_option("--device-memory-bytes", snapshot_device_bytes,
                   "With --snapshot: what cudaMalloc can give the allocator in all (default: inferred from an oom "
                   "or a release-and-retry in the trace, else unlimited)")
      ->needs(snapshot_option);
  CLI::App* alloc_trace_cmd = app.add_subcommand("alloc-trace", "Write the allocation trace of one rank of a plan");
  alloc_trace_cmd->add_option("plan", alloc.plan, "Plan YAML (or schedule JSON)")->required()->check(CLI::ExistingFile);
  alloc_trace_cmd->add_option("--rank", alloc.rank, "Rank whose program is traced")->capture_default_str();
  alloc_trace_cmd->add_option("-o,--output", alloc.output, "Allocation trace JSON to write")->required();
  alloc_trace_cmd->add_option("--device-memory-gb", alloc.device_memory_gb,
                              "Device memory of the trace, in GiB (default: what the simulator gives the plan's "
                              "GPU: its memory less the CUDA context and memory reserved by others)");

  const shardscope::cli::CommandRunner memory_runner = shardscope::cli::AddMemoryCommand(app);
  const shardscope::cli::CommandRunner fit_runner = shardscope::cli::AddFitCommand(app);
  const shardscope::cli::CommandRunner check_runner = shardscope::cli::AddCheckCommand(app);
  // Commands added after the first ones: each runner says whether its command ran.
  const std::vector<shardscope::cli::CommandRunner> more_runners = {
      shardscope::cli::AddImportCommand(app), shardscope::cli::AddCalibrateCommand(app),
      shardscope::cli::AddRunCommand(app), shardscope::cli::AddDiffCommand(app),
      shardscope::cli::AddAnalyzeCommand(app), shardscope::cli::AddFlightRecorderCommand(app),
      shardscope::cli::AddTuneCommand(app)};

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }

  Status status;
  // Out of memory anywhere below: one message and exit 1, never an abort. The work limits
  // (sim/lowering/work_limits.h) refuse what is known to be too big; this is for what they miss.
  try {
    if (*simulate_cmd) {
      if (!compare_inputs.empty()) {
        status = RunCompare(compare_inputs, simulate.quiet, simulate.force, simulate.all_ranks);
      } else if (simulate.input.empty()) {
        status = Status::InvalidInput("simulate: expected a plan or schedule file, or --compare A.yaml B.yaml");
      } else {
        status = RunSimulate(simulate);
      }
    }
    if (*schedule_cmd) {
      status = RunSchedule(schedule_input, schedule_output, schedule_listing, schedule_rank, schedule_force);
    }
    if (*alloc_replay_cmd) {
      status = !snapshot_input.empty() ? shardscope::cli::RunAllocReplaySnapshot(snapshot_input, alloc.replay_json,
                                                                                snapshot_device_bytes)
               : alloc.replay_input.empty() ? shardscope::Status::InvalidInput("alloc-replay: expected TRACE.json or --snapshot FILE.pickle")
                                            : RunAllocReplay(alloc);
    }
    if (*alloc_trace_cmd) status = RunAllocTrace(alloc);
    if (std::optional<Status> ran = memory_runner()) status = *ran;
    if (std::optional<Status> ran = fit_runner()) status = *ran;
    if (std::optional<Status> ran = check_runner()) status = *ran;
    for (const auto& runner : more_runners) {
      if (std::optional<Status> ran = runner()) status = *ran;
    }
  } catch (const std::bad_alloc&) {
    std::cerr << "shardscope: error: out of memory (the input is larger than this machine can hold; a smaller "
                 "plan, fewer traced ranks, or a machine with more memory)\n";
    return 1;
  }
  return status.ok() ? 0 : Fail(status);
}

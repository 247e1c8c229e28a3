// `shardscope memory`: what fills each chosen rank's device memory when it is fullest, and
// what the allocator reserves beyond that.
// `shardscope fit`: the largest micro-batch (or the activation checkpointing) that fits.
//
// Both print tables for a terminal on stdout; progress goes to stderr. Library errors come
// back as Status values and main() turns them into exit codes (2 for bad input).
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "commands.h"
#include "inputs.h"
#include "progress.h"
#include "shardscope/sim/lowering/lowering.h"
#include "shardscope/sim/lowering/work_limits.h"
#include "shardscope/sim/memory/memory_report.h"
#include "shardscope/sim/memory/memory_text.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/sim/report/report.h"
#include "shardscope/traces/schedule_json.h"

namespace shardscope::cli {
namespace {

constexpr double kBytesPerGiB = double(int64_t{1} << 30);

double GiB(int64_t bytes) { return static_cast<double>(bytes) / kBytesPerGiB; }

// ---- memory

struct MemoryOptions {
  std::string input;
  std::string ranks;  // empty: the default ranks
  bool json = false;
  bool quiet = false;
  bool force = false;
  bool all_ranks = false;
};

Status RunMemory(const MemoryOptions& options) {
  SHARDSCOPE_ASSIGN_OR_RETURN(LoadedInput loaded,
                              LoadInput(options.input, LoadOptionsWith(options.force, options.quiet, options.all_ranks)));
  Progress::Note(options.quiet, fmt::format("simulating the memory of {} ({} ranks)", options.input,
                                            loaded.schedule.world_size()));
  const traces::Schedule& schedule = loaded.schedule;
  const sim::SimulationSetup& setup = loaded.setup;
  std::vector<sim::MemoryBreakdown> breakdowns;
  if (options.ranks.empty()) {
    SHARDSCOPE_ASSIGN_OR_RETURN(breakdowns, sim::SimulateMemoryDefaultRanks(schedule, setup));
  } else {
    SHARDSCOPE_ASSIGN_OR_RETURN(std::vector<int32_t> ranks, ParseRankList(options.ranks, schedule.world_size(), "--ranks"));
    SHARDSCOPE_ASSIGN_OR_RETURN(breakdowns, sim::SimulateMemory(schedule, setup, ranks));
  }
  if (options.json) {
    std::cout << sim::MemoryBreakdownsJson(options.input, schedule.world_size(), breakdowns);
    return Status::Ok();
  }
  std::cout << fmt::format("{}: {} ranks\n", options.input, schedule.world_size());
  for (const sim::MemoryBreakdown& b : breakdowns) std::cout << "\n" << sim::MemoryBreakdownText(b);
  return Status::Ok();
}

// ---- fit

struct FitOptions {
  std::string plan;
  std::string search;
  int64_t max_micro_batch = sim::kDefaultFitMaxMicroBatch;
  bool quiet = false;
  bool force = false;
};

std::string CandidateLabel(const sim::FitCandidate& c) {
  return fmt::format("micro_batch_size {}, activation_checkpointing {}", c.micro_batch_size,
                     sim::ActivationCheckpointingName(c.ac));
}

std::string Verdict(const sim::FitCandidate& c) {
  return c.fits ? fmt::format("fits (peak {:.2f} GiB)", GiB(c.peak_reserved_bytes)) : "does not fit: " + c.note;
}

// Each candidate as it is decided (progress.h: in place on a terminal, sparse lines in a log,
// nothing with -q).
sim::FitProgress MakeProgress(Progress& progress) {
  return [&progress](int done, int total, const sim::FitCandidate& c) {
    progress.Update(total > 0 ? static_cast<double>(done) / total : 0,
                    fmt::format("{}/~{}: {}: {}", done, total, CandidateLabel(c), Verdict(c)));
  };
}

Status RunFit(const FitOptions& options) {
  const std::optional<sim::FitDimension> dimension = sim::ParseFitDimension(options.search);
  if (!dimension) {
    return Status::InvalidInput(fmt::format(
        "--search: expected micro_batch_size or activation_checkpointing, got '{}'", options.search));
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(sim::Plan plan, sim::LoadPlanFile(options.plan));
  // Every candidate lowers the plan: too big a one is refused before the first.
  SHARDSCOPE_ASSIGN_OR_RETURN(sim::WorkEstimate work, sim::EstimatePlanWork(plan));
  SHARDSCOPE_RETURN_IF_ERROR(sim::CheckWork(work, options.plan, WorkLimitsWith(options.force, options.quiet)));
  Progress progress(fmt::format("fit: searching {}", options.search), options.quiet);
  SHARDSCOPE_ASSIGN_OR_RETURN(sim::FitResult fit,
                              sim::FitSearch(plan, *dimension, options.max_micro_batch, MakeProgress(progress)));
  progress.Done();

  std::cout << sim::FitReportText(options.plan, fit);
  // main() maps every error but bad input to exit code 1, which is what "nothing fits" must
  // return; the message repeats the reason on stderr.
  if (!fit.best) return Status::Internal("nothing fits: " + fit.reason);
  return Status::Ok();
}

}  // namespace

CommandRunner AddMemoryCommand(CLI::App& app) {
  auto options = std::make_shared<MemoryOptions>();
  CLI::App* cmd = app.add_subcommand(
      "memory", "Break down each rank's device memory at its peak (caching allocator simulated)");
  cmd->add_option("input", options->input, "Plan YAML or schedule JSON")->required()->check(CLI::ExistingFile);
  cmd->add_option("--ranks", options->ranks,
                  "Ranks to show, like '0,5' or '0-3' (default: rank 0 and the rank with the highest peak)");
  cmd->add_flag("--json", options->json, "Print the breakdowns as JSON");
  cmd->add_flag("-q,--quiet", options->quiet, "No progress messages or warnings on stderr");
  cmd->add_flag("--force", options->force, "Go on past the size limit (a schedule over 8 GiB in memory)");
  cmd->add_flag("--all-ranks", options->all_ranks, kAllRanksHelp);
  return [cmd, options]() -> std::optional<Status> {
    if (!*cmd) return std::nullopt;
    return RunMemory(*options);
  };
}

CommandRunner AddFitCommand(CLI::App& app) {
  auto options = std::make_shared<FitOptions>();
  CLI::App* cmd = app.add_subcommand(
      "fit", "Find the largest micro-batch (or the activation checkpointing) that fits in GPU memory");
  cmd->add_option("plan", options->plan, "Plan YAML")->required()->check(CLI::ExistingFile);
  cmd->add_option("--search", options->search, "What to search: micro_batch_size or activation_checkpointing")
      ->required();
  cmd->add_option("--max", options->max_micro_batch, "Largest micro-batch size to try")->capture_default_str();
  cmd->add_flag("-q,--quiet", options->quiet, "No progress messages or warnings on stderr");
  cmd->add_flag("--force", options->force, "Go on past the size limit (a schedule over 8 GiB in memory)");
  return [cmd, options]() -> std::optional<Status> {
    if (!*cmd) return std::nullopt;
    return RunFit(*options);
  };
}

}  // namespace shardscope::cli

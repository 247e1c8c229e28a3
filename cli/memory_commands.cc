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
#include "shardscope/sim/lowering/lowering.h"
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
};

Status RunMemory(const MemoryOptions& options) {
  SHARDSCOPE_ASSIGN_OR_RETURN(LoadedInput loaded, LoadInput(options.input));
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
};

std::string CandidateLabel(const sim::FitCandidate& c) {
  return fmt::format("micro_batch_size {}, activation_checkpointing {}", c.micro_batch_size,
                     sim::ActivationCheckpointingName(c.ac));
}

std::string Verdict(const sim::FitCandidate& c) {
  return c.fits ? fmt::format("fits (peak {:.2f} GiB)", GiB(c.peak_reserved_bytes)) : "does not fit: " + c.note;
}

// On a terminal: one bar redrawn in place. Elsewhere (logs, CI): one line per candidate.
sim::FitProgress MakeProgress() {
  if (!isatty(STDERR_FILENO)) {
    return [](int done, int total, const sim::FitCandidate& c) {
      std::cerr << fmt::format("shardscope: fit [{}/~{}] {}: {}\n", done, total, CandidateLabel(c), Verdict(c));
    };
  }
  return [](int done, int total, const sim::FitCandidate& c) {
    constexpr int kBarWidth = 24;
    const int filled = total > 0 ? std::min(kBarWidth, done * kBarWidth / total) : 0;
    std::cerr << fmt::format("\r\033[K[{:#<{}}{:<{}}] {}/~{}  micro-batch {} {}", "", filled, "", kBarWidth - filled,
                             done, total, c.micro_batch_size, c.fits ? "fits" : "does not fit")
              << std::flush;
  };
}

Status RunFit(const FitOptions& options) {
  const std::optional<sim::FitDimension> dimension = sim::ParseFitDimension(options.search);
  if (!dimension) {
    return Status::InvalidInput(fmt::format(
        "--search: expected micro_batch_size or activation_checkpointing, got '{}'", options.search));
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(sim::Plan plan, sim::LoadPlanFile(options.plan));
  const bool terminal = isatty(STDERR_FILENO);
  SHARDSCOPE_ASSIGN_OR_RETURN(sim::FitResult fit,
                              sim::FitSearch(plan, *dimension, options.max_micro_batch, MakeProgress()));
  if (terminal) std::cerr << "\r\033[K" << std::flush;

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
  return [cmd, options]() -> std::optional<Status> {
    if (!*cmd) return std::nullopt;
    return RunFit(*options);
  };
}

}  // namespace shardscope::cli

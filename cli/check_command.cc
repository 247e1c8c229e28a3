// `shardscope check PLAN`: the plan once as it is (it must complete), then a sweep of injected
// faults (an OOM at each module boundary of one rank per program, a straggler), in parallel
// threads, printed as a table. Exit 0 when no fault hangs, 1 when some does (for CI), 2 on bad
// input.
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "commands.h"
#include "inputs.h"
#include "progress.h"
#include "shardscope/sim/lowering/lowering.h"
#include "shardscope/sim/hangs/check.h"
#include "shardscope/sim/hangs/fault_sweep.h"
#include "shardscope/sim/hangs/hang.h"
#include "shardscope/sim/report/report.h"

namespace shardscope::cli {

StatusOr<std::map<int32_t, double>> ParseStragglers(const std::vector<std::string>& specs, int32_t world) {
  std::map<int32_t, double> stragglers;
  for (const std::string& spec : specs) {
    const size_t colon = spec.find(':');
    const auto bad = [&] {
      return Status::InvalidInput(
          fmt::format("--straggler: expected RANK:FACTOR with 0 <= RANK < {} and 1 <= FACTOR <= {} (like 3:1.5), "
                      "got '{}'",
                      world, sim::kMaxRankSlowdownFactor, spec));
    };
    if (colon == std::string::npos) return bad();
    int64_t rank = -1;
    double factor = 0;
    try {
      size_t used = 0;
      rank = std::stoll(spec.substr(0, colon), &used);
      if (used != colon) return bad();
      const std::string factor_text = spec.substr(colon + 1);
      factor = std::stod(factor_text, &used);
      if (used != factor_text.size()) return bad();
    } catch (const std::exception&) {
      return bad();
    }
    if (!sim::ValidStraggler(rank, factor, world)) return bad();
    if (!stragglers.emplace(static_cast<int32_t>(rank), factor).second) {
      return Status::InvalidInput(fmt::format("--straggler: rank {} given twice (one factor per rank)", rank));
    }
  }
  return stragglers;
}

namespace {

struct CheckOptions {
  std::string input;
  int threads = 0;
  std::string ranks;
  std::vector<std::string> stragglers;
  double watchdog_minutes = 10;
  double seq_len_factor = sim::FaultSweepOptions{}.seq_len_factor;
  double moe_load = sim::FaultSweepOptions{}.moe_load;
  double held_gib = static_cast<double>(sim::FaultSweepOptions{}.held_bytes) / static_cast<double>(int64_t{1} << 30);
  bool quiet = false;
  bool force = false;
  bool all_ranks = false;
};

Status RunCheck(const CheckOptions& options) {
  sim::CheckSettings settings;
  settings.threads = options.threads;
  settings.watchdog_minutes = options.watchdog_minutes;
  settings.seq_len_factor = options.seq_len_factor;
  settings.moe_load = options.moe_load;
  settings.held_gib = options.held_gib;
  SHARDSCOPE_RETURN_IF_ERROR(sim::ValidateCheckSettings(settings));
  Progress::Note(options.quiet, fmt::format("loading {}", options.input));
  SHARDSCOPE_ASSIGN_OR_RETURN(LoadedInput loaded,
                              LoadInput(options.input, LoadOptionsWith(options.force, options.quiet, options.all_ranks)));
  const traces::Schedule& schedule = loaded.schedule;
  if (!options.ranks.empty()) {
    SHARDSCOPE_ASSIGN_OR_RETURN(settings.oom_ranks, ParseRankList(options.ranks, schedule.world_size(), "--ranks"));
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(settings.stragglers, ParseStragglers(options.stragglers, schedule.world_size()));
  // The baseline run and the sweep each show their progress (progress.h: in place on a
  // terminal, sparse lines in a log, nothing with -q), cleared before the text that follows.
  std::optional<Progress> phase;
  sim::CheckProgress progress;
  progress.begin = [&](const std::string& what) { phase.emplace(fmt::format("check: {}", what), options.quiet); };
  if (!options.quiet) {
    progress.update = [&](double fraction, const std::string& detail) { phase->Update(fraction, detail); };
  }
  progress.end = [&] { phase.reset(); };
  const auto print = [](const std::string& text) { std::cout << text; };
  SHARDSCOPE_ASSIGN_OR_RETURN(sim::CheckRun run, sim::RunCheck(loaded, options.input, settings, print, progress));
  // main() maps every error but bad input to exit code 1, which is what a hang must return.
  if (run.verdict != sim::CheckVerdict::kSafe) return Status::Internal(run.failure);
  return Status::Ok();
}

}  // namespace

CommandRunner AddCheckCommand(CLI::App& app) {
  auto options = std::make_shared<CheckOptions>();
  CLI::App* cmd = app.add_subcommand(
      "check",
      "Run a plan, then inject faults (an OOM at each module boundary, a straggler, one rank running a different "
      "plan: longer sequences, more routed tokens, a micro-batch fewer, another prefetch or bucket setting; memory "
      "held by another process) and report which hang. Exit 0: all safe, 1: some hang, 2: bad input");
  cmd->add_option("input", options->input, "Plan YAML or schedule JSON")->required()->check(CLI::ExistingFile);
  cmd->add_option("--threads", options->threads, "Cases simulated in parallel (0: one per hardware thread)")
      ->capture_default_str();
  cmd->add_option("--ranks", options->ranks,
                  "Ranks that get the injected OOMs, like '0,5' or '0-3' (default: the first rank of each program)");
  cmd->add_option("--straggler", options->stragglers,
                  "RANK:FACTOR: a straggler case (that rank's kernels and copies FACTOR x slower); repeatable "
                  "(default: the first rank at 2x)");
  cmd->add_option("--watchdog-minutes", options->watchdog_minutes, "NCCL watchdog timeout for the reported times")
      ->capture_default_str();
  cmd->add_option("--seq-len-factor", options->seq_len_factor,
                  "Variable-length batch case: the rank's seq_len times this")
      ->capture_default_str();
  cmd->add_option("--moe-load", options->moe_load,
                  "Routing-imbalance case (expert parallel): the rank's experts get this many times the tokens")
      ->capture_default_str();
  cmd->add_option("--held-gib", options->held_gib,
                  "Memory-held case: GiB another process holds on the rank's GPU (0: no such case)")
      ->capture_default_str();
  cmd->add_flag("-q,--quiet", options->quiet, "No progress messages or warnings on stderr");
  cmd->add_flag("--force", options->force, "Go on past the size limit (a schedule over 8 GiB in memory)");
  cmd->add_flag("--all-ranks", options->all_ranks, kAllRanksHelp);
  return [cmd, options]() -> std::optional<Status> {
    if (!*cmd) return std::nullopt;
    return RunCheck(*options);
  };
}

}  // namespace shardscope::cli

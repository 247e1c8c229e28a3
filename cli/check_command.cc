// `shardscope check PLAN`: the plan once as it is (it must complete), then a sweep of injected
// faults (an OOM at each module boundary of one rank per program, a straggler), in parallel
// threads, printed as a table. Exit 0 when no fault hangs, 1 when some does (for CI), 2 on bad
// input.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "commands.h"
#include "inputs.h"
#include "shardscope/sim/lowering/lowering.h"
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
          fmt::format("--straggler: expected RANK:FACTOR with 0 <= RANK < {} and FACTOR >= 1 (like 3:1.5), got '{}'",
                      world, spec));
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
    stragglers[static_cast<int32_t>(rank)] = factor;
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
};

// What the known fix for OOM hangs costs: Composer's catch_and_sync with its FSDP sync hooks
// (oom: {policy: catch_and_sync, sync_hooks: true}), modelled for torch FSDP1 plans. One more
// run of the plan with the hooks on gives their cost per step; Composer keeps them on only
// until 3 consecutive batches run without an OOM (composer/trainer/trainer.py _train_batch,
// num_consecutive_non_OOM_batches >= 3), so each OOM costs about three such steps.
StatusOr<std::string> MitigationLine(const LoadedInput& loaded, const sim::EngineConfig& config,
                                     int64_t baseline_step_ns) {
  if (!loaded.plan) return std::string("  mitigation: needs the plan (a schedule JSON cannot be re-lowered with hooks)\n");
  const sim::Plan& plan = *loaded.plan;
  if (plan.strategy != sim::Strategy::kFsdp1 || plan.fsdp1.implementation != sim::Fsdp1Implementation::kTorch) {
    return fmt::format("  mitigation: none modelled for {}: Composer's OOM sync hooks patch torch FSDP1 (strategy "
                       "fsdp1, implementation torch); elsewhere an OOM must not happen (`shardscope fit`)\n",
                       sim::StrategyName(plan.strategy));
  }
  if (plan.oom.policy == sim::OomPolicy::kCatchAndSync && plan.oom.sync_hooks) {
    return std::string("  mitigation: the plan already runs Composer's sync hooks; the hangs above are places "
                       "they do not cover\n");
  }
  sim::Plan hooked = plan;
  hooked.oom.policy = sim::OomPolicy::kCatchAndSync;
  hooked.oom.sync_hooks = true;
  for (sim::RankVariant& variant : hooked.divergence.variants) {
    sim::Plan variant_plan = *variant.plan;
    variant_plan.oom = hooked.oom;
    variant.plan = std::make_shared<const sim::Plan>(std::move(variant_plan));
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(traces::Schedule schedule, sim::LowerPlan(hooked));
  SHARDSCOPE_ASSIGN_OR_RETURN(sim::SimulationSetup setup, sim::SetupFromSchedule(schedule, loaded.setup.label));
  SHARDSCOPE_ASSIGN_OR_RETURN(std::unique_ptr<sim::CostProvider> costs, sim::MakeCostProvider(schedule, setup));
  sim::EngineConfig hooked_config = sim::EngineConfigFor(setup, schedule.world_size());
  hooked_config.memory.record_history = false;
  hooked_config.rank_slowdown = config.rank_slowdown;
  SHARDSCOPE_ASSIGN_OR_RETURN(sim::SimulationResult run, sim::Simulate(schedule, *costs, hooked_config, nullptr));
  if (run.hung || run.oom_agreed) {
    return std::string("  mitigation: with Composer's sync hooks the plan itself does not complete\n");
  }
  const int64_t cost = run.step_ns - baseline_step_ns;
  return fmt::format("  mitigation: Composer's catch_and_sync with FSDP sync hooks (oom: {{policy: catch_and_sync, "
                     "sync_hooks: true}}) makes every rank agree on an OOM before its next collective; the hooks cost "
                     "{:+.3f} ms per step ({:+.1f}%) while on, and Composer drops them after 3 batches without an OOM "
                     "(about {:.3f} ms per OOM)\n",
                     static_cast<double>(cost) * 1e-6,
                     baseline_step_ns > 0 ? 100.0 * static_cast<double>(cost) / static_cast<double>(baseline_step_ns) : 0,
                     3 * static_cast<double>(cost) * 1e-6);
}

// On a terminal: one bar redrawn in place. Elsewhere (logs, CI): nothing (the table follows).
sim::FaultProgress MakeProgress() {
  if (!isatty(STDERR_FILENO)) return {};
  return [](size_t done, size_t total, const sim::FaultCaseResult& r) {
    constexpr size_t kBarWidth = 24;
    const size_t filled = total > 0 ? std::min(kBarWidth, done * kBarWidth / total) : 0;
    std::cerr << fmt::format("\r\033[K[{:#<{}}{:<{}}] {}/{}  {}: {}", "", filled, "", kBarWidth - filled, done, total,
                             r.fault.Label(), sim::FaultOutcomeName(r.outcome))
              << std::flush;
  };
}

Status RunCheck(const CheckOptions& options) {
  if (!(options.watchdog_minutes > 0) || options.watchdog_minutes > 1e6) {
    return Status::InvalidInput(
        fmt::format("--watchdog-minutes: expected a positive number of minutes, got {}", options.watchdog_minutes));
  }
  if (options.threads < 0) return Status::InvalidInput(fmt::format("--threads: expected >= 0, got {}", options.threads));
  SHARDSCOPE_ASSIGN_OR_RETURN(LoadedInput loaded, LoadInput(options.input));
  const traces::Schedule& schedule = loaded.schedule;
  sim::FaultSweepOptions sweep;
  if (!options.ranks.empty()) {
    SHARDSCOPE_ASSIGN_OR_RETURN(sweep.oom_ranks, ParseRankList(options.ranks, schedule.world_size(), "--ranks"));
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(sweep.stragglers, ParseStragglers(options.stragglers, schedule.world_size()));
  sweep.hang.watchdog_timeout_ns = static_cast<int64_t>(std::llround(options.watchdog_minutes * 60e9));
  if (!(options.seq_len_factor > 0) || options.seq_len_factor > 1000) {
    return Status::InvalidInput(fmt::format("--seq-len-factor: expected a number in (0, 1000], got {}", options.seq_len_factor));
  }
  if (!(options.moe_load > 0) || options.moe_load > 1000) {
    return Status::InvalidInput(fmt::format("--moe-load: expected a number in (0, 1000], got {}", options.moe_load));
  }
  if (!(options.held_gib >= 0) || options.held_gib > 1e6) {
    return Status::InvalidInput(fmt::format("--held-gib: expected a number of GiB >= 0, got {}", options.held_gib));
  }
  sweep.seq_len_factor = options.seq_len_factor;
  sweep.moe_load = options.moe_load;
  sweep.held_bytes = static_cast<int64_t>(std::llround(options.held_gib * static_cast<double>(int64_t{1} << 30)));
  SHARDSCOPE_ASSIGN_OR_RETURN(std::vector<sim::FaultCase> cases, sim::BuildFaultCases(schedule, sweep));
  // Divergence cases need the plan (a schedule JSON has none): on the first OOM rank.
  if (loaded.plan) {
    const int32_t rank = sweep.oom_ranks.empty() ? 0 : *std::min_element(sweep.oom_ranks.begin(), sweep.oom_ranks.end());
    SHARDSCOPE_ASSIGN_OR_RETURN(std::vector<sim::FaultCase> divergence,
                                sim::BuildDivergenceCases(*loaded.plan, rank, sweep));
    cases.insert(cases.end(), divergence.begin(), divergence.end());
  }

  SHARDSCOPE_ASSIGN_OR_RETURN(std::unique_ptr<sim::CostProvider> cost_provider,
                              sim::MakeCostProvider(schedule, loaded.setup));
  const sim::CostProvider& costs = *cost_provider;
  sim::EngineConfig config = sim::EngineConfigFor(loaded.setup, schedule.world_size());
  config.memory.record_history = false;  // no trace: snapshots would only cost time
  SHARDSCOPE_ASSIGN_OR_RETURN(sim::SimulationResult baseline, sim::Simulate(schedule, costs, config, nullptr));
  std::cout << fmt::format("{}: {} ranks, {} program(s)\n", options.input, schedule.world_size(),
                           schedule.programs.size());
  if (baseline.hung) {
    const sim::HangReport report = sim::AnalyzeHang(schedule, baseline, sweep.hang);
    std::cout << "  the plan does not complete without faults:\n";
    for (const std::string& line : report.explanation) std::cout << "  WHY: " << line << "\n";
    return Status::Internal("the baseline run does not complete; fix the plan before sweeping faults");
  }
  if (baseline.oom_agreed) {
    std::cout << fmt::format("  the plan runs out of memory without faults (rank(s) {}); the ranks agree at all_reduce #{} "
                             "and retry with a smaller micro-batch\n",
                             sim::CompressRanks(baseline.oom_agreed->oom_ranks), baseline.oom_agreed->seq);
    return Status::Internal("the baseline run runs out of memory; fix the plan before sweeping faults");
  }
  std::cout << fmt::format("  baseline: step {:.3f} ms\n", static_cast<double>(baseline.step_ns) * 1e-6);
  std::cout << fmt::format("  sweeping {} fault(s): an OOM at each module boundary of rank(s) {}, stragglers{}\n\n",
                           cases.size(), [&] {
                             std::vector<int32_t> ranks;
                             for (const sim::FaultCase& c : cases) {
                               if (c.kind == sim::FaultKind::kOom) ranks.push_back(c.rank);
                             }
                             return ranks.empty() ? std::string("none") : sim::CompressRanks(ranks);
                           }(),
                           loaded.plan ? ", divergences (one rank runs a different plan), memory held by another process"
                                       : " (a schedule JSON: no divergence cases, they need the plan)");
  const sim::FaultProgress progress = MakeProgress();
  SHARDSCOPE_ASSIGN_OR_RETURN(
      std::vector<sim::FaultCaseResult> results,
      sim::RunFaultSweep(schedule, costs, config, cases, baseline.step_ns, options.threads, progress, sweep.hang));
  if (progress) std::cerr << "\r\033[K" << std::flush;
  std::cout << sim::FaultTableText(results);
  const auto hangs = std::count_if(results.begin(), results.end(), [](const sim::FaultCaseResult& r) { return !r.Safe(); });
  std::cout << "\n";
  if (hangs == 0) {
    std::cout << fmt::format("all {} fault(s) are safe: no hang\n", results.size());
    return Status::Ok();
  }
  const auto hangs_of = [&](auto&& predicate) {
    return std::count_if(results.begin(), results.end(),
                         [&](const sim::FaultCaseResult& r) { return !r.Safe() && predicate(r.fault.kind); });
  };
  const auto oom_hangs = hangs_of([](sim::FaultKind kind) { return kind == sim::FaultKind::kOom; });
  const auto other_hangs = hangs - oom_hangs;
  std::cout << fmt::format("{} of {} fault(s) hang.\n", hangs, results.size());
  if (oom_hangs > 0 && config.oom_catch_and_sync) {
    std::cout << fmt::format("  {} injected OOM(s): with catch_and_sync the rank that runs out of memory goes to its "
                             "next OOM-flag agreement, and a peer that enters another collective first waits there "
                             "until the watchdog fires (a place without a sync hook)\n",
                             oom_hangs);
  } else if (oom_hangs > 0) {
    std::cout << fmt::format("  {} injected OOM(s): with the `raise` OOM policy the rank that runs out of memory "
                             "leaves, and its peers wait at their next collective until the watchdog fires\n",
                             oom_hangs);
  }
  if (oom_hangs > 0) {
    SHARDSCOPE_ASSIGN_OR_RETURN(std::string mitigation, MitigationLine(loaded, config, baseline.step_ns));
    std::cout << mitigation;
  }
  if (other_hangs > 0) {
    std::cout << fmt::format("  {} divergence(s) or resource fault(s): the ranks issue different collectives (type, "
                             "size or count) on one communicator, which NCCL matches by order only, or one rank runs "
                             "out of memory and leaves\n",
                             other_hangs);
  }
  // main() maps every error but bad input to exit code 1, which is what a hang must return.
  return Status::Internal(fmt::format("{} of {} injected fault(s) hang", hangs, results.size()));
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
  return [cmd, options]() -> std::optional<Status> {
    if (!*cmd) return std::nullopt;
    return RunCheck(*options);
  };
}

}  // namespace shardscope::cli

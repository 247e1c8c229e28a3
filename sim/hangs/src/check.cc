// RunCheck: `shardscope check`'s body (moved from cli/check_command.cc): the baseline run, the
// fault cases (and the divergence cases when the input is a plan), the sweep, the table and
// the lines that explain the hangs and what their mitigation costs.
#include "shardscope/sim/hangs/check.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>

#include <fmt/format.h>

#include "shardscope/sim/hangs/hang.h"
#include "shardscope/sim/lowering/lowering.h"
#include "shardscope/sim/simulate/simulate.h"

namespace shardscope::sim {
namespace {

// What the known fix for OOM hangs costs: Composer's catch_and_sync with its FSDP sync hooks
// (oom: {policy: catch_and_sync, sync_hooks: true}), modelled for torch FSDP1 plans. One more
// run of the plan with the hooks on gives their cost per step; Composer keeps them on only
// until 3 consecutive batches run without an OOM (composer/trainer/trainer.py _train_batch,
// num_consecutive_non_OOM_batches >= 3), so each OOM costs about three such steps.
StatusOr<std::string> MitigationLine(const LoadedInput& loaded, const EngineConfig& config,
                                     int64_t baseline_step_ns) {
  if (!loaded.plan) return std::string("  mitigation: needs the plan (a schedule JSON cannot be re-lowered with hooks)\n");
  const Plan& plan = *loaded.plan;
  if (plan.strategy != Strategy::kFsdp1 || plan.fsdp1.implementation != Fsdp1Implementation::kTorch) {
    return fmt::format("  mitigation: none modelled for {}: Composer's OOM sync hooks patch torch FSDP1 (strategy "
                       "fsdp1, implementation torch); elsewhere an OOM must not happen (`shardscope fit`)\n",
                       StrategyName(plan.strategy));
  }
  if (plan.oom.policy == OomPolicy::kCatchAndSync && plan.oom.sync_hooks) {
    return std::string("  mitigation: the plan already runs Composer's sync hooks; the hangs above are places "
                       "they do not cover\n");
  }
  Plan hooked = plan;
  hooked.oom.policy = OomPolicy::kCatchAndSync;
  hooked.oom.sync_hooks = true;
  for (RankVariant& variant : hooked.divergence.variants) {
    Plan variant_plan = *variant.plan;
    variant_plan.oom = hooked.oom;
    variant.plan = std::make_shared<const Plan>(std::move(variant_plan));
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(traces::Schedule schedule, LowerPlan(hooked));
  SHARDSCOPE_ASSIGN_OR_RETURN(SimulationSetup setup, SetupFromSchedule(schedule, loaded.setup.label));
  SHARDSCOPE_ASSIGN_OR_RETURN(std::unique_ptr<CostProvider> costs, MakeCostProvider(schedule, setup));
  EngineConfig hooked_config = EngineConfigFor(setup, schedule);
  hooked_config.memory.record_history = false;
  hooked_config.rank_slowdown = config.rank_slowdown;
  SHARDSCOPE_ASSIGN_OR_RETURN(SimulationResult run, Simulate(schedule, *costs, hooked_config, nullptr));
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

}  // namespace

Status ValidateCheckSettings(const CheckSettings& settings) {
  if (!(settings.watchdog_minutes > 0) || settings.watchdog_minutes > 1e6) {
    return Status::InvalidInput(
        fmt::format("--watchdog-minutes: expected a positive number of minutes, got {}", settings.watchdog_minutes));
  }
  if (settings.threads < 0) return Status::InvalidInput(fmt::format("--threads: expected >= 0, got {}", settings.threads));
  if (!(settings.seq_len_factor > 0) || settings.seq_len_factor > 1000) {
    return Status::InvalidInput(
        fmt::format("--seq-len-factor: expected a number in (0, 1000], got {}", settings.seq_len_factor));
  }
  if (!(settings.moe_load > 0) || settings.moe_load > 1000) {
    return Status::InvalidInput(fmt::format("--moe-load: expected a number in (0, 1000], got {}", settings.moe_load));
  }
  if (!(settings.held_gib >= 0) || settings.held_gib > 1e6) {
    return Status::InvalidInput(fmt::format("--held-gib: expected a number of GiB >= 0, got {}", settings.held_gib));
  }
  return Status::Ok();
}

StatusOr<CheckRun> RunCheck(const LoadedInput& loaded, const std::string& label, const CheckSettings& settings,
                            const std::function<void(const std::string&)>& print, const CheckProgress& progress) {
  SHARDSCOPE_RETURN_IF_ERROR(ValidateCheckSettings(settings));
  const traces::Schedule& schedule = loaded.schedule;
  FaultSweepOptions sweep;
  sweep.oom_ranks = settings.oom_ranks;
  sweep.stragglers = settings.stragglers;
  sweep.hang.watchdog_timeout_ns = static_cast<int64_t>(std::llround(settings.watchdog_minutes * 60e9));
  sweep.seq_len_factor = settings.seq_len_factor;
  sweep.moe_load = settings.moe_load;
  sweep.held_bytes = static_cast<int64_t>(std::llround(settings.held_gib * static_cast<double>(int64_t{1} << 30)));
  SHARDSCOPE_ASSIGN_OR_RETURN(std::vector<FaultCase> cases, BuildFaultCases(schedule, sweep));
  // Divergence cases need the plan (a schedule JSON has none): on the first OOM rank.
  if (loaded.plan) {
    const int32_t rank = sweep.oom_ranks.empty() ? 0 : *std::min_element(sweep.oom_ranks.begin(), sweep.oom_ranks.end());
    SHARDSCOPE_ASSIGN_OR_RETURN(std::vector<FaultCase> divergence, BuildDivergenceCases(*loaded.plan, rank, sweep));
    cases.insert(cases.end(), divergence.begin(), divergence.end());
  }

  SHARDSCOPE_ASSIGN_OR_RETURN(std::unique_ptr<CostProvider> cost_provider, MakeCostProvider(schedule, loaded.setup));
  const CostProvider& costs = *cost_provider;
  EngineConfig config = EngineConfigFor(loaded.setup, schedule);
  config.memory.record_history = false;  // no trace: snapshots would only cost time
  const auto begin = [&](const std::string& what) {
    if (progress.begin) progress.begin(what);
  };
  const auto end = [&] {
    if (progress.end) progress.end();
  };
  begin(fmt::format("the baseline run ({} ranks)", schedule.world_size()));
  EngineConfig baseline_config = config;
  if (progress.update) baseline_config.progress = [&](double fraction) { progress.update(fraction, {}); };
  StatusOr<SimulationResult> baseline_run = Simulate(schedule, costs, baseline_config, nullptr);
  end();
  SHARDSCOPE_ASSIGN_OR_RETURN(SimulationResult baseline, std::move(baseline_run));
  CheckRun run;
  print(fmt::format("{}: {} ranks, {} program(s)\n", label, schedule.world_size(), schedule.programs.size()));
  if (baseline.hung) {
    const HangReport report = AnalyzeHang(schedule, baseline, sweep.hang);
    print("  the plan does not complete without faults:\n");
    for (const std::string& line : report.explanation) print("  WHY: " + line + "\n");
    run.verdict = CheckVerdict::kBaselineHangs;
    run.baseline_why = report.explanation;
    run.failure = "the baseline run does not complete; fix the plan before sweeping faults";
    return run;
  }
  if (baseline.oom_agreed) {
    print(fmt::format("  the plan runs out of memory without faults (rank(s) {}); the ranks agree at all_reduce #{} "
                      "and retry with a smaller micro-batch\n",
                      CompressRanks(baseline.oom_agreed->oom_ranks), baseline.oom_agreed->seq));
    run.verdict = CheckVerdict::kBaselineOom;
    run.failure = "the baseline run runs out of memory; fix the plan before sweeping faults";
    return run;
  }
  run.baseline_step_ns = baseline.step_ns;
  print(fmt::format("  baseline: step {:.3f} ms\n", static_cast<double>(baseline.step_ns) * 1e-6));
  print(fmt::format("  sweeping {} fault(s): an OOM at each module boundary of rank(s) {}, stragglers{}\n\n",
                    cases.size(), [&] {
                      std::vector<int32_t> ranks;
                      for (const FaultCase& c : cases) {
                        if (c.kind == FaultKind::kOom) ranks.push_back(c.rank);
                      }
                      return ranks.empty() ? std::string("none") : CompressRanks(ranks);
                    }(),
                    loaded.plan ? ", divergences (one rank runs a different plan), memory held by another process"
                                : " (a schedule JSON: no divergence cases, they need the plan)"));
  FaultProgress case_done;
  if (progress.update) {
    case_done = [&](size_t done, size_t total, const FaultCaseResult& r) {
      progress.update(total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 1.0,
                      fmt::format("{}/{}: {}: {}", done, total, r.fault.Label(), FaultOutcomeName(r.outcome)));
    };
  }
  begin(fmt::format("{} fault case(s)", cases.size()));
  StatusOr<std::vector<FaultCaseResult>> swept =
      RunFaultSweep(schedule, costs, config, cases, baseline.step_ns, settings.threads, case_done, sweep.hang);
  end();
  SHARDSCOPE_ASSIGN_OR_RETURN(run.results, std::move(swept));
  const std::vector<FaultCaseResult>& results = run.results;
  print(FaultTableText(results));
  const auto hangs = std::count_if(results.begin(), results.end(), [](const FaultCaseResult& r) { return !r.Safe(); });
  print("\n");
  if (hangs == 0) {
    print(fmt::format("all {} fault(s) are safe: no hang\n", results.size()));
    return run;
  }
  const auto hangs_of = [&](auto&& predicate) {
    return std::count_if(results.begin(), results.end(),
                         [&](const FaultCaseResult& r) { return !r.Safe() && predicate(r.fault.kind); });
  };
  const auto oom_hangs = hangs_of([](FaultKind kind) { return kind == FaultKind::kOom; });
  const auto other_hangs = hangs - oom_hangs;
  print(fmt::format("{} of {} fault(s) hang.\n", hangs, results.size()));
  if (oom_hangs > 0 && config.oom_catch_and_sync) {
    print(fmt::format("  {} injected OOM(s): with catch_and_sync the rank that runs out of memory goes to its "
                      "next OOM-flag agreement, and a peer that enters another collective first waits there "
                      "until the watchdog fires (a place without a sync hook)\n",
                      oom_hangs));
  } else if (oom_hangs > 0) {
    print(fmt::format("  {} injected OOM(s): with the `raise` OOM policy the rank that runs out of memory "
                      "leaves, and its peers wait at their next collective until the watchdog fires\n",
                      oom_hangs));
  }
  if (oom_hangs > 0) {
    SHARDSCOPE_ASSIGN_OR_RETURN(std::string mitigation, MitigationLine(loaded, config, baseline.step_ns));
    print(mitigation);
  }
  if (other_hangs > 0) {
    print(fmt::format("  {} divergence(s) or resource fault(s): the ranks issue different collectives (type, "
                      "size or count) on one communicator, which NCCL matches by order only, or one rank runs "
                      "out of memory and leaves\n",
                      other_hangs));
  }
  run.verdict = CheckVerdict::kHangs;
  run.failure = fmt::format("{} of {} injected fault(s) hang", hangs, results.size());
  return run;
}

}  // namespace shardscope::sim

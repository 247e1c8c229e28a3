#include "shardscope/sim/hangs/fault_sweep.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

#include <fmt/format.h>

#include "shardscope/sim/lowering/lowering.h"
#include "shardscope/sim/simulate/simulate.h"

namespace shardscope::sim {
namespace {

std::string FactorText(double factor) { return fmt::format("{:g}", factor); }

// The explanation's first cause without what the fault column already says: for an injected
// OOM, "rank 0 stopped: injected out of memory at op 17 ..., 250 KiB requested; rank 1 waits
// in all_gather #1 on 'dp_shard' for rank 0" becomes its part after the first "; ".
std::string ShortWhere(const HangReport& report) {
  if (report.causes.empty()) return report.explanation.empty() ? std::string("no cause found") : report.explanation.front();
  const RootCause& cause = report.causes.front();
  std::string text = cause.text;
  if (cause.kind == RootCauseKind::kOutOfMemory) {
    const size_t split = text.find("; ");
    if (split != std::string::npos) text = text.substr(split + 2);
  }
  if (report.causes.size() > 1) text += fmt::format(" (+{} more cause(s))", report.causes.size() - 1);
  return text;
}

std::string Milliseconds(int64_t ns) { return fmt::format("{:.3f} ms", static_cast<double>(ns) * 1e-6); }

}  // namespace

std::string FaultCase::Label() const {
  switch (kind) {
    case FaultKind::kStraggler: return fmt::format("straggler rank {} x{}", rank, FactorText(slowdown));
    case FaultKind::kDivergence: return fmt::format("rank {} runs {}", rank, divergence);
    case FaultKind::kMemoryHeld:
      return fmt::format("rank {}: {:.2f} GiB held by another process", rank,
                         static_cast<double>(held_bytes) / static_cast<double>(int64_t{1} << 30));
    case FaultKind::kOom: break;
  }
  return fmt::format("OOM rank {} @ {} (op {})", rank, boundary, op_id);
}

std::string_view FaultOutcomeName(FaultOutcome outcome) {
  switch (outcome) {
    case FaultOutcome::kOk: return "ok";
    case FaultOutcome::kOomOnly: return "oom-only";
    case FaultOutcome::kOomAgreed: return "oom-agreed";
    case FaultOutcome::kHang: return "hang";
  }
  return "?";
}

std::vector<FaultCase> ModuleBoundaries(const traces::Schedule& schedule, int32_t rank) {
  const traces::Program& program = schedule.ProgramOf(rank);
  std::vector<FaultCase> cases;
  std::optional<std::tuple<traces::Phase, int32_t, traces::NameIndex>> previous;
  for (size_t index = 0; index < program.ops.size(); ++index) {
    const traces::Op& op = program.ops[index];
    if (!std::holds_alternative<traces::AllocateOp>(op.payload)) continue;
    if (op.tags.phase == traces::Phase::kNone) continue;  // model states, set up before the step
    const auto key = std::make_tuple(op.tags.phase, op.tags.micro_batch, op.tags.module);
    if (previous && *previous == key) continue;
    previous = key;
    FaultCase fault;
    fault.kind = FaultKind::kOom;
    fault.rank = rank;
    fault.op_id = op.id;
    fault.op_index = static_cast<int32_t>(index);
    fault.boundary = std::string(traces::PhaseName(op.tags.phase));
    if (op.tags.micro_batch >= 0) fault.boundary += fmt::format(" mb {}", op.tags.micro_batch);
    if (op.tags.module != traces::kNoName) fault.boundary += fmt::format(" {}", program.NameOf(op.tags.module));
    cases.push_back(std::move(fault));
  }
  return cases;
}

StatusOr<std::vector<FaultCase>> BuildFaultCases(const traces::Schedule& schedule, const FaultSweepOptions& options) {
  const int32_t world = schedule.world_size();
  std::vector<int32_t> oom_ranks = options.oom_ranks;
  if (oom_ranks.empty()) {
    // Ranks with one program make the same calls: the first rank of each program stands for all.
    std::set<int32_t> programs_seen;
    for (int32_t rank = 0; rank < world; ++rank) {
      if (programs_seen.insert(schedule.ranks[static_cast<size_t>(rank)].program).second) oom_ranks.push_back(rank);
    }
  }
  std::sort(oom_ranks.begin(), oom_ranks.end());
  oom_ranks.erase(std::unique(oom_ranks.begin(), oom_ranks.end()), oom_ranks.end());
  std::vector<FaultCase> cases;
  for (int32_t rank : oom_ranks) {
    if (rank < 0 || rank >= world) {
      return Status::InvalidInput(fmt::format("rank {} is outside the world of {} ranks", rank, world));
    }
    std::vector<FaultCase> boundaries = ModuleBoundaries(schedule, rank);
    cases.insert(cases.end(), boundaries.begin(), boundaries.end());
  }
  std::map<int32_t, double> stragglers = options.stragglers;
  if (stragglers.empty() && world > 0) stragglers[oom_ranks.empty() ? 0 : oom_ranks.front()] = 2.0;
  for (const auto& [rank, factor] : stragglers) {
    if (rank < 0 || rank >= world) {
      return Status::InvalidInput(fmt::format("straggler rank {} is outside the world of {} ranks", rank, world));
    }
    if (!(factor >= 1.0) || !std::isfinite(factor)) {
      return Status::InvalidInput(fmt::format("straggler rank {}: slowdown factor {} must be >= 1", rank, factor));
    }
    FaultCase fault;
    fault.kind = FaultKind::kStraggler;
    fault.rank = rank;
    fault.slowdown = factor;
    cases.push_back(fault);
  }
  return cases;
}

StatusOr<std::vector<FaultCase>> BuildDivergenceCases(const Plan& plan, int32_t rank,
                                                      const FaultSweepOptions& options) {
  const int32_t world = plan.cluster.world_size();
  if (rank < 0 || rank >= world) {
    return Status::InvalidInput(fmt::format("rank {} is outside the world of {} ranks", rank, world));
  }
  // What the rank runs now: its variant's plan, or the plan itself.
  Plan current = WithoutDivergence(plan);
  for (const RankVariant& variant : plan.divergence.variants) {
    if (std::find(variant.ranks.begin(), variant.ranks.end(), rank) != variant.ranks.end()) current = *variant.plan;
  }
  std::vector<FaultCase> cases;
  const auto add = [&](Plan changed, std::string description) -> Status {
    SHARDSCOPE_ASSIGN_OR_RETURN(Plan with, WithRankVariant(plan, {rank}, std::move(changed), description));
    SHARDSCOPE_ASSIGN_OR_RETURN(traces::Schedule lowered, LowerPlan(with));
    FaultCase fault;
    fault.kind = FaultKind::kDivergence;
    fault.rank = rank;
    fault.divergence = std::move(description);
    auto schedule = std::make_shared<const traces::Schedule>(std::move(lowered));
    // The variant's own setup: the same cluster (and calibration profile, if any).
    SHARDSCOPE_ASSIGN_OR_RETURN(SimulationSetup setup, SetupFromSchedule(*schedule, plan.source));
    SHARDSCOPE_ASSIGN_OR_RETURN(std::unique_ptr<CostProvider> costs, MakeCostProvider(*schedule, setup));
    fault.costs = std::shared_ptr<const CostProvider>(std::move(costs));
    fault.schedule = std::move(schedule);
    cases.push_back(std::move(fault));
    return Status::Ok();
  };

  // Variable-length batches: this rank's sequences are longer (within learned positions).
  int64_t longer = static_cast<int64_t>(std::llround(static_cast<double>(current.training.seq_len) * options.seq_len_factor));
  if (current.model.learned_positions) longer = std::min<int64_t>(longer, current.model.max_positions);
  if (longer != current.training.seq_len && longer > 0) {
    Plan changed = current;
    changed.training.seq_len = longer;
    SHARDSCOPE_RETURN_IF_ERROR(
        add(changed, fmt::format("seq_len x{} (training.seq_len {})", FactorText(options.seq_len_factor), longer)));
  }
  // Routing imbalance: this rank's experts get more tokens (expert parallelism only).
  if (current.moe.expert_parallel > 1 && current.model.experts > 1 && options.moe_load != 1) {
    Plan changed = current;
    changed.moe.rank_load = current.moe.rank_load * options.moe_load;
    SHARDSCOPE_RETURN_IF_ERROR(add(changed, fmt::format("moe_load x{}", FactorText(options.moe_load))));
  }
  // A rank that skips a micro-batch (its data loader ran out one batch early).
  if (current.training.grad_accum_steps > 1) {
    Plan changed = current;
    changed.training.grad_accum_steps -= 1;
    SHARDSCOPE_RETURN_IF_ERROR(add(changed, fmt::format("one micro-batch fewer (training.grad_accum_steps {})",
                                                        changed.training.grad_accum_steps)));
  }
  // A rank-dependent prefetch setting (a config read per rank, a heuristic on local state).
  switch (current.strategy) {
    case Strategy::kFsdp2:
      if (current.fsdp2.backward_prefetch_units.empty()) {
        Plan changed = current;
        changed.fsdp2.backward_prefetch = current.fsdp2.backward_prefetch > 0 ? 0 : 1;
        SHARDSCOPE_RETURN_IF_ERROR(
            add(changed, fmt::format("fsdp2.backward_prefetch {}", changed.fsdp2.backward_prefetch)));
      }
      break;
    case Strategy::kFsdp1: {
      Plan changed = current;
      const bool had = current.fsdp1.backward_prefetch != Fsdp1BackwardPrefetch::kNone;
      changed.fsdp1.backward_prefetch = had ? Fsdp1BackwardPrefetch::kNone : Fsdp1BackwardPrefetch::kBackwardPre;
      SHARDSCOPE_RETURN_IF_ERROR(add(changed, had ? "fsdp1.backward_prefetch null" : "fsdp1.backward_prefetch BACKWARD_PRE"));
      break;
    }
    case Strategy::kZero3: {
      Plan changed = current;
      changed.zero.stage3_prefetch_bucket_size = current.zero.stage3_prefetch_bucket_size > 0 ? 0 : 50'000'000;
      SHARDSCOPE_RETURN_IF_ERROR(
          add(changed, fmt::format("zero.stage3_prefetch_bucket_size {}", changed.zero.stage3_prefetch_bucket_size)));
      break;
    }
    case Strategy::kDdp: {
      // A different bucket layout (bucket_cap_mb read from a per-rank config).
      Plan changed = current;
      changed.ddp.bucket_cap_mb = current.ddp.bucket_cap_mb / 2;
      changed.ddp.first_bucket_mb = std::min(current.ddp.first_bucket_mb, changed.ddp.bucket_cap_mb);
      SHARDSCOPE_RETURN_IF_ERROR(add(changed, fmt::format("ddp.bucket_cap_mb {:g}", changed.ddp.bucket_cap_mb)));
      break;
    }
    case Strategy::kZero1:
    case Strategy::kZero2: {
      Plan changed = current;
      changed.zero.reduce_bucket_size = std::max<int64_t>(1, current.zero.reduce_bucket_size / 2);
      SHARDSCOPE_RETURN_IF_ERROR(
          add(changed, fmt::format("zero.reduce_bucket_size {}", changed.zero.reduce_bucket_size)));
      break;
    }
  }
  if (options.held_bytes > 0) {
    FaultCase fault;
    fault.kind = FaultKind::kMemoryHeld;
    fault.rank = rank;
    fault.held_bytes = options.held_bytes;
    cases.push_back(std::move(fault));
  }
  return cases;
}

StatusOr<FaultCaseResult> RunFaultCase(const traces::Schedule& schedule, const CostProvider& costs,
                                       const EngineConfig& base, const FaultCase& fault, int64_t baseline_step_ns,
                                       const HangOptions& hang) {
  EngineConfig config = base;
  config.progress = nullptr;
  const traces::Schedule& run = fault.schedule ? *fault.schedule : schedule;
  const CostProvider& run_costs = fault.costs ? *fault.costs : costs;
  switch (fault.kind) {
    case FaultKind::kOom: config.inject_oom = InjectedOom{fault.rank, fault.op_id}; break;
    case FaultKind::kStraggler: config.rank_slowdown[fault.rank] = fault.slowdown; break;
    case FaultKind::kDivergence: break;
    case FaultKind::kMemoryHeld: {
      // One capacity per rank from here on (a single entry stands for every rank).
      std::vector<int64_t>& capacity = config.memory.capacity_bytes;
      if (capacity.size() == 1) capacity.assign(static_cast<size_t>(run.world_size()), capacity.front());
      if (static_cast<size_t>(fault.rank) < capacity.size()) {
        int64_t& own = capacity[static_cast<size_t>(fault.rank)];
        own = std::max<int64_t>(0, own - fault.held_bytes);
      }
      break;
    }
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(SimulationResult result, Simulate(run, run_costs, config, nullptr));
  FaultCaseResult out;
  out.fault = fault;
  if (result.hung) {
    // The faulty rank stopped (an injected OOM, or one its change caused) after its last
    // collective: the others finished without it.
    const bool faulty_rank_ran_out =
        fault.kind == FaultKind::kOom ||
        (static_cast<size_t>(fault.rank) < result.ranks.size() && result.ranks[static_cast<size_t>(fault.rank)].memory.oom);
    const bool only_injected_rank =
        faulty_rank_ran_out && result.blocked.size() == 1 && result.blocked.front().rank == fault.rank;
    for (const BlockedRank& b : result.blocked) out.blocked_ranks.push_back(b.rank);
    if (only_injected_rank) {
      // It stopped after its last collective: the others finished without it.
      out.outcome = FaultOutcome::kOomOnly;
      out.step_ns = result.step_ns;
      return out;
    }
    const HangReport report = AnalyzeHang(run, result, hang);
    out.outcome = FaultOutcome::kHang;
    out.where = ShortWhere(report);
    out.watchdog_fires_at_ns = report.watchdog_fires_at_ns;
    return out;
  }
  if (result.oom_agreed) {
    out.outcome = FaultOutcome::kOomAgreed;
    out.step_ns = result.oom_agreed->time_ns;  // when every rank knew: the retry starts here
    out.where = fmt::format("all ranks agree at all_reduce #{} on '{}' (op {})", result.oom_agreed->seq,
                            run.communicators[static_cast<size_t>(result.oom_agreed->communicator)].name,
                            result.oom_agreed->op_id);
    return out;
  }
  out.outcome = FaultOutcome::kOk;
  out.step_ns = result.step_ns;
  out.cost_ns = result.step_ns - baseline_step_ns;
  return out;
}

StatusOr<std::vector<FaultCaseResult>> RunFaultSweep(const traces::Schedule& schedule, const CostProvider& costs,
                                                     const EngineConfig& base, const std::vector<FaultCase>& cases,
                                                     int64_t baseline_step_ns, int threads,
                                                     const FaultProgress& progress, const HangOptions& hang) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const size_t workers = std::min(cases.size(), static_cast<size_t>(threads));
  std::vector<std::optional<FaultCaseResult>> results(cases.size());
  std::vector<Status> errors(cases.size());
  std::atomic<size_t> next{0};
  std::mutex progress_mutex;
  size_t done = 0;
  auto work = [&] {
    for (size_t i = next.fetch_add(1); i < cases.size(); i = next.fetch_add(1)) {
      StatusOr<FaultCaseResult> ran = RunFaultCase(schedule, costs, base, cases[i], baseline_step_ns, hang);
      if (ran.ok()) {
        results[i] = std::move(*ran);
      } else {
        errors[i] = ran.status();
      }
      std::lock_guard<std::mutex> lock(progress_mutex);
      ++done;
      if (progress && results[i]) progress(done, cases.size(), *results[i]);
    }
  };
  if (workers <= 1) {
    work();
  } else {
    std::vector<std::thread> pool;
    pool.reserve(workers);
    for (size_t w = 0; w < workers; ++w) pool.emplace_back(work);
    for (std::thread& t : pool) t.join();
  }
  std::vector<FaultCaseResult> out;
  out.reserve(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    if (!results[i]) return errors[i];  // the first failing case in case order: deterministic
    out.push_back(std::move(*results[i]));
  }
  return out;
}

std::string FaultTableText(const std::vector<FaultCaseResult>& results) {
  struct Row {
    std::string fault, outcome, time, cost, where;
  };
  std::vector<Row> rows;
  rows.push_back({"fault", "outcome", "step / watchdog", "cost", "where"});
  for (const FaultCaseResult& r : results) {
    Row row;
    row.fault = r.fault.Label();
    row.outcome = std::string(FaultOutcomeName(r.outcome));
    if (r.outcome == FaultOutcome::kHang) {
      row.time = r.watchdog_fires_at_ns >= 0
                     ? fmt::format("watchdog {:.3f} s", static_cast<double>(r.watchdog_fires_at_ns) * 1e-9)
                     : "-";
    } else {
      row.time = Milliseconds(r.step_ns);
    }
    row.cost = r.fault.kind != FaultKind::kOom && r.outcome == FaultOutcome::kOk
                   ? fmt::format("{:+.3f} ms", static_cast<double>(r.cost_ns) * 1e-6)
                   : "-";
    row.where = r.outcome == FaultOutcome::kHang || r.outcome == FaultOutcome::kOomAgreed ? r.where
                : r.outcome == FaultOutcome::kOomOnly ? fmt::format("rank {} stopped after its last collective", r.fault.rank)
                                                      : "";
    rows.push_back(std::move(row));
  }
  size_t w_fault = 0, w_outcome = 0, w_time = 0, w_cost = 0;
  for (const Row& row : rows) {
    w_fault = std::max(w_fault, row.fault.size());
    w_outcome = std::max(w_outcome, row.outcome.size());
    w_time = std::max(w_time, row.time.size());
    w_cost = std::max(w_cost, row.cost.size());
  }
  std::string out;
  for (const Row& row : rows) {
    std::string line = fmt::format("{:<{}}  {:<{}}  {:>{}}  {:>{}}  {}", row.fault, w_fault, row.outcome, w_outcome,
                                   row.time, w_time, row.cost, w_cost, row.where);
    line.erase(line.find_last_not_of(' ') + 1);
    out += line + "\n";
  }
  return out;
}

}  // namespace shardscope::sim

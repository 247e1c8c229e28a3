#include "shardscope/sim/fault_sweep.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

#include <fmt/format.h>

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
  if (kind == FaultKind::kStraggler) return fmt::format("straggler rank {} x{}", rank, FactorText(slowdown));
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

StatusOr<FaultCaseResult> RunFaultCase(const traces::Schedule& schedule, const CostProvider& costs,
                                       const EngineConfig& base, const FaultCase& fault, int64_t baseline_step_ns,
                                       const HangOptions& hang) {
  EngineConfig config = base;
  config.progress = nullptr;
  if (fault.kind == FaultKind::kOom) {
    config.inject_oom = InjectedOom{fault.rank, fault.op_id};
  } else {
    config.rank_slowdown[fault.rank] = fault.slowdown;
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(SimulationResult result, Simulate(schedule, costs, config, nullptr));
  FaultCaseResult out;
  out.fault = fault;
  if (result.hung) {
    const bool only_injected_rank = fault.kind == FaultKind::kOom && result.blocked.size() == 1 &&
                                    result.blocked.front().rank == fault.rank;
    for (const BlockedRank& b : result.blocked) out.blocked_ranks.push_back(b.rank);
    if (only_injected_rank) {
      // It stopped after its last collective: the others finished without it.
      out.outcome = FaultOutcome::kOomOnly;
      out.step_ns = result.step_ns;
      return out;
    }
    const HangReport report = AnalyzeHang(schedule, result, hang);
    out.outcome = FaultOutcome::kHang;
    out.where = ShortWhere(report);
    out.watchdog_fires_at_ns = report.watchdog_fires_at_ns;
    return out;
  }
  if (result.oom_agreed) {
    out.outcome = FaultOutcome::kOomAgreed;
    out.step_ns = result.oom_agreed->time_ns;  // when every rank knew: the retry starts here
    out.where = fmt::format("all ranks agree at all_reduce #{} on '{}' (op {})", result.oom_agreed->seq,
                            schedule.communicators[static_cast<size_t>(result.oom_agreed->communicator)].name,
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
    row.cost = r.fault.kind == FaultKind::kStraggler && r.outcome == FaultOutcome::kOk
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

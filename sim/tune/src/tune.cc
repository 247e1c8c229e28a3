// Tune: the candidates, their bounds, the batches of simulations and the verdicts (tune.h).
#include "shardscope/sim/tune/tune.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "shardscope/sim/hangs/fault_sweep.h"
#include "shardscope/sim/hangs/hang.h"
#include "shardscope/sim/lowering/load_input.h"
#include "shardscope/sim/simulate/init_phase.h"
#include "shardscope/sim/simulate/simulate.h"
#include "tune_bounds.h"
#include "tune_candidates.h"

namespace shardscope::sim {

using tune_internal::BoundsOf;
using tune_internal::CandidateBounds;
using tune_internal::SearchBase;

std::string_view TuneVerdictName(TuneVerdict verdict) {
  switch (verdict) {
    case TuneVerdict::kKept: return "kept";
    case TuneVerdict::kOutOfMemory: return "out_of_memory";
    case TuneVerdict::kRetries: return "alloc_retries";
    case TuneVerdict::kHangs: return "hangs";
    case TuneVerdict::kCheck: return "check";
    case TuneVerdict::kBound: return "memory_bound";
    case TuneVerdict::kDominated: return "time_bound";
    case TuneVerdict::kInvalid: return "invalid";
    case TuneVerdict::kBudget: return "budget";
  }
  return "budget";
}

StatusOr<TuneSpace> ParseTuneSpace(const std::string& text) {
  TuneSpace space;
  if (text.empty() || text == "all") return space;
  space = TuneSpace{false, false, false, false, false, false, false, false};
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    const std::string name = text.substr(begin, end - begin);
    if (name == "strategy") space.strategy = true;
    else if (name == "mesh") space.mesh = true;
    else if (name == "reshard") space.reshard = true;
    else if (name == "prefetch") space.prefetch = true;
    else if (name == "buckets") space.buckets = true;
    else if (name == "micro_batch") space.micro_batch = true;
    else if (name == "ac") space.checkpointing = true;
    else if (name == "compile") space.compile = true;
    else {
      return Status::InvalidInput(fmt::format(
          "--search: unknown knob '{}'; expected a comma-separated list of strategy, mesh, reshard, prefetch, buckets, "
          "micro_batch, ac, compile (or all)",
          name));
    }
    begin = end + 1;
  }
  return space;
}

namespace {

constexpr double kGiB = double(int64_t{1} << 30);

// The framework whose MFU a strategy's users read: torchtitan runs FSDP2, llm-foundry
// (Composer) FSDP1, DeepSpeed its ZeRO; plain DDP has no framework's log, so Megatron-LM's
// formula (the one shardscope's own figures follow).
std::string ConventionOf(const std::string& strategy) {
  if (strategy == "fsdp2") return "torchtitan";
  if (strategy == "fsdp1") return "llm_foundry";
  if (strategy == "ddp") return "megatron";
  return "deepspeed";
}

// "layers.3 forward" for an op of a rank's program, or "op 123".
std::string WhereIs(const traces::Schedule& schedule, int32_t rank, int64_t op_id) {
  const traces::Program& program = schedule.ProgramOf(rank);
  for (const traces::Op& op : program.ops) {
    if (op.id != op_id) continue;
    std::string where;
    if (op.tags.module != traces::kNoName) where = std::string(program.NameOf(op.tags.module));
    if (op.tags.phase != traces::Phase::kNone) where += (where.empty() ? "" : " ") + std::string(traces::PhaseName(op.tags.phase));
    return where.empty() ? fmt::format("op {}", op_id) : fmt::format("{} (op {})", where, op_id);
  }
  return fmt::format("op {}", op_id);
}

// What the batches before this one found: the kept plans fastest first, and the step time the
// `top`-th of them takes (no plan slower than that can enter the top).
struct PruneSnapshot {
  std::vector<const TuneCandidate*> kept;
  int64_t top_step = std::numeric_limits<int64_t>::max();
  int top = 0;
};

// A candidate slower than the top for sure (its time bound past the top's step) and off the
// Pareto front for sure (a kept plan is faster than its time bound and needs no more memory than
// its memory bound) need not be simulated. Returns the reason, or "" to simulate it.
std::string PruneReason(const TuneCandidate& c, const PruneSnapshot& snapshot, const char* bound) {
  if (c.time_bound_ns <= snapshot.top_step) return "";
  for (const TuneCandidate* k : snapshot.kept) {
    if (k->step_ns < c.time_bound_ns && k->peak_reserved_bytes <= c.memory_bound_bytes) {
      return fmt::format("time bound: at least {:.1f} ms ({}), behind the top {} and beaten on time and memory by: {}",
                         static_cast<double>(c.time_bound_ns) * 1e-6, bound, snapshot.top, k->label);
    }
  }
  return "";
}

// The compute kernels of a rank's program at full speed, summed: a GPU shares its compute
// between concurrent kernels (gpu_sharing_model.h kFairShare: n kernels at 1/n speed each), so no
// step of that rank is shorter; contention and stragglers only lengthen it. The largest over
// the programs.
int64_t ComputeKernelNs(const traces::Schedule& schedule, const CostProvider& costs) {
  int64_t most = 0;
  for (const traces::Program& program : schedule.programs) {
    int64_t sum = 0;
    for (const traces::Op& op : program.ops) {
      if (const auto* kernel = std::get_if<traces::KernelOp>(&op.payload)) sum += costs.KernelNs(kernel->compute);
    }
    most = std::max(most, sum);
  }
  return most;
}

// One candidate lowered, bounded again with its kernels' costs, simulated, checked and scored.
// Only reads shared state.
TuneCandidate Evaluate(TuneCandidate c, const Plan& plan, const TuneOptions& options, const PruneSnapshot& snapshot) {
  StatusOr<LoadedInput> loaded = LoadPlan(plan, c.label);
  if (!loaded.ok()) {
    c.verdict = TuneVerdict::kInvalid;
    c.why = loaded.status().message();
    return c;
  }
  const traces::Schedule& schedule = loaded->schedule;
  const SimulationSetup& setup = loaded->setup;
  StatusOr<std::unique_ptr<CostProvider>> costs = MakeCostProvider(schedule, setup);
  if (!costs.ok()) {
    c.verdict = TuneVerdict::kInvalid;
    c.why = costs.status().message();
    return c;
  }
  EngineConfig config = EngineConfigFor(setup, schedule);
  if (config.compute_sharing == ComputeSharing::kFairShare) {
    c.time_bound_ns = std::max(c.time_bound_ns, ComputeKernelNs(schedule, **costs));
    std::string pruned = PruneReason(c, snapshot, "its compute kernels at full speed, one after another");
    if (!pruned.empty()) {
      c.verdict = TuneVerdict::kDominated;
      c.why = std::move(pruned);
      return c;
    }
  }
  config.memory.record_history = false;
  // A candidate that runs out of memory hangs its peers; its verdict needs no hang report, and
  // the full simulation that would make one costs as much as every other step of the search.
  config.rerun_hangs_in_full = false;
  StatusOr<SimulationResult> run = Simulate(schedule, **costs, config, nullptr);
  if (!run.ok()) {
    c.verdict = TuneVerdict::kInvalid;
    c.why = run.status().message();
    return c;
  }
  const SimulationResult& result = *run;
  c.simulated_ranks = result.symmetry.simulated_ranks;
  int64_t retries = 0, comm_minus_overlap = 0;
  int32_t first_oom = -1, oom_ranks = 0;
  c.capacity_bytes = std::numeric_limits<int64_t>::max();
  for (size_t r = 0; r < result.ranks.size(); ++r) {
    const RankStats& stats = result.ranks[r];
    c.peak_reserved_bytes = std::max(c.peak_reserved_bytes, stats.memory.stats.reserved_bytes_peak);
    c.capacity_bytes = std::min(c.capacity_bytes, stats.memory.capacity_bytes);
    retries += stats.memory.stats.num_alloc_retries;
    comm_minus_overlap += stats.comm_ns - stats.overlap_ns;
    if (stats.memory.oom) {
      ++oom_ranks;
      if (first_oom < 0) first_oom = static_cast<int32_t>(r);
    }
  }
  c.exposed_comm_ns = result.ranks.empty() ? 0 : comm_minus_overlap / static_cast<int64_t>(result.ranks.size());
  if (first_oom >= 0) {
    const OomInfo& oom = *result.ranks[static_cast<size_t>(first_oom)].memory.oom;
    c.verdict = TuneVerdict::kOutOfMemory;
    c.why = fmt::format("{} rank(s) out of memory; rank {} at {}: {:.2f} GiB asked with {:.2f} GiB free", oom_ranks,
                        first_oom, WhereIs(schedule, first_oom, oom.op_id),
                        static_cast<double>(oom.requested_bytes) / kGiB, static_cast<double>(oom.free_bytes) / kGiB);
    return c;
  }
  const traces::ReportMemoryPhases phases = MemoryPhasesOf(schedule, setup, result);
  for (const traces::ReportMemoryClass& phase : phases.classes) {
    if (!phase.init_oom) continue;
    c.verdict = TuneVerdict::kOutOfMemory;
    c.why = fmt::format("the init phase ({}) runs ranks {} out of memory at {}: {:.2f} GiB more needed",
                        phases.init_framework, phase.ranks, phase.init_oom_at,
                        static_cast<double>(phase.init_oom_requested_bytes) / kGiB);
    return c;
  }
  if (result.hung || result.oom_agreed) {
    // No rank ran out of memory, yet the step does not complete: the plan's own divergence.
    // Rare, so the full run that explains it is affordable.
    c.verdict = TuneVerdict::kHangs;
    EngineConfig explain = config;
    explain.rerun_hangs_in_full = true;
    StatusOr<SimulationResult> full = Simulate(schedule, **costs, explain, nullptr);
    std::string first_cause;
    if (full.ok() && full->hung) {
      const HangReport hang = AnalyzeHang(schedule, *full);
      if (!hang.explanation.empty()) first_cause = hang.explanation.front();
    }
    c.why = first_cause.empty() ? std::string("the step does not complete") : "the step hangs: " + first_cause;
    return c;
  }
  c.step_ns = result.step_ns > 0 ? result.step_ns : result.makespan_ns;
  if (retries > 0) {
    c.verdict = TuneVerdict::kRetries;
    c.why = fmt::format("{} allocator retries (the cache freed and the malloc retried) at {:.2f} GiB reserved of "
                        "{:.2f} GiB",
                        retries, static_cast<double>(c.peak_reserved_bytes) / kGiB,
                        static_cast<double>(c.capacity_bytes) / kGiB);
    return c;
  }
  const double step_s = static_cast<double>(c.step_ns) * 1e-9;
  if (step_s > 0) c.tokens_per_second_per_gpu = static_cast<double>(setup.tokens_per_rank_step) / step_s;
  c.mfu_convention = ConventionOf(c.knobs.strategy);
  for (const SimulationSetup::ConventionFigures& figures : setup.mfu_conventions) {
    if (figures.name == c.mfu_convention && figures.peak_flops > 0) {
      c.mfu = figures.flops_per_token * c.tokens_per_second_per_gpu / figures.peak_flops;
    }
  }
  // The check's memory fault (fault_sweep.h FaultKind::kMemoryHeld): another process holds
  // memory on rank 0's GPU. Safe as the check counts it: every rank but rank 0 finishes (an OOM
  // of rank 0 after its last collective hangs nobody).
  if (options.held_bytes > 0) {
    FaultCase fault;
    fault.kind = FaultKind::kMemoryHeld;
    fault.rank = 0;
    fault.held_bytes = options.held_bytes;
    EngineConfig held = config;
    std::vector<int64_t>& capacity = held.memory.capacity_bytes;
    if (capacity.size() == 1) capacity.assign(static_cast<size_t>(schedule.world_size()), capacity.front());
    if (!capacity.empty()) capacity[0] = std::max<int64_t>(0, capacity[0] - fault.held_bytes);
    StatusOr<SimulationResult> checked = Simulate(schedule, **costs, held, nullptr);
    if (!checked.ok()) {
      c.verdict = TuneVerdict::kInvalid;
      c.why = checked.status().message();
      return c;
    }
    bool others_finish = true;
    for (size_t r = 1; r < checked->ranks.size() && others_finish; ++r) {
      others_finish = checked->ranks[r].finished || checked->ranks[r].oom_handled;
    }
    if (!others_finish) {
      const std::optional<OomInfo>& oom = checked->ranks[0].memory.oom;
      c.verdict = TuneVerdict::kCheck;
      c.why = fmt::format("check: with {} the job hangs{}", fault.Label(),
                          oom ? fmt::format(" (rank 0 out of memory at {})", WhereIs(schedule, 0, oom->op_id)) : "");
      return c;
    }
  }
  c.verdict = TuneVerdict::kKept;
  return c;
}

// A candidate's simulated outcome as one process sends it to the others.
nlohmann::json OutcomeJson(const TuneCandidate& c) {
  return {{"index", c.index},           {"verdict", static_cast<int>(c.verdict)},
          {"why", c.why},               {"step_ns", c.step_ns},
          {"tokens", c.tokens_per_second_per_gpu}, {"mfu", c.mfu},
          {"convention", c.mfu_convention},       {"peak", c.peak_reserved_bytes},
          {"capacity", c.capacity_bytes},         {"exposed", c.exposed_comm_ns},
          {"ranks", c.simulated_ranks},         {"time_bound", c.time_bound_ns}};
}

void ApplyOutcome(const nlohmann::json& j, TuneCandidate& c) {
  c.verdict = static_cast<TuneVerdict>(j.at("verdict").get<int>());
  c.why = j.at("why").get<std::string>();
  c.step_ns = j.at("step_ns").get<int64_t>();
  c.tokens_per_second_per_gpu = j.at("tokens").get<double>();
  c.mfu = j.at("mfu").get<double>();
  c.mfu_convention = j.at("convention").get<std::string>();
  c.peak_reserved_bytes = j.at("peak").get<int64_t>();
  c.capacity_bytes = j.at("capacity").get<int64_t>();
  c.exposed_comm_ns = j.at("exposed").get<int64_t>();
  c.simulated_ranks = j.at("ranks").get<int32_t>();
  c.time_bound_ns = j.at("time_bound").get<int64_t>();
}

// Kept candidates fastest first (ties: less memory, then enumeration order).
bool Faster(const TuneCandidate& a, const TuneCandidate& b) {
  if (a.step_ns != b.step_ns) return a.step_ns < b.step_ns;
  if (a.peak_reserved_bytes != b.peak_reserved_bytes) return a.peak_reserved_bytes < b.peak_reserved_bytes;
  return a.index < b.index;
}

// Runs `count` jobs on up to `threads` threads.
void ParallelFor(size_t count, int threads, const std::function<void(size_t)>& job) {
  const size_t workers = std::min(count, static_cast<size_t>(std::max(1, threads)));
  if (workers <= 1) {
    for (size_t i = 0; i < count; ++i) job(i);
    return;
  }
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  for (size_t w = 0; w < workers; ++w) {
    pool.emplace_back([&] {
      for (size_t i = next++; i < count; i = next++) job(i);
    });
  }
  for (std::thread& t : pool) t.join();
}

}  // namespace

StatusOr<TuneResult> Tune(const std::string& plan_path, const TuneOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  if (options.top <= 0) return Status::InvalidInput(fmt::format("--top: expected a positive count, got {}", options.top));
  if (options.held_bytes < 0) return Status::InvalidInput("--held-gib: expected a number of GiB >= 0");
  SHARDSCOPE_ASSIGN_OR_RETURN(SearchBase base, tune_internal::LoadSearchBase(plan_path, options));
  TuneResult result;
  result.plan_path = plan_path;
  result.gpus = base.gpus;
  result.global_batch = base.global_batch;

  // Every candidate: its plan text, parsed once; the loader's refusals and the memory bound
  // settle some at once.
  const std::vector<TuneKnobs> knobs = tune_internal::EnumerateKnobs(base, options.space, options.max_micro_batch);
  result.candidates.resize(knobs.size());
  std::vector<std::optional<Plan>> plans(knobs.size());
  const int threads = options.threads > 0 ? options.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ParallelFor(knobs.size(), threads, [&](size_t i) {
    TuneCandidate& c = result.candidates[i];
    c.index = static_cast<int32_t>(i);
    c.knobs = knobs[i];
    c.label = tune_internal::KnobsLabel(knobs[i], base.gpus);
    c.family = tune_internal::KnobsFamily(knobs[i], base.gpus);
    c.plan_yaml = tune_internal::CandidateYaml(base, knobs[i]);
    StatusOr<Plan> plan = ParsePlan(c.plan_yaml, plan_path);
    if (!plan.ok()) {
      c.verdict = TuneVerdict::kInvalid;
      c.why = plan.status().message();
      return;
    }
    const CandidateBounds bounds = BoundsOf(*plan);
    c.memory_bound_bytes = bounds.memory_bytes();
    c.time_bound_ns = bounds.time_ns;
    const int64_t usable = plan->cluster.gpu.usable_bytes;
    if (usable > 0 && c.memory_bound_bytes > usable) {
      c.verdict = TuneVerdict::kBound;
      c.why = fmt::format("memory bound: model states {:.2f} GiB + saved activations {:.2f} GiB > {:.2f} GiB usable",
                          static_cast<double>(bounds.states_bytes) / kGiB,
                          static_cast<double>(bounds.activations_bytes) / kGiB, static_cast<double>(usable) / kGiB);
      return;
    }
    plans[i] = std::move(*plan);
  });

  // The rest in order of their time bound, in batches.
  std::vector<int32_t> order;
  for (const TuneCandidate& c : result.candidates) {
    if (plans[static_cast<size_t>(c.index)]) order.push_back(c.index);
  }
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return result.candidates[static_cast<size_t>(a)].time_bound_ns < result.candidates[static_cast<size_t>(b)].time_bound_ns;
  });
  std::vector<int32_t> kept;  // simulated and kept, so far
  const auto settled = [&] {
    size_t n = 0;
    for (const TuneCandidate& c : result.candidates) n += c.verdict != TuneVerdict::kBudget;
    return n;
  };
  // A batch's outcomes: the kept ones join the ranking; the ones its schedule bound pruned were
  // lowered but not simulated.
  const auto Settle = [&](const std::vector<int32_t>& batch) {
    for (int32_t index : batch) {
      const TuneVerdict verdict = result.candidates[static_cast<size_t>(index)].verdict;
      if (verdict != TuneVerdict::kDominated) ++result.simulated;
      if (verdict == TuneVerdict::kKept) kept.push_back(index);
    }
  };
  if (options.progress) options.progress(settled(), result.candidates.size());
  for (size_t begin = 0; begin < order.size(); begin += kTuneBatch) {
    // Prune this batch with what the batches before it found (copies: the batch's workers
    // write into the candidates while the snapshot is read).
    std::vector<TuneCandidate> kept_before;
    for (int32_t k : kept) kept_before.push_back(result.candidates[static_cast<size_t>(k)]);
    std::sort(kept_before.begin(), kept_before.end(), Faster);
    PruneSnapshot snapshot;
    snapshot.top = options.top;
    for (const TuneCandidate& k : kept_before) snapshot.kept.push_back(&k);
    if (kept_before.size() >= static_cast<size_t>(options.top)) {
      snapshot.top_step = kept_before[static_cast<size_t>(options.top) - 1].step_ns;
    }
    std::vector<int32_t> batch;
    for (size_t i = begin; i < std::min(order.size(), begin + kTuneBatch); ++i) {
      TuneCandidate& c = result.candidates[static_cast<size_t>(order[i])];
      std::string pruned = PruneReason(c, snapshot, "its FLOPs at the GPU's datasheet peak");
      if (!pruned.empty()) {
        c.verdict = TuneVerdict::kDominated;
        c.why = std::move(pruned);
        continue;
      }
      if (options.max_simulations > 0 && result.simulated + static_cast<int64_t>(batch.size()) >= options.max_simulations) {
        result.budget_ran_out = true;
        continue;  // left kBudget
      }
      batch.push_back(c.index);
    }
    // This process's share of the batch.
    const TuneProcesses& procs = options.processes;
    std::vector<int32_t> mine;
    for (size_t i = 0; i < batch.size(); ++i) {
      if (static_cast<int32_t>(i % static_cast<size_t>(std::max(1, procs.size))) == procs.rank) mine.push_back(batch[i]);
    }
    ParallelFor(mine.size(), threads, [&](size_t i) {
      const auto index = static_cast<size_t>(mine[i]);
      result.candidates[index] = Evaluate(result.candidates[index], *plans[index], options, snapshot);
    });
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (procs.size > 1 && procs.all_gather) {
      nlohmann::json message = {{"elapsed", elapsed}, {"outcomes", nlohmann::json::array()}};
      for (int32_t index : mine) message["outcomes"].push_back(OutcomeJson(result.candidates[static_cast<size_t>(index)]));
      SHARDSCOPE_ASSIGN_OR_RETURN(std::vector<std::string> gathered, procs.all_gather(message.dump()));
      bool stop = false;
      for (size_t p = 0; p < gathered.size(); ++p) {
        const nlohmann::json j = nlohmann::json::parse(gathered[p], nullptr, false);
        if (j.is_discarded()) return Status::Internal(fmt::format("tune: process {} sent an unreadable result", p));
        for (const nlohmann::json& outcome : j.at("outcomes")) {
          ApplyOutcome(outcome, result.candidates[static_cast<size_t>(outcome.at("index").get<int32_t>())]);
        }
        // Rank 0's clock decides the time budget, so every process stops after the same batch.
        if (p == 0) stop = options.max_seconds > 0 && j.at("elapsed").get<double>() > options.max_seconds;
      }
      if (stop && begin + kTuneBatch < order.size()) result.budget_ran_out = true;
      Settle(batch);
      if (options.progress) options.progress(settled(), result.candidates.size());
      if (stop) break;
      continue;
    }
    Settle(batch);
    if (options.progress) options.progress(settled(), result.candidates.size());
    if (options.max_seconds > 0 && elapsed > options.max_seconds) {
      if (begin + kTuneBatch < order.size()) result.budget_ran_out = true;
      break;
    }
  }
  for (TuneCandidate& c : result.candidates) {
    if (c.verdict == TuneVerdict::kBudget && c.why.empty()) c.why = "not simulated: the budget ran out first";
  }
  result.ranking = kept;
  std::sort(result.ranking.begin(), result.ranking.end(), [&](int32_t a, int32_t b) {
    return Faster(result.candidates[static_cast<size_t>(a)], result.candidates[static_cast<size_t>(b)]);
  });
  // The Pareto front of step time against peak reserved: in ranking order, each plan that
  // needs less memory than every faster one.
  int64_t least = std::numeric_limits<int64_t>::max();
  for (int32_t index : result.ranking) {
    const TuneCandidate& c = result.candidates[static_cast<size_t>(index)];
    if (c.peak_reserved_bytes < least) {
      result.pareto.push_back(index);
      least = c.peak_reserved_bytes;
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

}  // namespace shardscope::sim

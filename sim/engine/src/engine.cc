// The discrete-event engine (see engine.h for the semantics, engine_internal.h for where each
// part lives): setup of every rank, the event loop, and the result.
#include "shardscope/sim/engine/engine.h"

#include "engine_internal.h"
#include "shardscope/sim/models/resource_models.h"

namespace shardscope::sim {
namespace engine_internal {

StatusOr<SimulationResult> Engine::Run() {
  const int32_t world = schedule_.world_size();
  for (const auto& [rank, factor] : config_.rank_slowdown) {
    if (rank < 0 || rank >= world) {
      return Status::InvalidInput(fmt::format("straggler rank {} is outside the world of {} ranks", rank, world));
    }
    if (!(factor >= 1.0 && factor <= kMaxRankSlowdownFactor)) {
      return Status::InvalidInput(fmt::format("straggler rank {}: slowdown factor {} must be in [1, {}]", rank, factor,
                                              kMaxRankSlowdownFactor));
    }
  }
  if (config_.inject_oom) {
    const InjectedOom& oom = *config_.inject_oom;
    if (oom.rank < 0 || oom.rank >= world) {
      return Status::InvalidInput(fmt::format("injected OOM: rank {} is outside the world of {} ranks", oom.rank, world));
    }
    const std::vector<Op>& ops = schedule_.ProgramOf(oom.rank).ops;
    if (std::none_of(ops.begin(), ops.end(), [&](const Op& op) {
          return op.id == oom.op_id && std::holds_alternative<traces::AllocateOp>(op.payload);
        })) {
      return Status::InvalidInput(
          fmt::format("injected OOM: rank {} has no allocate op with id {}", oom.rank, oom.op_id));
    }
  }
  // One state per class of identical ranks (rank_classes.h), or per rank.
  if (config_.reduce_symmetry) {
    classes_ = ComputeRankClasses(schedule_, costs_, config_, observer_);
    reduced_ = classes_.reduced();
  }
  const int32_t states = reduced_ ? classes_.classes() : world;
  quorum_.resize(schedule_.communicators.size());
  for (size_t c = 0; c < schedule_.communicators.size(); ++c) {
    quorum_[c] = static_cast<int32_t>(reduced_ ? classes_.members_by_class[c].size()
                                               : schedule_.communicators[c].ranks.size());
  }
  // The resource models decide every rate; the loop below only asks for the next completion.
  ResourceModelsConfig models;
  models.compute_sharing = config_.compute_sharing;
  models.contention = {config_.compute_slowdown, config_.comm_slowdown};
  models.links = reduced_ ? classes_.links : config_.links;
  models.link_topologies = config_.link_topologies;
  SHARDSCOPE_ASSIGN_OR_RETURN(auto resource_models,
                              MakeResourceModels(models, static_cast<int32_t>(schedule_.communicators.size())));
  activities_.emplace(states, std::move(resource_models), &next_seq_);
  ranks_.resize(static_cast<size_t>(states));
  rendezvous_.resize(schedule_.communicators.size());
  for (int32_t state = 0; state < states; ++state) {
    RankState& r = ranks_[static_cast<size_t>(state)];
    const int32_t rank = reduced_ ? classes_.representative[static_cast<size_t>(state)] : state;
    const traces::RankBinding& binding = schedule_.ranks[static_cast<size_t>(rank)];
    r.rank = rank;
    r.state = state;
    r.weight = reduced_ ? classes_.class_size[static_cast<size_t>(state)] : 1;
    r.program = &schedule_.ProgramOf(rank);
    {
      auto [it, inserted] = durations_.try_emplace(r.program);
      if (inserted) it->second.assign(r.program->ops.size(), -1);
      r.durations = &it->second;
      auto [copies, copies_inserted] = copy_durations_.try_emplace(r.program);
      if (copies_inserted) copies->second.assign(r.program->ops.size(), -1);
      r.copy_durations = &copies->second;
    }
    {
      auto [it, inserted] = has_checkpoint_.try_emplace(r.program, false);
      if (inserted) {
        it->second = std::any_of(r.program->ops.begin(), r.program->ops.end(),
                                 [](const Op& op) { return op.tags.phase == traces::Phase::kCheckpoint; });
      }
      r.has_checkpoint_ops = it->second;
    }
    r.streams.resize(r.program->streams.size());
    r.stats.streams.resize(r.program->streams.size());
    r.event_last_record.assign(r.program->events.size(), -1);
    r.comm_of_slot = binding.comm_binding;
    r.own_comm_of_slot = &binding.comm_binding;
    if (r.comm_of_slot.size() != r.program->comm_slots.size()) {
      return Status::Internal(fmt::format("rank {}: communicator slots are not bound", rank));
    }
    if (reduced_) {
      for (int32_t& comm : r.comm_of_slot) comm = classes_.comm_representative[static_cast<size_t>(comm)];
    }
    // Two slots bound to one communicator share its serialization lane.
    for (size_t slot = 0; slot < r.comm_of_slot.size(); ++slot) {
      int32_t lane = -1;
      for (size_t earlier = 0; earlier < slot; ++earlier) {
        if (r.comm_of_slot[earlier] == r.comm_of_slot[slot]) lane = r.lane_of_slot[earlier];
      }
      if (lane < 0) {
        lane = static_cast<int32_t>(r.lanes.size());
        r.lanes.emplace_back();
      }
      r.lane_of_slot.push_back(lane);
    }
    r.want_trace = observer_ != nullptr && observer_->WantsRank(rank);
    if (auto it = config_.rank_slowdown.find(rank); it != config_.rank_slowdown.end()) r.slowdown = it->second;
    // The injected rank may keep reading a shared allocator log: it stops at the injected op
    // before consuming that op's outcome, and every outcome before it is the same as its
    // class's (same program, same capacity, same calls in program order).
    if (config_.inject_oom && config_.inject_oom->rank == rank) r.inject_oom_op_id = config_.inject_oom->op_id;
    if (config_.memory.enabled) {
      const auto& capacities = config_.memory.capacity_bytes;
      if (capacities.empty()) return Status::Internal("memory simulation without capacities");
      const int64_t capacity = capacities[std::min(static_cast<size_t>(rank), capacities.size() - 1)];
      r.stats.memory.capacity_bytes = capacity;
      r.alloc_events = std::make_unique<AllocatorEvents>(*this, &r);
      const bool keep_details = config_.memory.record_history && r.want_trace;
      if (!keep_details) {
        // Ranks with the same program and capacity make the same allocator calls in the same
        // order; without cross-stream events the outcomes do not depend on time, so one
        // allocator run serves them all (BuildAllocatorLog checks that no event was used).
        auto& log = allocator_logs_[{binding.program, capacity}];
        if (!log.built) {
          log.built = true;
          log.log = BuildAllocatorLog(r);
        }
        r.log = log.log;
      }
      if (r.log) {
        r.reserved_peak_seen = r.log->warm_reserved_peak;
        r.stats.memory.fragmentation_bytes = r.log->warm_fragmentation;
        r.stats.memory.allocated_at_reserved_peak = r.log->warm_allocated_at_peak;
      } else {
        CreateAllocator(r);
        if (config_.memory.warm_start) {
          WarmAllocator(r);
        } else {
          AllocateGemmWorkspacesCold(r);
        }
      }
    }
    Push(0, HostResume{state});
    r.host.wait = HostWait::kResumeScheduled;
  }

  int64_t total_ops = 0;
  for (const RankState& r : ranks_) total_ops += static_cast<int64_t>(r.program->ops.size()) * r.weight;
  constexpr int64_t kProgressEvery = int64_t{1} << 20;  // events between progress calls
  EventPayload payload;
  int64_t instant = now_;
  while (PopNext(payload)) {
    if (observer_ != nullptr && now_ != instant) {
      observer_->OnInstantDone();
      instant = now_;
    }
    if (config_.progress && (events_processed_ & (kProgressEvery - 1)) == 0 && total_ops > 0) {
      config_.progress(static_cast<double>(ops_executed_) / static_cast<double>(total_ops));
    }
    ++events_processed_;
    if (const auto* resume = std::get_if<HostResume>(&payload)) {
      RankState& r = ranks_[static_cast<size_t>(resume->state)];
      r.host.wait = HostWait::kNone;
      RunHost(r);
    } else if (const auto* wake = std::get_if<StreamWake>(&payload)) {
      RankState& r = ranks_[static_cast<size_t>(wake->state)];
      StreamState& s = r.streams[static_cast<size_t>(wake->stream)];
      if (s.wake_at == now_) s.wake_at = -1;
      AdvanceStream(r, wake->stream);
    } else {
      const auto& done = std::get<ActivityDone>(payload);
      if (activities_->IsCurrent(done.activity, done.version)) FinishActivity(done.activity);
    }
  }

  if (observer_ != nullptr) observer_->OnInstantDone();
  if (!past_event_.empty()) return Status::Internal(past_event_);
  if (passed_horizon_ || activities_->PassedHorizon()) {
    // Only an input out of scale gets here (schedule.h's limits keep real jobs far below).
    return Status::InvalidInput(fmt::format(
        "the simulated run passes {} ns (36 years) of simulated time: a duration, a size, a bandwidth or a FLOP "
        "rate in the input is out of scale",
        traces::kMaxSimulatedNs));
  }
  SimulationResult result;
  result.ops_executed = ops_executed_;
  result.events_processed = events_processed_;
  result.oom_agreed = oom_agreed_;
  result.symmetry.simulated_ranks = static_cast<int32_t>(ranks_.size());
  result.symmetry.reduced = reduced_;
  if (config_.reduce_symmetry && !reduced_) result.symmetry.why_not = classes_.why_not;
  std::vector<RankStats> per_state;
  per_state.reserve(ranks_.size());
  for (RankState& r : ranks_) {
    bool streams_idle = std::all_of(r.streams.begin(), r.streams.end(),
                                    [](const StreamState& s) { return s.Idle(); });
    r.stats.finished = r.host.wait == HostWait::kDone && streams_idle;
    if (r.log) r.stats.memory.stats = CurrentStats(r);
    if (r.allocator) {
      r.stats.memory.stats = r.allocator->stats();
      if (config_.memory.record_history && r.want_trace) {
        r.stats.memory.snapshot = r.allocator->Snapshot();
        r.stats.memory.history = r.allocator->history();
      }
    }
    if (!r.stats.finished && !r.stats.oom_handled) {
      result.hung = true;
      // A reduced run's states stand for classes, not the ranks a hang report names: they are
      // described rank by rank below (DescribeReducedHang), or the run is simulated again in full.
      if (!reduced_) result.blocked.push_back(DescribeBlocked(r, r.rank, r.comm_of_slot));
    }
    // Without checkpoint ops the step is the whole run (host time after the last span, an
    // out-of-memory stop, included).
    if (!r.has_checkpoint_ops) r.stats.step_end_ns = r.stats.end_ns;
    result.makespan_ns = std::max(result.makespan_ns, r.stats.end_ns);
    result.step_ns = std::max(result.step_ns, r.stats.step_end_ns);
    per_state.push_back(std::move(r.stats));
  }
  result.ranks = reduced_ ? RankResults(std::move(per_state), classes_.class_of_rank) : RankResults(std::move(per_state));
  for (size_t rank = 0; rank < result.ranks.size(); ++rank) {
    const RankStats& stats = result.ranks[rank];
    if (stats.collective_wait_caused_ns < kStragglerMinWaitNs) continue;
    if (result.straggler && stats.collective_wait_caused_ns <= result.straggler->wait_caused_ns) continue;
    result.straggler = Straggler{static_cast<int32_t>(rank), stats.last_arrivals, stats.collectives,
                                 stats.collective_wait_caused_ns};
  }
  if (result.hung) {
    if (!reduced_) {
      result.rendezvous = PendingRendezvouses();
    } else {
      result.symmetry.hang_described = DescribeReducedHang(result);
    }
  }
  return result;
}

// The next event in (time, sequence) order over the engine's heap, this instant's FIFO and the
// resource models' completions. Heap events due now were pushed before this instant began and
// so precede the FIFO; completions interleave with both by sequence number. Only when nothing
// is left at this instant does the clock advance.
SHARDSCOPE_ENGINE_HOT bool Engine::PopNext(EventPayload& payload) {
  const Completion* done = activities_->Next();
  if (!events_.empty()) {
    const ScheduledEvent& top = events_.top();
    // A heap event due now precedes this instant's FIFO (pushed before the instant began).
    if (top.time == now_ || now_events_.empty()) {
      if (done == nullptr || !(done->time < top.time || (done->time == top.time && done->seq < top.seq))) {
        now_ = top.time;
        payload = top.payload;
        events_.pop();
        return true;
      }
      now_ = done->time;
      payload = PopCompletion();
      return true;
    }
  }
  if (!now_events_.empty()) {
    if (done != nullptr && done->time == now_ && done->seq < now_events_.front().seq) {
      payload = PopCompletion();
      return true;
    }
    payload = now_events_.front().payload;
    now_events_.pop_front();
    return true;
  }
  if (done == nullptr) return false;
  now_ = done->time;  // never earlier than now_: completions are queued at now or later
  payload = PopCompletion();
  return true;
}


}  // namespace engine_internal

namespace {

StatusOr<SimulationResult> RunEngine(const traces::Schedule& schedule, const CostProvider& costs,
                                     const EngineConfig& config, EngineObserver* observer) {
  engine_internal::Engine engine(schedule, costs, config, observer);
  return engine.Run();
}

// A reduced run that agrees on an OOM, or hangs where its hang could not be described rank by
// rank (a mismatched rendezvous, whose report reads the order members arrived in), or hangs
// while an observer watches (the hang's trace and dumps come from the run it watched): the
// report names ranks, communicators and arrival orders one by one, which only the full run has.
bool NeedsFullRun(const SimulationResult& result, const EngineConfig& config, bool observed) {
  if (!config.rerun_hangs_in_full || !result.symmetry.reduced) return false;
  return result.oom_agreed || (result.hung && (observed || !result.symmetry.hang_described));
}

}  // namespace

StatusOr<SimulationResult> Simulate(const traces::Schedule& schedule, const CostProvider& costs,
                                    const EngineConfig& config, EngineObserver* observer) {
  if (!config.reduce_symmetry) return RunEngine(schedule, costs, config, observer);
  EngineConfig full = config;
  full.reduce_symmetry = false;
  if (observer != nullptr && config.rerun_hangs_in_full) {
    // The observer sees spans as they happen, so whether the run needs the full simulation is
    // found first by a reduced run it does not watch (a few milliseconds at any scale).
    EngineConfig probe_config = config;
    probe_config.progress = nullptr;
    SHARDSCOPE_ASSIGN_OR_RETURN(SimulationResult probe, RunEngine(schedule, costs, probe_config, nullptr));
    if (NeedsFullRun(probe, config, /*observed=*/true)) {
      SHARDSCOPE_ASSIGN_OR_RETURN(SimulationResult result, RunEngine(schedule, costs, full, observer));
      result.symmetry.why_not = probe.hung ? "the reduced run hangs: simulated in full" : "the reduced run agrees on an OOM: simulated in full";
      return result;
    }
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(SimulationResult result, RunEngine(schedule, costs, config, observer));
  if (!NeedsFullRun(result, config, observer != nullptr)) return result;
  const bool hung = result.hung;
  SHARDSCOPE_ASSIGN_OR_RETURN(result, RunEngine(schedule, costs, full, observer));
  result.symmetry.why_not = hung ? "the reduced run hangs: simulated in full" : "the reduced run agrees on an OOM: simulated in full";
  return result;
}

}  // namespace shardscope::sim

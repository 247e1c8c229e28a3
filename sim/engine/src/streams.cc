// Streams and events: each stream runs its items in FIFO order (an event wait holds its stream
// until the captured record has executed); kernels and copies become activities of the
// resource models, collectives go to rendezvous.cc. A finished activity retires its stream's
// head and advances the streams it held; a kernel followed by a ready kernel hands its activity
// over without telling the models (the GPU's kernel count does not change).
#include "engine_internal.h"

namespace shardscope::sim::engine_internal {

// Retires a stream's head item; a host blocked on that stream's full queue may launch again.
void Engine::PopFront(RankState& r, int32_t stream) {
  r.streams[static_cast<size_t>(stream)].queue.pop_front();
  HostState& host = r.host;
  if (host.wait == HostWait::kQueueFull && host.wait_target == stream) {
    host.clock = std::max(now_, host.launch_blocked_since);
    host.wait = HostWait::kResumeScheduled;
    Push(host.clock, HostResume{r.state});
    // The resume runs within this instant: bring the op it starts with into the cache now.
    __builtin_prefetch(&r.program->ops[static_cast<size_t>(host.pc)]);
  }
}

void Engine::AdvanceStream(RankState& r, int32_t stream) {
  StreamState& s = r.streams[static_cast<size_t>(stream)];
  while (true) {
    if (s.running_activity >= 0 || s.at_rendezvous || s.waiting_turn || s.waiting_record >= 0) return;
    if (s.queue.empty()) {
      OnStreamIdle(r, stream);
      return;
    }
    const QueueItem item = s.queue.front();
    if (item.ready_ns > now_) {
      ScheduleStreamWake(r, stream, item.ready_ns);
      return;
    }
    if (item.op_index < 0) {  // an allocator event (record_stream deferral)
      PopFront(r, stream);
      r.record_done[static_cast<size_t>(item.aux)] = now_;
      OnRecordDone(r, item.aux);
      continue;
    }
    const Op& op = OpOf(r, item.op_index);
    if (const auto* kernel = std::get_if<traces::KernelOp>(&op.payload)) {
      int64_t& ns = (*r.durations)[static_cast<size_t>(item.op_index)];
      if (ns < 0) ns = costs_.KernelNs(kernel->compute);
      StartCompute(r, stream, item, Slowed(r, ns), ActivityKind::kCompute);
      return;
    }
    if (const auto* copy = std::get_if<traces::MemcpyOp>(&op.payload)) {
      int64_t& ns = (*r.copy_durations)[static_cast<size_t>(item.op_index)];
      if (ns < 0) ns = costs_.MemcpyNs(copy->kind, copy->bytes);
      StartCompute(r, stream, item, Slowed(r, ns), ActivityKind::kCopy);
      return;
    }
    if (const auto* coll = std::get_if<traces::CollectiveOp>(&op.payload)) {
      CommLane& lane = r.lanes[static_cast<size_t>(r.lane_of_slot[static_cast<size_t>(coll->comm)])];
      if (lane.completed == item.aux) {
        s.at_rendezvous = true;
        s.arrived_ns = now_;
        if (coll->type == CollectiveType::kSend || coll->type == CollectiveType::kRecv) {
          ArriveP2p(r, stream, item, *coll);
        } else {
          ArriveCollective(r, stream, item, *coll);
        }
      } else {
        s.waiting_turn = true;  // an earlier op of this communicator has not finished
        s.waiting_since = now_;
      }
      return;
    }
    if (std::holds_alternative<traces::EventRecordOp>(op.payload)) {
      PopFront(r, stream);
      r.record_done[static_cast<size_t>(item.aux)] = now_;
      OnRecordDone(r, item.aux);
      continue;
    }
    if (std::holds_alternative<traces::StreamWaitEventOp>(op.payload)) {
      if (r.record_done[static_cast<size_t>(item.aux)] >= 0) {
        PopFront(r, stream);
        continue;
      }
      s.waiting_record = item.aux;
      s.waiting_since = now_;
      return;
    }
    // Nothing else is ever enqueued.
    PopFront(r, stream);
  }
}

void Engine::OnRecordDone(RankState& r, int64_t record) {
  for (size_t i = 0; i < r.streams.size(); ++i) {
    StreamState& other = r.streams[i];
    if (other.waiting_record == record) {
      other.waiting_record = -1;
      PopFront(r, static_cast<int32_t>(i));
      AdvanceStream(r, static_cast<int32_t>(i));
    }
  }
  if (r.host.wait == HostWait::kRecord && r.host.wait_target == record) UnblockHost(r);
}

void Engine::OnStreamIdle(RankState& r, int32_t stream) {
  HostState& host = r.host;
  if (host.wait == HostWait::kStream && host.wait_target == stream) {
    UnblockHost(r);
  } else if (host.wait == HostWait::kDevice &&
             std::all_of(r.streams.begin(), r.streams.end(),
                         [](const StreamState& s) { return s.Idle(); })) {
    UnblockHost(r);
  }
}

// ---- Compute and copies

void Engine::StartCompute(RankState& r, int32_t stream, const QueueItem& item, int64_t work_ns,
                          ActivityKind kind) {
  if (kind == ActivityKind::kCompute) {  // copies are not compute time
    Integrate(r);
    ++r.kernels_running;
  }
  const int32_t gpu = r.state;
  const ActivityId id = activities_->Start(kind, static_cast<double>(work_ns), {&gpu, 1}, CollectiveWork{}, now_);
  DeviceActivity& a = DeviceActivityOf(id);
  a.kind = kind;
  a.ahead_begin = a.ahead_end = 0;
  a.start_ns = now_;
  a.one = Participant{r.state, stream, item.op_index};
  r.streams[static_cast<size_t>(stream)].running_activity = id;
}

void Engine::FinishActivity(ActivityId id) {
  if (HandOverKernel(id)) return;
  DeviceActivity& a = device_activities_[static_cast<size_t>(id)];
  // Copied out: advancing the streams below may start new work on this id.
  const Participant one = a.one;
  const std::vector<Participant> collective_members = std::move(a.members);
  a.members.clear();
  const std::span<const Participant> members =
      a.kind == ActivityKind::kComm ? std::span<const Participant>(collective_members) : std::span<const Participant>(&one, 1);
  const ActivityKind kind = a.kind;
  const int64_t start = a.start_ns;
  const CollectiveRun run = a.run;
  if (kind != ActivityKind::kCopy) {
    for (const Participant& p : members) {
      RankState& r = ranks_[static_cast<size_t>(p.state)];
      Integrate(r);
      --(kind == ActivityKind::kCompute ? r.kernels_running : r.collectives_running);
    }
  }
  activities_->Finish(id, now_);
  for (const Participant& p : members) {
    RankState& r = ranks_[static_cast<size_t>(p.state)];
    StreamState& s = r.streams[static_cast<size_t>(p.stream)];
    s.running_activity = -1;
    s.at_rendezvous = false;
    PopFront(r, p.stream);
    StreamStats& stats = r.stats.streams[static_cast<size_t>(p.stream)];
    stats.busy_ns += now_ - start;
    ++stats.ops;
    r.stats.end_ns = std::max(r.stats.end_ns, now_);
    EmitDevice(r, p, start, now_, kind == ActivityKind::kComm ? &run : nullptr);
  }
  if (kind == ActivityKind::kComm && config_.oom_catch_and_sync) {
    const RankState& first = ranks_[static_cast<size_t>(members.front().state)];
    const bool sync_point = std::get<CollectiveOp>(OpOf(first, members.front().op_index).payload).oom_sync;
    // A member's flag is 1 only in the collective it skipped to after its OOM (the host
    // fills the flag before the launch; the host may run ahead of earlier agreements).
    if (sync_point && std::any_of(members.begin(), members.end(), [&](const Participant& p) {
          const RankState& r = ranks_[static_cast<size_t>(p.state)];
          return r.oom_caught && p.op_index == r.oom_resume_pc;
        })) {
      AgreeOnOom(members, run);  // before the streams advance: no host resumes past it
    }
  }
  for (const Participant& p : members) {
    RankState& r = ranks_[static_cast<size_t>(p.state)];
    if (kind == ActivityKind::kComm) {
      const auto& coll = std::get<CollectiveOp>(OpOf(r, p.op_index).payload);
      CommLane& lane = r.lanes[static_cast<size_t>(r.lane_of_slot[static_cast<size_t>(coll.comm)])];
      ++lane.completed;
      WakeNextOnLane(r, &lane);
    }
    AdvanceStream(r, p.stream);
  }
}

// A kernel op's duration at full speed, cached per program; -1 for other ops (their durations
// are never in this cache: a copy cached here would be handed over to as a kernel).
int64_t Engine::KernelDuration(const RankState& r, int32_t op_index) {
  int64_t& ns = (*r.durations)[static_cast<size_t>(op_index)];
  if (ns < 0) {
    const auto* kernel = std::get_if<traces::KernelOp>(&OpOf(r, op_index).payload);
    if (kernel == nullptr) return -1;
    ns = costs_.KernelNs(kernel->compute);
  }
  return ns;
}

// A kernel ends and the next item of its stream is a kernel that is ready: the stream starts
// it at once, so the GPU's count of running compute kernels goes 1 -> 0 -> 1 within this
// instant, which changes no rate. The activity carries on as the next kernel: nothing is
// recounted, and no collective on the GPU is re-timed twice for nothing.
SHARDSCOPE_ENGINE_HOT bool Engine::HandOverKernel(ActivityId id) {
  DeviceActivity& a = device_activities_[static_cast<size_t>(id)];
  if (a.kind != ActivityKind::kCompute) return false;
  const Participant p = a.one;
  RankState& r = ranks_[static_cast<size_t>(p.state)];
  StreamState& s = r.streams[static_cast<size_t>(p.stream)];
  if (a.ahead_begin == a.ahead_end) {
    // Refill the look-ahead from the queue: the items behind the running one (queue[0]).
    a.ahead_begin = 0;
    a.ahead_end = static_cast<int32_t>(std::min<size_t>(DeviceActivity::kAhead, s.queue.size() - 1));
    for (int32_t i = 0; i < a.ahead_end; ++i) {
      const QueueItem& item = s.queue[static_cast<size_t>(i) + 1];
      a.ahead[static_cast<size_t>(i)] = item;
      a.ahead_ns[static_cast<size_t>(i)] = item.op_index >= 0 ? KernelDuration(r, item.op_index) : -1;
    }
    if (a.ahead_end == 0) return false;
  }
  const QueueItem next = a.ahead[static_cast<size_t>(a.ahead_begin)];
  const int64_t ns = a.ahead_ns[static_cast<size_t>(a.ahead_begin)];
  if (ns < 0 || next.ready_ns > now_) return false;
  // Retire the finished kernel as FinishActivity would.
  const int64_t start = a.start_ns;
  PopFront(r, p.stream);
  StreamStats& stats = r.stats.streams[static_cast<size_t>(p.stream)];
  stats.busy_ns += now_ - start;
  ++stats.ops;
  r.stats.end_ns = std::max(r.stats.end_ns, now_);
  EmitDevice(r, p, start, now_, nullptr);
  // Start the next one on the same activity, at the unchanged rate.
  a.one.op_index = next.op_index;
  ++a.ahead_begin;
  a.start_ns = now_;
  activities_->Restart(id, static_cast<double>(Slowed(r, ns)), now_);
  return true;
}

// Time with compute, with communication, and with both, per rank (HTA's overlap).
void Engine::Integrate(RankState& r) {
  const int64_t dt = now_ - r.last_change_ns;
  if (dt > 0) {
    const bool compute = r.kernels_running > 0;
    const bool comm = r.collectives_running > 0;
    if (compute) r.stats.compute_ns += dt;
    if (comm) r.stats.comm_ns += dt;
    if (compute && comm) r.stats.overlap_ns += dt;
  }
  r.last_change_ns = now_;
}

}  // namespace shardscope::sim::engine_internal

// What an unfinished run leaves for the hang report: why each rank's host and streams stopped
// (BlockedRank), and the collectives some members reached (PendingRendezvous). Runs once per
// unfinished rank when the run ends, never on the hot path.
#include "engine_internal.h"

namespace shardscope::sim::engine_internal {

std::string Engine::DescribeOp(const RankState& r, const std::vector<int32_t>& comm_of_slot, int32_t op_index) const {
  const Op& op = OpOf(r, op_index);
  std::string text = fmt::format("op {} {}", op.id, traces::OpKindName(op.payload));
  if (op.name != traces::kNoName) text += fmt::format(" '{}'", r.program->NameOf(op.name));
  if (const auto* coll = std::get_if<CollectiveOp>(&op.payload)) {
    const int32_t comm = comm_of_slot[static_cast<size_t>(coll->comm)];
    text += fmt::format(" {} on '{}'", traces::CollectiveTypeName(coll->type),
                        schedule_.communicators[static_cast<size_t>(comm)].name);
  }
  return text;
}

// Runs once per unfinished rank when the run ends, never on the hot path. `rank` and
// `comm_of_slot` name the rank described and its communicators: the state's own, or, in a
// reduced run, one member of the state's class (its timeline is the state's; its communicators
// are its own, not the class representatives the state ran on).
BlockedRank Engine::DescribeBlocked(const RankState& r, int32_t rank, const std::vector<int32_t>& comm_of_slot) const {
  BlockedRank blocked;
  blocked.rank = rank;
  const int32_t pc = r.host.pc;
  const bool at_op = static_cast<size_t>(pc) < r.program->ops.size();
  switch (r.host.wait) {
    case HostWait::kDone: blocked.host = "finished issuing"; break;
    case HostWait::kStream:
    case HostWait::kDevice:
    case HostWait::kRecord:
    case HostWait::kQueueFull:
      blocked.host = "blocked in " + DescribeOp(r, comm_of_slot, pc);
      break;
    case HostWait::kStopped:
      blocked.host = (r.oom_caught ? "caught out of memory in " : "stopped: out of memory in ") +
                     DescribeOp(r, comm_of_slot, pc) +
                     (r.oom_caught ? ", waiting in its OOM-flag all_reduce" : "");
      break;
    default: blocked.host = fmt::format("at op index {}", pc); break;
  }
  // Where a pending record sits: the queue item holding it (records execute in their queue).
  auto find_record = [&](int64_t record, int32_t& stream_out, int32_t& op_out) {
    for (size_t i = 0; i < r.streams.size(); ++i) {
      for (const QueueItem& item : r.streams[i].queue) {
        if (item.aux != record) continue;
        if (item.op_index >= 0 && !std::holds_alternative<traces::EventRecordOp>(OpOf(r, item.op_index).payload)) continue;
        stream_out = static_cast<int32_t>(i);
        op_out = item.op_index;
        return;
      }
    }
  };
  BlockedHost& host = blocked.host_state;
  host.since_ns = r.host.wait_start;
  if (at_op && r.host.wait != HostWait::kDone) {
    host.op_index = pc;
    host.op_id = OpOf(r, pc).id;
  }
  switch (r.host.wait) {
    case HostWait::kDone: host.reason = HostBlockReason::kFinished; host.since_ns = r.host.clock; break;
    case HostWait::kStream:
      host.reason = HostBlockReason::kStreamSynchronize;
      host.stream = static_cast<int32_t>(r.host.wait_target);
      break;
    case HostWait::kDevice: host.reason = HostBlockReason::kDeviceSynchronize; break;
    case HostWait::kRecord: {
      host.reason = HostBlockReason::kEventSynchronize;
      if (const auto* sync = std::get_if<traces::EventSynchronizeOp>(&OpOf(r, pc).payload)) host.event = sync->event;
      int32_t unused_op = -1;
      find_record(r.host.wait_target, host.record_stream, unused_op);
      break;
    }
    case HostWait::kQueueFull:
      host.reason = HostBlockReason::kLaunchQueueFull;
      host.stream = static_cast<int32_t>(r.host.wait_target);
      host.since_ns = r.host.launch_blocked_since;
      break;
    case HostWait::kStopped:
      host.reason = HostBlockReason::kOutOfMemory;
      host.since_ns = r.host.clock;
      if (r.oom_caught) {  // waits for its OOM-flag collective (see EngineConfig)
        host.oom_caught = true;
        host.oom_sync_op_index = r.oom_resume_pc;
        host.stream = std::get<CollectiveOp>(OpOf(r, r.oom_resume_pc).payload).stream;
      }
      break;
    default: host.reason = HostBlockReason::kOther; break;
  }

  // Every issued collective with its per-communicator numbers (Flight Recorder counts
  // collectives and p2p apart); the lane index tells which ones are unfinished.
  std::vector<CommLaneState> lanes(r.lanes.size());
  for (size_t slot = 0; slot < comm_of_slot.size(); ++slot) {
    lanes[static_cast<size_t>(r.lane_of_slot[slot])].communicator = comm_of_slot[slot];
  }
  for (size_t lane = 0; lane < r.lanes.size(); ++lane) {
    lanes[lane].issued = r.lanes[lane].issued;
    lanes[lane].completed = r.lanes[lane].completed;
  }
  std::unordered_map<int32_t, std::pair<int32_t, const QueueItem*>> queued;  // op index -> (stream, item)
  for (size_t i = 0; i < r.streams.size(); ++i) {
    for (const QueueItem& item : r.streams[i].queue) {
      if (item.op_index >= 0) queued[item.op_index] = {static_cast<int32_t>(i), &item};
    }
  }
  std::vector<int64_t> coll_count(r.lanes.size(), 0), p2p_count(r.lanes.size(), 0), lane_count(r.lanes.size(), 0);
  std::unordered_map<int32_t, PendingCollective> pending_at;  // op index -> pending collective
  // A rank that caught an OOM skipped the ops after it up to its oom_sync collective, which
  // it issued before it halted (its pc points back at the failing op then).
  const int32_t issued_end = r.oom_caught && r.halted ? r.oom_resume_pc + 1
                             : at_op                 ? pc
                                                     : static_cast<int32_t>(r.program->ops.size());
  for (int32_t index = 0; index < issued_end; ++index) {
    if (r.oom_caught && index > r.oom_pc && index < r.oom_resume_pc) continue;  // skipped
    const auto* coll = std::get_if<CollectiveOp>(&OpOf(r, index).payload);
    if (coll == nullptr) continue;
    const auto lane = static_cast<size_t>(r.lane_of_slot[static_cast<size_t>(coll->comm)]);
    const bool p2p = coll->type == CollectiveType::kSend || coll->type == CollectiveType::kRecv;
    (p2p ? p2p_count : coll_count)[lane]++;
    if (lane_count[lane]++ < r.lanes[lane].completed) continue;
    PendingCollective pending;
    pending.communicator = lanes[lane].communicator;
    pending.seq = coll_count[lane];
    pending.p2p_seq = p2p_count[lane];
    pending.type = coll->type;
    pending.bytes = coll->bytes;
    pending.dtype = coll->dtype;
    pending.peer = coll->peer;
    auto it = queued.find(index);
    if (it != queued.end()) {
      pending.enqueued_ns = it->second.second->ready_ns - config_.launch_overhead_ns;
      const StreamState& s = r.streams[static_cast<size_t>(it->second.first)];
      if (&s.queue.front() == it->second.second && s.at_rendezvous) pending.arrived_ns = s.arrived_ns;
    }
    pending_at[index] = pending;
    blocked.pending.emplace_back(index, pending);
  }
  blocked.lanes = lanes;

  for (size_t i = 0; i < r.streams.size(); ++i) {
    const StreamState& s = r.streams[i];
    if (s.queue.empty()) continue;
    BlockedStream state;
    state.stream = static_cast<int32_t>(i);
    state.queued = static_cast<int64_t>(s.queue.size());
    const QueueItem& head = s.queue.front();
    state.op_index = head.op_index;
    if (head.op_index < 0) {
      blocked.streams.push_back(fmt::format("stream '{}': an allocator event", r.program->streams[i].name));
      state.reason = StreamWaitReason::kAllocatorEvent;
      blocked.stream_states.push_back(state);
      continue;
    }
    state.op_id = OpOf(r, head.op_index).id;
    if (auto it = pending_at.find(head.op_index); it != pending_at.end()) state.collective = it->second;
    if (s.at_rendezvous) {
      state.reason = StreamWaitReason::kRendezvous;
      state.since_ns = s.arrived_ns;
    } else if (s.waiting_turn) {
      state.reason = StreamWaitReason::kCommunicatorTurn;
      state.since_ns = s.waiting_since;
      // The communicator's next op on this rank: the unfinished one with the lowest lane index.
      const auto& coll = std::get<CollectiveOp>(OpOf(r, head.op_index).payload);
      const int32_t lane = r.lane_of_slot[static_cast<size_t>(coll.comm)];
      for (const auto& [index, pending] : blocked.pending) {
        const auto& other = std::get<CollectiveOp>(OpOf(r, index).payload);
        if (r.lane_of_slot[static_cast<size_t>(other.comm)] != lane) continue;
        auto where = queued.find(index);
        if (where != queued.end()) {
          state.turn_stream = where->second.first;
          state.turn_op_index = index;
        }
        break;
      }
    } else if (s.waiting_record >= 0) {
      state.reason = StreamWaitReason::kEventRecord;
      state.since_ns = s.waiting_since;
      if (const auto* wait = std::get_if<traces::StreamWaitEventOp>(&OpOf(r, head.op_index).payload)) state.event = wait->event;
      find_record(s.waiting_record, state.record_stream, state.record_op_index);
    }
    std::string why = s.at_rendezvous    ? " (waiting for peers)"
                      : s.waiting_turn   ? " (waiting for an earlier op of its communicator)"
                      : s.waiting_record >= 0 ? " (waiting for an event)"
                                              : "";
    blocked.streams.push_back(fmt::format("stream '{}': {}{}", r.program->streams[i].name,
                                          DescribeOp(r, comm_of_slot, head.op_index), why));
    blocked.stream_states.push_back(std::move(state));
  }
  return blocked;
}

// Collectives some members reached: who arrived, with what (the hang report's input). In a
// reduced run a representative communicator's rendezvous holds one arrival per rank class;
// each communicator of its class gets its own members of the classes that arrived, in the
// communicator's rank order (the full run lists them in arrival order; the report reads the
// order only where arrivals differ, a mismatch, and a reduced run with one is simulated in full).
std::vector<PendingRendezvous> Engine::PendingRendezvouses() const {
  std::vector<PendingRendezvous> out;
  for (size_t comm = 0; comm < rendezvous_.size(); ++comm) {
    const size_t runs_on = reduced_ ? static_cast<size_t>(classes_.comm_representative[comm]) : comm;
    const Rendezvous& rv = rendezvous_[runs_on];
    if (rv.arrived.empty()) continue;
    PendingRendezvous pending;
    pending.communicator = static_cast<int32_t>(comm);
    pending.seq = rv.seq + 1;
    pending.mismatch = rv.mismatch;
    const auto arrival = [&](const Participant& p, int32_t rank) {
      const RankState& r = ranks_[static_cast<size_t>(p.state)];
      const auto& coll = std::get<CollectiveOp>(OpOf(r, p.op_index).payload);
      pending.arrived.push_back({rank, p.stream, p.op_index, coll.type, coll.bytes, coll.dtype});
    };
    if (!reduced_) {
      for (const Participant& p : rv.arrived) arrival(p, ranks_[static_cast<size_t>(p.state)].rank);
    } else {
      for (int32_t member : schedule_.communicators[comm].ranks) {
        const int32_t state = classes_.class_of_rank[static_cast<size_t>(member)];
        auto it = std::find_if(rv.arrived.begin(), rv.arrived.end(), [&](const Participant& p) { return p.state == state; });
        if (it != rv.arrived.end()) arrival(*it, member);
      }
    }
    out.push_back(std::move(pending));
  }
  return out;
}

// The hang report's input from a reduced run: every unfinished rank described through its
// class's state, and the rendezvous expanded. False (nothing set) when a rendezvous is
// mismatched: there the report reads the order the members arrived in, which only the full
// run has.
bool Engine::DescribeReducedHang(SimulationResult& result) const {
  if (std::any_of(rendezvous_.begin(), rendezvous_.end(), [](const Rendezvous& rv) { return rv.mismatch && !rv.arrived.empty(); })) {
    return false;
  }
  for (size_t rank = 0; rank < classes_.class_of_rank.size(); ++rank) {
    const RankStats& stats = result.ranks[rank];
    if (stats.finished || stats.oom_handled) continue;
    const RankState& r = ranks_[static_cast<size_t>(classes_.class_of_rank[rank])];
    result.blocked.push_back(DescribeBlocked(r, static_cast<int32_t>(rank), schedule_.ranks[rank].comm_binding));
  }
  result.rendezvous = PendingRendezvouses();
  return true;
}

}  // namespace shardscope::sim::engine_internal

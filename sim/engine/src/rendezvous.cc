// Collectives and send/recv pairs meeting their peers: per-communicator serialization lanes,
// the rendezvous of every member (type, size and dtype must match), p2p matching by
// (communicator, sender, receiver), straggler attribution, and the start of the collective's
// activity.
#include "engine_internal.h"

namespace shardscope::sim::engine_internal {

// A lane finished an op: the stream whose head is the lane's next op may now arrive.
void Engine::WakeNextOnLane(RankState& r, const CommLane* lane) {
  for (size_t i = 0; i < r.streams.size(); ++i) {
    StreamState& s = r.streams[i];
    if (!s.waiting_turn) continue;
    const QueueItem& head = s.queue.front();
    const auto& coll = std::get<CollectiveOp>(OpOf(r, head.op_index).payload);
    if (&r.lanes[static_cast<size_t>(r.lane_of_slot[static_cast<size_t>(coll.comm)])] != lane) continue;
    if (head.aux != lane->completed) continue;
    s.waiting_turn = false;
    AdvanceStream(r, static_cast<int32_t>(i));
    return;
  }
}

void Engine::ArriveCollective(RankState& r, int32_t stream, const QueueItem& item,
                              const CollectiveOp& op) {
  const int32_t comm = r.comm_of_slot[static_cast<size_t>(op.comm)];
  Rendezvous& rv = rendezvous_[static_cast<size_t>(comm)];
  // all_to_all may move different amounts per rank (torch.distributed.all_to_all_single with
  // input/output split sizes; NCCL runs it as grouped ncclSend/ncclRecv, one pair per peer).
  // Flight Recorder's analyzer accepts that too: it checks an all_to_all only by the totals
  // over ranks (check_size_alltoall, torch/distributed/flight_recorder/components/utils.py).
  const bool sizes_may_differ = op.type == CollectiveType::kAllToAll;
  if (rv.arrived.empty()) {
    rv.first = &op;
    rv.max_bytes = op.bytes;
  } else if (op.type != rv.first->type || op.dtype != rv.first->dtype ||
             (op.bytes != rv.first->bytes && !sizes_may_differ)) {
    rv.mismatch = true;  // NCCL would hang or corrupt memory: never start it
  }
  rv.max_bytes = std::max(rv.max_bytes, op.bytes);
  rv.arrived.push_back(Participant{r.state, stream, item.op_index});
  if (rv.arrived.size() < static_cast<size_t>(quorum_[static_cast<size_t>(comm)]) || rv.mismatch) return;
  std::vector<Participant> participants = std::move(rv.arrived);
  rv.arrived.clear();
  const CollectiveOp& first = *rv.first;
  rv.first = nullptr;
  // Every member's grouped send/recv ends only when its slowest pair has: the instance is
  // costed with the largest member's bytes (equal to every member's outside all_to_all).
  StartCollective(comm, std::move(participants), first, rv.max_bytes, rv.seq++);
}

void Engine::ArriveP2p(RankState& r, int32_t stream, const QueueItem& item, const CollectiveOp& op) {
  const int32_t comm = r.comm_of_slot[static_cast<size_t>(op.comm)];
  const bool is_send = op.type == CollectiveType::kSend;
  P2pKey key{comm, is_send ? r.rank : op.peer, is_send ? op.peer : r.rank};
  P2pPending& pending = p2p_[key];
  Participant me{r.state, stream, item.op_index};
  if (is_send) {
    pending.has_send = true;
    pending.send = me;
  } else {
    pending.has_recv = true;
    pending.recv = me;
  }
  if (!pending.has_send || !pending.has_recv) return;
  std::vector<Participant> members = {pending.send, pending.recv};
  const CollectiveOp& send_op = std::get<CollectiveOp>(
      OpOf(ranks_[static_cast<size_t>(pending.send.state)], pending.send.op_index).payload);
  const int64_t seq = pending.seq++;
  pending.has_send = pending.has_recv = false;
  StartCollective(comm, std::move(members), send_op, send_op.bytes, seq);
}

// The members of representative communicator `comm` that `state` stands for: its class's
// members there (classes are few per communicator: a linear search).
int64_t Engine::Multiplicity(int32_t comm, int32_t state) const {
  if (!reduced_) return 1;
  for (const auto& [klass, count] : classes_.members_by_class[static_cast<size_t>(comm)]) {
    if (klass == state) return count;
  }
  return 1;
}

// The instance starts now, when its last member arrived: who was last, and for how long the
// others had waited (see RankStats::last_arrivals). Reduced, a participant stands for its
// class's members in the communicator, who arrived together. O(members), no allocation.
void Engine::AttributeWaits(int32_t comm, const std::vector<Participant>& members) {
  int32_t last_state = -1;
  int64_t arrived_now = 0;
  int64_t waited_ns = 0;
  for (const Participant& p : members) {
    RankState& r = ranks_[static_cast<size_t>(p.state)];
    ++r.stats.collectives;
    const int64_t arrived = r.streams[static_cast<size_t>(p.stream)].arrived_ns;
    const int64_t members_here = Multiplicity(comm, p.state);
    if (arrived >= now_) {
      arrived_now += members_here;
      last_state = p.state;
    } else {
      waited_ns += members_here * (now_ - arrived);
    }
  }
  if (arrived_now != 1) return;  // a tie: nobody was late
  RankStats& late = ranks_[static_cast<size_t>(last_state)].stats;
  ++late.last_arrivals;
  late.collective_wait_caused_ns += waited_ns;
}

void Engine::StartCollective(int32_t comm, std::vector<Participant> members, const CollectiveOp& op,
                             int64_t bytes, int64_t seq) {
  AttributeWaits(comm, members);
  const CostKey key{comm, op.type, bytes};
  auto cached = cost_cache_.find(key);
  if (cached == cost_cache_.end()) {
    cached = cost_cache_.emplace(key, costs_.Collective(op.type, bytes, comm)).first;
  }
  // Time with compute / comm is integrated up to now before the collective joins its GPUs.
  member_ranks_.clear();
  for (const Participant& p : members) {
    RankState& r = ranks_[static_cast<size_t>(p.state)];
    Integrate(r);
    ++r.collectives_running;
    member_ranks_.push_back(p.state);
  }
  const ActivityId id = activities_->Start(ActivityKind::kComm, static_cast<double>(cached->second.duration_ns),
                                           member_ranks_,
                                           CollectiveWork{comm, op.type, cached->second.algorithm, bytes}, now_);
  DeviceActivity& a = DeviceActivityOf(id);
  a.kind = ActivityKind::kComm;
  a.start_ns = now_;
  a.members = std::move(members);
  a.run = CollectiveRun{comm, seq, cached->second};
  for (const Participant& p : a.members) {
    ranks_[static_cast<size_t>(p.state)].streams[static_cast<size_t>(p.stream)].running_activity = id;
  }
}

}  // namespace shardscope::sim::engine_internal

// The wait-for graph of a hung simulation (the hang analyzer's first step; see
// hang_internal.h), and the texts naming what its vertices do.
//
// The wait-for graph has an edge "A waits for B":
//   host    -> stream        (cudaStreamSynchronize, cudaDeviceSynchronize, a full launch queue)
//   host    -> event -> stream holding the awaited record (cudaEventSynchronize)
//   stream  -> event -> stream holding the awaited record (cudaStreamWaitEvent)
//   stream  -> stream holding the communicator's earlier op on the same rank (NCCL runs a
//              communicator's work in issue order on each rank)
//   stream  -> rendezvous (a collective that arrived) -> each member that has not arrived:
//              the stream holding that member's next op of the communicator, or its host when
//              it has not issued it.
//   stream  -> the peer's position on the communicator, for a send or recv that arrived (NCCL
//              pairs point-to-point ops; the peer has not reached the matching one)
//   host    -> stream holding its OOM-flag collective, for a rank that caught an out-of-memory
//              error under catch_and_sync (Composer reads the flag back with .item())
// A rendezvous whose members arrived with different types, sizes or dtypes waits for nothing:
// it never starts (NCCL would hang or corrupt memory), so it is a root (hang.cc finds them).
#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "hang_internal.h"

namespace shardscope::sim::hang_internal {

size_t Analyzer::Vertex(WaitVertexKind kind, int32_t a, int32_t b, int64_t c) {
  const auto key = std::make_tuple(static_cast<int>(kind), a, b, c);
  auto [it, inserted] = vertex_index_.try_emplace(key, report_.vertices.size());
  if (!inserted) return it->second;
  WaitVertex v;
  v.kind = kind;
  switch (kind) {
    case WaitVertexKind::kHost:
      v.rank = a;
      v.label = fmt::format("rank {} host", a);
      break;
    case WaitVertexKind::kStream:
      v.rank = a;
      v.stream = b;
      v.label = fmt::format("rank {} stream '{}'", a, StreamName(a, b));
      break;
    case WaitVertexKind::kEvent:
      v.rank = a;
      v.event = b;
      v.stream = static_cast<int32_t>(c);
      v.label = b >= 0 ? fmt::format("rank {} event '{}'", a, ProgramOf(a).events[static_cast<size_t>(b)])
                       : fmt::format("rank {} allocator event", a);
      break;
    case WaitVertexKind::kRendezvous: {
      v.communicator = a;
      v.seq = c;
      auto rv = rendezvous_of_comm_.find(a);
      const CollectiveType type = rv != rendezvous_of_comm_.end() && !rv->second->arrived.empty()
                                      ? rv->second->arrived.front().type
                                      : CollectiveType::kAllReduce;
      v.label = CollectiveName(schedule_, type, a, c);
      break;
    }
  }
  report_.vertices.push_back(std::move(v));
  return it->second;
}

std::string Analyzer::OpText(int32_t rank, int32_t op_index) const {
  const traces::Program& program = ProgramOf(rank);
  const traces::Op& op = program.ops[static_cast<size_t>(op_index)];
  std::string text = fmt::format("op {}", op.id);
  if (op.name != traces::kNoName) text += fmt::format(" ('{}')", program.NameOf(op.name));
  if (const auto* alloc = std::get_if<traces::AllocateOp>(&op.payload)) {
    text += fmt::format(", allocating '{}'", program.tensors[static_cast<size_t>(alloc->tensor)]);
  }
  return text;
}

std::string Analyzer::PendingText(const PendingCollective& p) const {
  if (!IsP2p(p.type)) return CollectiveName(schedule_, p.type, p.communicator, p.seq);
  return fmt::format("{} {} rank {} on '{}' (p2p_seq_id {})", traces::CollectiveTypeName(p.type),
                     p.type == CollectiveType::kSend ? "to" : "from", p.peer,
                     schedule_.communicators[static_cast<size_t>(p.communicator)].name, p.p2p_seq);
}

const PendingCollective* Analyzer::PendingAt(int32_t rank, int32_t op_index) const {
  auto it = blocked_.find(rank);
  if (it == blocked_.end()) return nullptr;
  for (const auto& [index, pending] : it->second->pending) {
    if (index == op_index) return &pending;
  }
  return nullptr;
}

const BlockedStream* Analyzer::StreamState(int32_t rank, int32_t stream) const {
  auto it = blocked_.find(rank);
  if (it == blocked_.end()) return nullptr;
  for (const BlockedStream& s : it->second->stream_states) {
    if (s.stream == stream) return &s;
  }
  return nullptr;
}

std::string Analyzer::HeadCollective(int32_t rank, int32_t stream) const {
  const BlockedStream* s = StreamState(rank, stream);
  return s != nullptr && s->collective ? PendingText(*s->collective) : "";
}

std::string Analyzer::MissingP2pText(int32_t poster, int32_t peer, int32_t comm, CollectiveType posted) const {
  const std::string_view wanted = posted == CollectiveType::kSend ? "recv" : "send";
  const CollectiveType wanted_type = posted == CollectiveType::kSend ? CollectiveType::kRecv : CollectiveType::kSend;
  auto it = blocked_.find(peer);
  if (it == blocked_.end()) return fmt::format("rank {} never posted the matching {} (it finished its program)", peer, wanted);
  const BlockedRank& b = *it->second;
  // Issued: the matching op is queued behind the peer's earlier work, or the peer is in
  // another op of the communicator.
  bool matching_issued = false;
  for (const auto& [op_index, pending] : b.pending) {
    if (pending.communicator == comm && pending.type == wanted_type && pending.peer == poster) matching_issued = true;
  }
  for (const auto& [op_index, pending] : b.pending) {
    if (pending.communicator != comm) continue;
    const auto& coll = std::get<CollectiveOp>(ProgramOf(peer).ops[static_cast<size_t>(op_index)].payload);
    const BlockedStream* s = StreamState(peer, coll.stream);
    const bool at_head = s != nullptr && s->op_index == op_index;
    if (matching_issued) {
      const std::string head = HeadCollective(peer, coll.stream);
      return fmt::format("rank {} issued the matching {} but its stream '{}' is behind {}", peer, wanted,
                         StreamName(peer, coll.stream), head.empty() ? "other work" : head);
    }
    if (at_head) return fmt::format("rank {} has not posted the matching {}: it is in {}", peer, wanted, PendingText(pending));
    const std::string head = HeadCollective(peer, coll.stream);
    return fmt::format("rank {} has not posted the matching {}: its stream '{}' is behind {}", peer, wanted,
                       StreamName(peer, coll.stream), head.empty() ? "other work" : head);
  }
  const BlockedHost& h = b.host_state;
  switch (h.reason) {
    case HostBlockReason::kOutOfMemory:
      if (h.oom_caught) {
        return fmt::format("rank {} never posted the matching {} (it caught an out-of-memory error at {} and waits "
                           "in its OOM-flag collective)",
                           peer, wanted, OpText(peer, h.op_index));
      }
      return fmt::format("rank {} never posted the matching {} (it stopped: out of memory at {})", peer, wanted,
                         h.op_index >= 0 ? OpText(peer, h.op_index) : "an allocation");
    case HostBlockReason::kFinished:
      return fmt::format("rank {} never posted the matching {} (it finished issuing without one)", peer, wanted);
    default:
      return fmt::format("rank {} has not posted the matching {} yet (host blocked in {})", peer, wanted,
                         b.host.rfind("blocked in ", 0) == 0 ? b.host.substr(11) : b.host);
  }
}

std::string Analyzer::CaughtOomLine(int32_t rank) const {
  const BlockedRank& b = *blocked_.at(rank);
  const BlockedHost& h = b.host_state;
  const PendingCollective* flag = PendingAt(rank, h.oom_sync_op_index);
  std::string text = fmt::format("rank {} caught an out-of-memory error at {} (oom.policy catch_and_sync) and waits "
                                 "in its OOM-flag {}",
                                 rank, h.op_index >= 0 ? OpText(rank, h.op_index) : "an allocation",
                                 flag != nullptr ? PendingText(*flag) : "collective");
  if (flag == nullptr) return text;
  // The other members not at the flag: where each waits instead (grouped, in rank order).
  std::map<std::string, std::vector<int32_t>> went_on;
  std::vector<std::string> order;
  for (int32_t m : schedule_.communicators[static_cast<size_t>(flag->communicator)].ranks) {
    if (m == rank) continue;
    std::string where = "finished the program";
    if (auto it = blocked_.find(m); it != blocked_.end()) {
      where = DoingText(m, flag->communicator);
      for (const BlockedStream& s : it->second->stream_states) {
        if (s.reason != StreamWaitReason::kRendezvous || !s.collective) continue;
        const PendingCollective& c = *s.collective;
        const bool at_flag = c.communicator == flag->communicator && c.seq == flag->seq && c.type == flag->type;
        where = at_flag ? std::string() : "went on into " + PendingText(c);
        break;
      }
    }
    if (where.empty()) continue;  // waits in the flag too
    if (went_on.find(where) == went_on.end()) order.push_back(where);
    went_on[where].push_back(m);
  }
  for (const std::string& where : order) text += fmt::format("; {} {}", RanksPhrase(went_on[where]), where);
  return text;
}

size_t Analyzer::PositionOn(int32_t rank, int32_t comm) {
  auto it = blocked_.find(rank);
  if (it == blocked_.end()) return Host(rank);  // finished everything without entering it
  const BlockedRank& b = *it->second;
  for (const auto& [op_index, pending] : b.pending) {
    if (pending.communicator != comm) continue;
    const auto& coll = std::get<CollectiveOp>(ProgramOf(rank).ops[static_cast<size_t>(op_index)].payload);
    return Stream(rank, coll.stream);  // the communicator's next op on this rank, still queued
  }
  return Host(rank);  // not issued yet: the host is elsewhere
}

// What a rank that has not arrived at `comm`'s collective is doing instead.
std::string Analyzer::DoingText(int32_t rank, int32_t comm) const {
  auto it = blocked_.find(rank);
  if (it == blocked_.end()) return "finished";
  const BlockedRank& b = *it->second;
  for (const auto& [op_index, pending] : b.pending) {
    if (pending.communicator != comm) continue;
    const auto& coll = std::get<CollectiveOp>(ProgramOf(rank).ops[static_cast<size_t>(op_index)].payload);
    const std::string head = HeadCollective(rank, coll.stream);
    return fmt::format("issued it, stream '{}' is behind {}", StreamName(rank, coll.stream),
                       head.empty() ? "other work" : head);
  }
  switch (b.host_state.reason) {
    case HostBlockReason::kOutOfMemory: {
      if (!b.host_state.oom_caught) return "stopped: out of memory";
      const PendingCollective* flag = PendingAt(rank, b.host_state.oom_sync_op_index);
      return "caught an out-of-memory error and waits in its OOM-flag " +
             (flag != nullptr ? PendingText(*flag) : std::string("collective"));
    }
    case HostBlockReason::kFinished: return "finished issuing without it";
    default: return fmt::format("host blocked in {}", b.host);
  }
}

void Analyzer::BuildGraph() {
  for (const PendingRendezvous& rv : result_.rendezvous) rendezvous_of_comm_[rv.communicator] = &rv;
  for (const BlockedRank& b : result_.blocked) {
    const int32_t rank = b.rank;
    const BlockedHost& h = b.host_state;
    const std::set<int32_t> busy = [&] {
      std::set<int32_t> s;
      for (const BlockedStream& st : b.stream_states) s.insert(st.stream);
      return s;
    }();
    switch (h.reason) {
      case HostBlockReason::kStreamSynchronize:
      case HostBlockReason::kLaunchQueueFull:
        if (h.stream >= 0) Edge(Host(rank), Stream(rank, h.stream));
        break;
      case HostBlockReason::kDeviceSynchronize:
        for (int32_t s : busy) Edge(Host(rank), Stream(rank, s));
        break;
      case HostBlockReason::kEventSynchronize: {
        const size_t event = Event(rank, h.event, h.record_stream);
        Edge(Host(rank), event);
        if (h.record_stream >= 0) Edge(event, Stream(rank, h.record_stream));
        break;
      }
      case HostBlockReason::kOutOfMemory:
        // Caught under catch_and_sync: the host waits for its OOM-flag collective's result.
        if (h.oom_caught && h.stream >= 0) {
          Edge(Host(rank), Stream(rank, h.stream));
        } else {
          Host(rank);
        }
        break;
      default: break;
    }
    for (const BlockedStream& s : b.stream_states) {
      const size_t self = Stream(rank, s.stream);
      switch (s.reason) {
        case StreamWaitReason::kEventRecord: {
          const size_t event = Event(rank, s.event, s.record_stream);
          Edge(self, event);
          if (s.record_stream >= 0) Edge(event, Stream(rank, s.record_stream));
          break;
        }
        case StreamWaitReason::kCommunicatorTurn:
          if (s.turn_stream >= 0) Edge(self, Stream(rank, s.turn_stream));
          break;
        case StreamWaitReason::kRendezvous: {
          if (!s.collective) break;
          const int32_t comm = s.collective->communicator;
          if (IsP2p(s.collective->type)) {  // a send or recv waits for its peer only
            Edge(self, PositionOn(s.collective->peer, comm));
            HalfArrivedP2p half;
            half.rank = rank;
            half.peer = s.collective->peer;
            half.communicator = comm;
            half.type = s.collective->type;
            half.p2p_seq = s.collective->p2p_seq;
            half.bytes = s.collective->bytes;
            half.arrived_ns = s.collective->arrived_ns;
            half.text = fmt::format("rank {} is in {}; {}", rank, PendingText(*s.collective),
                                    MissingP2pText(rank, half.peer, comm, half.type));
            report_.p2p.push_back(std::move(half));
            break;
          }
          auto rv = rendezvous_of_comm_.find(comm);
          if (rv == rendezvous_of_comm_.end()) break;
          Edge(self, Rendezvous(comm, rv->second->seq));
          break;
        }
        default: break;
      }
    }
  }
  for (const PendingRendezvous& rv : result_.rendezvous) {
    const size_t vertex = Rendezvous(rv.communicator, rv.seq);
    if (rv.mismatch) continue;  // it never starts: a root
    std::set<int32_t> arrived;
    for (const auto& a : rv.arrived) arrived.insert(a.rank);
    for (int32_t member : schedule_.communicators[static_cast<size_t>(rv.communicator)].ranks) {
      if (!arrived.count(member)) Edge(vertex, PositionOn(member, rv.communicator));
    }
  }
}

std::vector<size_t> Analyzer::CycleOrder(const std::vector<size_t>& component) const {
  // A DFS inside the component from its first vertex back to it.
  const std::set<size_t> inside(component.begin(), component.end());
  std::map<size_t, std::vector<size_t>> out;
  for (const WaitEdge& e : report_.edges) {
    if (inside.count(e.from) && inside.count(e.to)) out[e.from].push_back(e.to);
  }
  const size_t start = component.front();
  std::vector<size_t> path = {start};
  std::vector<size_t> next_child = {0};
  std::set<size_t> on_path = {start};
  while (!path.empty()) {
    const size_t v = path.back();
    const auto& children = out[v];
    if (next_child.back() >= children.size()) {
      on_path.erase(v);
      path.pop_back();
      next_child.pop_back();
      continue;
    }
    const size_t child = children[next_child.back()++];
    if (child == start) return path;
    if (on_path.count(child)) continue;
    path.push_back(child);
    next_child.push_back(0);
    on_path.insert(child);
  }
  return component;
}

}  // namespace shardscope::sim::hang_internal

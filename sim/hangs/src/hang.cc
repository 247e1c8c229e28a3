// Hang analysis (see hang.h).
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
// it never starts (NCCL would hang or corrupt memory), so it is a root. The minimal blocking
// set is the set of sink components of the graph's condensation: every blocked vertex reaches
// one, and unblocking them would let the rest move.
#include "shardscope/sim/hangs/hang.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/strong_components.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "shardscope/traces/collective_counts.h"

namespace shardscope::sim {
namespace {

using traces::CollectiveOp;
using traces::CollectiveType;

bool IsP2p(CollectiveType type) { return type == CollectiveType::kSend || type == CollectiveType::kRecv; }

std::string RanksPhrase(const std::vector<int32_t>& ranks) {
  std::set<int32_t> unique(ranks.begin(), ranks.end());
  return fmt::format("{} {}", unique.size() == 1 ? "rank" : "ranks", CompressRanks(ranks));
}

// "rank 3 waits" / "ranks 0-2 wait".
std::string RanksWait(const std::vector<int32_t>& ranks) {
  std::set<int32_t> unique(ranks.begin(), ranks.end());
  return RanksPhrase(ranks) + (unique.size() == 1 ? " waits" : " wait");
}

std::string CollectiveName(const traces::Schedule& schedule, CollectiveType type, int32_t comm, int64_t seq) {
  return fmt::format("{} #{} on '{}'", traces::CollectiveTypeName(type), seq,
                     schedule.communicators[static_cast<size_t>(comm)].name);
}

std::string Bytes(int64_t bytes) {
  const auto value = static_cast<double>(bytes);
  return bytes >= (int64_t{1} << 30) ? fmt::format("{:.2f} GiB", value / (1 << 30))
                                     : fmt::format("{:.2f} MiB", value / (1 << 20));
}

class Analyzer {
 public:
  Analyzer(const traces::Schedule& schedule, const SimulationResult& result, const HangOptions& options)
      : schedule_(schedule), result_(result), options_(options) {
    for (const BlockedRank& b : result.blocked) blocked_[b.rank] = &b;
  }

  HangReport Run();

 private:
  size_t Vertex(WaitVertexKind kind, int32_t a, int32_t b, int64_t c);
  size_t Host(int32_t rank) { return Vertex(WaitVertexKind::kHost, rank, -1, 0); }
  size_t Stream(int32_t rank, int32_t stream) { return Vertex(WaitVertexKind::kStream, rank, stream, 0); }
  size_t Event(int32_t rank, int32_t event, int32_t record_stream) {
    return Vertex(WaitVertexKind::kEvent, rank, event, record_stream);
  }
  size_t Rendezvous(int32_t comm, int64_t seq) { return Vertex(WaitVertexKind::kRendezvous, comm, -1, seq); }
  void Edge(size_t from, size_t to) {
    if (edge_set_.insert({from, to}).second) report_.edges.push_back({from, to});
  }
  // What `rank` does instead of entering `comm`'s next collective: the vertex to wait for.
  size_t PositionOn(int32_t rank, int32_t comm);
  const traces::Program& ProgramOf(int32_t rank) const { return schedule_.ProgramOf(rank); }
  std::string StreamName(int32_t rank, int32_t stream) const {
    return ProgramOf(rank).streams[static_cast<size_t>(stream)].name;
  }
  std::string OpText(int32_t rank, int32_t op_index) const;
  // "all_gather #17 on 'dp'", or for p2p "send to rank 3 on 'pp' (p2p_seq_id 1)".
  std::string PendingText(const PendingCollective& p) const;
  const PendingCollective* PendingAt(int32_t rank, int32_t op_index) const;
  const BlockedStream* StreamState(int32_t rank, int32_t stream) const;
  // What the peer of a half-arrived send/recv does instead of the matching op.
  std::string MissingP2pText(int32_t poster, int32_t peer, int32_t comm, CollectiveType posted) const;
  // A rank that caught an out-of-memory error and waits in its OOM-flag collective, and what
  // the other members of that communicator went on into instead.
  std::string CaughtOomLine(int32_t rank) const;
  bool OomCaught(int32_t rank) const {
    auto it = blocked_.find(rank);
    return it != blocked_.end() && it->second->host_state.oom_caught;
  }
  // The unfinished collective at the head of a stream, described; empty when none.
  std::string HeadCollective(int32_t rank, int32_t stream) const;
  std::string DoingText(int32_t rank, int32_t comm) const;
  void BuildGraph();
  void FindCauses();
  void Watchdog();
  std::string CauseText(RootCause& cause);
  std::vector<size_t> CycleOrder(const std::vector<size_t>& component) const;

  const traces::Schedule& schedule_;
  const SimulationResult& result_;
  const HangOptions& options_;
  std::map<int32_t, const BlockedRank*> blocked_;
  std::map<std::tuple<int, int32_t, int32_t, int64_t>, size_t> vertex_index_;
  std::set<std::pair<size_t, size_t>> edge_set_;
  std::map<int32_t, const PendingRendezvous*> rendezvous_of_comm_;
  HangReport report_;
};

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

void Analyzer::FindCauses() {
  using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::directedS>;
  const size_t n = report_.vertices.size();
  Graph graph(n);
  for (const WaitEdge& e : report_.edges) boost::add_edge(e.from, e.to, graph);
  std::vector<int> component(n, 0);
  const int components = n == 0 ? 0 : boost::strong_components(graph, component.data());
  std::vector<std::vector<size_t>> members(static_cast<size_t>(components));
  for (size_t v = 0; v < n; ++v) members[static_cast<size_t>(component[v])].push_back(v);
  std::vector<bool> has_exit(static_cast<size_t>(components), false), self_loop(static_cast<size_t>(components), false);
  for (const WaitEdge& e : report_.edges) {
    const int from = component[e.from], to = component[e.to];
    if (from != to) has_exit[static_cast<size_t>(from)] = true;
    if (e.from == e.to) self_loop[static_cast<size_t>(from)] = true;
  }
  // Reverse edges, for "who waits for this".
  std::vector<std::vector<size_t>> in(n);
  for (const WaitEdge& e : report_.edges) in[e.to].push_back(e.from);
  // Components in order of their smallest vertex: deterministic output.
  std::vector<int> order;
  for (int c = 0; c < components; ++c) order.push_back(c);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return members[static_cast<size_t>(a)].front() < members[static_cast<size_t>(b)].front();
  });
  for (int c : order) {
    const auto& vs = members[static_cast<size_t>(c)];
    const bool cycle = vs.size() > 1 || self_loop[static_cast<size_t>(c)];
    if (cycle) report_.cycles.push_back(CycleOrder(vs));
    if (has_exit[static_cast<size_t>(c)]) continue;
    RootCause cause;
    cause.vertices = cycle ? CycleOrder(vs) : vs;
    const WaitVertex& v = report_.vertices[vs.front()];
    if (cycle) {
      cause.kind = RootCauseKind::kCycle;
    } else if (v.kind == WaitVertexKind::kHost) {
      auto b = blocked_.find(v.rank);
      cause.kind = b != blocked_.end() && b->second->host_state.reason == HostBlockReason::kOutOfMemory
                       ? RootCauseKind::kOutOfMemory
                       : RootCauseKind::kNeverIssued;
      cause.ranks = {v.rank};
    } else if (v.kind == WaitVertexKind::kRendezvous) {
      auto rv = rendezvous_of_comm_.find(v.communicator);
      cause.kind = rv != rendezvous_of_comm_.end() && rv->second->mismatch ? RootCauseKind::kMismatch
                                                                            : RootCauseKind::kOther;
      cause.communicator = v.communicator;
      cause.seq = v.seq;
    } else {
      cause.kind = RootCauseKind::kOther;
      cause.ranks = {v.rank};
    }
    // Every blocked rank with a vertex that reaches this component waits for it.
    std::set<size_t> seen(vs.begin(), vs.end());
    std::vector<size_t> stack(vs.begin(), vs.end());
    std::set<int32_t> waiting;
    while (!stack.empty()) {
      const size_t u = stack.back();
      stack.pop_back();
      const WaitVertex& w = report_.vertices[u];
      if (w.kind != WaitVertexKind::kRendezvous) waiting.insert(w.rank);
      for (size_t p : in[u]) {
        if (seen.insert(p).second) stack.push_back(p);
      }
    }
    for (int32_t r : cause.ranks) waiting.erase(r);
    cause.waiting_ranks.assign(waiting.begin(), waiting.end());
    cause.text = CauseText(cause);
    report_.causes.push_back(std::move(cause));
  }
  // One line for ranks that ran out of memory at the same op with nobody waiting on them
  // alone (e.g. every rank of a plan that does not fit): "ranks 0-7 stopped: ...".
  std::map<std::string, std::vector<int32_t>> same_oom;
  std::vector<std::string> order_of_lines;
  for (const RootCause& c : report_.causes) {
    const std::string prefix = fmt::format("rank {} ", c.ranks.empty() ? -1 : c.ranks.front());
    if (c.kind == RootCauseKind::kOutOfMemory && c.text.rfind(prefix, 0) == 0 &&
        c.text.find(';') == std::string::npos) {
      const std::string rest = c.text.substr(prefix.size());
      if (same_oom.find(rest) == same_oom.end()) order_of_lines.push_back("\x01" + rest);
      same_oom[rest].push_back(c.ranks.front());
    } else {
      order_of_lines.push_back(c.text);
    }
  }
  for (const std::string& line : order_of_lines) {
    if (line.empty() || line[0] != '\x01') {
      report_.explanation.push_back(line);
      continue;
    }
    const std::string rest = line.substr(1);
    report_.explanation.push_back(fmt::format("{} {}", RanksPhrase(same_oom[rest]), rest));
  }
}

std::string Analyzer::CauseText(RootCause& cause) {
  // The half-arrived send/recv whose posting stream waits directly for one of `targets`.
  auto p2p_into = [&](const std::set<size_t>& targets) {
    std::vector<const HalfArrivedP2p*> found;
    for (const HalfArrivedP2p& half : report_.p2p) {
      for (const WaitEdge& e : report_.edges) {
        const WaitVertex& v = report_.vertices[e.from];
        if (v.kind != WaitVertexKind::kStream || v.rank != half.rank || !targets.count(e.to)) continue;
        const BlockedStream* s = StreamState(v.rank, v.stream);
        if (s != nullptr && s->collective && IsP2p(s->collective->type) && s->collective->peer == half.peer &&
            s->collective->p2p_seq == half.p2p_seq && s->collective->communicator == half.communicator) {
          found.push_back(&half);
          break;
        }
      }
    }
    return found;
  };
  // The rendezvous (and sends / recvs) that wait directly for a set of vertices: "ranks A
  // wait in X for rank R"; `with_p2p` false leaves the sends / recvs out of the text.
  auto waiters_of = [&](const std::set<size_t>& targets, bool with_p2p = true) {
    std::vector<std::string> parts;
    std::set<int32_t> covered;
    for (const HalfArrivedP2p* half : p2p_into(targets)) {
      covered.insert(half->rank);
      if (!with_p2p) continue;
      PendingCollective p;
      p.communicator = half->communicator;
      p.type = half->type;
      p.peer = half->peer;
      p.p2p_seq = half->p2p_seq;
      parts.push_back(fmt::format("rank {} waits in {}", half->rank, PendingText(p)));
    }
    for (size_t v = 0; v < report_.vertices.size(); ++v) {
      const WaitVertex& rv = report_.vertices[v];
      if (rv.kind != WaitVertexKind::kRendezvous) continue;
      std::vector<int32_t> missing;
      for (const WaitEdge& e : report_.edges) {
        if (e.from == v && targets.count(e.to)) missing.push_back(report_.vertices[e.to].rank);
      }
      if (missing.empty()) continue;
      std::vector<int32_t> arrived;
      for (const auto& a : rendezvous_of_comm_.at(rv.communicator)->arrived) arrived.push_back(a.rank);
      covered.insert(arrived.begin(), arrived.end());
      parts.push_back(fmt::format("{} in {} for {}", RanksWait(arrived), rv.label, RanksPhrase(missing)));
    }
    std::vector<int32_t> rest;
    for (int32_t r : cause.waiting_ranks) {
      if (!covered.count(r)) rest.push_back(r);
    }
    if (!rest.empty()) parts.push_back(fmt::format("{} on them in turn", RanksWait(rest)));
    std::string text;
    for (const std::string& p : parts) text += "; " + p;
    return text;
  };
  switch (cause.kind) {
    case RootCauseKind::kOutOfMemory: {
      const int32_t rank = cause.ranks.front();
      const BlockedHost& h = blocked_.at(rank)->host_state;
      if (h.oom_caught) return CaughtOomLine(rank) + waiters_of({cause.vertices.front()});
      const auto& oom = result_.ranks[static_cast<size_t>(rank)].memory.oom;
      std::string text = fmt::format("rank {} stopped: {}out of memory at {}", rank,
                                     oom && oom->injected ? "injected " : "",
                                     h.op_index >= 0 ? OpText(rank, h.op_index) : "an allocation");
      if (oom) text += fmt::format(", {} requested, {} free", Bytes(oom->requested_bytes), Bytes(oom->free_bytes));
      std::set<size_t> targets;
      for (size_t v = 0; v < report_.vertices.size(); ++v) {
        const WaitVertex& w = report_.vertices[v];
        if (w.kind != WaitVertexKind::kRendezvous && w.rank == rank) targets.insert(v);
      }
      return text + waiters_of(targets);
    }
    case RootCauseKind::kNeverIssued: {
      const int32_t rank = cause.ranks.front();
      std::set<size_t> targets = {cause.vertices.front()};
      // Which collectives it never entered, with how many it issued on that communicator.
      std::vector<std::string> missed;
      for (const WaitEdge& e : report_.edges) {
        if (e.to != cause.vertices.front()) continue;
        const WaitVertex& from = report_.vertices[e.from];
        if (from.kind != WaitVertexKind::kRendezvous) continue;
        int64_t issued = 0;
        for (const traces::Op& op : ProgramOf(rank).ops) {
          const auto* coll = std::get_if<CollectiveOp>(&op.payload);
          if (coll && !IsP2p(coll->type) && schedule_.CommunicatorOf(rank, coll->comm) == from.communicator) ++issued;
        }
        missed.push_back(fmt::format("{} (its program issues {} collective(s) there)", from.label, issued));
      }
      auto b = blocked_.find(rank);
      const std::string state = b == blocked_.end() ? "finished its program"
                                : b->second->host_state.reason == HostBlockReason::kFinished
                                    ? "finished issuing"
                                    : "is stuck";
      const std::vector<const HalfArrivedP2p*> halves = p2p_into(targets);
      if (missed.empty() && !halves.empty()) {
        // Only sends / recvs wait for it: "rank 2 is in send to rank 3 ...; rank 3 never posted
        // the matching recv (...)".
        std::string text;
        for (size_t i = 0; i < halves.size(); ++i) text += (i ? "; " : "") + halves[i]->text;
        return text + waiters_of(targets, /*with_p2p=*/false);
      }
      std::string text = fmt::format("rank {} {} without entering ", rank, state);
      for (size_t i = 0; i < missed.size(); ++i) text += (i ? ", " : "") + missed[i];
      if (missed.empty()) text += "the collective its peers wait in";
      return text + waiters_of(targets);
    }
    case RootCauseKind::kMismatch: {
      const PendingRendezvous& rv = *rendezvous_of_comm_.at(cause.communicator);
      // Group the arrivals by what they entered; the smallest group is the odd one out.
      std::map<std::tuple<int, int64_t, int>, std::vector<int32_t>> groups;
      // An all_to_all's sizes may differ per rank (uneven splits; see engine.cc
      // ArriveCollective): they group as one (-1) and never make a size mismatch.
      for (const auto& a : rv.arrived) {
        const int64_t bytes = a.type == CollectiveType::kAllToAll ? -1 : a.bytes;
        groups[{static_cast<int>(a.type), bytes, static_cast<int>(a.dtype)}].push_back(a.rank);
      }
      std::vector<std::pair<std::tuple<int, int64_t, int>, std::vector<int32_t>>> sorted(groups.begin(), groups.end());
      std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
        return a.second.size() != b.second.size() ? a.second.size() < b.second.size() : a.second < b.second;
      });
      std::set<int> types, dtypes;
      std::set<int64_t> sizes;
      std::string text;
      for (size_t i = 0; i < sorted.size(); ++i) {
        const auto& [key, ranks] = sorted[i];
        for (int32_t r : ranks) cause.ranks.push_back(r);
        types.insert(std::get<0>(key));
        sizes.insert(std::get<1>(key));
        dtypes.insert(std::get<2>(key));
        const auto type = static_cast<CollectiveType>(std::get<0>(key));
        const auto dtype = static_cast<traces::DType>(std::get<2>(key));
        const std::string what = std::get<1>(key) >= 0 ? fmt::format("{} bytes, {}", std::get<1>(key), traces::DTypeName(dtype))
                                                        : std::string(traces::DTypeName(dtype));
        text += fmt::format("{}{} {} in {} ({})", i == 0 ? "" : i + 1 == sorted.size() ? " while " : ", ",
                            RanksPhrase(ranks), ranks.size() == 1 ? "is" : "are",
                            CollectiveName(schedule_, type, rv.communicator, rv.seq), what);
      }
      // A rank that caught an out-of-memory error entered its OOM-flag collective here while
      // its peers went on with the step: say so rather than only which types differ.
      for (const auto& a : rv.arrived) {
        if (OomCaught(a.rank) && blocked_.at(a.rank)->host_state.oom_sync_op_index == a.op_index) {
          text = CaughtOomLine(a.rank);
          break;
        }
      }
      // The Flight Recorder analyzer's names (torch/distributed/flight_recorder/components/types.py).
      text += types.size() > 1    ? ": collective type mismatch (COLLECTIVE_TYPE_MISMATCH)"
              : sizes.size() > 1  ? ": size mismatch (SIZE_OR_SYNTAX_MISMATCH)"
                                  : ": dtype mismatch (COLLECTIVE_DTYPE_MISMATCH)";
      std::set<int32_t> arrived;
      for (const auto& a : rv.arrived) arrived.insert(a.rank);
      std::vector<std::string> absent;
      for (int32_t m : schedule_.communicators[static_cast<size_t>(rv.communicator)].ranks) {
        if (!arrived.count(m)) absent.push_back(fmt::format("rank {} ({})", m, DoingText(m, rv.communicator)));
      }
      if (!absent.empty()) {
        text += "; not arrived: ";
        for (size_t i = 0; i < absent.size(); ++i) text += (i ? ", " : "") + absent[i];
      }
      std::sort(cause.ranks.begin(), cause.ranks.end());
      return text;
    }
    case RootCauseKind::kCycle: {
      std::vector<std::string> parts;
      std::set<int32_t> ranks;
      const auto& cycle = cause.vertices;
      bool p2p = false;
      int32_t caught = -1;
      for (size_t i = 0; i < cycle.size(); ++i) {
        const WaitVertex& v = report_.vertices[cycle[i]];
        const WaitVertex& next = report_.vertices[cycle[(i + 1) % cycle.size()]];
        std::string behind;
        if (next.kind == WaitVertexKind::kStream) {
          const std::string head = HeadCollective(next.rank, next.stream);
          behind = fmt::format(", whose stream '{}' is behind {}", StreamName(next.rank, next.stream),
                               head.empty() ? "other work" : head);
        }
        if (v.kind != WaitVertexKind::kRendezvous) {
          if (v.rank >= 0) ranks.insert(v.rank);
          if (v.kind == WaitVertexKind::kHost && OomCaught(v.rank) && caught < 0) caught = v.rank;
          // A send or recv waiting for its peer on another rank.
          const BlockedStream* s = v.kind == WaitVertexKind::kStream ? StreamState(v.rank, v.stream) : nullptr;
          if (s != nullptr && s->reason == StreamWaitReason::kRendezvous && s->collective &&
              IsP2p(s->collective->type) && next.rank != v.rank) {
            p2p = true;
            parts.push_back(fmt::format("rank {} waits in {} for rank {}{}", v.rank, PendingText(*s->collective),
                                        next.rank, behind));
          }
          continue;
        }
        std::vector<int32_t> arrived;
        for (const auto& a : rendezvous_of_comm_.at(v.communicator)->arrived) arrived.push_back(a.rank);
        parts.push_back(fmt::format("{} in {} for rank {}{}", RanksWait(arrived), v.label, next.rank, behind));
      }
      cause.ranks.assign(ranks.begin(), ranks.end());
      // A rank that caught an out-of-memory error waits in its OOM-flag collective while its
      // peers went on: that is what to read first.
      std::string text = caught >= 0 ? CaughtOomLine(caught) + "; deadlock cycle: " : "deadlock cycle: ";
      if (parts.empty()) {
        for (size_t i = 0; i < cycle.size(); ++i) text += (i ? " -> " : "") + report_.vertices[cycle[i]].label;
        return text;
      }
      for (size_t i = 0; i < parts.size(); ++i) text += (i ? "; " : "") + parts[i];
      if (p2p) {
        return text + " (a send or recv waits for its matching op; NCCL runs each communicator's work in order per "
                      "rank, so an op issued behind it never comes)";
      }
      return text + " (communicators entered in different orders by different ranks; NCCL serializes each "
                    "communicator's work per rank)";
    }
    case RootCauseKind::kOther: break;
  }
  std::string text = "blocked on " + report_.vertices[cause.vertices.front()].label;
  return text;
}

void Analyzer::Watchdog() {
  report_.watchdog_timeout_ns = options_.watchdog_timeout_ns;
  for (const BlockedRank& b : result_.blocked) {
    for (const auto& [op_index, pending] : b.pending) {
      const int64_t fires = pending.enqueued_ns + options_.watchdog_timeout_ns;
      if (report_.watchdog_fires_at_ns < 0 || fires < report_.watchdog_fires_at_ns) {
        report_.watchdog_fires_at_ns = fires;
        report_.watchdog_rank = b.rank;
        report_.watchdog_communicator = pending.communicator;
        report_.watchdog_seq = IsP2p(pending.type) ? pending.p2p_seq : pending.seq;
        report_.watchdog_collective = CollectiveName(schedule_, pending.type, pending.communicator, report_.watchdog_seq);
      }
    }
  }
}

HangReport Analyzer::Run() {
  for (const BlockedRank& b : result_.blocked) report_.blocked_ranks.push_back(b.rank);
  BuildGraph();
  FindCauses();
  Watchdog();
  return std::move(report_);
}

std::string_view VertexKindName(WaitVertexKind kind) {
  switch (kind) {
    case WaitVertexKind::kHost: return "host";
    case WaitVertexKind::kStream: return "stream";
    case WaitVertexKind::kEvent: return "event";
    case WaitVertexKind::kRendezvous: return "rendezvous";
  }
  return "";
}

std::string_view CauseKindName(RootCauseKind kind) {
  switch (kind) {
    case RootCauseKind::kOutOfMemory: return "out_of_memory";
    case RootCauseKind::kNeverIssued: return "never_issued";
    case RootCauseKind::kMismatch: return "mismatch";
    case RootCauseKind::kCycle: return "cycle";
    case RootCauseKind::kOther: return "other";
  }
  return "";
}


}  // namespace

HangReport AnalyzeHang(const traces::Schedule& schedule, const SimulationResult& result, const HangOptions& options) {
  if (!result.hung) {
    HangReport empty;
    empty.watchdog_timeout_ns = options.watchdog_timeout_ns;
    return empty;
  }
  return Analyzer(schedule, result, options).Run();
}

std::string HangReportJson(const traces::Schedule& schedule, const HangReport& report) {
  nlohmann::ordered_json j;
  j["blocked_ranks"] = CompressRanks(report.blocked_ranks);
  j["explanation"] = report.explanation;
  nlohmann::ordered_json causes = nlohmann::ordered_json::array();
  for (const RootCause& c : report.causes) {
    nlohmann::ordered_json cause = {{"kind", CauseKindName(c.kind)},
                                    {"ranks", c.ranks},
                                    {"communicator", c.communicator >= 0
                                                         ? nlohmann::ordered_json(schedule.communicators[static_cast<size_t>(c.communicator)].name)
                                                         : nlohmann::ordered_json(nullptr)},
                                    {"seq", c.seq},
                                    {"waiting_ranks", CompressRanks(c.waiting_ranks)},
                                    {"vertices", c.vertices},
                                    {"text", c.text}};
    causes.push_back(cause);
  }
  j["causes"] = causes;
  j["cycles"] = report.cycles;
  nlohmann::ordered_json p2p = nlohmann::ordered_json::array();
  for (const HalfArrivedP2p& half : report.p2p) {
    p2p.push_back({{"rank", half.rank},
                   {"op", traces::CollectiveTypeName(half.type)},
                   {"peer", half.peer},
                   {"communicator", schedule.communicators[static_cast<size_t>(half.communicator)].name},
                   {"p2p_seq_id", half.p2p_seq},
                   {"bytes", half.bytes},
                   {"arrived_ns", half.arrived_ns},
                   {"text", half.text}});
  }
  j["p2p"] = p2p;
  j["watchdog"] = {{"timeout_ms", report.watchdog_timeout_ns / 1'000'000},
                   {"fires_at_ns", report.watchdog_fires_at_ns},
                   {"rank", report.watchdog_rank},
                   {"communicator", report.watchdog_communicator >= 0
                                        ? nlohmann::ordered_json(schedule.communicators[static_cast<size_t>(report.watchdog_communicator)].name)
                                        : nlohmann::ordered_json(nullptr)},
                   {"collective_seq_id", report.watchdog_seq},
                   {"collective", report.watchdog_collective}};
  nlohmann::ordered_json vertices = nlohmann::ordered_json::array();
  for (const WaitVertex& v : report.vertices) vertices.push_back({{"kind", VertexKindName(v.kind)}, {"label", v.label}});
  nlohmann::ordered_json edges = nlohmann::ordered_json::array();
  for (const WaitEdge& e : report.edges) edges.push_back({e.from, e.to});
  j["wait_for_graph"] = {{"vertices", vertices}, {"edges", edges}};
  return j.dump();
}

void WriteHangTrace(const traces::Schedule& schedule, const SimulationResult& result, const HangReport& report,
                    const std::vector<int32_t>& traced_ranks, traces::TimelineSink& sink) {
  if (!result.hung) return;
  std::vector<bool> traced(static_cast<size_t>(schedule.world_size()), false);
  for (int32_t r : traced_ranks) {
    if (r >= 0 && r < schedule.world_size()) traced[static_cast<size_t>(r)] = true;
  }
  std::map<int32_t, const BlockedRank*> blocked;
  for (const BlockedRank& b : result.blocked) blocked[b.rank] = &b;
  // The host and stream vertices of traced ranks: their track, when they began waiting, what
  // they wait in.
  struct Track {
    int32_t pid = 0, tid = 0;
    int64_t since_ns = 0;
    int64_t op_id = -1;
    std::string what;
  };
  std::map<size_t, Track> tracks;
  int64_t latest = result.makespan_ns;
  for (size_t v = 0; v < report.vertices.size(); ++v) {
    const WaitVertex& vertex = report.vertices[v];
    if (vertex.kind != WaitVertexKind::kHost && vertex.kind != WaitVertexKind::kStream) continue;
    if (!traced[static_cast<size_t>(vertex.rank)]) continue;
    Track track;
    track.pid = vertex.rank;
    auto b = blocked.find(vertex.rank);
    if (vertex.kind == WaitVertexKind::kStream) {
      track.tid = 1 + vertex.stream;
      track.since_ns = result.makespan_ns;
      track.what = vertex.label;
      if (b != blocked.end()) {
        const BlockedRank& rank = *b->second;
        for (size_t i = 0; i < rank.stream_states.size(); ++i) {
          const BlockedStream& s = rank.stream_states[i];
          if (s.stream != vertex.stream) continue;
          if (s.since_ns >= 0) track.since_ns = s.since_ns;
          track.op_id = s.op_id;
          if (i < rank.streams.size()) track.what = rank.streams[i];
        }
      }
    } else if (b != blocked.end()) {
      const BlockedHost& h = b->second->host_state;
      track.since_ns = h.since_ns;
      track.op_id = h.op_id;
      track.what = h.reason == HostBlockReason::kFinished ? "host finished issuing" : "host " + b->second->host;
    } else {
      track.since_ns = result.ranks[static_cast<size_t>(vertex.rank)].end_ns;
      track.what = "host finished its program";
    }
    latest = std::max(latest, track.since_ns);
    tracks.emplace(v, std::move(track));
  }
  // Past the end of the run: the waits never end, and every flow end lies inside a slice.
  constexpr int64_t kMinTailNs = 1'000;
  const int64_t end_ns = latest + std::max(kMinTailNs, result.makespan_ns / 100);

  // Edges between tracks: follow rendezvous and event vertices to the tracks behind them.
  std::vector<std::vector<size_t>> out(report.vertices.size());
  for (const WaitEdge& e : report.edges) out[e.from].push_back(e.to);
  const auto concrete = [&](size_t v) {
    return report.vertices[v].kind == WaitVertexKind::kHost || report.vertices[v].kind == WaitVertexKind::kStream;
  };
  // A mismatched rendezvous waits for nothing in the graph (it is a root); on the trace each
  // member that entered it waits for the members that entered something else.
  std::map<std::pair<int32_t, int32_t>, size_t> stream_vertex;
  for (size_t v = 0; v < report.vertices.size(); ++v) {
    if (report.vertices[v].kind == WaitVertexKind::kStream) stream_vertex[{report.vertices[v].rank, report.vertices[v].stream}] = v;
  }
  const auto mismatched_with = [&](const WaitVertex& rendezvous, const WaitVertex& member) {
    std::vector<size_t> others;
    for (const PendingRendezvous& rv : result.rendezvous) {
      if (rv.communicator != rendezvous.communicator || rv.seq != rendezvous.seq || !rv.mismatch) continue;
      const auto key = [](const PendingRendezvous::Arrival& a) {
        return std::make_tuple(a.type, a.type == CollectiveType::kAllToAll ? -1 : a.bytes, a.dtype);
      };
      auto mine = std::find_if(rv.arrived.begin(), rv.arrived.end(), [&](const PendingRendezvous::Arrival& a) {
        return a.rank == member.rank && a.stream == member.stream;
      });
      if (mine == rv.arrived.end()) break;
      for (const PendingRendezvous::Arrival& a : rv.arrived) {
        if (key(a) == key(*mine)) continue;
        if (auto it = stream_vertex.find({a.rank, a.stream}); it != stream_vertex.end()) others.push_back(it->second);
      }
    }
    return others;
  };
  std::map<size_t, std::vector<size_t>> waits_for;
  for (const auto& [v, track] : tracks) {
    std::vector<size_t>& targets = waits_for[v];
    std::set<size_t> seen = {v};
    std::vector<size_t> stack(out[v].rbegin(), out[v].rend());
    while (!stack.empty()) {
      const size_t u = stack.back();
      stack.pop_back();
      if (!seen.insert(u).second) continue;
      if (concrete(u)) {
        targets.push_back(u);
        continue;
      }
      if (out[u].empty() && report.vertices[u].kind == WaitVertexKind::kRendezvous &&
          report.vertices[v].kind == WaitVertexKind::kStream) {
        const std::vector<size_t> others = mismatched_with(report.vertices[u], report.vertices[v]);
        stack.insert(stack.end(), others.rbegin(), others.rend());
      }
      for (auto it = out[u].rbegin(); it != out[u].rend(); ++it) stack.push_back(*it);
    }
  }

  for (const auto& [v, track] : tracks) {
    traces::Slice slice;
    slice.pid = track.pid;
    slice.tid = track.tid;
    slice.ts_ns = track.since_ns;
    slice.dur_ns = end_ns - track.since_ns;
    slice.name = "hang: " + track.what;
    slice.category = traces::Category::kOther;
    slice.raw_category = "hang";
    slice.op_id = track.op_id;
    std::string targets;
    for (size_t t : waits_for[v]) targets += (targets.empty() ? "" : ", ") + report.vertices[t].label;
    if (!targets.empty()) slice.args.push_back({"waits for", targets});
    sink.OnSlice(slice);
  }
  // Ids apart from the launch -> kernel flows ((rank << 32) | correlation).
  constexpr int64_t kHangFlowIdBase = int64_t{1} << 62;
  int64_t next_id = kHangFlowIdBase;
  for (const auto& [v, track] : tracks) {
    for (size_t t : waits_for[v]) {
      auto target = tracks.find(t);
      if (target == tracks.end()) continue;  // an untraced rank
      traces::Flow flow;
      flow.id = next_id++;
      flow.name = "waits for";
      flow.category = "hang";
      flow.from_pid = track.pid;
      flow.from_tid = track.tid;
      flow.from_ts_ns = track.since_ns + 1;
      flow.to_pid = target->second.pid;
      flow.to_tid = target->second.tid;
      flow.to_ts_ns = std::max(target->second.since_ns + 1, flow.from_ts_ns);
      sink.OnFlow(flow);
    }
  }
}

std::vector<int32_t> FlightRecorderRanks(const SimulationResult& result, size_t limit) {
  std::vector<int32_t> ranks;
  for (const BlockedRank& b : result.blocked) {
    if (ranks.size() >= limit) break;
    ranks.push_back(b.rank);
  }
  return ranks;
}

CollectiveRecorder::CollectiveRecorder(const traces::Schedule& schedule, std::vector<int32_t> ranks)
    : schedule_(schedule), wanted_(static_cast<size_t>(schedule.world_size()), false) {
  for (int32_t r : ranks) {
    if (r >= 0 && r < schedule.world_size()) wanted_[static_cast<size_t>(r)] = true;
  }
}

bool CollectiveRecorder::WantsRank(int32_t rank) const { return wanted_[static_cast<size_t>(rank)]; }

void CollectiveRecorder::OnHostSpan(const HostSpan& span) {
  if (span.kind != HostSpanKind::kLaunch) return;
  const traces::Op& op = schedule_.ProgramOf(span.rank).ops[static_cast<size_t>(span.op_index)];
  if (!std::holds_alternative<CollectiveOp>(op.payload)) return;
  times_[span.rank][span.op_index].created_ns = span.start_ns;
}

void CollectiveRecorder::OnDeviceSpan(const DeviceSpan& span) {
  if (span.collective == nullptr) return;
  Times& t = times_[span.rank][span.op_index];
  t.started_ns = span.start_ns;
  t.completed_ns = span.end_ns;
}

const std::map<int32_t, CollectiveRecorder::Times>& CollectiveRecorder::TimesOf(int32_t rank) const {
  static const std::map<int32_t, Times> kNone;
  auto it = times_.find(rank);
  return it == times_.end() ? kNone : it->second;
}

std::string FlightRecorderJson(const traces::Schedule& schedule, const SimulationResult& result, int32_t rank,
                               const CollectiveRecorder* recorder, const HangOptions& options) {
  const traces::Program& program = schedule.ProgramOf(rank);
  const BlockedRank* blocked = nullptr;
  for (const BlockedRank& b : result.blocked) {
    if (b.rank == rank) blocked = &b;
  }
  std::map<int32_t, const PendingCollective*> pending;
  if (blocked) {
    for (const auto& [index, p] : blocked->pending) pending[index] = &p;
  }
  // Ops the host issued: all of them, unless it is blocked at (or stopped before) an op. A rank
  // that caught an out-of-memory error skipped the ops after it up to its OOM-flag collective,
  // which it issued.
  int32_t issued_end = static_cast<int32_t>(program.ops.size());
  int32_t skipped_begin = -1, skipped_end = -1;  // [begin, end): not issued
  if (blocked && blocked->host_state.reason != HostBlockReason::kFinished && blocked->host_state.op_index >= 0) {
    issued_end = blocked->host_state.op_index;
    if (blocked->host_state.oom_caught && blocked->host_state.oom_sync_op_index >= 0) {
      skipped_begin = blocked->host_state.op_index;
      skipped_end = blocked->host_state.oom_sync_op_index;
      issued_end = blocked->host_state.oom_sync_op_index + 1;
    }
  }
  const double timeout_ms = static_cast<double>(options.watchdog_timeout_ns) / 1e6;
  struct PgCount {
    int64_t coll = 0, p2p = 0, ops = 0, started = 0, completed = 0;
  };
  std::map<int32_t, PgCount> counts;
  nlohmann::ordered_json entries = nlohmann::ordered_json::array();
  int64_t record_id = 0;
  for (int32_t index = 0; index < issued_end; ++index) {
    if (index >= skipped_begin && index < skipped_end) continue;
    const traces::Op& op = program.ops[static_cast<size_t>(index)];
    const auto* coll = std::get_if<CollectiveOp>(&op.payload);
    if (coll == nullptr) continue;
    const int32_t comm = schedule.CommunicatorOf(rank, coll->comm);
    const traces::Communicator& communicator = schedule.communicators[static_cast<size_t>(comm)];
    PgCount& count = counts[comm];
    const bool p2p = IsP2p(coll->type);
    (p2p ? count.p2p : count.coll)++;
    ++count.ops;
    // Element counts from CollectiveOp::bytes (nccl-tests' size: the gathered output of an
    // all_gather, the input of a reduce_scatter, the buffer otherwise).
    const traces::CollectiveCounts sizes = traces::CountsOf(*coll, static_cast<int32_t>(communicator.ranks.size()));
    const int64_t in = sizes.in_elements, out = sizes.out_elements;
    auto found = pending.find(index);
    const bool done = found == pending.end();
    CollectiveRecorder::Times times;
    if (recorder) {
      const auto& all = recorder->TimesOf(rank);
      if (auto t = all.find(index); t != all.end()) times = t->second;
    }
    std::string state = "completed";
    nlohmann::ordered_json started = nullptr, completed = nullptr, duration = nullptr;
    int64_t created = times.created_ns;
    if (done) {
      ++count.started;
      ++count.completed;
      if (times.started_ns >= 0) started = times.started_ns;
      if (times.completed_ns >= 0) {
        completed = times.completed_ns;
        duration = static_cast<double>(times.completed_ns - times.started_ns) / 1e6;
      }
    } else {
      const PendingCollective& p = *found->second;
      created = p.enqueued_ns;
      if (p.arrived_ns >= 0) {
        // NCCL's kernel runs once its stream reaches it, spinning for the peers: "started".
        state = "started";
        started = p.arrived_ns;
        ++count.started;
      } else {
        state = "scheduled";
      }
    }
    const std::string dtype(traces::TorchScalarTypeName(coll->dtype));
    nlohmann::ordered_json entry;
    entry["record_id"] = record_id++;
    entry["pg_id"] = comm;
    entry["process_group"] = {std::to_string(comm), communicator.name};
    entry["collective_seq_id"] = count.coll;
    entry["p2p_seq_id"] = count.p2p;
    entry["op_id"] = count.ops;
    // ProcessGroupNCCL::send / recv name p2p work "nccl:send 2->3" / "nccl:recv 3<-2" with
    // ranks in the process group.
    std::string profiling_name = fmt::format("nccl:{}", traces::CollectiveTypeName(coll->type));
    if (p2p) {
      const auto group_rank = [&](int32_t global) {
        auto it = std::find(communicator.ranks.begin(), communicator.ranks.end(), global);
        return it == communicator.ranks.end() ? global : static_cast<int32_t>(it - communicator.ranks.begin());
      };
      profiling_name += fmt::format(" {}{}{}", group_rank(rank), coll->type == CollectiveType::kSend ? "->" : "<-",
                                    group_rank(coll->peer));
    }
    entry["profiling_name"] = profiling_name;
    entry["time_created_ns"] = created >= 0 ? nlohmann::ordered_json(created) : nlohmann::ordered_json(nullptr);
    entry["input_sizes"] = {{in}};
    entry["input_dtypes"] = {dtype};
    entry["output_sizes"] = {{out}};
    entry["output_dtypes"] = {dtype};
    entry["state"] = state;
    entry["time_discovered_started_ns"] = started;
    entry["time_discovered_completed_ns"] = completed;
    entry["duration_ms"] = duration;
    entry["retired"] = done;
    entry["timeout_ms"] = static_cast<int64_t>(timeout_ms);
    entry["is_p2p"] = p2p;
    entry["frames"] = nlohmann::ordered_json::array();
    entries.push_back(entry);
  }
  // The ring buffer keeps the last N entries.
  const auto keep = static_cast<size_t>(std::max(0, options.flight_recorder_entries));
  if (entries.size() > keep) entries.erase(entries.begin(), entries.end() - static_cast<std::ptrdiff_t>(keep));
  nlohmann::ordered_json pg_config = nlohmann::ordered_json::object(), pg_status = nlohmann::ordered_json::object();
  const auto& binding = schedule.ranks[static_cast<size_t>(rank)].comm_binding;
  std::set<int32_t> comms(binding.begin(), binding.end());
  for (int32_t comm : comms) {
    const traces::Communicator& communicator = schedule.communicators[static_cast<size_t>(comm)];
    std::string ranks = "[";
    for (size_t i = 0; i < communicator.ranks.size(); ++i) ranks += (i ? ", " : "") + std::to_string(communicator.ranks[i]);
    ranks += "]";
    pg_config[std::to_string(comm)] = {{"name", std::to_string(comm)}, {"desc", communicator.name}, {"ranks", ranks}};
    const PgCount c = counts.count(comm) ? counts.at(comm) : PgCount{};
    pg_status[std::to_string(comm)] = {{"last_enqueued_collective", c.ops},
                                       {"last_started_collective", c.started},
                                       {"last_completed_collective", c.completed}};
  }
  nlohmann::ordered_json j;
  // FlightRecorder.hpp: version_val "2.10" at the time of writing.
  j["version"] = "2.10";
  j["pg_config"] = pg_config;
  j["pg_status"] = pg_status;
  j["entries"] = entries;
  return j.dump(2) + "\n";
}

}  // namespace shardscope::sim

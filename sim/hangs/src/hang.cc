// Hang analysis (see hang.h): the root causes of a hung simulation, their explanation and
// the time the NCCL watchdog fires. The wait-for graph they are found in is built by
// hang_graph.cc (its comment lists the edges); the report's JSON and trace are written by
// hang_render.cc, the Flight Recorder dumps by hang_flight_recorder.cc.
//
// The minimal blocking set is the set of sink components of the graph's condensation: every
// blocked vertex reaches one, and unblocking them would let the rest move.
#include "shardscope/sim/hangs/hang.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/strong_components.hpp>
#include <fmt/format.h>

#include "hang_internal.h"

namespace shardscope::sim {
namespace hang_internal {

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

}  // namespace hang_internal

HangReport AnalyzeHang(const traces::Schedule& schedule, const SimulationResult& result, const HangOptions& options) {
  if (!result.hung) {
    HangReport empty;
    empty.watchdog_timeout_ns = options.watchdog_timeout_ns;
    return empty;
  }
  return hang_internal::Analyzer(schedule, result, options).Run();
}

}  // namespace shardscope::sim

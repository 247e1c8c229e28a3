// A hang report written out: as JSON (`simulate --hang-report`) and as slices and flows on
// the Chrome trace, one slice per blocked host or stream saying what it waits for.
#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "hang_internal.h"

namespace shardscope::sim {
namespace {

using traces::CollectiveType;

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

}  // namespace shardscope::sim

// Private to sim/hangs: the hang analyzer every file of the analysis shares (hang.cc: root
// causes, their text and the watchdog; hang_graph.cc: the wait-for graph and its cycles) and
// the phrases the analysis, the report and the Flight Recorder dump word alike.
#ifndef SHARDSCOPE_SIM_HANGS_HANG_INTERNAL_H_
#define SHARDSCOPE_SIM_HANGS_HANG_INTERNAL_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "shardscope/sim/hangs/hang.h"

namespace shardscope::sim::hang_internal {

using traces::CollectiveOp;
using traces::CollectiveType;

inline bool IsP2p(CollectiveType type) { return type == CollectiveType::kSend || type == CollectiveType::kRecv; }

// "rank 3" / "ranks 0-2".
std::string RanksPhrase(const std::vector<int32_t>& ranks);
// "rank 3 waits" / "ranks 0-2 wait".
std::string RanksWait(const std::vector<int32_t>& ranks);
// "all_gather #17 on 'dp'".
std::string CollectiveName(const traces::Schedule& schedule, CollectiveType type, int32_t comm, int64_t seq);
// "1.50 GiB" / "512.00 MiB".
std::string Bytes(int64_t bytes);

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

}  // namespace shardscope::sim::hang_internal

#endif  // SHARDSCOPE_SIM_HANGS_HANG_INTERNAL_H_

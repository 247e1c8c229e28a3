// The critical path of one side: a longest path (Boost.Graph dag_shortest_paths on negated
// weights) over a DAG whose nodes are the start and end of every event.
//
// The graph follows HTA's lightweight critical path analysis
// (docs/source/features/lightweight_critical_path_analysis.rst,
// hta/analyzers/critical_path_analysis.py): timing edges carry time, dependency edges do
// not. Dependencies of a node:
// - start of a host slice: the end of the previous slice at the same nesting level of its
//   thread, else the start of its parent (HTA: "CPU operators are dependent serially on the
//   last operator that ran on the respective CPU thread"; nested operators hang off their
//   parent);
// - start of a device slice: the end of the previous slice on its stream (streams are FIFO)
//   and the end of its launch (the host slice with the same correlation id);
// - end of any slice: its own start (the duration); for a host parent, the end of its last
//   child; for a collective, the start of the latest-starting member with the same
//   (process group, seq) on another rank (a collective cannot finish before every member
//   has joined: the rendezvous); for a host synchronize call, the latest device end on its
//   rank before the call returned (HTA's synchronization edges).
// Event waits between streams are not visible in our traces (the event is not named), so
// they are not edges: the time a stream waited shows as the waiting kernel's "device wait".
//
// Weights: the dependency that released the node last (the binding one) carries the real
// time between the two points; the others carry -1 ns, so that among explanations of equal
// length the binding chain wins deterministically (HTA gives them 0). Every path is then
// at most (node time - origin) long and the binding chain reaches that bound, so the
// longest path ends at the latest event end, has length (latest end - earliest start), and
// is the chain of binding dependencies: the edges on it add up exactly to the span.
#include <algorithm>
#include <limits>
#include <map>

#include <boost/graph/compressed_sparse_row_graph.hpp>
#include <boost/graph/dag_shortest_paths.hpp>
#include <boost/graph/exception.hpp>
#include <fmt/format.h>

#include "diff_internal.h"

namespace shardscope::traces::diff_internal {
namespace {

struct EdgeWeight {
  int64_t weight = 0;  // negated (shortest path on -w is the longest path on w)
};
using Graph = boost::compressed_sparse_row_graph<boost::directedS, boost::no_property, EdgeWeight, boost::no_property,
                                                 uint32_t, uint32_t>;

constexpr int64_t kNonBindingWeight = -1;

struct Candidate {
  uint32_t node;
  int64_t time;
  int32_t priority;  // lower wins a tie in time
};

class GraphBuilder {
 public:
  explicit GraphBuilder(uint32_t source) : source_(source) {}

  // Adds the edges into `node` (at time `time`) from its candidates; none valid: from the
  // source, weighted by the time since the origin.
  void AddNode(uint32_t node, int64_t time, int64_t origin, const std::vector<Candidate>& candidates) {
    const Candidate* binding = nullptr;
    for (const Candidate& c : candidates) {
      if (c.time > time) continue;  // not causal (clock skew, overlap): no edge
      if (binding == nullptr || c.time > binding->time ||
          (c.time == binding->time && (c.priority < binding->priority ||
                                       (c.priority == binding->priority && c.node < binding->node)))) {
        binding = &c;
      }
    }
    if (binding == nullptr) {
      Add(source_, node, time - origin);
      return;
    }
    for (const Candidate& c : candidates) {
      if (c.time > time) continue;
      Add(c.node, node, &c == binding ? time - c.time : kNonBindingWeight);
    }
  }

  std::vector<std::pair<uint32_t, uint32_t>> edges;
  std::vector<EdgeWeight> weights;

 private:
  void Add(uint32_t from, uint32_t to, int64_t weight) {
    edges.emplace_back(from, to);
    weights.push_back({-weight});
  }
  uint32_t source_;
};

uint32_t StartNode(size_t event) { return static_cast<uint32_t>(2 * event); }
uint32_t EndNode(size_t event) { return static_cast<uint32_t>(2 * event + 1); }

}  // namespace

StatusOr<CriticalPath> ComputeCriticalPath(const SideAnalysis& analysis, std::vector<int64_t>& on_path_ns) {
  const std::vector<DiffEvent>& events = analysis.events;
  on_path_ns.assign(events.size(), 0);
  CriticalPath path;
  if (events.empty()) return path;
  const size_t n = events.size();
  if (n >= (std::numeric_limits<uint32_t>::max() - 1) / 2) {
    return Status::InvalidInput(fmt::format("{} events are too many for the critical path graph", n));
  }
  int64_t origin = INT64_MAX;
  for (const DiffEvent& e : events) origin = std::min(origin, e.ts_ns);
  path.start_ns = origin;
  const auto source = static_cast<uint32_t>(2 * n);

  // Per rank: launches by correlation, device ends in time order.
  std::vector<std::pair<std::pair<int32_t, int64_t>, uint32_t>> launches;  // ((rank, corr), event)
  std::vector<std::pair<std::pair<int32_t, int64_t>, uint32_t>> device_ends;  // ((rank, end), event)
  // Collective members: ((pg, seq), (ts, event)).
  std::vector<std::pair<std::pair<int32_t, int64_t>, std::pair<int64_t, uint32_t>>> members;
  std::vector<int32_t> last_child(n, -1);
  for (size_t i = 0; i < n; ++i) {
    const DiffEvent& e = events[i];
    if (!e.device && e.correlation >= 0) launches.push_back({{e.rank, e.correlation}, static_cast<uint32_t>(i)});
    if (e.device) device_ends.push_back({{e.rank, e.end_ns()}, static_cast<uint32_t>(i)});
    if (e.device && e.process_group >= 0 && e.seq >= 0) {
      members.push_back({{e.process_group, e.seq}, {e.ts_ns, static_cast<uint32_t>(i)}});
    }
    if (e.parent >= 0) last_child[static_cast<size_t>(e.parent)] = static_cast<int32_t>(i);
  }
  std::sort(launches.begin(), launches.end());
  std::sort(device_ends.begin(), device_ends.end());
  std::sort(members.begin(), members.end());
  // For each collective event: the latest-starting other member (event index), or -1.
  std::vector<int32_t> latest_peer(n, -1);
  for (size_t i = 0; i < members.size();) {
    size_t j = i;
    while (j < members.size() && members[j].first == members[i].first) ++j;
    // The two latest starts of the group: each member's latest peer is the latest other.
    size_t first = i;  // latest
    size_t second = j; // second latest
    for (size_t k = i + 1; k < j; ++k) {
      if (members[k].second > members[first].second) {
        second = first;
        first = k;
      } else if (second == j || members[k].second > members[second].second) {
        second = k;
      }
    }
    for (size_t k = i; k < j; ++k) {
      const size_t peer = k == first ? second : first;
      if (peer != j && peer != k) latest_peer[members[k].second.second] = static_cast<int32_t>(members[peer].second.second);
    }
    i = j;
  }

  GraphBuilder builder(source);
  builder.edges.reserve(3 * n);
  builder.weights.reserve(3 * n);
  std::vector<Candidate> candidates;
  std::map<int32_t, int32_t> last_at_level;  // parent (-1: top level) -> last slice under it
  int32_t current_track = -1;
  int32_t previous_on_stream = -1;
  for (size_t i = 0; i < n; ++i) {
    const DiffEvent& e = events[i];
    if (e.track != current_track) {
      current_track = e.track;
      last_at_level.clear();
      previous_on_stream = -1;
    }
    // Start.
    candidates.clear();
    if (e.device) {
      if (previous_on_stream >= 0) {
        const DiffEvent& p = events[static_cast<size_t>(previous_on_stream)];
        candidates.push_back({EndNode(static_cast<size_t>(previous_on_stream)), p.end_ns(), 0});
      }
      previous_on_stream = static_cast<int32_t>(i);
      if (e.correlation >= 0) {
        auto it = std::lower_bound(launches.begin(), launches.end(), std::make_pair(std::make_pair(e.rank, e.correlation), 0u));
        if (it != launches.end() && it->first == std::make_pair(e.rank, e.correlation)) {
          candidates.push_back({EndNode(it->second), events[it->second].end_ns(), 1});
        }
      }
    } else {
      auto sibling = last_at_level.find(e.parent);
      if (sibling != last_at_level.end()) {
        const auto s = static_cast<size_t>(sibling->second);
        candidates.push_back({EndNode(s), events[s].end_ns(), 0});
      } else if (e.parent >= 0) {
        candidates.push_back({StartNode(static_cast<size_t>(e.parent)), events[static_cast<size_t>(e.parent)].ts_ns, 0});
      }
      last_at_level[e.parent] = static_cast<int32_t>(i);
    }
    builder.AddNode(StartNode(i), e.ts_ns, origin, candidates);
    // End.
    candidates.clear();
    candidates.push_back({StartNode(i), e.ts_ns, 0});
    if (last_child[i] >= 0) {
      const auto c = static_cast<size_t>(last_child[i]);
      candidates.push_back({EndNode(c), events[c].end_ns(), 1});
    }
    if (latest_peer[i] >= 0) {
      const auto p = static_cast<size_t>(latest_peer[i]);
      candidates.push_back({StartNode(p), events[p].ts_ns, 2});
    }
    if (!e.device && e.synchronizes) {
      // The latest device end on this rank at or before the call's end.
      auto it = std::upper_bound(device_ends.begin(), device_ends.end(),
                                 std::make_pair(std::make_pair(e.rank, e.end_ns()), std::numeric_limits<uint32_t>::max()));
      if (it != device_ends.begin()) {
        --it;
        if (it->first.first == e.rank) candidates.push_back({EndNode(it->second), it->first.second, 3});
      }
    }
    builder.AddNode(EndNode(i), e.end_ns(), origin, candidates);
  }

  const auto vertices = static_cast<uint32_t>(2 * n + 1);
  Graph graph(boost::edges_are_unsorted_multi_pass, builder.edges.begin(), builder.edges.end(), builder.weights.begin(),
              vertices);
  builder.edges = {};
  builder.weights = {};
  std::vector<int64_t> distance(vertices, std::numeric_limits<int64_t>::max());
  std::vector<uint32_t> predecessor(vertices);
  for (uint32_t v = 0; v < vertices; ++v) predecessor[v] = v;
  try {
    boost::dag_shortest_paths(
        graph, source,
        boost::weight_map(boost::get(&EdgeWeight::weight, graph))
            .distance_map(boost::make_iterator_property_map(distance.begin(), boost::get(boost::vertex_index, graph)))
            .predecessor_map(boost::make_iterator_property_map(predecessor.begin(), boost::get(boost::vertex_index, graph))));
  } catch (const boost::not_a_dag&) {
    return Status::InvalidInput(
        "the dependencies form a cycle (collectives of one process group in different orders on different ranks?)");
  }
  // The longest path ends at the end node with the largest length (ties: lowest index).
  uint32_t end = EndNode(0);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t v = EndNode(i);
    if (distance[v] != std::numeric_limits<int64_t>::max() && -distance[v] > -distance[end]) end = v;
  }
  path.length_ns = -distance[end];
  std::vector<uint32_t> nodes;
  for (uint32_t v = end; v != source && predecessor[v] != v; v = predecessor[v]) nodes.push_back(v);
  std::reverse(nodes.begin(), nodes.end());
  int64_t reached = 0;  // path length up to the previous node
  for (uint32_t v : nodes) {
    const int64_t here = -distance[v];
    const int64_t weight = here - reached;
    reached = here;
    const size_t event = v / 2;
    on_path_ns[event] += weight;
    if (path.steps.empty() || path.steps.back().event != static_cast<int32_t>(event)) {
      path.steps.push_back({static_cast<int32_t>(event), 0, 0});
    }
    if (v % 2 == 0) {
      path.steps.back().wait_ns += weight;
    } else {
      path.steps.back().dur_ns += weight;
    }
  }
  return path;
}

}  // namespace shardscope::traces::diff_internal

// The shared links of a schedule on its cluster (cluster_links.h).
#include "shardscope/sim/simulate/cluster_links.h"

#include <fmt/format.h>

#include <cstdint>
#include <map>
#include <utility>

#include "shardscope/sim/models/link_traffic.h"

namespace shardscope::sim {

ClusterLinks ClusterLinksFor(const traces::Schedule& schedule, const ClusterSpec& cluster,
                             const NcclModelConfig& nccl) {
  ClusterLinks out;
  if (!cluster.link_sharing) return out;
  const int32_t world = schedule.world_size();
  std::vector<CommTopology> topologies;
  topologies.reserve(schedule.communicators.size());
  // Per GPU, the communicators crossing its NVLink and its NIC, in communicator order.
  std::vector<std::vector<int32_t>> nvlink(static_cast<size_t>(world)), nic(static_cast<size_t>(world));
  for (size_t c = 0; c < schedule.communicators.size(); ++c) {
    const traces::Communicator& comm = schedule.communicators[c];
    topologies.push_back(TopologyOf(cluster, comm.ranks));
    const CommTopology& t = topologies.back();
    if (t.nranks <= 1) continue;  // a local copy
    const bool inside_nodes = t.nranks > t.nnodes;  // some node holds two members
    const bool across_nodes = t.nnodes > 1;
    for (int32_t rank : comm.ranks) {
      if (rank < 0 || rank >= world) continue;  // ValidateSchedule refuses these
      if (inside_nodes) nvlink[static_cast<size_t>(rank)].push_back(static_cast<int32_t>(c));
      if (across_nodes) nic[static_cast<size_t>(rank)].push_back(static_cast<int32_t>(c));
    }
  }
  // One link per distinct (kind, communicators): the capacity is the same for every GPU of the
  // cluster, so equal keys are the same constraint. The map only finds duplicates; links keep
  // the order of their first GPU.
  std::map<std::pair<LinkKind, std::vector<int32_t>>, size_t> seen;
  std::vector<int32_t> duplicates;
  const auto add = [&](LinkKind kind, int32_t rank, std::vector<int32_t>& comms) {
    if (comms.size() < 2) return;  // one communicator is serialized by NCCL: nothing to share
    const double capacity = LinkCapacity(cluster, kind, nccl);
    if (!(capacity > 0)) return;    // the cost model has no such path either
    auto [it, inserted] = seen.try_emplace({kind, comms}, out.links.size());
    if (!inserted) {
      ++duplicates[it->second];
      return;
    }
    LinkSpec link;
    link.name = fmt::format("rank {} {}", rank, kind == LinkKind::kNic ? "NIC" : "NVLink");
    link.kind = kind;
    link.bandwidth_bytes_per_s = capacity;
    link.communicators = std::move(comms);
    out.links.push_back(std::move(link));
    duplicates.push_back(0);
  };
  for (int32_t rank = 0; rank < world; ++rank) {
    add(LinkKind::kNvlink, rank, nvlink[static_cast<size_t>(rank)]);
    add(LinkKind::kNic, rank, nic[static_cast<size_t>(rank)]);
  }
  for (size_t l = 0; l < out.links.size(); ++l) {
    if (duplicates[l] > 0) out.links[l].name += fmt::format(" (and {} more like it)", duplicates[l]);
  }
  if (!out.links.empty()) out.topologies = std::move(topologies);
  return out;
}

}  // namespace shardscope::sim

// The links of a cluster that a schedule's communicators share (sim/models/link_model.h): each
// GPU's NVLink ports and its NIC share (link_traffic.h says what crosses which). A communicator
// crosses a member GPU's NVLink when some node holds two or more of its members (its ring,
// tree or all-to-all then moves data inside nodes), and the member's NIC when it spans nodes.
// Nodes are rail-optimized (DGX-style): a GPU reaches the network through its own NIC share.
//
// NCCL serializes the collectives of one communicator (the engine does too), so a link crossed
// by a single communicator never shares anything: only links that two or more communicators
// cross are built, and links that are the same constraint (same kind, capacity and
// communicators, e.g. the NVLinks of one node crossed by the same groups) are built once. A
// schedule whose communicators never meet gets no link at all, and the engine no link solving.
#ifndef SHARDSCOPE_SIM_SIMULATE_CLUSTER_LINKS_H_
#define SHARDSCOPE_SIM_SIMULATE_CLUSTER_LINKS_H_

#include <vector>

#include "shardscope/sim/models/link_model.h"
#include "shardscope/sim/models/nccl_model.h"
#include "shardscope/sim/presets/hardware.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::sim {

struct ClusterLinks {
  std::vector<LinkSpec> links;             // in GPU order, NVLink before NIC
  std::vector<CommTopology> topologies;    // per communicator (empty when there is no link)
};

// The shared links of `schedule`'s communicators on `cluster`, with capacities as NCCL's model
// uses them (`nccl`: the usable NVLink fraction). Empty when cluster.link_sharing is false.
ClusterLinks ClusterLinksFor(const traces::Schedule& schedule, const ClusterSpec& cluster,
                             const NcclModelConfig& nccl);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_SIMULATE_CLUSTER_LINKS_H_

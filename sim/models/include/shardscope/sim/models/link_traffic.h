// What one collective puts on the links of a member GPU: the bytes it sends through the GPU's
// NVLink ports (or its PCIe link, on a node without NVLink) and through the GPU's NIC, by the
// algorithm NCCL runs, and what those links can carry as NCCL's cost model sees them. The link
// model (link_model.h) divides the traffic by the collective's full-speed duration to get what
// it demands of each link per ns when alone.
//
// Conventions:
//  - `bytes` is nccl-tests' size S of the collective (traces::CollectiveOp): the whole buffer of
//    all_gather / reduce_scatter, the buffer of all_reduce, what one rank sends in all_to_all,
//    the message of send / recv.
//  - One direction: NVLink, PCIe and the network are full duplex and a collective loads both
//    directions alike (each member sends what it receives), so a link is one direction of the
//    GPU's port and the traffic is what the GPU sends through it.
//  - Per member, averaged over the members as NCCL's model averages them: the shape is
//    CommTopology's (n ranks on N nodes, n/N per node). NcclModel::Estimate prices the collective
//    on the same averages, so a collective alone never demands more than a link's capacity.
//  - A NIC link is the GPU's share of the node's network (ClusterSpec::inter_node_bandwidth is
//    per GPU): where several GPUs share one NIC (aws-p4d: 2 per NIC), the NCCL model already
//    gives each its share, and so do the links.
#ifndef SHARDSCOPE_SIM_MODELS_LINK_TRAFFIC_H_
#define SHARDSCOPE_SIM_MODELS_LINK_TRAFFIC_H_

#include <cstdint>
#include <string_view>

#include "shardscope/sim/models/nccl_model.h"
#include "shardscope/sim/presets/hardware.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::sim {

// What a link is, which decides which part of a collective's traffic crosses it.
enum class LinkKind : uint8_t {
  kCollectiveBytes,  // a hand-made link every byte S of the collective crosses (tests, what-ifs)
  kNvlink,           // one GPU's NVLink ports (its PCIe link on a PCIe-only node): intra-node traffic
  kNic,              // one GPU's share of its node's NICs: inter-node traffic
};
std::string_view LinkKindName(LinkKind kind);  // "bytes", "nvlink", "nic"

// Bytes one member GPU sends through each of its links during the whole collective.
struct LinkTraffic {
  double nvlink_bytes = 0;
  double nic_bytes = 0;
  double BytesOn(LinkKind kind, int64_t collective_bytes) const {
    switch (kind) {
      case LinkKind::kCollectiveBytes: return static_cast<double>(collective_bytes);
      case LinkKind::kNvlink: return nvlink_bytes;
      case LinkKind::kNic: return nic_bytes;
    }
    return 0;
  }
};

// The traffic of a collective of `type` and `bytes` on a communicator of `topology`, run with
// `algorithm` (CollectiveCost::algorithm; all_to_all and send / recv are point-to-point whatever
// it says). Zero for a 1-rank communicator (a local copy) and for bytes <= 0.
LinkTraffic CollectiveLinkTraffic(const CommTopology& topology, traces::CollectiveType type, int64_t bytes,
                                  NcclAlgorithm algorithm);

// What one GPU's link of `kind` carries per second, one direction, as NCCL's model uses it:
// NVLink at the GPU's NVLink bandwidth x NcclModelConfig::nvlink_usable_fraction (PCIe as given),
// a NIC at the GPU's network share. 0 for kCollectiveBytes (a hand-made link says its own).
double LinkCapacity(const ClusterSpec& cluster, LinkKind kind, const NcclModelConfig& nccl);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_MODELS_LINK_TRAFFIC_H_

// The traffic a collective puts on a member GPU's NVLink and NIC (link_traffic.h).
//
// With n ranks on N nodes (n/N per node, CommTopology's averages) and S the collective's bytes:
//
//  Ring (NCCL src/device/all_gather.h, reduce_scatter.h, all_reduce.h runRing): the buffer is cut
//    into n chunks; all_gather and reduce_scatter take n-1 steps, all_reduce 2(n-1) (a
//    reduce-scatter, then an all-gather), and at every step each rank sends one chunk S/n to its
//    ring successor. Each rank sends E = steps x S/n: (n-1)/n S or 2(n-1)/n S, exactly
//    nccl-tests' busbw factor (doc/PERFORMANCE.md: bus bandwidth is per-rank link traffic over
//    time). broadcast and reduce pipeline S through the ring (broadcast.h, reduce.h runRing):
//    every rank but one forwards S, (n-1)/n S on average.
//    Across nodes NCCL's ring graphs enter and leave every node once per channel, through one
//    NIC each way (src/graph/search.cc ncclTopoCompute: rings that cross the node once,
//    channels spread over the NICs), so N of the ring's n edges are inter-node: a member sends
//    N/n of E through its NIC and (n-N)/n of E over NVLink, on average. (PXN, which routes a
//    send over NVLink to the GPU on the peer's rail, is not modelled: rings are rail-aligned.)
//  Tree (all_reduce only; src/graph/trees.cc ncclGetDtree, src/device/all_reduce.h
//    runTreeUpDown / runTreeSplit): inside a node the ranks form a chain, across nodes two
//    binary trees each carry half the buffer; the data is reduced up and broadcast down. Every
//    chain edge carries S up and S down, so a node's k = n/N ranks send 2(k-1) S over NVLink,
//    2(k-1)/k S each. In each tree every inter-node edge carries S/2 each way; a tree of N
//    nodes has N-1 edges, so the two trees send 2(N-1) S over the network in all, 2(N-1)/N S
//    per node, spread over its k NICs: 2(N-1)/(N k) S each.
//  all_to_all (PyTorch's all_to_all_single: one ncclSend / ncclRecv of S/n per peer in one
//    group, torch/csrc/cuda/nccl.cpp all2all_single_equal_split): a rank sends S/n to each of
//    its local peers over NVLink and to each remote peer through its NIC; the local peers are
//    the members on its node less itself (NcclModel::EstimateWith counts them the same way).
//  send / recv: S through the NIC when the communicator spans nodes (the NCCL model then
//    assumes the peer is remote), else over NVLink.
//
// NVLS, NVLS-Tree and PAT: see their cases in RingOrTree (the switch has no default, so an
// algorithm added to NcclAlgorithm fails the build until its traffic is written).
#include "shardscope/sim/models/link_traffic.h"

#include <algorithm>

namespace shardscope::sim {
namespace {

using traces::CollectiveType;

struct Averages {
  double n;            // ranks
  double nodes;        // N
  double per_node;     // n / N
  double local_peers;  // members on a rank's node less itself (NCCL model's local_ranks - 1)
  double remote_peers;
};

Averages AveragesOf(const CommTopology& t) {
  Averages a;
  a.n = std::max(t.nranks, 1);
  a.nodes = std::clamp(t.nnodes, 1, std::max(t.nranks, 1));
  a.per_node = a.n / a.nodes;
  const double local_ranks = a.nodes == 1 ? a.n : std::clamp<double>(t.ranks_per_node, 1, a.n);
  a.local_peers = local_ranks - 1;
  a.remote_peers = a.n - local_ranks;
  return a;
}

// Ring traffic E per rank split by the share of the ring's edges that leave the node.
LinkTraffic RingTraffic(const Averages& a, double sent_per_rank) {
  LinkTraffic t;
  const double inter_share = a.nodes > 1 ? a.nodes / a.n : 0.0;
  t.nic_bytes = sent_per_rank * inter_share;
  t.nvlink_bytes = sent_per_rank * (1.0 - inter_share);
  return t;
}

LinkTraffic RingOrTree(const Averages& a, CollectiveType type, double s, NcclAlgorithm algorithm) {
  // Sends per rank of the ring: steps x S/n.
  const double ring_steps = type == CollectiveType::kAllReduce ? 2 * (a.n - 1) : a.n - 1;
  switch (algorithm) {
    case NcclAlgorithm::kRing:
      return RingTraffic(a, ring_steps * s / a.n);
    case NcclAlgorithm::kTree: {
      if (type != CollectiveType::kAllReduce) return RingTraffic(a, ring_steps * s / a.n);  // NCCL has no such tree
      // Reduce up and broadcast down: both directions of the chain, and of each of the two trees.
      constexpr double kUpAndDown = 2;
      LinkTraffic t;
      t.nvlink_bytes = kUpAndDown * (a.per_node - 1) / a.per_node * s;
      t.nic_bytes = a.nodes > 1 ? kUpAndDown * (a.nodes - 1) / a.nodes * s / a.per_node : 0.0;
      return t;
    }
    case NcclAlgorithm::kNvls: {
      // One NVSwitch node (NcclModel enables NVLS on a single node only). all_reduce: the
      // reduce-scatter half is multimem.ld_reduce — the switch reads each owner's slice S/n from
      // every GPU, so a GPU sends (n-1)/n x S to the other owners' reductions and S/n of its own;
      // the all-gather half is multimem.st — each owner sends its reduced S/n once and the switch
      // multicasts it. Sent per GPU: S + S/n. all_gather / reduce_scatter (one half each): a GPU
      // receives (n-1)/n x S (all_gather) or sends it (reduce_scatter): the ring's figure.
      LinkTraffic t;
      t.nvlink_bytes = type == CollectiveType::kAllReduce ? s * (a.n + 1) / a.n : s * (a.n - 1) / a.n;
      return t;
    }
    case NcclAlgorithm::kNvlsTree: {
      // all_reduce across nodes: NVLS inside each node (as kNvls over the node's k = n/N GPUs:
      // S + S/k), and the tree across nodes on each GPU's slice S/k (up and down, as kTree's NIC).
      constexpr double kUpAndDown = 2;
      LinkTraffic t;
      t.nvlink_bytes = s * (a.per_node + 1) / a.per_node;
      t.nic_bytes = a.nodes > 1 ? kUpAndDown * (a.nodes - 1) / a.nodes * s / a.per_node : 0.0;
      return t;
    }
    case NcclAlgorithm::kPat:
      // all_gather / reduce_scatter with one GPU per node (NcclModel's condition): every other
      // rank's S/n crosses this rank's NIC once, as on a ring; only the order differs.
      return RingTraffic(a, (a.n - 1) * s / a.n);
    case NcclAlgorithm::kCollNetDirect:
    case NcclAlgorithm::kCollNetChain:
      // Not modelled (the plan refuses NCCL_COLLNET_ENABLE=1, so NcclModel never picks it); should
      // a calibrated cost name it, its data still moves as a ring's would.
      return RingTraffic(a, ring_steps * s / a.n);
  }
  return RingTraffic(a, ring_steps * s / a.n);
}

}  // namespace

std::string_view LinkKindName(LinkKind kind) {
  switch (kind) {
    case LinkKind::kCollectiveBytes: return "bytes";
    case LinkKind::kNvlink: return "nvlink";
    case LinkKind::kNic: return "nic";
  }
  return "unknown";
}

LinkTraffic CollectiveLinkTraffic(const CommTopology& topology, CollectiveType type, int64_t bytes,
                                  NcclAlgorithm algorithm) {
  if (bytes <= 0 || topology.nranks <= 1) return {};
  const Averages a = AveragesOf(topology);
  const double s = static_cast<double>(bytes);
  switch (type) {
    case CollectiveType::kAllToAll: {
      LinkTraffic t;
      t.nvlink_bytes = a.local_peers * s / a.n;
      t.nic_bytes = a.remote_peers * s / a.n;
      return t;
    }
    case CollectiveType::kSend:
    case CollectiveType::kRecv: {
      LinkTraffic t;
      (a.nodes > 1 ? t.nic_bytes : t.nvlink_bytes) = s;
      return t;
    }
    case CollectiveType::kAllGather:
    case CollectiveType::kReduceScatter:
    case CollectiveType::kAllReduce:
      return RingOrTree(a, type, s, algorithm);
    case CollectiveType::kBroadcast:
    case CollectiveType::kReduce:
      // A pipeline through the ring: every rank but the last forwards the whole buffer.
      return RingTraffic(a, (a.n - 1) / a.n * s);
  }
  return {};
}

double LinkCapacity(const ClusterSpec& cluster, LinkKind kind, const NcclModelConfig& nccl) {
  switch (kind) {
    case LinkKind::kCollectiveBytes: return 0;
    case LinkKind::kNvlink:
      // nccl_model.cc UsableIntraBandwidth: NCCL counts an NVLink below its line rate.
      return cluster.fabric == IntraNodeFabric::kPcie
                 ? cluster.intra_node_bandwidth
                 : cluster.intra_node_bandwidth * nccl.nvlink_usable_fraction[static_cast<int>(cluster.gpu.arch)];
    case LinkKind::kNic: return cluster.inter_node_bandwidth;
  }
  return 0;
}

}  // namespace shardscope::sim

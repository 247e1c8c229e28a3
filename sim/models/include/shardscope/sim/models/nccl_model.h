// NCCL's own tuning model (src/graph/tuning.cc), reimplemented: for a collective of a given
// size on a communicator of a given shape, the time of every enabled (algorithm, protocol)
// pair is latency + bytes / bandwidth, and NCCL picks the cheapest. We model Ring and Tree
// with the LL, LL128 and Simple protocols (NVLS, CollNet and PAT are not modelled).
//
// The tables (base latencies, per-hop latencies, per-channel bandwidths, channel counts)
// live in NcclModelConfig::Default() with the NCCL source they come from; nccl_model.cc
// documents the formulas and what replaces NCCL's topology search.
//
// all_to_all and send / recv are not tuned by NCCL; they are costed as concurrent
// point-to-point messages (see NcclModel::Estimate).
#ifndef SHARDSCOPE_SIM_NCCL_MODEL_H_
#define SHARDSCOPE_SIM_NCCL_MODEL_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "shardscope/sim/presets/hardware.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::sim {

enum class NcclAlgorithm : uint8_t { kTree = 0, kRing = 1 };
enum class NcclProtocol : uint8_t { kLL = 0, kLL128 = 1, kSimple = 2 };
inline constexpr int kNumNcclAlgorithms = 2;
inline constexpr int kNumNcclProtocols = 3;
std::string_view NcclAlgorithmName(NcclAlgorithm algorithm);  // "Tree", "Ring"
std::string_view NcclProtocolName(NcclProtocol protocol);     // "LL", "LL128", "Simple"

inline constexpr int kNumGpuArchs = 3;          // GpuArch values
inline constexpr int kNumCpuVendors = 2;        // CpuVendor values
inline constexpr int kNumIntraNodeFabrics = 3;  // IntraNodeFabric values
// NCCL's node-count classes for its per-channel tables: 1 node, 2 nodes, more (tuning.cc
// index2 = nNodes <= 2 ? nNodes-1 : 2).
inline constexpr int kNumNodeClasses = 3;
// ncclTopoGetAlgoTime's tree correction covers log2(bytes / 64) in [0, 23).
inline constexpr int kNumTreeCorrectionSizes = 23;

// The shape of one communicator on the cluster.
struct CommTopology {
  int32_t nranks = 1;
  int32_t nnodes = 1;                 // distinct nodes among the members
  int32_t ranks_per_node = 1;         // max members on one node
  GpuArch arch = GpuArch::kHopper;
  IntraNodeFabric fabric = IntraNodeFabric::kNvSwitch;
  double intra_node_bandwidth = 0;    // bytes/s per GPU per direction
  double inter_node_bandwidth = 0;    // bytes/s per GPU per direction
  CpuVendor cpu_vendor = CpuVendor::kIntel;  // picks NCCL's multi-node LL cap / net overhead
  bool gpu_direct_rdma = true;        // LL128 across nodes needs it
  double hbm_bandwidth = 0;           // bytes/s: a 1-rank collective is a local copy
};

// Builds the topology of a communicator made of `ranks` on `cluster`.
CommTopology TopologyOf(const ClusterSpec& cluster, const std::vector<int32_t>& ranks);

struct CollectiveCost {
  // False when NCCL has no such (algorithm, protocol) pair for the collective (e.g. Tree for
  // all_gather) or disables it on this topology (LL128 over PCIe); duration_ns is then
  // INT64_MAX.
  bool available = true;
  int64_t duration_ns = 0;
  NcclAlgorithm algorithm = NcclAlgorithm::kRing;
  NcclProtocol protocol = NcclProtocol::kSimple;
  int32_t channels = 0;
  double latency_us = 0;      // the latency term of the chosen pair
  double algo_bandwidth = 0;  // bytes/s: the bandwidth term's divisor of the chosen pair
};

struct NcclModelConfig {
  // [algorithm][protocol], microseconds (tuning.cc baseLat).
  double base_latency_us[kNumNcclAlgorithms][kNumNcclProtocols] = {};
  // Per-hop latencies [algorithm][protocol], microseconds (tuning.cc hwLat NVLINK / NET).
  double nvlink_hop_latency_us[kNumNcclAlgorithms][kNumNcclProtocols] = {};
  double network_hop_latency_us[kNumNcclAlgorithms][kNumNcclProtocols] = {};
  // Per-hop latency when the GPUs of a node talk over PCIe (tuning.cc hwLat PCI).
  double pci_hop_latency_us[kNumNcclAlgorithms][kNumNcclProtocols] = {};

  // ---- Bandwidth caps, GB/s (1e9 B/s) as in tuning.cc.
  // LL bus-bandwidth cap on one node, by GPU arch (llMaxBws, N1 column).
  double ll_max_bw_single_node_gbps[kNumGpuArchs] = {};
  // LL cap across nodes, by CPU vendor, for 2 nodes and for more (llMaxBws N2 / N4 columns).
  double ll_max_bw_multi_node_gbps[kNumCpuVendors][2] = {};
  // Per-channel caps [arch][node class] (perChMaxRingLL128Bws, perChMaxTreeLL128Bws,
  // perChMaxTreeBws).
  double per_channel_max_ring_ll128_gbps[kNumGpuArchs][kNumNodeClasses] = {};
  double per_channel_max_tree_ll128_gbps[kNumGpuArchs][kNumNodeClasses] = {};
  double per_channel_max_tree_gbps[kNumGpuArchs][kNumNodeClasses] = {};

  // ---- Protocol / algorithm bandwidth factors (tuning.cc "model refinements").
  double ring_ll_bw_factor = 0;                 // LL: 8-byte lines carry 4 bytes of data
  double ring_ll128_bw_factor = 0;              // LL128: 120 of 128 bytes are data
  double tree_bw_factor = 0;                    // all Tree protocols
  double tree_ll_bw_factor = 0;                 // Tree LL on top of tree_bw_factor
  double tree_ll128_bw_factor_single_node = 0;  // Tree LL128, 1 node
  double tree_ll128_bw_factor_multi_node = 0;   // Tree LL128, several nodes
  double tree_bus_to_algo_ratio = 0;            // Tree algBw = busBw x this

  // ---- ncclTopoGetAlgoTime refinements.
  // Tree bandwidth multiplier [protocol][log2(bytes / 64)].
  double tree_correction_factor[kNumNcclProtocols][kNumTreeCorrectionSizes] = {};
  // Ring / Simple all_reduce across nodes: latency x this ("plateau effect of ring") once
  // bytes / (channels x ranks) reaches the threshold; Volta has its own factor.
  double ring_plateau_latency_factor_volta = 0;
  double ring_plateau_latency_factor = 0;
  double ring_plateau_min_bytes_per_channel_rank = 0;

  // ---- Multi-node ring latency floor per step (getNetOverhead), microseconds, by CPU
  // vendor; Simple pays it net_overhead_simple_factor times.
  double net_overhead_us[kNumCpuVendors] = {};
  double net_overhead_simple_factor = 0;

  // ---- What replaces NCCL's topology search (see nccl_model.cc).
  int32_t channels[kNumGpuArchs] = {};           // ring / tree graph channels
  double nvlink_usable_fraction[kNumGpuArchs] = {};  // NCCL's per-link NVLink bw / line rate

  // ---- Point-to-point (send / recv, all_to_all).
  int64_t p2p_ll_threshold_bytes = 0;            // LL at or below, Simple above
  // Share of a GPU's NVLink bandwidth one peer can reach, by fabric.
  double p2p_pair_nvlink_fraction[kNumIntraNodeFabrics] = {};

  static NcclModelConfig Default();
};

class NcclModel {
 public:
  explicit NcclModel(NcclModelConfig config);
  // Cheapest (algorithm, protocol) for the collective, NCCL-style. `bytes` is nccl-tests'
  // size S (see CollectiveOp). send / recv and single-rank communicators are handled too
  // (a 1-rank collective is a local copy); bytes <= 0 costs 0. all_to_all and send / recv
  // are concurrent point-to-point messages, reported as Ring with the protocol NCCL's p2p
  // path uses (LL up to p2p_ll_threshold_bytes per peer, Simple above).
  CollectiveCost Estimate(traces::CollectiveType type, int64_t bytes,
                          const CommTopology& topology) const;
  // The cost of one specific pair (for tests and for reports); available = false when NCCL
  // has no such pair for the collective on this topology.
  CollectiveCost EstimateWith(traces::CollectiveType type, int64_t bytes,
                              const CommTopology& topology, NcclAlgorithm algorithm,
                              NcclProtocol protocol) const;
  const NcclModelConfig& config() const { return config_; }

 private:
  NcclModelConfig config_;
};

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_NCCL_MODEL_H_

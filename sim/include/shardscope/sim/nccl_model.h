// NCCL's own tuning model (src/graph/tuning.cc), reimplemented: for a collective of a given
// size on a communicator of a given shape, the time of every enabled (algorithm, protocol)
// pair is latency + bytes / bandwidth, and NCCL picks the cheapest. We model Ring and Tree
// with the LL, LL128 and Simple protocols.
//
// The tables (base latencies, per-hop latencies, per-channel bandwidths, channel counts)
// live in NcclModelConfig::Default() with the NCCL source they come from.
#ifndef SHARDSCOPE_SIM_NCCL_MODEL_H_
#define SHARDSCOPE_SIM_NCCL_MODEL_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "shardscope/sim/hardware.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::sim {

enum class NcclAlgorithm : uint8_t { kTree = 0, kRing = 1 };
enum class NcclProtocol : uint8_t { kLL = 0, kLL128 = 1, kSimple = 2 };
inline constexpr int kNumNcclAlgorithms = 2;
inline constexpr int kNumNcclProtocols = 3;
std::string_view NcclAlgorithmName(NcclAlgorithm algorithm);  // "Tree", "Ring"
std::string_view NcclProtocolName(NcclProtocol protocol);     // "LL", "LL128", "Simple"

// The shape of one communicator on the cluster.
struct CommTopology {
  int32_t nranks = 1;
  int32_t nnodes = 1;                 // distinct nodes among the members
  int32_t ranks_per_node = 1;         // max members on one node
  GpuArch arch = GpuArch::kHopper;
  IntraNodeFabric fabric = IntraNodeFabric::kNvSwitch;
  double intra_node_bandwidth = 0;    // bytes/s per GPU per direction
  double inter_node_bandwidth = 0;    // bytes/s per GPU per direction
};

// Builds the topology of a communicator made of `ranks` on `cluster`.
CommTopology TopologyOf(const ClusterSpec& cluster, const std::vector<int32_t>& ranks);

struct CollectiveCost {
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
  // Further tables (per-channel bandwidth caps, protocol efficiencies, channel counts)
  // are added by the implementation with their sources.
  static NcclModelConfig Default();
};

class NcclModel {
 public:
  explicit NcclModel(NcclModelConfig config);
  // Cheapest (algorithm, protocol) for the collective, NCCL-style. send / recv and
  // single-rank communicators are handled too (a 1-rank collective is a local copy).
  CollectiveCost Estimate(traces::CollectiveType type, int64_t bytes,
                          const CommTopology& topology) const;
  // The cost of one specific pair (for tests and for reports).
  CollectiveCost EstimateWith(traces::CollectiveType type, int64_t bytes,
                              const CommTopology& topology, NcclAlgorithm algorithm,
                              NcclProtocol protocol) const;
  const NcclModelConfig& config() const { return config_; }

 private:
  NcclModelConfig config_;
};

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_NCCL_MODEL_H_

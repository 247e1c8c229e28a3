// Private to sim/models/: what nccl_model.cc (selection, channels, topologies) and
// nccl_estimate.cc (the cost of one algorithm / protocol pair) share. nccl_model.cc's file
// comment documents the model.
#ifndef SHARDSCOPE_SIM_MODELS_NCCL_MODEL_INTERNAL_H_
#define SHARDSCOPE_SIM_MODELS_NCCL_MODEL_INTERNAL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "shardscope/sim/models/nccl_model.h"

namespace shardscope::sim::nccl_internal {

// NCCL's units: latencies in microseconds, bandwidths in GB/s (1e9 bytes/s). One GB/s is one
// byte per nanosecond, so bytes / GBps is nanoseconds.
inline constexpr double kBytesPerSecondPerGbps = 1e9;
inline constexpr double kNsPerUs = 1e3;
inline constexpr double kNsPerSecond = 1e9;

inline constexpr int kTree = static_cast<int>(NcclAlgorithm::kTree);
inline constexpr int kRing = static_cast<int>(NcclAlgorithm::kRing);
inline constexpr int kNvls = static_cast<int>(NcclAlgorithm::kNvls);
inline constexpr int kNvlsTree = static_cast<int>(NcclAlgorithm::kNvlsTree);
inline constexpr int kPat = static_cast<int>(NcclAlgorithm::kPat);
inline constexpr int kLL = static_cast<int>(NcclProtocol::kLL);
inline constexpr int kLL128 = static_cast<int>(NcclProtocol::kLL128);
inline constexpr int kSimple = static_cast<int>(NcclProtocol::kSimple);
inline constexpr int kHwNvlink = 0, kHwPci = 1, kHwNet = 2;  // hwLat rows

inline int ArchIndex(GpuArch arch) { return static_cast<int>(arch); }
inline int CpuIndex(CpuVendor cpu) { return static_cast<int>(cpu); }
inline int FabricIndex(IntraNodeFabric fabric) { return static_cast<int>(fabric); }
// tuning.cc: index2 = nNodes <= 2 ? nNodes-1 : 2.
inline int NodeClass(int32_t nnodes) { return nnodes <= 2 ? nnodes - 1 : 2; }
// NCCL's log2i: floor(log2(n)), 0 for n <= 1.
inline int Log2i(int64_t n) {
  int l = 0;
  while (n >>= 1) ++l;
  return l;
}
inline int CeilLog2(int64_t n) {
  int l = 0;
  while ((int64_t{1} << l) < n) ++l;
  return l;
}
inline bool IsPointToPoint(traces::CollectiveType type) {
  return type == traces::CollectiveType::kAllToAll || type == traces::CollectiveType::kSend ||
         type == traces::CollectiveType::kRecv;
}
// Clamped to the simulator's horizon (traces::kMaxSimulatedNs), so the conversion is defined
// for any size and bandwidth; a collective that long stops the run with the engine's error.
inline int64_t CeilNs(double ns) {
  if (!(ns > 0)) return 0;
  return static_cast<int64_t>(std::ceil(std::min(ns, static_cast<double>(traces::kMaxSimulatedNs))));
}
inline int IntraHw(const CommTopology& t) { return t.fabric == IntraNodeFabric::kPcie ? kHwPci : kHwNvlink; }

inline CollectiveCost Unavailable(NcclAlgorithm algorithm, NcclProtocol protocol) {
  CollectiveCost cost;
  cost.available = false;
  cost.duration_ns = std::numeric_limits<int64_t>::max();
  cost.algorithm = algorithm;
  cost.protocol = protocol;
  return cost;
}

// The communicator with degenerate fields made safe.
struct Shape {
  int32_t nranks;
  int32_t nnodes;
  int32_t local_ranks;  // members on one node (all of them on a single node)
};
Shape ShapeOf(const CommTopology& t);

// GB/s of the GPU's NVLink (or PCIe) bandwidth NCCL's graphs can use inside a node.
double UsableIntraGbps(const NcclModelConfig& c, const CommTopology& t);
// The ring / tree graph's bus bandwidth, GB/s (nccl_model.cc's file comment).
double GraphGbps(const NcclModelConfig& c, const CommTopology& t, const Shape& s);

// The NVLS graph NCCL's search finds (NvlsGraphOf in nccl_model.cc says how).
struct NvlsGraph {
  int32_t channels = 0;
  double bw_intra = 0;  // GB/s per channel
  double bw_inter = 0;
};
NvlsGraph NvlsGraphOf(const NcclModelConfig& c, const CommTopology& t, const Shape& s);

// Whether NVLS (flat, one node) or NVLS-Tree (across nodes) can run on `t`, knobs aside.
bool NvlsUsable(const NcclTuningTables& tables, const CommTopology& t, const Shape& s, bool tree);

// The execution-channel counts with the user's limits and without them.
struct ChannelCounts {
  int32_t ring_tree = 0, ring_tree_default = 0;
  int32_t nvls = 0, nvls_default = 0;
};
ChannelCounts ChannelsOf(const NcclModelConfig& c, const CommTopology& t);
// used / by_default, at most 1.
double ChannelScale(int32_t used, int32_t by_default);

}  // namespace shardscope::sim::nccl_internal

#endif  // SHARDSCOPE_SIM_MODELS_NCCL_MODEL_INTERNAL_H_

// NCCL's tuning model (ncclTopoTuneModel + ncclTopoGetAlgoTime in src/graph/tuning.cc),
// reimplemented for Ring and Tree x LL / LL128 / Simple.
//
// Source: NVIDIA/nccl src/graph/tuning.cc as of NCCL 2.23-2.26 (the tables below are those
// of that file's baseLat, hwLat, llMaxBws, perChMax*Bws and treeCorrectionFactor; later
// releases keep the same values in ncclTunerConstantsDefaults).
//
// For a collective of S bytes (nccl-tests' size, see CollectiveOp) NCCL estimates
//   time_us = latency_us + S / (1000 x algBw_GBps)
// and runs the cheapest enabled (algorithm, protocol). With n ranks on N nodes:
//
//   busBw  = nChannels x per-channel bandwidth of the ring / tree graph, then
//            Ring LL     min(llMaxBw, busBw x 0.5)
//            Ring LL128  min(busBw x 0.92, nChannels x perChMaxRingLL128Bw)
//            Tree        min(busBw x 0.92, nChannels x perChMaxTreeBw), then
//              LL        min(busBw / 3.8, llMaxBw)
//              LL128     min(busBw x (N == 1 ? 7/9 : 120/128), nChannels x perChMaxTreeLL128Bw)
//   algBw  = Ring: busBw x n / nsteps   (nsteps: all_reduce 2(n-1); all_gather and
//                                        reduce_scatter n-1; broadcast and reduce n)
//            Tree: busBw x 0.5
//   latency Ring (all_reduce, all_gather, reduce_scatter):
//              baseLat + (nsteps - nInterSteps) x intraLat + nInterSteps x interLat,
//              nInterSteps = N == 1 ? 0 : all_reduce ? 2(N-1) : N-1;
//              across nodes intraLat = max(intraLat, netOverhead (x3 for Simple))
//           Ring (broadcast, reduce): baseLat + hwLat if every channel is the same ring,
//              else baseLat + nsteps x hwLat (Simple then uses the Tree hwLat row)
//           Tree: baseLat + 2 x ((n/N - 1) x intraLat + floor(log2 N) x interLat)
//            interLat is the NET row of hwLat (the Tree row when N == n: one GPU per node).
//   then ncclTopoGetAlgoTime: Tree bw x treeCorrectionFactor[protocol][log2(S/64)], and
//   Ring Simple all_reduce across nodes: latency x 1.4 (Volta 1.9) once
//   S / (nChannels x n) >= 64.
//   Tree is only for all_reduce; broadcast, reduce, all_gather and reduce_scatter are Ring.
//
// What replaces NCCL's topology search (ncclTopoCompute), which we do not run:
//  - The per-GPU bus bandwidth nChannels x bw of the graph. On one node it is the GPU's
//    NVLink bandwidth x nvlink_usable_fraction (NCCL counts each NVLink at SMxx_NVLINK_BW,
//    below the 25 GB/s line rate); over PCIe the intra-node bandwidth as given. Across nodes
//    each channel of a ring or tree leaves and enters every node through one NIC, and the
//    channels are spread over the NICs of the members' GPUs, so the graph carries
//    min(intra, (n/N) x per-GPU network share); with one GPU per node, the network share.
//    (NCCL uses the graph's bwIntra for N <= 2; ring graphs across nodes have bwIntra ==
//    bwInter, and the raised bwIntra of 2-node trees is not modelled.)
//  - The channel count (`channels`, by arch): only the per-channel caps and the plateau
//    threshold read it. ASSUMPTION, derived by hand from ncclTopoCompute on a fully
//    populated node: Volta hybrid cube mesh 6 rings at SM70_NVLINK_BW = 20 GB/s (one per
//    NVLink); A100 NVSwitch 6 x 40 GB/s (speedArrayIntra[0]) fills the 12 x 20 = 240 GB/s,
//    then ncclTopoDupChannels doubles to 12 x 20; H100 NVSwitch 6 x 60 GB/s
//    (sm90SpeedArrayIntra[0]) is the best fit to 18 x 20.6 = 370.8 GB/s, doubled to 12 x 30.
//    Multi-node graphs are assumed to keep the same count. NCCL_DEBUG=INFO prints the real
//    graph ("Pattern 4, crossNic 0, nChannels ..., bw .../...").
//  - Trees are NCCL_TOPO_PATTERN_BALANCED_TREE (no extra x0.85 of the plain TREE pattern);
//    graph latencyInter (extra NIC latency) is 0; ring channels are all the same ring
//    (sameChannels) only on a single NVSwitch node.
//  - LL128 is enabled as in NCCL on Volta/Ampere/Hopper when the GPUs of a node talk over
//    NVLink and, across nodes, the NIC is reachable through a PCIe switch (GPUDirect RDMA).
//  - The CPU vendor picks the multi-node LL cap and getNetOverhead (Intel 1 us, AMD 2 us).
//
// Not modelled: NVLS / NVLS-Tree (Hopper NVSwitch: NCCL prefers NVLS for large
// all_reduce), CollNet, PAT (1 GPU per node all_gather / reduce_scatter, NCCL >= 2.23),
// user NCCL_ALGO / NCCL_PROTO overrides, aggregation of several operations (latCount = 1).
//
// Point-to-point (NCCL does not tune these; enqueue.cc uses LL for messages up to
// NCCL_P2P_LL_THRESHOLD = 16384 bytes and Simple above):
//  - send / recv: base latency + one hop latency (Ring row: NVLink, PCI, or NET when the
//    communicator spans nodes: the peer is then assumed remote), plus bytes over the pair's
//    bandwidth: the per-GPU network share across nodes, otherwise the GPU's usable NVLink
//    bandwidth x p2p_pair_nvlink_fraction (a V100 pair shares one of six links). LL moves
//    data at ring_ll_bw_factor of that.
//  - all_to_all (S = what one rank sends, S/n per peer): every peer message is in flight at
//    once; the local peers share the GPU's usable NVLink bandwidth and the remote ones its
//    network share, so the bandwidth term is max(local bytes / intra, remote bytes / inter)
//    and the latency is one base + one hop of the slowest kind. This ignores NCCL's
//    scheduling of many peers in rounds (a lower bound on latency for large communicators).
#include "shardscope/sim/models/nccl_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace shardscope::sim {
namespace {

using traces::CollectiveType;

// NCCL's units: latencies in microseconds, bandwidths in GB/s (1e9 bytes/s). One GB/s is one
// byte per nanosecond, so bytes / GBps is nanoseconds.
constexpr double kBytesPerSecondPerGbps = 1e9;
constexpr double kNsPerUs = 1e3;
constexpr double kNsPerSecond = 1e9;
// A 1-rank collective copies the buffer once: it is read and written.
constexpr double kLocalCopyTrafficFactor = 2;

constexpr int kTree = static_cast<int>(NcclAlgorithm::kTree);
constexpr int kRing = static_cast<int>(NcclAlgorithm::kRing);
constexpr int kLL = static_cast<int>(NcclProtocol::kLL);
constexpr int kLL128 = static_cast<int>(NcclProtocol::kLL128);
constexpr int kSimple = static_cast<int>(NcclProtocol::kSimple);

int ArchIndex(GpuArch arch) { return static_cast<int>(arch); }
int CpuIndex(CpuVendor cpu) { return static_cast<int>(cpu); }
int FabricIndex(IntraNodeFabric fabric) { return static_cast<int>(fabric); }
// tuning.cc: index2 = nNodes <= 2 ? nNodes-1 : 2.
int NodeClass(int32_t nnodes) { return nnodes <= 2 ? nnodes - 1 : 2; }

// NCCL's log2i: floor(log2(n)), 0 for n <= 1.
int Log2i(int64_t n) {
  int l = 0;
  while (n >>= 1) ++l;
  return l;
}

bool IsPointToPoint(CollectiveType type) {
  return type == CollectiveType::kAllToAll || type == CollectiveType::kSend ||
         type == CollectiveType::kRecv;
}

// Clamped to the simulator's horizon (traces::kMaxSimulatedNs), so the conversion is defined
// for any size and bandwidth; a collective that long stops the run with the engine's error.
int64_t CeilNs(double ns) {
  if (!(ns > 0)) return 0;
  return static_cast<int64_t>(std::ceil(std::min(ns, static_cast<double>(traces::kMaxSimulatedNs))));
}

CollectiveCost Unavailable(NcclAlgorithm algorithm, NcclProtocol protocol) {
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

Shape ShapeOf(const CommTopology& t) {
  Shape s;
  s.nranks = std::max(t.nranks, 1);
  s.nnodes = std::clamp(t.nnodes, 1, s.nranks);
  s.local_ranks = s.nnodes == 1 ? s.nranks : std::clamp(t.ranks_per_node, 1, s.nranks);
  return s;
}

// Bytes/s of the GPU's NVLink (or PCIe) bandwidth NCCL's graphs can use inside a node.
double UsableIntraBandwidth(const NcclModelConfig& c, const CommTopology& t) {
  if (t.fabric == IntraNodeFabric::kPcie) return t.intra_node_bandwidth;
  return t.intra_node_bandwidth * c.nvlink_usable_fraction[ArchIndex(t.arch)];
}

// One hwLat row: [algorithm][protocol] microseconds.
using HopLatencyTable = double[kNumNcclAlgorithms][kNumNcclProtocols];

// hwLat row for traffic inside a node.
const HopLatencyTable& IntraHopLatency(const NcclModelConfig& c, const CommTopology& t) {
  return t.fabric == IntraNodeFabric::kPcie ? c.pci_hop_latency_us : c.nvlink_hop_latency_us;
}

}  // namespace

std::string_view NcclAlgorithmName(NcclAlgorithm algorithm) {
  switch (algorithm) {
    case NcclAlgorithm::kTree: return "Tree";
    case NcclAlgorithm::kRing: return "Ring";
  }
  return "unknown";
}

std::string_view NcclProtocolName(NcclProtocol protocol) {
  switch (protocol) {
    case NcclProtocol::kLL: return "LL";
    case NcclProtocol::kLL128: return "LL128";
    case NcclProtocol::kSimple: return "Simple";
  }
  return "unknown";
}

CommTopology TopologyOf(const ClusterSpec& cluster, const std::vector<int32_t>& ranks) {
  CommTopology t;
  t.nranks = static_cast<int32_t>(ranks.size());
  // Members per node; ranks are few (<= world size) so a sorted copy is cheap.
  std::vector<int32_t> nodes;
  nodes.reserve(ranks.size());
  for (int32_t rank : ranks) nodes.push_back(cluster.NodeOf(rank));
  std::sort(nodes.begin(), nodes.end());
  t.nnodes = 0;
  t.ranks_per_node = 0;
  for (size_t i = 0; i < nodes.size();) {
    size_t j = i;
    while (j < nodes.size() && nodes[j] == nodes[i]) ++j;
    ++t.nnodes;
    t.ranks_per_node = std::max(t.ranks_per_node, static_cast<int32_t>(j - i));
    i = j;
  }
  if (t.nnodes == 0) {  // empty communicator: the 1-rank defaults
    t.nnodes = 1;
    t.ranks_per_node = 1;
  }
  t.arch = cluster.gpu.arch;
  t.fabric = cluster.fabric;
  t.intra_node_bandwidth = cluster.intra_node_bandwidth;
  t.inter_node_bandwidth = cluster.inter_node_bandwidth;
  t.cpu_vendor = cluster.cpu_vendor;
  t.gpu_direct_rdma = cluster.gpu_direct_rdma;
  t.hbm_bandwidth = cluster.gpu.hbm_bandwidth;
  return t;
}

NcclModelConfig NcclModelConfig::Default() {
  NcclModelConfig c;
  // All tables: NVIDIA/nccl src/graph/tuning.cc (NCCL 2.23-2.26), indices [Tree, Ring]
  // x [LL, LL128, Simple] unless stated.

  // baseLat: "Latencies in us".
  const double base[kNumNcclAlgorithms][kNumNcclProtocols] = {
      {6.8, 14.0, 8.4},  // Tree
      {6.6, 14.0, 8.4},  // Ring
  };
  // hwLat[NCCL_HW_NVLINK], hwLat[NCCL_HW_PCI], hwLat[NCCL_HW_NET].
  const double nvlink[kNumNcclAlgorithms][kNumNcclProtocols] = {
      {0.6, 1.25, 4.0},  // Tree
      {0.6, 1.9, 3.4},   // Ring
  };
  const double pci[kNumNcclAlgorithms][kNumNcclProtocols] = {
      {1.0, 1.9, 4.0},  // Tree
      {1.0, 2.5, 5.7},  // Ring
  };
  const double net[kNumNcclAlgorithms][kNumNcclProtocols] = {
      {5.0, 8.5, 14.0},  // Tree
      {2.7, 4.0, 14.0},  // Ring
  };
  for (int a = 0; a < kNumNcclAlgorithms; ++a) {
    for (int p = 0; p < kNumNcclProtocols; ++p) {
      c.base_latency_us[a][p] = base[a][p];
      c.nvlink_hop_latency_us[a][p] = nvlink[a][p];
      c.pci_hop_latency_us[a][p] = pci[a][p];
      c.network_hop_latency_us[a][p] = net[a][p];
    }
  }

  // llMaxBws[index1][index2]: index1 is the GPU arch on one node ("Volta-N1", "Ampere-N1",
  // "Hopper-N1") and the CPU across nodes (row 0 "Intel-N2/Intel-N4", row 1 "AMD-N2/AMD-N4").
  const double ll_single[kNumGpuArchs] = {39.0, 87.7, 141.0};  // Volta, Ampere, Hopper
  const double ll_multi[kNumCpuVendors][2] = {
      {39.0, 20.4},  // Intel: N2, N4+
      {22.5, 19.0},  // AMD: N2 ("avg of ring & tree"), N4+
  };
  // perChMaxRingLL128Bws, perChMaxTreeLL128Bws, perChMaxTreeBws: [arch][N1, N2, N4+].
  const double ring_ll128[kNumGpuArchs][kNumNodeClasses] = {
      {20.0, 20.0, 20.0},  // Volta
      {20.0, 20.0, 20.0},  // Ampere
      {36.7, 36.7, 36.7},  // Hopper
  };
  const double tree_ll128[kNumGpuArchs][kNumNodeClasses] = {
      {20.0, 20.0, 20.0},  // Volta
      {20.0, 20.0, 20.0},  // Ampere
      {36.7, 36.7, 29.0},  // Hopper
  };
  const double tree[kNumGpuArchs][kNumNodeClasses] = {
      {26.5, 18.5, 10.0},  // Volta
      {24.0, 23.6, 17.8},  // Ampere
      {38.7, 41.4, 36.0},  // Hopper
  };
  for (int g = 0; g < kNumGpuArchs; ++g) {
    c.ll_max_bw_single_node_gbps[g] = ll_single[g];
    for (int n = 0; n < kNumNodeClasses; ++n) {
      c.per_channel_max_ring_ll128_gbps[g][n] = ring_ll128[g][n];
      c.per_channel_max_tree_ll128_gbps[g][n] = tree_ll128[g][n];
      c.per_channel_max_tree_gbps[g][n] = tree[g][n];
    }
  }
  for (int v = 0; v < kNumCpuVendors; ++v) {
    c.ll_max_bw_multi_node_gbps[v][0] = ll_multi[v][0];
    c.ll_max_bw_multi_node_gbps[v][1] = ll_multi[v][1];
  }

  // ncclTopoTuneModel "Various model refinements" and "Convert bus BW to algorithm BW".
  c.ring_ll_bw_factor = 0.5;
  c.ring_ll128_bw_factor = 0.92;  // "0.92 /*120.0/128.0*/"
  c.tree_bw_factor = 0.92;
  c.tree_ll_bw_factor = 1.0 / 3.8;
  c.tree_ll128_bw_factor_single_node = 7.0 / 9.0;
  c.tree_ll128_bw_factor_multi_node = 120.0 / 128.0;
  c.tree_bus_to_algo_ratio = 0.5;

  // treeCorrectionFactor: "Powers of two, 64 B to 256MB".
  const double correction[kNumNcclProtocols][kNumTreeCorrectionSizes] = {
      {1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5,
       .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0},  // LL
      {1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6,
       .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0},  // LL128
      {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5,
       .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9},  // Simple
  };
  for (int p = 0; p < kNumNcclProtocols; ++p) {
    for (int i = 0; i < kNumTreeCorrectionSizes; ++i) {
      c.tree_correction_factor[p][i] = correction[p][i];
    }
  }
  // ncclTopoGetAlgoTime: "lat *= comm->minCompCap < 80 ? 1.9 : 1.4; // Plateau effect of
  // ring" when nBytes/(nChannels*nRanks) >= 64.
  c.ring_plateau_latency_factor_volta = 1.9;
  c.ring_plateau_latency_factor = 1.4;
  c.ring_plateau_min_bytes_per_channel_rank = 64;

  // getNetOverhead: x86 Intel 1.0 us, x86 AMD 2.0 us; "if (p == NCCL_PROTO_SIMPLE)
  // netOverhead *= 3".
  c.net_overhead_us[CpuIndex(CpuVendor::kIntel)] = 1.0;
  c.net_overhead_us[CpuIndex(CpuVendor::kAmd)] = 2.0;
  c.net_overhead_simple_factor = 3;

  // Channels: ASSUMPTION derived from ncclTopoCompute by hand (see the file comment).
  c.channels[ArchIndex(GpuArch::kVolta)] = 6;
  c.channels[ArchIndex(GpuArch::kAmpere)] = 12;
  c.channels[ArchIndex(GpuArch::kHopper)] = 12;

  // NCCL's per-link NVLink bandwidth (src/graph/topo.h SM70_NVLINK_BW 20.0, SM80_NVLINK_BW
  // 20.0, SM90_NVLINK_BW 20.6 GB/s) over the per-link, per-direction line rate of NVLink 2,
  // 3 and 4 (25 GB/s: V100, A100 and H100 architecture whitepapers).
  constexpr double kNvlinkLineRateGbps = 25.0;
  c.nvlink_usable_fraction[ArchIndex(GpuArch::kVolta)] = 20.0 / kNvlinkLineRateGbps;
  c.nvlink_usable_fraction[ArchIndex(GpuArch::kAmpere)] = 20.0 / kNvlinkLineRateGbps;
  c.nvlink_usable_fraction[ArchIndex(GpuArch::kHopper)] = 20.6 / kNvlinkLineRateGbps;

  // src/enqueue.cc: NCCL_PARAM(P2pLLThreshold, "P2P_LL_THRESHOLD", 16384).
  c.p2p_ll_threshold_bytes = 16384;
  // A pair on NVSwitch reaches the whole NVLink bandwidth through the switches; on the
  // V100 hybrid cube mesh a pair is joined by one (some pairs two) of the GPU's six links
  // (DGX-1 V100 whitepaper); we assume one: 1/6. PCIe: the pair has the GPU's PCIe link.
  constexpr double kV100NvlinksPerGpu = 6;
  c.p2p_pair_nvlink_fraction[FabricIndex(IntraNodeFabric::kNvSwitch)] = 1.0;
  c.p2p_pair_nvlink_fraction[FabricIndex(IntraNodeFabric::kNvLinkHybridCubeMesh)] =
      1.0 / kV100NvlinksPerGpu;
  c.p2p_pair_nvlink_fraction[FabricIndex(IntraNodeFabric::kPcie)] = 1.0;
  return c;
}

NcclModel::NcclModel(NcclModelConfig config) : config_(std::move(config)) {}

CollectiveCost NcclModel::Estimate(CollectiveType type, int64_t bytes,
                                   const CommTopology& topology) const {
  if (IsPointToPoint(type)) {
    // NCCL picks the p2p protocol by size, not by its cost model.
    const Shape s = ShapeOf(topology);
    const int64_t per_peer = type == CollectiveType::kAllToAll ? bytes / s.nranks : bytes;
    const NcclProtocol protocol = per_peer <= config_.p2p_ll_threshold_bytes
                                      ? NcclProtocol::kLL
                                      : NcclProtocol::kSimple;
    return EstimateWith(type, bytes, topology, NcclAlgorithm::kRing, protocol);
  }
  if (bytes <= 0 || topology.nranks <= 1) {
    // Nothing to tune: no launch, or a local copy.
    return EstimateWith(type, bytes, topology, NcclAlgorithm::kRing, NcclProtocol::kSimple);
  }
  CollectiveCost best = Unavailable(NcclAlgorithm::kRing, NcclProtocol::kSimple);
  double best_ns = std::numeric_limits<double>::infinity();
  // NCCL's loop order (algorithms, then protocols); the first strictly cheaper pair wins.
  for (int a = 0; a < kNumNcclAlgorithms; ++a) {
    for (int p = 0; p < kNumNcclProtocols; ++p) {
      CollectiveCost cost = EstimateWith(type, bytes, topology, static_cast<NcclAlgorithm>(a),
                                         static_cast<NcclProtocol>(p));
      if (!cost.available) continue;
      // Compare the unrounded times, as NCCL does.
      const double ns = cost.latency_us * kNsPerUs +
                        (cost.algo_bandwidth > 0
                             ? static_cast<double>(std::max<int64_t>(bytes, 0)) * kNsPerSecond /
                                   cost.algo_bandwidth
                             : 0);
      if (ns < best_ns) {
        best_ns = ns;
        best = cost;
      }
    }
  }
  return best;
}

CollectiveCost NcclModel::EstimateWith(CollectiveType type, int64_t bytes,
                                       const CommTopology& topology, NcclAlgorithm algorithm,
                                       NcclProtocol protocol) const {
  const NcclModelConfig& c = config_;
  const int a = static_cast<int>(algorithm);
  const int p = static_cast<int>(protocol);
  const Shape s = ShapeOf(topology);
  const bool p2p = IsPointToPoint(type);

  // Which pairs exist: Tree only for all_reduce; p2p runs LL or Simple on ring channels.
  if (algorithm == NcclAlgorithm::kTree && type != CollectiveType::kAllReduce) {
    return Unavailable(algorithm, protocol);
  }
  if (p2p && (algorithm != NcclAlgorithm::kRing || protocol == NcclProtocol::kLL128)) {
    return Unavailable(algorithm, protocol);
  }
  // LL128 only over NVLink, and across nodes only with the NIC on the GPU's PCIe switch
  // (tuning.cc: typeIntra <= PATH_NVB, typeInter <= PATH_PXB).
  if (protocol == NcclProtocol::kLL128 &&
      (topology.fabric == IntraNodeFabric::kPcie || (s.nnodes > 1 && !topology.gpu_direct_rdma))) {
    return Unavailable(algorithm, protocol);
  }

  CollectiveCost cost;
  cost.algorithm = algorithm;
  cost.protocol = protocol;
  if (bytes <= 0) {
    // NCCL returns without launching anything for a zero count.
    cost.channels = 0;
    return cost;
  }
  if (s.nranks == 1) {
    // A 1-rank collective is a local device copy (NCCL's one-rank path); no tuning applies.
    cost.channels = 0;
    if (topology.hbm_bandwidth > 0) {
      cost.algo_bandwidth = topology.hbm_bandwidth / kLocalCopyTrafficFactor;
      cost.duration_ns =
          CeilNs(static_cast<double>(bytes) * kNsPerSecond / cost.algo_bandwidth);
    }
    return cost;
  }

  const int arch = ArchIndex(topology.arch);
  const int nclass = NodeClass(s.nnodes);
  const int32_t nch = c.channels[arch];
  cost.channels = nch;
  const double intra_gbps = UsableIntraBandwidth(c, topology) / kBytesPerSecondPerGbps;
  const double inter_gbps = topology.inter_node_bandwidth / kBytesPerSecondPerGbps;
  const HopLatencyTable& intra_hop = IntraHopLatency(c, topology);
  const double bytes_d = static_cast<double>(bytes);

  if (p2p) {
    const double ll_factor = protocol == NcclProtocol::kLL ? c.ring_ll_bw_factor : 1.0;
    double bw_ns = 0;  // the bandwidth term
    bool remote = false;
    if (type == CollectiveType::kAllToAll) {
      const double per_peer = bytes_d / s.nranks;
      const double local_peers = s.local_ranks - 1;
      const double remote_peers = s.nranks - s.local_ranks;
      remote = remote_peers > 0;
      double local_ns = 0, remote_ns = 0;
      if (local_peers > 0 && intra_gbps > 0) {
        local_ns = local_peers * per_peer / (intra_gbps * ll_factor);
      }
      if (remote && inter_gbps > 0) remote_ns = remote_peers * per_peer / (inter_gbps * ll_factor);
      bw_ns = std::max(local_ns, remote_ns);
    } else {
      remote = s.nnodes > 1;
      const double pair_gbps =
          remote ? inter_gbps
                 : intra_gbps * c.p2p_pair_nvlink_fraction[FabricIndex(topology.fabric)];
      if (pair_gbps > 0) bw_ns = bytes_d / (pair_gbps * ll_factor);
    }
    cost.latency_us = c.base_latency_us[kRing][p] +
                      (remote ? c.network_hop_latency_us[kRing][p] : intra_hop[kRing][p]);
    cost.algo_bandwidth = bw_ns > 0 ? bytes_d / bw_ns * kNsPerSecond : 0;
    cost.duration_ns = CeilNs(cost.latency_us * kNsPerUs + bw_ns);
    return cost;
  }

  // ---- Bus bandwidth of the graph (GB/s): see the file comment.
  double graph_gbps = intra_gbps;
  if (s.nnodes > 1) {
    const double ppn = static_cast<double>(s.nranks) / s.nnodes;
    const double nics_gbps = ppn * inter_gbps;
    graph_gbps = s.local_ranks > 1 ? std::min(intra_gbps, nics_gbps) : nics_gbps;
  }
  const double ll_max = s.nnodes == 1
                            ? c.ll_max_bw_single_node_gbps[arch]
                            : c.ll_max_bw_multi_node_gbps[CpuIndex(topology.cpu_vendor)]
                                                         [s.nnodes <= 2 ? 0 : 1];
  double bus = graph_gbps;
  if (a == kRing && p == kLL) bus = std::min(ll_max, bus * c.ring_ll_bw_factor);
  if (a == kRing && p == kLL128) {
    bus = std::min(bus * c.ring_ll128_bw_factor,
                   nch * c.per_channel_max_ring_ll128_gbps[arch][nclass]);
  }
  if (a == kTree) {
    bus = std::min(bus * c.tree_bw_factor, nch * c.per_channel_max_tree_gbps[arch][nclass]);
  }
  if (a == kTree && p == kLL) bus = std::min(bus * c.tree_ll_bw_factor, ll_max);
  if (a == kTree && p == kLL128) {
    const double f = s.nnodes == 1 ? c.tree_ll128_bw_factor_single_node
                                   : c.tree_ll128_bw_factor_multi_node;
    bus = std::min(bus * f, nch * c.per_channel_max_tree_ll128_gbps[arch][nclass]);
  }

  const int32_t n = s.nranks;
  const int32_t nnodes = s.nnodes;
  const bool all_reduce = type == CollectiveType::kAllReduce;
  const bool gather_scatter =
      type == CollectiveType::kAllGather || type == CollectiveType::kReduceScatter;
  const int32_t nsteps = all_reduce ? 2 * (n - 1) : gather_scatter ? n - 1 : n;
  double algo_gbps =
      a == kRing ? bus * n / nsteps : bus * c.tree_bus_to_algo_ratio;

  // ---- Latency (us).
  double lat = c.base_latency_us[a][p];
  double intra_lat = intra_hop[a][p];
  // "With ppn=1 latencies are fully exposed, use the Tree network latency".
  const double inter_lat =
      n == nnodes ? c.network_hop_latency_us[kTree][p] : c.network_hop_latency_us[a][p];
  if (a == kRing) {
    if (all_reduce || gather_scatter) {
      if (nnodes > 1) {
        const double overhead = c.net_overhead_us[CpuIndex(topology.cpu_vendor)] *
                                (p == kSimple ? c.net_overhead_simple_factor : 1.0);
        intra_lat = std::max(intra_lat, overhead);
      }
      const int32_t inter_steps = nnodes == 1 ? 0 : all_reduce ? 2 * (nnodes - 1) : nnodes - 1;
      lat += (nsteps - inter_steps) * intra_lat + inter_steps * inter_lat;
    } else {
      // Broadcast / reduce: one pipeline through the ring.
      const HopLatencyTable& hop = nnodes == 1 ? intra_hop : c.network_hop_latency_us;
      const bool same_channels = nnodes == 1 && topology.fabric == IntraNodeFabric::kNvSwitch;
      if (same_channels) {
        lat += hop[kRing][p];
      } else {
        // "Add some chunk latency, waiting for proper chunk modeling".
        lat += nsteps * (p == kSimple ? hop[kTree][p] : hop[kRing][p]);
      }
    }
  } else {
    lat += 2 * ((n / nnodes - 1) * intra_lat + Log2i(nnodes) * inter_lat);
  }

  // ---- ncclTopoGetAlgoTime refinements.
  if (a == kTree) {
    const int log_size = Log2i(bytes >> 6);
    if (log_size >= 0 && log_size < kNumTreeCorrectionSizes) {
      algo_gbps *= c.tree_correction_factor[p][log_size];
    }
  }
  // NCCL divides in integers: nBytes / (nChannels * nRanks).
  if (a == kRing && p == kSimple && nnodes > 1 && all_reduce && nch > 0 &&
      static_cast<double>(bytes / (int64_t{nch} * n)) >=
          c.ring_plateau_min_bytes_per_channel_rank) {
    lat *= topology.arch == GpuArch::kVolta ? c.ring_plateau_latency_factor_volta
                                            : c.ring_plateau_latency_factor;
  }

  if (algo_gbps <= 0) return Unavailable(algorithm, protocol);
  cost.latency_us = lat;
  cost.algo_bandwidth = algo_gbps * kBytesPerSecondPerGbps;
  cost.duration_ns = CeilNs(lat * kNsPerUs + bytes_d / algo_gbps);
  return cost;
}

}  // namespace shardscope::sim

// NcclModel::EstimateWith: the time NCCL's model gives one (algorithm, protocol) pair, the
// point-to-point costs, and cluster.network's extra switch hops. The formulas, with the
// tables fields they read, are in nccl_model.cc's file comment.
#include <algorithm>
#include <cmath>
#include <limits>

#include "nccl_model_internal.h"
#include "shardscope/sim/models/nccl_model.h"

namespace shardscope::sim {
namespace {

using namespace nccl_internal;  // NOLINT(build/namespaces): this file's half of the model
using traces::CollectiveType;

// A 1-rank collective copies the buffer once: it is read and written.
constexpr double kLocalCopyTrafficFactor = 2;
// A leaf-to-leaf path through a spine passes two switches more than a path inside one leaf.
constexpr int64_t kExtraSwitchesPerSpineCrossing = 2;

// Which pairs NCCL runs for a function (the "continue"s at the top of ncclTopoTuneModel's
// loops): Tree only all_reduce; NVLS all_reduce, all_gather, reduce_scatter; NVLS-Tree only
// all_reduce; PAT all_gather and reduce_scatter; NVLS, NVLS-Tree and PAT only Simple;
// CollNet never (not modelled).
bool NcclRuns(NcclFunction f, int a, int p) {
  const bool all_reduce = f == NcclFunction::kAllReduce;
  const bool gather_scatter = f == NcclFunction::kAllGather || f == NcclFunction::kReduceScatter;
  switch (static_cast<NcclAlgorithm>(a)) {
    case NcclAlgorithm::kRing: return true;
    case NcclAlgorithm::kTree: return all_reduce;
    case NcclAlgorithm::kNvls: return p == kSimple && (all_reduce || gather_scatter);
    case NcclAlgorithm::kNvlsTree: return p == kSimple && all_reduce;
    case NcclAlgorithm::kPat: return p == kSimple && gather_scatter;
    case NcclAlgorithm::kCollNetDirect:
    case NcclAlgorithm::kCollNetChain: return false;
  }
  return false;
}

// LL128 by default: Volta / Ampere (and Hopper from 2.12) when the node's GPUs talk over
// NVLink and, across nodes, the NIC sits on the GPU's PCIe switch (tuning.cc "Enable LL128
// by default only on ..."; typeIntra <= PATH_NVB, typeInter <= PATH_PXB / PXN). NCCL_PROTO
// naming LL128 forces it (NCCL's enable value 1 skips the check).
bool Ll128Allowed(const NcclModelConfig& c, const CommTopology& t, const Shape& s, NcclFunction f) {
  if (!c.env.proto.empty() && c.env.proto_enabled.Has(f, kLL128)) return true;
  if (t.fabric == IntraNodeFabric::kPcie || (s.nnodes > 1 && !t.gpu_direct_rdma)) return false;
  return t.arch != GpuArch::kHopper || c.tables.ll128_on_hopper;
}

// NVLS / NVLS-Tree: the bus bandwidth and the bus-to-algorithm ratio (0: unavailable).
struct NvlsBandwidth {
  double bus_gbps = 0;
  double algo_ratio = 0;
};

NvlsBandwidth NvlsBusBandwidth(const NcclModelConfig& c, const CommTopology& t, const Shape& s,
                               NcclFunction f, bool tree, double ring_graph_gbps) {
  const NcclTuningTables& tb = c.tables;
  const bool all_reduce = f == NcclFunction::kAllReduce;
  const int32_t n = s.nranks;
  NvlsBandwidth out;
  switch (tb.nvls) {
    case NcclNvlsModel::kNone:
      return out;
    case NcclNvlsModel::kRingGraph:
      // 2.17: graphs[NVLS] is the ring graph, "busBw = min(busBw, 370)" then "ratio = .75".
      out.bus_gbps = ring_graph_gbps;
      out.algo_ratio = tb.nvls_algo_ratio;
      return out;
    case NcclNvlsModel::kMinIntraInter: {
      const NvlsGraph g = NvlsGraphOf(c, t, s);
      if (g.channels < 1) return out;
      const double bw = tree ? std::min(g.bw_intra, s.nnodes <= 2 ? g.bw_inter : g.bw_inter / 2)
                             : std::min(g.bw_intra, g.bw_inter);
      out.bus_gbps = g.channels * bw;
      out.algo_ratio = all_reduce || tb.nvls_ratio_for_gather ? tb.nvls_algo_ratio : 1.0;
      return out;
    }
    case NcclNvlsModel::kEfficiency: {
      const NvlsGraph g = NvlsGraphOf(c, t, s);
      if (g.channels < 2) return out;  // "NVLS/NVLStree needs at least 2 channels"
      const double efficiency = t.arch == GpuArch::kHopper ? tb.nvls_efficiency_hopper : 0;
      double intra = g.bw_intra * efficiency * (g.channels - 1) / g.channels;
      // "AllReduce pipelines two operations"; all_gather / reduce_scatter move (ppn-1)/ppn.
      const double ppn = static_cast<double>(n) / s.nnodes;
      intra *= all_reduce ? 2.0 : (ppn - 1) / ppn;
      const double inter = g.bw_inter * (tree && s.nnodes <= 2 ? 2 : 1);
      double bw = std::min(intra, inter);
      if (tree) bw = std::min(bw, tb.per_channel_max_nvls_tree_gbps[ArchIndex(t.arch)][NodeClass(s.nnodes)]);
      out.bus_gbps = g.channels * bw;
      // Ring, NVLS and NVLS-Tree all_reduce: x nRanks / nsteps; all_gather / reduce_scatter
      // other than Ring: unconverted.
      out.algo_ratio = all_reduce ? static_cast<double>(n) / (2.0 * (n - 1)) : 1.0;
      return out;
    }
  }
  return out;
}

// cluster.network's extra switch latency for the chosen pair (nccl_model.cc's file comment).
int64_t FabricNs(CollectiveType type, NcclAlgorithm algorithm, const CommTopology& t, const Shape& s) {
  const int64_t groups = t.leaf_groups;
  if (groups <= 1 || t.switch_latency_ns <= 0 || s.nnodes <= 1) return 0;
  int64_t crossings = 0;
  if (IsPointToPoint(type)) {
    crossings = 1;
  } else {
    switch (algorithm) {
      case NcclAlgorithm::kRing: {
        const bool all_reduce = type == CollectiveType::kAllReduce;
        const int64_t network_steps = all_reduce ? 2 * (s.nnodes - 1) : s.nnodes - 1;
        crossings = std::min(groups * (all_reduce ? 2 : 1), network_steps);
        break;
      }
      case NcclAlgorithm::kTree:
      case NcclAlgorithm::kNvlsTree: crossings = 2 * CeilLog2(groups); break;
      case NcclAlgorithm::kPat: crossings = CeilLog2(groups); break;
      case NcclAlgorithm::kNvls:
      case NcclAlgorithm::kCollNetDirect:
      case NcclAlgorithm::kCollNetChain: crossings = 0; break;
    }
  }
  return crossings * kExtraSwitchesPerSpineCrossing * t.switch_latency_ns;
}

// send / recv and all_to_all (NCCL does not tune these; enqueue.cc uses LL up to
// NCCL_P2P_LL_THRESHOLD = 16384 bytes per peer and Simple above):
//  - send / recv: base latency + one hop latency (Ring row: NVLink, PCI, or NET when the
//    communicator spans nodes: the peer is then assumed remote), plus bytes over the pair's
//    bandwidth: the per-GPU network share across nodes, otherwise the GPU's usable NVLink
//    bandwidth x p2p_pair_nvlink_fraction (a V100 pair shares one of six links). LL moves
//    data at half of that (8-byte lines carry 4 bytes of data).
//  - all_to_all (S = what one rank sends, S/n per peer): every peer message is in flight at
//    once; the local peers share the GPU's usable NVLink bandwidth and the remote ones its
//    network share, so the bandwidth term is max(local bytes / intra, remote bytes / inter)
//    and the latency is one base + one hop of the slowest kind. This ignores NCCL's
//    scheduling of many peers in rounds (a lower bound on latency for large communicators).
// The latencies are the Ring rows of the range's tables.
constexpr double kLlDataFraction = 0.5;

CollectiveCost EstimatePointToPoint(const NcclModelConfig& c, CollectiveType type, double bytes,
                                    const CommTopology& t, const Shape& s, NcclProtocol protocol) {
  CollectiveCost cost;
  cost.algorithm = NcclAlgorithm::kRing;
  cost.protocol = protocol;
  const int p = static_cast<int>(protocol);
  const double intra_gbps = UsableIntraGbps(c, t);
  const double inter_gbps = t.inter_node_bandwidth / kBytesPerSecondPerGbps;
  const double ll_factor = protocol == NcclProtocol::kLL ? kLlDataFraction : 1.0;
  double bw_ns = 0;  // the bandwidth term
  bool remote = false;
  if (type == CollectiveType::kAllToAll) {
    const double per_peer = bytes / s.nranks;
    const double local_peers = s.local_ranks - 1;
    const double remote_peers = s.nranks - s.local_ranks;
    remote = remote_peers > 0;
    double local_ns = 0, remote_ns = 0;
    if (local_peers > 0 && intra_gbps > 0) local_ns = local_peers * per_peer / (intra_gbps * ll_factor);
    if (remote && inter_gbps > 0) remote_ns = remote_peers * per_peer / (inter_gbps * ll_factor);
    bw_ns = std::max(local_ns, remote_ns);
  } else {
    remote = s.nnodes > 1;
    const double pair_gbps =
        remote ? inter_gbps : intra_gbps * c.p2p_pair_nvlink_fraction[FabricIndex(t.fabric)];
    if (pair_gbps > 0) bw_ns = bytes / (pair_gbps * ll_factor);
  }
  const double hop = c.tables.hw_latency_us[remote ? kHwNet : IntraHw(t)][kRing][p];
  cost.latency_us = c.tables.base_latency_us[kRing][p] + hop;
  cost.algo_bandwidth = bw_ns > 0 ? bytes / bw_ns * kNsPerSecond : 0;
  cost.channels = ChannelsOf(c, t).ring_tree;
  cost.fabric_ns = FabricNs(type, NcclAlgorithm::kRing, t, s);
  cost.duration_ns = CeilNs(cost.latency_us * kNsPerUs + bw_ns) + cost.fabric_ns;
  return cost;
}

}  // namespace

CollectiveCost NcclModel::EstimateWith(CollectiveType type, int64_t bytes, const CommTopology& topology,
                                       NcclAlgorithm algorithm, NcclProtocol protocol) const {
  const NcclModelConfig& c = config_;
  const NcclTuningTables& tb = c.tables;
  const int a = static_cast<int>(algorithm);
  const int p = static_cast<int>(protocol);
  const Shape s = ShapeOf(topology);

  if (IsPointToPoint(type)) {
    // p2p runs LL or Simple on ring channels.
    if (algorithm != NcclAlgorithm::kRing || protocol == NcclProtocol::kLL128) return Unavailable(algorithm, protocol);
    if (bytes <= 0) {
      CollectiveCost zero;
      zero.algorithm = algorithm;
      zero.protocol = protocol;
      return zero;
    }
    return EstimatePointToPoint(c, type, static_cast<double>(bytes), topology, s, protocol);
  }
  NcclFunction f = NcclFunction::kAllReduce;
  NcclFunctionOf(type, &f);
  if (!NcclRuns(f, a, p)) return Unavailable(algorithm, protocol);
  if (protocol == NcclProtocol::kLL128 && !Ll128Allowed(c, topology, s, f)) return Unavailable(algorithm, protocol);
  const bool nvls = algorithm == NcclAlgorithm::kNvls || algorithm == NcclAlgorithm::kNvlsTree;
  if (nvls && !NvlsUsable(tb, topology, s, algorithm == NcclAlgorithm::kNvlsTree)) {
    return Unavailable(algorithm, protocol);
  }
  // ncclPatEnable: NCCL_PAT_ENABLE=1 forces it; 2 (auto) only with one GPU per node.
  if (algorithm == NcclAlgorithm::kPat && (!tb.has_pat || (c.env.pat_enable != 1 && s.nnodes != s.nranks))) {
    return Unavailable(algorithm, protocol);
  }

  CollectiveCost cost;
  cost.algorithm = algorithm;
  cost.protocol = protocol;
  if (bytes <= 0) return cost;  // NCCL returns without launching anything for a zero count
  if (s.nranks == 1) {
    // A 1-rank collective is a local device copy (NCCL's one-rank path); no tuning applies.
    if (topology.hbm_bandwidth > 0) {
      cost.algo_bandwidth = topology.hbm_bandwidth / kLocalCopyTrafficFactor;
      cost.duration_ns = CeilNs(static_cast<double>(bytes) * kNsPerSecond / cost.algo_bandwidth);
    }
    return cost;
  }

  const int arch = ArchIndex(topology.arch);
  const int nclass = NodeClass(s.nnodes);
  const int32_t nch = c.ring_graph_channels[arch];
  const ChannelCounts channels = ChannelsOf(c, topology);
  const bool all_reduce = f == NcclFunction::kAllReduce;
  const bool gather_scatter = f == NcclFunction::kAllGather || f == NcclFunction::kReduceScatter;
  const int32_t n = s.nranks;
  const int32_t nnodes = s.nnodes;
  const int32_t nsteps = all_reduce ? 2 * (n - 1) : gather_scatter ? n - 1 : n;
  const double ppn = static_cast<double>(n) / nnodes;

  // ---- Bus bandwidth (GB/s).
  double bus = GraphGbps(c, topology, s);
  if (tb.arch_bus_bw_cap_gbps[arch] > 0) bus = std::min(bus, tb.arch_bus_bw_cap_gbps[arch]);
  int ll_row = nnodes == 1 ? arch : CpuIndex(topology.cpu_vendor);
  if (nnodes == 1 && tb.ll_max_row_by_sm80) ll_row = topology.arch == GpuArch::kAmpere ? 1 : 0;
  const double ll_max = tb.ll_max_bw_gbps[ll_row][nclass];
  auto cap_ll = [ll_max](double bw) { return ll_max > 0 ? std::min(ll_max, bw) : bw; };
  const double ll128_by_function = tb.ll128_max_bw_by_function_gbps[static_cast<int>(f)];
  double algo_ratio = 1;
  switch (algorithm) {
    case NcclAlgorithm::kRing:
      if (p == kLL) {
        const bool wide = nnodes > 1 || all_reduce || f == NcclFunction::kReduce;
        bus = cap_ll(bus * (wide ? tb.ring_ll_factor : tb.ring_ll_factor_one_node_other));
      } else if (p == kLL128) {
        const double cap = nch * (ll128_by_function > 0 ? ll128_by_function : tb.per_channel_max_ring_ll128_gbps[arch][nclass]);
        bus = std::min(bus * (ppn < 2 ? tb.ring_ll128_factor_one_ppn : tb.ring_ll128_factor), cap);
      }
      algo_ratio = static_cast<double>(n) / nsteps;
      break;
    case NcclAlgorithm::kTree: {
      const double tree_cap = tb.tree_max_bw_gbps[nnodes > 2][topology.arch == GpuArch::kAmpere && p == kLL128];
      bus = std::min(bus * tb.tree_bw_factor, tree_cap > 0 ? tree_cap : nch * tb.per_channel_max_tree_gbps[arch][nclass]);
      if (p == kLL) bus = cap_ll(bus * tb.tree_ll_factor);
      if (p == kLL128) {
        const double per_channel = ll128_by_function > 0 ? ll128_by_function : tb.per_channel_max_tree_ll128_gbps[arch][nclass];
        const double factor = nnodes == 1 ? tb.tree_ll128_factor_single_node : tb.tree_ll128_factor_multi_node;
        bus = std::min(bus * factor, nch * per_channel * tb.tree_ll128_cap_scale);
      }
      algo_ratio = tb.tree_bus_to_algo_ratio;
      break;
    }
    case NcclAlgorithm::kPat:
      bus *= tb.pat_bw_factor;  // the tree graph; all_gather / reduce_scatter unconverted
      break;
    case NcclAlgorithm::kNvls:
    case NcclAlgorithm::kNvlsTree: {
      const NvlsBandwidth nb = NvlsBusBandwidth(c, topology, s, f, algorithm == NcclAlgorithm::kNvlsTree, bus);
      bus = nb.bus_gbps;
      algo_ratio = nb.algo_ratio;
      break;
    }
    case NcclAlgorithm::kCollNetDirect:
    case NcclAlgorithm::kCollNetChain: return Unavailable(algorithm, protocol);
  }
  double algo_gbps = bus * algo_ratio;
  cost.channels = nvls ? channels.nvls : channels.ring_tree;
  algo_gbps *= nvls ? ChannelScale(channels.nvls, channels.nvls_default)
                    : ChannelScale(channels.ring_tree, channels.ring_tree_default);

  // ---- Latency (us).
  const auto& hw = tb.hw_latency_us;
  double lat = tb.base_latency_us[a][p];
  double intra_lat = hw[IntraHw(topology)][a][p];
  if (nnodes > 1 && p == kLL) intra_lat *= tb.multi_node_ll_intra_latency_factor;
  // 2.23+: "With ppn=1 latencies are fully exposed, use the Tree network latency".
  const double inter_lat = tb.ppn1_tree_net_latency && n == nnodes ? hw[kHwNet][kTree][p] : hw[kHwNet][a][p];
  switch (algorithm) {
    case NcclAlgorithm::kRing:
      if (all_reduce || gather_scatter) {
        if (tb.net_overhead_floor && nnodes > 1) {
          const double overhead = c.net_overhead_us[CpuIndex(topology.cpu_vendor)] *
                                  (p == kSimple ? c.net_overhead_simple_factor : 1.0);
          intra_lat = std::max(intra_lat, overhead);
        }
        const int32_t inter_steps = nnodes == 1      ? 0
                                    : !all_reduce    ? nnodes - 1
                                    : tb.all_reduce_inter_steps_2n ? 2 * nnodes
                                                                   : 2 * (nnodes - 1);
        lat += (nsteps - inter_steps) * intra_lat + inter_steps * inter_lat;
      } else {
        // Broadcast / reduce: one pipeline through the ring.
        const int hop_kind = nnodes == 1 ? IntraHw(topology) : kHwNet;
        const bool same_channels = nnodes == 1 && topology.fabric == IntraNodeFabric::kNvSwitch;
        if (same_channels) {
          lat += hw[hop_kind][kRing][p];
        } else {
          // "Add some chunk latency, waiting for proper chunk modeling".
          lat += nsteps * (p == kSimple ? hw[hop_kind][kTree][p] : hw[hop_kind][kRing][p]);
        }
      }
      break;
    case NcclAlgorithm::kTree:
      lat += 2 * ((n / nnodes - 1) * intra_lat + Log2i(nnodes) * inter_lat);
      break;
    case NcclAlgorithm::kNvls:
      // 2.17: baseLat only; later "comm->latencies = intraLat (+ interLat across nodes)".
      if (tb.nvls != NcclNvlsModel::kRingGraph) lat = intra_lat + (nnodes > 1 ? inter_lat : 0);
      break;
    case NcclAlgorithm::kNvlsTree:
      lat += intra_lat + 2 * Log2i(nnodes) * inter_lat;
      break;
    case NcclAlgorithm::kPat:
      lat = tb.pat_base_latency_us + Log2i(nnodes) * (inter_lat / tb.pat_inter_latency_divisor) +
            n * tb.pat_per_rank_latency_us;
      break;
    case NcclAlgorithm::kCollNetDirect:
    case NcclAlgorithm::kCollNetChain: break;
  }

  // ---- ncclTopoGetAlgoTime refinements.
  if (algorithm == NcclAlgorithm::kTree) {
    const int log_size = Log2i(bytes >> 6);
    if (log_size < tb.tree_correction_sizes) algo_gbps *= tb.tree_correction_factor[p][log_size];
  }
  if (algorithm == NcclAlgorithm::kRing && p == kSimple && nnodes > 1 && all_reduce) {
    // 2.19+: "nBytes/(comm->nChannels*comm->nRanks) >= 64" (integer division); before:
    // "nBytes >= nRanks/16.0*65536".
    constexpr int64_t kPlateauBytesPerChannelRank = 64;
    constexpr double kPlateauRanksPerChunk = 16, kPlateauChunkBytes = 65536;
    const bool plateau = tb.plateau_per_channel_rank
                             ? channels.ring_tree > 0 &&
                                   bytes / (int64_t{channels.ring_tree} * n) >= kPlateauBytesPerChannelRank
                             : static_cast<double>(bytes) >= n / kPlateauRanksPerChunk * kPlateauChunkBytes;
    if (plateau) lat *= topology.arch < tb.plateau_arch ? tb.plateau_factor_below : tb.plateau_factor;
  }

  if (algo_gbps <= 0) return Unavailable(algorithm, protocol);
  cost.latency_us = lat;
  cost.algo_bandwidth = algo_gbps * kBytesPerSecondPerGbps;
  cost.fabric_ns = FabricNs(type, algorithm, topology, s);
  cost.duration_ns = CeilNs(lat * kNsPerUs + static_cast<double>(bytes) / algo_gbps) + cost.fabric_ns;
  return cost;
}

}  // namespace shardscope::sim

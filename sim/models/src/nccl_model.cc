// NCCL's tuning model (ncclTopoTuneModel + ncclTopoGetAlgoTime in src/graph/tuning.cc),
// reimplemented over the tables of each release range (nccl_tables.cc).
//
// For a collective of S bytes (nccl-tests' size, see CollectiveOp) NCCL estimates
//   time_us = latency_us + S / (1000 x algBw_GBps)
// and runs the cheapest enabled (algorithm, protocol). With n ranks on N nodes (every
// constant below is a field of NcclTuningTables, named in brackets):
//
//   busBw  = nChannels x per-channel bandwidth of the algorithm's graph, capped by arch
//            [arch_bus_bw_cap_gbps, 2.7-2.17], then
//            Ring LL     min(llMaxBw, busBw x [ring_ll_factor])
//            Ring LL128  min(busBw x [ring_ll128_factor], nChannels x perChMaxRingLL128Bw)
//            Tree        min(busBw x [tree_bw_factor], nChannels x perChMaxTreeBw), then
//              LL        min(busBw x [tree_ll_factor], llMaxBw)
//              LL128     min(busBw x [tree_ll128_factor_*], nChannels x perChMaxTreeLL128Bw)
//            PAT         busBw x [pat_bw_factor] (the tree graph)
//            NVLS        see NvlsBusBandwidth below
//   algBw  = Ring: busBw x n / nsteps   (nsteps: all_reduce 2(n-1); all_gather and
//                                        reduce_scatter n-1; broadcast and reduce n)
//            Tree: busBw x 0.5; NVLS / NVLS-Tree as NvlsBusBandwidth says; PAT and, from
//            2.23, NVLS all_gather / reduce_scatter: busBw (no conversion)
//   latency Ring (all_reduce, all_gather, reduce_scatter):
//              baseLat + (nsteps - nInterSteps) x intraLat + nInterSteps x interLat,
//              nInterSteps = N == 1 ? 0 : all_reduce ? 2(N-1) (2N in 2.17-2.22) : N-1;
//              across nodes intraLat = max(intraLat, netOverhead (x3 for Simple)) from 2.19,
//              and LL's intraLat x 1.8 before
//           Ring (broadcast, reduce): baseLat + hwLat if every channel is the same ring,
//              else baseLat + nsteps x hwLat (Simple then uses the Tree hwLat row)
//           Tree: baseLat + 2 x ((n/N - 1) x intraLat + floor(log2 N) x interLat)
//           NVLS: intraLat (the NVLink NVLS row) on one node (2.17: baseLat)
//           NVLS-Tree: baseLat + intraLat + 2 x floor(log2 N) x interLat
//           PAT: base + floor(log2 N) x interLat / 3.5 + n x 2.8
//            interLat is the NET row of hwLat (from 2.23 the Tree row when N == n).
//   then ncclTopoGetAlgoTime: Tree bw x treeCorrectionFactor[protocol][log2(S/64)], and
//   Ring / Simple all_reduce across nodes: latency x the plateau factor once
//   S / (channels x n) >= 64 (before 2.19: S >= n / 16 x 64 KiB).
//   Tree is only for all_reduce; NVLS for all_reduce, all_gather and reduce_scatter on one
//   node (across nodes it needs CollNet, which is off); NVLS-Tree for all_reduce across
//   nodes; PAT for all_gather / reduce_scatter with one GPU per node (NCCL_PAT_ENABLE=1:
//   any); broadcast and reduce are Ring.
//
// NVLS (src/graph/tuning.cc by release; NvlsBusBandwidth):
//   2.17: the ring graph's busBw x .75, every function, latency baseLat 40 us.
//   2.18-2.26: bw = min(bwIntra, bwInter) of the NVLS graph (NVLS-Tree: bwInter / 2 beyond
//     two nodes), busBw = nChannels x bw, algBw = busBw x 5/6 (all_gather / reduce_scatter
//     unconverted from 2.23).
//   2.27+: intraBw = bwIntra x nvlsEfficiency (Hopper .85) x (nCh-1)/nCh, x 2 for all_reduce
//     ("AllReduce pipelines two operations"), x (ppn-1)/ppn otherwise; interBw = bwInter
//     (x 2 for NVLS-Tree on two nodes); bw = min(intraBw, interBw, perChMaxNVLSTreeBw for
//     NVLS-Tree); busBw = nCh x bw; algBw = busBw x n / nsteps for all_reduce.
//   Enabled on Hopper NVSwitch nodes with more than two of the communicator's GPUs (2.17:
//   more than one), NCCL_NVLS_ENABLE != 0.
//
// What replaces NCCL's topology search (ncclTopoCompute), which we do not run:
//  - The ring / tree graph's bus bandwidth nChannels x bw. On one node it is the GPU's
//    NVLink bandwidth x nvlink_usable_fraction (NCCL counts each NVLink at SMxx_NVLINK_BW,
//    below the 25 GB/s line rate); over PCIe the intra-node bandwidth as given. Across nodes
//    each channel of a ring or tree leaves and enters every node through one NIC, and the
//    channels are spread over the NICs of the members' GPUs, so the graph carries
//    min(intra, (n/N) x per-GPU network share); with one GPU per node, the network share.
//    (NCCL uses the graph's bwIntra for N <= 2; ring graphs across nodes have bwIntra ==
//    bwInter, and the raised bwIntra of 2-node trees is not modelled.)
//  - The ring graph's channel count (ring_graph_channels, by arch), derived by hand from
//    ncclTopoCompute on a fully populated node: Volta hybrid cube mesh 6 rings at
//    SM70_NVLINK_BW = 20 GB/s (one per NVLink); A100 NVSwitch 6 x 40 GB/s
//    (speedArrayIntra[0]) fills the 12 x 20 = 240 GB/s, then ncclTopoDupChannels doubles
//    to 12 x 20; H100 NVSwitch 6 x 60 GB/s (sm90SpeedArrayIntra[0], 6 x 60 <= 18 x 20.6 =
//    370.8 GB/s), doubled to 12 x 30. Multi-node graphs are assumed to keep the count.
//    Execution channels are twice that (ncclTopoPostset: "nChannels = comm->nChannels =
//    std::min(MAXCHANNELS,nChannels*2)"), then NCCL_MAX_NCHANNELS, then NCCL_MIN_NCHANNELS
//    (copyChannels): 24 on DGX A100 / H100, as their NCCL_DEBUG logs print ("Channel
//    00/24"). NvlsGraphOf replays the NVLS search (nvls channels: NCCL_NVLS_NCHANNELS, 16).
//  - NCCL_MAX_NCHANNELS below the default scales the bandwidth by channels used / channels
//    the communicator has, the rule 2.17-2.22's ncclTopoGetAlgoTime applied to an operation
//    on fewer channels ("bw = bw / comm->nChannels * info->nChannels"); more channels than
//    the default add none (duplicated channels share the links). NCCL_NVLS_NCHANNELS scales
//    NVLS the same way (ASSUMPTION).
//  - Trees are NCCL_TOPO_PATTERN_BALANCED_TREE (no extra x0.85 of the plain TREE pattern);
//    graph latencyInter (extra NIC latency) is 0; ring channels are all the same ring
//    (sameChannels) only on a single NVSwitch node.
//  - LL128 is enabled as in NCCL (Volta/Ampere, and Hopper from 2.12) when the GPUs of a
//    node talk over NVLink and, across nodes, the NIC is reachable through a PCIe switch
//    (GPUDirect RDMA); NCCL_PROTO naming LL128 forces it on, as NCCL's enable value 1 does.
//  - The CPU vendor picks the multi-node LL cap and getNetOverhead (Intel 1 us, AMD 2 us).
//
// Point-to-point (NCCL does not tune these; enqueue.cc uses LL for messages up to
// NCCL_P2P_LL_THRESHOLD = 16384 bytes and Simple above): see EstimatePointToPoint.
//
// cluster.network (FabricNs): ASSUMPTION that NCCL's NET hop latency covers one switch (two
// nodes on one leaf, the smallest fabric it can have been measured on); every network step
// of the chosen algorithm that crosses leaf groups passes two more switches (spine and the
// far leaf), each cluster.network.switch_latency_ns. Ring (and broadcast / reduce): one
// crossing per leaf group per revolution, at most the algorithm's network steps; Tree and
// NVLS-Tree: 2 x ceil(log2 groups) (the tree's upper levels span groups, up and down); PAT:
// ceil(log2 groups); send / recv and all_to_all: one. PXN (NCCL's default since 2.12) keeps
// traffic on its rail, so rails are not crossed. Not modelled: three-tier (core) fabrics,
// congestion, adaptive routing.
#include "shardscope/sim/models/nccl_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "nccl_model_internal.h"

namespace shardscope::sim {

using traces::CollectiveType;

namespace nccl_internal {

Shape ShapeOf(const CommTopology& t) {
  Shape s;
  s.nranks = std::max(t.nranks, 1);
  s.nnodes = std::clamp(t.nnodes, 1, s.nranks);
  s.local_ranks = s.nnodes == 1 ? s.nranks : std::clamp(t.ranks_per_node, 1, s.nranks);
  return s;
}

// GB/s of the GPU's NVLink (or PCIe) bandwidth NCCL's graphs can use inside a node.
double UsableIntraGbps(const NcclModelConfig& c, const CommTopology& t) {
  const double bytes = t.fabric == IntraNodeFabric::kPcie
                           ? t.intra_node_bandwidth
                           : t.intra_node_bandwidth * c.nvlink_usable_fraction[ArchIndex(t.arch)];
  return bytes / kBytesPerSecondPerGbps;
}

// The ring / tree graph's bus bandwidth, GB/s (see the file comment).
double GraphGbps(const NcclModelConfig& c, const CommTopology& t, const Shape& s) {
  const double intra = UsableIntraGbps(c, t);
  if (s.nnodes == 1) return intra;
  const double inter = t.inter_node_bandwidth / kBytesPerSecondPerGbps;
  const double nics = static_cast<double>(s.nranks) / s.nnodes * inter;
  return s.local_ranks > 1 ? std::min(intra, nics) : nics;
}

// The NVLS graph (search.cc ncclTopoCompute with NCCL_TOPO_PATTERN_NVLS, replayed): one
// channel per local GPU, each GPU the head of one; ncclTopoSearchTryNvls charges the head
// twice its bandwidth and every other GPU once, in both directions, so c channels at speed s
// need (c + 1) x s of a GPU's NVLink bandwidth B. On one node the channel count is forced to
// the GPU count and bwIntra is the fastest speed of sm90SpeedArrayIntra that fits; pass 2
// then raises bwInter while it is below 2 x bwIntra (no NIC bounds it). Across nodes the
// search walks sm90SpeedArrayInter below the NIC's bandwidth, keeps the graph with the most
// channels, then raises bwInter the same way up to the NIC.
NvlsGraph NvlsGraphOf(const NcclModelConfig& c, const CommTopology& t, const Shape& s) {
  NvlsGraph g;
  const double budget = UsableIntraGbps(c, t);
  const int32_t gpus = s.local_ranks;
  const bool one_node = s.nnodes == 1;
  const std::vector<double>& speeds = one_node ? c.sm90_speeds_intra_gbps : c.sm90_speeds_inter_gbps;
  const double cap = one_node ? budget : t.inter_node_bandwidth / kBytesPerSecondPerGbps;
  // search.cc "speedArray[speedIndex+1]/graph->bwInter > .49": keep lowering the speed while
  // the next one is more than about half the best found.
  constexpr double kLowerWhileAbove = 0.49;
  size_t best = speeds.size();
  for (size_t i = 0; i < speeds.size(); ++i) {
    const double speed = speeds[i];
    if (speed > cap) continue;
    if (best < speeds.size() && speed / speeds[best] <= kLowerWhileAbove) break;
    const int32_t fit = static_cast<int32_t>(std::floor(budget / speed + 1e-9)) - 1;
    const int32_t channels = std::min(gpus, fit);
    if (channels < 1 || (one_node && channels < gpus)) continue;
    if (best == speeds.size() || channels > g.channels || channels * speed > g.channels * g.bw_intra) {
      best = i;
      g.channels = channels;
      g.bw_intra = speed;
    }
  }
  if (best == speeds.size()) return NvlsGraph{};
  g.bw_inter = g.bw_intra;
  for (size_t i = best; i > 0 && g.bw_inter < 2 * g.bw_intra && speeds[i - 1] <= cap; --i) {
    g.bw_inter = speeds[i - 1];
  }
  return g;
}

bool NvlsUsable(const NcclTuningTables& tables, const CommTopology& t, const Shape& s, bool tree) {
  if (tables.nvls == NcclNvlsModel::kNone) return false;
  if (t.arch != GpuArch::kHopper || t.fabric != IntraNodeFabric::kNvSwitch) return false;
  if (s.local_ranks <= tables.nvls_min_local_ranks) return false;
  if (tree) return tables.has_nvls_tree && s.nnodes > 1;
  return s.nnodes == 1;  // across nodes NVLS needs CollNet, which is off
}

ChannelCounts ChannelsOf(const NcclModelConfig& c, const CommTopology& t) {
  ChannelCounts ch;
  const int32_t max_channels = c.tables.max_channels;
  ch.ring_tree_default = std::min(max_channels, 2 * c.ring_graph_channels[ArchIndex(t.arch)]);
  ch.ring_tree = ch.ring_tree_default;
  if (c.env.max_nchannels > 0) ch.ring_tree = std::min(ch.ring_tree, c.env.max_nchannels);
  if (c.env.min_nchannels > 0) ch.ring_tree = std::max(ch.ring_tree, std::min(c.env.min_nchannels, max_channels));
  ch.nvls_default = c.nvls_default_channels;
  ch.nvls = c.env.nvls_nchannels > 0 ? c.env.nvls_nchannels : ch.nvls_default;
  if (c.env.max_nchannels > 0) ch.nvls = std::min(ch.nvls, c.env.max_nchannels);
  return ch;
}

double ChannelScale(int32_t used, int32_t by_default) {
  return by_default > 0 ? std::min(1.0, static_cast<double>(used) / by_default) : 1.0;
}

}  // namespace nccl_internal

namespace {

using nccl_internal::ArchIndex;
using nccl_internal::ChannelCounts;
using nccl_internal::ChannelsOf;
using nccl_internal::CpuIndex;
using nccl_internal::FabricIndex;
using nccl_internal::IsPointToPoint;
using nccl_internal::kSimple;
using nccl_internal::kNsPerSecond;
using nccl_internal::kNsPerUs;
using nccl_internal::NvlsUsable;
using nccl_internal::Shape;
using nccl_internal::ShapeOf;
using nccl_internal::Unavailable;

}  // namespace

bool NcclFunctionOf(CollectiveType type, NcclFunction* function) {
  switch (type) {
    case CollectiveType::kBroadcast: *function = NcclFunction::kBroadcast; return true;
    case CollectiveType::kReduce: *function = NcclFunction::kReduce; return true;
    case CollectiveType::kAllGather: *function = NcclFunction::kAllGather; return true;
    case CollectiveType::kReduceScatter: *function = NcclFunction::kReduceScatter; return true;
    case CollectiveType::kAllReduce: *function = NcclFunction::kAllReduce; return true;
    default: return false;
  }
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
  int32_t last_group = -1;
  const int32_t per_leaf = cluster.network.nodes_per_leaf;
  t.leaf_groups = 0;
  for (size_t i = 0; i < nodes.size();) {
    size_t j = i;
    while (j < nodes.size() && nodes[j] == nodes[i]) ++j;
    ++t.nnodes;
    t.ranks_per_node = std::max(t.ranks_per_node, static_cast<int32_t>(j - i));
    const int32_t group = per_leaf > 0 ? nodes[i] / per_leaf : 0;
    if (group != last_group) ++t.leaf_groups;  // nodes are sorted, so groups come in order
    last_group = group;
    i = j;
  }
  if (t.nnodes == 0) {  // empty communicator: the 1-rank defaults
    t.nnodes = 1;
    t.ranks_per_node = 1;
    t.leaf_groups = 1;
  }
  t.switch_latency_ns = per_leaf > 0 ? cluster.network.switch_latency_ns : 0;
  t.arch = cluster.gpu.arch;
  t.fabric = cluster.fabric;
  t.intra_node_bandwidth = cluster.intra_node_bandwidth;
  t.inter_node_bandwidth = cluster.inter_node_bandwidth;
  t.cpu_vendor = cluster.cpu_vendor;
  t.gpu_direct_rdma = cluster.gpu_direct_rdma;
  t.hbm_bandwidth = cluster.gpu.hbm_bandwidth;
  return t;
}

NcclModelConfig NcclModelConfig::For(const NcclEnv& env) {
  NcclModelConfig c;
  c.tables = NcclTuningTablesFor(env.version);
  c.env = env;

  // Ring graph search channels: ASSUMPTION derived from ncclTopoCompute by hand (see the
  // file comment).
  c.ring_graph_channels[ArchIndex(GpuArch::kVolta)] = 6;
  c.ring_graph_channels[ArchIndex(GpuArch::kAmpere)] = 12;
  c.ring_graph_channels[ArchIndex(GpuArch::kHopper)] = 12;

  // NCCL's per-link NVLink bandwidth (src/graph/topo.h SM70_NVLINK_BW 20.0, SM80_NVLINK_BW
  // 20.0, SM90_NVLINK_BW 20.6 GB/s) over the per-link, per-direction line rate of NVLink 2,
  // 3 and 4 (25 GB/s: V100, A100 and H100 architecture whitepapers). NCCL_DEBUG=INFO's
  // topology dump of an H100 prints the 18 links as "NVL[370.8]" (NVIDIA/nccl issue #1189).
  constexpr double kNvlinkLineRateGbps = 25.0;
  c.nvlink_usable_fraction[ArchIndex(GpuArch::kVolta)] = 20.0 / kNvlinkLineRateGbps;
  c.nvlink_usable_fraction[ArchIndex(GpuArch::kAmpere)] = 20.0 / kNvlinkLineRateGbps;
  c.nvlink_usable_fraction[ArchIndex(GpuArch::kHopper)] = 20.6 / kNvlinkLineRateGbps;

  // src/transport/nvls.cc NCCL_PARAM(NvlsChannels, "NVLS_NCHANNELS", 16) (2.17-2.24; later
  // releases leave the default to the platform, ASSUMPTION 16 on Hopper: NCCL_DEBUG logs of
  // H100 jobs print "16 nvls channels", e.g. deepseek-ai/DeepEP issue #106).
  c.nvls_default_channels = 16;
  // src/graph/search.cc (2.24.3): sm90SpeedArrayIntra[] = { 60.0, 50.0, 40.0, 30.0, 24.0,
  // 20.0, 15.0, 12.0, 11.0, 6.0, 3.0 }; sm90SpeedArrayInter[] = { 48.0, 45.0, 42.0, 40.0,
  // 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12 }.
  c.sm90_speeds_intra_gbps = {60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0};
  c.sm90_speeds_inter_gbps = {48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5,
                              15.0, 12.0, 6.0,  3.0,  2.4,  1.2,  0.24, 0.12};

  // getNetOverhead: x86 Intel 1.0 us, x86 AMD 2.0 us; "if (p == NCCL_PROTO_SIMPLE)
  // netOverhead *= 3".
  c.net_overhead_us[CpuIndex(CpuVendor::kIntel)] = 1.0;
  c.net_overhead_us[CpuIndex(CpuVendor::kAmd)] = 2.0;
  c.net_overhead_simple_factor = 3;

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

NcclModelConfig NcclModelConfig::Default() { return For(NcclEnv{}); }

NcclChannels NcclChannelsFor(const NcclModelConfig& config, const CommTopology& topology) {
  NcclChannels out;
  if (topology.nranks <= 1) return out;  // no peers: no connections, no buffers
  const Shape s = ShapeOf(topology);
  const ChannelCounts ch = ChannelsOf(config, topology);
  out.search = config.ring_graph_channels[ArchIndex(topology.arch)];
  out.ring_tree = ch.ring_tree;
  const bool nvls = config.env.nvls_enable != 0 &&
                    (NvlsUsable(config.tables, topology, s, /*tree=*/false) ||
                     NvlsUsable(config.tables, topology, s, /*tree=*/true));
  out.nvls = nvls ? ch.nvls : 0;
  return out;
}

NcclModel::NcclModel(NcclModelConfig config) : config_(std::move(config)) {}

bool NcclModel::Enabled(NcclFunction function, NcclAlgorithm algorithm, NcclProtocol protocol) const {
  const NcclEnv& env = config_.env;
  const int a = static_cast<int>(algorithm);
  if (!env.proto.empty() && !env.proto_enabled.Has(function, static_cast<int>(protocol))) return false;
  if (algorithm == NcclAlgorithm::kCollNetDirect || algorithm == NcclAlgorithm::kCollNetChain) return false;
  if ((algorithm == NcclAlgorithm::kNvls || algorithm == NcclAlgorithm::kNvlsTree) && env.nvls_enable == 0) {
    return false;
  }
  if (algorithm == NcclAlgorithm::kPat && env.pat_enable == 0) return false;
  switch (config_.tables.algo_scope) {
    case NcclAlgoScope::kAllReduceOnly:
      return function != NcclFunction::kAllReduce || env.algo_enabled.Has(function, a);
    case NcclAlgoScope::kRingAlwaysElsewhere:
      if (algorithm == NcclAlgorithm::kRing && function != NcclFunction::kAllReduce) return true;
      return env.algo_enabled.Has(function, a);
    case NcclAlgoScope::kRingBackup:
    case NcclAlgoScope::kStrict:
      return env.algo_enabled.Has(function, a);
  }
  return true;
}

bool NcclModel::AnyEnabled(CollectiveType type, const CommTopology& topology) const {
  NcclFunction f;
  if (!NcclFunctionOf(type, &f) || topology.nranks <= 1) return true;
  for (int a = 0; a < kNumNcclAlgorithms; ++a) {
    for (int p = 0; p < kNumNcclProtocols; ++p) {
      const auto algorithm = static_cast<NcclAlgorithm>(a);
      const auto protocol = static_cast<NcclProtocol>(p);
      if (Enabled(f, algorithm, protocol) && EstimateWith(type, 1, topology, algorithm, protocol).available) {
        return true;
      }
    }
  }
  return false;
}

CollectiveCost NcclModel::Estimate(CollectiveType type, int64_t bytes,
                                   const CommTopology& topology) const {
  CollectiveCost cost = Cheapest(type, bytes, topology, /*honour_knobs=*/true);
  // Nothing the knobs leave can run: NCCL 2.18-2.22 restores Ring ("at least set ring algo
  // available"), older releases never disable it outside all_reduce; 2.23+ refuses the call
  // (CheckNcclChoices, cost_provider.h, reports it before a simulation starts).
  if (!cost.available) cost = Cheapest(type, bytes, topology, /*honour_knobs=*/false);
  return cost;
}

CollectiveCost NcclModel::Cheapest(CollectiveType type, int64_t bytes, const CommTopology& topology,
                                   bool honour_knobs) const {
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
  NcclFunction f = NcclFunction::kAllReduce;
  NcclFunctionOf(type, &f);
  CollectiveCost best = Unavailable(NcclAlgorithm::kRing, NcclProtocol::kSimple);
  double best_ns = std::numeric_limits<double>::infinity();
  // NCCL's loop order (algorithms, then protocols); the first strictly cheaper pair wins.
  for (int a = 0; a < kNumNcclAlgorithms; ++a) {
    for (int p = 0; p < kNumNcclProtocols; ++p) {
      const auto algorithm = static_cast<NcclAlgorithm>(a);
      const auto protocol = static_cast<NcclProtocol>(p);
      // Without the knobs only Ring is a fallback.
      if (honour_knobs ? !Enabled(f, algorithm, protocol) : algorithm != NcclAlgorithm::kRing) continue;
      CollectiveCost cost = EstimateWith(type, bytes, topology, algorithm, protocol);
      if (!cost.available) continue;
      // Compare the unrounded times, as NCCL does (the fabric's hops are not in its model).
      const double ns = cost.latency_us * kNsPerUs +
                        (cost.algo_bandwidth > 0
                             ? static_cast<double>(bytes) * kNsPerSecond / cost.algo_bandwidth
                             : 0);
      if (ns < best_ns) {
        best_ns = ns;
        best = cost;
      }
    }
  }
  return best;
}

}  // namespace shardscope::sim

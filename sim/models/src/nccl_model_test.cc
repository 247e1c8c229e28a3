// Tests for the NCCL cost model. Every expected time is worked out by hand from the formulas
// in nccl_model.cc and the tables of nccl_tables.cc (NCCL's tuning.cc of each release); the
// arithmetic is in the comments. Times are ceil()ed to whole ns, so EXPECT_NEAR(.., 1).
//
// Figures used throughout (dgx-h100): usable NVLink = 450 GB/s x 20.6/25 = 370.8 GB/s;
// 12 ring-graph channels, 24 execution channels; network share 50 GB/s per GPU; Intel CPU
// (net overhead 1 us). NVLS graph on one node: 8 channels, bwIntra 40 (9 x 40 <= 370.8 <
// 9 x 50), bwInter 60; across nodes: 8 channels, bwIntra 40, bwInter 48.
// One GB/s is one byte per ns, so bytes / (GB/s) is ns.
#include "shardscope/sim/models/nccl_model.h"

#include <gtest/gtest.h>

#include <limits>
#include <numeric>
#include <string_view>
#include <utility>
#include <vector>

namespace shardscope::sim {
namespace {

using traces::CollectiveType;

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * kKiB;
constexpr int64_t kGiB = 1024 * kMiB;

std::vector<int32_t> Iota(int32_t n, int32_t stride = 1) {
  std::vector<int32_t> ranks(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) ranks[static_cast<size_t>(i)] = i * stride;
  return ranks;
}

CommTopology Topology(std::string_view preset, int32_t nodes, int32_t nranks, int32_t stride = 1) {
  auto cluster = FindClusterPreset(preset, nodes);
  EXPECT_TRUE(cluster.ok());
  return TopologyOf(cluster.value(), Iota(nranks, stride));
}

NcclEnv Env(NcclVersion version) {
  NcclEnv env;
  env.version = version;
  return env;
}

NcclModel Model(NcclVersion version) { return NcclModel(NcclModelConfig::For(Env(version))); }

constexpr NcclVersion k2_14{2, 14, 3};
constexpr NcclVersion k2_17{2, 17, 1};
constexpr NcclVersion k2_21{2, 21, 5};
constexpr NcclVersion k2_24{2, 24, 3};
constexpr NcclVersion k2_28{2, 28, 9};

TEST(NcclTablesTest, ReleasesFallInTheirRanges) {
  EXPECT_EQ(NcclTuningTablesFor({2, 7, 8}).name, "2.7");
  EXPECT_EQ(NcclTuningTablesFor({2, 9, 8}).name, "2.8");
  EXPECT_EQ(NcclTuningTablesFor({2, 10, 3}).name, "2.8");
  EXPECT_EQ(NcclTuningTablesFor(k2_14).name, "2.12");
  EXPECT_EQ(NcclTuningTablesFor(k2_17).name, "2.17");
  EXPECT_EQ(NcclTuningTablesFor({2, 18, 1}).name, "2.20");
  EXPECT_EQ(NcclTuningTablesFor(k2_21).name, "2.20");
  EXPECT_EQ(NcclTuningTablesFor({2, 23, 4}).name, "2.24");
  EXPECT_EQ(NcclTuningTablesFor({2, 26, 2}).name, "2.24");
  EXPECT_EQ(NcclTuningTablesFor({2, 27, 3}).name, "2.28");
  EXPECT_EQ(NcclTuningTablesFor(k2_28).name, "2.28");
  EXPECT_EQ(NcclTuningTablesFor({2, 31, 0}).name, "2.28");
  // Oldest first, each range after the one before.
  const auto all = AllNcclTuningTables();
  for (size_t i = 1; i < all.size(); ++i) EXPECT_LT(all[i - 1].first, all[i].first);
}

TEST(NcclTablesTest, TablesAreEachReleases) {
  constexpr int kT = 0, kR = 1, kNv = 4, kNt = 5, kLL = 0, kLL128 = 1, kS = 2, kNvlink = 0, kNet = 2;
  const NcclTuningTables& t27 = NcclTuningTablesFor({2, 7, 8});
  EXPECT_DOUBLE_EQ(t27.base_latency_us[kR][kLL], 3.6);
  EXPECT_DOUBLE_EQ(t27.hw_latency_us[kNet][kT][kS], 50);
  EXPECT_DOUBLE_EQ(t27.ll128_max_bw_by_function_gbps[4], 16.7);
  EXPECT_EQ(t27.algo_scope, NcclAlgoScope::kAllReduceOnly);
  const NcclTuningTables& t217 = NcclTuningTablesFor(k2_17);
  EXPECT_DOUBLE_EQ(t217.base_latency_us[kNv][kS], 40.0);
  EXPECT_DOUBLE_EQ(t217.arch_bus_bw_cap_gbps[2], 370);
  const NcclTuningTables& t220 = NcclTuningTablesFor(k2_21);
  EXPECT_DOUBLE_EQ(t220.base_latency_us[kT][kS], 0);
  EXPECT_DOUBLE_EQ(t220.hw_latency_us[kNvlink][kT][kS], 28);
  EXPECT_DOUBLE_EQ(t220.hw_latency_us[kNvlink][kNv][kS], 23);
  EXPECT_DOUBLE_EQ(t220.ring_ll_factor, 0.25);
  const NcclTuningTables& t224 = NcclTuningTablesFor(k2_24);
  EXPECT_DOUBLE_EQ(t224.base_latency_us[kT][kLL], 6.8);
  EXPECT_DOUBLE_EQ(t224.base_latency_us[kR][kLL128], 14.0);
  EXPECT_DOUBLE_EQ(t224.base_latency_us[kT][kS], 8.4);
  EXPECT_DOUBLE_EQ(t224.hw_latency_us[kNvlink][kT][kS], 4.0);
  EXPECT_DOUBLE_EQ(t224.hw_latency_us[kNvlink][kR][kLL128], 1.9);
  EXPECT_DOUBLE_EQ(t224.hw_latency_us[kNet][kT][kS], 14.0);
  EXPECT_DOUBLE_EQ(t224.hw_latency_us[kNet][kR][kLL], 2.7);
  EXPECT_DOUBLE_EQ(t224.hw_latency_us[1][kR][kS], 5.7);
  EXPECT_DOUBLE_EQ(t224.ll_max_bw_gbps[2][0], 141.0);
  EXPECT_DOUBLE_EQ(t224.per_channel_max_ring_ll128_gbps[2][0], 36.7);
  EXPECT_DOUBLE_EQ(t224.per_channel_max_tree_gbps[1][2], 17.8);
  EXPECT_DOUBLE_EQ(t224.tree_correction_factor[kS][11], 0.5);
  EXPECT_DOUBLE_EQ(t224.pat_bw_factor, 0.75);
  const NcclTuningTables& t228 = NcclTuningTablesFor(k2_28);
  EXPECT_DOUBLE_EQ(t228.hw_latency_us[kNet][kNt][kS], 20.9);
  EXPECT_DOUBLE_EQ(t228.nvls_efficiency_hopper, 0.85);
  EXPECT_DOUBLE_EQ(t228.per_channel_max_nvls_tree_gbps[2][1], 57.7);
  EXPECT_EQ(NcclModelConfig::For(Env(k2_24)).p2p_ll_threshold_bytes, 16384);
}

TEST(NcclModelTest, TopologyOfCountsNodesAndLeafGroups) {
  auto cluster = FindClusterPreset("dgx-h100", 4);
  ASSERT_TRUE(cluster.ok());
  CommTopology t = TopologyOf(*cluster, Iota(16));
  EXPECT_EQ(t.nranks, 16);
  EXPECT_EQ(t.nnodes, 2);
  EXPECT_EQ(t.ranks_per_node, 8);
  EXPECT_EQ(t.arch, GpuArch::kHopper);
  EXPECT_DOUBLE_EQ(t.intra_node_bandwidth, 450e9);
  EXPECT_DOUBLE_EQ(t.inter_node_bandwidth, 50e9);
  EXPECT_DOUBLE_EQ(t.hbm_bandwidth, 3350e9);
  EXPECT_EQ(t.leaf_groups, 1);
  t = TopologyOf(*cluster, {0, 8, 16, 24});  // one rank per node (a DP group across nodes)
  EXPECT_EQ(t.nnodes, 4);
  EXPECT_EQ(t.ranks_per_node, 1);
  t = TopologyOf(*cluster, {9, 3, 4, 5});
  EXPECT_EQ(t.nnodes, 2);
  EXPECT_EQ(t.ranks_per_node, 3);
  // Two nodes per leaf group: nodes 0-1 and 2-3.
  cluster->network = NetworkTiers{2, 100};
  t = TopologyOf(*cluster, {0, 8, 16, 24});
  EXPECT_EQ(t.leaf_groups, 2);
  EXPECT_EQ(t.switch_latency_ns, 100);
  t = TopologyOf(*cluster, Iota(16));
  EXPECT_EQ(t.leaf_groups, 1);
}

// Worked example 1 (NCCL 2.24): 8 ranks on one DGX H100, all_reduce of 1 GiB, Ring / Simple.
//   busBw = 370.8 GB/s (Simple: no protocol factor)
//   algBw = busBw x n / nsteps = 370.8 x 8 / 14 = 211.885714 GB/s
//   latency = baseLat 8.4 + (nsteps 14 - 0 inter steps) x NVLink Ring/Simple 3.4 = 56.0 us
//   time = 56,000 ns + 1,073,741,824 / 211.885714 = 56,000 + 5,067,551.76 = 5,123,551.76 ns
// NCCL picks NVLS (example 2), not Ring.
TEST(NcclModelTest, SingleNodeAllReduceRingSimple) {
  const NcclModel model = Model(k2_24);
  const CommTopology t = Topology("dgx-h100", 1, 8);
  const CollectiveCost c =
      model.EstimateWith(CollectiveType::kAllReduce, kGiB, t, NcclAlgorithm::kRing, NcclProtocol::kSimple);
  ASSERT_TRUE(c.available);
  EXPECT_DOUBLE_EQ(c.latency_us, 56.0);
  EXPECT_NEAR(c.algo_bandwidth, 211.885714e9, 1e3);
  EXPECT_EQ(c.channels, 24);
  EXPECT_NEAR(c.duration_ns, 5123552, 1);
  // Competitors at 1 GiB: Tree/Simple busBw = min(370.8 x 0.92, 12 x 38.7) = 341.136,
  // algBw 170.568, latency 8.4 + 2 x 7 x 4.0 = 64.4 us -> 6.36 ms; Ring/LL128 algBw
  // 341.136 x 8/14 = 194.9 -> 5.55 ms; Ring/LL capped at 141 GB/s.
  EXPECT_EQ(model.Estimate(CollectiveType::kAllReduce, kGiB, t).algorithm, NcclAlgorithm::kNvls);
}

// Worked example 2: NVLS all_reduce of 1 GiB on one DGX H100 (8 GPUs), by release.
//   2.28: intraBw = bwIntra 40 x nvlsEfficiency 0.85 x (8-1)/8 x 2 (all_reduce) = 59.5;
//         bw = min(59.5, bwInter 60) = 59.5; busBw = 8 channels x 59.5 = 476 GB/s;
//         algBw = 476 x 8 / 14 = 272.0 GB/s; latency = NVLink NVLS hwLat 25 us;
//         time = 25,000 + 1,073,741,824 / 272 = 25,000 + 3,947,580.24 = 3,972,580.24 ns;
//         nccl-tests busbw = algBw x 2(n-1)/n = 272 x 14/8 = 476 GB/s.
//   2.24: bw = min(40, 60) = 40; busBw 320; algBw = 320 x 5/6 = 266.67; latency 25 us;
//         time = 25,000 + 4,026,531.84 = 4,051,531.84 ns.
//   2.21 (2.20's tables): as 2.24 with hwLat 23 us: 4,049,531.84 ns.
//   2.17: the ring graph's 370.8 capped at 370, x .75 = 277.5 GB/s; latency baseLat 40 us:
//         40,000 + 3,869,339.91 = 3,909,339.91 ns.
// Ring/Simple is 5,123,551.76 ns (example 1): NVLS wins in every release that has it.
TEST(NcclModelTest, NvlsAllReduceOnEightH100) {
  const CommTopology t = Topology("dgx-h100", 1, 8);
  struct Case {
    NcclVersion version;
    double latency_us, algo_gbps;
    int64_t duration_ns;
  };
  for (const Case& c : {Case{k2_28, 25, 272.0, 3972581}, Case{k2_24, 25, 266.666667, 4051532},
                        Case{k2_21, 23, 266.666667, 4049532}, Case{k2_17, 40, 277.5, 3909340}}) {
    const CollectiveCost cost = Model(c.version).Estimate(CollectiveType::kAllReduce, kGiB, t);
    EXPECT_EQ(cost.algorithm, NcclAlgorithm::kNvls) << c.version.ToString();
    EXPECT_EQ(cost.protocol, NcclProtocol::kSimple);
    EXPECT_EQ(cost.channels, 16) << "NCCL_NVLS_NCHANNELS' default";
    EXPECT_NEAR(cost.latency_us, c.latency_us, 1e-9) << c.version.ToString();
    EXPECT_NEAR(cost.algo_bandwidth, c.algo_gbps * 1e9, 1e3) << c.version.ToString();
    EXPECT_NEAR(cost.duration_ns, c.duration_ns, 1) << c.version.ToString();
  }
  // NVLS needs Hopper and an NVSwitch: none on DGX A100.
  EXPECT_FALSE(Model(k2_28)
                   .EstimateWith(CollectiveType::kAllReduce, kGiB, Topology("dgx-a100", 1, 8), NcclAlgorithm::kNvls,
                                 NcclProtocol::kSimple)
                   .available);
  // ... and more than two of the node's GPUs from 2.18 on (2.17: more than one).
  const CommTopology pair = Topology("dgx-h100", 1, 2);
  EXPECT_FALSE(Model(k2_28).EstimateWith(CollectiveType::kAllReduce, kGiB, pair, NcclAlgorithm::kNvls,
                                         NcclProtocol::kSimple).available);
  EXPECT_TRUE(Model(k2_17).EstimateWith(CollectiveType::kAllReduce, kGiB, pair, NcclAlgorithm::kNvls,
                                        NcclProtocol::kSimple).available);
  // NVLS all_gather exists but loses to Ring on one node (2.24: busBw 320 unconverted against
  // Ring's 370.8 x 8/7 = 423.8 GB/s).
  EXPECT_EQ(Model(k2_24).Estimate(CollectiveType::kAllGather, kGiB, t).algorithm, NcclAlgorithm::kRing);
}

// Worked example 3 (NCCL 2.28): NVLS-Tree all_reduce of 1 GiB on two DGX H100 nodes (16 ranks).
//   NVLS graph across nodes: 8 channels, bwIntra 40, bwInter 48 (the NIC's 50 GB/s bounds it).
//   intraBw = 40 x 0.85 x 7/8 x 2 = 59.5; interBw = 48 x 2 (NVLS-Tree on two nodes) = 96;
//   bw = min(59.5, 96, perChMaxNVLSTreeBw Hopper-N2 57.7) = 57.7; busBw = 8 x 57.7 = 461.6;
//   algBw = 461.6 x 16 / 30 = 246.186667 GB/s; latency = 0 + NVLink 25 + 2 x log2(2) x NET 20.9
//   = 66.8 us; time = 66,800 + 1,073,741,824 / 246.186667 = 4,428,294.63 ns.
//   Ring/Simple: algBw = min(370.8, 8 x 50) x 16/30 = 197.76; latency (8.4 + 28 x 3.4 + 2 x 14)
//   x 1.4 (plateau) = 184.24 us -> 5,613,759.74 ns. NVLS-Tree wins.
//   2.21: bw = min(40, 48) = 40, busBw 320 x 5/6 = 266.67; latency 0 + 23 + 2 x 14 = 51 us
//   -> 4,077,531.84 ns.
TEST(NcclModelTest, NvlsTreeAcrossTwoNodes) {
  const CommTopology t = Topology("dgx-h100", 2, 16);
  CollectiveCost c = Model(k2_28).Estimate(CollectiveType::kAllReduce, kGiB, t);
  EXPECT_EQ(c.algorithm, NcclAlgorithm::kNvlsTree);
  EXPECT_NEAR(c.latency_us, 66.8, 1e-9);
  EXPECT_NEAR(c.algo_bandwidth, 246.186667e9, 1e3);
  EXPECT_NEAR(c.duration_ns, 4428295, 1);
  const CollectiveCost ring =
      Model(k2_28).EstimateWith(CollectiveType::kAllReduce, kGiB, t, NcclAlgorithm::kRing, NcclProtocol::kSimple);
  EXPECT_NEAR(ring.latency_us, 184.24, 1e-9);
  EXPECT_NEAR(ring.duration_ns, 5613760, 1);
  c = Model(k2_21).Estimate(CollectiveType::kAllReduce, kGiB, t);
  EXPECT_EQ(c.algorithm, NcclAlgorithm::kNvlsTree);
  EXPECT_NEAR(c.duration_ns, 4077532, 1);
  // Flat NVLS across nodes needs CollNet (off); NVLS-Tree none on one node; none before 2.18.
  EXPECT_FALSE(Model(k2_28).EstimateWith(CollectiveType::kAllReduce, kGiB, t, NcclAlgorithm::kNvls,
                                         NcclProtocol::kSimple).available);
  EXPECT_FALSE(Model(k2_28).EstimateWith(CollectiveType::kAllReduce, kGiB, Topology("dgx-h100", 1, 8),
                                         NcclAlgorithm::kNvlsTree, NcclProtocol::kSimple).available);
  EXPECT_FALSE(Model(k2_17).EstimateWith(CollectiveType::kAllReduce, kGiB, t, NcclAlgorithm::kNvlsTree,
                                         NcclProtocol::kSimple).available);
}

// Worked example 4 (NCCL 2.24): PAT all_gather with one GPU per node, 64 ranks on 64 nodes.
//   PAT: busBw = network share 50 x 0.75 = 37.5 GB/s, unconverted; latency = 8 + log2(64) x
//        (Tree NET Simple 14 / 3.5) + 64 x 2.8 = 8 + 24 + 179.2 = 211.2 us.
//   Ring, one GPU per node: every one of the 63 steps crosses the network at the Tree NET row:
//        Simple 8.4 + 63 x 14 = 890.4 us, algBw 50 x 64/63 = 50.793651;
//        LL 6.6 + 63 x 5.0 = 321.6 us, algBw min(20.4, 25) x 64/63 = 20.72381;
//        LL128 14 + 63 x 8.5 = 549.5 us, algBw 46 x 64/63 = 46.730159.
//   1 MiB: PAT 211,200 + 1,048,576 / 37.5 = 239,162.03 ns; LL 372,197.65; LL128 571,938.96;
//          Simple 911,043.84 -> PAT.
//   1 GiB: PAT 211,200 + 28,633,115.31 = 28,844,315.31 ns; Ring/Simple 890,400 +
//          21,139,292.16 = 22,029,692.16 ns -> Ring.
TEST(NcclModelTest, PatAtOneGpuPerNode) {
  const NcclModel model = Model(k2_24);
  const CommTopology t = Topology("dgx-h100", 64, 64, /*stride=*/8);
  ASSERT_EQ(t.nnodes, 64);
  CollectiveCost c = model.Estimate(CollectiveType::kAllGather, kMiB, t);
  EXPECT_EQ(c.algorithm, NcclAlgorithm::kPat);
  EXPECT_EQ(c.protocol, NcclProtocol::kSimple);
  EXPECT_NEAR(c.latency_us, 211.2, 1e-9);
  EXPECT_NEAR(c.duration_ns, 239163, 1);
  c = model.Estimate(CollectiveType::kAllGather, kGiB, t);
  EXPECT_EQ(c.algorithm, NcclAlgorithm::kRing);
  EXPECT_EQ(c.protocol, NcclProtocol::kSimple);
  EXPECT_NEAR(c.duration_ns, 22029693, 1);
  const CollectiveCost pat = model.EstimateWith(CollectiveType::kAllGather, kGiB, t, NcclAlgorithm::kPat,
                                                NcclProtocol::kSimple);
  EXPECT_NEAR(pat.duration_ns, 28844316, 1);
  // PAT needs one GPU per node (NCCL_PAT_ENABLE 2), PAT's release (2.23) and all_gather /
  // reduce_scatter.
  EXPECT_FALSE(model.EstimateWith(CollectiveType::kAllGather, kMiB, Topology("dgx-h100", 8, 64),
                                  NcclAlgorithm::kPat, NcclProtocol::kSimple).available);
  EXPECT_FALSE(Model(k2_21).EstimateWith(CollectiveType::kAllGather, kMiB, t, NcclAlgorithm::kPat,
                                         NcclProtocol::kSimple).available);
  EXPECT_FALSE(model.EstimateWith(CollectiveType::kAllReduce, kMiB, t, NcclAlgorithm::kPat,
                                  NcclProtocol::kSimple).available);
  EXPECT_EQ(model.Estimate(CollectiveType::kReduceScatter, kMiB, t).algorithm, NcclAlgorithm::kPat);
}

// NCCL_ALGO=Ring brings back the pre-NVLS choice on one DGX H100: Ring / Simple, 5,123,551.76
// ns (example 1); NCCL_NVLS_ENABLE=0 does the same.
TEST(NcclModelTest, KnobsForceTheOldChoice) {
  const CommTopology t = Topology("dgx-h100", 1, 8);
  NcclEnv ring = Env(k2_28);
  ring.algo = "Ring";
  ring.algo_enabled = ParseNcclAlgoList("Ring", k2_28).value();
  CollectiveCost c = NcclModel(NcclModelConfig::For(ring)).Estimate(CollectiveType::kAllReduce, kGiB, t);
  EXPECT_EQ(c.algorithm, NcclAlgorithm::kRing);
  EXPECT_EQ(c.protocol, NcclProtocol::kSimple);
  EXPECT_NEAR(c.duration_ns, 5123552, 1);
  NcclEnv no_nvls = Env(k2_28);
  no_nvls.nvls_enable = 0;
  c = NcclModel(NcclModelConfig::For(no_nvls)).Estimate(CollectiveType::kAllReduce, kGiB, t);
  EXPECT_EQ(c.algorithm, NcclAlgorithm::kRing);
  EXPECT_NEAR(c.duration_ns, 5123552, 1);
  EXPECT_EQ(NcclChannelsFor(NcclModelConfig::For(no_nvls), t).nvls, 0);
  // NCCL_PROTO=LL128 leaves Ring/LL128: busBw min(370.8 x 0.92, 12 x 36.7) = 341.136, algBw
  // 194.934857; latency 14 + 14 x 1.9 = 40.6 us -> 40,600 + 5,508,208.32 = 5,548,808.32 ns.
  NcclEnv ll128 = ring;
  ll128.proto = "LL128";
  ll128.proto_enabled = ParseNcclProtoList("LL128", k2_28).value();
  c = NcclModel(NcclModelConfig::For(ll128)).Estimate(CollectiveType::kAllReduce, kGiB, t);
  EXPECT_EQ(c.protocol, NcclProtocol::kLL128);
  EXPECT_NEAR(c.duration_ns, 5548809, 1);
  // The per-function form: NVLS for all_reduce only, Ring for the rest.
  NcclEnv per_function = Env(k2_28);
  per_function.algo = "ring;allreduce:nvls";
  per_function.algo_enabled = ParseNcclAlgoList(per_function.algo, k2_28).value();
  const NcclModel pf(NcclModelConfig::For(per_function));
  EXPECT_EQ(pf.Estimate(CollectiveType::kAllReduce, kGiB, t).algorithm, NcclAlgorithm::kNvls);
  EXPECT_TRUE(pf.AnyEnabled(CollectiveType::kAllGather, t));
  // NCCL_ALGO=Tree leaves all_gather nothing: 2.28 refuses (AnyEnabled false; Estimate runs
  // Ring), 2.7's scope ignores NCCL_ALGO outside all_reduce.
  NcclEnv tree = Env(k2_28);
  tree.algo = "Tree";
  tree.algo_enabled = ParseNcclAlgoList("Tree", k2_28).value();
  EXPECT_FALSE(NcclModel(NcclModelConfig::For(tree)).AnyEnabled(CollectiveType::kAllGather, t));
  EXPECT_EQ(NcclModel(NcclModelConfig::For(tree)).Estimate(CollectiveType::kAllGather, kGiB, t).algorithm,
            NcclAlgorithm::kRing);
}

// NCCL_MAX_NCHANNELS=12 halves the ring's execution channels (24 -> 12) and, as NCCL's
// ncclTopoGetAlgoTime scales an operation on fewer channels, its bandwidth: Ring/Simple algBw
// 211.885714 / 2 = 105.942857 GB/s; 56,000 + 1,073,741,824 / 105.942857 = 10,191,103.52 ns.
// NVLS channels are min(16, 12) = 12: NVLS x 12/16.
TEST(NcclModelTest, MaxChannelsHalvesBandwidth) {
  const CommTopology t = Topology("dgx-h100", 1, 8);
  NcclEnv env = Env(k2_24);
  env.max_nchannels = 12;
  const NcclModel model(NcclModelConfig::For(env));
  const CollectiveCost c =
      model.EstimateWith(CollectiveType::kAllReduce, kGiB, t, NcclAlgorithm::kRing, NcclProtocol::kSimple);
  EXPECT_EQ(c.channels, 12);
  EXPECT_NEAR(c.algo_bandwidth, 105.942857e9, 1e3);
  EXPECT_NEAR(c.duration_ns, 10191104, 1);
  const CollectiveCost nvls =
      model.EstimateWith(CollectiveType::kAllReduce, kGiB, t, NcclAlgorithm::kNvls, NcclProtocol::kSimple);
  EXPECT_EQ(nvls.channels, 12);
  EXPECT_NEAR(nvls.algo_bandwidth, 266.666667e9 * 12 / 16, 1e3);
  // More channels than the default add no bandwidth.
  env.max_nchannels = 0;
  env.min_nchannels = 32;
  const CollectiveCost more = NcclModel(NcclModelConfig::For(env))
                                  .EstimateWith(CollectiveType::kAllReduce, kGiB, t, NcclAlgorithm::kRing,
                                                NcclProtocol::kSimple);
  EXPECT_EQ(more.channels, 32);
  EXPECT_NEAR(more.duration_ns, 5123552, 1);
}

// A release before NVLS (2.14.3, PyTorch 1.13 / 2.0's): 2.17.1's tables without NVLS, where
// Hopper's busBw is capped at 370 GB/s. Ring/Simple: algBw 370 x 8/14 = 211.428571, latency
// 8.4 + 14 x 3.4 = 56 us -> 56,000 + 5,078,508.63 = 5,134,508.63 ns. Tree/Simple (hwLat 28 us
// per NVLink hop then: 2 x 7 x 28 = 392 us) and Ring/LL128 (10.0 + 14 x 1.9 = 36.6 us at
// min(340.4, 440.4) x 8/14 = 194.51 GB/s -> 5,556,778 ns) lose.
TEST(NcclModelTest, ReleaseBeforeNvls) {
  const NcclModel model = Model(k2_14);
  const CommTopology t = Topology("dgx-h100", 1, 8);
  const CollectiveCost c = model.Estimate(CollectiveType::kAllReduce, kGiB, t);
  EXPECT_EQ(c.algorithm, NcclAlgorithm::kRing);
  EXPECT_EQ(c.protocol, NcclProtocol::kSimple);
  EXPECT_NEAR(c.latency_us, 56.0, 1e-9);
  EXPECT_NEAR(c.duration_ns, 5134509, 1);
  EXPECT_FALSE(model.EstimateWith(CollectiveType::kAllReduce, kGiB, t, NcclAlgorithm::kNvls,
                                  NcclProtocol::kSimple).available);
  EXPECT_EQ(NcclChannelsFor(model.config(), t).nvls, 0);
}

// Worked example 5 (NCCL 2.24): 64 ranks on 8 DGX H100 nodes, all_gather of S = 1 GiB.
//   The ring leaves each node through the NICs of its 8 GPUs: min(370.8, 8 x 50) = 370.8.
//   algBw = 370.8 x 64 / 63 = 376.685714 GB/s
//   nsteps = 63, nInterSteps = nNodes - 1 = 7
//   intraLat = max(NVLink Ring/Simple 3.4, Intel net overhead 1.0 x 3) = 3.4
//   interLat = NET Ring/Simple 14.0
//   latency = 8.4 + 56 x 3.4 + 7 x 14.0 = 8.4 + 190.4 + 98.0 = 296.8 us
//   time = 296,800 + 1,073,741,824 / 376.685714 = 296,800 + 2,850,497.86 = 3,147,297.86 ns
TEST(NcclModelTest, MultiNodeAllGather) {
  const NcclModel model = Model(k2_24);
  const CommTopology t = Topology("dgx-h100", 8, 64);
  const CollectiveCost c =
      model.EstimateWith(CollectiveType::kAllGather, kGiB, t, NcclAlgorithm::kRing, NcclProtocol::kSimple);
  ASSERT_TRUE(c.available);
  EXPECT_NEAR(c.latency_us, 296.8, 1e-9);
  EXPECT_NEAR(c.algo_bandwidth, 376.685714e9, 1e3);
  EXPECT_NEAR(c.duration_ns, 3147298, 1);
  // Ring/LL128: busBw min(341.136, 12 x 36.7) x 64/63 = 346.55; latency 14.0 + 56 x 1.9 +
  // 7 x 4.0 = 148.4 us -> 3,246,767 ns: Simple still wins at 1 GiB.
  const CollectiveCost best = model.Estimate(CollectiveType::kAllGather, kGiB, t);
  EXPECT_EQ(best.algorithm, NcclAlgorithm::kRing);
  EXPECT_EQ(best.protocol, NcclProtocol::kSimple);
  EXPECT_NEAR(best.duration_ns, 3147298, 1);
  // Tree has no all_gather.
  EXPECT_FALSE(
      model.EstimateWith(CollectiveType::kAllGather, kGiB, t, NcclAlgorithm::kTree, NcclProtocol::kSimple).available);
}

// Worked example 6 (NCCL 2.24): 8 KiB all_reduce on one DGX H100 chooses Ring / LL.
//   Ring/LL: busBw = min(llMaxBw Hopper-N1 141, 370.8 x 0.5 = 185.4) = 141
//            algBw = 141 x 8 / 14 = 80.571429 GB/s; latency = 6.6 + 14 x 0.6 = 15.0 us
//            time = 15,000 + 8192 / 80.571429 = 15,000 + 101.67 = 15,101.67 ns
//   Tree/LL: busBw min(341.136 / 3.8, 141) = 89.77, x 0.5, x correction LL[log2(8192/64)
//            = 7] 0.7 = 31.42 GB/s; latency 6.8 + 2 x 7 x 0.6 = 15.2 us -> 15,460.7 ns
//   LL128 (latency >= 14 + 14 x 1.9 = 40.6 us), Simple (56 us) and NVLS (25 us) are behind.
TEST(NcclModelTest, SmallAllReducePicksLL) {
  const NcclModel model = Model(k2_24);
  const CommTopology t = Topology("dgx-h100", 1, 8);
  const CollectiveCost c = model.Estimate(CollectiveType::kAllReduce, 8 * kKiB, t);
  EXPECT_EQ(c.algorithm, NcclAlgorithm::kRing);
  EXPECT_EQ(c.protocol, NcclProtocol::kLL);
  EXPECT_DOUBLE_EQ(c.latency_us, 15.0);
  EXPECT_NEAR(c.algo_bandwidth, 80.571429e9, 1e3);
  EXPECT_NEAR(c.duration_ns, 15102, 1);
  const CollectiveCost tree =
      model.EstimateWith(CollectiveType::kAllReduce, 8 * kKiB, t, NcclAlgorithm::kTree, NcclProtocol::kLL);
  EXPECT_NEAR(tree.duration_ns, 15461, 1);
  // 2.21 (2.20's tables): Ring/LL's busBw is 370.8 x 1/4 = 92.7, capped at llMaxBw Hopper-N1
  // 87.7: algBw 87.7 x 8/14 = 50.114286; latency 6.6 + 14 x 0.6 = 15.0 us -> 15,163.47 ns.
  const CollectiveCost old = Model(k2_21).Estimate(CollectiveType::kAllReduce, 8 * kKiB, t);
  EXPECT_EQ(old.protocol, NcclProtocol::kLL);
  EXPECT_NEAR(old.duration_ns, 15164, 1);
}

// Worked example 7 (NCCL 2.24): Tree vs Ring across 8 DGX H100 nodes (64 ranks), all_reduce,
// NVLS off (NVLS-Tree is compared at the end).
//   Ring/Simple: algBw = 370.8 x 64 / 126 = 188.342857 GB/s
//     latency = 8.4 + (126 - 14) x max(3.4, 3.0) + 14 x 14.0 = 8.4 + 380.8 + 196 = 585.2 us,
//     x 1.4 plateau (bytes / (24 ch x 64) >= 64) = 819.28 us
//   Tree/LL128: busBw = min(370.8 x 0.92, 12 x 36.0) = 341.136, then
//     min(341.136 x 120/128, 12 x 29.0) = 319.815; algBw = x 0.5 = 159.9075 GB/s
//     latency = 14.0 + 2 x ((64/8 - 1) x 1.25 + log2(8) x 8.5) = 14 + 2 x 34.25 = 82.5 us
//   256 MiB (correction LL128[log2(2^28/64) = 22] = 1.0):
//     Tree/LL128 = 82,500 + 268,435,456 / 159.9075 = 1,761,192.09 ns
//     Ring/Simple = 819,280 + 268,435,456 / 188.342857 = 2,244,528.93 ns -> Tree wins
//   4 GiB (no correction above 2^28 B):
//     Ring/Simple = 819,280 + 4,294,967,296 / 188.342857 = 23,623,262.91 ns -> Ring wins
TEST(NcclModelTest, TreeRingCrossoverAcrossNodes) {
  NcclEnv env = Env(k2_24);
  env.nvls_enable = 0;
  const NcclModel model(NcclModelConfig::For(env));
  const CommTopology t = Topology("dgx-h100", 8, 64);
  const CollectiveCost medium = model.Estimate(CollectiveType::kAllReduce, 256 * kMiB, t);
  EXPECT_EQ(medium.algorithm, NcclAlgorithm::kTree);
  EXPECT_EQ(medium.protocol, NcclProtocol::kLL128);
  EXPECT_DOUBLE_EQ(medium.latency_us, 82.5);
  EXPECT_NEAR(medium.duration_ns, 1761193, 1);
  const CollectiveCost ring_medium =
      model.EstimateWith(CollectiveType::kAllReduce, 256 * kMiB, t, NcclAlgorithm::kRing, NcclProtocol::kSimple);
  EXPECT_NEAR(ring_medium.latency_us, 819.28, 1e-9);
  EXPECT_NEAR(ring_medium.duration_ns, 2244529, 1);
  const CollectiveCost large = model.Estimate(CollectiveType::kAllReduce, 4 * kGiB, t);
  EXPECT_EQ(large.algorithm, NcclAlgorithm::kRing);
  EXPECT_EQ(large.protocol, NcclProtocol::kSimple);
  EXPECT_NEAR(large.duration_ns, 23623263, 1);
  // With NVLS on, NVLS-Tree: bw min(40, 48 / 2) = 24 (beyond two nodes), busBw 192 x 5/6 = 160
  // GB/s; latency 25 + 2 x 3 x 14 = 109 us: 256 MiB -> 109,000 + 1,677,721.6 = 1,786,721.6 ns
  // (Tree/LL128's 1,761,192 wins); 4 GiB -> 26,952,545.6 ns (Ring's 23.6 ms wins).
  EXPECT_EQ(Model(k2_24).Estimate(CollectiveType::kAllReduce, 256 * kMiB, t).algorithm, NcclAlgorithm::kTree);
  EXPECT_EQ(Model(k2_24).Estimate(CollectiveType::kAllReduce, 4 * kGiB, t).algorithm, NcclAlgorithm::kRing);
}

// Part 3a: what NCCL 2.28's model picks at scale on dgx-h100 for one Llama-3-70B layer's bf16
// parameters (hidden 8192, 64 heads / 8 KV heads x 128, FFN 28672: attention 150,994,944 +
// MLP 704,643,072 + norms 16,384 = 855,654,400 parameters = S = 1,711,308,800 bytes), FSDP over
// every rank (8 per node, N = n / 8 nodes).
//   Ring latency = baseLat + (nsteps - nInterSteps) x max(NVLink hop, net overhead) +
//   nInterSteps x NET hop; all_gather / reduce_scatter: nsteps n-1, nInterSteps N-1.
//     Simple: 8.4 + (n - N) x max(3.4, 3.0) + (N - 1) x 14
//     LL128: 14 + (n - N) x 1.9 + (N - 1) x 4.0
//   n = 128 (N 16): Simple 8.4 + 112 x 3.4 + 15 x 14 = 599.2 us; algBw 370.8 x 128/127 =
//     373.719685 -> 599,200 + 4,579,124.06 = 5,178,324.06 ns (LL128: 286.8 us, 343.822 GB/s ->
//     5,264,108.76) -> Ring / Simple
//   n = 1,024 (N 128): Simple 8.4 + 896 x 3.4 + 127 x 14 = 4,832.8 us -> 9,443,473.14 ns;
//     LL128 14 + 896 x 1.9 + 127 x 4.0 = 2,224.4 us, algBw 341.136 x 1024/1023 = 341.469466 ->
//     2,224,400 + 5,011,601.24 = 7,236,001.24 ns -> Ring / LL128
//   n = 4,096 (N 512): LL128 14 + 3,584 x 1.9 + 511 x 4 = 8,867.6 us -> 13,882,875.43 ns
//     (Simple 19,348.0 us -> 23,962,053.40) -> Ring / LL128
//   n = 16,384 (N 2,048): LL128 14 + 14,336 x 1.9 + 2,047 x 4 = 35,440.4 us -> 40,456,593.98 ns
//     (Simple 8.4 + 14,336 x 3.4 + 2,047 x 14 = 77,408.8 us -> 82,023,698.46) -> Ring / LL128:
//     at 16K ranks the ring's latency term is 7x its bandwidth term.
//   all_reduce: NVLS-Tree, bw = min(59.5, bwInter 48, perChMaxNVLSTreeBw Hopper-N4 45.5) = 45.5,
//     busBw 364, algBw 364 x n / (2(n-1)); latency 25 + 2 x log2(N) x 20.9:
//     n = 128: 25 + 2 x 4 x 20.9 = 192.2 us, algBw 183.433071 -> 9,521,536.26 ns
//     n = 1,024: 25 + 2 x 7 x 20.9 = 317.6 us, 182.177908 -> 9,711,213.19 ns
//     n = 4,096: 25 + 2 x 9 x 20.9 = 401.2 us, 182.044444 -> 9,801,700.00 ns
//     n = 16,384: 25 + 2 x 11 x 20.9 = 484.8 us, 182.011109 -> 9,887,021.70 ns
//     (Tree/Simple, next: 8.4 + 2 x (7 x 4.0 + log2(N) x 14), algBw 170.568 -> 10.2-10.4 ms.)
TEST(NcclModelTest, ChoicesAtScaleForALlama70bLayer) {
  constexpr int64_t kLayerBytes = 1'711'308'800;
  const NcclModel model = Model(k2_28);
  struct Case {
    int32_t ranks;
    NcclProtocol gather_protocol;
    double gather_latency_us;
    int64_t gather_ns;
    double reduce_latency_us;
    int64_t reduce_ns;
  };
  for (const Case& c : {Case{128, NcclProtocol::kSimple, 599.2, 5178325, 192.2, 9521537},
                        Case{1024, NcclProtocol::kLL128, 2224.4, 7236002, 317.6, 9711214},
                        Case{4096, NcclProtocol::kLL128, 8867.6, 13882876, 401.2, 9801700},
                        Case{16384, NcclProtocol::kLL128, 35440.4, 40456594, 484.8, 9887022}}) {
    const CommTopology t = Topology("dgx-h100", c.ranks / 8, c.ranks);
    for (CollectiveType type : {CollectiveType::kAllGather, CollectiveType::kReduceScatter}) {
      const CollectiveCost g = model.Estimate(type, kLayerBytes, t);
      EXPECT_EQ(g.algorithm, NcclAlgorithm::kRing) << c.ranks;
      EXPECT_EQ(g.protocol, c.gather_protocol) << c.ranks;
      EXPECT_NEAR(g.latency_us, c.gather_latency_us, 1e-6) << c.ranks;
      EXPECT_NEAR(g.duration_ns, c.gather_ns, 1) << c.ranks;
    }
    const CollectiveCost r = model.Estimate(CollectiveType::kAllReduce, kLayerBytes, t);
    EXPECT_EQ(r.algorithm, NcclAlgorithm::kNvlsTree) << c.ranks;
    EXPECT_NEAR(r.latency_us, c.reduce_latency_us, 1e-6) << c.ranks;
    EXPECT_NEAR(r.duration_ns, c.reduce_ns, 1) << c.ranks;
  }
}

// cluster.network: 128 DGX H100 nodes, 32 per leaf group (4 groups), 200 ns per switch (a
// test figure). NCCL still picks by its own model; the collective then pays the spine hops:
//   Ring all_gather: min(4 groups x 1 revolution, 127 network steps) = 4 crossings x 2 extra
//     switches x 200 ns = 1,600 ns
//   NVLS-Tree all_reduce: 2 x ceil(log2 4) = 4 crossings -> 1,600 ns
//   32 nodes (one group): 0.
TEST(NcclModelTest, LeafSpineHopsAddToTheChosenAlgorithm) {
  auto cluster = FindClusterPreset("dgx-h100", 128);
  ASSERT_TRUE(cluster.ok());
  const NcclModel model(NcclModelConfig::For(cluster->nccl));
  const CommTopology flat = TopologyOf(*cluster, Iota(1024));
  cluster->network = NetworkTiers{32, 200};
  const CommTopology tiered = TopologyOf(*cluster, Iota(1024));
  ASSERT_EQ(tiered.leaf_groups, 4);
  for (CollectiveType type : {CollectiveType::kAllGather, CollectiveType::kAllReduce}) {
    const CollectiveCost a = model.Estimate(type, 64 * kMiB, flat);
    const CollectiveCost b = model.Estimate(type, 64 * kMiB, tiered);
    EXPECT_EQ(a.algorithm, b.algorithm);
    EXPECT_EQ(a.protocol, b.protocol);
    EXPECT_EQ(a.fabric_ns, 0);
    EXPECT_EQ(b.fabric_ns, 1600) << traces::CollectiveTypeName(type);
    EXPECT_EQ(b.duration_ns, a.duration_ns + 1600);
  }
  EXPECT_EQ(model.Estimate(CollectiveType::kAllGather, 64 * kMiB, TopologyOf(*cluster, Iota(256))).fabric_ns, 0);
}

// Selection sanity: LL for tiny messages, Simple for huge ones, and the chosen time never
// falls as the size doubles (each pair's time grows; the tree correction factors never
// drop by more than half between neighbouring powers of two).
TEST(NcclModelTest, SelectionIsMonotoneInSize) {
  for (NcclVersion version : {NcclVersion{2, 7, 8}, NcclVersion{2, 10, 3}, k2_14, k2_17, k2_21, k2_24, k2_28}) {
    const NcclModel model = Model(version);
    for (const auto& [preset, nodes] : std::vector<std::pair<std::string_view, int32_t>>{
             {"dgx-h100", 1}, {"dgx-h100", 8}, {"dgx-a100", 16}, {"aws-p3dn", 4}, {"aws-p4d", 2}}) {
      const CommTopology t = Topology(preset, nodes, nodes * 8);
      for (CollectiveType type : {CollectiveType::kAllReduce, CollectiveType::kAllGather,
                                  CollectiveType::kReduceScatter, CollectiveType::kBroadcast}) {
        int64_t previous = 0;
        for (int64_t bytes = 8; bytes <= 8 * kGiB; bytes *= 2) {
          const CollectiveCost c = model.Estimate(type, bytes, t);
          ASSERT_TRUE(c.available);
          EXPECT_GE(c.duration_ns, previous) << version.ToString() << " " << preset << " x" << nodes << " " << bytes;
          previous = c.duration_ns;
        }
        EXPECT_EQ(model.Estimate(type, 8, t).protocol, NcclProtocol::kLL) << version.ToString() << " " << preset;
        // Except 2.7's broadcast across 16 nodes: its Simple pipeline pays the Tree NET Simple
        // hop (50 us then) at each of its 128 steps, 6.4 ms, against LL128's 128 x 4.0 us =
        // 0.5 ms; at 8 GiB that outweighs LL128's 184 / 200 GB/s (46.7 against 42.9 ms).
        if (version.minor == 7 && type == CollectiveType::kBroadcast && nodes == 16) {
          EXPECT_EQ(model.Estimate(type, 8 * kGiB, t).protocol, NcclProtocol::kLL128);
          continue;
        }
        EXPECT_EQ(model.Estimate(type, 8 * kGiB, t).protocol, NcclProtocol::kSimple)
            << version.ToString() << " " << preset << " " << traces::CollectiveTypeName(type);
      }
    }
  }
}

TEST(NcclModelTest, LL128NeedsNvlinkAndGpuDirectAcrossNodes) {
  const NcclModel model = Model(k2_24);
  // p3dn across nodes: the NIC is behind the CPU (no GPUDirect RDMA).
  const CommTopology p3dn = Topology("aws-p3dn", 2, 16);
  EXPECT_FALSE(model.EstimateWith(CollectiveType::kAllReduce, kMiB, p3dn, NcclAlgorithm::kRing,
                                  NcclProtocol::kLL128).available);
  // One p3dn node: NVLink only, LL128 allowed.
  const CommTopology p3dn_one = Topology("aws-p3dn", 1, 8);
  EXPECT_TRUE(model.EstimateWith(CollectiveType::kAllReduce, kMiB, p3dn_one, NcclAlgorithm::kRing,
                                 NcclProtocol::kLL128).available);
  CommTopology pcie = Topology("dgx-a100", 1, 8);
  pcie.fabric = IntraNodeFabric::kPcie;
  const CollectiveCost c =
      model.EstimateWith(CollectiveType::kAllReduce, kMiB, pcie, NcclAlgorithm::kTree, NcclProtocol::kLL128);
  EXPECT_FALSE(c.available);
  EXPECT_EQ(c.duration_ns, std::numeric_limits<int64_t>::max());
  for (int64_t bytes = 8; bytes <= kGiB; bytes *= 4) {
    EXPECT_NE(model.Estimate(CollectiveType::kAllReduce, bytes, p3dn).protocol, NcclProtocol::kLL128);
  }
  // NCCL 2.7/2.8 enable LL128 by default on sm70 / sm80 only: none on Hopper.
  EXPECT_FALSE(Model({2, 10, 3}).EstimateWith(CollectiveType::kAllReduce, kMiB, Topology("dgx-h100", 1, 8),
                                              NcclAlgorithm::kRing, NcclProtocol::kLL128).available);
}

// Broadcast on one NVSwitch node: every channel is the same ring (sameChannels), so the
// latency is one hop: 8.4 + 3.4 = 11.8 us; algBw = 370.8 x 8 / 8 (nsteps = n).
// 1 GiB: 11,800 + 1,073,741,824 / 370.8 = 2,907,543.86 ns.
// On the V100 mesh the rings differ: Simple pays nsteps x the Tree hop: 8.4 + 8 x 4.0 =
// 40.4 us at 150 x 0.8 = 120 GB/s: 40,400 + 1,073,741,824 / 120 = 8,988,248.53 ns (2.24).
TEST(NcclModelTest, Broadcast) {
  const NcclModel model = Model(k2_24);
  const CollectiveCost h100 = model.EstimateWith(CollectiveType::kBroadcast, kGiB, Topology("dgx-h100", 1, 8),
                                                 NcclAlgorithm::kRing, NcclProtocol::kSimple);
  EXPECT_NEAR(h100.latency_us, 11.8, 1e-9);
  EXPECT_NEAR(h100.duration_ns, 2907544, 1);
  const CollectiveCost v100 = model.EstimateWith(CollectiveType::kBroadcast, kGiB, Topology("aws-p3dn", 1, 8),
                                                 NcclAlgorithm::kRing, NcclProtocol::kSimple);
  EXPECT_NEAR(v100.latency_us, 40.4, 1e-9);
  EXPECT_NEAR(v100.duration_ns, 8988249, 1);
}

TEST(NcclModelTest, OneRankIsALocalCopy) {
  const NcclModel model = Model(k2_28);
  const CommTopology t = Topology("dgx-h100", 1, 1);
  // Read + write 1 GiB through HBM: 2 x 1,073,741,824 / 3.35e12 B/s = 641,039.89 ns.
  const CollectiveCost c = model.Estimate(CollectiveType::kAllReduce, kGiB, t);
  EXPECT_TRUE(c.available);
  EXPECT_NEAR(c.duration_ns, 641040, 1);
  EXPECT_EQ(c.latency_us, 0);
  EXPECT_EQ(model.Estimate(CollectiveType::kAllReduce, 0, t).duration_ns, 0);
  EXPECT_EQ(NcclChannelsFor(model.config(), t).ring_tree, 0);
}

TEST(NcclModelTest, ZeroBytesCostNothing) {
  const NcclModel model = Model(k2_28);
  const CommTopology t = Topology("dgx-h100", 2, 16);
  for (CollectiveType type : {CollectiveType::kAllGather, CollectiveType::kAllReduce,
                              CollectiveType::kAllToAll, CollectiveType::kSend}) {
    EXPECT_EQ(model.Estimate(type, 0, t).duration_ns, 0);
  }
}

// Point-to-point on DGX H100 (2.24's Ring rows).
//   send 1 GiB inside a node: Simple, latency 8.4 + NVLink Ring/Simple 3.4 = 11.8 us,
//     1 GiB / 370.8 GB/s -> 11,800 + 2,895,743.86 = 2,907,543.86 ns
//   send 1 GiB across nodes: latency 8.4 + NET 14.0 = 22.4 us, 50 GB/s:
//     22,400 + 21,474,836.48 = 21,497,236.48 ns
//   send 4 KiB inside a node (<= 16 KiB: LL): 6.6 + 0.6 = 7.2 us, 370.8 x 0.5 = 185.4 GB/s:
//     7,200 + 22.09 = 7,222.09 ns
//   all_to_all, 64 ranks on 8 nodes, 64 MiB sent per rank = 1 MiB per peer (Simple):
//     7 local peers: 7 MiB / 370.8 = 19,795.1 ns; 56 remote: 56 MiB / 50 = 1,174,405.12 ns
//     latency 8.4 + 14.0 = 22.4 us -> 22,400 + 1,174,405.12 = 1,196,805.12 ns
TEST(NcclModelTest, PointToPoint) {
  const NcclModel model = Model(k2_24);
  const CommTopology one = Topology("dgx-h100", 1, 8);
  const CommTopology eight = Topology("dgx-h100", 8, 64);
  CollectiveCost c = model.Estimate(CollectiveType::kSend, kGiB, one);
  EXPECT_EQ(c.protocol, NcclProtocol::kSimple);
  EXPECT_NEAR(c.duration_ns, 2907544, 1);
  EXPECT_EQ(model.Estimate(CollectiveType::kRecv, kGiB, one).duration_ns, c.duration_ns);
  c = model.Estimate(CollectiveType::kSend, kGiB, Topology("dgx-h100", 2, 2 * 8));
  EXPECT_NEAR(c.duration_ns, 21497237, 1);
  c = model.Estimate(CollectiveType::kSend, 4 * kKiB, one);
  EXPECT_EQ(c.protocol, NcclProtocol::kLL);
  EXPECT_NEAR(c.duration_ns, 7223, 1);
  c = model.Estimate(CollectiveType::kAllToAll, 64 * kMiB, eight);
  EXPECT_EQ(c.protocol, NcclProtocol::kSimple);
  EXPECT_NEAR(c.latency_us, 22.4, 1e-9);
  EXPECT_NEAR(c.duration_ns, 1196806, 1);
  EXPECT_FALSE(
      model.EstimateWith(CollectiveType::kAllToAll, kMiB, eight, NcclAlgorithm::kTree, NcclProtocol::kSimple).available);
}

// The channels a communicator's buffers are sized by (NcclChannelsFor): 2 x the ring graph's
// (H100 and A100 12 -> 24, V100 6 -> 12), NVLS channels only where NVLS can run.
TEST(NcclModelTest, ChannelsForACommunicator) {
  const NcclModelConfig config = NcclModelConfig::Default();
  NcclChannels ch = NcclChannelsFor(config, Topology("dgx-h100", 1, 8));
  EXPECT_EQ(ch.ring_tree, 24);
  EXPECT_EQ(ch.search, 12);
  EXPECT_EQ(ch.nvls, 16);
  ch = NcclChannelsFor(config, Topology("dgx-h100", 2, 16));
  EXPECT_EQ(ch.nvls, 16);  // NVLS-Tree
  ch = NcclChannelsFor(config, Topology("dgx-a100", 1, 8));
  EXPECT_EQ(ch.ring_tree, 24);
  EXPECT_EQ(ch.nvls, 0);
  EXPECT_EQ(NcclChannelsFor(config, Topology("aws-p3dn", 1, 8)).ring_tree, 12);
  EXPECT_EQ(config.env.buffsize, 4 * kMiB);
}

TEST(NcclModelTest, Names) {
  EXPECT_EQ(NcclAlgorithmName(NcclAlgorithm::kTree), "Tree");
  EXPECT_EQ(NcclAlgorithmName(NcclAlgorithm::kRing), "Ring");
  EXPECT_EQ(NcclAlgorithmName(NcclAlgorithm::kNvls), "NVLS");
  EXPECT_EQ(NcclAlgorithmName(NcclAlgorithm::kNvlsTree), "NVLSTree");
  EXPECT_EQ(NcclAlgorithmName(NcclAlgorithm::kPat), "PAT");
  EXPECT_EQ(NcclProtocolName(NcclProtocol::kLL), "LL");
  EXPECT_EQ(NcclProtocolName(NcclProtocol::kLL128), "LL128");
  EXPECT_EQ(NcclProtocolName(NcclProtocol::kSimple), "Simple");
}

}  // namespace
}  // namespace shardscope::sim

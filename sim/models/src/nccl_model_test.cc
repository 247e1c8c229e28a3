// Tests for the NCCL cost model. Every expected time is worked out by hand from the formulas
// in nccl_model.cc and the tables of NcclModelConfig::Default() (NCCL tuning.cc); the
// arithmetic is in the comments. Times are ceil()ed to whole ns, so EXPECT_NEAR(.., 1).
//
// Figures used throughout (dgx-h100): usable NVLink = 450 GB/s x 20.6/25 = 370.8 GB/s;
// 12 channels; network share 50 GB/s per GPU; Intel CPU (net overhead 1 us).
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

std::vector<int32_t> Iota(int32_t n) {
  std::vector<int32_t> ranks(static_cast<size_t>(n));
  std::iota(ranks.begin(), ranks.end(), 0);
  return ranks;
}

CommTopology Topology(std::string_view preset, int32_t nodes, int32_t nranks) {
  auto cluster = FindClusterPreset(preset, nodes);
  EXPECT_TRUE(cluster.ok());
  return TopologyOf(cluster.value(), Iota(nranks));
}

class NcclModelTest : public ::testing::Test {
 protected:
  NcclModel model_{NcclModelConfig::Default()};
};

TEST_F(NcclModelTest, DefaultTablesAreNccls) {
  const NcclModelConfig c = NcclModelConfig::Default();
  constexpr int kT = 0, kR = 1, kLL = 0, kLL128 = 1, kS = 2;
  EXPECT_DOUBLE_EQ(c.base_latency_us[kT][kLL], 6.8);
  EXPECT_DOUBLE_EQ(c.base_latency_us[kR][kLL], 6.6);
  EXPECT_DOUBLE_EQ(c.base_latency_us[kR][kLL128], 14.0);
  EXPECT_DOUBLE_EQ(c.base_latency_us[kT][kS], 8.4);
  EXPECT_DOUBLE_EQ(c.nvlink_hop_latency_us[kT][kS], 4.0);
  EXPECT_DOUBLE_EQ(c.nvlink_hop_latency_us[kR][kLL128], 1.9);
  EXPECT_DOUBLE_EQ(c.network_hop_latency_us[kT][kS], 14.0);
  EXPECT_DOUBLE_EQ(c.network_hop_latency_us[kR][kLL], 2.7);
  EXPECT_DOUBLE_EQ(c.pci_hop_latency_us[kR][kS], 5.7);
  EXPECT_DOUBLE_EQ(c.ll_max_bw_single_node_gbps[2], 141.0);
  EXPECT_DOUBLE_EQ(c.per_channel_max_ring_ll128_gbps[2][0], 36.7);
  EXPECT_DOUBLE_EQ(c.per_channel_max_tree_gbps[1][2], 17.8);
  EXPECT_DOUBLE_EQ(c.tree_correction_factor[kS][11], 0.5);
  EXPECT_EQ(c.p2p_ll_threshold_bytes, 16384);
}

TEST_F(NcclModelTest, TopologyOfCountsNodes) {
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
  t = TopologyOf(*cluster, {0, 8, 16, 24});  // one rank per node (a DP group across nodes)
  EXPECT_EQ(t.nnodes, 4);
  EXPECT_EQ(t.ranks_per_node, 1);
  t = TopologyOf(*cluster, {9, 3, 4, 5});
  EXPECT_EQ(t.nnodes, 2);
  EXPECT_EQ(t.ranks_per_node, 3);
}

// Worked example 1: 8 ranks on one DGX H100, all_reduce of 1 GiB, Ring / Simple.
//   busBw = 370.8 GB/s (Simple: no protocol factor)
//   algBw = busBw x n / nsteps = 370.8 x 8 / 14 = 211.885714 GB/s
//   latency = baseLat 8.4 + (nsteps 14 - 0 inter steps) x NVLink Ring/Simple 3.4 = 56.0 us
//   time = 56,000 ns + 1,073,741,824 / 211.885714 = 56,000 + 5,067,551.76 = 5,123,551.76 ns
TEST_F(NcclModelTest, SingleNodeAllReduceRingSimple) {
  const CommTopology t = Topology("dgx-h100", 1, 8);
  const CollectiveCost c = model_.EstimateWith(CollectiveType::kAllReduce, kGiB, t,
                                               NcclAlgorithm::kRing, NcclProtocol::kSimple);
  ASSERT_TRUE(c.available);
  EXPECT_DOUBLE_EQ(c.latency_us, 56.0);
  EXPECT_NEAR(c.algo_bandwidth, 211.885714e9, 1e3);
  EXPECT_EQ(c.channels, 12);
  EXPECT_NEAR(c.duration_ns, 5123552, 1);
  // Competitors at 1 GiB: Tree/Simple busBw = min(370.8 x 0.92, 12 x 38.7) = 341.136,
  // algBw 170.568, latency 8.4 + 2 x 7 x 4.0 = 64.4 us -> 6.36 ms; Ring/LL128 algBw
  // 341.136 x 8/14 = 194.9 -> 5.55 ms; Ring/LL capped at 141 GB/s. Ring/Simple wins.
  const CollectiveCost best = model_.Estimate(CollectiveType::kAllReduce, kGiB, t);
  EXPECT_EQ(best.algorithm, NcclAlgorithm::kRing);
  EXPECT_EQ(best.protocol, NcclProtocol::kSimple);
  EXPECT_EQ(best.duration_ns, c.duration_ns);
}

// Worked example 2: 64 ranks on 8 DGX H100 nodes, all_gather of S = 1 GiB (total output).
//   The ring leaves each node through the NICs of its 8 GPUs: min(370.8, 8 x 50) = 370.8.
//   algBw = 370.8 x 64 / 63 = 376.685714 GB/s
//   nsteps = 63, nInterSteps = nNodes - 1 = 7
//   intraLat = max(NVLink Ring/Simple 3.4, Intel net overhead 1.0 x 3) = 3.4
//   interLat = NET Ring/Simple 14.0
//   latency = 8.4 + 56 x 3.4 + 7 x 14.0 = 8.4 + 190.4 + 98.0 = 296.8 us
//   time = 296,800 + 1,073,741,824 / 376.685714 = 296,800 + 2,850,497.86 = 3,147,297.86 ns
TEST_F(NcclModelTest, MultiNodeAllGather) {
  const CommTopology t = Topology("dgx-h100", 8, 64);
  const CollectiveCost c = model_.EstimateWith(CollectiveType::kAllGather, kGiB, t,
                                               NcclAlgorithm::kRing, NcclProtocol::kSimple);
  ASSERT_TRUE(c.available);
  EXPECT_NEAR(c.latency_us, 296.8, 1e-9);
  EXPECT_NEAR(c.algo_bandwidth, 376.685714e9, 1e3);
  EXPECT_NEAR(c.duration_ns, 3147298, 1);
  // Ring/LL128: busBw min(341.136, 12 x 36.7) x 64/63 = 346.55; latency 14.0 + 56 x 1.9 +
  // 7 x 4.0 = 148.4 us -> 3,246,767 ns: Simple still wins at 1 GiB.
  const CollectiveCost best = model_.Estimate(CollectiveType::kAllGather, kGiB, t);
  EXPECT_EQ(best.algorithm, NcclAlgorithm::kRing);
  EXPECT_EQ(best.protocol, NcclProtocol::kSimple);
  EXPECT_NEAR(best.duration_ns, 3147298, 1);
  // Tree has no all_gather.
  EXPECT_FALSE(model_.EstimateWith(CollectiveType::kAllGather, kGiB, t, NcclAlgorithm::kTree,
                                   NcclProtocol::kSimple)
                   .available);
}

// Worked example 3: 8 KiB all_reduce on one DGX H100 chooses Ring / LL.
//   Ring/LL: busBw = min(llMaxBw Hopper-N1 141, 370.8 x 0.5 = 185.4) = 141
//            algBw = 141 x 8 / 14 = 80.571429 GB/s; latency = 6.6 + 14 x 0.6 = 15.0 us
//            time = 15,000 + 8192 / 80.571429 = 15,000 + 101.67 = 15,101.67 ns
//   Tree/LL: busBw min(341.136 / 3.8, 141) = 89.77, x 0.5, x correction LL[log2(8192/64)
//            = 7] 0.7 = 31.42 GB/s; latency 6.8 + 2 x 7 x 0.6 = 15.2 us -> 15,460.7 ns
//   LL128 (latency >= 14 + 14 x 1.9 = 40.6 us) and Simple (56 us) are far behind.
TEST_F(NcclModelTest, SmallAllReducePicksLL) {
  const CommTopology t = Topology("dgx-h100", 1, 8);
  const CollectiveCost c = model_.Estimate(CollectiveType::kAllReduce, 8 * kKiB, t);
  EXPECT_EQ(c.algorithm, NcclAlgorithm::kRing);
  EXPECT_EQ(c.protocol, NcclProtocol::kLL);
  EXPECT_DOUBLE_EQ(c.latency_us, 15.0);
  EXPECT_NEAR(c.algo_bandwidth, 80.571429e9, 1e3);
  EXPECT_NEAR(c.duration_ns, 15102, 1);
  const CollectiveCost tree = model_.EstimateWith(CollectiveType::kAllReduce, 8 * kKiB, t,
                                                  NcclAlgorithm::kTree, NcclProtocol::kLL);
  EXPECT_NEAR(tree.duration_ns, 15461, 1);
}

// Worked example 4: Tree vs Ring across 8 DGX H100 nodes (64 ranks), all_reduce.
//   Ring/Simple: algBw = 370.8 x 64 / 126 = 188.342857 GB/s
//     latency = 8.4 + (126 - 14) x max(3.4, 3.0) + 14 x 14.0 = 8.4 + 380.8 + 196 = 585.2 us,
//     x 1.4 plateau (bytes / (12 ch x 64) >= 64) = 819.28 us
//   Tree/LL128: busBw = min(370.8 x 0.92, 12 x 36.0) = 341.136, then
//     min(341.136 x 120/128, 12 x 29.0) = 319.815; algBw = x 0.5 = 159.9075 GB/s
//     latency = 14.0 + 2 x ((64/8 - 1) x 1.25 + log2(8) x 8.5) = 14 + 2 x 34.25 = 82.5 us
//   256 MiB (correction LL128[log2(2^28/64) = 22] = 1.0):
//     Tree/LL128 = 82,500 + 268,435,456 / 159.9075 = 1,761,192.09 ns
//     Ring/Simple = 819,280 + 268,435,456 / 188.342857 = 2,244,528.93 ns -> Tree wins
//     (Tree/Simple 1,897,037.6; Ring/LL128 1,831,983.6)
//   4 GiB (no correction above 2^28 B):
//     Ring/Simple = 819,280 + 4,294,967,296 / 188.342857 = 23,623,262.91 ns -> Ring wins
//     (Tree/Simple 148.4 us + S / 170.568 = 25,328,781.4; Ring/LL128 25,069,737.9)
TEST_F(NcclModelTest, TreeRingCrossoverAcrossNodes) {
  const CommTopology t = Topology("dgx-h100", 8, 64);
  const CollectiveCost medium = model_.Estimate(CollectiveType::kAllReduce, 256 * kMiB, t);
  EXPECT_EQ(medium.algorithm, NcclAlgorithm::kTree);
  EXPECT_EQ(medium.protocol, NcclProtocol::kLL128);
  EXPECT_DOUBLE_EQ(medium.latency_us, 82.5);
  EXPECT_NEAR(medium.duration_ns, 1761193, 1);
  const CollectiveCost ring_medium = model_.EstimateWith(
      CollectiveType::kAllReduce, 256 * kMiB, t, NcclAlgorithm::kRing, NcclProtocol::kSimple);
  EXPECT_NEAR(ring_medium.latency_us, 819.28, 1e-9);
  EXPECT_NEAR(ring_medium.duration_ns, 2244529, 1);

  const CollectiveCost large = model_.Estimate(CollectiveType::kAllReduce, 4 * kGiB, t);
  EXPECT_EQ(large.algorithm, NcclAlgorithm::kRing);
  EXPECT_EQ(large.protocol, NcclProtocol::kSimple);
  EXPECT_NEAR(large.duration_ns, 23623263, 1);
}

// Selection sanity: LL for tiny messages, Simple for huge ones, and the chosen time never
// falls as the size doubles (each pair's time grows; the tree correction factors never
// drop by more than half between neighbouring powers of two).
TEST_F(NcclModelTest, SelectionIsMonotoneInSize) {
  for (const auto& [preset, nodes] :
       std::vector<std::pair<std::string_view, int32_t>>{
           {"dgx-h100", 1}, {"dgx-h100", 8}, {"dgx-a100", 16}, {"aws-p3dn", 4},
           {"aws-p4d", 2}}) {
    const CommTopology t = Topology(preset, nodes, nodes * 8);
    for (CollectiveType type : {CollectiveType::kAllReduce, CollectiveType::kAllGather,
                                CollectiveType::kReduceScatter, CollectiveType::kBroadcast}) {
      int64_t previous = 0;
      for (int64_t bytes = 8; bytes <= 8 * kGiB; bytes *= 2) {
        const CollectiveCost c = model_.Estimate(type, bytes, t);
        ASSERT_TRUE(c.available);
        EXPECT_GE(c.duration_ns, previous) << preset << " x" << nodes << " " << bytes;
        previous = c.duration_ns;
      }
      EXPECT_EQ(model_.Estimate(type, 8, t).protocol, NcclProtocol::kLL) << preset;
      EXPECT_EQ(model_.Estimate(type, 8 * kGiB, t).protocol, NcclProtocol::kSimple) << preset;
    }
  }
}

TEST_F(NcclModelTest, LL128NeedsNvlinkAndGpuDirectAcrossNodes) {
  // p3dn across nodes: the NIC is behind the CPU (no GPUDirect RDMA).
  const CommTopology p3dn = Topology("aws-p3dn", 2, 16);
  EXPECT_FALSE(model_.EstimateWith(CollectiveType::kAllReduce, kMiB, p3dn,
                                   NcclAlgorithm::kRing, NcclProtocol::kLL128)
                   .available);
  // One p3dn node: NVLink only, LL128 allowed.
  const CommTopology p3dn_one = Topology("aws-p3dn", 1, 8);
  EXPECT_TRUE(model_.EstimateWith(CollectiveType::kAllReduce, kMiB, p3dn_one,
                                  NcclAlgorithm::kRing, NcclProtocol::kLL128)
                  .available);
  CommTopology pcie = Topology("dgx-a100", 1, 8);
  pcie.fabric = IntraNodeFabric::kPcie;
  const CollectiveCost c = model_.EstimateWith(CollectiveType::kAllReduce, kMiB, pcie,
                                               NcclAlgorithm::kTree, NcclProtocol::kLL128);
  EXPECT_FALSE(c.available);
  EXPECT_EQ(c.duration_ns, std::numeric_limits<int64_t>::max());
  for (int64_t bytes = 8; bytes <= kGiB; bytes *= 4) {
    EXPECT_NE(model_.Estimate(CollectiveType::kAllReduce, bytes, p3dn).protocol,
              NcclProtocol::kLL128);
  }
}

// Broadcast on one NVSwitch node: every channel is the same ring (sameChannels), so the
// latency is one hop: 8.4 + 3.4 = 11.8 us; algBw = 370.8 x 8 / 8 (nsteps = n).
// 1 GiB: 11,800 + 1,073,741,824 / 370.8 = 2,907,543.86 ns.
// On the V100 mesh the rings differ: Simple pays nsteps x the Tree hop: 8.4 + 8 x 4.0 =
// 40.4 us at 150 x 0.8 = 120 GB/s: 40,400 + 1,073,741,824 / 120 = 8,988,248.53 ns.
TEST_F(NcclModelTest, Broadcast) {
  const CollectiveCost h100 =
      model_.EstimateWith(CollectiveType::kBroadcast, kGiB, Topology("dgx-h100", 1, 8),
                          NcclAlgorithm::kRing, NcclProtocol::kSimple);
  EXPECT_NEAR(h100.latency_us, 11.8, 1e-9);
  EXPECT_NEAR(h100.duration_ns, 2907544, 1);
  const CollectiveCost v100 =
      model_.EstimateWith(CollectiveType::kBroadcast, kGiB, Topology("aws-p3dn", 1, 8),
                          NcclAlgorithm::kRing, NcclProtocol::kSimple);
  EXPECT_NEAR(v100.latency_us, 40.4, 1e-9);
  EXPECT_NEAR(v100.duration_ns, 8988249, 1);
}

TEST_F(NcclModelTest, OneRankIsALocalCopy) {
  const CommTopology t = Topology("dgx-h100", 1, 1);
  // Read + write 1 GiB through HBM: 2 x 1,073,741,824 / 3.35e12 B/s = 641,039.89 ns.
  const CollectiveCost c = model_.Estimate(CollectiveType::kAllReduce, kGiB, t);
  EXPECT_TRUE(c.available);
  EXPECT_NEAR(c.duration_ns, 641040, 1);
  EXPECT_EQ(c.latency_us, 0);
  EXPECT_EQ(model_.Estimate(CollectiveType::kAllReduce, 0, t).duration_ns, 0);
}

TEST_F(NcclModelTest, ZeroBytesCostNothing) {
  const CommTopology t = Topology("dgx-h100", 2, 16);
  for (CollectiveType type : {CollectiveType::kAllGather, CollectiveType::kAllReduce,
                              CollectiveType::kAllToAll, CollectiveType::kSend}) {
    EXPECT_EQ(model_.Estimate(type, 0, t).duration_ns, 0);
  }
}

// Point-to-point on DGX H100.
//   send 1 GiB inside a node: Simple, latency 8.4 + NVLink Ring/Simple 3.4 = 11.8 us,
//     1 GiB / 370.8 GB/s -> 11,800 + 2,895,743.86 = 2,907,543.86 ns
//   send 1 GiB across nodes: latency 8.4 + NET 14.0 = 22.4 us, 50 GB/s:
//     22,400 + 21,474,836.48 = 21,497,236.48 ns
//   send 4 KiB inside a node (<= 16 KiB: LL): 6.6 + 0.6 = 7.2 us, 370.8 x 0.5 = 185.4 GB/s:
//     7,200 + 22.09 = 7,222.09 ns
//   all_to_all, 64 ranks on 8 nodes, 64 MiB sent per rank = 1 MiB per peer (Simple):
//     7 local peers: 7 MiB / 370.8 = 19,795.1 ns; 56 remote: 56 MiB / 50 = 1,174,405.12 ns
//     latency 8.4 + 14.0 = 22.4 us -> 22,400 + 1,174,405.12 = 1,196,805.12 ns
TEST_F(NcclModelTest, PointToPoint) {
  const CommTopology one = Topology("dgx-h100", 1, 8);
  const CommTopology eight = Topology("dgx-h100", 8, 64);
  CollectiveCost c = model_.Estimate(CollectiveType::kSend, kGiB, one);
  EXPECT_EQ(c.protocol, NcclProtocol::kSimple);
  EXPECT_NEAR(c.duration_ns, 2907544, 1);
  EXPECT_EQ(model_.Estimate(CollectiveType::kRecv, kGiB, one).duration_ns, c.duration_ns);
  c = model_.Estimate(CollectiveType::kSend, kGiB, Topology("dgx-h100", 2, 2 * 8));
  EXPECT_NEAR(c.duration_ns, 21497237, 1);
  c = model_.Estimate(CollectiveType::kSend, 4 * kKiB, one);
  EXPECT_EQ(c.protocol, NcclProtocol::kLL);
  EXPECT_NEAR(c.duration_ns, 7223, 1);
  c = model_.Estimate(CollectiveType::kAllToAll, 64 * kMiB, eight);
  EXPECT_EQ(c.protocol, NcclProtocol::kSimple);
  EXPECT_NEAR(c.latency_us, 22.4, 1e-9);
  EXPECT_NEAR(c.duration_ns, 1196806, 1);
  EXPECT_FALSE(model_.EstimateWith(CollectiveType::kAllToAll, kMiB, eight,
                                   NcclAlgorithm::kTree, NcclProtocol::kSimple)
                   .available);
}

TEST_F(NcclModelTest, Names) {
  EXPECT_EQ(NcclAlgorithmName(NcclAlgorithm::kTree), "Tree");
  EXPECT_EQ(NcclAlgorithmName(NcclAlgorithm::kRing), "Ring");
  EXPECT_EQ(NcclProtocolName(NcclProtocol::kLL), "LL");
  EXPECT_EQ(NcclProtocolName(NcclProtocol::kLL128), "LL128");
  EXPECT_EQ(NcclProtocolName(NcclProtocol::kSimple), "Simple");
}

}  // namespace
}  // namespace shardscope::sim

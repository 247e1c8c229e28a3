// NCCL's buffers per communicator, each expectation computed by hand from NCCL's constants
// (nccl_memory.h / .cc): LL 524,288 B, LL128 4,915,200 B, Simple 4,194,304 B, a 4096 B control
// block per end, every intra-node end rounded up to 2 MiB (2,097,152 B).
#include "shardscope/sim/models/nccl_memory.h"

#include <gtest/gtest.h>

#include "engine_test_support.h"

namespace shardscope::sim {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

CommTopology Node(GpuArch arch, IntraNodeFabric fabric, int32_t ranks) {
  CommTopology t;
  t.nranks = ranks;
  t.nnodes = 1;
  t.ranks_per_node = ranks;
  t.arch = arch;
  t.fabric = fabric;
  return t;
}

TEST(NcclMemoryTest, DefaultBufferSizesAreNcclsConstants) {
  EXPECT_EQ(kNcclDefaultLlBuffSize, 8 * 512 * 8 * 16);
  EXPECT_EQ(kNcclDefaultLlBuffSize, 524'288);
  EXPECT_EQ(kNcclDefaultLl128BuffSize, 4'915'200);
  EXPECT_EQ(kNcclDefaultBuffsize, 4 * kMiB);
}

TEST(NcclMemoryTest, AmpereRingChannelIsTwelveMiBWithP2pRead) {
  // Read: send = align(4096 + 4 MiB) = 6 MiB; recv = align(4096 + 524,288 + 4,915,200 =
  // 5,443,584) = 6 MiB. 12 channels x 12 MiB = 144 MiB.
  NcclMemoryOptions o;
  o.channels = 12;
  o.ring = true;
  const NcclCommMemory m = NcclCommunicatorMemory(Node(GpuArch::kAmpere, IntraNodeFabric::kNvSwitch, 8), o);
  EXPECT_EQ(m.ring, 144 * kMiB);
  EXPECT_EQ(m.tree, 0);
  EXPECT_EQ(m.total(), 144 * kMiB);
}

TEST(NcclMemoryTest, VoltaWritesAndConnectsRingAndTreeAtInit) {
  // Write: send = align(4096) = 2 MiB; recv = align(4096 + 524,288 + 4,915,200 + 4,194,304 =
  // 9,637,888) = 10 MiB. Ring and tree at init: 2 x 6 channels x 12 MiB = 144 MiB.
  NcclMemoryOptions o;
  o.channels = 6;
  o.connect_at_init = true;
  const NcclCommMemory m =
      NcclCommunicatorMemory(Node(GpuArch::kVolta, IntraNodeFabric::kNvLinkHybridCubeMesh, 8), o);
  EXPECT_EQ(m.ring, 72 * kMiB);
  EXPECT_EQ(m.tree, 72 * kMiB);
}

TEST(NcclMemoryTest, BuffSizeMovesTheSimpleBuffer) {
  // NCCL_BUFFSIZE 8 MiB with read: send = align(4096 + 8 MiB) = 10 MiB, recv 6 MiB: 16 MiB.
  NcclMemoryOptions o;
  o.channels = 1;
  o.ring = true;
  o.buffsize = 8 * kMiB;
  EXPECT_EQ(NcclCommunicatorMemory(Node(GpuArch::kHopper, IntraNodeFabric::kNvSwitch, 8), o).ring, 16 * kMiB);
}

TEST(NcclMemoryTest, MultiNodeRingAveragesNetworkEnds) {
  // 16 nodes x 8: (7 x 12 MiB + NET pair) / 8. NET pair with GPUDirect RDMA: recv 9,633,792 +
  // send (4,915,200 + 4,194,304) = 18,743,296; (88,080,384 + 18,743,296) / 8 = 13,352,960.
  CommTopology t = Node(GpuArch::kAmpere, IntraNodeFabric::kNvSwitch, 8);
  t.nranks = 128;
  t.nnodes = 16;
  NcclMemoryOptions o;
  o.channels = 1;
  o.ring = true;
  EXPECT_EQ(NcclCommunicatorMemory(t, o).ring, 13'352'960);
  // Without GPUDirect RDMA the network buffers are in host memory: 88,080,384 / 8.
  t.gpu_direct_rdma = false;
  EXPECT_EQ(NcclCommunicatorMemory(t, o).ring, 11'010'048);
}

TEST(NcclMemoryTest, AllToAllPeersUseP2pConnections) {
  // Per peer: 2 channels x (2 MiB + align(4096 + 524,288 + 8 x 512 KiB = 4,722,688) = 6 MiB)
  // = 16 MiB; 7 peers = 112 MiB.
  NcclMemoryOptions o;
  o.channels = 12;
  o.p2p_peers = 7;
  const NcclCommMemory m = NcclCommunicatorMemory(Node(GpuArch::kHopper, IntraNodeFabric::kNvSwitch, 8), o);
  EXPECT_EQ(m.p2p, 112 * kMiB);
  EXPECT_EQ(m.ring, 0);
}

TEST(NcclMemoryTest, NvlsWhenAsked) {
  // 16 channels x 2 x (128 KiB x 8) x 8 heads = 256 MiB.
  NcclMemoryOptions o;
  o.nvls = true;
  EXPECT_EQ(NcclCommunicatorMemory(Node(GpuArch::kHopper, IntraNodeFabric::kNvSwitch, 8), o).nvls, 256 * kMiB);
}

TEST(NcclMemoryTest, OneRankHoldsNothing) {
  NcclMemoryOptions o;
  o.channels = 12;
  o.connect_at_init = true;
  EXPECT_EQ(NcclCommunicatorMemory(Node(GpuArch::kHopper, IntraNodeFabric::kNvSwitch, 1), o).total(), 0);
}

TEST(NcclMemoryTest, PerRankCountsOnlyCommunicatorsItsProgramUses) {
  // 4 ranks on one A100 node; slot "world" carries an all_gather, slot "idle" nothing: each
  // rank holds one ring of 12 channels x 12 MiB.
  test_support::ScheduleBuilder b(4, {"world", "idle"});
  for (int r = 0; r < 4; ++r) b.CollOn(r, 0, 0, 1024, traces::CollectiveType::kAllGather);
  ASSERT_TRUE(b.schedule.ResolveBindings().ok());
  StatusOr<ClusterSpec> cluster = FindClusterPreset("dgx-a100", 1);
  ASSERT_TRUE(cluster.ok());
  NcclMemoryOptions base;
  base.channels = 12;
  const std::vector<RankNcclMemory> per_rank = NcclMemoryPerRank(b.schedule, *cluster, base);
  ASSERT_EQ(per_rank.size(), 4u);
  for (const RankNcclMemory& m : per_rank) {
    EXPECT_EQ(m.communicators, 1);
    EXPECT_EQ(m.bytes, 144 * kMiB);
  }
}

TEST(NcclMemoryTest, PerRankWithTheJobsNcclConnectsWhatItsTuningRuns) {
  // 8 ranks on one DGX H100, NCCL 2.28.9 (runtime connect): a 1 GiB all_gather runs on rings and
  // a 1 GiB all_reduce on NVLS (NCCL's tuning: NVLS's bus bandwidth beats the ring's on a Hopper
  // NVSwitch node), and no tree is connected. Channels are NCCL's for the communicator: 24
  // execution channels (twice the ring graph's 12) and 16 NVLS channels (NCCL_NVLS_NCHANNELS).
  // Ring: 24 x 12 MiB (P2P read: a 6 MiB send end, a 6 MiB receive end) = 288 MiB; NVLS:
  // 16 x 2 x (128 KiB x 8) x 8 heads = 256 MiB; 544 MiB in all.
  test_support::ScheduleBuilder b(8, {"world"});
  for (int r = 0; r < 8; ++r) {
    b.CollOn(r, 0, 0, int64_t{1} << 30, traces::CollectiveType::kAllGather);
    b.CollOn(r, 0, 0, int64_t{1} << 30, traces::CollectiveType::kAllReduce);
  }
  ASSERT_TRUE(b.schedule.ResolveBindings().ok());
  StatusOr<ClusterSpec> cluster = FindClusterPreset("dgx-h100", 1);
  ASSERT_TRUE(cluster.ok());
  const NcclModel model(NcclModelConfig::For(cluster->nccl));
  const CommTopology world = TopologyOf(*cluster, {0, 1, 2, 3, 4, 5, 6, 7});
  ASSERT_EQ(model.Estimate(traces::CollectiveType::kAllGather, int64_t{1} << 30, world).algorithm,
            NcclAlgorithm::kRing);
  ASSERT_EQ(model.Estimate(traces::CollectiveType::kAllReduce, int64_t{1} << 30, world).algorithm,
            NcclAlgorithm::kNvls);
  const std::vector<RankNcclMemory> per_rank = NcclMemoryPerRank(b.schedule, *cluster, NcclMemoryOptions{}, &model);
  ASSERT_EQ(per_rank.size(), 8u);
  for (const RankNcclMemory& m : per_rank) EXPECT_EQ(m.bytes, 544 * kMiB);
  // Before NCCL 2.22 every ring and tree channel (and NVLS) is connected when the communicator is
  // made, whatever runs: ring 288 + tree 288 + NVLS 256 = 832 MiB.
  NcclMemoryOptions at_init;
  at_init.connect_at_init = true;
  for (const RankNcclMemory& m : NcclMemoryPerRank(b.schedule, *cluster, at_init, &model)) {
    EXPECT_EQ(m.bytes, 832 * kMiB);
  }
}

}  // namespace
}  // namespace shardscope::sim

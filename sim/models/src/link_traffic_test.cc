// The traffic a collective puts on a member's NVLink and NIC (link_traffic.h), worked out by hand
// from the algorithms, and the property the link model relies on: alone, a collective never
// demands more of a link than the link carries.
#include "shardscope/sim/models/link_traffic.h"

#include <gtest/gtest.h>

#include <numeric>
#include <string_view>
#include <vector>

namespace shardscope::sim {
namespace {

using traces::CollectiveType;

// n ranks, N nodes, at most `per_node` of them on one node (the NCCL model's shape).
CommTopology Shape(int32_t n, int32_t nodes, int32_t per_node) {
  CommTopology t;
  t.nranks = n;
  t.nnodes = nodes;
  t.ranks_per_node = per_node;
  return t;
}

TEST(LinkTrafficTest, RingAllGatherAcrossTwoNodesSendsTwoSixteenthsThroughTheNic) {
  // 16 ranks on 2 nodes, S = 1.6 MB: each rank sends 15 chunks of S/16 = 100 KB, 1.5 MB. Two of
  // the ring's 16 edges leave a node: 1.5 MB x 2/16 = 187,500 B through the NIC, the other
  // 14/16 = 1,312,500 B over NVLink. reduce_scatter moves the same.
  for (CollectiveType type : {CollectiveType::kAllGather, CollectiveType::kReduceScatter}) {
    const LinkTraffic t = CollectiveLinkTraffic(Shape(16, 2, 8), type, 1'600'000, NcclAlgorithm::kRing);
    EXPECT_DOUBLE_EQ(t.nic_bytes, 187'500);
    EXPECT_DOUBLE_EQ(t.nvlink_bytes, 1'312'500);
  }
}

TEST(LinkTrafficTest, RingAllReduceSendsTwiceAndOneRankPerNodeUsesOnlyTheNic) {
  // 64 ranks on 64 nodes, S = 64 MB = 64,000,000: 2 x 63 chunks of 1,000,000, all inter-node.
  LinkTraffic t = CollectiveLinkTraffic(Shape(64, 64, 1), CollectiveType::kAllReduce, 64'000'000,
                                        NcclAlgorithm::kRing);
  EXPECT_DOUBLE_EQ(t.nic_bytes, 126'000'000);
  EXPECT_DOUBLE_EQ(t.nvlink_bytes, 0);
  // 8 ranks on one node, S = 8,000: 2 x 7 x 1,000 over NVLink, nothing through a NIC.
  t = CollectiveLinkTraffic(Shape(8, 1, 8), CollectiveType::kAllReduce, 8'000, NcclAlgorithm::kRing);
  EXPECT_DOUBLE_EQ(t.nvlink_bytes, 14'000);
  EXPECT_DOUBLE_EQ(t.nic_bytes, 0);
}

TEST(LinkTrafficTest, TreeAllReduceReducesUpAndBroadcastsDown) {
  // 16 ranks on 4 nodes (a chain of 4 per node), S = 1,000,000. NVLink: the chain's 3 edges carry
  // S each way, 2 x 3/4 x S = 1,500,000 per rank. Network: two binary trees of 4 nodes (3 edges
  // each) carry S/2 up and S/2 down per edge: 2 x 3 x S = 6 MB in all, 1.5 MB per node, 375,000
  // per rank over the node's 4 NICs.
  const LinkTraffic t = CollectiveLinkTraffic(Shape(16, 4, 4), CollectiveType::kAllReduce, 1'000'000,
                                              NcclAlgorithm::kTree);
  EXPECT_DOUBLE_EQ(t.nvlink_bytes, 1'500'000);
  EXPECT_DOUBLE_EQ(t.nic_bytes, 375'000);
}

TEST(LinkTrafficTest, AllToAllSendsEachPeerItsSlice) {
  // 16 ranks on 2 nodes, S = 1.6 MB sent by each rank, 100 KB per peer: 7 local peers over
  // NVLink (700 KB), 8 remote ones through the NIC (800 KB); the rank's own slice stays.
  const LinkTraffic t = CollectiveLinkTraffic(Shape(16, 2, 8), CollectiveType::kAllToAll, 1'600'000,
                                              NcclAlgorithm::kRing);
  EXPECT_DOUBLE_EQ(t.nvlink_bytes, 700'000);
  EXPECT_DOUBLE_EQ(t.nic_bytes, 800'000);
}

TEST(LinkTrafficTest, PointToPointCrossesTheNicOnlyAcrossNodes) {
  LinkTraffic t = CollectiveLinkTraffic(Shape(2, 2, 1), CollectiveType::kSend, 4096, NcclAlgorithm::kRing);
  EXPECT_DOUBLE_EQ(t.nic_bytes, 4096);
  EXPECT_DOUBLE_EQ(t.nvlink_bytes, 0);
  t = CollectiveLinkTraffic(Shape(2, 1, 2), CollectiveType::kRecv, 4096, NcclAlgorithm::kRing);
  EXPECT_DOUBLE_EQ(t.nvlink_bytes, 4096);
  EXPECT_DOUBLE_EQ(t.nic_bytes, 0);
}

TEST(LinkTrafficTest, BroadcastForwardsTheBufferAlongTheRing) {
  // 4 ranks on 4 nodes, S = 4,000: three of the four ranks forward S, 3,000 each on average.
  const LinkTraffic t = CollectiveLinkTraffic(Shape(4, 4, 1), CollectiveType::kBroadcast, 4'000,
                                              NcclAlgorithm::kRing);
  EXPECT_DOUBLE_EQ(t.nic_bytes, 3'000);
  EXPECT_DOUBLE_EQ(t.nvlink_bytes, 0);
}

TEST(LinkTrafficTest, NothingMovesForOneRankOrNoBytes) {
  LinkTraffic t = CollectiveLinkTraffic(Shape(1, 1, 1), CollectiveType::kAllReduce, 1 << 20, NcclAlgorithm::kRing);
  EXPECT_EQ(t.nic_bytes + t.nvlink_bytes, 0);
  t = CollectiveLinkTraffic(Shape(16, 2, 8), CollectiveType::kAllGather, 0, NcclAlgorithm::kRing);
  EXPECT_EQ(t.nic_bytes + t.nvlink_bytes, 0);
}

TEST(LinkTrafficTest, CapacitiesAreTheNcclModels) {
  // dgx-h100: 450 GB/s NVLink x 20.6/25 (NCCL's SM90_NVLINK_BW over the line rate) = 370.8 GB/s;
  // 400 Gb/s NDR per GPU = 50 GB/s. aws-p4d: 400 Gb/s per node over 8 GPUs = 6.25 GB/s each.
  const NcclModelConfig nccl = NcclModelConfig::Default();
  auto h100 = FindClusterPreset("dgx-h100", 2);
  ASSERT_TRUE(h100.ok());
  EXPECT_DOUBLE_EQ(LinkCapacity(*h100, LinkKind::kNvlink, nccl), 370.8e9);
  EXPECT_DOUBLE_EQ(LinkCapacity(*h100, LinkKind::kNic, nccl), 50e9);
  auto p4d = FindClusterPreset("aws-p4d", 2);
  ASSERT_TRUE(p4d.ok());
  EXPECT_DOUBLE_EQ(LinkCapacity(*p4d, LinkKind::kNic, nccl), 6.25e9);
  EXPECT_EQ(LinkCapacity(*h100, LinkKind::kCollectiveBytes, nccl), 0);
}

// Alone, a collective priced by the NCCL model never demands more of a link than its capacity:
// the traffic over the full-speed duration stays within what each link carries. Every type,
// algorithm NCCL picks, size from 1 KB to 4 GB and shape from one node to 64, on each preset.
TEST(LinkTrafficTest, AloneACollectiveNeverDemandsMoreThanALinkCarries) {
  const NcclModelConfig config = NcclModelConfig::Default();
  const NcclModel model(config);
  for (std::string_view preset : {"dgx-h100", "dgx-a100", "aws-p4d", "aws-p3dn"}) {
    auto cluster = FindClusterPreset(preset, 64);
    ASSERT_TRUE(cluster.ok());
    const double nvlink = LinkCapacity(*cluster, LinkKind::kNvlink, config) / 1e9;  // bytes per ns
    const double nic = LinkCapacity(*cluster, LinkKind::kNic, config) / 1e9;
    // Groups as the lowerings make them: consecutive ranks, and one rank per node.
    std::vector<std::vector<int32_t>> groups;
    for (int32_t n : {2, 4, 8, 16, 64, 512}) {
      std::vector<int32_t> ranks(static_cast<size_t>(n));
      std::iota(ranks.begin(), ranks.end(), 0);
      groups.push_back(ranks);
      if (n <= 64) {
        for (int32_t i = 0; i < n; ++i) ranks[static_cast<size_t>(i)] = i * cluster->gpus_per_node;
        groups.push_back(ranks);
      }
    }
    for (const std::vector<int32_t>& ranks : groups) {
      const CommTopology topology = TopologyOf(*cluster, ranks);
      for (CollectiveType type :
           {CollectiveType::kAllGather, CollectiveType::kReduceScatter, CollectiveType::kAllReduce,
            CollectiveType::kBroadcast, CollectiveType::kAllToAll, CollectiveType::kSend}) {
        for (int64_t bytes = 1024; bytes <= (int64_t{4} << 30); bytes *= 8) {
          const CollectiveCost cost = model.Estimate(type, bytes, topology);
          ASSERT_GT(cost.duration_ns, 0);
          const LinkTraffic t = CollectiveLinkTraffic(topology, type, bytes, cost.algorithm);
          const double ns = static_cast<double>(cost.duration_ns);
          EXPECT_LE(t.nvlink_bytes / ns, nvlink * (1 + 1e-9))
              << preset << " " << traces::CollectiveTypeName(type) << " n=" << ranks.size() << " S=" << bytes;
          EXPECT_LE(t.nic_bytes / ns, nic * (1 + 1e-9))
              << preset << " " << traces::CollectiveTypeName(type) << " n=" << ranks.size() << " S=" << bytes;
        }
      }
    }
  }
}

}  // namespace
}  // namespace shardscope::sim

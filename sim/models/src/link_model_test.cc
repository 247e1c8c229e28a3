// The link model through the ActivitySet with NVLink and NIC links: what each collective demands
// of each link from its traffic (link_traffic.h), max-min shares and completion dates by hand.
// One GB/s is one byte per ns.
#include "shardscope/sim/models/link_model.h"

#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "shardscope/sim/models/activity_set.h"
#include "shardscope/sim/models/resource_models.h"

namespace shardscope::sim {
namespace {

using traces::CollectiveType;

CommTopology Shape(int32_t n, int32_t nodes, int32_t per_node) {
  CommTopology t;
  t.nranks = n;
  t.nnodes = nodes;
  t.ranks_per_node = per_node;
  return t;
}

// Three communicators meeting on rank 0's links (a dgx-h100: 8 GPUs per node, NIC 50 GB/s,
// NVLink 370.8 GB/s as NCCL counts it):
//   0 "replicate": 2 ranks on 2 nodes (ranks 0 and 8), its traffic all through the NIC;
//   1 "shard":     16 ranks on 2 nodes, a ring that leaves each node once: 2/16 of it through
//                  the NIC, 14/16 over NVLink;
//   2 "experts":   8 ranks on rank 0's node, all over NVLink.
// Rank 0's NIC is crossed by 0 and 1, its NVLink by 1 and 2.
struct ThreeGroups {
  explicit ThreeGroups(bool shared = true) {
    ResourceModelsConfig config;
    if (shared) {
      config.links = {LinkSpec{"rank 0 NIC", 50e9, {0, 1}, LinkKind::kNic},
                      LinkSpec{"rank 0 NVLink", 370.8e9, {1, 2}, LinkKind::kNvlink}};
      config.link_topologies = {Shape(2, 2, 1), Shape(16, 2, 8), Shape(8, 1, 8)};
    }
    auto models = MakeResourceModels(config, 3);
    EXPECT_TRUE(models.ok()) << models.status().message();
    set.emplace(16, std::move(*models), &seq);
  }
  ActivityId Start(int32_t comm, CollectiveType type, int64_t bytes, double ns, std::vector<int32_t> gpus,
                   int64_t now = 0) {
    return set->Start(ActivityKind::kComm, ns, gpus, CollectiveWork{comm, type, NcclAlgorithm::kRing, bytes}, now);
  }
  // A: all_reduce of 1 MB on the replicate group in 20 us: 2 x 1/2 x 1 MB = 1 MB through the
  // NIC, 50 B/ns (the NIC's capacity: alone it runs at the network's speed).
  ActivityId A(int64_t now = 0) { return Start(0, CollectiveType::kAllReduce, 1'000'000, 20'000, {0, 8}, now); }
  // B: all_gather of 16 MB on the shard group in 50 us: each rank sends 15/16 x 16 MB = 15 MB,
  // 2/16 of it (1.875 MB) through the NIC, 37.5 B/ns, and 13.125 MB over NVLink, 262.5 B/ns.
  ActivityId B(int64_t now = 0) {
    std::vector<int32_t> ranks(16);
    for (int32_t r = 0; r < 16; ++r) ranks[static_cast<size_t>(r)] = r;
    return Start(1, CollectiveType::kAllGather, 16'000'000, 50'000, ranks, now);
  }
  // C: all_gather of 8 MB on the node's 8 ranks in 14 us: 7/8 x 8 MB = 7 MB over NVLink, 500
  // B/ns, more than the link carries: taken as its 370.8 (alone it is never slowed).
  ActivityId C(int64_t now = 0) {
    return Start(2, CollectiveType::kAllGather, 8'000'000, 14'000, {0, 1, 2, 3, 4, 5, 6, 7}, now);
  }

  double Rate(ActivityId id) const { return (*set)[id].rate; }
  // Pops completions (skipping stale ones) until `id`'s, finishing those it passes: its date.
  int64_t RunUntilEndOf(ActivityId id) {
    while (set->Next() != nullptr) {
      const Completion done = set->PopNext();
      if (!set->IsCurrent(done.id, done.version)) continue;
      set->Finish(done.id, done.time);
      if (done.id == id) return done.time;
    }
    return -1;
  }
  uint64_t seq = 0;
  std::optional<ActivitySet> set;
};

TEST(LinkModelTest, AloneEachCollectiveRunsAtFullSpeed) {
  // A demands the whole NIC, C more than the NVLink (capped at it): alone, both at rate 1.
  ThreeGroups g;
  const ActivityId a = g.A();
  EXPECT_EQ(g.Rate(a), 1.0);
  EXPECT_EQ(g.RunUntilEndOf(a), 20'000);
  const ActivityId c = g.C(20'000);
  EXPECT_EQ(g.Rate(c), 1.0);
  EXPECT_EQ(g.RunUntilEndOf(c), 34'000);
}

TEST(LinkModelTest, TwoCollectivesOnOneNicShareItMaxMinFair) {
  // On the NIC (50 B/ns) A demands 50 and B 37.5: equal shares of 25 each, both held back (each
  // wants more than 25). A at 25/50 = 0.5, B at 25/37.5 = 2/3 (its NVLink part slows with it:
  // 175 B/ns of its 262.5). A's 20 us of work ends at 40 us; by then B has done 40 x 2/3 =
  // 26.667 us of its 50; alone again it finishes the remaining 23.333 us at full speed:
  // 40,000 + ceil(23,333.33) = 63,334 ns.
  ThreeGroups g;
  const ActivityId a = g.A();
  const ActivityId b = g.B();
  EXPECT_DOUBLE_EQ(g.Rate(a), 0.5);
  EXPECT_DOUBLE_EQ(g.Rate(b), 25.0 / 37.5);
  EXPECT_EQ(g.RunUntilEndOf(a), 40'000);
  EXPECT_EQ(g.Rate(b), 1.0);
  EXPECT_EQ(g.RunUntilEndOf(b), 63'334);
}

TEST(LinkModelTest, EachCollectiveRunsAtWhatItsTightestLinkGives) {
  // A, B and C together. NIC: water level 25 (A 50, B 37.5 on 50): A 0.5, B 2/3. NVLink: B 262.5
  // and C 370.8 on 370.8 would level at 185.4, but the NIC is B's tightest link (2/3 < 185.4 /
  // 262.5 = 0.706): B settles at 2/3 there and uses 175 of the NVLink, leaving C 195.8: C at
  // 195.8 / 370.8 = 0.528.
  ThreeGroups g;
  const ActivityId a = g.A();
  const ActivityId b = g.B();
  const ActivityId c = g.C();
  EXPECT_DOUBLE_EQ(g.Rate(a), 0.5);
  EXPECT_DOUBLE_EQ(g.Rate(b), 25.0 / 37.5);
  EXPECT_NEAR(g.Rate(c), 195.8 / 370.8, 1e-12);
  // C's 14 us at 0.528 end at ceil(14,000 x 370.8 / 195.8) = ceil(26,512.77) = 26,513 ns; A and B
  // keep their NIC shares (the NIC still holds them back), so A still ends at 40 us.
  EXPECT_EQ(g.RunUntilEndOf(c), 26'513);
  EXPECT_DOUBLE_EQ(g.Rate(a), 0.5);
  EXPECT_EQ(g.RunUntilEndOf(a), 40'000);
}

TEST(LinkModelTest, WithoutLinksEveryCollectiveKeepsItsOwn) {
  // The same three with link sharing off: nothing shared, all at full speed.
  ThreeGroups g(/*shared=*/false);
  const ActivityId a = g.A();
  const ActivityId b = g.B();
  const ActivityId c = g.C();
  EXPECT_EQ(g.Rate(a), 1.0);
  EXPECT_EQ(g.Rate(b), 1.0);
  EXPECT_EQ(g.Rate(c), 1.0);
}

TEST(LinkModelTest, DemandsCrossingInOppositeProportionsGetMaxMin) {
  // Two links of 105 B/ns: a NIC and an NVLink, both crossed by P and Q.
  //   P: all_to_all of 1.6 MB on 16 ranks, 2 per node, in 14 us: 1 local peer (100 KB over
  //      NVLink, 7.14 B/ns) and 14 remote ones (1.4 MB through the NIC, 100 B/ns).
  //   Q: ring all_gather of 16 MB on 16 ranks, 8 per node, in 131.25 us: 13.125 MB over NVLink
  //      (100 B/ns) and 1.875 MB through the NIC (100/7 B/ns).
  // The NIC (114.3 demanded) and the NVLink (107.1) are both over capacity. Each collective is
  // held back by the link it loads most, where it gets the most bandwidth, and both links
  // saturate: 100 p + 100/7 q = 105 and 100/14 p + 100 q = 105, so p = 1.05 x 84/97 = 0.9093
  // and q = 1.05 x 91/97 = 0.9851. (Plain water levels, which count each at its full demand on
  // its lighter link, would give p = 0.9071 and q = 0.9786.)
  ResourceModelsConfig config;
  config.links = {LinkSpec{"nic", 105e9, {0, 1}, LinkKind::kNic},
                  LinkSpec{"nvlink", 105e9, {0, 1}, LinkKind::kNvlink}};
  config.link_topologies = {Shape(16, 8, 2), Shape(16, 2, 8)};
  auto models = MakeResourceModels(config, 2);
  ASSERT_TRUE(models.ok()) << models.status().message();
  uint64_t seq = 0;
  ActivitySet set(16, std::move(*models), &seq);
  std::vector<int32_t> ranks(16);
  for (int32_t r = 0; r < 16; ++r) ranks[static_cast<size_t>(r)] = r;
  const ActivityId p = set.Start(ActivityKind::kComm, 14'000, ranks,
                                 CollectiveWork{0, CollectiveType::kAllToAll, NcclAlgorithm::kRing, 1'600'000}, 0);
  const ActivityId q = set.Start(ActivityKind::kComm, 131'250, ranks,
                                 CollectiveWork{1, CollectiveType::kAllGather, NcclAlgorithm::kRing, 16'000'000}, 0);
  EXPECT_NEAR(set[p].rate, 1.05 * 84 / 97, 1e-9);
  EXPECT_NEAR(set[q].rate, 1.05 * 91 / 97, 1e-9);
}

TEST(LinkModelTest, BadLinksAreInvalidInput) {
  // A typed link without the communicators' shapes cannot know their traffic.
  auto missing = LinkModel::Create({LinkSpec{"rank 0 NIC", 50e9, {0, 1}, LinkKind::kNic}}, {}, 2);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(missing.status().message().find("link 'rank 0 NIC'"), std::string::npos);
  auto bad = LinkModel::Create({LinkSpec{"rank 0 NIC", -1, {0}, LinkKind::kNic}}, {Shape(2, 2, 1)}, 1);
  ASSERT_FALSE(bad.ok());
}

}  // namespace
}  // namespace shardscope::sim

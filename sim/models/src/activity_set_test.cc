// The resource models through the ActivitySet, rates and completion dates by hand.
#include "shardscope/sim/models/activity_set.h"

#include <gtest/gtest.h>

#include "shardscope/sim/models/resource_models.h"

namespace shardscope::sim {
namespace {

struct Fixture {
  explicit Fixture(ResourceModelsConfig config, int32_t gpus = 2, int32_t communicators = 2) {
    auto models = MakeResourceModels(config, communicators);
    EXPECT_TRUE(models.ok());
    set.emplace(gpus, std::move(*models), &seq);
  }
  ActivityId Kernel(int32_t gpu, double ns, int64_t now = 0) {
    return set->Start(ActivityKind::kCompute, ns, {&gpu, 1}, CollectiveWork{}, now);
  }
  ActivityId Collective(std::vector<int32_t> gpus, double ns, int32_t comm = 0, int64_t bytes = 0, int64_t now = 0) {
    const CollectiveWork work{comm, traces::CollectiveType::kAllGather, NcclAlgorithm::kRing, bytes};
    return set->Start(ActivityKind::kComm, ns, gpus, work, now);
  }
  // Pops completions (skipping stale ones) until `id`'s: its date.
  int64_t EndOf(ActivityId id) {
    while (const Completion* c = set->Next()) {
      const Completion done = set->PopNext();
      if (set->IsCurrent(done.id, done.version) && done.id == id) return done.time;
      (void)c;
    }
    return -1;
  }
  uint64_t seq = 0;
  std::optional<ActivitySet> set;
};

TEST(ActivitySetTest, FairShareHalvesTwoKernelsOfOneGpu) {
  // Two 100 ns kernels on GPU 0 from t=0: each at 1/2, both done at 200. GPU 1's runs alone.
  Fixture f(ResourceModelsConfig{});
  const ActivityId a = f.Kernel(0, 100);
  const ActivityId b = f.Kernel(0, 100);
  const ActivityId c = f.Kernel(1, 100);
  EXPECT_EQ((*f.set)[a].rate, 0.5);
  EXPECT_EQ((*f.set)[b].rate, 0.5);
  EXPECT_EQ((*f.set)[c].rate, 1.0);
  EXPECT_EQ(f.EndOf(c), 100);
  EXPECT_EQ(f.EndOf(a), 200);
}

TEST(ActivitySetTest, IndependentKernelsDoNotSlowEachOther) {
  ResourceModelsConfig config;
  config.compute_sharing = ComputeSharing::kIndependent;
  Fixture f(config);
  const ActivityId a = f.Kernel(0, 100);
  f.Kernel(0, 100);
  EXPECT_EQ((*f.set)[a].rate, 1.0);
  EXPECT_EQ(f.EndOf(a), 100);
}

TEST(ActivitySetTest, ContentionSlowsComputeAndCommunicationWhileBothRun) {
  // compute_slowdown 0.25, comm_slowdown 1: with a collective on GPU 0 a kernel there runs at
  // 1/1.25 = 0.8; the collective, with a member computing, at 1/2. The 100 ns kernel ends at
  // 125; the 100 ns collective has done 62.5 by then and its last 37.5 run at 1: 162.5 -> 163.
  ResourceModelsConfig config;
  config.contention = {0.25, 1.0};
  Fixture f(config);
  const ActivityId k = f.Kernel(0, 100);
  const ActivityId c = f.Collective({0, 1}, 100);
  EXPECT_EQ((*f.set)[k].rate, 0.8);
  EXPECT_EQ((*f.set)[c].rate, 0.5);
  EXPECT_EQ(f.EndOf(k), 125);
  f.set->Finish(k, 125);
  EXPECT_EQ((*f.set)[c].rate, 1.0);
  EXPECT_EQ(f.EndOf(c), 163);
}

TEST(ActivitySetTest, CollectivesOnOneLinkShareItMaxMinFair) {
  // A 100 B/ns link crossed by communicators 0 and 1. Two 1,000 ns collectives of 100,000 bytes
  // (100 B/ns each) get 50 each: rate 1/2. A third of 10,000 bytes over 1,000 ns (10 B/ns) on
  // communicator 1 keeps its full speed; the two big ones split the other 90: 45 each, 0.45.
  ResourceModelsConfig config;
  config.links = {LinkSpec{"link", 100e9, {0, 1}}};
  Fixture f(config, 6);
  const ActivityId a = f.Collective({0, 1}, 1000, 0, 100'000);
  const ActivityId b = f.Collective({2, 3}, 1000, 1, 100'000);
  EXPECT_EQ((*f.set)[a].rate, 0.5);
  EXPECT_EQ((*f.set)[b].rate, 0.5);
  const ActivityId small = f.Collective({4, 5}, 1000, 1, 10'000);
  EXPECT_EQ((*f.set)[small].rate, 1.0);
  EXPECT_DOUBLE_EQ((*f.set)[a].rate, 0.45);
  EXPECT_DOUBLE_EQ((*f.set)[b].rate, 0.45);
}

TEST(ActivitySetTest, HandOverKeepsTheRate) {
  // Restart: new work at the unchanged rate (1/2 under fair share): 30 ns of work from t=200
  // ends at 260.
  Fixture f(ResourceModelsConfig{});
  const ActivityId a = f.Kernel(0, 100);
  f.Kernel(0, 1000);
  EXPECT_EQ(f.EndOf(a), 200);
  f.set->Restart(a, 30, 200);
  EXPECT_EQ(f.EndOf(a), 260);
}

}  // namespace
}  // namespace shardscope::sim

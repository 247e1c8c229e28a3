// Links shared by concurrent collectives of different communicators (EngineConfig::links,
// sim/models/link_model.h): the engine loop knows no model, so sharing a link needs only a
// link in the config. Times computed by hand in the comments.
#include "shardscope/sim/engine/engine.h"

#include <gtest/gtest.h>

#include <map>

#include "engine_test_support.h"

namespace shardscope::sim {
namespace {

using namespace traces;
using Builder = test_support::ScheduleBuilder;

constexpr int64_t kGB = 1'000'000'000;
constexpr double kLinkBytesPerS = 100e9;  // one 100 GB/s link (100 bytes per ns)

// A collective on communicator c costs latency_ns[c] + bytes / 100 ns: alone it moves its bytes
// at the link's 100 GB/s. Kernels cost their fixed duration.
class LinkCosts : public CostProvider {
 public:
  std::map<int32_t, int64_t> latency_ns;
  int64_t KernelNs(const ComputeDesc& desc) const override {
    return std::get<FixedDurationDesc>(desc).duration_ns;
  }
  int64_t MemcpyNs(MemcpyKind, int64_t bytes) const override { return bytes; }
  CollectiveCost Collective(CollectiveType, int64_t bytes, int32_t communicator) const override {
    CollectiveCost cost;
    auto it = latency_ns.find(communicator);
    cost.duration_ns = (it == latency_ns.end() ? 0 : it->second) + bytes / 100;
    return cost;
  }
};

// Four ranks: communicator A = {0, 1} (slot 0), B = {2, 3} (slot 1). Each rank may first run a
// kernel of `delay_ns` on stream 0, then an all-gather of `bytes` on its communicator.
struct TwoCommunicators {
  TwoCommunicators(int64_t a_bytes, int64_t b_bytes, int64_t b_delay_ns = 0) : builder(4, {"A", "B"}) {
    builder.schedule.communicators[0].ranks = {0, 1};
    builder.schedule.communicators[1].ranks = {2, 3};
    for (int r = 0; r < 2 && a_bytes > 0; ++r) builder.CollOn(r, 0, 0, a_bytes, CollectiveType::kAllGather);
    for (int r = 2; r < 4 && b_bytes > 0; ++r) {
      if (b_delay_ns > 0) builder.Kernel(r, 0, b_delay_ns);
      builder.CollOn(r, 1, 0, b_bytes, CollectiveType::kAllGather);
    }
  }
  // The end of each rank (ns) with the given links; launches cost nothing.
  std::vector<int64_t> Run(std::vector<LinkSpec> links, const LinkCosts& costs = LinkCosts()) {
    EXPECT_TRUE(builder.schedule.ResolveBindings().ok());
    EngineConfig config;
    config.links = std::move(links);
    StatusOr<SimulationResult> result = Simulate(builder.schedule, costs, config, nullptr);
    EXPECT_TRUE(result.ok()) << result.status().message();
    std::vector<int64_t> ends;
    for (const RankStats& rank : result->ranks) ends.push_back(rank.end_ns);
    return ends;
  }
  Builder builder;
};

std::vector<LinkSpec> OneSharedLink() { return {LinkSpec{"uplink", kLinkBytesPerS, {0, 1}}}; }

TEST(EngineLinksTest, AloneACollectiveRunsAtItsOwnSpeed) {
  // X = 1 GB / 100 GB/s = 10 ms = 10,000,000 ns, with or without the link.
  EXPECT_EQ(TwoCommunicators(kGB, 0).Run({}), (std::vector<int64_t>{10'000'000, 10'000'000, 0, 0}));
  EXPECT_EQ(TwoCommunicators(kGB, 0).Run(OneSharedLink()),
            (std::vector<int64_t>{10'000'000, 10'000'000, 0, 0}));
}

TEST(EngineLinksTest, TwoCommunicatorsStartedTogetherShareTheLinkAndBothFinishAt2X) {
  // Each demands 100 B/ns; the link has 100: each gets 50, rate 0.5, so both take 2X = 20 ms
  // (2 GB through 100 GB/s).
  EXPECT_EQ(TwoCommunicators(kGB, kGB).Run(OneSharedLink()),
            (std::vector<int64_t>{20'000'000, 20'000'000, 20'000'000, 20'000'000}));
}

TEST(EngineLinksTest, WithoutASharedLinkEachCommunicatorKeepsItsOwn) {
  // The default: each communicator on its own link; both take X, as before links existed.
  EXPECT_EQ(TwoCommunicators(kGB, kGB).Run({}),
            (std::vector<int64_t>{10'000'000, 10'000'000, 10'000'000, 10'000'000}));
  // A link that only A crosses changes nothing either.
  EXPECT_EQ(TwoCommunicators(kGB, kGB).Run({LinkSpec{"a only", kLinkBytesPerS, {0}}}),
            (std::vector<int64_t>{10'000'000, 10'000'000, 10'000'000, 10'000'000}));
}

TEST(EngineLinksTest, StaggeredStartsAreSharedPiecewise) {
  // B's ranks first run a 4 ms kernel. 0-4 ms: A alone at rate 1 does 4 ms of its 10 ms.
  // From 4 ms both run at 0.5: A's remaining 6 ms of work take 12 ms, so A ends at 16 ms;
  // by then B has done 6 ms of its 10, and its last 4 ms run alone at rate 1: B ends at 20 ms.
  EXPECT_EQ(TwoCommunicators(kGB, kGB, 4'000'000).Run(OneSharedLink()),
            (std::vector<int64_t>{16'000'000, 16'000'000, 20'000'000, 20'000'000}));
}

TEST(EngineLinksTest, MaxMinLeavesASmallCollectiveItsFullSpeed) {
  // B: 1 MB with 30 us of latency: 30,000 + 10,000 = 40,000 ns, demand 1e6 / 40,000 = 25 B/ns.
  // A: demand 100 B/ns. Max-min on the 100 B/ns link: B gets its 25 (rate 1), A the other 75
  // (rate 0.75). B ends at 40,000 ns. A has done 40,000 x 0.75 = 30,000 ns of work by then; its
  // remaining 9,970,000 ns run alone: A ends at 10,010,000. (Equal shares would have slowed B
  // to 80,000 ns.)
  LinkCosts costs;
  costs.latency_ns[1] = 30'000;
  EXPECT_EQ(TwoCommunicators(kGB, 1'000'000).Run(OneSharedLink(), costs),
            (std::vector<int64_t>{10'010'000, 10'010'000, 40'000, 40'000}));
}

TEST(EngineLinksTest, BadLinksAreInvalidInput) {
  TwoCommunicators two(kGB, kGB);
  ASSERT_TRUE(two.builder.schedule.ResolveBindings().ok());
  LinkCosts costs;
  for (const LinkSpec& link : {LinkSpec{"nic", 0, {0}}, LinkSpec{"nic", kLinkBytesPerS, {2}}}) {
    EngineConfig config;
    config.links = {link};
    StatusOr<SimulationResult> result = Simulate(two.builder.schedule, costs, config, nullptr);
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.status().code(), StatusCode::kInvalidInput);
    EXPECT_NE(result.status().message().find("link 'nic'"), std::string::npos) << result.status().message();
  }
}

}  // namespace
}  // namespace shardscope::sim

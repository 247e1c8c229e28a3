// The links a schedule's communicators share on a cluster (cluster_links.h), and the on/off knob
// end to end: which communicators cross which link, worked out from the groups by hand.
#include "shardscope/sim/simulate/cluster_links.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lowering_test_support.h"
#include "shardscope/sim/simulate/simulate.h"

namespace shardscope::sim {
namespace {

using test_support::MustLower;
using test_support::MustParsePlan;

ClusterSpec DgxH100(int32_t nodes) {
  auto cluster = FindClusterPreset("dgx-h100", nodes);
  EXPECT_TRUE(cluster.ok());
  return *cluster;
}

std::vector<int32_t> Range(int32_t first, int32_t count, int32_t stride = 1) {
  std::vector<int32_t> ranks;
  for (int32_t i = 0; i < count; ++i) ranks.push_back(first + i * stride);
  return ranks;
}

// HSDP on 4 dgx-h100 nodes (32 GPUs): two shard groups of 16 (ranks 0-15 on nodes 0-1, 16-31
// on nodes 2-3), sixteen replicate groups {i, i+16}.
traces::Schedule HsdpCommunicators() {
  traces::Schedule schedule;
  schedule.ranks.resize(32);
  schedule.communicators.push_back({"dp_shard.0", Range(0, 16)});
  schedule.communicators.push_back({"dp_shard.1", Range(16, 16)});
  for (int32_t i = 0; i < 16; ++i) {
    schedule.communicators.push_back({"dp_replicate." + std::to_string(i), {i, i + 16}});
  }
  return schedule;
}

TEST(ClusterLinksTest, HsdpShardsSpanningNodesShareEachNicWithTheirReplicas) {
  // A shard group spans two nodes: its ring crosses every member's NIC (and NVLink). A replicate
  // group {i, i+16} has one member per node: only NICs. So rank r's NIC is crossed by its shard
  // group and its replicate group, and its NVLink by its shard group alone (not built: one
  // communicator is serialized by NCCL). 32 NIC links, each with a distinct pair, none merged.
  const ClusterLinks links = ClusterLinksFor(HsdpCommunicators(), DgxH100(4), NcclModelConfig::Default());
  ASSERT_EQ(links.links.size(), 32u);
  for (int32_t rank = 0; rank < 32; ++rank) {
    const LinkSpec& link = links.links[static_cast<size_t>(rank)];
    EXPECT_EQ(link.name, "rank " + std::to_string(rank) + " NIC");
    EXPECT_EQ(link.kind, LinkKind::kNic);
    EXPECT_DOUBLE_EQ(link.bandwidth_bytes_per_s, 50e9);  // 400 Gb/s NDR per GPU
    const int32_t shard = rank / 16, replicate = 2 + rank % 16;
    EXPECT_EQ(link.communicators, (std::vector<int32_t>{shard, replicate})) << link.name;
  }
  ASSERT_EQ(links.topologies.size(), 18u);
  EXPECT_EQ(links.topologies[0].nnodes, 2);
  EXPECT_EQ(links.topologies[2].nranks, 2);
}

TEST(ClusterLinksTest, IntraNodeShardsShareNothing) {
  // Shards of 8 inside a node and replicas across nodes never meet on a link: no links at all,
  // and the engine does no link solving.
  traces::Schedule schedule;
  schedule.ranks.resize(16);
  schedule.communicators.push_back({"dp_shard.0", Range(0, 8)});
  schedule.communicators.push_back({"dp_shard.1", Range(8, 8)});
  for (int32_t i = 0; i < 8; ++i) schedule.communicators.push_back({"dp_replicate", {i, i + 8}});
  const ClusterLinks links = ClusterLinksFor(schedule, DgxH100(2), NcclModelConfig::Default());
  EXPECT_TRUE(links.links.empty());
  EXPECT_TRUE(links.topologies.empty());
}

TEST(ClusterLinksTest, LinksThatAreTheSameConstraintAreBuiltOnce) {
  // A world group and an 8-rank expert group on each node of 2: every GPU's NVLink is crossed by
  // {world, its node's experts}; the 8 NVLinks of a node are one constraint (same kind, same
  // capacity, same groups). The NICs are crossed by the world group alone: none.
  traces::Schedule schedule;
  schedule.ranks.resize(16);
  schedule.communicators.push_back({"dp", Range(0, 16)});
  schedule.communicators.push_back({"ep.0", Range(0, 8)});
  schedule.communicators.push_back({"ep.1", Range(8, 8)});
  const ClusterLinks links = ClusterLinksFor(schedule, DgxH100(2), NcclModelConfig::Default());
  ASSERT_EQ(links.links.size(), 2u);
  EXPECT_EQ(links.links[0].name, "rank 0 NVLink (and 7 more like it)");
  EXPECT_EQ(links.links[0].communicators, (std::vector<int32_t>{0, 1}));
  EXPECT_DOUBLE_EQ(links.links[0].bandwidth_bytes_per_s, 370.8e9);  // 450 GB/s x 20.6/25
  EXPECT_EQ(links.links[1].name, "rank 8 NVLink (and 7 more like it)");
  EXPECT_EQ(links.links[1].communicators, (std::vector<int32_t>{0, 2}));
}

TEST(ClusterLinksTest, SharingOffBuildsNoLink) {
  ClusterSpec cluster = DgxH100(4);
  cluster.link_sharing = false;
  EXPECT_TRUE(ClusterLinksFor(HsdpCommunicators(), cluster, NcclModelConfig::Default()).links.empty());
}

// A small HSDP plan whose 16-GPU shard groups span two nodes: in backward the replicate
// all-reduce of one layer runs beside the next layer's reduce-scatter and all-gather, on the
// same NICs.
std::string HsdpPlan(const std::string& cluster_extra) {
  return "model: {layers: 4, hidden: 4096, heads: 32, kv_heads: 8, ffn: 14336, vocab: 32000}\n"
         "cluster: {preset: dgx-h100, nodes: 4" + cluster_extra + "}\n"
         "strategy: fsdp2\n"
         "training: {seq_len: 4096, micro_batch_size: 1, dtype: bf16}\n"
         "fsdp2: {mesh: {replicate: 2, shard: 16}}\n";
}

TEST(ClusterLinksTest, TheKnobTravelsInTheScheduleAndSharingSlowsTheStep) {
  const traces::Schedule shared = MustLower(MustParsePlan(HsdpPlan("")));
  const traces::Schedule alone = MustLower(MustParsePlan(HsdpPlan(", link_sharing: false")));
  // Only the non-default value is written (schedules of plans without the key are unchanged).
  EXPECT_EQ(shared.metadata.count("cluster.link_sharing"), 0u);
  EXPECT_EQ(alone.metadata.at("cluster.link_sharing"), "0");
  StatusOr<SimulationSetup> shared_setup = SetupFromSchedule(shared, "<shared>");
  StatusOr<SimulationSetup> alone_setup = SetupFromSchedule(alone, "<alone>");
  ASSERT_TRUE(shared_setup.ok() && alone_setup.ok());
  EXPECT_TRUE(shared_setup->cluster.link_sharing);
  EXPECT_FALSE(alone_setup->cluster.link_sharing);
  const EngineConfig shared_config = EngineConfigFor(*shared_setup, shared);
  EXPECT_FALSE(shared_config.links.empty());
  EXPECT_TRUE(EngineConfigFor(*alone_setup, alone).links.empty());
  // The programs are the same; only the links differ, and sharing can only slow the step.
  const std::optional<SimulationResult> with = test_support::RunSimulation(shared);
  const std::optional<SimulationResult> without = test_support::RunSimulation(alone);
  ASSERT_TRUE(with && without);
  EXPECT_GT(with->step_ns, without->step_ns);
}

TEST(ClusterLinksTest, ABadKnobIsAnErrorNamingTheKey) {
  StatusOr<Plan> plan = ParsePlan(HsdpPlan(", link_sharing: sometimes"), "plan.yaml");
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(plan.status().message().find("cluster.link_sharing"), std::string::npos) << plan.status().message();
  EXPECT_NE(plan.status().message().find("true or false"), std::string::npos) << plan.status().message();
  traces::Schedule schedule = MustLower(MustParsePlan(HsdpPlan("")));
  schedule.metadata["cluster.link_sharing"] = "2";
  StatusOr<SimulationSetup> setup = SetupFromSchedule(schedule, "schedule.json");
  ASSERT_FALSE(setup.ok());
  EXPECT_NE(setup.status().message().find("/metadata/cluster.link_sharing"), std::string::npos);
}

}  // namespace
}  // namespace shardscope::sim

// Tests for cluster.nccl (the NCCL release and its environment variables, resolved after
// training.pytorch_version) and cluster.network (leaf/spine tiers): values, defaults, the
// errors that name file, line and key, and the round trip through a schedule's metadata.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "plan_test_support.h"
#include "shardscope/sim/lowering/lowering.h"
#include "shardscope/sim/lowering/schedule_metadata.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/sim/simulate/simulate.h"

namespace shardscope::sim {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(PlanNcclTest, DefaultIsThePytorchReleasesNccl) {
  // PyTorch 2.11 (the default release) bundles 2.28.9; a plan on PyTorch 1.8 gets 2.7.8.
  Plan plan = ParseOk(BasePlan());
  EXPECT_EQ(plan.cluster.nccl.version, (NcclVersion{2, 28, 9}));
  EXPECT_THAT(plan.cluster.nccl.version_source, HasSubstr("PyTorch 2.11"));
  plan = ParseOk(Lines({"model: llama3-8b", "cluster: dgx-a100", "strategy: ddp", "training: {pytorch_version: \"1.8\"}"}));
  EXPECT_EQ(plan.cluster.nccl.version, (NcclVersion{2, 7, 8}));
}

TEST(PlanNcclTest, KnobsAreRead) {
  const Plan plan = ParseOk(Lines({
      "model: llama3-8b",
      "cluster:",
      "  preset: dgx-h100",
      "  nccl:",
      "    version: \"2.21.5\"",
      "    NCCL_ALGO: \"^NVLS\"",
      "    NCCL_PROTO: Simple,LL",
      "    NCCL_NVLS_ENABLE: 0",
      "    NCCL_PAT_ENABLE: 1",
      "    NCCL_COLLNET_ENABLE: 0",
      "    NCCL_MIN_NCHANNELS: 4",
      "    NCCL_MAX_NCHANNELS: 12",
      "    NCCL_NVLS_NCHANNELS: 8",
      "    NCCL_BUFFSIZE: 8388608",
      "  network: {nodes_per_leaf: 32, switch_latency_ns: 200}",
      "strategy: fsdp2",
      "training: {pytorch_version: \"2.4\"}",  // the plan's version wins over PyTorch's 2.20.5
  }));
  const NcclEnv& env = plan.cluster.nccl;
  EXPECT_EQ(env.version, (NcclVersion{2, 21, 5}));
  EXPECT_EQ(env.version_source, "cluster.nccl.version");
  EXPECT_EQ(env.algo, "^NVLS");
  EXPECT_FALSE(env.algo_enabled.Has(NcclFunction::kAllReduce, static_cast<int>(NcclAlgorithm::kNvls)));
  EXPECT_TRUE(env.algo_enabled.Has(NcclFunction::kAllReduce, static_cast<int>(NcclAlgorithm::kRing)));
  EXPECT_FALSE(env.proto_enabled.Has(NcclFunction::kAllGather, static_cast<int>(NcclProtocol::kLL128)));
  EXPECT_EQ(env.algo_where, "test.yaml:6:16");
  EXPECT_EQ(env.nvls_enable, 0);
  EXPECT_EQ(env.pat_enable, 1);
  EXPECT_EQ(env.min_nchannels, 4);
  EXPECT_EQ(env.max_nchannels, 12);
  EXPECT_EQ(env.nvls_nchannels, 8);
  EXPECT_EQ(env.buffsize, 8 << 20);
  EXPECT_EQ(plan.cluster.network.nodes_per_leaf, 32);
  EXPECT_EQ(plan.cluster.network.switch_latency_ns, 200);

  // The schedule carries all of it: its setup reads back the same cluster.
  StatusOr<traces::Schedule> schedule = LowerPlan(plan);
  ASSERT_TRUE(schedule.ok()) << schedule.status().message();
  StatusOr<SimulationSetup> setup = SetupFromSchedule(*schedule, "s.json");
  ASSERT_TRUE(setup.ok()) << setup.status().message();
  const NcclEnv& back = setup->cluster.nccl;
  EXPECT_EQ(back.version, env.version);
  EXPECT_EQ(back.algo, env.algo);
  EXPECT_EQ(back.algo_enabled, env.algo_enabled);
  EXPECT_EQ(back.proto_enabled, env.proto_enabled);
  EXPECT_EQ(back.nvls_enable, 0);
  EXPECT_EQ(back.pat_enable, 1);
  EXPECT_EQ(back.min_nchannels, 4);
  EXPECT_EQ(back.max_nchannels, 12);
  EXPECT_EQ(back.nvls_nchannels, 8);
  EXPECT_EQ(back.buffsize, 8 << 20);
  EXPECT_EQ(setup->cluster.network.nodes_per_leaf, 32);
  EXPECT_EQ(setup->cluster.network.switch_latency_ns, 200);
}

TEST(PlanNcclTest, BadValuesNameFileLineAndKey) {
  const auto with_nccl = [](const std::string& nccl) {
    return Lines({"model: llama3-8b", "cluster:", "  preset: dgx-h100", "  nccl: " + nccl, "strategy: fsdp2"});
  };
  EXPECT_THAT(ParseError(with_nccl("{version: \"2.5.6\"}")),
              AllOf(HasSubstr("test.yaml:4:"), HasSubstr("cluster.nccl.version"), HasSubstr("from 2.7")));
  EXPECT_THAT(ParseError(with_nccl("{version: 3}")), HasSubstr("cluster.nccl.version"));
  EXPECT_THAT(ParseError(with_nccl("{NCCL_ALGO: Rign}")),
              AllOf(HasSubstr("test.yaml:4:"), HasSubstr("cluster.nccl.NCCL_ALGO"), HasSubstr("\"Rign\" is not one")));
  // PAT is not an algorithm of PyTorch 2.4's NCCL (2.20.5).
  EXPECT_THAT(ParseError(Lines({"model: llama3-8b", "cluster: {preset: dgx-h100, nccl: {NCCL_ALGO: PAT}}",
                                "strategy: fsdp2", "training: {pytorch_version: \"2.4\"}"})),
              AllOf(HasSubstr("test.yaml:2:"), HasSubstr("NCCL 2.20.5 knows")));
  EXPECT_THAT(ParseError(with_nccl("{version: \"2.21.5\", NCCL_ALGO: \"ring;allreduce:tree\"}")),
              HasSubstr("exists from NCCL 2.23.0"));
  EXPECT_THAT(ParseError(with_nccl("{NCCL_PROTO: LL256}")), HasSubstr("cluster.nccl.NCCL_PROTO"));
  EXPECT_THAT(ParseError(with_nccl("{NCCL_NVLS_ENABLE: 3}")), HasSubstr("cluster.nccl.NCCL_NVLS_ENABLE"));
  EXPECT_THAT(ParseError(with_nccl("{NCCL_COLLNET_ENABLE: 1}")),
              AllOf(HasSubstr("cluster.nccl.NCCL_COLLNET_ENABLE"), HasSubstr("not modelled")));
  EXPECT_THAT(ParseError(with_nccl("{NCCL_MAX_NCHANNELS: 0}")), HasSubstr("cluster.nccl.NCCL_MAX_NCHANNELS"));
  EXPECT_THAT(ParseError(with_nccl("{NCCL_BUFFSIZE: 1.5}")), HasSubstr("cluster.nccl.NCCL_BUFFSIZE"));
  EXPECT_THAT(ParseError(with_nccl("{NCCL_DEBUG: INFO}")), HasSubstr("NCCL_DEBUG"));
  EXPECT_THAT(ParseError(Lines({"model: llama3-8b", "cluster: {preset: dgx-h100, network: {nodes_per_leaf: 32}}",
                                "strategy: fsdp2"})),
              AllOf(HasSubstr("test.yaml:2:"), HasSubstr("switch_latency_ns")));
}

// NCCL 2.23+ refuses a call the knobs leave no algorithm for: NCCL_ALGO=Tree leaves FSDP2's
// all_gather nothing (Tree is all_reduce only), found before the simulation starts. NCCL 2.21
// restores Ring instead, so the same plan simulates.
TEST(PlanNcclTest, NothingLeftToRunIsAnErrorFromNccl223) {
  const auto plan_for = [](const char* version) {
    return ParseOk(Lines({"model: llama3-8b",
                          std::string("cluster: {preset: dgx-h100, nodes: 2, nccl: {version: \"") + version +
                              "\", NCCL_ALGO: Tree}}",
                          "strategy: fsdp2"}));
  };
  for (const char* version : {"2.28.9", "2.21.5"}) {
    const Plan plan = plan_for(version);
    StatusOr<traces::Schedule> schedule = LowerPlan(plan);
    ASSERT_TRUE(schedule.ok()) << schedule.status().message();
    StatusOr<SimulationSetup> setup = SetupFromSchedule(*schedule, "s.json");
    ASSERT_TRUE(setup.ok()) << setup.status().message();
    const auto costs = MakeCostProvider(*schedule, *setup);
    if (std::string(version) == "2.28.9") {
      ASSERT_FALSE(costs.ok());
      EXPECT_EQ(costs.status().code(), StatusCode::kInvalidInput);
      EXPECT_THAT(costs.status().message(),
                  AllOf(HasSubstr("test.yaml:2:"), HasSubstr("cluster.nccl.NCCL_ALGO"), HasSubstr("all_gather"),
                        HasSubstr("no algorithm/protocol available")));
    } else {
      EXPECT_TRUE(costs.ok()) << costs.status().message();
    }
  }
}

}  // namespace
}  // namespace shardscope::sim

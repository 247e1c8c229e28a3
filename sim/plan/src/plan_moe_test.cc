// Tests for the moe: section: expert parallelism and the groups it must divide.
#include "shardscope/sim/plan/plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "plan_test_support.h"

namespace shardscope::sim {
namespace {

using ::testing::HasSubstr;

TEST(PlanMoeTest, ExpertParallel) {
  EXPECT_EQ(ParseOk(Plan16(kMoe4, "fsdp2", {})).moe.expert_parallel, 1);
  EXPECT_EQ(ParseOk(Plan16(kMoe4, "fsdp2", {"moe: {expert_parallel: 8}"})).moe.expert_parallel, 8);
  EXPECT_EQ(ParseOk(Plan16(kMoe4, "fsdp1", {"moe: {expert_parallel: 4}"})).moe.expert_parallel, 4);
  // HSDP 2 x 8: 8 divides the shard group.
  EXPECT_EQ(ParseOk(Plan16(kMoe4, "fsdp2",
                           {"fsdp2: {mesh: {replicate: 2}}", "moe: {expert_parallel: 8}"}))
                .moe.expert_parallel,
            8);
  // A dense model may say 1.
  EXPECT_EQ(
      ParseOk(Plan16(kDense4, "zero3", {"moe: {expert_parallel: 1}"})).moe.expert_parallel, 1);
}

TEST(PlanMoeTest, Errors) {
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2", {"moe:", "  expert_parallel: 2"})),
              HasSubstr("test.yaml:5:20: moe.expert_parallel: expected 1 for a dense model "
                        "(model.experts is 1)"));
  EXPECT_THAT(ParseError(Plan16(kMoe4, "zero3", {"moe:", "  expert_parallel: 2"})),
              HasSubstr("test.yaml:5:20: moe.expert_parallel: expected 1 with this strategy "
                        "(expert parallelism is simulated with fsdp2 and fsdp1), got '2' with "
                        "strategy zero3"));
  EXPECT_THAT(ParseError(Plan16(kMoe4, "fsdp2", {"moe:", "  expert_parallel: 3"})),
              HasSubstr("test.yaml:5:20: moe.expert_parallel: expected a divisor of the model's 8 "
                        "experts"));
  EXPECT_THAT(ParseError(Plan16(kMoe4, "fsdp2", {"moe:", "  expert_parallel: 16"})),
              HasSubstr("a divisor of the model's 8 experts"));
  EXPECT_THAT(ParseError(Lines({kMoe4, "cluster: {preset: dgx-a100, gpus_per_node: 6}",
                                "strategy: fsdp2", "moe:", "  expert_parallel: 4"})),
              HasSubstr("test.yaml:5:20: moe.expert_parallel: expected a divisor of the world "
                        "size 6, got '4'"));
  // HSDP 4 x 4: 8 divides the world (16) and the experts (8) but not the shard group (4).
  EXPECT_THAT(ParseError(Plan16(kMoe4, "fsdp2",
                                {"fsdp2: {mesh: {replicate: 4}}", "moe:", "  expert_parallel: 8"})),
              HasSubstr("test.yaml:6:20: moe.expert_parallel: expected a divisor of the HSDP "
                        "shard group size 4"));
}

}  // namespace
}  // namespace shardscope::sim

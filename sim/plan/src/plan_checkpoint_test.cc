// Tests for the checkpoint: section: FSDP1 optimizer-state consolidation and fairscale's
// no_broadcast_optim_state.
#include "shardscope/sim/plan/plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "plan_test_support.h"

namespace shardscope::sim {
namespace {

using ::testing::HasSubstr;

TEST(PlanCheckpointTest, Consolidation) {
  Plan plan =
      ParseOk(Plan16(kDense4, "fsdp1", {"checkpoint: {consolidate_optimizer_state: true}"}));
  EXPECT_TRUE(plan.checkpoint.consolidate_optimizer_state);
  EXPECT_FALSE(plan.checkpoint.no_broadcast_optim_state);
  plan = ParseOk(Plan16(kMoe4, "fsdp1",
                        {"fsdp1: {implementation: fairscale}", "moe: {expert_parallel: 8}",
                         "checkpoint: {consolidate_optimizer_state: true, "
                         "no_broadcast_optim_state: true}"}));
  EXPECT_TRUE(plan.checkpoint.consolidate_optimizer_state);
  EXPECT_TRUE(plan.checkpoint.no_broadcast_optim_state);
}

TEST(PlanCheckpointTest, Errors) {
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2", {"checkpoint:",
                                                   "  consolidate_optimizer_state: true"})),
              HasSubstr("test.yaml:4:1: checkpoint: expected a checkpoint section only with "
                        "strategy fsdp1"));
  EXPECT_THAT(ParseError(Plan16(kMoe4, "fsdp1",
                                {"moe: {expert_parallel: 8}", "checkpoint:",
                                 "  consolidate_optimizer_state: true",
                                 "  no_broadcast_optim_state: true"})),
              HasSubstr("test.yaml:7:3: checkpoint.no_broadcast_optim_state: expected "
                        "no_broadcast_optim_state only with fsdp1.implementation fairscale"));
  EXPECT_THAT(ParseError(Plan16(kMoe4, "fsdp1",
                                {"fsdp1: {implementation: fairscale}", "checkpoint:",
                                 "  consolidate_optimizer_state: true",
                                 "  no_broadcast_optim_state: true"})),
              HasSubstr("expected no_broadcast_optim_state only for an MoE model with "
                        "moe.expert_parallel > 1 (it keeps expert state on the rank that owns "
                        "it), got model.experts 8 and moe.expert_parallel 1"));
  EXPECT_THAT(ParseError(Plan16(kMoe4, "fsdp1",
                                {"fsdp1: {implementation: fairscale}", "moe: {expert_parallel: 8}",
                                 "checkpoint:", "  no_broadcast_optim_state: true"})),
              HasSubstr("test.yaml:7:3: checkpoint.no_broadcast_optim_state: expected "
                        "no_broadcast_optim_state only with consolidate_optimizer_state: true"));
  // no_broadcast_optim_state: false is always fine.
  ParseOk(Plan16(kDense4, "fsdp1", {"checkpoint: {no_broadcast_optim_state: false}"}));
}

}  // namespace
}  // namespace shardscope::sim

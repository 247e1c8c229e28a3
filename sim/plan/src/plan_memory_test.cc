// Tests for the oom: section: Composer's catch_and_sync policy and its sync hooks, on torch FSDP1.
#include "shardscope/sim/plan/plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "plan_test_support.h"

namespace shardscope::sim {
namespace {

using ::testing::HasSubstr;

std::string Fsdp1Plan(std::string_view oom_line) {
  return Lines({"model: llama3-8b", "cluster: {preset: dgx-a100, nodes: 1}", "strategy: fsdp1",
                oom_line});
}

TEST(PlanOomTest, DefaultIsRaiseWithoutHooks) {
  const Plan plan = ParseOk(Fsdp1Plan(""));
  EXPECT_EQ(plan.oom.policy, OomPolicy::kRaise);
  EXPECT_FALSE(plan.oom.sync_hooks);
}

TEST(PlanOomTest, CatchAndSyncWithAndWithoutHooks) {
  const Plan caught = ParseOk(Fsdp1Plan("oom: {policy: catch_and_sync}"));
  EXPECT_EQ(caught.oom.policy, OomPolicy::kCatchAndSync);
  EXPECT_FALSE(caught.oom.sync_hooks);
  const Plan hooked = ParseOk(Fsdp1Plan("oom: {policy: catch_and_sync, sync_hooks: true}"));
  EXPECT_EQ(hooked.oom.policy, OomPolicy::kCatchAndSync);
  EXPECT_TRUE(hooked.oom.sync_hooks);
  EXPECT_EQ(ParseOk(Fsdp1Plan("oom: {policy: raise, sync_hooks: false}")).oom.policy, OomPolicy::kRaise);
}

TEST(PlanOomTest, RejectsOtherStrategiesHooksWithoutCatchAndBadValues) {
  const std::string fsdp2 = ParseError(BasePlan() + "oom: {policy: catch_and_sync}\n");
  EXPECT_THAT(fsdp2, HasSubstr("test.yaml:10:"));
  EXPECT_THAT(fsdp2, HasSubstr("oom.policy"));
  EXPECT_THAT(fsdp2, HasSubstr("only with strategy fsdp1"));
  EXPECT_THAT(fsdp2, HasSubstr("strategy fsdp2"));
  EXPECT_THAT(ParseError(Fsdp1Plan("oom: {policy: raise, sync_hooks: true}")),
              HasSubstr("sync_hooks only with policy catch_and_sync"));
  EXPECT_THAT(ParseError(Fsdp1Plan("oom: {sync_hooks: true}")),
              HasSubstr("sync_hooks only with policy catch_and_sync"));
  EXPECT_THAT(ParseError(Fsdp1Plan("oom: {policy: retry}")), HasSubstr("oom.policy"));
  EXPECT_THAT(ParseError(Fsdp1Plan("oom: {policy: raise, hooks: true}")), HasSubstr("sync_hooks"));
  EXPECT_THAT(ParseError(Lines({"model: llama3-8b", "cluster: {preset: dgx-a100, nodes: 1}",
                                "strategy: fsdp1", "fsdp1: {implementation: fairscale}",
                                "oom: {policy: catch_and_sync}"})),
              HasSubstr("implementation fairscale"));
}

}  // namespace
}  // namespace shardscope::sim

// Tests for the ddp: section: gradient buckets and no_sync.
#include "shardscope/sim/plan/plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "plan_test_support.h"

namespace shardscope::sim {
namespace {


TEST(PlanTest, DdpPlan) {
  const Plan plan = ParseOk(Lines({
      "model: llama3-8b",
      "cluster: {preset: dgx-a100, nodes: 1}",
      "strategy: ddp",
      "ddp: {bucket_cap_mb: 50.5}",
  }));
  EXPECT_EQ(plan.strategy, Strategy::kDdp);
  EXPECT_DOUBLE_EQ(plan.ddp.bucket_cap_mb, 50.5);
  // An explicit bucket_cap_mb caps the first bucket too (DistributedDataParallel.__init__:
  // the 1 MiB first bucket only with bucket_cap_mb=None).
  EXPECT_DOUBLE_EQ(plan.ddp.first_bucket_mb, 50.5);
  const Plan defaults = ParseOk(Lines({
      "model: llama3-8b",
      "cluster: {preset: dgx-a100, nodes: 1}",
      "strategy: ddp",
  }));
  EXPECT_DOUBLE_EQ(defaults.ddp.first_bucket_mb, 1);
  EXPECT_DOUBLE_EQ(defaults.ddp.bucket_cap_mb, 25);
}

TEST(PlanDdpTest, NoSync) {
  const Plan plan =
      ParseOk(Plan16(kDense4, "ddp", {"training: {grad_accum_steps: 4}", "ddp: {no_sync: true}"}));
  EXPECT_TRUE(plan.ddp.no_sync);
  EXPECT_FALSE(ParseOk(Plan16(kDense4, "ddp", {})).ddp.no_sync);
}

}  // namespace
}  // namespace shardscope::sim

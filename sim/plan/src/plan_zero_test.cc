// Tests for the zero: section: DeepSpeed ZeRO's defaults per stage, the stage-3 knobs, and the
// keys refused at the wrong stage.
#include "shardscope/sim/plan/plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "plan_test_support.h"

namespace shardscope::sim {
namespace {

using ::testing::HasSubstr;

TEST(PlanZeroTest, DefaultsAndOverlapComm) {
  for (const char* stage : {"zero1", "zero2", "zero3"}) {
    const Plan plan = ParseOk(Plan16(kDense4, stage, {}));
    EXPECT_EQ(StrategyName(plan.strategy), stage);
    // DeepSpeedZeroConfig.overlap_comm_valid: true for stage 3 only.
    EXPECT_EQ(plan.zero.overlap_comm, std::string(stage) == "zero3") << stage;
    EXPECT_EQ(plan.zero.reduce_bucket_size, 500'000'000);
    EXPECT_EQ(plan.zero.allgather_bucket_size, 500'000'000);
    EXPECT_TRUE(plan.zero.contiguous_gradients);
    EXPECT_EQ(plan.zero.stage3_prefetch_bucket_size, 50'000'000);
    EXPECT_EQ(plan.zero.stage3_max_live_parameters, 1'000'000'000);
    EXPECT_EQ(plan.zero.stage3_max_reuse_distance, 1'000'000'000);
    EXPECT_EQ(plan.zero.stage3_param_persistence_threshold, 100'000);
  }
  EXPECT_TRUE(ParseOk(Plan16(kDense4, "zero2", {"zero: {overlap_comm: true}"})).zero.overlap_comm);
  EXPECT_FALSE(
      ParseOk(Plan16(kDense4, "zero3", {"zero: {overlap_comm: false}"})).zero.overlap_comm);
}

TEST(PlanZeroTest, Stage3Knobs) {
  const Plan plan = ParseOk(Plan16(kDense4, "zero3",
                                   {"training: {dtype: fp32}", "zero:",
                                    "  reduce_bucket_size: 2e8",
                                    "  stage3_prefetch_bucket_size: 5.0e7",
                                    "  stage3_max_live_parameters: 300000000",
                                    "  stage3_max_reuse_distance: 0",
                                    "  stage3_param_persistence_threshold: 1e4",
                                    "  contiguous_gradients: false",
                                    "  legacy_prefetch_off_by_one: true",
                                    "  legacy_stream_sync_in_fetch_release: true",
                                    "  legacy_debug_norm_sync: true"}));
  EXPECT_EQ(plan.training.dtype, traces::DType::kFloat32);  // fp32 with ZeRO is fine
  EXPECT_EQ(plan.zero.reduce_bucket_size, 200'000'000);
  EXPECT_EQ(plan.zero.stage3_prefetch_bucket_size, 50'000'000);
  EXPECT_EQ(plan.zero.stage3_max_live_parameters, 300'000'000);
  EXPECT_EQ(plan.zero.stage3_max_reuse_distance, 0);
  EXPECT_EQ(plan.zero.stage3_param_persistence_threshold, 10'000);
  EXPECT_FALSE(plan.zero.contiguous_gradients);
  EXPECT_TRUE(plan.zero.legacy_prefetch_off_by_one);
  EXPECT_TRUE(plan.zero.legacy_stream_sync_in_fetch_release);
  EXPECT_TRUE(plan.zero.legacy_debug_norm_sync);
  EXPECT_EQ(ParseOk(Plan16(kDense4, "zero1", {"zero: {allgather_bucket_size: 1.5e8}"}))
                .zero.allgather_bucket_size,
            150'000'000);
}

TEST(PlanZeroTest, Errors) {
  EXPECT_THAT(ParseError(Plan16(kDense4, "zero2", {"zero:", "  reduce_bucket_size: 1.5"})),
              HasSubstr("test.yaml:5:23: zero.reduce_bucket_size: expected a whole number of "
                        "elements in [0, 2^50] (an integer, or a float such as 5e8), got '1.5' "
                        "(not a whole number)"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "zero2", {"zero:", "  reduce_bucket_size: -1"})),
              HasSubstr("got '-1'"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "zero2", {"zero:", "  reduce_bucket_size: 1e300"})),
              HasSubstr("got '1e300'"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "zero2", {"zero:", "  stage3_max_live_parameters: 1e9"})),
              HasSubstr("test.yaml:5:3: zero.stage3_max_live_parameters: expected "
                        "stage3_max_live_parameters only with strategy zero3 (it only applies "
                        "to ZeRO stage 3), got stage3_max_live_parameters with strategy zero2"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "zero1", {"zero:", "  legacy_debug_norm_sync: true"})),
              HasSubstr("test.yaml:5:3: zero.legacy_debug_norm_sync: expected "
                        "legacy_debug_norm_sync only with strategy zero3"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "zero3", {"zero:", "  allgather_bucket_size: 5e8"})),
              HasSubstr("test.yaml:5:3: zero.allgather_bucket_size: expected "
                        "allgather_bucket_size only with zero1 or zero2"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "zero3", {"fsdp2: {reshard_after_forward: true}"})),
              HasSubstr("test.yaml:4:1: fsdp2: expected only the 'zero' section, got section "
                        "'fsdp2' given but strategy is zero3"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2", {"zero: {overlap_comm: true}"})),
              HasSubstr("test.yaml:4:1: zero: expected only the 'fsdp2' section, got section "
                        "'zero' given but strategy is fsdp2"));
}

TEST(PlanZeroTest, Fp8IsNotADeepSpeedPrecision) {
  const std::string hopper = GpuPresetOfArch(GpuArch::kHopper);
  ASSERT_FALSE(hopper.empty());
  const std::string message =
      ParseError(Lines({"model: llama3-8b", "cluster: {preset: dgx-a100, gpu: " + hopper + "}",
                        "strategy: zero3", "training:", "  dtype: fp8"}));
  EXPECT_THAT(message, HasSubstr("test.yaml:5:10: training.dtype: expected bf16, fp16 or fp32 "
                                 "with strategy zero3 (DeepSpeed ZeRO has no fp8 precision"));
  // The same dtype is fine under FSDP2.
  ParseOk(Lines({"model: llama3-8b", "cluster: {preset: dgx-a100, gpu: " + hopper + "}",
                 "strategy: fsdp2", "training:", "  dtype: fp8"}));
}

}  // namespace
}  // namespace shardscope::sim

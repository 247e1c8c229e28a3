// Tests for the training: section: activation checkpointing, gradient clipping, precision, and
// the dtype and sequence length checked against the GPU and the model.
#include "shardscope/sim/plan/plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "plan_test_support.h"

namespace shardscope::sim {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(PlanErrorTest, SeqLenBeyondLearnedPositions) {
  const std::string message = ParseError(Lines({
      "model: {preset: llama3-8b, learned_positions: true, max_positions: 2048}",
      "cluster: dgx-a100",
      "strategy: fsdp2",
      "training:",
      "  seq_len: 4096",
  }));
  EXPECT_THAT(message, AllOf(HasSubstr("test.yaml:5:12: training.seq_len: "),
                             HasSubstr("max_positions (2048)")));
}

TEST(PlanErrorTest, Fp8NeedsHardwareSupport) {
  std::string text = BasePlan();
  text.replace(text.find("dtype: bf16"), 11, "dtype: fp8");
  // dgx-a100: Ampere has no fp8 tensor cores.
  EXPECT_THAT(ParseError(text), AllOf(HasSubstr("test.yaml:7:10: training.dtype: expected a dtype "
                                                "the GPU "),
                                      HasSubstr("got 'fp8'")));
}

TEST(PlanErrorTest, DefaultDtypeNeedsHardwareSupport) {
  const std::string volta = GpuPresetOfArch(GpuArch::kVolta);
  if (volta.empty()) GTEST_SKIP() << "no Volta GPU preset";
  StatusOr<GpuSpec> gpu = FindGpuPreset(volta);
  ASSERT_TRUE(gpu.ok());
  if (PeakFlops(*gpu, traces::DType::kBFloat16) > 0) GTEST_SKIP() << "preset claims bf16";
  const std::string message = ParseError(Lines({
      "model: llama3-8b",
      "cluster: {preset: dgx-a100, gpu: " + volta + "}",
      "strategy: fsdp2",
  }));
  EXPECT_THAT(message, AllOf(HasSubstr("training.dtype: expected a dtype the GPU"),
                             HasSubstr("got the default 'bf16'")));
}

TEST(PlanTrainingTest, SelectiveCheckpointingAndClipping) {
  const Plan plan = ParseOk(Plan16(kDense4, "fsdp2",
                                   {"training:", "  activation_checkpointing: selective",
                                    "  selective_ac_every: 3", "  max_grad_norm: 0.5"}));
  EXPECT_EQ(plan.training.activation_checkpointing, ActivationCheckpointing::kSelective);
  EXPECT_EQ(plan.training.selective_ac_every, 3);
  EXPECT_DOUBLE_EQ(plan.training.max_grad_norm, 0.5);
  // Defaults: torchtitan's selective_ac_option "2" and max_norm 1.0.
  const Plan defaults = ParseOk(Plan16(kDense4, "fsdp2", {}));
  EXPECT_EQ(defaults.training.selective_ac_every, 2);
  EXPECT_DOUBLE_EQ(defaults.training.max_grad_norm, 1.0);
  EXPECT_DOUBLE_EQ(ParseOk(Plan16(kDense4, "fsdp2", {"training: {max_grad_norm: 0}"}))
                       .training.max_grad_norm,
                   0.0);
}

TEST(PlanTrainingTest, SelectiveAcEveryOnlyWithSelective) {
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2",
                                {"training:", "  activation_checkpointing: full",
                                 "  selective_ac_every: 3"})),
              HasSubstr("test.yaml:6:3: training.selective_ac_every: expected no "
                        "selective_ac_every unless activation_checkpointing is selective, got "
                        "selective_ac_every with activation_checkpointing full"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2", {"training:", "  selective_ac_every: 2"})),
              HasSubstr("with activation_checkpointing none"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2",
                                {"training:", "  activation_checkpointing: selective",
                                 "  selective_ac_every: 0"})),
              HasSubstr("test.yaml:6:23: training.selective_ac_every: expected a positive"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2", {"training:", "  max_grad_norm: -1"})),
              HasSubstr("test.yaml:5:18: training.max_grad_norm: expected a number >= 0"));
}

TEST(PlanTrainingTest, PureBf16NeedsBf16AndAStrategyThatShardsABf16Model) {
  const Plan plan = ParseOk(Lines({"model: llama3-8b", "cluster: {preset: dgx-a100}", "strategy: fsdp2",
                                   "training:", "  precision: pure_bf16"}));
  EXPECT_EQ(plan.training.precision, Precision::kPureBf16);
  EXPECT_EQ(plan.fsdp2.reduce_dtype, traces::DType::kBFloat16);  // no MixedPrecisionPolicy
  EXPECT_THAT(ParseError(Lines({"model: llama3-8b", "cluster: {preset: dgx-a100}", "strategy: fsdp2",
                                "training:", "  precision: pure_bf16", "  dtype: fp16"})),
              HasSubstr("test.yaml:5:14: training.precision: expected mixed, or training.dtype bf16"));
  EXPECT_THAT(ParseError(Lines({"model: llama3-8b", "cluster: {preset: dgx-a100}", "strategy: zero3",
                                "training:", "  precision: pure_bf16"})),
              HasSubstr("test.yaml:5:14: training.precision: expected mixed with strategy zero3 "
                        "(pure_bf16 is modelled for fsdp2 and ddp"));
}

}  // namespace
}  // namespace shardscope::sim

// Tests for what a plan says about the job before its first step: training.cuda_version (its
// default per release and GPU, and the GPU's minimum) and the init setup (training.init.device,
// fsdp1.sync_module_states / device_id, zero.zero_init) with the errors each framework would
// raise, pointing at the offending key.
#include "shardscope/sim/plan/plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "plan_test_support.h"

namespace shardscope::sim {
namespace {

using ::testing::HasSubstr;

std::string Plan8(std::string_view gpu_cluster, std::string_view strategy, std::string_view training,
                  std::string_view section = "") {
  return Lines({"model: llama3-8b", gpu_cluster, std::string("strategy: ") + std::string(strategy), training, section});
}

TEST(PlanInitTest, CudaVersionDefaultsToTheReleasesBuildForTheGpu) {
  // PyTorch 1.8: CUDA 10.2 on PyPI; an A100 needs its cu111 build.
  Plan plan = ParseOk(Plan8("cluster: {preset: aws-p3dn, nodes: 1}", "zero2",
                            "training: {dtype: fp16, pytorch_version: \"1.8\"}"));
  EXPECT_EQ(plan.training.cuda_major, 10);
  EXPECT_EQ(plan.training.cuda_minor, 2);
  plan = ParseOk(Plan8("cluster: {preset: aws-p4d, nodes: 1}", "zero2", "training: {dtype: fp16, pytorch_version: \"1.8\"}"));
  EXPECT_EQ(plan.training.cuda_major, 11);
  EXPECT_EQ(plan.training.cuda_minor, 1);
  // The default release (2.11) on an H100: 12.8.
  plan = ParseOk(Plan8("cluster: {preset: dgx-h100, nodes: 1}", "fsdp2", "training: {seq_len: 2048}"));
  EXPECT_EQ(plan.training.cuda_major, 12);
  EXPECT_EQ(plan.training.cuda_minor, 8);
  // Given: kept as written ("11.1.1" reads as 11.1).
  plan = ParseOk(Plan8("cluster: {preset: aws-p3dn, nodes: 1}", "zero2",
                       "training: {dtype: fp16, pytorch_version: \"1.8\", cuda_version: \"11.1.1\"}"));
  EXPECT_EQ(plan.training.cuda_major, 11);
  EXPECT_EQ(plan.training.cuda_minor, 1);
}

TEST(PlanInitTest, CudaVersionErrors) {
  EXPECT_THAT(ParseError(Plan8("cluster: {preset: dgx-a100, nodes: 1}", "fsdp2", "training: {cuda_version: 12}")),
              HasSubstr("test.yaml:4:26: training.cuda_version: expected a CUDA release as \"major.minor\""));
  EXPECT_THAT(ParseError(Plan8("cluster: {preset: dgx-a100, nodes: 1}", "fsdp2", "training: {cuda_version: \"9.2\"}")),
              HasSubstr("training.cuda_version: expected a CUDA release"));
  // CUDA 10.2 has no sm_80 kernels.
  EXPECT_THAT(ParseError(Plan8("cluster: {preset: dgx-a100, nodes: 1}", "fsdp2",
                               "training: {pytorch_version: \"1.8\", cuda_version: \"10.2\"}")),
              HasSubstr("test.yaml:4:50: training.cuda_version: expected CUDA 11.0 or later on a100-sxm4-80gb"));
}

TEST(PlanInitTest, InitDeviceDefaultsPerStrategy) {
  EXPECT_EQ(InitDeviceOf(ParseOk(Plan8("cluster: {preset: dgx-a100, nodes: 1}", "fsdp2", "training: {seq_len: 2048}"))),
            InitDevice::kMeta);
  EXPECT_EQ(InitDeviceOf(ParseOk(Plan8("cluster: {preset: dgx-a100, nodes: 1}", "ddp", "training: {seq_len: 2048}"))),
            InitDevice::kCpu);
  const Plan plan =
      ParseOk(Plan8("cluster: {preset: dgx-a100, nodes: 1}", "fsdp1", "training: {init: {device: cuda}}",
                    "fsdp1: {sync_module_states: true, device_id: true}"));
  EXPECT_EQ(InitDeviceOf(plan), InitDevice::kCuda);
  EXPECT_TRUE(plan.fsdp1.sync_module_states);
  EXPECT_TRUE(plan.fsdp1.device_id);
  EXPECT_TRUE(ParseOk(Plan8("cluster: {preset: dgx-a100, nodes: 1}", "zero3", "training: {init: {device: meta}}",
                            "zero: {zero_init: true}"))
                  .zero.zero_init);
}

TEST(PlanInitTest, InitErrorsNameTheFrameworksRule) {
  EXPECT_THAT(ParseError(Plan8("cluster: {preset: dgx-a100, nodes: 1}", "ddp", "training: {init: {device: meta}}")),
              HasSubstr("test.yaml:4:27: training.init.device: expected cpu or cuda with strategy ddp"));
  EXPECT_THAT(ParseError(Plan8("cluster: {preset: dgx-a100, nodes: 1}", "zero3", "training: {init: {device: meta}}")),
              HasSubstr("training.init.device: expected cpu or cuda with DeepSpeed"));
  EXPECT_THAT(ParseError(Plan8("cluster: {preset: dgx-a100, nodes: 1}", "fsdp2", "training: {init: {device: gpu}}")),
              HasSubstr("training.init.device"));
  EXPECT_THAT(ParseError(Plan8("cluster: {preset: dgx-a100, nodes: 1}", "fsdp2", "training: {init: {where: cpu}}")),
              HasSubstr("training.init"));
  // FSDP raises for sync_module_states on a CPU module without device_id.
  EXPECT_THAT(ParseError(Plan8("cluster: {preset: dgx-a100, nodes: 1}", "fsdp1", "training: {seq_len: 2048}",
                               "fsdp1: {sync_module_states: true}")),
              HasSubstr("test.yaml:5:29: fsdp1.sync_module_states: expected sync_module_states only with a module on the GPU"));
  // zero.Init partitions parameters: stage 3 only.
  EXPECT_THAT(ParseError(Plan8("cluster: {preset: dgx-a100, nodes: 1}", "zero2", "training: {seq_len: 2048}",
                               "zero: {zero_init: true}")),
              HasSubstr("zero.zero_init: expected zero_init only with strategy zero3"));
  // fairscale's FSDP has neither knob.
  EXPECT_THAT(ParseError(Plan8("cluster: {preset: dgx-a100, nodes: 1}", "fsdp1", "training: {seq_len: 2048}",
                               "fsdp1: {implementation: fairscale, device_id: true}")),
              HasSubstr("fsdp1.device_id: expected no device_id with implementation fairscale"));
}

}  // namespace
}  // namespace shardscope::sim

// Tests for the cluster: section: presets with overrides (units converted), clusters from their
// GPU and links, and the world-size limit. cluster.calibration: calibration_plan_test.cc.
#include "shardscope/sim/plan/plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "plan_test_support.h"

namespace shardscope::sim {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(PlanTest, GpuMemoryOverrideReproducesPreset) {
  const Plan plan = ParseOk(Lines({
      "model: llama3-8b",
      "cluster: {preset: dgx-a100, gpu_memory_gb: 80}",
      "strategy: fsdp2",
  }));
  const StatusOr<ClusterSpec> a100 = FindClusterPreset("dgx-a100", 1);
  ASSERT_TRUE(a100.ok());
  EXPECT_EQ(plan.cluster.gpu.hbm_bytes, a100->gpu.hbm_bytes);
}

TEST(PlanTest, ClusterOverridesConvertUnits) {
  const std::string hopper = GpuPresetOfArch(GpuArch::kHopper);
  ASSERT_FALSE(hopper.empty()) << "no Hopper GPU preset";
  const Plan plan = ParseOk(Lines({
      "model: llama3-8b",
      "cluster:",
      "  preset: dgx-a100",
      "  nodes: 2",
      "  gpu: " + hopper,
      "  gpus_per_node: 4",
      "  intra_node_bandwidth_gbps: 450",
      "  inter_node_bandwidth_gbps: 12.5",
      "  gpu_memory_gb: 96",
      "strategy: fsdp2",
      "training: {dtype: fp8}",
  }));
  EXPECT_EQ(plan.cluster.gpu.name, hopper);
  EXPECT_EQ(plan.cluster.gpu.arch, GpuArch::kHopper);
  EXPECT_EQ(plan.cluster.world_size(), 8);
  EXPECT_DOUBLE_EQ(plan.cluster.intra_node_bandwidth, 450e9);
  EXPECT_DOUBLE_EQ(plan.cluster.inter_node_bandwidth, 12.5e9);
  // Memory "GB" is GiB, as GPU presets use it; bandwidth GB/s is decimal.
  EXPECT_EQ(plan.cluster.gpu.hbm_bytes, int64_t{96} << 30);
  EXPECT_EQ(plan.training.dtype, traces::DType::kFloat8E4M3);
}

TEST(PlanTest, CustomCluster) {
  const std::string hopper = GpuPresetOfArch(GpuArch::kHopper);
  ASSERT_FALSE(hopper.empty());
  const Plan plan = ParseOk(Lines({
      "model: llama3-8b",
      "cluster: {gpu: " + hopper + ", gpus_per_node: 4, intra_node_bandwidth_gbps: 300}",
      "strategy: fsdp2",
  }));
  EXPECT_EQ(plan.cluster.name, "custom");
  EXPECT_EQ(plan.cluster.world_size(), 4);
  EXPECT_DOUBLE_EQ(plan.cluster.intra_node_bandwidth, 300e9);
}

TEST(PlanErrorTest, WorldSizeTooLarge) {
  const std::string message = ParseError(Lines({
      "model: llama3-8b",
      "cluster: {preset: dgx-a100, nodes: 65536, gpus_per_node: 65536}",
      "strategy: fsdp2",
  }));
  EXPECT_THAT(message, AllOf(HasSubstr("test.yaml:2:"), HasSubstr("cluster: expected a world size"),
                             HasSubstr("1048576"), HasSubstr("65536 x 65536")));
}

}  // namespace
}  // namespace shardscope::sim

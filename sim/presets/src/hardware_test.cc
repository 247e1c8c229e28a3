// Tests for the GPU and cluster presets: the figures come from the datasheets cited in
// hardware.cc, restated here by hand.
#include "shardscope/sim/presets/hardware.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace shardscope::sim {
namespace {

using ::testing::HasSubstr;
using traces::DType;

constexpr double kTera = 1e12;
constexpr double kGiga = 1e9;
constexpr int64_t kGiB = int64_t{1} << 30;

GpuSpec Gpu(std::string_view name) {
  auto gpu = FindGpuPreset(name);
  EXPECT_TRUE(gpu.ok()) << gpu.status().message();
  return gpu.value();
}

TEST(HardwareTest, GpuPresetNamesAreTheFiveDatasheetGpus) {
  EXPECT_THAT(GpuPresetNames(),
              ::testing::ElementsAre("v100-sxm2-32gb", "a100-sxm4-40gb", "a100-sxm4-80gb",
                                     "h100-sxm5-80gb", "h200-sxm-141gb"));
}

TEST(HardwareTest, V100Figures) {
  const GpuSpec g = Gpu("v100-sxm2-32gb");
  EXPECT_EQ(g.arch, GpuArch::kVolta);
  EXPECT_EQ(g.sm_count, 80);
  EXPECT_DOUBLE_EQ(g.peak_flops_fp16, 125 * kTera);
  EXPECT_DOUBLE_EQ(g.peak_flops_fp32, 15.7 * kTera);
  EXPECT_EQ(g.peak_flops_bf16, 0);  // no bf16 tensor cores
  EXPECT_EQ(g.peak_flops_tf32, 0);
  EXPECT_EQ(g.peak_flops_fp8, 0);
  EXPECT_EQ(g.hbm_bytes, 32 * kGiB);
  EXPECT_DOUBLE_EQ(g.hbm_bandwidth, 900 * kGiga);
  EXPECT_DOUBLE_EQ(g.nvlink_bandwidth, 150 * kGiga);  // 300 GB/s bidirectional / 2
  // PCIe Gen3 x16: 8 GT/s x 16 lanes x 128/130 / 8 bits = 15.754 GB/s.
  EXPECT_NEAR(g.pcie_bandwidth, 15.7538e9, 1e5);
}

TEST(HardwareTest, A100Figures) {
  const GpuSpec g40 = Gpu("a100-sxm4-40gb");
  const GpuSpec g80 = Gpu("a100-sxm4-80gb");
  for (const GpuSpec& g : {g40, g80}) {
    EXPECT_EQ(g.arch, GpuArch::kAmpere);
    EXPECT_EQ(g.sm_count, 108);
    EXPECT_DOUBLE_EQ(g.peak_flops_bf16, 312 * kTera);
    EXPECT_DOUBLE_EQ(g.peak_flops_fp16, 312 * kTera);
    EXPECT_DOUBLE_EQ(g.peak_flops_tf32, 156 * kTera);
    EXPECT_DOUBLE_EQ(g.peak_flops_fp32, 19.5 * kTera);
    EXPECT_EQ(g.peak_flops_fp8, 0);
    EXPECT_DOUBLE_EQ(g.nvlink_bandwidth, 300 * kGiga);
    // PCIe Gen4 x16: 16 GT/s x 16 x 128/130 / 8 = 31.508 GB/s.
    EXPECT_NEAR(g.pcie_bandwidth, 31.5077e9, 1e5);
  }
  EXPECT_EQ(g40.hbm_bytes, 40 * kGiB);
  EXPECT_DOUBLE_EQ(g40.hbm_bandwidth, 1555 * kGiga);
  EXPECT_EQ(g80.hbm_bytes, 80 * kGiB);
  EXPECT_DOUBLE_EQ(g80.hbm_bandwidth, 2039 * kGiga);
}

TEST(HardwareTest, HopperFigures) {
  const GpuSpec h100 = Gpu("h100-sxm5-80gb");
  const GpuSpec h200 = Gpu("h200-sxm-141gb");
  for (const GpuSpec& g : {h100, h200}) {
    EXPECT_EQ(g.arch, GpuArch::kHopper);
    EXPECT_EQ(g.sm_count, 132);
    // Datasheet "with sparsity" 1979 / 989 / 3958 TFLOP/s halved.
    EXPECT_DOUBLE_EQ(g.peak_flops_bf16, 989.5 * kTera);
    EXPECT_DOUBLE_EQ(g.peak_flops_fp16, 989.5 * kTera);
    EXPECT_DOUBLE_EQ(g.peak_flops_tf32, 494.5 * kTera);
    EXPECT_DOUBLE_EQ(g.peak_flops_fp8, 1979 * kTera);
    EXPECT_DOUBLE_EQ(g.peak_flops_fp32, 67 * kTera);
    EXPECT_DOUBLE_EQ(g.nvlink_bandwidth, 450 * kGiga);
    // PCIe Gen5 x16: 32 GT/s x 16 x 128/130 / 8 = 63.015 GB/s.
    EXPECT_NEAR(g.pcie_bandwidth, 63.0154e9, 1e5);
  }
  EXPECT_EQ(h100.hbm_bytes, 80 * kGiB);
  EXPECT_DOUBLE_EQ(h100.hbm_bandwidth, 3350 * kGiga);
  EXPECT_EQ(h200.hbm_bytes, 141 * kGiB);
  EXPECT_DOUBLE_EQ(h200.hbm_bandwidth, 4800 * kGiga);
}

// The driver-reported totals restated from the postings cited in hardware.cc, and what they
// leave of the datasheet capacity: every "NN GB" part reports between 0.2 and 1.9 GiB less.
TEST(HardwareTest, UsableCapacityIsTheDriverReportedTotal) {
  // 31.749 GiB x 2^30 = 34,090,229,170.2 B, rounded.
  EXPECT_EQ(Gpu("v100-sxm2-32gb").usable_bytes, 34'090'229'170);
  EXPECT_EQ(Gpu("a100-sxm4-40gb").usable_bytes, 42'298'834'944);
  EXPECT_EQ(Gpu("a100-sxm4-80gb").usable_bytes, 85'100'068'864);
  EXPECT_EQ(Gpu("h100-sxm5-80gb").usable_bytes, 85'045'477'376);
  EXPECT_EQ(Gpu("h200-sxm-141gb").usable_bytes, int64_t{143'156} << 20);
  for (const std::string& name : GpuPresetNames()) {
    const GpuSpec g = Gpu(name);
    EXPECT_LT(g.usable_bytes, g.hbm_bytes) << name;
    EXPECT_GT(g.usable_bytes, g.hbm_bytes - 2 * kGiB) << name;
  }
}

TEST(HardwareTest, PeakFlopsPicksTheDtypeRate) {
  const GpuSpec h100 = Gpu("h100-sxm5-80gb");
  EXPECT_DOUBLE_EQ(PeakFlops(h100, DType::kBFloat16), 989.5 * kTera);
  EXPECT_DOUBLE_EQ(PeakFlops(h100, DType::kFloat16), 989.5 * kTera);
  EXPECT_DOUBLE_EQ(PeakFlops(h100, DType::kTFloat32), 494.5 * kTera);
  EXPECT_DOUBLE_EQ(PeakFlops(h100, DType::kFloat32), 67 * kTera);
  EXPECT_DOUBLE_EQ(PeakFlops(h100, DType::kFloat8E4M3), 1979 * kTera);
  EXPECT_DOUBLE_EQ(PeakFlops(h100, DType::kFloat8E5M2), 1979 * kTera);
  EXPECT_EQ(PeakFlops(h100, DType::kInt32), 0);
  const GpuSpec v100 = Gpu("v100-sxm2-32gb");
  EXPECT_EQ(PeakFlops(v100, DType::kBFloat16), 0);
  EXPECT_EQ(PeakFlops(v100, DType::kFloat8E4M3), 0);
  EXPECT_DOUBLE_EQ(PeakFlops(v100, DType::kFloat16), 125 * kTera);
}

TEST(HardwareTest, UnknownGpuListsTheValidNames) {
  auto gpu = FindGpuPreset("h100");
  ASSERT_FALSE(gpu.ok());
  EXPECT_EQ(gpu.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(gpu.status().message(), HasSubstr("'h100'"));
  EXPECT_THAT(gpu.status().message(), HasSubstr("h100-sxm5-80gb"));
  EXPECT_THAT(gpu.status().message(), HasSubstr("v100-sxm2-32gb"));
}

TEST(HardwareTest, ClusterPresetNames) {
  EXPECT_THAT(ClusterPresetNames(),
              ::testing::ElementsAre("dgx-a100", "dgx-h100", "aws-p3dn", "aws-p4d"));
}

TEST(HardwareTest, UnknownClusterListsTheValidNames) {
  auto cluster = FindClusterPreset("dgx-b200", 1);
  ASSERT_FALSE(cluster.ok());
  EXPECT_EQ(cluster.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(cluster.status().message(), HasSubstr("dgx-b200"));
  EXPECT_THAT(cluster.status().message(), HasSubstr("dgx-a100, dgx-h100, aws-p3dn, aws-p4d"));
}

TEST(HardwareTest, ClusterNeedsAtLeastOneNode) {
  for (int32_t nodes : {0, -3}) {
    auto cluster = FindClusterPreset("dgx-h100", nodes);
    ASSERT_FALSE(cluster.ok());
    EXPECT_EQ(cluster.status().code(), StatusCode::kInvalidInput);
    EXPECT_THAT(cluster.status().message(), HasSubstr("nodes must be >= 1"));
  }
}

TEST(HardwareTest, DgxA100) {
  auto c = FindClusterPreset("dgx-a100", 4);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->gpu.name, "a100-sxm4-80gb");
  EXPECT_EQ(c->gpus_per_node, 8);
  EXPECT_EQ(c->nodes, 4);
  EXPECT_EQ(c->world_size(), 32);
  EXPECT_EQ(c->NodeOf(17), 2);
  EXPECT_EQ(c->fabric, IntraNodeFabric::kNvSwitch);
  EXPECT_DOUBLE_EQ(c->intra_node_bandwidth, 300 * kGiga);
  EXPECT_DOUBLE_EQ(c->inter_node_bandwidth, 25 * kGiga);  // 200 Gb/s HDR / 8
  EXPECT_EQ(c->nics_per_node, 8);
  EXPECT_EQ(c->cpu_vendor, CpuVendor::kAmd);
  EXPECT_TRUE(c->gpu_direct_rdma);
}

TEST(HardwareTest, DgxH100) {
  auto c = FindClusterPreset("dgx-h100", 1);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->gpu.name, "h100-sxm5-80gb");
  EXPECT_EQ(c->fabric, IntraNodeFabric::kNvSwitch);
  EXPECT_DOUBLE_EQ(c->intra_node_bandwidth, 450 * kGiga);
  EXPECT_DOUBLE_EQ(c->inter_node_bandwidth, 50 * kGiga);  // 400 Gb/s NDR / 8
  EXPECT_EQ(c->nics_per_node, 8);
  EXPECT_EQ(c->cpu_vendor, CpuVendor::kIntel);
}

TEST(HardwareTest, AwsP3dn) {
  auto c = FindClusterPreset("aws-p3dn", 2);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->gpu.name, "v100-sxm2-32gb");
  EXPECT_EQ(c->fabric, IntraNodeFabric::kNvLinkHybridCubeMesh);
  EXPECT_DOUBLE_EQ(c->intra_node_bandwidth, 150 * kGiga);  // six 25 GB/s links
  // 100 Gb/s per node = 12.5 GB/s, / 8 GPUs.
  EXPECT_DOUBLE_EQ(c->inter_node_bandwidth, 1.5625 * kGiga);
  EXPECT_EQ(c->nics_per_node, 1);
  EXPECT_FALSE(c->gpu_direct_rdma);
}

TEST(HardwareTest, AwsP4d) {
  auto c = FindClusterPreset("aws-p4d", 2);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->gpu.name, "a100-sxm4-40gb");
  EXPECT_EQ(c->fabric, IntraNodeFabric::kNvSwitch);
  EXPECT_DOUBLE_EQ(c->intra_node_bandwidth, 300 * kGiga);
  // 400 Gb/s per node = 50 GB/s, / 8 GPUs.
  EXPECT_DOUBLE_EQ(c->inter_node_bandwidth, 6.25 * kGiga);
  EXPECT_EQ(c->nics_per_node, 4);
  EXPECT_TRUE(c->gpu_direct_rdma);
}

TEST(HardwareTest, Names) {
  EXPECT_EQ(GpuArchName(GpuArch::kVolta), "volta");
  EXPECT_EQ(GpuArchName(GpuArch::kAmpere), "ampere");
  EXPECT_EQ(GpuArchName(GpuArch::kHopper), "hopper");
  EXPECT_EQ(IntraNodeFabricName(IntraNodeFabric::kNvSwitch), "nvswitch");
  EXPECT_EQ(IntraNodeFabricName(IntraNodeFabric::kNvLinkHybridCubeMesh),
            "nvlink-hybrid-cube-mesh");
  EXPECT_EQ(IntraNodeFabricName(IntraNodeFabric::kPcie), "pcie");
}

}  // namespace
}  // namespace shardscope::sim

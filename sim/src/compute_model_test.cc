// Tests for the roofline compute model. Expected durations are worked out by hand from the
// formula in compute_model.h and the constants of ComputeModelConfig::Default():
//   GEMM efficiency >= 1e11 FLOPs: 795 / 989.5 = 0.803436...
//   attention efficiency: (0.50 + 0.73) / 2 = 0.615
//   memory efficiency: 3.0 / 3.35 = 0.895522...
//   kernel and memcpy floor: 2000 ns.
// Results are ceil()ed to whole ns; EXPECT_NEAR(.., 1) absorbs the last floating-point ulp.
#include "shardscope/sim/compute_model.h"

#include <gtest/gtest.h>

namespace shardscope::sim {
namespace {

using traces::AttentionDesc;
using traces::DType;
using traces::FixedDurationDesc;
using traces::GemmDesc;
using traces::MemcpyKind;
using traces::MemoryBoundDesc;

constexpr int64_t kGiB = int64_t{1} << 30;

ComputeModel ModelFor(std::string_view gpu_name) {
  auto gpu = FindGpuPreset(gpu_name);
  EXPECT_TRUE(gpu.ok());
  return ComputeModel(gpu.value(), ComputeModelConfig::Default());
}

TEST(ComputeModelTest, DefaultConfigValues) {
  const ComputeModelConfig c = ComputeModelConfig::Default();
  ASSERT_EQ(c.gemm_efficiency.size(), 4u);
  for (size_t i = 1; i < c.gemm_efficiency.size(); ++i) {
    EXPECT_LT(c.gemm_efficiency[i - 1].min_flops, c.gemm_efficiency[i].min_flops);
    EXPECT_LE(c.gemm_efficiency[i - 1].efficiency, c.gemm_efficiency[i].efficiency);
  }
  EXPECT_NEAR(c.gemm_efficiency.back().efficiency, 795.0 / 989.5, 1e-12);
  EXPECT_NEAR(c.attention_efficiency, 0.615, 1e-12);
  EXPECT_NEAR(c.memory_efficiency, 3.0 / 3.35, 1e-12);
  EXPECT_EQ(c.kernel_floor_ns, 2000);
  EXPECT_EQ(c.memcpy_floor_ns, 2000);
}

TEST(ComputeModelTest, KernelFlops) {
  // 2 x 128 x 256 x 64 x 3 = 12,582,912.
  EXPECT_DOUBLE_EQ(KernelFlops(GemmDesc{128, 256, 64, 3, DType::kBFloat16}), 12582912.0);
  AttentionDesc a{2, 16, 4, 1024, 2048, 64, /*causal=*/false, /*backward=*/false,
                  DType::kBFloat16};
  // 4 x b x h x sq x skv x d = 4 x 2 x 16 x 1024 x 2048 x 64 = 17,179,869,184.
  EXPECT_DOUBLE_EQ(KernelFlops(a), 17179869184.0);
  a.causal = true;  // halved
  EXPECT_DOUBLE_EQ(KernelFlops(a), 8589934592.0);
  a.backward = true;  // x 2.5
  EXPECT_DOUBLE_EQ(KernelFlops(a), 21474836480.0);
  EXPECT_EQ(KernelFlops(MemoryBoundDesc{100, 200}), 0);
  EXPECT_EQ(KernelFlops(FixedDurationDesc{5000}), 0);
}

TEST(ComputeModelTest, KernelBytes) {
  // (m k + k n + m n) x batch x 2 bytes = (128x64 + 64x256 + 128x256) x 3 x 2
  // = (8192 + 16384 + 32768) x 6 = 344,064.
  EXPECT_DOUBLE_EQ(KernelBytes(GemmDesc{128, 256, 64, 3, DType::kBFloat16}), 344064.0);
  // fp32 doubles it.
  EXPECT_DOUBLE_EQ(KernelBytes(GemmDesc{128, 256, 64, 3, DType::kFloat32}), 688128.0);
  // GQA: Q and O are b x h x sq x d = 2 x 16 x 1024 x 64 = 2,097,152 elements each; K and V
  // are b x kv_heads x skv x d = 2 x 4 x 2048 x 64 = 1,048,576 each. Total 6,291,456
  // elements x 2 bytes = 12,582,912; backward twice that.
  AttentionDesc a{2, 16, 4, 1024, 2048, 64, true, false, DType::kBFloat16};
  EXPECT_DOUBLE_EQ(KernelBytes(a), 12582912.0);
  a.backward = true;
  EXPECT_DOUBLE_EQ(KernelBytes(a), 25165824.0);
  // kv_heads == 0 means no GQA: Q and O 2,097,152 elements each; K and V
  // 2 x 16 x 2048 x 64 = 4,194,304 each; 12,582,912 elements x 2 B = 25,165,824.
  AttentionDesc mha{2, 16, 0, 1024, 2048, 64, true, false, DType::kBFloat16};
  EXPECT_DOUBLE_EQ(KernelBytes(mha), 25165824.0);
  EXPECT_DOUBLE_EQ(KernelBytes(MemoryBoundDesc{100, 200}), 300.0);
  EXPECT_EQ(KernelBytes(FixedDurationDesc{5000}), 0);
}

TEST(ComputeModelTest, ComputeBoundGemmOnA100) {
  const ComputeModel model = ModelFor("a100-sxm4-80gb");
  // 8192^3 bf16: FLOPs = 2 x 8192^3 = 1,099,511,627,776 (>= 1e11: efficiency 0.803436).
  // Compute: 1.0995e12 / (312e12 x 0.8034361) = 1.0995e12 / 2.5067206e14 s = 4,386,255.26 ns.
  // Memory: 3 x 8192^2 x 2 B = 402,653,184 B / (2.039e12 x 0.8955224) = 220,514.7 ns.
  // Compute-bound: ceil(4,386,255.26) = 4,386,256 ns.
  EXPECT_NEAR(model.KernelDurationNs(GemmDesc{8192, 8192, 8192, 1, DType::kBFloat16}),
              4386256, 1);
}

TEST(ComputeModelTest, MemoryBoundOpOnA100) {
  const ComputeModel model = ModelFor("a100-sxm4-80gb");
  // 1 GiB read + 1 GiB written = 2^31 B / (2.039e12 x 0.8955224 = 1.8259701e12 B/s)
  // = 1,176,078.18 ns -> 1,176,079.
  EXPECT_NEAR(model.KernelDurationNs(MemoryBoundDesc{kGiB, kGiB}), 1176079, 1);
}

TEST(ComputeModelTest, SmallKernelsHitTheFloor) {
  const ComputeModel model = ModelFor("a100-sxm4-80gb");
  // 8 KiB / 1.826e12 B/s = 4.5 ns, far below the 2 us floor.
  EXPECT_EQ(model.KernelDurationNs(MemoryBoundDesc{4096, 4096}), 2000);
  // 2 x 64^3 = 524,288 FLOPs at 312e12 x 0.35: 4.8 ns.
  EXPECT_EQ(model.KernelDurationNs(GemmDesc{64, 64, 64, 1, DType::kBFloat16}), 2000);
}

TEST(ComputeModelTest, FixedDurationIsReturnedAsGiven) {
  const ComputeModel model = ModelFor("h100-sxm5-80gb");
  EXPECT_EQ(model.KernelDurationNs(FixedDurationDesc{123}), 123);
  EXPECT_EQ(model.KernelDurationNs(FixedDurationDesc{123456789}), 123456789);
}

TEST(ComputeModelTest, AttentionOnA100) {
  const ComputeModel model = ModelFor("a100-sxm4-80gb");
  // b=1, h=32, kv=8, s=4096, d=128, causal forward, bf16:
  // FLOPs = 4 x 32 x 4096^2 x 128 / 2 = 137,438,953,472;
  // / (312e12 x 0.615 = 1.9188e14) = 716,275.55 ns -> 716,276.
  // Bytes: (2 x 32 + 2 x 8) x 4096 x 128 x 2 = 83,886,080 B -> 45,940 ns: compute-bound.
  AttentionDesc a{1, 32, 8, 4096, 4096, 128, true, false, DType::kBFloat16};
  EXPECT_NEAR(model.KernelDurationNs(a), 716276, 1);
}

TEST(ComputeModelTest, Bf16OnV100RunsAtTheFp32Rate) {
  const ComputeModel model = ModelFor("v100-sxm2-32gb");
  EXPECT_DOUBLE_EQ(model.EffectivePeakFlops(DType::kBFloat16), 15.7e12);
  EXPECT_DOUBLE_EQ(model.EffectivePeakFlops(DType::kFloat16), 125e12);
  // 4096^3 bf16: 2 x 4096^3 = 137,438,953,472 FLOPs (>= 1e11: 0.803436) at 15.7e12:
  // 137,438,953,472 / (15.7e12 x 0.8034361 = 1.2613946e13) = 10,895,793.33 ns -> 10,895,794.
  EXPECT_NEAR(model.KernelDurationNs(GemmDesc{4096, 4096, 4096, 1, DType::kBFloat16}),
              10895794, 1);
}

TEST(ComputeModelTest, GemmEfficiencyGrowsWithSize) {
  const ComputeModel model = ModelFor("h100-sxm5-80gb");
  // Achieved FLOP/s never falls as the GEMM grows through the buckets.
  double previous = 0;
  for (int64_t n : {256, 512, 1024, 2048, 4096, 8192, 16384}) {
    const GemmDesc g{n, n, n, 1, DType::kBFloat16};
    const double achieved = KernelFlops(g) / static_cast<double>(model.KernelDurationNs(g));
    EXPECT_GE(achieved, previous) << n;
    previous = achieved;
  }
}

TEST(ComputeModelTest, Memcpy) {
  const ComputeModel model = ModelFor("a100-sxm4-80gb");
  // h2d 1 GiB over PCIe Gen4 x16 (31.5077e9 B/s): 2^30 / 31.5077e9 = 34,078,720 ns.
  EXPECT_NEAR(model.MemcpyDurationNs(MemcpyKind::kHostToDevice, kGiB), 34078720, 1);
  EXPECT_NEAR(model.MemcpyDurationNs(MemcpyKind::kDeviceToHost, kGiB), 34078720, 1);
  // d2d 1 GiB: read + write = 2^31 B / 1.8259701e12 B/s = 1,176,078.18 -> 1,176,079.
  EXPECT_NEAR(model.MemcpyDurationNs(MemcpyKind::kDeviceToDevice, kGiB), 1176079, 1);
  // Tiny copies take the floor; empty ones nothing.
  EXPECT_EQ(model.MemcpyDurationNs(MemcpyKind::kHostToDevice, 64), 2000);
  EXPECT_EQ(model.MemcpyDurationNs(MemcpyKind::kDeviceToDevice, 64), 2000);
  EXPECT_EQ(model.MemcpyDurationNs(MemcpyKind::kHostToDevice, 0), 0);
}

}  // namespace
}  // namespace shardscope::sim

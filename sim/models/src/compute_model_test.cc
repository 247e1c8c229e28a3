// Tests for the compute model. Expected durations are worked out by hand from the model in
// compute_model.h, the tables of ComputeModelConfig::Default() and the presets' measured figures
// (hardware.cc). On the A100-SXM4-80GB (108 SMs, Ampere tiling 128x256 / 256x128 / 128x128,
// tile depth 64, 3 stages, measured 253.7 TFLOP/s at 8192^3, floor 1806 ns, copy 1672.4 GB/s):
//   8192^3 with 128x256 tiles: 64 x 32 = 2048 tiles -> ceil(2048 / 108) = 19 waves of
//   (128 steps + 2 fill) x (2 x 128 x 256 x 64 = 4,194,304 FLOPs) = 10,359,930,880 per SM
//   (128x128 tiles: 38 waves x 130 x 2,097,152, the same). Measured time 2 x 8192^3 / 253.7e12
//   = 4,333,904.72 ns, less the floor: 4,332,098.72 ns, so one SM runs 2,391.43462 FLOP/ns.
// Results are ceil()ed to whole ns; EXPECT_NEAR(.., 1) absorbs the last floating-point ulp.
#include "shardscope/sim/models/compute_model.h"

#include <gtest/gtest.h>

namespace shardscope::sim {
namespace {

using traces::AttentionDesc;
using traces::AttentionImpl;
using traces::DType;
using traces::FixedDurationDesc;
using traces::GemmDesc;
using traces::MemcpyKind;
using traces::MemoryBoundDesc;

constexpr int64_t kGiB = int64_t{1} << 30;

ComputeModel ModelFor(std::string_view gpu_name) {
  auto gpu = FindGpuPreset(gpu_name);
  EXPECT_TRUE(gpu.ok());
  return ComputeModel(gpu.value());
}

TEST(ComputeModelTest, DefaultTilingPerArchitecture) {
  const ComputeModelConfig c = ComputeModelConfig::Default();
  ASSERT_EQ(c.tiling.size(), 3u);
  EXPECT_EQ(c.tiling[0].arch, GpuArch::kVolta);
  EXPECT_EQ(c.tiling[0].tile_k, 32);
  EXPECT_EQ(c.tiling[0].stages, 2);
  EXPECT_EQ(c.tiling[1].arch, GpuArch::kAmpere);
  EXPECT_EQ(c.tiling[1].tile_k, 64);
  EXPECT_EQ(c.tiling[1].stages, 3);
  EXPECT_EQ(c.tiling[2].arch, GpuArch::kHopper);
  EXPECT_EQ(c.tiling[2].stages, 4);
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

TEST(ComputeModelTest, TheMeasuredShapeTakesTheMeasuredTime) {
  // By construction of the normalization, on every GPU with a measurement.
  for (const std::string& name : GpuPresetNames()) {
    const ComputeModel model = ModelFor(name);
    const GpuMeasuredFigures& m = model.gpu().measured;
    const GemmDesc g{m.matmul_m, m.matmul_n, m.matmul_k, 1, DType::kFloat16};
    const double expected_ns = KernelFlops(g) / m.matmul_flops_16bit * 1e9;
    EXPECT_NEAR(static_cast<double>(model.KernelDurationNs(g)), expected_ns, 1.0) << name;
  }
}

TEST(ComputeModelTest, LargeGemmOnA100) {
  const ComputeModel model = ModelFor("a100-sxm4-80gb");
  const GemmCost c = model.Gemm(GemmDesc{8192, 8192, 8192, 1, DType::kBFloat16});
  EXPECT_EQ(c.tile_m, 128);  // 128x256 first among equals
  EXPECT_EQ(c.tile_n, 256);
  EXPECT_EQ(c.split_k, 1);
  EXPECT_EQ(c.ctas, 2048);
  EXPECT_EQ(c.waves, 19);
  EXPECT_EQ(c.k_steps, 128);
  // 1806 + 4,332,098.72 = 4,333,904.72 -> 4,333,905 (the measured time).
  EXPECT_NEAR(c.duration_ns, 4333905, 1);
}

TEST(ComputeModelTest, WaveQuantizationPicksTheTileWithTheFewestIdleSms) {
  const ComputeModel model = ModelFor("a100-sxm4-80gb");
  // m = 13952 = 109 x 128, n = 256, k = 4096 (64 steps):
  //   128x256: 109 tiles -> 2 waves x 66 x 4,194,304 = 553,648,128 per SM;
  //   256x128: 55 x 2 = 110 tiles -> 2 waves, the same;
  //   128x128: 109 x 2 = 218 tiles -> 3 waves x 66 x 2,097,152 = 415,236,096: the least.
  // 415,236,096 / 2,391.43462 = 173,634.73 ns + 1806 = 175,440.73 -> 175,441.
  const GemmCost c = model.Gemm(GemmDesc{13952, 256, 4096, 1, DType::kBFloat16});
  EXPECT_EQ(c.tile_m, 128);
  EXPECT_EQ(c.tile_n, 128);
  EXPECT_EQ(c.ctas, 218);
  EXPECT_EQ(c.waves, 3);
  EXPECT_EQ(c.k_steps, 64);
  EXPECT_NEAR(c.duration_ns, 175441, 1);
  // One tile row more than a wave holds costs a whole wave: 108 x 128 rows fit in one wave
  // with 128x256 tiles (108 tiles -> 1 wave x 66 x 4,194,304 = 276,824,064 / 2,391.43462 =
  // 115,756.48 + 1806 -> 117,563).
  EXPECT_NEAR(model.KernelDurationNs(GemmDesc{108 * 128, 256, 4096, 1, DType::kBFloat16}), 117563, 1);
}

TEST(ComputeModelTest, SkinnyGemmSplitsKAndMeetsTheMemoryTerm) {
  const ComputeModel model = ModelFor("a100-sxm4-80gb");
  // m = 16 tokens, n = k = 8192: one row of tiles. Memory: (16 x 8192 x 2 + 8192^2) x 2 B =
  // 134,742,016 B / 1,672.4 B/ns = 80,568.06 ns. With 128x128 tiles (64 of them) split 8 ways:
  // 512 CTAs -> 5 waves x (16 + 2) x 2,097,152 = 188,743,680 / 2,391.43462 = 78,924.90 ns
  // compute, under the memory term; the reduction writes and reads 8 fp32 partials and writes
  // the bf16 result: (2 x 8 x 4 + 2) x 131,072 B = 8,650,752 B / 1,672.4 = 5,172.66 ns.
  // 1806 + 80,568.06 + 5,172.66 = 87,546.71 -> 87,547.
  const GemmCost c = model.Gemm(GemmDesc{16, 8192, 8192, 1, DType::kBFloat16});
  EXPECT_EQ(c.tile_n, 128);
  EXPECT_EQ(c.split_k, 8);
  EXPECT_EQ(c.waves, 5);
  EXPECT_GT(c.memory_ns, c.compute_ns);
  EXPECT_NEAR(c.duration_ns, 87547, 1);
}

TEST(ComputeModelTest, MemoryBoundKernelsPayTheFloorPlusTheirBytes) {
  const ComputeModel model = ModelFor("a100-sxm4-80gb");
  // 1806 + 2^31 B / 1,672.4 B/ns = 1806 + 1,284,072.0 -> 1,285,879.
  EXPECT_NEAR(model.KernelDurationNs(MemoryBoundDesc{kGiB, kGiB}), 1285879, 1);
  // 8 KiB: 1806 + 4.9 -> 1811.
  EXPECT_EQ(model.KernelDurationNs(MemoryBoundDesc{4096, 4096}), 1811);
}

TEST(ComputeModelTest, FixedDurationIsReturnedAsGiven) {
  const ComputeModel model = ModelFor("h100-sxm5-80gb");
  EXPECT_EQ(model.KernelDurationNs(FixedDurationDesc{123}), 123);
  EXPECT_EQ(model.KernelDurationNs(FixedDurationDesc{123456789}), 123456789);
}

TEST(ComputeModelTest, AttentionInterpolatesTheMeasuredSeries) {
  const ComputeModel model = ModelFor("a100-sxm4-80gb");
  // FlashAttention-2, A100, causal, head dim 128, forward at 4k: 197.8 TFLOP/s.
  AttentionDesc a{1, 32, 8, 4096, 4096, 128, true, false, DType::kBFloat16, AttentionImpl::kFlash2};
  EXPECT_DOUBLE_EQ(model.AttentionFlopsPerSecond(a), 197.8e12);
  // FLOPs 4 x 32 x 4096^2 x 128 / 2 = 137,438,953,472 / 197.8e12 = 694,837.98 ns -> 694,838.
  EXPECT_NEAR(model.KernelDurationNs(a), 694838, 1);
  // 6144: log2 is 12.585 between 4k (197.8) and 8k (206.2): 197.8 + 8.4 x 0.5849625 = 202.7137.
  a.seq_q = a.seq_kv = 6144;
  EXPECT_NEAR(model.AttentionFlopsPerSecond(a), 202.71368e12, 1e8);
  // Head dim 96: halfway between the 64 (168.8) and 128 (197.8) series at 4k: 183.3.
  a.seq_q = a.seq_kv = 4096;
  a.head_dim = 96;
  EXPECT_NEAR(model.AttentionFlopsPerSecond(a), 183.3e12, 1e6);
  // Beyond the grid: clamped to 16k's 210.4 and to the 512 value 108.
  a.head_dim = 128;
  a.seq_q = a.seq_kv = 65536;
  EXPECT_DOUBLE_EQ(model.AttentionFlopsPerSecond(a), 210.4e12);
  a.seq_q = a.seq_kv = 128;
  EXPECT_DOUBLE_EQ(model.AttentionFlopsPerSecond(a), 108e12);
}

TEST(ComputeModelTest, HopperCausalBackwardScalesTheNonCausalOne) {
  const ComputeModel model = ModelFor("h100-sxm5-80gb");
  // FlashAttention-3 at 4k, head dim 128: non-causal backward 542, forward causal 579 and
  // non-causal 638: 542 x 579 / 638 = 491.875.
  AttentionDesc a{1, 16, 16, 4096, 4096, 128, true, true, DType::kBFloat16, AttentionImpl::kFlash3};
  EXPECT_NEAR(model.AttentionFlopsPerSecond(a), 542.0 * 579.0 / 638.0 * 1e12, 1e6);
  // Head dim 256 has forward measurements only: the backward takes head dim 128's.
  a.causal = false;
  a.head_dim = 256;
  EXPECT_DOUBLE_EQ(model.AttentionFlopsPerSecond(a), 542e12);
  // cuDNN forward, non-causal, 64 at 16k: 413.
  AttentionDesc c{1, 8, 8, 16384, 16384, 64, false, false, DType::kBFloat16, AttentionImpl::kCudnn};
  EXPECT_DOUBLE_EQ(model.AttentionFlopsPerSecond(c), 413e12);
}

TEST(ComputeModelTest, AttentionSupportPerArchitecture) {
  EXPECT_TRUE(AttentionSupported(AttentionImpl::kFlash2, GpuArch::kAmpere));
  EXPECT_TRUE(AttentionSupported(AttentionImpl::kFlash2, GpuArch::kHopper));
  EXPECT_TRUE(AttentionSupported(AttentionImpl::kFlash3, GpuArch::kHopper));
  EXPECT_TRUE(AttentionSupported(AttentionImpl::kCudnn, GpuArch::kHopper));
  EXPECT_TRUE(AttentionSupported(AttentionImpl::kMemEfficient, GpuArch::kVolta));
  EXPECT_FALSE(AttentionSupported(AttentionImpl::kFlash3, GpuArch::kAmpere));
  EXPECT_FALSE(AttentionSupported(AttentionImpl::kFlash2, GpuArch::kVolta));
  EXPECT_FALSE(AttentionSupported(AttentionImpl::kCudnn, GpuArch::kAmpere));
}

TEST(ComputeModelTest, MemEfficientOnVoltaIsRelativeToTheUnfusedPath) {
  const ComputeModel model = ModelFor("v100-sxm2-32gb");
  // b=1, 16 heads, s=1024, d=64, causal, fp16. V100: 80 SMs, tiles of depth 32, 2 stages,
  // 97.36 TFLOP/s at 8192^3 (26 waves of 128x256 x 257 steps), floor 2000 ns, copy
  // 740.02 GiB/s. The unfused forward: QK^T (49,508 ns), scale and mask (86,458 ns each: 2 x
  // 32 MiB at 794.6 GB/s + floor), the fp32 softmax (128,686 ns), PV (57,764 ns): 408,874 ns;
  // the CUTLASS kernel is 1.25x faster: 327,099.2 -> 327,100.
  AttentionDesc a{1, 16, 16, 1024, 1024, 64, true, false, DType::kFloat16, AttentionImpl::kMemEfficient};
  EXPECT_EQ(model.MathAttentionNs(a), 408874);
  EXPECT_NEAR(model.KernelDurationNs(a), 327100, 1);
  // Backward: dP and dV, the softmax and scale backward, dQ and dK: 480,173 ns; 19% slower:
  // 571,405.87 -> 571,406.
  a.backward = true;
  EXPECT_EQ(model.MathAttentionNs(a), 480173);
  EXPECT_NEAR(model.KernelDurationNs(a), 571406, 1);
}

TEST(ComputeModelTest, AchievableMatmulRates) {
  const ComputeModel a100 = ModelFor("a100-sxm4-80gb");
  EXPECT_DOUBLE_EQ(a100.AchievableMatmulFlops(DType::kBFloat16), 253.7e12);
  EXPECT_DOUBLE_EQ(a100.AchievableMatmulFlops(DType::kFloat32), 19.18e12);
  // tf32: the datasheet 156 x the 16-bit fraction 253.7 / 312 (an estimate).
  EXPECT_NEAR(a100.AchievableMatmulFlops(DType::kTFloat32), 156e12 * 253.7 / 312, 1e3);
  // V100 has no bf16 tensor cores: bf16 GEMMs run on the CUDA cores at the fp32 rate.
  const ComputeModel v100 = ModelFor("v100-sxm2-32gb");
  EXPECT_DOUBLE_EQ(v100.AchievableMatmulFlops(DType::kBFloat16), 14.51e12);
  EXPECT_DOUBLE_EQ(v100.AchievableMatmulFlops(DType::kFloat16), 97.36e12);
  EXPECT_DOUBLE_EQ(v100.EffectivePeakFlops(DType::kBFloat16), 15.7e12);
}

TEST(ComputeModelTest, AchievedFlopsNeverFallAsASquareGemmGrows) {
  const ComputeModel model = ModelFor("h100-sxm5-80gb");
  double previous = 0;
  for (int64_t n : {256, 512, 1024, 2048, 4096, 8192}) {
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
  // d2d 1 GiB: read + write = 2^31 B / 1.6724e12 B/s = 1,284,072.04 -> 1,284,073.
  EXPECT_NEAR(model.MemcpyDurationNs(MemcpyKind::kDeviceToDevice, kGiB), 1284073, 1);
  // Tiny copies take the floor; empty ones nothing.
  EXPECT_EQ(model.MemcpyDurationNs(MemcpyKind::kHostToDevice, 64), 2000);
  EXPECT_EQ(model.MemcpyDurationNs(MemcpyKind::kDeviceToDevice, 64), 2000);
  EXPECT_EQ(model.MemcpyDurationNs(MemcpyKind::kHostToDevice, 0), 0);
}

}  // namespace
}  // namespace shardscope::sim

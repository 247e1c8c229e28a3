// The CUDA-stack tables restated from their sources (cuda_runtime.cc): each expectation is the
// posted figure or the framework constant, computed by hand in the comment.
#include "shardscope/sim/presets/cuda_runtime.h"

#include <gtest/gtest.h>

namespace shardscope::sim {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

TEST(CudaRuntimeTest, DefaultCudaIsTheReleasesPypiWheel) {
  EXPECT_EQ(DefaultCudaForPytorch({1, 8}), (CudaVersion{10, 2}));   // RELEASE.md: PyPI keeps CUDA 10.2
  EXPECT_EQ(DefaultCudaForPytorch({1, 12}), (CudaVersion{10, 2}));
  EXPECT_EQ(DefaultCudaForPytorch({1, 13}), (CudaVersion{11, 7}));
  EXPECT_EQ(DefaultCudaForPytorch({2, 0}), (CudaVersion{11, 7}));
  EXPECT_EQ(DefaultCudaForPytorch({2, 4}), (CudaVersion{12, 1}));
  EXPECT_EQ(DefaultCudaForPytorch({2, 6}), (CudaVersion{12, 4}));
  EXPECT_EQ(DefaultCudaForPytorch({2, 7}), (CudaVersion{12, 6}));
  EXPECT_EQ(DefaultCudaForPytorch({2, 11}), (CudaVersion{12, 8}));
  EXPECT_EQ(DefaultCudaForPytorch({3, 0}), (CudaVersion{12, 8}));  // the newest row holds on
}

TEST(CudaRuntimeTest, DefaultCudaRunsTheGpu) {
  // PyTorch 1.8's PyPI wheel (CUDA 10.2) has no sm_80 kernels: an A100 runs its cu111 build.
  EXPECT_EQ(DefaultCudaFor({1, 8}, GpuArch::kVolta), (CudaVersion{10, 2}));
  EXPECT_EQ(DefaultCudaFor({1, 8}, GpuArch::kAmpere), (CudaVersion{11, 1}));
  EXPECT_EQ(DefaultCudaFor({1, 12}, GpuArch::kAmpere), (CudaVersion{11, 3}));
  EXPECT_EQ(DefaultCudaFor({1, 13}, GpuArch::kHopper), (CudaVersion{11, 8}));  // sm_90 needs 11.8
  EXPECT_EQ(DefaultCudaFor({2, 6}, GpuArch::kHopper), (CudaVersion{12, 4}));
  EXPECT_EQ(MinimumCudaFor(GpuArch::kAmpere), (CudaVersion{11, 0}));
}

TEST(CudaRuntimeTest, LazyLoadingNeedsCuda117AndPytorch113OrCuda122) {
  EXPECT_FALSE(LazyModuleLoading({1, 8}, {10, 2}));
  EXPECT_FALSE(LazyModuleLoading({1, 8}, {11, 1}));
  EXPECT_FALSE(LazyModuleLoading({1, 12}, {11, 7}));  // PyTorch sets LAZY only from 1.13
  EXPECT_TRUE(LazyModuleLoading({1, 12}, {12, 2}));   // CUDA 12.2 loads lazily by default
  EXPECT_TRUE(LazyModuleLoading({1, 13}, {11, 7}));
  EXPECT_TRUE(LazyModuleLoading({2, 6}, {12, 4}));
}

TEST(CudaRuntimeTest, ContextRowsAreThePostedFigures) {
  // GTX 1080, torch 1.8.2+cu101: 721 MiB - 2 MiB.
  EXPECT_EQ(CudaContextBytes(GpuArch::kVolta, {10, 2}, false), 719 * kMiB);
  // RTX 3090, torch 1.8.2+cu111: 1687 MiB - 2 MiB.
  EXPECT_EQ(CudaContextBytes(GpuArch::kVolta, {11, 1}, false), 1685 * kMiB);
  // PR #86509: 287,047,680 - 20,971,520 = 266,076,160 (lazy), 666,632,192 - 20,971,520 (eager).
  EXPECT_EQ(CudaContextBytes(GpuArch::kAmpere, {11, 8}, true), 266'076'160);
  EXPECT_EQ(CudaContextBytes(GpuArch::kAmpere, {11, 8}, false), 645'660'672);
  // unsloth-zoo PR #1053: 426 MiB on CUDA 13.0.
  EXPECT_EQ(CudaContextBytes(GpuArch::kHopper, {12, 4}, true), 426 * kMiB);
  // "Lazy" before CUDA 11.7 does not exist: the eager row applies.
  EXPECT_EQ(CudaContextBytes(GpuArch::kVolta, {11, 1}, true), 1685 * kMiB);
  // Lazy loading shrinks the context on the same CUDA.
  EXPECT_LT(CudaContextBytes(GpuArch::kHopper, {11, 7}, true), CudaContextBytes(GpuArch::kHopper, {11, 7}, false));
  EXPECT_FALSE(CudaContextSource({12, 4}, true).empty());
}

TEST(CudaRuntimeTest, CublasWorkspaceByRelease) {
  // <= 1.12: cuBLAS's own workspace, outside the allocator: 4096 KiB x 2 + 16 KiB x 8.
  EXPECT_EQ(CublasWorkspaceOf(GpuArch::kVolta, {1, 8}).bytes, 8'519'680);
  EXPECT_FALSE(CublasWorkspaceOf(GpuArch::kVolta, {1, 8}).through_caching_allocator);
  // 1.13: through the allocator, 4096 KiB.
  EXPECT_EQ(CublasWorkspaceOf(GpuArch::kHopper, {1, 13}).bytes, 4 * kMiB);
  EXPECT_TRUE(CublasWorkspaceOf(GpuArch::kHopper, {1, 13}).through_caching_allocator);
  // 2.0 on: :4096:2:16:8 except Hopper, 32 MiB.
  EXPECT_EQ(CublasWorkspaceOf(GpuArch::kAmpere, {2, 6}).bytes, 8'519'680);
  EXPECT_EQ(CublasWorkspaceOf(GpuArch::kHopper, {2, 6}).bytes, 32 * kMiB);
  EXPECT_TRUE(CublasWorkspaceOf(GpuArch::kHopper, {2, 6}).through_caching_allocator);
}

TEST(CudaRuntimeTest, NcclConnectsAtInitBeforeNccl222) {
  // NCCL_RUNTIME_CONNECT came with 2.22: PyTorch 2.6's 2.21.5 connects at init, 2.7's 2.26.2 not.
  EXPECT_TRUE(NcclConnectsAtInit({2, 7, 8}));
  EXPECT_TRUE(NcclConnectsAtInit({2, 21, 5}));
  EXPECT_FALSE(NcclConnectsAtInit({2, 22, 0}));
  EXPECT_FALSE(NcclConnectsAtInit({2, 26, 2}));
}

TEST(CudaRuntimeTest, ParsesReleaseVersions) {
  EXPECT_EQ(ParseReleaseVersion("12.4"), (ReleaseVersion{12, 4}));
  EXPECT_EQ(ParseReleaseVersion("11.1.1"), (ReleaseVersion{11, 1}));
  EXPECT_EQ(ReleaseVersionText({10, 2}), "10.2");
  EXPECT_FALSE(ParseReleaseVersion("12").has_value());
  EXPECT_FALSE(ParseReleaseVersion("12.x").has_value());
  EXPECT_FALSE(ParseReleaseVersion("12.4.").has_value());
  EXPECT_FALSE(ParseReleaseVersion("").has_value());
}

}  // namespace
}  // namespace shardscope::sim

// The cost models at the schedule's limits (traces/schedule.h): the largest shapes and sizes a
// schedule may give cost a positive duration no longer than the simulator's horizon, with no
// integer overflow on the way (the UBSan build runs these). Lower bounds by hand: no GEMM beats
// the GPU's peak, no transfer its bandwidth.
#include <gtest/gtest.h>

#include <cmath>

#include "shardscope/sim/models/compute_model.h"
#include "shardscope/sim/models/cost_provider.h"

namespace shardscope::sim {
namespace {

constexpr int64_t kDim = traces::kMaxShapeDim;  // 2^24

ComputeModel A100() {
  StatusOr<GpuSpec> gpu = FindGpuPreset("a100-sxm4-80gb");
  EXPECT_TRUE(gpu.ok());
  return ComputeModel(*gpu);
}

TEST(ModelLimitsTest, TheLargestGemmCostsAtLeastItsFlopsAtPeakAndAtMostTheHorizon) {
  // m = n = k = 2^24, batch 1: each operand 2^48 elements, the limit. 2 x 2^72 FLOPs at the
  // A100's 312 TFLOP/s bf16 peak take at least 3.03e16 ns (351 days), below 2^60 ns.
  const ComputeModel model = A100();
  const traces::GemmDesc gemm{kDim, kDim, kDim, 1, traces::DType::kBFloat16};
  ASSERT_EQ(traces::ComputeLimitViolation(gemm), "");
  const int64_t ns = model.KernelDurationNs(gemm);
  const double at_peak_ns = 2.0 * std::pow(2.0, 72) / 312e12 * 1e9;
  EXPECT_GE(static_cast<double>(ns), at_peak_ns);
  EXPECT_LE(ns, traces::kMaxSimulatedNs);
  // batch 2^24 over a 1 x 16 x 1 GEMM: the tile count (batch x tiles) is formed in int64.
  const traces::GemmDesc batched{1, 16, 16, kDim, traces::DType::kFloat32};
  ASSERT_EQ(traces::ComputeLimitViolation(batched), "");
  EXPECT_GT(model.KernelDurationNs(batched), 0);
}

TEST(ModelLimitsTest, TheLargestAttentionAndMemoryKernelsStayWithinTheHorizon) {
  const ComputeModel model = A100();
  // Q = 1 x 2^8 x 2^24 x 2^16 = 2^48 elements; the unfused path's scores (2^8 x 2^48) are
  // formed in double.
  for (traces::AttentionImpl impl : {traces::AttentionImpl::kFlash2, traces::AttentionImpl::kMemEfficient}) {
    traces::AttentionDesc a;
    a.batch = 1;
    a.heads = 256;
    a.kv_heads = 256;
    a.seq_q = kDim;
    a.seq_kv = kDim;
    a.head_dim = 65536;
    a.impl = impl;
    ASSERT_EQ(traces::ComputeLimitViolation(a), "");
    const int64_t ns = model.KernelDurationNs(a);
    EXPECT_GT(ns, 0);
    EXPECT_LE(ns, traces::kMaxSimulatedNs);
  }
  // 2^50 bytes read and written at the A100's measured 1672.4 GB/s copy rate: >= 1.35e15 ns.
  const traces::MemoryBoundDesc memory{traces::kMaxOpBytes, traces::kMaxOpBytes};
  EXPECT_GE(static_cast<double>(model.KernelDurationNs(memory)), 2.0 * std::pow(2.0, 50) / 1672.4e9 * 1e9);
  EXPECT_GT(model.MemcpyDurationNs(traces::MemcpyKind::kHostToDevice, traces::kMaxOpBytes), 0);
}

TEST(ModelLimitsTest, TheLargestCollectiveCostsAtMostTheHorizon) {
  // 2^50 bytes all-reduced by 16 ranks over two DGX A100 nodes (a 9.6e9 ms step once came of
  // 2^62 bytes): positive and below the horizon, and no faster than half the bytes crossing
  // between the nodes over all 8 GPUs' network shares (8 x 25 GB/s).
  traces::Schedule schedule;
  schedule.communicators = {{"world", {}}};
  for (int32_t r = 0; r < 16; ++r) schedule.communicators[0].ranks.push_back(r);
  StatusOr<ClusterSpec> cluster = FindClusterPreset("dgx-a100", 2);
  ASSERT_TRUE(cluster.ok());
  const ClusterCostProvider costs(schedule, *cluster);
  const CollectiveCost cost = costs.Collective(traces::CollectiveType::kAllReduce, traces::kMaxOpBytes, 0);
  EXPECT_GT(cost.duration_ns, 0);
  EXPECT_LE(cost.duration_ns, traces::kMaxSimulatedNs);
  EXPECT_GE(static_cast<double>(cost.duration_ns), std::pow(2.0, 49) / (8 * cluster->inter_node_bandwidth) * 1e9);
}

}  // namespace
}  // namespace shardscope::sim

// Plans that could only fail later, refused when loaded: a GPU that leaves the allocator
// nothing, bandwidths below the slowest real link; and the expect: section's checks.
#include "shardscope/sim/plan/plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "plan_test_support.h"

namespace shardscope::sim {
namespace {

using ::testing::HasSubstr;

TEST(PlanLimitsTest, AGpuThatLeavesTheAllocatorNothingIsRefusedAtItsKey) {
  // 0.5 GiB of GPU memory less the CUDA context of PyTorch 2.11's CUDA 12.8 with lazy loading
  // (426 MiB = 0.416 GiB, sim/presets/src/cuda_runtime.cc) less 1000 GiB held by others:
  // -999.916 GiB. It once ran to an OOM at op 0. (NCCL's buffers depend on the communicators the
  // lowering makes: the simulation counts them, this check at load does not.)
  EXPECT_EQ(ParseError(Lines({
                "model: llama3-8b",
                "cluster: {preset: dgx-a100, gpu_memory_gb: 0.5}",
                "strategy: fsdp2",
                "allocator: {memory_reserved_by_others_gb: 1000}",
            })),
            "test.yaml:4:43: allocator.memory_reserved_by_others_gb: expected memory left for the caching "
            "allocator on every rank (with cluster.gpu_memory_gb), got 0.500 GiB of GPU memory less 0.416 GiB of "
            "CUDA context (CUDA 12.8) less 1000.000 GiB held by other processes = -999.916 GiB");
  // Without others: the GPU alone (0.4 GiB) is smaller than its context (0.416 GiB).
  EXPECT_THAT(ParseError(Lines({
                  "model: llama3-8b",
                  "cluster: {preset: dgx-a100, gpu_memory_gb: 0.4}",
                  "strategy: fsdp2",
              })),
              HasSubstr("test.yaml:2:44: cluster.gpu_memory_gb: expected memory left for the caching allocator on "
                        "every rank, got 0.400 GiB of GPU memory less 0.416 GiB"));
  // One rank's neighbour takes it all: that rank is named.
  EXPECT_THAT(ParseError(Lines({
                  "model: llama3-8b",
                  "cluster: {preset: dgx-a100}",
                  "strategy: fsdp2",
                  "allocator: {memory_reserved_by_others_gb_per_rank: {5: 79}}",
              })),
              HasSubstr("allocator.memory_reserved_by_others_gb_per_rank: expected memory left for the caching "
                        "allocator on every rank (with cluster.gpu_memory_gb), got 79.256 GiB of GPU memory less "
                        "0.416 GiB of CUDA context (CUDA 12.8) less 79.000 GiB held by other processes on rank 5 "
                        "= -0.160 GiB"));
  // 78 GiB held leaves 0.84 GiB: accepted (whether it fits is the simulation's answer).
  ParseOk(Lines({
      "model: llama3-8b",
      "cluster: {preset: dgx-a100}",
      "strategy: fsdp2",
      "allocator: {memory_reserved_by_others_gb_per_rank: {5: 78}}",
  }));
}

TEST(PlanLimitsTest, BandwidthsBelowTheSlowestRealLinkAreRefused) {
  // 1000 B/s = 1e-6 GB/s was honoured; the floor is 0.1 GB/s (below 1 Gb/s Ethernet).
  EXPECT_THAT(ParseError(Lines({
                  "model: llama3-8b",
                  "cluster: {preset: dgx-a100, nodes: 2, inter_node_bandwidth_gbps: 0.000001}",
                  "strategy: fsdp2",
              })),
              HasSubstr("cluster.inter_node_bandwidth_gbps: expected a number >= 0.1 and <= 100000, got '0.000001'"));
}

TEST(PlanLimitsTest, ExpectIsCheckedAndIgnored) {
  const std::string base = Lines({"model: llama3-8b", "cluster: {preset: dgx-a100}", "strategy: fsdp2"});
  const Plan with = ParseOk(base + "expect: {outcome: hangs, cause: mismatch, oom_ranks: [3]}\n");
  const Plan without = ParseOk(base);
  EXPECT_EQ(with.training.grad_accum_steps, without.training.grad_accum_steps);
  EXPECT_THAT(ParseError(base + "expect: {outcome: hang}\n"),
              HasSubstr("test.yaml:4:19: expect.outcome: expected one of completes, hangs, oom_agreed, out_of_memory"));
  EXPECT_THAT(ParseError(base + "expect: {cause: mismatch}\n"), HasSubstr("expect.outcome"));
  EXPECT_THAT(ParseError(base + "expect: {outcome: completes, cause: mismatch}\n"),
              HasSubstr("expect.cause: expected cause only with outcome hangs"));
  EXPECT_THAT(ParseError(base + "expect: {outcome: out_of_memory, oom_ranks: [8]}\n"),
              HasSubstr("expect.oom_ranks[0]"));
  EXPECT_THAT(ParseError(base + "expect: {outcome: completes, why: x}\n"), HasSubstr("expect.why"));
}

}  // namespace
}  // namespace shardscope::sim

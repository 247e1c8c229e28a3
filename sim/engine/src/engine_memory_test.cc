// The caching allocator on the timeline: segment costs, record_stream, retries, OOM stops and
// the shared outcome log, with timestamps computed by hand.
#include "shardscope/sim/engine/engine.h"
#include "shardscope/sim/hangs/hang.h"

#include <gtest/gtest.h>

#include "engine_test_util.h"

namespace shardscope::sim {
namespace {

using namespace test_support::engine_tests;

TEST(EngineMemoryTest, SegmentAllocationCostsHostTimeOnlyWhenCold) {
  // A 6 MiB request (in (1, 10) MiB) gets a 20 MiB segment: reserved 20 MiB, allocated 6 MiB.
  // Cold: the allocation at t=0 pays one cudaMalloc (1000 ns), so K launches 1000..1010 and
  // runs 1010..1110. Warm (steady state): the segment is cached from the first step, K runs
  // 10..110. Peaks are the same.
  for (bool warm : {false, true}) {
    Builder b(1);
    b.Add(0, AllocateOp{0, 6 * kMiB, 0}).Kernel(0, 0, 100).Add(0, FreeOp{0});
    Recorder rec(b.schedule);
    SimulationResult result = b.Run(WithMemory(1024 * kMiB, warm), &rec);
    const int64_t start = warm ? 10 : 1010;
    EXPECT_EQ(rec.device.at({0, 1}), std::make_pair(start, start + 100)) << "warm=" << warm;
    EXPECT_EQ(result.ranks[0].memory.stats.reserved_bytes_peak, 20 * kMiB);
    EXPECT_EQ(result.ranks[0].memory.stats.allocated_bytes_peak, 6 * kMiB);
    EXPECT_EQ(result.ranks[0].memory.fragmentation_bytes, 14 * kMiB);
    EXPECT_EQ(result.ranks[0].memory.stats.num_device_alloc, 1);  // the warm step's segment is reused
  }
}

TEST(EngineMemoryTest, RecordStreamKeepsTheBlockUntilTheOtherStreamCatchesUp) {
  // A (12 MiB, a segment of its own: > 10 MiB rounds to 2 MiB) is allocated on s0 and used
  // on s1, where K runs 10..5010. Freed at host time ~1010, its block is reusable at once —
  // unless A.record_stream(s1) was called: then the allocator holds it until s1's work queued
  // before the free completes (5010), so B (12 MiB on s0, issued right after) needs a second
  // segment. Reserved peak 24 MiB with record_stream, 12 MiB without.
  for (bool record : {false, true}) {
    Builder b(1);
    b.Kernel(0, 1, 5000).Add(0, AllocateOp{0, 12 * kMiB, 0});
    if (record) b.Add(0, RecordStreamOp{0, 1});
    b.Add(0, FreeOp{0}).Add(0, AllocateOp{1, 12 * kMiB, 0}).Kernel(0, 0, 100).Add(0, FreeOp{1});
    SimulationResult result = b.Run(WithMemory(1024 * kMiB, false));
    EXPECT_EQ(result.ranks[0].memory.stats.reserved_bytes_peak, (record ? 24 : 12) * kMiB) << "record=" << record;
    EXPECT_EQ(result.ranks[0].memory.stats.allocated_bytes_peak, 12 * kMiB);
    EXPECT_FALSE(result.hung);
  }
}

TEST(EngineMemoryTest, RetryBlocksTheHostUntilTheDeviceDrains) {
  // Capacity 40 MiB, cold. K (5000 ns) launched 0..10 runs 10..5010. A: 30 MiB on s0 at 10
  // -> cudaMalloc, host 10..1010; freed (cached in s0's pool). B: 30 MiB on s1 at 1010 cannot
  // reuse s0's block, cudaMalloc fails (30 of 40 MiB reserved), so the allocator frees its
  // cached segments and retries: num_alloc_retries = 1. cudaFree synchronizes the device: the
  // host waits until K ends at 5010, then pays one cudaFree (500) and one cudaMalloc (1000):
  // B's host span is 1010..6510 and K2 launches 6510..6520, runs 6520..6620.
  Builder b(1);
  b.Kernel(0, 0, 5000).Add(0, AllocateOp{0, 30 * kMiB, 0}).Add(0, FreeOp{0});
  b.Add(0, AllocateOp{1, 30 * kMiB, 1}).Kernel(0, 1, 100).Add(0, FreeOp{1});
  Recorder rec(b.schedule);
  SimulationResult result = b.Run(WithMemory(40 * kMiB, false), &rec);
  EXPECT_EQ(rec.host.at({0, 1}), std::make_pair(int64_t{10}, int64_t{1010}));
  EXPECT_EQ(rec.host.at({0, 3}), std::make_pair(int64_t{1010}, int64_t{6510}));
  EXPECT_EQ(rec.device.at({0, 4}), std::make_pair(int64_t{6520}, int64_t{6620}));
  const RankMemory& memory = result.ranks[0].memory;
  EXPECT_EQ(memory.stats.num_alloc_retries, 1);
  EXPECT_EQ(memory.stats.num_ooms, 0);
  EXPECT_EQ(memory.stats.reserved_bytes_peak, 30 * kMiB);
  EXPECT_EQ(result.ranks[0].host_blocked_ns, 4000);
  EXPECT_FALSE(result.hung);
}

TEST(EngineMemoryTest, OutOfMemoryStopsTheRankAndThePeersHang) {
  // Rank 0 asks for 64 MiB on a 40 MiB device before the all-reduce: it stops at op 0
  // (warm start falls back to cold because the first step runs out too). Rank 1 waits in
  // the all-reduce forever.
  Builder b(2);
  b.Add(0, AllocateOp{0, 64 * kMiB, 0}).Coll(0, 0, 50);
  b.Coll(1, 0, 50);
  SimulationResult result = b.Run(WithMemory(40 * kMiB, true));
  EXPECT_TRUE(result.hung);
  const RankMemory& memory = result.ranks[0].memory;
  ASSERT_TRUE(memory.oom.has_value());
  EXPECT_EQ(memory.oom->op_id, 0);
  EXPECT_EQ(memory.oom->time_ns, 0);
  EXPECT_EQ(memory.stats.num_ooms, 1);
  EXPECT_FALSE(result.ranks[1].memory.oom.has_value());
  ASSERT_EQ(result.blocked.size(), 2u);
  EXPECT_NE(result.blocked[0].host.find("out of memory"), std::string::npos);
  EXPECT_NE(result.blocked[1].streams.at(0).find("waiting for peers"), std::string::npos);
}

TEST(EngineMemoryTest, SharedOutcomesKeepTheWarmStepsStats) {
  // The tensor stays allocated across steps: the measured step makes no allocator call, yet
  // a rank reading the shared outcome log reports what a live allocator does.
  for (bool live : {false, true}) {
    Builder b(1);
    b.Add(0, AllocateOp{0, 6 * kMiB, 0}).Kernel(0, 0, 100);
    EngineConfig config = WithMemory(1024 * kMiB, true);
    config.memory.record_history = live;  // with a recorder: a live allocator
    Recorder rec(b.schedule);
    SimulationResult result = b.Run(config, &rec);
    EXPECT_EQ(result.ranks[0].memory.stats.reserved_bytes_peak, 20 * kMiB) << "live=" << live;
    EXPECT_EQ(result.ranks[0].memory.stats.allocated_bytes, 6 * kMiB) << "live=" << live;
  }
}

// Fixed kernels cost their duration, a GEMM 50 ns (FakeCosts knows only fixed kernels).
class GemmCosts : public FakeCosts {
 public:
  int64_t KernelNs(const traces::ComputeDesc& desc) const override {
    if (std::holds_alternative<traces::GemmDesc>(desc)) return 50;
    return FakeCosts::KernelNs(desc);
  }
};

TEST(EngineMemoryTest, CublasWorkspacesComeFromTheAllocatorAtTheFirstGemm) {
  // Two 8,519,680 B workspaces (PyTorch's :4096:2:16:8): the first (<= 10 MiB) takes a 20 MiB
  // segment and leaves 11.875 MiB split off, which holds the second. Before them the program
  // allocated A (6 MiB: its own 20 MiB segment, 14 MiB split off) on s0; the workspaces come
  // at the GEMM, on s1, so A's remainder (s0's pool) is not theirs: 40 MiB reserved,
  // 6 MiB + 2 x 8,519,680 B allocated. Warm or cold alike.
  for (bool warm : {false, true}) {
    Builder b(1);
    b.Add(0, AllocateOp{0, 6 * kMiB, 0}).Kernel(0, 0, 100);
    b.Add(0, KernelOp{1, GemmDesc{64, 64, 64, 1, DType::kBFloat16}});
    b.Add(0, FreeOp{0});
    EngineConfig config = WithMemory(1024 * kMiB, warm);
    config.memory.gemm_workspace_bytes = 8'519'680;
    config.memory.gemm_workspaces = 2;
    ASSERT_TRUE(b.schedule.ResolveBindings().ok());
    GemmCosts costs;
    StatusOr<SimulationResult> result = Simulate(b.schedule, costs, config, nullptr);
    ASSERT_TRUE(result.ok()) << result.status().message();
    const MemoryStats& stats = result->ranks[0].memory.stats;
    EXPECT_EQ(stats.reserved_bytes_peak, 40 * kMiB) << "warm=" << warm;
    EXPECT_EQ(stats.allocated_bytes_peak, 6 * kMiB + 2 * 8'519'680) << "warm=" << warm;
    // They stay: after the step only the workspaces are allocated.
    EXPECT_EQ(stats.allocated_bytes, 2 * 8'519'680) << "warm=" << warm;
  }
}

TEST(EngineMemoryTest, NoGemmNoWorkspace) {
  Builder b(1);
  b.Add(0, AllocateOp{0, 6 * kMiB, 0}).Kernel(0, 0, 100).Add(0, FreeOp{0});
  EngineConfig config = WithMemory(1024 * kMiB, true);
  config.memory.gemm_workspace_bytes = 8'519'680;
  config.memory.gemm_workspaces = 2;
  const SimulationResult result = b.Run(config);
  EXPECT_EQ(result.ranks[0].memory.stats.reserved_bytes_peak, 20 * kMiB);
  EXPECT_EQ(result.ranks[0].memory.stats.allocated_bytes, 0);
}

}  // namespace
}  // namespace shardscope::sim

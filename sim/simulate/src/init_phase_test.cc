// The init phase through the caching allocator, with reserved bytes worked out by hand from the
// allocator's policy (kLargeBuffer: a request in (1 MiB, 10 MiB) takes a 20 MiB segment, the
// remainder split off when it exceeds 1 MiB; larger requests take a segment rounded to 2 MiB).
#include "shardscope/sim/simulate/init_phase.h"

#include <gtest/gtest.h>

#include "engine_test_support.h"
#include "lowering_test_support.h"

namespace shardscope::sim {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

struct Fixture {
  traces::Schedule schedule;
  SimulationSetup setup;
};

// One rank with a "dp" slot; a GPU reporting `usable` bytes, a context of `context`.
Fixture OneRank(int64_t usable, int64_t context) {
  test_support::ScheduleBuilder b(1, {"dp"});
  EXPECT_TRUE(b.schedule.ResolveBindings().ok());
  Fixture f{b.schedule, {}};
  f.setup.cluster.gpu.usable_bytes = usable;
  f.setup.device_memory.cuda_context_bytes = context;
  return f;
}

InitOp Alloc(InitOpKind kind, std::string group, int32_t divide, InitWhat what) {
  InitOp op;
  op.kind = kind;
  op.group = std::move(group);
  op.element_bytes = 4;
  op.divide = divide;
  op.what = what;
  return op;
}

TEST(InitPhaseTest, PeakFollowsTheAllocatorsSegments) {
  Fixture f = OneRank(kGiB, 0);
  // Two units of one 1 Mi-element (4 MiB) parameter each.
  f.setup.init.framework = "test";
  f.setup.init.units = {{1 << 20}, {1 << 20}};
  InitOp free_model;
  free_model.kind = InitOpKind::kFree;
  free_model.group = "model";
  f.setup.init.phases = {
      {false, {Alloc(InitOpKind::kAllocEach, "model", 1, InitWhat::kModelToGpu)}},
      {true, {Alloc(InitOpKind::kAllocFlat, "shard", 2, InitWhat::kShard), free_model}},
  };
  const InitPhaseResult r = SimulateInitPhase(f.schedule, f.setup, 0);
  ASSERT_TRUE(r.simulated);
  EXPECT_FALSE(r.oom);
  EXPECT_EQ(r.capacity_bytes, kGiB);
  // 4 MiB -> a 20 MiB segment, 16 MiB split off; the second 4 MiB from it (12 MiB left); each
  // 2 MiB shard from the remainder. Reserved never passes 20 MiB, reached by the model move.
  EXPECT_EQ(r.peak_reserved_bytes, 20 * kMiB);
  EXPECT_EQ(r.peak_what, InitWhat::kModelToGpu);
}

TEST(InitPhaseTest, OutOfMemoryNamesTheStep) {
  // 16 MiB usable less a 2 MiB context: the 20 MiB segment of the first 4 MiB tensor fails.
  Fixture f = OneRank(16 * kMiB, 2 * kMiB);
  f.setup.init.units = {{1 << 20}};
  f.setup.init.phases = {{false, {Alloc(InitOpKind::kAllocEach, "model", 1, InitWhat::kModelHalf)}}};
  const InitPhaseResult r = SimulateInitPhase(f.schedule, f.setup, 0);
  ASSERT_TRUE(r.oom.has_value());
  EXPECT_EQ(r.oom->what, InitWhat::kModelHalf);
  EXPECT_EQ(r.oom->requested_bytes, 20 * kMiB);
  EXPECT_EQ(r.oom->free_bytes, 14 * kMiB);
  EXPECT_EQ(r.peak_reserved_bytes, 0);
}

TEST(InitPhaseTest, NcclBuffersAppearAtTheFirstCollective) {
  // 64 MiB usable; the communicator's buffers (48 MiB) arrive after a 4 MiB tensor (20 MiB
  // segment): 20 + 48 = 68 > 64, so the broadcast itself cannot get its buffers.
  Fixture f = OneRank(64 * kMiB, 0);
  f.setup.device_memory.nccl_per_rank = {RankNcclMemory{48 * kMiB, 1, {48 * kMiB}}};
  f.setup.init.units = {{1 << 20}};
  InitOp broadcast;
  broadcast.kind = InitOpKind::kCollective;
  broadcast.slot = "dp";
  broadcast.what = InitWhat::kBroadcast;
  f.setup.init.phases = {{false, {Alloc(InitOpKind::kAllocEach, "model", 1, InitWhat::kModelToGpu), broadcast}}};
  InitPhaseResult r = SimulateInitPhase(f.schedule, f.setup, 0);
  ASSERT_TRUE(r.oom.has_value());
  EXPECT_EQ(r.oom->what, InitWhat::kBroadcast);
  EXPECT_EQ(r.oom->requested_bytes, 48 * kMiB);
  // With 32 MiB of buffers they fit, and count in the phase.
  f.setup.device_memory.nccl_per_rank = {RankNcclMemory{32 * kMiB, 1, {32 * kMiB}}};
  r = SimulateInitPhase(f.schedule, f.setup, 0);
  EXPECT_FALSE(r.oom.has_value());
  EXPECT_EQ(r.nccl_bytes, 32 * kMiB);
  EXPECT_EQ(r.peak_reserved_bytes, 20 * kMiB);
}

TEST(InitPhaseTest, NoProgramNoPhase) {
  Fixture f = OneRank(kGiB, 0);
  EXPECT_FALSE(SimulateInitPhase(f.schedule, f.setup, 0).simulated);
}

// A whole plan: ZeRO-2 of a 2-block toy on 8 A100s: the phase fits; DeepSpeed's 16-bit model
// (Ψ x 2 B) is the lower bound of its peak.
TEST(InitPhaseTest, ToyZero2Fits) {
  Plan plan = test_support::MustParsePlan(test_support::ToyDdpYaml(1));
  plan.strategy = Strategy::kZero2;
  const traces::Schedule schedule = test_support::MustLower(plan);
  StatusOr<SimulationSetup> setup = SetupFromSchedule(schedule, "<test>");
  ASSERT_TRUE(setup.ok()) << setup.status().message();
  const InitPhaseResult r = SimulateInitPhase(schedule, *setup, 0);
  ASSERT_TRUE(r.simulated);
  EXPECT_FALSE(r.oom.has_value());
  EXPECT_GE(r.peak_reserved_bytes, 2 * ParameterCount(plan.model));
  EXPECT_GT(r.nccl_bytes, 0);  // _broadcast_model created the dp communicator
  // usable - context: the A100-80GB's reported total less CUDA 12.8's lazy context.
  EXPECT_EQ(r.capacity_bytes, setup->cluster.gpu.usable_bytes - setup->device_memory.cuda_context_bytes);
}

}  // namespace
}  // namespace shardscope::sim

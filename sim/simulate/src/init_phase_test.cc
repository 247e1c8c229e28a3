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

// A per-parameter phase frees each parameter's tensors before the next parameter's: two
// 3 Mi-element fp32 parameters (12 MiB each: over kMinLargeAlloc, a 12 MiB segment of their
// own). Gathered like the 2021 hook registration — a flat buffer and NCCL's flat output of
// ceil(n / 2) x 2 = n elements, then the parameter — the first parameter reserves 12 + 12
// MiB (the parameter reuses the freed NCCL block); the second reuses both blocks: 24 MiB.
// The same ops for the whole unit at once keep both parameters' buffers: 48 MiB.
TEST(InitPhaseTest, PerParameterPhaseFreesBeforeTheNextParameter) {
  Fixture f = OneRank(kGiB, 0);
  f.setup.init.units = {{3 << 20, 3 << 20}};
  const auto gather = [](std::string group) {
    InitOp op = Alloc(InitOpKind::kAllocEach, std::move(group), 2, InitWhat::kHookGather);
    op.multiply = 2;
    return op;
  };
  const auto free = [](std::string group) {
    InitOp op;
    op.kind = InitOpKind::kFree;
    op.group = std::move(group);
    return op;
  };
  InitPhase hooks;
  hooks.per_param = true;
  hooks.ops = {gather("flat"), gather("nccl_flat"), free("nccl_flat"),
               Alloc(InitOpKind::kAllocEach, "param", 1, InitWhat::kHookGather), free("flat"), free("param")};
  f.setup.init.phases = {hooks};
  InitPhaseResult r = SimulateInitPhase(f.schedule, f.setup, 0);
  ASSERT_FALSE(r.oom.has_value());
  EXPECT_EQ(r.peak_reserved_bytes, 24 * kMiB);
  EXPECT_EQ(r.peak_what, InitWhat::kHookGather);
  hooks.per_param = false;
  hooks.per_unit = true;
  f.setup.init.phases = {hooks};
  r = SimulateInitPhase(f.schedule, f.setup, 0);
  EXPECT_EQ(r.peak_reserved_bytes, 48 * kMiB);
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

// The 2021 ZeRO-3 holds two NCCL communicators of the same eight ranks — the engine's
// data-parallel group (created by _broadcast_model) and WORLD (dist.barrier() before
// flattening) — so its init phase has twice the NCCL buffers of today's single one. PyTorch
// 1.8's NCCL (2.7.8) connects every channel's ring and tree when a communicator is created,
// whatever its collectives, so the two hold the same bytes.
TEST(InitPhaseTest, ToyZero3Of2021HasTwoCommunicators) {
  const auto init_of = [](std::string_view zero) {
    const Plan plan = test_support::MustParsePlan(
        "model: {layers: 2, hidden: 256, heads: 4, kv_heads: 4, ffn: 688, vocab: 1000}\n"
        "cluster: {preset: dgx-a100, nodes: 1}\nstrategy: zero3\n"
        "training: {seq_len: 128, micro_batch_size: 1, dtype: fp16, pytorch_version: \"1.8\"}\n"
        "zero: {overlap_comm: true" + std::string(zero) + "}\n");
    const traces::Schedule schedule = test_support::MustLower(plan);
    StatusOr<SimulationSetup> setup = SetupFromSchedule(schedule, "<test>");
    EXPECT_TRUE(setup.ok()) << setup.status().message();
    return setup.ok() ? SimulateInitPhase(schedule, *setup, 0) : InitPhaseResult{};
  };
  const InitPhaseResult today = init_of("");
  const InitPhaseResult legacy = init_of(", legacy_per_parameter_path: true");
  ASSERT_TRUE(today.simulated);
  ASSERT_TRUE(legacy.simulated);
  EXPECT_FALSE(legacy.oom.has_value());
  EXPECT_GT(today.nccl_bytes, 0);
  EXPECT_EQ(legacy.nccl_bytes, 2 * today.nccl_bytes);
}

}  // namespace
}  // namespace shardscope::sim

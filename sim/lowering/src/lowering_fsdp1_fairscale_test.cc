// Tests for fairscale's FSDP as the FSDP1 lowering models it: fp32 gradient accumulation
// (optimize_backward_concat), the blocking fp32 gradient copy, _free_full_params' host sync,
// its prefetch order, the ReduceScatterBucketer, and the strategies it lacks.
#include <gtest/gtest.h>

#include "lowering_fsdp1_test_support.h"

// In the helpers' namespace, so the tests call them unqualified.
namespace shardscope::sim::fsdp1_test {
namespace {

TEST(Fsdp1Fairscale, OptimizeBackwardConcatSavesOneUnshardedFp32Gradient) {
  // fairscale FSDP, mixed precision with fp32 gradient accumulation under no_sync over two
  // micro-batches. A wide model with short sequences, so gradients dominate activations.
  Plan plan = ToyPlan();
  Widen(plan);
  plan.training.seq_len = 32;
  plan.training.grad_accum_steps = 2;
  plan.fsdp1.implementation = Fsdp1Implementation::kFairscale;
  plan.fsdp1.no_sync = true;
  plan.fsdp1.optimize_backward_concat = false;
  const Schedule old_way = MustLower(plan);
  plan.fsdp1.optimize_backward_concat = true;
  const Schedule fixed = MustLower(plan);
  // Same communication either way; fairscale has no rate limiter.
  EXPECT_EQ(CollectiveBytes(old_way), CollectiveBytes(fixed));
  EXPECT_EQ(CountEventSyncs(old_way), 0);
  const SimulationResult a = MustSimulate(old_way), b = MustSimulate(fixed);
  const UnitNumels u = Units(plan);
  // At the largest unit's post-backward on the synced micro-batch, over the accumulated fp32
  // gradients of every unit, the old way holds the flat bf16 gradient (SplitWithSizesBackward's
  // cat, 2 B/element) plus the concatenated fp32 copy (4 B); the fixed way only the
  // per-parameter bf16 gradients and their bf16 cat (2 + 2 B). Saved: 2 B per element of the
  // largest unit.
  const int64_t largest = std::max(u.root, u.blocks[0]);
  const int64_t expected_saved = (kBf16 + kFp32 - 2 * kBf16) * largest;
  const int64_t saved = a.ranks[0].memory.stats.allocated_bytes_peak - b.ranks[0].memory.stats.allocated_bytes_peak;
  EXPECT_GT(saved, expected_saved * 3 / 4);
  EXPECT_LT(saved, expected_saved * 5 / 4);
}

TEST(Fsdp1Fairscale, Fp32GradsAreMadeInForwardWithABlockingCopy) {
  // One micro-batch: each of the 3 FlatParameters (root, layers.0, layers.1) gets its flat
  // fp32 gradient in its forward: an H2D copy of numel * 4 B and a host sync each.
  Plan plan = FairscalePlan();
  const UnitNumels u = Units(plan);
  const Schedule schedule = MustLower(plan);
  const traces::Program& p = schedule.ProgramOf(0);
  const auto copies = OpsNamed<traces::MemcpyOp>(p, "fairscale::fp32_grads.cuda");
  ASSERT_EQ(copies.size(), 3u);
  int64_t bytes = 0;
  for (const traces::Op* op : copies) {
    EXPECT_EQ(op->tags.phase, traces::Phase::kForward);
    EXPECT_EQ(std::get<traces::MemcpyOp>(op->payload).kind, traces::MemcpyKind::kHostToDevice);
    bytes += std::get<traces::MemcpyOp>(op->payload).bytes;
  }
  EXPECT_EQ(bytes, kFp32 * (u.root + u.blocks[0] + u.blocks[1]));
  EXPECT_EQ(OpsNamed<traces::StreamSynchronizeOp>(p, "fairscale::fp32_grads.cuda.sync").size(), 3u);
  // Peak memory: the whole model's fp32 gradients are there at the end of forward, so the
  // fixed way's peak is at least the model states (3 fp32 shards) plus all unsharded fp32 grads.
  const SimulationResult r = MustSimulate(schedule);
  int64_t local = Shard(u.root, 8) + Shard(u.blocks[0], 8) + Shard(u.blocks[1], 8);
  EXPECT_GE(r.ranks[0].memory.stats.allocated_bytes_peak, 3 * kFp32 * local + bytes);
  // Two micro-batches under no_sync: made once (the reduction drops them at the end only).
  plan.training.grad_accum_steps = 2;
  plan.fsdp1.no_sync = true;
  EXPECT_EQ(OpsNamed<traces::MemcpyOp>(MustLower(plan).ProgramOf(0), "fairscale::fp32_grads.cuda").size(), 3u);
}

TEST(Fsdp1Fairscale, FreeFullParamsSynchronizesTheHost) {
  // FULL_SHARD, one micro-batch: _free_full_params after the 2 non-root forwards and in the 3
  // post-backward hooks (synced): 5 host syncs on the compute stream; SHARD_GRAD_OP: only the 3.
  Plan plan = FairscalePlan();
  const Schedule full = MustLower(plan);
  EXPECT_EQ(OpsNamed<traces::StreamSynchronizeOp>(full.ProgramOf(0), "fairscale::free_full_params").size(), 5u);
  const SimulationResult r = MustSimulate(full);
  EXPECT_GT(r.ranks[0].host_blocked_ns, 0);
  plan.fsdp1.sharding_strategy = Fsdp1ShardingStrategy::kShardGradOp;
  EXPECT_EQ(OpsNamed<traces::StreamSynchronizeOp>(MustLower(plan).ProgramOf(0), "fairscale::free_full_params").size(),
            3u);
}

TEST(Fsdp1Fairscale, PrefetchesTheNextInstanceInForwardAndThePreviousInBackward) {
  const Schedule schedule = MustLower(FairscalePlan());
  // Forward: the root's forward prefetches layers.0, layers.0's layers.1: 3 gathers, the
  // third before layers.0's first kernel.
  const auto forward = AllGathersIn(schedule, traces::Phase::kForward);
  ASSERT_EQ(forward.size(), 3u);
  EXPECT_LT(forward[2].first, FirstComputeKernel(schedule, traces::Phase::kForward, "layers.0"));
  // Backward: the root prefetches nothing (it does not reshard); layers.1 rebuilds itself
  // and prefetches layers.0 before its own kernels.
  const auto backward = AllGathersIn(schedule, traces::Phase::kBackward);
  ASSERT_EQ(backward.size(), 2u);
  EXPECT_EQ(backward[0].second, "layers.1");
  EXPECT_EQ(backward[1].second, "layers.1");
  EXPECT_LT(backward[1].first, FirstComputeKernel(schedule, traces::Phase::kBackward, "layers.1"));
  MustSimulate(schedule);
}

TEST(Fsdp1Fairscale, ConcatKeepsPerParameterGradsUntilTheSyncedCat) {
  // SplitWithSizesBackward's cat: once per FlatParameter on the synced micro-batch with
  // optimize_backward_concat, on every micro-batch the old way; each makes a flat bf16
  // gradient of numel * 2 B.
  Plan plan = FairscalePlan();
  plan.training.grad_accum_steps = 2;
  plan.fsdp1.no_sync = true;
  const UnitNumels u = Units(plan);
  const auto cats = [](const Schedule& s) {
    return OpsNamed<traces::KernelOp>(s.ProgramOf(0), "fairscale::SplitWithSizesBackward.cat").size();
  };
  const Schedule fixed = MustLower(plan);
  EXPECT_EQ(cats(fixed), 3u);
  int64_t flat_bytes = 0;
  const traces::Program& p = fixed.ProgramOf(0);
  for (const traces::Op& op : p.ops) {
    if (const auto* a = std::get_if<traces::AllocateOp>(&op.payload)) {
      if (TensorStartsWith(p, a->tensor, "grad_flat.")) {
        flat_bytes += a->bytes;
      }
    }
  }
  EXPECT_EQ(flat_bytes, kBf16 * (u.root + u.blocks[0] + u.blocks[1]));
  plan.fsdp1.optimize_backward_concat = false;
  EXPECT_EQ(cats(MustLower(plan)), 6u);
  MustSimulate(fixed);
}

TEST(Fsdp1Fairscale, ReduceScatterBucketerBatchesSmallShards) {
  // 8 ranks: shards of layers.1, layers.0 (reduced first) and the root. A bucket of
  // floor(6.2 MiB / 4 B / 8) elements per rank holds both blocks but not the root: the root
  // flushes the blocks (one reduce-scatter), the end of backward flushes the root.
  Plan plan = FairscalePlan();
  const UnitNumels u = Units(plan);
  const int64_t block = Shard(u.blocks[0], 8), root = Shard(u.root, 8);
  plan.fsdp1.bucket_cap_mb = 6.2;
  const int64_t capacity = static_cast<int64_t>(6.2 * 1024 * 1024 / 4 / 8);
  ASSERT_LE(2 * block, capacity);
  ASSERT_GT(2 * block + root, capacity);
  const auto reduce_scatters = [](const Schedule& s) {
    std::vector<int64_t> bytes;
    for (const traces::Op& op : s.ProgramOf(0).ops) {
      if (const auto* c = std::get_if<traces::CollectiveOp>(&op.payload); c && c->type == CollectiveType::kReduceScatter) {
        bytes.push_back(c->bytes);
      }
    }
    return bytes;
  };
  const Schedule bucketed = MustLower(plan);
  EXPECT_EQ(reduce_scatters(bucketed), (std::vector<int64_t>{kFp32 * 8 * 2 * block, kFp32 * 8 * root}));
  // The bucket (8 x capacity) and its output shard are allocated once.
  int64_t bucket_bytes = 0;
  const SimulationResult with = MustSimulate(bucketed);
  for (const traces::Op& op : bucketed.ProgramOf(0).ops) {
    if (const auto* a = std::get_if<traces::AllocateOp>(&op.payload)) {
      if (TensorStartsWith(bucketed.ProgramOf(0), a->tensor, "reduce_scatter_bucket.")) {
        bucket_bytes += a->bytes;
      }
    }
  }
  EXPECT_EQ(bucket_bytes, kFp32 * 9 * capacity);
  // Disabled (0) or shards above the cap: one reduce-scatter per FlatParameter, same bytes.
  plan.fsdp1.bucket_cap_mb = 0;
  const std::vector<int64_t> direct{kFp32 * 8 * block, kFp32 * 8 * block, kFp32 * 8 * root};
  EXPECT_EQ(reduce_scatters(MustLower(plan)), direct);
  plan.fsdp1.bucket_cap_mb = 1;  // 32768 elements per rank: every shard is larger
  ASSERT_GT(root, 1024 * 1024 / 4 / 8);
  EXPECT_EQ(reduce_scatters(MustLower(plan)), direct);
  (void)with;
}

TEST(Fsdp1Fairscale, RejectsStrategiesFairscaleDoesNotHave) {
  Plan plan = ToyPlan();
  plan.fsdp1.implementation = Fsdp1Implementation::kFairscale;
  plan.fsdp1.sharding_strategy = Fsdp1ShardingStrategy::kHybridShard;
  EXPECT_FALSE(LowerPlan(plan).ok());
  plan.fsdp1.sharding_strategy = Fsdp1ShardingStrategy::kShardGradOp;
  const Schedule schedule = MustLower(plan);
  const UnitNumels u = Units(plan);
  EXPECT_EQ(Get(CollectiveBytes(schedule), CollectiveType::kAllGather), kBf16 * SumPadded(u, 8, true));
  MustSimulate(schedule);
}

}  // namespace
}  // namespace shardscope::sim::fsdp1_test

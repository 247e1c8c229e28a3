// Tests for fairscale's FSDP as the FSDP1 lowering models it: fp32 gradient accumulation
// (optimize_backward_concat), the blocking fp32 gradient copy, _free_full_params' host sync,
// its prefetch order, the ReduceScatterBucketer, and the strategies it lacks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lowering_fsdp1_test_support.h"
#include "shardscope/sim/lowering/schedule_metadata.h"
#include "shardscope/sim/models/caching_allocator.h"
#include "shardscope/sim/models/cost_provider.h"
#include "shardscope/sim/simulate/simulate.h"

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

// A llama-like toy whose root FlatParameter (token embedding + final norm + output) is the
// largest unit: vocab 32768, hidden 256, two blocks of 791,040 parameters.
//   N_root = 2 x 32768 x 256 + 256 = 16,777,472 parameters
//   fp32: 4 x N_root = 67,109,888 B (a multiple of 512 B: the caching allocator's request)
//   a fresh segment for it: >= 10 MiB, so rounded up to 2 MiB: 69,206,016 B (66 MiB)
//   per parameter: tok_embeddings and output 32768 x 256 x 4 = 33,554,432 B (32 MiB) each,
//   the norm 1 KiB (small pool).
// seq 128 with full activation checkpointing; the loss's fp32 logits (the upcast, its
// log_softmax and its gradient) are mb x 128 x 32768 x 4 B = mb x 16 MiB.
Plan FairscaleConcatToy(int32_t micro_batch, bool optimize_backward_concat) {
  Plan plan = test_support::MustParsePlan(
      "model: {layers: 2, hidden: 256, heads: 4, kv_heads: 4, ffn: 688, vocab: 32768}\n"
      "cluster: {preset: dgx-a100, nodes: 1}\n"
      "strategy: fsdp2\n"
      "training: {seq_len: 128, micro_batch_size: " +
      std::to_string(micro_batch) + ", grad_accum_steps: 2, dtype: bf16, activation_checkpointing: full}\n");
  plan.strategy = Strategy::kFsdp1;
  plan.fsdp1.implementation = Fsdp1Implementation::kFairscale;
  plan.fsdp1.no_sync = true;
  plan.fsdp1.optimize_backward_concat = optimize_backward_concat;
  return plan;
}

constexpr int64_t kRootNumel = 2 * 32768 * 256 + 256;
constexpr int64_t kRootFp32 = 4 * kRootNumel;             // 67,109,888 B
constexpr int64_t kRootFp32Segment = 33 * 2 * 1024 * 1024;  // 66 MiB: 64 MiB + 1 KiB rounded up

TEST(Fsdp1Fairscale, ConcatMakesOneFp32GradientPerParameterThenOneFlatCopy) {
  // fairscale before PR #1186: each parameter's fp32 gradient is its own tensor, made by its
  // first accumulation (micro-batch 0) and kept; the synced micro-batch concatenates them into
  // one flat fp32 tensor and drops them. The root's: two 32 MiB blocks and the norm's 1 KiB,
  // then one 4 x N_root copy.
  const Schedule schedule = MustLower(FairscaleConcatToy(1, false));
  const traces::Program& p = schedule.ProgramOf(0);
  std::vector<int64_t> root_param_grads;
  int64_t flat = 0, flat_count = 0, per_param_total = 0;
  for (const traces::Op& op : p.ops) {
    const auto* a = std::get_if<traces::AllocateOp>(&op.payload);
    if (a == nullptr) continue;
    if (TensorStartsWith(p, a->tensor, "fp32_grads.")) {
      per_param_total += a->bytes;
      const std::string& name = p.tensors[static_cast<size_t>(a->tensor)];
      if (name.rfind("fp32_grads.layers.", 0) != 0) root_param_grads.push_back(a->bytes);
    }
    if (TensorStartsWith(p, a->tensor, "fp32_flat_grad.root")) {
      flat = a->bytes;
      ++flat_count;
    }
  }
  // Made once (micro-batch 0), in the order autograd finishes them: the output projection
  // and the final norm (head, last parameter first), then the token embedding.
  EXPECT_EQ(root_param_grads, (std::vector<int64_t>{33554432, 1024, 33554432}));
  const UnitNumels u = Units(FairscaleConcatToy(1, false));
  EXPECT_EQ(u.root, kRootNumel);
  EXPECT_EQ(per_param_total, kFp32 * (u.root + u.blocks[0] + u.blocks[1]));
  EXPECT_EQ(flat_count, 1);
  EXPECT_EQ(flat, kRootFp32);
}

// Records rank 0's allocator history.
class HistoryObserver : public EngineObserver {
 public:
  bool WantsRank(int32_t rank) const override { return rank == 0; }
  void OnHostSpan(const HostSpan&) override {}
  void OnDeviceSpan(const DeviceSpan&) override {}
};

std::vector<TraceEntry> RankZeroHistory(const Schedule& schedule) {
  StatusOr<SimulationSetup> setup = SetupFromSchedule(schedule, "<test>");
  EXPECT_TRUE(setup.ok());
  if (!setup.ok()) return {};
  ClusterCostProvider costs(schedule, setup->cluster);
  EngineConfig config = EngineConfigFor(*setup, schedule);
  config.memory.record_history = true;
  HistoryObserver observer;
  StatusOr<SimulationResult> result = Simulate(schedule, costs, config, &observer);
  EXPECT_TRUE(result.ok());
  if (!result.ok()) return {};
  return result->ranks[0].memory.history;
}

// Bytes of the fresh segments cudaMalloc'd for allocations of exactly `bytes` (0 when each
// was served from the cache), over the whole run (the warm-up step and the measured one).
int64_t FreshSegmentBytesFor(const std::vector<TraceEntry>& history, int64_t bytes) {
  int64_t fresh = 0;
  for (size_t i = 1; i < history.size(); ++i) {
    if (history[i].action == "alloc" && history[i].size == bytes && history[i - 1].action == "segment_alloc") {
      fresh += history[i - 1].size;
    }
  }
  return fresh;
}

TEST(Fsdp1Fairscale, ConcatSpikeIsOneFreshSegmentOfTheLargestUnitsFp32Gradient) {
  // The spike fairscale PR #1186 removed: the synced micro-batch's torch.cat of the root's
  // per-parameter fp32 gradients needs one contiguous 4 x N_root block while those gradients
  // are still alive. Best fit takes the smallest cached block that holds it; when none does,
  // cudaMalloc adds a segment of 4 x N_root rounded up to 2 MiB: 69,206,016 B, once for the
  // run (the next step's cat reuses it). The cached blocks then are the per-parameter fp32
  // (32 MiB) and bf16 (16 MiB) gradients, the unsharded bf16 blocks and the loss's fp32
  // logits blocks (mb x 16 MiB, freed by the loss's backward at the start of the synced
  // backward). So for mb = 1, 2, 4 (16, 32, 64 MiB logits, all < 67,109,888 B: the norm's
  // 1 KiB is what the 64 MiB block lacks) the cat costs exactly one fresh 66 MiB segment,
  // whatever the micro-batch size; at mb = 8 the 128 MiB cached logits block holds it and
  // the cat costs no reserved memory at all. The slice way (optimize_backward_concat) never
  // allocates a 4 x N_root block in backward: its flat buffer is made in forward, and the
  // hooks add into its slices.
  // Before the per-parameter blocks, the root's fp32 gradient was one 4 x N_root block made
  // at the head's output.weight (its first parameter in backward): at micro-batch sizes whose
  // cached logits block is large enough, best fit split that logits block, and the next
  // micro-batch's loss needed fresh segments for its logits — reserved memory then depended
  // on which cached logits block a whole unit's gradient happened to fit (the 0.9x-2x swing
  // of examples/fairscale-grad-concat). Per-parameter blocks are the size of the weights that
  // produce them and land where those sizes fit.
  for (int32_t mb : {1, 2, 4, 8}) {
    const std::vector<TraceEntry> concat = RankZeroHistory(MustLower(FairscaleConcatToy(mb, false)));
    const std::vector<TraceEntry> slice = RankZeroHistory(MustLower(FairscaleConcatToy(mb, true)));
    ASSERT_FALSE(concat.empty());
    EXPECT_EQ(FreshSegmentBytesFor(concat, kRootFp32), mb < 8 ? kRootFp32Segment : 0) << "mb " << mb;
    // The slice way's only 4 x N_root block is its flat buffer, one fresh segment too (made
    // in the first forward, before any logits exist).
    EXPECT_EQ(FreshSegmentBytesFor(slice, kRootFp32), kRootFp32Segment) << "mb " << mb;
  }
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

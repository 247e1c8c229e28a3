// Tests for the FSDP1 / fairscale FSDP lowering: bytes per collective type per step in closed
// form (FlatParameters padded to a multiple of the shard group), op order of the prefetch
// modes, the all-gather rate limiter, no_sync, HSDP, consolidation on rank 0, and fairscale's
// fp32 gradient accumulation (optimize_backward_concat). Every schedule validates and
// simulates to completion.
#include <gtest/gtest.h>

#include <optional>

#include <algorithm>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "lowering_test_support.h"
#include "shardscope/sim/engine/engine.h"
#include "shardscope/sim/lowering/lowering.h"
#include "shardscope/sim/presets/model.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/sim/report/report.h"
#include "shardscope/traces/schedule.h"
#include "shardscope/traces/timeline.h"

namespace shardscope::sim {
namespace {

using traces::CollectiveType;
using traces::Schedule;

// A 2-block toy model on one 8-GPU node. The YAML says fsdp2 (the parser does not know the
// fsdp1 section yet); the strategy and its knobs are set on the struct.
Plan ToyPlan(const std::string& extra_model = "", const std::string& cluster = "{preset: dgx-a100, nodes: 1}",
             int32_t layers = 2) {
  const std::string yaml = "model: {layers: " + std::to_string(layers) +
                           ", hidden: 256, heads: 4, kv_heads: 4, ffn: 688, vocab: 1000" + extra_model +
                           "}\ncluster: " + cluster +
                           "\nstrategy: fsdp2\ntraining: {seq_len: 128, micro_batch_size: 1}\n";
  StatusOr<Plan> plan = ParsePlan(yaml, "<test>");
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  Plan p = plan.ok() ? *plan : Plan{};
  p.strategy = Strategy::kFsdp1;
  return p;
}

using test_support::MustLower;

SimulationResult MustSimulate(const Schedule& schedule) {
  std::optional<SimulationResult> result = test_support::RunSimulation(schedule);
  if (!result) return SimulationResult{};
  EXPECT_TRUE(test_support::Completed(*result));
  return std::move(*result);
}

// Bytes per collective type in one rank's program (nccl-tests sizes).
std::map<CollectiveType, int64_t> CollectiveBytes(const Schedule& schedule, int32_t rank = 0) {
  std::map<CollectiveType, int64_t> bytes;
  for (const traces::Op& op : schedule.ProgramOf(rank).ops) {
    if (const auto* c = std::get_if<traces::CollectiveOp>(&op.payload)) bytes[c->type] += c->bytes;
  }
  return bytes;
}

int64_t Get(const std::map<CollectiveType, int64_t>& bytes, CollectiveType type) {
  const auto it = bytes.find(type);
  return it == bytes.end() ? 0 : it->second;
}

// Parameters of the FSDP units as the auto-wrap builds them: one per block, the root holding
// the rest (embedding, final norm, output).
struct UnitNumels {
  int64_t root = 0;
  std::vector<int64_t> blocks;
};

UnitNumels Units(const Plan& plan) {
  UnitNumels units;
  for (const ModuleKernels& m : DecomposeModel(plan.model, WorkloadOf(plan))) {
    if (m.name.rfind("layers.", 0) == 0) {
      units.blocks.push_back(m.param_numel());
    } else {
      units.root += m.param_numel();
    }
  }
  return units;
}

// A FlatParameter of n elements sharded over g ranks: ceil(n / g) per rank, g chunks.
int64_t Shard(int64_t n, int64_t g) { return (n + g - 1) / g; }
int64_t Padded(int64_t n, int64_t g) { return Shard(n, g) * g; }

int64_t SumPadded(const UnitNumels& u, int64_t g, bool with_root) {
  int64_t sum = with_root ? Padded(u.root, g) : 0;
  for (int64_t b : u.blocks) sum += Padded(b, g);
  return sum;
}

constexpr int64_t kBf16 = 2, kFp32 = 4;
constexpr int64_t kClipNormBytes = 4;  // clip_grad_norm_'s all-reduce of one fp32 norm

TEST(Fsdp1ClosedForm, FullShardMovesThreePsi) {
  // Forward all-gathers every unit (bf16), backward all-gathers again every unit but the
  // root (never freed after forward); one fp32 reduce-scatter per unit.
  const Plan plan = ToyPlan();
  const Schedule schedule = MustLower(plan);
  const auto bytes = CollectiveBytes(schedule);
  const UnitNumels u = Units(plan);
  EXPECT_EQ(Get(bytes, CollectiveType::kAllGather), kBf16 * (SumPadded(u, 8, true) + SumPadded(u, 8, false)));
  EXPECT_EQ(Get(bytes, CollectiveType::kReduceScatter), kFp32 * SumPadded(u, 8, true));
  EXPECT_EQ(Get(bytes, CollectiveType::kAllReduce), kClipNormBytes);
  MustSimulate(schedule);
}

TEST(Fsdp1ClosedForm, ShardGradOpHasNoBackwardAllGather) {
  Plan plan = ToyPlan();
  plan.fsdp1.sharding_strategy = Fsdp1ShardingStrategy::kShardGradOp;
  const Schedule schedule = MustLower(plan);
  const auto bytes = CollectiveBytes(schedule);
  const UnitNumels u = Units(plan);
  EXPECT_EQ(Get(bytes, CollectiveType::kAllGather), kBf16 * SumPadded(u, 8, true));
  EXPECT_EQ(Get(bytes, CollectiveType::kReduceScatter), kFp32 * SumPadded(u, 8, true));
  MustSimulate(schedule);
}

TEST(Fsdp1ClosedForm, NoShardAllReducesTheGradients) {
  // NO_SHARD: no all-gather, no reduce-scatter; each unit's fp32 gradient (unpadded) is
  // all-reduced; clipping is local (no norm all-reduce).
  Plan plan = ToyPlan();
  plan.fsdp1.sharding_strategy = Fsdp1ShardingStrategy::kNoShard;
  const Schedule schedule = MustLower(plan);
  const auto bytes = CollectiveBytes(schedule);
  const UnitNumels u = Units(plan);
  int64_t psi = u.root;
  for (int64_t b : u.blocks) psi += b;
  EXPECT_EQ(Get(bytes, CollectiveType::kAllGather), 0);
  EXPECT_EQ(Get(bytes, CollectiveType::kReduceScatter), 0);
  EXPECT_EQ(Get(bytes, CollectiveType::kAllReduce), kFp32 * psi);
  MustSimulate(schedule);
}

TEST(Fsdp1ClosedForm, HybridShardAllReducesShardsOverReplicas) {
  // 2 nodes x 8 GPUs, HYBRID_SHARD over the node (shard 8), replicas across nodes (2).
  for (const Fsdp1ShardingStrategy strategy :
       {Fsdp1ShardingStrategy::kHybridShard, Fsdp1ShardingStrategy::kHybridShardZero2}) {
    Plan plan = ToyPlan("", "{preset: dgx-a100, nodes: 2}");
    plan.fsdp1.sharding_strategy = strategy;
    plan.fsdp1.mesh = DataParallelMesh{2, 8};
    const Schedule schedule = MustLower(plan);
    const auto bytes = CollectiveBytes(schedule);
    const UnitNumels u = Units(plan);
    const bool zero2 = strategy == Fsdp1ShardingStrategy::kHybridShardZero2;
    EXPECT_EQ(Get(bytes, CollectiveType::kAllGather),
              kBf16 * (SumPadded(u, 8, true) + (zero2 ? 0 : SumPadded(u, 8, false))));
    EXPECT_EQ(Get(bytes, CollectiveType::kReduceScatter), kFp32 * SumPadded(u, 8, true));
    int64_t shards = Shard(u.root, 8);
    for (int64_t b : u.blocks) shards += Shard(b, 8);
    EXPECT_EQ(Get(bytes, CollectiveType::kAllReduce), kFp32 * shards + kClipNormBytes);
    // The reduce-scatters run over the 8-rank shard group, the all-reduces over the 2-rank
    // replicate group, on their own stream.
    const traces::Program& program = schedule.ProgramOf(0);
    for (const traces::Op& op : program.ops) {
      const auto* c = std::get_if<traces::CollectiveOp>(&op.payload);
      if (c == nullptr || c->bytes == kClipNormBytes) continue;
      const std::string& slot = program.comm_slots[static_cast<size_t>(c->comm)];
      const std::string& stream = program.streams[static_cast<size_t>(c->stream)].name;
      if (c->type == CollectiveType::kAllReduce) {
        EXPECT_EQ(slot, "dp_replicate");
        EXPECT_EQ(stream, "all_reduce");
      } else {
        EXPECT_EQ(slot, "dp_shard");
      }
    }
    MustSimulate(schedule);
  }
}

TEST(Fsdp1ClosedForm, NoSyncReducesOncePerStep) {
  // Two micro-batches under no_sync: all-gathers every micro-batch (FULL_SHARD frees in
  // backward either way), but one reduce-scatter per unit per step.
  Plan plan = ToyPlan();
  plan.training.grad_accum_steps = 2;
  const Schedule every = MustLower(plan);
  plan.fsdp1.no_sync = true;
  const Schedule once = MustLower(plan);
  const UnitNumels u = Units(plan);
  const auto bytes_every = CollectiveBytes(every), bytes_once = CollectiveBytes(once);
  EXPECT_EQ(Get(bytes_every, CollectiveType::kReduceScatter), 2 * kFp32 * SumPadded(u, 8, true));
  EXPECT_EQ(Get(bytes_once, CollectiveType::kReduceScatter), kFp32 * SumPadded(u, 8, true));
  EXPECT_EQ(Get(bytes_once, CollectiveType::kAllGather),
            2 * kBf16 * (SumPadded(u, 8, true) + SumPadded(u, 8, false)));
  // The unsharded bf16 gradients kept between micro-batches cost memory.
  const SimulationResult r_every = MustSimulate(every), r_once = MustSimulate(once);
  EXPECT_GT(r_once.ranks[0].memory.stats.allocated_bytes_peak, r_every.ranks[0].memory.stats.allocated_bytes_peak);

  // SHARD_GRAD_OP under no_sync keeps the parameters between micro-batches: only the first
  // forward all-gathers.
  plan.fsdp1.sharding_strategy = Fsdp1ShardingStrategy::kShardGradOp;
  const Schedule kept = MustLower(plan);
  EXPECT_EQ(Get(CollectiveBytes(kept), CollectiveType::kAllGather), kBf16 * SumPadded(u, 8, true));
  MustSimulate(kept);
}

int CountEventSyncs(const Schedule& schedule) {
  int count = 0;
  for (const traces::Op& op : schedule.ProgramOf(0).ops) {
    count += std::holds_alternative<traces::EventSynchronizeOp>(op.payload) ? 1 : 0;
  }
  return count;
}

TEST(Fsdp1Limiter, LimitAllGathersBlocksTheHostAndBoundsMemory) {
  // Six blocks, so that the forward has more unshards than the queue holds; long enough
  // sequences that the GPU, not the host, is the bottleneck (the host runs ahead).
  Plan plan = ToyPlan("", "{preset: dgx-a100, nodes: 1}", 6);
  plan.model.hidden = 1024;
  plan.model.ffn = 2816;
  plan.model.heads = 8;
  plan.model.kv_heads = 8;
  plan.training.seq_len = 2048;
  const Schedule limited = MustLower(plan);
  plan.fsdp1.limit_all_gathers = false;
  const Schedule unlimited = MustLower(plan);
  EXPECT_EQ(CountEventSyncs(unlimited), 0);
  EXPECT_GT(CountEventSyncs(limited), 0);

  // In program order, every event synchronize targets a free event recorded at least two
  // frees earlier: with the host blocked there, at most two unsharded flat parameters of
  // later units can be in flight.
  const traces::Program& program = limited.ProgramOf(0);
  std::vector<int32_t> free_events_recorded;
  int all_gathers_since_sync = 0, max_all_gathers_since_sync = 0;
  for (const traces::Op& op : program.ops) {
    if (const auto* rec = std::get_if<traces::EventRecordOp>(&op.payload)) {
      if (program.events[static_cast<size_t>(rec->event)].rfind("free_event.", 0) == 0) {
        free_events_recorded.push_back(rec->event);
      }
    } else if (const auto* sync = std::get_if<traces::EventSynchronizeOp>(&op.payload)) {
      const auto it = std::find(free_events_recorded.begin(), free_events_recorded.end(), sync->event);
      ASSERT_NE(it, free_events_recorded.end());
      EXPECT_GE(free_events_recorded.end() - it, 2);
      all_gathers_since_sync = 0;
    } else if (const auto* c = std::get_if<traces::CollectiveOp>(&op.payload)) {
      if (c->type == CollectiveType::kAllGather) {
        max_all_gathers_since_sync = std::max(max_all_gathers_since_sync, ++all_gathers_since_sync);
      }
    }
  }
  // Forward with explicit prefetch off: one all-gather per unshard, each preceded by a sync
  // once two frees are queued; BACKWARD_PRE adds the prefetched one.
  EXPECT_LE(max_all_gathers_since_sync, 3);

  const SimulationResult with = MustSimulate(limited), without = MustSimulate(unlimited);
  EXPECT_GT(with.ranks[0].host_blocked_ns, without.ranks[0].host_blocked_ns);
  EXPECT_LE(with.ranks[0].memory.stats.allocated_bytes_peak, without.ranks[0].memory.stats.allocated_bytes_peak);
}

// Index in rank 0's program of the first op matching `pred`, or -1.
template <typename Pred>
int64_t FirstOp(const traces::Program& program, Pred pred) {
  for (size_t i = 0; i < program.ops.size(); ++i) {
    if (pred(program.ops[i])) return static_cast<int64_t>(i);
  }
  return -1;
}

std::string ModuleOf(const traces::Program& program, const traces::Op& op) {
  return op.tags.module == traces::kNoName ? "" : program.names[static_cast<size_t>(op.tags.module)];
}

struct BackwardOrder {
  int64_t all_gather_block0 = -1;   // the backward all-gather of layers.0's FlatParameter
  int64_t first_kernel_block1 = -1; // layers.1's first backward kernel
  int64_t last_kernel_block1 = -1;  // layers.1's last backward kernel
  int64_t reduce_scatter_block1 = -1;
};

BackwardOrder OrderOf(const Schedule& schedule) {
  const traces::Program& p = schedule.ProgramOf(0);
  BackwardOrder order;
  for (size_t i = 0; i < p.ops.size(); ++i) {
    const traces::Op& op = p.ops[i];
    if (op.tags.phase != traces::Phase::kBackward || ModuleOf(p, op) != "layers.1") continue;
    const int64_t index = static_cast<int64_t>(i);
    if (const auto* c = std::get_if<traces::CollectiveOp>(&op.payload)) {
      if (c->type == CollectiveType::kReduceScatter) order.reduce_scatter_block1 = index;
    } else if (std::holds_alternative<traces::KernelOp>(op.payload)) {
      // The block's own backward kernels (not the FSDP casts / copies on side streams).
      const std::string& name = p.names[static_cast<size_t>(op.name)];
      if (name.rfind("FSDP::", 0) == 0 || name == "AccumulateGrad") continue;
      if (order.first_kernel_block1 < 0) order.first_kernel_block1 = index;
      order.last_kernel_block1 = index;
    }
  }
  return order;
}

// The backward all-gather of layers.0 by op position: the first all-gather after layers.1's
// pre-backward in backward with the size of a block's FlatParameter, whichever module tag.
int64_t BackwardAllGatherOfBlock0(const Schedule& schedule, int64_t block_bytes) {
  const traces::Program& p = schedule.ProgramOf(0);
  int seen = 0;
  for (size_t i = 0; i < p.ops.size(); ++i) {
    const traces::Op& op = p.ops[i];
    if (op.tags.phase != traces::Phase::kBackward) continue;
    if (const auto* c = std::get_if<traces::CollectiveOp>(&op.payload)) {
      // Backward all-gathers: layers.1 first, then layers.0.
      if (c->type == CollectiveType::kAllGather && c->bytes == block_bytes && ++seen == 2) {
        return static_cast<int64_t>(i);
      }
    }
  }
  return -1;
}

TEST(Fsdp1Prefetch, BackwardPrefetchModesOrderTheAllGather) {
  Plan plan = ToyPlan();
  const UnitNumels u = Units(plan);
  ASSERT_EQ(u.blocks[0], u.blocks[1]);
  const int64_t block_bytes = kBf16 * Padded(u.blocks[0], 8);
  std::map<Fsdp1BackwardPrefetch, Schedule> schedules;
  for (const Fsdp1BackwardPrefetch mode :
       {Fsdp1BackwardPrefetch::kBackwardPre, Fsdp1BackwardPrefetch::kBackwardPost, Fsdp1BackwardPrefetch::kNone}) {
    plan.fsdp1.backward_prefetch = mode;
    schedules[mode] = MustLower(plan);
    MustSimulate(schedules[mode]);
  }
  const auto positions = [&](Fsdp1BackwardPrefetch mode) {
    BackwardOrder order = OrderOf(schedules[mode]);
    order.all_gather_block0 = BackwardAllGatherOfBlock0(schedules[mode], block_bytes);
    return order;
  };
  // BACKWARD_PRE: layers.0 is gathered in layers.1's pre-backward hook, before its gradients.
  const BackwardOrder pre = positions(Fsdp1BackwardPrefetch::kBackwardPre);
  ASSERT_GE(pre.all_gather_block0, 0);
  EXPECT_LT(pre.all_gather_block0, pre.first_kernel_block1);
  // BACKWARD_POST: after layers.1's gradient computation, before its reduce-scatter.
  const BackwardOrder post = positions(Fsdp1BackwardPrefetch::kBackwardPost);
  EXPECT_GT(post.all_gather_block0, post.last_kernel_block1);
  EXPECT_LT(post.all_gather_block0, post.reduce_scatter_block1);
  // None: on demand in layers.0's own pre-backward, after layers.1's reduce-scatter.
  const BackwardOrder none = positions(Fsdp1BackwardPrefetch::kNone);
  EXPECT_GT(none.all_gather_block0, none.reduce_scatter_block1);
}

TEST(Fsdp1Prefetch, NoBackwardPrefetchIsSlowerWhenCommunicationBound) {
  // Two nodes (inter-node all-gathers), short sequences: communication dominates. Without
  // prefetch the all-gather of block k-1 queues behind block k's reduce-scatter on the same
  // communicator, and compute waits for both.
  Plan plan = ToyPlan("", "{preset: dgx-a100, nodes: 2}", 4);
  plan.model.hidden = 1024;
  plan.model.ffn = 2816;
  plan.model.heads = 8;
  plan.model.kv_heads = 8;
  plan.training.seq_len = 64;
  plan.fsdp1.backward_prefetch = Fsdp1BackwardPrefetch::kBackwardPre;
  const SimulationResult pre = MustSimulate(MustLower(plan));
  plan.fsdp1.backward_prefetch = Fsdp1BackwardPrefetch::kNone;
  const SimulationResult none = MustSimulate(MustLower(plan));
  EXPECT_GT(none.makespan_ns, pre.makespan_ns);
}

TEST(Fsdp1Prefetch, ForwardPrefetchIssuesTheNextUnitInPreForward) {
  // forward_prefetch: in layers.0's pre-forward, after waiting for its own all-gather, the
  // all-gather of layers.1 is issued — before layers.0's first forward kernel.
  Plan plan = ToyPlan();
  plan.fsdp1.forward_prefetch = true;
  const Schedule schedule = MustLower(plan);
  const traces::Program& p = schedule.ProgramOf(0);
  std::vector<int64_t> forward_all_gathers;
  int64_t first_block0_kernel = -1;
  for (size_t i = 0; i < p.ops.size(); ++i) {
    const traces::Op& op = p.ops[i];
    if (op.tags.phase != traces::Phase::kForward) continue;
    if (const auto* c = std::get_if<traces::CollectiveOp>(&op.payload)) {
      if (c->type == CollectiveType::kAllGather) forward_all_gathers.push_back(static_cast<int64_t>(i));
    } else if (std::holds_alternative<traces::KernelOp>(op.payload) && ModuleOf(p, op) == "layers.0" &&
               p.names[static_cast<size_t>(op.name)].rfind("FSDP::", 0) != 0 && first_block0_kernel < 0) {
      first_block0_kernel = static_cast<int64_t>(i);
    }
  }
  ASSERT_EQ(forward_all_gathers.size(), 3u);  // root, layers.0, layers.1
  EXPECT_LT(forward_all_gathers[2], first_block0_kernel);
  MustSimulate(schedule);
}

TEST(Fsdp1Consolidation, RankZeroCopiesToHostAndHoldsTheGatherBuffer) {
  Plan plan = ToyPlan();
  plan.checkpoint.consolidate_optimizer_state = true;
  const Schedule schedule = MustLower(plan);
  ASSERT_EQ(schedule.programs.size(), 2u);
  EXPECT_EQ(schedule.ranks[0].program, 1);
  for (size_t r = 1; r < schedule.ranks.size(); ++r) EXPECT_EQ(schedule.ranks[r].program, 0);
  const auto d2h = [](const traces::Program& p) {
    int n = 0;
    for (const traces::Op& op : p.ops) {
      if (const auto* m = std::get_if<traces::MemcpyOp>(&op.payload)) n += m->kind == traces::MemcpyKind::kDeviceToHost;
    }
    return n;
  };
  const UnitNumels u = Units(plan);
  // Two AdamW states per FSDP instance (root + 2 blocks).
  EXPECT_EQ(d2h(schedule.ProgramOf(0)), 2 * 3);
  EXPECT_EQ(d2h(schedule.ProgramOf(1)), 0);
  // Each state is all-gathered to its full (padded) fp32 size on every rank.
  EXPECT_EQ(Get(CollectiveBytes(schedule, 1), CollectiveType::kAllGather),
            Get(CollectiveBytes(schedule, 0), CollectiveType::kAllGather));

  const SimulationResult r = MustSimulate(schedule);
  // After zero_grad the model states are 12 bytes per local parameter; the largest unit's
  // gather buffer comes on top during consolidation.
  int64_t local = Shard(u.root, 8);
  for (int64_t b : u.blocks) local += Shard(b, 8);
  const int64_t largest_buffer = kFp32 * std::max(Padded(u.root, 8), Padded(u.blocks[0], 8));
  EXPECT_GE(r.ranks[0].memory.stats.allocated_bytes_peak, 3 * kFp32 * local + largest_buffer);
  // Rank 0 waits on its synchronous copies to the host.
  EXPECT_GE(r.ranks[0].end_ns, r.ranks[1].end_ns);
}

TEST(Fsdp1Consolidation, NoBroadcastOptimStateSavesTimeAndRankZeroMemory) {
  // MoE (8 experts, top-2) with expert parallelism 4: the experts of each block are an FSDP
  // instance over the 2 ranks holding the same experts ("ep_dp").
  Plan plan = ToyPlan(", experts: 8, experts_per_token: 2");
  plan.moe.expert_parallel = 4;
  plan.checkpoint.consolidate_optimizer_state = true;
  const Schedule broadcast = MustLower(plan);
  // Expert FlatParameters reduce over ep_dp.
  {
    const traces::Program& p = broadcast.ProgramOf(0);
    bool expert_reduce_scatter = false;
    for (const traces::Op& op : p.ops) {
      if (const auto* c = std::get_if<traces::CollectiveOp>(&op.payload)) {
        expert_reduce_scatter |= c->type == CollectiveType::kReduceScatter &&
                                 p.comm_slots[static_cast<size_t>(c->comm)] == "ep_dp";
      }
    }
    EXPECT_TRUE(expert_reduce_scatter);
  }
  plan.checkpoint.no_broadcast_optim_state = true;
  const Schedule local = MustLower(plan);
  const SimulationResult with = MustSimulate(broadcast), without = MustSimulate(local);
  EXPECT_LT(without.makespan_ns, with.makespan_ns);
  EXPECT_LT(without.ranks[0].memory.stats.allocated_bytes_peak, with.ranks[0].memory.stats.allocated_bytes_peak);
}

TEST(Fsdp1Fairscale, OptimizeBackwardConcatSavesOneUnshardedFp32Gradient) {
  // fairscale FSDP, mixed precision with fp32 gradient accumulation under no_sync over two
  // micro-batches. A wide model with short sequences, so gradients dominate activations.
  Plan plan = ToyPlan();
  plan.model.hidden = 1024;
  plan.model.ffn = 2816;
  plan.model.heads = 8;
  plan.model.kv_heads = 8;
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

// Ops of rank 0's program whose name starts with `prefix`.
template <typename Payload>
std::vector<const traces::Op*> OpsNamed(const traces::Program& p, const std::string& prefix) {
  std::vector<const traces::Op*> ops;
  for (const traces::Op& op : p.ops) {
    if (std::holds_alternative<Payload>(op.payload) && p.names[static_cast<size_t>(op.name)].rfind(prefix, 0) == 0) {
      ops.push_back(&op);
    }
  }
  return ops;
}

bool TensorStartsWith(const traces::Program& p, traces::TensorIndex tensor, const std::string& prefix) {
  return p.tensors[static_cast<size_t>(tensor)].rfind(prefix, 0) == 0;
}

Plan FairscalePlan() {
  Plan plan = ToyPlan();
  plan.fsdp1.implementation = Fsdp1Implementation::kFairscale;
  plan.fsdp1.optimize_backward_concat = true;
  return plan;
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

// Backward all-gathers of rank 0 with the module tag of the hook that issued them.
std::vector<std::pair<int64_t, std::string>> AllGathersIn(const Schedule& schedule, traces::Phase phase) {
  const traces::Program& p = schedule.ProgramOf(0);
  std::vector<std::pair<int64_t, std::string>> out;
  for (size_t i = 0; i < p.ops.size(); ++i) {
    const traces::Op& op = p.ops[i];
    if (op.tags.phase != phase) continue;
    if (const auto* c = std::get_if<traces::CollectiveOp>(&op.payload); c && c->type == CollectiveType::kAllGather) {
      out.emplace_back(static_cast<int64_t>(i), ModuleOf(p, op));
    }
  }
  return out;
}

int64_t FirstComputeKernel(const Schedule& schedule, traces::Phase phase, const std::string& module) {
  const traces::Program& p = schedule.ProgramOf(0);
  return FirstOp(p, [&](const traces::Op& op) {
    if (op.tags.phase != phase || !std::holds_alternative<traces::KernelOp>(op.payload)) return false;
    const std::string& name = p.names[static_cast<size_t>(op.name)];
    return ModuleOf(p, op) == module && name.rfind("FSDP::", 0) != 0 && name.rfind("fairscale::", 0) != 0;
  });
}

TEST(Fsdp1Prefetch, RootPreBackwardPrefetchesTheLastBlock) {
  // Post-forward order: layers.0, layers.1, root. The root's pre-backward (at the output
  // module) prefetches layers.1, layers.1's prefetches layers.0: both backward all-gathers
  // are issued before the block's own backward kernels, the first from the output module.
  // (BACKWARD_POST uses the same targets, but the root's post-backward hook runs last, after
  // the embedding's gradient: by then layers.1 has gathered itself.)
  Plan plan = ToyPlan();
  {
    plan.fsdp1.backward_prefetch = Fsdp1BackwardPrefetch::kBackwardPre;
    const Schedule schedule = MustLower(plan);
    const auto gathers = AllGathersIn(schedule, traces::Phase::kBackward);
    ASSERT_EQ(gathers.size(), 2u);  // the root keeps its parameters after forward
    EXPECT_NE(gathers[0].second, "layers.1");
    EXPECT_NE(gathers[0].second, "layers.0");
    EXPECT_LT(gathers[0].first, FirstComputeKernel(schedule, traces::Phase::kBackward, "layers.1"));
    EXPECT_EQ(gathers[1].second, "layers.1");
    EXPECT_LT(gathers[1].first, FirstComputeKernel(schedule, traces::Phase::kBackward, "layers.0"));
    MustSimulate(schedule);
  }
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

TEST(Fsdp1Matrix, EveryStrategyValidatesAndCompletes) {
  for (const Fsdp1ShardingStrategy strategy :
       {Fsdp1ShardingStrategy::kFullShard, Fsdp1ShardingStrategy::kShardGradOp, Fsdp1ShardingStrategy::kNoShard,
        Fsdp1ShardingStrategy::kHybridShard, Fsdp1ShardingStrategy::kHybridShardZero2}) {
    for (const bool no_sync : {false, true}) {
      for (const ActivationCheckpointing ac : {ActivationCheckpointing::kNone, ActivationCheckpointing::kFull}) {
        Plan plan = ToyPlan("", "{preset: dgx-a100, nodes: 2}");
        plan.fsdp1.sharding_strategy = strategy;
        plan.fsdp1.mesh = DataParallelMesh{2, 8};
        plan.fsdp1.no_sync = no_sync;
        plan.fsdp1.forward_prefetch = no_sync;
        plan.training.grad_accum_steps = 2;
        plan.training.activation_checkpointing = ac;
        if (strategy != Fsdp1ShardingStrategy::kHybridShard && strategy != Fsdp1ShardingStrategy::kHybridShardZero2) {
          plan.fsdp1.mesh = DataParallelMesh{};
        }
        SCOPED_TRACE(testing::Message() << "strategy " << static_cast<int>(strategy) << " no_sync " << no_sync);
        MustSimulate(MustLower(plan));
      }
    }
  }
}


// ---- oom.policy catch_and_sync: Composer's OOM-flag agreements

struct OomSyncCounts {
  int64_t oom_sync = 0;        // oom_sync all-reduces (1 byte each)
  int64_t oom_sync_bytes = 0;
  int64_t reads = 0;           // D2H copies of a flag (.item())
  std::map<std::string, int64_t> hooks;  // "composer::sync_hook (<place>)" host work per place
  bool unshard_hook_before_every_all_gather = true;
};

OomSyncCounts CountOomSync(const Schedule& schedule) {
  OomSyncCounts counts;
  const traces::Program& program = schedule.ProgramOf(0);
  for (size_t i = 0; i < program.ops.size(); ++i) {
    const traces::Op& op = program.ops[i];
    if (const auto* c = std::get_if<traces::CollectiveOp>(&op.payload)) {
      if (c->oom_sync) {
        ++counts.oom_sync;
        counts.oom_sync_bytes += c->bytes;
        EXPECT_EQ(c->type, CollectiveType::kAllReduce);
        EXPECT_EQ(program.comm_slots[static_cast<size_t>(c->comm)], "dp");
      }
      if (c->type == CollectiveType::kAllGather) {
        // The op before the all-gather: the hook's MIN all-reduce on the same stream.
        const auto* before = i > 0 ? std::get_if<traces::CollectiveOp>(&program.ops[i - 1].payload) : nullptr;
        if (before == nullptr || !before->oom_sync || before->stream != c->stream) {
          counts.unshard_hook_before_every_all_gather = false;
        }
      }
    } else if (const auto* copy = std::get_if<traces::MemcpyOp>(&op.payload)) {
      if (copy->kind == traces::MemcpyKind::kDeviceToHost && copy->bytes == 1) ++counts.reads;
    } else if (std::holds_alternative<traces::HostWorkOp>(op.payload) && op.name != traces::kNoName) {
      const std::string name(program.NameOf(op.name));
      if (name.rfind("composer::sync_hook (", 0) == 0) ++counts.hooks[name.substr(21, name.size() - 22)];
    }
  }
  return counts;
}

TEST(Fsdp1OomPolicy, SyncHooksAtTheFourPlacesPerStep) {
  // Two blocks: 3 FSDP units (root + 2 blocks). FULL_SHARD all-gathers 3 units in forward and
  // 2 in backward (the root keeps its parameters): 5 unshards. Per micro-batch the hooks run
  // before each unit's forward (3) and backward (3), after each unit's backward (3) and after
  // each unshard's allocation (5); the trainer adds its after-forward check per micro-batch
  // and its end-of-batch agreement once. Each agreement is 2 one-byte all-reduces (MAX, MIN);
  // each reads the MAX flag once, the end-of-batch loop also the MIN flag.
  for (int32_t accum : {1, 2}) {
    Plan plan = ToyPlan();
    plan.training.grad_accum_steps = accum;
    plan.oom.policy = OomPolicy::kCatchAndSync;
    plan.oom.sync_hooks = true;
    const Schedule schedule = MustLower(plan);
    const OomSyncCounts counts = CountOomSync(schedule);
    const int64_t per_micro_batch = 3 + 3 + 3 + 5 + 1;
    const int64_t agreements = accum * per_micro_batch + 1;
    EXPECT_EQ(counts.oom_sync, 2 * agreements) << "accum " << accum;
    EXPECT_EQ(counts.oom_sync_bytes, 2 * agreements);
    EXPECT_EQ(counts.reads, agreements + 1);
    EXPECT_EQ(counts.hooks.at("pre_forward"), 3 * accum);
    EXPECT_EQ(counts.hooks.at("pre_backward"), 3 * accum);
    EXPECT_EQ(counts.hooks.at("post_backward"), 3 * accum);
    EXPECT_EQ(counts.hooks.at("unshard"), 5 * accum);
    EXPECT_EQ(counts.hooks.at("after_forward"), accum);
    EXPECT_EQ(counts.hooks.at("end_of_batch"), 1);
    EXPECT_TRUE(counts.unshard_hook_before_every_all_gather);
    // The FSDP traffic is unchanged; the all-reduce bytes grow by the flags only.
    const auto bytes = CollectiveBytes(schedule);
    const UnitNumels u = Units(plan);
    EXPECT_EQ(Get(bytes, CollectiveType::kAllGather),
              accum * kBf16 * (SumPadded(u, 8, true) + SumPadded(u, 8, false)));
    EXPECT_EQ(Get(bytes, CollectiveType::kAllReduce), kClipNormBytes + 2 * agreements);
    MustSimulate(schedule);
  }
}

TEST(Fsdp1OomPolicy, CatchWithoutHooksHasOnlyTheTrainersAgreements) {
  Plan plan = ToyPlan();
  plan.oom.policy = OomPolicy::kCatchAndSync;
  const Schedule schedule = MustLower(plan);
  const OomSyncCounts counts = CountOomSync(schedule);
  EXPECT_EQ(counts.oom_sync, 2 * 2);  // after forward, end of batch
  EXPECT_EQ(counts.hooks.size(), 2u);
  EXPECT_FALSE(counts.unshard_hook_before_every_all_gather);
  MustSimulate(schedule);
  // raise: nothing of it, and the schedule is the one of a plan without an oom section.
  const Schedule raised = MustLower(ToyPlan());
  EXPECT_EQ(CountOomSync(raised).oom_sync, 0);
  EXPECT_EQ(raised.metadata.count("oom.policy"), 0u);
  EXPECT_EQ(schedule.metadata.at("oom.policy"), "catch_and_sync");
}

}  // namespace
}  // namespace shardscope::sim

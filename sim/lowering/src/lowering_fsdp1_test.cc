// Tests for the FSDP1 lowering: bytes per collective type per step in closed form
// (FlatParameters padded to a multiple of the shard group), op order of the prefetch modes,
// the all-gather rate limiter, no_sync, HSDP, consolidation on rank 0, Composer's OOM-flag
// agreements. Every schedule validates and simulates to completion. fairscale's FSDP:
// lowering_fsdp1_fairscale_test.cc.
#include <gtest/gtest.h>

#include "lowering_fsdp1_test_support.h"

// In the helpers' namespace, so the tests call them unqualified.
namespace shardscope::sim::fsdp1_test {
namespace {

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

TEST(Fsdp1Limiter, LimitAllGathersBlocksTheHostAndBoundsMemory) {
  // Six blocks, so that the forward has more unshards than the queue holds; long enough
  // sequences that the GPU, not the host, is the bottleneck (the host runs ahead).
  Plan plan = ToyPlan("", "{preset: dgx-a100, nodes: 1}", 6);
  Widen(plan);
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
  Widen(plan);
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
}  // namespace shardscope::sim::fsdp1_test

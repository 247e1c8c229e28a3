// DeepSpeed ZeRO-3 lowering (lowering_zero3*.cc): closed-form communication and
// model-state bytes per rank, prefetch and persistence, the 2021 per-parameter path and
// other legacy behaviours, allocation lifetimes and op order against DeepSpeed's sources;
// every schedule validates and simulates to completion.
#include <gtest/gtest.h>

#include <set>

#include "lowering_zero_test_support.h"

// In the helpers' namespace, so the tests call them unqualified.
namespace shardscope::sim::zero_test {
namespace {

TEST(ZeroLowering, Stage3CommunicatesThreePsiPerStep) {
  const Plan plan = Zero3NoPrefetchPlan();
  const Schedule schedule = MustLower(plan);
  // Forward all-gather + backward all-gather + reduce-scatter, each Ψ (padded) in bf16.
  EXPECT_EQ(CollectiveBytes(schedule, "ZeRO::all_gather_coalesced", CollectiveType::kAllGather),
            2 * PaddedNumel(plan) * kBf16);
  EXPECT_EQ(CollectiveBytes(schedule, "ZeRO::reduce_scatter_coalesced", CollectiveType::kReduceScatter),
            PaddedNumel(plan) * kBf16);
  EXPECT_EQ(CountOps(schedule, "ZeRO::all_gather_dp_groups"), 0);  // no all-gather after the step
  MustSimulate(schedule);
}

TEST(ZeroLowering, Stage3PrefetchCoalescesAndKeepsParametersItSkipped) {
  Plan plan = Zero3NoPrefetchPlan();
  plan.zero.stage3_prefetch_bucket_size = 100'000;  // a few submodules ahead
  const Schedule schedule = MustLower(plan);
  // Everything is gathered in forward; in backward less than everything: a prefetch that
  // passes over a submodule's later use while the submodule is still gathered records that
  // use (__most_recent_step_id_param_fetched_for), and __params_to_release then keeps it
  // (so some submodule is gathered once; none more than twice).
  const int64_t gathered = CollectiveBytes(schedule, "ZeRO::all_gather_coalesced", CollectiveType::kAllGather);
  EXPECT_GT(gathered, PaddedNumel(plan) * kBf16);
  EXPECT_LT(gathered, 2 * PaddedNumel(plan) * kBf16);
  std::map<std::string, int64_t> gathers;
  const traces::Program& program = schedule.ProgramOf(0);
  for (const traces::Op& op : program.ops) {
    const auto* a = std::get_if<traces::AllocateOp>(&op.payload);
    const std::string& tensor = a == nullptr ? std::string() : program.tensors[static_cast<size_t>(a->tensor)];
    if (a != nullptr && tensor.rfind("unsharded.", 0) == 0) ++gathers[tensor];
  }
  EXPECT_EQ(gathers.size(), 21u);  // 9 per block, the embedding, the head's norm and output
  bool some_kept = false;
  for (const auto& [tensor, count] : gathers) {
    EXPECT_TRUE(count == 1 || count == 2) << tensor << " " << count;
    some_kept = some_kept || count == 1;
  }
  EXPECT_TRUE(some_kept);
  // Prefetching coalesces several submodules into one all-gather.
  const Schedule on_demand = MustLower(Zero3NoPrefetchPlan());
  EXPECT_LT(CountOps(schedule, "ZeRO::all_gather_coalesced"), CountOps(on_demand, "ZeRO::all_gather_coalesced"));
  MustSimulate(schedule);
}

TEST(ZeroLowering, Stage3ModelStatesAreSixteenPsiOverN) {
  const Plan plan = Zero3NoPrefetchPlan();
  const Schedule schedule = MustLower(plan);
  const int64_t partition = PaddedNumel(plan) / kWorld;
  // Sums: bf16 parameter partitions, fp32 master partition, two fp32 moments and the bf16
  // gradient partitions — everything a rank keeps across steps apart from the IPG bucket.
  const int64_t total = Allocated(schedule, "param_shard.").first + Allocated(schedule, "exp_avg.").first +
                        Allocated(schedule, "exp_avg_sq.").first +
                        Allocated(schedule, "grad_shard.grad_partitions_flat").first;
  EXPECT_EQ(total, 16 * partition);
  EXPECT_NEAR(static_cast<double>(total), 16.0 * static_cast<double>(Psi(plan)) / kWorld,
              16.0 * static_cast<double>(Params(plan).size()));
  EXPECT_EQ(Allocated(schedule, "unsharded.persistent.").second, 0);
}

TEST(ZeroLowering, Stage3PersistentParametersAreNeverGathered) {
  Plan plan = Zero3NoPrefetchPlan();
  // hidden 256: norms (256) and attention projections (65,536) fall below; the MLP
  // (176,128) and embedding/output (256,000) do not.
  constexpr int64_t kThreshold = 100'000;
  plan.zero.stage3_param_persistence_threshold = kThreshold;
  const Schedule schedule = MustLower(plan);
  EXPECT_EQ(Allocated(schedule, "unsharded.layers.0.attention.wq").second, 0);
  EXPECT_EQ(Allocated(schedule, "unsharded.layers.0.attention_norm").second, 0);
  EXPECT_EQ(Allocated(schedule, "unsharded.layers.0.feed_forward.w1").second, 2);  // forward + backward
  EXPECT_EQ(CollectiveBytes(schedule, "ZeRO::all_gather_coalesced", CollectiveType::kAllGather),
            2 * PaddedNumel(plan, kThreshold) * kBf16);
  // Persistent parameters are whole on every rank, freed at the start of the step
  // (_partition_all_parameters) and re-gathered after it (_post_step), each into its own
  // buffer of ceil(numel / N) x N elements (previously: one unpadded block, never freed);
  // their gradients are still reduce-scattered.
  int64_t persistent_padded = 0, persistent_params = 0;
  for (const ParamTensor& p : Params(plan)) {
    if (p.numel <= kThreshold) {
      persistent_padded += (p.numel + kWorld - 1) / kWorld * kWorld;
      ++persistent_params;
    }
  }
  // Held from the previous step, then gathered again: two allocations per parameter.
  EXPECT_EQ(Allocated(schedule, "unsharded.persistent.").first, 2 * persistent_padded * kBf16);
  EXPECT_EQ(Allocated(schedule, "unsharded.persistent.").second, 2 * persistent_params);
  EXPECT_EQ(CollectiveBytes(schedule, "ZeRO::all_gather_persistent_parameters", CollectiveType::kAllGather),
            (PaddedNumel(plan) - PaddedNumel(plan, kThreshold)) * kBf16);
  EXPECT_EQ(CollectiveBytes(schedule, "ZeRO::reduce_scatter_coalesced", CollectiveType::kReduceScatter),
            PaddedNumel(plan) * kBf16);
  MustSimulate(schedule);
}

TEST(ZeroLowering, Stage3ReuseDistanceKeepsParametersForBackward) {
  Plan plan = Zero3NoPrefetchPlan();
  plan.zero.stage3_max_reuse_distance = 1'000'000'000;  // DeepSpeed's default
  const Schedule schedule = MustLower(plan);
  // The whole trace is within the reuse distance: nothing is released after forward, so
  // backward gathers nothing.
  EXPECT_EQ(CollectiveBytes(schedule, "ZeRO::all_gather_coalesced", CollectiveType::kAllGather),
            PaddedNumel(plan) * kBf16);
  MustSimulate(schedule);
}

TEST(ZeroLowering, Stage3ReducesEveryMicroStep) {
  constexpr int32_t kAccum = 3;
  const Plan plan = Zero3NoPrefetchPlan(kAccum);
  const Schedule schedule = MustLower(plan);
  EXPECT_EQ(CollectiveBytes(schedule, "ZeRO::reduce_scatter_coalesced", CollectiveType::kReduceScatter),
            kAccum * PaddedNumel(plan) * kBf16);
  // One host synchronize of the reduce stream at the end of every backward.
  EXPECT_EQ(CountOps(schedule, "ZeRO::reduce_and_partition_stream.synchronize"), kAccum);
  MustSimulate(schedule);
}

TEST(ZeroLowering, Stage3LegacyOptionsAddSynchronizations) {
  Plan plan = Zero3NoPrefetchPlan();
  plan.zero.stage3_prefetch_bucket_size = 50'000'000;
  const Schedule fixed = MustLower(plan);
  EXPECT_EQ(CountOps(fixed, "ZeRO::legacy.all_gather_stream.synchronize"), 0);
  EXPECT_EQ(CountOps(fixed, "ZeRO::legacy.debug_norm.item"), 0);
  EXPECT_EQ(CountOps(fixed, "ZeRO::legacy.release.synchronize"), 0);
  plan.zero.legacy_stream_sync_in_fetch_release = true;
  plan.zero.legacy_debug_norm_sync = true;
  plan.zero.legacy_prefetch_off_by_one = true;
  const Schedule legacy = MustLower(plan);
  // Every submodule with parameters (9 per block, the embedding, the head's norm and
  // output) is fetched once in forward and once in backward, and released after each.
  const int64_t submodules = 2 * 9 + 1 + 2;
  EXPECT_EQ(CountOps(legacy, "ZeRO::legacy.debug_norm.item"), 2 * submodules);
  // A blocking synchronize in every fetch (the all-gather stream) and every release (the
  // compute stream that used the parameters).
  EXPECT_GE(CountOps(legacy, "ZeRO::legacy.all_gather_stream.synchronize"), submodules);
  EXPECT_GE(CountOps(legacy, "ZeRO::legacy.release.synchronize"), 2 * submodules);
  EXPECT_GT(CountOps(legacy, "ZeRO::all_gather_coalesced"), CountOps(fixed, "ZeRO::all_gather_coalesced"));
  MustSimulate(legacy);
}

// The 2021 per-parameter path (partition_parameters.py _allgather_param @ c4ec23fc): each
// parameter gets its own zeroed buffer, a device synchronize, a list-form all_gather (which
// ProcessGroupNCCL runs into a flat buffer and copies back out, one copy per rank) and, on
// release, a 1-element placeholder copied from the host (a pageable copy: a stream
// synchronize per released parameter).
TEST(ZeroLowering, Stage3LegacyPerParameterGatherSynchronizesEachParameter) {
  Plan plan = Zero3NoPrefetchPlan();  // 21 one-parameter submodules, released after each use
  plan.zero.legacy_per_parameter_path = true;
  plan.zero.legacy_stream_sync_in_fetch_release = true;
  const Schedule schedule = MustLower(plan);
  constexpr int64_t kGathers = 2 * 21;  // forward and backward
  EXPECT_EQ(CountOps(schedule, "ZeRO::all_gather_coalesced"), 0);
  EXPECT_EQ(CountOps(schedule, "ZeRO::all_gather"), kGathers);
  EXPECT_EQ(CountOps(schedule, "ZeRO::legacy.allgather_param.synchronize"), kGathers);
  EXPECT_EQ(CountOps(schedule, "ZeRO::legacy.allgather_param.copy_out"), kGathers * kWorld);
  EXPECT_EQ(CountOps(schedule, "ZeRO::legacy.partition.placeholder"), kGathers);
  EXPECT_EQ(CountOps(schedule, "ZeRO::legacy.release.synchronize"), kGathers);
  // Each gather: the aligned buffer and the flat buffer ProcessGroupNCCL gathers into, both
  // ceil(numel / 8) x 8 elements. feed_forward.w1 is 688 x 256.
  const int64_t w1 = (176'128 + kWorld - 1) / kWorld * kWorld;
  EXPECT_EQ(Allocated(schedule, "unsharded.layers.0.feed_forward.w1.p0"),
            (std::pair<int64_t, int64_t>{2 * 2 * w1 * kBf16, 4}));
  EXPECT_EQ(CollectiveBytes(schedule, "ZeRO::all_gather", CollectiveType::kAllGather), 2 * PaddedNumel(plan) * kBf16);
  MustSimulate(schedule);
  // Without the blocking release the placeholder copies go too.
  plan.zero.legacy_stream_sync_in_fetch_release = false;
  const Schedule unblocked = MustLower(plan);
  EXPECT_EQ(CountOps(unblocked, "ZeRO::legacy.partition.placeholder"), 0);
  EXPECT_EQ(CountOps(unblocked, "ZeRO::legacy.allgather_param.synchronize"), kGathers);
  MustSimulate(unblocked);
}

// The 2021 gradient partition (stage3.py at 70adb32a): grads_in_partition is made by the
// first partition_previous_reduced_grads of a step — torch.zeros on the reduction stream, once
// per step even with accumulation (it is dropped only at the boundary) — and freed in the step
// by zero_grad after the fp32 copy, before the optimizer. Without contiguous_gradients
// _release_ipg_buffers leaves it: held from the start, never freed.
TEST(ZeroLowering, Stage3LegacyGradientPartitionLivesFromTheBackwardToTheStep) {
  constexpr int32_t kAccum = 3;
  Plan plan = Zero3NoPrefetchPlan(kAccum);
  plan.zero.legacy_per_parameter_path = true;
  const Schedule schedule = MustLower(plan);
  // Σ ceil(numel / 8) over the parameters, 2 bytes each: PaddedNumel / 8 x 2.
  const int64_t bytes = PaddedNumel(plan) / kWorld * kBf16;
  EXPECT_EQ(Allocated(schedule, "grad_shard.grad_partitions_flat"), (std::pair<int64_t, int64_t>{bytes, 1}));
  EXPECT_EQ(Allocated(schedule, "grad_shard.grad_partitions_flat", /*micro_batch=*/0).second, 1);
  EXPECT_EQ(CountOps(schedule, "ZeRO::legacy.grads_in_partition.zeros"), 1);
  const OpIndex index(schedule);
  size_t allocated = 0, freed = 0, to_fp32 = 0, adam = 0, first_partition = 0;
  for (size_t i = 0; i < index.program.ops.size(); ++i) {
    const traces::Op& op = index.program.ops[i];
    const std::string_view name = index.Name(op);
    if (name == "ZeRO::grad_partition.to_fp32") to_fp32 = i;
    if (name == "optimizer.adamw") adam = i;
    if (name == "ZeRO::partition_grads.copy" && first_partition == 0) first_partition = i;
    const std::string* tensor = index.Tensor(op);
    if (tensor == nullptr || *tensor != "grad_shard.grad_partitions_flat") continue;
    if (const auto* a = std::get_if<traces::AllocateOp>(&op.payload)) {
      allocated = i;
      EXPECT_EQ(op.tags.phase, traces::Phase::kBackward);
      EXPECT_EQ(index.program.streams[static_cast<size_t>(a->stream)].name, "reduce_and_partition");
    } else {
      freed = i;
      EXPECT_EQ(op.tags.phase, traces::Phase::kOptimizer);
    }
  }
  EXPECT_LT(allocated, first_partition);  // made before the first slice is copied into it
  EXPECT_LT(to_fp32, freed);
  EXPECT_LT(freed, adam);
  MustSimulate(schedule);

  plan.zero.contiguous_gradients = false;
  const Schedule kept = MustLower(plan);
  EXPECT_EQ(Allocated(kept, "grad_shard.grad_partitions_flat"), (std::pair<int64_t, int64_t>{bytes, 1}));
  EXPECT_EQ(CountOps(kept, "ZeRO::legacy.grads_in_partition.zeros"), 0);
  const OpIndex kept_index(kept);
  for (const traces::Op& op : kept_index.program.ops) {
    const std::string* tensor = kept_index.Tensor(op);
    if (tensor != nullptr && *tensor == "grad_shard.grad_partitions_flat") {
      EXPECT_TRUE(std::holds_alternative<traces::AllocateOp>(op.payload));
      EXPECT_EQ(op.tags.phase, traces::Phase::kNone);
    }
  }
  MustSimulate(kept);
}

// 2021: gathers and reduce-scatters run on Init's group, WORLD ("dp"); the optimizer's
// overflow and norm all-reduces on the engine's data_parallel_group, a new_group of the same
// ranks ("dp_engine", its own NCCL communicator). Today's lowering has one slot.
TEST(ZeroLowering, Stage3LegacyStepAllReducesRunOnTheEnginesGroup) {
  Plan plan = Zero3NoPrefetchPlan();
  const Schedule today = MustLower(plan);
  EXPECT_EQ(today.ProgramOf(0).comm_slots, (std::vector<std::string>{"dp"}));
  plan.zero.legacy_per_parameter_path = true;
  const Schedule schedule = MustLower(plan);
  const traces::Program& program = schedule.ProgramOf(0);
  EXPECT_EQ(program.comm_slots, (std::vector<std::string>{"dp", "dp_engine"}));
  std::map<std::string, std::set<std::string>> slots_of;  // collective name -> slots
  for (const traces::Op& op : program.ops) {
    if (const auto* c = std::get_if<CollectiveOp>(&op.payload)) {
      slots_of[std::string(program.NameOf(op.name))].insert(program.comm_slots[static_cast<size_t>(c->comm)]);
    }
  }
  EXPECT_EQ(slots_of["ZeRO::legacy.overflow.all_reduce"], (std::set<std::string>{"dp_engine"}));
  EXPECT_EQ(slots_of["ZeRO::get_grad_norm_direct.all_reduce"], (std::set<std::string>{"dp_engine"}));
  EXPECT_EQ(slots_of["ZeRO::all_gather"], (std::set<std::string>{"dp"}));
  EXPECT_EQ(slots_of["ZeRO::reduce_scatter"], (std::set<std::string>{"dp"}));
  // Two communicators of the same 8 ranks.
  ASSERT_EQ(schedule.communicators.size(), 2u);
  EXPECT_EQ(schedule.communicators[0].ranks, schedule.communicators[1].ranks);
  EXPECT_NE(schedule.communicators[0].name, schedule.communicators[1].name);
  MustSimulate(schedule);
}

// partition_parameters.py all_gather_coalesced, len(params) == 1: one buffer of
// ceil(numel / N) x N gathered straight from ds_tensor, the parameter a view of it.
TEST(ZeroLowering, Stage3SingleParameterGatherUsesOneBufferAndNoCopies) {
  const Plan plan = Zero3NoPrefetchPlan();  // one submodule (one parameter) per fetch
  const Schedule schedule = MustLower(plan);
  EXPECT_EQ(CountOps(schedule, "ZeRO::all_gather_coalesced.copy_in"), 0);
  EXPECT_EQ(CountOps(schedule, "ZeRO::all_gather_coalesced.wait.cat"), 0);
  EXPECT_EQ(Allocated(schedule, "all_gather_output.").second, 0);
  // feed_forward.w1: ffn 688 x hidden 256 = 176,128 elements, gathered in forward and in
  // backward, each time into ceil(176128 / 8) x 8 elements.
  const int64_t w1 = (176'128 + kWorld - 1) / kWorld * kWorld;
  EXPECT_EQ(Allocated(schedule, "unsharded.layers.0.feed_forward.w1"),
            (std::pair<int64_t, int64_t>{2 * w1 * kBf16, 2}));
  // Every all-gather is one gather per submodule fetch: 21 submodules, forward + backward.
  EXPECT_EQ(CountOps(schedule, "ZeRO::all_gather_coalesced"), 2 * 21);
  MustSimulate(schedule);
}

// AllGatherCoalescedHandle keeps `partitions` (views of the flat buffer) and each parameter
// stays in __inflight_param_registry until its own submodule is fetched: the flat buffer of
// a prefetch lives across the fetches of all its submodules, not only the first one.
TEST(ZeroLowering, Stage3PrefetchFlatBufferLivesUntilItsLastParameterIsFetched) {
  Plan plan = Zero3NoPrefetchPlan();
  plan.zero.stage3_prefetch_bucket_size = 400'000;  // several submodules per prefetch
  const Schedule schedule = MustLower(plan);
  const OpIndex index(schedule);
  std::map<std::string, size_t> allocated_at;
  int64_t handles = 0, max_fetches_while_alive = 0;
  for (size_t i = 0; i < index.program.ops.size(); ++i) {
    const traces::Op& op = index.program.ops[i];
    const std::string* tensor = index.Tensor(op);
    if (tensor == nullptr || tensor->rfind("all_gather_output.h", 0) != 0) continue;
    if (std::holds_alternative<traces::AllocateOp>(op.payload)) {
      allocated_at[*tensor] = i;
      continue;
    }
    ++handles;
    int64_t fetches = 0;  // submodule fetches (pre-forward/backward hooks) while it lived
    for (size_t j = allocated_at.at(*tensor); j < i; ++j) {
      const std::string_view name = index.Name(index.program.ops[j]);
      fetches += name == "ZeRO::pre_forward_hook" || name == "ZeRO::pre_backward_hook" ? 1 : 0;
    }
    EXPECT_GE(fetches, 1) << *tensor;
    max_fetches_while_alive = std::max(max_fetches_while_alive, fetches);
  }
  EXPECT_EQ(handles, static_cast<int64_t>(allocated_at.size()));  // every flat buffer freed
  EXPECT_GT(handles, 0);
  // Freed at the first wait, a buffer would live across exactly one fetch.
  EXPECT_GE(max_fetches_while_alive, 3);
  MustSimulate(schedule);
}

// coalesced_collectives.py reduce_scatter_coalesced: always a pre-divide (div_) on the flat
// buffer; a single tensor divisible by N is used in place (no cat, no allocation); the flat
// buffer is released only after partition_grads has read the rank's output view.
TEST(ZeroLowering, Stage3ReduceScatterPreDividesAndReducesOneDivisibleTensorInPlace) {
  Plan plan = Zero3NoPrefetchPlan();
  plan.zero.reduce_bucket_size = 1;  // every gradient reduced on its own
  const Schedule alone = MustLower(plan);
  const int64_t reductions = CountOps(alone, "ZeRO::reduce_scatter_coalesced");
  EXPECT_EQ(reductions, static_cast<int64_t>(Params(plan).size()));  // each numel divides by 8
  EXPECT_EQ(CountOps(alone, "ZeRO::reduce_scatter_coalesced.div_"), reductions);
  EXPECT_EQ(CountOps(alone, "ZeRO::reduce_scatter_coalesced.cat"), 0);
  EXPECT_EQ(Allocated(alone, "reduce_scatter_input.").second, 0);
  MustSimulate(alone);

  const Schedule bucketed = MustLower(Zero3NoPrefetchPlan());  // 500M-element buckets
  EXPECT_EQ(CountOps(bucketed, "ZeRO::reduce_scatter_coalesced.div_"),
            CountOps(bucketed, "ZeRO::reduce_scatter_coalesced"));
  EXPECT_EQ(CountOps(bucketed, "ZeRO::reduce_scatter_coalesced.cat"),
            CountOps(bucketed, "ZeRO::reduce_scatter_coalesced"));
  const OpIndex index(bucketed);
  bool partitioned = false;
  int64_t frees = 0;
  for (const traces::Op& op : index.program.ops) {
    const std::string_view name = index.Name(op);
    if (name == "ZeRO::reduce_scatter_coalesced") partitioned = false;
    if (name == "ZeRO::partition_grads.copy" || name == "ZeRO::partition_grads.add") partitioned = true;
    const std::string* tensor = index.Tensor(op);
    if (tensor != nullptr && *tensor == "reduce_scatter_input.ipg" && std::holds_alternative<traces::FreeOp>(op.payload)) {
      EXPECT_TRUE(partitioned);
      ++frees;
    }
  }
  EXPECT_EQ(frees, CountOps(bucketed, "ZeRO::reduce_scatter_coalesced"));
}

// stage3.py step: _partition_all_parameters frees the persistent copies first; _post_step
// gathers them back with one all_gather_into_tensor per parameter (own buffer each) and an
// accelerator synchronize. The norm (get_grad_norm_direct) is an fp64 scalar, computed on
// the bf16 gradient partitions before their fp32 flatten.
TEST(ZeroLowering, Stage3StepFreesAndRegathersPersistentParametersOneByOne) {
  Plan plan = Zero3NoPrefetchPlan();
  constexpr int64_t kThreshold = 100'000;
  plan.zero.stage3_param_persistence_threshold = kThreshold;
  const Schedule schedule = MustLower(plan);
  int64_t persistent = 0;
  for (const ParamTensor& p : Params(plan)) persistent += p.numel <= kThreshold ? 1 : 0;
  EXPECT_EQ(persistent, 13);  // per block 2 norms + 4 attention projections; the final norm
  EXPECT_EQ(CountOps(schedule, "ZeRO::all_gather_persistent_parameters"), persistent);
  EXPECT_EQ(CountOps(schedule, "ZeRO::allgather_params_coalesced.synchronize"), 1);
  EXPECT_EQ(CollectiveBytes(schedule, "ZeRO::get_grad_norm_direct.all_reduce", CollectiveType::kAllReduce), 8);
  // One fp64 norm per gradient partition (every parameter, persistent ones included).
  EXPECT_EQ(CountOps(schedule, "ZeRO::get_grad_norm_direct.norm"), static_cast<int64_t>(Params(plan).size()));
  const OpIndex index(schedule);
  int64_t freed_in_step = 0;
  size_t first_norm = 0, flatten = 0, first_gather = 0;
  for (size_t i = 0; i < index.program.ops.size(); ++i) {
    const traces::Op& op = index.program.ops[i];
    const std::string* tensor = index.Tensor(op);
    if (tensor != nullptr && tensor->rfind("unsharded.persistent.", 0) == 0 &&
        std::holds_alternative<traces::FreeOp>(op.payload)) {
      EXPECT_EQ(op.tags.phase, traces::Phase::kOptimizer);
      EXPECT_EQ(first_norm, 0u) << "persistent parameters are freed before the norm";
      ++freed_in_step;
    }
    const std::string_view name = index.Name(op);
    if (name == "ZeRO::get_grad_norm_direct.norm" && first_norm == 0) first_norm = i;
    if (name == "ZeRO::flatten_grad_partition") flatten = i;
    if (name == "ZeRO::all_gather_persistent_parameters" && first_gather == 0) first_gather = i;
  }
  EXPECT_EQ(freed_in_step, persistent);
  EXPECT_LT(first_norm, flatten);
  EXPECT_LT(flatten, first_gather);
  MustSimulate(schedule);
}

// A 2B-class GPT-style model (40 layers, hidden 2048, GeLU MLP 8192: ~2.1B parameters) on
// 8 V100s (aws-p3dn), fp16: the three 2021 behaviours on must be slower than off. The
// reports (DeepSpeed issue #1069, PR #1170, PR #1453) saw about half the throughput; this
// model reproduces the direction only (see the report: the syncs still leave a one-submodule
// overlap, and per-parameter Python hook cost is not modelled).
TEST(ZeroLowering, Stage3LegacyBehavioursSlowA2BModelOnV100s) {
  const std::string yaml =
      "model: {layers: 40, hidden: 2048, heads: 16, kv_heads: 16, ffn: 8192, vocab: 50257, mlp: gelu}\n"
      "cluster: {preset: aws-p3dn, nodes: 1}\n"
      "strategy: ddp\n"
      "training: {seq_len: 1024, micro_batch_size: 1, dtype: fp16, activation_checkpointing: full}\n";
  Plan plan = test_support::MustParsePlan(yaml);
  ASSERT_FALSE(HasFailure());  // the plan parses
  plan.strategy = Strategy::kZero3;
  plan.zero.overlap_comm = true;
  plan.zero.reduce_bucket_size = 50'000'000;  // 100 MB IPG bucket: fits a 32 GB V100
  const auto tflops_per_gpu = [&](const Plan& p) {
    const Schedule schedule = MustLower(p);
    const SimulationResult result = MustSimulate(schedule);
    const double flops = std::stod(schedule.metadata.at(kMetaModelFlopsPerRankStep));
    return flops / (static_cast<double>(result.makespan_ns) * 1e-9) / 1e12;
  };
  const double fixed = tflops_per_gpu(plan);
  plan.zero.legacy_prefetch_off_by_one = true;
  plan.zero.legacy_stream_sync_in_fetch_release = true;
  plan.zero.legacy_debug_norm_sync = true;
  const double legacy = tflops_per_gpu(plan);
  std::printf("ZeRO-3 2B on 8 V100: %.1f TFLOP/s per GPU fixed, %.1f with the 2021 behaviours\n", fixed, legacy);
  EXPECT_LT(legacy, 0.95 * fixed);
}

}  // namespace
}  // namespace shardscope::sim::zero_test

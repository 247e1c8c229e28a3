// DeepSpeed ZeRO-1/2/3 lowering: closed-form communication and model-state bytes per rank,
// gradient-accumulation behaviour, persistence, the 2021 ZeRO-3 behaviours, and that every
// schedule validates and simulates to completion.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>
#include <variant>

#include "shardscope/sim/engine.h"
#include "shardscope/sim/lowering.h"
#include "shardscope/sim/model.h"
#include "shardscope/sim/plan.h"
#include "shardscope/sim/simulation.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::sim {
namespace {

using traces::CollectiveOp;
using traces::CollectiveType;
using traces::Schedule;

constexpr int64_t kWorld = 8;
constexpr int64_t kBf16 = 2;

// A 2-block toy model on one 8-GPU node. The plan parser does not know the zero strategies
// yet: parse as ddp and set the strategy and knobs directly.
Plan ToyPlan(Strategy strategy, int32_t grad_accum = 1) {
  const std::string yaml =
      "model: {layers: 2, hidden: 256, heads: 4, kv_heads: 4, ffn: 688, vocab: 1000}\n"
      "cluster: {preset: dgx-a100, nodes: 1}\n"
      "strategy: ddp\n"
      "training: {seq_len: 128, micro_batch_size: 1, grad_accum_steps: " +
      std::to_string(grad_accum) + ", dtype: bf16}\n";
  StatusOr<Plan> plan = ParsePlan(yaml, "<test>");
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  Plan out = *plan;
  out.strategy = strategy;
  out.zero.overlap_comm = strategy == Strategy::kZero3;  // DeepSpeed's resolved default
  return out;
}

std::vector<ParamTensor> Params(const Plan& plan) {
  std::vector<ParamTensor> params;
  for (const ModuleKernels& m :
       DecomposeModel(plan.model, {plan.training.micro_batch_size, plan.training.seq_len, plan.training.dtype})) {
    params.insert(params.end(), m.params.begin(), m.params.end());
  }
  return params;
}

int64_t Psi(const Plan& plan) {
  int64_t total = 0;
  for (const ParamTensor& p : Params(plan)) total += p.numel;
  return total;
}

Schedule MustLower(const Plan& plan) {
  StatusOr<Schedule> schedule = LowerPlan(plan);
  EXPECT_TRUE(schedule.ok()) << schedule.status().message();
  if (!schedule.ok()) return {};
  Status valid = traces::ValidateSchedule(*schedule);
  EXPECT_TRUE(valid.ok()) << valid.message();
  return *schedule;
}

SimulationResult MustSimulate(const Schedule& schedule) {
  StatusOr<SimulationSetup> setup = SetupFromSchedule(schedule, "<test>");
  EXPECT_TRUE(setup.ok()) << setup.status().message();
  ClusterCostProvider costs(schedule, setup->cluster);
  StatusOr<SimulationResult> result =
      Simulate(schedule, costs, EngineConfigFor(*setup, schedule.world_size()), nullptr);
  EXPECT_TRUE(result.ok()) << result.status().message();
  EXPECT_FALSE(result->hung);
  for (const RankStats& rank : result->ranks) EXPECT_TRUE(rank.finished);
  return *result;
}

// Bytes of rank 0's collectives whose op name is `name`.
int64_t CollectiveBytes(const Schedule& schedule, const std::string& name, CollectiveType type) {
  const traces::Program& program = schedule.ProgramOf(0);
  int64_t bytes = 0;
  for (const traces::Op& op : program.ops) {
    const auto* c = std::get_if<CollectiveOp>(&op.payload);
    if (c != nullptr && c->type == type && program.NameOf(op.name) == name) bytes += c->bytes;
  }
  return bytes;
}

int64_t CountOps(const Schedule& schedule, const std::string& name) {
  const traces::Program& program = schedule.ProgramOf(0);
  int64_t n = 0;
  for (const traces::Op& op : program.ops) n += program.NameOf(op.name) == name ? 1 : 0;
  return n;
}

// Bytes of every allocation of rank 0 whose tensor name starts with `prefix`, with the
// number of allocations.
std::pair<int64_t, int64_t> Allocated(const Schedule& schedule, const std::string& prefix,
                                      int32_t micro_batch = -2) {
  const traces::Program& program = schedule.ProgramOf(0);
  int64_t bytes = 0, count = 0;
  for (const traces::Op& op : program.ops) {
    const auto* a = std::get_if<traces::AllocateOp>(&op.payload);
    if (a == nullptr || program.tensors[static_cast<size_t>(a->tensor)].rfind(prefix, 0) != 0) continue;
    if (micro_batch != -2 && op.tags.micro_batch != micro_batch) continue;
    bytes += a->bytes;
    ++count;
  }
  return {bytes, count};
}

// ---- ZeRO-1 / ZeRO-2 ----------------------------------------------------------------------

// The flat bit16 group is padded to a multiple of 2 x world (nccl_start_alignment_factor).
int64_t FlatNumel(const Plan& plan) { return (Psi(plan) + 2 * kWorld - 1) / (2 * kWorld) * (2 * kWorld); }

TEST(ZeroLowering, Stage1And2CommunicateTwoPsiPerStep) {
  for (Strategy strategy : {Strategy::kZero1, Strategy::kZero2}) {
    Plan plan = ToyPlan(strategy);
    plan.zero.reduce_bucket_size = 200'000;  // several IPG buckets
    const Schedule schedule = MustLower(plan);
    const int64_t psi = Psi(plan);
    // Gradient reduction: every gradient element goes through one all_reduce of its bucket
    // (bf16): Ψ x 2 bytes; then the parameters: one all_gather of the padded flat group.
    EXPECT_EQ(CollectiveBytes(schedule, "ZeRO::allreduce_bucket", CollectiveType::kAllReduce), psi * kBf16);
    EXPECT_GT(CountOps(schedule, "ZeRO::allreduce_bucket"), 1);
    EXPECT_EQ(CollectiveBytes(schedule, "ZeRO::all_gather_dp_groups", CollectiveType::kAllGather),
              FlatNumel(plan) * kBf16);
    // No reduce-scatter: DeepSpeed all-reduces the bucket and keeps its slice.
    EXPECT_EQ(CountOps(schedule, "ZeRO::reduce_scatter_coalesced"), 0);
    // The clip norm is one fp32 scalar all-reduced over the world.
    EXPECT_EQ(CollectiveBytes(schedule, "clip_grad_norm.all_reduce", CollectiveType::kAllReduce), 4);
    MustSimulate(schedule);
  }
}

TEST(ZeroLowering, Stage1ModelStatesAreFourPsiPlusTwelvePsiOverN) {
  const Plan plan = ToyPlan(Strategy::kZero1);
  const Schedule schedule = MustLower(plan);
  const int64_t psi = Psi(plan);
  const int64_t partition = FlatNumel(plan) / kWorld;
  // Sums: the replicated bf16 flat parameters, the full bf16 gradients autograd allocates
  // (grad.<module>, micro-batch 0), the fp32 master partition and the two fp32 moments.
  const int64_t params = Allocated(schedule, "unsharded.bit16_groups_flat").first;
  const int64_t grads = Allocated(schedule, "grad.", 0).first;
  const int64_t optimizer = Allocated(schedule, "param_shard.fp32_partition").first +
                            Allocated(schedule, "exp_avg.").first + Allocated(schedule, "exp_avg_sq.").first;
  EXPECT_EQ(params, 2 * FlatNumel(plan));
  EXPECT_EQ(grads, 2 * psi);
  EXPECT_EQ(optimizer, 12 * partition);
  // 4Ψ + 12Ψ/N up to the alignment padding (< 2N elements).
  EXPECT_NEAR(static_cast<double>(params + grads + optimizer), 4.0 * psi + 12.0 * psi / kWorld, 4.0 * 2 * kWorld);
}

TEST(ZeroLowering, Stage2ModelStatesAreTwoPsiPlusFourteenPsiOverN) {
  const Plan plan = ToyPlan(Strategy::kZero2);
  const Schedule schedule = MustLower(plan);
  const int64_t psi = Psi(plan);
  const int64_t partition = FlatNumel(plan) / kWorld;
  // Sums: the replicated bf16 parameters, the bf16 gradient partition (grads_in_partition)
  // and the fp32 master partition with its two moments. The full gradients are transient
  // (copied into the IPG buffer as they become ready).
  const int64_t total = Allocated(schedule, "unsharded.bit16_groups_flat").first +
                        Allocated(schedule, "grad_shard.grads_in_partition").first +
                        Allocated(schedule, "param_shard.fp32_partition").first +
                        Allocated(schedule, "exp_avg.").first + Allocated(schedule, "exp_avg_sq.").first;
  EXPECT_EQ(total, 2 * FlatNumel(plan) + 14 * partition);
  EXPECT_NEAR(static_cast<double>(total), 2.0 * psi + 14.0 * psi / kWorld, 16.0 * 2 * kWorld);
}

TEST(ZeroLowering, Stage1ReducesOncePerStepStage2EveryMicroStep) {
  constexpr int32_t kAccum = 4;
  for (Strategy strategy : {Strategy::kZero1, Strategy::kZero2}) {
    const Plan plan = ToyPlan(strategy, kAccum);
    const Schedule schedule = MustLower(plan);
    const int64_t reductions = strategy == Strategy::kZero1 ? 1 : kAccum;
    EXPECT_EQ(CollectiveBytes(schedule, "ZeRO::allreduce_bucket", CollectiveType::kAllReduce),
              reductions * Psi(plan) * kBf16)
        << StrategyName(strategy);
    // The parameters are gathered once, after the step.
    EXPECT_EQ(CountOps(schedule, "ZeRO::all_gather_dp_groups"), 1);
    MustSimulate(schedule);
  }
}

TEST(ZeroLowering, OverlapCommDoubleBuffersAndSynchronizesInTheEpilogue) {
  Plan plan = ToyPlan(Strategy::kZero2);
  plan.zero.overlap_comm = true;
  const Schedule with = MustLower(plan);
  EXPECT_EQ(Allocated(with, "bucket.ipg.").second, 2);
  EXPECT_EQ(CountOps(with, "ZeRO::ipg_epilogue.synchronize"), 1);
  MustSimulate(with);
  plan.zero.overlap_comm = false;
  const Schedule without = MustLower(plan);
  EXPECT_EQ(Allocated(without, "bucket.ipg.").second, 1);
  EXPECT_EQ(CountOps(without, "ZeRO::ipg_epilogue.synchronize"), 0);
}

// ---- ZeRO-3 -------------------------------------------------------------------------------

// Σ over parameters of numel rounded up to a multiple of the world size (each rank holds
// ceil(numel / N) of every parameter); only parameters at or above `threshold` when given.
int64_t PaddedNumel(const Plan& plan, int64_t threshold = 0) {
  int64_t total = 0;
  for (const ParamTensor& p : Params(plan)) {
    if (p.numel >= threshold) total += (p.numel + kWorld - 1) / kWorld * kWorld;
  }
  return total;
}

Plan Zero3NoPrefetchPlan(int32_t grad_accum = 1) {
  Plan plan = ToyPlan(Strategy::kZero3, grad_accum);
  plan.zero.stage3_param_persistence_threshold = 0;  // nothing persistent
  plan.zero.stage3_max_reuse_distance = 0;           // release after every use
  plan.zero.stage3_prefetch_bucket_size = 0;         // fetch on demand only
  return plan;
}

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
  EXPECT_EQ(Allocated(schedule, "unsharded.persistent_parameters").second, 0);
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
  // Persistent parameters are whole on every rank and re-gathered once after the step
  // (_post_step); their gradients are still reduce-scattered.
  int64_t persistent = 0;
  for (const ParamTensor& p : Params(plan)) persistent += p.numel < kThreshold ? p.numel : 0;
  EXPECT_EQ(Allocated(schedule, "unsharded.persistent_parameters").first, persistent * kBf16);
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
  plan.zero.legacy_prefetch_first_param_only = true;
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
  StatusOr<Plan> parsed = ParsePlan(yaml, "<test>");
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  Plan plan = *parsed;
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
  plan.zero.legacy_prefetch_first_param_only = true;
  plan.zero.legacy_stream_sync_in_fetch_release = true;
  plan.zero.legacy_debug_norm_sync = true;
  const double legacy = tflops_per_gpu(plan);
  std::printf("ZeRO-3 2B on 8 V100: %.1f TFLOP/s per GPU fixed, %.1f with the 2021 behaviours\n", fixed, legacy);
  EXPECT_LT(legacy, 0.95 * fixed);
}

}  // namespace
}  // namespace shardscope::sim

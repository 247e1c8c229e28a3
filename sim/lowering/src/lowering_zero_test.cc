// DeepSpeed ZeRO-1/2/3 lowering: closed-form communication and model-state bytes per rank,
// gradient-accumulation behaviour, persistence, the 2021 ZeRO-3 behaviours, and that every
// schedule validates and simulates to completion.
#include <gtest/gtest.h>

#include <optional>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <variant>

#include "lowering_test_support.h"
#include "shardscope/sim/engine/engine.h"
#include "shardscope/sim/lowering/lowering.h"
#include "shardscope/sim/presets/model.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/sim/report/report.h"
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
       DecomposeModel(plan.model, WorkloadOf(plan))) {
    params.insert(params.end(), m.params.begin(), m.params.end());
  }
  return params;
}

int64_t Psi(const Plan& plan) {
  int64_t total = 0;
  for (const ParamTensor& p : Params(plan)) total += p.numel;
  return total;
}

using test_support::MustLower;

SimulationResult MustSimulate(const Schedule& schedule) {
  std::optional<SimulationResult> result = test_support::RunSimulation(schedule);
  if (!result) return SimulationResult{};
  EXPECT_FALSE(result->hung);
  for (const RankStats& rank : result->ranks) EXPECT_TRUE(rank.finished);
  return std::move(*result);
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
    // get_grad_norm_direct (stage_1_and_2.py, current main): the norm is one fp32 scalar
    // (.square().sum().float()) all-reduced over the world.
    EXPECT_EQ(CollectiveBytes(schedule, "ZeRO::get_grad_norm_direct.all_reduce", CollectiveType::kAllReduce), 4);
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

// grads_in_partition (copy_grads_in_partition): the whole numel of every parameter that
// overlaps the rank's partition (get_partition_info: a straddling parameter counts whole);
// the program follows the rank where that is largest.
int64_t GradsInPartitionNumel(const Plan& plan) {
  const int64_t partition = FlatNumel(plan) / kWorld;
  int64_t best = 0;
  for (int64_t rank = 0; rank < kWorld; ++rank) {
    int64_t offset = 0, whole = 0;
    for (const ParamTensor& p : Params(plan)) {
      if (offset < (rank + 1) * partition && offset + p.numel > rank * partition) whole += p.numel;
      offset += p.numel;
    }
    best = std::max(best, whole);
  }
  return best;
}

TEST(ZeroLowering, Stage2ModelStatesAreTwoPsiPlusFourteenPsiOverN) {
  const Plan plan = ToyPlan(Strategy::kZero2);
  const Schedule schedule = MustLower(plan);
  const int64_t psi = Psi(plan);
  const int64_t partition = FlatNumel(plan) / kWorld;
  // Sums: the replicated bf16 parameters, the bf16 gradient partition (grads_in_partition,
  // one per backward: one micro-step here) and the fp32 master partition with its two
  // moments. The full gradients are transient (copied into the IPG buffer as they become
  // ready). grads_in_partition holds straddling parameters whole, so it exceeds Ψ/N by at
  // most the two parameters that straddle the partition's ends (previously encoded as
  // exactly Ψ/N, which DeepSpeed does not allocate).
  const int64_t grads = GradsInPartitionNumel(plan);
  int64_t largest = 0;
  for (const ParamTensor& p : Params(plan)) largest = std::max(largest, p.numel);
  EXPECT_GE(grads, partition - 2 * kWorld);
  EXPECT_LE(grads, partition + 2 * largest);
  const int64_t total = Allocated(schedule, "unsharded.bit16_groups_flat").first +
                        Allocated(schedule, "grad_shard.grads_in_partition").first +
                        Allocated(schedule, "param_shard.fp32_partition").first +
                        Allocated(schedule, "exp_avg.").first + Allocated(schedule, "exp_avg_sq.").first;
  EXPECT_EQ(total, 2 * FlatNumel(plan) + 12 * partition + 2 * grads);
  EXPECT_NEAR(static_cast<double>(total), 2.0 * psi + 14.0 * psi / kWorld, 16.0 * 2 * kWorld + 4.0 * largest);
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

// The 2021 stage 2 average_tensor: each run of a bucket owned by one rank is reduced to that
// rank (dist.reduce), so one step moves Ψ in reduces — never the 2Ψ of an all-reduce — after a
// device synchronize per bucket.
TEST(ZeroLowering, Stage2LegacyReducesEachRanksSliceToIt) {
  Plan plan = ToyPlan(Strategy::kZero2);
  plan.zero.overlap_comm = true;
  plan.zero.legacy_reduce_per_rank = true;
  plan.zero.reduce_bucket_size = 100'000;  // several buckets
  const Schedule schedule = MustLower(plan);
  EXPECT_EQ(CollectiveBytes(schedule, "ZeRO::allreduce_bucket", CollectiveType::kAllReduce), 0);
  EXPECT_EQ(CollectiveBytes(schedule, "ZeRO::reduce", CollectiveType::kReduce), Psi(plan) * kBf16);
  const int64_t buckets = CountOps(schedule, "ZeRO::legacy.average_tensor.synchronize");
  EXPECT_GT(buckets, 1);
  // At least one reduce per bucket and at most one per rank and bucket.
  EXPECT_GE(CountOps(schedule, "ZeRO::reduce"), buckets);
  EXPECT_LE(CountOps(schedule, "ZeRO::reduce"), buckets * kWorld);
  // Every root is a rank of the group.
  const traces::Program& program = schedule.ProgramOf(0);
  for (const traces::Op& op : program.ops) {
    const auto* c = std::get_if<CollectiveOp>(&op.payload);
    if (c != nullptr && c->type == CollectiveType::kReduce) {
      EXPECT_GE(c->peer, 0);
      EXPECT_LT(c->peer, kWorld);
    }
  }
  MustSimulate(schedule);
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
// ceil(numel / N) of every parameter); only parameters above `threshold` (not persistent:
// ds_numel <= threshold persists) when given.
int64_t PaddedNumel(const Plan& plan, int64_t threshold = -1) {
  int64_t total = 0;
  for (const ParamTensor& p : Params(plan)) {
    if (p.numel > threshold) total += (p.numel + kWorld - 1) / kWorld * kWorld;
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

// ---- Allocation lifetimes and op order against DeepSpeed's sources -------------------------

// Index of every op of rank 0's program, with helpers to find allocations and frees.
struct OpIndex {
  explicit OpIndex(const Schedule& schedule) : program(schedule.ProgramOf(0)) {}
  std::string_view Name(const traces::Op& op) const { return program.NameOf(op.name); }
  std::string_view Module(const traces::Op& op) const { return program.NameOf(op.tags.module); }
  const std::string* Tensor(const traces::Op& op) const {
    if (const auto* a = std::get_if<traces::AllocateOp>(&op.payload)) return &program.tensors[static_cast<size_t>(a->tensor)];
    if (const auto* f = std::get_if<traces::FreeOp>(&op.payload)) return &program.tensors[static_cast<size_t>(f->tensor)];
    return nullptr;
  }
  const traces::Program& program;
};

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

// stage_1_and_2.py: copy_grads_in_partition allocates grads_in_partition lazily in every
// backward, _release_ipg_buffers drops it at the end of every epilogue; the first
// micro-step's storage lives on (all_grad_tensors, then averaged_gradients) until the step.
TEST(ZeroLowering, Stage2GradsInPartitionIsReallocatedEveryBackward) {
  constexpr int32_t kAccum = 3;
  const Plan plan = ToyPlan(Strategy::kZero2, kAccum);
  const Schedule schedule = MustLower(plan);
  EXPECT_EQ(Allocated(schedule, "grad_shard.grads_in_partition"),
            (std::pair<int64_t, int64_t>{kAccum * GradsInPartitionNumel(plan) * kBf16, kAccum}));
  const OpIndex index(schedule);
  std::map<std::string, traces::OpTags> allocated, freed;
  for (const traces::Op& op : index.program.ops) {
    const std::string* tensor = index.Tensor(op);
    if (tensor == nullptr || tensor->rfind("grad_shard.grads_in_partition", 0) != 0) continue;
    (std::holds_alternative<traces::AllocateOp>(op.payload) ? allocated : freed)[*tensor] = op.tags;
  }
  ASSERT_EQ(freed.size(), static_cast<size_t>(kAccum));
  for (const auto& [tensor, tags] : allocated) {
    EXPECT_EQ(tags.phase, traces::Phase::kBackward) << tensor;
    if (tags.micro_batch == 0) {
      EXPECT_EQ(freed.at(tensor).phase, traces::Phase::kOptimizer) << tensor;
    } else {
      EXPECT_EQ(freed.at(tensor).phase, traces::Phase::kBackward) << tensor;
      EXPECT_EQ(freed.at(tensor).micro_batch, tags.micro_batch) << tensor;
    }
  }
  // Later micro-steps add their gradients into the first one's (all_grad_tensors add_).
  EXPECT_EQ(CountOps(schedule, "ZeRO::accumulate_all_grad_tensors"), kAccum - 1);
  MustSimulate(schedule);
}

// create_gradient_handling_hooks / register_grad_hook: one hook per parameter, run as soon as
// its gradient is ready — interleaved with the module's backward kernels, so reductions
// start before the block's backward ends and gradients are allocated per leaf module.
TEST(ZeroLowering, Stage2HooksInterleaveWithTheBackwardKernels) {
  Plan plan = ToyPlan(Strategy::kZero2);
  plan.zero.reduce_bucket_size = 200'000;
  const Schedule schedule = MustLower(plan);
  const OpIndex index(schedule);
  size_t first_reduce = 0, last_kernel = 0;
  for (size_t i = 0; i < index.program.ops.size(); ++i) {
    const traces::Op& op = index.program.ops[i];
    if (op.tags.phase != traces::Phase::kBackward || index.Module(op) != "layers.1") continue;
    if (index.Name(op) == "ZeRO::allreduce_bucket" && first_reduce == 0) first_reduce = i;
    const auto* kernel = std::get_if<traces::KernelOp>(&op.payload);
    if (kernel != nullptr && std::holds_alternative<traces::GemmDesc>(kernel->compute)) last_kernel = i;
  }
  EXPECT_GT(first_reduce, 0u);
  EXPECT_LT(first_reduce, last_kernel);
  // The gradient of feed_forward.w2 (hidden 256 x ffn 688) is its own allocation.
  EXPECT_EQ(Allocated(schedule, "grad.layers.1.feed_forward.w2"), (std::pair<int64_t, int64_t>{176'128 * kBf16, 1}));
  EXPECT_EQ(Allocated(schedule, "grad.layers.1.").first, (4 * 65'536 + 3 * 176'128 + 2 * 256) * kBf16);
  MustSimulate(schedule);
}

// process_gradients reduces only if partition_gradients or overlap_comm: ZeRO-1 with
// overlap_comm false (the default) reduces nothing in backward; at the boundary
// reduce_gradients walks the parameters in forward order after backward, then the epilogue.
TEST(ZeroLowering, Stage1WithoutOverlapReducesAfterBackwardInForwardOrder) {
  Plan plan = ToyPlan(Strategy::kZero1);
  plan.zero.reduce_bucket_size = 200'000;
  ASSERT_FALSE(plan.zero.overlap_comm);
  const Schedule schedule = MustLower(plan);
  const OpIndex index(schedule);
  std::vector<int64_t> bucket_bytes;
  for (const traces::Op& op : index.program.ops) {
    const auto* c = std::get_if<CollectiveOp>(&op.payload);
    if (c == nullptr || index.Name(op) != "ZeRO::allreduce_bucket") continue;
    EXPECT_EQ(index.Module(op), "") << "reduced inside a module's backward";
    bucket_bytes.push_back(c->bytes);
  }
  // Forward order, 200,000-element buckets: the embedding (256,000: larger than a bucket,
  // reduced alone), then layers.0's attention_norm + wq + wk + wv (256 + 3 x 65,536 =
  // 196,864; wo would overflow the bucket), ... In reverse order the first buckets would be
  // the output projection (256,000) and then the final norm with feed_forward.w2.
  ASSERT_GE(bucket_bytes.size(), 2u);
  EXPECT_EQ(bucket_bytes[0], 256'000 * kBf16);
  EXPECT_EQ(bucket_bytes[1], (256 + 3 * 65'536) * kBf16);
  MustSimulate(schedule);
  // With overlap_comm the hooks reduce during the backward.
  plan.zero.overlap_comm = true;
  const Schedule overlapped = MustLower(plan);
  const OpIndex overlapped_index(overlapped);
  int64_t in_modules = 0;
  for (const traces::Op& op : overlapped_index.program.ops) {
    in_modules += overlapped_index.Name(op) == "ZeRO::allreduce_bucket" && overlapped_index.Module(op) != "" ? 1 : 0;
  }
  EXPECT_GT(in_modules, 0);
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
  plan.zero.legacy_prefetch_off_by_one = true;
  plan.zero.legacy_stream_sync_in_fetch_release = true;
  plan.zero.legacy_debug_norm_sync = true;
  const double legacy = tflops_per_gpu(plan);
  std::printf("ZeRO-3 2B on 8 V100: %.1f TFLOP/s per GPU fixed, %.1f with the 2021 behaviours\n", fixed, legacy);
  EXPECT_LT(legacy, 0.95 * fixed);
}

}  // namespace
}  // namespace shardscope::sim

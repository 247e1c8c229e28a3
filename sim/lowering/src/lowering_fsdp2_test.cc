// FSDP2 lowering: every fsdp2 knob checked against closed forms computed here from the
// model's parameter tensors (bytes per collective type and group per step, model-state
// bytes), op order for explicit prefetch, memory under gradient accumulation, and an end to
// end simulation of each knob.
#include <gtest/gtest.h>

#include <optional>

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "lowering_test_support.h"
#include "shardscope/sim/lowering/lowering.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/sim/report/report.h"

namespace shardscope::sim {
namespace {

using traces::CollectiveType;
using traces::DType;
using traces::Schedule;

// A 2-block toy model on one node of `gpus` GPUs.
Plan TinyPlan(int32_t gpus, int32_t grad_accum_steps = 1, const std::string& model_extra = "") {
  const std::string yaml = fmt::format(
      "model: {{layers: 2, hidden: 256, heads: 4, kv_heads: 4, ffn: 688, vocab: 1000{}}}\n"
      "cluster: {{preset: dgx-a100, nodes: 1, gpus_per_node: {}}}\n"
      "strategy: fsdp2\n"
      "training: {{seq_len: 128, micro_batch_size: 1, grad_accum_steps: {}}}\n",
      model_extra, gpus, grad_accum_steps);
  StatusOr<Plan> plan = ParsePlan(yaml, "<test>");
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return *plan;
}

using test_support::MustLower;

std::vector<ModuleKernels> Modules(const Plan& plan) {
  return DecomposeModel(plan.model, WorkloadOf(plan));
}

// Elements of the modules `keep` selects, each tensor padded to a multiple of `group` (FSDP2
// shards dim 0 of every parameter with padding); `param_filter` selects tensors.
int64_t Padded(const Plan& plan, int32_t group, const std::function<bool(const std::string&)>& keep,
               const std::function<bool(const ParamTensor&)>& param_filter = nullptr, int32_t divide = 1) {
  int64_t total = 0;
  for (const ModuleKernels& m : Modules(plan)) {
    if (!keep(m.name)) continue;
    for (const ParamTensor& p : m.params) {
      if (param_filter && !param_filter(p)) continue;
      const int64_t numel = p.numel / divide;
      total += (numel + group - 1) / group * group;
    }
  }
  return total;
}
bool Any(const std::string&) { return true; }
bool IsHead(const std::string& name) { return name == "head"; }

struct CollectiveTally {
  int64_t bytes = 0;
  int64_t count = 0;
};
// Rank 0's collectives by (type, communicator slot name).
std::map<std::pair<CollectiveType, std::string>, CollectiveTally> Collectives(const Schedule& schedule) {
  std::map<std::pair<CollectiveType, std::string>, CollectiveTally> out;
  const traces::Program& program = schedule.ProgramOf(0);
  for (const traces::Op& op : program.ops) {
    if (const auto* c = std::get_if<traces::CollectiveOp>(&op.payload)) {
      CollectiveTally& t = out[{c->type, program.comm_slots[static_cast<size_t>(c->comm)]}];
      t.bytes += c->bytes;
      ++t.count;
    }
  }
  return out;
}
CollectiveTally Tally(const Schedule& schedule, CollectiveType type, const std::string& comm) {
  const auto all = Collectives(schedule);
  const auto it = all.find({type, comm});
  return it == all.end() ? CollectiveTally{} : it->second;
}

int64_t CountKernels(const Schedule& schedule, std::string_view name) {
  const traces::Program& program = schedule.ProgramOf(0);
  int64_t count = 0;
  for (const traces::Op& op : program.ops) {
    if (std::holds_alternative<traces::KernelOp>(op.payload) && program.NameOf(op.name) == name) ++count;
  }
  return count;
}

// Bytes of every allocation of tensors whose name starts with `prefix`.
int64_t AllocatedBytes(const Schedule& schedule, const std::string& prefix) {
  const traces::Program& program = schedule.ProgramOf(0);
  int64_t bytes = 0;
  for (const traces::Op& op : program.ops) {
    if (const auto* a = std::get_if<traces::AllocateOp>(&op.payload)) {
      if (program.tensors[static_cast<size_t>(a->tensor)].rfind(prefix, 0) == 0) bytes += a->bytes;
    }
  }
  return bytes;
}

struct Simulated {
  bool completed = false;
  int64_t peak_allocated = 0;
};
Simulated MustSimulate(const Schedule& schedule) {
  Simulated out;
  const std::optional<SimulationResult> result = test_support::RunSimulation(schedule);
  if (!result) return out;
  out.completed = !result->hung;
  for (const RankStats& r : result->ranks) {
    out.completed = out.completed && r.finished;
    out.peak_allocated = std::max(out.peak_allocated, r.memory.stats.allocated_bytes_peak);
  }
  return out;
}

// ---- Communication volume (ZeRO paper: full sharding moves 3Ψ per step) -----------------

TEST(Fsdp2Lowering, DefaultAllGathersTwiceAndReduceScattersOnce) {
  const Plan plan = TinyPlan(4);
  const Schedule schedule = MustLower(plan);
  // Forward all-gather of every unit and backward all-gather of all but [norm, output]
  // (torchtitan keeps it after forward), bf16 params; one fp32 reduce-scatter of all.
  const int64_t psi = Padded(plan, 4, Any), head = Padded(plan, 4, IsHead);
  EXPECT_EQ(Tally(schedule, CollectiveType::kAllGather, "dp_shard").bytes, 2 * (psi + psi - head));
  EXPECT_EQ(Tally(schedule, CollectiveType::kReduceScatter, "dp_shard").bytes, 4 * psi);
  EXPECT_EQ(Tally(schedule, CollectiveType::kReduceScatter, "dp_shard").count, 4);  // embed, 2 blocks, head
  // clip_grad_norm_: one fp32 scalar all-reduced over the shard group, nothing else.
  const CollectiveTally clip = Tally(schedule, CollectiveType::kAllReduce, "dp_shard");
  EXPECT_EQ(clip.bytes, 4);
  EXPECT_EQ(clip.count, 1);
  EXPECT_EQ(Collectives(schedule).size(), 3u);
}

TEST(Fsdp2Lowering, ModelStatesAreSixteenPsiOverN) {
  // fp32 parameter shard + exp_avg + exp_avg_sq + fp32 sharded gradient: 16Ψ/N.
  for (const int32_t gpus : {2, 4, 8}) {
    const Plan plan = TinyPlan(gpus);
    const Schedule schedule = MustLower(plan);
    const int64_t psi = Padded(plan, gpus, Any);
    int64_t states = 0;
    for (const char* prefix : {"param_shard.", "exp_avg.", "exp_avg_sq.", "grad_shard."}) {
      states += AllocatedBytes(schedule, prefix);
    }
    EXPECT_EQ(states, 16 * psi / gpus) << gpus << " GPUs";
  }
}

TEST(Fsdp2Lowering, NoReshardAfterForwardSkipsBackwardAllGather) {
  Plan plan = TinyPlan(4);
  plan.fsdp2.reshard_after_forward = ReshardAfterForward::kFalse;
  const Schedule schedule = MustLower(plan);
  const int64_t psi = Padded(plan, 4, Any);
  EXPECT_EQ(Tally(schedule, CollectiveType::kAllGather, "dp_shard").bytes, 2 * psi);
  EXPECT_EQ(Tally(schedule, CollectiveType::kAllGather, "dp_shard").count, 4);
  EXPECT_EQ(Tally(schedule, CollectiveType::kReduceScatter, "dp_shard").bytes, 4 * psi);
}

TEST(Fsdp2Lowering, NoneIsTrueUnderTorchtitansParameterlessRoot) {
  // The root fully_shard(model) holds no parameters: None means True for every unit.
  Plan with_none = TinyPlan(4);
  with_none.fsdp2.reshard_after_forward = ReshardAfterForward::kNone;
  EXPECT_EQ(MustLower(with_none).programs, MustLower(TinyPlan(4)).programs);
}

TEST(Fsdp2Lowering, IntReshardsToThePostForwardGroup) {
  Plan plan = TinyPlan(8);
  plan.fsdp2.reshard_after_forward = ReshardAfterForward::kInt;
  plan.fsdp2.reshard_after_forward_size = 2;
  const Schedule schedule = MustLower(plan);
  const int64_t psi = Padded(plan, 8, Any), head = Padded(plan, 8, IsHead);
  // Forward: every unit gathered from its 8-rank shard group. Backward: the unsharded bf16
  // parameters of embed and the blocks gathered again, from the 2 ranks holding the
  // post-forward slices.
  EXPECT_EQ(Tally(schedule, CollectiveType::kAllGather, "dp_shard").bytes, 2 * psi);
  EXPECT_EQ(Tally(schedule, CollectiveType::kAllGather, "dp_post_forward").bytes, 2 * (psi - head));
  EXPECT_EQ(Tally(schedule, CollectiveType::kAllGather, "dp_post_forward").count, 3);
  // The post-forward slice is 1/k of the unsharded bf16 parameters.
  EXPECT_EQ(AllocatedBytes(schedule, "unsharded.post_forward."), 2 * (psi - head) / 2);
  // The post-forward groups are consecutive pairs of ranks.
  const auto& comms = schedule.communicators;
  const auto pair = std::find_if(comms.begin(), comms.end(),
                                 [](const traces::Communicator& c) { return c.name == "dp_post_forward.1"; });
  ASSERT_NE(pair, comms.end());
  EXPECT_EQ(pair->ranks, (std::vector<int32_t>{2, 3}));
  EXPECT_TRUE(MustSimulate(schedule).completed);
}

TEST(Fsdp2Lowering, IntReshardIsCheckedAgainstTheShardGroup) {
  Plan plan = TinyPlan(8);
  plan.fsdp2.reshard_after_forward = ReshardAfterForward::kInt;
  plan.fsdp2.reshard_after_forward_size = 3;  // not a factor of 8: fully_shard raises
  const StatusOr<Schedule> bad = LowerPlan(plan);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidInput);
  // 1 means False and the group size means True (_get_post_forward_mesh_info).
  plan.fsdp2.reshard_after_forward_size = 1;
  Plan keep = TinyPlan(8);
  keep.fsdp2.reshard_after_forward = ReshardAfterForward::kFalse;
  EXPECT_EQ(MustLower(plan).programs, MustLower(keep).programs);
  plan.fsdp2.reshard_after_forward_size = 8;
  EXPECT_EQ(MustLower(plan).programs, MustLower(TinyPlan(8)).programs);
}

TEST(Fsdp2Lowering, RootOnlyKeepsParametersOnlyWhenLeftNone) {
  Plan plan = TinyPlan(4);
  plan.fsdp2.root_only = true;
  const int64_t psi = Padded(plan, 4, Any);
  // None: the root keeps its parameters after forward — one all-gather of everything.
  plan.fsdp2.reshard_after_forward = ReshardAfterForward::kNone;
  Schedule schedule = MustLower(plan);
  EXPECT_EQ(Tally(schedule, CollectiveType::kAllGather, "dp_shard").bytes, 2 * psi);
  EXPECT_EQ(Tally(schedule, CollectiveType::kAllGather, "dp_shard").count, 1);
  EXPECT_EQ(Tally(schedule, CollectiveType::kReduceScatter, "dp_shard").count, 1);
  EXPECT_TRUE(MustSimulate(schedule).completed);
  // An explicit True is honoured even for the root: gathered again in backward.
  plan.fsdp2.reshard_after_forward = ReshardAfterForward::kTrue;
  schedule = MustLower(plan);
  EXPECT_EQ(Tally(schedule, CollectiveType::kAllGather, "dp_shard").bytes, 4 * psi);
  EXPECT_EQ(Tally(schedule, CollectiveType::kAllGather, "dp_shard").count, 2);
}

TEST(Fsdp2Lowering, BlocksPerUnitGroupsConsecutiveBlocks) {
  Plan plan = TinyPlan(4);
  plan.fsdp2.blocks_per_unit = 2;
  const Schedule schedule = MustLower(plan);
  // Units: embed, layers.0 (both blocks), head.
  EXPECT_EQ(Tally(schedule, CollectiveType::kReduceScatter, "dp_shard").count, 3);
  EXPECT_EQ(Tally(schedule, CollectiveType::kAllGather, "dp_shard").count, 3 + 2);
  const int64_t blocks = Padded(plan, 4, [](const std::string& n) { return n.rfind("layers.", 0) == 0; });
  EXPECT_EQ(AllocatedBytes(schedule, "param_shard.layers.0"), 4 * blocks / 4);
  EXPECT_EQ(AllocatedBytes(schedule, "param_shard.layers.1"), 0);
}

// ---- HSDP ---------------------------------------------------------------------------------

TEST(Fsdp2Lowering, HsdpReduceScattersOverShardAndAllReducesShards) {
  Plan plan = TinyPlan(8);
  plan.fsdp2.mesh = {2, 4};  // 2 replicas of 4-way shard groups
  const Schedule schedule = MustLower(plan);
  const int64_t psi = Padded(plan, 4, Any), head = Padded(plan, 4, IsHead);
  EXPECT_EQ(Tally(schedule, CollectiveType::kAllGather, "dp_shard").bytes, 2 * (psi + psi - head));
  EXPECT_EQ(Tally(schedule, CollectiveType::kReduceScatter, "dp_shard").bytes, 4 * psi);
  // The all-reduce moves each rank's fp32 shard (Ψ/4 elements) over the replicate group.
  const CollectiveTally all_reduce = Tally(schedule, CollectiveType::kAllReduce, "dp_replicate");
  EXPECT_EQ(all_reduce.bytes, 4 * psi / 4);
  EXPECT_EQ(all_reduce.count, 4);
  // The norm of the clip is partial over the shard dimension only.
  EXPECT_EQ(Tally(schedule, CollectiveType::kAllReduce, "dp_shard").bytes, 4);
  // Each all-reduce runs on the all-reduce stream after it waited for the reduce-scatter
  // stream's event.
  const traces::Program& program = schedule.ProgramOf(0);
  for (size_t i = 0; i < program.ops.size(); ++i) {
    const auto* c = std::get_if<traces::CollectiveOp>(&program.ops[i].payload);
    if (c == nullptr || program.comm_slots[static_cast<size_t>(c->comm)] != "dp_replicate") continue;
    EXPECT_EQ(program.streams[static_cast<size_t>(c->stream)].name, "all_reduce");
    const auto* wait = std::get_if<traces::StreamWaitEventOp>(&program.ops[i - 1].payload);
    ASSERT_NE(wait, nullptr);
    EXPECT_EQ(wait->stream, c->stream);
    EXPECT_EQ(program.events[static_cast<size_t>(wait->event)].rfind("reduce_scatter_done.", 0), 0u);
  }
  EXPECT_TRUE(MustSimulate(schedule).completed);
}

TEST(Fsdp2Lowering, HsdpWithoutAllReduceDefersItToTheLastMicroBatch) {
  Plan plan = TinyPlan(8, /*grad_accum_steps=*/3);
  plan.fsdp2.mesh = {2, 4};
  plan.fsdp2.requires_all_reduce = false;
  const Schedule schedule = MustLower(plan);
  const int64_t psi = Padded(plan, 4, Any);
  EXPECT_EQ(Tally(schedule, CollectiveType::kReduceScatter, "dp_shard").count, 3 * 4);
  EXPECT_EQ(Tally(schedule, CollectiveType::kAllReduce, "dp_replicate").count, 4);
  EXPECT_EQ(Tally(schedule, CollectiveType::kAllReduce, "dp_replicate").bytes, 4 * psi / 4);
  EXPECT_TRUE(MustSimulate(schedule).completed);
}

// ---- Gradient accumulation ---------------------------------------------------------------

TEST(Fsdp2Lowering, GradientSyncEveryVersusLastMicroBatch) {
  Plan every = TinyPlan(4, /*grad_accum_steps=*/3);
  Plan last = every;
  last.fsdp2.requires_gradient_sync = GradientSync::kLastMicroBatch;
  const int64_t psi = Padded(every, 4, Any), head = Padded(every, 4, IsHead);
  const Schedule a = MustLower(every), b = MustLower(last);
  EXPECT_EQ(Tally(a, CollectiveType::kReduceScatter, "dp_shard").count, 3 * 4);
  EXPECT_EQ(Tally(a, CollectiveType::kReduceScatter, "dp_shard").bytes, 3 * 4 * psi);
  EXPECT_EQ(Tally(b, CollectiveType::kReduceScatter, "dp_shard").count, 4);
  EXPECT_EQ(Tally(b, CollectiveType::kReduceScatter, "dp_shard").bytes, 4 * psi);
  // All-gathers are unchanged: every micro-batch gathers in forward and backward.
  for (const Schedule* s : {&a, &b}) {
    EXPECT_EQ(Tally(*s, CollectiveType::kAllGather, "dp_shard").bytes, 3 * 2 * (2 * psi - head));
  }
  // The unsharded gradients are cast once into fp32 accumulators (reduce_dtype), one per unit.
  int64_t unsharded = 0;
  for (const ModuleKernels& m : Modules(every)) unsharded += m.param_numel();
  EXPECT_EQ(AllocatedBytes(b, "grad.accumulated."), 4 * unsharded);
  EXPECT_EQ(CountKernels(b, "FSDP::to_accumulated_grad"), 4);
  EXPECT_EQ(CountKernels(b, "FSDP::accumulate_unsharded_grad"), 2 * 4);

  // Memory: keeping fp32 unsharded gradients across micro-batches instead of fp32 shards.
  const Simulated run_every = MustSimulate(a), run_last = MustSimulate(b);
  ASSERT_TRUE(run_every.completed);
  ASSERT_TRUE(run_last.completed);
  const int64_t expected = 4 * unsharded - 4 * psi / 4;  // fp32 accumulators minus fp32 shards
  const int64_t grew = run_last.peak_allocated - run_every.peak_allocated;
  RecordProperty("peak_allocated_every", std::to_string(run_every.peak_allocated));
  RecordProperty("peak_allocated_last", std::to_string(run_last.peak_allocated));
  RecordProperty("expected_growth", std::to_string(expected));
  EXPECT_GT(grew, expected * 3 / 4) << "peak every " << run_every.peak_allocated << " last " << run_last.peak_allocated;
  EXPECT_LT(grew, expected * 5 / 4) << "peak every " << run_every.peak_allocated << " last " << run_last.peak_allocated;
}

TEST(Fsdp2Lowering, PerBlockGradientSyncKeepsEveryKthBlockReducing) {
  Plan plan = TinyPlan(4, /*grad_accum_steps=*/2);
  plan.fsdp2.requires_gradient_sync = GradientSync::kLastMicroBatch;
  plan.fsdp2.gradient_sync_every_k_blocks = 2;
  const Schedule schedule = MustLower(plan);
  // layers.0 (0 % 2 == 0) reduces in both micro-batches, the other 3 units only in the last.
  const int64_t psi = Padded(plan, 4, Any);
  const int64_t block0 = Padded(plan, 4, [](const std::string& n) { return n == "layers.0"; });
  EXPECT_EQ(Tally(schedule, CollectiveType::kReduceScatter, "dp_shard").count, 4 + 1);
  EXPECT_EQ(Tally(schedule, CollectiveType::kReduceScatter, "dp_shard").bytes, 4 * (psi + block0));
  EXPECT_TRUE(MustSimulate(schedule).completed);
}

TEST(Fsdp2Lowering, NoReshardAfterBackwardSkipsTheNextForwardAllGather) {
  Plan plan = TinyPlan(4, /*grad_accum_steps=*/2);
  plan.fsdp2.reshard_after_backward = false;
  const Schedule schedule = MustLower(plan);
  const int64_t psi = Padded(plan, 4, Any), head = Padded(plan, 4, IsHead);
  // Micro-batch 0 gathers in forward and backward; micro-batch 1's forward finds every unit
  // unsharded and only its backward gathers again (after the post-forward reshard).
  EXPECT_EQ(Tally(schedule, CollectiveType::kAllGather, "dp_shard").bytes, 2 * (psi + 2 * (psi - head)));
  EXPECT_TRUE(MustSimulate(schedule).completed);
}

// ---- Mixed precision ----------------------------------------------------------------------

// torchtune's default (training.precision pure_bf16): bf16 parameters, gradients and AdamW
// moments, no fp32 master and no MixedPrecisionPolicy — 8Ψ/N of model states, nothing cast.
TEST(Fsdp2Lowering, PureBf16KeepsEveryStateInBf16) {
  for (const int32_t gpus : {2, 4}) {
    const std::string yaml = fmt::format(
        "model: {{layers: 2, hidden: 256, heads: 4, kv_heads: 4, ffn: 688, vocab: 1000}}\n"
        "cluster: {{preset: dgx-a100, nodes: 1, gpus_per_node: {}}}\n"
        "strategy: fsdp2\n"
        "training: {{seq_len: 128, micro_batch_size: 1, precision: pure_bf16}}\n",
        gpus);
    StatusOr<Plan> plan = ParsePlan(yaml, "<test>");
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    EXPECT_EQ(plan->fsdp2.param_dtype, DType::kBFloat16);
    EXPECT_EQ(plan->fsdp2.reduce_dtype, DType::kBFloat16);
    const Schedule schedule = MustLower(*plan);
    const int64_t psi = Padded(*plan, gpus, Any), head = Padded(*plan, gpus, IsHead);
    int64_t states = 0;
    for (const char* prefix : {"param_shard.", "exp_avg.", "exp_avg_sq.", "grad_shard."}) {
      states += AllocatedBytes(schedule, prefix);
    }
    EXPECT_EQ(states, 8 * psi / gpus) << gpus << " GPUs";
    EXPECT_EQ(CountKernels(schedule, "FSDP::cast_to_param_dtype"), 0);
    EXPECT_EQ(CountKernels(schedule, "FSDP::cast_to_orig_dtype"), 0);
    EXPECT_EQ(Tally(schedule, CollectiveType::kAllGather, "dp_shard").bytes, 2 * (2 * psi - head));
    EXPECT_EQ(Tally(schedule, CollectiveType::kReduceScatter, "dp_shard").bytes, 2 * psi);
    EXPECT_TRUE(MustSimulate(schedule).completed);
  }
}

TEST(Fsdp2Lowering, MixedPrecisionDtypes) {
  const Plan base = TinyPlan(4);
  const int64_t psi = Padded(base, 4, Any), head = Padded(base, 4, IsHead);
  {  // param_dtype fp32: no cast on copy-in, 4-byte all-gathers.
    Plan plan = base;
    plan.fsdp2.param_dtype = DType::kFloat32;
    const Schedule schedule = MustLower(plan);
    EXPECT_EQ(CountKernels(schedule, "FSDP::cast_to_param_dtype"), 0);
    EXPECT_EQ(Tally(schedule, CollectiveType::kAllGather, "dp_shard").bytes, 4 * (2 * psi - head));
    EXPECT_TRUE(MustSimulate(schedule).completed);
  }
  {  // reduce_dtype bf16: 2-byte reduce-scatters, the output cast to the fp32 .grad.
    Plan plan = base;
    plan.fsdp2.reduce_dtype = DType::kBFloat16;
    const Schedule schedule = MustLower(plan);
    EXPECT_EQ(Tally(schedule, CollectiveType::kReduceScatter, "dp_shard").bytes, 2 * psi);
    EXPECT_EQ(CountKernels(schedule, "FSDP::cast_to_orig_dtype"), 4);
    EXPECT_EQ(CountKernels(schedule, "FSDP::predivide"), 0);
    EXPECT_EQ(AllocatedBytes(schedule, "grad_shard."), 4 * psi / 4);
    EXPECT_TRUE(MustSimulate(schedule).completed);
  }
  {  // reduce_dtype fp16: SUM with divide kernels before and after.
    Plan plan = base;
    plan.fsdp2.reduce_dtype = DType::kFloat16;
    const Schedule schedule = MustLower(plan);
    EXPECT_EQ(CountKernels(schedule, "FSDP::predivide"), 4);
    EXPECT_EQ(CountKernels(schedule, "FSDP::postdivide"), 4);
    EXPECT_TRUE(MustSimulate(schedule).completed);
  }
  {  // fp32 params reduced in bf16: a narrowing copy through a gradient-dtype buffer.
    Plan plan = base;
    plan.fsdp2.param_dtype = DType::kFloat32;
    plan.fsdp2.reduce_dtype = DType::kBFloat16;
    const Schedule schedule = MustLower(plan);
    EXPECT_EQ(CountKernels(schedule, "FSDP::copy_to_reduce_dtype"), 4);
    EXPECT_TRUE(MustSimulate(schedule).completed);
  }
}

// ---- Prefetch order -----------------------------------------------------------------------

// Index in rank 0's program of the first op satisfying `pred`.
size_t FirstOp(const traces::Program& program, const std::function<bool(const traces::Op&)>& pred) {
  for (size_t i = 0; i < program.ops.size(); ++i) {
    if (pred(program.ops[i])) return i;
  }
  return program.ops.size();
}
std::function<bool(const traces::Op&)> AllGatherDoneOf(const traces::Program& program, const std::string& unit,
                                                       int occurrence = 0) {
  auto seen = std::make_shared<int>(0);
  return [&program, unit, occurrence, seen](const traces::Op& op) {
    const auto* r = std::get_if<traces::EventRecordOp>(&op.payload);
    if (r == nullptr || program.events[static_cast<size_t>(r->event)] != "all_gather." + unit) return false;
    return (*seen)++ == occurrence;
  };
}
std::function<bool(const traces::Op&)> FirstKernelOf(const traces::Program& program, const std::string& module,
                                                     traces::Phase phase) {
  return [&program, module, phase](const traces::Op& op) {
    // The module's own kernels: not FSDP's copies, not the loss (computed outside the model,
    // before the pre-backward hooks fire).
    return std::holds_alternative<traces::KernelOp>(op.payload) && op.tags.phase == phase &&
           program.NameOf(op.tags.module) == module && program.NameOf(op.name).rfind("FSDP::", 0) != 0 &&
           program.NameOf(op.name).rfind("loss.", 0) != 0;
  };
}

TEST(Fsdp2Lowering, ExplicitForwardPrefetchIssuesTheNextAllGatherBeforeTheKernels) {
  Plan plan = TinyPlan(4);
  {  // Implicit: layers.1's all-gather is issued at its own pre-forward, after layers.0's kernels.
    const Schedule schedule = MustLower(plan);
    const traces::Program& p = schedule.ProgramOf(0);
    EXPECT_GT(FirstOp(p, AllGatherDoneOf(p, "layers.1")), FirstOp(p, FirstKernelOf(p, "layers.0", traces::Phase::kForward)));
  }
  for (const bool by_name : {false, true}) {
    Plan explicit_plan = plan;
    if (by_name) {
      explicit_plan.fsdp2.forward_prefetch_units["layers.0"] = {"layers.1"};
    } else {
      explicit_plan.fsdp2.forward_prefetch = 1;
    }
    const Schedule schedule = MustLower(explicit_plan);
    const traces::Program& p = schedule.ProgramOf(0);
    EXPECT_LT(FirstOp(p, AllGatherDoneOf(p, "layers.1")), FirstOp(p, FirstKernelOf(p, "layers.0", traces::Phase::kForward)))
        << (by_name ? "by name" : "by count");
    EXPECT_TRUE(MustSimulate(schedule).completed);
  }
}

TEST(Fsdp2Lowering, BackwardPrefetchCountAndList) {
  Plan plan = TinyPlan(4);
  // Backward all-gathers are the second record of each unit's all_gather event.
  {  // Default: one unit ahead — layers.0 is gathered before layers.1's backward kernels.
    const Schedule schedule = MustLower(plan);
    const traces::Program& p = schedule.ProgramOf(0);
    EXPECT_LT(FirstOp(p, AllGatherDoneOf(p, "layers.0", 1)), FirstOp(p, FirstKernelOf(p, "layers.1", traces::Phase::kBackward)));
  }
  {  // 0: none — gathered at its own pre-backward, after layers.1's kernels.
    plan.fsdp2.backward_prefetch = 0;
    const Schedule schedule = MustLower(plan);
    const traces::Program& p = schedule.ProgramOf(0);
    EXPECT_GT(FirstOp(p, AllGatherDoneOf(p, "layers.0", 1)), FirstOp(p, FirstKernelOf(p, "layers.1", traces::Phase::kBackward)));
    EXPECT_TRUE(MustSimulate(schedule).completed);
  }
  {  // A list: the head prefetches both blocks before its own backward kernels.
    plan.fsdp2.backward_prefetch_units["head"] = {"layers.1", "layers.0"};
    const Schedule schedule = MustLower(plan);
    const traces::Program& p = schedule.ProgramOf(0);
    const size_t head_kernels = FirstOp(p, FirstKernelOf(p, "head", traces::Phase::kBackward));
    EXPECT_LT(FirstOp(p, AllGatherDoneOf(p, "layers.1", 1)), head_kernels);
    EXPECT_LT(FirstOp(p, AllGatherDoneOf(p, "layers.0", 1)), head_kernels);
    EXPECT_TRUE(MustSimulate(schedule).completed);
  }
  {  // Unknown names are errors.
    plan.fsdp2.backward_prefetch_units["head"] = {"layers.7"};
    const StatusOr<Schedule> bad = LowerPlan(plan);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("layers.7"), std::string::npos);
  }
}

// ---- Activation checkpointing and MoE ------------------------------------------------------

TEST(Fsdp2Lowering, CheckpointedRecomputeNeedsNoExtraAllGather) {
  Plan plan = TinyPlan(4);
  const int64_t plain = Tally(MustLower(plan), CollectiveType::kAllGather, "dp_shard").bytes;
  for (const ActivationCheckpointing ac : {ActivationCheckpointing::kFull, ActivationCheckpointing::kSelective}) {
    plan.training.activation_checkpointing = ac;
    const Schedule schedule = MustLower(plan);
    EXPECT_EQ(Tally(schedule, CollectiveType::kAllGather, "dp_shard").bytes, plain);
    // The recompute runs the checkpointed blocks' forward kernels again inside backward.
    int64_t recomputed = 0;
    const traces::Program& p = schedule.ProgramOf(0);
    for (const traces::Op& op : p.ops) {
      recomputed += op.tags.phase == traces::Phase::kBackward && p.NameOf(op.name) == "attn.wq" ? 1 : 0;
    }
    EXPECT_GT(recomputed, 0);
    EXPECT_TRUE(MustSimulate(schedule).completed);
  }
}

TEST(Fsdp2Lowering, ExpertsAreANestedUnitOverTheExpertDataGroup) {
  Plan plan = TinyPlan(4, 1, ", experts: 4, experts_per_token: 2");
  plan.moe.expert_parallel = 2;
  const Schedule schedule = MustLower(plan);
  const auto is_expert = [](const ParamTensor& p) { return p.name.rfind("feed_forward.experts.", 0) == 0; };
  const auto dense = [&](const ParamTensor& p) { return !is_expert(p); };
  // Dense parameters over the 4-rank shard group, as before.
  const int64_t psi_dense = Padded(plan, 4, Any, dense), head = Padded(plan, 4, IsHead, dense);
  EXPECT_EQ(Tally(schedule, CollectiveType::kAllGather, "dp_shard").bytes, 2 * (2 * psi_dense - head));
  EXPECT_EQ(Tally(schedule, CollectiveType::kReduceScatter, "dp_shard").bytes, 4 * psi_dense);
  // Each rank's half of the experts (ep = 2), sharded over the 2 ranks holding the same experts.
  const int64_t experts = Padded(plan, 2, Any, is_expert, /*divide=*/2);
  ASSERT_GT(experts, 0);
  EXPECT_EQ(Tally(schedule, CollectiveType::kAllGather, "ep_dp").bytes, 2 * 2 * experts);
  EXPECT_EQ(Tally(schedule, CollectiveType::kAllGather, "ep_dp").count, 2 * 2);
  EXPECT_EQ(Tally(schedule, CollectiveType::kReduceScatter, "ep_dp").bytes, 4 * experts);
  // Token all-to-alls come from the shared emitters; the clip norm spans every rank.
  EXPECT_GT(Tally(schedule, CollectiveType::kAllToAll, "ep").count, 0);
  EXPECT_EQ(Tally(schedule, CollectiveType::kAllReduce, "dp").bytes, 4);
  EXPECT_EQ(AllocatedBytes(schedule, "param_shard.layers.0.moe.experts"), 4 * experts / 2 / 2);
  EXPECT_TRUE(MustSimulate(schedule).completed);
}

// ---- Every knob simulates; nothing leaks ----------------------------------------------------

struct Knob {
  std::string name;
  std::function<void(Plan&)> apply;
};

class Fsdp2Knobs : public ::testing::TestWithParam<Knob> {};

TEST_P(Fsdp2Knobs, ValidatesSimulatesAndFreesEverythingButModelStates) {
  Plan plan = TinyPlan(8, /*grad_accum_steps=*/2, ", experts: 1");
  GetParam().apply(plan);
  const Schedule schedule = MustLower(plan);
  ASSERT_FALSE(schedule.programs.empty());
  // Every tensor still live at the end is a model state of some unit.
  const traces::Program& program = schedule.ProgramOf(0);
  std::set<std::string> live;
  for (const traces::Op& op : program.ops) {
    if (const auto* a = std::get_if<traces::AllocateOp>(&op.payload)) live.insert(program.tensors[static_cast<size_t>(a->tensor)]);
    if (const auto* f = std::get_if<traces::FreeOp>(&op.payload)) live.erase(program.tensors[static_cast<size_t>(f->tensor)]);
  }
  for (const std::string& tensor : live) {
    EXPECT_TRUE(tensor.rfind("param_shard.", 0) == 0 || tensor.rfind("exp_avg.", 0) == 0 ||
                tensor.rfind("exp_avg_sq.", 0) == 0)
        << tensor << " leaks";
  }
  EXPECT_TRUE(MustSimulate(schedule).completed);
}

INSTANTIATE_TEST_SUITE_P(
    All, Fsdp2Knobs,
    ::testing::Values(
        Knob{"default", [](Plan&) {}},
        Knob{"no_reshard", [](Plan& p) { p.fsdp2.reshard_after_forward = ReshardAfterForward::kFalse; }},
        Knob{"none", [](Plan& p) { p.fsdp2.reshard_after_forward = ReshardAfterForward::kNone; }},
        Knob{"int4", [](Plan& p) {
               p.fsdp2.reshard_after_forward = ReshardAfterForward::kInt;
               p.fsdp2.reshard_after_forward_size = 4;
             }},
        Knob{"forward_prefetch2", [](Plan& p) { p.fsdp2.forward_prefetch = 2; }},
        Knob{"backward_prefetch0", [](Plan& p) { p.fsdp2.backward_prefetch = 0; }},
        Knob{"backward_prefetch2", [](Plan& p) { p.fsdp2.backward_prefetch = 2; }},
        Knob{"bf16_reduce", [](Plan& p) { p.fsdp2.reduce_dtype = DType::kBFloat16; }},
        Knob{"fp32_params", [](Plan& p) { p.fsdp2.param_dtype = DType::kFloat32; }},
        Knob{"hsdp", [](Plan& p) { p.fsdp2.mesh = {2, 4}; }},
        Knob{"hsdp_bf16_no_all_reduce", [](Plan& p) {
               p.fsdp2.mesh = {2, 4};
               p.fsdp2.reduce_dtype = DType::kBFloat16;
               p.fsdp2.requires_all_reduce = false;
             }},
        Knob{"hsdp_int2", [](Plan& p) {
               p.fsdp2.mesh = {2, 4};
               p.fsdp2.reshard_after_forward = ReshardAfterForward::kInt;
               p.fsdp2.reshard_after_forward_size = 2;
             }},
        Knob{"last_micro_batch", [](Plan& p) { p.fsdp2.requires_gradient_sync = GradientSync::kLastMicroBatch; }},
        Knob{"last_micro_batch_bf16_reduce", [](Plan& p) {
               p.fsdp2.requires_gradient_sync = GradientSync::kLastMicroBatch;
               p.fsdp2.reduce_dtype = DType::kBFloat16;
             }},
        Knob{"no_reshard_after_backward", [](Plan& p) { p.fsdp2.reshard_after_backward = false; }},
        Knob{"blocks_per_unit2", [](Plan& p) { p.fsdp2.blocks_per_unit = 2; }},
        Knob{"root_only", [](Plan& p) { p.fsdp2.root_only = true; }},
        Knob{"full_ac", [](Plan& p) { p.training.activation_checkpointing = ActivationCheckpointing::kFull; }},
        Knob{"moe_ep2", [](Plan& p) {
               p.model.experts = 4;
               p.model.experts_per_token = 2;
               p.moe.expert_parallel = 2;
             }},
        Knob{"moe_ep2_last_micro_batch_blocks2", [](Plan& p) {
               p.model.experts = 4;
               p.model.experts_per_token = 2;
               p.moe.expert_parallel = 2;
               p.fsdp2.requires_gradient_sync = GradientSync::kLastMicroBatch;
               p.fsdp2.blocks_per_unit = 2;
             }}),
    [](const ::testing::TestParamInfo<Knob>& knob) { return knob.param.name; });

}  // namespace
}  // namespace shardscope::sim

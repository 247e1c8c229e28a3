// DDP lowering: no_sync under gradient accumulation (one all-reduce pass per step instead of
// one per micro-batch) and gradient clipping without a collective (replicated gradients).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <vector>

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

constexpr int32_t kAccum = 4;

Plan DdpPlan(bool no_sync) {
  Plan out = test_support::MustParsePlan(test_support::ToyDdpYaml(kAccum));
  out.ddp.no_sync = no_sync;
  return out;
}

int64_t Psi(const Plan& plan) {
  int64_t total = 0;
  for (const ModuleKernels& m :
       DecomposeModel(plan.model, WorkloadOf(plan))) {
    total += m.param_numel();
  }
  return total;
}

using test_support::MustLower;

void MustSimulate(const Schedule& schedule) {
  const std::optional<SimulationResult> result = test_support::RunSimulation(schedule);
  ASSERT_TRUE(result.has_value());
  EXPECT_TRUE(test_support::Completed(*result));
}

// (bytes, count) of rank 0's collectives named `name`, per micro-batch tag when given.
std::pair<int64_t, int64_t> Collectives(const Schedule& schedule, const std::string& name, int32_t micro_batch = -2) {
  const traces::Program& program = schedule.ProgramOf(0);
  int64_t bytes = 0, count = 0;
  for (const traces::Op& op : program.ops) {
    const auto* c = std::get_if<CollectiveOp>(&op.payload);
    if (c == nullptr || program.NameOf(op.name) != name) continue;
    if (micro_batch != -2 && op.tags.micro_batch != micro_batch) continue;
    bytes += c->bytes;
    ++count;
  }
  return {bytes, count};
}

int64_t CountOps(const Schedule& schedule, const std::string& name) {
  const traces::Program& program = schedule.ProgramOf(0);
  int64_t n = 0;
  for (const traces::Op& op : program.ops) n += program.NameOf(op.name) == name ? 1 : 0;
  return n;
}

TEST(DdpLowering, NoSyncAllReducesOncePerStep) {
  const Plan plan = DdpPlan(/*no_sync=*/true);
  const Schedule schedule = MustLower(plan);
  // fp32 gradients (autocast keeps fp32 parameters): Ψ x 4 bytes, all in the last micro-batch.
  EXPECT_EQ(Collectives(schedule, "DDP::all_reduce").first, Psi(plan) * 4);
  EXPECT_EQ(Collectives(schedule, "DDP::all_reduce", kAccum - 1).first, Psi(plan) * 4);
  for (int32_t mb = 0; mb + 1 < kAccum; ++mb) {
    EXPECT_EQ(Collectives(schedule, "DDP::all_reduce", mb).second, 0) << mb;
  }
  // Nothing copied into or out of buckets while gradients only accumulate.
  const Schedule synced = MustLower(DdpPlan(false));
  EXPECT_EQ(CountOps(schedule, "DDP::copy_grad_to_bucket") * kAccum, CountOps(synced, "DDP::copy_grad_to_bucket"));
  MustSimulate(schedule);
}

TEST(DdpLowering, WithoutNoSyncEveryMicroBatchAllReduces) {
  const Plan plan = DdpPlan(/*no_sync=*/false);
  const Schedule schedule = MustLower(plan);
  EXPECT_EQ(Collectives(schedule, "DDP::all_reduce").first, kAccum * Psi(plan) * 4);
  for (int32_t mb = 0; mb < kAccum; ++mb) {
    EXPECT_EQ(Collectives(schedule, "DDP::all_reduce", mb).first, Psi(plan) * 4) << mb;
  }
  MustSimulate(schedule);
}

// training.precision pure_bf16: the model itself is bf16, so autocast casts nothing and the
// gradients all-reduced are bf16 (2 bytes per parameter).
TEST(DdpLowering, PureBf16AllReducesBf16GradientsAndCastsNothing) {
  Plan plan = DdpPlan(/*no_sync=*/false);
  plan.training.precision = Precision::kPureBf16;
  const Schedule schedule = MustLower(plan);
  EXPECT_EQ(Collectives(schedule, "DDP::all_reduce").first, kAccum * Psi(plan) * 2);
  EXPECT_EQ(CountOps(schedule, "autocast::to_copy"), 0);
  EXPECT_EQ(CountOps(schedule, "autocast::to_copy_backward"), 0);
  const traces::Program& program = schedule.ProgramOf(0);
  for (const traces::Op& op : program.ops) {
    const auto* a = std::get_if<traces::AllocateOp>(&op.payload);
    if (a == nullptr) continue;
    const std::string& tensor = program.tensors[static_cast<size_t>(a->tensor)];
    if (tensor == "params" || tensor == "exp_avg" || tensor == "exp_avg_sq") {
      EXPECT_EQ(a->bytes, Psi(plan) * 2) << tensor;
    }
  }
  MustSimulate(schedule);
}

TEST(DdpLowering, ClipsReplicatedGradientsWithoutACollective) {
  const Schedule schedule = MustLower(DdpPlan(false));
  EXPECT_EQ(CountOps(schedule, "clip_grad_norm.foreach_norm"), 1);
  EXPECT_EQ(CountOps(schedule, "clip_grad_norm.foreach_mul"), 1);
  EXPECT_EQ(CountOps(schedule, "clip_grad_norm.all_reduce"), 0);
  // The clip comes before the optimizer.
  const traces::Program& program = schedule.ProgramOf(0);
  int64_t clip = -1, adam = -1;
  for (const traces::Op& op : program.ops) {
    if (clip < 0 && program.NameOf(op.name) == "clip_grad_norm.foreach_mul") clip = op.id;
    if (adam < 0 && program.NameOf(op.name) == "optimizer.adamw") adam = op.id;
  }
  EXPECT_GE(clip, 0);
  EXPECT_LT(clip, adam);
}

// PyTorch makes one tensor per parameter for the parameter itself, each AdamW moment
// (zeros_like(p)), autocast's bf16 weight copy, the bf16 weight gradient and the fp32 .grad:
// the allocator sees one block each. Toy (hidden 256, ffn 688, vocab 1000, 2 blocks): per
// block two norms of 256, wq/wk/wv/wo of 65,536, w1/w2/w3 of 176,128; the embedding, the
// final norm and the output 256,000 / 256 / 256,000.
TEST(DdpLowering, ParameterTensorsAreOneBlockEach) {
  const Plan plan = DdpPlan(/*no_sync=*/true);
  const Schedule schedule = MustLower(plan);
  const traces::Program& program = schedule.ProgramOf(0);
  std::map<std::string, std::vector<int64_t>> by_prefix;
  for (const traces::Op& op : program.ops) {
    const auto* a = std::get_if<traces::AllocateOp>(&op.payload);
    if (a == nullptr || op.tags.micro_batch > 0) continue;  // model states and micro-batch 0
    const std::string& name = program.tensors[static_cast<size_t>(a->tensor)];
    by_prefix[name.substr(0, name.find('.'))].push_back(a->bytes);
  }
  std::vector<int64_t> fp32, bf16_matmul;
  for (const ModuleKernels& m : DecomposeModel(plan.model, WorkloadOf(plan))) {
    for (const ParamTensor& p : m.params) {
      fp32.push_back(4 * p.numel);
      if (p.matmul) bf16_matmul.push_back(2 * p.numel);
    }
  }
  std::sort(fp32.begin(), fp32.end());
  std::sort(bf16_matmul.begin(), bf16_matmul.end());
  for (const char* prefix : {"params", "exp_avg", "exp_avg_sq", "grad"}) {
    std::vector<int64_t> got = by_prefix[prefix];
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, fp32) << prefix;
  }
  // Micro-batch 0's bf16 weight gradients and weight casts: the GEMMs' weights only.
  for (const char* prefix : {"grad_lowp", "weight_cast"}) {
    std::vector<int64_t> got = by_prefix[prefix];
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, bf16_matmul) << prefix;
  }
  MustSimulate(schedule);
}

}  // namespace
}  // namespace shardscope::sim

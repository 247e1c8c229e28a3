// Strategy-independent checks of LowerPlan: FLOPs with and without recompute in closed form,
// communicator groups of the mesh and expert parallelism, per-step collective bytes.
#include "shardscope/sim/lowering/lowering.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "lowering_internal.h"
#include "shardscope/sim/models/compute_model.h"
#include "shardscope/sim/memory/memory_report.h"
#include "shardscope/sim/report/report.h"

namespace shardscope::sim {
namespace {

using traces::CollectiveType;

// A Llama-style 2-block toy on 2 GPUs.
Plan ToyPlan(const std::string& strategy) {
  const std::string yaml =
      "model: {preset: llama3-8b, layers: 2, hidden: 256, heads: 4, kv_heads: 2, ffn: 512, vocab: 1000}\n"
      "cluster: {preset: dgx-a100, nodes: 1, gpus_per_node: 2}\n"
      "strategy: " + strategy + "\n"
      "training: {seq_len: 128, micro_batch_size: 2}\n";
  StatusOr<Plan> plan = ParsePlan(yaml, "<test>");
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return *plan;
}

double GemmFlops(const traces::Schedule& schedule) {
  double flops = 0;
  for (const traces::Op& op : schedule.ProgramOf(0).ops) {
    if (const auto* kernel = std::get_if<traces::KernelOp>(&op.payload)) {
      if (std::holds_alternative<traces::GemmDesc>(kernel->compute)) flops += KernelFlops(kernel->compute);
    }
  }
  return flops;
}

// GEMM FLOPs of one step = 6 x (parameters in matrix products) x tokens (2 forward, 4
// backward); recompute adds one more forward (2 x block matmul parameters x tokens) for
// every checkpointed block. The toy has no biases, so every matmul parameter is a weight.
TEST(LoweringFlops, SixNPlusOneForwardPerRecomputedBlock) {
  for (const char* strategy : {"ddp", "fsdp2"}) {
    Plan plan = ToyPlan(strategy);
    const double tokens = 2.0 * 128;
    const double matmul = static_cast<double>(ActiveMatmulParameterCount(plan.model));
    const double head = 256.0 * 1000;  // the output projection, hidden x vocab
    const double per_block = (matmul - head) / 2;
    struct Case {
      ActivationCheckpointing ac;
      int32_t every;
      double recomputed_blocks;
    };
    for (const Case& c : {Case{ActivationCheckpointing::kNone, 2, 0}, Case{ActivationCheckpointing::kFull, 2, 2},
                          Case{ActivationCheckpointing::kSelective, 2, 1},
                          Case{ActivationCheckpointing::kSelective, 1, 2},
                          Case{ActivationCheckpointing::kSelective, 3, 0}}) {
      plan.training.activation_checkpointing = c.ac;
      plan.training.selective_ac_every = c.every;
      StatusOr<traces::Schedule> schedule = LowerPlan(plan);
      ASSERT_TRUE(schedule.ok()) << schedule.status().message();
      const double expected = 6 * matmul * tokens + 2 * per_block * tokens * c.recomputed_blocks;
      EXPECT_DOUBLE_EQ(GemmFlops(*schedule), expected) << strategy << " every " << c.every;
    }
  }
}

// DDP all-reduces every fp32 gradient once per step: 4 bytes x parameters (the ZeRO
// paper's 2Ψ communication is this buffer's ring all-reduce, 2(N-1)/N x its size on the
// wire, which nccl_model.cc accounts for).
TEST(LoweringBytes, DdpAllReducesEveryGradientOnce) {
  Plan plan = ToyPlan("ddp");
  StatusOr<traces::Schedule> schedule = LowerPlan(plan);
  ASSERT_TRUE(schedule.ok());
  const auto bytes = CollectiveBytesPerStep(*schedule, 1);
  EXPECT_EQ(bytes[static_cast<size_t>(CollectiveType::kAllReduce)], 4 * ParameterCount(plan.model));
  EXPECT_EQ(bytes[static_cast<size_t>(CollectiveType::kAllGather)], 0);
}

// Expert parallelism: per MoE block, forward dispatch + combine, the token-count exchange,
// and their two backward all-to-alls; each moves this rank's routed tokens
// (tokens x top_k rows of hidden, bf16). Without expert parallelism there are none.
TEST(LoweringBytes, ExpertParallelAllToAlls) {
  Plan plan = ToyPlan("fsdp2");
  plan.model.experts = 4;
  plan.model.experts_per_token = 2;
  for (int32_t ep : {1, 2}) {
    plan.moe.expert_parallel = ep;
    StatusOr<traces::Schedule> schedule = LowerPlan(plan);
    ASSERT_TRUE(schedule.ok()) << schedule.status().message();
    const int64_t routed = int64_t{2} * 128 * 2 * 256 * 2;
    const int64_t splits = 4 * 8;
    const auto bytes = CollectiveBytesPerStep(*schedule, 0);
    EXPECT_EQ(bytes[static_cast<size_t>(CollectiveType::kAllToAll)], ep == 1 ? 0 : 2 * (4 * routed + splits));
    int host_syncs = 0;
    for (const traces::Op& op : schedule->ProgramOf(0).ops) {
      host_syncs += std::holds_alternative<traces::StreamSynchronizeOp>(op.payload) ? 1 : 0;
    }
    EXPECT_EQ(host_syncs, ep == 1 ? 0 : 2) << "the splits' .tolist() per MoE block";
  }
}

// Per-parameter gradient readiness from the kernel shapes: each wgrad GEMM completes exactly
// the linear weights it computes, each norm's backward the norm's weight, in backward order.
TEST(GradReadyAfter, MatchesEveryLlamaBlockParameterToItsKernel) {
  const Plan plan = ToyPlan("ddp");
  const std::vector<ModuleKernels> modules =
      DecomposeModel(plan.model, WorkloadOf(plan));
  const ModuleKernels& block = modules[1];
  ASSERT_EQ(block.name, "layers.0");
  const auto ready = GradReadyAfter(block);
  std::map<std::string, std::vector<std::string>> by_kernel;
  size_t matched = 0;
  for (size_t k = 0; k < ready.size(); ++k) {
    for (size_t p : ready[k]) {
      by_kernel[block.backward[k].name].push_back(block.params[p].name);
      ++matched;
    }
  }
  EXPECT_EQ(matched, block.params.size());
  using V = std::vector<std::string>;
  EXPECT_EQ(by_kernel["mlp.w2.wgrad"], (V{"feed_forward.w2.weight"}));
  EXPECT_EQ(by_kernel["mlp.w3.wgrad"], (V{"feed_forward.w3.weight"}));
  EXPECT_EQ(by_kernel["mlp.w1.wgrad"], (V{"feed_forward.w1.weight"}));
  // transformers' LlamaRMSNorm (DDP's default model code): the weight's gradient is the sum
  // over tokens after the multiply's backward.
  EXPECT_EQ(by_kernel["mlp.norm.mul_weight.bwd"], (V{"ffn_norm.weight"}));
  EXPECT_EQ(by_kernel["attn.wo.wgrad"], (V{"attention.wo.weight"}));
  EXPECT_EQ(by_kernel["attn.wv.wgrad"], (V{"attention.wv.weight"}));
  EXPECT_EQ(by_kernel["attn.wk.wgrad"], (V{"attention.wk.weight"}));
  EXPECT_EQ(by_kernel["attn.wq.wgrad"], (V{"attention.wq.weight"}));
  EXPECT_EQ(by_kernel["attn.norm.mul_weight.bwd"], (V{"attention_norm.weight"}));
}

// DDP launches a bucket as soon as its last parameter's gradient is complete: with 0.5 MiB
// buckets, the first all-reduce of a block is issued before that block's last backward
// kernel, not after the whole block.
TEST(LoweringDdp, BucketsLaunchFromPerParameterHooks) {
  Plan plan = ToyPlan("ddp");
  plan.ddp.bucket_cap_mb = 0.5;
  plan.ddp.first_bucket_mb = 0.5;
  StatusOr<traces::Schedule> schedule = LowerPlan(plan);
  ASSERT_TRUE(schedule.ok());
  const traces::Program& p = schedule->ProgramOf(0);
  int64_t first_all_reduce = -1, last_block_kernel = -1;
  for (const traces::Op& op : p.ops) {
    if (op.tags.phase != traces::Phase::kBackward || p.NameOf(op.tags.module) != "layers.1") continue;
    if (first_all_reduce < 0 && std::holds_alternative<traces::CollectiveOp>(op.payload)) first_all_reduce = op.id;
    if (std::holds_alternative<traces::KernelOp>(op.payload)) last_block_kernel = op.id;
  }
  ASSERT_GE(first_all_reduce, 0);
  EXPECT_LT(first_all_reduce, last_block_kernel);
}

// `shardscope memory` attributes every tensor by name: no strategy's lowering may produce a
// tensor that falls into "other".
TEST(LoweringTensors, EveryStrategysTensorsHaveAMemoryCategory) {
  for (const char* strategy : {"fsdp2", "fsdp1", "zero1", "zero2", "zero3", "ddp"}) {
    for (const bool variant : {false, true}) {
      Plan plan = ToyPlan(strategy);
      plan.training.grad_accum_steps = 2;
      plan.training.activation_checkpointing = ActivationCheckpointing::kFull;
      if (variant) {  // the knobs that bring their own buffers
        plan.fsdp1.implementation = Fsdp1Implementation::kFairscale;
        plan.fsdp1.optimize_backward_concat = true;
        plan.fsdp2.requires_gradient_sync = GradientSync::kLastMicroBatch;
        plan.checkpoint.consolidate_optimizer_state = plan.strategy == Strategy::kFsdp1;
        plan.zero.overlap_comm = true;
      }
      StatusOr<traces::Schedule> schedule = LowerPlan(plan);
      ASSERT_TRUE(schedule.ok()) << strategy << ": " << schedule.status().message();
      for (const traces::Program& program : schedule->programs) {
        for (const std::string& tensor : program.tensors) {
          EXPECT_NE(CategoryOfTensor(tensor), MemoryCategory::kOther) << strategy << ": " << tensor;
        }
      }
    }
  }
}

}  // namespace
}  // namespace shardscope::sim

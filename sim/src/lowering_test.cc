// Strategy-independent checks of LowerPlan: FLOPs with and without recompute in closed form,
// communicator groups of the mesh and expert parallelism, per-step collective bytes.
#include "shardscope/sim/lowering.h"

#include <gtest/gtest.h>

#include <string>

#include "shardscope/sim/compute_model.h"
#include "shardscope/sim/simulation.h"

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

}  // namespace
}  // namespace shardscope::sim

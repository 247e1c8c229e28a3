// The closed-form lower bounds of tune_bounds.h.
#include "tune_bounds.h"

#include <algorithm>
#include <cmath>

#include "shardscope/sim/presets/hardware.h"
#include "shardscope/sim/presets/model.h"

namespace shardscope::sim::tune_internal {
namespace {

// Bytes per parameter of the model states (mixed precision: fp32 parameter, gradient and
// AdamW's exp_avg and exp_avg_sq; pure bf16: the same four in bf16).
constexpr int64_t kMixedStateBytes = 16;
constexpr int64_t kPureBf16StateBytes = 8;
// DeepSpeed ZeRO-1/2 (stage_1_and_2.py): 16-bit parameters and gradients replicated, the fp32
// master copy and both moments (4 + 4 + 4) partitioned.
constexpr int64_t kZero16BitBytes = 2;
constexpr int64_t kZeroFp32OptimizerBytes = 12;

int64_t CeilDiv(int64_t a, int64_t b) { return b > 0 ? (a + b - 1) / b : a; }

int64_t StatesBytes(const Plan& plan) {
  const ModelSpec& model = plan.model;
  if (model.experts > 1) return 0;  // see the header
  const int64_t params = ParameterCount(model);
  const int64_t world = plan.cluster.world_size();
  const int64_t per_param = plan.training.precision == Precision::kPureBf16 ? kPureBf16StateBytes : kMixedStateBytes;
  switch (plan.strategy) {
    case Strategy::kDdp:
      return params * per_param;
    case Strategy::kZero1:
      return params * 2 * kZero16BitBytes + CeilDiv(params * kZeroFp32OptimizerBytes, world);
    case Strategy::kZero2:
      return params * kZero16BitBytes + CeilDiv(params * (kZero16BitBytes + kZeroFp32OptimizerBytes), world);
    case Strategy::kZero3:
      return CeilDiv(params * kMixedStateBytes, world);
    case Strategy::kFsdp1: {
      const Fsdp1Config& f = plan.fsdp1;
      if (f.sharding_strategy == Fsdp1ShardingStrategy::kNoShard) return params * per_param;
      const bool hybrid = f.sharding_strategy == Fsdp1ShardingStrategy::kHybridShard ||
                          f.sharding_strategy == Fsdp1ShardingStrategy::kHybridShardZero2;
      const int64_t shard = hybrid ? std::max<int32_t>(1, f.mesh.shard) : world;
      int64_t bytes = CeilDiv(params * per_param, shard);
      const bool kept_unsharded = f.sharding_strategy == Fsdp1ShardingStrategy::kShardGradOp ||
                                  f.sharding_strategy == Fsdp1ShardingStrategy::kHybridShardZero2;
      if (kept_unsharded) bytes += params * traces::DTypeSize(f.param_dtype);
      return bytes;
    }
    case Strategy::kFsdp2: {
      const Fsdp2Config& f = plan.fsdp2;
      const int64_t shard = std::max<int32_t>(1, f.mesh.shard);
      int64_t bytes = CeilDiv(params * per_param, shard);
      if (f.reshard_after_forward == ReshardAfterForward::kFalse) bytes += params * traces::DTypeSize(f.param_dtype);
      return bytes;
    }
  }
  return 0;
}

// How many of the model's blocks are checkpointed (recomputed in backward).
int64_t CheckpointedBlocks(const TrainingConfig& t, int64_t layers) {
  switch (t.activation_checkpointing) {
    case ActivationCheckpointing::kNone: return 0;
    case ActivationCheckpointing::kFull: return layers;
    case ActivationCheckpointing::kSelectiveOp: return layers;  // bounded as full: it saves more
    case ActivationCheckpointing::kSelective: return t.selective_ac_every > 0 ? layers / t.selective_ac_every : 0;
  }
  return 0;
}

int64_t ActivationBytes(const Plan& plan) {
  const ModelSpec& model = plan.model;
  const TrainingConfig& t = plan.training;
  const int64_t tokens = t.seq_len * t.micro_batch_size;
  // fp8 training keeps its activations in bf16 between the casts of each GEMM.
  const int64_t bytes = t.dtype == traces::DType::kFloat32 ? 4 : 2;
  const int64_t layers = model.layers;
  const int64_t checkpointed = std::min(layers, CheckpointedBlocks(t, layers));
  const int64_t saved_per_full_block = (3 * model.hidden + model.ffn) * tokens * bytes;
  const int64_t saved_per_checkpointed_block = model.hidden * tokens * bytes;
  return (layers - checkpointed) * saved_per_full_block + checkpointed * saved_per_checkpointed_block;
}

int64_t TimeNs(const Plan& plan) {
  const TrainingConfig& t = plan.training;
  const double peak = PeakFlops(plan.cluster.gpu, t.dtype);
  if (!(peak > 0)) return 0;
  const double tokens = static_cast<double>(t.seq_len * t.micro_batch_size) * t.grad_accum_steps;
  double flops = TrainingFlopsPerToken(plan.model, t.seq_len) * tokens;
  // A recomputed block runs its forward again: a third of its training FLOPs.
  const int64_t layers = plan.model.layers;
  const int64_t checkpointed = t.activation_checkpointing == ActivationCheckpointing::kSelectiveOp
                                   ? 0  // recomputes only some ops: no lower bound beyond none
                                   : std::min(layers, CheckpointedBlocks(t, layers));
  if (layers > 0) flops *= 1.0 + static_cast<double>(checkpointed) / static_cast<double>(layers) / 3.0;
  return static_cast<int64_t>(std::floor(flops / peak * 1e9));
}

}  // namespace

CandidateBounds BoundsOf(const Plan& plan) {
  CandidateBounds b;
  b.states_bytes = StatesBytes(plan);
  b.activations_bytes = ActivationBytes(plan);
  b.time_ns = TimeNs(plan);
  return b;
}

}  // namespace shardscope::sim::tune_internal

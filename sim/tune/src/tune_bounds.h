// Closed-form lower bounds of a candidate plan, computed from the plan alone (no lowering):
// what `tune` rules candidates out with before simulating them.
//
// Memory: at the end of the forward pass of one micro-batch every rank holds
//  - its share of the model states (mixed precision: fp32 parameters, gradients and AdamW's
//    two moments, 16 bytes per parameter; pure bf16: 8), partitioned as the strategy does:
//    DDP and FSDP1 NO_SHARD replicate all of it; ZeRO-1 replicates 16-bit parameters and
//    gradients (2 + 2 bytes) and shards the fp32 master and moments (12 bytes) over the world
//    (DeepSpeed's stage 1/2 optimizer); ZeRO-2 also shards the gradients; ZeRO-3, FSDP1 and
//    FSDP2 shard everything over the shard group (HSDP: the group, not the world);
//  - with FSDP2 `reshard_after_forward: false` or FSDP1 SHARD_GRAD_OP, every unit's unsharded
//    parameters (param dtype), which stay gathered until their backward;
//  - the activations autograd saves, at the least: per transformer block not checkpointed, the
//    inputs of its matrix products (q/k/v's input, the attention output, the MLP's input, each
//    h elements per token, and the down projection's input, ffn per token; dtype bytes), and per
//    checkpointed block its input alone (h per token).
// Everything else a rank holds (the CUDA context, NCCL's buffers, the loss's logits, optimizer
// temporaries, fragmentation) only adds to it. MoE models get no states bound (0): which of
// their parameters expert parallelism partitions is the lowering's business.
//
// Time: the step's model FLOPs (TrainingFlopsPerToken, plus one forward per checkpointed block)
// at the GPU's datasheet peak for the training dtype, spread over every rank: no kernel model
// runs faster than the peak.
#ifndef SHARDSCOPE_SIM_TUNE_SRC_TUNE_BOUNDS_H_
#define SHARDSCOPE_SIM_TUNE_SRC_TUNE_BOUNDS_H_

#include <cstdint>

#include "shardscope/sim/plan/plan.h"

namespace shardscope::sim::tune_internal {

struct CandidateBounds {
  int64_t states_bytes = 0;       // model states (and unsharded parameters kept after forward)
  int64_t activations_bytes = 0;  // saved activations at the end of forward, at the least
  int64_t memory_bytes() const { return states_bytes + activations_bytes; }
  int64_t time_ns = 0;
};

CandidateBounds BoundsOf(const Plan& plan);

}  // namespace shardscope::sim::tune_internal

#endif  // SHARDSCOPE_SIM_TUNE_SRC_TUNE_BOUNDS_H_

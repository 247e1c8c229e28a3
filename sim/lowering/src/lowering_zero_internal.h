// What the ZeRO lowerings share (private to sim/lowering): the leaf modules that hold a
// module's parameters and their share of its backward kernels, the gradient norm and the fp32
// flattening of the gradient partition every stage's step runs, and the two stage lowerings
// LowerZero (lowering_zero.cc) dispatches to: ZeRO-1/2 in lowering_zero12.cc, ZeRO-3 in
// lowering_zero3*.cc.
#ifndef SHARDSCOPE_SIM_LOWERING_ZERO_INTERNAL_H_
#define SHARDSCOPE_SIM_LOWERING_ZERO_INTERNAL_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lowering_internal.h"

namespace shardscope::sim {

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

// The leaf modules that hold parameters: one per distinct parameter-name prefix
// (attention_norm, attention.wq, ..., feed_forward.w2), in the module's parameter order.
// A module's kernels are divided in order among them (estimate: the decomposition does not
// say which kernel belongs to which leaf).
struct LeafModule {
  std::string name;              // "layers.0.attention.wq"
  std::vector<size_t> params;    // indices into module.params
  int64_t numel = 0;
};
std::vector<LeafModule> LeafModulesOf(const ModuleKernels& module);

// The backward kernels [begin, end) of the leaf that is `first`-th of `count` in forward
// order: the backward runs in reverse, so the r-th leaf from the end takes the r-th share.
std::pair<size_t, size_t> BackwardShare(const ModuleKernels& module, size_t first, size_t count);

// get_grad_norm_direct over the rank's gradient tensors (stage3.py with an fp64 scalar,
// stage_1_and_2.py with an fp32 one; lowering_zero.cc has the details).
void EmitGradNormDirect(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex stream,
                        traces::CommSlot comm, const std::vector<int64_t>& tensor_numels, bool fp64_scalar);

// The fp32 gradient of the partition (flatten, cast) and unscale_and_clip_grads' mul_.
void EmitFlattenToFp32AndUnscale(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex stream,
                                 int64_t partition_numel);

// One program for every rank: stage_1_and_2.py DeepSpeedZeroOptimizer (lowering_zero12.cc)
// and stage3.py DeepSpeedZeroOptimizer_Stage3 (lowering_zero3.cc).
traces::Program LowerZero12(const LoweringContext& ctx);
traces::Program LowerZero3(const LoweringContext& ctx);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_LOWERING_ZERO_INTERNAL_H_

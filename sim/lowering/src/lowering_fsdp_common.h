// The backward pass FSDP1 (lowering_fsdp1*.cc) and FSDP2 (lowering_fsdp2*.cc) share
// (private to sim/lowering). Both frameworks run the same walk: autograd goes through the
// modules in reverse, each FSDP unit's pre-backward hook fires before its first module's
// backward (unshard, wait for the unshard, prefetch the next unit), its post-backward hook
// after its last (reshard, reduce the gradient), and a final callback queued by the root
// waits for the reductions at the end:
// - FSDP1: torch/distributed/fsdp/_runtime_utils.py _pre_backward_hook (registered on the
//   forward outputs by _register_pre_backward_hooks), _post_backward_hook (on the
//   FlatParameter's AccumulateGrad), _post_backward_final_callback; fairscale's
//   FullyShardedDataParallel._pre_backward_hook / _post_backward_hook /
//   _wait_for_post_backward likewise.
// - FSDP2: torch/distributed/fsdp/_fully_shard/_fsdp_state.py FSDPState._pre_backward ->
//   FSDPParamGroup.pre_backward, RegisterPostBackwardFunction -> FSDPParamGroup.post_backward
//   (foreach_reduce), FSDPState._root_post_backward_final_callback.
// What differs between them is what each step does to the unit (a FlatParameter or an
// FSDPParamGroup, their streams, their gradient accumulation): FsdpBackwardHooks.
#ifndef SHARDSCOPE_SIM_LOWERING_FSDP_COMMON_H_
#define SHARDSCOPE_SIM_LOWERING_FSDP_COMMON_H_

#include <cstddef>
#include <vector>

#include "lowering_internal.h"

namespace shardscope::sim {

// What one FSDP lowering does at each point of the backward walk. Units and modules are
// indices: units into the lowering's own list, modules into LoweringContext::modules.
class FsdpBackwardHooks {
 public:
  virtual ~FsdpBackwardHooks() = default;

  virtual size_t UnitCount() const = 0;
  // The unit whose hooks `module`'s backward fires.
  virtual size_t UnitOfModule(size_t module) const = 0;
  // Whether `module` is the unit's first module in forward order: its backward completes the
  // unit's gradients, so the unit's post-backward hook follows it.
  virtual bool CompletesUnit(size_t unit, size_t module) const = 0;
  // Units nested inside `module` with hooks of their own (FSDP2's fully_shard of a block's
  // experts): their pre-backward runs after the enclosing unit's, their post-backward before.
  virtual std::vector<size_t> NestedUnits(size_t /*module*/) const { return {}; }

  // The pre-backward hook, in order: what runs before FSDP's own hook (FSDP1: Composer's
  // prepended sync hook), the unit's unshard (a no-op when prefetched or kept since
  // forward), the current stream's wait for it, the unshards of the prefetch targets, then
  // what the lowering does once the hook has run (FSDP1: the flat gradient autograd will
  // produce).
  virtual void BeforePreBackward(size_t /*unit*/) {}
  virtual void UnshardUnit(size_t unit) = 0;
  virtual void WaitForBackwardUnshard(size_t unit) = 0;
  virtual std::vector<size_t> BackwardPrefetchTargets(size_t unit) const = 0;
  virtual void AfterPreBackward(size_t /*unit*/) {}

  // Around a module's backward kernels: the gradients autograd allocates for it (FSDP2's
  // per-module gradients), and what runs as they complete (fairscale's per-parameter fp32
  // accumulation hooks).
  virtual void AllocateGradients(size_t /*module*/) {}
  virtual void AfterModuleBackward(size_t /*module*/) {}

  // The post-backward hook of a unit whose gradients are complete, and the root's final
  // callback after the last one.
  virtual void PostBackward(size_t unit) = 0;
  virtual void FinalCallback() = 0;
};

// One backward pass on `compute`: the loss's backward first (the pre-backward hooks are
// registered on the model's output, KernelPart), then the modules from the head to the
// embedding with each unit's hooks around them, then the final callback.
void WalkFsdpBackward(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex compute,
                      FsdpBackwardHooks& hooks);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_LOWERING_FSDP_COMMON_H_

// The backward walk FSDP1 and FSDP2 share (lowering_fsdp_common.h).
#include "lowering_fsdp_common.h"

namespace shardscope::sim {

void WalkFsdpBackward(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex compute,
                      FsdpBackwardHooks& hooks) {
  const int64_t hook_ns = ctx.plan.host.hook_overhead_ns;
  b.SetPhase(Phase::kBackward);
  // A unit's pre-backward hook runs once per pass, at the first of its modules autograd
  // reaches (FSDP1 _pre_backward_hook returns once handle._ran_pre_backward_hook is set;
  // FSDP2 FSDPState._register_pre_backward_hook registers _pre_backward on the unit's forward
  // outputs with register_multi_grad_hook(mode="any"), which fires once).
  std::vector<bool> pre_backward_done(hooks.UnitCount(), false);
  const auto pre_backward = [&](size_t unit) {
    if (pre_backward_done[unit]) return;
    pre_backward_done[unit] = true;
    hooks.BeforePreBackward(unit);
    b.HostWork("FSDP::pre_backward", hook_ns);
    hooks.UnshardUnit(unit);
    hooks.WaitForBackwardUnshard(unit);
    // The prefetch is issued before this unit's gradients are computed (FSDP1 BACKWARD_PRE,
    // fairscale's rebuild of the previous instance, FSDP2 _backward_prefetch).
    for (size_t target : hooks.BackwardPrefetchTargets(unit)) hooks.UnshardUnit(target);
    hooks.AfterPreBackward(unit);
  };
  // The loss's backward first: the pre-backward hooks fire on the model output's gradient.
  EmitLossBackward(ctx, b, compute);
  // Module order in backward: head, layers.L-1 .. layers.0, embed. A unit holding several
  // modules (FSDP1's root: embedding and head; FSDP2's multi-block units) gets its
  // pre-backward at its last module in forward order and its post-backward after its first.
  for (size_t step = 0; step < ctx.modules.size(); ++step) {
    const size_t m = ctx.modules.size() - 1 - step;
    const ModuleKernels& module = ctx.modules[m];
    const size_t unit = hooks.UnitOfModule(m);
    const std::vector<size_t> nested = hooks.NestedUnits(m);
    b.SetModule(module.name);
    pre_backward(unit);
    for (size_t inner : nested) pre_backward(inner);
    hooks.AllocateGradients(m);
    EmitBackwardKernels(ctx, b, compute, module, KernelPart::kModel);
    hooks.AfterModuleBackward(m);
    for (size_t inner : nested) hooks.PostBackward(inner);
    if (hooks.CompletesUnit(unit, m)) hooks.PostBackward(unit);
  }
  hooks.FinalCallback();
}

}  // namespace shardscope::sim

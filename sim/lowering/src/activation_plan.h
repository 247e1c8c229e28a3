// Where the activations of one micro-batch live: for every module's forward, recompute and
// backward kernels, which tensors to allocate right before the launch and which to free right
// after it. Private to sim/ (the lowerings' emitters, lowering_common.cc).
//
// The plan is a liveness analysis over the step as every strategy issues it: the modules'
// forward kernels in order, then per module in reverse order its recompute (when checkpointed)
// and its backward kernels. A tensor is allocated when a kernel writes it and freed after the
// last kernel that reads it before it is written again (a checkpoint's recompute writes a
// module's tensors anew). Modules link through their input and output (and the gradients of
// those); views share their base tensor's storage.
//
// Checkpointing decides what the forward keeps:
// - none: the forward's tensors live until the backward's last read of them (what autograd
//   saves);
// - full (torch.utils.checkpoint): the forward runs without autograd, each tensor dies after
//   its last forward use; the backward first recomputes the whole forward;
// - op-level selective (torchtitan _apply_op_sac: its _save_list keeps the outputs of matmuls
//   (every other one: mm_count % 2 == 0 is recomputed, counting from 1 per block) and of fused
//   attention): the recompute skips those ops and reuses their kept outputs.
#ifndef SHARDSCOPE_SIM_ACTIVATION_PLAN_H_
#define SHARDSCOPE_SIM_ACTIVATION_PLAN_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "shardscope/sim/presets/model.h"

namespace shardscope::sim {

enum class ActivationMode : uint8_t { kKeep, kFullRecompute, kOpSelective };

struct PlannedKernel {
  int32_t index = 0;                                     // into ModuleKernels::forward / backward
  std::vector<std::pair<std::string, int64_t>> allocs;   // before the launch
  std::vector<std::string> frees;                        // after the launch
};

struct ModuleActivationPlan {
  ActivationMode mode = ActivationMode::kKeep;
  std::vector<PlannedKernel> forward;
  std::vector<PlannedKernel> recompute;  // forward kernels run again (index into forward)
  std::vector<PlannedKernel> backward;
};

class ActivationPlan {
 public:
  // `modes[m]` for modules[m]. Tensor names are "act.<module>.<tensor>".
  static ActivationPlan Build(const std::vector<ModuleKernels>& modules, const std::vector<ActivationMode>& modes);
  const ModuleActivationPlan& Of(size_t module) const { return modules_[module]; }

 private:
  std::vector<ModuleActivationPlan> modules_;
};

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_ACTIVATION_PLAN_H_

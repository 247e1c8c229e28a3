// The GPU compute-sharing model: how kernels running at once on one GPU share it. It runs
// kernels and copies (holds their completions); copies run on copy engines at full speed.
#ifndef SHARDSCOPE_SIM_MODELS_GPU_SHARING_MODEL_H_
#define SHARDSCOPE_SIM_MODELS_GPU_SHARING_MODEL_H_

#include <cstdint>

#include "shardscope/sim/models/resource_model.h"

namespace shardscope::sim {

enum class ComputeSharing : uint8_t {
  kFairShare,    // n concurrent compute kernels on a GPU each run at 1/n speed (default): a
                 // roofline-costed kernel is assumed to saturate the resource it is bound by
  kIndependent,  // concurrent compute kernels do not slow each other
};

class GpuSharingModel : public ResourceModel {
 public:
  explicit GpuSharingModel(ComputeSharing sharing) : sharing_(sharing) {}
  std::string_view name() const override { return "gpu_sharing"; }
  bool Runs(ActivityKind kind) const override { return kind != ActivityKind::kComm; }
  bool Concerns(ActivityKind kind) const override { return kind == ActivityKind::kCompute; }
  void OnStart(ActivityId id, const ActivitySet& set, std::vector<ActivityId>& changed) override;
  void OnEnd(ActivityId id, const ActivitySet& set, std::vector<ActivityId>& changed) override;
  double Share(ActivityId id, const ActivitySet& set, double rate) const override;

 private:
  ComputeSharing sharing_;
};

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_MODELS_GPU_SHARING_MODEL_H_

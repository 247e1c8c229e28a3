// The compute-communication contention model: while a collective runs on a GPU, kernels there
// run at 1/(1 + compute_slowdown); a collective runs at 1/(1 + comm_slowdown) while any of its
// member GPUs runs a kernel (SM and memory-bandwidth contention between NCCL's kernels and
// compute, fitted by calibration). Rates change mid-kernel; remaining work carries over. It
// runs nothing itself: it slows what the GPU-sharing and link models run.
#ifndef SHARDSCOPE_SIM_MODELS_CONTENTION_MODEL_H_
#define SHARDSCOPE_SIM_MODELS_CONTENTION_MODEL_H_

#include <cstdint>
#include <vector>

#include "shardscope/sim/models/cost_provider.h"
#include "shardscope/sim/models/resource_model.h"

namespace shardscope::sim {

class ContentionModel : public ResourceModel {
 public:
  explicit ContentionModel(const ContentionConfig& config) : config_(config) {}
  std::string_view name() const override { return "contention"; }
  bool Runs(ActivityKind) const override { return false; }
  bool Concerns(ActivityKind kind) const override { return kind != ActivityKind::kCopy; }
  void OnStart(ActivityId id, const ActivitySet& set, std::vector<ActivityId>& changed) override;
  void OnEnd(ActivityId id, const ActivitySet& set, std::vector<ActivityId>& changed) override;
  double Share(ActivityId id, const ActivitySet& set, double rate) const override;

 private:
  ContentionConfig config_;
  std::vector<int32_t> members_computing_;  // per collective: member GPUs running a kernel
};

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_MODELS_CONTENTION_MODEL_H_

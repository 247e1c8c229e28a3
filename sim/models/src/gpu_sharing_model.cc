// GPU compute sharing: under fair share every kernel of a GPU is re-rated when one starts or
// ends (each runs at 1/n); independent kernels never slow each other.
#include "shardscope/sim/models/gpu_sharing_model.h"

#include "shardscope/sim/models/activity_set.h"

namespace shardscope::sim {

void GpuSharingModel::OnStart(ActivityId id, const ActivitySet& set, std::vector<ActivityId>& changed) {
  if (sharing_ != ComputeSharing::kFairShare) return;
  // Every kernel of the GPU, the new one last (the order the engine always queued them in).
  const auto& running = set.RunningOn(set[id].gpu, ActivityKind::kCompute);
  changed.insert(changed.end(), running.begin(), running.end());
}

void GpuSharingModel::OnEnd(ActivityId id, const ActivitySet& set, std::vector<ActivityId>& changed) {
  if (sharing_ != ComputeSharing::kFairShare) return;
  const auto& running = set.RunningOn(set[id].gpu, ActivityKind::kCompute);
  changed.insert(changed.end(), running.begin(), running.end());
}

double GpuSharingModel::Share(ActivityId id, const ActivitySet& set, double rate) const {
  if (sharing_ != ComputeSharing::kFairShare) return rate;
  const size_t n = set.RunningOn(set[id].gpu, ActivityKind::kCompute).size();
  if (n > 1) rate /= static_cast<double>(n);
  return rate;
}

}  // namespace shardscope::sim

// Compute-communication contention: a GPU going from idle to computing (or back) re-rates its
// collectives; one going from no collective to one (or back) re-rates its kernels.
#include "shardscope/sim/models/contention_model.h"

#include "shardscope/sim/models/activity_set.h"

namespace shardscope::sim {

void ContentionModel::OnStart(ActivityId id, const ActivitySet& set, std::vector<ActivityId>& changed) {
  const Activity& a = set[id];
  if (a.kind == ActivityKind::kCompute) {
    const int32_t gpu = a.gpu;
    if (set.RunningOn(gpu, ActivityKind::kCompute).size() != 1) return;  // was computing already
    for (ActivityId comm : set.RunningOn(gpu, ActivityKind::kComm)) {
      ++members_computing_[static_cast<size_t>(comm)];
      changed.push_back(comm);
    }
    return;
  }
  if (members_computing_.size() < set.capacity()) members_computing_.resize(set.capacity(), 0);
  int32_t computing = 0;
  for (int32_t gpu : a.gpus) {
    if (!set.RunningOn(gpu, ActivityKind::kCompute).empty()) ++computing;
  }
  members_computing_[static_cast<size_t>(id)] = computing;
  for (int32_t gpu : a.gpus) {
    // The GPU had no collective before this one: its kernels slow down.
    if (set.RunningOn(gpu, ActivityKind::kComm).front() != id) continue;
    const auto& kernels = set.RunningOn(gpu, ActivityKind::kCompute);
    changed.insert(changed.end(), kernels.begin(), kernels.end());
  }
}

void ContentionModel::OnEnd(ActivityId id, const ActivitySet& set, std::vector<ActivityId>& changed) {
  const Activity& a = set[id];
  if (a.kind == ActivityKind::kCompute) {
    const int32_t gpu = a.gpu;
    if (!set.RunningOn(gpu, ActivityKind::kCompute).empty()) return;  // still computing
    for (ActivityId comm : set.RunningOn(gpu, ActivityKind::kComm)) {
      --members_computing_[static_cast<size_t>(comm)];
      changed.push_back(comm);
    }
    return;
  }
  for (int32_t gpu : a.gpus) {
    if (!set.RunningOn(gpu, ActivityKind::kComm).empty()) continue;
    const auto& kernels = set.RunningOn(gpu, ActivityKind::kCompute);
    changed.insert(changed.end(), kernels.begin(), kernels.end());
  }
}

double ContentionModel::Share(ActivityId id, const ActivitySet& set, double rate) const {
  const Activity& a = set[id];
  if (a.kind == ActivityKind::kCompute) {
    if (!set.RunningOn(a.gpu, ActivityKind::kComm).empty()) rate /= 1.0 + config_.compute_slowdown;
    return rate;
  }
  return members_computing_[static_cast<size_t>(id)] > 0 ? rate / (1.0 + config_.comm_slowdown) : rate;
}

}  // namespace shardscope::sim

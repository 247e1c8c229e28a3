// The activity set: starts and ends activities, tells the models, re-rates what changed.
#include "shardscope/sim/models/activity_set.h"

#include <utility>

#include "shardscope/base/check.h"

namespace shardscope::sim {

ActivitySet::ActivitySet(int32_t gpus, std::vector<std::unique_ptr<ResourceModel>> models, uint64_t* next_seq)
    : models_(std::move(models)), next_seq_(next_seq) {
  for (const auto& model : models_) {
    bool runs_any = false;
    for (int k = 0; k < kNumActivityKinds; ++k) {
      const auto kind = static_cast<ActivityKind>(k);
      if (model->Runs(kind)) {
        // The first model that claims a kind runs it.
        if (owner_of_[static_cast<size_t>(k)] == nullptr) owner_of_[static_cast<size_t>(k)] = model.get();
        runs_any = true;
      }
      if (model->Concerns(kind)) concerned_[static_cast<size_t>(k)].push_back(model.get());
    }
    if (runs_any) owners_.push_back(model.get());
  }
  for (const ResourceModel* owner : owner_of_) {
    SHARDSCOPE_CHECK(owner != nullptr, "every activity kind needs a resource model that runs it");
  }
  running_.resize(static_cast<size_t>(gpus));
}

ActivityId ActivitySet::Start(ActivityKind kind, double work_ns, std::span<const int32_t> gpus,
                              const CollectiveWork& collective, int64_t now) {
  ActivityId id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    id = static_cast<ActivityId>(activities_.size());
    activities_.emplace_back();
  }
  Activity& a = activities_[static_cast<size_t>(id)];
  a.live = true;
  ++a.version;
  a.kind = kind;
  a.remaining = work_ns;
  a.work = work_ns;
  a.rate = 0;  // forces the first SetRate to queue the completion
  a.last_update = now;
  a.bytes = collective.bytes;
  a.communicator = collective.communicator;
  a.collective_type = collective.type;
  a.algorithm = collective.algorithm;
  a.gpus.assign(gpus.begin(), gpus.end());
  a.gpu = gpus.empty() ? -1 : gpus.front();
  if (Indexed(kind)) {
    for (int32_t gpu : gpus) running_[static_cast<size_t>(gpu)][static_cast<size_t>(kind)].push_back(id);
  }
  changed_.clear();
  for (ResourceModel* m : concerned_[static_cast<size_t>(kind)]) m->OnStart(id, *this, changed_);
  for (ActivityId changed : changed_) SetRate(changed, Rate(changed), now);
  // Rated last unless a model already listed it (a rate is never 0 once set).
  if (a.rate == 0) SetRate(id, Rate(id), now);
  return id;
}

void ActivitySet::Finish(ActivityId id, int64_t now) {
  Activity& a = activities_[static_cast<size_t>(id)];
  a.live = false;
  free_.push_back(id);
  if (Indexed(a.kind)) {
    for (int32_t gpu : a.gpus) {
      auto& list = running_[static_cast<size_t>(gpu)][static_cast<size_t>(a.kind)];
      list.erase(std::find(list.begin(), list.end(), id));
    }
  }
  changed_.clear();
  for (ResourceModel* m : concerned_[static_cast<size_t>(a.kind)]) m->OnEnd(id, *this, changed_);
  Rerate(now);
}

void ActivitySet::Rerate(int64_t now) {
  for (ActivityId id : changed_) SetRate(id, Rate(id), now);
}

}  // namespace shardscope::sim

// The running activities and the resource models that rate them (resource_model.h): what the
// engine starts, finishes and asks for the next completion. The engine names no model; the set
// calls every model that concerns an activity's kind, recomputes the rates of the activities a
// change touched, and queues their completions with the owning model.
//
// Rates and completion dates are computed exactly as the engine always did (the same floating
// operations in the same order), so timestamps do not move by a nanosecond: a rate change
// first charges the work done since the last update at the old rate, then the completion is
// now + ceil(remaining / rate - 1e-6) ns (the epsilon keeps an exact quotient such as
// 100 / 0.8 from rounding up by one).
#ifndef SHARDSCOPE_SIM_MODELS_ACTIVITY_SET_H_
#define SHARDSCOPE_SIM_MODELS_ACTIVITY_SET_H_

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "shardscope/sim/models/resource_model.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::sim {

class ActivitySet {
 public:
  // `gpus`: the number of ranks. `next_seq`: the engine's event sequence counter, shared so
  // that completions and engine events order by one (time, seq) key.
  ActivitySet(int32_t gpus, std::vector<std::unique_ptr<ResourceModel>> models, uint64_t* next_seq);

  // Starts `work_ns` of work at `now` on `gpus` (one GPU for a kernel or copy, every member
  // for a collective, which says what it moves in `collective`), rates it and whatever it
  // slows, and queues their completions.
  ActivityId Start(ActivityKind kind, double work_ns, std::span<const int32_t> gpus,
                   const CollectiveWork& collective, int64_t now);
  // Ends `id` at `now` and re-rates what it was slowing.
  void Finish(ActivityId id, int64_t now);
  // `id` carries on as new work of `work_ns` at its unchanged rate (a kernel handing its
  // activity to the next kernel of its stream: no model hears of it, nothing is re-rated).
  void Restart(ActivityId id, double work_ns, int64_t now) {
    Activity& a = activities_[static_cast<size_t>(id)];
    a.remaining = work_ns;
    a.work = work_ns;
    a.last_update = now;
    ++a.version;
    Queue(a, id, now, a.remaining / a.rate);
  }

  const Activity& operator[](ActivityId id) const { return activities_[static_cast<size_t>(id)]; }
  // The activities of `kind` (kCompute or kComm) running on `gpu`, in start order.
  const std::vector<ActivityId>& RunningOn(int32_t gpu, ActivityKind kind) const {
    return running_[static_cast<size_t>(gpu)][static_cast<size_t>(kind)];
  }
  // Whether a completion was due at or past traces::kMaxSimulatedNs (and so never queued).
  bool PassedHorizon() const { return passed_horizon_; }
  // Ids are reused after Finish; callers may keep per-id data in vectors of this size.
  size_t capacity() const { return activities_.size(); }

  // The earliest queued completion over every owning model, stale ones included; null when
  // none is queued.
  const Completion* Next() const {
    const Completion* best = nullptr;
    for (ResourceModel* owner : owners_) {
      if (owner->completions().empty()) continue;
      const Completion& top = owner->completions().top();
      if (best == nullptr || *best > top) {
        best = &top;
        next_owner_ = owner;
      }
    }
    return best;
  }
  // Removes the completion the last Next() returned (nothing was queued since).
  Completion PopNext() {
    Completion c = next_owner_->completions().top();
    next_owner_->completions().pop();
    return c;
  }
  // False for a completion queued before the activity's last rate change, or of a finished one.
  bool IsCurrent(ActivityId id, uint32_t version) const {
    const Activity& a = activities_[static_cast<size_t>(id)];
    return a.live && a.version == version;
  }

 private:
  void SetRate(ActivityId id, double rate, int64_t now) {
    Activity& a = activities_[static_cast<size_t>(id)];
    if (a.rate == rate) return;
    a.remaining = std::max(0.0, a.remaining - static_cast<double>(now - a.last_update) * a.rate);
    a.last_update = now;
    a.rate = rate;
    ++a.version;
    Queue(a, id, now, a.remaining / rate);
  }
  // Every model that concerns the kind applies its share, in model order.
  double Rate(ActivityId id) const {
    double rate = 1.0;
    for (const ResourceModel* m : concerned_[static_cast<size_t>(activities_[static_cast<size_t>(id)].kind)]) {
      rate = m->Share(id, *this, rate);
    }
    return rate;
  }
  // Queues the completion `left_ns` after `now`. The wait is clamped to the simulator's horizon
  // (traces::kMaxSimulatedNs) before the conversion, and a completion at or past the horizon is
  // not queued but remembered (PassedHorizon): the run then drains and the engine reports it.
  // now < 2^60 and the wait <= 2^60, so nothing overflows.
  void Queue(const Activity& a, ActivityId id, int64_t now, double left_ns) {
    constexpr auto kHorizon = static_cast<double>(traces::kMaxSimulatedNs);
    // NaN (a zero rate) also goes to the horizon.
    int64_t time = now + static_cast<int64_t>(std::ceil((left_ns < kHorizon ? left_ns : kHorizon) - 1e-6));
    if (time < now) time = now;
    if (time >= traces::kMaxSimulatedNs) [[unlikely]] {
      passed_horizon_ = true;
      return;
    }
    owner_of_[static_cast<size_t>(a.kind)]->completions().push(Completion{time, (*next_seq_)++, id, a.version});
  }
  void Rerate(int64_t now);
  static bool Indexed(ActivityKind kind) { return kind != ActivityKind::kCopy; }

  std::vector<std::unique_ptr<ResourceModel>> models_;
  std::vector<ResourceModel*> owners_;                              // models that run a kind
  mutable ResourceModel* next_owner_ = nullptr;                     // whose top Next() found
  std::array<ResourceModel*, kNumActivityKinds> owner_of_{};
  std::array<std::vector<ResourceModel*>, kNumActivityKinds> concerned_;
  uint64_t* next_seq_;
  bool passed_horizon_ = false;
  std::vector<Activity> activities_;
  std::vector<ActivityId> free_;
  // [gpu][kind]: running compute and comm activities (copies are not indexed). A GPU's lists
  // sit side by side: the models read both at every start and end.
  std::vector<std::array<std::vector<ActivityId>, 2>> running_;
  std::vector<ActivityId> changed_;  // scratch for Start / Finish
};

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_MODELS_ACTIVITY_SET_H_

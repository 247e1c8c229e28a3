// The resource models' interface, after SimGrid's kernel/resource/Model and Action: what runs
// on the simulated GPUs and network (an Activity: its remaining work and its rate) and the
// models that decide how fast it goes while other work runs beside it.
//
// A model is told when an activity of a kind it concerns starts or ends (OnStart / OnEnd),
// updates its state and names the running activities whose share of its resources changed;
// the ActivitySet (activity_set.h) then recomputes their rates. An activity's rate starts at 1
// (full speed) and every model that concerns its kind applies its share in a fixed order
// (Share: a division or a product; a model with nothing to say returns the rate unchanged, bit
// for bit, so adding a model that does not apply changes no timestamp).
//
// Each activity kind is run by one model, its owner (GPU sharing runs kernels and copies, the
// links run collectives): the owner keeps the completions of the activities it runs in its
// queue and so answers its next completion (SimGrid's next_occurring_event). The engine takes
// the earliest over every owner and its own events, and never names a model.
#ifndef SHARDSCOPE_SIM_MODELS_RESOURCE_MODEL_H_
#define SHARDSCOPE_SIM_MODELS_RESOURCE_MODEL_H_

#include <cstdint>
#include <functional>
#include <queue>
#include <string_view>
#include <vector>

#include "shardscope/sim/models/nccl_model.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::sim {

using ActivityId = int32_t;

enum class ActivityKind : uint8_t {
  kCompute,  // a kernel on one GPU
  kComm,     // a collective (or a send/recv pair) on every member GPU
  kCopy,     // a memcpy on one GPU's copy engine (no model slows it)
};
inline constexpr int kNumActivityKinds = 3;

// Running work (SimGrid's Action). Owned by the ActivitySet; models read it.
struct Activity {
  // Read at every completion and rate change: first, in one cache line.
  ActivityKind kind = ActivityKind::kCompute;
  bool live = false;
  uint32_t version = 0;        // bumped at every rate change: older completions are stale
  double remaining = 0;        // ns of work at rate 1, as of last_update
  double rate = 0;             // fraction of full speed (0 until first rated)
  int64_t last_update = 0;
  int32_t gpu = -1;            // the first of gpus (a kernel's or copy's only one), kept here
                               // because the models read it at every start and end
  int32_t communicator = -1;   // collectives: index into Schedule::communicators
  // Collectives: what it is and how NCCL runs it (the links' traffic, link_traffic.h).
  traces::CollectiveType collective_type = traces::CollectiveType::kAllReduce;
  NcclAlgorithm algorithm = NcclAlgorithm::kRing;
  double work = 0;             // ns at full speed, as started (the links' demand)
  int64_t bytes = 0;           // collectives: the instance's bytes (the links' demand)
  std::vector<int32_t> gpus;   // the ranks it occupies, in member order
};

// What a collective activity moves (ActivitySet::Start); kernels and copies pass it empty.
struct CollectiveWork {
  int32_t communicator = -1;   // index into Schedule::communicators
  traces::CollectiveType type = traces::CollectiveType::kAllReduce;
  NcclAlgorithm algorithm = NcclAlgorithm::kRing;  // CollectiveCost::algorithm
  int64_t bytes = 0;           // nccl-tests' size of the instance
};

// When an activity ends at its current rate. Ordered by (time, seq): the sequence number
// comes from the engine's one counter, so completions and the engine's own events interleave
// in the order they were scheduled (the determinism the engine promises).
struct Completion {
  int64_t time = 0;
  uint64_t seq = 0;
  ActivityId id = -1;
  uint32_t version = 0;
  bool operator>(const Completion& other) const {
    return time != other.time ? time > other.time : seq > other.seq;
  }
};

class ActivitySet;

class ResourceModel {
 public:
  virtual ~ResourceModel() = default;
  virtual std::string_view name() const = 0;
  // True for the kinds this model runs (it then holds their completions).
  virtual bool Runs(ActivityKind kind) const = 0;
  // True for the kinds whose starts and ends this model hears of and whose rate it shares.
  virtual bool Concerns(ActivityKind kind) const = 0;
  // `id` has started (or is about to end: it is still in the set's lists for OnStart, already
  // out of them for OnEnd). Append to `changed` the running activities whose Share may now
  // differ, in the order their rates must be reset (the order completions are queued in).
  virtual void OnStart(ActivityId id, const ActivitySet& set, std::vector<ActivityId>& changed) = 0;
  virtual void OnEnd(ActivityId id, const ActivitySet& set, std::vector<ActivityId>& changed) = 0;
  // The model's share of its resources for `id`, applied to `rate`.
  virtual double Share(ActivityId id, const ActivitySet& set, double rate) const = 0;

  // The completions of the activities this model runs, stale ones included (the engine pops and
  // counts them, then skips them: ActivitySet::IsCurrent).
  using CompletionQueue = std::priority_queue<Completion, std::vector<Completion>, std::greater<>>;
  CompletionQueue& completions() { return completions_; }
  const CompletionQueue& completions() const { return completions_; }

 private:
  CompletionQueue completions_;
};

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_MODELS_RESOURCE_MODEL_H_

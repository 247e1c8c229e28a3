// The network-link model: it runs collectives (and send/recv pairs) and shares links between
// the ones that cross them at once. A link has a bandwidth and the communicators whose
// collectives cross it; a collective on a communicator that crosses no configured link runs
// on its own virtual link of unlimited bandwidth, at full speed whatever else runs (today's
// default: a communicator's collectives are serialized by NCCL anyway).
//
// Sharing is max-min fair (progressive filling, as SimGrid's LMM solver shares a link between
// flows): a collective draws `bytes / full-speed duration` bytes per ns when alone (its
// demand); every collective on a saturated link gets an equal share of what the others leave,
// and one that needs less than its share keeps its full speed and leaves the rest to the
// others. Equal share would slow a small, latency-bound collective as much as a large one;
// max-min does not, and equals equal share when every collective saturates the link (the
// usual case: the cost model assumes a collective alone runs at its path's bandwidth). A
// collective's rate is its allocation over its demand, at most 1.
#ifndef SHARDSCOPE_SIM_MODELS_LINK_MODEL_H_
#define SHARDSCOPE_SIM_MODELS_LINK_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shardscope/base/status.h"
#include "shardscope/sim/models/resource_model.h"

namespace shardscope::sim {

struct LinkSpec {
  std::string name;                    // for messages ("node0 NIC", "NVSwitch")
  double bandwidth_bytes_per_s = 0;    // what the collectives crossing it share
  std::vector<int32_t> communicators;  // indices into Schedule::communicators
};

class LinkModel : public ResourceModel {
 public:
  // Checks the links against the number of communicators (kInvalidInput naming the link).
  static StatusOr<std::unique_ptr<LinkModel>> Create(std::vector<LinkSpec> links, int32_t communicators);

  std::string_view name() const override { return "links"; }
  bool Runs(ActivityKind kind) const override { return kind == ActivityKind::kComm; }
  bool Concerns(ActivityKind kind) const override { return kind == ActivityKind::kComm; }
  void OnStart(ActivityId id, const ActivitySet& set, std::vector<ActivityId>& changed) override;
  void OnEnd(ActivityId id, const ActivitySet& set, std::vector<ActivityId>& changed) override;
  double Share(ActivityId id, const ActivitySet& set, double rate) const override;

 private:
  LinkModel(std::vector<LinkSpec> links, std::vector<std::vector<int32_t>> links_of_comm)
      : links_(std::move(links)), links_of_comm_(std::move(links_of_comm)) {}
  // Recomputes every flow's share; appends the flows whose share changed (not `skip`).
  void Solve(const ActivitySet& set, ActivityId skip, std::vector<ActivityId>& changed);

  std::vector<LinkSpec> links_;
  std::vector<std::vector<int32_t>> links_of_comm_;  // per communicator: the links it crosses
  std::vector<ActivityId> flows_;                    // running collectives on links, start order
  std::vector<double> share_;                        // per activity id: its rate factor
};

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_MODELS_LINK_MODEL_H_

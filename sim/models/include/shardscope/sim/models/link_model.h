// The network-link model: it runs collectives (and send/recv pairs) and shares links between
// the ones that cross them at once. A link has a capacity and the communicators whose
// collectives cross it; a collective on a communicator that crosses no configured link runs
// on its own virtual link of unlimited bandwidth, at full speed whatever else runs (the default:
// a communicator's collectives are serialized by NCCL anyway, so a link matters only when the
// collectives of several communicators cross it). sim/simulate builds the links of a cluster
// (cluster_links.h): each GPU's NVLink ports and its NIC share, listed only where two
// communicators meet.
//
// What a collective demands of a link (bytes per ns) is the traffic it puts on that link when
// alone over its full-speed duration: link_traffic.h gives the traffic by link kind from the
// algorithm NCCL runs (a ring all-gather spanning nodes sends N/n of its (n-1)/n S through each
// member's NIC and the rest over NVLink); a hand-made link of kind kCollectiveBytes is crossed by
// all S bytes. The duration includes the latency, so a latency-bound collective demands little.
// A demand above the link's capacity (a calibrated collective measured faster than the link
// model allows) is taken as the capacity: alone, a collective is never slowed by its links.
//
// Sharing is max-min fair in bandwidth on each link, as a NIC or NVSwitch port arbitrates
// between the connections crossing it: the collectives held back by a saturated link get equal
// bandwidth there, and one that needs less than that share keeps its full speed and leaves the
// rest to the others (equal shares would slow a small, latency-bound collective as much as a
// large one; max-min does not, and equals equal shares when every collective saturates the
// link). A collective runs at one rate r (a fraction of its full speed) on all its links, since
// its algorithm moves the NVLink and NIC parts in lockstep: it uses r x its demand on each link,
// and r is what its tightest link gives it. The allocation is the one where every collective
// held back has a saturated link on which it gets the most bandwidth (Bertsekas & Gallager,
// Data Networks, 6.5.2, with demands that differ per link). Solved bottleneck by bottleneck:
// the links' water levels over the unsettled collectives; a link that is the tightest for every
// unsettled collective on it settles them at its level (levels only rise as collectives settle,
// so a settled rate is final); repeat. When no link is the tightest for all of its collectives
// (demands crossing in opposite proportions, e.g. an all-to-all loading the NIC beside a ring
// loading the NVLink, both crossing both), the rest are settled at the fixed point of the
// levels computed with each collective held to what its other links give it (link_model.cc).
//
// Only the collectives connected to the one that started or ended (through the links they
// share) are re-solved; a start or end on a communicator that crosses no link costs nothing.
#ifndef SHARDSCOPE_SIM_MODELS_LINK_MODEL_H_
#define SHARDSCOPE_SIM_MODELS_LINK_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shardscope/base/status.h"
#include "shardscope/sim/models/link_traffic.h"
#include "shardscope/sim/models/nccl_model.h"
#include "shardscope/sim/models/resource_model.h"

namespace shardscope::sim {

struct LinkSpec {
  std::string name;                    // for messages ("rank 3 NIC", "rank 3 NVLink")
  double bandwidth_bytes_per_s = 0;    // what the collectives crossing it share, one direction
  std::vector<int32_t> communicators;  // indices into Schedule::communicators
  LinkKind kind = LinkKind::kCollectiveBytes;  // which traffic of a collective crosses it
};

class LinkModel : public ResourceModel {
 public:
  // Checks the links against the number of communicators (kInvalidInput naming the link).
  // `topologies`: per communicator, its shape on the cluster (what kNvlink and kNic links need
  // to know the traffic; may be empty when every link is kCollectiveBytes).
  static StatusOr<std::unique_ptr<LinkModel>> Create(std::vector<LinkSpec> links, std::vector<CommTopology> topologies,
                                                     int32_t communicators);

  std::string_view name() const override { return "links"; }
  bool Runs(ActivityKind kind) const override { return kind == ActivityKind::kComm; }
  bool Concerns(ActivityKind kind) const override { return kind == ActivityKind::kComm; }
  void OnStart(ActivityId id, const ActivitySet& set, std::vector<ActivityId>& changed) override;
  void OnEnd(ActivityId id, const ActivitySet& set, std::vector<ActivityId>& changed) override;
  double Share(ActivityId id, const ActivitySet& set, double rate) const override;

 private:
  // A running collective on configured links: what it demands of each at full speed.
  struct Flow {
    std::vector<std::pair<int32_t, double>> demands;  // (link, bytes per ns), in link order
  };
  LinkModel(std::vector<LinkSpec> links, std::vector<CommTopology> topologies,
            std::vector<std::vector<int32_t>> links_of_comm);
  // Re-solves the collectives connected to `id` through shared links; appends those whose share
  // changed (not `skip`).
  void Solve(ActivityId id, ActivityId skip, std::vector<ActivityId>& changed);
  // The water level of link `l`: the bandwidth each of its unsettled collectives gets when
  // those that would use more are held to it, in the capacity the settled ones leave; each at
  // its demand, or (`held_elsewhere`) at what its other links give it. Infinity when the link
  // fits them all.
  double WaterLevel(int32_t l, bool held_elsewhere);
  // Each unsettled component flow's lowest and second-lowest level / demand over its links.
  void RatesFromLevels();
  void Settle(size_t f, double rate);
  // Settles every unsettled flow when no link is the tightest for all of its flows.
  void SettleCrossing();

  std::vector<LinkSpec> links_;
  std::vector<double> capacity_;                     // per link: bytes per ns
  std::vector<CommTopology> topologies_;
  std::vector<std::vector<int32_t>> links_of_comm_;  // per communicator: the links it crosses
  // Per link: its running flows and what each demands there, in start order.
  std::vector<std::vector<std::pair<ActivityId, double>>> on_link_;
  std::vector<Flow> flow_;                           // per activity id (no demands: not on a link)
  std::vector<double> share_;                        // per activity id: its rate factor
  // Scratch for Solve, kept to avoid allocating per start and end.
  std::vector<ActivityId> component_flows_;
  std::vector<int32_t> component_links_;
  std::vector<uint64_t> link_mark_, flow_mark_;  // the last Solve that visited each
  std::vector<size_t> slot_;                     // per activity id: its index in component_flows_
  uint64_t mark_ = 0;
  std::vector<double> rate_;                   // per component flow: its rate
  std::vector<bool> settled_;                  // ... whether it is final
  std::vector<double> tightest_, second_rate_;  // ... the two lowest level / demand of its links
  std::vector<int32_t> tightest_link_;          // ... and the link of the lowest
  std::vector<double> residual_, level_;        // per link: capacity left, water level
  std::vector<double> previous_rate_;           // SettleCrossing: the rates a round before
  std::vector<double> caps_;                    // one link's flows' caps (water filling)
  std::vector<int32_t> consistent_;             // links that are the tightest for all their flows
};

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_MODELS_LINK_MODEL_H_

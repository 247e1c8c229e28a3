// Classes of ranks whose timelines are identical under the model, found before a run, so the
// engine simulates one representative per class (EngineConfig::reduce_symmetry).
//
// Why identical: a rank's timeline depends only on its program, its costs (capacity,
// straggler factor, faults) and, through rendezvous, contention and links, on when the
// members of its communicators arrive and what they run. Colour refinement (1-dimensional
// Weisfeiler-Leman) over the graph of ranks, communicators and links finds the coarsest
// partition that is *equitable*: ranks of one class run the same program with the same costs,
// and for every slot bind communicators of one class; communicators of one class cost the
// same for every collective (CostProvider::CommunicatorCostKey), cross links of the same
// classes and hold the same number of members of each rank class through the same slots;
// links of one class have the same kind and bandwidth and are crossed by communicators of the
// same classes. By induction over the engine's events, ranks of one class then arrive at every
// collective at the same time and see the same rates, so simulating one of them, with each
// communicator class's collectives started when every rank class among its members has
// arrived, gives every rank's timeline exactly (the exactness test in
// tests/symmetry_exactness_test.cc compares report.json and trace.json byte for byte).
//
// Ranks a caller singles out stay alone in their class: traced ranks (the observer's), the
// rank of an injected fault, and ranks whose program has send/recv (p2p pairs are matched by
// global rank). Reduction is refused (`reduced()` false, `why_not` says why) where the
// quotient would not be exact: a rank binding two communicators of one class on different
// slots (they would share one serialization lane), a link crossed by two communicators of one
// class, or a partition that does not settle within kMaxRefinementRounds rounds.
#ifndef SHARDSCOPE_SIM_ENGINE_RANK_CLASSES_H_
#define SHARDSCOPE_SIM_ENGINE_RANK_CLASSES_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "shardscope/sim/models/link_model.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::sim {

class CostProvider;
struct EngineConfig;
class EngineObserver;

// Rounds of refinement before giving up (a partition that needs more is one of long chains of
// distinct ranks, where the reduction would save little anyway).
inline constexpr int kMaxRefinementRounds = 64;

struct RankClasses {
  // Per rank: its class. Classes are numbered in the order of their lowest rank, which is the
  // class's representative.
  std::vector<int32_t> class_of_rank;
  std::vector<int32_t> representative;   // per class
  std::vector<int32_t> class_size;       // per class: its ranks
  // Per communicator: the lowest-index communicator of its class (itself when alone).
  std::vector<int32_t> comm_representative;
  // Per representative communicator (empty for the others): its members grouped by class,
  // (class, number of members of that class), in order of class.
  std::vector<std::vector<std::pair<int32_t, int32_t>>> members_by_class;
  // The links the representatives cross: one per link class, communicators given by their
  // representatives (what the engine's link model runs on instead of EngineConfig::links).
  std::vector<LinkSpec> links;
  std::string why_not;                   // set when no reduction is possible
  int rounds = 0;                        // refinement rounds run

  int32_t classes() const { return static_cast<int32_t>(representative.size()); }
  // Fewer classes than ranks, and the quotient is exact.
  bool reduced() const { return why_not.empty() && representative.size() < class_of_rank.size(); }
};

// The classes of `schedule`'s ranks under `config` (capacities, stragglers, the injected OOM,
// links) and `costs` (which communicators cost alike). `observer` (may be null): ranks it
// wants stay alone.
RankClasses ComputeRankClasses(const traces::Schedule& schedule, const CostProvider& costs,
                               const EngineConfig& config, const EngineObserver* observer);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_ENGINE_RANK_CLASSES_H_

// Colour refinement of ranks, communicators and links into the classes the engine simulates
// once each (rank_classes.h has the argument for exactness).
//
// Every round recolours all three kinds of vertex from the previous round's colours
// (synchronous refinement): a vertex's new colour is its old colour with the multiset of its
// neighbours' old colours, so colours only split. When a round splits nothing the partition is
// equitable. Colours are numbered in order of first appearance, so the result depends only on
// the input.
#include "shardscope/sim/engine/rank_classes.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <map>
#include <set>
#include <variant>

#include <fmt/format.h>

#include "shardscope/sim/engine/engine.h"
#include "shardscope/sim/models/cost_provider.h"

namespace shardscope::sim {
namespace {

using Key = std::vector<int64_t>;

// Colours in order of first appearance: the same keys in the same order give the same colours.
class Palette {
 public:
  int32_t Of(const Key& key) {
    auto [it, inserted] = colours_.try_emplace(key, static_cast<int32_t>(colours_.size()));
    return it->second;
  }
  size_t size() const { return colours_.size(); }

 private:
  std::map<Key, int32_t> colours_;
};

int64_t Bits(double value) { return std::bit_cast<int64_t>(value); }

bool HasPointToPoint(const traces::Program& program) {
  return std::any_of(program.ops.begin(), program.ops.end(), [](const traces::Op& op) {
    const auto* coll = std::get_if<traces::CollectiveOp>(&op.payload);
    return coll != nullptr && (coll->type == traces::CollectiveType::kSend || coll->type == traces::CollectiveType::kRecv);
  });
}

}  // namespace

RankClasses ComputeRankClasses(const traces::Schedule& schedule, const CostProvider& costs, const EngineConfig& config,
                               const EngineObserver* observer) {
  RankClasses out;
  const int32_t world = schedule.world_size();
  const size_t comms = schedule.communicators.size();
  const std::vector<LinkSpec>& links = config.links;

  // Initial colours. Ranks: program, capacity, straggler factor, and for ranks kept alone
  // their own rank.
  std::vector<bool> p2p_program(schedule.programs.size());
  for (size_t p = 0; p < schedule.programs.size(); ++p) p2p_program[p] = HasPointToPoint(schedule.programs[p]);
  std::vector<int32_t> rank_colour(static_cast<size_t>(world));
  {
    Palette palette;
    const std::vector<int64_t>& capacities = config.memory.capacity_bytes;
    for (int32_t r = 0; r < world; ++r) {
      const traces::RankBinding& binding = schedule.ranks[static_cast<size_t>(r)];
      const int64_t capacity = config.memory.enabled && !capacities.empty()
                                   ? capacities[std::min(static_cast<size_t>(r), capacities.size() - 1)]
                                   : 0;
      const auto slow = config.rank_slowdown.find(r);
      const double factor = slow == config.rank_slowdown.end() ? 1.0 : slow->second;
      const bool alone = (observer != nullptr && observer->WantsRank(r)) ||
                         (config.inject_oom && config.inject_oom->rank == r) ||
                         p2p_program[static_cast<size_t>(binding.program)];
      rank_colour[static_cast<size_t>(r)] =
          palette.Of({binding.program, capacity, Bits(factor), alone ? r : -1});
    }
  }
  // Communicators: what they cost and how many members they have.
  std::vector<int32_t> comm_colour(comms);
  {
    Palette palette;
    for (size_t c = 0; c < comms; ++c) {
      comm_colour[c] = palette.Of({costs.CommunicatorCostKey(static_cast<int32_t>(c)),
                                   static_cast<int64_t>(schedule.communicators[c].ranks.size())});
    }
  }
  // Links: kind and bandwidth.
  std::vector<int32_t> link_colour(links.size());
  std::vector<std::vector<int32_t>> links_of_comm(comms);
  {
    Palette palette;
    for (size_t l = 0; l < links.size(); ++l) {
      link_colour[l] = palette.Of({static_cast<int64_t>(links[l].kind), Bits(links[l].bandwidth_bytes_per_s)});
      for (int32_t c : links[l].communicators) {
        if (c >= 0 && static_cast<size_t>(c) < comms) links_of_comm[static_cast<size_t>(c)].push_back(static_cast<int32_t>(l));
      }
    }
  }
  // Per (communicator, member): the member's slots bound to it (none: -1), fixed for the run.
  std::vector<std::vector<std::pair<int32_t, int32_t>>> member_slots(comms);  // (rank, slot)
  for (size_t c = 0; c < comms; ++c) {
    for (int32_t m : schedule.communicators[c].ranks) {
      if (m < 0 || m >= world) continue;
      const std::vector<int32_t>& binding = schedule.ranks[static_cast<size_t>(m)].comm_binding;
      bool bound = false;
      for (size_t s = 0; s < binding.size(); ++s) {
        if (binding[s] == static_cast<int32_t>(c)) {
          member_slots[c].emplace_back(m, static_cast<int32_t>(s));
          bound = true;
        }
      }
      if (!bound) member_slots[c].emplace_back(m, -1);
    }
  }

  size_t rank_classes = 0, comm_classes = 0, link_classes = 0;
  {
    std::set<int32_t> r(rank_colour.begin(), rank_colour.end()), c(comm_colour.begin(), comm_colour.end()),
        l(link_colour.begin(), link_colour.end());
    rank_classes = r.size();
    comm_classes = c.size();
    link_classes = l.size();
  }
  bool stable = false;
  Key key;
  std::vector<std::pair<int32_t, int32_t>> entries;
  std::vector<int32_t> colours;
  for (out.rounds = 1; out.rounds <= kMaxRefinementRounds; ++out.rounds) {
    Palette comm_palette, link_palette, rank_palette;
    std::vector<int32_t> next_comm(comms), next_link(links.size()), next_rank(static_cast<size_t>(world));
    for (size_t c = 0; c < comms; ++c) {
      entries.clear();
      for (const auto& [m, slot] : member_slots[c]) entries.emplace_back(rank_colour[static_cast<size_t>(m)], slot);
      std::sort(entries.begin(), entries.end());
      key.assign(1, comm_colour[c]);
      // Run-length: (colour, slot, count) per distinct pair.
      for (size_t i = 0; i < entries.size();) {
        size_t j = i;
        while (j < entries.size() && entries[j] == entries[i]) ++j;
        key.push_back(entries[i].first);
        key.push_back(entries[i].second);
        key.push_back(static_cast<int64_t>(j - i));
        i = j;
      }
      key.push_back(-2);
      colours.clear();
      for (int32_t l : links_of_comm[c]) colours.push_back(link_colour[static_cast<size_t>(l)]);
      std::sort(colours.begin(), colours.end());
      key.insert(key.end(), colours.begin(), colours.end());
      next_comm[c] = comm_palette.Of(key);
    }
    for (size_t l = 0; l < links.size(); ++l) {
      colours.clear();
      for (int32_t c : links[l].communicators) {
        if (c >= 0 && static_cast<size_t>(c) < comms) colours.push_back(comm_colour[static_cast<size_t>(c)]);
      }
      std::sort(colours.begin(), colours.end());
      key.assign(1, link_colour[l]);
      key.insert(key.end(), colours.begin(), colours.end());
      next_link[l] = link_palette.Of(key);
    }
    for (int32_t r = 0; r < world; ++r) {
      key.assign(1, rank_colour[static_cast<size_t>(r)]);
      for (int32_t c : schedule.ranks[static_cast<size_t>(r)].comm_binding) {
        key.push_back(c >= 0 && static_cast<size_t>(c) < comms ? comm_colour[static_cast<size_t>(c)] : -1);
      }
      next_rank[static_cast<size_t>(r)] = rank_palette.Of(key);
    }
    const bool split = rank_palette.size() != rank_classes || comm_palette.size() != comm_classes ||
                       link_palette.size() != link_classes;
    rank_colour = std::move(next_rank);
    comm_colour = std::move(next_comm);
    link_colour = std::move(next_link);
    rank_classes = rank_palette.size();
    comm_classes = comm_palette.size();
    link_classes = link_palette.size();
    if (!split) {
      stable = true;
      break;
    }
  }

  // Classes numbered by their lowest rank (colours already are: palettes number in rank order).
  out.class_of_rank.assign(rank_colour.begin(), rank_colour.end());
  out.representative.assign(rank_classes, -1);
  out.class_size.assign(rank_classes, 0);
  for (int32_t r = 0; r < world; ++r) {
    const auto k = static_cast<size_t>(out.class_of_rank[static_cast<size_t>(r)]);
    if (out.representative[k] < 0) out.representative[k] = r;
    ++out.class_size[k];
  }
  if (!stable) {
    out.why_not = fmt::format("the rank classes did not settle in {} refinement rounds", kMaxRefinementRounds);
    return out;
  }
  std::vector<int32_t> first_comm(comm_classes, -1);
  out.comm_representative.resize(comms);
  for (size_t c = 0; c < comms; ++c) {
    int32_t& first = first_comm[static_cast<size_t>(comm_colour[c])];
    if (first < 0) first = static_cast<int32_t>(c);
    out.comm_representative[c] = first;
  }
  out.members_by_class.resize(comms);
  for (int32_t c : first_comm) {
    std::map<int32_t, int32_t> counts;
    for (int32_t m : schedule.communicators[static_cast<size_t>(c)].ranks) {
      if (m >= 0 && m < world) ++counts[out.class_of_rank[static_cast<size_t>(m)]];
    }
    out.members_by_class[static_cast<size_t>(c)].assign(counts.begin(), counts.end());
  }
  // A representative must not bind two communicators of one class on slots bound to different
  // communicators: in the quotient they would be one communicator with one serialization lane.
  for (int32_t rep : out.representative) {
    const std::vector<int32_t>& binding = schedule.ranks[static_cast<size_t>(rep)].comm_binding;
    for (size_t a = 0; a < binding.size(); ++a) {
      for (size_t b = a + 1; b < binding.size(); ++b) {
        if (binding[a] == binding[b] || binding[a] < 0 || binding[b] < 0) continue;
        if (out.comm_representative[static_cast<size_t>(binding[a])] ==
            out.comm_representative[static_cast<size_t>(binding[b])]) {
          out.why_not = fmt::format("rank {} binds communicators '{}' and '{}' of one class", rep,
                                    schedule.communicators[static_cast<size_t>(binding[a])].name,
                                    schedule.communicators[static_cast<size_t>(binding[b])].name);
          return out;
        }
      }
    }
  }
  // One link per link class, crossed by the representatives of its communicators' classes.
  std::vector<bool> seen_link_class(link_classes, false);
  for (size_t l = 0; l < links.size(); ++l) {
    if (seen_link_class[static_cast<size_t>(link_colour[l])]) continue;
    seen_link_class[static_cast<size_t>(link_colour[l])] = true;
    LinkSpec link = links[l];
    for (int32_t& c : link.communicators) {
      if (c >= 0 && static_cast<size_t>(c) < comms) c = out.comm_representative[static_cast<size_t>(c)];
    }
    std::vector<int32_t> sorted = link.communicators;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      out.why_not = fmt::format("link '{}' is crossed by two communicators of one class", links[l].name);
      return out;
    }
    out.links.push_back(std::move(link));
  }
  return out;
}

}  // namespace shardscope::sim

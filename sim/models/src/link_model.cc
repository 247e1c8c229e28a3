// Network links: max-min fair sharing in bandwidth, bottleneck by bottleneck, over the
// collectives connected to the one that started or ended (see link_model.h).
#include "shardscope/sim/models/link_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include <fmt/format.h>

#include "shardscope/sim/models/activity_set.h"

namespace shardscope::sim {
namespace {

// Two rates this close (relative) are the same: a link whose rate for a collective is within
// this of the collective's tightest is its tightest too (ties settle together).
constexpr double kSameLevel = 1e-12;
constexpr double kNsPerSecond = 1e9;
// Demands crossing in opposite proportions: the Jacobi iteration of SettleCrossing converges
// geometrically, fast when each collective loads one of the links far more than the other (the
// all-to-all beside a ring of link_model_test.cc); past this many rounds, the lower of the last
// two rates is taken.
constexpr int kMaxIterations = 64;

}  // namespace

LinkModel::LinkModel(std::vector<LinkSpec> links, std::vector<CommTopology> topologies,
                     std::vector<std::vector<int32_t>> links_of_comm)
    : links_(std::move(links)), topologies_(std::move(topologies)), links_of_comm_(std::move(links_of_comm)) {
  capacity_.reserve(links_.size());
  for (const LinkSpec& link : links_) capacity_.push_back(link.bandwidth_bytes_per_s / kNsPerSecond);
  on_link_.resize(links_.size());
  link_mark_.assign(links_.size(), 0);
  residual_.assign(links_.size(), 0.0);
  level_.assign(links_.size(), 0.0);
}

StatusOr<std::unique_ptr<LinkModel>> LinkModel::Create(std::vector<LinkSpec> links,
                                                       std::vector<CommTopology> topologies,
                                                       int32_t communicators) {
  std::vector<std::vector<int32_t>> links_of_comm(static_cast<size_t>(std::max(communicators, 0)));
  for (size_t l = 0; l < links.size(); ++l) {
    const LinkSpec& link = links[l];
    if (!(link.bandwidth_bytes_per_s > 0) || !std::isfinite(link.bandwidth_bytes_per_s)) {
      return Status::InvalidInput(fmt::format("link '{}': bandwidth {} B/s must be a positive number",
                                              link.name, link.bandwidth_bytes_per_s));
    }
    if (link.kind != LinkKind::kCollectiveBytes && topologies.size() != links_of_comm.size()) {
      return Status::InvalidInput(fmt::format(
          "link '{}': a {} link needs the shape of each of the schedule's {} communicators, got {}", link.name,
          LinkKindName(link.kind), communicators, topologies.size()));
    }
    for (int32_t comm : link.communicators) {
      if (comm < 0 || comm >= communicators) {
        return Status::InvalidInput(fmt::format("link '{}': communicator {} is outside the schedule's {}",
                                                link.name, comm, communicators));
      }
      auto& crossing = links_of_comm[static_cast<size_t>(comm)];
      if (std::find(crossing.begin(), crossing.end(), static_cast<int32_t>(l)) == crossing.end()) {
        crossing.push_back(static_cast<int32_t>(l));
      }
    }
  }
  return std::unique_ptr<LinkModel>(new LinkModel(std::move(links), std::move(topologies), std::move(links_of_comm)));
}

void LinkModel::OnStart(ActivityId id, const ActivitySet& set, std::vector<ActivityId>& changed) {
  // The new collective is rated first, before anything it slows.
  changed.push_back(id);
  if (share_.size() < set.capacity()) {
    share_.resize(set.capacity(), 1.0);
    flow_.resize(set.capacity());
    flow_mark_.resize(set.capacity(), 0);
    slot_.resize(set.capacity(), 0);
  }
  const auto index = static_cast<size_t>(id);
  share_[index] = 1.0;
  Flow& flow = flow_[index];
  flow.demands.clear();
  const Activity& a = set[id];
  if (a.communicator < 0 || static_cast<size_t>(a.communicator) >= links_of_comm_.size() ||
      links_of_comm_[static_cast<size_t>(a.communicator)].empty() || !(a.work > 0)) {
    return;  // its own unlimited virtual link (or no time to share)
  }
  // Its demand on each link it crosses: traffic there / full-speed ns, at most the capacity.
  const std::vector<int32_t>& crossed = links_of_comm_[static_cast<size_t>(a.communicator)];
  LinkTraffic traffic;
  const bool typed = std::any_of(crossed.begin(), crossed.end(), [&](int32_t l) {
    return links_[static_cast<size_t>(l)].kind != LinkKind::kCollectiveBytes;
  });
  if (typed) {
    traffic = CollectiveLinkTraffic(topologies_[static_cast<size_t>(a.communicator)], a.collective_type, a.bytes,
                                    a.algorithm);
  }
  for (int32_t l : crossed) {
    const double demand = std::min(traffic.BytesOn(links_[static_cast<size_t>(l)].kind, a.bytes) / a.work,
                                   capacity_[static_cast<size_t>(l)]);
    if (!(demand > 0)) continue;  // crosses the link without traffic there
    flow.demands.emplace_back(l, demand);
    on_link_[static_cast<size_t>(l)].emplace_back(id, demand);
  }
  if (flow.demands.empty()) return;
  Solve(id, id, changed);
}

void LinkModel::OnEnd(ActivityId id, const ActivitySet&, std::vector<ActivityId>& changed) {
  const auto index = static_cast<size_t>(id);
  if (index >= flow_.size() || flow_[index].demands.empty()) return;
  std::vector<std::pair<int32_t, double>> left = std::move(flow_[index].demands);
  flow_[index].demands.clear();
  share_[index] = 1.0;
  for (const auto& [l, demand] : left) {
    auto& flows = on_link_[static_cast<size_t>(l)];
    flows.erase(std::find_if(flows.begin(), flows.end(), [&](const auto& entry) { return entry.first == id; }));
  }
  // Its neighbours are re-solved without it, from each link it left; marks only grow, so a
  // neighbour solved in this pass carries a mark above the one before it.
  const uint64_t before = mark_;
  for (const auto& [l, demand] : left) {
    const auto& flows = on_link_[static_cast<size_t>(l)];
    if (!flows.empty() && flow_mark_[static_cast<size_t>(flows.front().first)] <= before) {
      Solve(flows.front().first, id, changed);
    }
  }
}

double LinkModel::Share(ActivityId id, const ActivitySet&, double rate) const {
  const double share = share_[static_cast<size_t>(id)];
  return share == 1.0 ? rate : rate * share;
}

double LinkModel::WaterLevel(int32_t l, bool held_elsewhere) {
  caps_.clear();
  double sum = 0;
  for (const auto& [id, demand] : on_link_[static_cast<size_t>(l)]) {
    const size_t f = slot_[static_cast<size_t>(id)];
    if (settled_[f]) continue;  // in the residual already
    // Held elsewhere: what the links other than this one let the flow use.
    const double elsewhere = !held_elsewhere ? 1.0 : tightest_link_[f] == l ? second_rate_[f] : tightest_[f];
    caps_.push_back(demand * std::min(1.0, elsewhere));
    sum += caps_.back();
  }
  const double residual = std::max(0.0, residual_[static_cast<size_t>(l)]);
  if (sum <= residual) return std::numeric_limits<double>::infinity();
  // Those using less than the level keep it; the rest share what is left equally.
  std::sort(caps_.begin(), caps_.end());
  double below = 0;
  for (size_t i = 0; i < caps_.size(); ++i) {
    const double level = (residual - below) / static_cast<double>(caps_.size() - i);
    if (caps_[i] >= level) return level;
    below += caps_[i];
  }
  return std::numeric_limits<double>::infinity();  // not reached: the sum exceeds the residual
}

void LinkModel::RatesFromLevels() {
  for (size_t f = 0; f < component_flows_.size(); ++f) {
    if (settled_[f]) continue;
    double best = std::numeric_limits<double>::infinity(), second = best;
    int32_t best_link = -1;
    for (const auto& [l, demand] : flow_[static_cast<size_t>(component_flows_[f])].demands) {
      const double rate = level_[static_cast<size_t>(l)] / demand;
      if (rate < best) {
        second = best;
        best = rate;
        best_link = l;
      } else {
        second = std::min(second, rate);
      }
    }
    tightest_[f] = best;
    second_rate_[f] = second;
    tightest_link_[f] = best_link;
  }
}

void LinkModel::Settle(size_t f, double rate) {
  settled_[f] = true;
  rate_[f] = rate;
  for (const auto& [l, demand] : flow_[static_cast<size_t>(component_flows_[f])].demands) {
    residual_[static_cast<size_t>(l)] -= demand * rate;
  }
}

void LinkModel::SettleCrossing() {
  // Jacobi iteration on the levels, each computed with every unsettled flow held to what its
  // other links give it. From "nothing held elsewhere" the levels alternate around the fixed
  // point (lower levels hold flows back more, which raises the next levels); where they
  // converge, every flow held back has a saturated link on which it gets the most bandwidth.
  // Still alternating after kMaxIterations: the lower of the last two rates.
  const size_t n = component_flows_.size();
  for (int32_t l : component_links_) level_[static_cast<size_t>(l)] = std::numeric_limits<double>::infinity();
  std::fill(tightest_.begin(), tightest_.end(), std::numeric_limits<double>::infinity());
  std::fill(second_rate_.begin(), second_rate_.end(), std::numeric_limits<double>::infinity());
  std::fill(tightest_link_.begin(), tightest_link_.end(), -1);
  std::vector<double>& previous = previous_rate_;  // the rates of the iteration before
  previous.assign(n, 1.0);
  bool converged = false;
  for (int iteration = 0; iteration < kMaxIterations && !converged; ++iteration) {
    for (size_t f = 0; f < n; ++f) previous[f] = std::min(1.0, tightest_[f]);
    for (int32_t l : component_links_) level_[static_cast<size_t>(l)] = WaterLevel(l, /*held_elsewhere=*/true);
    RatesFromLevels();
    converged = true;
    for (size_t f = 0; f < n; ++f) {
      if (settled_[f]) continue;
      const double before = previous[f], after = std::min(1.0, tightest_[f]);
      if (std::abs(after - before) > kSameLevel * std::max(before, after)) converged = false;
    }
  }
  for (size_t f = 0; f < n; ++f) {
    if (settled_[f]) continue;
    const double rate = std::min(1.0, tightest_[f]);
    rate_[f] = converged ? rate : std::min(rate, previous[f]);
    settled_[f] = true;
  }
}

void LinkModel::Solve(ActivityId start, ActivityId skip, std::vector<ActivityId>& changed) {
  // The connected component of `start`: flows and the links they cross, breadth first.
  ++mark_;
  component_flows_.clear();
  component_links_.clear();
  component_flows_.push_back(start);
  flow_mark_[static_cast<size_t>(start)] = mark_;
  for (size_t i = 0; i < component_flows_.size(); ++i) {
    for (const auto& [l, demand] : flow_[static_cast<size_t>(component_flows_[i])].demands) {
      if (link_mark_[static_cast<size_t>(l)] == mark_) continue;
      link_mark_[static_cast<size_t>(l)] = mark_;
      component_links_.push_back(l);
      for (const auto& [other, other_demand] : on_link_[static_cast<size_t>(l)]) {
        if (flow_mark_[static_cast<size_t>(other)] == mark_) continue;
        flow_mark_[static_cast<size_t>(other)] = mark_;
        component_flows_.push_back(other);
      }
    }
  }
  // Sorted: one order whichever flow the search started from.
  std::sort(component_flows_.begin(), component_flows_.end());
  std::sort(component_links_.begin(), component_links_.end());
  const size_t n = component_flows_.size();
  for (size_t f = 0; f < n; ++f) slot_[static_cast<size_t>(component_flows_[f])] = f;
  rate_.assign(n, 1.0);
  settled_.assign(n, false);
  tightest_.assign(n, 1.0);
  second_rate_.assign(n, 1.0);
  tightest_link_.assign(n, -1);
  // Every flow at full speed fits on every link: nothing to share.
  for (int32_t l : component_links_) residual_[static_cast<size_t>(l)] = capacity_[static_cast<size_t>(l)];
  for (ActivityId f : component_flows_) {
    for (const auto& [l, demand] : flow_[static_cast<size_t>(f)].demands) residual_[static_cast<size_t>(l)] -= demand;
  }
  const bool fits = std::all_of(component_links_.begin(), component_links_.end(),
                                [&](int32_t l) { return residual_[static_cast<size_t>(l)] >= 0; });
  if (!fits) {
    for (int32_t l : component_links_) residual_[static_cast<size_t>(l)] = capacity_[static_cast<size_t>(l)];
    size_t unsettled = n;
    while (unsettled > 0) {
      // Water levels over the unsettled flows at full demand, and each flow's tightest link.
      for (int32_t l : component_links_) level_[static_cast<size_t>(l)] = WaterLevel(l, /*held_elsewhere=*/false);
      RatesFromLevels();
      // A link settles its flows when it is the tightest for each unsettled flow on it; which
      // links qualify is decided on this round's levels before any flow settles (settling at
      // or below the levels only raises the others').
      consistent_.clear();
      for (int32_t l : component_links_) {
        const double level = level_[static_cast<size_t>(l)];
        if (!std::isfinite(level)) continue;  // fits its unsettled flows: holds nobody back
        bool tightest_for_all = true;
        for (const auto& [id, demand] : on_link_[static_cast<size_t>(l)]) {
          const size_t f = slot_[static_cast<size_t>(id)];
          if (!settled_[f] && std::min(1.0, level / demand) > std::min(1.0, tightest_[f]) * (1 + kSameLevel)) {
            tightest_for_all = false;
            break;
          }
        }
        if (tightest_for_all) consistent_.push_back(l);
      }
      const size_t before = unsettled;
      for (size_t f = 0; f < n; ++f) {
        if (!settled_[f] && tightest_[f] >= 1.0) {  // no link holds it back
          Settle(f, 1.0);
          --unsettled;
        }
      }
      for (int32_t l : consistent_) {
        for (const auto& [id, demand] : on_link_[static_cast<size_t>(l)]) {
          const size_t f = slot_[static_cast<size_t>(id)];
          if (settled_[f]) continue;
          Settle(f, tightest_[f]);
          --unsettled;
        }
      }
      if (unsettled == before) {
        // Demands crossing in opposite proportions: no link is the tightest for all its flows.
        SettleCrossing();
        unsettled = 0;
      }
    }
  }
  for (size_t f = 0; f < n; ++f) {
    const ActivityId id = component_flows_[f];
    const double share = rate_[f];
    double& old = share_[static_cast<size_t>(id)];
    if (old == share) continue;
    old = share;
    if (id != skip) changed.push_back(id);
  }
}

}  // namespace shardscope::sim

// Network links: max-min fair sharing by progressive filling (see link_model.h).
#include "shardscope/sim/models/link_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include <fmt/format.h>

#include "shardscope/sim/models/activity_set.h"

namespace shardscope::sim {
namespace {

// Two levels this close (relative) are the same bottleneck: the filling freezes them together.
constexpr double kSameLevel = 1e-12;

}  // namespace

StatusOr<std::unique_ptr<LinkModel>> LinkModel::Create(std::vector<LinkSpec> links, int32_t communicators) {
  std::vector<std::vector<int32_t>> links_of_comm(static_cast<size_t>(std::max(communicators, 0)));
  for (size_t l = 0; l < links.size(); ++l) {
    const LinkSpec& link = links[l];
    if (!(link.bandwidth_bytes_per_s > 0) || !std::isfinite(link.bandwidth_bytes_per_s)) {
      return Status::InvalidInput(fmt::format("link '{}': bandwidth {} B/s must be a positive number",
                                              link.name, link.bandwidth_bytes_per_s));
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
  return std::unique_ptr<LinkModel>(new LinkModel(std::move(links), std::move(links_of_comm)));
}

void LinkModel::OnStart(ActivityId id, const ActivitySet& set, std::vector<ActivityId>& changed) {
  // The new collective is rated first, before anything it slows.
  changed.push_back(id);
  if (share_.size() < set.capacity()) share_.resize(set.capacity(), 1.0);
  share_[static_cast<size_t>(id)] = 1.0;
  const int32_t comm = set[id].communicator;
  if (comm < 0 || static_cast<size_t>(comm) >= links_of_comm_.size() ||
      links_of_comm_[static_cast<size_t>(comm)].empty()) {
    return;  // its own unlimited virtual link
  }
  flows_.push_back(id);
  Solve(set, id, changed);
}

void LinkModel::OnEnd(ActivityId id, const ActivitySet& set, std::vector<ActivityId>& changed) {
  auto it = std::find(flows_.begin(), flows_.end(), id);
  if (it == flows_.end()) return;
  flows_.erase(it);
  Solve(set, id, changed);
}

double LinkModel::Share(ActivityId id, const ActivitySet&, double rate) const {
  const double share = share_[static_cast<size_t>(id)];
  return share == 1.0 ? rate : rate * share;
}

void LinkModel::Solve(const ActivitySet& set, ActivityId skip, std::vector<ActivityId>& changed) {
  const size_t n = flows_.size();
  std::vector<double> demand(n), alloc(n, 0.0);
  std::vector<bool> frozen(n, false);
  for (size_t f = 0; f < n; ++f) {
    const Activity& a = set[flows_[f]];
    demand[f] = a.work > 0 ? static_cast<double>(a.bytes) / a.work : 0.0;  // bytes per ns
    frozen[f] = !(demand[f] > 0);  // moves nothing (or in no time): full speed
  }
  std::vector<double> capacity(links_.size());
  for (size_t l = 0; l < links_.size(); ++l) capacity[l] = links_[l].bandwidth_bytes_per_s / 1e9;
  std::vector<double> used(links_.size()), level(links_.size());
  std::vector<int32_t> unfrozen(links_.size());
  // Progressive filling: raise every unfrozen flow's allocation by the same amount until a flow
  // reaches its demand or a link it crosses is full; freeze those; repeat. Each round freezes
  // at least one flow.
  while (std::find(frozen.begin(), frozen.end(), false) != frozen.end()) {
    std::fill(used.begin(), used.end(), 0.0);
    std::fill(unfrozen.begin(), unfrozen.end(), 0);
    for (size_t f = 0; f < n; ++f) {
      for (int32_t l : links_of_comm_[static_cast<size_t>(set[flows_[f]].communicator)]) {
        used[static_cast<size_t>(l)] += alloc[f];
        if (!frozen[f]) ++unfrozen[static_cast<size_t>(l)];
      }
    }
    double step = std::numeric_limits<double>::infinity();
    for (size_t l = 0; l < links_.size(); ++l) {
      level[l] = unfrozen[l] > 0 ? std::max(0.0, capacity[l] - used[l]) / unfrozen[l]
                                 : std::numeric_limits<double>::infinity();
      step = std::min(step, level[l]);
    }
    for (size_t f = 0; f < n; ++f) {
      if (!frozen[f]) step = std::min(step, demand[f] - alloc[f]);
    }
    const double tolerance = step * kSameLevel;
    for (size_t f = 0; f < n; ++f) {
      if (frozen[f]) continue;
      bool saturated = demand[f] - alloc[f] <= step + tolerance;
      for (int32_t l : links_of_comm_[static_cast<size_t>(set[flows_[f]].communicator)]) {
        if (level[static_cast<size_t>(l)] <= step + tolerance) saturated = true;
      }
      alloc[f] = std::min(demand[f], alloc[f] + step);
      if (saturated) frozen[f] = true;
    }
  }
  for (size_t f = 0; f < n; ++f) {
    const double share = demand[f] > 0 ? std::min(1.0, alloc[f] / demand[f]) : 1.0;
    double& old = share_[static_cast<size_t>(flows_[f])];
    if (old == share) continue;
    old = share;
    if (flows_[f] != skip) changed.push_back(flows_[f]);
  }
}

}  // namespace shardscope::sim

// The diff: builds both sides, matches them, measures them and compares op by op.
//
// Attribution of the step-time difference: each side's critical path is a chain of edges
// whose weights add up to that side's span (diff_critical_path.cc). Every edge is charged
// to the event it enters: the edge into its start is the event's wait, the edge into its
// end its duration on the path. An op's contribution is its measured time on the measured
// path minus its predicted time on the predicted path, summed over its instances on all
// ranks (same op id and occurrence; an unmatched op counts on its side only), so the contributions of all ops add up exactly to the difference of the two
// critical paths. Classes take the duration part by the op's class; the wait part of a host
// op goes to "host gap", of a collective to its collective class (it waits for its peers or
// its proxy), of any other device op to "device wait".
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <tuple>

#include "diff_internal.h"

namespace shardscope::traces {
namespace {

using diff_internal::RankRange;

int64_t RankStepStart(const std::vector<RankMetrics>& ranks, int32_t rank) {
  auto it = std::lower_bound(ranks.begin(), ranks.end(), rank,
                             [](const RankMetrics& m, int32_t r) { return m.rank < r; });
  return it != ranks.end() && it->rank == rank ? it->step_start_ns : 0;
}

OpClass WaitClass(const DiffEvent& e) {
  if (!e.device) return OpClass::kHostGap;
  if (IsCollectiveClass(e.op_class)) return e.op_class;
  return OpClass::kDeviceWait;
}

// Time on the critical path per class.
std::vector<int64_t> PathTimeByClass(const SideAnalysis& side) {
  std::vector<int64_t> by_class(kOpClassCount, 0);
  for (const CriticalPathStep& step : side.critical_path.steps) {
    const DiffEvent& e = side.events[static_cast<size_t>(step.event)];
    by_class[static_cast<size_t>(e.op_class)] += step.dur_ns;
    by_class[static_cast<size_t>(WaitClass(e))] += step.wait_ns;
  }
  return by_class;
}

// Host gap before each host event: start minus the end of the previous slice at the same
// nesting level of its thread (-1 for the first).
std::vector<int64_t> HostGaps(const SideAnalysis& side) {
  std::vector<int64_t> gaps(side.events.size(), -1);
  int32_t track = -1;
  std::vector<std::pair<int32_t, int32_t>> last;  // (parent, event), small: nesting depth
  for (size_t i = 0; i < side.events.size(); ++i) {
    const DiffEvent& e = side.events[i];
    if (e.track != track) {
      track = e.track;
      last.clear();
    }
    if (e.device) continue;
    auto it = std::find_if(last.begin(), last.end(), [&](const auto& p) { return p.first == e.parent; });
    if (it != last.end()) {
      gaps[i] = std::max<int64_t>(0, e.ts_ns - side.events[static_cast<size_t>(it->second)].end_ns());
      it->second = static_cast<int32_t>(i);
    } else {
      last.emplace_back(e.parent, static_cast<int32_t>(i));
    }
  }
  return gaps;
}

ClassStats Summarize(OpClass op_class, std::vector<int64_t>& errors, int64_t contribution) {
  ClassStats stats;
  stats.op_class = op_class;
  stats.count = static_cast<int64_t>(errors.size());
  stats.contribution_ns = contribution;
  if (errors.empty()) return stats;
  for (int64_t e : errors) stats.total_error_ns += e;
  std::sort(errors.begin(), errors.end());
  const size_t n = errors.size();
  // Median: the lower middle for an even count (an observed value, integer ns).
  stats.median_error_ns = errors[(n - 1) / 2];
  std::vector<int64_t> magnitudes;
  magnitudes.reserve(n);
  for (int64_t e : errors) magnitudes.push_back(std::llabs(e));
  std::sort(magnitudes.begin(), magnitudes.end());
  // Nearest-rank 90th percentile: the ceil(0.9 n)-th smallest.
  const size_t rank = (9 * n + 9) / 10;
  stats.p90_abs_error_ns = magnitudes[std::max<size_t>(rank, 1) - 1];
  return stats;
}

// Ops across ranks: every rank's instance of one schedule op (same op id, host or device,
// same occurrence) shares a key; a slice without op id is its own op (with its match).
struct OpKeys {
  std::vector<int32_t> predicted;
  std::vector<int32_t> measured;
  int32_t count = 0;
};

OpKeys AssignOpKeys(const SideAnalysis& p, const SideAnalysis& m) {
  OpKeys keys;
  keys.predicted.assign(p.events.size(), -1);
  keys.measured.assign(m.events.size(), -1);
  struct Instance {
    int32_t rank;
    bool device;
    int64_t op_id;
    int64_t ts;
    int32_t index;
    int32_t occurrence;
  };
  std::vector<Instance> instances;
  for (size_t i = 0; i < p.events.size(); ++i) {
    const DiffEvent& e = p.events[i];
    if (e.op_id >= 0) instances.push_back({e.rank, e.device, e.op_id, e.ts_ns, static_cast<int32_t>(i), 0});
  }
  std::sort(instances.begin(), instances.end(), [](const Instance& a, const Instance& b) {
    return std::tie(a.rank, a.device, a.op_id, a.ts, a.index) < std::tie(b.rank, b.device, b.op_id, b.ts, b.index);
  });
  for (size_t k = 1; k < instances.size(); ++k) {
    const Instance& a = instances[k - 1];
    Instance& b = instances[k];
    if (std::tie(a.rank, a.device, a.op_id) == std::tie(b.rank, b.device, b.op_id)) b.occurrence = a.occurrence + 1;
  }
  std::sort(instances.begin(), instances.end(), [](const Instance& a, const Instance& b) {
    return std::tie(a.device, a.op_id, a.occurrence, a.index) < std::tie(b.device, b.op_id, b.occurrence, b.index);
  });
  for (size_t k = 0; k < instances.size(); ++k) {
    const bool same = k > 0 && std::tie(instances[k - 1].device, instances[k - 1].op_id, instances[k - 1].occurrence) ==
                                   std::tie(instances[k].device, instances[k].op_id, instances[k].occurrence);
    if (!same) ++keys.count;
    keys.predicted[static_cast<size_t>(instances[k].index)] = keys.count - 1;
  }
  for (size_t i = 0; i < p.events.size(); ++i) {
    if (keys.predicted[i] < 0) keys.predicted[i] = keys.count++;
  }
  for (size_t j = 0; j < m.events.size(); ++j) {
    const int32_t match = m.match[j];
    keys.measured[j] = match >= 0 ? keys.predicted[static_cast<size_t>(match)] : keys.count++;
  }
  return keys;
}

}  // namespace

StatusOr<DiffResult> Diff(const DiffSide& predicted, const DiffSide& measured, const DiffOptions& options) {
  DiffResult diff;
  diff_internal::Interner names(diff.names);
  diff_internal::Interner groups(diff.process_groups);
  diff_internal::NameCache cache(names);
  diff_internal::BuildSide(predicted, options.rank, cache, groups, diff.predicted);
  diff_internal::BuildSide(measured, options.rank, cache, groups, diff.measured);
  diff_internal::MatchSides(predicted, measured, diff);

  for (auto [side, analysis] : {std::pair{&predicted, &diff.predicted}, std::pair{&measured, &diff.measured}}) {
    analysis->ranks = diff_internal::ComputeRankMetrics(*side, *analysis, options);
    for (const RankMetrics& m : analysis->ranks) analysis->step_ns = std::max(analysis->step_ns, m.step_ns);
    auto path = diff_internal::ComputeCriticalPath(*analysis, analysis->on_path_ns);
    if (!path.ok()) return path.status().WithContext(side->source);
    analysis->critical_path = std::move(path).value();
  }

  const SideAnalysis& p = diff.predicted;
  const SideAnalysis& m = diff.measured;
  // Per matched pair.
  std::vector<std::vector<int64_t>> class_errors(kOpClassCount);
  const std::vector<int64_t> p_gaps = HostGaps(p);
  const std::vector<int64_t> m_gaps = HostGaps(m);
  std::vector<double> relative;
  for (size_t i = 0; i < p.events.size(); ++i) {
    const int32_t j = p.match[i];
    if (j < 0) continue;
    const DiffEvent& pe = p.events[i];
    const DiffEvent& me = m.events[static_cast<size_t>(j)];
    OpError error;
    error.predicted = static_cast<int32_t>(i);
    error.measured = j;
    error.op_class = pe.op_class;
    error.duration_error_ns = me.dur_ns - pe.dur_ns;
    error.start_shift_ns =
        (me.ts_ns - RankStepStart(m.ranks, me.rank)) - (pe.ts_ns - RankStepStart(p.ranks, pe.rank));
    class_errors[static_cast<size_t>(pe.op_class)].push_back(error.duration_error_ns);
    if (!pe.device && p_gaps[i] >= 0 && m_gaps[static_cast<size_t>(j)] >= 0) {
      class_errors[static_cast<size_t>(OpClass::kHostGap)].push_back(m_gaps[static_cast<size_t>(j)] - p_gaps[i]);
    }
    diff.errors.push_back(error);
    if (pe.device && pe.dur_ns > 0) {
      relative.push_back(std::abs(static_cast<double>(error.duration_error_ns)) / static_cast<double>(pe.dur_ns));
    }
  }
  if (!relative.empty()) {
    std::sort(relative.begin(), relative.end());
    const size_t n = relative.size();
    diff.device_relative.count = static_cast<int64_t>(n);
    // The lower middle and the nearest-rank 90th percentile, as for the classes.
    diff.device_relative.median = relative[(n - 1) / 2];
    diff.device_relative.p90 = relative[std::max<size_t>((9 * n + 9) / 10, 1) - 1];
  }
  // Per class.
  const std::vector<int64_t> p_path = PathTimeByClass(p);
  const std::vector<int64_t> m_path = PathTimeByClass(m);
  for (int c = 0; c < kOpClassCount; ++c) {
    const auto index = static_cast<size_t>(c);
    const int64_t contribution = m_path[index] - p_path[index];
    if (class_errors[index].empty() && contribution == 0 && p_path[index] == 0 && m_path[index] == 0) continue;
    diff.classes.push_back(Summarize(static_cast<OpClass>(c), class_errors[index], contribution));
  }
  // Contributions per op, all ranks together: the paths of the two sides may run through
  // different ranks (a straggler), so an op's time on the path is compared whatever rank
  // carries it.
  const OpKeys keys = AssignOpKeys(p, m);
  std::vector<int64_t> contribution(static_cast<size_t>(keys.count), 0);
  for (size_t i = 0; i < p.events.size(); ++i) contribution[static_cast<size_t>(keys.predicted[i])] -= p.on_path_ns[i];
  for (size_t j = 0; j < m.events.size(); ++j) contribution[static_cast<size_t>(keys.measured[j])] += m.on_path_ns[j];
  for (OpError& e : diff.errors) e.contribution_ns = contribution[static_cast<size_t>(keys.predicted[static_cast<size_t>(e.predicted)])];
  // One representative per op: its instance on the measured path (else the predicted path)
  // with the most time there; for an op off both paths, the pair with the largest error.
  std::vector<OpError> representative(static_cast<size_t>(keys.count));
  std::vector<int64_t> best(static_cast<size_t>(keys.count), -1);
  const auto consider = [&](int32_t key, const OpError& candidate, int64_t score) {
    if (score > best[static_cast<size_t>(key)]) {
      best[static_cast<size_t>(key)] = score;
      representative[static_cast<size_t>(key)] = candidate;
    }
  };
  constexpr int64_t kOnMeasuredPath = int64_t{1} << 61;
  constexpr int64_t kOnPredictedPath = int64_t{1} << 60;
  for (const OpError& e : diff.errors) {
    const int64_t on_m = m.on_path_ns[static_cast<size_t>(e.measured)];
    const int64_t on_p = p.on_path_ns[static_cast<size_t>(e.predicted)];
    const int64_t score = on_m > 0 ? kOnMeasuredPath + on_m : on_p > 0 ? kOnPredictedPath + on_p : std::llabs(e.duration_error_ns);
    consider(keys.predicted[static_cast<size_t>(e.predicted)], e, score);
  }
  for (size_t i = 0; i < p.events.size(); ++i) {
    if (p.match[i] < 0) {
      consider(keys.predicted[i], {static_cast<int32_t>(i), -1, p.events[i].op_class, 0, 0, 0}, p.on_path_ns[i]);
    }
  }
  for (size_t j = 0; j < m.events.size(); ++j) {
    if (m.match[j] < 0) {
      consider(keys.measured[j], {-1, static_cast<int32_t>(j), m.events[j].op_class, 0, 0, 0}, m.on_path_ns[j]);
    }
  }
  std::vector<OpError> candidates;
  for (int32_t k = 0; k < keys.count; ++k) {
    OpError e = representative[static_cast<size_t>(k)];
    if (best[static_cast<size_t>(k)] < 0) continue;
    e.contribution_ns = contribution[static_cast<size_t>(k)];
    if (e.contribution_ns != 0 || e.duration_error_ns != 0) candidates.push_back(e);
  }
  const auto order = [](const OpError& a, const OpError& b) {
    if (std::llabs(a.contribution_ns) != std::llabs(b.contribution_ns)) {
      return std::llabs(a.contribution_ns) > std::llabs(b.contribution_ns);
    }
    if (std::llabs(a.duration_error_ns) != std::llabs(b.duration_error_ns)) {
      return std::llabs(a.duration_error_ns) > std::llabs(b.duration_error_ns);
    }
    return std::pair(a.predicted, a.measured) < std::pair(b.predicted, b.measured);
  };
  const size_t top = std::min(candidates.size(), static_cast<size_t>(std::max(0, options.top_n)));
  std::partial_sort(candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(top), candidates.end(), order);
  candidates.resize(top);
  diff.top = std::move(candidates);
  // Where the critical paths part: the first step whose ops differ (whatever their ranks).
  const auto& ps = p.critical_path.steps;
  const auto& ms = m.critical_path.steps;
  const size_t common = std::min(ps.size(), ms.size());
  size_t k = 0;
  while (k < common && keys.predicted[static_cast<size_t>(ps[k].event)] == keys.measured[static_cast<size_t>(ms[k].event)]) {
    ++k;
  }
  if (k < ps.size() || k < ms.size()) {
    diff.divergence.diverged = true;
    diff.divergence.index = static_cast<int64_t>(k);
    diff.divergence.last_common_predicted = k > 0 ? ps[k - 1].event : -1;
    diff.divergence.predicted = k < ps.size() ? ps[k].event : -1;
    diff.divergence.measured = k < ms.size() ? ms[k].event : -1;
  }
  return diff;
}

}  // namespace shardscope::traces

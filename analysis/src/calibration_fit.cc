// Calibration of the cost models from measured timelines: see calibration_fit.h for what is
// fitted and how; docs/CALIBRATION.md for the profile format and the workflow.
//
// The fit runs in dependency order: memory bandwidth first (the GEMM and attention fits
// need it to tell compute-bound kernels from memory-bound ones), then GEMM and attention
// efficiencies, collectives, the launch cost, and last the contention factors, whose clean
// durations come from a provider built on everything fitted before.
#include "shardscope/analysis/calibration_fit.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <tuple>
#include <type_traits>
#include <unistd.h>
#include <unordered_map>
#include <utility>

#include "shardscope/sim/report/report.h"

namespace shardscope::sim {
namespace {

using traces::AttentionDesc;
using traces::CollectiveOp;
using traces::CollectiveType;
using traces::DType;
using traces::GemmDesc;
using traces::KernelOp;
using traces::MemoryBoundDesc;

constexpr double kNsPerSecond = 1e9;
// A kernel within this fraction of its memory-roofline time or of the kernel floor is not
// compute-bound: its duration says nothing about its FLOP efficiency (nor, at the floor,
// about bandwidth). 2% leaves room for ns rounding and measurement noise.
constexpr double kBoundMargin = 1.02;
// Alpha and beta are fitted apart only when a bucket's sizes span at least this ratio: with
// sizes a few percent apart (padding differences) the two are not separable, and the least-
// squares system is singular in all but name.
constexpr double kMinSizeSpread = 1.2;
// A trace belongs to the schedule when at least this share of its slices that carry an op id
// join an op of the same kind (a kernel slice to a kernel or collective, a copy to a memcpy).
// shardscope's own traces of the schedule join all of them; op ids are small integers, so a
// trace of another schedule joins some by accident, with the wrong kinds.
constexpr double kMinJoinedShare = 0.9;
// Plausibility bounds on fitted figures (CalibrationFit::warnings). A fitted FLOP efficiency
// above 1 beats the tensor cores' peak; memory-bound kernels stream (read + written) at no
// more than the datasheet HBM bandwidth and, on every GPU this project has a copy measurement
// for, at more than half of it, so a quarter is "far below"; a CUDA launch costs a few
// microseconds of host time (compute_model.h), so 100 us means the host was not launching.
constexpr double kMaxPlausibleEfficiency = 1.0;
constexpr double kMaxPlausibleBandwidthShare = 1.05;  // 5% for clock and counting slack
constexpr double kMinPlausibleBandwidthShare = 0.25;
constexpr double kMaxPlausibleLaunchNs = 100e3;

// Least squares on relative errors for a model predicted_i = u_i * x against measured d_i:
// minimises sum (u_i x / d_i - 1)^2 with a_i = u_i / d_i, giving x = sum a / sum a^2.
struct RatioFit {
  std::vector<double> a;
  void Add(double u, double d) {
    if (u > 0 && d > 0) a.push_back(u / d);
  }
  bool Empty() const { return a.empty(); }
  double X() const {
    double sa = 0, saa = 0;
    for (double v : a) {
      sa += v;
      saa += v * v;
    }
    return saa > 0 ? sa / saa : 0;
  }
  FitQuality Quality(double x) const {
    FitQuality q;
    q.points = static_cast<int64_t>(a.size());
    double sum = 0;
    for (double v : a) sum += (v * x - 1) * (v * x - 1);
    q.rms_relative_error = a.empty() ? 0 : std::sqrt(sum / static_cast<double>(a.size()));
    return q;
  }
};

FitQuality RelativeQuality(const std::vector<std::pair<double, double>>& predicted_measured) {
  FitQuality q;
  q.points = static_cast<int64_t>(predicted_measured.size());
  double sum = 0;
  for (const auto& [p, m] : predicted_measured) {
    const double r = m != 0 ? (p - m) / m : 0;
    sum += r * r;
  }
  q.rms_relative_error = q.points > 0 ? std::sqrt(sum / static_cast<double>(q.points)) : 0;
  return q;
}

struct Interval {
  int64_t start = 0, end = 0;
};

// Sorted, disjoint union of intervals.
std::vector<Interval> Union(std::vector<Interval> v) {
  std::sort(v.begin(), v.end(), [](const Interval& a, const Interval& b) { return a.start < b.start; });
  std::vector<Interval> out;
  for (const Interval& i : v) {
    if (i.end <= i.start) continue;
    if (!out.empty() && i.start <= out.back().end) {
      out.back().end = std::max(out.back().end, i.end);
    } else {
      out.push_back(i);
    }
  }
  return out;
}

// Length of [s, e) covered by a sorted disjoint union.
int64_t Covered(const std::vector<Interval>& u, int64_t s, int64_t e) {
  auto it = std::lower_bound(u.begin(), u.end(), s, [](const Interval& i, int64_t t) { return i.end <= t; });
  int64_t total = 0;
  for (; it != u.end() && it->start < e; ++it) total += std::max<int64_t>(0, std::min(e, it->end) - std::max(s, it->start));
  return total;
}

// A device slice joined to its schedule op.
struct DeviceRun {
  int32_t rank = 0;
  int64_t start = 0, end = 0;
  const traces::Op* op = nullptr;
};

struct KernelPoint {
  DeviceRun run;
  bool overlaps_compute = false;
  int64_t comm_overlap_ns = 0;
};

// One collective as all its traced members ran it.
struct CollectiveInstance {
  CollectiveType type = CollectiveType::kAllReduce;
  int64_t bytes = 0;
  int32_t communicator = 0;
  int64_t last_start = 0, last_end = 0;
  std::vector<int32_t> members;  // traced ranks
  int64_t compute_overlap_ns = 0;
  int64_t Duration() const { return last_end - last_start; }
};

using CollectiveKey = std::tuple<CollectiveType, int32_t, int32_t>;  // type, group size, decade

std::string DTypeText(DType d) { return std::string(traces::DTypeName(d)); }

}  // namespace


// ---- Fitting

namespace {

// Whether a device slice (tid >= 1) can have been launched by `op`: a kernel slice by a
// kernel or a collective, a copy by a memcpy. Other categories (annotations) are not checked.
bool SliceKindMatches(const traces::Slice& slice, const traces::Op& op) {
  switch (slice.category) {
    case traces::Category::kKernel:
      return std::holds_alternative<KernelOp>(op.payload) || std::holds_alternative<CollectiveOp>(op.payload);
    case traces::Category::kGpuMemcpy:
      return std::holds_alternative<traces::MemcpyOp>(op.payload);
    default:
      return true;
  }
}

// Flags fitted figures no run of `gpu` can produce (the bounds are at the top of the file):
// a trace from another GPU, from the host backend's scaled busy-waits, or with a clock error.
void AddPlausibilityWarnings(const GpuSpec& gpu, CalibrationFit& fit) {
  const CalibrationProfile& p = fit.profile;
  for (const GemmCalibration& g : p.gemm) {
    if (g.efficiency > kMaxPlausibleEfficiency) {
      fit.warnings.push_back(fmt::format("GEMM {} 1e{} FLOPs: efficiency {:.3g} is above {}'s peak {} FLOP/s",
                                         DTypeText(g.dtype), g.flops_decade, g.efficiency, gpu.name,
                                         PeakFlops(gpu, g.dtype)));
    }
  }
  for (const AttentionCalibration& a : p.attention) {
    if (a.efficiency > kMaxPlausibleEfficiency) {
      fit.warnings.push_back(fmt::format("attention {} {}: efficiency {:.3g} is above {}'s peak", DTypeText(a.dtype),
                                         a.backward ? "backward" : "forward", a.efficiency, gpu.name));
    }
  }
  if (p.memory_bandwidth && gpu.hbm_bandwidth > 0) {
    const double share = p.memory_bandwidth->value / gpu.hbm_bandwidth;
    if (share > kMaxPlausibleBandwidthShare || share < kMinPlausibleBandwidthShare) {
      fit.warnings.push_back(fmt::format("memory bandwidth {:.3g} GB/s is {:.2f}x {}'s datasheet {:.3g} GB/s",
                                         p.memory_bandwidth->value * 1e-9, share, gpu.name,
                                         gpu.hbm_bandwidth * 1e-9));
    }
  }
  if (p.launch_overhead_ns && p.launch_overhead_ns->value > kMaxPlausibleLaunchNs) {
    fit.warnings.push_back(fmt::format("launch cost {:.0f} ns per launch: a CUDA launch takes a few microseconds",
                                       p.launch_overhead_ns->value));
  }
}

}  // namespace

StatusOr<CalibrationFit> FitCalibration(const traces::Schedule& schedule, const ClusterSpec& cluster,
                                        const std::vector<const traces::Timeline*>& measured,
                                        const std::vector<std::string>& names) {
  CalibrationFit out;
  CalibrationProfile& profile = out.profile;
  profile.gpu = cluster.gpu.name;
  const ComputeModel model(cluster.gpu);
  const ClusterCostProvider base(schedule, cluster);
  const int64_t floor_ns = model.KernelFloorNs();

  // Op id -> op, per program.
  std::vector<std::unordered_map<int64_t, const traces::Op*>> ops_by_id(schedule.programs.size());
  for (size_t p = 0; p < schedule.programs.size(); ++p) {
    for (const traces::Op& op : schedule.programs[p].ops) ops_by_id[p].emplace(op.id, &op);
  }

  std::vector<KernelPoint> kernels;
  std::vector<CollectiveInstance> collectives;
  std::vector<double> launches;
  for (size_t ti = 0; ti < measured.size(); ++ti) {
    const traces::Timeline& timeline = *measured[ti];
    const std::string name = ti < names.size() ? names[ti] : fmt::format("measured trace #{}", ti + 1);
    if (timeline.info.world_size != schedule.world_size()) {
      return Status::InvalidInput(fmt::format(
          "{}: distributedInfo.world_size is {}, the schedule has {} ranks: this trace is not a run of it", name,
          timeline.info.world_size, schedule.world_size()));
    }
    int64_t with_id = 0, joined_here = 0;
    std::map<int32_t, std::vector<size_t>> kernels_of_rank;  // rank -> indices into kernels
    std::map<int32_t, std::vector<Interval>> comm_of_rank;
    std::map<std::pair<int32_t, int64_t>, size_t> instance_of;  // (communicator, seq) -> index
    const size_t first_instance = collectives.size();
    for (const traces::Slice& s : timeline.slices) {
      if (s.op_id < 0) continue;
      ++with_id;
      if (s.pid < 0 || s.pid >= schedule.world_size()) {
        ++out.unmatched_slices;
        continue;
      }
      const traces::RankBinding& binding = schedule.ranks[static_cast<size_t>(s.pid)];
      const auto& index = ops_by_id[static_cast<size_t>(binding.program)];
      auto found = index.find(s.op_id);
      if (found == index.end() || (s.tid != 0 && !SliceKindMatches(s, *found->second))) {
        ++out.unmatched_slices;
        continue;
      }
      ++out.joined_slices;
      ++joined_here;
      const traces::Op& op = *found->second;
      if (s.tid == 0) {
        const bool launch = std::holds_alternative<KernelOp>(op.payload) ||
                            std::holds_alternative<CollectiveOp>(op.payload) ||
                            std::holds_alternative<traces::MemcpyOp>(op.payload);
        if (launch && s.category == traces::Category::kCudaRuntime && s.dur_ns > 0) {
          launches.push_back(static_cast<double>(s.dur_ns));
        }
        continue;
      }
      const DeviceRun run{s.pid, s.ts_ns, s.ts_ns + s.dur_ns, &op};
      if (std::holds_alternative<KernelOp>(op.payload)) {
        kernels_of_rank[s.pid].push_back(kernels.size());
        kernels.push_back(KernelPoint{run, false, 0});
      } else if (const auto* coll = std::get_if<CollectiveOp>(&op.payload)) {
        comm_of_rank[s.pid].push_back(Interval{run.start, run.end});
        if (!s.collective || s.collective->seq < 0) continue;
        const auto slot = static_cast<size_t>(coll->comm);
        if (slot >= binding.comm_binding.size()) continue;
        const int32_t communicator = binding.comm_binding[slot];
        auto [it, inserted] = instance_of.try_emplace({communicator, s.collective->seq}, collectives.size());
        if (inserted) {
          CollectiveInstance c;
          c.type = coll->type;
          c.bytes = coll->bytes;
          c.communicator = communicator;
          c.last_start = run.start;
          c.last_end = run.end;
          collectives.push_back(c);
        }
        CollectiveInstance& c = collectives[it->second];
        c.last_start = std::max(c.last_start, run.start);
        c.last_end = std::max(c.last_end, run.end);
        c.members.push_back(s.pid);
      }
    }
    if (with_id > 0 && static_cast<double>(joined_here) < kMinJoinedShare * static_cast<double>(with_id)) {
      return Status::InvalidInput(fmt::format(
          "{}: only {} of {} slices with op ids ({:.0f}%) join an op of the same kind in the schedule (at least "
          "{:.0f}% expected): this trace is a run of another schedule",
          name, joined_here, with_id, 100.0 * static_cast<double>(joined_here) / static_cast<double>(with_id),
          100 * kMinJoinedShare));
    }
    // Overlaps within this timeline.
    std::map<int32_t, std::vector<Interval>> compute_union;
    for (auto& [rank, indices] : kernels_of_rank) {
      std::sort(indices.begin(), indices.end(), [&](size_t a, size_t b) {
        return std::tie(kernels[a].run.start, kernels[a].run.end) < std::tie(kernels[b].run.start, kernels[b].run.end);
      });
      int64_t max_end = std::numeric_limits<int64_t>::min();
      std::vector<Interval> spans;
      const std::vector<Interval> comm = Union(comm_of_rank[rank]);
      for (size_t i = 0; i < indices.size(); ++i) {
        KernelPoint& k = kernels[indices[i]];
        const bool prev = max_end > k.run.start;
        const bool next = i + 1 < indices.size() && kernels[indices[i + 1]].run.start < k.run.end;
        k.overlaps_compute = prev || next;
        max_end = std::max(max_end, k.run.end);
        k.comm_overlap_ns = Covered(comm, k.run.start, k.run.end);
        spans.push_back(Interval{k.run.start, k.run.end});
      }
      compute_union[rank] = Union(std::move(spans));
    }
    for (size_t i = first_instance; i < collectives.size(); ++i) {
      CollectiveInstance& c = collectives[i];
      std::vector<Interval> pieces;
      for (int32_t member : c.members) {
        auto it = compute_union.find(member);
        if (it == compute_union.end()) continue;
        for (const Interval& iv : it->second) {
          const int64_t s = std::max(iv.start, c.last_start), e = std::min(iv.end, c.last_end);
          if (e > s) pieces.push_back(Interval{s, e});
        }
      }
      for (const Interval& iv : Union(std::move(pieces))) c.compute_overlap_ns += iv.end - iv.start;
    }
  }
  if (out.joined_slices == 0) {
    return Status::InvalidInput(
        "calibrate: no measured slice joins an op of the schedule (the traces need op ids: \"op id\" args, as "
        "`shardscope simulate` and `shardscope run` write them, of this very schedule)");
  }

  // 1. Memory-bound bandwidth.
  {
    RatioFit fit;  // predicted = bytes * x, x = ns per byte
    for (const KernelPoint& k : kernels) {
      if (k.overlaps_compute || k.comm_overlap_ns > 0) continue;
      const auto& desc = std::get<KernelOp>(k.run.op->payload).compute;
      const auto* mem = std::get_if<MemoryBoundDesc>(&desc);
      const double d = static_cast<double>(k.run.end - k.run.start);
      if (mem == nullptr || d <= kBoundMargin * static_cast<double>(floor_ns)) continue;
      // The model: floor + bytes / bandwidth (compute_model.h).
      fit.Add(KernelBytes(desc), d - static_cast<double>(floor_ns));
    }
    if (!fit.Empty()) {
      const double x = fit.X();
      profile.memory_bandwidth = FittedValue{kNsPerSecond / x, fit.Quality(x)};
    }
  }
  const double bandwidth = profile.memory_bandwidth ? profile.memory_bandwidth->value
                                                    : model.CopyBandwidth();

  // 2. GEMM and attention efficiencies.
  {
    std::map<std::pair<DType, int32_t>, RatioFit> gemm;
    std::map<std::pair<DType, bool>, RatioFit> attention;
    int64_t not_compute_bound = 0, overlapped = 0;
    for (const KernelPoint& k : kernels) {
      const auto& desc = std::get<KernelOp>(k.run.op->payload).compute;
      const auto* g = std::get_if<GemmDesc>(&desc);
      const auto* a = std::get_if<AttentionDesc>(&desc);
      if (g == nullptr && a == nullptr) continue;
      if (k.overlaps_compute || k.comm_overlap_ns > 0) {
        ++overlapped;
        continue;
      }
      const double d = static_cast<double>(k.run.end - k.run.start);
      const double memory_ns = KernelBytes(desc) / bandwidth * kNsPerSecond;
      if (d <= kBoundMargin * memory_ns || d <= kBoundMargin * static_cast<double>(floor_ns)) {
        ++not_compute_bound;
        continue;
      }
      const DType dtype = g != nullptr ? g->dtype : a->dtype;
      const double peak = model.EffectivePeakFlops(dtype);
      if (!(peak > 0)) continue;
      // predicted = flops / (peak x efficiency) = (flops / peak) x (1 / efficiency)
      const double flops = KernelFlops(desc);
      const double u = flops / peak * kNsPerSecond;
      if (g != nullptr) {
        gemm[{dtype, CalibrationDecade(flops)}].Add(u, d);
      } else {
        attention[{dtype, a->backward}].Add(u, d);
      }
    }
    for (const auto& [key, fit] : gemm) {
      const double x = fit.X();
      if (x > 0) profile.gemm.push_back(GemmCalibration{key.first, key.second, 1 / x, fit.Quality(x)});
    }
    for (const auto& [key, fit] : attention) {
      const double x = fit.X();
      if (x > 0) profile.attention.push_back(AttentionCalibration{key.first, key.second, 1 / x, fit.Quality(x)});
    }
    if (not_compute_bound > 0) {
      out.notes.push_back(fmt::format("{} GEMM/attention kernel(s) at the memory roofline or the kernel floor: not "
                                      "used for efficiencies",
                                      not_compute_bound));
    }
    if (overlapped > 0) {
      out.notes.push_back(fmt::format("{} GEMM/attention kernel(s) overlapped other kernels or collectives: used only "
                                      "for the contention fit",
                                      overlapped));
    }
  }

  // 3. Collectives, jointly with the communication slowdown. Each instance i of bucket k gives
  //   alpha_k + bytes_i x x_k - c x over_i = t_i - over_i        (x = 1 / beta, c = 1 / (1 + s))
  // (the collective's work at full speed equals its time outside compute plus c times its
  // time under compute). One linear least-squares problem over every bucket's parameters and
  // the shared c; c only when some instance overlapped compute.
  {
    struct Point {
      double bytes, t, over;
    };
    struct Bucket {
      std::vector<Point> points;
      int32_t communicator = 0;  // of the first point (the base model's choice for it)
      CollectiveCalibration row;
      int alpha_param = -1, x_param = -1;  // indices into the unknowns, -1 = fixed
      double fixed_alpha = 0, fixed_x = 0;
    };
    std::map<CollectiveKey, Bucket> buckets;
    bool any_overlap = false;
    for (const CollectiveInstance& c : collectives) {
      if (c.Duration() <= 0 || c.bytes <= 0) continue;
      const auto size = static_cast<int32_t>(schedule.communicators[static_cast<size_t>(c.communicator)].ranks.size());
      const double bytes = static_cast<double>(c.bytes);
      auto [it, inserted] = buckets.try_emplace({c.type, size, CalibrationDecade(bytes)});
      if (inserted) it->second.communicator = c.communicator;
      it->second.points.push_back(Point{bytes, static_cast<double>(c.Duration()), static_cast<double>(c.compute_overlap_ns)});
      any_overlap = any_overlap || c.compute_overlap_ns > 0;
    }
    int unknowns = 0;
    int c_param = -1;
    std::vector<double> theta;
    const auto solve = [&]() -> bool {
      unknowns = 0;
      for (auto& [key, bucket] : buckets) {
        const auto& [type, size, decade] = key;
        bucket.row.type = type;
        bucket.row.group_size = size;
        bucket.row.bytes_decade = decade;
        std::set<double> sizes;
        for (const Point& p : bucket.points) sizes.insert(p.bytes);
        if (*sizes.rbegin() >= kMinSizeSpread * *sizes.begin()) {
          bucket.row.method = CollectiveFitMethod::kAlphaBeta;
          bucket.alpha_param = unknowns++;
          bucket.x_param = unknowns++;
          continue;
        }
        // One size (or sizes too close): alpha and beta cannot be told apart; the base model's term that dominates
        // at this size is fitted, the other kept.
        const CollectiveCost cost = base.Collective(type, static_cast<int64_t>(*sizes.begin()), bucket.communicator);
        bucket.fixed_alpha = cost.latency_us * 1e3;
        bucket.fixed_x = cost.algo_bandwidth > 0 ? kNsPerSecond / cost.algo_bandwidth : 0;
        if (bucket.fixed_alpha >= *sizes.begin() * bucket.fixed_x) {
          bucket.row.method = CollectiveFitMethod::kAlphaOnly;
          bucket.alpha_param = unknowns++;
        } else {
          bucket.row.method = CollectiveFitMethod::kBetaOnly;
          bucket.x_param = unknowns++;
        }
      }
      c_param = any_overlap ? unknowns++ : -1;
      // Normal equations (A^T A) theta = A^T y, solved by Gaussian elimination with pivoting.
      const auto n = static_cast<size_t>(unknowns);
      std::vector<std::vector<double>> ata(n, std::vector<double>(n + 1, 0));
      for (const auto& [key, bucket] : buckets) {
        for (const Point& p : bucket.points) {
          std::vector<std::pair<int, double>> row;  // (unknown, coefficient)
          double y = p.t - p.over;
          if (bucket.alpha_param >= 0) row.emplace_back(bucket.alpha_param, 1.0); else y -= bucket.fixed_alpha;
          if (bucket.x_param >= 0) row.emplace_back(bucket.x_param, p.bytes); else y -= p.bytes * bucket.fixed_x;
          if (c_param >= 0 && p.over > 0) row.emplace_back(c_param, -p.over);
          for (const auto& [i, ai] : row) {
            for (const auto& [j, aj] : row) ata[static_cast<size_t>(i)][static_cast<size_t>(j)] += ai * aj;
            ata[static_cast<size_t>(i)][n] += ai * y;
          }
        }
      }
      theta.assign(n, 0);
      bool solved = n > 0;
      if (!solved) return false;
      for (size_t col = 0; col < n && solved; ++col) {
        size_t pivot = col;
        for (size_t r = col + 1; r < n; ++r) {
          if (std::abs(ata[r][col]) > std::abs(ata[pivot][col])) pivot = r;
        }
        // Relative to the column's scale: bytes^2 and 1 differ by ~20 orders of magnitude.
        double scale = 0;
        for (size_t r = 0; r < n; ++r) scale = std::max(scale, std::abs(ata[r][col]));
        if (!(std::abs(ata[pivot][col]) > 1e-12 * scale) || scale == 0) {
          solved = false;
          break;
        }
        std::swap(ata[col], ata[pivot]);
        for (size_t r = 0; r < n; ++r) {
          if (r == col) continue;
          const double f = ata[r][col] / ata[col][col];
          for (size_t k = col; k <= n; ++k) ata[r][k] -= f * ata[col][k];
        }
      }
      if (solved) {
        for (size_t i = 0; i < n; ++i) theta[i] = ata[i][n] / ata[i][i];
      }
      return solved;
    };
    bool solved = solve();
    if (!solved && any_overlap) {
      // Overlaps that do not pin c down (one size, one overlap pattern): without them.
      out.notes.push_back("collectives: the overlapped instances do not determine the comm slowdown; fitted on "
                          "the clean ones only");
      for (auto it = buckets.begin(); it != buckets.end();) {
        auto& points = it->second.points;
        points.erase(std::remove_if(points.begin(), points.end(), [](const Point& p) { return p.over > 0; }),
                     points.end());
        it = points.empty() ? buckets.erase(it) : std::next(it);
      }
      any_overlap = false;
      for (auto& [key, bucket] : buckets) bucket.alpha_param = bucket.x_param = -1;
      solved = solve();
    }
    if (!solved && !buckets.empty()) {
      out.notes.push_back("collectives: the least-squares system is singular; collectives are left to the NCCL model");
    }
    const double c = c_param >= 0 && solved ? theta[static_cast<size_t>(c_param)] : 1.0;
    const bool c_valid = c > 0 && c <= 1;
    if (solved && c_param >= 0 && !c_valid) {
      out.notes.push_back(fmt::format("collectives: the fitted comm slowdown factor 1/c - 1 with c = {} is not >= 0; "
                                      "not kept",
                                      c));
    }
    std::vector<std::pair<double, double>> overlapped_pm;  // for the slowdown's residual
    for (auto& [key, bucket] : buckets) {
      if (!solved) break;
      CollectiveCalibration& row = bucket.row;
      row.alpha_ns = bucket.alpha_param >= 0 ? theta[static_cast<size_t>(bucket.alpha_param)] : bucket.fixed_alpha;
      const double x = bucket.x_param >= 0 ? theta[static_cast<size_t>(bucket.x_param)] : bucket.fixed_x;
      if (!(x > 0) || row.alpha_ns < 0) {
        out.notes.push_back(fmt::format("{} on {} rank(s), 1e{} bytes: fitted alpha {:.0f} ns, 1/beta {} ns/B are not "
                                        "physical; left to the NCCL model",
                                        traces::CollectiveTypeName(row.type), row.group_size, row.bytes_decade,
                                        row.alpha_ns, x));
        continue;
      }
      row.beta_bytes_per_s = kNsPerSecond / x;
      std::vector<std::pair<double, double>> pm;
      for (const Point& p : bucket.points) {
        const double work = p.t - p.over + (c_valid ? c : 1.0) * p.over;  // measured work at full speed
        pm.emplace_back(row.alpha_ns + p.bytes * x, work);
        if (p.over > 0) overlapped_pm.emplace_back(p.t - p.over + (c_valid ? c : 1.0) * p.over, row.alpha_ns + p.bytes * x);
      }
      row.fit = RelativeQuality(pm);
      profile.collectives.push_back(row);
    }
    if (solved && c_param >= 0 && c_valid) profile.comm_slowdown = FittedValue{1 / c - 1, RelativeQuality(overlapped_pm)};
  }

  // 4. Host launch cost: the median (robust to a launch that hit a full queue or a page fault).
  if (!launches.empty()) {
    std::vector<double> sorted = launches;
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    const double median = n % 2 == 1 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
    std::vector<std::pair<double, double>> pm;
    for (double d : launches) pm.emplace_back(median, d);
    profile.launch_overhead_ns = FittedValue{median, RelativeQuality(pm)};
  }

  // 5. Compute slowdown, with clean durations from everything fitted so far.
  {
    const CalibratedCostProvider fitted(schedule, cluster, base, profile);
    // W = t_free + c x t_over: least squares for c over (t_over, W - t_free).
    struct Overlapped {
      double work, free, over;
    };
    const auto fit_slowdown = [](const std::vector<Overlapped>& points) -> std::optional<FittedValue> {
      double sxy = 0, sxx = 0;
      for (const Overlapped& p : points) {
        sxy += p.over * (p.work - p.free);
        sxx += p.over * p.over;
      }
      if (!(sxx > 0) || !(sxy > 0)) return std::nullopt;
      const double c = sxy / sxx;
      std::vector<std::pair<double, double>> pm;
      for (const Overlapped& p : points) pm.emplace_back(p.free + c * p.over, p.work);
      // c > 1: the overlapped kernels ran faster than the fitted clean model says (its per-bucket
      // efficiencies average over shapes): no slowdown is measurable, which is 0, not negative.
      return FittedValue{std::max(0.0, 1 / c - 1), RelativeQuality(pm)};
    };
    std::vector<Overlapped> compute_points;
    for (const KernelPoint& k : kernels) {
      if (k.overlaps_compute || k.comm_overlap_ns <= 0) continue;
      // Only kernels whose clean duration the profile knows (else the base model's error
      // would be read as contention).
      const auto& desc = std::get<KernelOp>(k.run.op->payload).compute;
      const bool known =
          std::holds_alternative<traces::FixedDurationDesc>(desc) ||
          (std::holds_alternative<MemoryBoundDesc>(desc) && profile.memory_bandwidth) ||
          (std::holds_alternative<GemmDesc>(desc) &&
           std::any_of(profile.gemm.begin(), profile.gemm.end(), [&](const GemmCalibration& g) {
             return g.dtype == std::get<GemmDesc>(desc).dtype && g.flops_decade == CalibrationDecade(KernelFlops(desc));
           })) ||
          (std::holds_alternative<AttentionDesc>(desc) &&
           std::any_of(profile.attention.begin(), profile.attention.end(), [&](const AttentionCalibration& a) {
             return a.dtype == std::get<AttentionDesc>(desc).dtype && a.backward == std::get<AttentionDesc>(desc).backward;
           }));
      if (!known) continue;
      const double d = static_cast<double>(k.run.end - k.run.start);
      const double work = static_cast<double>(fitted.KernelNs(std::get<KernelOp>(k.run.op->payload).compute));
      const double over = static_cast<double>(k.comm_overlap_ns);
      compute_points.push_back(Overlapped{work, d - over, over});
    }
    profile.compute_slowdown = fit_slowdown(compute_points);
  }
  AddPlausibilityWarnings(cluster.gpu, out);
  return out;
}

// ---- Residual table

std::string CalibrationTableText(const CalibrationProfile& profile, const ClusterSpec& cluster) {
  const ComputeModel model(cluster.gpu);
  std::string text = fmt::format("{:<44} {:>14} {:>14} {:>8} {:>10}\n", "quantity", "fitted", "default", "points",
                                 "rms rel.err");
  const auto row = [&](const std::string& name, const std::string& fitted, const std::string& def, const FitQuality& q) {
    text += fmt::format("{:<44} {:>14} {:>14} {:>8} {:>9.3f}%\n", name, fitted, def, q.points,
                        100 * q.rms_relative_error);
  };
  // The defaults of GEMMs and attention depend on the shape (tile/wave model, measured
  // attention tables): no single default efficiency exists to print beside a bucket.
  for (const GemmCalibration& g : profile.gemm) {
    row(fmt::format("gemm {} 1e{}..1e{} FLOPs efficiency", DTypeText(g.dtype), g.flops_decade, g.flops_decade + 1),
        fmt::format("{:.4f}", g.efficiency), "shape model", g.fit);
  }
  for (const AttentionCalibration& a : profile.attention) {
    row(fmt::format("attention {} {} efficiency", DTypeText(a.dtype), a.backward ? "backward" : "forward"),
        fmt::format("{:.4f}", a.efficiency), "measured table", a.fit);
  }
  if (profile.memory_bandwidth) {
    row("memory-bound bandwidth (GB/s)", fmt::format("{:.1f}", profile.memory_bandwidth->value / 1e9),
        fmt::format("{:.1f}", model.CopyBandwidth() / 1e9), profile.memory_bandwidth->fit);
  }
  for (const CollectiveCalibration& c : profile.collectives) {
    const std::string name = fmt::format("{} x{} 1e{} B", traces::CollectiveTypeName(c.type), c.group_size, c.bytes_decade);
    row(name + " alpha (us)", fmt::format("{:.2f}", c.alpha_ns / 1e3),
        c.method == CollectiveFitMethod::kBetaOnly ? "(kept)" : "nccl model", c.fit);
    row(name + " beta algbw (GB/s)", fmt::format("{:.2f}", c.beta_bytes_per_s / 1e9),
        c.method == CollectiveFitMethod::kAlphaOnly ? "(kept)" : "nccl model", c.fit);
  }
  const HostConfig host = DefaultHostConfig();
  const ContentionConfig contention = DefaultContentionConfig();
  if (profile.launch_overhead_ns) {
    row("kernel launch host cost (us)", fmt::format("{:.3f}", profile.launch_overhead_ns->value / 1e3),
        fmt::format("{:.3f}", static_cast<double>(host.launch_overhead_ns) / 1e3), profile.launch_overhead_ns->fit);
  }
  if (profile.compute_slowdown) {
    row("compute slowdown under a collective", fmt::format("{:.4f}", profile.compute_slowdown->value),
        fmt::format("{:.4f}", contention.compute_slowdown), profile.compute_slowdown->fit);
  }
  if (profile.comm_slowdown) {
    row("collective slowdown under compute", fmt::format("{:.4f}", profile.comm_slowdown->value),
        fmt::format("{:.4f}", contention.comm_slowdown), profile.comm_slowdown->fit);
  }
  return text;
}

}  // namespace shardscope::sim

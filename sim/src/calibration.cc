// Calibration of the cost models from measured timelines: see calibration.h for what is
// fitted and how; docs/CALIBRATION.md for the profile format and the workflow.
//
// The fit runs in dependency order: memory bandwidth first (the GEMM and attention fits
// need it to tell compute-bound kernels from memory-bound ones), then GEMM and attention
// efficiencies, collectives, the launch cost, and last the contention factors, whose clean
// durations come from a provider built on everything fitted before.
#include "shardscope/sim/calibration.h"

#include "shardscope/base/file_io.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

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

#include "shardscope/sim/simulation.h"

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
constexpr int kProfileVersion = 1;
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

// floor(log10(x)) for x > 0, exact at powers of ten.
int32_t Decade(double x) {
  if (!(x > 0)) return 0;
  auto d = static_cast<int32_t>(std::floor(std::log10(x)));
  while (std::pow(10.0, d + 1) <= x) ++d;
  while (std::pow(10.0, d) > x) --d;
  return d;
}

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

std::string_view CollectiveFitMethodName(CollectiveFitMethod method) {
  switch (method) {
    case CollectiveFitMethod::kAlphaBeta: return "alpha_beta";
    case CollectiveFitMethod::kAlphaOnly: return "alpha_only";
    case CollectiveFitMethod::kBetaOnly: return "beta_only";
  }
  return "?";
}

namespace {
bool SameFit(const FitQuality& a, const FitQuality& b) {
  return a.points == b.points && a.rms_relative_error == b.rms_relative_error;
}
bool SameValue(const std::optional<FittedValue>& a, const std::optional<FittedValue>& b) {
  if (a.has_value() != b.has_value()) return false;
  return !a || (a->value == b->value && SameFit(a->fit, b->fit));
}
}  // namespace

bool CalibrationProfile::operator==(const CalibrationProfile& o) const {
  if (gpu != o.gpu || gemm.size() != o.gemm.size() || attention.size() != o.attention.size() ||
      collectives.size() != o.collectives.size()) {
    return false;
  }
  for (size_t i = 0; i < gemm.size(); ++i) {
    const auto &a = gemm[i], &b = o.gemm[i];
    if (a.dtype != b.dtype || a.flops_decade != b.flops_decade || a.efficiency != b.efficiency || !SameFit(a.fit, b.fit))
      return false;
  }
  for (size_t i = 0; i < attention.size(); ++i) {
    const auto &a = attention[i], &b = o.attention[i];
    if (a.dtype != b.dtype || a.backward != b.backward || a.efficiency != b.efficiency || !SameFit(a.fit, b.fit))
      return false;
  }
  for (size_t i = 0; i < collectives.size(); ++i) {
    const auto &a = collectives[i], &b = o.collectives[i];
    if (a.type != b.type || a.group_size != b.group_size || a.bytes_decade != b.bytes_decade ||
        a.alpha_ns != b.alpha_ns || a.beta_bytes_per_s != b.beta_bytes_per_s || a.method != b.method ||
        !SameFit(a.fit, b.fit)) {
      return false;
    }
  }
  return SameValue(memory_bandwidth, o.memory_bandwidth) && SameValue(launch_overhead_ns, o.launch_overhead_ns) &&
         SameValue(compute_slowdown, o.compute_slowdown) && SameValue(comm_slowdown, o.comm_slowdown);
}

// ---- CalibratedCostProvider

CalibratedCostProvider::CalibratedCostProvider(const traces::Schedule& schedule, const ClusterSpec& cluster,
                                               const CostProvider& base, CalibrationProfile profile)
    : base_(base), profile_(std::move(profile)), compute_(cluster.gpu) {
  group_sizes_.reserve(schedule.communicators.size());
  for (const traces::Communicator& c : schedule.communicators) {
    group_sizes_.push_back(static_cast<int32_t>(c.ranks.size()));
  }
}

const GemmCalibration* CalibratedCostProvider::FindGemm(DType dtype, double flops) const {
  const int32_t decade = Decade(flops);
  for (const GemmCalibration& g : profile_.gemm) {
    if (g.dtype == dtype && g.flops_decade == decade) return &g;
  }
  return nullptr;
}

const AttentionCalibration* CalibratedCostProvider::FindAttention(DType dtype, bool backward) const {
  for (const AttentionCalibration& a : profile_.attention) {
    if (a.dtype == dtype && a.backward == backward) return &a;
  }
  return nullptr;
}

const CollectiveCalibration* CalibratedCostProvider::FindCollective(CollectiveType type, int32_t group_size,
                                                                    int64_t bytes) const {
  const int32_t decade = Decade(static_cast<double>(bytes));
  for (const CollectiveCalibration& c : profile_.collectives) {
    if (c.type == type && c.group_size == group_size && c.bytes_decade == decade) return &c;
  }
  return nullptr;
}

double CalibratedCostProvider::MemoryBandwidth() const {
  if (profile_.memory_bandwidth) return profile_.memory_bandwidth->value;
  return compute_.CopyBandwidth();
}

int64_t CalibratedCostProvider::KernelNs(const traces::ComputeDesc& desc) const {
  double efficiency = 0;
  DType dtype = DType::kBFloat16;
  const double flops = KernelFlops(desc);
  if (const auto* gemm = std::get_if<GemmDesc>(&desc)) {
    const GemmCalibration* row = FindGemm(gemm->dtype, flops);
    if (row == nullptr) return base_.KernelNs(desc);
    efficiency = row->efficiency;
    dtype = gemm->dtype;
  } else if (const auto* attn = std::get_if<AttentionDesc>(&desc)) {
    const AttentionCalibration* row = FindAttention(attn->dtype, attn->backward);
    if (row == nullptr) return base_.KernelNs(desc);
    efficiency = row->efficiency;
    dtype = attn->dtype;
  } else if (!std::holds_alternative<MemoryBoundDesc>(desc) || !profile_.memory_bandwidth) {
    return base_.KernelNs(desc);  // fixed durations; memory-bound kernels without a fit
  } else {
    // Memory-bound: the floor plus the streaming time at the fitted bandwidth, as the model.
    const double bandwidth = MemoryBandwidth();
    const double stream_ns = bandwidth > 0 ? KernelBytes(desc) / bandwidth * kNsPerSecond : 0;
    return static_cast<int64_t>(std::ceil(static_cast<double>(compute_.KernelFloorNs()) + stream_ns));
  }
  double compute_s = 0;
  if (efficiency > 0 && flops > 0) {
    const double rate = compute_.EffectivePeakFlops(dtype) * efficiency;
    if (rate > 0) compute_s = flops / rate;
  }
  const double bytes = KernelBytes(desc);
  const double bandwidth = MemoryBandwidth();
  const double memory_s = bytes > 0 && bandwidth > 0 ? bytes / bandwidth : 0;
  const double ns = std::max(compute_s, memory_s) * kNsPerSecond;
  return std::max(static_cast<int64_t>(std::ceil(ns)), compute_.KernelFloorNs());
}

int64_t CalibratedCostProvider::MemcpyNs(traces::MemcpyKind kind, int64_t bytes) const {
  return base_.MemcpyNs(kind, bytes);
}

CollectiveCost CalibratedCostProvider::Collective(CollectiveType type, int64_t bytes, int32_t communicator) const {
  CollectiveCost cost = base_.Collective(type, bytes, communicator);
  if (bytes <= 0 || communicator < 0 || static_cast<size_t>(communicator) >= group_sizes_.size()) return cost;
  const CollectiveCalibration* row = FindCollective(type, group_sizes_[static_cast<size_t>(communicator)], bytes);
  if (row == nullptr || !(row->beta_bytes_per_s > 0)) return cost;
  const double ns = row->alpha_ns + static_cast<double>(bytes) / row->beta_bytes_per_s * kNsPerSecond;
  cost.available = true;
  cost.duration_ns = std::max<int64_t>(0, static_cast<int64_t>(std::ceil(ns)));
  cost.latency_us = row->alpha_ns / 1e3;
  cost.algo_bandwidth = row->beta_bytes_per_s;
  return cost;
}

StatusOr<std::unique_ptr<CostProvider>> MakeCalibratedCostProvider(const traces::Schedule& schedule,
                                                                   const ClusterSpec& cluster,
                                                                   const CalibrationProfile& profile) {
  if (!profile.gpu.empty() && profile.gpu != cluster.gpu.name) {
    return Status::InvalidInput(fmt::format(
        "calibration profile: measured on GPU '{}', but the cluster has '{}' (efficiencies are fractions of the "
        "measured GPU's peak; calibrate on the cluster's GPU)",
        profile.gpu, cluster.gpu.name));
  }
  // Owns its base: the provider the engine sees is self-contained.
  class Owning final : public CostProvider {
   public:
    Owning(const traces::Schedule& s, const ClusterSpec& c, const CalibrationProfile& p)
        : base_(s, c), calibrated_(s, c, base_, p) {}
    int64_t KernelNs(const traces::ComputeDesc& d) const override { return calibrated_.KernelNs(d); }
    int64_t MemcpyNs(traces::MemcpyKind k, int64_t b) const override { return calibrated_.MemcpyNs(k, b); }
    CollectiveCost Collective(CollectiveType t, int64_t b, int32_t c) const override {
      return calibrated_.Collective(t, b, c);
    }

   private:
    ClusterCostProvider base_;
    CalibratedCostProvider calibrated_;
  };
  return std::unique_ptr<CostProvider>(std::make_unique<Owning>(schedule, cluster, profile));
}

void ApplyCalibration(const CalibrationProfile& profile, HostConfig& host, ContentionConfig& contention) {
  if (profile.launch_overhead_ns) host.launch_overhead_ns = std::llround(profile.launch_overhead_ns->value);
  if (profile.compute_slowdown) contention.compute_slowdown = profile.compute_slowdown->value;
  if (profile.comm_slowdown) contention.comm_slowdown = profile.comm_slowdown->value;
}

void ApplyCalibration(const CalibrationProfile& profile, EngineConfig& config) {
  if (profile.launch_overhead_ns) config.launch_overhead_ns = std::llround(profile.launch_overhead_ns->value);
  if (profile.compute_slowdown) config.compute_slowdown = profile.compute_slowdown->value;
  if (profile.comm_slowdown) config.comm_slowdown = profile.comm_slowdown->value;
}

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
        gemm[{dtype, Decade(flops)}].Add(u, d);
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
      auto [it, inserted] = buckets.try_emplace({c.type, size, Decade(bytes)});
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
             return g.dtype == std::get<GemmDesc>(desc).dtype && g.flops_decade == Decade(KernelFlops(desc));
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

// ---- YAML

namespace {

// Shortest text that reads back to the same double (fmt's default for doubles).
std::string Num(double v) { return fmt::format("{}", v); }

std::string FitFields(const FitQuality& q) {
  return fmt::format("points: {}, rms_relative_error: {}", q.points, Num(q.rms_relative_error));
}

std::string Value(const FittedValue& v) { return fmt::format("{{value: {}, {}}}", Num(v.value), FitFields(v.fit)); }

}  // namespace

std::string CalibrationProfileYaml(const CalibrationProfile& p) {
  std::string y = "# shardscope calibration profile (docs/CALIBRATION.md); written by `shardscope calibrate`\n";
  y += fmt::format("version: {}\n", kProfileVersion);
  y += fmt::format("gpu: {}\n", p.gpu);
  if (p.launch_overhead_ns) y += fmt::format("launch_overhead_ns: {}\n", Value(*p.launch_overhead_ns));
  if (p.memory_bandwidth) y += fmt::format("memory_bandwidth_bytes_per_s: {}\n", Value(*p.memory_bandwidth));
  if (p.compute_slowdown) y += fmt::format("compute_slowdown: {}\n", Value(*p.compute_slowdown));
  if (p.comm_slowdown) y += fmt::format("comm_slowdown: {}\n", Value(*p.comm_slowdown));
  if (!p.gemm.empty()) {
    y += "gemm:\n";
    for (const GemmCalibration& g : p.gemm) {
      y += fmt::format("  - {{dtype: {}, flops_decade: {}, efficiency: {}, {}}}\n", DTypeText(g.dtype), g.flops_decade,
                       Num(g.efficiency), FitFields(g.fit));
    }
  }
  if (!p.attention.empty()) {
    y += "attention:\n";
    for (const AttentionCalibration& a : p.attention) {
      y += fmt::format("  - {{dtype: {}, pass: {}, efficiency: {}, {}}}\n", DTypeText(a.dtype),
                       a.backward ? "backward" : "forward", Num(a.efficiency), FitFields(a.fit));
    }
  }
  if (!p.collectives.empty()) {
    y += "collectives:\n";
    for (const CollectiveCalibration& c : p.collectives) {
      y += fmt::format(
          "  - {{type: {}, group_size: {}, bytes_decade: {}, alpha_ns: {}, beta_bytes_per_s: {}, method: {}, {}}}\n",
          traces::CollectiveTypeName(c.type), c.group_size, c.bytes_decade, Num(c.alpha_ns), Num(c.beta_bytes_per_s),
          CollectiveFitMethodName(c.method), FitFields(c.fit));
    }
  }
  return y;
}

namespace {

// Reads one profile; every error names source:line:column and the key path.
class ProfileReader {
 public:
  explicit ProfileReader(std::string source) : source_(std::move(source)) {}

  Status Error(const YAML::Node& node, const std::string& path, const std::string& message) const {
    const YAML::Mark mark = node.Mark();
    const std::string where = mark.is_null() || mark.line < 0 ? fmt::format("{}:1:1", source_)
                                                              : fmt::format("{}:{}:{}", source_, mark.line + 1, mark.column + 1);
    return Status::InvalidInput(fmt::format("{}: {}: {}", where, path, message));
  }

  // Keys of a map, checked against the allowed ones.
  Status CheckKeys(const YAML::Node& map, const std::string& path, std::initializer_list<std::string_view> allowed) const {
    if (!map.IsMap()) return Error(map, path, "expected a mapping");
    for (const auto& entry : map) {
      const std::string key = entry.first.as<std::string>("");
      if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
        std::string list;
        for (std::string_view a : allowed) list += fmt::format("{}{}", list.empty() ? "" : ", ", a);
        return Error(entry.first, path + "." + key, fmt::format("unknown key (expected one of: {})", list));
      }
    }
    return Status::Ok();
  }

  StatusOr<double> Number(const YAML::Node& map, const std::string& path, const std::string& key) const {
    const YAML::Node node = map[key];
    if (!node) return Error(map, path + "." + key, "missing (expected a number)");
    if (!node.IsScalar()) return Error(node, path + "." + key, "expected a number");
    try {
      const double v = node.as<double>();
      if (!std::isfinite(v)) return Error(node, path + "." + key, "expected a finite number");
      return v;
    } catch (const YAML::Exception&) {
      return Error(node, path + "." + key, fmt::format("expected a number, got '{}'", node.Scalar()));
    }
  }

  StatusOr<int64_t> Integer(const YAML::Node& map, const std::string& path, const std::string& key) const {
    const YAML::Node node = map[key];
    if (!node) return Error(map, path + "." + key, "missing (expected an integer)");
    try {
      if (!node.IsScalar()) throw YAML::Exception(YAML::Mark(), "");
      return node.as<int64_t>();
    } catch (const YAML::Exception&) {
      return Error(node, path + "." + key, fmt::format("expected an integer, got '{}'", node.IsScalar() ? node.Scalar() : "a collection"));
    }
  }

  StatusOr<std::string> Text(const YAML::Node& map, const std::string& path, const std::string& key) const {
    const YAML::Node node = map[key];
    if (!node) return Error(map, path + "." + key, "missing (expected a string)");
    if (!node.IsScalar()) return Error(node, path + "." + key, "expected a string");
    return node.Scalar();
  }

  StatusOr<FitQuality> Fit(const YAML::Node& map, const std::string& path) const {
    FitQuality q;
    SHARDSCOPE_ASSIGN_OR_RETURN(q.points, Integer(map, path, "points"));
    SHARDSCOPE_ASSIGN_OR_RETURN(q.rms_relative_error, Number(map, path, "rms_relative_error"));
    if (q.points < 0) return Error(map["points"], path + ".points", "expected >= 0");
    if (q.rms_relative_error < 0) return Error(map["rms_relative_error"], path + ".rms_relative_error", "expected >= 0");
    return q;
  }

  StatusOr<std::optional<FittedValue>> Value(const YAML::Node& root, const std::string& key, bool positive) const {
    const YAML::Node node = root[key];
    if (!node) return std::optional<FittedValue>();
    SHARDSCOPE_RETURN_IF_ERROR(CheckKeys(node, key, {"value", "points", "rms_relative_error"}));
    FittedValue v;
    SHARDSCOPE_ASSIGN_OR_RETURN(v.value, Number(node, key, "value"));
    if (positive ? !(v.value > 0) : v.value < 0) {
      return Error(node["value"], key + ".value", positive ? "expected > 0" : "expected >= 0");
    }
    SHARDSCOPE_ASSIGN_OR_RETURN(v.fit, Fit(node, key));
    return std::optional<FittedValue>(v);
  }

  StatusOr<DType> Dtype(const YAML::Node& map, const std::string& path) const {
    SHARDSCOPE_ASSIGN_OR_RETURN(std::string text, Text(map, path, "dtype"));
    std::optional<DType> d = traces::ParseDType(text);
    if (!d) return Error(map["dtype"], path + ".dtype", fmt::format("unknown dtype '{}' (bf16, fp16, fp32, tf32, ...)", text));
    return *d;
  }

  StatusOr<YAML::Node> List(const YAML::Node& root, const std::string& key) const {
    const YAML::Node node = root[key];
    if (node && !node.IsSequence()) return Error(node, key, "expected a list");
    return node;
  }

  StatusOr<CalibrationProfile> Read(const YAML::Node& root) const {
    CalibrationProfile p;
    if (!root || root.IsNull()) return Error(root, "(top level)", "empty profile: expected a mapping with version and gpu");
    SHARDSCOPE_RETURN_IF_ERROR(CheckKeys(root, "(top level)",
                                         {"version", "gpu", "launch_overhead_ns", "memory_bandwidth_bytes_per_s",
                                          "compute_slowdown", "comm_slowdown", "gemm", "attention", "collectives"}));
    SHARDSCOPE_ASSIGN_OR_RETURN(int64_t version, Integer(root, "(top level)", "version"));
    if (version != kProfileVersion) {
      return Error(root["version"], "version", fmt::format("expected {}, got {}", kProfileVersion, version));
    }
    SHARDSCOPE_ASSIGN_OR_RETURN(p.gpu, Text(root, "(top level)", "gpu"));
    SHARDSCOPE_ASSIGN_OR_RETURN(p.launch_overhead_ns, Value(root, "launch_overhead_ns", false));
    SHARDSCOPE_ASSIGN_OR_RETURN(p.memory_bandwidth, Value(root, "memory_bandwidth_bytes_per_s", true));
    SHARDSCOPE_ASSIGN_OR_RETURN(p.compute_slowdown, Value(root, "compute_slowdown", false));
    SHARDSCOPE_ASSIGN_OR_RETURN(p.comm_slowdown, Value(root, "comm_slowdown", false));
    SHARDSCOPE_ASSIGN_OR_RETURN(YAML::Node gemm, List(root, "gemm"));
    for (size_t i = 0; gemm && i < gemm.size(); ++i) {
      const std::string path = fmt::format("gemm[{}]", i);
      const YAML::Node n = gemm[i];
      SHARDSCOPE_RETURN_IF_ERROR(CheckKeys(n, path, {"dtype", "flops_decade", "efficiency", "points", "rms_relative_error"}));
      GemmCalibration g;
      SHARDSCOPE_ASSIGN_OR_RETURN(g.dtype, Dtype(n, path));
      SHARDSCOPE_ASSIGN_OR_RETURN(int64_t decade, Integer(n, path, "flops_decade"));
      if (decade < 0 || decade > 30) return Error(n["flops_decade"], path + ".flops_decade", "expected 0..30");
      g.flops_decade = static_cast<int32_t>(decade);
      SHARDSCOPE_ASSIGN_OR_RETURN(g.efficiency, Number(n, path, "efficiency"));
      if (!(g.efficiency > 0)) return Error(n["efficiency"], path + ".efficiency", "expected > 0");
      SHARDSCOPE_ASSIGN_OR_RETURN(g.fit, Fit(n, path));
      p.gemm.push_back(g);
    }
    SHARDSCOPE_ASSIGN_OR_RETURN(YAML::Node attention, List(root, "attention"));
    for (size_t i = 0; attention && i < attention.size(); ++i) {
      const std::string path = fmt::format("attention[{}]", i);
      const YAML::Node n = attention[i];
      SHARDSCOPE_RETURN_IF_ERROR(CheckKeys(n, path, {"dtype", "pass", "efficiency", "points", "rms_relative_error"}));
      AttentionCalibration a;
      SHARDSCOPE_ASSIGN_OR_RETURN(a.dtype, Dtype(n, path));
      SHARDSCOPE_ASSIGN_OR_RETURN(std::string pass, Text(n, path, "pass"));
      if (pass != "forward" && pass != "backward") {
        return Error(n["pass"], path + ".pass", fmt::format("expected forward or backward, got '{}'", pass));
      }
      a.backward = pass == "backward";
      SHARDSCOPE_ASSIGN_OR_RETURN(a.efficiency, Number(n, path, "efficiency"));
      if (!(a.efficiency > 0)) return Error(n["efficiency"], path + ".efficiency", "expected > 0");
      SHARDSCOPE_ASSIGN_OR_RETURN(a.fit, Fit(n, path));
      p.attention.push_back(a);
    }
    SHARDSCOPE_ASSIGN_OR_RETURN(YAML::Node colls, List(root, "collectives"));
    for (size_t i = 0; colls && i < colls.size(); ++i) {
      const std::string path = fmt::format("collectives[{}]", i);
      const YAML::Node n = colls[i];
      SHARDSCOPE_RETURN_IF_ERROR(CheckKeys(n, path,
                                           {"type", "group_size", "bytes_decade", "alpha_ns", "beta_bytes_per_s",
                                            "method", "points", "rms_relative_error"}));
      CollectiveCalibration c;
      SHARDSCOPE_ASSIGN_OR_RETURN(std::string type, Text(n, path, "type"));
      std::optional<CollectiveType> t = traces::ParseCollectiveType(type);
      if (!t) return Error(n["type"], path + ".type", fmt::format("unknown collective '{}' (all_gather, reduce_scatter, ...)", type));
      c.type = *t;
      SHARDSCOPE_ASSIGN_OR_RETURN(int64_t size, Integer(n, path, "group_size"));
      if (size < 1 || size > (int64_t{1} << 24)) return Error(n["group_size"], path + ".group_size", "expected >= 1");
      c.group_size = static_cast<int32_t>(size);
      SHARDSCOPE_ASSIGN_OR_RETURN(int64_t decade, Integer(n, path, "bytes_decade"));
      if (decade < 0 || decade > 18) return Error(n["bytes_decade"], path + ".bytes_decade", "expected 0..18");
      c.bytes_decade = static_cast<int32_t>(decade);
      SHARDSCOPE_ASSIGN_OR_RETURN(c.alpha_ns, Number(n, path, "alpha_ns"));
      if (c.alpha_ns < 0) return Error(n["alpha_ns"], path + ".alpha_ns", "expected >= 0");
      SHARDSCOPE_ASSIGN_OR_RETURN(c.beta_bytes_per_s, Number(n, path, "beta_bytes_per_s"));
      if (!(c.beta_bytes_per_s > 0)) return Error(n["beta_bytes_per_s"], path + ".beta_bytes_per_s", "expected > 0");
      SHARDSCOPE_ASSIGN_OR_RETURN(std::string method, Text(n, path, "method"));
      if (method == "alpha_beta") {
        c.method = CollectiveFitMethod::kAlphaBeta;
      } else if (method == "alpha_only") {
        c.method = CollectiveFitMethod::kAlphaOnly;
      } else if (method == "beta_only") {
        c.method = CollectiveFitMethod::kBetaOnly;
      } else {
        return Error(n["method"], path + ".method", fmt::format("expected alpha_beta, alpha_only or beta_only, got '{}'", method));
      }
      SHARDSCOPE_ASSIGN_OR_RETURN(c.fit, Fit(n, path));
      p.collectives.push_back(c);
    }
    return p;
  }

 private:
  std::string source_;
};

}  // namespace

StatusOr<CalibrationProfile> ParseCalibrationProfile(std::string_view yaml, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return Status::InvalidInput(fmt::format("{}:{}:{}: invalid YAML: {}", source, e.mark.line + 1, e.mark.column + 1, e.msg));
  }
  try {
    return ProfileReader(source).Read(root);
  } catch (const YAML::Exception& e) {
    return Status::InvalidInput(fmt::format("{}:{}:{}: {}", source, e.mark.line + 1, e.mark.column + 1, e.msg));
  }
}

StatusOr<CalibrationProfile> ReadCalibrationProfile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) return Status::IoError(fmt::format("cannot open '{}': {}", path, std::strerror(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  return ParseCalibrationProfile(text.str(), path);
}

Status WriteCalibrationProfile(const CalibrationProfile& profile, const std::string& path) {
  return traces::WriteFileAtomically(path, CalibrationProfileYaml(profile));
}

}  // namespace shardscope::sim

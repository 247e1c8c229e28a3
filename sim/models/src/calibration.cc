// The calibration profile (its YAML form, docs/CALIBRATION.md) and the cost provider that
// simulates with it. The fitting of a profile from measured timelines is in
// analysis/src/calibration_fit.cc.
#include "shardscope/sim/models/calibration.h"

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

#include "shardscope/sim/models/cost_provider.h"

namespace shardscope::sim {
namespace {

using traces::CollectiveType;
using traces::DType;
using traces::GemmDesc;
using traces::MemoryBoundDesc;
using traces::AttentionDesc;

constexpr double kNsPerSecond = 1e9;
constexpr int kProfileVersion = 1;

// Limits on a profile's values (docs/CALIBRATION.md), the same as a plan's own where the plan
// has the key (sim/plan/src/plan_schema.h), so a profile cannot set what a plan may not:
// - an efficiency is achieved / datasheet peak FLOP/s of the measured GPU, at most 1;
constexpr double kMaxEfficiency = 1;
// - host costs (launch, a collective's alpha) at most one second (kMaxHostOverheadUs);
constexpr double kMaxHostCostNs = 1e9;
// - contention slowdowns at most 100 (kMaxSlowdown);
constexpr double kMaxSlowdownFactor = 100;
// - bandwidths from 0.1 GB/s (below 1 Gb/s Ethernet's 125 MB/s, the slowest link a GPU job
//   could cross) to 100 TB/s (kMaxBandwidthGbps; HBM3e is 8 TB/s).
constexpr double kMinBandwidthBytesPerS = 1e8;
constexpr double kMaxBandwidthBytesPerS = 1e14;

std::string DTypeText(DType d) { return std::string(traces::DTypeName(d)); }

// Clamped to the simulator's horizon (traces::kMaxSimulatedNs) as the models' durations are.
int64_t CeilNs(double ns) {
  if (!(ns > 0)) return 0;
  return static_cast<int64_t>(std::ceil(std::min(ns, static_cast<double>(traces::kMaxSimulatedNs))));
}

}  // namespace

int32_t CalibrationDecade(double x) {
  if (!(x > 0)) return 0;
  auto d = static_cast<int32_t>(std::floor(std::log10(x)));
  while (std::pow(10.0, d + 1) <= x) ++d;
  while (std::pow(10.0, d) > x) --d;
  return d;
}

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
  std::map<std::pair<int64_t, int32_t>, int32_t> keys;
  for (size_t c = 0; c < schedule.communicators.size(); ++c) {
    group_sizes_.push_back(static_cast<int32_t>(schedule.communicators[c].ranks.size()));
    const std::pair<int64_t, int32_t> key{base_.CommunicatorCostKey(static_cast<int32_t>(c)), group_sizes_.back()};
    cost_keys_.push_back(keys.try_emplace(key, static_cast<int32_t>(keys.size())).first->second);
  }
}

int64_t CalibratedCostProvider::CommunicatorCostKey(int32_t communicator) const {
  return cost_keys_[static_cast<size_t>(communicator)];
}

const GemmCalibration* CalibratedCostProvider::FindGemm(DType dtype, double flops) const {
  const int32_t decade = CalibrationDecade(flops);
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
  const int32_t decade = CalibrationDecade(static_cast<double>(bytes));
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
    return CeilNs(static_cast<double>(compute_.KernelFloorNs()) + stream_ns);
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
  return std::max(CeilNs(ns), compute_.KernelFloorNs());
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
  cost.duration_ns = CeilNs(ns);
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
    int64_t CommunicatorCostKey(int32_t c) const override { return calibrated_.CommunicatorCostKey(c); }

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

  // Keys of a map, checked against the allowed ones; a key given twice is an error (yaml-cpp
  // would keep one silently).
  Status CheckKeys(const YAML::Node& map, const std::string& path, std::initializer_list<std::string_view> allowed) const {
    if (!map.IsMap()) return Error(map, path, "expected a mapping");
    std::set<std::string> seen;
    for (const auto& entry : map) {
      const std::string key = entry.first.as<std::string>("");
      if (!seen.insert(key).second) return Error(entry.first, path + "." + key, "key given twice");
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

  // A number in [min, max] (min excluded when `open_min`).
  Status Range(const YAML::Node& node, const std::string& path, double value, double min, bool open_min,
               double max) const {
    if (open_min ? !(value > min) : !(value >= min)) {
      return Error(node, path, fmt::format("expected a number {} {} and <= {}, got {}", open_min ? ">" : ">=",
                                           Num(min), Num(max), Num(value)));
    }
    if (!(value <= max)) {
      return Error(node, path, fmt::format("expected a number <= {} (the limit), got {}", Num(max), Num(value)));
    }
    return Status::Ok();
  }

  StatusOr<std::optional<FittedValue>> Value(const YAML::Node& root, const std::string& key, double min,
                                             bool open_min, double max) const {
    const YAML::Node node = root[key];
    if (!node) return std::optional<FittedValue>();
    SHARDSCOPE_RETURN_IF_ERROR(CheckKeys(node, key, {"value", "points", "rms_relative_error"}));
    FittedValue v;
    SHARDSCOPE_ASSIGN_OR_RETURN(v.value, Number(node, key, "value"));
    SHARDSCOPE_RETURN_IF_ERROR(Range(node["value"], key + ".value", v.value, min, open_min, max));
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
    SHARDSCOPE_ASSIGN_OR_RETURN(p.launch_overhead_ns, Value(root, "launch_overhead_ns", 0, false, kMaxHostCostNs));
    SHARDSCOPE_ASSIGN_OR_RETURN(p.memory_bandwidth, Value(root, "memory_bandwidth_bytes_per_s", kMinBandwidthBytesPerS,
                                                          false, kMaxBandwidthBytesPerS));
    SHARDSCOPE_ASSIGN_OR_RETURN(p.compute_slowdown, Value(root, "compute_slowdown", 0, false, kMaxSlowdownFactor));
    SHARDSCOPE_ASSIGN_OR_RETURN(p.comm_slowdown, Value(root, "comm_slowdown", 0, false, kMaxSlowdownFactor));
    // One row per bucket: a second row for a bucket would be silently ignored by the lookups.
    std::map<std::tuple<int, int64_t, int64_t>, std::string> buckets;
    const auto unique_bucket = [&](const YAML::Node& n, const std::string& path, std::tuple<int, int64_t, int64_t> key,
                                   std::string_view what) -> Status {
      auto [it, inserted] = buckets.emplace(key, path);
      if (!inserted) return Error(n, path, fmt::format("{} already calibrated by {}", what, it->second));
      return Status::Ok();
    };
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
      SHARDSCOPE_RETURN_IF_ERROR(Range(n["efficiency"], path + ".efficiency", g.efficiency, 0, true, kMaxEfficiency));
      SHARDSCOPE_ASSIGN_OR_RETURN(g.fit, Fit(n, path));
      SHARDSCOPE_RETURN_IF_ERROR(unique_bucket(n, path, {0, static_cast<int>(g.dtype), g.flops_decade},
                                               fmt::format("the bucket ({}, flops_decade {})", DTypeText(g.dtype),
                                                           g.flops_decade)));
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
      SHARDSCOPE_RETURN_IF_ERROR(Range(n["efficiency"], path + ".efficiency", a.efficiency, 0, true, kMaxEfficiency));
      SHARDSCOPE_ASSIGN_OR_RETURN(a.fit, Fit(n, path));
      SHARDSCOPE_RETURN_IF_ERROR(unique_bucket(n, path, {1, static_cast<int>(a.dtype), a.backward ? 1 : 0},
                                               fmt::format("the bucket ({}, {})", DTypeText(a.dtype), pass)));
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
      SHARDSCOPE_RETURN_IF_ERROR(Range(n["alpha_ns"], path + ".alpha_ns", c.alpha_ns, 0, false, kMaxHostCostNs));
      SHARDSCOPE_ASSIGN_OR_RETURN(c.beta_bytes_per_s, Number(n, path, "beta_bytes_per_s"));
      SHARDSCOPE_RETURN_IF_ERROR(Range(n["beta_bytes_per_s"], path + ".beta_bytes_per_s", c.beta_bytes_per_s,
                                       kMinBandwidthBytesPerS, false, kMaxBandwidthBytesPerS));
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
      // Collective types are numbered after the two kernel tables' tags (0, 1).
      SHARDSCOPE_RETURN_IF_ERROR(unique_bucket(
          n, path, {2 + static_cast<int>(c.type), c.group_size, c.bytes_decade},
          fmt::format("the bucket ({}, group_size {}, bytes_decade {})", type, c.group_size, c.bytes_decade)));
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

// The calibration profile: the cost-model figures fitted to a measured run, its YAML form, and
// the cost provider that simulates with it. Fitting a profile from measured timelines
// (FitCalibration, the residual table) is the measured side's, in
// shardscope/analysis/calibration_fit.h; what is fitted and how is described there.
//
//   SHARDSCOPE_ASSIGN_OR_RETURN(CalibrationProfile profile, ReadCalibrationProfile("profile.yaml"));
//   SHARDSCOPE_ASSIGN_OR_RETURN(auto costs, MakeCalibratedCostProvider(schedule, setup.cluster, profile));
//   EngineConfig config = EngineConfigFor(setup, schedule);
//   ApplyCalibration(profile, config);          // launch cost and contention, where fitted
//   Simulate(schedule, *costs, config, observer);
#ifndef SHARDSCOPE_SIM_CALIBRATION_H_
#define SHARDSCOPE_SIM_CALIBRATION_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardscope/sim/models/compute_model.h"
#include "shardscope/sim/models/cost_provider.h"
#include "shardscope/sim/presets/hardware.h"
#include "shardscope/traces/schedule.h"
#include "shardscope/base/status.h"
#include "shardscope/traces/timeline.h"

namespace shardscope::sim {

// How well a fitted quantity describes its points.
struct FitQuality {
  int64_t points = 0;
  double rms_relative_error = 0;   // sqrt(mean(((predicted - measured) / measured)^2))
};

struct FittedValue {
  double value = 0;
  FitQuality fit;
};

struct GemmCalibration {
  traces::DType dtype = traces::DType::kBFloat16;
  int32_t flops_decade = 0;        // 10^d <= FLOPs < 10^(d+1)
  double efficiency = 0;           // of EffectivePeakFlops(dtype)
  FitQuality fit;
};

struct AttentionCalibration {
  traces::DType dtype = traces::DType::kBFloat16;
  bool backward = false;
  double efficiency = 0;
  FitQuality fit;
};

// kAlphaBeta: both fitted (the bucket's sizes span a ratio of 1.2 or more). Otherwise they
// cannot be told apart: the term that dominates in the base NCCL model at that size is
// fitted and the other kept from the base model (kAlphaOnly: latency-bound messages,
// kBetaOnly: bandwidth-bound ones).
enum class CollectiveFitMethod : uint8_t { kAlphaBeta, kAlphaOnly, kBetaOnly };
std::string_view CollectiveFitMethodName(CollectiveFitMethod method);  // "alpha_beta", "alpha_only", "beta_only"

struct CollectiveCalibration {
  traces::CollectiveType type = traces::CollectiveType::kAllReduce;
  int32_t group_size = 0;
  int32_t bytes_decade = 0;        // 10^d <= bytes < 10^(d+1)
  double alpha_ns = 0;             // latency
  double beta_bytes_per_s = 0;     // algorithm bandwidth (nccl-tests' algbw)
  CollectiveFitMethod method = CollectiveFitMethod::kAlphaBeta;
  FitQuality fit;
};

struct CalibrationProfile {
  std::string gpu;                 // GPU preset the measurements ran on (peak FLOP/s)
  std::vector<GemmCalibration> gemm;                 // by (dtype, decade)
  std::vector<AttentionCalibration> attention;       // by (dtype, backward)
  std::optional<FittedValue> memory_bandwidth;       // bytes/s
  std::vector<CollectiveCalibration> collectives;    // by (type, group size, decade)
  std::optional<FittedValue> launch_overhead_ns;     // host time per launch
  std::optional<FittedValue> compute_slowdown;
  std::optional<FittedValue> comm_slowdown;
  bool operator==(const CalibrationProfile&) const;
};

// The bucket a FLOP count or a byte size falls in: d with 10^d <= x < 10^(d+1), exact at powers
// of ten (0 for x <= 0). Shared by the fit (shardscope/analysis/calibration_fit.h) and the
// provider below, so both put a point in the same bucket.
int32_t CalibrationDecade(double x);

// ---- The YAML form (docs/CALIBRATION.md):
//   version: 1
//   gpu: h100-sxm5-80gb
//   launch_overhead_ns: {value: 4000, points: 96, rms_relative_error: 0}
//   memory_bandwidth_bytes_per_s: {value: 2.4e12, points: 40, rms_relative_error: 0.001}
//   compute_slowdown: {value: 0.2, ...}
//   comm_slowdown: {value: 0.1, ...}
//   gemm:
//     - {dtype: bf16, flops_decade: 9, efficiency: 0.55, points: 12, rms_relative_error: 0}
//   attention:
//     - {dtype: bf16, pass: forward, efficiency: 0.6, points: 2, rms_relative_error: 0}
//   collectives:
//     - {type: all_gather, group_size: 8, bytes_decade: 7, alpha_ns: 37000, beta_bytes_per_s: 1.2e11,
//        method: alpha_beta, points: 6, rms_relative_error: 0}
// Every key but version and gpu is optional; unknown keys are errors. Numbers are written in
// the shortest form that reads back to the same double, so write -> read is exact.
std::string CalibrationProfileYaml(const CalibrationProfile& profile);
// `source` names the text in errors ("<source>:<line>:<column>: <key path>: expected ...").
StatusOr<CalibrationProfile> ParseCalibrationProfile(std::string_view yaml, const std::string& source);
StatusOr<CalibrationProfile> ReadCalibrationProfile(const std::string& path);
// Writes through a temporary file renamed onto `path`.
Status WriteCalibrationProfile(const CalibrationProfile& profile, const std::string& path);

// A CostProvider that costs with the profile where it has a bucket for the operation and
// asks `base` otherwise (FixedDurationDesc kernels and memcpys always go to `base`).
// Kernels with a bucket: max(FLOPs / (peak x fitted efficiency), bytes / memory bandwidth),
// the bandwidth fitted or else the base model's, never below the base model's kernel floor,
// rounded up to whole ns (as ComputeModel does). Collectives with a bucket: alpha + bytes /
// beta, with the algorithm and protocol the base model picks.
class CalibratedCostProvider : public CostProvider {
 public:
  // `base` must outlive this provider.
  CalibratedCostProvider(const traces::Schedule& schedule, const ClusterSpec& cluster, const CostProvider& base,
                         CalibrationProfile profile);
  int64_t KernelNs(const traces::ComputeDesc& desc) const override;
  int64_t MemcpyNs(traces::MemcpyKind kind, int64_t bytes) const override;
  CollectiveCost Collective(traces::CollectiveType type, int64_t bytes, int32_t communicator) const override;
  // The base's key refined by the group size the fitted rows are looked up by.
  int64_t CommunicatorCostKey(int32_t communicator) const override;
  const CalibrationProfile& profile() const { return profile_; }

 private:
  const GemmCalibration* FindGemm(traces::DType dtype, double flops) const;
  const AttentionCalibration* FindAttention(traces::DType dtype, bool backward) const;
  const CollectiveCalibration* FindCollective(traces::CollectiveType type, int32_t group_size, int64_t bytes) const;
  double MemoryBandwidth() const;

  const CostProvider& base_;
  CalibrationProfile profile_;
  ComputeModel compute_;               // peaks and the default floor / memory efficiency
  std::vector<int32_t> group_sizes_;   // per communicator
  std::vector<int32_t> cost_keys_;     // per communicator: distinct (base key, group size)
};

// The provider a simulation uses with `cluster: {calibration: profile.yaml}`: a
// CalibratedCostProvider over a ClusterCostProvider it owns. InvalidInput when the profile
// was measured on another GPU than the cluster's (efficiencies are fractions of that GPU's
// peak and would not transfer).
StatusOr<std::unique_ptr<CostProvider>> MakeCalibratedCostProvider(const traces::Schedule& schedule,
                                                                   const ClusterSpec& cluster,
                                                                   const CalibrationProfile& profile);

// Overrides the launch cost and the contention factors with the fitted ones, where fitted.
void ApplyCalibration(const CalibrationProfile& profile, HostConfig& host, ContentionConfig& contention);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_CALIBRATION_H_

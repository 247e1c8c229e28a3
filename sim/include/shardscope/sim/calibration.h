// Calibration: fitting the cost models to a measured run, and simulating with the result.
//
//   SHARDSCOPE_ASSIGN_OR_RETURN(CalibrationFit fit, FitCalibration(schedule, cluster, {&measured}));
//   SHARDSCOPE_RETURN_IF_ERROR(WriteCalibrationProfile(fit.profile, "profile.yaml"));
//   ...
//   SHARDSCOPE_ASSIGN_OR_RETURN(CalibrationProfile profile, ReadCalibrationProfile("profile.yaml"));
//   SHARDSCOPE_ASSIGN_OR_RETURN(auto costs, MakeCalibratedCostProvider(schedule, setup.cluster, profile));
//   EngineConfig config = EngineConfigFor(setup, world);
//   ApplyCalibration(profile, config);          // launch cost and contention, where fitted
//   Simulate(schedule, *costs, config, observer);
//
// The measured timeline must carry op ids (Slice::op_id): shardscope's own traces do
// (`shardscope simulate`, and `shardscope run` with the profiler), so every measured kernel
// joins the schedule op that launched it exactly; slices without an op id are ignored.
// pid = rank, tid 0 = host thread, tid 1 + s = stream s (TraceRecorder's layout).
//
// What is fitted (docs/CALIBRATION.md has the long form), each with its residual (RMS of the
// relative error of the fitted model against the points it was fitted on) and point count:
// - GEMM efficiency per (dtype, FLOP decade): bucket d holds GEMMs with 10^d <= FLOPs <
//   10^(d+1). efficiency = FLOPs / (peak(dtype) x duration), fitted by least squares on
//   the relative error. A GEMM whose duration is within 2% of its memory-roofline time or
//   of the kernel floor is not compute-bound and tells nothing about efficiency: skipped.
// - Attention efficiency per (dtype, forward | backward), the same way.
// - Memory-bound bandwidth (bytes/s achieved by MemoryBoundDesc kernels, read + written).
// - Collectives per (type, group size, bytes decade): t = alpha + bytes / beta (nccl-tests'
//   size S, CollectiveOp::bytes). t is the time from the last traced member's start to the
//   last end (an NCCL kernel spins from its own launch until every peer has arrived, so the
//   last start is when the transfer can begin). All buckets are fitted in one linear least-
//   squares problem together with the communication slowdown (below), so collectives that
//   overlapped compute count too: alpha and beta when the bucket's sizes span a ratio of
//   1.2 or more, else one of them (CollectiveFitMethod).
// - Host launch cost: the median of the cuda_runtime launch slices (kernels, collectives,
//   memcpys) on the host thread.
// - Contention (the engine's model, engine.h): compute kernels overlapped by a collective
//   run at 1/(1 + compute_slowdown); collectives overlapped by compute on any member run at
//   1/(1 + comm_slowdown). With W the clean (fitted) duration, t the measured one and t_over
//   the part of it overlapped: W = (t - t_over) + t_over x c, c = 1 / (1 + slowdown), fitted
//   by least squares over the overlapped points.
// Only "clean" kernels enter the efficiency and bandwidth fits: a kernel that overlaps
// another compute kernel or a collective on its rank only enters the compute-slowdown fit
// (and not even that when it overlaps another compute kernel: fair sharing is not fitted);
// a collective's compute overlap is the union over its traced members.
#ifndef SHARDSCOPE_SIM_CALIBRATION_H_
#define SHARDSCOPE_SIM_CALIBRATION_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardscope/sim/compute_model.h"
#include "shardscope/sim/engine.h"
#include "shardscope/sim/hardware.h"
#include "shardscope/sim/plan.h"
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

// What a fit also tells: how much of the input it could use.
struct CalibrationFit {
  CalibrationProfile profile;
  int64_t joined_slices = 0;       // slices matched to a schedule op
  int64_t unmatched_slices = 0;    // slices with an op id the schedule does not have
  std::vector<std::string> notes;  // points skipped and why, by kind
  // Fitted figures no run of the cluster's GPU can produce (an efficiency above 1, a memory
  // bandwidth above or far below the datasheet's, a launch cost of 100 us or more): the trace
  // is probably from another GPU or from the host backend. The profile is still written.
  std::vector<std::string> warnings;
};

// Fits the profile from measured timelines of `schedule` run on `cluster` (several files
// add up: one per rank or several runs). `names` name the timelines in errors (default
// "measured trace #i"). InvalidInput when a trace does not belong to the schedule: its
// distributedInfo.world_size differs, fewer than 90% of its slices with op ids join an op of
// the same kind, or nothing joins at all (no op ids).
StatusOr<CalibrationFit> FitCalibration(const traces::Schedule& schedule, const ClusterSpec& cluster,
                                        const std::vector<const traces::Timeline*>& measured,
                                        const std::vector<std::string>& names = {});

// The residual table `shardscope calibrate` prints: one row per fitted quantity with its
// value, the default it replaces, the point count and the RMS relative error.
std::string CalibrationTableText(const CalibrationProfile& profile, const ClusterSpec& cluster);

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
void ApplyCalibration(const CalibrationProfile& profile, EngineConfig& config);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_CALIBRATION_H_

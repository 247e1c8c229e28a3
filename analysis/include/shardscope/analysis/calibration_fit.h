// Calibration: fitting the cost models to a measured run (the profile, its YAML form and the
// provider that simulates with it are in shardscope/sim/models/calibration.h).
//
//   SHARDSCOPE_ASSIGN_OR_RETURN(CalibrationFit fit, FitCalibration(schedule, cluster, {&measured}));
//   SHARDSCOPE_RETURN_IF_ERROR(WriteCalibrationProfile(fit.profile, "profile.yaml"));
//   ...
//   SHARDSCOPE_ASSIGN_OR_RETURN(CalibrationProfile profile, ReadCalibrationProfile("profile.yaml"));
//   SHARDSCOPE_ASSIGN_OR_RETURN(auto costs, MakeCalibratedCostProvider(schedule, setup.cluster, profile));
//   EngineConfig config = EngineConfigFor(setup, schedule);
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
#ifndef SHARDSCOPE_ANALYSIS_CALIBRATION_FIT_H_
#define SHARDSCOPE_ANALYSIS_CALIBRATION_FIT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "shardscope/base/status.h"
#include "shardscope/sim/models/calibration.h"
#include "shardscope/sim/presets/hardware.h"
#include "shardscope/traces/schedule.h"
#include "shardscope/traces/timeline.h"

namespace shardscope::sim {

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

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_ANALYSIS_CALIBRATION_FIT_H_

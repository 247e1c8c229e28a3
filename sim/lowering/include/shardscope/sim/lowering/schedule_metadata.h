// The plan context a schedule carries in Schedule::metadata: the lowering writes every
// hardware figure, the contention factors, the host costs, the memory and OOM settings and
// the divergence into it (WritePlanMetadata), and every simulation of the schedule reads them
// back (SetupFromSchedule), so a schedule JSON simulates without the plan that produced it.
#ifndef SHARDSCOPE_SIM_LOWERING_SCHEDULE_METADATA_H_
#define SHARDSCOPE_SIM_LOWERING_SCHEDULE_METADATA_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardscope/sim/models/cost_provider.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/sim/presets/hardware.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::sim {

struct CalibrationProfile;  // models/calibration.h

// Writes every hardware figure, the contention factors and the host costs.
void WritePlanMetadata(const Plan& plan, std::map<std::string, std::string>& metadata);

// Everything besides the schedule that a simulation needs.
struct SimulationSetup {
  std::string label;                  // plan file or schedule file, for reports
  ClusterSpec cluster;
  ContentionConfig contention;
  HostConfig host;
  MemoryPlan memory;
  OomConfig oom;                      // metadata "oom.policy", "oom.sync_hooks"
  std::map<int32_t, double> rank_slowdown;  // metadata "divergence.slowdown.<rank>" (stragglers)
  // metadata "cluster.calibration": the profile the costs come from (calibration.h); its
  // launch cost and contention factors are already in `host` and `contention`.
  std::shared_ptr<const CalibrationProfile> calibration;
  std::string calibration_path;          // the profile's file, as the plan names it
  double model_flops_per_rank_step = 0;  // 0 when unknown (hand-written schedules)
  int64_t tokens_per_rank_step = 0;
  // metadata "mfu.<convention>.flops_per_token" / ".peak_flops" (mfu_conventions.h): how
  // each framework would count this step; empty when the schedule has none.
  struct ConventionFigures {
    std::string name;
    double flops_per_token = 0;
    double peak_flops = 0;  // 0: that framework reports no MFU on this GPU and dtype
  };
  std::vector<ConventionFigures> mfu_conventions;
};

// Reads the setup from a schedule's metadata (written by LowerPlan). Keys that are absent
// fall back to defaults only where one exists; a missing cluster is an error.
StatusOr<SimulationSetup> SetupFromSchedule(const traces::Schedule& schedule, const std::string& label);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_LOWERING_SCHEDULE_METADATA_H_

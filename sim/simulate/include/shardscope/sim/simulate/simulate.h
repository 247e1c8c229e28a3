// One simulation of a schedule, set up from its metadata (lowering/schedule_metadata.h): the
// cost provider (calibrated when the setup names a profile), the device memory each rank's
// allocator may use, and the engine's configuration. Every command that simulates (simulate,
// check, fit, memory, calibrate) builds its run here.
#ifndef SHARDSCOPE_SIM_SIMULATE_SIMULATE_H_
#define SHARDSCOPE_SIM_SIMULATE_SIMULATE_H_

#include <cstdint>
#include <memory>

#include "shardscope/base/status.h"
#include "shardscope/sim/engine/engine.h"
#include "shardscope/sim/lowering/schedule_metadata.h"
#include "shardscope/sim/models/calibration.h"
#include "shardscope/sim/models/cost_provider.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::sim {

// The cost provider a simulation of `schedule` uses: the calibrated one when the setup has a
// profile (InvalidInput when it was measured on another GPU), else ClusterCostProvider.
// InvalidInput when the NCCL knobs leave a collective nothing NCCL would run
// (CheckNcclChoices).
StatusOr<std::unique_ptr<CostProvider>> MakeCostProvider(const traces::Schedule& schedule,
                                                         const SimulationSetup& setup);

// Device memory each rank's allocator may use: what CUDA reports (GpuSpec::usable_bytes) - the
// CUDA context - the NCCL buffers of the rank's communicators - cuBLAS workspaces cuBLAS
// allocates itself (PyTorch <= 1.12; later ones come from the allocator, EngineConfigFor) -
// memory reserved by other processes on that GPU (lowering/schedule_metadata.h DeviceMemorySetup).
int64_t AllocatorCapacity(const SimulationSetup& setup, int32_t rank);

// The engine configuration of a simulation of `schedule` with `setup`: memory, host costs,
// contention, stragglers and the links its communicators share (cluster_links.h).
EngineConfig EngineConfigFor(const SimulationSetup& setup, const traces::Schedule& schedule);

// The fault `simulate --inject-oom RANK:OP_ID` and `run --inject-oom` inject: op `op_id` of
// rank `rank`'s program, which must be an allocate. Otherwise InvalidInput whose message says
// why in a few words ("rank outside the world of 8 ranks"), for the caller to prefix with the
// option's name. (Moved from cli/run_command.cc ParseInjectedOom.)
StatusOr<InjectedOom> InjectedOomAt(const traces::Schedule& schedule, int64_t rank, int64_t op_id);

// A straggler (`--straggler RANK:FACTOR`, EngineConfig::rank_slowdown) a world of `world`
// ranks can take: 0 <= rank < world and 1 <= factor <= kMaxRankSlowdownFactor
// (models/cost_provider.h; the engine refuses more). (Moved from
// cli/check_command.cc ParseStragglers.)
bool ValidStraggler(int64_t rank, double factor, int32_t world);

// A profile's launch cost and contention factors, where fitted, into an engine configuration.
void ApplyCalibration(const CalibrationProfile& profile, EngineConfig& config);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_SIMULATE_SIMULATE_H_

// The "memory.*" keys of a schedule's metadata (schedule_metadata.h DeviceMemorySetup): the
// CUDA context, cuBLAS workspaces and NCCL settings a plan implies, written by the lowering and
// read back with each rank's NCCL buffers computed from the schedule. Private to sim/lowering/.
#ifndef SHARDSCOPE_SIM_LOWERING_DEVICE_MEMORY_METADATA_H_
#define SHARDSCOPE_SIM_LOWERING_DEVICE_MEMORY_METADATA_H_

#include <map>
#include <string>

#include "shardscope/base/status.h"
#include "shardscope/sim/lowering/schedule_metadata.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::sim::lowering_internal {

void WriteDeviceMemoryMetadata(const Plan& plan, std::map<std::string, std::string>& metadata);

// Fills setup.device_memory (needs setup.cluster) and setup.init. Absent keys leave the
// defaults: no context, no NCCL channels, no workspaces (hand-written schedules), except that
// an older schedule's "gpu.cuda_context_bytes" is taken as the context.
Status ReadDeviceMemoryMetadata(const traces::Schedule& schedule, const std::string& label, SimulationSetup& setup);

}  // namespace shardscope::sim::lowering_internal

#endif  // SHARDSCOPE_SIM_LOWERING_DEVICE_MEMORY_METADATA_H_

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

#include "shardscope/sim/lowering/init_program.h"
#include "shardscope/sim/models/cost_provider.h"
#include "shardscope/sim/models/nccl_memory.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/sim/presets/cuda_runtime.h"
#include "shardscope/sim/presets/hardware.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::sim {

struct CalibrationProfile;  // models/calibration.h

// Writes every hardware figure, the contention factors and the host costs.
void WritePlanMetadata(const Plan& plan, std::map<std::string, std::string>& metadata);

// Device memory a rank holds outside its step's tensors (docs/REPORT.md, "memory"): the CUDA
// context, NCCL's communicator buffers and cuBLAS's workspaces. Metadata "memory.*" (written
// from the plan by WritePlanMetadata, with the figures of presets/cuda_runtime.h); the NCCL
// buffers of each rank are computed from the schedule's communicators when it is read.
struct DeviceMemorySetup {
  CudaVersion cuda;                         // "memory.cuda_version"
  bool lazy_loading = false;                // "memory.cuda_lazy_loading"
  int64_t cuda_context_bytes = 0;           // "memory.cuda_context_bytes"
  int64_t cublas_workspace_bytes = 0;       // per (handle, stream): "memory.cublas_workspace_bytes"
  int32_t cublas_workspaces = 0;            // handles x GEMM streams: "memory.cublas_workspaces"
  bool cublas_in_allocator = true;          // "memory.cublas_workspace_in_allocator"
  // Channels, NCCL_BUFFSIZE and whether channels connect at init: "memory.nccl_channels",
  // "memory.nccl_buffsize", "memory.nccl_connect_at_init" (0 channels: no NCCL memory counted).
  NcclMemoryOptions nccl;
  std::vector<RankNcclMemory> nccl_per_rank;  // NcclMemoryPerRank over the schedule
  int64_t NcclBytes(int32_t rank) const {
    return rank >= 0 && static_cast<size_t>(rank) < nccl_per_rank.size() ? nccl_per_rank[static_cast<size_t>(rank)].bytes : 0;
  }
  // cuBLAS workspaces cudaMalloc'd outside the caching allocator (PyTorch <= 1.12).
  int64_t CublasOutsideBytes() const { return cublas_in_allocator ? 0 : cublas_workspace_bytes * cublas_workspaces; }
};

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
  DeviceMemorySetup device_memory;
  InitProgram init;                     // metadata "init.*" (empty: no init phase simulated)
  // `--all-ranks`: simulate every rank instead of one per class of identical ranks
  // (EngineConfig::reduce_symmetry; the results are the same, only slower). Not metadata.
  bool simulate_every_rank = false;
};

// Reads the setup from a schedule's metadata (written by LowerPlan). Keys that are absent
// fall back to defaults only where one exists; a missing cluster is an error.
StatusOr<SimulationSetup> SetupFromSchedule(const traces::Schedule& schedule, const std::string& label);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_LOWERING_SCHEDULE_METADATA_H_

// The job before its first step: the schedule's init program (lowering/init_program.h) run
// through the caching allocator on one rank, with the CUDA context and other processes' memory
// present from the start and each NCCL communicator's buffers from its first collective.
//
//   const InitPhaseResult init = SimulateInitPhase(schedule, setup, /*rank=*/0);
//   if (init.oom) ...  // the job dies before the step: InitWhatText(init.oom->what)
#ifndef SHARDSCOPE_SIM_SIMULATE_INIT_PHASE_H_
#define SHARDSCOPE_SIM_SIMULATE_INIT_PHASE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shardscope/sim/engine/engine.h"
#include "shardscope/sim/lowering/init_program.h"
#include "shardscope/sim/lowering/schedule_metadata.h"
#include "shardscope/traces/report_header.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::sim {

struct InitOom {
  InitWhat what = InitWhat::kRelease;  // the framework step whose allocation failed
  int64_t requested_bytes = 0;         // the segment the allocator asked for
  int64_t free_bytes = 0;              // device memory left for it (capacity less reserved, NCCL)
};

struct InitPhaseResult {
  bool simulated = false;              // the schedule carries an init program
  std::string framework;
  // usable - CUDA context - others' memory; NCCL's buffers take their share when created.
  int64_t capacity_bytes = 0;
  int64_t peak_reserved_bytes = 0;     // the caching allocator's reserved peak during init
  InitWhat peak_what = InitWhat::kRelease;  // the step whose allocation reached the peak
  int64_t nccl_bytes = 0;              // NCCL buffers created during init
  std::optional<InitOom> oom;
};

InitPhaseResult SimulateInitPhase(const traces::Schedule& schedule, const SimulationSetup& setup, int32_t rank);

// One rank's step as the report classes it: its reserved peak and whether it ran out of memory
// (not counting an OOM the fault sweep injected).
struct RankStepMemory {
  int64_t peak_reserved_bytes = 0;
  bool oom = false;
};

// Every class of ranks that agree on program, capacity and NCCL buffers: what CUDA reports,
// the CUDA context, NCCL's buffers, cuBLAS's workspaces, the init phase (simulated for the
// class's first rank when `simulate_init`) and the step's reserved peak (report.json
// "memory.phases"). `step` has one entry per rank (fewer: the rest count as 0).
traces::ReportMemoryPhases MemoryPhasesOf(const traces::Schedule& schedule, const SimulationSetup& setup,
                                          const std::vector<RankStepMemory>& step, bool simulate_init);
// The same for a simulated run.
traces::ReportMemoryPhases MemoryPhasesOf(const traces::Schedule& schedule, const SimulationSetup& setup,
                                          const SimulationResult& result);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_SIMULATE_INIT_PHASE_H_

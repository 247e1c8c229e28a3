// Running a schedule end to end: the hardware it runs on (from the plan, or from the
// schedule's metadata), the cost provider over the cluster's compute and NCCL models, the
// trace recorder that turns engine spans into a Perfetto timeline, and report.json.
#ifndef SHARDSCOPE_SIM_SIMULATION_H_
#define SHARDSCOPE_SIM_SIMULATION_H_

#include <map>
#include <memory>
#include <array>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "shardscope/sim/models/compute_model.h"
#include "shardscope/sim/engine/engine.h"
#include "shardscope/sim/presets/hardware.h"
#include "shardscope/sim/models/nccl_model.h"
#include "shardscope/sim/lowering/schedule_metadata.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/sim/simulate/init_phase.h"
#include "shardscope/sim/simulate/simulate.h"
#include "shardscope/traces/report_header.h"
#include "shardscope/traces/schedule.h"
#include "shardscope/traces/timeline.h"

namespace shardscope::sim {

// Turns engine spans of the chosen ranks into timeline events (Kineto conventions: pid =
// rank, tid 0 = host thread, tid 1 + stream index = stream; launch -> kernel "ac2g" flows).
// The calls of each engine instant are written in (rank, lane) order, lane 0 the host thread
// and its memory counters, lane 1 + s stream s (EngineObserver::OnInstantDone), so trace.json
// is the same byte for byte however the run was simulated.
class TraceRecorder : public EngineObserver {
 public:
  TraceRecorder(const traces::Schedule& schedule, std::vector<int32_t> ranks, traces::TimelineSink& sink);
  bool WantsRank(int32_t rank) const override;
  void OnHostSpan(const HostSpan& span) override;
  void OnDeviceSpan(const DeviceSpan& span) override;
  void OnMemory(int32_t rank, int64_t ts_ns, int64_t allocated, int64_t reserved) override;
  void OnMemoryEvent(int32_t rank, int64_t ts_ns, std::string_view what, int64_t bytes) override;
  void OnInstantDone() override;

 private:
  struct MemorySample {
    int32_t rank;
    int64_t ts_ns, allocated, reserved;
  };
  struct MemoryEvent {
    int32_t rank;
    int64_t ts_ns;
    std::string_view what;  // a literal ("oom", ...)
    int64_t bytes;
  };
  struct Call {
    int32_t rank = 0;
    int32_t lane = 0;
    std::variant<HostSpan, DeviceSpan, MemorySample, MemoryEvent> what;
    CollectiveRun collective;  // a DeviceSpan's (its pointer is the engine's, gone after the call)
  };
  void WriteHostSpan(const HostSpan& span);
  void WriteDeviceSpan(const DeviceSpan& span);
  void WriteMemory(const MemorySample& sample);
  void WriteMemoryEvent(const MemoryEvent& event);

  const traces::Schedule& schedule_;
  std::vector<bool> wanted_;
  traces::TimelineSink& sink_;
  std::unordered_map<int64_t, int64_t> launch_starts_;  // flow id -> launch start, until bound
  std::vector<Call> instant_;  // this instant's calls, in arrival order
};

// The ranks a trace shows by default: the first node, plus the first rank of every group of
// ranks whose timelines are identical to each other but differ from all ranks already shown.
std::vector<int32_t> DefaultTraceRanks(const SimulationResult& result, int32_t gpus_per_node);

// What the plan's divergence (plan.h DivergenceConfig, and `simulate --straggler`) costs: the
// same job run with every rank alike.
struct DivergenceCost {
  std::vector<std::string> sources;  // "rank 3 (kernels and copies x1.5)", "rank(s) 5 run training.seq_len 12288"
  bool uniform_completed = false;    // the run with every rank alike completed
  int64_t uniform_step_ns = 0;
};

// Writes report.json (schema in docs/REPORT.md). `divergence` (may be null: "divergence": null)
// adds what the divergence costs.
std::string ReportJson(const traces::Schedule& schedule, const SimulationSetup& setup,
                       const SimulationResult& result, const DivergenceCost* divergence = nullptr);

// A rank's allocator state in the layout of torch.cuda.memory._snapshot(): segments with
// blocks, and device_traces with the actions (times in microseconds).
std::string MemorySnapshotJson(const RankMemory& memory, int32_t rank);
// The same as a pickle, the file torch.cuda.memory._dump_snapshot writes: it opens in
// PyTorch's memory_viz (pytorch.org/memory_viz) and in `alloc-replay --snapshot`. Segments
// are on device 0 (one rank per file); blocks and actions carry empty `frames`.
std::string MemorySnapshotPickle(const RankMemory& memory);

// The summary's memory lines, per class of ranks: usable capacity less the CUDA context, NCCL's
// buffers and cuBLAS workspaces outside the allocator; the init phase's peak and verdict; the
// step's peak and headroom (simulate/init_phase.h MemoryPhasesOf).
std::string MemoryPhasesText(const traces::ReportMemoryPhases& phases);

// The summary `shardscope simulate` prints.
std::string SummaryText(const traces::Schedule& schedule, const SimulationSetup& setup,
                        const SimulationResult& result);

// Bytes one rank moves per step in collectives of each type, in nccl-tests' size convention
// (CollectiveOp::bytes: the gathered output of an all-gather, the input of a
// reduce-scatter, the buffer of an all-reduce), indexed by CollectiveType.
std::array<int64_t, 8> CollectiveBytesPerStep(const traces::Schedule& schedule, int32_t rank);

// One simulated plan, for `shardscope simulate --compare`.
struct ComparedRun {
  std::string label;                 // the input path
  const traces::Schedule* schedule = nullptr;
  const SimulationSetup* setup = nullptr;
  const SimulationResult* result = nullptr;
};
// The two summaries side by side, one row per figure, with B - A and B / A.
std::string CompareText(const ComparedRun& a, const ComparedRun& b);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_SIMULATION_H_

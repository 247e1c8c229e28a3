// One rank's result of a run, as both backends record it, send it to rank 0 and report it:
// the result record (one struct; one wire layout of int64 values), the figures rank 0 derives
// from every rank's record, and report.json (the keys of simulate's report, docs/REPORT.md,
// where they apply to a measured run, plus what a backend adds).
//
//   std::vector<int64_t> wire = EncodeResult(mine, steps, replays);   // every rank
//   RankResult r = DecodeResult(wire.data(), steps, replays);          // rank 0, per rank
//   std::string json = RunReportJson(header, setup, all, runtime_section, extras);
#ifndef SHARDSCOPE_RUNTIME_SRC_RUN_RESULT_H_
#define SHARDSCOPE_RUNTIME_SRC_RUN_RESULT_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardscope/runtime/host_backend.h"
#include "shardscope/sim/report/report.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::runtime {

struct OomRecord {
  int64_t op_id = 0, time_ns = 0, requested = 0, free_bytes = 0, largest_free = 0;
  bool injected = false;
};

struct RankResult {
  bool finished = false;             // ran every step
  std::optional<OomRecord> oom;
  int64_t capacity = 0;
  int64_t peak_allocated = 0, peak_reserved = 0;
  int64_t fragmentation = 0;         // reserved - allocated when reserved peaked
  int64_t retries = 0, num_ooms = 0;
  int64_t host_busy_ns = 0;
  int64_t device_allocs = 0, device_frees = 0;
  // CUDA backend only (-1 elsewhere).
  int64_t device = -1;
  int64_t operand_reserved = -1;
  // cudaMemGetInfo once setup was done (context, operands, NCCL), and the capacity the
  // simulator planned, of which the rank got min(planned, free): capacity.
  int64_t meminfo_free_after_setup = -1, meminfo_total = -1, planned_capacity = -1;
  // What the device held for the schedule's memory during the measured steps (one cudaMalloc
  // of the allocator's reserved bytes after the warm-up, or the part the device granted).
  int64_t device_backing = -1;
  std::vector<int64_t> step_times;   // measured steps, at most RunOptions::steps
  std::vector<int64_t> graph_times;  // CUDA-graph replays, at most CudaRunOptions::graph_replays
};

// The wire layout: these fields (int64 each, -1 when unset), then `steps` step times, then
// `replays` replay times. Every rank of a job encodes with the same steps and replays.
enum ResultField : int {
  kFinished, kOom, kOomOpId, kOomInjected, kOomRequested, kOomFree, kOomLargest, kOomTime, kCapacity,
  kPeakAllocated, kPeakReserved, kFragmentation, kRetries, kNumOoms, kHostBusy, kDeviceAllocs, kDeviceFrees,
  kOperandReserved, kMemInfoFreeAfterSetup, kMemInfoTotal, kPlannedCapacity, kDeviceBacking, kDevice, kStepsDone, kGraphStepsDone, kResultFields
};

size_t ResultRecordSize(int32_t steps, int32_t replays);
std::vector<int64_t> EncodeResult(const RankResult& result, int32_t steps, int32_t replays);
RankResult DecodeResult(const int64_t* record, int32_t steps, int32_t replays);

// The lower median (the middle element, the lower of the two middle ones when even), 0 when empty.
int64_t Median(std::vector<int64_t> values);

// What rank 0 returns from a run: completed when every rank finished; the ranks out of memory.
RunResult RunResultOf(const std::vector<RankResult>& ranks);
// The slowest rank's median step, and the largest peak reserved.
int64_t SlowestMedianStep(const std::vector<RankResult>& ranks);
int64_t SlowestMedianGraphStep(const std::vector<RankResult>& ranks);
int64_t LargestPeakReserved(const std::vector<RankResult>& ranks);
// "  OOM: rank r ran out of memory at op N (injected); it stopped (raise)\n" per rank.
std::string OomSummaryLines(const std::vector<RankResult>& ranks);

// report.json: the header (traces/report_header.h), completed, step_time_ns, memory, hang
// (false: a hang aborts the job; its evidence is in flight_recorder/), `runtime`, and per rank
// the common keys followed by whatever `rank_extras` adds.
std::string RunReportJson(const traces::Schedule& schedule, const sim::SimulationSetup& setup,
                          const std::string& source, const std::vector<RankResult>& ranks,
                          const nlohmann::ordered_json& runtime,
                          const std::function<void(const RankResult&, nlohmann::ordered_json&)>& rank_extras);

}  // namespace shardscope::runtime

#endif  // SHARDSCOPE_RUNTIME_SRC_RUN_RESULT_H_

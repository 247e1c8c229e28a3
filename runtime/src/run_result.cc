#include "run_result.h"

#include <algorithm>

#include <fmt/format.h>

#include "shardscope/sim/report/version.h"
#include "shardscope/sim/simulate/init_phase.h"
#include "shardscope/traces/report_header.h"

namespace shardscope::runtime {

size_t ResultRecordSize(int32_t steps, int32_t replays) {
  return static_cast<size_t>(kResultFields) + static_cast<size_t>(std::max(0, steps)) +
         static_cast<size_t>(std::max(0, replays));
}

std::vector<int64_t> EncodeResult(const RankResult& r, int32_t steps, int32_t replays) {
  std::vector<int64_t> out(ResultRecordSize(steps, replays), -1);
  out[kFinished] = r.finished ? 1 : 0;
  out[kOom] = r.oom ? 1 : 0;
  if (r.oom) {
    out[kOomOpId] = r.oom->op_id;
    out[kOomInjected] = r.oom->injected ? 1 : 0;
    out[kOomRequested] = r.oom->requested;
    out[kOomFree] = r.oom->free_bytes;
    out[kOomLargest] = r.oom->largest_free;
    out[kOomTime] = r.oom->time_ns;
  }
  out[kCapacity] = r.capacity;
  out[kPeakAllocated] = r.peak_allocated;
  out[kPeakReserved] = r.peak_reserved;
  out[kFragmentation] = r.fragmentation;
  out[kRetries] = r.retries;
  out[kNumOoms] = r.num_ooms;
  out[kHostBusy] = r.host_busy_ns;
  out[kDeviceAllocs] = r.device_allocs;
  out[kDeviceFrees] = r.device_frees;
  out[kOperandReserved] = r.operand_reserved;
  out[kMemInfoFreeAfterSetup] = r.meminfo_free_after_setup;
  out[kMemInfoTotal] = r.meminfo_total;
  out[kPlannedCapacity] = r.planned_capacity;
  out[kDeviceBacking] = r.device_backing;
  out[kDevice] = r.device;
  const auto step_slots = static_cast<size_t>(std::max(0, steps));
  const auto replay_slots = static_cast<size_t>(std::max(0, replays));
  const size_t step_count = std::min(r.step_times.size(), step_slots);
  const size_t replay_count = std::min(r.graph_times.size(), replay_slots);
  out[kStepsDone] = static_cast<int64_t>(step_count);
  out[kGraphStepsDone] = static_cast<int64_t>(replay_count);
  for (size_t i = 0; i < step_count; ++i) out[kResultFields + i] = r.step_times[i];
  for (size_t i = 0; i < replay_count; ++i) out[kResultFields + step_slots + i] = r.graph_times[i];
  return out;
}

RankResult DecodeResult(const int64_t* rec, int32_t steps, int32_t replays) {
  RankResult r;
  r.finished = rec[kFinished] == 1;
  if (rec[kOom] == 1) {
    r.oom = OomRecord{rec[kOomOpId], rec[kOomTime], rec[kOomRequested], rec[kOomFree], rec[kOomLargest],
                      rec[kOomInjected] == 1};
  }
  r.capacity = rec[kCapacity];
  r.peak_allocated = rec[kPeakAllocated];
  r.peak_reserved = rec[kPeakReserved];
  r.fragmentation = rec[kFragmentation];
  r.retries = rec[kRetries];
  r.num_ooms = rec[kNumOoms];
  r.host_busy_ns = rec[kHostBusy];
  r.device_allocs = rec[kDeviceAllocs];
  r.device_frees = rec[kDeviceFrees];
  r.operand_reserved = rec[kOperandReserved];
  r.meminfo_free_after_setup = rec[kMemInfoFreeAfterSetup];
  r.meminfo_total = rec[kMemInfoTotal];
  r.planned_capacity = rec[kPlannedCapacity];
  r.device_backing = rec[kDeviceBacking];
  r.device = rec[kDevice];
  for (int64_t i = 0; i < rec[kStepsDone] && i < steps; ++i) r.step_times.push_back(rec[kResultFields + i]);
  for (int64_t i = 0; i < rec[kGraphStepsDone] && i < replays; ++i) {
    r.graph_times.push_back(rec[kResultFields + steps + i]);
  }
  return r;
}

int64_t Median(std::vector<int64_t> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[(values.size() - 1) / 2];
}

RunResult RunResultOf(const std::vector<RankResult>& ranks) {
  RunResult result;
  result.completed = true;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (!ranks[r].finished) result.completed = false;
    if (ranks[r].oom) result.oom_ranks.push_back(static_cast<int32_t>(r));
  }
  return result;
}

int64_t SlowestMedianStep(const std::vector<RankResult>& ranks) {
  int64_t step = 0;
  for (const RankResult& r : ranks) step = std::max(step, Median(r.step_times));
  return step;
}

int64_t SlowestMedianGraphStep(const std::vector<RankResult>& ranks) {
  int64_t step = 0;
  for (const RankResult& r : ranks) step = std::max(step, Median(r.graph_times));
  return step;
}

int64_t LargestPeakReserved(const std::vector<RankResult>& ranks) {
  int64_t peak = 0;
  for (const RankResult& r : ranks) peak = std::max(peak, r.peak_reserved);
  return peak;
}

std::string OomSummaryLines(const std::vector<RankResult>& ranks) {
  std::string text;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (!ranks[r].oom) continue;
    text += fmt::format("  OOM: rank {} ran out of memory at op {}{}; it stopped (raise)\n", r, ranks[r].oom->op_id,
                        ranks[r].oom->injected ? " (injected)" : "");
  }
  return text;
}

std::string RunReportJson(const traces::Schedule& schedule, const sim::SimulationSetup& setup,
                          const std::string& source, const std::vector<RankResult>& ranks,
                          const nlohmann::ordered_json& runtime,
                          const std::function<void(const RankResult&, nlohmann::ordered_json&)>& rank_extras) {
  nlohmann::ordered_json j;
  traces::WriteReportHeader(traces::ReportHeaderOf(schedule, std::string(sim::Version()), source,
                                                   {setup.cluster.name, setup.cluster.gpu.name, setup.cluster.nodes,
                                                    setup.cluster.gpus_per_node}),
                            j);
  bool completed = true;
  int64_t step = 0;
  traces::ReportMemory memory;
  nlohmann::ordered_json per_rank = nlohmann::ordered_json::array();
  for (size_t r = 0; r < ranks.size(); ++r) {
    const RankResult& rec = ranks[r];
    const int64_t median = Median(rec.step_times);
    completed = completed && rec.finished;
    step = std::max(step, median);
    memory.AddRank(static_cast<int32_t>(r), rec.peak_reserved, rec.peak_allocated, rec.retries, rec.num_ooms);
    nlohmann::ordered_json rank;
    rank["rank"] = r;
    rank["step_time_ns"] = median;
    rank["step_times_ns"] = rec.step_times;
    rank["host_busy_ns"] = rec.host_busy_ns;
    rank["finished"] = rec.finished;
    rank["capacity_bytes"] = rec.capacity;
    rank["peak_allocated_bytes"] = rec.peak_allocated;
    rank["peak_reserved_bytes"] = rec.peak_reserved;
    rank["fragmentation_bytes"] = rec.fragmentation;
    rank["num_alloc_retries"] = rec.retries;
    rank["num_ooms"] = rec.num_ooms;
    rank["num_device_alloc"] = rec.device_allocs;
    rank["num_device_free"] = rec.device_frees;
    if (rec.oom) {
      rank["oom"] = {{"op_id", rec.oom->op_id},
                     {"time_ns", rec.oom->time_ns},
                     {"requested_bytes", rec.oom->requested},
                     {"free_bytes", rec.oom->free_bytes},
                     {"largest_free_block", rec.oom->largest_free},
                     {"injected", rec.oom->injected}};
    } else {
      rank["oom"] = nullptr;
    }
    if (rank_extras) rank_extras(rec, rank);
    per_rank.push_back(rank);
  }
  j["completed"] = completed;
  j["step_time_ns"] = step;
  traces::WriteReportMemory(memory, setup.memory.alloc_conf, j);
  // The memory outside the step as the schedule's metadata describes it, with the measured
  // peaks; the init phase is simulate's (a run does not measure it): null here.
  std::vector<sim::RankStepMemory> step_memory;
  step_memory.reserve(ranks.size());
  for (const RankResult& rec : ranks) step_memory.push_back({rec.peak_reserved, rec.num_ooms > 0});
  traces::WriteReportMemoryPhases(sim::MemoryPhasesOf(schedule, setup, step_memory, /*simulate_init=*/false), j);
  j["hang"] = false;  // a hang aborts the job: its evidence is in flight_recorder/
  j["runtime"] = runtime;
  j["ranks"] = per_rank;
  return j.dump(2) + "\n";
}

}  // namespace shardscope::runtime

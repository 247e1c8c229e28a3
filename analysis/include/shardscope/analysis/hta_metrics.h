// Holistic Trace Analysis's per-rank GPU metrics (facebookresearch/HolisticTraceAnalysis),
// computed exactly as HTA computes them, for `shardscope analyze` and the diff (one
// implementation for both):
//
//   SHARDSCOPE_ASSIGN_OR_RETURN(DiffSide side, LoadDiffSide("rank0.pt.trace.json.gz"));
//   std::vector<HtaRankMetrics> ranks = ComputeHtaMetrics(side, HtaOptions{});
//
// What HTA does, and so what this does (hta_metrics.cc cites the function beside each step):
// - Events. A GPU event is a kernel, gpu_memcpy or gpu_memset slice (in Kineto traces exactly
//   the events carrying a "stream" arg, HTA's test); everything else is a CPU event, the
//   gpu_user_annotation ranges included. Its type comes from its name: communication when it
//   starts with "nccl" (or holds "gloo:"), memory when it holds "Memcpy" or "Memset",
//   computation otherwise (hta/utils/utils.py get_kernel_type). A slice carrying collective
//   args, or in the gpu_memcpy / gpu_memset category, is also communication / memory (our
//   own traces name kernels freely; in Kineto traces the two rules agree).
// - Rounding. When a rank's timestamps hold fractions of a microsecond, HTA's JSON parser
//   rounds every event inward to whole microseconds: start up, end down
//   (hta/common/trace_parser.py _parse_trace_dataframe_json, after pytorch/pytorch#122425).
//   This changes the figures by up to half a percentage point on a real trace, so it is on
//   by default (HtaOptions::round_to_whole_us). An event that rounds to nothing counts as empty.
// - Steps. With two or more distinct ProfilerStep# names, HTA keeps only the GPU events
//   launched before the last step began: those whose correlation id is shared by a CPU event
//   starting before the last ProfilerStep's start (hta/common/trace.py
//   _filter_irrelevant_gpu_kernels). GPU events without a correlation id are kept (HTA's
//   join on the default -1 matches them to every CPU op). With fewer steps nothing is filtered.
// - Temporal breakdown (hta/analyzers/breakdown_analysis.py get_temporal_breakdown): the span
//   runs from the first GPU event's start to the last one's end; idle = span - |union of GPU
//   events|; compute = |union of computation events|; non-compute = span - compute - idle.
// - Overlap (hta/analyzers/communication_analysis.py get_comm_comp_overlap):
//   |computation ∩ communication| / |communication|, each a union first.
// - Idle time per stream (breakdown_analysis.py _analyze_idle_time_for_stream): the GPU
//   events of one stream in start order; the gap before each is its start minus the previous
//   event's end; host wait when its launching CPU event (same correlation id) started after
//   that end, else kernel wait when the gap is under the threshold, else other. HTA's
//   threshold is 30 (trace_analysis.py get_idle_time_breakdown, consecutive_kernel_delay),
//   documented as nanoseconds but compared with timestamps in the trace's unit, which
//   Kineto writes in microseconds: 30 us is what HTA applies, so it is our default. Per
//   stream the idle time is at most the stream's span, itself within the rank's span; it
//   is never summed over streams (streams idle at the same time).
// - Kernel-type breakdown (breakdown_analysis.py get_gpu_kernel_breakdown,
//   _get_gpu_kernel_type_time): time covered by each combination of the three types'
//   unions ("COMPUTATION", "COMPUTATION overlapping COMMUNICATION", ...).
// Ranks: a file's distributedInfo.rank, or the pid in our own multi-rank traces (DiffSide's
// rule); HTA needs distributedInfo.rank in every file.
#ifndef SHARDSCOPE_ANALYSIS_HTA_METRICS_H_
#define SHARDSCOPE_ANALYSIS_HTA_METRICS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "shardscope/traces/timeline.h"

namespace shardscope::traces {

struct DiffSide;  // diff.h: trace files and the rank of each

struct HtaOptions {
  // HTA's consecutive_kernel_delay as HTA applies it to Kineto's microsecond timestamps.
  int64_t kernel_wait_threshold_ns = 30'000;
  // HTA's rounding of fractional-microsecond timestamps (see above).
  bool round_to_whole_us = true;
  // HTA's include_last_profiler_step (TraceAnalysis's constructor; default False).
  bool include_last_profiler_step = false;
  int32_t rank = -1;  // only this rank (-1: all)
};

enum class HtaKernelType : uint8_t { kComputation, kCommunication, kMemory };
std::string_view HtaKernelTypeName(HtaKernelType type);  // "COMPUTATION", ...
bool IsHtaGpuEvent(const Slice& slice);
HtaKernelType HtaKernelTypeOf(const Slice& slice);

// HTA's idle-time breakdown of one stream.
struct HtaStreamIdle {
  int32_t pid = 0;
  int32_t tid = 0;
  int64_t stream = 0;        // the CUDA stream id (the "stream" arg), else the tid
  std::string name;          // the track's thread_name, else "stream <id>"
  int64_t events = 0;
  int64_t idle_ns = 0;       // host_wait + kernel_wait + other
  int64_t host_wait_ns = 0;
  int64_t kernel_wait_ns = 0;
  int64_t other_ns = 0;
};

struct HtaKernelTypeTime {
  std::string type;  // HTA's label
  int64_t ns = 0;
};

struct HtaRankMetrics {
  int32_t rank = 0;
  int64_t gpu_events = 0;              // after the step filter
  int32_t profiler_steps = 0;          // distinct ProfilerStep# names
  bool last_step_excluded = false;     // the step filter ran
  bool rounded_to_us = false;
  int64_t span_ns = 0;                 // HTA's kernel_time
  int64_t idle_ns = 0;
  int64_t compute_ns = 0;
  int64_t non_compute_ns = 0;
  int64_t comm_ns = 0;                 // union of communication events
  int64_t overlap_ns = 0;              // |computation ∩ communication|
  std::vector<HtaStreamIdle> streams;  // by (pid, stream)
  std::vector<HtaKernelTypeTime> kernel_types;  // in bitmask order, only those present

  double Pct(int64_t part) const;      // 100 * part / span (0 when the span is 0)
  double IdlePct() const { return Pct(idle_ns); }
  double ComputePct() const { return Pct(compute_ns); }
  double NonComputePct() const { return Pct(non_compute_ns); }
  // 100 * overlap / communication (0 without communication).
  double CommCompOverlapPct() const;
};

// Per rank of `side`, ascending rank.
std::vector<HtaRankMetrics> ComputeHtaMetrics(const DiffSide& side, const HtaOptions& options);

// `shardscope analyze`'s table, and its --json form:
// {"ranks":[{"rank","idle_pct","compute_pct","non_compute_pct","comm_comp_overlap_pct",
//   "span_ns","idle_ns","compute_ns","non_compute_ns","communication_ns","overlap_ns",
//   "gpu_events","profiler_steps","last_step_excluded","rounded_to_us",
//   "streams":[{"stream","name","events","idle_ns","idle_pct","host_wait_ns",
//     "host_wait_pct","kernel_wait_ns","kernel_wait_pct","other_ns","other_pct"}],
//   "kernel_types":[{"type","ns","pct"}]}]}
// A stream's idle_pct is of the rank's span; its host/kernel/other pct of its own idle time
// (HTA's idle_time_ratio); a kernel type's pct of the rank's GPU busy time.
std::string HtaMetricsText(const std::vector<HtaRankMetrics>& ranks);
std::string HtaMetricsJson(const std::vector<HtaRankMetrics>& ranks, const HtaOptions& options);

}  // namespace shardscope::traces

#endif  // SHARDSCOPE_ANALYSIS_HTA_METRICS_H_

// Holistic Trace Analysis's per-rank metrics (hta_metrics.h has the definitions and the HTA
// functions they follow; each step below cites its function again).
#include "shardscope/analysis/hta_metrics.h"

#include "shardscope/analysis/diff.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <climits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>
#include <utility>

namespace shardscope::traces {
namespace {

using Interval = std::pair<int64_t, int64_t>;  // [begin, end)

// Kineto writes microseconds; HTA's dataframes hold them as they are.
constexpr int64_t kNsPerUs = 1000;
// torch.profiler.profile.step() names its record_function "ProfilerStep#<n>"
// (torch/profiler/profiler.py); HTA's symbol table finds them by this prefix
// (hta/common/trace_symbol_table.py get_profiler_step_ids).
constexpr std::string_view kProfilerStepPrefix = "ProfilerStep";

// For b > 0, without negating a (INT64_MIN has no negation).
int64_t FloorDiv(int64_t a, int64_t b) { return a / b - (a % b < 0 ? 1 : 0); }
int64_t CeilDiv(int64_t a, int64_t b) { return a / b + (a % b > 0 ? 1 : 0); }
// ts + dur, saturating: a hostile file may hold timestamps near the int64 limits.
int64_t EndOf(int64_t ts, int64_t dur) {
  int64_t end = 0;
  return __builtin_add_overflow(ts, dur, &end) ? INT64_MAX : end;
}

// hta/utils/utils.py merge_kernel_intervals: sorted by start, an interval joins the group
// while its start is not after the largest end so far (touching intervals merge).
std::vector<Interval> Merge(std::vector<Interval> intervals) {
  std::sort(intervals.begin(), intervals.end());
  std::vector<Interval> merged;
  for (const Interval& interval : intervals) {
    if (!merged.empty() && interval.first <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, interval.second);
    } else {
      merged.push_back(interval);
    }
  }
  return merged;
}

int64_t Length(const std::vector<Interval>& merged) {
  int64_t total = 0;
  for (const auto& [begin, end] : merged) total += end - begin;
  return total;
}

int64_t IntersectionLength(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  int64_t total = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const int64_t begin = std::max(a[i].first, b[j].first);
    const int64_t end = std::min(a[i].second, b[j].second);
    if (end > begin) total += end - begin;
    if (a[i].second < b[j].second) {
      ++i;
    } else {
      ++j;
    }
  }
  return total;
}

std::optional<int64_t> IntArg(const Slice& slice, std::string_view key) {
  for (const Arg& arg : slice.args) {
    if (arg.key != key) continue;
    if (const auto* value = std::get_if<int64_t>(&arg.value)) return *value;
  }
  return std::nullopt;
}

struct GpuEvent {
  int64_t ts = 0;
  int64_t end = 0;
  int64_t correlation = -1;
  HtaKernelType type = HtaKernelType::kComputation;
  std::pair<int32_t, int64_t> stream;  // (pid, stream id)
};

struct CpuEvent {
  int64_t ts = 0;
  int64_t end = 0;
  int64_t correlation = -1;
};

// One rank's events, as HTA's dataframe holds them.
struct RankEvents {
  std::vector<GpuEvent> gpu;
  std::vector<CpuEvent> cpu;
  std::vector<std::pair<int64_t, int64_t>> profiler_steps;  // (ts, end)
  std::set<std::string> step_names;
  bool fractional_us = false;
  std::map<std::pair<int32_t, int64_t>, std::pair<size_t, int32_t>> stream_track;  // -> (file, tid)
};

std::string StreamName(const DiffSide& side, size_t file, int32_t pid, int32_t tid, int64_t stream) {
  for (const ThreadInfo& thread : side.files[file].threads) {
    if (thread.pid == pid && thread.tid == tid && !thread.name.empty()) return thread.name;
  }
  return fmt::format("stream {}", stream);
}

}  // namespace

std::string_view HtaKernelTypeName(HtaKernelType type) {
  switch (type) {
    case HtaKernelType::kComputation: return "COMPUTATION";
    case HtaKernelType::kCommunication: return "COMMUNICATION";
    case HtaKernelType::kMemory: return "MEMORY";
  }
  return "?";
}

bool IsHtaGpuEvent(const Slice& slice) {
  return slice.category == Category::kKernel || slice.category == Category::kGpuMemcpy ||
         slice.category == Category::kGpuMemset;
}

HtaKernelType HtaKernelTypeOf(const Slice& slice) {
  // hta/utils/utils.py get_kernel_type: is_comm_kernel (the name starts with "nccl", or holds
  // "gloo:") before is_memory_kernel (the name holds "Memcpy" or "Memset").
  const std::string_view name = slice.name;
  if (name.starts_with("nccl") || name.find("gloo:") != std::string_view::npos || slice.collective.has_value()) {
    return HtaKernelType::kCommunication;
  }
  if (name.find("Memcpy") != std::string_view::npos || name.find("Memset") != std::string_view::npos ||
      slice.category == Category::kGpuMemcpy || slice.category == Category::kGpuMemset) {
    return HtaKernelType::kMemory;
  }
  return HtaKernelType::kComputation;
}

double HtaRankMetrics::Pct(int64_t part) const {
  return span_ns > 0 ? 100.0 * static_cast<double>(part) / static_cast<double>(span_ns) : 0.0;
}

double HtaRankMetrics::CommCompOverlapPct() const {
  return comm_ns > 0 ? 100.0 * static_cast<double>(overlap_ns) / static_cast<double>(comm_ns) : 0.0;
}

std::vector<HtaRankMetrics> ComputeHtaMetrics(const DiffSide& side, const HtaOptions& options) {
  std::map<int32_t, RankEvents> ranks;
  for (size_t f = 0; f < side.files.size(); ++f) {
    for (const Slice& slice : side.files[f].slices) {
      const int32_t rank = side.file_rank[f] == DiffSide::kPidIsRank ? slice.pid : side.file_rank[f];
      if (options.rank >= 0 && rank != options.rank) continue;
      RankEvents& r = ranks[rank];
      // HTA's parser rounds when the ts column is fractional (a float column).
      r.fractional_us = r.fractional_us || slice.ts_ns % kNsPerUs != 0;
      const int64_t dur = std::max<int64_t>(0, slice.dur_ns);
      if (IsHtaGpuEvent(slice)) {
        const int64_t stream = IntArg(slice, "stream").value_or(slice.tid);
        const GpuEvent e{slice.ts_ns, EndOf(slice.ts_ns, dur), slice.correlation, HtaKernelTypeOf(slice),
                         {slice.pid, stream}};
        r.stream_track.try_emplace(e.stream, f, slice.tid);
        r.gpu.push_back(e);
        continue;
      }
      r.cpu.push_back({slice.ts_ns, EndOf(slice.ts_ns, dur), slice.correlation});
      if (slice.name.starts_with(kProfilerStepPrefix)) {
        r.profiler_steps.emplace_back(slice.ts_ns, EndOf(slice.ts_ns, dur));
        r.step_names.insert(slice.name);
      }
    }
  }

  std::vector<HtaRankMetrics> out;
  for (auto& [rank, r] : ranks) {
    HtaRankMetrics m;
    m.rank = rank;
    m.profiler_steps = static_cast<int32_t>(r.step_names.size());
    // hta/common/trace_parser.py _parse_trace_dataframe_json: ts = ceil(ts), end =
    // floor(ts + dur) in microseconds when the timestamps are fractional.
    m.rounded_to_us = options.round_to_whole_us && r.fractional_us;
    const auto round = [&](int64_t& ts, int64_t& end) {
      if (!m.rounded_to_us) return;
      ts = std::min(CeilDiv(ts, kNsPerUs), INT64_MAX / kNsPerUs) * kNsPerUs;
      end = std::max(ts, FloorDiv(end, kNsPerUs) * kNsPerUs);
    };
    for (GpuEvent& e : r.gpu) round(e.ts, e.end);
    for (CpuEvent& e : r.cpu) round(e.ts, e.end);
    for (auto& [ts, end] : r.profiler_steps) round(ts, end);

    // hta/common/trace.py _filter_irrelevant_gpu_kernels: with two or more ProfilerStep
    // names, only the GPU events launched (same correlation) by CPU events that start before
    // the last step's start (or, with include_last_profiler_step, not after its end).
    std::vector<GpuEvent> gpu;
    if (r.step_names.size() >= 2) {
      m.last_step_excluded = !options.include_last_profiler_step;
      int64_t last_start = INT64_MIN;
      int64_t last_end = INT64_MIN;
      for (const auto& [ts, end] : r.profiler_steps) {
        last_start = std::max(last_start, ts);
        last_end = std::max(last_end, end);
      }
      std::set<int64_t> launched;
      bool uncorrelated_cpu = false;
      for (const CpuEvent& e : r.cpu) {
        const bool kept = options.include_last_profiler_step ? e.ts <= last_end : e.ts < last_start;
        if (!kept) continue;
        if (e.correlation >= 0) {
          launched.insert(e.correlation);
        } else {
          uncorrelated_cpu = true;
        }
      }
      for (const GpuEvent& e : r.gpu) {
        if (e.correlation >= 0 ? launched.count(e.correlation) != 0 : uncorrelated_cpu) gpu.push_back(e);
      }
    } else {
      gpu = std::move(r.gpu);
    }
    m.gpu_events = static_cast<int64_t>(gpu.size());

    // Temporal breakdown (breakdown_analysis.py get_temporal_breakdown, _get_idle_time_for_kernels).
    std::array<std::vector<Interval>, 3> by_type;
    std::vector<Interval> all;
    for (const GpuEvent& e : gpu) {
      all.emplace_back(e.ts, e.end);
      by_type[static_cast<size_t>(e.type)].emplace_back(e.ts, e.end);
    }
    const std::vector<Interval> merged_all = Merge(std::move(all));
    std::array<std::vector<Interval>, 3> merged;
    for (size_t t = 0; t < 3; ++t) merged[t] = Merge(std::move(by_type[t]));
    if (!merged_all.empty()) {
      m.span_ns = merged_all.back().second - merged_all.front().first;
      m.idle_ns = m.span_ns - Length(merged_all);
      m.compute_ns = Length(merged[static_cast<size_t>(HtaKernelType::kComputation)]);
      m.non_compute_ns = m.span_ns - m.compute_ns - m.idle_ns;
    }
    // communication_analysis.py get_comm_comp_overlap.
    const auto& comp = merged[static_cast<size_t>(HtaKernelType::kComputation)];
    const auto& comm = merged[static_cast<size_t>(HtaKernelType::kCommunication)];
    m.comm_ns = Length(comm);
    m.overlap_ns = IntersectionLength(comp, comm);

    // Kernel-type breakdown (breakdown_analysis.py _get_gpu_kernel_type_time): a sweep over the
    // three unions with bit 1 << type set while a type runs; each stretch goes to the label of
    // its bit set, the types named in HTA's order joined by " overlapping ".
    std::vector<std::pair<int64_t, int>> edges;  // (time, +bit or -bit)
    for (size_t t = 0; t < 3; ++t) {
      const int bit = 1 << t;
      for (const auto& [begin, end] : merged[t]) {
        edges.emplace_back(begin, bit);
        edges.emplace_back(end, -bit);
      }
    }
    std::sort(edges.begin(), edges.end());
    std::array<int64_t, 8> by_mask{};
    int running = 0;
    for (size_t i = 0; i < edges.size(); ++i) {
      running += edges[i].second;
      if (i + 1 < edges.size() && running > 0) by_mask[static_cast<size_t>(running)] += edges[i + 1].first - edges[i].first;
    }
    for (int mask = 1; mask < 8; ++mask) {
      if (by_mask[static_cast<size_t>(mask)] == 0) continue;
      std::string label;
      for (size_t t = 0; t < 3; ++t) {
        if ((mask & (1 << t)) == 0) continue;
        label += (label.empty() ? "" : " overlapping ") + std::string(HtaKernelTypeName(static_cast<HtaKernelType>(t)));
      }
      m.kernel_types.push_back({label, by_mask[static_cast<size_t>(mask)]});
    }

    // Idle time per stream (breakdown_analysis.py get_idle_time_breakdown,
    // _analyze_idle_time_for_stream). The launching CPU event of a GPU event is the CPU event
    // with its correlation id (hta/common/trace.py transform_correlation_to_index; the last
    // one when several share it, as its assignment leaves it).
    std::unordered_map<int64_t, int64_t> launch_ts;
    for (const CpuEvent& e : r.cpu) {
      if (e.correlation >= 0) launch_ts[e.correlation] = e.ts;
    }
    std::stable_sort(gpu.begin(), gpu.end(), [](const GpuEvent& a, const GpuEvent& b) {
      return std::tie(a.stream, a.ts) < std::tie(b.stream, b.ts);
    });
    for (size_t i = 0; i < gpu.size();) {
      size_t j = i;
      while (j < gpu.size() && gpu[j].stream == gpu[i].stream) ++j;
      HtaStreamIdle s;
      s.pid = gpu[i].stream.first;
      s.stream = gpu[i].stream.second;
      const auto& [file, tid] = r.stream_track.at(gpu[i].stream);
      s.tid = tid;
      s.name = StreamName(side, file, s.pid, tid, s.stream);
      s.events = static_cast<int64_t>(j - i);
      for (size_t k = i + 1; k < j; ++k) {
        const int64_t previous_end = gpu[k - 1].end;
        // HTA adds a negative gap (an event starting before the previous one ended) as it
        // is; a CUDA stream runs its work in order, so only rounding or a malformed trace
        // makes one, and it counts as no idle time here rather than negative idle time.
        const int64_t gap = std::max<int64_t>(0, gpu[k].ts - previous_end);
        auto launch = gpu[k].correlation >= 0 ? launch_ts.find(gpu[k].correlation) : launch_ts.end();
        if (launch != launch_ts.end() && launch->second > previous_end) {
          s.host_wait_ns += gap;
        } else if (gpu[k].ts - previous_end < options.kernel_wait_threshold_ns) {
          s.kernel_wait_ns += gap;
        } else {
          s.other_ns += gap;
        }
      }
      s.idle_ns = s.host_wait_ns + s.kernel_wait_ns + s.other_ns;
      m.streams.push_back(std::move(s));
      i = j;
    }
    out.push_back(std::move(m));
  }
  return out;
}

namespace {

double Share(int64_t part, int64_t whole) {
  return whole > 0 ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}

// Percentages rounded to 2 decimals as HTA prints them (round(100 * ratio, 2)).
double Round2(double pct) { return static_cast<double>(static_cast<int64_t>(pct * 100.0 + (pct >= 0 ? 0.5 : -0.5))) / 100.0; }

int64_t BusyNs(const HtaRankMetrics& m) { return m.span_ns - m.idle_ns; }

}  // namespace

std::string HtaMetricsText(const std::vector<HtaRankMetrics>& ranks) {
  std::string out;
  out += "Holistic Trace Analysis metrics per rank (HTA's definitions; docs/ANALYZE.md)\n";
  out += fmt::format("{:>6} {:>12} {:>8} {:>10} {:>13} {:>14} {:>9}  {}\n", "rank", "span (us)", "idle %", "compute %",
                     "non-compute %", "comm overlap %", "events", "steps");
  for (const HtaRankMetrics& m : ranks) {
    out += fmt::format("{:>6} {:>12.1f} {:>8.2f} {:>10.2f} {:>13.2f} {:>14.2f} {:>9}  {}\n", m.rank,
                       static_cast<double>(m.span_ns) * 1e-3, m.IdlePct(), m.ComputePct(), m.NonComputePct(),
                       m.CommCompOverlapPct(), m.gpu_events,
                       m.last_step_excluded ? fmt::format("{} ProfilerStep(s), last excluded", m.profiler_steps)
                       : m.profiler_steps > 0 ? fmt::format("{} ProfilerStep(s), all kept", m.profiler_steps)
                                              : std::string("no ProfilerStep: all events"));
  }
  for (const HtaRankMetrics& m : ranks) {
    out += fmt::format("rank {}: idle time per stream (host wait / kernel wait / other, % of the stream's idle time)\n",
                       m.rank);
    for (const HtaStreamIdle& s : m.streams) {
      out += fmt::format("  {:<40} {:>7} events  idle {:>12.1f} us ({:>6.2f}% of span)  host {:>6.2f}%  kernel {:>6.2f}%  "
                         "other {:>6.2f}%\n",
                         s.name, s.events, static_cast<double>(s.idle_ns) * 1e-3, m.Pct(s.idle_ns),
                         Share(s.host_wait_ns, s.idle_ns), Share(s.kernel_wait_ns, s.idle_ns),
                         Share(s.other_ns, s.idle_ns));
    }
    out += fmt::format("rank {}: kernel types (% of GPU busy time)\n", m.rank);
    for (const HtaKernelTypeTime& k : m.kernel_types) {
      out += fmt::format("  {:<56} {:>12.1f} us {:>7.2f}%\n", k.type, static_cast<double>(k.ns) * 1e-3,
                         Share(k.ns, BusyNs(m)));
    }
  }
  return out;
}

std::string HtaMetricsJson(const std::vector<HtaRankMetrics>& ranks, const HtaOptions& options) {
  using Json = nlohmann::ordered_json;
  Json j;
  j["schema"] = "shardscope.analyze/1";
  j["kernel_wait_threshold_ns"] = options.kernel_wait_threshold_ns;
  j["include_last_profiler_step"] = options.include_last_profiler_step;
  Json list = Json::array();
  for (const HtaRankMetrics& m : ranks) {
    Json r;
    r["rank"] = m.rank;
    r["idle_pct"] = Round2(m.IdlePct());
    r["compute_pct"] = Round2(m.ComputePct());
    r["non_compute_pct"] = Round2(m.NonComputePct());
    r["comm_comp_overlap_pct"] = Round2(m.CommCompOverlapPct());
    r["span_ns"] = m.span_ns;
    r["idle_ns"] = m.idle_ns;
    r["compute_ns"] = m.compute_ns;
    r["non_compute_ns"] = m.non_compute_ns;
    r["communication_ns"] = m.comm_ns;
    r["overlap_ns"] = m.overlap_ns;
    r["gpu_events"] = m.gpu_events;
    r["profiler_steps"] = m.profiler_steps;
    r["last_step_excluded"] = m.last_step_excluded;
    r["rounded_to_us"] = m.rounded_to_us;
    Json streams = Json::array();
    for (const HtaStreamIdle& s : m.streams) {
      streams.push_back({{"stream", s.stream},
                         {"name", s.name},
                         {"events", s.events},
                         {"idle_ns", s.idle_ns},
                         {"idle_pct", Round2(m.Pct(s.idle_ns))},
                         {"host_wait_ns", s.host_wait_ns},
                         {"host_wait_pct", Round2(Share(s.host_wait_ns, s.idle_ns))},
                         {"kernel_wait_ns", s.kernel_wait_ns},
                         {"kernel_wait_pct", Round2(Share(s.kernel_wait_ns, s.idle_ns))},
                         {"other_ns", s.other_ns},
                         {"other_pct", Round2(Share(s.other_ns, s.idle_ns))}});
    }
    r["streams"] = streams;
    Json types = Json::array();
    for (const HtaKernelTypeTime& k : m.kernel_types) {
      types.push_back({{"type", k.type}, {"ns", k.ns}, {"pct", Round2(Share(k.ns, BusyNs(m)))}});
    }
    r["kernel_types"] = types;
    list.push_back(r);
  }
  j["ranks"] = list;
  return j.dump(2) + "\n";
}

}  // namespace shardscope::traces

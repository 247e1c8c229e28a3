// Op classes and per-rank metrics of one side of a diff: the step, stream busy time, and
// Holistic Trace Analysis's metrics from hta_metrics.cc (the code `shardscope analyze` runs).
#include <algorithm>
#include <array>
#include <cctype>
#include <map>
#include <optional>

#include "diff_internal.h"

namespace shardscope::traces::diff_internal {
namespace {

std::string Lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool ContainsAny(const std::string& text, std::initializer_list<std::string_view> needles) {
  for (std::string_view needle : needles) {
    if (text.find(needle) != std::string::npos) return true;
  }
  return false;
}

// Collective type from a name such as "all_gather", "ncclDevKernel_ReduceScatter_RING_LL" or
// "ncclKernel_AllReduce_RING_LL_Sum_float" (underscores ignored, case-insensitive).
OpClass CollectiveClass(std::string_view name) {
  std::string squeezed;
  for (char c : name) {
    if (c != '_') squeezed.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  if (squeezed.find("allgather") != std::string::npos) return OpClass::kAllGather;
  if (squeezed.find("reducescatter") != std::string::npos) return OpClass::kReduceScatter;
  if (squeezed.find("allreduce") != std::string::npos) return OpClass::kAllReduce;
  if (squeezed.find("alltoall") != std::string::npos) return OpClass::kAllToAll;
  if (squeezed.find("broadcast") != std::string::npos) return OpClass::kBroadcast;
  if (ContainsAny(squeezed, {"sendrecv", "send", "recv"})) return OpClass::kSendRecv;
  if (squeezed.find("reduce") != std::string::npos) return OpClass::kReduce;
  return OpClass::kOtherCollective;
}

// A kernel doing at least this many FLOPs per byte moved is a matrix multiply when its name
// says nothing: elementwise, normalization and reduction kernels do O(1) FLOP per byte,
// GEMMs O(min(m, n, k)). Estimate: 10 is far below any GPU's ridge point (A100: 312 TFLOP/s
// / 2.0 TB/s = 156 FLOP/B) and far above elementwise work.
constexpr double kGemmMinFlopsPerByte = 10.0;

double NumericArg(const Slice& slice, std::string_view key) {
  for (const Arg& arg : slice.args) {
    if (arg.key != key) continue;
    if (const auto* d = std::get_if<double>(&arg.value)) return *d;
    if (const auto* i = std::get_if<int64_t>(&arg.value)) return static_cast<double>(*i);
  }
  return 0;
}

// Union of intervals (sorted in place by start) as disjoint sorted intervals.
std::vector<std::pair<int64_t, int64_t>> Merge(std::vector<std::pair<int64_t, int64_t>> intervals) {
  std::sort(intervals.begin(), intervals.end());
  std::vector<std::pair<int64_t, int64_t>> merged;
  for (const auto& [begin, end] : intervals) {
    if (!merged.empty() && begin <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, end);
    } else {
      merged.emplace_back(begin, end);
    }
  }
  return merged;
}

int64_t Length(const std::vector<std::pair<int64_t, int64_t>>& merged) {
  int64_t total = 0;
  for (const auto& [begin, end] : merged) total += end - begin;
  return total;
}

}  // namespace

// Rules, first that applies (docs/DIFF.md):
// - a slice with NCCL collective args, or a device slice whose name holds "nccl" (HTA's
//   communication kernels: hta/utils/utils.py is_comm_kernel), by collective type;
// - gpu_memcpy / gpu_memset (HTA's memory kernels: Memcpy / Memset) -> memcpy;
// - other device slices: attention when the name says flash / fmha / attention / sdpa /
//   attn.core (our lowering's attention kernels, sim/presets/src/model.cc); GEMM when it says gemm /
//   cutlass / cublas / xmma / nvjet / matmul / _proj / dense / linear / .wgrad / .dgrad, or
//   its "flops" / "bytes" args give >= kGemmMinFlopsPerByte; otherwise memory-bound;
// - host slices: cudaMalloc* / cudaFree* / allocator retries ("alloc_retry", names holding
//   "CachingAllocator") -> allocator stall; everything else -> host op.
namespace {

// The rules that depend on the name (and category) alone; nullopt when the slice's
// "flops" / "bytes" args decide between GEMM and memory-bound.
std::optional<OpClass> ClassifyByName(std::string_view raw_name, Category category, bool device) {
  const std::string name = Lower(raw_name);
  if (!device) {
    if (name.rfind("cudamalloc", 0) == 0 || name.rfind("cudafree", 0) == 0 ||
        ContainsAny(name, {"alloc_retry", "cachingallocator"})) {
      return OpClass::kAllocatorStall;
    }
    return OpClass::kHostOp;
  }
  if (name.find("nccl") != std::string::npos) return CollectiveClass(name);
  if (category == Category::kGpuMemcpy || category == Category::kGpuMemset) return OpClass::kMemcpy;
  if (ContainsAny(name, {"flash", "fmha", "attention", "sdpa", "attn.core"})) return OpClass::kAttention;
  if (ContainsAny(name, {"gemm", "cutlass", "cublas", "xmma", "nvjet", "matmul", "_proj", "dense", "linear", ".wgrad",
                         ".dgrad"})) {
    return OpClass::kGemm;
  }
  return std::nullopt;
}

OpClass ClassifyByArgs(const Slice& slice) {
  const double flops = NumericArg(slice, "flops");
  const double bytes = NumericArg(slice, "bytes");
  if (flops > 0 && bytes > 0 && flops / bytes >= kGemmMinFlopsPerByte) return OpClass::kGemm;
  return OpClass::kMemoryBound;
}

}  // namespace

OpClass ClassifySlice(const Slice& slice, bool device) {
  if (slice.collective.has_value() && !slice.collective->collective_name.empty()) {
    return CollectiveClass(slice.collective->collective_name);
  }
  if (std::optional<OpClass> by_name = ClassifyByName(slice.name, slice.category, device)) return *by_name;
  return ClassifyByArgs(slice);
}

OpClass ClassCache::Classify(const Slice& slice, bool device) {
  if (slice.collective.has_value() && !slice.collective->collective_name.empty()) {
    return CollectiveClass(slice.collective->collective_name);
  }
  auto [it, inserted] = by_name_.try_emplace(std::string_view(slice.name));
  Entry& entry = it->second;
  if (inserted) {
    entry = Entry{slice.category, device, ClassifyByName(slice.name, slice.category, device)};
  } else if (entry.category != slice.category || entry.device != device) {
    // The same name in another category (rare): not cached.
    std::optional<OpClass> by_name = ClassifyByName(slice.name, slice.category, device);
    return by_name ? *by_name : ClassifyByArgs(slice);
  }
  return entry.by_name ? *entry.by_name : ClassifyByArgs(slice);
}

std::vector<RankMetrics> ComputeRankMetrics(const DiffSide& side, const SideAnalysis& analysis,
                                            const DiffOptions& options) {
  // ProfilerStep#N annotations (PyTorch's profiler.step(): torch/profiler/profiler.py
  // names the record_function "ProfilerStep#" + step number), per rank. Schema-1 traces
  // (2021) record them as CPU ops ("Operator").
  struct StepSpan {
    int64_t begin = INT64_MAX;
    int64_t end = INT64_MIN;
    int32_t count = 0;
  };
  std::map<int32_t, StepSpan> steps;
  for (size_t f = 0; f < side.files.size(); ++f) {
    for (const Slice& slice : side.files[f].slices) {
      if ((slice.category != Category::kUserAnnotation && slice.category != Category::kCpuOp) ||
          slice.name.rfind("ProfilerStep#", 0) != 0) {
        continue;
      }
      const int32_t rank = RankOf(side, f, slice.pid);
      if (options.rank >= 0 && rank != options.rank) continue;
      StepSpan& span = steps[rank];
      span.begin = std::min(span.begin, slice.ts_ns);
      span.end = std::max(span.end, slice.ts_ns + slice.dur_ns);
      ++span.count;
    }
  }
  // Holistic Trace Analysis's metrics: one implementation, shared with `shardscope analyze`.
  HtaOptions hta_options = options.hta;
  hta_options.rank = options.rank;
  std::map<int32_t, HtaRankMetrics> hta;
  for (HtaRankMetrics& m : ComputeHtaMetrics(side, hta_options)) hta.emplace(m.rank, std::move(m));

  std::vector<RankMetrics> out;
  const std::vector<DiffEvent>& events = analysis.events;
  for (const RankRange& range : RankRanges(events)) {
    RankMetrics m;
    m.rank = range.rank;
    int64_t device_begin = INT64_MAX;
    int64_t device_end = INT64_MIN;
    int64_t any_begin = INT64_MAX;
    int64_t any_end = INT64_MIN;
    for (size_t i = range.begin; i < range.end; ++i) {
      const DiffEvent& e = events[i];
      any_begin = std::min(any_begin, e.ts_ns);
      any_end = std::max(any_end, e.end_ns());
      if (!e.device) continue;
      device_begin = std::min(device_begin, e.ts_ns);
      device_end = std::max(device_end, e.end_ns());
    }
    auto step = steps.find(range.rank);
    if (step != steps.end()) {
      m.from_profiler_steps = true;
      m.steps = step->second.count;
      m.step_start_ns = step->second.begin;
      m.step_ns = (step->second.end - step->second.begin) / step->second.count;
    } else if (device_begin <= device_end) {
      m.step_start_ns = device_begin;
      m.step_ns = device_end - device_begin;
    } else {
      m.step_start_ns = any_begin;
      m.step_ns = any_end - any_begin;
    }
    // Per device track: the time it is busy (the union of its slices).
    for (size_t i = range.begin; i < range.end;) {
      size_t j = i;
      while (j < range.end && events[j].track == events[i].track) ++j;
      if (events[i].device) {
        std::vector<std::pair<int64_t, int64_t>> intervals;
        for (size_t k = i; k < j; ++k) intervals.emplace_back(events[k].ts_ns, events[k].end_ns());
        m.streams.push_back(StreamBusy{events[i].track, Length(Merge(std::move(intervals)))});
      }
      i = j;
    }
    if (auto it = hta.find(range.rank); it != hta.end()) m.hta = std::move(it->second);
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace shardscope::traces::diff_internal

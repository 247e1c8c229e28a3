// Reading the two sides of a diff (a file, a directory with trace.json, or per-rank files)
// and flattening each into tracks and events.
#include <algorithm>
#include <climits>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "diff_internal.h"
#include "shardscope/traces/chrome_trace.h"

namespace shardscope::traces {
namespace {

bool ProducedByShardscope(const Timeline& timeline) { return timeline.info.producer.rfind("shardscope", 0) == 0; }

// `shardscope run` writes DIR/report.json beside DIR/trace.json; its "runtime" object says the
// host backend's time_scale and the warm-up steps (runtime/src/host_backend.cc ReportJson,
// runtime/src/cuda/cuda_backend.cc). Read when present; a report that is not JSON is ignored
// with a warning (the trace alone still diffs).
void ReadRunReport(const std::filesystem::path& trace_json, DiffSide& side) {
  const std::filesystem::path report = trace_json.parent_path() / "report.json";
  std::error_code error;
  if (!std::filesystem::is_regular_file(report, error)) return;
  std::ifstream in(report, std::ios::binary);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    side.warnings.push_back(fmt::format("{}: not JSON; the run's time scale and warm-up are unknown", report.string()));
    return;
  }
  const auto runtime = j.find("runtime");
  if (runtime == j.end() || !runtime->is_object()) return;
  if (const auto scale = runtime->find("time_scale"); scale != runtime->end() && scale->is_number()) {
    side.time_scale = scale->get<double>();
  }
  if (const auto warmup = runtime->find("warmup"); warmup != runtime->end() && warmup->is_number_integer()) {
    const int64_t value = warmup->get<int64_t>();
    if (value >= 0 && value <= INT32_MAX) side.warmup_steps = static_cast<int32_t>(value);
  }
}

}  // namespace

DiffSide DiffSideFromTimeline(Timeline timeline, std::string source) {
  DiffSide side;
  side.source = source;
  side.file_names.push_back(std::move(source));
  side.file_rank.push_back(ProducedByShardscope(timeline) ? DiffSide::kPidIsRank : timeline.info.rank);
  side.files.push_back(std::move(timeline));
  return side;
}

StatusOr<DiffSide> LoadDiffSide(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::exists(path, error)) {
    return Status::InvalidInput(fmt::format("{}: no such file or directory (expected a trace file, or a directory "
                                            "holding trace.json or per-rank *.json traces)",
                                            path));
  }
  if (!fs::is_directory(path, error)) {
    SHARDSCOPE_ASSIGN_OR_RETURN(Timeline timeline, ReadChromeTraceFile(path));
    const bool ours = ProducedByShardscope(timeline);
    DiffSide side = DiffSideFromTimeline(std::move(timeline), path);
    if (ours) ReadRunReport(fs::path(path), side);
    return side;
  }
  const fs::path dir(path);
  if (fs::is_regular_file(dir / "trace.json", error)) {
    SHARDSCOPE_ASSIGN_OR_RETURN(Timeline timeline, ReadChromeTraceFile((dir / "trace.json").string()));
    const bool ours = ProducedByShardscope(timeline);
    DiffSide side = DiffSideFromTimeline(std::move(timeline), (dir / "trace.json").string());
    side.source = path;
    if (ours) ReadRunReport(dir / "trace.json", side);
    return side;
  }
  // Per-rank traces (PyTorch profiler: one file per rank): every *.json and *.json.gz, in
  // name order.
  std::vector<std::string> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && (name.ends_with(".json") || name.ends_with(".json.gz"))) {
      files.push_back(entry.path().string());
    }
  }
  if (error) return Status::InvalidInput(fmt::format("{}: cannot list the directory: {}", path, error.message()));
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    return Status::InvalidInput(
        fmt::format("{}: the directory holds neither trace.json nor per-rank *.json / *.json.gz trace files", path));
  }
  DiffSide side;
  side.source = path;
  std::map<int32_t, std::string> rank_files;
  for (const std::string& file : files) {
    SHARDSCOPE_ASSIGN_OR_RETURN(Timeline timeline, ReadChromeTraceFile(file));
    if (files.size() > 1) {
      // Several files: each is one rank, whatever its producer (distributedInfo.rank).
      const int32_t rank = timeline.info.rank;
      if (rank < 0) {
        return Status::InvalidInput(fmt::format("{}: distributedInfo.rank is {}; per-rank traces need a rank >= 0",
                                                file, rank));
      }
      auto [it, inserted] = rank_files.emplace(rank, file);
      if (!inserted) {
        return Status::InvalidInput(fmt::format("{}: distributedInfo.rank {} is also the rank of {}; per-rank traces "
                                                "need one file per rank",
                                                file, rank, it->second));
      }
      side.file_rank.push_back(rank);
    } else {
      side.file_rank.push_back(ProducedByShardscope(timeline) ? DiffSide::kPidIsRank : timeline.info.rank);
    }
    side.file_names.push_back(file);
    side.files.push_back(std::move(timeline));
  }
  return side;
}

StatusOr<DiffSide> LoadTraceFiles(const std::vector<std::string>& paths, std::vector<std::string>* warnings) {
  if (paths.empty()) return Status::InvalidInput("expected at least one trace");
  if (paths.size() == 1) return LoadDiffSide(paths[0]);
  DiffSide side;
  std::map<int32_t, std::string> rank_files;  // ranks of files that hold one rank each
  for (size_t i = 0; i < paths.size(); ++i) {
    SHARDSCOPE_ASSIGN_OR_RETURN(DiffSide one, LoadDiffSide(paths[i]));
    for (size_t f = 0; f < one.files.size(); ++f) {
      int32_t rank = one.file_rank[f];
      // A PyTorch-profiler file without distributedInfo reads as rank 0 of a world of 1;
      // among several files that says nothing, so its position in the arguments decides (as
      // `shardscope import` does), with a warning.
      if (rank != DiffSide::kPidIsRank && one.files[f].info.world_size <= 1) {
        rank = static_cast<int32_t>(i);
        if (warnings != nullptr) {
          warnings->push_back(fmt::format("{}: no distributedInfo (or world_size 1); taken as rank {} from its "
                                          "position in the arguments",
                                          one.file_names[f], rank));
        }
      }
      if (rank != DiffSide::kPidIsRank) {
        auto [it, inserted] = rank_files.emplace(rank, one.file_names[f]);
        if (!inserted) {
          return Status::InvalidInput(fmt::format("{}: rank {} is also the rank of {}; give one trace per rank",
                                                  one.file_names[f], rank, it->second));
        }
      }
      side.file_rank.push_back(rank);
      side.file_names.push_back(std::move(one.file_names[f]));
      side.files.push_back(std::move(one.files[f]));
    }
    side.source += (side.source.empty() ? "" : ",") + paths[i];
  }
  return side;
}

std::string_view OpClassName(OpClass op_class) {
  switch (op_class) {
    case OpClass::kGemm: return "gemm";
    case OpClass::kAttention: return "attention";
    case OpClass::kMemoryBound: return "memory-bound";
    case OpClass::kMemcpy: return "memcpy";
    case OpClass::kAllGather: return "all_gather";
    case OpClass::kReduceScatter: return "reduce_scatter";
    case OpClass::kAllReduce: return "all_reduce";
    case OpClass::kBroadcast: return "broadcast";
    case OpClass::kReduce: return "reduce";
    case OpClass::kAllToAll: return "all_to_all";
    case OpClass::kSendRecv: return "send_recv";
    case OpClass::kOtherCollective: return "collective";
    case OpClass::kHostOp: return "host op";
    case OpClass::kHostGap: return "host gap";
    case OpClass::kAllocatorStall: return "allocator stall";
    case OpClass::kDeviceWait: return "device wait";
  }
  return "?";
}

bool IsCollectiveClass(OpClass op_class) {
  return op_class >= OpClass::kAllGather && op_class <= OpClass::kOtherCollective;
}

namespace diff_internal {

int32_t Interner::Intern(std::string_view text) {
  auto it = ids_.find(text);
  if (it != ids_.end()) return it->second;
  const auto id = static_cast<int32_t>(names_.size());
  names_.emplace_back(text);
  const std::string& stored = storage_.emplace_back(text);
  ids_.emplace(std::string_view(stored), id);
  return id;
}

int32_t NameCache::IdOf(const Slice& slice) {
  auto it = raw_ids_.find(slice.name);
  if (it != raw_ids_.end()) return it->second;
  std::string normalized;
  if (slice.collective.has_value() && !slice.collective->collective_name.empty()) {
    normalized = "nccl:" + NormalizeKernelName(slice.collective->collective_name);
  } else {
    normalized = NormalizeKernelName(slice.name);
  }
  const int32_t id = interner_.Intern(normalized);
  // Collectives are named from their args, which may differ between slices of one raw
  // name; only plain slices are cached by raw name.
  if (!slice.collective.has_value()) raw_ids_.emplace(std::string_view(slice.name), id);
  return id;
}

int32_t RankOf(const DiffSide& side, size_t file, int32_t pid) {
  const int32_t rank = side.file_rank[file];
  return rank == DiffSide::kPidIsRank ? pid : rank;
}

bool IsDeviceCategory(Category category) {
  return category == Category::kKernel || category == Category::kGpuMemcpy || category == Category::kGpuMemset;
}

std::vector<RankRange> RankRanges(const std::vector<DiffEvent>& events) {
  std::vector<RankRange> ranges;
  for (size_t i = 0; i < events.size();) {
    size_t j = i;
    while (j < events.size() && events[j].rank == events[i].rank) ++j;
    ranges.push_back({events[i].rank, i, j});
    i = j;
  }
  return ranges;
}

void BuildSide(const DiffSide& side, int32_t only_rank, NameCache& names, Interner& groups, SideAnalysis& out) {
  // Tracks: (rank, host before device, file, pid, tid).
  using TrackKey = std::tuple<int32_t, bool, uint32_t, int32_t, int32_t>;
  std::map<TrackKey, int32_t> track_ids;
  std::vector<TrackKey> event_keys;
  ClassCache classes;
  size_t total_slices = 0;
  for (const Timeline& file : side.files) total_slices += file.slices.size();
  out.events.clear();
  out.events.reserve(total_slices);
  event_keys.reserve(total_slices);
  for (size_t f = 0; f < side.files.size(); ++f) {
    const std::vector<Slice>& slices = side.files[f].slices;
    for (size_t s = 0; s < slices.size(); ++s) {
      const Slice& slice = slices[s];
      // Annotations mark steps and modules; they are not ops.
      if (slice.category == Category::kUserAnnotation || slice.category == Category::kGpuUserAnnotation) continue;
      const int32_t rank = RankOf(side, f, slice.pid);
      if (only_rank >= 0 && rank != only_rank) continue;
      DiffEvent event;
      event.ts_ns = slice.ts_ns;
      event.dur_ns = std::max<int64_t>(0, slice.dur_ns);
      event.op_id = slice.op_id;
      event.correlation = slice.correlation;
      event.rank = rank;
      event.file = static_cast<uint32_t>(f);
      event.slice = static_cast<uint32_t>(s);
      event.device = IsDeviceCategory(slice.category);
      event.op_class = classes.Classify(slice, event.device);
      event.synchronizes = !event.device && slice.name.find("Synchronize") != std::string::npos;
      event.name_id = names.IdOf(slice);
      if (slice.collective.has_value()) {
        event.seq = slice.collective->seq;
        if (!slice.collective->process_group.empty()) event.process_group = groups.Intern(slice.collective->process_group);
      }
      const TrackKey key{rank, event.device, static_cast<uint32_t>(f), slice.pid, slice.tid};
      track_ids.emplace(key, 0);
      event_keys.push_back(key);
      out.events.push_back(event);
    }
  }
  // Number tracks in key order and name them.
  out.tracks.clear();
  for (auto& [key, id] : track_ids) {
    id = static_cast<int32_t>(out.tracks.size());
    const auto& [rank, device, file, pid, tid] = key;
    DiffTrack track{rank, static_cast<int32_t>(file), pid, tid, device, ""};
    for (const ThreadInfo& thread : side.files[file].threads) {
      if (thread.pid == pid && thread.tid == tid) track.name = thread.name;
    }
    if (track.name.empty()) track.name = device ? fmt::format("stream {}", tid) : fmt::format("host thread {}", tid);
    out.tracks.push_back(std::move(track));
  }
  for (size_t i = 0; i < out.events.size(); ++i) out.events[i].track = track_ids.at(event_keys[i]);
  event_keys.clear();
  event_keys.shrink_to_fit();
  // Order: (track, ts, longer first, file, slice). The events are in (file, slice) order now,
  // so a counting sort by track keeps that order within each track, and each track, usually
  // already in time order, needs at most a stable sort by (ts, longer first). Same result as
  // one comparison sort on the whole key, at a fraction of the cost on a million events.
  std::vector<size_t> track_begin(out.tracks.size() + 1, 0);
  for (const DiffEvent& event : out.events) ++track_begin[static_cast<size_t>(event.track) + 1];
  for (size_t t = 1; t < track_begin.size(); ++t) track_begin[t] += track_begin[t - 1];
  {
    std::vector<DiffEvent> by_track(out.events.size());
    std::vector<size_t> next(track_begin.begin(), track_begin.end() - 1);
    for (const DiffEvent& event : out.events) by_track[next[static_cast<size_t>(event.track)]++] = event;
    out.events = std::move(by_track);
  }
  const auto earlier = [](const DiffEvent& a, const DiffEvent& b) {
    if (a.ts_ns != b.ts_ns) return a.ts_ns < b.ts_ns;
    return a.dur_ns > b.dur_ns;  // an enclosing slice first
  };
  for (size_t t = 0; t + 1 < track_begin.size(); ++t) {
    const auto begin = out.events.begin() + static_cast<std::ptrdiff_t>(track_begin[t]);
    const auto end = out.events.begin() + static_cast<std::ptrdiff_t>(track_begin[t + 1]);
    if (!std::is_sorted(begin, end, earlier)) std::stable_sort(begin, end, earlier);
  }
  // Host nesting (PyTorch's cpu_op stacks): the parent is the innermost open slice that
  // contains the start. Slices that overlap without nesting are treated as nested.
  std::vector<int32_t> open;
  int32_t current_track = -1;
  for (size_t i = 0; i < out.events.size(); ++i) {
    DiffEvent& event = out.events[i];
    if (event.track != current_track) {
      open.clear();
      current_track = event.track;
    }
    if (event.device) continue;
    while (!open.empty() && out.events[static_cast<size_t>(open.back())].end_ns() <= event.ts_ns) open.pop_back();
    event.parent = open.empty() ? -1 : open.back();
    open.push_back(static_cast<int32_t>(i));
  }
}

}  // namespace diff_internal
}  // namespace shardscope::traces

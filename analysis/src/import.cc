// Import of PyTorch-profiler traces: see import.h for the mapping and its sources.
//
// Each file is read with the streaming Chrome-JSON reader, then converted in two passes:
// the first classifies its tracks (devices, streams, host threads) and finds the rank and
// the file's earliest event; once every file is read the common origin is known, and the
// second pass rewrites pids, tids and timestamps into the merged timeline.
#include "shardscope/analysis/import.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "shardscope/base/output_dir.h"
#include "shardscope/traces/chrome_trace.h"

namespace shardscope::traces {
namespace {

// Kineto's name of the CPU op that carries a collective's metadata (output_json.cpp
// kParamCommsCallName; torch/csrc/distributed/c10d/ParamCommsUtils.hpp RECORD_PARAM_COMMS).
constexpr std::string_view kParamCommsOp = "record_param_comms";
// torch.profiler.profile.step() annotates each step as "ProfilerStep#<n>"
// (torch/profiler/profiler.py, _KinetoProfile / profile.step: record_function).
constexpr std::string_view kProfilerStepPrefix = "ProfilerStep#";
// Process Group Description of the world group (c10d names it "default_pg"); Kineto reads
// the rank from its collectives when distributedInfo is absent (output_json.cpp).
constexpr std::string_view kDefaultProcessGroupDesc = "default_pg";
// Flow ids are made unique across ranks as (rank << kFlowRankShift) | (id & kFlowIdMask),
// as TraceRecorder does for simulated traces (CUPTI correlation ids are 32-bit).
constexpr int kFlowRankShift = 32;
constexpr int64_t kFlowIdMask = (int64_t{1} << kFlowRankShift) - 1;

bool IsDeviceCategory(const Slice& slice) {
  return slice.category == Category::kKernel || slice.category == Category::kGpuMemcpy ||
         slice.category == Category::kGpuMemset || slice.category == Category::kGpuUserAnnotation;
}

const Arg* FindArg(const std::vector<Arg>& args, std::string_view key) {
  for (const Arg& arg : args) {
    if (arg.key == key) return &arg;
  }
  return nullptr;
}

std::optional<int64_t> IntArg(const std::vector<Arg>& args, std::string_view key) {
  const Arg* arg = FindArg(args, key);
  if (arg == nullptr) return std::nullopt;
  if (const auto* value = std::get_if<int64_t>(&arg->value)) return *value;
  return std::nullopt;
}

// Kineto's "External id"; schemaVersion 1 traces of 2021 spell it "external id".
std::optional<int64_t> ExternalId(const std::vector<Arg>& args) {
  if (std::optional<int64_t> id = IntArg(args, "External id")) return id;
  return IntArg(args, "external id");
}

std::optional<std::string> StringArg(const std::vector<Arg>& args, std::string_view key) {
  const Arg* arg = FindArg(args, key);
  if (arg == nullptr) return std::nullopt;
  if (const auto* value = std::get_if<std::string>(&arg->value)) return *value;
  return std::nullopt;
}

// "ProfilerStep#12" -> 12.
std::optional<int64_t> ProfilerStepNumber(std::string_view name) {
  if (name.substr(0, kProfilerStepPrefix.size()) != kProfilerStepPrefix) return std::nullopt;
  const std::string_view digits = name.substr(kProfilerStepPrefix.size());
  if (digits.empty() || digits.size() > 18) return std::nullopt;
  int64_t n = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + (c - '0');
  }
  return n;
}

using TrackKey = std::pair<int32_t, int32_t>;  // (pid, tid) in the source file

// What pass 1 learns about one file.
struct FileLayout {
  std::set<int32_t> device_pids;
  std::map<TrackKey, int32_t> tid_of;   // source (pid, tid) -> our tid
  std::vector<ThreadInfo> threads;      // ours (pid filled later)
  int32_t streams = 0;
  int32_t host_threads = 0;
  std::optional<int64_t> earliest_ns;   // absolute
};

bool HasPid(int32_t pid) { return pid >= 0; }  // string pids became negative ids

FileLayout Classify(const Timeline& raw) {
  FileLayout layout;
  for (const Slice& s : raw.slices) {
    if (HasPid(s.pid) && IsDeviceCategory(s)) layout.device_pids.insert(s.pid);
  }
  std::set<TrackKey> streams;
  // Host threads with their weight for choosing the main one: (ProfilerStep count, cpu_op
  // count, any count).
  std::map<TrackKey, std::array<int64_t, 3>> host;
  for (const Slice& s : raw.slices) {
    if (!HasPid(s.pid)) continue;
    const TrackKey key{s.pid, s.tid};
    if (layout.device_pids.count(s.pid) != 0) {
      streams.insert(key);
      continue;
    }
    auto& weight = host[key];
    if (ProfilerStepNumber(s.name)) ++weight[0];
    if (s.category == Category::kCpuOp) ++weight[1];
    ++weight[2];
  }
  for (const Instant& i : raw.instants) {
    if (HasPid(i.pid) && layout.device_pids.count(i.pid) == 0) host.try_emplace({i.pid, i.tid});
  }
  // The main thread: most ProfilerStep annotations, then most cpu_ops, then most events;
  // ties go to the smaller (pid, tid) (std::map order), so the choice is deterministic.
  std::optional<TrackKey> main;
  std::array<int64_t, 3> best{-1, -1, -1};
  for (const auto& [key, weight] : host) {
    if (weight > best) {
      best = weight;
      main = key;
    }
  }
  int32_t next_tid = 0;
  if (main) {
    layout.tid_of[*main] = next_tid;
    layout.threads.push_back(
        ThreadInfo{0, next_tid, fmt::format("host thread (tid {})", main->second), next_tid});
    ++next_tid;
  } else {
    ++next_tid;  // tid 0 stays the host thread even when the file has no host events
  }
  for (const TrackKey& key : streams) {
    const int32_t k = next_tid - 1;
    layout.tid_of[key] = next_tid;
    layout.threads.push_back(ThreadInfo{
        0, next_tid, fmt::format("stream {} (CUDA stream {}, device {})", k, key.second, key.first), next_tid});
    ++next_tid;
  }
  layout.streams = static_cast<int32_t>(streams.size());
  // Other host threads in ascending (pid, tid).
  for (const auto& [key, weight] : host) {
    if (main && key == *main) continue;
    layout.tid_of[key] = next_tid;
    layout.threads.push_back(
        ThreadInfo{0, next_tid, fmt::format("host thread (tid {})", key.second), next_tid});
    ++next_tid;
  }
  layout.host_threads = static_cast<int32_t>(host.size());
  return layout;
}

// The earliest absolute time of a kept event.
std::optional<int64_t> Earliest(const Timeline& raw) {
  std::optional<int64_t> earliest;
  const auto take = [&](int32_t pid, int64_t ts) {
    if (!HasPid(pid)) return;
    const int64_t absolute = raw.info.base_time_ns + ts;
    if (!earliest || absolute < *earliest) earliest = absolute;
  };
  for (const Slice& s : raw.slices) take(s.pid, s.ts_ns);
  for (const Instant& i : raw.instants) take(i.pid, i.ts_ns);
  for (const CounterSample& c : raw.counters) take(c.pid, c.ts_ns);
  return earliest;
}

// The rank a file speaks for, or nullopt when it does not say.
std::optional<int64_t> RankOf(const Timeline& raw, bool several_files) {
  // distributedInfo with world_size 1 and rank 0 is also what the reader reports when the
  // key is absent; it is believed only for a single file.
  if (raw.info.world_size > 1 || !several_files) return raw.info.rank;
  for (const Slice& s : raw.slices) {
    if (!s.collective || s.collective->rank < 0) continue;
    if (StringArg(s.args, "Process Group Description") == kDefaultProcessGroupDesc) return s.collective->rank;
  }
  return std::nullopt;
}

// Metadata of record_param_comms ops by External id: Seq and the rank in the group live
// only there (Kineto copies the other keys onto the kernel).
struct ParamComms {
  int64_t seq = -1;
  int32_t group_rank = -1;
  std::string process_group;
  int32_t group_size = 0;
};

std::unordered_map<int64_t, ParamComms> ParamCommsByExternalId(const Timeline& raw) {
  std::unordered_map<int64_t, ParamComms> out;
  for (const Slice& s : raw.slices) {
    if (s.name != kParamCommsOp || !s.collective) continue;
    const std::optional<int64_t> external = ExternalId(s.args);
    if (!external) continue;
    out[*external] = ParamComms{s.collective->seq, s.collective->rank, s.collective->process_group,
                                s.collective->group_size};
  }
  return out;
}

struct Source {
  std::string name;
  Timeline raw;
  FileLayout layout;
  int32_t rank = 0;
  bool rank_from_order = false;
};

// Pass 2: one file into the merged timeline.
void Convert(const Source& source, int64_t origin_ns, ImportedTrace& out, ImportedRank& info) {
  const Timeline& raw = source.raw;
  const int32_t rank = source.rank;
  const int64_t shift = raw.info.base_time_ns - origin_ns;
  info.shift_ns = shift;
  const auto tid_of = [&](int32_t pid, int32_t tid) -> std::optional<int32_t> {
    auto it = source.layout.tid_of.find({pid, tid});
    if (it == source.layout.tid_of.end()) return std::nullopt;
    return it->second;
  };
  out.timeline.OnProcess(ProcessInfo{rank, fmt::format("rank {}", rank), rank});
  bool has_host_thread = false;
  for (ThreadInfo thread : source.layout.threads) {
    thread.pid = rank;
    has_host_thread = has_host_thread || thread.tid == 0;
    out.timeline.OnThread(thread);
  }
  if (!has_host_thread) out.timeline.OnThread(ThreadInfo{rank, 0, "host thread", 0});

  const std::unordered_map<int64_t, ParamComms> param_comms = ParamCommsByExternalId(raw);
  for (const Slice& s : raw.slices) {
    const std::optional<int32_t> tid = HasPid(s.pid) ? tid_of(s.pid, s.tid) : std::nullopt;
    if (!tid) {
      ++info.dropped_events;
      continue;
    }
    Slice slice = s;
    slice.pid = rank;
    slice.tid = *tid;
    slice.ts_ns = s.ts_ns + shift;
    const bool on_device = source.layout.device_pids.count(s.pid) != 0;
    if (on_device && slice.category == Category::kKernel) {
      ++info.kernels;
      std::string lowered = slice.name;
      std::transform(lowered.begin(), lowered.end(), lowered.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      // HTA's test for a communication kernel: the name starts with "nccl".
      if (!slice.collective && lowered.rfind("nccl", 0) == 0) {
        slice.collective.emplace();
        slice.collective->collective_name = slice.name;
      }
    }
    if (on_device && slice.collective) {
      ++info.collectives;
      CollectiveInfo& c = *slice.collective;
      const std::string normalized = NormalizeCollectiveName(c.collective_name);
      if (!normalized.empty() && normalized != c.collective_name) {
        slice.args.push_back(Arg{"torch collective", c.collective_name});
        c.collective_name = normalized;
      }
      const std::optional<int64_t> external = ExternalId(s.args);
      auto it = external ? param_comms.find(*external) : param_comms.end();
      if (it != param_comms.end()) {
        if (c.seq < 0) c.seq = it->second.seq;
        if (c.process_group.empty()) c.process_group = it->second.process_group;
        if (c.group_size == 0) c.group_size = it->second.group_size;
        if (it->second.group_rank >= 0 && !FindArg(slice.args, "group rank")) {
          slice.args.push_back(Arg{"group rank", int64_t{it->second.group_rank}});
        }
      }
      // A "Rank" on the kernel itself is the rank in the group as well.
      if (c.rank >= 0 && !FindArg(slice.args, "group rank")) slice.args.push_back(Arg{"group rank", int64_t{c.rank}});
      c.rank = rank;
    }
    if (std::optional<int64_t> step = ProfilerStepNumber(slice.name); step && slice.tid == 0) {
      out.steps.push_back(ImportedStep{rank, *step, slice.ts_ns, slice.ts_ns + slice.dur_ns});
    }
    out.timeline.OnSlice(slice);
  }
  for (const Instant& i : raw.instants) {
    const std::optional<int32_t> tid = HasPid(i.pid) ? tid_of(i.pid, i.tid) : std::nullopt;
    if (!tid) {
      ++info.dropped_events;
      continue;
    }
    Instant instant = i;
    instant.pid = rank;
    instant.tid = *tid;
    instant.ts_ns = i.ts_ns + shift;
    out.timeline.OnInstant(instant);
  }
  for (const CounterSample& c : raw.counters) {
    if (!HasPid(c.pid)) {
      ++info.dropped_events;
      continue;
    }
    CounterSample sample = c;
    sample.pid = rank;
    sample.ts_ns = c.ts_ns + shift;
    out.timeline.OnCounter(sample);
  }
  for (const Flow& f : raw.flows) {
    const std::optional<int32_t> from = HasPid(f.from_pid) ? tid_of(f.from_pid, f.from_tid) : std::nullopt;
    const std::optional<int32_t> to = HasPid(f.to_pid) ? tid_of(f.to_pid, f.to_tid) : std::nullopt;
    if (!from || !to) {
      ++info.dropped_events;
      continue;
    }
    Flow flow = f;
    flow.id = (static_cast<int64_t>(rank) << kFlowRankShift) | (f.id & kFlowIdMask);
    flow.from_pid = flow.to_pid = rank;
    flow.from_tid = *from;
    flow.to_tid = *to;
    flow.from_ts_ns = f.from_ts_ns + shift;
    flow.to_ts_ns = f.to_ts_ns + shift;
    out.timeline.OnFlow(flow);
  }
}

// Collective kernels whose trace gives no Seq (PyTorch before 2.x, HTA's test traces, the
// kernel's record_param_comms op outside the trace) are numbered by order: per rank and
// process group, in start order, 1, 2, ... as PyTorch numbers them (ProcessGroupNCCL's
// seqCollective_ counts every collective of the group, so the k-th one a rank ran is the k-th
// on every member). This holds while the trace holds the same window of collectives on
// every rank; a group where some kernel has a Seq keeps the Seq it has.
void SequenceCollectivesWithoutSeq(ImportedTrace& out) {
  std::map<std::pair<int32_t, std::string>, std::vector<size_t>> groups;  // (rank, group) -> slices
  std::set<std::pair<int32_t, std::string>> with_seq;
  for (size_t i = 0; i < out.timeline.slices.size(); ++i) {
    const Slice& s = out.timeline.slices[i];
    if (s.tid == 0 || s.category != Category::kKernel || !s.collective) continue;
    const std::pair<int32_t, std::string> key{s.pid, s.collective->process_group};
    if (s.collective->seq >= 0) {
      with_seq.insert(key);
    } else {
      groups[key].push_back(i);
    }
  }
  std::map<int32_t, int64_t> numbered;  // rank -> kernels numbered
  for (auto& [key, indices] : groups) {
    if (with_seq.count(key) != 0) continue;
    std::stable_sort(indices.begin(), indices.end(), [&](size_t a, size_t b) {
      return out.timeline.slices[a].ts_ns < out.timeline.slices[b].ts_ns;
    });
    for (size_t k = 0; k < indices.size(); ++k) {
      Slice& slice = out.timeline.slices[indices[k]];
      slice.collective->seq = static_cast<int64_t>(k) + 1;
      slice.args.push_back(Arg{"Seq from", std::string("order")});
    }
    numbered[key.first] += static_cast<int64_t>(indices.size());
  }
  for (const auto& [rank, count] : numbered) {
    std::string source;
    for (const ImportedRank& r : out.ranks) {
      if (r.rank == rank) source = r.source;
    }
    out.warnings.push_back(fmt::format(
        "{}: {} collective kernel(s) carry no \"Seq\" (neither on the kernel nor on a record_param_comms op with its "
        "External id); numbered 1, 2, ... by start time per process group (arg \"Seq from\": \"order\")",
        source, count));
  }
}

}  // namespace

std::string NormalizeCollectiveName(std::string_view name) {
  std::string squashed;
  for (char c : name) {
    if (c == '_' || c == ' ' || c == '-') continue;
    squashed.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  // Order matters: "reducescatter" and "allreduce" contain "reduce"; "allgather" contains
  // "gather". Names from ProcessGroupNCCL.cpp's RECORD_PARAM_COMMS calls ("allreduce",
  // "allreduce_coalesced", "_allgather_base", "allgather_into_tensor_coalesced",
  // "_reduce_scatter_base", "reduce_scatter_tensor_coalesced", "broadcast", "reduce",
  // "all_to_all", "all_to_allv", "send", "recv") and NCCL kernel names
  // (ncclDevKernel_<Func>_<Algo>_<Proto>, ncclKernel_<Func>_...).
  static constexpr std::pair<std::string_view, std::string_view> kPatterns[] = {
      {"reducescatter", "reduce_scatter"}, {"allgather", "all_gather"}, {"allreduce", "all_reduce"},
      {"alltoall", "all_to_all"},          {"broadcast", "broadcast"},  {"reduce", "reduce"},
      {"sendrecv", ""},                    {"send", "send"},            {"recv", "recv"},
  };
  for (const auto& [pattern, normalized] : kPatterns) {
    if (squashed.find(pattern) != std::string::npos) return std::string(normalized);
  }
  return "";
}

StatusOr<ImportedTrace> ImportPytorchTimelines(std::vector<std::pair<std::string, Timeline>> inputs) {
  if (inputs.empty()) return Status::InvalidInput("import: expected at least one trace file");
  const bool several = inputs.size() > 1;
  std::vector<Source> sources;
  sources.reserve(inputs.size());
  ImportedTrace out;
  std::map<int32_t, size_t> by_rank;  // rank -> index into sources
  for (size_t i = 0; i < inputs.size(); ++i) {
    Source source;
    source.name = std::move(inputs[i].first);
    source.raw = std::move(inputs[i].second);
    source.layout = Classify(source.raw);
    source.layout.earliest_ns = Earliest(source.raw);
    const std::optional<int64_t> rank = RankOf(source.raw, several);
    if (rank) {
      const int32_t world = std::max(source.raw.info.world_size, 1);
      if (*rank < 0 || (source.raw.info.world_size > 1 && *rank >= world) ||
          *rank > std::numeric_limits<int32_t>::max()) {
        return Status::InvalidInput(fmt::format("{}: /distributedInfo/rank: expected 0 <= rank < world_size {}, got {}",
                                                source.name, world, *rank));
      }
      source.rank = static_cast<int32_t>(*rank);
    } else {
      source.rank = static_cast<int32_t>(i);
      source.rank_from_order = true;
      out.warnings.push_back(fmt::format(
          "{}: no distributedInfo.rank (nor a default_pg collective with a \"Rank\"); taken as rank {} from its "
          "position in the argument list",
          source.name, i));
    }
    auto [it, inserted] = by_rank.emplace(source.rank, sources.size());
    if (!inserted) {
      return Status::InvalidInput(fmt::format("{}: rank {} is already given by {}", source.name, source.rank,
                                              sources[it->second].name));
    }
    if (source.raw.slices.empty()) {
      out.warnings.push_back(fmt::format("{}: no complete (\"X\") events", source.name));
    }
    sources.push_back(std::move(source));
  }
  // The common origin: the earliest event of any rank (0 when no file has one).
  std::optional<int64_t> origin;
  for (const Source& s : sources) {
    if (s.layout.earliest_ns && (!origin || *s.layout.earliest_ns < *origin)) origin = *s.layout.earliest_ns;
  }
  const int64_t origin_ns = origin.value_or(0);

  // Trace-wide info: the first file's backend; world size as the files say, at least the
  // number of ranks imported.
  const Source& first = sources[by_rank.begin()->second];
  out.timeline.info.backend = first.raw.info.backend;
  out.timeline.info.rank = by_rank.begin()->first;
  int32_t world = by_rank.rbegin()->first + 1;
  for (const Source& s : sources) world = std::max(world, s.raw.info.world_size);
  out.timeline.info.world_size = world;
  out.timeline.info.base_time_ns = origin_ns;
  out.timeline.info.producer = "shardscope import (torch.profiler)";
  std::string names;
  for (const auto& [rank, index] : by_rank) names += (names.empty() ? "" : ",") + sources[index].name;
  out.timeline.info.extra.push_back(Arg{"imported from", names});

  for (const auto& [rank, index] : by_rank) {
    const Source& source = sources[index];
    ImportedRank info;
    info.rank = rank;
    info.source = source.name;
    info.rank_from_file_order = source.rank_from_order;
    info.streams = source.layout.streams;
    info.host_threads = source.layout.host_threads;
    info.base_time_ns = source.raw.info.base_time_ns;
    Convert(source, origin_ns, out, info);
    out.ranks.push_back(std::move(info));
  }
  // Deterministic order: by track, then time (stable: equal times keep file order).
  std::stable_sort(out.timeline.slices.begin(), out.timeline.slices.end(), [](const Slice& a, const Slice& b) {
    return std::tie(a.pid, a.tid, a.ts_ns) < std::tie(b.pid, b.tid, b.ts_ns);
  });
  std::stable_sort(out.timeline.threads.begin(), out.timeline.threads.end(),
                   [](const ThreadInfo& a, const ThreadInfo& b) { return std::tie(a.pid, a.tid) < std::tie(b.pid, b.tid); });
  std::stable_sort(out.steps.begin(), out.steps.end(), [](const ImportedStep& a, const ImportedStep& b) {
    return std::tie(a.rank, a.start_ns) < std::tie(b.rank, b.start_ns);
  });
  SequenceCollectivesWithoutSeq(out);
  return out;
}

StatusOr<ImportedTrace> ImportPytorchTraces(const std::vector<std::string>& paths) {
  std::vector<std::pair<std::string, Timeline>> inputs;
  inputs.reserve(paths.size());
  for (const std::string& path : paths) {
    SHARDSCOPE_ASSIGN_OR_RETURN(Timeline timeline, ReadChromeTraceFile(path));
    inputs.emplace_back(path, std::move(timeline));
  }
  return ImportPytorchTimelines(std::move(inputs));
}

std::string ImportSummaryText(const ImportedTrace& trace) {
  std::string text;
  text += fmt::format("{} rank(s), world size {}\n", trace.ranks.size(), trace.timeline.info.world_size);
  for (const ImportedRank& r : trace.ranks) {
    text += fmt::format("  rank {}: {} stream(s), {} host thread(s), {} kernel(s) of which {} collective(s){}  [{}]\n",
                        r.rank, r.streams, r.host_threads, r.kernels, r.collectives,
                        r.dropped_events > 0 ? fmt::format(", {} event(s) dropped", r.dropped_events) : "", r.source);
  }
  // Process groups: name -> (size, ranks string, type -> count per rank summed).
  struct Group {
    int32_t size = 0;
    std::string ranks;
    std::map<std::string, int64_t> by_type;
    std::set<int32_t> members_seen;
  };
  std::map<std::string, Group> groups;
  for (const Slice& s : trace.timeline.slices) {
    if (s.tid == 0 || s.category != Category::kKernel || !s.collective) continue;
    Group& g = groups[s.collective->process_group];
    g.size = std::max(g.size, s.collective->group_size);
    if (g.ranks.empty()) {
      if (std::optional<std::string> ranks = StringArg(s.args, "Process Group Ranks")) g.ranks = *ranks;
    }
    ++g.by_type[s.collective->collective_name.empty() ? "?" : s.collective->collective_name];
    g.members_seen.insert(s.pid);
  }
  if (!groups.empty()) text += "process groups (collective kernels summed over the imported ranks):\n";
  for (const auto& [name, g] : groups) {
    std::string counts;
    for (const auto& [type, n] : g.by_type) counts += fmt::format("{}{} {}", counts.empty() ? "" : ", ", type, n);
    text += fmt::format("  group '{}': size {}{}, seen on {} rank(s): {}\n", name.empty() ? "?" : name, g.size,
                        g.ranks.empty() ? "" : fmt::format(", ranks {}", g.ranks), g.members_seen.size(), counts);
  }
  if (!trace.steps.empty()) {
    std::map<int64_t, std::pair<int64_t, int64_t>> step_span;  // step -> (min start, max end)
    for (const ImportedStep& s : trace.steps) {
      auto [it, inserted] = step_span.try_emplace(s.step, s.start_ns, s.end_ns);
      if (!inserted) {
        it->second.first = std::min(it->second.first, s.start_ns);
        it->second.second = std::max(it->second.second, s.end_ns);
      }
    }
    text += "steps (ProfilerStep#N, earliest start to latest end over the ranks):\n";
    for (const auto& [step, span] : step_span) {
      text += fmt::format("  step {}: {:.1f} us\n", step, static_cast<double>(span.second - span.first) * 1e-3);
    }
  }
  for (const std::string& warning : trace.warnings) text += fmt::format("warning: {}\n", warning);
  return text;
}

StatusOr<std::string> WriteImportedTrace(const ImportedTrace& trace, const std::string& out_dir) {
  SHARDSCOPE_ASSIGN_OR_RETURN(std::unique_ptr<OutputDir> out, OutputDir::Create(out_dir, {{"trace.json"}, ""}));
  SHARDSCOPE_RETURN_IF_ERROR(WriteChromeTrace(trace.timeline, out->StagingPath("trace.json")));
  SHARDSCOPE_RETURN_IF_ERROR(out->Commit());
  return out->FinalPath("trace.json");
}

}  // namespace shardscope::traces

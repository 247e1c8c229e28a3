// The reports of a memory-snapshot replay: JSON (`replay-snapshot --json`) and text.
#include "shardscope/analysis/memory_snapshot.h"

#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "memory_snapshot_internal.h"

namespace shardscope::sim {
namespace {

using snapshot_internal::Describe;
using snapshot_internal::StreamIndex;

nlohmann::ordered_json CountJson(const RecordedModelCount& count) {
  nlohmann::ordered_json j;
  j["recorded"] = count.recorded;
  j["model"] = count.model;
  return j;
}

// An action in the snapshot's own keys (an oom has device_free where others have addr);
// `index` < 0 leaves it out (the model's actions have none of their own).
nlohmann::ordered_json ActionJson(int64_t index, const std::string& action, uint64_t address, int64_t size,
                                  int64_t stream) {
  nlohmann::ordered_json j;
  if (index >= 0) j["index"] = index;
  j["action"] = action;
  j[action == "oom" ? "device_free" : "addr"] = address;
  j["size"] = size;
  j["stream"] = stream;
  return j;
}

}  // namespace

std::string SnapshotReplayJson(const RecordedSnapshot& snapshot, const SnapshotReplay& replay,
                               const std::string& source) {
  const std::vector<int64_t>& streams = replay.converted.streams;
  nlohmann::ordered_json j;
  j["verdict"] = replay.exact ? "exact" : "diverges";
  j["actions"] = replay.actions;
  j["segment_allocs"] = CountJson(replay.segment_allocs);
  j["segment_frees"] = CountJson(replay.segment_frees);
  j["peak_reserved_bytes"] = CountJson(replay.peak_reserved_bytes);
  j["alloc_retries"] = CountJson(replay.alloc_retries);
  if (replay.first_divergence) {
    const SnapshotDivergence& d = *replay.first_divergence;
    nlohmann::ordered_json dj;
    dj["index"] = d.index;
    dj["what"] = d.what;
    dj["recorded"] = d.recorded ? ActionJson(d.recorded->index, d.recorded->action,
                                             d.recorded->action == "oom" ? static_cast<uint64_t>(d.recorded->device_free)
                                                                         : d.recorded->address,
                                             d.recorded->size, StreamIndex(streams, d.recorded->stream))
                                : nlohmann::ordered_json();
    dj["model"] = d.model ? ActionJson(-1, d.model->action, d.model->address, d.model->size, d.model->stream)
                          : nlohmann::ordered_json();
    j["first_divergence"] = dj;
  } else {
    j["first_divergence"] = nullptr;
  }
  j["snapshot"] = source;
  j["device"] = snapshot.device;
  j["alloc_conf"] = snapshot.alloc_conf;
  j["allocator_settings"] = snapshot.has_allocator_settings;
  const SnapshotAllocTrace& c = replay.converted;
  if (c.capacity_source.rfind("unlimited", 0) == 0) {
    j["device_memory_bytes"] = nullptr;
  } else {
    j["device_memory_bytes"] = c.trace.device_memory_bytes;
  }
  j["device_memory_source"] = c.capacity_source;
  nlohmann::ordered_json initial;
  initial["segments"] = c.trace.initial_segments.size();
  initial["reserved_bytes"] = c.initial_reserved_bytes;
  initial["allocated_blocks"] = c.initial_allocated_blocks;
  j["initial_state"] = initial;
  j["streams"] = streams;
  return j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

std::string SnapshotReplayText(const RecordedSnapshot& snapshot, const SnapshotReplay& replay,
                               const std::string& source) {
  const SnapshotAllocTrace& c = replay.converted;
  std::string out = fmt::format("{}: device {}, {} actions, allocator settings {}\n", source, snapshot.device,
                                replay.actions,
                                !snapshot.has_allocator_settings ? "absent (defaults)"
                                : snapshot.alloc_conf.empty()    ? "default"
                                                                 : "'" + snapshot.alloc_conf + "'");
  out += fmt::format("  state when recording began (the trace undone): {} segments, {} B reserved, {} blocks allocated\n",
                     c.trace.initial_segments.size(), c.initial_reserved_bytes, c.initial_allocated_blocks);
  if (c.capacity_source.rfind("unlimited", 0) == 0) {
    out += fmt::format("  device memory: {}\n", c.capacity_source);
  } else {
    out += fmt::format("  device memory: {} B ({})\n", c.trace.device_memory_bytes, c.capacity_source);
  }
  out += fmt::format("  {:<20} {:>16} {:>16}\n", "", "recorded", "model");
  auto row = [&](std::string_view label, const RecordedModelCount& count) {
    out += fmt::format("  {:<20} {:>16} {:>16}{}\n", label, count.recorded, count.model,
                       count.recorded == count.model ? "" : "   <- differs");
  };
  row("segment_alloc", replay.segment_allocs);
  row("segment_free", replay.segment_frees);
  row("alloc retries", replay.alloc_retries);
  row("peak reserved (B)", replay.peak_reserved_bytes);
  if (replay.exact) {
    out += "verdict: exact (every action matches: the block chosen, each segment allocation and free, reserved "
           "bytes after every action; the final segments match)\n";
    return out;
  }
  const SnapshotDivergence& d = *replay.first_divergence;
  out += fmt::format("verdict: diverges at device_traces[{}][{}]: {}\n", snapshot.device, d.index, d.what);
  // A few actions either side, recorded beside modelled, in comparison order.
  size_t k = replay.recorded.size();
  for (size_t i = 0; i < replay.recorded.size(); ++i) {
    if (replay.recorded[i].index == d.index) {
      k = i;
      break;
    }
  }
  if (!d.recorded && d.model) k = replay.recorded.size();
  constexpr size_t kBefore = 3, kAfter = 2;
  const size_t first = k >= kBefore ? k - kBefore : 0;
  const size_t last = std::min(std::max(replay.recorded.size(), replay.model.size()), k + kAfter + 1);
  if (first < last) out += fmt::format("  {:<8} {:<52} {}\n", "index", "recorded", "model");
  for (size_t i = first; i < last; ++i) {
    std::string index = "";
    std::string recorded = "-";
    std::string model = "-";
    if (i < replay.recorded.size()) {
      const RecordedAction& r = replay.recorded[i];
      index = fmt::format("[{}]", r.index);
      recorded = Describe(r.action, r.address, r.size, StreamIndex(c.streams, r.stream));
    }
    if (i < replay.model.size()) {
      const TraceEntry& m = replay.model[i];
      model = Describe(m.action, m.address, m.size, m.stream);
    }
    out += fmt::format("{} {:<8} {:<52} {}\n", i == k ? ">" : " ", index, recorded, model);
  }
  return out;
}

}  // namespace shardscope::sim
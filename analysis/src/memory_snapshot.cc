// Memory snapshot replay (see memory_snapshot.h, docs/ALLOC_TRACE.md).
//
// Rebuilding the start state. Undoing the trace from the final segments, last action first
// (as MemoryViz.js simulate_memory walks back from the snapshot): an alloc removes its block
// from the allocated set, a free_completed/free_requested puts it back, a segment_alloc
// removes its segment, a segment_free puts it back. What the trace does not say is the size
// of a block allocated before recording began and freed during it (free actions carry the
// requested size). It follows from the allocator's rules: the block is the request rounded
// (round_size), plus, in the large pool, the gap up to the next block when that gap is
// <= 1 MiB, because should_split leaves a large block whole when the remainder would be
// <= kSmallSize, and every large-pool block (free or not) is larger than that (requests
// above 1 MiB, remainders above 1 MiB, merges only grow) so such a gap cannot be a block of
// its own. Free space is one block per gap, as free_block merges neighbours.
#include "shardscope/analysis/memory_snapshot.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

namespace shardscope::sim {
namespace {

using traces::PickleObject;
using Kind = PickleObject::Kind;

// c10/cuda/CUDACachingAllocator.cpp constants the reconstruction relies on.
constexpr int64_t kSmallSize = 1 * kMiB;    // largest request of the small pool
constexpr int64_t kSmallBuffer = 2 * kMiB;  // the small pool's segment size
// "No limit" when nothing in the trace bounds the device: more than any GPU holds, small
// enough that sums of segment sizes stay far from overflowing.
constexpr int64_t kUnlimitedCapacity = int64_t{1} << 56;
// The allocation-trace format's stream limit (alloc_trace.cc kMaxStreams).
constexpr size_t kMaxStreams = 1024;

// ---- reading the pickle --------------------------------------------------------------

class Reader {
 public:
  explicit Reader(std::string_view source) : source_(source) {}

  Status Error(const std::string& path, std::string_view what) const {
    return Status::InvalidInput(fmt::format("{}: {}: {}", source_, path, what));
  }

  // The value of `key`, which must be present.
  StatusOr<const PickleObject*> Required(const PickleObject& dict, std::string_view key,
                                         const std::string& path) const {
    const PickleObject* value = dict.Find(key);
    if (value == nullptr) return Error(Join(path, key), "missing");
    return value;
  }

  StatusOr<int64_t> Int(const PickleObject& dict, std::string_view key, const std::string& path,
                        std::optional<int64_t> fallback = std::nullopt) const {
    const PickleObject* value = dict.Find(key);
    if (value == nullptr) {
      if (fallback) return *fallback;
      return Error(Join(path, key), "missing (expected int)");
    }
    if (value->kind != Kind::kInt) {
      return Error(Join(path, key), fmt::format("expected int, got {}", value->KindName()));
    }
    return value->int_value;
  }

  StatusOr<std::string> String(const PickleObject& dict, std::string_view key, const std::string& path,
                               std::optional<std::string> fallback = std::nullopt) const {
    const PickleObject* value = dict.Find(key);
    if (value == nullptr) {
      if (fallback) return *fallback;
      return Error(Join(path, key), "missing (expected str)");
    }
    if (value->kind != Kind::kString) {
      return Error(Join(path, key), fmt::format("expected str, got {}", value->KindName()));
    }
    return value->string_value;
  }

  StatusOr<bool> Bool(const PickleObject& dict, std::string_view key, const std::string& path, bool fallback) const {
    const PickleObject* value = dict.Find(key);
    if (value == nullptr) return fallback;
    if (value->kind != Kind::kBool) {
      return Error(Join(path, key), fmt::format("expected bool, got {}", value->KindName()));
    }
    return value->bool_value;
  }

  Status Expect(const PickleObject& value, Kind kind, const std::string& path) const {
    if (value.kind == kind) return Status::Ok();
    PickleObject expected;
    expected.kind = kind;
    return Error(path, fmt::format("expected {}, got {}", expected.KindName(), value.KindName()));
  }

  static std::string Join(const std::string& path, std::string_view key) {
    return path.empty() ? std::string(key) : fmt::format("{}.{}", path, key);
  }

 private:
  std::string_view source_;
};

StatusOr<uint64_t> Address(const Reader& reader, const PickleObject& dict, std::string_view key,
                           const std::string& path, std::optional<int64_t> fallback = std::nullopt) {
  SHARDSCOPE_ASSIGN_OR_RETURN(int64_t value, reader.Int(dict, key, path, fallback));
  if (value < 0) return reader.Error(Reader::Join(path, key), fmt::format("expected an address (>= 0), got {}", value));
  return static_cast<uint64_t>(value);
}

StatusOr<int64_t> Size(const Reader& reader, const PickleObject& dict, std::string_view key, const std::string& path,
                       std::optional<int64_t> fallback = std::nullopt) {
  SHARDSCOPE_ASSIGN_OR_RETURN(int64_t value, reader.Int(dict, key, path, fallback));
  if (value < 0) return reader.Error(Reader::Join(path, key), fmt::format("expected bytes (>= 0), got {}", value));
  return value;
}

// allocator_settings (torch/csrc/cuda/memory_snapshot.cpp _memory_snapshot_pickled) as an
// alloc_conf string for AllocatorConfig::Parse.
StatusOr<std::string> AllocConfFromSettings(const Reader& reader, const PickleObject& settings) {
  const std::string path = "allocator_settings";
  SHARDSCOPE_RETURN_IF_ERROR(reader.Expect(settings, Kind::kDict, path));
  std::vector<std::string> parts;
  // max_non_split_rounding_mb is not among the structured settings; the recorded
  // PYTORCH_CUDA_ALLOC_CONF string has it when it was set.
  SHARDSCOPE_ASSIGN_OR_RETURN(std::string recorded_conf, reader.String(settings, "PYTORCH_CUDA_ALLOC_CONF", path, ""));
  if (auto parsed = AllocatorConfig::Parse(recorded_conf); parsed.ok()) {
    const AllocatorConfig defaults;
    if (parsed->max_non_split_rounding != defaults.max_non_split_rounding) {
      parts.push_back(fmt::format("max_non_split_rounding_mb:{}", parsed->max_non_split_rounding / kMiB));
    }
  }
  // max_split_size: bytes; SIZE_MAX (read back as -1) means no limit.
  SHARDSCOPE_ASSIGN_OR_RETURN(int64_t max_split, reader.Int(settings, "max_split_size", path, int64_t{-1}));
  if (max_split >= 0) parts.push_back(fmt::format("max_split_size_mb:{}", max_split / kMiB));
  if (const PickleObject* gc = settings.Find("garbage_collection_threshold"); gc != nullptr) {
    double threshold = 0;
    if (gc->kind == Kind::kFloat) {
      threshold = gc->float_value;
    } else if (gc->kind == Kind::kInt) {
      threshold = static_cast<double>(gc->int_value);
    } else {
      return reader.Error(path + ".garbage_collection_threshold", fmt::format("expected float, got {}", gc->KindName()));
    }
    if (threshold > 0) parts.push_back(fmt::format("garbage_collection_threshold:{}", threshold));
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(bool expandable, reader.Bool(settings, "expandable_segments", path, false));
  if (expandable) parts.push_back("expandable_segments:True");
  // roundup_power2_divisions: {"1": d, "2": d, ..., "32768": d}, keyed by the interval's
  // start in MiB, one entry per interval.
  if (const PickleObject* divisions = settings.Find("roundup_power2_divisions"); divisions != nullptr) {
    const std::string dpath = path + ".roundup_power2_divisions";
    SHARDSCOPE_RETURN_IF_ERROR(reader.Expect(*divisions, Kind::kDict, dpath));
    std::map<int64_t, int64_t> by_interval;
    bool any = false;
    for (const auto& [key, value] : divisions->entries) {
      if (key->kind != Kind::kString) return reader.Error(dpath, fmt::format("expected str keys, got {}", key->KindName()));
      const std::string kpath = fmt::format("{}['{}']", dpath, key->string_value);
      int64_t mib = 0;
      for (char c : key->string_value) {
        if (c < '0' || c > '9' || mib > (int64_t{1} << 40)) return reader.Error(kpath, "expected a power of two (MiB)");
        mib = mib * 10 + (c - '0');
      }
      if (mib <= 0 || !std::has_single_bit(static_cast<uint64_t>(mib))) {
        return reader.Error(kpath, "expected a power of two (MiB)");
      }
      if (value->kind != Kind::kInt || value->int_value < 0) {
        return reader.Error(kpath, fmt::format("expected a non-negative int, got {}", value->KindName()));
      }
      by_interval[mib] = value->int_value;
      any = any || value->int_value != 0;
    }
    if (any) {
      std::string list;
      for (const auto& [mib, value] : by_interval) list += fmt::format("{}{}:{}", list.empty() ? "" : ",", mib, value);
      parts.push_back(fmt::format("roundup_power2_divisions:[{}]", list));
    }
  }
  std::string conf;
  for (const std::string& part : parts) conf += (conf.empty() ? "" : ",") + part;
  if (auto parsed = AllocatorConfig::Parse(conf); !parsed.ok()) return reader.Error(path, parsed.status().message());
  return conf;
}

// ---- helpers --------------------------------------------------------------------------

class NoEvents final : public StreamEvents {
 public:
  EventToken Record(AllocStream /*stream*/) override { return 0; }
  bool Query(EventToken /*event*/) override { return true; }
  void Synchronize(EventToken /*event*/) override {}
};

std::string Where(int32_t device, int64_t index) { return fmt::format("device_traces[{}][{}]", device, index); }

std::string Describe(const std::string& action, uint64_t address, int64_t size, int64_t stream) {
  if (action == "oom") return fmt::format("oom ({} B, stream {})", size, stream);
  return fmt::format("{} {:#x} ({} B, stream {})", action, address, size, stream);
}

int32_t StreamIndex(const std::vector<int64_t>& streams, int64_t stream) {
  auto it = std::lower_bound(streams.begin(), streams.end(), stream);
  return static_cast<int32_t>(it - streams.begin());
}

}  // namespace

StatusOr<std::unique_ptr<traces::PickleDocument>> ParseMemorySnapshotPickle(std::string_view bytes,
                                                                            std::string_view source) {
  return traces::ParsePickle(bytes, source);
}

StatusOr<std::unique_ptr<traces::PickleDocument>> ReadMemorySnapshotPickleFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file.is_open()) return Status::IoError(fmt::format("cannot open '{}'", path));
  std::ostringstream bytes;
  bytes << file.rdbuf();
  if (file.bad()) return Status::IoError(fmt::format("reading '{}' failed", path));
  return ParseMemorySnapshotPickle(bytes.str(), path);
}

StatusOr<RecordedSnapshot> ReadMemorySnapshot(const PickleObject& root, std::string_view source, int32_t device) {
  const Reader reader(source);
  SHARDSCOPE_RETURN_IF_ERROR(reader.Expect(root, Kind::kDict, "the top level"));
  SHARDSCOPE_ASSIGN_OR_RETURN(const PickleObject* traces_value, reader.Required(root, "device_traces", ""));
  SHARDSCOPE_RETURN_IF_ERROR(reader.Expect(*traces_value, Kind::kList, "device_traces"));
  for (size_t d = 0; d < traces_value->items.size(); ++d) {
    SHARDSCOPE_RETURN_IF_ERROR(reader.Expect(*traces_value->items[d], Kind::kList, fmt::format("device_traces[{}]", d)));
  }
  RecordedSnapshot snapshot;
  if (device < 0) {
    device = 0;
    for (size_t d = 0; d < traces_value->items.size(); ++d) {
      if (!traces_value->items[d]->items.empty()) {
        device = static_cast<int32_t>(d);
        break;
      }
    }
  } else if (static_cast<size_t>(device) >= traces_value->items.size()) {
    return reader.Error("device_traces", fmt::format("no trace for device {} ({} devices)", device,
                                                     traces_value->items.size()));
  }
  snapshot.device = device;

  SHARDSCOPE_ASSIGN_OR_RETURN(const PickleObject* segments_value, reader.Required(root, "segments", ""));
  SHARDSCOPE_RETURN_IF_ERROR(reader.Expect(*segments_value, Kind::kList, "segments"));
  for (size_t s = 0; s < segments_value->items.size(); ++s) {
    const PickleObject& seg = *segments_value->items[s];
    const std::string path = fmt::format("segments[{}]", s);
    SHARDSCOPE_RETURN_IF_ERROR(reader.Expect(seg, Kind::kDict, path));
    SHARDSCOPE_ASSIGN_OR_RETURN(int64_t seg_device, reader.Int(seg, "device", path, int64_t{0}));
    if (seg_device != device) continue;
    RecordedSegment out;
    SHARDSCOPE_ASSIGN_OR_RETURN(out.address, Address(reader, seg, "address", path));
    SHARDSCOPE_ASSIGN_OR_RETURN(out.total_size, Size(reader, seg, "total_size", path));
    SHARDSCOPE_ASSIGN_OR_RETURN(out.stream, reader.Int(seg, "stream", path, int64_t{0}));
    SHARDSCOPE_ASSIGN_OR_RETURN(out.is_expandable, reader.Bool(seg, "is_expandable", path, false));
    // Older snapshots lack segment_type; the small pool's segments are its 2 MiB buffers.
    SHARDSCOPE_ASSIGN_OR_RETURN(out.segment_type, reader.String(seg, "segment_type", path,
                                                                out.total_size == kSmallBuffer ? "small" : "large"));
    SHARDSCOPE_ASSIGN_OR_RETURN(const PickleObject* blocks, reader.Required(seg, "blocks", path));
    SHARDSCOPE_RETURN_IF_ERROR(reader.Expect(*blocks, Kind::kList, path + ".blocks"));
    uint64_t address = out.address;
    for (size_t b = 0; b < blocks->items.size(); ++b) {
      const PickleObject& block = *blocks->items[b];
      const std::string bpath = fmt::format("{}.blocks[{}]", path, b);
      SHARDSCOPE_RETURN_IF_ERROR(reader.Expect(block, Kind::kDict, bpath));
      RecordedBlock rb;
      SHARDSCOPE_ASSIGN_OR_RETURN(rb.size, Size(reader, block, "size", bpath));
      // Block addresses were added to snapshots later; before, blocks tiled the segment.
      SHARDSCOPE_ASSIGN_OR_RETURN(rb.address, Address(reader, block, "address", bpath, static_cast<int64_t>(address)));
      SHARDSCOPE_ASSIGN_OR_RETURN(rb.requested_size, Size(reader, block, "requested_size", bpath, rb.size));
      SHARDSCOPE_ASSIGN_OR_RETURN(rb.state, reader.String(block, "state", bpath));
      address = rb.address + static_cast<uint64_t>(rb.size);
      out.blocks.push_back(std::move(rb));
    }
    snapshot.segments.push_back(std::move(out));
  }

  if (!traces_value->items.empty()) {
    const PickleObject& entries = *traces_value->items[static_cast<size_t>(device)];
    snapshot.trace.reserve(entries.items.size());
    for (size_t i = 0; i < entries.items.size(); ++i) {
      const PickleObject& entry = *entries.items[i];
      const std::string path = Where(device, static_cast<int64_t>(i));
      SHARDSCOPE_RETURN_IF_ERROR(reader.Expect(entry, Kind::kDict, path));
      RecordedAction action;
      action.index = static_cast<int64_t>(i);
      SHARDSCOPE_ASSIGN_OR_RETURN(action.action, reader.String(entry, "action", path));
      if (action.action == "oom") {
        // The OOM entry stores cudaMemGetInfo's free bytes where others store the address.
        SHARDSCOPE_ASSIGN_OR_RETURN(action.device_free, Size(reader, entry, "device_free", path, int64_t{0}));
      } else if (action.action != "snapshot") {
        SHARDSCOPE_ASSIGN_OR_RETURN(action.address, Address(reader, entry, "addr", path));
      }
      SHARDSCOPE_ASSIGN_OR_RETURN(action.size, Size(reader, entry, "size", path, int64_t{0}));
      SHARDSCOPE_ASSIGN_OR_RETURN(action.stream, reader.Int(entry, "stream", path, int64_t{0}));
      snapshot.trace.push_back(std::move(action));
    }
  }

  if (const PickleObject* settings = root.Find("allocator_settings"); settings != nullptr) {
    SHARDSCOPE_ASSIGN_OR_RETURN(snapshot.alloc_conf, AllocConfFromSettings(reader, *settings));
    snapshot.has_allocator_settings = true;
  }
  return snapshot;
}

StatusOr<SnapshotAllocTrace> SnapshotToAllocTrace(const RecordedSnapshot& snapshot,
                                                  const SnapshotReplayOptions& options) {
  const int32_t device = snapshot.device;
  if (options.device_memory_bytes < 0 || options.device_memory_bytes > kUnlimitedCapacity) {
    return Status::InvalidInput(fmt::format("device memory: expected a positive number of bytes up to {}, got {}",
                                            kUnlimitedCapacity, options.device_memory_bytes));
  }
  // Every size below 2^56 and reserved bytes below that too (checked as they are summed),
  // so that no sum here or in the model can overflow.
  for (const RecordedAction& a : snapshot.trace) {
    if (a.size > kUnlimitedCapacity || a.device_free > kUnlimitedCapacity) {
      return Status::InvalidInput(fmt::format("{}: {} B is more than any device holds ({} B)", Where(device, a.index),
                                              std::max(a.size, a.device_free), kUnlimitedCapacity));
    }
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(AllocatorConfig config, AllocatorConfig::Parse(snapshot.alloc_conf));
  if (config.expandable_segments) {
    return Status::InvalidInput("allocator_settings: expandable_segments is on; replaying expandable segments "
                                "(segment_map/segment_unmap) is not modelled");
  }
  SnapshotAllocTrace out;

  // Streams, renumbered in the order of their values.
  std::vector<int64_t>& streams = out.streams;
  for (const RecordedSegment& seg : snapshot.segments) streams.push_back(seg.stream);
  for (const RecordedAction& a : snapshot.trace) streams.push_back(a.stream);
  std::sort(streams.begin(), streams.end());
  streams.erase(std::unique(streams.begin(), streams.end()), streams.end());
  if (streams.empty()) streams.push_back(0);
  if (streams.size() > kMaxStreams) {
    return Status::InvalidInput(fmt::format("the snapshot uses {} streams; at most {} are replayed", streams.size(),
                                            kMaxStreams));
  }

  // round_size as the recorded allocator applied it.
  std::unique_ptr<DeviceMemory> scratch_memory = MakeCapacityDeviceMemory(0);
  NoEvents scratch_events;
  CachingAllocator rounding(config, *scratch_memory, scratch_events);

  struct Segment {
    int64_t size = 0;
    int64_t stream = 0;
    bool small = false;
  };
  struct Live {
    int64_t size = 0;  // 0: not known yet (allocated before recording, freed during it)
    int64_t requested = 0;
  };
  std::map<uint64_t, Segment> segments;
  std::map<uint64_t, Live> live;
  for (size_t s = 0; s < snapshot.segments.size(); ++s) {
    const RecordedSegment& seg = snapshot.segments[s];
    if (seg.is_expandable) {
      return Status::InvalidInput(fmt::format("segments[{}]: an expandable segment; replaying expandable "
                                              "segments is not modelled", s));
    }
    if (seg.segment_type != "small" && seg.segment_type != "large") {
      return Status::InvalidInput(fmt::format("segments[{}].segment_type: expected 'small' or 'large', got '{}'", s,
                                              seg.segment_type));
    }
    if (seg.total_size <= 0 || seg.total_size > kUnlimitedCapacity || seg.address == 0) {
      return Status::InvalidInput(fmt::format("segments[{}]: expected a positive address and size, got {:#x}, {} B", s,
                                              seg.address, seg.total_size));
    }
    if (!segments.emplace(seg.address, Segment{seg.total_size, seg.stream, seg.segment_type == "small"}).second) {
      return Status::InvalidInput(fmt::format("segments[{}]: a second segment at {:#x}", s, seg.address));
    }
    for (size_t b = 0; b < seg.blocks.size(); ++b) {
      const RecordedBlock& block = seg.blocks[b];
      if (block.state == "inactive") continue;
      if (block.size <= 0) {
        return Status::InvalidInput(fmt::format("segments[{}].blocks[{}]: an allocated block of {} bytes", s, b,
                                                block.size));
      }
      // A block still waiting for its streams (active_pending_free) was allocated at the
      // start too, as far as the trace goes.
      if (!live.emplace(block.address, Live{block.size, block.requested_size}).second) {
        return Status::InvalidInput(fmt::format("segments[{}].blocks[{}]: a second block at {:#x}", s, b,
                                                block.address));
      }
    }
  }

  // Undo the trace, last action first.
  for (auto it = snapshot.trace.rbegin(); it != snapshot.trace.rend(); ++it) {
    const RecordedAction& a = *it;
    auto inconsistent = [&](std::string_view what) {
      return Status::InvalidInput(fmt::format("{}: {}: {} (the trace does not lead to the final segments)",
                                              Where(device, a.index), Describe(a.action, a.address, a.size, a.stream),
                                              what));
    };
    if (a.action == "alloc") {
      auto found = live.find(a.address);
      if (found == live.end()) return inconsistent("no later free and not allocated in the final segments");
      live.erase(found);
    } else if (a.action == "free_completed") {
      if (!live.emplace(a.address, Live{0, a.size}).second) {
        return inconsistent("freed again later without an alloc in between");
      }
    } else if (a.action == "free_requested") {
      if (live.count(a.address) == 0) return inconsistent("never completed and not pending in the final segments");
    } else if (a.action == "segment_alloc") {
      auto found = segments.find(a.address);
      if (found == segments.end()) return inconsistent("no later segment_free and not in the final segments");
      if (found->second.size != a.size) {
        return inconsistent(fmt::format("the segment there has {} B later", found->second.size));
      }
      segments.erase(found);
    } else if (a.action == "segment_free") {
      // Small-pool segments are exactly kSmallBuffer; large-pool ones are >= 10 MiB
      // (get_allocation_size), so the size tells the pool.
      if (!segments.emplace(a.address, Segment{a.size, a.stream, a.size == kSmallBuffer}).second) {
        return inconsistent("the segment is freed twice");
      }
      if (a.size <= 0 || a.size > kUnlimitedCapacity) return inconsistent("expected a positive size");
    } else if (a.action == "segment_map" || a.action == "segment_unmap") {
      return Status::InvalidInput(fmt::format("{}: {}: expandable segments are not modelled in a snapshot replay",
                                              Where(device, a.index), a.action));
    } else if (a.action != "oom" && a.action != "snapshot") {
      return Status::InvalidInput(fmt::format("{}.action: unknown action '{}' (expected alloc, free_requested, "
                                              "free_completed, segment_alloc, segment_free, oom or snapshot)",
                                              Where(device, a.index), a.action));
    }
  }

  // Every block allocated at the start lies in a segment that existed then.
  for (const auto& [address, block] : live) {
    auto seg = segments.upper_bound(address);
    if (seg == segments.begin() || address >= std::prev(seg)->first + static_cast<uint64_t>(std::prev(seg)->second.size)) {
      return Status::InvalidInput(fmt::format("the block at {:#x} ({} B requested), allocated when the trace begins, "
                                              "lies in no segment that existed then", address, block.requested));
    }
  }

  // The initial segments, blocks in address order.
  AllocTrace& trace = out.trace;
  int64_t next_id = 0;
  std::map<uint64_t, int64_t> live_id;  // allocated block address -> id
  for (const auto& [address, seg] : segments) {
    AllocTraceInitialSegment initial;
    initial.address = address;
    initial.stream = StreamIndex(streams, seg.stream);
    initial.small = seg.small;
    const uint64_t end = address + static_cast<uint64_t>(seg.size);
    uint64_t cursor = address;
    for (auto it = live.lower_bound(address); it != live.end() && it->first < end; ++it) {
      const uint64_t block_address = it->first;
      const auto next = std::next(it);
      const uint64_t boundary = next != live.end() && next->first < end ? next->first : end;
      int64_t size = it->second.size;
      if (size == 0) {
        size = rounding.RoundSize(std::max<int64_t>(it->second.requested, 1));
        const int64_t gap = static_cast<int64_t>(boundary - block_address) - size;
        if (gap < 0) {
          return Status::InvalidInput(fmt::format("the block at {:#x} ({} B requested, {} B rounded), allocated when "
                                                  "the trace begins, does not fit before {:#x}", block_address,
                                                  it->second.requested, size, boundary));
        }
        // should_split: a large-pool block keeps a remainder of <= 1 MiB, and an oversize
        // one (>= max_split_size) is never split.
        if (!seg.small && gap > 0 && (gap <= kSmallSize || size >= config.max_split_size)) size += gap;
      }
      if (block_address < cursor || size > static_cast<int64_t>(boundary - block_address)) {
        return Status::InvalidInput(fmt::format("the block at {:#x} ({} B) overlaps its neighbour in the segment at "
                                                "{:#x}", block_address, size, address));
      }
      if (block_address > cursor) initial.blocks.push_back({static_cast<int64_t>(block_address - cursor), -1, 0});
      initial.blocks.push_back({size, next_id, it->second.requested});
      live_id[block_address] = next_id++;
      cursor = block_address + static_cast<uint64_t>(size);
    }
    if (cursor < end) initial.blocks.push_back({static_cast<int64_t>(end - cursor), -1, 0});
    out.initial_reserved_bytes += seg.size;
    if (out.initial_reserved_bytes > kUnlimitedCapacity) {
      return Status::InvalidInput(fmt::format("the segments when the trace begins hold more than {} B",
                                              kUnlimitedCapacity));
    }
    trace.initial_segments.push_back(std::move(initial));
  }
  out.initial_allocated_blocks = static_cast<int64_t>(live_id.size());

  // The calls, and what bounds the device. Bursts of segment_free: inside a malloc (the
  // release-and-retry path of malloc: release_cached_blocks, then alloc_block again,
  // whose segment_alloc and the alloc follow; or an oom follows) or empty_cache.
  auto next_action = [&](size_t i) {
    while (i < snapshot.trace.size() && snapshot.trace[i].action == "snapshot") ++i;
    return i;
  };
  int64_t reserved = out.initial_reserved_bytes;
  std::optional<int64_t> bound;
  std::string bound_source;
  auto consider = [&](int64_t value, std::string source) {
    if (!bound || value < *bound) {
      bound = value;
      bound_source = std::move(source);
    }
  };
  std::string previous;
  std::map<uint64_t, int64_t> pending;  // address -> id: free requested, not yet completed
  for (size_t i = 0; i < snapshot.trace.size(); ++i) {
    const RecordedAction& a = snapshot.trace[i];
    const int32_t stream = StreamIndex(streams, a.stream);
    if (a.action == "alloc") {
      trace.ops.push_back(AllocTraceAlloc{next_id, a.size, stream});
      live_id[a.address] = next_id++;
    } else if (a.action == "free_requested") {
      auto it = live_id.find(a.address);
      if (it == live_id.end()) {  // the reverse walk rules this out
        previous = a.action;
        continue;
      }
      const size_t next = next_action(i + 1);
      const bool completes_now = next < snapshot.trace.size() && snapshot.trace[next].action == "free_completed" &&
                                 snapshot.trace[next].address == a.address;
      if (completes_now) {
        trace.ops.push_back(AllocTraceFree{it->second});
      } else {
        // free: stream_uses not empty -> insert_events; the block returns to the pool in
        // process_events (or synchronize_and_free_events) once they complete.
        pending[a.address] = it->second;
        out.deferred_free_requests.push_back(a.index);
      }
      live_id.erase(it);
    } else if (a.action == "free_completed") {
      // The completion of a deferred free, or of one requested before recording began.
      auto it = pending.find(a.address);
      if (it != pending.end()) {
        out.deferred_free_ops.push_back(static_cast<int64_t>(trace.ops.size()));
        trace.ops.push_back(AllocTraceFree{it->second});
        pending.erase(it);
      } else if (auto held = live_id.find(a.address); held != live_id.end()) {
        out.deferred_free_ops.push_back(static_cast<int64_t>(trace.ops.size()));
        trace.ops.push_back(AllocTraceFree{held->second});
        live_id.erase(held);
      }
    } else if (a.action == "segment_alloc") {
      trace.segment_addresses.push_back(a.address);
      reserved += a.size;
      if (reserved > kUnlimitedCapacity) {
        return Status::InvalidInput(fmt::format("{}: the segments hold more than {} B", Where(device, a.index),
                                                kUnlimitedCapacity));
      }
    } else if (a.action == "segment_free") {
      if (previous != "segment_free") {
        size_t j = i;
        while (j < snapshot.trace.size() &&
               (snapshot.trace[j].action == "segment_free" || snapshot.trace[j].action == "snapshot")) {
          ++j;
        }
        const bool then_segment = j < snapshot.trace.size() && snapshot.trace[j].action == "segment_alloc";
        const size_t after = then_segment ? next_action(j + 1) : j;
        if (then_segment && after < snapshot.trace.size() && snapshot.trace[after].action == "alloc") {
          // cudaMalloc failed at `reserved` + the segment, then succeeded after the release.
          out.retry_bursts.push_back(a.index);
          consider(reserved + snapshot.trace[j].size - 1, fmt::format("retry at {}", Where(device, a.index)));
        } else if (!(j < snapshot.trace.size() && snapshot.trace[j].action == "oom")) {
          trace.ops.push_back(AllocTraceEmptyCache{});
        }
      }
      reserved -= a.size;
    } else if (a.action == "oom") {
      // malloc's OOM branch: the rounded request, after the release; cudaMemGetInfo's free
      // bytes give the device's capacity for this allocator.
      trace.ops.push_back(AllocTraceAlloc{next_id++, a.size, stream});
      consider(reserved + a.device_free, fmt::format("oom at {}", Where(device, a.index)));
    }
    if (a.action != "snapshot") previous = a.action;
  }

  if (options.device_memory_bytes > 0) {
    trace.device_memory_bytes = options.device_memory_bytes;
    out.capacity_source = "--device-memory-bytes";
  } else if (bound) {
    trace.device_memory_bytes = std::max<int64_t>(*bound, 1);
    out.capacity_source = bound_source;
  } else {
    trace.device_memory_bytes = kUnlimitedCapacity;
    out.capacity_source = "unlimited: no cudaMalloc failed in the trace";
  }
  if (trace.device_memory_bytes < out.initial_reserved_bytes) {
    return Status::InvalidInput(fmt::format("device memory {} B ({}) is less than the {} B the segments hold when the "
                                            "trace begins", trace.device_memory_bytes, out.capacity_source,
                                            out.initial_reserved_bytes));
  }
  trace.alloc_conf = snapshot.alloc_conf;
  trace.streams = static_cast<int32_t>(streams.size());
  trace.description = fmt::format("memory snapshot, device {}: {} actions replayed from the state when recording began",
                                  device, snapshot.trace.size());
  return out;
}

namespace {

bool SameAction(const RecordedAction& r, const TraceEntry& m, const std::vector<int64_t>& streams) {
  return r.action == m.action && r.size == m.size && StreamIndex(streams, r.stream) == m.stream &&
         (r.action == "oom" || r.address == m.address);
}

std::string DivergenceText(const RecordedAction& r, const TraceEntry& m, const std::vector<int64_t>& streams) {
  const int32_t r_stream = StreamIndex(streams, r.stream);
  if (r.action == m.action && r.action == "alloc" && r.size == m.size && r.address != m.address) {
    return fmt::format("block chosen for an alloc of {} B: recorded {:#x}, model {:#x}", r.size, r.address, m.address);
  }
  return fmt::format("recorded {}, model {}", Describe(r.action, r.address, r.size, r_stream),
                     Describe(m.action, m.address, m.size, m.stream));
}

// The final segments, recorded and modelled, compared in address order.
std::optional<std::string> FinalStateDifference(const RecordedSnapshot& snapshot,
                                                const std::vector<SnapshotSegment>& model,
                                                const std::vector<int64_t>& streams) {
  std::vector<const RecordedSegment*> recorded;
  for (const RecordedSegment& seg : snapshot.segments) recorded.push_back(&seg);
  std::sort(recorded.begin(), recorded.end(), [](const auto* a, const auto* b) { return a->address < b->address; });
  if (recorded.size() != model.size()) {
    return fmt::format("final state: {} segments recorded, {} in the model", recorded.size(), model.size());
  }
  for (size_t s = 0; s < model.size(); ++s) {
    const RecordedSegment& r = *recorded[s];
    const SnapshotSegment& m = model[s];
    if (r.address != m.address || r.total_size != m.total_size || StreamIndex(streams, r.stream) != m.stream ||
        r.segment_type != m.segment_type) {
      return fmt::format("final state: segment {:#x} ({} B, {}) recorded, {:#x} ({} B, {}) in the model", r.address,
                         r.total_size, r.segment_type, m.address, m.total_size, m.segment_type);
    }
    if (r.blocks.size() != m.blocks.size()) {
      return fmt::format("final state: segment {:#x} has {} blocks recorded, {} in the model", r.address,
                         r.blocks.size(), m.blocks.size());
    }
    for (size_t b = 0; b < r.blocks.size(); ++b) {
      const RecordedBlock& rb = r.blocks[b];
      const SnapshotBlock& mb = m.blocks[b];
      // A block whose free still waits for other streams is allocated in the model (its free
      // is replayed when it completes).
      const std::string state = rb.state == "active_pending_free" ? "active_allocated" : rb.state;
      const bool requested_differs = state == "active_allocated" && rb.requested_size != mb.requested_size;
      if (rb.address != mb.address || rb.size != mb.size || state != mb.state || requested_differs) {
        return fmt::format("final state: block {:#x} ({} B, {}) recorded, {:#x} ({} B, {}) in the model", rb.address,
                           rb.size, rb.state, mb.address, mb.size, mb.state);
      }
    }
  }
  return std::nullopt;
}

}  // namespace

StatusOr<SnapshotReplay> ReplaySnapshot(const RecordedSnapshot& snapshot, const SnapshotReplayOptions& options) {
  SnapshotReplay replay;
  SHARDSCOPE_ASSIGN_OR_RETURN(replay.converted, SnapshotToAllocTrace(snapshot, options));
  const std::vector<int64_t>& streams = replay.converted.streams;
  AllocReplayOptions replay_options;
  replay_options.record_history = true;
  SHARDSCOPE_ASSIGN_OR_RETURN(AllocReplayResult result, ReplayAllocTrace(replay.converted.trace, replay_options));

  int64_t reserved = replay.converted.initial_reserved_bytes;
  replay.peak_reserved_bytes.recorded = reserved;
  int64_t ooms = 0;
  const std::vector<int64_t>& deferred_requests = replay.converted.deferred_free_requests;
  const std::vector<int64_t>& deferred_ops = replay.converted.deferred_free_ops;
  for (const RecordedAction& a : snapshot.trace) {
    if (a.action == "snapshot") continue;
    ++replay.actions;
    // A deferred free is compared where it completes (SnapshotAllocTrace).
    if (!std::binary_search(deferred_requests.begin(), deferred_requests.end(), a.index)) replay.recorded.push_back(a);
    if (a.action == "segment_alloc") {
      ++replay.segment_allocs.recorded;
      reserved += a.size;
    } else if (a.action == "segment_free") {
      ++replay.segment_frees.recorded;
      reserved -= a.size;
    } else if (a.action == "oom") {
      ++ooms;
    }
    replay.peak_reserved_bytes.recorded = std::max(replay.peak_reserved_bytes.recorded, reserved);
  }
  // Every oom went through the release-and-retry path first (num_alloc_retries counts it).
  replay.alloc_retries.recorded = static_cast<int64_t>(replay.converted.retry_bursts.size()) + ooms;
  for (size_t k = 0; k < result.history.size(); ++k) {
    TraceEntry& e = result.history[k];
    const int64_t op = k < result.history_op.size() ? result.history_op[k] : -1;
    if (e.action == "free_requested" && std::binary_search(deferred_ops.begin(), deferred_ops.end(), op)) continue;
    replay.model.push_back(std::move(e));
  }
  for (const TraceEntry& e : replay.model) {
    if (e.action == "segment_alloc") ++replay.segment_allocs.model;
    if (e.action == "segment_free") ++replay.segment_frees.model;
  }
  replay.alloc_retries.model = result.stats.num_alloc_retries;
  replay.peak_reserved_bytes.model = result.stats.reserved_bytes_peak;

  const int64_t trace_end = static_cast<int64_t>(snapshot.trace.size());
  const size_t n = std::max(replay.recorded.size(), replay.model.size());
  for (size_t k = 0; k < n && !replay.first_divergence; ++k) {
    const bool has_recorded = k < replay.recorded.size();
    const bool has_model = k < replay.model.size();
    if (has_recorded && has_model && SameAction(replay.recorded[k], replay.model[k], streams)) continue;
    SnapshotDivergence d;
    if (has_recorded) d.recorded = replay.recorded[k];
    if (has_model) d.model = replay.model[k];
    d.index = has_recorded ? replay.recorded[k].index : trace_end;
    if (has_recorded && has_model) {
      d.what = DivergenceText(replay.recorded[k], replay.model[k], streams);
    } else if (has_recorded) {
      const RecordedAction& r = replay.recorded[k];
      d.what = fmt::format("recorded {}, the model did nothing more",
                           Describe(r.action, r.address, r.size, StreamIndex(streams, r.stream)));
    } else {
      const TraceEntry& m = replay.model[k];
      d.what = fmt::format("the recorded trace ends, the model went on: {}",
                           Describe(m.action, m.address, m.size, m.stream));
    }
    replay.first_divergence = std::move(d);
  }
  if (!replay.first_divergence) {
    if (std::optional<std::string> what = FinalStateDifference(snapshot, result.final_segments, streams)) {
      replay.first_divergence = SnapshotDivergence{trace_end, *what, std::nullopt, std::nullopt};
    }
  }
  replay.exact = !replay.first_divergence;
  return replay;
}

namespace {

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

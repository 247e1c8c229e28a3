// Reading a PyTorch memory snapshot (torch.cuda.memory._snapshot() pickled by
// _dump_snapshot): the segments, the trace of one device and the allocator settings, checked
// and turned into a RecordedSnapshot (see memory_snapshot.h).
#include "shardscope/analysis/memory_snapshot.h"

#include <algorithm>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "memory_snapshot_internal.h"

namespace shardscope::sim {
namespace {

using snapshot_internal::kSmallBuffer;
using snapshot_internal::Where;
using traces::PickleObject;
using Kind = PickleObject::Kind;

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

}  // namespace shardscope::sim

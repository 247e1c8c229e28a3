// Allocation traces: JSON reading and writing, validation, replay through CachingAllocator,
// and lowering a rank's program into a trace (see alloc_trace.h, docs/ALLOC_TRACE.md).
//
// Validation walks the ops once keeping, per id, the op index that allocated it and the
// one that freed it (-1 while live), so every message can point at both ops.
#include "shardscope/sim/memory/alloc_trace.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "shardscope/base/json_text.h"

namespace shardscope::sim {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

// A trace with more streams than this is a typo, not a workload (PyTorch pools hold a
// handful of streams); the cap also bounds the GPU script, which creates every stream.
constexpr int64_t kMaxStreams = 1024;
// Bytes: one alloc at most traces::kMaxOpBytes (1 PiB, the schedule's limit), a device at most
// 2^56 (64 PiB, as the initial segments in all): the allocator's rounding and sums of such
// sizes stay inside int64_t.
constexpr int64_t kMaxDeviceBytes = int64_t{1} << 56;
// A trace nests three levels deep; nlohmann's parser recurses per level, so deeper input is
// refused before parsing rather than allowed to exhaust the stack.
constexpr int kMaxDepth = 64;

// What the value is, for "expected X, got Y" messages.
std::string Describe(const Json& value) {
  switch (value.type()) {
    case Json::value_t::object:
      return "an object";
    case Json::value_t::array:
      return "an array";
    default: {
      std::string text = value.dump(-1, ' ', false, Json::error_handler_t::replace);
      constexpr size_t kMaxChars = 64;
      if (text.size() > kMaxChars) text = text.substr(0, kMaxChars) + "...";
      return text;
    }
  }
}

// Builds messages "SOURCE: WHERE: key 'KEY': expected ..., got ...".
class Context {
 public:
  Context(const std::string& source, std::string where) : source_(source), where_(std::move(where)) {}

  Status Error(std::string_view key, std::string_view what) const {
    return Status::InvalidInput(fmt::format("{}: {}key '{}': {}", source_, Prefix(), key, what));
  }
  Status Error(std::string_view what) const {
    return Status::InvalidInput(fmt::format("{}: {}{}", source_, Prefix(), what));
  }

  // Integer value of `key` in [lo, hi].
  StatusOr<int64_t> Int(const Json& object, std::string_view key, int64_t lo, int64_t hi,
                        std::string_view expected) const {
    auto it = object.find(key);
    if (it == object.end()) return Error(key, fmt::format("missing (expected {})", expected));
    int64_t value = 0;
    if (it->is_number_integer() && !it->is_number_unsigned()) {
      value = it->get<int64_t>();
    } else if (it->is_number_unsigned()) {
      const auto u = it->get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Error(key, fmt::format("expected {}, got {}", expected, Describe(*it)));
      }
      value = static_cast<int64_t>(u);
    } else {
      return Error(key, fmt::format("expected {}, got {}", expected, Describe(*it)));
    }
    if (value < lo || value > hi) return Error(key, fmt::format("expected {}, got {}", expected, value));
    return value;
  }

  StatusOr<std::string> String(const Json& object, std::string_view key) const {
    auto it = object.find(key);
    if (it == object.end()) return std::string();
    if (!it->is_string()) return Error(key, fmt::format("expected a string, got {}", Describe(*it)));
    return it->get<std::string>();
  }

  Status OnlyKeys(const Json& object, std::initializer_list<std::string_view> allowed) const {
    for (auto it = object.begin(); it != object.end(); ++it) {
      bool known = false;
      for (std::string_view key : allowed) known = known || it.key() == key;
      if (!known) {
        std::string list;
        for (std::string_view key : allowed) list += (list.empty() ? "" : ", ") + std::string(key);
        return Error(it.key(), fmt::format("unknown key (expected one of: {})", list));
      }
    }
    return Status::Ok();
  }

 private:
  std::string Prefix() const { return where_.empty() ? "" : where_ + ": "; }
  const std::string& source_;
  std::string where_;
};

// A replay runs no kernels: its events complete at once (CompletedStreamEvents).

// The initial state in the form CachingAllocator::Restore takes.
std::vector<SnapshotSegment> InitialSnapshotSegments(const AllocTrace& trace) {
  std::vector<SnapshotSegment> segments;
  segments.reserve(trace.initial_segments.size());
  for (const AllocTraceInitialSegment& seg : trace.initial_segments) {
    SnapshotSegment out;
    out.address = seg.address;
    out.stream = seg.stream;
    out.segment_type = seg.small ? "small" : "large";
    uint64_t address = seg.address;
    for (const AllocTraceInitialBlock& block : seg.blocks) {
      SnapshotBlock b;
      b.address = address;
      b.size = block.size;
      b.requested_size = block.id >= 0 ? block.bytes : 0;
      b.state = block.id >= 0 ? "active_allocated" : "inactive";
      address += static_cast<uint64_t>(std::max<int64_t>(block.size, 0));
      out.total_size += block.size;
      out.blocks.push_back(std::move(b));
    }
    segments.push_back(std::move(out));
  }
  return segments;
}

int64_t InitialReservedBytes(const AllocTrace& trace) {
  int64_t total = 0;
  for (const AllocTraceInitialSegment& seg : trace.initial_segments) {
    for (const AllocTraceInitialBlock& block : seg.blocks) total += block.size;
  }
  return total;
}

// The device beneath a replay: the recorded addresses when the trace has an initial state
// or segment addresses, a fresh device of that capacity otherwise.
std::unique_ptr<DeviceMemory> MakeReplayDevice(const AllocTrace& trace) {
  if (trace.initial_segments.empty() && trace.segment_addresses.empty()) {
    return MakeCapacityDeviceMemory(trace.device_memory_bytes);
  }
  return MakeRecordedDeviceMemory(trace.device_memory_bytes, InitialReservedBytes(trace), trace.segment_addresses);
}

StatusOr<AllocTraceOp> ParseOp(const Json& value, const Context& at, int64_t max_stream) {
  if (!value.is_object()) return at.Error(fmt::format("expected an op object, got {}", Describe(value)));
  auto kind_it = value.find("op");
  if (kind_it == value.end()) {
    return at.Error("op", "missing (expected \"alloc\", \"free\", \"record_stream\" or \"empty_cache\")");
  }
  if (!kind_it->is_string()) return at.Error("op", fmt::format("expected a string, got {}", Describe(*kind_it)));
  const std::string& kind = kind_it->get_ref<const std::string&>();
  const std::string stream_expected = fmt::format("a stream index in [0, {}]", max_stream);
  constexpr int64_t kMaxId = std::numeric_limits<int64_t>::max();
  if (kind == "alloc") {
    SHARDSCOPE_RETURN_IF_ERROR(at.OnlyKeys(value, {"op", "id", "bytes", "stream"}));
    AllocTraceAlloc op;
    SHARDSCOPE_ASSIGN_OR_RETURN(op.id, at.Int(value, "id", 0, kMaxId, "a non-negative integer"));
    SHARDSCOPE_ASSIGN_OR_RETURN(op.bytes, at.Int(value, "bytes", 0, traces::kMaxOpBytes,
                                                 fmt::format("an integer in [0, {}] (bytes)", traces::kMaxOpBytes)));
    SHARDSCOPE_ASSIGN_OR_RETURN(int64_t stream, at.Int(value, "stream", 0, max_stream, stream_expected));
    op.stream = static_cast<int32_t>(stream);
    return AllocTraceOp(op);
  }
  if (kind == "free") {
    SHARDSCOPE_RETURN_IF_ERROR(at.OnlyKeys(value, {"op", "id"}));
    AllocTraceFree op;
    SHARDSCOPE_ASSIGN_OR_RETURN(op.id, at.Int(value, "id", 0, kMaxId, "a non-negative integer"));
    return AllocTraceOp(op);
  }
  if (kind == "record_stream") {
    SHARDSCOPE_RETURN_IF_ERROR(at.OnlyKeys(value, {"op", "id", "stream"}));
    AllocTraceRecordStream op;
    SHARDSCOPE_ASSIGN_OR_RETURN(op.id, at.Int(value, "id", 0, kMaxId, "a non-negative integer"));
    SHARDSCOPE_ASSIGN_OR_RETURN(int64_t stream, at.Int(value, "stream", 0, max_stream, stream_expected));
    op.stream = static_cast<int32_t>(stream);
    return AllocTraceOp(op);
  }
  if (kind == "empty_cache") {
    SHARDSCOPE_RETURN_IF_ERROR(at.OnlyKeys(value, {"op"}));
    return AllocTraceOp(AllocTraceEmptyCache{});
  }
  return at.Error("op", fmt::format("expected \"alloc\", \"free\", \"record_stream\" or \"empty_cache\", got {}",
                                    Describe(*kind_it)));
}

std::string OpWhere(size_t index) { return fmt::format("ops[{}]", index); }

// Checks what replay relies on beyond types: header ranges, stream indices, and the life of
// every id (allocated once, freed at most once, used only while live).
Status ValidateAllocTrace(const AllocTrace& trace, const std::string& source) {
  const Context top(source, "");
  if (trace.version != kAllocTraceVersion) {
    return top.Error("version", fmt::format("expected {}, got {}", kAllocTraceVersion, trace.version));
  }
  if (!(trace.memory_fraction > 0 && trace.memory_fraction <= 1)) {
    return top.Error("memory_fraction", fmt::format("expected a number in (0, 1], got {}", trace.memory_fraction));
  }
  if (trace.device_memory_bytes <= 0 || trace.device_memory_bytes > kMaxDeviceBytes) {
    return top.Error("device_memory_bytes",
                     fmt::format("expected an integer in [1, {}], got {}", kMaxDeviceBytes, trace.device_memory_bytes));
  }
  if (trace.streams < 1 || trace.streams > kMaxStreams) {
    return top.Error("streams", fmt::format("expected an integer in [1, {}], got {}", kMaxStreams, trace.streams));
  }
  auto conf = AllocatorConfig::Parse(trace.alloc_conf);
  if (!conf.ok()) return top.Error("alloc_conf", conf.status().message());

  struct Life {
    int64_t allocated_at = 0;  // -1: allocated in initial_segments
    int64_t freed_at = -1;
  };
  std::unordered_map<int64_t, Life> lives;
  auto where_allocated = [](int64_t at) {
    return at < 0 ? std::string("in initial_segments") : fmt::format("at ops[{}]", at);
  };
  // Initial state: streams, sizes and ids here; the layout (blocks tiling each segment,
  // segments not overlapping) by restoring it into a scratch allocator.
  int64_t initial_bytes = 0;
  for (size_t s = 0; s < trace.initial_segments.size(); ++s) {
    const AllocTraceInitialSegment& seg = trace.initial_segments[s];
    const Context at(source, fmt::format("initial_segments[{}]", s));
    if (seg.address == 0) return at.Error("address", "expected a positive integer, got 0");
    if (seg.stream < 0 || seg.stream >= trace.streams) {
      return at.Error("stream", fmt::format("expected a stream index in [0, {}], got {}", trace.streams - 1, seg.stream));
    }
    if (seg.blocks.empty()) return at.Error("blocks", "expected at least one block");
    for (size_t b = 0; b < seg.blocks.size(); ++b) {
      const AllocTraceInitialBlock& block = seg.blocks[b];
      const Context block_at(source, fmt::format("initial_segments[{}].blocks[{}]", s, b));
      constexpr int64_t kMaxBytes = int64_t{1} << 56;  // 64 PiB: no device holds more
      if (block.size <= 0 || block.size > kMaxBytes - initial_bytes) {
        return block_at.Error("size", fmt::format("expected a positive integer (bytes, {} in all at most), got {}",
                                                  kMaxBytes, block.size));
      }
      initial_bytes += block.size;
      if (block.id < -1) return block_at.Error("id", fmt::format("expected a non-negative integer, got {}", block.id));
      if (block.id < 0) continue;
      if (block.bytes < 0 || block.bytes > block.size) {
        return block_at.Error("bytes", fmt::format("expected an integer in [0, {}] (the block's size), got {}",
                                                   block.size, block.bytes));
      }
      auto [it, inserted] = lives.try_emplace(block.id, Life{-1, -1});
      if (!inserted) return block_at.Error("id", fmt::format("id {} appears twice in initial_segments", block.id));
    }
  }
  if (initial_bytes > trace.device_memory_bytes) {
    return top.Error("device_memory_bytes", fmt::format("the initial segments hold {} bytes, more than the device's {}",
                                                         initial_bytes, trace.device_memory_bytes));
  }
  for (size_t i = 0; i < trace.segment_addresses.size(); ++i) {
    if (trace.segment_addresses[i] == 0) {
      return Context(source, fmt::format("segment_addresses[{}]", i)).Error("expected a positive integer, got 0");
    }
  }
  if (!trace.initial_segments.empty()) {
    std::unique_ptr<DeviceMemory> scratch_memory = MakeReplayDevice(trace);
    CompletedStreamEvents scratch_events;
    CachingAllocator scratch(*conf, *scratch_memory, scratch_events);
    Status restored = scratch.Restore(InitialSnapshotSegments(trace));
    if (!restored.ok()) return top.Error("initial_segments", restored.message());
  }
  for (size_t i = 0; i < trace.ops.size(); ++i) {
    const Context at(source, OpWhere(i));
    const AllocTraceOp& op = trace.ops[i];
    auto check_stream = [&](int32_t stream) -> Status {
      if (stream < 0 || stream >= trace.streams) {
        return at.Error("stream", fmt::format("expected a stream index in [0, {}] (the trace declares "
                                              "\"streams\": {}), got {}",
                                              trace.streams - 1, trace.streams, stream));
      }
      return Status::Ok();
    };
    // The id must be live: known and not yet freed.
    auto check_live = [&](int64_t id) -> Status {
      auto it = lives.find(id);
      if (it == lives.end()) return at.Error("id", fmt::format("unknown id {} (no earlier alloc)", id));
      if (it->second.freed_at >= 0) {
        return at.Error("id", fmt::format("id {} was already freed at ops[{}]", id, it->second.freed_at));
      }
      return Status::Ok();
    };
    if (const auto* alloc = std::get_if<AllocTraceAlloc>(&op)) {
      if (alloc->bytes < 0 || alloc->bytes > traces::kMaxOpBytes) {
        return at.Error("bytes", fmt::format("expected an integer in [0, {}], got {}", traces::kMaxOpBytes, alloc->bytes));
      }
      if (alloc->id < 0) return at.Error("id", fmt::format("expected a non-negative integer, got {}", alloc->id));
      SHARDSCOPE_RETURN_IF_ERROR(check_stream(alloc->stream));
      auto [it, inserted] = lives.try_emplace(alloc->id, Life{static_cast<int64_t>(i), -1});
      if (!inserted) {
        return at.Error("id", fmt::format("id {} was already allocated {} (ids are never reused)", alloc->id,
                                          where_allocated(it->second.allocated_at)));
      }
    } else if (const auto* free_op = std::get_if<AllocTraceFree>(&op)) {
      SHARDSCOPE_RETURN_IF_ERROR(check_live(free_op->id));
      lives[free_op->id].freed_at = static_cast<int64_t>(i);
    } else if (const auto* record = std::get_if<AllocTraceRecordStream>(&op)) {
      SHARDSCOPE_RETURN_IF_ERROR(check_live(record->id));
      SHARDSCOPE_RETURN_IF_ERROR(check_stream(record->stream));
    }
  }
  return Status::Ok();
}

}  // namespace

StatusOr<AllocTrace> ParseAllocTrace(std::string_view json, const std::string& source) {
  if (traces::JsonNestingDepth(json, kMaxDepth) > kMaxDepth) {
    return Status::InvalidInput(fmt::format("{}: JSON nested deeper than {} levels (a trace nests 3)", source, kMaxDepth));
  }
  // nlohmann reports where a syntax error is only through its exception; it is caught here
  // and never leaves this function.
  Json doc;
  try {
    doc = Json::parse(json.begin(), json.end());
  } catch (const Json::parse_error& e) {
    const size_t offset = e.byte > 0 ? e.byte - 1 : 0;
    return Status::InvalidInput(fmt::format("{}:{}: invalid JSON: {}", source, traces::LineColumn(json, offset), e.what()));
  } catch (const std::exception& e) {
    return Status::InvalidInput(fmt::format("{}: invalid JSON: {}", source, e.what()));
  }
  const Context top(source, "");
  if (!doc.is_object()) return top.Error(fmt::format("expected a JSON object at the top level, got {}", Describe(doc)));
  SHARDSCOPE_RETURN_IF_ERROR(top.OnlyKeys(doc, {"version", "description", "alloc_conf", "memory_fraction",
                                                "device_memory_bytes", "streams", "initial_segments",
                                                "segment_addresses", "ops"}));

  AllocTrace trace;
  SHARDSCOPE_ASSIGN_OR_RETURN(int64_t version, top.Int(doc, "version", kAllocTraceVersion, kAllocTraceVersion,
                                                       fmt::format("{}", kAllocTraceVersion)));
  trace.version = static_cast<int>(version);
  SHARDSCOPE_ASSIGN_OR_RETURN(trace.description, top.String(doc, "description"));
  SHARDSCOPE_ASSIGN_OR_RETURN(trace.alloc_conf, top.String(doc, "alloc_conf"));
  if (auto it = doc.find("memory_fraction"); it != doc.end()) {
    if (!it->is_number()) {
      return top.Error("memory_fraction", fmt::format("expected a number in (0, 1], got {}", Describe(*it)));
    }
    trace.memory_fraction = it->get<double>();
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(trace.device_memory_bytes,
                              top.Int(doc, "device_memory_bytes", 1, kMaxDeviceBytes,
                                      fmt::format("an integer in [1, {}] (bytes)", kMaxDeviceBytes)));
  SHARDSCOPE_ASSIGN_OR_RETURN(int64_t streams,
                              top.Int(doc, "streams", 1, kMaxStreams, fmt::format("an integer in [1, {}]", kMaxStreams)));
  trace.streams = static_cast<int32_t>(streams);

  constexpr int64_t kMaxAddress = std::numeric_limits<int64_t>::max();
  if (auto it = doc.find("initial_segments"); it != doc.end()) {
    if (!it->is_array()) {
      return top.Error("initial_segments", fmt::format("expected an array of segments, got {}", Describe(*it)));
    }
    for (size_t s = 0; s < it->size(); ++s) {
      const Json& value = (*it)[s];
      const Context at(source, fmt::format("initial_segments[{}]", s));
      if (!value.is_object()) return at.Error(fmt::format("expected a segment object, got {}", Describe(value)));
      SHARDSCOPE_RETURN_IF_ERROR(at.OnlyKeys(value, {"address", "stream", "pool", "blocks"}));
      AllocTraceInitialSegment seg;
      SHARDSCOPE_ASSIGN_OR_RETURN(int64_t address, at.Int(value, "address", 1, kMaxAddress, "a positive integer"));
      seg.address = static_cast<uint64_t>(address);
      SHARDSCOPE_ASSIGN_OR_RETURN(int64_t stream, at.Int(value, "stream", 0, streams - 1,
                                                         fmt::format("a stream index in [0, {}]", streams - 1)));
      seg.stream = static_cast<int32_t>(stream);
      SHARDSCOPE_ASSIGN_OR_RETURN(std::string pool, at.String(value, "pool"));
      if (pool != "small" && pool != "large") {
        return at.Error("pool", fmt::format("expected \"small\" or \"large\", got \"{}\"", pool));
      }
      seg.small = pool == "small";
      auto blocks_it = value.find("blocks");
      if (blocks_it == value.end() || !blocks_it->is_array()) {
        return at.Error("blocks", "expected an array of blocks ({\"size\": N} or {\"size\": N, \"id\": I, \"bytes\": B})");
      }
      for (size_t b = 0; b < blocks_it->size(); ++b) {
        const Json& block_value = (*blocks_it)[b];
        const Context block_at(source, fmt::format("initial_segments[{}].blocks[{}]", s, b));
        if (!block_value.is_object()) {
          return block_at.Error(fmt::format("expected a block object, got {}", Describe(block_value)));
        }
        SHARDSCOPE_RETURN_IF_ERROR(block_at.OnlyKeys(block_value, {"size", "id", "bytes"}));
        AllocTraceInitialBlock block;
        SHARDSCOPE_ASSIGN_OR_RETURN(block.size, block_at.Int(block_value, "size", 1, kMaxAddress, "a positive integer"));
        if (block_value.contains("id")) {
          SHARDSCOPE_ASSIGN_OR_RETURN(block.id, block_at.Int(block_value, "id", 0, kMaxAddress, "a non-negative integer"));
          SHARDSCOPE_ASSIGN_OR_RETURN(block.bytes,
                                      block_at.Int(block_value, "bytes", 0, kMaxAddress, "a non-negative integer"));
        } else if (block_value.contains("bytes")) {
          return block_at.Error("bytes", "a free block (no \"id\") has no requested bytes");
        }
        seg.blocks.push_back(block);
      }
      trace.initial_segments.push_back(std::move(seg));
    }
  }
  if (auto it = doc.find("segment_addresses"); it != doc.end()) {
    if (!it->is_array()) {
      return top.Error("segment_addresses", fmt::format("expected an array of addresses, got {}", Describe(*it)));
    }
    for (size_t i = 0; i < it->size(); ++i) {
      const Json& value = (*it)[i];
      if (!value.is_number_integer() || (!value.is_number_unsigned() && value.get<int64_t>() <= 0) ||
          (value.is_number_unsigned() && value.get<uint64_t>() == 0)) {
        return Context(source, fmt::format("segment_addresses[{}]", i))
            .Error(fmt::format("expected a positive integer (an address), got {}", Describe(value)));
      }
      trace.segment_addresses.push_back(value.get<uint64_t>());
    }
  }

  auto ops_it = doc.find("ops");
  if (ops_it == doc.end()) return top.Error("ops", "missing (expected an array of ops)");
  if (!ops_it->is_array()) return top.Error("ops", fmt::format("expected an array of ops, got {}", Describe(*ops_it)));
  trace.ops.reserve(ops_it->size());
  for (size_t i = 0; i < ops_it->size(); ++i) {
    const Context at(source, OpWhere(i));
    SHARDSCOPE_ASSIGN_OR_RETURN(AllocTraceOp op, ParseOp((*ops_it)[i], at, streams - 1));
    trace.ops.push_back(op);
  }
  SHARDSCOPE_RETURN_IF_ERROR(ValidateAllocTrace(trace, source));
  return trace;
}

StatusOr<AllocTrace> ReadAllocTraceFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::InvalidInput(fmt::format("cannot read '{}': {}", path, std::strerror(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Status::IoError(fmt::format("cannot read '{}'", path));
  return ParseAllocTrace(text.str(), path);
}

std::string AllocTraceToJson(const AllocTrace& trace) {
  std::string out = "{\n";
  out += fmt::format("  \"version\": {},\n", trace.version);
  out += fmt::format("  \"description\": {},\n", Json(trace.description).dump(-1, ' ', false, Json::error_handler_t::replace));
  out += fmt::format("  \"alloc_conf\": {},\n", Json(trace.alloc_conf).dump(-1, ' ', false, Json::error_handler_t::replace));
  // nlohmann prints the shortest text that reads back as the same double (1.0, 0.8).
  out += fmt::format("  \"memory_fraction\": {},\n", Json(trace.memory_fraction).dump());
  out += fmt::format("  \"device_memory_bytes\": {},\n", trace.device_memory_bytes);
  out += fmt::format("  \"streams\": {},\n", trace.streams);
  // The optional keys only when present, so that traces without them read as before.
  if (!trace.initial_segments.empty()) {
    out += "  \"initial_segments\": [";
    for (size_t s = 0; s < trace.initial_segments.size(); ++s) {
      const AllocTraceInitialSegment& seg = trace.initial_segments[s];
      out += s == 0 ? "\n    " : ",\n    ";
      out += fmt::format("{{\"address\": {}, \"stream\": {}, \"pool\": \"{}\", \"blocks\": [", seg.address, seg.stream,
                         seg.small ? "small" : "large");
      for (size_t b = 0; b < seg.blocks.size(); ++b) {
        const AllocTraceInitialBlock& block = seg.blocks[b];
        out += b == 0 ? "" : ", ";
        out += block.id >= 0 ? fmt::format("{{\"size\": {}, \"id\": {}, \"bytes\": {}}}", block.size, block.id, block.bytes)
                             : fmt::format("{{\"size\": {}}}", block.size);
      }
      out += "]}";
    }
    out += "\n  ],\n";
  }
  if (!trace.segment_addresses.empty()) {
    out += fmt::format("  \"segment_addresses\": [{}],\n", fmt::join(trace.segment_addresses, ", "));
  }
  out += "  \"ops\": [";
  for (size_t i = 0; i < trace.ops.size(); ++i) {
    out += i == 0 ? "\n    " : ",\n    ";
    const AllocTraceOp& op = trace.ops[i];
    if (const auto* alloc = std::get_if<AllocTraceAlloc>(&op)) {
      out += fmt::format("{{\"op\": \"alloc\", \"id\": {}, \"bytes\": {}, \"stream\": {}}}", alloc->id, alloc->bytes,
                         alloc->stream);
    } else if (const auto* free_op = std::get_if<AllocTraceFree>(&op)) {
      out += fmt::format("{{\"op\": \"free\", \"id\": {}}}", free_op->id);
    } else if (const auto* record = std::get_if<AllocTraceRecordStream>(&op)) {
      out += fmt::format("{{\"op\": \"record_stream\", \"id\": {}, \"stream\": {}}}", record->id, record->stream);
    } else {
      out += "{\"op\": \"empty_cache\"}";
    }
  }
  out += trace.ops.empty() ? "]\n}\n" : "\n  ]\n}\n";
  return out;
}

StatusOr<AllocReplayResult> ReplayAllocTrace(const AllocTrace& trace, const AllocReplayOptions& options) {
  // A trace built in code skipped ParseAllocTrace; replay relies on the same invariants.
  SHARDSCOPE_RETURN_IF_ERROR(ValidateAllocTrace(trace, "<trace>"));
  SHARDSCOPE_ASSIGN_OR_RETURN(AllocatorConfig config, AllocatorConfig::Parse(trace.alloc_conf));
  config.memory_fraction = trace.memory_fraction;
  std::unique_ptr<DeviceMemory> memory = MakeReplayDevice(trace);
  CompletedStreamEvents events;
  CachingAllocator allocator(config, *memory, events);

  AllocReplayResult result;
  result.reserved_after_op.reserve(trace.ops.size());
  // id -> address; ids whose alloc allocated nothing (0 bytes, OOM) are absent, so their
  // frees and record_streams do nothing, like the GPU script's null pointers.
  std::unordered_map<int64_t, uint64_t> addresses;
  if (!trace.initial_segments.empty()) {
    SHARDSCOPE_RETURN_IF_ERROR(allocator.Restore(InitialSnapshotSegments(trace)));
    for (const AllocTraceInitialSegment& seg : trace.initial_segments) {
      uint64_t address = seg.address;
      for (const AllocTraceInitialBlock& block : seg.blocks) {
        if (block.id >= 0) addresses[block.id] = address;
        address += static_cast<uint64_t>(block.size);
      }
    }
  }
  if (options.record_history) allocator.RecordHistory(true);
  for (size_t i = 0; i < trace.ops.size(); ++i) {
    const AllocTraceOp& op = trace.ops[i];
    if (const auto* alloc = std::get_if<AllocTraceAlloc>(&op)) {
      if (alloc->bytes > 0) {
        MallocOutcome outcome = allocator.Malloc(alloc->bytes, alloc->stream);
        if (outcome.ok) {
          addresses[alloc->id] = outcome.address;
        } else {
          result.ooms.push_back(AllocReplayOom{static_cast<int64_t>(i), outcome});
        }
      }
    } else if (const auto* free_op = std::get_if<AllocTraceFree>(&op)) {
      if (auto it = addresses.find(free_op->id); it != addresses.end()) {
        allocator.Free(it->second);
        addresses.erase(it);
      }
    } else if (const auto* record = std::get_if<AllocTraceRecordStream>(&op)) {
      if (auto it = addresses.find(record->id); it != addresses.end()) allocator.RecordStream(it->second, record->stream);
    } else {
      (void)allocator.EmptyCache();
    }
    result.reserved_after_op.push_back(allocator.stats().reserved_bytes);
    if (options.record_history) result.history_op.resize(allocator.history().size(), static_cast<int64_t>(i));
  }
  result.stats = allocator.stats();
  if (options.record_history) {
    result.history = allocator.history();
    result.final_segments = allocator.Snapshot();
  }
  return result;
}

std::string AllocReplayResultToJson(const AllocTrace& trace, const AllocReplayResult& result,
                                    const std::string& source) {
  const MemoryStats& s = result.stats;
  OrderedJson stats;
  stats["allocated_bytes.all.current"] = s.allocated_bytes;
  stats["allocated_bytes.all.peak"] = s.allocated_bytes_peak;
  stats["reserved_bytes.all.current"] = s.reserved_bytes;
  stats["reserved_bytes.all.peak"] = s.reserved_bytes_peak;
  stats["active_bytes.all.current"] = s.active_bytes;
  stats["active_bytes.all.peak"] = s.active_bytes_peak;
  stats["inactive_split_bytes.all.current"] = s.inactive_split_bytes;
  stats["inactive_split_bytes.all.peak"] = s.inactive_split_bytes_peak;
  stats["requested_bytes.all.current"] = s.requested_bytes;
  stats["requested_bytes.all.peak"] = s.requested_bytes_peak;
  stats["segment.all.current"] = s.segment;
  stats["segment.all.peak"] = s.segment_peak;
  stats["num_alloc_retries"] = s.num_alloc_retries;
  stats["num_ooms"] = s.num_ooms;
  stats["num_sync_all_streams"] = s.num_sync_all_streams;
  stats["num_device_alloc"] = s.num_device_alloc;
  stats["num_device_free"] = s.num_device_free;

  OrderedJson ooms = OrderedJson::array();
  for (const AllocReplayOom& oom : result.ooms) {
    ooms.push_back({{"op_index", oom.op_index},
                    {"requested_bytes", oom.outcome.requested_bytes},
                    {"device_free_bytes", oom.outcome.device_free_bytes},
                    {"largest_free_block", oom.outcome.largest_free_block}});
  }
  OrderedJson out;
  out["producer"] = "shardscope alloc-replay";
  out["trace"] = source;
  out["description"] = trace.description;
  out["alloc_conf"] = trace.alloc_conf;
  out["memory_fraction"] = trace.memory_fraction;
  out["device_memory_bytes"] = trace.device_memory_bytes;
  out["num_ops"] = trace.ops.size();
  out["memory_stats"] = std::move(stats);
  out["oom_ops"] = std::move(ooms);
  out["reserved_bytes_after_op"] = result.reserved_after_op;
  return out.dump(2, ' ', false, OrderedJson::error_handler_t::replace) + "\n";
}

AllocTrace AllocTraceFromSchedule(const traces::Schedule& schedule, int32_t rank, int64_t device_memory_bytes) {
  AllocTrace trace;
  trace.device_memory_bytes = device_memory_bytes;
  // Explicit rather than empty, so the GPU run overrides whatever the environment holds.
  trace.alloc_conf = "expandable_segments:False";
  if (rank < 0 || rank >= schedule.world_size() ||
      schedule.ranks[static_cast<size_t>(rank)].program < 0 ||
      static_cast<size_t>(schedule.ranks[static_cast<size_t>(rank)].program) >= schedule.programs.size()) {
    trace.description = fmt::format("rank {} is not in the schedule ({} ranks)", rank, schedule.world_size());
    return trace;
  }
  const traces::Program& program = schedule.ProgramOf(rank);
  trace.streams = std::max<int32_t>(1, static_cast<int32_t>(program.streams.size()));
  // Tensor names are reused across phases (an FSDP all-gather buffer is allocated again in
  // backward), so each AllocateOp gets a fresh id and the tensor maps to its live one.
  std::vector<int64_t> live(program.tensors.size(), -1);
  int64_t next_id = 0;
  for (const traces::Op& op : program.ops) {
    if (const auto* allocate = std::get_if<traces::AllocateOp>(&op.payload)) {
      const auto tensor = static_cast<size_t>(allocate->tensor);
      if (tensor >= live.size()) continue;  // ValidateSchedule rejects this; stay safe anyway
      trace.ops.push_back(AllocTraceAlloc{next_id, allocate->bytes, allocate->stream});
      live[tensor] = next_id++;
    } else if (const auto* free_op = std::get_if<traces::FreeOp>(&op.payload)) {
      const auto tensor = static_cast<size_t>(free_op->tensor);
      if (tensor >= live.size() || live[tensor] < 0) continue;
      trace.ops.push_back(AllocTraceFree{live[tensor]});
      live[tensor] = -1;
    } else if (const auto* record = std::get_if<traces::RecordStreamOp>(&op.payload)) {
      const auto tensor = static_cast<size_t>(record->tensor);
      if (tensor >= live.size() || live[tensor] < 0) continue;
      trace.ops.push_back(AllocTraceRecordStream{live[tensor], record->stream});
    }
  }
  trace.description = fmt::format("allocate/free ops of rank {} (program '{}') in program order", rank, program.name);
  return trace;
}

}  // namespace shardscope::sim

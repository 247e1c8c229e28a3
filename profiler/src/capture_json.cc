#include "shardscope/profiler/capture_json.h"

#include "shardscope/base/file_io.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace shardscope::profiler {
namespace {

using nlohmann::json;

// Reads the keys of one JSON object, remembering which were used so that any other key is
// reported (a misspelt optional key must not silently read as its default).
class ObjectReader {
 public:
  ObjectReader(const json& object, std::string path, const std::string& source)
      : object_(object), path_(std::move(path)), source_(source) {}

  Status Error(std::string_view key, std::string_view expected, const json& got) const {
    return Status::InvalidInput(fmt::format("{}: {}/{}: expected {}, got {}", source_, path_, key, expected,
                                            got.dump()));
  }
  const json* Find(const char* key, bool required, Status& status) {
    used_.insert(key);
    auto it = object_.find(key);
    if (it == object_.end()) {
      if (required) {
        status = Status::InvalidInput(fmt::format("{}: {}: missing required key \"{}\"", source_, Where(), key));
      }
      return nullptr;
    }
    return &*it;
  }
  template <typename T>
  Status Integer(const char* key, T& out, bool required, std::string_view expected) {
    Status status;
    const json* value = Find(key, required, status);
    if (value == nullptr) return status;
    if (value->is_number_unsigned()) {
      const auto v = value->get<uint64_t>();
      if (v <= static_cast<uint64_t>(std::numeric_limits<T>::max())) {
        out = static_cast<T>(v);
        return Status::Ok();
      }
    } else if (value->is_number_integer()) {
      const auto v = value->get<int64_t>();
      if (std::numeric_limits<T>::is_signed && v >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
          v <= static_cast<int64_t>(std::numeric_limits<T>::max())) {
        out = static_cast<T>(v);
        return Status::Ok();
      }
    }
    return Error(key, expected, *value);
  }
  Status String(const char* key, std::string& out, bool required) {
    Status status;
    const json* value = Find(key, required, status);
    if (value == nullptr) return status;
    if (!value->is_string()) return Error(key, "a string", *value);
    out = value->get<std::string>();
    return Status::Ok();
  }
  Status Triple(const char* key, std::array<int32_t, 3>& out) {
    Status status;
    const json* value = Find(key, false, status);
    if (value == nullptr) return status;
    if (!value->is_array() || value->size() != 3) return Error(key, "an array of 3 integers", *value);
    for (size_t i = 0; i < 3; ++i) {
      const json& v = (*value)[i];
      if (!v.is_number_integer() || v.get<int64_t>() < std::numeric_limits<int32_t>::min() ||
          v.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return Error(key, "an array of 3 32-bit integers", *value);
      }
      out[i] = static_cast<int32_t>(v.get<int64_t>());
    }
    return Status::Ok();
  }
  template <typename Enum, typename Parse>
  Status Named(const char* key, Enum& out, bool required, Parse parse, std::string_view expected) {
    Status status;
    const json* value = Find(key, required, status);
    if (value == nullptr) return status;
    if (!value->is_string()) return Error(key, expected, *value);
    auto parsed = parse(value->get<std::string>());
    if (!parsed) return Error(key, expected, *value);
    out = *parsed;
    return Status::Ok();
  }
  Status Finish() const {
    for (auto it = object_.begin(); it != object_.end(); ++it) {
      if (used_.count(it.key()) == 0) {
        return Status::InvalidInput(fmt::format("{}: {}: unknown key \"{}\"", source_, Where(), it.key()));
      }
    }
    return Status::Ok();
  }

 private:
  std::string_view Where() const { return path_.empty() ? std::string_view("/") : std::string_view(path_); }
  const json& object_;
  std::string path_;
  const std::string& source_;
  std::set<std::string> used_;
};

constexpr std::string_view kU32 = "an unsigned 32-bit integer";
constexpr std::string_view kI64 = "a 64-bit integer";

Status Times(ObjectReader& r, int64_t& start, int64_t& end) {
  SHARDSCOPE_RETURN_IF_ERROR(r.Integer("start", start, true, kI64));
  return r.Integer("end", end, true, kI64);
}

StatusOr<ActivityRecord> ParseRecord(const json& value, const std::string& path, const std::string& source) {
  if (!value.is_object()) {
    return Status::InvalidInput(fmt::format("{}: {}: expected a record object, got {}", source, path, value.dump()));
  }
  ObjectReader r(value, path, source);
  ActivityKind kind = ActivityKind::kConcurrentKernel;
  SHARDSCOPE_RETURN_IF_ERROR(r.Named("kind", kind, true, ParseActivityKind,
                                     "one of concurrent_kernel, memcpy, memset, synchronization, runtime, "
                                     "driver, external_correlation, overhead"));
  ActivityRecord record;
  switch (kind) {
    case ActivityKind::kConcurrentKernel: {
      KernelRecord k;
      SHARDSCOPE_RETURN_IF_ERROR(Times(r, k.start_ns, k.end_ns));
      SHARDSCOPE_RETURN_IF_ERROR(r.String("name", k.name, true));
      SHARDSCOPE_RETURN_IF_ERROR(r.Integer("stream", k.stream, true, kU32));
      SHARDSCOPE_RETURN_IF_ERROR(r.Integer("correlation", k.correlation, true, kU32));
      SHARDSCOPE_RETURN_IF_ERROR(r.Integer("device", k.device, false, kU32));
      SHARDSCOPE_RETURN_IF_ERROR(r.Integer("context", k.context, false, kU32));
      SHARDSCOPE_RETURN_IF_ERROR(r.Triple("grid", k.grid));
      SHARDSCOPE_RETURN_IF_ERROR(r.Triple("block", k.block));
      SHARDSCOPE_RETURN_IF_ERROR(r.Integer("registers_per_thread", k.registers_per_thread, false, "a 32-bit integer"));
      SHARDSCOPE_RETURN_IF_ERROR(r.Integer("static_shared_memory", k.static_shared_memory, false, "a 32-bit integer"));
      SHARDSCOPE_RETURN_IF_ERROR(
          r.Integer("dynamic_shared_memory", k.dynamic_shared_memory, false, "a 32-bit integer"));
      record = std::move(k);
      break;
    }
    case ActivityKind::kMemcpy: {
      MemcpyRecord m;
      SHARDSCOPE_RETURN_IF_ERROR(Times(r, m.start_ns, m.end_ns));
      SHARDSCOPE_RETURN_IF_ERROR(r.Integer("stream", m.stream, true, kU32));
      SHARDSCOPE_RETURN_IF_ERROR(r.Integer("correlation", m.correlation, true, kU32));
      SHARDSCOPE_RETURN_IF_ERROR(r.Named("copy_kind", m.direction, false, ParseMemcpyDirection,
                                         "one of Unknown, HtoD, DtoH, DtoD, HtoH, PtoP, Other"));
      constexpr std::string_view kMemory = "one of Unknown, Pageable, Pinned, Device, Array, Managed";
      SHARDSCOPE_RETURN_IF_ERROR(r.Named("src_memory", m.src_memory, false, ParseMemoryKind, kMemory));
      SHARDSCOPE_RETURN_IF_ERROR(r.Named("dst_memory", m.dst_memory, false, ParseMemoryKind, kMemory));
      SHARDSCOPE_RETURN_IF_ERROR(r.Integer("bytes", m.bytes, false, kI64));
      SHARDSCOPE_RETURN_IF_ERROR(r.Integer("device", m.device, false, kU32));
      SHARDSCOPE_RETURN_IF_ERROR(r.Integer("context", m.context, false, kU32));
      record = m;
      break;
    }
    case ActivityKind::kMemset: {
      MemsetRecord m;
      SHARDSCOPE_RETURN_IF_ERROR(Times(r, m.start_ns, m.end_ns));
      SHARDSCOPE_RETURN_IF_ERROR(r.Integer("stream", m.stream, true, kU32));
      SHARDSCOPE_RETURN_IF_ERROR(r.Integer("correlation", m.correlation, true, kU32));
      SHARDSCOPE_RETURN_IF_ERROR(r.Integer("bytes", m.bytes, false, kI64));
      SHARDSCOPE_RETURN_IF_ERROR(r.Integer("value", m.value, false, kU32));
      SHARDSCOPE_RETURN_IF_ERROR(r.Named("memory", m.memory, false, ParseMemoryKind,
                                         "one of Unknown, Pageable, Pinned, Device, Array, Managed"));
      SHARDSCOPE_RETURN_IF_ERROR(r.Integer("device", m.device, false, kU32));
      SHARDSCOPE_RETURN_IF_ERROR(r.Integer("context", m.context, false, kU32));
      record = m;
      break;
    }
    case ActivityKind::kSynchronization: {
      SynchronizationRecord s;
      SHARDSCOPE_RETURN_IF_ERROR(Times(r, s.start_ns, s.end_ns));
      SHARDSCOPE_RETURN_IF_ERROR(r.Named("type", s.type, true, ParseSyncType,
                                         "one of unknown, event_synchronize, stream_wait_event, "
                                         "stream_synchronize, context_synchronize"));
      SHARDSCOPE_RETURN_IF_ERROR(r.Integer("correlation", s.correlation, true, kU32));
      SHARDSCOPE_RETURN_IF_ERROR(r.Integer("context", s.context, false, kU32));
      uint32_t stream = 0, event = 0;
      Status ignored;
      if (r.Find("stream", false, ignored) != nullptr) {
        SHARDSCOPE_RETURN_IF_ERROR(r.Integer("stream", stream, true, kU32));
        s.stream = stream;
      }
      if (r.Find("event", false, ignored) != nullptr) {
        SHARDSCOPE_RETURN_IF_ERROR(r.Integer("event", event, true, kU32));
        s.event = event;
      }
      record = s;
      break;
    }
    case ActivityKind::kRuntime:
    case ActivityKind::kDriver: {
      ApiRecord a;
      a.domain = kind == ActivityKind::kDriver ? ApiDomain::kDriver : ApiDomain::kRuntime;
      SHARDSCOPE_RETURN_IF_ERROR(Times(r, a.start_ns, a.end_ns));
      SHARDSCOPE_RETURN_IF_ERROR(r.String("name", a.name, true));
      SHARDSCOPE_RETURN_IF_ERROR(r.Integer("correlation", a.correlation, true, kU32));
      SHARDSCOPE_RETURN_IF_ERROR(r.Integer("cbid", a.cbid, false, kU32));
      SHARDSCOPE_RETURN_IF_ERROR(r.Integer("process_id", a.process_id, false, kU32));
      SHARDSCOPE_RETURN_IF_ERROR(r.Integer("thread_id", a.thread_id, false, kU32));
      record = std::move(a);
      break;
    }
    case ActivityKind::kExternalCorrelation: {
      ExternalCorrelationRecord e;
      SHARDSCOPE_RETURN_IF_ERROR(r.Named("external_kind", e.kind, false, ParseExternalKind,
                                         "one of unknown, openacc, custom0, custom1, custom2"));
      SHARDSCOPE_RETURN_IF_ERROR(r.Integer("external_id", e.external_id, true, "an unsigned 64-bit integer"));
      SHARDSCOPE_RETURN_IF_ERROR(r.Integer("correlation", e.correlation, true, kU32));
      record = e;
      break;
    }
    case ActivityKind::kOverhead: {
      OverheadRecord o;
      SHARDSCOPE_RETURN_IF_ERROR(Times(r, o.start_ns, o.end_ns));
      SHARDSCOPE_RETURN_IF_ERROR(r.String("overhead_kind", o.kind, false));
      SHARDSCOPE_RETURN_IF_ERROR(r.Integer("correlation", o.correlation, false, kU32));
      record = std::move(o);
      break;
    }
  }
  SHARDSCOPE_RETURN_IF_ERROR(r.Finish());
  return record;
}

json RecordToJson(const ActivityRecord& record) {
  json j = json::object();
  j["kind"] = std::string(ActivityKindName(KindOf(record)));
  if (const auto* k = std::get_if<KernelRecord>(&record)) {
    j["name"] = k->name;
    j["start"] = k->start_ns;
    j["end"] = k->end_ns;
    j["device"] = k->device;
    j["context"] = k->context;
    j["stream"] = k->stream;
    j["correlation"] = k->correlation;
    j["grid"] = k->grid;
    j["block"] = k->block;
    j["registers_per_thread"] = k->registers_per_thread;
    j["static_shared_memory"] = k->static_shared_memory;
    j["dynamic_shared_memory"] = k->dynamic_shared_memory;
  } else if (const auto* m = std::get_if<MemcpyRecord>(&record)) {
    j["copy_kind"] = std::string(MemcpyDirectionName(m->direction));
    j["src_memory"] = std::string(MemoryKindName(m->src_memory));
    j["dst_memory"] = std::string(MemoryKindName(m->dst_memory));
    j["bytes"] = m->bytes;
    j["start"] = m->start_ns;
    j["end"] = m->end_ns;
    j["device"] = m->device;
    j["context"] = m->context;
    j["stream"] = m->stream;
    j["correlation"] = m->correlation;
  } else if (const auto* s = std::get_if<MemsetRecord>(&record)) {
    j["bytes"] = s->bytes;
    j["value"] = s->value;
    j["memory"] = std::string(MemoryKindName(s->memory));
    j["start"] = s->start_ns;
    j["end"] = s->end_ns;
    j["device"] = s->device;
    j["context"] = s->context;
    j["stream"] = s->stream;
    j["correlation"] = s->correlation;
  } else if (const auto* y = std::get_if<SynchronizationRecord>(&record)) {
    j["type"] = std::string(SyncTypeJsonName(y->type));
    j["start"] = y->start_ns;
    j["end"] = y->end_ns;
    j["context"] = y->context;
    if (y->stream) j["stream"] = *y->stream;
    if (y->event) j["event"] = *y->event;
    j["correlation"] = y->correlation;
  } else if (const auto* a = std::get_if<ApiRecord>(&record)) {
    j["cbid"] = a->cbid;
    j["name"] = a->name;
    j["start"] = a->start_ns;
    j["end"] = a->end_ns;
    j["process_id"] = a->process_id;
    j["thread_id"] = a->thread_id;
    j["correlation"] = a->correlation;
  } else if (const auto* e = std::get_if<ExternalCorrelationRecord>(&record)) {
    j["external_kind"] = std::string(ExternalKindName(e->kind));
    j["external_id"] = e->external_id;
    j["correlation"] = e->correlation;
  } else if (const auto* o = std::get_if<OverheadRecord>(&record)) {
    j["overhead_kind"] = o->kind;
    j["start"] = o->start_ns;
    j["end"] = o->end_ns;
    j["correlation"] = o->correlation;
  }
  return j;
}

}  // namespace

StatusOr<ActivityCapture> ParseActivityCaptureJson(std::string_view text, const std::string& source) {
  json root;
  try {
    root = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    return Status::InvalidInput(fmt::format("{}: invalid JSON: {}", source, e.what()));
  }
  if (!root.is_object()) return Status::InvalidInput(fmt::format("{}: expected a JSON object at the top level", source));
  ObjectReader top(root, "", source);
  int64_t version = 0;
  SHARDSCOPE_RETURN_IF_ERROR(top.Integer("version", version, true, kI64));
  if (version != kActivityCaptureVersion) {
    return Status::InvalidInput(
        fmt::format("{}: /version: expected {}, got {}", source, kActivityCaptureVersion, version));
  }
  ActivityCapture capture;
  SHARDSCOPE_RETURN_IF_ERROR(top.Integer("rank", capture.rank, true, "a non-negative 32-bit integer"));
  if (capture.rank < 0) return top.Error("rank", "a non-negative 32-bit integer", root["rank"]);
  SHARDSCOPE_RETURN_IF_ERROR(top.Integer("dropped_records", capture.dropped_records, false, kI64));
  Status ignored;
  if (const json* map = top.Find("stream_map", false, ignored)) {
    if (!map->is_array()) return top.Error("stream_map", "an array of {cuda_stream, stream}", *map);
    for (size_t i = 0; i < map->size(); ++i) {
      ObjectReader entry((*map)[i], fmt::format("/stream_map/{}", i), source);
      if (!(*map)[i].is_object()) return top.Error(fmt::format("stream_map/{}", i), "an object", (*map)[i]);
      uint32_t cuda_stream = 0;
      int32_t stream = 0;
      SHARDSCOPE_RETURN_IF_ERROR(entry.Integer("cuda_stream", cuda_stream, true, kU32));
      SHARDSCOPE_RETURN_IF_ERROR(entry.Integer("stream", stream, true, "a 32-bit integer"));
      SHARDSCOPE_RETURN_IF_ERROR(entry.Finish());
      if (!capture.stream_map.emplace(cuda_stream, stream).second) {
        return entry.Error("cuda_stream", "a CUDA stream id not mapped before", (*map)[i]["cuda_stream"]);
      }
    }
  }
  if (const json* samples = top.Find("clock_samples", false, ignored)) {
    if (!samples->is_array()) return top.Error("clock_samples", "an array of {cupti_ns, host_ns}", *samples);
    for (size_t i = 0; i < samples->size(); ++i) {
      if (!(*samples)[i].is_object()) return top.Error(fmt::format("clock_samples/{}", i), "an object", (*samples)[i]);
      ObjectReader entry((*samples)[i], fmt::format("/clock_samples/{}", i), source);
      ClockSample sample;
      SHARDSCOPE_RETURN_IF_ERROR(entry.Integer("cupti_ns", sample.source_ns, true, kI64));
      SHARDSCOPE_RETURN_IF_ERROR(entry.Integer("host_ns", sample.target_ns, true, kI64));
      SHARDSCOPE_RETURN_IF_ERROR(entry.Finish());
      capture.clock_samples.push_back(sample);
    }
  }
  const json* records = top.Find("records", true, ignored);
  if (records == nullptr) return ignored;
  if (!records->is_array()) return top.Error("records", "an array of records", *records);
  capture.records.reserve(records->size());
  for (size_t i = 0; i < records->size(); ++i) {
    SHARDSCOPE_ASSIGN_OR_RETURN(ActivityRecord record, ParseRecord((*records)[i], fmt::format("/records/{}", i), source));
    capture.records.push_back(std::move(record));
  }
  SHARDSCOPE_RETURN_IF_ERROR(top.Finish());
  return capture;
}

StatusOr<ActivityCapture> ReadActivityCaptureFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IoError(fmt::format("cannot open '{}': {}", path, std::strerror(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  return ParseActivityCaptureJson(text.str(), path);
}

std::string ActivityCaptureToJson(const ActivityCapture& capture) {
  std::string out = fmt::format("{{\n\"version\": {},\n\"rank\": {},\n\"dropped_records\": {},\n\"stream_map\": [",
                                kActivityCaptureVersion, capture.rank, capture.dropped_records);
  bool first = true;
  for (const auto& [cuda_stream, stream] : capture.stream_map) {
    out += fmt::format("{}{{\"cuda_stream\": {}, \"stream\": {}}}", first ? "" : ", ", cuda_stream, stream);
    first = false;
  }
  out += "],\n\"clock_samples\": [";
  first = true;
  for (const ClockSample& sample : capture.clock_samples) {
    out += fmt::format("{}{{\"cupti_ns\": {}, \"host_ns\": {}}}", first ? "" : ", ", sample.source_ns,
                       sample.target_ns);
    first = false;
  }
  out += "],\n\"records\": [";
  first = true;
  for (const ActivityRecord& record : capture.records) {
    out += first ? "\n" : ",\n";
    // Invalid UTF-8 in a kernel name becomes U+FFFD rather than an exception.
    out += RecordToJson(record).dump(-1, ' ', false, json::error_handler_t::replace);
    first = false;
  }
  out += "\n]\n}\n";
  return out;
}

Status WriteActivityCaptureFile(const ActivityCapture& capture, const std::string& path) {
  return traces::WriteFileAtomically(path, ActivityCaptureToJson(capture));
}

}  // namespace shardscope::profiler

// Streaming Chrome-JSON reader (shardscope's own traces and PyTorch-profiler traces).
//
// The file goes through nlohmann's SAX parser; a small state machine (TraceSax) keeps only
// the fields of the event being read, turns each finished event into timeline entries and
// forgets it. Nothing proportional to the file is ever held besides the Timeline itself,
// so multi-gigabyte traces read in memory close to their Timeline's size.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "chrome_trace_fast_reader.h"
#include "shardscope/base/gzip_stream.h"
#include "json_text.h"
#include "shardscope/traces/chrome_trace.h"

namespace shardscope::traces {
namespace {

using namespace std::string_view_literals;

using Json = nlohmann::json;
using trace_internal::DecimalMicrosToNanos;
using trace_internal::Field;
using trace_internal::kFieldCount;
using trace_internal::kFieldKeys;
using trace_internal::RawEvent;
using trace_internal::RawValue;
using enum trace_internal::Field;

// Containers nested deeper than this are rejected: no real trace comes close, and the cap
// keeps hostile input from growing the frame stack without bound.
constexpr size_t kMaxDepth = 512;
// Error messages quote at most this much of a bad value.
constexpr size_t kMaxQuotedChars = 64;
// Reading buffer for trace files.
constexpr size_t kReadBufferBytes = size_t{1} << 20;
// The fast path gives up on lines longer than this (and the SAX parser reads the file).
constexpr size_t kMaxFastLineBytes = size_t{1} << 26;
// The shortest slice line ChromeTraceWriter writes ({"ph":"X","cat":"","name":"","pid":0,
// "tid":0,"ts":0.000,"dur":0.000,"args":{}} and ",\n"), for reserving: most of a trace is
// slices, and growing a vector of a million of them costs copies and page faults.
constexpr size_t kMinSliceLineBytes = 80;

std::string Describe(const RawValue& value) {
  switch (value.type) {
    case RawValue::Type::kNull:
      return "null";
    case RawValue::Type::kBool:
      return value.boolean ? "true" : "false";
    case RawValue::Type::kInt:
      return std::to_string(value.integer);
    case RawValue::Type::kFloat:
      return value.text;
    case RawValue::Type::kString: {
      std::string quoted = value.text.substr(0, kMaxQuotedChars);
      return fmt::format("\"{}{}\"", quoted, value.text.size() > kMaxQuotedChars ? "..." : "");
    }
  }
  return "?";
}

// One end of a flow waiting for its partner.
struct FlowPoint {
  int32_t pid = 0, tid = 0;
  int64_t ts_ns = 0;
  std::string name;
};

// SAX handler: a stack of frames says what the current container is; events are built
// field by field and converted when their object closes.
class TraceSax final : public nlohmann::json_sax<Json> {
 public:
  explicit TraceSax(Timeline& timeline) : timeline_(timeline) { timeline_.info.producer.clear(); }

  // Set when a callback returned false because the input is well-formed JSON but not a
  // trace; the message starts with the JSON path.
  const std::optional<std::string>& semantic_error() const { return semantic_error_; }
  // Set when the JSON itself is malformed.
  std::optional<size_t> syntax_error_offset() const { return syntax_error_offset_; }
  const std::string& syntax_error_text() const { return syntax_error_text_; }

  // The fast path (FastLayoutReader): after the header was parsed as a document of its own
  // with an empty "traceEvents", continues as if inside that array again.
  void ReenterEventsArray() {
    frames_ = {Frame::kRootObject, Frame::kEvents};
    root_is_object_ = true;
    saw_events_ = true;
    event_index_ = 0;
  }
  // The event the fast scanner fills, and its conversion (what end_object does).
  RawEvent& event() { return event_; }
  void AppendScannedSlice(Slice&& slice) {
    timeline_.slices.push_back(std::move(slice));
    ++event_index_;
  }
  bool ConvertScannedEvent() {
    const bool ok = ConvertEvent();
    ++event_index_;
    return ok;
  }

  // Checks what can only be checked at the end.
  bool Finish() {
    if (root_is_object_ && !saw_events_) {
      return Fail("", "expected a \"traceEvents\" array in the top-level object");
    }
    return true;
  }

  bool null() override { return Scalar(RawValue{}); }
  bool boolean(bool value) override {
    RawValue raw;
    raw.type = RawValue::Type::kBool;
    raw.boolean = value;
    return Scalar(std::move(raw));
  }
  bool number_integer(number_integer_t value) override {
    RawValue raw;
    raw.type = RawValue::Type::kInt;
    raw.integer = value;
    return Scalar(std::move(raw));
  }
  bool number_unsigned(number_unsigned_t value) override {
    RawValue raw;
    if (value <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      raw.type = RawValue::Type::kInt;
      raw.integer = static_cast<int64_t>(value);
    } else {
      raw.type = RawValue::Type::kFloat;
      raw.number = static_cast<double>(value);
      raw.text = std::to_string(value);
    }
    return Scalar(std::move(raw));
  }
  bool number_float(number_float_t value, const string_t& text) override {
    RawValue raw;
    raw.type = RawValue::Type::kFloat;
    raw.number = value;
    raw.text = text;
    return Scalar(std::move(raw));
  }
  bool string(string_t& value) override {
    RawValue raw;
    raw.type = RawValue::Type::kString;
    raw.text = std::move(value);
    return Scalar(std::move(raw));
  }
  bool binary(binary_t& /*value*/) override { return Fail(Path(), "unexpected binary value"); }

  bool key(string_t& value) override {
    key_ = std::move(value);
    return true;
  }

  bool start_object(std::size_t /*elements*/) override { return StartContainer(/*object=*/true); }
  bool start_array(std::size_t /*elements*/) override { return StartContainer(/*object=*/false); }

  bool end_object() override {
    const Frame frame = frames_.back();
    frames_.pop_back();
    if (frame == Frame::kEvent) {
      const bool ok = ConvertEvent();
      ++event_index_;
      return ok;
    }
    return true;
  }
  bool end_array() override {
    frames_.pop_back();
    return true;
  }

  bool parse_error(std::size_t position, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& error) override {
    // `position` counts the characters read, the offending one included.
    syntax_error_offset_ = position > 0 ? position - 1 : 0;
    syntax_error_text_ = JsonErrorText(error);
    return false;
  }

 private:
  enum class Frame : uint8_t {
    kRootObject,       // {"traceEvents": [...], ...}
    kDistributedInfo,  // {"backend": ..., "rank": ..., "world_size": ...}
    kEvents,           // the array of events
    kEvent,            // one event object
    kArgs,             // an event's "args"
    kSkip,             // anything else: ignored with all it contains
  };

  bool Fail(const std::string& path, std::string_view message) {
    semantic_error_ = path.empty() ? std::string(message) : fmt::format("{}: {}", path, message);
    return false;
  }

  // Path of the current event, e.g. "/traceEvents/12".
  std::string Path() const {
    return fmt::format("{}/{}", root_is_object_ ? "/traceEvents" : "", event_index_);
  }
  std::string FieldPath(Field field) const {
    return fmt::format("{}/{}", Path(), kFieldKeys[field]);
  }

  bool StartContainer(bool object) {
    if (frames_.size() >= kMaxDepth) {
      const bool in_event =
          std::find(frames_.begin(), frames_.end(), Frame::kEvent) != frames_.end();
      return Fail(in_event ? Path() : "",
                  fmt::format("JSON nested deeper than {} levels", kMaxDepth));
    }
    if (frames_.empty()) {
      root_is_object_ = object;
      saw_events_ = !object;
      frames_.push_back(object ? Frame::kRootObject : Frame::kEvents);
      return true;
    }
    Frame next = Frame::kSkip;
    switch (frames_.back()) {
      case Frame::kRootObject:
        if (key_ == "traceEvents") {
          if (object) return Fail("/traceEvents", "expected an array of events, got an object");
          saw_events_ = true;
          next = Frame::kEvents;
        } else if (key_ == "distributedInfo" && object) {
          next = Frame::kDistributedInfo;
        }
        break;
      case Frame::kEvents:
        if (!object) return Fail(Path(), "expected an event object, got an array");
        event_.Clear();
        next = Frame::kEvent;
        break;
      case Frame::kEvent:
        if (key_ == "args" && object) next = Frame::kArgs;
        break;
      case Frame::kDistributedInfo:
      case Frame::kArgs:  // nested args (shapes, lists) are not kept
      case Frame::kSkip:
        break;
    }
    frames_.push_back(next);
    return true;
  }

  bool Scalar(RawValue value) {
    if (frames_.empty()) {
      return Fail("", fmt::format("expected an object with \"traceEvents\" or an array of events, "
                                  "got {}",
                                  Describe(value)));
    }
    switch (frames_.back()) {
      case Frame::kRootObject:
        return TopLevelScalar(std::move(value));
      case Frame::kDistributedInfo:
        return DistributedInfoScalar(value);
      case Frame::kEvents:
        return Fail(Path(), fmt::format("expected an event object, got {}", Describe(value)));
      case Frame::kEvent:
        for (size_t f = 0; f < kFieldCount; ++f) {
          if (kFieldKeys[f] == key_) {
            event_.fields[f] = std::move(value);
            break;
          }
        }
        return true;
      case Frame::kArgs:
        if (value.type != RawValue::Type::kNull) event_.args.emplace_back(key_, std::move(value));
        return true;
      case Frame::kSkip:
        return true;
    }
    return true;
  }

  // Scalar -> Arg value; nullopt for null.
  static std::optional<std::variant<int64_t, double, std::string>> ToArgValue(RawValue value) {
    switch (value.type) {
      case RawValue::Type::kNull:
        return std::nullopt;
      case RawValue::Type::kBool:
        return int64_t{value.boolean ? 1 : 0};
      case RawValue::Type::kInt:
        return value.integer;
      case RawValue::Type::kFloat:
        return value.number;
      case RawValue::Type::kString:
        return std::move(value.text);
    }
    return std::nullopt;
  }

  bool TopLevelScalar(RawValue value) {
    if (key_ == "schemaVersion" || key_ == "displayTimeUnit") return true;
    if (key_ == "traceEvents" || key_ == "distributedInfo" || key_ == "deviceProperties") {
      if (value.type == RawValue::Type::kNull) return true;
      return Fail("/" + key_, fmt::format("expected {}, got {}",
                                          key_ == "distributedInfo" ? "an object" : "an array",
                                          Describe(value)));
    }
    if (key_ == "baseTimeNanoseconds") {
      if (value.type != RawValue::Type::kInt) {
        return Fail("/baseTimeNanoseconds",
                    fmt::format("expected an integer (ns), got {}", Describe(value)));
      }
      timeline_.info.base_time_ns = value.integer;
      return true;
    }
    if (key_ == "producer") {
      if (value.type != RawValue::Type::kString) {
        return Fail("/producer", fmt::format("expected a string, got {}", Describe(value)));
      }
      timeline_.info.producer = std::move(value.text);
      return true;
    }
    if (auto arg = ToArgValue(std::move(value))) {
      timeline_.info.extra.push_back(Arg{key_, std::move(*arg)});
    }
    return true;
  }

  bool DistributedInfoScalar(const RawValue& value) {
    const std::string path = "/distributedInfo/" + key_;
    if (key_ == "backend") {
      if (value.type != RawValue::Type::kString) {
        return Fail(path, fmt::format("expected a string, got {}", Describe(value)));
      }
      timeline_.info.backend = value.text;
    } else if (key_ == "rank" || key_ == "world_size") {
      std::optional<int32_t> number = ToInt32(value);
      if (!number)
        return Fail(path, fmt::format("expected a 32-bit integer, got {}", Describe(value)));
      (key_ == "rank" ? timeline_.info.rank : timeline_.info.world_size) = *number;
    }
    return true;
  }

  static std::optional<int32_t> ToInt32(const RawValue& value) {
    if (value.type != RawValue::Type::kInt || value.integer < std::numeric_limits<int32_t>::min() ||
        value.integer > std::numeric_limits<int32_t>::max()) {
      return std::nullopt;
    }
    return static_cast<int32_t>(value.integer);
  }

  // pid / tid: an int32, or any other value mapped to a synthetic negative id.
  int32_t TrackId(Field field) {
    const std::optional<RawValue>& value = event_.fields[field];
    if (!value || value->type == RawValue::Type::kNull) return 0;
    if (std::optional<int32_t> number = ToInt32(*value)) return *number;
    // The type prefix keeps the string "7" apart from an out-of-range number 7...
    std::string key =
        value->type == RawValue::Type::kString ? "s:" + value->text : "n:" + Describe(*value);
    auto [it, inserted] = synthetic_ids_.try_emplace(
        std::move(key), -static_cast<int32_t>(synthetic_ids_.size()) - 1);
    return it->second;
  }

  // A required or optional time field, in ns.
  bool Time(Field field, bool required, int64_t& out) {
    const std::optional<RawValue>& value = event_.fields[field];
    if (!value) {
      if (required) return Fail(Path(), fmt::format("missing \"{}\"", kFieldKeys[field]));
      out = 0;
      return true;
    }
    std::optional<int64_t> ns;
    if (value->type == RawValue::Type::kInt) {
      int64_t product = 0;
      if (!__builtin_mul_overflow(value->integer, int64_t{1000}, &product)) ns = product;
    } else if (value->type == RawValue::Type::kFloat) {
      ns = DecimalMicrosToNanos(value->text);
    } else {
      return Fail(FieldPath(field),
                  fmt::format("expected a number (microseconds), got {}", Describe(*value)));
    }
    if (!ns) {
      return Fail(FieldPath(field),
                  fmt::format("{} us does not fit in int64 nanoseconds", Describe(*value)));
    }
    out = *ns;
    return true;
  }

  // An optional string field ("" when absent).
  bool Text(Field field, std::string& out) {
    std::optional<RawValue>& value = event_.fields[field];
    if (!value || value->type == RawValue::Type::kNull) {
      out.clear();
      return true;
    }
    if (value->type != RawValue::Type::kString) {
      return Fail(FieldPath(field), fmt::format("expected a string, got {}", Describe(*value)));
    }
    out = std::move(value->text);
    return true;
  }

  bool ConvertEvent() {
    const std::optional<RawValue>& ph = event_.fields[kPh];
    if (!ph) return Fail(Path(), "missing \"ph\"");
    if (ph->type != RawValue::Type::kString) {
      return Fail(FieldPath(kPh), fmt::format("expected a string, got {}", Describe(*ph)));
    }
    const std::string& phase = ph->text;
    if (phase == "X"sv) return ConvertSlice();
    if (phase == "i"sv || phase == "I"sv) return ConvertInstant();
    if (phase == "C"sv) return ConvertCounter();
    if (phase == "M"sv) return ConvertMetadata();
    if (phase == "s"sv || phase == "f"sv || phase == "t"sv) return ConvertFlow(phase == "s"sv);
    return true;  // "B"/"E", async and object events: not part of the timeline model
  }

  bool ConvertSlice() {
    Slice slice;
    slice.pid = TrackId(kPid);
    slice.tid = TrackId(kTid);
    std::string category;
    if (!Time(kTs, true, slice.ts_ns) || !Time(kDur, false, slice.dur_ns) ||
        !Text(kName, slice.name) || !Text(kCat, category)) {
      return false;
    }
    slice.category = ParseCategory(category);
    if (slice.category == Category::kOther) slice.raw_category = std::move(category);

    // Pass 1: the keys that decide how others are read.
    auto& args = event_.args;
    std::optional<size_t> op_id_index, collective_index;
    for (size_t i = 0; i < args.size(); ++i) {
      const auto& [key, value] = args[i];
      if (!op_id_index && key == "op id"sv && value.type == RawValue::Type::kInt) op_id_index = i;
      if (!collective_index && key == "Collective name"sv && value.type == RawValue::Type::kString) {
        collective_index = i;
      }
    }
    if (op_id_index) slice.op_id = args[*op_id_index].second.integer;
    if (collective_index) {
      slice.collective.emplace();
      slice.collective->collective_name = args[*collective_index].second.text;
    }
    // Pass 2: consume the known keys (first occurrence, right type), keep the rest in order.
    bool have_correlation = false, have_external_id = false;
    std::array<bool, 7> have_collective_field{};
    for (size_t i = 0; i < args.size(); ++i) {
      auto& [key, value] = args[i];
      if (i == op_id_index || i == collective_index) continue;
      if (ConsumeSliceArg(slice, key, value, have_correlation, have_external_id,
                          have_collective_field)) {
        continue;
      }
      if (auto arg = ToArgValue(std::move(value))) slice.args.push_back(Arg{key, std::move(*arg)});
    }
    timeline_.slices.push_back(std::move(slice));
    return true;
  }

  // Reads `key` into a field of `slice` if it is one of the keys derived from fields.
  static bool ConsumeSliceArg(Slice& slice, const std::string& key, RawValue& value,
                              bool& have_correlation, bool& have_external_id,
                              std::array<bool, 7>& have_collective_field) {
    const bool is_int = value.type == RawValue::Type::kInt;
    if (key == "correlation"sv && is_int && !have_correlation) {
      have_correlation = true;
      slice.correlation = value.integer;
      return true;
    }
    // Our writer repeats the op id as "External id"; a PyTorch External id is kept.
    if (key == "External id"sv && is_int && !have_external_id && slice.op_id >= 0 &&
        value.integer == slice.op_id) {
      have_external_id = true;
      return true;
    }
    if (!slice.collective) return false;
    CollectiveInfo& c = *slice.collective;
    const auto take_string = [&](size_t slot, std::string& field) {
      if (have_collective_field[slot] || value.type != RawValue::Type::kString) return false;
      have_collective_field[slot] = true;
      field = std::move(value.text);
      return true;
    };
    const auto take_int64 = [&](size_t slot, int64_t& field) {
      if (have_collective_field[slot] || !is_int) return false;
      have_collective_field[slot] = true;
      field = value.integer;
      return true;
    };
    const auto take_int32 = [&](size_t slot, int32_t& field) {
      std::optional<int32_t> number = ToInt32(value);
      if (have_collective_field[slot] || !number) return false;
      have_collective_field[slot] = true;
      field = *number;
      return true;
    };
    if (key == "Process Group Name"sv) return take_string(0, c.process_group);
    if (key == "dtype"sv) return take_string(1, c.dtype);
    if (key == "In msg nelems"sv) return take_int64(2, c.in_nelems);
    if (key == "Out msg nelems"sv) return take_int64(3, c.out_nelems);
    if (key == "Group size"sv) return take_int32(4, c.group_size);
    if (key == "Seq"sv) return take_int64(5, c.seq);
    if (key == "Rank"sv) return take_int32(6, c.rank);
    return false;
  }

  bool ConvertInstant() {
    Instant instant;
    instant.pid = TrackId(kPid);
    instant.tid = TrackId(kTid);
    if (!Time(kTs, true, instant.ts_ns) || !Text(kName, instant.name) ||
        !Text(kCat, instant.category)) {
      return false;
    }
    std::string scope;
    if (!Text(kScope, scope)) return false;
    if (scope.size() == 1) instant.scope = scope[0];
    for (auto& [key, value] : event_.args) {
      if (auto arg = ToArgValue(std::move(value)))
        instant.args.push_back(Arg{key, std::move(*arg)});
    }
    timeline_.instants.push_back(std::move(instant));
    return true;
  }

  bool ConvertCounter() {
    CounterSample sample;
    sample.pid = TrackId(kPid);
    if (!Time(kTs, true, sample.ts_ns) || !Text(kName, sample.name)) return false;
    for (auto& [key, value] : event_.args) {
      if (value.type == RawValue::Type::kInt) {
        sample.values.emplace_back(key, static_cast<double>(value.integer));
      } else if (value.type == RawValue::Type::kFloat) {
        sample.values.emplace_back(key, value.number);
      }
    }
    timeline_.counters.push_back(std::move(sample));
    return true;
  }

  // process_name and process_sort_index arrive as separate events; both update the same
  // ProcessInfo (likewise for threads), created where the first of them appears.
  bool ConvertMetadata() {
    std::string name;
    if (!Text(kName, name)) return false;
    const bool process = name == "process_name"sv || name == "process_sort_index"sv;
    const bool thread = name == "thread_name"sv || name == "thread_sort_index"sv;
    if (!process && !thread) return true;  // process_labels, ...: not modelled
    const bool is_name = name == "process_name"sv || name == "thread_name"sv;
    const std::string_view arg_key = is_name ? "name" : "sort_index";
    RawValue* arg = nullptr;
    for (auto& [key, value] : event_.args) {
      if (key == arg_key) {
        arg = &value;
        break;
      }
    }
    const int32_t pid = TrackId(kPid);
    if (process) {
      auto [it, inserted] = process_index_.try_emplace(pid, timeline_.processes.size());
      if (inserted) {
        timeline_.processes.emplace_back();
        timeline_.processes.back().pid = pid;
      }
      return SetMetadata(timeline_.processes[it->second].name,
                         timeline_.processes[it->second].sort_index, is_name, arg);
    }
    const int32_t tid = TrackId(kTid);
    auto [it, inserted] = thread_index_.try_emplace({pid, tid}, timeline_.threads.size());
    if (inserted) {
      timeline_.threads.emplace_back();
      timeline_.threads.back().pid = pid;
      timeline_.threads.back().tid = tid;
    }
    return SetMetadata(timeline_.threads[it->second].name, timeline_.threads[it->second].sort_index,
                       is_name, arg);
  }

  bool SetMetadata(std::string& name, int32_t& sort_index, bool is_name, RawValue* arg) {
    if (arg == nullptr) return true;
    if (is_name) {
      if (arg->type != RawValue::Type::kString) {
        return Fail(Path() + "/args/name",
                    fmt::format("expected a string, got {}", Describe(*arg)));
      }
      name = std::move(arg->text);
      return true;
    }
    std::optional<int32_t> number = ToInt32(*arg);
    if (!number) {
      return Fail(Path() + "/args/sort_index",
                  fmt::format("expected a 32-bit integer, got {}", Describe(*arg)));
    }
    sort_index = *number;
    return true;
  }

  bool ConvertFlow(bool is_start) {
    const std::optional<RawValue>& id = event_.fields[kId];
    // Chrome also allows string ids; flows are decoration, so those are skipped.
    if (!id || id->type != RawValue::Type::kInt) return true;
    std::string category;
    FlowPoint point;
    point.pid = TrackId(kPid);
    point.tid = TrackId(kTid);
    if (!Time(kTs, true, point.ts_ns) || !Text(kName, point.name) || !Text(kCat, category)) {
      return false;
    }
    auto key = std::make_pair(std::move(category), id->integer);
    auto& partners = is_start ? pending_ends_ : pending_starts_;
    auto it = partners.find(key);
    if (it == partners.end() || it->second.empty()) {
      (is_start ? pending_starts_ : pending_ends_)[std::move(key)].push_back(std::move(point));
      return true;
    }
    FlowPoint partner = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) partners.erase(it);
    const FlowPoint& from = is_start ? point : partner;
    const FlowPoint& to = is_start ? partner : point;
    Flow flow;
    flow.id = key.second;
    flow.category = key.first;
    flow.name = from.name;
    flow.from_pid = from.pid;
    flow.from_tid = from.tid;
    flow.from_ts_ns = from.ts_ns;
    flow.to_pid = to.pid;
    flow.to_tid = to.tid;
    flow.to_ts_ns = to.ts_ns;
    timeline_.flows.push_back(std::move(flow));
    return true;
  }

  Timeline& timeline_;
  std::vector<Frame> frames_;
  std::string key_;  // the last key read; consumed by the value that follows it
  bool root_is_object_ = false;
  bool saw_events_ = false;
  size_t event_index_ = 0;
  RawEvent event_;
  std::map<std::pair<std::string, int64_t>, std::deque<FlowPoint>> pending_starts_, pending_ends_;
  std::unordered_map<std::string, int32_t> synthetic_ids_;
  std::unordered_map<int32_t, size_t> process_index_;
  std::map<std::pair<int32_t, int32_t>, size_t> thread_index_;
  std::optional<std::string> semantic_error_;
  std::optional<size_t> syntax_error_offset_;
  std::string syntax_error_text_;
};

// Runs the parser over `input` (a pointer range or a stream). `line_column` turns a byte
// offset into "line:column" for syntax errors.
template <typename Parse, typename LineColumnFn>
StatusOr<Timeline> RunTraceSax(const std::string& source, Parse parse, LineColumnFn line_column) {
  Timeline timeline;
  TraceSax sax(timeline);
  try {
    const bool ok = parse(sax) && sax.Finish();
    if (ok) return timeline;
  } catch (const std::exception& e) {
    // Only allocation failures can get here; the handler itself does not throw.
    return Status::InvalidInput(fmt::format("{}: cannot read trace: {}", source, e.what()));
  }
  if (sax.semantic_error()) {
    return Status::InvalidInput(fmt::format("{}: {}", source, *sax.semantic_error()));
  }
  if (sax.syntax_error_offset()) {
    return Status::InvalidInput(fmt::format("{}:{}: invalid JSON: {}", source,
                                            line_column(*sax.syntax_error_offset()),
                                            sax.syntax_error_text()));
  }
  return Status::Internal(fmt::format("{}: trace parser stopped without an error", source));
}

// The fast path for traces in ChromeTraceWriter's layout: the header (every line up to
// `  "traceEvents": [`) goes through the SAX parser as a small document of its own, then
// each event line through ScanEventLine and the SAX handler's conversion. Any line that is
// not exactly in that layout stops it; the caller then reads the whole input with the SAX
// parser (which also reports the errors of bad input).
class FastLayoutReader {
 public:
  // `input_bytes`: the input's size, to reserve for the most slices it could hold once the
  // header says it is the writer's layout (pages never touched cost no memory).
  FastLayoutReader(Timeline& timeline, size_t input_bytes)
      : timeline_(timeline), input_bytes_(input_bytes), sax_(timeline) {}

  // One line without its '\n'. False: not the writer's layout (or not a valid trace).
  bool Line(std::string_view line) {
    switch (state_) {
      case State::kHeader:
        return HeaderLine(line);
      case State::kFirstEvent:
        if (line.empty()) {  // the writer's empty array: "[\n\n]}"
          state_ = State::kEmptyBody;
          return true;
        }
        [[fallthrough]];
      case State::kEvents:
        if (line == trace_internal::kEventsCloseLine) {
          if (expect_more_) return false;  // a trailing comma
          state_ = State::kClosed;
          return true;
        }
        if (state_ == State::kEvents && !expect_more_) return false;  // a missing comma
        state_ = State::kEvents;
        expect_more_ = !line.empty() && line.back() == ',';
        if (expect_more_) line.remove_suffix(1);
        if (line.starts_with(kSlicePrefix)) {
          Slice slice;
          if (trace_internal::ScanWriterSlice(line, slice)) {
            sax_.AppendScannedSlice(std::move(slice));
            return true;
          }
        }
        return trace_internal::ScanEventLine(line, sax_.event()) && sax_.ConvertScannedEvent();
      case State::kEmptyBody:
        state_ = State::kClosed;
        return line == trace_internal::kEventsCloseLine;
      case State::kClosed:
        return false;  // anything after the closing line
    }
    return false;
  }

  // True while the input can still be the writer's header (so the reader keeps feeding).
  bool InHeader() const { return state_ == State::kHeader; }

  // At the end of the input: true when it ended as the writer ends a trace.
  bool Finish() { return state_ == State::kClosed && sax_.Finish(); }

 private:
  enum class State : uint8_t { kHeader, kFirstEvent, kEvents, kEmptyBody, kClosed };
  static constexpr std::string_view kSlicePrefix = R"({"ph":"X",)";
  // Our header is a few hundred bytes; a longer one is someone else's layout.
  static constexpr size_t kMaxHeaderBytes = size_t{1} << 16;

  bool HeaderLine(std::string_view line) {
    if (header_.empty() && line != "{") return false;  // the writer's first line
    header_.append(line);
    header_ += '\n';
    if (header_.size() > kMaxHeaderBytes) return false;
    if (line != trace_internal::kEventsOpenLine) return true;
    header_ += "]}";
    if (!Json::sax_parse(header_.data(), header_.data() + header_.size(), &sax_)) return false;
    sax_.ReenterEventsArray();
    timeline_.slices.reserve(input_bytes_ / kMinSliceLineBytes);
    header_.clear();
    header_.shrink_to_fit();
    state_ = State::kFirstEvent;
    return true;
  }

  Timeline& timeline_;
  size_t input_bytes_ = 0;
  TraceSax sax_;
  State state_ = State::kHeader;
  bool expect_more_ = false;  // the last event line ended with ','
  std::string header_;
};

}  // namespace

std::optional<Timeline> trace_internal::ParseWriterLayout(std::string_view text) {
  try {
    Timeline timeline;
    FastLayoutReader reader(timeline, text.size());
    while (!text.empty()) {
      const size_t end = text.find('\n');
      if (!reader.Line(text.substr(0, end))) return std::nullopt;
      if (end == std::string_view::npos) break;
      text.remove_prefix(end + 1);
    }
    if (!reader.Finish()) return std::nullopt;
    return timeline;
  } catch (const std::exception&) {
    return std::nullopt;  // the SAX parser reports it
  }
}

std::optional<Timeline> trace_internal::ReadWriterLayoutFile(const std::string& path) {
  try {
    std::ifstream file(path, std::ios::binary);
    if (!file.is_open()) return std::nullopt;
    Timeline timeline;
    file.seekg(0, std::ios::end);
    const auto bytes = static_cast<size_t>(std::max<std::streamoff>(0, file.tellg()));
    file.seekg(0, std::ios::beg);
    FastLayoutReader reader(timeline, bytes);
    std::vector<char> block(kReadBufferBytes);
    size_t filled = 0;  // bytes in block; [0, filled) starts at a line's beginning
    bool at_end = false;
    while (!at_end) {
      if (filled == block.size()) {
        // A line longer than the block: only events can be that long (huge names).
        if (reader.InHeader() || block.size() >= kMaxFastLineBytes) return std::nullopt;
        block.resize(block.size() * 2);
      }
      file.read(block.data() + filled, static_cast<std::streamsize>(block.size() - filled));
      const auto got = static_cast<size_t>(file.gcount());
      at_end = got == 0;
      filled += got;
      std::string_view data(block.data(), filled);
      size_t consumed = 0;
      while (true) {
        const size_t end = data.find('\n', consumed);
        if (end == std::string_view::npos) break;
        if (!reader.Line(data.substr(consumed, end - consumed))) return std::nullopt;
        consumed = end + 1;
      }
      if (at_end && consumed < filled) {  // a last line without '\n'
        if (!reader.Line(data.substr(consumed))) return std::nullopt;
        consumed = filled;
      }
      std::memmove(block.data(), block.data() + consumed, filled - consumed);
      filled -= consumed;
    }
    if (file.bad() || !reader.Finish()) return std::nullopt;
    return timeline;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

StatusOr<Timeline> trace_internal::ParseWithSax(std::string_view text, const std::string& source) {
  return RunTraceSax(
      source,
      [&](TraceSax& sax) { return Json::sax_parse(text.data(), text.data() + text.size(), &sax); },
      [&](size_t offset) { return LineColumn(text, offset); });
}

StatusOr<Timeline> ParseChromeTrace(std::string_view text, const std::string& source) {
  if (std::optional<Timeline> fast = trace_internal::ParseWriterLayout(text)) return std::move(*fast);
  return trace_internal::ParseWithSax(text, source);
}

namespace {

// A gzip-compressed trace, parsed as it decompresses. `open` gives the compressed bytes from
// their start; it is called again only to find the line and column of a JSON syntax error
// (counted in the decompressed text).
StatusOr<Timeline> ParseGzipTrace(const std::string& source, const std::function<std::unique_ptr<std::istream>()>& open,
                                  int64_t max_decompressed_bytes) {
  std::unique_ptr<std::istream> compressed = open();
  trace_internal::GzipInputBuffer gzip(*compressed, max_decompressed_bytes);
  std::istream text(&gzip);
  StatusOr<Timeline> result = RunTraceSax(
      source, [&](TraceSax& sax) { return Json::sax_parse(text, &sax); },
      [&](size_t offset) {
        std::unique_ptr<std::istream> again = open();
        trace_internal::GzipInputBuffer gzip_again(*again, max_decompressed_bytes);
        size_t line = 1, column = 1;
        for (size_t i = 0; i < offset; ++i) {
          const int c = gzip_again.sbumpc();
          if (c == std::char_traits<char>::eof()) break;
          if (c == '\n') {
            ++line;
            column = 1;
          } else {
            ++column;
          }
        }
        return fmt::format("{}:{} (of the decompressed text)", line, column);
      });
  // A decompression error explains a parse error it caused (truncated JSON), and is an error
  // even when the JSON ended first (garbage after the trace).
  if (gzip.error()) return Status::InvalidInput(fmt::format("{}: {}", source, *gzip.error()));
  return result;
}

}  // namespace

StatusOr<Timeline> ParseChromeTraceBytes(std::string_view bytes, const std::string& source,
                                         int64_t max_decompressed_bytes) {
  if (!trace_internal::IsGzip(bytes)) return ParseChromeTrace(bytes, source);
  return ParseGzipTrace(
      source, [&]() -> std::unique_ptr<std::istream> { return std::make_unique<std::istringstream>(std::string(bytes)); },
      max_decompressed_bytes);
}

StatusOr<Timeline> ReadChromeTraceFile(const std::string& path, int64_t max_decompressed_bytes) {
  {
    std::ifstream head_file(path, std::ios::binary);
    if (!head_file.is_open()) {
      return Status::IoError(fmt::format("cannot open '{}': {}", path, std::strerror(errno)));
    }
    char head[2] = {0, 0};
    head_file.read(head, 2);
    if (trace_internal::IsGzip(std::string_view(head, static_cast<size_t>(head_file.gcount())))) {
      return ParseGzipTrace(
          path, [&]() -> std::unique_ptr<std::istream> { return std::make_unique<std::ifstream>(path, std::ios::binary); },
          max_decompressed_bytes);
    }
  }
  if (std::optional<Timeline> fast = trace_internal::ReadWriterLayoutFile(path)) return std::move(*fast);
  std::vector<char> buffer(kReadBufferBytes);
  std::ifstream file;
  file.rdbuf()->pubsetbuf(buffer.data(), static_cast<std::streamsize>(buffer.size()));
  file.open(path, std::ios::binary);
  if (!file.is_open()) {
    return Status::IoError(fmt::format("cannot open '{}': {}", path, std::strerror(errno)));
  }
  return RunTraceSax(
      path, [&](TraceSax& sax) { return Json::sax_parse(file, &sax); },
      [&](size_t offset) {
        // Only on error: read the file again up to the offset, a block at a time.
        std::ifstream again(path, std::ios::binary);
        size_t line = 1, column = 1;
        std::vector<char> block(kReadBufferBytes);
        size_t remaining = offset;
        while (remaining > 0 && again) {
          again.read(block.data(), static_cast<std::streamsize>(std::min(remaining, block.size())));
          const auto got = static_cast<size_t>(again.gcount());
          if (got == 0) break;
          for (size_t i = 0; i < got; ++i) {
            if (block[i] == '\n') {
              ++line;
              column = 1;
            } else {
              ++column;
            }
          }
          remaining -= got;
        }
        return fmt::format("{}:{}", line, column);
      });
}

}  // namespace shardscope::traces

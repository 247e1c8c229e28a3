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
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "json_text.h"
#include "shardscope/traces/chrome_trace.h"

namespace shardscope::traces {
namespace {

using Json = nlohmann::json;

// Containers nested deeper than this are rejected: no real trace comes close, and the cap
// keeps hostile input from growing the frame stack without bound.
constexpr size_t kMaxDepth = 512;
// Error messages quote at most this much of a bad value.
constexpr size_t kMaxQuotedChars = 64;
// Reading buffer for trace files.
constexpr size_t kReadBufferBytes = size_t{1} << 20;

// One scalar JSON value as the SAX parser reported it.
struct RawValue {
  enum class Type : uint8_t { kNull, kBool, kInt, kFloat, kString };
  Type type = Type::kNull;
  bool boolean = false;
  int64_t integer = 0;  // kInt (unsigned values above INT64_MAX become kFloat)
  double number = 0;    // kFloat
  std::string text;     // kString: the value; kFloat: the number as written
};

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

// Parses a JSON number written in microseconds into nanoseconds, exactly: the decimal
// digits are shifted by three places and rounded (half away from zero), so "1.0005" is
// 1001 ns and epoch timestamps beyond 2^53 ns keep every nanosecond. nullopt when the
// value does not fit int64 nanoseconds.
std::optional<int64_t> DecimalMicrosToNanos(std::string_view text) {
  // Only the first 20 significant digits can matter (19 for int64 plus the rounding
  // digit), so they are kept in a fixed buffer: no allocation per timestamp.
  constexpr size_t kKeptDigits = 24;
  std::array<char, kKeptDigits> digits{};
  int64_t significant = 0;  // significant digits seen (leading zeros skipped)
  int64_t fraction_digits = 0;
  size_t i = 0;
  const bool negative = i < text.size() && text[i] == '-';
  if (negative) ++i;
  bool in_fraction = false;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '.') {
      in_fraction = true;
      continue;
    }
    if (c < '0' || c > '9') break;
    if (in_fraction) ++fraction_digits;
    if (significant == 0 && c == '0') continue;
    if (significant < static_cast<int64_t>(kKeptDigits))
      digits[static_cast<size_t>(significant)] = c;
    ++significant;
  }
  int64_t exponent = 0;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    bool exponent_negative = false;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) exponent_negative = text[i++] == '-';
    for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
      // Clamped: any exponent this large already decides the result (0 or overflow).
      exponent = std::min<int64_t>(exponent * 10 + (text[i] - '0'), 1'000'000);
    }
    if (exponent_negative) exponent = -exponent;
  }
  if (i != text.size()) return std::nullopt;
  if (significant == 0) return 0;
  // value in ns = digits * 10^shift
  const int64_t shift = exponent - fraction_digits + 3;
  constexpr int64_t kMaxDigits = 19;  // 10^19 > 2^63: more integer digits always overflow
  uint64_t magnitude = 0;
  const auto accumulate = [&](int64_t k) {
    magnitude = magnitude * 10 + static_cast<uint64_t>(digits[static_cast<size_t>(k)] - '0');
  };
  if (shift >= 0) {
    if (significant + shift > kMaxDigits) return std::nullopt;
    for (int64_t k = 0; k < significant; ++k) accumulate(k);
    for (int64_t k = 0; k < shift; ++k) magnitude *= 10;
  } else {
    const int64_t keep = significant + shift;  // digits left of the ns decimal point
    if (keep > kMaxDigits) return std::nullopt;
    char round_digit = '0';
    if (keep >= 0) {
      for (int64_t k = 0; k < keep; ++k) accumulate(k);
      round_digit = digits[static_cast<size_t>(keep)];  // keep < significant: stored
    }
    if (round_digit >= '5') ++magnitude;  // half away from zero
  }
  constexpr uint64_t kMaxPositive = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (magnitude > kMaxPositive + (negative ? 1 : 0)) return std::nullopt;
  if (!negative) return static_cast<int64_t>(magnitude);
  return magnitude == kMaxPositive + 1 ? std::numeric_limits<int64_t>::min()
                                       : -static_cast<int64_t>(magnitude);
}

// The event fields the reader looks at; other keys are skipped.
enum Field : uint8_t { kPh, kName, kCat, kPid, kTid, kTs, kDur, kId, kScope, kFieldCount };
constexpr std::array<std::string_view, kFieldCount> kFieldKeys = {"ph", "name", "cat", "pid", "tid",
                                                                  "ts", "dur",  "id",  "s"};

struct RawEvent {
  std::array<std::optional<RawValue>, kFieldCount> fields;
  std::vector<std::pair<std::string, RawValue>> args;

  void Clear() {
    for (auto& field : fields) field.reset();
    args.clear();
  }
};

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
    if (phase == "X") return ConvertSlice();
    if (phase == "i" || phase == "I") return ConvertInstant();
    if (phase == "C") return ConvertCounter();
    if (phase == "M") return ConvertMetadata();
    if (phase == "s" || phase == "f" || phase == "t") return ConvertFlow(phase == "s");
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
      if (!op_id_index && key == "op id" && value.type == RawValue::Type::kInt) op_id_index = i;
      if (!collective_index && key == "Collective name" && value.type == RawValue::Type::kString) {
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
    if (key == "correlation" && is_int && !have_correlation) {
      have_correlation = true;
      slice.correlation = value.integer;
      return true;
    }
    // Our writer repeats the op id as "External id"; a PyTorch External id is kept.
    if (key == "External id" && is_int && !have_external_id && slice.op_id >= 0 &&
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
    if (key == "Process Group Name") return take_string(0, c.process_group);
    if (key == "dtype") return take_string(1, c.dtype);
    if (key == "In msg nelems") return take_int64(2, c.in_nelems);
    if (key == "Out msg nelems") return take_int64(3, c.out_nelems);
    if (key == "Group size") return take_int32(4, c.group_size);
    if (key == "Seq") return take_int64(5, c.seq);
    if (key == "Rank") return take_int32(6, c.rank);
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
    const bool process = name == "process_name" || name == "process_sort_index";
    const bool thread = name == "thread_name" || name == "thread_sort_index";
    if (!process && !thread) return true;  // process_labels, ...: not modelled
    const bool is_name = name == "process_name" || name == "thread_name";
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

}  // namespace

StatusOr<Timeline> ParseChromeTrace(std::string_view text, const std::string& source) {
  return RunTraceSax(
      source,
      [&](TraceSax& sax) { return Json::sax_parse(text.data(), text.data() + text.size(), &sax); },
      [&](size_t offset) { return LineColumn(text, offset); });
}

StatusOr<Timeline> ReadChromeTraceFile(const std::string& path) {
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

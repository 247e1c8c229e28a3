// The callbacks of TraceSax (see chrome_trace_sax.h) that follow the document's structure:
// which container is open, where each scalar belongs, the header fields outside
// "traceEvents". A finished event is handed to ConvertEvent (chrome_trace_convert.cc).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <variant>

#include <fmt/format.h>

#include "chrome_trace_sax.h"
#include "json_text.h"

namespace shardscope::traces::trace_internal {
namespace {

// Containers nested deeper than this are rejected: no real trace comes close, and the cap
// keeps hostile input from growing the frame stack without bound.
constexpr size_t kMaxDepth = 512;
// Error messages quote at most this much of a bad value.
constexpr size_t kMaxQuotedChars = 64;
// Reading buffer for trace files.

}  // namespace

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

bool TraceSax::null() { return Scalar(RawValue{}); }

bool TraceSax::boolean(bool value) {
  RawValue raw;
  raw.type = RawValue::Type::kBool;
  raw.boolean = value;
  return Scalar(std::move(raw));
}

bool TraceSax::number_integer(number_integer_t value) {
  RawValue raw;
  raw.type = RawValue::Type::kInt;
  raw.integer = value;
  return Scalar(std::move(raw));
}

bool TraceSax::number_unsigned(number_unsigned_t value) {
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

bool TraceSax::number_float(number_float_t value, const string_t& text) {
  RawValue raw;
  raw.type = RawValue::Type::kFloat;
  raw.number = value;
  raw.text = text;
  return Scalar(std::move(raw));
}

bool TraceSax::string(string_t& value) {
  RawValue raw;
  raw.type = RawValue::Type::kString;
  raw.text = std::move(value);
  return Scalar(std::move(raw));
}

bool TraceSax::binary(binary_t& /*value*/) { return Fail(Path(), "unexpected binary value"); }

bool TraceSax::key(string_t& value) {
  key_ = std::move(value);
  return true;
}

bool TraceSax::start_object(std::size_t /*elements*/) { return StartContainer(/*object=*/true); }

bool TraceSax::start_array(std::size_t /*elements*/) { return StartContainer(/*object=*/false); }

bool TraceSax::end_object() {
  const Frame frame = frames_.back();
  frames_.pop_back();
  if (frame == Frame::kEvent) {
    const bool ok = ConvertEvent();
    ++event_index_;
    return ok;
  }
  return true;
}

bool TraceSax::end_array() {
  frames_.pop_back();
  return true;
}

bool TraceSax::parse_error(std::size_t position, const std::string& /*last_token*/,
                 const nlohmann::detail::exception& error) {
  // `position` counts the characters read, the offending one included.
  syntax_error_offset_ = position > 0 ? position - 1 : 0;
  syntax_error_text_ = JsonErrorText(error);
  return false;
}

bool TraceSax::StartContainer(bool object) {
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

bool TraceSax::Scalar(RawValue value) {
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
std::optional<std::variant<int64_t, double, std::string>> TraceSax::ToArgValue(RawValue value) {
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

bool TraceSax::TopLevelScalar(RawValue value) {
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

bool TraceSax::DistributedInfoScalar(const RawValue& value) {
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

}  // namespace shardscope::traces::trace_internal

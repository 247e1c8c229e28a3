// Private to traces/: the SAX handler of the Chrome-JSON reader (chrome_trace_reader.cc).
//
// The file goes through nlohmann's SAX parser; a small state machine (TraceSax) keeps only
// the fields of the event being read, turns each finished event into timeline entries and
// forgets it. Nothing proportional to the file is ever held besides the Timeline itself,
// so multi-gigabyte traces read in memory close to their Timeline's size. The callbacks
// that follow the document's structure are in chrome_trace_sax.cc, the conversion of a
// finished event into slices, instants, counters, metadata and flows in
// chrome_trace_convert.cc.
#ifndef SHARDSCOPE_TRACES_SRC_CHROME_TRACE_SAX_H_
#define SHARDSCOPE_TRACES_SRC_CHROME_TRACE_SAX_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "chrome_trace_fast_reader.h"
#include "shardscope/traces/timeline.h"

namespace shardscope::traces::trace_internal {

using Json = nlohmann::json;

// A value for an error message: quoted and cut if it is a long string.
std::string Describe(const RawValue& value);

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

  bool null() override;
  bool boolean(bool value) override;
  bool number_integer(number_integer_t value) override;
  bool number_unsigned(number_unsigned_t value) override;
  bool number_float(number_float_t value, const string_t& text) override;
  bool string(string_t& value) override;
  bool binary(binary_t& value) override;
  bool key(string_t& value) override;
  bool start_object(std::size_t elements) override;
  bool start_array(std::size_t elements) override;
  bool end_object() override;
  bool end_array() override;
  bool parse_error(std::size_t position, const std::string& last_token,
                   const nlohmann::detail::exception& error) override;

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

  // chrome_trace_sax.cc: the document's structure.
  bool StartContainer(bool object);
  bool Scalar(RawValue value);
  // Scalar -> Arg value; nullopt for null.
  static std::optional<std::variant<int64_t, double, std::string>> ToArgValue(RawValue value);
  bool TopLevelScalar(RawValue value);
  bool DistributedInfoScalar(const RawValue& value);

  // chrome_trace_convert.cc: a finished event into timeline entries.
  static std::optional<int32_t> ToInt32(const RawValue& value);
  // pid / tid: an int32, or any other value mapped to a synthetic negative id.
  int32_t TrackId(Field field);
  // A required or optional time field, in ns.
  bool Time(Field field, bool required, int64_t& out);
  // An optional string field ("" when absent).
  bool Text(Field field, std::string& out);
  bool ConvertEvent();
  bool ConvertSlice();
  // Reads `key` into a field of `slice` if it is one of the keys derived from fields.
  static bool ConsumeSliceArg(Slice& slice, const std::string& key, RawValue& value,
                              bool& have_correlation, bool& have_external_id,
                              std::array<bool, 7>& have_collective_field);
  bool ConvertInstant();
  bool ConvertCounter();
  // process_name and process_sort_index arrive as separate events; both update the same
  // ProcessInfo (likewise for threads), created where the first of them appears.
  bool ConvertMetadata();
  bool SetMetadata(std::string& name, int32_t& sort_index, bool is_name, RawValue* arg);
  bool ConvertFlow(bool is_start);

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

}  // namespace shardscope::traces::trace_internal

#endif  // SHARDSCOPE_TRACES_SRC_CHROME_TRACE_SAX_H_

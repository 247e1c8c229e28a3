// Private to traces/: the raw event both Chrome-JSON readers fill, and the fast scanner for
// the layout ChromeTraceWriter emits.
//
// chrome_trace_reader.cc reads any Chrome JSON through nlohmann's SAX parser. Most traces we
// read are our own (simulate, diff, run --profile): one event per line, compact, no
// whitespace inside an event. For those, ScanEventLine reads one line into the same RawEvent
// the SAX handler builds (same values, same order), and the SAX handler's own conversion turns
// it into timeline entries, so both paths give equal Timelines by construction. The scanner
// accepts a strict subset of JSON and says "not mine" for anything else (whitespace, nested
// values in args, true/false, surrogate escapes, numbers that would not fit, invalid UTF-8);
// the caller then reads the whole input again with the SAX parser, which also produces the
// error message when the input is bad.
#ifndef SHARDSCOPE_TRACES_CHROME_TRACE_FAST_READER_H_
#define SHARDSCOPE_TRACES_CHROME_TRACE_FAST_READER_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardscope/base/status.h"
#include "shardscope/traces/timeline.h"

namespace shardscope::traces::trace_internal {

// One scalar JSON value as the SAX parser reports it.
struct RawValue {
  enum class Type : uint8_t { kNull, kBool, kInt, kFloat, kString };
  Type type = Type::kNull;
  bool boolean = false;
  int64_t integer = 0;  // kInt (unsigned values above INT64_MAX become kFloat)
  double number = 0;    // kFloat (the fast scanner fills it inside "args" only: elsewhere the
                        // readers use `text`, e.g. timestamps are converted from their digits)
  std::string text;     // kString: the value; kFloat: the number as written
};

// The event fields the readers look at; other keys are skipped.
enum Field : uint8_t { kPh, kName, kCat, kPid, kTid, kTs, kDur, kId, kScope, kFieldCount };
inline constexpr std::array<std::string_view, kFieldCount> kFieldKeys = {"ph", "name", "cat", "pid", "tid",
                                                                         "ts", "dur",  "id",  "s"};

// One event's fields and scalar args (nulls dropped), in file order.
struct RawEvent {
  std::array<std::optional<RawValue>, kFieldCount> fields;
  std::vector<std::pair<std::string, RawValue>> args;

  void Clear() {
    for (auto& field : fields) field.reset();
    args.clear();
  }
};

// Length of the valid UTF-8 sequence at s[i], or 0. The rules of nlohmann's lexer
// (lexer::scan_string; the writer escapes what fails them, so its output reads back): no overlong forms, no UTF-16 surrogates, nothing above U+10FFFF.
inline size_t Utf8SequenceLength(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char lead = byte(i);
  const size_t left = s.size() - i;
  const auto continuation = [&](size_t k, unsigned char lo, unsigned char hi) {
    return k < left && byte(i + k) >= lo && byte(i + k) <= hi;
  };
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return continuation(1, 0x80, 0xBF) ? 2 : 0;
  if (lead >= 0xE0 && lead <= 0xEF) {
    const unsigned char lo = lead == 0xE0 ? 0xA0 : 0x80;
    const unsigned char hi = lead == 0xED ? 0x9F : 0xBF;
    return continuation(1, lo, hi) && continuation(2, 0x80, 0xBF) ? 3 : 0;
  }
  if (lead >= 0xF0 && lead <= 0xF4) {
    const unsigned char lo = lead == 0xF0 ? 0x90 : 0x80;
    const unsigned char hi = lead == 0xF4 ? 0x8F : 0xBF;
    return continuation(1, lo, hi) && continuation(2, 0x80, 0xBF) && continuation(3, 0x80, 0xBF) ? 4 : 0;
  }
  return 0;
}

// The length of the run of plain bytes (printable ASCII other than '"' and '\\') at the
// start of `s`, eight bytes at a time: names are long and almost always all plain.
// Bit tricks from "Bit Twiddling Hacks" (S. E. Anderson, Stanford): "Determine if a word has
// a byte less than n" and "Determine if a word has a zero byte".
inline size_t PlainRunLength(const char* s, size_t size) {
  constexpr uint64_t kOnes = 0x0101010101010101ULL;
  constexpr uint64_t kHighBits = 0x8080808080808080ULL;
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t x = 0;
    std::memcpy(&x, s + i, 8);
    const auto has_zero_byte = [&](uint64_t v) { return (v - kOnes) & ~v & kHighBits; };
    const uint64_t control = (x - kOnes * 0x20) & ~x & kHighBits;  // a byte < 0x20
    const uint64_t quote = has_zero_byte(x ^ (kOnes * '"'));
    const uint64_t backslash = has_zero_byte(x ^ (kOnes * '\\'));
    if ((control | quote | backslash | (x & kHighBits)) != 0) break;
  }
  for (; i < size; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c >= 0x80 || c == '"' || c == '\\') break;
  }
  return i;
}

// Parses a JSON number written in microseconds into nanoseconds, exactly (digits shifted by
// three places, rounded half away from zero). nullopt when it does not fit int64 ns.
std::optional<int64_t> DecimalMicrosToNanos(std::string_view text);

// Reads one event line in ChromeTraceWriter's layout ('{' ... '}', no trailing comma) into
// `event` (cleared first). False when the line is not in the subset the scanner accepts;
// `event` is then unspecified.
bool ScanEventLine(std::string_view line, RawEvent& event);

// The common case, faster: a slice line exactly as ChromeTraceWriter::OnSlice writes it (its
// key order, the keys it derives from fields each once and with their types), read straight
// into `slice` (a fresh Slice) with what the SAX route would give. False for any other line
// (the caller then uses ScanEventLine); `slice` is then unspecified.
bool ScanWriterSlice(std::string_view line, Slice& slice);

// The fast path over a whole text or a file read a block at a time (chrome_trace_reader.cc):
// the Timeline, or nullopt when the input is not exactly in the writer's layout or is not a
// valid trace (ParseChromeTrace and ReadChromeTraceFile then use the SAX parser).
std::optional<Timeline> ParseWriterLayout(std::string_view text);
std::optional<Timeline> ReadWriterLayoutFile(const std::string& path);
// The SAX parser alone (what ParseChromeTrace falls back to); for tests comparing the paths.
StatusOr<Timeline> ParseWithSax(std::string_view text, const std::string& source);

// The header ChromeTraceWriter writes ends with this line; the events follow, one a line.
inline constexpr std::string_view kEventsOpenLine = "  \"traceEvents\": [";
// ...and the file ends with this line (and a newline).
inline constexpr std::string_view kEventsCloseLine = "]}";

}  // namespace shardscope::traces::trace_internal

#endif  // SHARDSCOPE_TRACES_CHROME_TRACE_FAST_READER_H_

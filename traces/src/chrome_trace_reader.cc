// Streaming Chrome-JSON reader (shardscope's own traces and PyTorch-profiler traces): the
// entry points, the fast path for traces in ChromeTraceWriter's layout, and gzip. Every
// other input goes through nlohmann's SAX parser and TraceSax (chrome_trace_sax.h), which
// keeps nothing proportional to the file besides the Timeline itself.
#include "shardscope/traces/chrome_trace.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "chrome_trace_fast_reader.h"
#include "chrome_trace_sax.h"
#include "shardscope/base/gzip_stream.h"
#include "json_text.h"

namespace shardscope::traces {
namespace {

using Json = nlohmann::json;
using trace_internal::TraceSax;

// Reading buffer for trace files.
constexpr size_t kReadBufferBytes = size_t{1} << 20;
// The fast path gives up on lines longer than this (and the SAX parser reads the file).
constexpr size_t kMaxFastLineBytes = size_t{1} << 26;
// The shortest slice line ChromeTraceWriter writes ({"ph":"X","cat":"","name":"","pid":0,
// "tid":0,"ts":0.000,"dur":0.000,"args":{}} and ",\n"), for reserving: most of a trace is
// slices, and growing a vector of a million of them costs copies and page faults.
constexpr size_t kMinSliceLineBytes = 80;

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
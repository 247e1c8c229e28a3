// Streaming Chrome-JSON writer (Kineto conventions; see chrome_trace.h for the layout).
//
// Every event is formatted into one reused string and appended to a buffered std::ofstream,
// so memory stays constant however long the trace. The file is written under a temporary
// name and renamed into place by Finish(), so readers never see half a trace.
#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <string_view>

#include "shardscope/traces/chrome_trace.h"

namespace shardscope::traces {
namespace {

// Large enough that a trace is written in few system calls, small enough to not matter.
constexpr size_t kFileBufferBytes = size_t{1} << 20;

// Top-level keys the writer produces itself; TraceInfo::extra may not repeat them.
constexpr std::array<std::string_view, 7> kReservedTopLevelKeys = {
    "schemaVersion",       "deviceProperties", "distributedInfo", "displayTimeUnit",
    "baseTimeNanoseconds", "producer",         "traceEvents"};

// Length of the valid UTF-8 sequence starting at s[i], or 0 if the bytes there are not one
// (the same rules as nlohmann's lexer: no overlong forms, surrogates or code points above
// U+10FFFF, which is what makes the output readable by our own reader).
size_t Utf8SequenceLength(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char lead = byte(i);
  const size_t left = s.size() - i;
  const auto continuation = [&](size_t k, unsigned char lo, unsigned char hi) {
    return k < left && byte(i + k) >= lo && byte(i + k) <= hi;
  };
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return continuation(1, 0x80, 0xBF) ? 2 : 0;
  if (lead >= 0xE0 && lead <= 0xEF) {
    const unsigned char lo = lead == 0xE0 ? 0xA0 : 0x80;  // no overlong 3-byte forms
    const unsigned char hi = lead == 0xED ? 0x9F : 0xBF;  // no UTF-16 surrogates
    return continuation(1, lo, hi) && continuation(2, 0x80, 0xBF) ? 3 : 0;
  }
  if (lead >= 0xF0 && lead <= 0xF4) {
    const unsigned char lo = lead == 0xF0 ? 0x90 : 0x80;  // no overlong 4-byte forms
    const unsigned char hi = lead == 0xF4 ? 0x8F : 0xBF;  // nothing above U+10FFFF
    return continuation(1, lo, hi) && continuation(2, 0x80, 0xBF) && continuation(3, 0x80, 0xBF)
               ? 4
               : 0;
  }
  return 0;
}

void AppendJsonString(std::string& out, std::string_view s) {
  out += '"';
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const size_t length = Utf8SequenceLength(s, i);
      if (length == 0) {
        out += "\\ufffd";  // invalid byte: JSON must be valid UTF-8
        ++i;
      } else {
        out.append(s.substr(i, length));
        i += length;
      }
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          fmt::format_to(std::back_inserter(out), "\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out += static_cast<char>(c);
        }
    }
    ++i;
  }
  out += '"';
}

// ns -> microseconds with exactly three decimals, by integer arithmetic (a double would
// lose nanoseconds beyond 2^53 ns, about 104 days, which epoch timestamps exceed).
void AppendMicros(std::string& out, int64_t ns) {
  // Negate in unsigned arithmetic so that INT64_MIN works too.
  const uint64_t magnitude =
      ns < 0 ? uint64_t{0} - static_cast<uint64_t>(ns) : static_cast<uint64_t>(ns);
  fmt::format_to(std::back_inserter(out), "{}{}.{:03}", ns < 0 ? "-" : "", magnitude / 1000,
                 magnitude % 1000);
}

void AppendDouble(std::string& out, double value) {
  if (!std::isfinite(value)) {
    out += "null";  // JSON has no NaN or infinity
    return;
  }
  const size_t start = out.size();
  fmt::format_to(std::back_inserter(out), "{}", value);  // shortest round-trip form
  // "3" would read back as an integer; keep it a double.
  if (out.find_first_of(".eE", start) == std::string::npos) out += ".0";
}

void AppendArgValue(std::string& out, const std::variant<int64_t, double, std::string>& value) {
  if (const auto* i = std::get_if<int64_t>(&value)) {
    fmt::format_to(std::back_inserter(out), "{}", *i);
  } else if (const auto* d = std::get_if<double>(&value)) {
    AppendDouble(out, *d);
  } else {
    AppendJsonString(out, std::get<std::string>(value));
  }
}

// Appends `"key":` preceded by a comma unless it is the first member.
void AppendKey(std::string& out, bool& first, std::string_view key) {
  if (!first) out += ',';
  first = false;
  AppendJsonString(out, key);
  out += ':';
}

void AppendArgs(std::string& out, bool& first, const std::vector<Arg>& args) {
  for (const Arg& arg : args) {
    AppendKey(out, first, arg.key);
    AppendArgValue(out, arg.value);
  }
}

// Keys of a slice's args that the writer derives from Slice fields. An extra arg with one
// of these keys would be read back into the field, so it is dropped.
bool IsReservedSliceArg(const Slice& slice, std::string_view key) {
  if (key == "op id" || key == "correlation" || key == "Collective name") return true;
  if (slice.op_id >= 0 && key == "External id") return true;
  if (slice.collective) {
    for (std::string_view k : {"Process Group Name", "dtype", "In msg nelems", "Out msg nelems",
                               "Group size", "Seq", "Rank"}) {
      if (key == k) return true;
    }
  }
  return false;
}

// Common head of a trace event: {"ph":"X","cat":...,"name":...,"pid":..,"tid":..
void AppendEventHead(std::string& out, std::string_view ph, std::string_view cat,
                     std::string_view name, int32_t pid, int32_t tid) {
  out += "{\"ph\":";
  AppendJsonString(out, ph);
  out += ",\"cat\":";
  AppendJsonString(out, cat);
  out += ",\"name\":";
  AppendJsonString(out, name);
  fmt::format_to(std::back_inserter(out), ",\"pid\":{},\"tid\":{}", pid, tid);
}

void AppendMetadataEvent(std::string& out, std::string_view name, int32_t pid, int32_t tid,
                         std::string_view arg_key,
                         const std::variant<int64_t, double, std::string>& value) {
  out += "{\"ph\":\"M\",\"name\":";
  AppendJsonString(out, name);
  fmt::format_to(std::back_inserter(out), ",\"pid\":{},\"tid\":{},\"args\":{{", pid, tid);
  AppendJsonString(out, arg_key);
  out += ':';
  AppendArgValue(out, value);
  out += "}}";
}

}  // namespace

ChromeTraceWriter::ChromeTraceWriter(std::string path, std::string temp_path)
    : path_(std::move(path)), temp_path_(std::move(temp_path)) {}

StatusOr<std::unique_ptr<ChromeTraceWriter>> ChromeTraceWriter::Open(const std::string& path,
                                                                     const TraceInfo& info) {
  for (const Arg& arg : info.extra) {
    for (std::string_view reserved : kReservedTopLevelKeys) {
      if (arg.key == reserved) {
        return Status::InvalidInput(fmt::format(
            "{}: TraceInfo::extra key \"{}\" collides with a top-level key the writer owns", path,
            arg.key));
      }
    }
  }
  std::unique_ptr<ChromeTraceWriter> writer(
      new ChromeTraceWriter(path, fmt::format("{}.tmp.{}", path, ::getpid())));
  writer->file_buffer_.resize(kFileBufferBytes);
  // pubsetbuf must come before open to take effect in libstdc++.
  writer->out_.rdbuf()->pubsetbuf(writer->file_buffer_.data(),
                                  static_cast<std::streamsize>(writer->file_buffer_.size()));
  writer->out_.open(writer->temp_path_, std::ios::binary | std::ios::trunc);
  if (!writer->out_.is_open()) {
    const int error = errno;
    writer->finished_ = true;  // nothing to remove
    return Status::IoError(
        fmt::format("cannot create '{}': {}", writer->temp_path_, std::strerror(error)));
  }

  std::string& header = writer->event_;
  header =
      "{\n  \"schemaVersion\": 1,\n  \"deviceProperties\": [],\n"
      "  \"distributedInfo\": {\"backend\": ";
  AppendJsonString(header, info.backend);
  fmt::format_to(std::back_inserter(header),
                 ", \"rank\": {}, \"world_size\": {}}},\n  \"displayTimeUnit\": \"ns\",\n"
                 "  \"baseTimeNanoseconds\": {},\n  \"producer\": ",
                 info.rank, info.world_size, info.base_time_ns);
  AppendJsonString(header, info.producer);
  header += ",\n";
  for (const Arg& arg : info.extra) {
    header += "  ";
    AppendJsonString(header, arg.key);
    header += ": ";
    AppendArgValue(header, arg.value);
    header += ",\n";
  }
  header += "  \"traceEvents\": [\n";
  writer->out_.write(header.data(), static_cast<std::streamsize>(header.size()));
  return writer;
}

ChromeTraceWriter::~ChromeTraceWriter() {
  if (finished_) return;
  out_.close();
  std::remove(temp_path_.c_str());
}

std::string& ChromeTraceWriter::BeginEvent() {
  event_.clear();
  if (!first_event_) event_ += ",\n";
  first_event_ = false;
  return event_;
}

void ChromeTraceWriter::EndEvent() {
  out_.write(event_.data(), static_cast<std::streamsize>(event_.size()));
}

void ChromeTraceWriter::OnProcess(const ProcessInfo& process) {
  if (finished_) return;
  std::string& out = BeginEvent();
  AppendMetadataEvent(out, "process_name", process.pid, 0, "name", process.name);
  out += ",\n";
  AppendMetadataEvent(out, "process_sort_index", process.pid, 0, "sort_index",
                      int64_t{process.sort_index});
  EndEvent();
}

void ChromeTraceWriter::OnThread(const ThreadInfo& thread) {
  if (finished_) return;
  std::string& out = BeginEvent();
  AppendMetadataEvent(out, "thread_name", thread.pid, thread.tid, "name", thread.name);
  out += ",\n";
  AppendMetadataEvent(out, "thread_sort_index", thread.pid, thread.tid, "sort_index",
                      int64_t{thread.sort_index});
  EndEvent();
}

void ChromeTraceWriter::OnSlice(const Slice& slice) {
  if (finished_) return;
  std::string& out = BeginEvent();
  AppendEventHead(out, "X",
                  slice.category == Category::kOther ? std::string_view(slice.raw_category)
                                                     : CategoryName(slice.category),
                  slice.name, slice.pid, slice.tid);
  out += ",\"ts\":";
  AppendMicros(out, slice.ts_ns);
  out += ",\"dur\":";
  AppendMicros(out, slice.dur_ns);
  out += ",\"args\":{";
  bool first = true;
  if (slice.op_id >= 0) {
    AppendKey(out, first, "op id");
    fmt::format_to(std::back_inserter(out), "{}", slice.op_id);
    // Kineto links CPU ops and kernels through "External id"; the op id plays that role.
    AppendKey(out, first, "External id");
    fmt::format_to(std::back_inserter(out), "{}", slice.op_id);
  }
  if (slice.correlation >= 0) {
    AppendKey(out, first, "correlation");
    fmt::format_to(std::back_inserter(out), "{}", slice.correlation);
  }
  if (slice.collective) {
    const CollectiveInfo& c = *slice.collective;
    AppendKey(out, first, "Collective name");
    AppendJsonString(out, c.collective_name);
    AppendKey(out, first, "Process Group Name");
    AppendJsonString(out, c.process_group);
    AppendKey(out, first, "dtype");
    AppendJsonString(out, c.dtype);
    fmt::format_to(std::back_inserter(out),
                   ",\"In msg nelems\":{},\"Out msg nelems\":{},\"Group size\":{},\"Seq\":{},"
                   "\"Rank\":{}",
                   c.in_nelems, c.out_nelems, c.group_size, c.seq, c.rank);
  }
  for (const Arg& arg : slice.args) {
    if (IsReservedSliceArg(slice, arg.key)) continue;
    AppendKey(out, first, arg.key);
    AppendArgValue(out, arg.value);
  }
  out += "}}";
  EndEvent();
}

void ChromeTraceWriter::OnInstant(const Instant& instant) {
  if (finished_) return;
  std::string& out = BeginEvent();
  AppendEventHead(out, "i", instant.category, instant.name, instant.pid, instant.tid);
  out += ",\"ts\":";
  AppendMicros(out, instant.ts_ns);
  out += ",\"s\":";
  AppendJsonString(out, std::string_view(&instant.scope, 1));
  out += ",\"args\":{";
  bool first = true;
  AppendArgs(out, first, instant.args);
  out += "}}";
  EndEvent();
}

void ChromeTraceWriter::OnCounter(const CounterSample& sample) {
  if (finished_) return;
  std::string& out = BeginEvent();
  out += "{\"ph\":\"C\",\"name\":";
  AppendJsonString(out, sample.name);
  fmt::format_to(std::back_inserter(out), ",\"pid\":{},\"ts\":", sample.pid);
  AppendMicros(out, sample.ts_ns);
  out += ",\"args\":{";
  bool first = true;
  for (const auto& [key, value] : sample.values) {
    AppendKey(out, first, key);
    AppendDouble(out, value);
  }
  out += "}}";
  EndEvent();
}

void ChromeTraceWriter::OnFlow(const Flow& flow) {
  if (finished_) return;
  std::string& out = BeginEvent();
  AppendEventHead(out, "s", flow.category, flow.name, flow.from_pid, flow.from_tid);
  fmt::format_to(std::back_inserter(out), ",\"id\":{},\"ts\":", flow.id);
  AppendMicros(out, flow.from_ts_ns);
  out += "},\n";
  // "bp":"e" binds the arrow to the enclosing slice instead of the next one.
  AppendEventHead(out, "f", flow.category, flow.name, flow.to_pid, flow.to_tid);
  fmt::format_to(std::back_inserter(out), ",\"id\":{},\"bp\":\"e\",\"ts\":", flow.id);
  AppendMicros(out, flow.to_ts_ns);
  out += '}';
  EndEvent();
}

Status ChromeTraceWriter::Finish() {
  if (finished_) return finish_status_;
  finished_ = true;
  static constexpr std::string_view kTail = "\n]}\n";
  out_.write(kTail.data(), static_cast<std::streamsize>(kTail.size()));
  out_.flush();
  const bool written = out_.good();
  out_.close();
  if (!written || out_.fail()) {
    std::remove(temp_path_.c_str());
    finish_status_ = Status::IoError(fmt::format("writing '{}' failed (disk full?)", temp_path_));
    return finish_status_;
  }
  if (std::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const int error = errno;
    std::remove(temp_path_.c_str());
    finish_status_ = Status::IoError(
        fmt::format("cannot rename '{}' to '{}': {}", temp_path_, path_, std::strerror(error)));
  }
  return finish_status_;
}

Status WriteChromeTrace(const Timeline& timeline, const std::string& path) {
  SHARDSCOPE_ASSIGN_OR_RETURN(std::unique_ptr<ChromeTraceWriter> writer,
                              ChromeTraceWriter::Open(path, timeline.info));
  timeline.ReplayInto(*writer);
  return writer->Finish();
}

}  // namespace shardscope::traces

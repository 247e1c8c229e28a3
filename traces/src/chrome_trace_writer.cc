// Streaming Chrome-JSON writer (Kineto conventions; see chrome_trace.h for the layout).
//
// Every event is appended to one reused string that goes to the (unbuffered) std::ofstream
// a megabyte at a time, so memory stays constant however long the trace. The file is
// written under a temporary name and renamed into place by Finish(), so readers never see
// half a trace.
#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <string_view>

#include "chrome_trace_fast_reader.h"
#include "shardscope/traces/chrome_trace.h"

namespace shardscope::traces {
namespace {

// Large enough that a trace is written in few system calls, small enough to not matter.
constexpr size_t kFileBufferBytes = size_t{1} << 20;

// Top-level keys the writer produces itself; TraceInfo::extra may not repeat them.
constexpr std::array<std::string_view, 7> kReservedTopLevelKeys = {
    "schemaVersion",       "deviceProperties", "distributedInfo", "displayTimeUnit",
    "baseTimeNanoseconds", "producer",         "traceEvents"};

void AppendJsonString(std::string& out, std::string_view s) {
  out += '"';
  size_t i = 0;
  while (i < s.size()) {
    // Copy the longest run of plain bytes at once (names are almost always all plain).
    const size_t run = trace_internal::PlainRunLength(s.data() + i, s.size() - i);
    out.append(s.data() + i, run);
    i += run;
    if (i == s.size()) break;
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const size_t length = trace_internal::Utf8SequenceLength(s, i);
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
      default: {  // other control characters
        static constexpr char kHex[] = "0123456789abcdef";
        const char escape[6] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 0xF]};
        out.append(escape, sizeof(escape));
      }
    }
    ++i;
  }
  out += '"';
}

// Integers through fmt::format_int (no format-string parsing, no iterator adaptor).
template <typename Int>
void AppendInt(std::string& out, Int value) {
  const fmt::format_int text(value);
  out.append(text.data(), text.size());
}

// ns -> microseconds with exactly three decimals, by integer arithmetic (a double would
// lose nanoseconds beyond 2^53 ns, about 104 days, which epoch timestamps exceed).
void AppendMicros(std::string& out, int64_t ns) {
  // Negate in unsigned arithmetic so that INT64_MIN works too.
  const uint64_t magnitude =
      ns < 0 ? uint64_t{0} - static_cast<uint64_t>(ns) : static_cast<uint64_t>(ns);
  if (ns < 0) out += '-';
  AppendInt(out, magnitude / 1000);
  const auto fraction = static_cast<unsigned>(magnitude % 1000);
  const char digits[4] = {'.', static_cast<char>('0' + fraction / 100), static_cast<char>('0' + fraction / 10 % 10),
                          static_cast<char>('0' + fraction % 10)};
  out.append(digits, sizeof(digits));
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
    AppendInt(out, *i);
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
  out += ",\"pid\":";
  AppendInt(out, pid);
  out += ",\"tid\":";
  AppendInt(out, tid);
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
  // The writer buffers itself (event_); writes reach the file a block at a time.
  writer->out_.rdbuf()->pubsetbuf(nullptr, 0);  // before open, to take effect in libstdc++
  writer->event_.reserve(kFileBufferBytes + kFileBufferBytes / 4);
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
  header += "  \"traceEvents\": [\n";  // stays in event_ until the first flush
  return writer;
}

ChromeTraceWriter::~ChromeTraceWriter() {
  if (finished_) return;
  out_.close();
  std::remove(temp_path_.c_str());
}

std::string& ChromeTraceWriter::BeginEvent() {
  if (!first_event_) event_ += ",\n";
  first_event_ = false;
  return event_;
}

void ChromeTraceWriter::EndEvent() {
  // Events collect in event_ and go to the file a block at a time: one copy fewer than
  // through the stream's buffer.
  if (event_.size() >= kFileBufferBytes) FlushEvents();
}

void ChromeTraceWriter::FlushEvents() {
  out_.write(event_.data(), static_cast<std::streamsize>(event_.size()));
  event_.clear();
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
  WriteSlice(slice, slice.pid, slice.tid, slice.ts_ns, {});
}

void ChromeTraceWriter::OnSliceAt(const Slice& slice, int32_t pid, int32_t tid, int64_t ts_ns,
                                  std::span<const Arg> extra_args) {
  WriteSlice(slice, pid, tid, ts_ns, extra_args);
}

void ChromeTraceWriter::WriteSlice(const Slice& slice, int32_t pid, int32_t tid, int64_t ts_ns,
                                   std::span<const Arg> extra_args) {
  if (finished_) return;
  std::string& out = BeginEvent();
  AppendEventHead(out, "X",
                  slice.category == Category::kOther ? std::string_view(slice.raw_category)
                                                     : CategoryName(slice.category),
                  slice.name, pid, tid);
  out += ",\"ts\":";
  AppendMicros(out, ts_ns);
  out += ",\"dur\":";
  AppendMicros(out, slice.dur_ns);
  out += ",\"args\":{";
  bool first = true;
  if (slice.op_id >= 0) {
    AppendKey(out, first, "op id");
    AppendInt(out, slice.op_id);
    // Kineto links CPU ops and kernels through "External id"; the op id plays that role.
    AppendKey(out, first, "External id");
    AppendInt(out, slice.op_id);
  }
  if (slice.correlation >= 0) {
    AppendKey(out, first, "correlation");
    AppendInt(out, slice.correlation);
  }
  if (slice.collective) {
    const CollectiveInfo& c = *slice.collective;
    AppendKey(out, first, "Collective name");
    AppendJsonString(out, c.collective_name);
    AppendKey(out, first, "Process Group Name");
    AppendJsonString(out, c.process_group);
    AppendKey(out, first, "dtype");
    AppendJsonString(out, c.dtype);
    out += ",\"In msg nelems\":";
    AppendInt(out, c.in_nelems);
    out += ",\"Out msg nelems\":";
    AppendInt(out, c.out_nelems);
    out += ",\"Group size\":";
    AppendInt(out, c.group_size);
    out += ",\"Seq\":";
    AppendInt(out, c.seq);
    out += ",\"Rank\":";
    AppendInt(out, c.rank);
  }
  for (std::span<const Arg> args : {std::span<const Arg>(slice.args), extra_args}) {
    for (const Arg& arg : args) {
      if (IsReservedSliceArg(slice, arg.key)) continue;
      AppendKey(out, first, arg.key);
      AppendArgValue(out, arg.value);
    }
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
  out += ",\"pid\":";
  AppendInt(out, sample.pid);
  out += ",\"ts\":";
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
  out += ",\"id\":";
  AppendInt(out, flow.id);
  out += ",\"ts\":";
  AppendMicros(out, flow.from_ts_ns);
  out += "},\n";
  // "bp":"e" binds the arrow to the enclosing slice instead of the next one.
  AppendEventHead(out, "f", flow.category, flow.name, flow.to_pid, flow.to_tid);
  out += ",\"id\":";
  AppendInt(out, flow.id);
  out += ",\"bp\":\"e\",\"ts\":";
  AppendMicros(out, flow.to_ts_ns);
  out += '}';
  EndEvent();
}

Status ChromeTraceWriter::Finish() {
  if (finished_) return finish_status_;
  finished_ = true;
  event_ += "\n]}\n";
  FlushEvents();
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

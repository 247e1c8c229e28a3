// Chrome-JSON trace files (what Perfetto, chrome://tracing and Holistic Trace Analysis
// open), written and read with the PyTorch-profiler (Kineto) conventions.
//
// Writing streams: ChromeTraceWriter formats each event as it arrives into a buffer that
// goes to the file a megabyte at a time, so memory does not grow with the trace. The file appears under its final
// name only when Finish() succeeds:
//
//   SHARDSCOPE_ASSIGN_OR_RETURN(auto writer, ChromeTraceWriter::Open("out.json", info));
//   simulator.Run(*writer);                 // any TimelineSink producer
//   SHARDSCOPE_RETURN_IF_ERROR(writer->Finish());
//
// Layout written (one event per line):
//   {"schemaVersion":1, "deviceProperties":[],
//    "distributedInfo":{"backend":"nccl","rank":0,"world_size":8},
//    "displayTimeUnit":"ns", "baseTimeNanoseconds":0, "producer":"shardscope", <extra...>,
//    "traceEvents":[ ... ]}
// - ts/dur: microseconds with exactly three decimals, converted exactly from int64 ns.
// - "X" slices: cat = CategoryName (or Slice::raw_category for kOther); args hold
//   "op id" and "External id" (= op id) when op_id >= 0, "correlation" when >= 0, the
//   NCCL-style keys of CollectiveInfo ("Collective name", "Process Group Name", "dtype",
//   "In msg nelems", "Out msg nelems", "Group size", "Seq", "Rank") when present, then
//   Slice::args. An extra arg whose key is one of those written from a field is dropped.
// - "M" process_name / process_sort_index / thread_name / thread_sort_index.
// - "i" instants with "s"; "C" counters (args = values); flows as "s" + "f" ("bp":"e").
// - Strings are escaped for JSON; invalid UTF-8 becomes U+FFFD. Doubles print in the
//   shortest form that reads back to the same value; NaN and infinities print as null.
//
// Reading accepts that layout, a bare array of events, and PyTorch-profiler traces, plain or
// gzip-compressed (zlib; detected by the gzip magic bytes). It streams through the file: memory is proportional to the resulting Timeline, never to a
// DOM of the file. A file exactly in the layout above (one event per line, as written) takes
// a fast path, a scanner for that layout; anything else goes through nlohmann's SAX parser,
// which also reports the errors. Both give the same Timeline (docs/DIFF.md, "Speed"). What
// it keeps:
// - "X" slices: the fields above; other args of scalar type (int64, double, string;
//   booleans as 0/1; nested objects and arrays are skipped). "External id" is kept in args
//   unless it merely repeats "op id". Unknown categories become kOther + raw_category;
//   schemaVersion 1 (2021) names ("Kernel", "Memcpy", "Memset", "Runtime", "Operator") read
//   as today's categories (ParseCategory).
// - "i"/"I" instants, "C" counters (numeric args), "M" process/thread names and sort
//   indices, flows paired by (cat, id): "s" with "f" or "t", in either order.
// - "B"/"E" pairs and other phases are ignored.
// - pid/tid that are strings or do not fit int32 are mapped to negative ids -1, -2, ... in
//   order of first appearance (consistently within one file).
// - distributedInfo {backend, rank, world_size}, baseTimeNanoseconds and producer go to
//   TraceInfo (producer is "" when absent); other scalar top-level keys go to
//   TraceInfo::extra, in order.
// Writing a Timeline and reading it back gives an equal Timeline (exact ns) as long as its
// strings are valid UTF-8, its doubles finite, its slices' extra args do not reuse the
// keys written from fields, and it describes each pid / (pid, tid) once.
#ifndef SHARDSCOPE_TRACES_CHROME_TRACE_H_
#define SHARDSCOPE_TRACES_CHROME_TRACE_H_

#include <cstdint>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shardscope/base/status.h"
#include "shardscope/traces/timeline.h"

namespace shardscope::traces {

// A TimelineSink that streams Chrome JSON into a file. Events are written in the order
// they arrive. Sink callbacks cannot fail; an I/O error is remembered and reported by
// Finish(). Not thread-safe.
class ChromeTraceWriter final : public TimelineSink {
 public:
  // Creates `path + ".tmp.<pid>"` and writes the header. Fails if the file cannot be
  // created or TraceInfo::extra reuses a top-level key the writer owns.
  static StatusOr<std::unique_ptr<ChromeTraceWriter>> Open(const std::string& path,
                                                           const TraceInfo& info);

  // Without a successful Finish(), removes the temporary file. Never throws.
  ~ChromeTraceWriter() override;

  ChromeTraceWriter(const ChromeTraceWriter&) = delete;
  ChromeTraceWriter& operator=(const ChromeTraceWriter&) = delete;

  void OnProcess(const ProcessInfo& process) override;
  void OnThread(const ThreadInfo& thread) override;
  void OnSlice(const Slice& slice) override;
  // Writes `slice` as OnSlice would with `pid`, `tid` and `ts_ns` in place of its own and
  // `extra_args` after its args: for a slice shown elsewhere (the diff's merged trace),
  // without copying it.
  void OnSliceAt(const Slice& slice, int32_t pid, int32_t tid, int64_t ts_ns,
                 std::span<const Arg> extra_args);
  void OnInstant(const Instant& instant) override;
  void OnCounter(const CounterSample& sample) override;
  void OnFlow(const Flow& flow) override;

  // Closes the JSON, flushes, and renames the temporary file onto `path`. Events that
  // arrive afterwards are ignored. Calling it twice returns the first result.
  Status Finish();

 private:
  ChromeTraceWriter(std::string path, std::string temp_path);
  // Writes the separator before an event and returns the reused formatting buffer.
  std::string& BeginEvent();
  void EndEvent();
  void WriteSlice(const Slice& slice, int32_t pid, int32_t tid, int64_t ts_ns,
                  std::span<const Arg> extra_args);

  std::string path_;
  std::string temp_path_;
  void FlushEvents();

  std::ofstream out_;  // unbuffered: event_ is the buffer
  std::string event_;  // events not yet written (about a megabyte at most), reused
  bool first_event_ = true;
  bool finished_ = false;
  Status finish_status_;
};

// Writes a whole in-memory timeline (metadata first, see Timeline::ReplayInto).
Status WriteChromeTrace(const Timeline& timeline, const std::string& path);

// Parses Chrome JSON. `source` names the input in error messages ("<source>:<line>:<col>"
// for syntax errors, "<source>: /traceEvents/<i>/<key>: ..." for bad events).
StatusOr<Timeline> ParseChromeTrace(std::string_view text, const std::string& source);

// The most bytes a gzip-compressed trace may decompress to: 64 GiB, far above the largest
// traces a browser or HTA opens (Perfetto's docs put the JSON limit near 2 GB), so only a
// corrupt or hostile file reaches it; past it reading stops with an error.
inline constexpr int64_t kMaxDecompressedTraceBytes = int64_t{64} << 30;

// Reads a trace file, streaming it from disk (the file is never held in memory whole). A
// gzip-compressed file (`*.pt.trace.json.gz`; recognised by its first two bytes, 1f 8b, not
// by its name) is decompressed as it is parsed; corrupt or truncated gzip data, or data
// decompressing past `max_decompressed_bytes`, is a kInvalidInput error naming the file.
StatusOr<Timeline> ReadChromeTraceFile(const std::string& path,
                                       int64_t max_decompressed_bytes = kMaxDecompressedTraceBytes);

// ParseChromeTrace over bytes that may be gzip-compressed (as ReadChromeTraceFile decides).
StatusOr<Timeline> ParseChromeTraceBytes(std::string_view bytes, const std::string& source,
                                         int64_t max_decompressed_bytes = kMaxDecompressedTraceBytes);

}  // namespace shardscope::traces

#endif  // SHARDSCOPE_TRACES_CHROME_TRACE_H_

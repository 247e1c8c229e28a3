#include "shardscope/traces/chrome_trace.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

namespace shardscope::traces {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::StartsWith;

std::string TempPath(std::string_view name) {
  return ::testing::TempDir() + "/chrome_trace_test_" + std::to_string(::getpid()) + "_" +
         std::string(name);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void ExpectSameTimeline(const Timeline& actual, const Timeline& expected) {
  EXPECT_TRUE(actual.info == expected.info);
  EXPECT_TRUE(actual.processes == expected.processes);
  EXPECT_TRUE(actual.threads == expected.threads);
  ASSERT_EQ(actual.slices.size(), expected.slices.size());
  for (size_t i = 0; i < actual.slices.size(); ++i) {
    EXPECT_TRUE(actual.slices[i] == expected.slices[i])
        << "slice " << i << " " << actual.slices[i].name << " ts " << actual.slices[i].ts_ns
        << " vs " << expected.slices[i].ts_ns;
  }
  EXPECT_TRUE(actual.instants == expected.instants);
  EXPECT_TRUE(actual.counters == expected.counters);
  EXPECT_TRUE(actual.flows == expected.flows);
}

Timeline MakeTimeline() {
  Timeline timeline;
  timeline.info.backend = "nccl";
  timeline.info.rank = 3;
  timeline.info.world_size = 8;
  timeline.info.base_time_ns = 1'712'345'678'901'234'567;
  timeline.info.producer = "shardscope simulate";
  timeline.info.extra = {{"plan", std::string("fsdp.yaml")}, {"seed", int64_t{42}}, {"scale", 0.5}};
  timeline.processes = {{3, "rank 3", 3}, {103, "rank 3 (measured)", 103}};
  timeline.threads = {{3, 0, "host thread", 0}, {3, 7, "stream 7 compute", 7}};

  Slice gemm;
  gemm.pid = 3;
  gemm.tid = 7;
  gemm.ts_ns = 1'712'345'678'901'234'567;  // beyond 2^53: a double would lose ns
  gemm.dur_ns = 12'345;
  gemm.name = "gemm qkv";
  gemm.category = Category::kKernel;
  gemm.op_id = 12;
  gemm.correlation = 99;
  gemm.args = {{"grid", std::string("[128, 1, 1]")},
               {"flops", 1.5e12},
               {"registers", int64_t{96}},
               {"ratio", 3.0},
               {"tiny", -2.5e-300}};
  timeline.slices.push_back(gemm);

  Slice nccl;
  nccl.pid = 3;
  nccl.tid = 9;
  nccl.ts_ns = -1;
  nccl.dur_ns = 999;
  nccl.name = "ncclDevKernel_AllGather_RING_LL";
  nccl.category = Category::kKernel;
  nccl.op_id = 0;
  nccl.collective = CollectiveInfo{"all_gather", "0", "bf16", 512, 4096, 8, 17, 3};
  timeline.slices.push_back(nccl);

  Slice other;
  other.pid = 3;
  other.tid = 0;
  other.ts_ns = 0;
  other.dur_ns = std::numeric_limits<int64_t>::max();
  other.name = "";
  other.category = Category::kOther;
  other.raw_category = "python_function";
  other.args = {{"External id", int64_t{5}}};  // no op id: kept as an ordinary arg
  timeline.slices.push_back(other);

  Slice extreme;
  extreme.ts_ns = std::numeric_limits<int64_t>::min();
  extreme.dur_ns = 1;
  extreme.category = Category::kGpuUserAnnotation;
  extreme.raw_category = "";
  timeline.slices.push_back(extreme);

  Slice empty_other;
  empty_other.category = Category::kOther;
  empty_other.raw_category = "other";
  timeline.slices.push_back(empty_other);

  timeline.instants = {{3, 0, 1500, "checkpoint", "user", 'p', {{"step", int64_t{4}}}},
                       {3, 7, 1501, "mark", "", 't', {}}};
  timeline.counters = {{3, 2000, "memory", {{"allocated", 1048576.0}, {"reserved", 0.25}}}};
  Flow flow;
  flow.id = 77;
  flow.from_pid = 3;
  flow.from_tid = 0;
  flow.from_ts_ns = 100;
  flow.to_pid = 3;
  flow.to_tid = 7;
  flow.to_ts_ns = 250;
  timeline.flows = {flow};
  flow.id = 78;
  flow.name = "dep";
  flow.category = "sync";
  timeline.flows.push_back(flow);
  return timeline;
}

TEST(ChromeTraceTest, WriterOutputReadsBackExactly) {
  const std::string path = TempPath("roundtrip.json");
  const Timeline original = MakeTimeline();
  ASSERT_TRUE(WriteChromeTrace(original, path).ok());
  const std::string text = ReadFile(path);
  EXPECT_THAT(text, HasSubstr("\"ts\":1712345678901234.567,\"dur\":12.345"));
  EXPECT_THAT(text, HasSubstr("\"ts\":-0.001,\"dur\":0.999"));
  EXPECT_THAT(text, HasSubstr("\"ts\":-9223372036854775.808"));
  EXPECT_THAT(text, HasSubstr("\"dur\":9223372036854775.807"));
  EXPECT_THAT(text, HasSubstr("\"displayTimeUnit\": \"ns\""));
  EXPECT_THAT(
      text,
      HasSubstr("\"distributedInfo\": {\"backend\": \"nccl\", \"rank\": 3, \"world_size\": 8}"));
  EXPECT_THAT(text, HasSubstr("\"args\":{\"op id\":12,\"External id\":12,\"correlation\":99,"));
  EXPECT_THAT(text, HasSubstr("\"Collective name\":\"all_gather\",\"Process Group Name\":\"0\","
                              "\"dtype\":\"bf16\",\"In msg nelems\":512,\"Out msg nelems\":4096,"
                              "\"Group size\":8,\"Seq\":17,\"Rank\":3"));
  EXPECT_THAT(text, HasSubstr("\"ratio\":3.0"));
  EXPECT_THAT(text,
              HasSubstr("{\"ph\":\"f\",\"cat\":\"ac2g\",\"name\":\"ac2g\",\"pid\":3,\"tid\":7,"
                        "\"id\":77,\"bp\":\"e\",\"ts\":0.250}"));
  EXPECT_THAT(text, HasSubstr("{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":3,\"tid\":7,"
                              "\"args\":{\"sort_index\":7}}"));

  StatusOr<Timeline> read = ReadChromeTraceFile(path);
  ASSERT_TRUE(read.ok()) << read.status().message();
  ExpectSameTimeline(*read, original);
  // The same text parsed from memory.
  StatusOr<Timeline> parsed = ParseChromeTrace(text, "mem");
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  ExpectSameTimeline(*parsed, original);
  std::filesystem::remove(path);
}

TEST(ChromeTraceTest, EscapesStrings) {
  Timeline timeline;
  Slice slice;
  slice.name = std::string("quote\" backslash\\ newline\n tab\t nul") + std::string(1, '\0') +
               "\x01\x1f del\x7f utf8 \xc2\xb5s \xe2\x9c\x93 \xf0\x9f\x9a\x80";
  slice.category = Category::kCpuOp;
  slice.args = {{"key \"with\" quotes", std::string("line1\r\nline2\b\f")}};
  timeline.slices.push_back(slice);
  const std::string path = TempPath("escape.json");
  ASSERT_TRUE(WriteChromeTrace(timeline, path).ok());
  const std::string text = ReadFile(path);
  EXPECT_THAT(text, HasSubstr(R"("quote\" backslash\\ newline\n tab\t nul\u0000\u0001\u001f del)"
                              "\x7f utf8 \xc2\xb5s \xe2\x9c\x93 \xf0\x9f\x9a\x80\""));
  EXPECT_THAT(text, HasSubstr(R"("key \"with\" quotes":"line1\r\nline2\b\f")"));
  StatusOr<Timeline> read = ReadChromeTraceFile(path);
  ASSERT_TRUE(read.ok()) << read.status().message();
  timeline.info.producer = "shardscope";
  ExpectSameTimeline(*read, timeline);

  // Invalid UTF-8 cannot go into JSON: it becomes U+FFFD and the file stays readable.
  timeline.slices[0].name = "bad \xff\xc3 end \xed\xa0\x80";
  ASSERT_TRUE(WriteChromeTrace(timeline, path).ok());
  read = ReadChromeTraceFile(path);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(read->slices[0].name,
            "bad \xef\xbf\xbd\xef\xbf\xbd end \xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
  std::filesystem::remove(path);
}

TEST(ChromeTraceTest, WriterLeavesNoFileWithoutFinish) {
  const std::string path = TempPath("unfinished.json");
  const std::string temp = path + ".tmp." + std::to_string(::getpid());
  {
    StatusOr<std::unique_ptr<ChromeTraceWriter>> writer =
        ChromeTraceWriter::Open(path, TraceInfo{});
    ASSERT_TRUE(writer.ok());
    (*writer)->OnSlice(Slice{});
    EXPECT_TRUE(std::filesystem::exists(temp));
    EXPECT_FALSE(std::filesystem::exists(path));
  }
  EXPECT_FALSE(std::filesystem::exists(temp));
  EXPECT_FALSE(std::filesystem::exists(path));

  StatusOr<std::unique_ptr<ChromeTraceWriter>> writer = ChromeTraceWriter::Open(path, TraceInfo{});
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Finish().ok());
  EXPECT_TRUE((*writer)->Finish().ok());
  (*writer)->OnSlice(Slice{});  // ignored after Finish
  EXPECT_TRUE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(temp));
  StatusOr<Timeline> read = ReadChromeTraceFile(path);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_TRUE(read->slices.empty());
  std::filesystem::remove(path);
}

TEST(ChromeTraceTest, WriterErrors) {
  StatusOr<std::unique_ptr<ChromeTraceWriter>> writer =
      ChromeTraceWriter::Open("/nonexistent-dir/trace.json", TraceInfo{});
  ASSERT_FALSE(writer.ok());
  EXPECT_EQ(writer.status().code(), StatusCode::kIoError);
  TraceInfo info;
  info.extra = {{"traceEvents", int64_t{1}}};
  writer = ChromeTraceWriter::Open(TempPath("reserved.json"), info);
  ASSERT_FALSE(writer.ok());
  EXPECT_THAT(writer.status().message(), HasSubstr("\"traceEvents\" collides"));
  EXPECT_EQ(ReadChromeTraceFile(TempPath("missing.json")).status().code(), StatusCode::kIoError);
}

// What a PyTorch-profiler trace of a DDP step looks like (abridged).
constexpr std::string_view kKinetoTrace = R"({
  "schemaVersion": 1,
  "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85045460992}],
  "distributedInfo": {"backend": "nccl", "rank": 1, "world_size": 2, "pg_count": 1,
                      "pg_config": [{"pg_name": "0", "ranks": [0, 1]}], "nccl_version": "2.20.5"},
  "record_shapes": 1,
  "with_stack": false,
  "traceName": "rank1.pt.trace.json",
  "displayTimeUnit": "ms",
  "baseTimeNanoseconds": 1727000000000000000,
  "traceEvents": [
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 4242, "tid": 4242,
     "ts": 1727000000123456.789, "dur": 35.5,
     "args": {"External id": 17, "Record function id": 0, "Input Dims": [[8, 8], [8, 8]],
              "Input type": ["float", "float"], "Ev Idx": 16}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 4242, "tid": 4242,
     "ts": 1727000000123460, "dur": 4.25, "args": {"External id": 17, "correlation": 301}},
    {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "pid": 1,
     "tid": 7, "ts": 1727000000123500.001, "dur": 150.125,
     "args": {"External id": 18, "queued": 0, "device": 1, "context": 1, "stream": 7,
              "correlation": 305, "registers per thread": 96, "shared memory": 0,
              "blocks per SM": 0.25, "grid": [2, 1, 1], "block": [640, 1, 1],
              "Collective name": "allreduce", "dtype": "BFloat16", "In msg nelems": 1048576,
              "Out msg nelems": 1048576, "Group size": 2, "Process Group Name": "0",
              "Process Group Description": "default_pg", "Seq": 41, "Rank": 1}},
    {"ph": "s", "id": 301, "pid": 4242, "tid": 4242, "ts": 1727000000123460, "cat": "ac2g", "name": "ac2g"},
    {"ph": "f", "id": 301, "pid": 1, "tid": 7, "ts": 1727000000123500.001, "cat": "ac2g", "name": "ac2g", "bp": "e"},
    {"ph": "f", "id": 999, "pid": 1, "tid": 7, "ts": 5, "cat": "ac2g", "name": "ac2g", "bp": "e"},
    {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python 4242"}},
    {"ph": "M", "name": "process_labels", "pid": 1, "tid": 0, "args": {"labels": "GPU 1"}},
    {"ph": "M", "name": "process_sort_index", "pid": 1, "tid": 0, "args": {"sort_index": 5000001}},
    {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "stream 7 "}},
    {"ph": "B", "name": "ignored", "pid": 1, "tid": 1, "ts": 1},
    {"ph": "E", "pid": 1, "tid": 1, "ts": 2},
    {"ph": "i", "cat": "gpu_mem", "name": "[memory]", "pid": "Spans", "tid": "PyTorch Profiler", "ts": 1727000000123999, "s": "t",
     "args": {"Total Reserved": 2097152, "Bytes": -512, "Device Id": 1}},
    {"ph": "C", "name": "GPU 1 memory", "pid": 1, "ts": 1727000000124000, "args": {"allocated": 2048, "note": "x"}}
  ]
})";

TEST(ChromeTraceTest, ReadsAKinetoTrace) {
  StatusOr<Timeline> read = ParseChromeTrace(kKinetoTrace, "rank1.json");
  ASSERT_TRUE(read.ok()) << read.status().message();
  const Timeline& t = *read;
  EXPECT_EQ(t.info.backend, "nccl");
  EXPECT_EQ(t.info.rank, 1);
  EXPECT_EQ(t.info.world_size, 2);
  EXPECT_EQ(t.info.base_time_ns, 1727000000000000000);
  EXPECT_EQ(t.info.producer, "");
  ASSERT_EQ(t.info.extra.size(), 3u);
  EXPECT_EQ(t.info.extra[0].key, "record_shapes");
  EXPECT_EQ(std::get<int64_t>(t.info.extra[1].value), 0);  // with_stack: false
  EXPECT_EQ(std::get<std::string>(t.info.extra[2].value), "rank1.pt.trace.json");

  ASSERT_EQ(t.slices.size(), 3u);
  const Slice& mm = t.slices[0];
  EXPECT_EQ(mm.category, Category::kCpuOp);
  EXPECT_EQ(mm.ts_ns, 1727000000123456789);
  EXPECT_EQ(mm.dur_ns, 35500);
  EXPECT_EQ(mm.op_id, -1);
  ASSERT_EQ(mm.args.size(), 3u);  // the arrays are skipped
  EXPECT_EQ(mm.args[0].key, "External id");
  EXPECT_EQ(std::get<int64_t>(mm.args[0].value), 17);
  EXPECT_EQ(mm.args[2].key, "Ev Idx");

  const Slice& launch = t.slices[1];
  EXPECT_EQ(launch.category, Category::kCudaRuntime);
  EXPECT_EQ(launch.ts_ns, 1727000000123460000);
  EXPECT_EQ(launch.correlation, 301);

  const Slice& kernel = t.slices[2];
  EXPECT_EQ(kernel.category, Category::kKernel);
  EXPECT_EQ(kernel.pid, 1);
  EXPECT_EQ(kernel.tid, 7);
  EXPECT_EQ(kernel.ts_ns, 1727000000123500001);
  EXPECT_EQ(kernel.dur_ns, 150125);
  EXPECT_EQ(kernel.correlation, 305);
  ASSERT_TRUE(kernel.collective.has_value());
  EXPECT_EQ(kernel.collective->collective_name, "allreduce");
  EXPECT_EQ(kernel.collective->process_group, "0");
  EXPECT_EQ(kernel.collective->dtype, "BFloat16");
  EXPECT_EQ(kernel.collective->in_nelems, 1048576);
  EXPECT_EQ(kernel.collective->out_nelems, 1048576);
  EXPECT_EQ(kernel.collective->group_size, 2);
  EXPECT_EQ(kernel.collective->seq, 41);
  EXPECT_EQ(kernel.collective->rank, 1);
  bool saw_blocks_per_sm = false, saw_description = false;
  for (const Arg& arg : kernel.args) {
    EXPECT_NE(arg.key, "Collective name");
    EXPECT_NE(arg.key, "Seq");
    if (arg.key == "blocks per SM") saw_blocks_per_sm = std::get<double>(arg.value) == 0.25;
    if (arg.key == "Process Group Description") saw_description = true;
  }
  EXPECT_TRUE(saw_blocks_per_sm);
  EXPECT_TRUE(saw_description);

  ASSERT_EQ(t.flows.size(), 1u);  // the "f" without an "s" is dropped
  EXPECT_EQ(t.flows[0].id, 301);
  EXPECT_EQ(t.flows[0].from_pid, 4242);
  EXPECT_EQ(t.flows[0].to_tid, 7);
  EXPECT_EQ(t.flows[0].to_ts_ns, 1727000000123500001);

  ASSERT_EQ(t.processes.size(), 1u);
  EXPECT_EQ(t.processes[0].name, "python 4242");
  EXPECT_EQ(t.processes[0].sort_index, 5000001);
  ASSERT_EQ(t.threads.size(), 1u);
  EXPECT_EQ(t.threads[0].name, "stream 7 ");

  ASSERT_EQ(t.instants.size(), 1u);
  EXPECT_EQ(t.instants[0].pid, -1);  // "Spans": a synthetic id
  EXPECT_EQ(t.instants[0].tid, -2);
  EXPECT_EQ(t.instants[0].category, "gpu_mem");
  EXPECT_EQ(t.instants[0].args.size(), 3u);

  ASSERT_EQ(t.counters.size(), 1u);
  ASSERT_EQ(t.counters[0].values.size(), 1u);
  EXPECT_EQ(t.counters[0].values[0].second, 2048.0);
}

TEST(ChromeTraceTest, ReadsBareArraysAndConvertsMicrosecondsExactly) {
  StatusOr<Timeline> read = ParseChromeTrace(R"([
    {"ph": "X", "name": "a", "ts": 1.0005, "dur": 2},
    {"ph": "X", "name": "b", "ts": -1.0005, "dur": 1e3},
    {"ph": "X", "name": "c", "ts": 0.0004999, "dur": 12.3456789e2},
    {"ph": "X", "name": "d", "ts": 9223372036854775.807, "dur": 0.000000001},
    {"ph": "X", "name": "e", "ts": 18446744073709551615e-6, "cat": "weird"},
    {"ph": "X", "name": "f", "ts": 0.0005, "dur": 1234567890123456789012e-6},
    {"ph": "X", "name": "g", "ts": -0.0, "dur": 0.00049999999999999999999999999999}
  ])",
                                             "bare.json");
  ASSERT_TRUE(read.ok()) << read.status().message();
  ASSERT_EQ(read->slices.size(), 7u);
  EXPECT_EQ(read->slices[0].ts_ns, 1001);  // half away from zero
  EXPECT_EQ(read->slices[0].dur_ns, 2000);
  EXPECT_EQ(read->slices[1].ts_ns, -1001);
  EXPECT_EQ(read->slices[1].dur_ns, 1'000'000);
  EXPECT_EQ(read->slices[2].ts_ns, 0);
  EXPECT_EQ(read->slices[2].dur_ns, 1'234'568);
  EXPECT_EQ(read->slices[3].ts_ns, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(read->slices[3].dur_ns, 0);
  EXPECT_EQ(read->slices[4].ts_ns, 18446744073709552);
  EXPECT_EQ(read->slices[4].category, Category::kOther);
  EXPECT_EQ(read->slices[4].raw_category, "weird");
  EXPECT_EQ(read->slices[5].ts_ns, 1);
  EXPECT_EQ(read->slices[5].dur_ns, 1234567890123456789);
  EXPECT_EQ(read->slices[6].ts_ns, 0);
  EXPECT_EQ(read->slices[6].dur_ns, 0);
  EXPECT_EQ(read->info.producer, "");
}

TEST(ChromeTraceTest, BadEventsNameTheirPath) {
  const auto error_of = [](std::string_view text) {
    StatusOr<Timeline> read = ParseChromeTrace(text, "t.json");
    EXPECT_FALSE(read.ok());
    EXPECT_EQ(read.status().code(), StatusCode::kInvalidInput);
    return read.status().message();
  };
  EXPECT_EQ(error_of(R"({"traceEvents": [{"ph": "X", "ts": 1}, {"ph": "X", "ts": "soon"}]})"),
            "t.json: /traceEvents/1/ts: expected a number (microseconds), got \"soon\"");
  EXPECT_EQ(error_of(R"([{"ph": "i"}])"), "t.json: /0: missing \"ts\"");
  EXPECT_EQ(error_of(R"({"traceEvents": [{"ts": 1}]})"), "t.json: /traceEvents/0: missing \"ph\"");
  EXPECT_EQ(error_of(R"({"traceEvents": [{"ph": "X", "ts": 1e300}]})"),
            "t.json: /traceEvents/0/ts: 1e300 us does not fit in int64 nanoseconds");
  // A Kineto event with dur -5 once passed into import's output: a span must not end before it
  // starts, nor after the last int64 nanosecond.
  EXPECT_EQ(error_of(R"({"traceEvents": [{"ph": "X", "ts": 10, "dur": -5, "name": "k"}]})"),
            "t.json: /traceEvents/0/dur: expected a duration >= 0 us, got -5");
  EXPECT_EQ(error_of(R"({"traceEvents": [{"ph": "X", "ts": 9223372036854775, "dur": 9223372036854775}]})"),
            "t.json: /traceEvents/0/dur: ts + dur does not fit in int64 nanoseconds");
  // The fast path for our own writer's layout hands a negative duration to the general one.
  EXPECT_EQ(error_of("{\"traceEvents\":[\n{\"ph\":\"X\",\"cat\":\"kernel\",\"name\":\"k\",\"pid\":0,\"tid\":1,"
                     "\"ts\":1.000,\"dur\":-5.000,\"args\":{}}\n]}\n"),
            "t.json: /traceEvents/0/dur: expected a duration >= 0 us, got -5.000");
  EXPECT_EQ(error_of(R"({"traceEvents": [3]})"),
            "t.json: /traceEvents/0: expected an event object, got 3");
  EXPECT_EQ(error_of(R"({"traceEvents": {}})"),
            "t.json: /traceEvents: expected an array of events, got an object");
  EXPECT_EQ(error_of(R"({"events": []})"),
            "t.json: expected a \"traceEvents\" array in the top-level object");
  EXPECT_EQ(error_of(R"("trace")"),
            "t.json: expected an object with \"traceEvents\" or an array of events, got \"trace\"");
  EXPECT_EQ(error_of(R"({"distributedInfo": {"rank": "one"}, "traceEvents": []})"),
            "t.json: /distributedInfo/rank: expected a 32-bit integer, got \"one\"");
  EXPECT_THAT(error_of("[{\"args\": " + std::string(600, '[') + std::string(600, ']') + "}]"),
              HasSubstr("nested deeper than 512 levels"));
}

TEST(ChromeTraceTest, TruncatedOrGarbageInputGivesLineAndColumn) {
  const auto error_of = [](std::string_view text) {
    StatusOr<Timeline> read = ParseChromeTrace(text, "t.json");
    EXPECT_FALSE(read.ok());
    EXPECT_EQ(read.status().code(), StatusCode::kInvalidInput);
    return read.status().message();
  };
  EXPECT_THAT(error_of("{\"traceEvents\": [\n  {\"ph\": \"X\",\n   \"ts\": }"),
              StartsWith("t.json:3:10: invalid JSON: "));
  EXPECT_THAT(error_of(""), StartsWith("t.json:1:1: invalid JSON: "));
  EXPECT_THAT(error_of("\x89PNG\r\n\x1a\n"), StartsWith("t.json:1:1: invalid JSON: "));
  EXPECT_THAT(error_of("[{\"ph\": \"X\", \"ts\": 1e400}]"), StartsWith("t.json:1:"));

  for (size_t length = 0; length + 1 < kKinetoTrace.size(); length += 3) {
    StatusOr<Timeline> read = ParseChromeTrace(kKinetoTrace.substr(0, length), "t.json");
    ASSERT_FALSE(read.ok()) << length;
    EXPECT_THAT(read.status().message(), MatchesRegex("t\\.json:[0-9]+:[0-9]+: invalid JSON: .*"))
        << length;
  }

  const std::string path = TempPath("truncated.json");
  {
    std::ofstream out(path);
    out << "{\"traceEvents\": [\n\n  {\"ph\": \"X\", \"ts\": 1,";
  }
  StatusOr<Timeline> read = ReadChromeTraceFile(path);
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(read.status().message(), StartsWith(path + ":3:"));
  std::filesystem::remove(path);
}

TEST(ChromeTraceTest, CategoryNames) {
  for (int c = 0; c <= static_cast<int>(Category::kOther); ++c) {
    const auto category = static_cast<Category>(c);
    if (category == Category::kOther) {
      EXPECT_EQ(ParseCategory(CategoryName(category)), Category::kOther);
    } else {
      EXPECT_EQ(ParseCategory(CategoryName(category)), category) << CategoryName(category);
    }
  }
  EXPECT_EQ(CategoryName(Category::kGpuMemcpy), "gpu_memcpy");
  EXPECT_EQ(ParseCategory("python_function"), Category::kOther);
}

// The fuzzers' seeds are valid inputs; inputs that once crashed a reader must now give a
// result or InvalidInput.
TEST(ChromeTraceTest, FuzzSeedsParseAndRegressionsDoNotCrash) {
  const std::filesystem::path root(SHARDSCOPE_SOURCE_DIR);
  size_t seeds = 0;
  for (const auto& entry : std::filesystem::directory_iterator(root / "fuzz/corpus/trace")) {
    StatusOr<Timeline> read = ReadChromeTraceFile(entry.path().string());
    EXPECT_TRUE(read.ok()) << read.status().message();
    ++seeds;
  }
  EXPECT_GE(seeds, 2u);
  for (const auto& entry : std::filesystem::directory_iterator(root / "tests/regressions/trace")) {
    if (entry.path().filename() == "README.md") continue;
    StatusOr<Timeline> read = ReadChromeTraceFile(entry.path().string());
    if (!read.ok()) {
      EXPECT_EQ(read.status().code(), StatusCode::kInvalidInput) << entry.path();
    }
  }
}

}  // namespace
}  // namespace shardscope::traces

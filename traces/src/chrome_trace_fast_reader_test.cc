// The fast reader for ChromeTraceWriter's layout must give exactly what the SAX reader gives,
// and must hand everything else to it.
#include "chrome_trace_fast_reader.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "shardscope/traces/chrome_trace.h"

namespace shardscope::traces {
namespace {

using trace_internal::ParseWithSax;
using trace_internal::ParseWriterLayout;
using trace_internal::ReadWriterLayoutFile;

std::string TempPath(std::string_view name) {
  return ::testing::TempDir() + "/fast_reader_test_" + std::to_string(::getpid()) + "_" + std::string(name);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void WriteFile(const std::string& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
}

std::string WrittenText(const Timeline& timeline, std::string_view name) {
  const std::string path = TempPath(name);
  EXPECT_TRUE(WriteChromeTrace(timeline, path).ok());
  std::string text = ReadFile(path);
  std::filesystem::remove(path);
  return text;
}

// Every field, with a message naming the first difference.
::testing::AssertionResult SameTimeline(const Timeline& a, const Timeline& b) {
  if (!(a.info == b.info)) return ::testing::AssertionFailure() << "info differs";
  if (!(a.processes == b.processes)) return ::testing::AssertionFailure() << "processes differ";
  if (!(a.threads == b.threads)) return ::testing::AssertionFailure() << "threads differ";
  if (a.slices.size() != b.slices.size()) {
    return ::testing::AssertionFailure() << a.slices.size() << " vs " << b.slices.size() << " slices";
  }
  for (size_t i = 0; i < a.slices.size(); ++i) {
    if (!(a.slices[i] == b.slices[i])) return ::testing::AssertionFailure() << "slice " << i << " differs";
  }
  if (!(a.instants == b.instants)) return ::testing::AssertionFailure() << "instants differ";
  if (a.counters.size() != b.counters.size()) return ::testing::AssertionFailure() << "counter count differs";
  for (size_t i = 0; i < a.counters.size(); ++i) {
    // Compared bit for bit: the doubles must be the very same values.
    const auto& x = a.counters[i];
    const auto& y = b.counters[i];
    bool same = x.pid == y.pid && x.ts_ns == y.ts_ns && x.name == y.name && x.values.size() == y.values.size();
    for (size_t k = 0; same && k < x.values.size(); ++k) {
      same = x.values[k].first == y.values[k].first &&
             std::memcmp(&x.values[k].second, &y.values[k].second, sizeof(double)) == 0;
    }
    if (!same) return ::testing::AssertionFailure() << "counter " << i << " differs";
  }
  if (!(a.flows == b.flows)) return ::testing::AssertionFailure() << "flows differ";
  return ::testing::AssertionSuccess();
}

// Everything the writer can produce: escapes, non-ASCII, extreme times, doubles of every
// kind (NaN is written as null and dropped), collectives, instants, counters, flows.
Timeline Varied() {
  Timeline t;
  t.info.rank = 3;
  t.info.world_size = 8;
  t.info.base_time_ns = 1'712'345'678'901'234'567;
  t.info.producer = "shardscope simulate";
  t.info.extra = {{"plan", std::string("fsdp.yaml")}, {"seed", int64_t{42}}, {"scale", 0.5}};
  t.processes = {{3, "rank 3 \"ü\"", 3}, {-7, "neg", -1}};
  t.threads = {{3, 0, "host\tthread", 0}, {3, 7, "stream 7 \\ compute", 7}};
  Slice gemm;
  gemm.pid = 3;
  gemm.tid = 7;
  gemm.ts_ns = 1'712'345'678'901'234'567;
  gemm.dur_ns = 12'345;
  gemm.name = "void gemm<float, 128>(T*) \x01 \xe2\x82\xac \xf0\x9f\x98\x80 bad:\xff";
  gemm.category = Category::kKernel;
  gemm.op_id = 12;
  gemm.correlation = 99;
  gemm.args = {{"grid", std::string("[128, 1, 1]")}, {"flops", 1.5e12},      {"registers", int64_t{96}},
               {"ratio", 3.0},                       {"tiny", -2.5e-300},    {"third", 1.0 / 3.0},
               {"nan", std::nan("")},                {"big", 1.7976931348623157e308},
               {"min int", std::numeric_limits<int64_t>::min()}};
  t.slices.push_back(gemm);
  Slice nccl;
  nccl.pid = 3;
  nccl.tid = 9;
  nccl.ts_ns = -1;
  nccl.dur_ns = 999;
  nccl.name = "ncclDevKernel_AllGather_RING_LL";
  nccl.category = Category::kKernel;
  nccl.op_id = 0;
  nccl.collective = CollectiveInfo{"all_gather", "dp_shard.1", "bf16", 512, 4096, 8, 17, 3};
  nccl.args = {{"algorithm", std::string("Ring")}};
  t.slices.push_back(nccl);
  Slice other;
  other.dur_ns = std::numeric_limits<int64_t>::max();
  other.category = Category::kOther;
  other.raw_category = "python_function";
  other.args = {{"External id", int64_t{5}}};
  t.slices.push_back(other);
  Slice extreme;
  extreme.ts_ns = std::numeric_limits<int64_t>::min();
  extreme.dur_ns = 1;
  extreme.category = Category::kGpuUserAnnotation;
  t.slices.push_back(extreme);
  t.instants = {{3, 0, 1500, "checkpoint", "user", 'p', {{"step", int64_t{4}}}}, {3, 7, 1501, "mark", "", 't', {}}};
  t.counters = {{3, 2000, "memory", {{"allocated", 1048576.0}, {"reserved", 0.25}, {"inf", INFINITY}}}};
  Flow flow;
  flow.id = 77;
  flow.from_pid = 3;
  flow.from_ts_ns = 100;
  flow.to_pid = 3;
  flow.to_tid = 7;
  flow.to_ts_ns = 250;
  t.flows = {flow};
  return t;
}

// The word-at-a-time scan must stop at exactly the first byte that is not plain, wherever
// it sits in the word, and at nothing else.
TEST(ChromeTraceFastReaderTest, PlainRunStopsAtTheFirstSpecialByte) {
  for (const char special : {'"', '\\', '\x00', '\x1f', '\n', '\x80', '\xc3', '\xff'}) {
    for (size_t at = 0; at < 20; ++at) {
      std::string text(20, 'a');
      text[at] = special;
      if (at + 1 < text.size()) text[at + 1] = ' ';  // and plain neighbours: ' ', '~', '!'
      if (at > 0) text[at - 1] = '~';
      EXPECT_EQ(trace_internal::PlainRunLength(text.data(), text.size()), at) << int(special) << " at " << at;
    }
  }
  const std::string plain = " !#$%&'()*+,-./09:;<=>?@AZ[]^_`az{|}~\x7f";
  EXPECT_EQ(trace_internal::PlainRunLength(plain.data(), plain.size()), plain.size());
}

TEST(ChromeTraceFastReaderTest, ReadsTheWritersLayoutLikeTheSaxReader) {
  const std::string text = WrittenText(Varied(), "varied.json");
  std::optional<Timeline> fast = ParseWriterLayout(text);
  ASSERT_TRUE(fast.has_value()) << "the writer's own output must take the fast path";
  StatusOr<Timeline> sax = ParseWithSax(text, "varied");
  ASSERT_TRUE(sax.ok()) << sax.status().message();
  EXPECT_TRUE(SameTimeline(*fast, *sax));
  // Spot checks computed by hand, so that a bug shared by both paths still shows.
  EXPECT_EQ(fast->slices[0].ts_ns, 1'712'345'678'901'234'567);
  EXPECT_EQ(fast->slices[0].name, "void gemm<float, 128>(T*) \x01 \xe2\x82\xac \xf0\x9f\x98\x80 bad:\xef\xbf\xbd");
  EXPECT_EQ(fast->slices[0].args.size(), 8u);  // NaN was written as null and dropped
  EXPECT_EQ(fast->slices[1].collective->process_group, "dp_shard.1");
  EXPECT_EQ(fast->processes[0].name, "rank 3 \"ü\"");
  ASSERT_EQ(fast->counters[0].values.size(), 2u);  // the infinity too
  EXPECT_EQ(fast->info.extra.size(), 3u);
  EXPECT_EQ(fast->flows.size(), 1u);
  // Every slice line the writer wrote takes the direct route (ScanWriterSlice), and gives
  // the slice that was written.
  size_t slice_lines = 0;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    std::string_view line(text.data() + start, end - start);
    start = end + 1;
    if (!line.starts_with(R"({"ph":"X")")) continue;
    if (line.ends_with(',')) line.remove_suffix(1);
    Slice slice;
    ASSERT_TRUE(trace_internal::ScanWriterSlice(line, slice)) << line;
    EXPECT_TRUE(slice == sax->slices[slice_lines]) << line;
    ++slice_lines;
  }
  EXPECT_EQ(slice_lines, sax->slices.size());
  // The file path (a block at a time) gives the same.
  const std::string path = TempPath("varied_file.json");
  WriteFile(path, text);
  std::optional<Timeline> from_file = ReadWriterLayoutFile(path);
  ASSERT_TRUE(from_file.has_value());
  EXPECT_TRUE(SameTimeline(*from_file, *sax));
  std::filesystem::remove(path);
}

TEST(ChromeTraceFastReaderTest, EmptyTraceAndLinesAcrossReadBlocks) {
  Timeline empty;
  const std::string empty_text = WrittenText(empty, "empty.json");
  std::optional<Timeline> fast = ParseWriterLayout(empty_text);
  ASSERT_TRUE(fast.has_value());
  EXPECT_TRUE(SameTimeline(*fast, *ParseWithSax(empty_text, "empty")));

  // ~4 MB of events (the file reader's block is 1 MiB) and one name longer than a block.
  Timeline big;
  for (int64_t i = 0; i < 30'000; ++i) {
    Slice s;
    s.pid = static_cast<int32_t>(i % 4);
    s.tid = 1;
    s.ts_ns = i * 1'001;
    s.dur_ns = 999;
    s.name = i == 17'000 ? std::string(size_t{3} << 20, 'x') : "kernel_" + std::to_string(i % 13);
    s.category = Category::kKernel;
    s.op_id = i;
    big.slices.push_back(std::move(s));
  }
  const std::string path = TempPath("big.json");
  ASSERT_TRUE(WriteChromeTrace(big, path).ok());
  std::optional<Timeline> from_file = ReadWriterLayoutFile(path);
  ASSERT_TRUE(from_file.has_value());
  StatusOr<Timeline> sax = ParseWithSax(ReadFile(path), "big");
  ASSERT_TRUE(sax.ok());
  EXPECT_TRUE(SameTimeline(*from_file, *sax));
  EXPECT_EQ(from_file->slices[29'999].ts_ns, 29'999 * 1'001);
  std::filesystem::remove(path);
}

TEST(ChromeTraceFastReaderTest, OtherLayoutsGoToTheSaxReader) {
  const std::filesystem::path root(SHARDSCOPE_SOURCE_DIR);
  // A PyTorch-profiler trace (pretty-printed): not ours.
  const std::string kineto = ReadFile((root / "tests/fixtures/kineto/rank0.pt.trace.json").string());
  EXPECT_FALSE(ParseWriterLayout(kineto).has_value());
  StatusOr<Timeline> via_public = ParseChromeTrace(kineto, "kineto");
  StatusOr<Timeline> sax = ParseWithSax(kineto, "kineto");
  ASSERT_TRUE(via_public.ok() && sax.ok());
  EXPECT_TRUE(SameTimeline(*via_public, *sax));
  // A bare array, whitespace inside an event, a boolean arg: not ours either.
  for (std::string_view text : {std::string_view(R"([{"ph":"X","ts":1,"dur":2}])"),
                                std::string_view("{\n  \"traceEvents\": [\n{\"ph\": \"X\",\"ts\":1}\n]}\n"),
                                std::string_view("{\n  \"traceEvents\": [\n{\"ph\":\"X\",\"ts\":1,\"args\":{\"b\":true}}\n]}\n")}) {
    EXPECT_FALSE(ParseWriterLayout(text).has_value()) << text;
    EXPECT_TRUE(ParseChromeTrace(text, "t").ok()) << text;
  }
  // Our layout with a bad event: the fast path declines, the SAX reader names the problem.
  const std::string bad = "{\n  \"traceEvents\": [\n{\"ph\":\"X\",\"name\":\"a\",\"pid\":0,\"tid\":0}\n]}\n";
  EXPECT_FALSE(ParseWriterLayout(bad).has_value());
  StatusOr<Timeline> error = ParseChromeTrace(bad, "bad.json");
  ASSERT_FALSE(error.ok());
  EXPECT_EQ(error.status().message(), "bad.json: /traceEvents/0: missing \"ts\"");
}

// The golden traces, and thousands of variants of one with a byte replaced, removed or
// inserted, or a line repeated: whenever the fast path accepts a variant, the SAX reader
// must accept it too and give an equal Timeline; whenever the SAX reader rejects one, the
// fast path must decline it (so the user sees the SAX reader's error).
TEST(ChromeTraceFastReaderTest, GoldenTracesAndMutationsAgreeWithTheSaxReader) {
  const std::filesystem::path root(SHARDSCOPE_SOURCE_DIR);
  const std::string golden = ReadFile((root / "tests/golden/tiny-fsdp2-2gpu/trace.json").string());
  ASSERT_FALSE(golden.empty());
  for (const std::string& text : {golden, WrittenText(Varied(), "varied2.json")}) {
    std::optional<Timeline> fast = ParseWriterLayout(text);
    ASSERT_TRUE(fast.has_value());
    StatusOr<Timeline> sax = ParseWithSax(text, "golden");
    ASSERT_TRUE(sax.ok());
    EXPECT_TRUE(SameTimeline(*fast, *sax));
  }
  // Mutations of a small trace in our layout (a prefix of the golden one, closed properly).
  std::string seed = WrittenText(Varied(), "seed.json");
  const size_t golden_lines_end = golden.find('\n', golden.find("\"ph\":\"X\"") + 2000);
  const std::string seed2 = golden.substr(0, golden_lines_end) + "\n]}\n";
  constexpr std::string_view kBytes = "\"\\,{}:[] \n\t0159.-+eEnux\x80\xc3\xa9\xff";
  uint64_t state = 0x9e3779b97f4a7c15ULL;
  const auto next = [&]() {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  int accepted = 0;
  int rejected_by_sax = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text = trial % 2 == 0 ? seed : seed2;
    const size_t at = static_cast<size_t>(next() % text.size());
    switch (next() % 4) {
      case 0: text[at] = kBytes[next() % kBytes.size()]; break;
      case 1: text.erase(at, 1); break;
      case 2: text.insert(at, 1, kBytes[next() % kBytes.size()]); break;
      default: {
        const size_t line_start = text.rfind('\n', at) == std::string::npos ? 0 : text.rfind('\n', at) + 1;
        const size_t line_end = text.find('\n', at);
        if (line_end != std::string::npos) text.insert(line_start, text.substr(line_start, line_end - line_start + 1));
      }
    }
    std::optional<Timeline> fast = ParseWriterLayout(text);
    StatusOr<Timeline> sax = ParseWithSax(text, "mutant");
    if (!sax.ok()) ++rejected_by_sax;
    if (!fast) continue;
    ++accepted;
    ASSERT_TRUE(sax.ok()) << "fast path accepted what the SAX reader rejects (" << sax.status().message()
                          << "):\n" << text;
    ASSERT_TRUE(SameTimeline(*fast, *sax)) << text;
  }
  // Both outcomes must have occurred, or the test proves nothing.
  EXPECT_GT(accepted, 300);
  EXPECT_GT(rejected_by_sax, 300);
}

}  // namespace
}  // namespace shardscope::traces

// Import of the hand-written Kineto fixtures (tests/fixtures/kineto/, README there). Every
// expected value below is worked out from the fixture text, not taken from the output.
#include "shardscope/analysis/import.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "shardscope/base/gzip_stream.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "shardscope/traces/chrome_trace.h"

namespace shardscope::traces {
namespace {

using ::testing::HasSubstr;

const std::string kFixtures = std::string(SHARDSCOPE_SOURCE_DIR) + "/tests/fixtures/kineto/";
const std::string kRank0 = kFixtures + "rank0.pt.trace.json";
const std::string kRank1 = kFixtures + "rank1.pt.trace.json";

// Times in the fixtures: rank 0's base B, its first kept event (ProfilerStep#5) at ts 1000 us;
// rank 1's base B + 200 us and every ts 99.5 us smaller, so its ProfilerStep#5 is at
// B + 200 us + 900.5 us = B + 1100.5 us. The common origin is B + 1000 us (the "Spans" slice
// at ts 990 us sits on a string pid and is dropped, so it does not count).
constexpr int64_t kBase0 = 1700000000000000000;
constexpr int64_t kOrigin = kBase0 + 1'000'000;
constexpr int64_t kRank1Offset = 100'500;  // rank 1's events are this much later on the axis

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/import_test_" + std::to_string(::getpid()) + "_" + name;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

const Slice* FindSlice(const Timeline& t, int32_t pid, std::string_view name_prefix) {
  for (const Slice& s : t.slices) {
    if (s.pid == pid && s.name.rfind(name_prefix, 0) == 0) return &s;
  }
  return nullptr;
}

const Arg* FindArg(const Slice& s, std::string_view key) {
  for (const Arg& a : s.args) {
    if (a.key == key) return &a;
  }
  return nullptr;
}

TEST(ImportPytorch, TwoRanksGetRankPidsStreamTidsAndOneTimeAxis) {
  StatusOr<ImportedTrace> imported = ImportPytorchTraces({kRank1, kRank0});  // order must not matter
  ASSERT_TRUE(imported.ok()) << imported.status().message();
  const Timeline& t = imported->timeline;
  EXPECT_EQ(t.info.world_size, 2);
  EXPECT_EQ(t.info.base_time_ns, kOrigin);
  ASSERT_EQ(imported->ranks.size(), 2u);
  EXPECT_EQ(imported->ranks[0].rank, 0);
  EXPECT_EQ(imported->ranks[0].source, kRank0);
  EXPECT_EQ(imported->ranks[1].rank, 1);
  EXPECT_EQ(imported->ranks[0].shift_ns, -1'000'000);
  EXPECT_EQ(imported->ranks[1].shift_ns, 200'000 - 1'000'000);
  for (const ImportedRank& r : imported->ranks) {
    EXPECT_FALSE(r.rank_from_file_order);
    EXPECT_EQ(r.streams, 2);          // CUDA streams 7 and 13
    EXPECT_EQ(r.host_threads, 2);     // the main thread and the autograd thread
    EXPECT_EQ(r.kernels, 3);          // the GEMM and two NCCL kernels
    EXPECT_EQ(r.collectives, 2);
    EXPECT_EQ(r.dropped_events, 3);   // the "Spans" slice, "Iteration Start", "Record Window End"
  }
  EXPECT_TRUE(imported->warnings.empty()) << imported->warnings.front();

  // Tracks: tid 0 main thread, 1 + k streams in ascending id, then the other host thread.
  ASSERT_EQ(t.processes.size(), 2u);
  EXPECT_EQ(t.processes[1].pid, 1);
  EXPECT_EQ(t.processes[1].name, "rank 1");
  ASSERT_EQ(t.threads.size(), 8u);
  EXPECT_EQ(t.threads[0].name, "host thread (tid 4242)");
  EXPECT_EQ(t.threads[1].name, "stream 0 (CUDA stream 7, device 0)");
  EXPECT_EQ(t.threads[2].name, "stream 1 (CUDA stream 13, device 0)");
  EXPECT_EQ(t.threads[3].name, "host thread (tid 4300)");
  EXPECT_EQ(t.threads[5].name, "stream 0 (CUDA stream 7, device 1)");
  EXPECT_EQ(t.threads[7].tid, 3);

  // 12 kept slices per rank (13 "X" events, one on the "Spans" pid).
  EXPECT_EQ(t.slices.size(), 24u);
  const Slice* step0 = FindSlice(t, 0, "ProfilerStep#5");
  ASSERT_NE(step0, nullptr);
  EXPECT_EQ(step0->tid, 0);
  EXPECT_EQ(step0->ts_ns, 0);
  EXPECT_EQ(step0->dur_ns, 500'000);
  const Slice* gemm1 = FindSlice(t, 1, "sm90_xmma_gemm");
  ASSERT_NE(gemm1, nullptr);
  EXPECT_EQ(gemm1->tid, 1);                         // CUDA stream 7 = stream 0
  EXPECT_EQ(gemm1->ts_ns, 30'125 + kRank1Offset);  // 1030.125 us on rank 0's axis
  EXPECT_EQ(gemm1->dur_ns, 80'500);
  EXPECT_EQ(gemm1->correlation, 100);
  EXPECT_FALSE(gemm1->collective.has_value());
  const Slice* backward = FindSlice(t, 0, "autograd::engine");
  ASSERT_NE(backward, nullptr);
  EXPECT_EQ(backward->tid, 3);
  EXPECT_EQ(backward->ts_ns, 200'000);

  // Steps.
  ASSERT_EQ(imported->steps.size(), 2u);
  EXPECT_EQ(imported->steps[1].rank, 1);
  EXPECT_EQ(imported->steps[1].step, 5);
  EXPECT_EQ(imported->steps[1].start_ns, kRank1Offset);
  EXPECT_EQ(imported->steps[1].end_ns, kRank1Offset + 500'000);
}

TEST(ImportPytorch, NcclKernelsBecomeCollectivesWithSeqFromRecordParamComms) {
  StatusOr<ImportedTrace> imported = ImportPytorchTraces({kRank0, kRank1});
  ASSERT_TRUE(imported.ok()) << imported.status().message();
  const Timeline& t = imported->timeline;
  for (int32_t rank : {0, 1}) {
    const Slice* ag = FindSlice(t, rank, "ncclDevKernel_AllGather");
    ASSERT_NE(ag, nullptr);
    EXPECT_EQ(ag->tid, 2);  // CUDA stream 13
    EXPECT_EQ(ag->category, Category::kKernel);
    ASSERT_TRUE(ag->collective.has_value());
    EXPECT_EQ(ag->collective->collective_name, "all_gather");
    EXPECT_EQ(ag->collective->process_group, "0");
    EXPECT_EQ(ag->collective->dtype, "BFloat16");
    EXPECT_EQ(ag->collective->in_nelems, 1024);
    EXPECT_EQ(ag->collective->out_nelems, 2048);
    EXPECT_EQ(ag->collective->group_size, 2);
    EXPECT_EQ(ag->collective->seq, 1);   // only on record_param_comms, joined by External id 11
    EXPECT_EQ(ag->collective->rank, rank);
    const Arg* original = FindArg(*ag, "torch collective");
    ASSERT_NE(original, nullptr);
    EXPECT_EQ(std::get<std::string>(original->value), "_allgather_base");
    const Arg* ranks = FindArg(*ag, "Process Group Ranks");
    ASSERT_NE(ranks, nullptr);
    EXPECT_EQ(std::get<std::string>(ranks->value), "[0, 1]");
    const Arg* group_rank = FindArg(*ag, "group rank");
    ASSERT_NE(group_rank, nullptr);
    EXPECT_EQ(std::get<int64_t>(group_rank->value), rank);

    const Slice* rs = FindSlice(t, rank, "ncclDevKernel_ReduceScatter");
    ASSERT_NE(rs, nullptr);
    ASSERT_TRUE(rs->collective.has_value());
    EXPECT_EQ(rs->collective->collective_name, "reduce_scatter");
    EXPECT_EQ(rs->collective->seq, 2);
    EXPECT_EQ(rs->ts_ns, 260'000 + (rank == 1 ? kRank1Offset : 0));
  }
  // Launch -> kernel flows keep their ends, with rank-unique ids.
  ASSERT_EQ(t.flows.size(), 4u);
  const Flow* rank1_gemm_flow = nullptr;
  for (const Flow& f : t.flows) {
    if (f.id == ((int64_t{1} << 32) | 100)) rank1_gemm_flow = &f;
  }
  ASSERT_NE(rank1_gemm_flow, nullptr);
  EXPECT_EQ(rank1_gemm_flow->from_pid, 1);
  EXPECT_EQ(rank1_gemm_flow->from_tid, 0);
  EXPECT_EQ(rank1_gemm_flow->from_ts_ns, 15'500 + kRank1Offset);
  EXPECT_EQ(rank1_gemm_flow->to_tid, 1);
  EXPECT_EQ(rank1_gemm_flow->to_ts_ns, 30'125 + kRank1Offset);
}

TEST(ImportPytorch, WrittenTraceReadsBackEqual) {
  StatusOr<ImportedTrace> imported = ImportPytorchTraces({kRank0, kRank1});
  ASSERT_TRUE(imported.ok()) << imported.status().message();
  const std::string path = TempPath("roundtrip.json");
  ASSERT_TRUE(WriteChromeTrace(imported->timeline, path).ok());
  StatusOr<Timeline> back = ReadChromeTraceFile(path);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_TRUE(back->slices == imported->timeline.slices);
  EXPECT_TRUE(back->threads == imported->timeline.threads);
  EXPECT_TRUE(back->flows == imported->timeline.flows);
  // Deterministic: the same inputs give the same bytes.
  const std::string again = TempPath("roundtrip2.json");
  StatusOr<ImportedTrace> second = ImportPytorchTraces({kRank0, kRank1});
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE(WriteChromeTrace(second->timeline, again).ok());
  EXPECT_EQ(ReadText(path), ReadText(again));
  std::remove(path.c_str());
  std::remove(again.c_str());
}

TEST(ImportPytorch, SummaryNamesRanksStreamsAndGroups) {
  StatusOr<ImportedTrace> imported = ImportPytorchTraces({kRank0, kRank1});
  ASSERT_TRUE(imported.ok());
  const std::string text = ImportSummaryText(*imported);
  EXPECT_THAT(text, HasSubstr("2 rank(s), world size 2"));
  EXPECT_THAT(text, HasSubstr("rank 1: 2 stream(s), 2 host thread(s), 3 kernel(s) of which 2 collective(s)"));
  EXPECT_THAT(text, HasSubstr("group '0': size 2, ranks [0, 1], seen on 2 rank(s): all_gather 2, reduce_scatter 2"));
  EXPECT_THAT(text, HasSubstr("step 5: 600.5 us"));  // 0 .. 100.5 us + 500 us
}

TEST(ImportPytorch, WithoutDistributedInfoTheRankComesFromTheDefaultGroupOrTheFileOrder) {
  std::string text = ReadText(kRank1);
  const size_t begin = text.find("\"distributedInfo\"");
  const size_t end = text.find('\n', begin);
  ASSERT_NE(begin, std::string::npos);
  text.erase(begin, end - begin + 1);
  // The default_pg collectives still say "Rank": 1 (Kineto's own fallback).
  StatusOr<Timeline> with_group = ParseChromeTrace(text, "no_dist_info.json");
  ASSERT_TRUE(with_group.ok()) << with_group.status().message();
  StatusOr<Timeline> rank0 = ReadChromeTraceFile(kRank0);
  ASSERT_TRUE(rank0.ok());
  StatusOr<ImportedTrace> imported =
      ImportPytorchTimelines({{"no_dist_info.json", *with_group}, {kRank0, *rank0}});
  ASSERT_TRUE(imported.ok()) << imported.status().message();
  EXPECT_EQ(imported->ranks[1].source, "no_dist_info.json");
  EXPECT_FALSE(imported->ranks[1].rank_from_file_order);

  // Without the default group's description either: the position in the list decides.
  std::string bare = text;
  for (size_t at; (at = bare.find("default_pg")) != std::string::npos;) bare.replace(at, 10, "custom_pg");
  StatusOr<Timeline> anonymous = ParseChromeTrace(bare, "anonymous.json");
  ASSERT_TRUE(anonymous.ok());
  StatusOr<ImportedTrace> by_order = ImportPytorchTimelines({{kRank0, *rank0}, {"anonymous.json", *anonymous}});
  ASSERT_TRUE(by_order.ok()) << by_order.status().message();
  EXPECT_TRUE(by_order->ranks[1].rank_from_file_order);
  EXPECT_EQ(by_order->ranks[1].rank, 1);
  ASSERT_EQ(by_order->warnings.size(), 1u);
  EXPECT_THAT(by_order->warnings[0], HasSubstr("anonymous.json: no distributedInfo.rank"));
}

TEST(ImportPytorch, BadInputsAreErrorsNamingTheFile) {
  // Two files claiming rank 0.
  StatusOr<ImportedTrace> twice = ImportPytorchTraces({kRank0, kRank0});
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(twice.status().message(), HasSubstr("rank 0 is already given by " + kRank0));

  // Corrupt gzip (a header cut short): an error naming the file and what went wrong.
  const std::string gz = TempPath("rank0.pt.trace.json.gz");
  WriteText(gz, std::string("\x1f\x8b\x08\x00", 4));
  StatusOr<ImportedTrace> compressed = ImportPytorchTraces({gz});
  ASSERT_FALSE(compressed.ok());
  EXPECT_EQ(compressed.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(compressed.status().message(), HasSubstr(gz + ": truncated gzip data"));

  // Not JSON: the reader's line:column, under the file's name.
  const std::string broken = TempPath("broken.json");
  WriteText(broken, "{\"traceEvents\": [\n  {\"ph\": \"X\",, }\n]}");
  StatusOr<ImportedTrace> syntax = ImportPytorchTraces({kRank0, broken});
  ASSERT_FALSE(syntax.ok());
  EXPECT_THAT(syntax.status().message(), HasSubstr(broken + ":2:"));

  // Missing file.
  StatusOr<ImportedTrace> missing = ImportPytorchTraces({TempPath("absent.json")});
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("absent.json"));

  // Rank outside world_size.
  std::string text = ReadText(kRank1);
  const size_t at = text.find("\"rank\": 1");
  text.replace(at, 9, "\"rank\": 5");
  const std::string out_of_range = TempPath("rank5.json");
  WriteText(out_of_range, text);
  StatusOr<ImportedTrace> bad_rank = ImportPytorchTraces({out_of_range});
  ASSERT_FALSE(bad_rank.ok());
  EXPECT_THAT(bad_rank.status().message(), HasSubstr(out_of_range + ": /distributedInfo/rank"));

  StatusOr<ImportedTrace> none = ImportPytorchTraces({});
  EXPECT_FALSE(none.ok());
  for (const std::string& p : {gz, broken, out_of_range}) std::remove(p.c_str());
}

TEST(ImportPytorch, NcclKernelWithoutArgsIsStillACollectiveAndWarnsAboutSeq) {
  const std::string text = R"({"traceEvents": [
    {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float", "pid": 0, "tid": 20,
     "ts": 5.000, "dur": 2.500, "args": {"correlation": 7}}]})";
  StatusOr<Timeline> raw = ParseChromeTrace(text, "old.json");
  ASSERT_TRUE(raw.ok());
  StatusOr<ImportedTrace> imported = ImportPytorchTimelines({{"old.json", *raw}});
  ASSERT_TRUE(imported.ok()) << imported.status().message();
  const Slice& s = imported->timeline.slices.at(0);
  EXPECT_EQ(s.tid, 1);
  EXPECT_EQ(s.ts_ns, 0);  // the only event is the origin
  ASSERT_TRUE(s.collective.has_value());
  EXPECT_EQ(s.collective->collective_name, "all_reduce");
  EXPECT_EQ(s.collective->seq, 1);  // numbered by order: the group's first collective
  ASSERT_EQ(imported->warnings.size(), 1u);
  EXPECT_THAT(imported->warnings[0], HasSubstr("old.json: 1 collective kernel(s) carry no \"Seq\""));
}

TEST(ImportPytorch, CollectivesWithoutSeqAreNumberedByOrderPerProcessGroup) {
  // Group "0": kernels at 1, 3 and 9 us (on two streams); group "7": one at 5 us. Start order
  // within each group gives 1, 2, 3 and 1.
  const std::string text = R"({"distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2}, "traceEvents": [
    {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce", "pid": 0, "tid": 20, "ts": 9, "dur": 1,
     "args": {"Process Group Name": "0", "Collective name": "allreduce"}},
    {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllGather", "pid": 0, "tid": 21, "ts": 3, "dur": 1,
     "args": {"Process Group Name": "0", "Collective name": "_allgather_base"}},
    {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce", "pid": 0, "tid": 20, "ts": 1, "dur": 1,
     "args": {"Process Group Name": "0", "Collective name": "allreduce"}},
    {"ph": "X", "cat": "kernel", "name": "ncclKernel_Broadcast", "pid": 0, "tid": 20, "ts": 5, "dur": 1,
     "args": {"Process Group Name": "7", "Collective name": "broadcast"}}]})";
  StatusOr<Timeline> raw = ParseChromeTrace(text, "noseq.json");
  ASSERT_TRUE(raw.ok());
  StatusOr<ImportedTrace> imported = ImportPytorchTimelines({{"noseq.json", *raw}});
  ASSERT_TRUE(imported.ok()) << imported.status().message();
  std::map<int64_t, std::pair<std::string, int64_t>> by_start;  // ts -> (group, seq)
  for (const Slice& s : imported->timeline.slices) {
    ASSERT_TRUE(s.collective.has_value());
    by_start[s.ts_ns] = {s.collective->process_group, s.collective->seq};
  }
  // Origin is the 1 us kernel.
  EXPECT_EQ(by_start.at(0), (std::pair<std::string, int64_t>{"0", 1}));
  EXPECT_EQ(by_start.at(2000), (std::pair<std::string, int64_t>{"0", 2}));
  EXPECT_EQ(by_start.at(4000), (std::pair<std::string, int64_t>{"7", 1}));
  EXPECT_EQ(by_start.at(8000), (std::pair<std::string, int64_t>{"0", 3}));
}

// `text` as a gzip file (`gzip -9`).
std::string Gzip(const std::string& text) { return trace_internal::GzipCompress(text, Z_BEST_SPEED).value(); }

TEST(ImportPytorch, GzipCompressedFileImportsLikeThePlainOne) {
  const std::string gz = TempPath("rank1.pt.trace.json.gz");
  WriteText(gz, Gzip(ReadText(kRank1)));
  StatusOr<ImportedTrace> plain = ImportPytorchTraces({kRank0, kRank1});
  StatusOr<ImportedTrace> compressed = ImportPytorchTraces({kRank0, gz});
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  ASSERT_TRUE(compressed.ok()) << compressed.status().message();
  EXPECT_EQ(compressed->timeline.slices, plain->timeline.slices);
  EXPECT_EQ(compressed->steps.size(), plain->steps.size());
  // Cut short: a clear error naming the file.
  const std::string whole = Gzip(ReadText(kRank1));
  WriteText(gz, whole.substr(0, whole.size() / 2));
  StatusOr<ImportedTrace> truncated = ImportPytorchTraces({gz});
  ASSERT_FALSE(truncated.ok());
  EXPECT_EQ(truncated.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(truncated.status().message(), HasSubstr(gz + ": truncated gzip data"));
  // A flipped byte in the compressed body: zlib's complaint, under the file's name.
  std::string flipped = whole;
  flipped[flipped.size() / 2] = static_cast<char>(flipped[flipped.size() / 2] ^ 0x55);
  WriteText(gz, flipped);
  StatusOr<ImportedTrace> corrupt = ImportPytorchTraces({gz});
  ASSERT_FALSE(corrupt.ok());
  EXPECT_THAT(corrupt.status().message(), HasSubstr(gz + ": "));
  std::remove(gz.c_str());
}

const std::string kReal = std::string(SHARDSCOPE_SOURCE_DIR) + "/tests/fixtures/real/traces/";

TEST(ImportPytorch, RealNcclTraceAsHtaItsSourceAssertsIt) {
  // HTA's tests/test_trace_parse.py::test_nccl_parser_config on this file: 21 NCCL kernels,
  // the longest an allreduce of 2,049,000 elements in and out, process group "0",
  // "default_pg", ranks [0, 1] (tests/fixtures/real/traces/hta-resnet-ddp-a100/README.md).
  StatusOr<ImportedTrace> imported = ImportPytorchTraces({kReal + "hta-resnet-ddp-a100/nccl_data.json.gz"});
  ASSERT_TRUE(imported.ok()) << imported.status().message();
  ASSERT_EQ(imported->ranks.size(), 1u);
  EXPECT_EQ(imported->ranks[0].rank, 0);
  EXPECT_EQ(imported->ranks[0].collectives, 21);
  std::vector<const Slice*> nccl;
  for (const Slice& s : imported->timeline.slices) {
    if (s.category == Category::kKernel && s.collective) nccl.push_back(&s);
  }
  ASSERT_EQ(nccl.size(), 21u);
  const Slice* longest = nccl[0];
  for (const Slice* s : nccl) {
    if (s->dur_ns > longest->dur_ns) longest = s;
  }
  EXPECT_EQ(longest->collective->collective_name, "all_reduce");
  EXPECT_EQ(longest->collective->in_nelems, 2049000);
  EXPECT_EQ(longest->collective->out_nelems, 2049000);
  EXPECT_EQ(longest->collective->process_group, "0");
  EXPECT_EQ(longest->collective->group_size, 2);
  const auto string_arg = [](const Slice& s, const std::string& key) -> std::string {
    for (const Arg& a : s.args) {
      if (a.key == key) return std::get<std::string>(a.value);
    }
    return "";
  };
  EXPECT_EQ(string_arg(*longest, "Process Group Description"), "default_pg");
  EXPECT_EQ(string_arg(*longest, "Process Group Ranks"), "[0, 1]");
  EXPECT_EQ(string_arg(*longest, "torch collective"), "allreduce");
  // No Seq in the file: numbered 1..21 in start order (one process group).
  std::sort(nccl.begin(), nccl.end(), [](const Slice* a, const Slice* b) { return a->ts_ns < b->ts_ns; });
  for (size_t k = 0; k < nccl.size(); ++k) EXPECT_EQ(nccl[k]->collective->seq, static_cast<int64_t>(k) + 1);
  EXPECT_THAT(imported->warnings.back(), HasSubstr("21 collective kernel(s) carry no \"Seq\""));
}

TEST(ImportPytorch, RealSchemaVersion1TraceOf2021) {
  // kineto's tb_plugin sample: "Operator"/"Runtime"/"Kernel"/"Memcpy"/"Memset" categories,
  // string tids, no distributedInfo. Counts from the file: ProfilerStep#5..10 on the main
  // thread; 8,772 Kernel events, all GPU work on one stream ("stream 7").
  StatusOr<ImportedTrace> imported =
      ImportPytorchTraces({kReal + "kineto-resnet50-v100/worker0.1623143089861.pt.trace.json.gz"});
  ASSERT_TRUE(imported.ok()) << imported.status().message();
  ASSERT_EQ(imported->ranks.size(), 1u);
  EXPECT_EQ(imported->ranks[0].rank, 0);
  EXPECT_EQ(imported->ranks[0].streams, 1);
  EXPECT_EQ(imported->ranks[0].kernels, 8772);
  EXPECT_EQ(imported->ranks[0].collectives, 0);
  ASSERT_EQ(imported->steps.size(), 6u);
  for (size_t k = 0; k < 6; ++k) EXPECT_EQ(imported->steps[k].step, static_cast<int64_t>(5 + k));
  int64_t memcpy = 0, memset = 0, runtime = 0;
  for (const Slice& s : imported->timeline.slices) {
    memcpy += s.category == Category::kGpuMemcpy ? 1 : 0;
    memset += s.category == Category::kGpuMemset ? 1 : 0;
    runtime += s.category == Category::kCudaRuntime ? 1 : 0;
  }
  EXPECT_EQ(memcpy, 12);
  EXPECT_EQ(memset, 312);
  EXPECT_EQ(runtime, 11923);
}

TEST(ImportPytorch, NormalizesTorchAndNcclCollectiveNames) {
  EXPECT_EQ(NormalizeCollectiveName("_allgather_base"), "all_gather");
  EXPECT_EQ(NormalizeCollectiveName("allgather_into_tensor_coalesced"), "all_gather");
  EXPECT_EQ(NormalizeCollectiveName("_reduce_scatter_base"), "reduce_scatter");
  EXPECT_EQ(NormalizeCollectiveName("reduce_scatter_tensor_coalesced"), "reduce_scatter");
  EXPECT_EQ(NormalizeCollectiveName("allreduce"), "all_reduce");
  EXPECT_EQ(NormalizeCollectiveName("all_to_allv"), "all_to_all");
  EXPECT_EQ(NormalizeCollectiveName("broadcast"), "broadcast");
  EXPECT_EQ(NormalizeCollectiveName("reduce"), "reduce");
  EXPECT_EQ(NormalizeCollectiveName("send"), "send");
  EXPECT_EQ(NormalizeCollectiveName("recv"), "recv");
  EXPECT_EQ(NormalizeCollectiveName("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL"), "reduce_scatter");
  EXPECT_EQ(NormalizeCollectiveName("ncclDevKernel_SendRecv"), "");
  EXPECT_EQ(NormalizeCollectiveName("barrier"), "");
}

}  // namespace
}  // namespace shardscope::traces

#include "shardscope/profiler/collector.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "shardscope/profiler/capture_json.h"
#include "shardscope/traces/schedule_json.h"

namespace shardscope::profiler {
namespace {

const std::string kFixtures = std::string(SHARDSCOPE_SOURCE_DIR) + "/tests/fixtures/cupti/";

class CollectorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto schedule = traces::ReadScheduleFile(kFixtures + "schedule.json");
    ASSERT_TRUE(schedule.ok()) << schedule.status().message();
    schedule_ = std::move(schedule).value();
    auto capture = ReadActivityCaptureFile(kFixtures + "rank0_two_steps.json");
    ASSERT_TRUE(capture.ok()) << capture.status().message();
    capture_ = std::move(capture).value();
  }

  traces::Timeline Convert(const std::vector<ActivityRecord>& records, CollectorReport* report = nullptr,
                           LinearClockMap clock = {}) {
    CollectorOptions options;
    options.rank = capture_.rank;
    options.stream_map = capture_.stream_map;
    options.clock = clock;
    auto collector = ActivityCollector::Create(schedule_, options);
    EXPECT_TRUE(collector.ok()) << collector.status().message();
    // Delivered in two batches, as two flushes would.
    const auto half = static_cast<std::ptrdiff_t>(records.size() / 2);
    (*collector)->OnActivities(std::span(records.data(), static_cast<size_t>(half)));
    (*collector)->OnActivities(std::span(records.data() + half, records.size() - static_cast<size_t>(half)));
    (*collector)->SetDroppedRecords(capture_.dropped_records);
    traces::Timeline timeline;
    CollectorReport r = (*collector)->WriteTimeline(timeline);
    if (report != nullptr) *report = r;
    return timeline;
  }

  static const traces::Slice* Find(const traces::Timeline& t, int32_t tid, int64_t ts) {
    for (const traces::Slice& s : t.slices) {
      if (s.tid == tid && s.ts_ns == ts) return &s;
    }
    return nullptr;
  }
  static const traces::Arg* FindArg(const traces::Slice& s, std::string_view key) {
    for (const traces::Arg& a : s.args) {
      if (a.key == key) return &a;
    }
    return nullptr;
  }

  traces::Schedule schedule_;
  ActivityCapture capture_;
};

TEST_F(CollectorTest, TracksAreThoseOfThePredictedTimelineThenExtraOnes) {
  const traces::Timeline t = Convert(capture_.records);
  ASSERT_EQ(t.processes.size(), 1u);
  EXPECT_EQ(t.processes[0], (traces::ProcessInfo{0, "rank 0", 0}));
  // sim's TraceRecorder: tid 0 host thread, 1 + stream index "stream <index> <name>"; then,
  // in order, the unmapped CUDA stream 21, the helper thread 999, CUPTI's overhead.
  const std::vector<traces::ThreadInfo> expected = {
      {0, 0, "host thread", 0},
      {0, 1, "stream 0 compute", 1},
      {0, 2, "stream 1 comm", 2},
      {0, 3, "cuda stream 21 (not in the schedule)", 3},
      {0, 4, "thread 999", 4},
      {0, 5, "CUPTI overhead", 5},
  };
  EXPECT_EQ(t.threads, expected);
}

TEST_F(CollectorTest, DeviceRecordsMapToTheirOpThroughCorrelation) {
  const traces::Timeline t = Convert(capture_.records);
  // The GEMM: CUPTI stream 7 = schedule stream 0 = tid 1; correlation 104 -> external id 13.
  const traces::Slice* gemm = Find(t, 1, 1600);
  ASSERT_NE(gemm, nullptr);
  EXPECT_EQ(gemm->name, "gemm_bf16_128x128");
  EXPECT_EQ(gemm->category, traces::Category::kKernel);
  EXPECT_EQ(gemm->op_id, 13);
  EXPECT_EQ(gemm->correlation, 104);
  EXPECT_EQ(gemm->dur_ns, 1000);
  ASSERT_NE(FindArg(*gemm, "op"), nullptr);
  EXPECT_EQ(std::get<std::string>(FindArg(*gemm, "op")->value), "gemm qkv");
  EXPECT_EQ(std::get<std::string>(FindArg(*gemm, "grid")->value), "[80, 1, 1]");
  EXPECT_EQ(std::get<int64_t>(FindArg(*gemm, "shared memory")->value), 1024 + 49152);
  EXPECT_EQ(std::get<int64_t>(FindArg(*gemm, "stream")->value), 0);
  EXPECT_EQ(std::get<int64_t>(FindArg(*gemm, "step")->value), 0);
  EXPECT_FALSE(gemm->collective.has_value());

  // The copy: Kineto's name, 4096 bytes in 4 ns = 1024 GB/s.
  const traces::Slice* copy = Find(t, 1, 2600);
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(copy->name, "Memcpy HtoD (Pinned -> Device)");
  EXPECT_EQ(copy->category, traces::Category::kGpuMemcpy);
  EXPECT_EQ(copy->op_id, 14);
  EXPECT_DOUBLE_EQ(std::get<double>(FindArg(*copy, "memory bandwidth (GB/s)")->value), 1024.0);

  // The API calls on the host thread carry the op ids too.
  const traces::Slice* launch = Find(t, 0, 1040);
  ASSERT_NE(launch, nullptr);
  EXPECT_EQ(launch->name, "cudaLaunchKernel");
  EXPECT_EQ(launch->category, traces::Category::kCudaRuntime);
  EXPECT_EQ(launch->op_id, 13);
  const traces::Slice* nccl_launch = Find(t, 0, 1000);
  ASSERT_NE(nccl_launch, nullptr);
  EXPECT_EQ(nccl_launch->category, traces::Category::kCudaDriver);
  EXPECT_EQ(nccl_launch->op_id, 10);
}

TEST_F(CollectorTest, NcclKernelsCarryTheirCollectiveWithPerCommunicatorSeq) {
  const traces::Timeline t = Convert(capture_.records);
  // Communicator dp has two collectives per step (op 10 then op 15), so Seq = 2 * step + index.
  struct Expect {
    int64_t ts;
    int64_t op;
    const char* collective;
    int64_t seq;
    int64_t in, out;
  };
  // 8 MiB of bf16 = 4,194,304 elements; all_gather's input is a 1/2 shard, reduce_scatter's output.
  const Expect expected[] = {{1100, 10, "all_gather", 0, 2097152, 4194304},
                             {2700, 15, "reduce_scatter", 1, 4194304, 2097152},
                             {4100, 10, "all_gather", 2, 2097152, 4194304},
                             {4600, 15, "reduce_scatter", 3, 4194304, 2097152}};
  for (const Expect& e : expected) {
    const traces::Slice* k = Find(t, 2, e.ts);
    ASSERT_NE(k, nullptr) << e.ts;
    EXPECT_EQ(k->op_id, e.op);
    ASSERT_TRUE(k->collective.has_value()) << e.ts;
    EXPECT_EQ(k->collective->collective_name, e.collective);
    EXPECT_EQ(k->collective->process_group, "dp");
    EXPECT_EQ(k->collective->dtype, "BFloat16");
    EXPECT_EQ(k->collective->group_size, 2);
    EXPECT_EQ(k->collective->seq, e.seq) << e.ts;
    EXPECT_EQ(k->collective->rank, 0);
    EXPECT_EQ(k->collective->in_nelems, e.in);
    EXPECT_EQ(k->collective->out_nelems, e.out);
  }
  // Demangled, so Holistic Trace Analysis's ^nccl rule classifies it as communication.
  EXPECT_EQ(Find(t, 2, 1100)->name, "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)");
}

TEST_F(CollectorTest, LaunchToKernelFlowsLikeThePredictedTrace) {
  const traces::Timeline t = Convert(capture_.records);
  // One flow per device record with a recorded launching call: 101, 104, 105, 106, 201, 206,
  // 301 (the memset on stream 21 has none). Rank 0: id = correlation.
  ASSERT_EQ(t.flows.size(), 7u);
  const traces::Flow& first = t.flows[0];
  EXPECT_EQ(first.id, 101);
  EXPECT_EQ(first.name, "ac2g");
  EXPECT_EQ(std::tie(first.from_tid, first.from_ts_ns), std::make_tuple(0, int64_t{1000}));
  EXPECT_EQ(std::tie(first.to_tid, first.to_ts_ns), std::make_tuple(2, int64_t{1100}));
}

TEST_F(CollectorTest, UnmatchedRecordsStayMarkedAndCounted) {
  CollectorReport report;
  const traces::Timeline t = Convert(capture_.records, &report);
  const traces::Slice* memset = Find(t, 3, 3300);
  ASSERT_NE(memset, nullptr);
  EXPECT_EQ(memset->name, "Memset (Device)");
  EXPECT_EQ(memset->op_id, -1);
  EXPECT_EQ(std::get<std::string>(FindArg(*memset, "unmatched")->value), "no external correlation id");
  const traces::Slice* mystery = Find(t, 1, 5200);
  ASSERT_NE(mystery, nullptr);
  EXPECT_EQ(mystery->op_id, -1);
  EXPECT_EQ(std::get<std::string>(FindArg(*mystery, "unmatched")->value),
            "external id 999 is not an op of program \"main\"");
  const traces::Slice* query = Find(t, 4, 1500);
  ASSERT_NE(query, nullptr);
  EXPECT_EQ(query->name, "cudaEventQuery");
  EXPECT_EQ(query->op_id, -1);

  // Counted by hand from the fixture (see its comment).
  CollectorReport expected;
  expected.records_by_kind = {/*kernel*/ 6, /*memcpy*/ 1, /*memset*/ 1, /*sync*/ 2, /*runtime*/ 7,
                              /*driver*/ 4, /*external*/ 10, /*overhead*/ 1};
  expected.unmatched_device_records = 2;  // memset (no external id), mystery kernel (id 999)
  expected.unmatched_api_records = 2;     // cudaEventQuery, the mystery launch
  expected.unknown_op_ids = 2;            // the mystery kernel and its launch
  expected.unmapped_stream_records = 1;   // the memset on stream 21
  expected.flows = 7;
  EXPECT_EQ(report, expected);
  // Every record except the 10 external correlations is a slice: 32 - 10.
  EXPECT_EQ(t.slices.size(), 22u);
}

TEST_F(CollectorTest, SyncRecordsGoToTheirStreamOrTheHostThread) {
  const traces::Timeline t = Convert(capture_.records);
  const traces::Slice* wait = nullptr;
  const traces::Slice* device_sync = nullptr;
  for (const traces::Slice& s : t.slices) {
    if (s.category != traces::Category::kCudaSync) continue;
    if (s.name == "Stream Wait Event") wait = &s;
    if (s.name == "Context Sync") device_sync = &s;
  }
  ASSERT_NE(wait, nullptr);
  EXPECT_EQ(wait->tid, 1);  // CUPTI stream 7 = compute
  EXPECT_EQ(wait->op_id, 12);
  ASSERT_NE(device_sync, nullptr);
  EXPECT_EQ(device_sync->tid, 0);
  EXPECT_EQ(device_sync->op_id, 16);
}

TEST_F(CollectorTest, SameTimelineWhateverTheDeliveryOrder) {
  const traces::Timeline in_order = Convert(capture_.records);
  std::vector<ActivityRecord> shuffled = capture_.records;
  std::mt19937 random(7);
  std::shuffle(shuffled.begin(), shuffled.end(), random);
  const traces::Timeline reordered = Convert(shuffled);
  EXPECT_EQ(in_order.threads, reordered.threads);
  EXPECT_EQ(in_order.slices, reordered.slices);
  EXPECT_EQ(in_order.flows, reordered.flows);
}

TEST_F(CollectorTest, TimestampsGoThroughTheClockMap) {
  // CUPTI 0 = host 1,000,000 and the host clock 10 ppm faster: CUPTI 1600 -> 1,001,600.016.
  const LinearClockMap clock{0, 1'000'000, 1.00001};
  const traces::Timeline t = Convert(capture_.records, nullptr, clock);
  const traces::Slice* gemm = Find(t, 1, 1'001'600);
  ASSERT_NE(gemm, nullptr);
  EXPECT_EQ(gemm->dur_ns, 1000);  // 2600 * 1.00001 = 2600.026 -> 2600; 1600.016 -> 1600
}

TEST(CollectorCreateTest, RejectsARankOrStreamOutsideTheSchedule) {
  auto schedule = traces::ReadScheduleFile(kFixtures + "schedule.json");
  ASSERT_TRUE(schedule.ok());
  CollectorOptions options;
  options.rank = 2;
  EXPECT_EQ(ActivityCollector::Create(*schedule, options).status().message(),
            "activity collector: rank 2 is not in the schedule's 2 ranks");
  options.rank = 1;
  options.stream_map = {{7, 2}};
  EXPECT_EQ(ActivityCollector::Create(*schedule, options).status().message(),
            "activity collector: CUDA stream 7 maps to stream index 2, but program \"main\" has 2 streams");
}

TEST(DemangleTest, DemanglesItaniumNamesOnly) {
  EXPECT_EQ(DemangleKernelName("_Z35ncclDevKernel_ReduceScatter_RING_LL24ncclDevKernelArgsStorageILm4096EE"),
            "ncclDevKernel_ReduceScatter_RING_LL(ncclDevKernelArgsStorage<4096ul>)");
  EXPECT_EQ(DemangleKernelName("gemm_bf16"), "gemm_bf16");
  EXPECT_EQ(DemangleKernelName("_Znot a mangled name"), "_Znot a mangled name");
}

}  // namespace
}  // namespace shardscope::profiler

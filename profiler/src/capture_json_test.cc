#include "shardscope/profiler/capture_json.h"

#include <gtest/gtest.h>

namespace shardscope::profiler {
namespace {

const std::string kFixture = std::string(SHARDSCOPE_SOURCE_DIR) + "/tests/fixtures/cupti/rank0_two_steps.json";

TEST(CaptureJsonTest, ReadsTheFixture) {
  auto capture = ReadActivityCaptureFile(kFixture);
  ASSERT_TRUE(capture.ok()) << capture.status().message();
  EXPECT_EQ(capture->rank, 0);
  EXPECT_EQ(capture->stream_map, (std::map<uint32_t, int32_t>{{7, 0}, {13, 1}}));
  ASSERT_EQ(capture->records.size(), 32u);
  // The first two records, field by field.
  EXPECT_EQ(capture->records[0], ActivityRecord(ExternalCorrelationRecord{ExternalKind::kCustom0, 10, 101}));
  ApiRecord launch;
  launch.domain = ApiDomain::kDriver;
  launch.cbid = 652;
  launch.name = "cuLaunchKernelEx";
  launch.start_ns = 1000;
  launch.end_ns = 1010;
  launch.process_id = 77;
  launch.thread_id = 4242;
  launch.correlation = 101;
  EXPECT_EQ(capture->records[1], ActivityRecord(launch));
  const auto& sync = std::get<SynchronizationRecord>(capture->records[20]);
  EXPECT_EQ(sync.type, SyncType::kContextSynchronize);
  EXPECT_FALSE(sync.stream.has_value());
}

TEST(CaptureJsonTest, RoundTripsExactly) {
  auto capture = ReadActivityCaptureFile(kFixture);
  ASSERT_TRUE(capture.ok());
  capture->dropped_records = 3;
  const std::string text = ActivityCaptureToJson(*capture);
  auto again = ParseActivityCaptureJson(text, "round-trip");
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(*again, *capture);
  EXPECT_EQ(ActivityCaptureToJson(*again), text);  // byte for byte
}

TEST(CaptureJsonTest, ErrorsNameThePathAndWhatWasExpected) {
  const auto error = [](std::string_view text) {
    return ParseActivityCaptureJson(text, "c.json").status().message();
  };
  EXPECT_EQ(error(R"({"version": 1, "rank": 0, "records": [{"kind": "memset", "start": 1, "end": 2, "stream": -1, "correlation": 3}]})"),
            "c.json: /records/0/stream: expected an unsigned 32-bit integer, got -1");
  EXPECT_EQ(error(R"({"version": 1, "rank": 0, "records": [{"kind": "kernel", "start": 1}]})"),
            "c.json: /records/0/kind: expected one of concurrent_kernel, memcpy, memset, synchronization, "
            "runtime, driver, external_correlation, overhead, got \"kernel\"");
  EXPECT_EQ(error(R"({"version": 1, "rank": 0, "records": [{"kind": "runtime", "start": 1, "end": 2, "name": "x", "correlation": 1, "thread": 4}]})"),
            "c.json: /records/0: unknown key \"thread\"");
  EXPECT_EQ(error(R"({"version": 1, "rank": 0, "records": [{"kind": "concurrent_kernel", "start": 1, "end": 2, "name": "k", "correlation": 1}]})"),
            "c.json: /records/0: missing required key \"stream\"");
  EXPECT_EQ(error(R"({"version": 2, "rank": 0, "records": []})"), "c.json: /version: expected 1, got 2");
  EXPECT_EQ(error(R"({"version": 1, "rank": 0})"), "c.json: /: missing required key \"records\"");
}

}  // namespace
}  // namespace shardscope::profiler

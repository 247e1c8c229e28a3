// Allocation traces: JSON round trip, every parse error, replays whose statistics are
// worked out by hand from the policy in /work/shared/reference/caching-allocator.md
// (PyTorch's c10/cuda/CUDACachingAllocator.cpp), and traces lowered from a plan.
#include "shardscope/sim/memory/alloc_trace.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <variant>

#include "shardscope/sim/lowering/lowering.h"
#include "shardscope/sim/plan/plan.h"

namespace shardscope::sim {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;

AllocTrace MakeTrace(int64_t device_bytes, int32_t streams, std::vector<AllocTraceOp> ops) {
  AllocTrace trace;
  trace.description = "test";
  trace.device_memory_bytes = device_bytes;
  trace.streams = streams;
  trace.ops = std::move(ops);
  return trace;
}

// A trace document with `ops` (a JSON array body) and a valid header.
std::string Doc(const std::string& ops, const std::string& extra = "") {
  return R"({"version": 1, "alloc_conf": "", "device_memory_bytes": 1073741824, "streams": 2)" + extra +
         R"(, "ops": [)" + ops + "]}";
}

std::string ParseError(const std::string& json) {
  auto trace = ParseAllocTrace(json, "t.json");
  EXPECT_FALSE(trace.ok()) << json;
  if (trace.ok()) return "";
  EXPECT_EQ(trace.status().code(), StatusCode::kInvalidInput);
  return trace.status().message();
}

TEST(AllocTraceJson, ParsesTheDocumentedExample) {
  auto trace = ParseAllocTrace(
      R"({"version": 1, "description": "d", "alloc_conf": "expandable_segments:False", "memory_fraction": 1.0,
          "device_memory_bytes": 2147483648, "streams": 2,
          "ops": [{"op": "alloc", "id": 0, "bytes": 1048576, "stream": 0},
                  {"op": "alloc", "id": 3, "bytes": 512, "stream": 0},
                  {"op": "free", "id": 0}, {"op": "record_stream", "id": 3, "stream": 1},
                  {"op": "empty_cache"}]})",
      "t.json");
  ASSERT_TRUE(trace.ok()) << trace.status().message();
  EXPECT_EQ(trace->device_memory_bytes, 2 * kGiB);
  EXPECT_EQ(trace->streams, 2);
  ASSERT_EQ(trace->ops.size(), 5u);
  EXPECT_EQ(std::get<AllocTraceAlloc>(trace->ops[0]), (AllocTraceAlloc{0, 1048576, 0}));
  EXPECT_EQ(std::get<AllocTraceRecordStream>(trace->ops[3]), (AllocTraceRecordStream{3, 1}));
  EXPECT_TRUE(std::holds_alternative<AllocTraceEmptyCache>(trace->ops[4]));
}

TEST(AllocTraceJson, RoundTripIsExact) {
  AllocTrace trace = MakeTrace(3 * kGiB + 7, 3,
                               {AllocTraceAlloc{0, 6 * kMiB, 0}, AllocTraceAlloc{5, 0, 2},
                                AllocTraceRecordStream{0, 1}, AllocTraceFree{0}, AllocTraceEmptyCache{},
                                AllocTraceAlloc{9, 123, 1}});
  trace.description = "quotes \" and \\ survive";
  trace.alloc_conf = "expandable_segments:True";
  trace.memory_fraction = 0.8;
  const std::string json = AllocTraceToJson(trace);
  auto back = ParseAllocTrace(json, "t.json");
  ASSERT_TRUE(back.ok()) << back.status().message() << "\n" << json;
  EXPECT_EQ(*back, trace);
  EXPECT_EQ(AllocTraceToJson(*back), json);
}

TEST(AllocTraceJson, EmptyOpsRoundTrip) {
  AllocTrace trace = MakeTrace(kGiB, 1, {});
  auto back = ParseAllocTrace(AllocTraceToJson(trace), "t.json");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(*back, trace);
}

TEST(AllocTraceJson, Errors) {
  EXPECT_THAT(ParseError(R"({"version": 1,)"), HasSubstr("t.json:1:"));
  EXPECT_THAT(ParseError("[1]"), HasSubstr("expected a JSON object"));
  EXPECT_THAT(ParseError(Doc("", R"(, "colour": 1)")), HasSubstr("key 'colour': unknown key"));
  EXPECT_THAT(ParseError(R"({"version": 2, "device_memory_bytes": 1, "streams": 1, "ops": []})"),
              HasSubstr("key 'version'"));
  EXPECT_THAT(ParseError(R"({"version": 1, "streams": 1, "ops": []})"), HasSubstr("key 'device_memory_bytes': missing"));
  EXPECT_THAT(ParseError(R"({"version": 1, "device_memory_bytes": -5, "streams": 1, "ops": []})"),
              HasSubstr("key 'device_memory_bytes'"));
  EXPECT_THAT(ParseError(R"({"version": 1, "device_memory_bytes": 5, "streams": 0, "ops": []})"),
              HasSubstr("key 'streams'"));
  EXPECT_THAT(ParseError(R"({"version": 1, "device_memory_bytes": 5, "streams": 1})"), HasSubstr("key 'ops': missing"));
  EXPECT_THAT(ParseError(Doc("", R"(, "memory_fraction": 1.5)")), HasSubstr("key 'memory_fraction'"));
  EXPECT_THAT(ParseError(Doc("", R"(, "memory_fraction": "half")")), HasSubstr("key 'memory_fraction'"));
  EXPECT_THAT(ParseError(Doc("", R"(, "description": 3)")), HasSubstr("key 'description': expected a string"));
  EXPECT_THAT(ParseError(R"({"version": 1, "alloc_conf": "no_such_knob:3", "device_memory_bytes": 5, "streams": 1,
                             "ops": []})"),
              HasSubstr("key 'alloc_conf'"));
  // Op-level errors name the op index and key.
  EXPECT_THAT(ParseError(Doc("3")), HasSubstr("ops[0]: expected an op object"));
  EXPECT_THAT(ParseError(Doc(R"({"id": 0})")), HasSubstr("ops[0]: key 'op': missing"));
  EXPECT_THAT(ParseError(Doc(R"({"op": "malloc"})")), HasSubstr("ops[0]: key 'op': expected \"alloc\""));
  EXPECT_THAT(ParseError(Doc(R"({"op": "alloc", "id": 0, "bytes": 1, "stream": 0, "size": 2})")),
              HasSubstr("ops[0]: key 'size': unknown key"));
  EXPECT_THAT(ParseError(Doc(R"({"op": "empty_cache", "id": 1})")), HasSubstr("ops[0]: key 'id': unknown key"));
  EXPECT_THAT(ParseError(Doc(R"({"op": "alloc", "id": 0, "stream": 0})")), HasSubstr("ops[0]: key 'bytes': missing"));
  EXPECT_THAT(ParseError(Doc(R"({"op": "alloc", "id": 0, "bytes": -5, "stream": 0})")),
              HasSubstr("ops[0]: key 'bytes': expected an integer in [0, 1125899906842624] (bytes), got -5"));
  EXPECT_THAT(ParseError(Doc(R"({"op": "alloc", "id": 0, "bytes": 1.5, "stream": 0})")),
              HasSubstr("ops[0]: key 'bytes': expected an integer in [0, 1125899906842624] (bytes), got 1.5"));
  // 2^63 - 1 bytes once wrapped in the allocator's rounding and did not run out of memory: one
  // alloc is at most traces::kMaxOpBytes (2^50), a device at most 2^56.
  EXPECT_THAT(ParseError(Doc(R"({"op": "alloc", "id": 0, "bytes": 9223372036854775807, "stream": 0})")),
              HasSubstr("ops[0]: key 'bytes': expected an integer in [0, 1125899906842624] (bytes), got "
                        "9223372036854775807"));
  EXPECT_THAT(ParseError(R"({"version": 1, "device_memory_bytes": 9223372036854775807, "streams": 1, "ops": []})"),
              HasSubstr("key 'device_memory_bytes': expected an integer in [1, 72057594037927936] (bytes)"));
  EXPECT_THAT(ParseError(Doc(R"({"op": "alloc", "id": -1, "bytes": 1, "stream": 0})")), HasSubstr("ops[0]: key 'id'"));
  EXPECT_THAT(ParseError(Doc(R"({"op": "alloc", "id": 0, "bytes": 1, "stream": 2})")),
              HasSubstr("ops[0]: key 'stream': expected a stream index in [0, 1], got 2"));
  EXPECT_THAT(ParseError(Doc(R"({"op": "alloc", "id": 0, "bytes": 1, "stream": 0},
                                {"op": "record_stream", "id": 0, "stream": 7})")),
              HasSubstr("ops[1]: key 'stream'"));
  EXPECT_THAT(ParseError(Doc(R"({"op": "free", "id": 4})")), HasSubstr("ops[0]: key 'id': unknown id 4"));
  EXPECT_THAT(ParseError(Doc(R"({"op": "record_stream", "id": 4, "stream": 1})")),
              HasSubstr("ops[0]: key 'id': unknown id 4"));
  EXPECT_THAT(ParseError(Doc(R"({"op": "alloc", "id": 0, "bytes": 1, "stream": 0}, {"op": "free", "id": 0},
                                {"op": "free", "id": 0})")),
              HasSubstr("ops[2]: key 'id': id 0 was already freed at ops[1]"));
  EXPECT_THAT(ParseError(Doc(R"({"op": "alloc", "id": 0, "bytes": 1, "stream": 0}, {"op": "free", "id": 0},
                                {"op": "record_stream", "id": 0, "stream": 1})")),
              HasSubstr("ops[2]: key 'id': id 0 was already freed"));
  EXPECT_THAT(ParseError(Doc(R"({"op": "alloc", "id": 0, "bytes": 1, "stream": 0}, {"op": "free", "id": 0},
                                {"op": "alloc", "id": 0, "bytes": 1, "stream": 0})")),
              HasSubstr("ops[2]: key 'id': id 0 was already allocated at ops[0]"));
  EXPECT_THAT(ParseError(std::string(100, '[') + std::string(100, ']')), HasSubstr("nested deeper"));
}

TEST(AllocTraceReplay, RejectsAnInvalidTraceBuiltInCode) {
  auto result = ReplayAllocTrace(MakeTrace(kGiB, 1, {AllocTraceFree{3}}));
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("unknown id 3"));
}

// Requests in (1 MiB, 10 MiB) get a kLargeBuffer (20 MiB) segment that later requests of
// the same stream split: two 6 MiB allocations share one segment.
TEST(AllocTraceReplay, TwoMidSizeAllocsShareOneSegment) {
  auto result = ReplayAllocTrace(MakeTrace(kGiB, 1, {AllocTraceAlloc{0, 6 * kMiB, 0}, AllocTraceAlloc{1, 6 * kMiB, 0}}));
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_EQ(result->stats.reserved_bytes_peak, 20 * kMiB);
  EXPECT_EQ(result->stats.allocated_bytes_peak, 12 * kMiB);
  EXPECT_EQ(result->stats.segment_peak, 1);
  EXPECT_EQ(result->reserved_after_op, (std::vector<int64_t>{20 * kMiB, 20 * kMiB}));
  EXPECT_TRUE(result->ooms.empty());
}

// Cached blocks are per stream: the same two requests on two streams take two segments.
TEST(AllocTraceReplay, StreamsDoNotShareSegments) {
  auto result = ReplayAllocTrace(MakeTrace(kGiB, 2, {AllocTraceAlloc{0, 6 * kMiB, 0}, AllocTraceAlloc{1, 6 * kMiB, 1}}));
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_EQ(result->stats.reserved_bytes_peak, 40 * kMiB);
  EXPECT_EQ(result->stats.segment_peak, 2);
}

// <= 1 MiB: rounded to 512 B, from a kSmallBuffer (2 MiB) segment. >= 10 MiB: the segment
// is the request rounded to kRoundLarge (2 MiB); the block stays at 512 B rounding and the
// 2 MiB - 512 B remainder (> 1 MiB) is split off.
TEST(AllocTraceReplay, SmallAndLargeRounding) {
  auto result = ReplayAllocTrace(MakeTrace(
      kGiB, 1, {AllocTraceAlloc{0, 1000, 0}, AllocTraceAlloc{1, 30 * kMiB + 1, 0}, AllocTraceAlloc{2, 0, 0}}));
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_EQ(result->reserved_after_op, (std::vector<int64_t>{2 * kMiB, 34 * kMiB, 34 * kMiB}));
  EXPECT_EQ(result->stats.allocated_bytes_peak, 1024 + 30 * kMiB + 512);
  EXPECT_EQ(result->stats.segment_peak, 2);
}

// A block used on another stream goes back to its pool once the events recorded at free
// have completed (they all have, in a replay), so the next request of its stream reuses it.
TEST(AllocTraceReplay, RecordStreamThenReuse) {
  auto result = ReplayAllocTrace(MakeTrace(kGiB, 2,
                                           {AllocTraceAlloc{0, 6 * kMiB, 0}, AllocTraceRecordStream{0, 1},
                                            AllocTraceFree{0}, AllocTraceAlloc{1, 6 * kMiB, 0}}));
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_EQ(result->stats.reserved_bytes_peak, 20 * kMiB);
  EXPECT_EQ(result->stats.segment_peak, 1);
  EXPECT_EQ(result->stats.allocated_bytes, 6 * kMiB);
}

// 16 MiB does not fit the 14 MiB left of the first segment: a second one (16 MiB, already
// a multiple of kRoundLarge). Freeing the 6 MiB block merges its segment whole again, and
// empty_cache releases it.
TEST(AllocTraceReplay, EmptyCacheReleasesFreeSegments) {
  auto result = ReplayAllocTrace(MakeTrace(
      kGiB, 1, {AllocTraceAlloc{0, 6 * kMiB, 0}, AllocTraceAlloc{1, 16 * kMiB, 0}, AllocTraceFree{0},
                AllocTraceEmptyCache{}}));
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_EQ(result->reserved_after_op, (std::vector<int64_t>{20 * kMiB, 36 * kMiB, 36 * kMiB, 16 * kMiB}));
  EXPECT_EQ(result->stats.reserved_bytes_peak, 36 * kMiB);
  EXPECT_EQ(result->stats.segment, 1);
}

// The 1200 MiB request finds no cached block of its stream large enough, cudaMalloc would
// exceed the 2 GiB device, so the allocator frees every cached segment (both 900 MiB ones,
// one per stream) and tries again: one retry, no OOM.
TEST(AllocTraceReplay, ReleaseCachedSegmentsAndRetry) {
  auto result = ReplayAllocTrace(MakeTrace(2 * kGiB, 2,
                                           {AllocTraceAlloc{0, 900 * kMiB, 0}, AllocTraceFree{0},
                                            AllocTraceAlloc{1, 900 * kMiB, 1}, AllocTraceFree{1},
                                            AllocTraceAlloc{2, 1200 * kMiB, 0}}));
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_EQ(result->stats.num_alloc_retries, 1);
  EXPECT_EQ(result->stats.num_ooms, 0);
  EXPECT_EQ(result->stats.reserved_bytes_peak, 1800 * kMiB);
  EXPECT_EQ(result->stats.reserved_bytes, 1200 * kMiB);
  EXPECT_TRUE(result->ooms.empty());
}

// 40 MiB held, 30 MiB more would pass the 64 MiB device and nothing is cached: an OOM at
// ops[1]. PyTorch counts the release-and-retry attempt before the OOM too (alloc_block with
// isRetry increments num_alloc_retries). Frees of the failed id do nothing.
TEST(AllocTraceReplay, OomIsReportedNotAnError) {
  auto result = ReplayAllocTrace(MakeTrace(64 * kMiB, 1,
                                           {AllocTraceAlloc{0, 40 * kMiB, 0}, AllocTraceAlloc{1, 30 * kMiB, 0},
                                            AllocTraceFree{1}, AllocTraceFree{0}}));
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_EQ(result->stats.num_ooms, 1);
  EXPECT_EQ(result->stats.num_alloc_retries, 1);
  ASSERT_EQ(result->ooms.size(), 1u);
  EXPECT_EQ(result->ooms[0].op_index, 1);
  EXPECT_FALSE(result->ooms[0].outcome.ok);
  EXPECT_EQ(result->stats.reserved_bytes_peak, 40 * kMiB);
  EXPECT_EQ(result->stats.allocated_bytes, 0);

  const std::string json = AllocReplayResultToJson(MakeTrace(64 * kMiB, 1, {}), *result, "oom.json");
  EXPECT_THAT(json, HasSubstr("\"num_ooms\": 1"));
  EXPECT_THAT(json, HasSubstr("\"op_index\": 1"));
  EXPECT_THAT(json, HasSubstr("\"reserved_bytes.all.peak\": 41943040"));
}

// memory_fraction limits the allocator below the device: 0.5 of 64 MiB cannot hold 40 MiB.
TEST(AllocTraceReplay, MemoryFractionLimitsTheAllocator) {
  AllocTrace trace = MakeTrace(64 * kMiB, 1, {AllocTraceAlloc{0, 40 * kMiB, 0}});
  trace.memory_fraction = 0.5;
  auto result = ReplayAllocTrace(trace);
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_EQ(result->stats.num_ooms, 1);
}

TEST(AllocTraceFromSchedule, TinyPlanKeepsEveryAllocateInProgramOrder) {
  auto plan = LoadPlanFile(std::string(SHARDSCOPE_SOURCE_DIR) + "/examples/tiny-fsdp2-2gpu.yaml");
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  auto schedule = LowerPlan(*plan);
  ASSERT_TRUE(schedule.ok()) << schedule.status().message();
  const traces::Program& program = schedule->ProgramOf(0);
  std::vector<int64_t> allocate_bytes;
  size_t frees = 0;
  for (const traces::Op& op : program.ops) {
    if (const auto* allocate = std::get_if<traces::AllocateOp>(&op.payload)) allocate_bytes.push_back(allocate->bytes);
    if (std::holds_alternative<traces::FreeOp>(op.payload)) ++frees;
  }
  ASSERT_FALSE(allocate_bytes.empty());

  AllocTrace trace = AllocTraceFromSchedule(*schedule, 0, 16 * kGiB);
  EXPECT_EQ(trace.streams, static_cast<int32_t>(program.streams.size()));
  EXPECT_EQ(trace.device_memory_bytes, 16 * kGiB);
  std::vector<int64_t> alloc_bytes;
  size_t trace_frees = 0;
  for (const AllocTraceOp& op : trace.ops) {
    if (const auto* alloc = std::get_if<AllocTraceAlloc>(&op)) alloc_bytes.push_back(alloc->bytes);
    if (std::holds_alternative<AllocTraceFree>(op)) ++trace_frees;
  }
  EXPECT_EQ(alloc_bytes, allocate_bytes);
  EXPECT_EQ(trace_frees, frees);

  // The trace is valid (ids fresh even where the program reuses a tensor name) and replays.
  auto back = ParseAllocTrace(AllocTraceToJson(trace), "lowered.json");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(*back, trace);
  auto result = ReplayAllocTrace(trace);
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_EQ(result->stats.num_ooms, 0);
  EXPECT_GE(result->stats.reserved_bytes_peak, result->stats.allocated_bytes_peak);
}

TEST(AllocTraceFromSchedule, RankOutsideTheScheduleGivesNoOps) {
  traces::Schedule schedule;
  AllocTrace trace = AllocTraceFromSchedule(schedule, 3, kGiB);
  EXPECT_TRUE(trace.ops.empty());
}

}  // namespace
}  // namespace shardscope::sim

namespace shardscope::sim {
namespace {

// A trace recorded mid-run: a 20 MiB segment whose first 6 MiB (id 7) were allocated before
// the trace began, and the addresses cudaMalloc gave when it was recorded.
AllocTrace InitialStateTrace() {
  AllocTrace trace = MakeTrace(kGiB, 2, {AllocTraceAlloc{0, 6 * kMiB, 0}, AllocTraceFree{7}, AllocTraceAlloc{1, 30 * kMiB, 1}});
  AllocTraceInitialSegment seg;
  seg.address = 0x7f0000000000;
  seg.stream = 0;
  seg.blocks = {{6 * kMiB, 7, 6000000}, {14 * kMiB, -1, 0}};
  trace.initial_segments = {seg};
  trace.segment_addresses = {0x7f0040000000};
  return trace;
}

TEST(AllocTraceJson, InitialStateAndSegmentAddressesRoundTrip) {
  const AllocTrace trace = InitialStateTrace();
  const std::string json = AllocTraceToJson(trace);
  EXPECT_THAT(json, HasSubstr("\"initial_segments\": [\n    {\"address\": 139637976727552, \"stream\": 0, \"pool\": "
                              "\"large\", \"blocks\": [{\"size\": 6291456, \"id\": 7, \"bytes\": 6000000}, "
                              "{\"size\": 14680064}]}\n  ],\n"));
  EXPECT_THAT(json, HasSubstr("\"segment_addresses\": [139639050469376],\n"));
  auto back = ParseAllocTrace(json, "t.json");
  ASSERT_TRUE(back.ok()) << back.status().message() << "\n" << json;
  EXPECT_EQ(*back, trace);
}

TEST(AllocTraceJson, InitialStateErrors) {
  AllocTrace trace = InitialStateTrace();
  trace.initial_segments[0].blocks[1].id = 7;
  trace.initial_segments[0].blocks[1].bytes = 1;
  auto parsed = ParseAllocTrace(AllocTraceToJson(trace), "t.json");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("initial_segments[0].blocks[1]: key 'id': id 7 appears twice"));

  trace = InitialStateTrace();
  trace.ops.push_back(AllocTraceAlloc{7, 512, 0});  // ids of the initial state are taken
  parsed = ParseAllocTrace(AllocTraceToJson(trace), "t.json");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("id 7 was already allocated in initial_segments"));

  trace = InitialStateTrace();
  trace.initial_segments.push_back(trace.initial_segments[0]);  // overlaps the first
  trace.initial_segments[1].blocks = {{20 * kMiB, -1, 0}};
  parsed = ParseAllocTrace(AllocTraceToJson(trace), "t.json");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("overlap"));

  EXPECT_THAT(ParseError(Doc(R"({"op": "empty_cache"})", R"(, "initial_segments": [{"address": 4096, "stream": 0,
              "pool": "medium", "blocks": [{"size": 512}]}])")),
              HasSubstr("initial_segments[0]: key 'pool': expected \"small\" or \"large\", got \"medium\""));
  EXPECT_THAT(ParseError(Doc(R"({"op": "empty_cache"})", R"(, "segment_addresses": [0])")),
              HasSubstr("segment_addresses[0]: expected a positive integer"));
}

// From the initial state: 6 MiB on stream 0 best-fits the 14 MiB free tail (split: 8 MiB left
// > 1 MiB), freeing id 7 leaves 6 MiB free at the start, and 30 MiB on stream 1 needs a new
// segment, which lands at the recorded address.
TEST(AllocTraceReplay, StartsFromTheInitialStateWithRecordedAddresses) {
  AllocReplayOptions options;
  options.record_history = true;
  auto result = ReplayAllocTrace(InitialStateTrace(), options);
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_EQ(result->reserved_after_op, (std::vector<int64_t>{20 * kMiB, 20 * kMiB, 50 * kMiB}));
  ASSERT_EQ(result->history.size(), 5u);
  EXPECT_EQ(result->history[0].action, "alloc");
  EXPECT_EQ(result->history[0].address, 0x7f0000000000u + 6 * kMiB);
  EXPECT_EQ(result->history[1].action, "free_requested");
  EXPECT_EQ(result->history[1].address, 0x7f0000000000u);
  EXPECT_EQ(result->history[3].action, "segment_alloc");
  EXPECT_EQ(result->history[3].address, 0x7f0040000000u);
  EXPECT_EQ(result->history_op, (std::vector<int64_t>{0, 1, 1, 2, 2}));
  EXPECT_EQ(result->stats.segment, 2);
  EXPECT_EQ(result->stats.allocated_bytes, 36 * kMiB);
  ASSERT_EQ(result->final_segments.size(), 2u);
  EXPECT_EQ(result->final_segments[0].blocks.size(), 3u);
}

}  // namespace
}  // namespace shardscope::sim

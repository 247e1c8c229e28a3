// Memory snapshot replay on hand-made snapshots whose expected decisions are worked out from
// PyTorch's allocator rules (round_size, best fit by (stream, size, address), should_split,
// release_cached_blocks then alloc_block again), and on the real snapshot in
// tests/fixtures/real/memory-snapshots/ against the counts its source states.
#include "shardscope/analysis/memory_snapshot.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace shardscope::sim {
namespace {

constexpr uint64_t kA = 0x7f0000000000;     // segment addresses, 256 MiB apart
constexpr uint64_t kB = kA + (256ull << 20);
constexpr uint64_t kC = kA + (512ull << 20);
constexpr uint64_t kD = kA + (768ull << 20);
constexpr int64_t kLargeSegment = 20 * kMiB;  // kLargeBuffer: requests of 1-10 MiB

RecordedBlock Block(uint64_t address, int64_t size, std::string state, int64_t requested = -1) {
  return RecordedBlock{address, size, requested < 0 ? (state == "inactive" ? 0 : size) : requested, std::move(state)};
}

RecordedSegment Segment(uint64_t address, std::vector<RecordedBlock> blocks, std::string type = "large") {
  RecordedSegment seg;
  seg.address = address;
  seg.segment_type = std::move(type);
  for (const RecordedBlock& b : blocks) seg.total_size += b.size;
  seg.blocks = std::move(blocks);
  return seg;
}

RecordedAction Act(std::string action, uint64_t address, int64_t size) {
  RecordedAction a;
  a.action = std::move(action);
  a.address = address;
  a.size = size;
  return a;
}

RecordedSnapshot Snapshot(std::vector<RecordedSegment> segments, std::vector<RecordedAction> trace) {
  RecordedSnapshot s;
  s.segments = std::move(segments);
  for (size_t i = 0; i < trace.size(); ++i) trace[i].index = static_cast<int64_t>(i);
  s.trace = std::move(trace);
  s.has_allocator_settings = true;
  return s;
}

SnapshotReplay ReplayOrDie(const RecordedSnapshot& snapshot, SnapshotReplayOptions options = {}) {
  auto replay = ReplaySnapshot(snapshot, options);
  EXPECT_TRUE(replay.ok()) << replay.status().message();
  return replay.ok() ? std::move(*replay) : SnapshotReplay{};
}

// Two cached 20 MiB segments (listed higher address first) and a 5 MiB request: best fit ties
// on (stream, size) and BlockComparatorSize breaks the tie by address, so the block at the
// lower address is split.
TEST(SnapshotReplay, BestFitTieIsBrokenByAddress) {
  constexpr int64_t k5MiB = 5 * kMiB;
  const RecordedSnapshot lower = Snapshot(
      {Segment(kB, {Block(kB, kLargeSegment, "inactive")}),
       Segment(kA, {Block(kA, k5MiB, "active_allocated"), Block(kA + k5MiB, kLargeSegment - k5MiB, "inactive")})},
      {Act("alloc", kA, k5MiB)});
  const SnapshotReplay exact = ReplayOrDie(lower);
  EXPECT_TRUE(exact.exact) << (exact.first_divergence ? exact.first_divergence->what : "");
  EXPECT_EQ(exact.converted.trace.initial_segments.size(), 2u);
  EXPECT_EQ(exact.converted.initial_reserved_bytes, 2 * kLargeSegment);
  EXPECT_EQ(exact.converted.initial_allocated_blocks, 0);
  EXPECT_EQ(exact.actions, 1);

  // Had the real allocator taken the higher block, the model would disagree right there.
  const RecordedSnapshot higher = Snapshot(
      {Segment(kB, {Block(kB, k5MiB, "active_allocated"), Block(kB + k5MiB, kLargeSegment - k5MiB, "inactive")}),
       Segment(kA, {Block(kA, kLargeSegment, "inactive")})},
      {Act("alloc", kB, k5MiB)});
  const SnapshotReplay diverges = ReplayOrDie(higher);
  ASSERT_FALSE(diverges.exact);
  ASSERT_TRUE(diverges.first_divergence.has_value());
  EXPECT_EQ(diverges.first_divergence->index, 0);
  EXPECT_NE(diverges.first_divergence->what.find("block chosen"), std::string::npos) << diverges.first_divergence->what;
  ASSERT_TRUE(diverges.first_divergence->model.has_value());
  EXPECT_EQ(diverges.first_divergence->model->address, kA);
  EXPECT_EQ(diverges.first_divergence->recorded->address, kB);
}

// From an empty allocator: 3,000,000 B rounds to 3,000,320 (5860 x 512) in a new 20 MiB
// segment, split (17,971,200 B left > 1 MiB); 2 MiB splits the remainder; after the first is
// freed, 1,500,000 B (1,500,160 rounded) best-fits the 3,000,320 B hole, not the 15,874,048 B
// tail, and splits it (1,500,160 B left > 1 MiB).
TEST(SnapshotReplay, SplitsAndBestFitFromAnEmptyAllocator) {
  const uint64_t second = kA + 3000320;
  const RecordedSnapshot snapshot = Snapshot(
      {Segment(kA, {Block(kA, 1500160, "active_allocated", 1500000), Block(kA + 1500160, 1500160, "inactive"),
                    Block(second, 2 * kMiB, "active_allocated"), Block(second + 2 * kMiB, 15874048, "inactive")})},
      {Act("segment_alloc", kA, kLargeSegment), Act("alloc", kA, 3000000), Act("alloc", second, 2 * kMiB),
       Act("free_requested", kA, 3000000), Act("free_completed", kA, 3000000), Act("alloc", kA, 1500000)});
  const SnapshotReplay replay = ReplayOrDie(snapshot);
  EXPECT_TRUE(replay.exact) << (replay.first_divergence ? replay.first_divergence->what : "");
  EXPECT_TRUE(replay.converted.trace.initial_segments.empty());
  EXPECT_EQ(replay.segment_allocs.recorded, 1);
  EXPECT_EQ(replay.segment_allocs.model, 1);
  EXPECT_EQ(replay.peak_reserved_bytes.recorded, kLargeSegment);
  EXPECT_EQ(replay.peak_reserved_bytes.model, kLargeSegment);
  EXPECT_EQ(replay.converted.capacity_source.rfind("unlimited", 0), 0u);
}

// Segments A and B (20 MiB, cached) and C (20 MiB, allocated before recording); a 30 MiB
// request fits no cached block, cudaMalloc fails, release_cached_blocks frees A then B (equal
// size: address order), and the retried cudaMalloc succeeds. The burst bounds the device:
// cudaMalloc of 30 MiB failed with 60 MiB reserved.
RecordedSnapshot RetrySnapshot(bool swapped) {
  constexpr int64_t k30MiB = 30 * kMiB;
  std::vector<RecordedAction> trace = {Act("segment_free", kA, kLargeSegment), Act("segment_free", kB, kLargeSegment),
                                       Act("segment_alloc", kD, k30MiB), Act("alloc", kD, k30MiB)};
  if (swapped) std::swap(trace[0], trace[1]);
  return Snapshot({Segment(kC, {Block(kC, kLargeSegment, "active_allocated")}),
                   Segment(kD, {Block(kD, k30MiB, "active_allocated")})},
                  std::move(trace));
}

TEST(SnapshotReplay, ReleaseAndRetryBurstInsideAMalloc) {
  const SnapshotReplay replay = ReplayOrDie(RetrySnapshot(false));
  EXPECT_TRUE(replay.exact) << (replay.first_divergence ? replay.first_divergence->what : "");
  EXPECT_EQ(replay.converted.initial_reserved_bytes, 3 * kLargeSegment);
  EXPECT_EQ(replay.converted.initial_allocated_blocks, 1);
  EXPECT_EQ(replay.converted.trace.device_memory_bytes, 3 * kLargeSegment + 30 * kMiB - 1);
  EXPECT_EQ(replay.converted.capacity_source, "retry at device_traces[0][0]");
  EXPECT_EQ(replay.alloc_retries.recorded, 1);
  EXPECT_EQ(replay.alloc_retries.model, 1);
  EXPECT_EQ(replay.segment_frees.recorded, 2);
  EXPECT_EQ(replay.segment_frees.model, 2);
  EXPECT_EQ(replay.peak_reserved_bytes.recorded, 3 * kLargeSegment);
  EXPECT_EQ(replay.peak_reserved_bytes.model, 3 * kLargeSegment);

  // The release order is compared too.
  const SnapshotReplay swapped = ReplayOrDie(RetrySnapshot(true));
  ASSERT_FALSE(swapped.exact);
  EXPECT_EQ(swapped.first_divergence->index, 0);
  EXPECT_EQ(swapped.first_divergence->model->address, kA);

  // A device large enough never makes cudaMalloc fail: the model allocates first.
  SnapshotReplayOptions big;
  big.device_memory_bytes = int64_t{1} << 30;
  const SnapshotReplay no_retry = ReplayOrDie(RetrySnapshot(false), big);
  ASSERT_FALSE(no_retry.exact);
  EXPECT_EQ(no_retry.first_divergence->model->action, "segment_alloc");
  EXPECT_EQ(no_retry.alloc_retries.model, 0);
}

// A block allocated before recording and freed during it: only its requested size is in the
// trace. Large pool: 10,276,352 B at +9,961,472 in a 20 MiB segment leaves 733,696 B
// (<= 1 MiB, so should_split kept it in the block): 11,010,048 B. Small pool: 700 B rounds to
// 1,024 B and the rest of the 2 MiB segment is a free block of its own.
TEST(SnapshotReplay, InitialBlockSizeFollowsShouldSplit) {
  const uint64_t second = kA + 9961472;
  const RecordedSnapshot large =
      Snapshot({Segment(kA, {Block(kA, 9961472, "active_allocated"), Block(second, 11010048, "inactive")})},
               {Act("free_requested", second, 10276352), Act("free_completed", second, 10276352)});
  auto converted = SnapshotToAllocTrace(large, {});
  ASSERT_TRUE(converted.ok()) << converted.status().message();
  ASSERT_EQ(converted->trace.initial_segments.size(), 1u);
  const std::vector<AllocTraceInitialBlock> expected_large = {{9961472, 0, 9961472}, {11010048, 1, 10276352}};
  EXPECT_EQ(converted->trace.initial_segments[0].blocks, expected_large);
  EXPECT_TRUE(ReplayOrDie(large).exact);

  // 5 MiB leaves 5,767,168 B (> 1 MiB): split, a free block after it.
  const RecordedSnapshot split =
      Snapshot({Segment(kA, {Block(kA, 9961472, "active_allocated"), Block(second, 11010048, "inactive")})},
               {Act("free_requested", second, 5 * kMiB), Act("free_completed", second, 5 * kMiB)});
  converted = SnapshotToAllocTrace(split, {});
  ASSERT_TRUE(converted.ok()) << converted.status().message();
  const std::vector<AllocTraceInitialBlock> expected_split = {
      {9961472, 0, 9961472}, {5 * kMiB, 1, 5 * kMiB}, {11010048 - 5 * kMiB, -1, 0}};
  EXPECT_EQ(converted->trace.initial_segments[0].blocks, expected_split);

  const RecordedSnapshot small = Snapshot(
      {Segment(kB, {Block(kB, 1024, "active_allocated", 1000), Block(kB + 1024, 2 * kMiB - 1024, "inactive")},
               "small")},
      {Act("free_requested", kB + 1024, 700), Act("free_completed", kB + 1024, 700)});
  converted = SnapshotToAllocTrace(small, {});
  ASSERT_TRUE(converted.ok()) << converted.status().message();
  ASSERT_EQ(converted->trace.initial_segments.size(), 1u);
  EXPECT_TRUE(converted->trace.initial_segments[0].small);
  const std::vector<AllocTraceInitialBlock> expected_small = {{1024, 0, 1000}, {1024, 1, 700}, {2 * kMiB - 2048, -1, 0}};
  EXPECT_EQ(converted->trace.initial_segments[0].blocks, expected_small);
  EXPECT_TRUE(ReplayOrDie(small).exact);
}

// An oom entry: the malloc failed after releasing what it could; reserved + device_free is
// what cudaMalloc had.
TEST(SnapshotReplay, OomGivesTheCapacity) {
  RecordedAction oom = Act("oom", 0, 40 * kMiB);
  oom.device_free = 10 * kMiB;
  const RecordedSnapshot snapshot =
      Snapshot({Segment(kC, {Block(kC, kLargeSegment, "active_allocated")})}, {oom});
  const SnapshotReplay replay = ReplayOrDie(snapshot);
  EXPECT_TRUE(replay.exact) << (replay.first_divergence ? replay.first_divergence->what : "");
  EXPECT_EQ(replay.converted.trace.device_memory_bytes, kLargeSegment + 10 * kMiB);
  EXPECT_EQ(replay.converted.capacity_source, "oom at device_traces[0][0]");
  EXPECT_EQ(replay.alloc_retries.recorded, 1);
  EXPECT_EQ(replay.alloc_retries.model, 1);
}

// empty_cache between calls: a burst of segment_free not followed by the malloc's
// segment_alloc + alloc.
TEST(SnapshotReplay, EmptyCacheBurst) {
  const RecordedSnapshot snapshot =
      Snapshot({}, {Act("segment_alloc", kA, kLargeSegment), Act("alloc", kA, 5 * kMiB),
                    Act("free_requested", kA, 5 * kMiB), Act("free_completed", kA, 5 * kMiB),
                    Act("segment_free", kA, kLargeSegment)});
  const SnapshotReplay replay = ReplayOrDie(snapshot);
  EXPECT_TRUE(replay.exact) << (replay.first_divergence ? replay.first_divergence->what : "");
  EXPECT_EQ(replay.alloc_retries.recorded, 0);
  EXPECT_EQ(replay.converted.capacity_source.rfind("unlimited", 0), 0u);
}

// record_stream: X's free is requested at [1] but completes only at [3] (its block waited for
// another stream), so the 5 MiB request at [2] cannot reuse it and splits the tail instead;
// the request at [4] then best-fits X's 5 MiB block (not the 10 MiB tail). Replayed at its
// completion, the free leaves the model's choices the recorded ones. A block still waiting
// at the end is allocated in the model.
TEST(SnapshotReplay, DeferredFreeIsReplayedWhenItCompletes) {
  constexpr int64_t k5MiB = 5 * kMiB;
  const uint64_t y = kA + k5MiB;
  const uint64_t tail = kA + 2 * k5MiB;
  const RecordedSnapshot snapshot = Snapshot(
      {Segment(kA, {Block(kA, k5MiB, "active_allocated"), Block(y, k5MiB, "active_pending_free"),
                    Block(tail, 2 * k5MiB, "inactive")})},
      {Act("alloc", kA, k5MiB), Act("free_requested", kA, k5MiB), Act("alloc", y, k5MiB),
       Act("free_completed", kA, k5MiB), Act("alloc", kA, k5MiB), Act("free_requested", y, k5MiB)});
  const SnapshotReplay replay = ReplayOrDie(snapshot);
  EXPECT_TRUE(replay.exact) << (replay.first_divergence ? replay.first_divergence->what : "");
  EXPECT_EQ(replay.converted.deferred_free_requests, (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(replay.converted.deferred_free_ops, (std::vector<int64_t>{2}));
  EXPECT_EQ(replay.actions, 6);
  EXPECT_EQ(replay.recorded.size(), 4u);
  EXPECT_EQ(replay.model.size(), 4u);
}

TEST(SnapshotReplay, InconsistentTracesAreBadInput) {
  // An alloc of a block that is neither freed later nor allocated at the end.
  auto bad = ReplaySnapshot(Snapshot({Segment(kA, {Block(kA, kLargeSegment, "inactive")})}, {Act("alloc", kA, 512)}),
                            {});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(bad.status().message().find("device_traces[0][0]"), std::string::npos) << bad.status().message();
  // A freed block that lies in no segment.
  bad = ReplaySnapshot(Snapshot({}, {Act("free_requested", kA, 512), Act("free_completed", kA, 512)}), {});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("lies in no segment"), std::string::npos) << bad.status().message();
  // Expandable segments are not modelled.
  RecordedSegment expandable = Segment(kA, {Block(kA, kLargeSegment, "inactive")});
  expandable.is_expandable = true;
  bad = ReplaySnapshot(Snapshot({expandable}, {}), {});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("expandable"), std::string::npos);
}

// ---- reading pickles

std::string SnapshotPickle(traces::PickleValue settings) {
  using traces::PickleValue;
  PickleValue block = PickleValue::Dict();
  block.Add("address", PickleValue::Int(static_cast<int64_t>(kA)))
      .Add("size", PickleValue::Int(kLargeSegment))
      .Add("requested_size", PickleValue::Int(0))
      .Add("state", PickleValue::String("inactive"))
      .Add("frames", PickleValue::List());
  PickleValue segment = PickleValue::Dict();
  segment.Add("device", PickleValue::Int(0))
      .Add("address", PickleValue::Int(static_cast<int64_t>(kA)))
      .Add("total_size", PickleValue::Int(kLargeSegment))
      .Add("stream", PickleValue::Int(0))
      .Add("segment_type", PickleValue::String("large"))
      .Add("segment_pool_id", PickleValue::Tuple({PickleValue::Int(0), PickleValue::Int(0)}))
      .Add("is_expandable", PickleValue::Bool(false))
      .Add("blocks", PickleValue::List({block}));
  // A 5 MiB tensor allocated in a new segment and freed again.
  PickleValue entries = PickleValue::List();
  for (const auto& [action, size] : std::vector<std::pair<std::string, int64_t>>{
           {"segment_alloc", kLargeSegment}, {"alloc", 5 * kMiB}, {"free_requested", 5 * kMiB},
           {"free_completed", 5 * kMiB}}) {
    PickleValue entry = PickleValue::Dict();
    entry.Add("action", PickleValue::String(action))
        .Add("addr", PickleValue::Int(static_cast<int64_t>(kA)))
        .Add("size", PickleValue::Int(size))
        .Add("stream", PickleValue::Int(0))
        .Add("time_us", PickleValue::Int(1));
    entries.Append(std::move(entry));
  }
  PickleValue root = PickleValue::Dict();
  root.Add("segments", PickleValue::List({segment}))
      .Add("device_traces", PickleValue::List({entries}))
      .Add("allocator_settings", std::move(settings));
  return traces::WritePickle(root);
}

TEST(MemorySnapshotReader, AllocatorSettingsBecomeAnAllocConf) {
  using traces::PickleValue;
  PickleValue divisions = PickleValue::Dict();
  std::string expected_list;
  for (int64_t mib = 1, i = 0; i < 16; mib *= 2, ++i) {
    const int64_t value = mib == 2 ? 4 : 0;
    divisions.Add(std::to_string(mib), PickleValue::Int(value));
    expected_list += fmt::format("{}{}:{}", i == 0 ? "" : ",", mib, value);
  }
  PickleValue settings = PickleValue::Dict();
  settings.Add("PYTORCH_CUDA_ALLOC_CONF", PickleValue::String("max_split_size_mb:128,max_non_split_rounding_mb:40"))
      .Add("max_split_size", PickleValue::Int(128 * kMiB))
      .Add("garbage_collection_threshold", PickleValue::Float(0.0))
      .Add("expandable_segments", PickleValue::Bool(false))
      .Add("roundup_power2_divisions", divisions);
  const std::string bytes = SnapshotPickle(settings);
  auto doc = ParseMemorySnapshotPickle(bytes, "s.pickle");
  ASSERT_TRUE(doc.ok()) << doc.status().message();
  auto snapshot = ReadMemorySnapshot((*doc)->root(), "s.pickle");
  ASSERT_TRUE(snapshot.ok()) << snapshot.status().message();
  EXPECT_EQ(snapshot->alloc_conf,
            fmt::format("max_non_split_rounding_mb:40,max_split_size_mb:128,roundup_power2_divisions:[{}]", expected_list));
  ASSERT_EQ(snapshot->segments.size(), 1u);
  EXPECT_EQ(snapshot->segments[0].address, kA);
  ASSERT_EQ(snapshot->trace.size(), 4u);
  EXPECT_EQ(snapshot->trace[0].action, "segment_alloc");
  EXPECT_EQ(snapshot->trace[1].size, 5 * kMiB);
  EXPECT_TRUE(ReplayOrDie(*snapshot).exact);
}

TEST(MemorySnapshotReader, ErrorsNameTheKeyPath) {
  using traces::PickleValue;
  PickleValue root = PickleValue::Dict();
  root.Add("device_traces", PickleValue::List());
  auto doc = ParseMemorySnapshotPickle(traces::WritePickle(root), "s.pickle");
  ASSERT_TRUE(doc.ok());
  auto snapshot = ReadMemorySnapshot((*doc)->root(), "s.pickle");
  ASSERT_FALSE(snapshot.ok());
  EXPECT_EQ(snapshot.status().message(), "s.pickle: segments: missing");

  PickleValue block = PickleValue::Dict();
  block.Add("size", PickleValue::String("big")).Add("state", PickleValue::String("inactive"));
  PickleValue segment = PickleValue::Dict();
  segment.Add("address", PickleValue::Int(4096)).Add("total_size", PickleValue::Int(512)).Add(
      "blocks", PickleValue::List({block}));
  root = PickleValue::Dict();
  root.Add("segments", PickleValue::List({segment})).Add("device_traces", PickleValue::List());
  doc = ParseMemorySnapshotPickle(traces::WritePickle(root), "s.pickle");
  ASSERT_TRUE(doc.ok());
  snapshot = ReadMemorySnapshot((*doc)->root(), "s.pickle");
  ASSERT_FALSE(snapshot.ok());
  EXPECT_EQ(snapshot.status().message(), "s.pickle: segments[0].blocks[0].size: expected int, got str");
}

// PyTorch pickles an unknown C++ frame line as SIZE_MAX (LONG1 of 9 bytes), which the pickle
// reader refuses; the snapshot reader reads it as -1.
TEST(MemorySnapshotReader, SizeMaxFrameLinesAreRead) {
  // pickle.dumps({"line": 2**64 - 1, "name": "f"}, protocol=4) without its FRAME: 36 bytes.
  static constexpr char kPickle[] =
      "\x80\x04}\x94(\x8c\x04line\x94\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00\x8c\x04name\x94\x8c\x01" "f\x94u.";
  const std::string bytes(kPickle, sizeof(kPickle) - 1);
  ASSERT_EQ(bytes.size(), 36u);
  auto doc = ParseMemorySnapshotPickle(bytes, "f.pickle");
  ASSERT_TRUE(doc.ok()) << doc.status().message();
  const traces::PickleObject* line = (*doc)->root().Find("line");
  ASSERT_NE(line, nullptr);
  EXPECT_EQ(line->int_value, -1);
  EXPECT_EQ((*doc)->root().Find("name")->string_value, "f");
  // Anything else still fails with the reader's own message.
  auto bad = ParseMemorySnapshotPickle(std::string("\x80\x04\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\xff.", 14),
                                       "g.pickle");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("g.pickle"), std::string::npos);
}

// ---- the real snapshot: figures from its source (tests/fixtures/real/memory-snapshots/
// transformer-small-forward/README.md), counted here from the file itself.

TEST(MemorySnapshotReal, TransformerForwardReplaysExactly) {
  const std::string path = std::string(SHARDSCOPE_SOURCE_DIR) +
                           "/tests/fixtures/real/memory-snapshots/transformer-small-forward/memory_small_forward.pickle";
  auto doc = ReadMemorySnapshotPickleFile(path);
  ASSERT_TRUE(doc.ok()) << doc.status().message();
  auto snapshot = ReadMemorySnapshot((*doc)->root(), path);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status().message();
  int64_t allocs = 0, frees_requested = 0, frees_completed = 0, segment_allocs = 0, segment_alloc_bytes = 0;
  for (const RecordedAction& a : snapshot->trace) {
    allocs += a.action == "alloc";
    frees_requested += a.action == "free_requested";
    frees_completed += a.action == "free_completed";
    if (a.action == "segment_alloc") {
      ++segment_allocs;
      segment_alloc_bytes += a.size;
    }
    EXPECT_NE(a.action, "segment_free");
  }
  EXPECT_EQ(allocs, 2998);
  EXPECT_EQ(frees_requested, 2753);
  EXPECT_EQ(frees_completed, 2753);
  EXPECT_EQ(segment_allocs, 3);
  int64_t reserved = 0, allocated = 0;
  for (const RecordedSegment& seg : snapshot->segments) {
    reserved += seg.total_size;
    for (const RecordedBlock& b : seg.blocks) allocated += b.state == "active_allocated" ? b.size : 0;
  }
  EXPECT_EQ(snapshot->segments.size(), 30u);
  EXPECT_EQ(reserved, 1107296256);
  EXPECT_EQ(allocated, 1043817472);
  EXPECT_EQ(snapshot->alloc_conf, "");  // default settings

  const SnapshotReplay replay = ReplayOrDie(*snapshot);
  EXPECT_TRUE(replay.exact) << (replay.first_divergence ? replay.first_divergence->what : "");
  EXPECT_EQ(replay.actions, 2998 + 2753 + 2753 + 3);
  EXPECT_EQ(replay.segment_allocs.recorded, 3);
  EXPECT_EQ(replay.segment_allocs.model, 3);
  EXPECT_EQ(replay.segment_frees.model, 0);
  // No segment is freed in the trace, so the start held the final segments less the three
  // allocated, and reserved memory peaks at the end.
  EXPECT_EQ(replay.converted.trace.initial_segments.size(), 27u);
  EXPECT_EQ(replay.converted.initial_reserved_bytes, 1107296256 - segment_alloc_bytes);
  EXPECT_EQ(replay.peak_reserved_bytes.recorded, 1107296256);
  EXPECT_EQ(replay.peak_reserved_bytes.model, 1107296256);
}

}  // namespace
}  // namespace shardscope::sim

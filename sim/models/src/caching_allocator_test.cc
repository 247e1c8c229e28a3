// Hand-traced sequences against PyTorch's caching-allocator policy. Each test writes out
// the trace it expects: which pool, which cached block best fit picks, whether it splits,
// which segments are created or released, and the statistics after each step. Addresses
// come from MakeCapacityDeviceMemory: the first segment at kBase (4 GiB), then first fit
// upwards in 2 MiB-aligned steps.
#include "shardscope/sim/models/caching_allocator.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace shardscope::sim {
namespace {

constexpr uint64_t kBase = uint64_t{1} << 32;
constexpr int64_t kKiB = 1024;
constexpr uint64_t Mi(int64_t mib) { return static_cast<uint64_t>(mib * kMiB); }

// Events whose completion the test decides.
class FakeEvents : public StreamEvents {
 public:
  EventToken Record(AllocStream stream) override {
    recorded.push_back(stream);
    return next_++;
  }
  bool Query(EventToken event) override { return completed.count(event) > 0; }
  void Synchronize(EventToken event) override {
    synchronized.push_back(event);
    completed.insert(event);
  }
  std::vector<AllocStream> recorded;
  std::set<EventToken> completed;
  std::vector<EventToken> synchronized;

 private:
  EventToken next_ = 0;
};

// One allocator on a device of `capacity` bytes.
struct Fixture {
  explicit Fixture(AllocatorConfig config = {}, int64_t capacity = 80 * 1024 * kMiB)
      : memory(MakeCapacityDeviceMemory(capacity)),
        allocator(std::move(config), *memory, events) {}
  std::unique_ptr<DeviceMemory> memory;
  FakeEvents events;
  CachingAllocator allocator;

  uint64_t Alloc(int64_t bytes, AllocStream stream = 0) {
    MallocOutcome out = allocator.Malloc(bytes, stream);
    EXPECT_TRUE(out.ok) << bytes;
    return out.address;
  }
};

AllocatorConfig ParseOrDie(std::string_view conf) {
  auto config = AllocatorConfig::Parse(conf);
  EXPECT_TRUE(config.ok()) << config.status().message();
  return config.ok() ? *config : AllocatorConfig{};
}

// (a) get_allocation_size: a request in (1 MiB, 10 MiB) gets a 20 MiB segment; should_split
// keeps the 17 MiB remainder (> 1 MiB), which the next request in the pool reuses.
TEST(CachingAllocator, MidSizeRequestSplitsA20MiBSegment) {
  Fixture f;
  auto& a = f.allocator;
  // Malloc(3 MiB): large pool, no cached block -> cudaMalloc(20 MiB) at kBase; split:
  // [kBase, 3 MiB] allocated, [kBase+3, 17 MiB] cached.
  MallocOutcome first = a.Malloc(3 * kMiB, 0);
  ASSERT_TRUE(first.ok);
  EXPECT_EQ(first.address, kBase);
  EXPECT_EQ(first.block_bytes, 3 * kMiB);
  EXPECT_EQ(first.device_allocs, 1);
  EXPECT_EQ(a.stats().reserved_bytes, 20 * kMiB);
  EXPECT_EQ(a.stats().inactive_split_bytes, 17 * kMiB);
  // Malloc(5 MiB): best fit is the 17 MiB remainder; split again: [kBase+3, 5 MiB]
  // allocated, [kBase+8, 12 MiB] cached. No new segment.
  MallocOutcome second = a.Malloc(5 * kMiB, 0);
  ASSERT_TRUE(second.ok);
  EXPECT_EQ(second.address, kBase + Mi(3));
  EXPECT_EQ(second.device_allocs, 0);
  EXPECT_EQ(a.stats().num_device_alloc, 1);
  EXPECT_EQ(a.stats().reserved_bytes, 20 * kMiB);
  EXPECT_EQ(a.stats().allocated_bytes, 8 * kMiB);
  EXPECT_EQ(a.stats().inactive_split_bytes, 12 * kMiB);
  EXPECT_EQ(a.stats().inactive_split, 1);
  // Free both: the three pieces merge back into one unsplit 20 MiB block.
  a.Free(first.address);
  EXPECT_EQ(a.stats().inactive_split_bytes, 15 * kMiB);  // 3 MiB + 12 MiB inactive pieces
  EXPECT_EQ(a.stats().inactive_split, 2);
  a.Free(second.address);
  EXPECT_EQ(a.stats().inactive_split_bytes, 0);
  EXPECT_EQ(a.stats().inactive_split, 0);
  auto snapshot = a.Snapshot();
  ASSERT_EQ(snapshot.size(), 1u);
  ASSERT_EQ(snapshot[0].blocks.size(), 1u);
  EXPECT_EQ(snapshot[0].blocks[0].size, 20 * kMiB);
  // A >= 10 MiB request gets its own segment rounded up to 2 MiB (kRoundLarge).
  MallocOutcome big = a.Malloc(21 * kMiB + 1, 0);
  ASSERT_TRUE(big.ok);
  EXPECT_EQ(big.address, kBase + Mi(20));
  EXPECT_EQ(big.block_bytes, 22 * kMiB);
}

// (b) Small requests (<= 1 MiB) share 2 MiB small-pool segments; sizes round to 512 B.
TEST(CachingAllocator, SmallRequestUsesA2MiBSegmentAndRoundsTo512) {
  Fixture f;
  auto& a = f.allocator;
  EXPECT_EQ(a.RoundSize(1), 512);
  EXPECT_EQ(a.RoundSize(512), 512);
  EXPECT_EQ(a.RoundSize(513), 1024);
  EXPECT_EQ(a.RoundSize(1000000), 1000448);  // 1954 x 512
  // Malloc(512 KiB): small pool -> cudaMalloc(2 MiB); split (remainder 1.5 MiB >= 512 B).
  MallocOutcome half = a.Malloc(512 * kKiB, 0);
  ASSERT_TRUE(half.ok);
  EXPECT_EQ(half.address, kBase);
  EXPECT_EQ(a.stats().reserved_bytes, 2 * kMiB);
  // Malloc(1): 512 B from the remainder, same segment.
  MallocOutcome tiny = a.Malloc(1, 0);
  ASSERT_TRUE(tiny.ok);
  EXPECT_EQ(tiny.address, kBase + 512 * kKiB);
  EXPECT_EQ(tiny.block_bytes, 512);
  EXPECT_EQ(a.stats().reserved_bytes, 2 * kMiB);
  EXPECT_EQ(a.stats().requested_bytes, 512 * kKiB + 1);
  // Exactly 1 MiB is still small: it fits the 1.5 MiB - 512 B remainder.
  MallocOutcome one = a.Malloc(kMiB, 0);
  ASSERT_TRUE(one.ok);
  EXPECT_EQ(one.address, kBase + 512 * kKiB + 512);
  // 1 MiB + 1 rounds to 1 MiB + 512: large pool, a new 20 MiB segment.
  MallocOutcome large = a.Malloc(kMiB + 1, 0);
  ASSERT_TRUE(large.ok);
  EXPECT_EQ(large.block_bytes, kMiB + 512);
  EXPECT_EQ(large.address, kBase + Mi(2));
  EXPECT_EQ(a.stats().reserved_bytes, 22 * kMiB);
  auto snapshot = a.Snapshot();
  ASSERT_EQ(snapshot.size(), 2u);
  EXPECT_EQ(snapshot[0].segment_type, "small");
  EXPECT_EQ(snapshot[1].segment_type, "large");
}

// (c) Cached blocks are per stream: a block freed on stream 0 is not given to stream 1.
TEST(CachingAllocator, BlockFreedOnOneStreamIsNotReusedByAnother) {
  Fixture f;
  auto& a = f.allocator;
  uint64_t on_a = f.Alloc(12 * kMiB, /*stream=*/0);  // segment kBase, 12 MiB
  a.Free(on_a);                                      // cached for stream 0
  // lower_bound(stream 1, 12 MiB) finds nothing of stream 1 -> a new segment.
  MallocOutcome on_b = a.Malloc(12 * kMiB, /*stream=*/1);
  ASSERT_TRUE(on_b.ok);
  EXPECT_EQ(on_b.address, kBase + Mi(12));
  EXPECT_EQ(on_b.device_allocs, 1);
  EXPECT_EQ(a.stats().reserved_bytes, 24 * kMiB);
  EXPECT_EQ(a.stats().segment, 2);
  // Stream 0 still gets its own block back.
  EXPECT_EQ(f.Alloc(12 * kMiB, 0), kBase);
  EXPECT_EQ(a.stats().num_device_alloc, 2);
}

// (d) record_stream: a block used on stream 1 and freed returns to the pool only when the
// event recorded on stream 1 at free time has completed (insert_events/process_events).
TEST(CachingAllocator, RecordStreamDefersReuseUntilTheEventCompletes) {
  Fixture f;
  auto& a = f.allocator;
  uint64_t x = f.Alloc(12 * kMiB, 0);  // kBase, its own 12 MiB segment (no split)
  a.RecordStream(x, 0);                // the allocation stream: ignored
  a.RecordStream(x, 1);
  a.Free(x);  // free_requested; event 0 recorded on stream 1; not yet back in the pool
  ASSERT_EQ(f.events.recorded, std::vector<AllocStream>{1});
  EXPECT_EQ(a.stats().allocated_bytes, 0);
  EXPECT_EQ(a.stats().active_bytes, 12 * kMiB);  // still active until the event completes
  auto pending = a.Snapshot();
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].blocks[0].state, "active_pending_free");
  // Event not done: process_events keeps it; the request needs a new segment.
  MallocOutcome y = a.Malloc(12 * kMiB, 0);
  ASSERT_TRUE(y.ok);
  EXPECT_EQ(y.address, kBase + Mi(12));
  EXPECT_EQ(a.stats().reserved_bytes, 24 * kMiB);
  a.Free(y.address);  // no stream uses: back in the pool at once
  // Event completes: the next malloc's process_events frees x; best fit over two 12 MiB
  // blocks takes the lower address, x.
  f.events.completed.insert(0);
  MallocOutcome z = a.Malloc(12 * kMiB, 0);
  ASSERT_TRUE(z.ok);
  EXPECT_EQ(z.address, kBase);
  EXPECT_EQ(z.device_allocs, 0);
  EXPECT_EQ(a.stats().active_bytes, 12 * kMiB);
  EXPECT_EQ(a.stats().reserved_bytes, 24 * kMiB);
}

// (e) max_split_size_mb:40: requests below 40 MiB never take a cached block of >= 40 MiB;
// blocks of >= 40 MiB are never split; a >= 40 MiB request takes a cached block only if it
// wastes less than max_non_split_rounding (20 MiB).
TEST(CachingAllocator, MaxSplitSizeProtectsOversizeBlocks) {
  Fixture f(ParseOrDie("max_split_size_mb:40"));
  auto& a = f.allocator;
  // 1. Malloc(70 MiB): segment S1 = kBase, 70 MiB, not split (70 >= 40). Freed: cached.
  uint64_t s1 = f.Alloc(70 * kMiB);
  EXPECT_EQ(s1, kBase);
  EXPECT_EQ(a.stats().oversize_segments, 1);
  a.Free(s1);
  // 2. Malloc(30 MiB): best fit S1 is oversize and 30 < 40 -> refused; new S2 = kBase+70.
  MallocOutcome s2 = a.Malloc(30 * kMiB, 0);
  ASSERT_TRUE(s2.ok);
  EXPECT_EQ(s2.address, kBase + Mi(70));
  EXPECT_EQ(s2.block_bytes, 30 * kMiB);
  // 3. Malloc(44 MiB): S1 would waste 26 MiB >= 20 -> refused; new S3 = kBase+100, 44 MiB.
  MallocOutcome s3 = a.Malloc(44 * kMiB, 0);
  ASSERT_TRUE(s3.ok);
  EXPECT_EQ(s3.address, kBase + Mi(100));
  a.Free(s3.address);
  // 4. Malloc(41 MiB): best fit S3 (44 MiB) wastes 3 MiB -> taken whole, not split.
  MallocOutcome s4 = a.Malloc(41 * kMiB, 0);
  ASSERT_TRUE(s4.ok);
  EXPECT_EQ(s4.address, kBase + Mi(100));
  EXPECT_EQ(s4.block_bytes, 44 * kMiB);
  EXPECT_EQ(a.stats().reserved_bytes, 144 * kMiB);
  EXPECT_EQ(a.stats().num_device_alloc, 3);
  EXPECT_EQ(a.stats().inactive_split_bytes, 0);
  EXPECT_EQ(a.stats().oversize_allocations, 1);  // s4 (44 MiB)

  // Control, default policy: step 2 takes S1 and splits it (remainder 40 MiB > 1 MiB).
  Fixture d;
  uint64_t t1 = d.Alloc(70 * kMiB);
  d.allocator.Free(t1);
  MallocOutcome t2 = d.allocator.Malloc(30 * kMiB, 0);
  ASSERT_TRUE(t2.ok);
  EXPECT_EQ(t2.address, kBase);
  EXPECT_EQ(d.allocator.stats().inactive_split_bytes, 40 * kMiB);
  EXPECT_EQ(d.allocator.stats().reserved_bytes, 70 * kMiB);
}

// (f) The release-and-retry path and the OOM on a 64 MiB device.
TEST(CachingAllocator, RetryReleasesCachedSegmentsThenOoms) {
  Fixture f({}, 64 * kMiB);
  auto& a = f.allocator;
  a.RecordHistory(true);
  // 1. Malloc(30 MiB) -> S1 = kBase (30 MiB); freed: cached.
  a.Free(f.Alloc(30 * kMiB));
  // 2. Malloc(40 MiB): no cached fit; cudaMalloc(40) fails (30 + 40 > 64);
  //    release_available_cached_blocks: max_split_size unset -> nothing;
  //    release_cached_blocks: sync events, cudaFree S1; cudaMalloc again (a retry) -> kBase.
  MallocOutcome big = a.Malloc(40 * kMiB, 0);
  ASSERT_TRUE(big.ok);
  EXPECT_EQ(big.address, kBase);  // the released range is reused
  EXPECT_TRUE(big.retried);
  EXPECT_TRUE(big.synchronized);
  EXPECT_EQ(big.device_frees, 1);
  EXPECT_EQ(big.device_allocs, 1);
  EXPECT_EQ(a.stats().num_alloc_retries, 1);
  EXPECT_EQ(a.stats().num_sync_all_streams, 1);
  EXPECT_EQ(a.stats().reserved_bytes, 40 * kMiB);
  EXPECT_EQ(a.stats().reserved_bytes_peak, 40 * kMiB);
  // 3. Malloc(3 MiB) -> 20 MiB segment at kBase+40 (40 + 20 <= 64), split: 17 MiB cached.
  EXPECT_EQ(f.Alloc(3 * kMiB), kBase + Mi(40));
  // 4. Malloc(30 MiB): no cached fit (17 < 30); cudaMalloc fails (60 + 30 > 64); release
  //    frees nothing (the 17 MiB block is split); the retry fails too -> OOM. PyTorch
  //    counts that second retry as well.
  MallocOutcome oom = a.Malloc(30 * kMiB, 0);
  EXPECT_FALSE(oom.ok);
  EXPECT_TRUE(oom.retried);
  EXPECT_TRUE(oom.synchronized);
  EXPECT_EQ(oom.device_frees, 0);
  EXPECT_EQ(a.stats().num_ooms, 1);
  EXPECT_EQ(a.stats().num_alloc_retries, 2);
  EXPECT_EQ(oom.requested_bytes, 30 * kMiB);
  EXPECT_EQ(oom.device_free_bytes, 4 * kMiB);
  EXPECT_EQ(oom.largest_free_block, 17 * kMiB);
  ASSERT_FALSE(a.history().empty());
  const TraceEntry& last = a.history().back();
  EXPECT_EQ(last.action, "oom");
  EXPECT_EQ(last.address, Mi(4));  // PyTorch stores the free device bytes there
  EXPECT_EQ(last.size, 30 * kMiB);
}

// Runs the growing sequence of test (g): step k allocates x = 12 + 2k MiB and
// y = 30 + 2k MiB, then frees both.
int64_t PeakReservedOfGrowingSequence(Fixture& f, int steps) {
  for (int k = 0; k < steps; ++k) {
    uint64_t x = f.Alloc((12 + 2 * k) * kMiB);
    uint64_t y = f.Alloc((30 + 2 * k) * kMiB);
    f.allocator.Free(x);
    f.allocator.Free(y);
  }
  return f.allocator.stats().reserved_bytes_peak;
}

// (g) Expandable segments avoid the fragmentation of a growing sequence.
//
// Default policy (sizes >= 10 MiB get exact segments):
//   k=0: x=12 -> S0 (12), y=30 -> S1 (30); freed: cached {12, 30}; reserved 42.
//   k=1: x=14 -> best fit S1 (30), split 14 + 16; y=32 -> no fit -> S2 (32); reserved 74.
//   k=2: x=16 -> S1 split 16 + 14; y=34 -> S3 (34); reserved 108.
//   k=3: x=18 -> S1 split; y=36 -> S4; reserved 144.
//   k=4: x=20 -> S1 split 20 + 10; y=38 -> S5; reserved 182.
// Expandable (large pool pages of 20 MiB, one virtual range for stream 0):
//   k=0: x=12 -> map page 0 (20 MiB), split 12 + 8; y=30 -> the free 8 MiB at the end plus
//        unmapped space: map pages 1-2 (40 MiB), merge -> 48 MiB, split 30 + 18;
//        reserved 60. Freed: one free 60 MiB block.
//   k=1..4: x + y = 46, 50, 54, 58 MiB <= 60: carved from that block; reserved stays 60.
TEST(CachingAllocator, ExpandableSegmentsAvoidGrowingFragmentation) {
  Fixture plain;
  EXPECT_EQ(PeakReservedOfGrowingSequence(plain, 5), 182 * kMiB);
  EXPECT_EQ(plain.allocator.stats().segment, 6);
  EXPECT_EQ(plain.allocator.stats().num_device_alloc, 6);

  Fixture expandable(ParseOrDie("expandable_segments:True"));
  expandable.allocator.RecordHistory(true);
  EXPECT_EQ(PeakReservedOfGrowingSequence(expandable, 5), 60 * kMiB);
  const MemoryStats& stats = expandable.allocator.stats();
  EXPECT_EQ(stats.num_device_alloc, 2);  // two map operations
  EXPECT_EQ(stats.segment, 0);           // PyTorch counts no segment for mapped pages
  EXPECT_EQ(stats.inactive_split_bytes, 0);
  const auto& history = expandable.allocator.history();
  ASSERT_GE(history.size(), 3u);
  EXPECT_EQ(history[0].action, "segment_map");
  EXPECT_EQ(history[0].size, 20 * kMiB);
  EXPECT_EQ(history[2].action, "segment_map");
  EXPECT_EQ(history[2].size, 40 * kMiB);
  EXPECT_EQ(history[2].address, history[0].address + Mi(20));
  auto snapshot = expandable.allocator.Snapshot();
  ASSERT_EQ(snapshot.size(), 1u);
  EXPECT_TRUE(snapshot[0].is_expandable);
  EXPECT_EQ(snapshot[0].total_size, 60 * kMiB);
  // empty_cache unmaps the three free pages in one unmap and releases the range.
  EXPECT_EQ(expandable.allocator.EmptyCache(), 1);
  EXPECT_EQ(stats.reserved_bytes, 0);
  EXPECT_EQ(expandable.allocator.history().back().action, "segment_unmap");
  EXPECT_TRUE(expandable.allocator.Snapshot().empty());
}

// (h) roundup_power2_divisions (round_size, roundup_power2_next_division).
TEST(CachingAllocator, RoundupPower2Divisions) {
  // Legacy form: 4 divisions everywhere.
  Fixture f(ParseOrDie("roundup_power2_divisions:4"));
  auto& a = f.allocator;
  // PyTorch's comment example: 1200 with 4 divisions lies in [1024, 2048), steps 1024,
  // 1280, 1536, 1792 -> 1280. But round_size applies divisions only above
  // kMinBlockSize x divisions (2048 B), so 1200 rounds to 512 B: 1536.
  EXPECT_EQ(a.RoundSize(1200), 1536);
  // The same example scaled to KiB: 1200 KiB -> 1280 KiB.
  EXPECT_EQ(a.RoundSize(1200 * kKiB), 1280 * kKiB);
  EXPECT_EQ(a.RoundSize(kMiB + 1), kMiB + 256 * kKiB);
  EXPECT_EQ(a.RoundSize(4 * kMiB), 4 * kMiB);  // powers of two stay
  EXPECT_EQ(a.RoundSize(5 * kMiB), 5 * kMiB);  // already on a step (4, 5, 6, 7 MiB)
  EXPECT_EQ(a.RoundSize(5 * kMiB + 1), 6 * kMiB);
  EXPECT_EQ(a.RoundSize(3000), 3072);  // step 512 in [2048, 4096)

  // The docs' list example "[256:1,512:2,1024:4,>:8]". As parsed by
  // parseRoundUpPower2Divisions, index = log2(MiB) and ">" fills from the last named
  // index inclusive, so: indices 0..8 -> 1, 9 ([512 MiB, 1 GiB)) -> 2, 10.. -> 8.
  AllocatorConfig list = ParseOrDie("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]");
  std::vector<int64_t> expected = {1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 8, 8, 8, 8, 8, 8};
  EXPECT_EQ(list.roundup_power2_divisions, expected);
  Fixture g(list);
  EXPECT_EQ(g.allocator.RoundSize(300 * kMiB + 1), 300 * kMiB + 512);  // 1 division: 512 B
  EXPECT_EQ(g.allocator.RoundSize(600 * kMiB), 768 * kMiB);            // halves of 512 MiB
  EXPECT_EQ(g.allocator.RoundSize(1536 * kMiB + 1), 1664 * kMiB);      // eighths of 1 GiB
  // The first entry fills every lower interval: "[64:8]" -> indices 0..6 are 8.
  AllocatorConfig first = ParseOrDie("roundup_power2_divisions:[64:8]");
  EXPECT_EQ(first.roundup_power2_divisions[0], 8);
  EXPECT_EQ(first.roundup_power2_divisions[6], 8);
  EXPECT_EQ(first.roundup_power2_divisions[7], 0);
}

// (i) garbage_collection_threshold:0.5 with memory fraction 0.5 of 100 MiB: GC runs on a
// cache miss once reserved > 0.5 x 50 MiB = 25 MiB and frees whole large cached segments
// at least as old (in large-pool get_free_block calls) as the average.
TEST(CachingAllocator, GarbageCollectionFreesOldCachedBlocks) {
  AllocatorConfig config = ParseOrDie("garbage_collection_threshold:0.5");
  config.memory_fraction = 0.5;
  Fixture f(config, 100 * kMiB);
  auto& a = f.allocator;
  // Clock = large-pool get_free_block calls; a freed block's age counts from its free.
  a.Free(f.Alloc(10 * kMiB));  // call 1: miss, reserved 0 -> no GC; A = kBase, freed at 1
  a.Free(f.Alloc(12 * kMiB));  // call 2: miss, reserved 10 -> no GC; B = kBase+10, at 2
  a.Free(f.Alloc(14 * kMiB));  // call 3: miss, reserved 22 -> no GC; C = kBase+22, at 3
  EXPECT_EQ(a.stats().reserved_bytes, 36 * kMiB);
  // Call 4: miss; reserved 36 > 25 -> GC, target 11 MiB. Ages A 3, B 2, C 1, average 2:
  // one pass frees A and B (22 MiB; the pass does not stop at the target), keeps C.
  // Then cudaMalloc(16): 14 + 16 <= 50 allowed -> D at kBase (first fit of A+B's range).
  MallocOutcome d = a.Malloc(16 * kMiB, 0);
  ASSERT_TRUE(d.ok);
  EXPECT_EQ(d.device_frees, 2);
  EXPECT_EQ(d.device_allocs, 1);
  EXPECT_FALSE(d.synchronized);  // GC waits for no events
  EXPECT_FALSE(d.retried);
  EXPECT_EQ(d.address, kBase);
  EXPECT_EQ(a.stats().reserved_bytes, 30 * kMiB);
  EXPECT_EQ(a.stats().reserved_bytes_peak, 36 * kMiB);
  // C (14 MiB at kBase+22) is still cached: a 14 MiB request reuses it.
  EXPECT_EQ(f.Alloc(14 * kMiB), kBase + Mi(22));

  // Control without a memory fraction: no GC, the 16 MiB is a new segment.
  Fixture g(ParseOrDie("garbage_collection_threshold:0.5"), 100 * kMiB);
  for (int64_t mib : {10, 12, 14}) g.allocator.Free(g.Alloc(mib * kMiB));
  g.Alloc(16 * kMiB);
  EXPECT_EQ(g.allocator.stats().reserved_bytes, 52 * kMiB);
  EXPECT_EQ(g.allocator.stats().num_device_free, 0);
}

// The memory fraction alone: cudaMalloc is refused past fraction x capacity, which sends
// the request down the release-and-retry path.
TEST(CachingAllocator, MemoryFractionLimitsReservedMemory) {
  AllocatorConfig config;
  config.memory_fraction = 0.5;
  Fixture f(config, 100 * kMiB);
  auto& a = f.allocator;
  a.Free(f.Alloc(30 * kMiB));
  // Malloc(32): no cached fit (30 < 32); 30 reserved + 32 > 50 allowed -> refused without
  // asking the device; release the cached 30 and retry: 32 <= 50.
  MallocOutcome out = a.Malloc(32 * kMiB, 0);
  ASSERT_TRUE(out.ok);
  EXPECT_TRUE(out.retried);
  EXPECT_EQ(out.address, kBase);
  EXPECT_EQ(a.stats().reserved_bytes, 32 * kMiB);
  // Malloc(3 MiB) wants a 20 MiB segment: 32 + 20 > 50, nothing to release -> OOM.
  MallocOutcome oom = a.Malloc(3 * kMiB, 0);
  EXPECT_FALSE(oom.ok);
  EXPECT_EQ(oom.requested_bytes, 20 * kMiB);
  EXPECT_EQ(oom.device_free_bytes, 68 * kMiB);
  EXPECT_EQ(a.stats().num_ooms, 1);
}

// (j) Statistics, current and peak, through a small-pool sequence.
TEST(CachingAllocator, StatisticsCurrentAndPeak) {
  Fixture f;
  auto& a = f.allocator;
  const int64_t segment = 2 * kMiB;
  // a = Malloc(1000) -> 1024 B at kBase of a new 2 MiB segment; remainder split off.
  uint64_t x = f.Alloc(1000);
  EXPECT_EQ(a.stats().inactive_split_bytes, segment - 1024);
  // b = Malloc(3000) -> 3072 B from the remainder at kBase+1024.
  uint64_t y = f.Alloc(3000);
  EXPECT_EQ(y, kBase + 1024);
  EXPECT_EQ(a.stats().inactive_split_bytes, segment - 4096);
  // Free(a): inactive pieces: [kBase, 1024] and the remainder -> 2 blocks.
  a.Free(x);
  EXPECT_EQ(a.stats().inactive_split, 2);
  EXPECT_EQ(a.stats().inactive_split_bytes, segment - 3072);
  // c = Malloc(512 KiB): best fit is the big remainder (the 1024 B piece is too small).
  uint64_t z = f.Alloc(512 * kKiB);
  EXPECT_EQ(z, kBase + 4096);
  EXPECT_EQ(a.stats().inactive_split_bytes, segment - 3072 - 512 * kKiB);
  // Free(b): merges with the free 1024 B piece -> [kBase, 4096] inactive.
  a.Free(y);
  EXPECT_EQ(a.stats().inactive_split, 2);
  EXPECT_EQ(a.stats().inactive_split_bytes, segment - 512 * kKiB);
  // Free(c): everything merges into one unsplit block.
  a.Free(z);
  const MemoryStats& s = a.stats();
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.allocated_bytes_peak, 3072 + 512 * kKiB);  // b and c together
  EXPECT_EQ(s.active_bytes, 0);
  EXPECT_EQ(s.active_bytes_peak, 3072 + 512 * kKiB);
  EXPECT_EQ(s.requested_bytes, 0);
  EXPECT_EQ(s.requested_bytes_peak, 3000 + 512 * kKiB);
  EXPECT_EQ(s.reserved_bytes, segment);
  EXPECT_EQ(s.reserved_bytes_peak, segment);
  EXPECT_EQ(s.inactive_split_bytes, 0);
  EXPECT_EQ(s.inactive_split_bytes_peak, segment - 1024);  // right after the first split
  EXPECT_EQ(s.inactive_split, 0);
  EXPECT_EQ(s.inactive_split_peak, 2);
  EXPECT_EQ(s.allocation, 0);
  EXPECT_EQ(s.allocation_peak, 2);
  EXPECT_EQ(s.active_peak, 2);
  EXPECT_EQ(s.segment, 1);
  EXPECT_EQ(s.segment_peak, 1);
  EXPECT_EQ(s.num_device_alloc, 1);
  EXPECT_EQ(s.num_device_free, 0);
  // empty_cache releases the now unsplit segment.
  EXPECT_EQ(a.EmptyCache(), 1);
  EXPECT_EQ(s.reserved_bytes, 0);
  EXPECT_EQ(s.segment, 0);
  EXPECT_EQ(s.num_sync_all_streams, 1);
}

// (k) Snapshot segments, blocks and states, and the history's actions.
TEST(CachingAllocator, SnapshotAndHistory) {
  Fixture f;
  auto& a = f.allocator;
  a.RecordHistory(true);
  uint64_t big = f.Alloc(3 * kMiB);    // large segment kBase (20 MiB), split
  uint64_t small = f.Alloc(100);       // small segment kBase+20 (2 MiB), 512 B block
  uint64_t pending = f.Alloc(200);     // next 512 B of the small segment
  a.RecordStream(pending, 7);
  a.Free(pending);                     // waits for stream 7's event
  a.Free(big);                         // merges back into one 20 MiB inactive block
  EXPECT_EQ(small, kBase + Mi(20));

  auto segments = a.Snapshot();
  ASSERT_EQ(segments.size(), 2u);
  EXPECT_EQ(segments[0].address, kBase);
  EXPECT_EQ(segments[0].segment_type, "large");
  EXPECT_EQ(segments[0].total_size, 20 * kMiB);
  EXPECT_EQ(segments[0].allocated_size, 0);
  ASSERT_EQ(segments[0].blocks.size(), 1u);
  EXPECT_EQ(segments[0].blocks[0].state, "inactive");
  const SnapshotSegment& s = segments[1];
  EXPECT_EQ(s.address, kBase + Mi(20));
  EXPECT_EQ(s.segment_type, "small");
  EXPECT_EQ(s.total_size, 2 * kMiB);
  EXPECT_EQ(s.allocated_size, 512);
  EXPECT_EQ(s.active_size, 1024);
  EXPECT_EQ(s.requested_size, 300);
  ASSERT_EQ(s.blocks.size(), 3u);
  EXPECT_EQ(s.blocks[0].state, "active_allocated");
  EXPECT_EQ(s.blocks[0].requested_size, 100);
  EXPECT_EQ(s.blocks[1].state, "active_pending_free");
  EXPECT_EQ(s.blocks[1].address, kBase + Mi(20) + 512);
  EXPECT_EQ(s.blocks[2].state, "inactive");
  EXPECT_EQ(s.blocks[2].size, 2 * kMiB - 1024);

  std::vector<std::string> actions;
  for (const TraceEntry& e : a.history()) actions.push_back(e.action);
  std::vector<std::string> expected = {"segment_alloc", "alloc",          "segment_alloc",
                                       "alloc",         "alloc",          "free_requested",
                                       "free_requested", "free_completed"};
  EXPECT_EQ(actions, expected);
  EXPECT_EQ(a.history()[0].size, 20 * kMiB);
  EXPECT_EQ(a.history()[1].size, 3 * kMiB);  // alloc records the requested size
  EXPECT_EQ(a.history()[4].address, kBase + Mi(20) + 512);
  a.RecordHistory(false);
  EXPECT_TRUE(a.history().empty());
}

// Zero-byte and unknown-address edge cases.
TEST(CachingAllocator, ZeroBytesAndUnknownFree) {
  Fixture f;
  MallocOutcome zero = f.allocator.Malloc(0, 0);
  EXPECT_TRUE(zero.ok);
  EXPECT_EQ(zero.address, 0u);
  EXPECT_FALSE(f.allocator.Malloc(-1, 0).ok);
  f.allocator.Free(0);
  f.allocator.Free(12345);
  EXPECT_EQ(f.allocator.stats().reserved_bytes, 0);
  EXPECT_EQ(f.allocator.stats().num_ooms, 0);
}

TEST(CachingAllocator, CapacityDeviceMemoryAlignsAndReuses) {
  auto memory = MakeCapacityDeviceMemory(10 * kMiB);
  uint64_t a = 0, b = 0, c = 0;
  ASSERT_TRUE(memory->Allocate(3 * kMiB, &a));  // occupies 4 MiB (2 MiB pages)
  ASSERT_TRUE(memory->Allocate(2 * kMiB, &b));
  EXPECT_EQ(a, kBase);
  EXPECT_EQ(b, kBase + Mi(4));
  EXPECT_FALSE(memory->Allocate(6 * kMiB, &c));  // 6 + 6 > 10
  memory->Release(a, 3 * kMiB);
  ASSERT_TRUE(memory->Allocate(4 * kMiB, &c));
  EXPECT_EQ(c, kBase);  // reused
  EXPECT_TRUE(memory->Map(4 * kMiB));
  EXPECT_FALSE(memory->Map(2 * kMiB));
  memory->Unmap(4 * kMiB);
  EXPECT_TRUE(memory->Map(2 * kMiB));
}

// Seeded random mix of sizes, streams, record_stream, empty_cache and OOMs on a small
// device, under four policies. Every 8th step the snapshot must agree with the counters
// (reserved = sum of segment sizes for fixed segments, allocated = sum of allocated
// blocks); after freeing everything, completing all events and emptying the cache, every
// counter is back to zero.
TEST(CachingAllocator, RandomSequencesKeepTheBooksBalanced) {
  const char* confs[] = {"", "max_split_size_mb:24", "expandable_segments:True",
                         "roundup_power2_divisions:4,max_split_size_mb:32"};
  for (const char* conf : confs) {
    Fixture f(ParseOrDie(conf), 256 * kMiB);
    auto& a = f.allocator;
    uint64_t state = 0x9e3779b97f4a7c15ULL;
    auto next = [&state](uint64_t bound) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      return state % bound;
    };
    std::vector<uint64_t> live;
    EventToken completed_up_to = 0;
    for (int step = 0; step < 4000; ++step) {
      const uint64_t op = next(100);
      if (op < 55 || live.empty()) {
        const int64_t bytes = next(4) == 0 ? static_cast<int64_t>(next(40 * kMiB)) + 1
                                           : static_cast<int64_t>(next(2 * kMiB)) + 1;
        MallocOutcome out = a.Malloc(bytes, static_cast<AllocStream>(next(2)));
        if (out.ok) {
          EXPECT_GE(out.block_bytes, bytes);
          live.push_back(out.address);
        }
      } else if (op < 95) {
        const size_t i = next(live.size());
        if (next(5) == 0) a.RecordStream(live[i], 2);
        a.Free(live[i]);
        live[i] = live.back();
        live.pop_back();
      } else if (op < 98) {
        for (EventToken e = completed_up_to; e < 1000000 && e < completed_up_to + 3; ++e) {
          f.events.completed.insert(e);
        }
        completed_up_to += 3;
      } else {
        a.EmptyCache();
      }
      ASSERT_LE(a.stats().reserved_bytes, 256 * kMiB);
      if (step % 8 != 0) continue;  // a snapshot walks everything: check every 8th step
      int64_t allocated = 0;
      int64_t total = 0;
      for (const SnapshotSegment& seg : a.Snapshot()) {
        allocated += seg.allocated_size;
        total += seg.total_size;
      }
      ASSERT_EQ(allocated, a.stats().allocated_bytes) << conf << " step " << step;
      ASSERT_EQ(total, a.stats().reserved_bytes) << conf << " step " << step;
    }
    for (uint64_t address : live) a.Free(address);
    a.EmptyCache();  // synchronizes every pending event first
    const MemoryStats& s = a.stats();
    EXPECT_EQ(s.allocated_bytes, 0) << conf;
    EXPECT_EQ(s.active_bytes, 0) << conf;
    EXPECT_EQ(s.requested_bytes, 0) << conf;
    EXPECT_EQ(s.inactive_split_bytes, 0) << conf;
    EXPECT_EQ(s.inactive_split, 0) << conf;
    EXPECT_EQ(s.reserved_bytes, 0) << conf;
    EXPECT_EQ(s.segment, 0) << conf;
    EXPECT_EQ(s.allocation, 0) << conf;
    EXPECT_EQ(s.active, 0) << conf;
    EXPECT_EQ(s.oversize_allocations, 0) << conf;
    EXPECT_EQ(s.oversize_segments, 0) << conf;
    EXPECT_GT(s.num_ooms + s.num_alloc_retries, 0) << conf;  // the device did fill up
    EXPECT_TRUE(a.Snapshot().empty()) << conf;
  }
}

// (l) PYTORCH_CUDA_ALLOC_CONF parsing.
TEST(AllocatorConfig, ParsesEveryKey) {
  AllocatorConfig c = ParseOrDie(
      " max_split_size_mb:128, max_non_split_rounding_mb:64,garbage_collection_threshold:0.6,"
      "expandable_segments:True,roundup_power2_divisions:[64:8,>:2],backend:native,"
      "release_lock_on_cudamalloc:False,");
  EXPECT_EQ(c.max_split_size, 128 * kMiB);
  EXPECT_EQ(c.max_non_split_rounding, 64 * kMiB);
  EXPECT_DOUBLE_EQ(c.garbage_collection_threshold, 0.6);
  EXPECT_TRUE(c.expandable_segments);
  std::vector<int64_t> divisions = {8, 8, 8, 8, 8, 8, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2};
  EXPECT_EQ(c.roundup_power2_divisions, divisions);
  AllocatorConfig defaults = ParseOrDie("");
  EXPECT_EQ(defaults.max_split_size, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(defaults.max_non_split_rounding, 20 * kMiB);
  EXPECT_FALSE(defaults.expandable_segments);
}

TEST(AllocatorConfig, ErrorsNameTheKeyAndTheExpectedValue) {
  struct Case {
    const char* conf;
    const char* needle;
  };
  const Case cases[] = {
      {"max_split_size_mb:10", "max_split_size_mb: too small: must be >= 20"},
      {"max_split_size_mb:abc", "max_split_size_mb: expected an integer number of MiB"},
      {"max_split_size_mb", "max_split_size_mb: expected ':'"},
      {"max_split_size_mb:", "max_split_size_mb: expected an integer"},
      {"max_non_split_rounding_mb:5", "max_non_split_rounding_mb: too small"},
      {"garbage_collection_threshold:1.5", "garbage_collection_threshold: expected a number"},
      {"garbage_collection_threshold:0", "garbage_collection_threshold: expected a number"},
      {"expandable_segments:yes", "expandable_segments: expected True or False, got 'yes'"},
      {"roundup_power2_divisions:3", "roundup_power2_divisions: divisions must be a power"},
      {"roundup_power2_divisions:[64:3]", "roundup_power2_divisions: divisions for '64'"},
      {"roundup_power2_divisions:[100:4]", "roundup_power2_divisions: interval must be"},
      {"roundup_power2_divisions:[64:4", "roundup_power2_divisions: expected ',' or ']'"},
      {"backend:cudaMallocAsync", "backend: expected native"},
      {"pinned_num_register_threads:3", "pinned_num_register_threads: expected a power"},
      {"max_split_size_mb:40 expandable_segments:True",
       "max_split_size_mb: expected an integer"},  // "40expandable_segments" once spaces go
      {"max_split_size_mb:40;", "max_split_size_mb: expected an integer"},
      {"max_split_size_mb:40:", "max_split_size_mb: expected ','"},
      {"foo:1", "foo: unrecognized option"},
  };
  for (const Case& c : cases) {
    auto parsed = AllocatorConfig::Parse(c.conf);
    ASSERT_FALSE(parsed.ok()) << c.conf;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidInput);
    EXPECT_NE(parsed.status().message().find(c.needle), std::string::npos)
        << c.conf << " -> " << parsed.status().message();
    EXPECT_EQ(parsed.status().message().rfind("PYTORCH_CUDA_ALLOC_CONF: ", 0), 0u);
  }
}

}  // namespace
}  // namespace shardscope::sim

namespace shardscope::sim {
namespace {

SnapshotSegment RestoredSegment(uint64_t address, std::string type, std::vector<std::pair<int64_t, std::string>> blocks) {
  SnapshotSegment seg;
  seg.address = address;
  seg.segment_type = std::move(type);
  uint64_t at = address;
  for (auto& [size, state] : blocks) {
    SnapshotBlock b;
    b.address = at;
    b.size = size;
    b.requested_size = state == "active_allocated" ? size - 100 : 0;
    b.state = std::move(state);
    at += static_cast<uint64_t>(size);
    seg.total_size += size;
    seg.blocks.push_back(std::move(b));
  }
  return seg;
}

// A large segment [5 MiB allocated][10 MiB free][5 MiB free] (the two free blocks are one in
// PyTorch: merged) and a small one, entirely free. The statistics count them as current and
// peak; the next 6 MiB request best-fits the 15 MiB block and splits it.
TEST(CachingAllocator, RestoreSeedsSegmentsBlocksAndStatistics) {
  constexpr uint64_t kAddress = 0x7f0000000000;
  constexpr uint64_t kSmall = kAddress + Mi(256);
  const std::vector<SnapshotSegment> segments = {
      RestoredSegment(kAddress, "large", {{Mi(5), "active_allocated"}, {Mi(10), "inactive"}, {Mi(5), "inactive"}}),
      RestoredSegment(kSmall, "small", {{Mi(2), "inactive"}})};
  auto memory = MakeRecordedDeviceMemory(Mi(64), Mi(22), {kAddress + Mi(512)});
  FakeEvents events;
  CachingAllocator allocator({}, *memory, events);
  ASSERT_TRUE(allocator.Restore(segments).ok());
  const MemoryStats& s = allocator.stats();
  EXPECT_EQ(s.segment, 2);
  EXPECT_EQ(s.reserved_bytes, Mi(22));
  EXPECT_EQ(s.reserved_bytes_peak, Mi(22));
  EXPECT_EQ(s.allocated_bytes, Mi(5));
  EXPECT_EQ(s.requested_bytes, Mi(5) - 100);
  EXPECT_EQ(s.inactive_split, 1);
  EXPECT_EQ(s.inactive_split_bytes, Mi(15));
  EXPECT_EQ(allocator.Snapshot()[0].blocks.size(), 2u);

  MallocOutcome out = allocator.Malloc(Mi(6), 0);
  ASSERT_TRUE(out.ok);
  EXPECT_EQ(out.address, kAddress + Mi(5));
  EXPECT_EQ(out.device_allocs, 0);
  // The restored block frees like any other and merges with its free neighbour.
  allocator.Free(kAddress);
  const std::vector<SnapshotSegment> after = allocator.Snapshot();
  ASSERT_EQ(after[0].blocks.size(), 3u);
  EXPECT_EQ(after[0].blocks[0].size, Mi(5));
  EXPECT_EQ(after[0].blocks[0].state, "inactive");
  // A new segment gets the recorded address; the capacity counts the restored bytes.
  out = allocator.Malloc(Mi(30), 0);
  ASSERT_TRUE(out.ok);
  EXPECT_EQ(out.address, kAddress + Mi(512));
  EXPECT_FALSE(allocator.Malloc(Mi(40), 0).ok);  // 22 + 30 + 40 > 64 even after releasing
}

TEST(CachingAllocator, RestoreRejectsWhatItCannotModel) {
  constexpr uint64_t kAddress = 0x7f0000000000;
  auto restore = [](std::vector<SnapshotSegment> segments) {
    auto memory = MakeRecordedDeviceMemory(Mi(1024), 0, {});
    FakeEvents events;
    CachingAllocator allocator({}, *memory, events);
    return allocator.Restore(segments);
  };
  SnapshotSegment pending = RestoredSegment(kAddress, "large", {{Mi(20), "active_pending_free"}});
  EXPECT_NE(restore({pending}).message().find("active_pending_free"), std::string::npos);
  SnapshotSegment gap = RestoredSegment(kAddress, "large", {{Mi(10), "inactive"}, {Mi(10), "inactive"}});
  gap.blocks[1].address += 512;
  EXPECT_NE(restore({gap}).message().find("tile"), std::string::npos);
  SnapshotSegment first = RestoredSegment(kAddress, "large", {{Mi(20), "inactive"}});
  SnapshotSegment second = RestoredSegment(kAddress + Mi(10), "large", {{Mi(20), "inactive"}});
  EXPECT_NE(restore({first, second}).message().find("overlap"), std::string::npos);
  EXPECT_EQ(restore({first, second}).code(), StatusCode::kInvalidInput);
}

}  // namespace
}  // namespace shardscope::sim

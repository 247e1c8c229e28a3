// Exact timestamps for small schedules, computed by hand in the comments.
#include "shardscope/sim/engine/engine.h"
#include "shardscope/sim/hangs/hang.h"

#include <gtest/gtest.h>

#include <map>

#include "engine_test_support.h"

namespace shardscope::sim {
namespace {

using namespace traces;
using Builder = test_support::ScheduleBuilder;
using test_support::FakeCosts;
using test_support::Launch10;

// Records every span, keyed by (rank, op id).
class Recorder : public EngineObserver {
 public:
  explicit Recorder(const Schedule& schedule) : schedule_(schedule) {}
  bool WantsRank(int32_t) const override { return true; }
  void OnHostSpan(const HostSpan& span) override {
    host[{span.rank, IdOf(span.rank, span.op_index)}] = {span.start_ns, span.end_ns};
  }
  void OnDeviceSpan(const DeviceSpan& span) override {
    device[{span.rank, IdOf(span.rank, span.op_index)}] = {span.start_ns, span.end_ns};
    if (span.collective != nullptr) seq[{span.rank, IdOf(span.rank, span.op_index)}] = span.collective->seq;
  }
  using Key = std::pair<int32_t, int64_t>;
  std::map<Key, std::pair<int64_t, int64_t>> host, device;
  std::map<Key, int64_t> seq;

 private:
  int64_t IdOf(int32_t rank, int32_t index) const {
    return schedule_.ProgramOf(rank).ops[static_cast<size_t>(index)].id;
  }
  const Schedule& schedule_;
};

TEST(EngineTest, TwoStreamsShareTheGpuFairly) {
  // Launches: K1 [0,10], K2 [10,20]. K1 runs alone 10..20 (10 done, 90 left); from 20 both
  // run at 1/2: K1 needs 180 more -> ends 200, K2 has done 90 by then -> 10 left alone -> 210.
  Builder b(1);
  b.Kernel(0, 0, 100).Kernel(0, 1, 100);
  Recorder rec(b.schedule);
  SimulationResult result = b.Run(Launch10(), &rec);
  EXPECT_EQ(rec.host.at({0, 0}), std::make_pair(int64_t{0}, int64_t{10}));
  EXPECT_EQ(rec.host.at({0, 1}), std::make_pair(int64_t{10}, int64_t{20}));
  EXPECT_EQ(rec.device.at({0, 0}), std::make_pair(int64_t{10}, int64_t{200}));
  EXPECT_EQ(rec.device.at({0, 1}), std::make_pair(int64_t{20}, int64_t{210}));
  EXPECT_EQ(result.makespan_ns, 210);
  EXPECT_EQ(result.ranks[0].compute_ns, 200);
  EXPECT_EQ(result.ranks[0].streams[0].busy_ns, 190);
  EXPECT_FALSE(result.hung);
}

TEST(EngineTest, TwoStreamsIndependent) {
  Builder b(1);
  b.Kernel(0, 0, 100).Kernel(0, 1, 100);
  Recorder rec(b.schedule);
  EngineConfig config = Launch10();
  config.compute_sharing = ComputeSharing::kIndependent;
  b.Run(config, &rec);
  EXPECT_EQ(rec.device.at({0, 0}), std::make_pair(int64_t{10}, int64_t{110}));
  EXPECT_EQ(rec.device.at({0, 1}), std::make_pair(int64_t{20}, int64_t{120}));
}

TEST(EngineTest, StreamWaitsOnEvent) {
  // K1 launch [0,10] runs 10..110; record e0 on s0 completes at 110; s1 waits for it;
  // K2 (launched 10..20) starts at 110 and ends at 160.
  Builder b(1);
  b.Kernel(0, 0, 100).Add(0, EventRecordOp{0, 0}).Add(0, StreamWaitEventOp{1, 0}).Kernel(0, 1, 50);
  Recorder rec(b.schedule);
  SimulationResult result = b.Run(Launch10(), &rec);
  EXPECT_EQ(rec.device.at({0, 0}), std::make_pair(int64_t{10}, int64_t{110}));
  EXPECT_EQ(rec.device.at({0, 3}), std::make_pair(int64_t{110}, int64_t{160}));
  EXPECT_EQ(result.makespan_ns, 160);
}

TEST(EngineTest, WaitCapturesTheRecordIssuedBeforeIt) {
  // e0 is recorded after K1 (ends 110), s1 waits on it, then e0 is re-recorded after K3
  // (s0: K1 10..110, K3 110..410). The wait must only wait for the first record: K2 runs
  // 110..160 on s1, not after 410.
  Builder b(1);
  b.Kernel(0, 0, 100).Add(0, EventRecordOp{0, 0}).Add(0, StreamWaitEventOp{1, 0});
  b.Kernel(0, 0, 300).Add(0, EventRecordOp{0, 0}).Kernel(0, 1, 50);
  Recorder rec(b.schedule);
  EngineConfig config = Launch10();
  config.compute_sharing = ComputeSharing::kIndependent;
  b.Run(config, &rec);
  EXPECT_EQ(rec.device.at({0, 3}), std::make_pair(int64_t{110}, int64_t{410}));
  EXPECT_EQ(rec.device.at({0, 5}), std::make_pair(int64_t{110}, int64_t{160}));
}

TEST(EngineTest, HostSynchronizeBlocksTheHost) {
  // K1 launch [0,10] runs 10..110; the host syncs at 10 and waits until 110; host work
  // 110..115; K2 launch 115..125 runs 125..225.
  Builder b(1);
  b.Kernel(0, 0, 100).Add(0, StreamSynchronizeOp{0}).Add(0, HostWorkOp{5}).Kernel(0, 0, 100);
  Recorder rec(b.schedule);
  SimulationResult result = b.Run(Launch10(), &rec);
  EXPECT_EQ(rec.host.at({0, 1}), std::make_pair(int64_t{10}, int64_t{110}));
  EXPECT_EQ(rec.host.at({0, 2}), std::make_pair(int64_t{110}, int64_t{115}));
  EXPECT_EQ(rec.device.at({0, 3}), std::make_pair(int64_t{125}, int64_t{225}));
  EXPECT_EQ(result.ranks[0].host_blocked_ns, 100);
  EXPECT_EQ(result.makespan_ns, 225);
}

TEST(EngineTest, DeviceAndEventSynchronize) {
  // s0: K1 10..110; s1: K2 20..70 (independent). Event sync on e0 (recorded after K2 on s1)
  // returns at 70; device sync then waits for K1: 110. K3 launch 110..120 runs 120..130.
  Builder b(1);
  b.Kernel(0, 0, 100).Kernel(0, 1, 50).Add(0, EventRecordOp{0, 1}).Add(0, EventSynchronizeOp{0});
  b.Add(0, DeviceSynchronizeOp{}).Kernel(0, 0, 10);
  Recorder rec(b.schedule);
  EngineConfig config = Launch10();
  config.compute_sharing = ComputeSharing::kIndependent;
  SimulationResult result = b.Run(config, &rec);
  EXPECT_EQ(rec.host.at({0, 3}), std::make_pair(int64_t{20}, int64_t{70}));
  EXPECT_EQ(rec.host.at({0, 4}), std::make_pair(int64_t{70}, int64_t{110}));
  EXPECT_EQ(rec.device.at({0, 5}), std::make_pair(int64_t{120}, int64_t{130}));
  EXPECT_EQ(result.ranks[0].host_blocked_ns, 90);
}

TEST(EngineTest, CollectiveWaitsForTheLateRank) {
  // Rank 0 reaches the all-reduce at 10; rank 1 works 30 ns on the host first, its launch
  // returns at 40. The collective (50 ns) runs 40..90 on both.
  Builder b(2);
  b.Coll(0, 0, 50);
  b.Add(1, HostWorkOp{30}).Coll(1, 0, 50);
  Recorder rec(b.schedule);
  SimulationResult result = b.Run(Launch10(), &rec);
  EXPECT_EQ(rec.device.at({0, 0}), std::make_pair(int64_t{40}, int64_t{90}));
  EXPECT_EQ(rec.device.at({1, 1}), std::make_pair(int64_t{40}, int64_t{90}));
  EXPECT_EQ(result.ranks[0].comm_ns, 50);
  EXPECT_EQ(result.ranks[0].overlap_ns, 0);
}

TEST(EngineTest, OneCommunicatorSerializesAcrossStreams) {
  // AR1 (50) on s0 ready at 10, AR2 (30) on s1 ready at 20. Same communicator: AR2 waits
  // for AR1 to finish: AR1 10..60, AR2 60..90 (sequence numbers 0 and 1).
  Builder b(2);
  for (int r = 0; r < 2; ++r) b.Coll(r, 0, 50).Coll(r, 1, 30);
  Recorder rec(b.schedule);
  b.Run(Launch10(), &rec);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(rec.device.at({r, 0}), std::make_pair(int64_t{10}, int64_t{60}));
    EXPECT_EQ(rec.device.at({r, 1}), std::make_pair(int64_t{60}, int64_t{90}));
    EXPECT_EQ(rec.seq.at({r, 0}), 0);
    EXPECT_EQ(rec.seq.at({r, 1}), 1);
  }
}

TEST(EngineTest, ThreeCollectivesQueuedOnTwoStreams) {
  // AR1 (50) on s0, AR2 (30) on s1, AR3 (20) on s0 behind AR1... and AR4 (10) on s1:
  // order is issue order: AR1 10..60, AR2 60..90, AR3 90..110, AR4 110..120.
  Builder b(2);
  for (int r = 0; r < 2; ++r) b.Coll(r, 0, 50).Coll(r, 1, 30).Coll(r, 0, 20).Coll(r, 1, 10);
  Recorder rec(b.schedule);
  b.Run(Launch10(), &rec);
  EXPECT_EQ(rec.device.at({1, 2}), std::make_pair(int64_t{90}, int64_t{110}));
  EXPECT_EQ(rec.device.at({1, 3}), std::make_pair(int64_t{110}, int64_t{120}));
}

TEST(EngineTest, ContentionSlowsComputeAndCommunication) {
  // No launch cost. Rank 0 runs K (100) on s0 and a collective (150) on s1 with rank 1, all
  // from t=0. compute_slowdown = comm_slowdown = 1: both run at 1/2 while they overlap.
  // K: 100 / 0.5 = 200 -> ends 200. The collective has done 100 by 200, 50 left at full
  // speed -> ends 250.
  Builder b(2);
  b.Kernel(0, 0, 100).Coll(0, 1, 150);
  b.Coll(1, 1, 150);
  Recorder rec(b.schedule);
  EngineConfig config;
  config.compute_slowdown = 1.0;
  config.comm_slowdown = 1.0;
  SimulationResult result = b.Run(config, &rec);
  EXPECT_EQ(rec.device.at({0, 0}), std::make_pair(int64_t{0}, int64_t{200}));
  EXPECT_EQ(rec.device.at({0, 1}), std::make_pair(int64_t{0}, int64_t{250}));
  EXPECT_EQ(rec.device.at({1, 0}), std::make_pair(int64_t{0}, int64_t{250}));
  EXPECT_EQ(result.ranks[0].overlap_ns, 200);
  EXPECT_EQ(result.ranks[0].comm_ns, 250);
  EXPECT_EQ(result.ranks[1].overlap_ns, 0);
}

TEST(EngineTest, ContentionWithPartialOverlap) {
  // compute_slowdown 0.25 (rate 0.8), no comm slowdown. Collective (100) on both ranks from
  // 0..100 at full speed. Rank 0's K (100) launched with a 20 ns host delay starts at 20:
  // 20..100 at 0.8 does 64, 36 left at full speed -> ends 136.
  Builder b(2);
  b.Coll(0, 1, 100).Add(0, HostWorkOp{20}).Kernel(0, 0, 100);
  b.Coll(1, 1, 100);
  Recorder rec(b.schedule);
  EngineConfig config;
  config.compute_slowdown = 0.25;
  b.Run(config, &rec);
  EXPECT_EQ(rec.device.at({0, 0}), std::make_pair(int64_t{0}, int64_t{100}));
  EXPECT_EQ(rec.device.at({0, 2}), std::make_pair(int64_t{20}, int64_t{136}));
}

TEST(EngineTest, SendRecvPair) {
  // Rank 0 sends 40 ns worth at 10; rank 1 posts the receive after 25 ns of host work
  // (launch returns at 35). The transfer runs 35..75 on both.
  Builder b(2);
  CollectiveOp send;
  send.type = CollectiveType::kSend;
  send.bytes = 40;
  send.peer = 1;
  CollectiveOp recv = send;
  recv.type = CollectiveType::kRecv;
  recv.peer = 0;
  b.Add(0, send);
  b.Add(1, HostWorkOp{25}).Add(1, recv);
  Recorder rec(b.schedule);
  b.Run(Launch10(), &rec);
  EXPECT_EQ(rec.device.at({0, 0}), std::make_pair(int64_t{35}, int64_t{75}));
  EXPECT_EQ(rec.device.at({1, 1}), std::make_pair(int64_t{35}, int64_t{75}));
}

TEST(EngineTest, MismatchedCollectivesHang) {
  Builder b(2);
  b.Coll(0, 0, 50, CollectiveType::kAllGather);
  b.Coll(1, 0, 50, CollectiveType::kAllReduce);
  SimulationResult result = b.Run(Launch10());
  EXPECT_TRUE(result.hung);
  ASSERT_EQ(result.blocked.size(), 2u);
  EXPECT_NE(result.blocked[0].streams.at(0).find("waiting for peers"), std::string::npos);
}

TEST(EngineTest, MissingPeerHangs) {
  // Rank 1 never issues the collective: rank 0 waits forever; rank 1 finishes.
  Builder b(2);
  b.Coll(0, 0, 50);
  b.Kernel(1, 0, 10);
  SimulationResult result = b.Run(Launch10());
  EXPECT_TRUE(result.hung);
  ASSERT_EQ(result.blocked.size(), 1u);
  EXPECT_EQ(result.blocked[0].rank, 0);
  EXPECT_TRUE(result.ranks[1].finished);
}

TEST(EngineTest, FullLaunchQueueBlocksTheHost) {
  // At most 2 items per stream. K1 launch [0,10] runs 10..110; K2 launch [10,20] queues
  // behind it; K3's launch at 20 finds 2 items queued and returns only when K1 retires at
  // 110 (launch span 20..120); K2 runs 110..210, K3 210..310.
  Builder b(1);
  b.Kernel(0, 0, 100).Kernel(0, 0, 100).Kernel(0, 0, 100);
  Recorder rec(b.schedule);
  EngineConfig config = Launch10();
  config.max_queued_per_stream = 2;
  SimulationResult result = b.Run(config, &rec);
  EXPECT_EQ(rec.host.at({0, 2}), std::make_pair(int64_t{20}, int64_t{120}));
  EXPECT_EQ(rec.device.at({0, 1}), std::make_pair(int64_t{110}, int64_t{210}));
  EXPECT_EQ(rec.device.at({0, 2}), std::make_pair(int64_t{210}, int64_t{310}));
  EXPECT_EQ(result.ranks[0].host_blocked_ns, 90);
  EXPECT_EQ(result.ranks[0].host_busy_ns, 30);
}

constexpr int64_t kMiB = int64_t{1} << 20;

TEST(EngineTest, CheckpointPhaseIsTimedApartFromTheStep) {
  // K1 (launch 0..10, runs 10..110) is the step; K2, tagged checkpoint (launch 10..20, runs
  // 110..160), is not: step 110, makespan 160. Without the tag the step is the makespan.
  for (bool tagged : {true, false}) {
    Builder b(1);
    b.Kernel(0, 0, 100).Kernel(0, 0, 50);
    if (tagged) b.schedule.programs[0].ops[1].tags.phase = traces::Phase::kCheckpoint;
    SimulationResult result = b.Run(Launch10());
    EXPECT_EQ(result.makespan_ns, 160);
    EXPECT_EQ(result.step_ns, tagged ? 110 : 160);
  }
}

EngineConfig WithMemory(int64_t capacity, bool warm) {
  EngineConfig config = Launch10();
  config.memory.enabled = true;
  config.memory.capacity_bytes = {capacity};
  config.memory.device_alloc_ns = 1000;
  config.memory.device_free_ns = 500;
  config.memory.warm_start = warm;
  return config;
}

TEST(EngineMemoryTest, SegmentAllocationCostsHostTimeOnlyWhenCold) {
  // A 6 MiB request (in (1, 10) MiB) gets a 20 MiB segment: reserved 20 MiB, allocated 6 MiB.
  // Cold: the allocation at t=0 pays one cudaMalloc (1000 ns), so K launches 1000..1010 and
  // runs 1010..1110. Warm (steady state): the segment is cached from the first step, K runs
  // 10..110. Peaks are the same.
  for (bool warm : {false, true}) {
    Builder b(1);
    b.Add(0, AllocateOp{0, 6 * kMiB, 0}).Kernel(0, 0, 100).Add(0, FreeOp{0});
    Recorder rec(b.schedule);
    SimulationResult result = b.Run(WithMemory(1024 * kMiB, warm), &rec);
    const int64_t start = warm ? 10 : 1010;
    EXPECT_EQ(rec.device.at({0, 1}), std::make_pair(start, start + 100)) << "warm=" << warm;
    EXPECT_EQ(result.ranks[0].memory.stats.reserved_bytes_peak, 20 * kMiB);
    EXPECT_EQ(result.ranks[0].memory.stats.allocated_bytes_peak, 6 * kMiB);
    EXPECT_EQ(result.ranks[0].memory.fragmentation_bytes, 14 * kMiB);
    EXPECT_EQ(result.ranks[0].memory.stats.num_device_alloc, 1);  // the warm step's segment is reused
  }
}

TEST(EngineMemoryTest, RecordStreamKeepsTheBlockUntilTheOtherStreamCatchesUp) {
  // A (12 MiB, a segment of its own: > 10 MiB rounds to 2 MiB) is allocated on s0 and used
  // on s1, where K runs 10..5010. Freed at host time ~1010, its block is reusable at once —
  // unless A.record_stream(s1) was called: then the allocator holds it until s1's work queued
  // before the free completes (5010), so B (12 MiB on s0, issued right after) needs a second
  // segment. Reserved peak 24 MiB with record_stream, 12 MiB without.
  for (bool record : {false, true}) {
    Builder b(1);
    b.Kernel(0, 1, 5000).Add(0, AllocateOp{0, 12 * kMiB, 0});
    if (record) b.Add(0, RecordStreamOp{0, 1});
    b.Add(0, FreeOp{0}).Add(0, AllocateOp{1, 12 * kMiB, 0}).Kernel(0, 0, 100).Add(0, FreeOp{1});
    SimulationResult result = b.Run(WithMemory(1024 * kMiB, false));
    EXPECT_EQ(result.ranks[0].memory.stats.reserved_bytes_peak, (record ? 24 : 12) * kMiB) << "record=" << record;
    EXPECT_EQ(result.ranks[0].memory.stats.allocated_bytes_peak, 12 * kMiB);
    EXPECT_FALSE(result.hung);
  }
}

TEST(EngineMemoryTest, RetryBlocksTheHostUntilTheDeviceDrains) {
  // Capacity 40 MiB, cold. K (5000 ns) launched 0..10 runs 10..5010. A: 30 MiB on s0 at 10
  // -> cudaMalloc, host 10..1010; freed (cached in s0's pool). B: 30 MiB on s1 at 1010 cannot
  // reuse s0's block, cudaMalloc fails (30 of 40 MiB reserved), so the allocator frees its
  // cached segments and retries: num_alloc_retries = 1. cudaFree synchronizes the device: the
  // host waits until K ends at 5010, then pays one cudaFree (500) and one cudaMalloc (1000):
  // B's host span is 1010..6510 and K2 launches 6510..6520, runs 6520..6620.
  Builder b(1);
  b.Kernel(0, 0, 5000).Add(0, AllocateOp{0, 30 * kMiB, 0}).Add(0, FreeOp{0});
  b.Add(0, AllocateOp{1, 30 * kMiB, 1}).Kernel(0, 1, 100).Add(0, FreeOp{1});
  Recorder rec(b.schedule);
  SimulationResult result = b.Run(WithMemory(40 * kMiB, false), &rec);
  EXPECT_EQ(rec.host.at({0, 1}), std::make_pair(int64_t{10}, int64_t{1010}));
  EXPECT_EQ(rec.host.at({0, 3}), std::make_pair(int64_t{1010}, int64_t{6510}));
  EXPECT_EQ(rec.device.at({0, 4}), std::make_pair(int64_t{6520}, int64_t{6620}));
  const RankMemory& memory = result.ranks[0].memory;
  EXPECT_EQ(memory.stats.num_alloc_retries, 1);
  EXPECT_EQ(memory.stats.num_ooms, 0);
  EXPECT_EQ(memory.stats.reserved_bytes_peak, 30 * kMiB);
  EXPECT_EQ(result.ranks[0].host_blocked_ns, 4000);
  EXPECT_FALSE(result.hung);
}

TEST(EngineMemoryTest, OutOfMemoryStopsTheRankAndThePeersHang) {
  // Rank 0 asks for 64 MiB on a 40 MiB device before the all-reduce: it stops at op 0
  // (warm start falls back to cold because the first step runs out too). Rank 1 waits in
  // the all-reduce forever.
  Builder b(2);
  b.Add(0, AllocateOp{0, 64 * kMiB, 0}).Coll(0, 0, 50);
  b.Coll(1, 0, 50);
  SimulationResult result = b.Run(WithMemory(40 * kMiB, true));
  EXPECT_TRUE(result.hung);
  const RankMemory& memory = result.ranks[0].memory;
  ASSERT_TRUE(memory.oom.has_value());
  EXPECT_EQ(memory.oom->op_id, 0);
  EXPECT_EQ(memory.oom->time_ns, 0);
  EXPECT_EQ(memory.stats.num_ooms, 1);
  EXPECT_FALSE(result.ranks[1].memory.oom.has_value());
  ASSERT_EQ(result.blocked.size(), 2u);
  EXPECT_NE(result.blocked[0].host.find("out of memory"), std::string::npos);
  EXPECT_NE(result.blocked[1].streams.at(0).find("waiting for peers"), std::string::npos);
}

TEST(EngineTest, PointToPointIsNumberedApartFromCollectives) {
  // all_reduce, send 0->1, all_reduce: the collectives are #0 and #1 of the communicator, the
  // send/recv #0 of its pair (PyTorch numbers p2p separately).
  Builder b(2);
  CollectiveOp send;
  send.type = CollectiveType::kSend;
  send.bytes = 10;
  send.peer = 1;
  CollectiveOp recv = send;
  recv.type = CollectiveType::kRecv;
  recv.peer = 0;
  b.Coll(0, 0, 20).Add(0, send).Coll(0, 0, 20);
  b.Coll(1, 0, 20).Add(1, recv).Coll(1, 0, 20);
  Recorder rec(b.schedule);
  b.Run(Launch10(), &rec);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(rec.seq.at({r, 0}), 0);
    EXPECT_EQ(rec.seq.at({r, 1}), 0);
    EXPECT_EQ(rec.seq.at({r, 2}), 1);
  }
}

TEST(EngineMemoryTest, SharedOutcomesKeepTheWarmStepsStats) {
  // The tensor stays allocated across steps: the measured step makes no allocator call, yet
  // a rank reading the shared outcome log reports what a live allocator does.
  for (bool live : {false, true}) {
    Builder b(1);
    b.Add(0, AllocateOp{0, 6 * kMiB, 0}).Kernel(0, 0, 100);
    EngineConfig config = WithMemory(1024 * kMiB, true);
    config.memory.record_history = live;  // with a recorder: a live allocator
    Recorder rec(b.schedule);
    SimulationResult result = b.Run(config, &rec);
    EXPECT_EQ(result.ranks[0].memory.stats.reserved_bytes_peak, 20 * kMiB) << "live=" << live;
    EXPECT_EQ(result.ranks[0].memory.stats.allocated_bytes, 6 * kMiB) << "live=" << live;
  }
}

TEST(EngineTest, IdenticalRanksHashEqualAndRunsAreDeterministic) {
  Builder b(2);
  for (int r = 0; r < 2; ++r) b.Kernel(r, 0, 100).Coll(r, 1, 70).Kernel(r, 0, 33);
  SimulationResult first = b.Run(Launch10());
  SimulationResult second = b.Run(Launch10());
  EXPECT_EQ(first.ranks[0].timeline_hash, first.ranks[1].timeline_hash);
  EXPECT_EQ(first.ranks[0].timeline_hash, second.ranks[0].timeline_hash);
  EXPECT_EQ(first.makespan_ns, second.makespan_ns);
}

// ---- Fault injection (EngineConfig::inject_oom, rank_slowdown)

// Three ranks share one program: all_reduce (50 ns) [op 0], allocate a 1 MiB [op 1],
// all_gather (100 ns) [op 2], free a [op 3]. The fault makes op 1 of rank 0 fail.
Builder SharedProgramWithAllocation() {
  Builder b(3);
  b.Coll(0, 0, 50).Add(0, AllocateOp{0, kMiB, 0}).Coll(0, 0, 100, CollectiveType::kAllGather).Add(0, FreeOp{0});
  for (int r = 1; r < 3; ++r) b.schedule.ranks[static_cast<size_t>(r)].program = 0;
  return b;
}

TEST(EngineFaultTest, InjectedOomStopsTheRankAtThatOpAndPeersHang) {
  // With and without memory simulation; with memory, ranks 1-2 read the outcome log their
  // class shares with rank 0. Rank 0: all_reduce launch [0,10]; the allocation at host time
  // 10 fails (injected), so it never issues all_gather #2. Ranks 1-2 run all_reduce #1 10..60,
  // then arrive in all_gather #2 (launched [10,20]) at 60 and wait for rank 0.
  for (bool memory : {false, true}) {
    Builder b = SharedProgramWithAllocation();
    EngineConfig config = memory ? WithMemory(1024 * kMiB, true) : Launch10();
    config.launch_overhead_ns = 10;
    config.memory.device_alloc_ns = 0;
    const SimulationResult fault_free = b.Run(config);
    ASSERT_FALSE(fault_free.hung);
    config.inject_oom = InjectedOom{0, 1};
    const SimulationResult result = b.Run(config);
    ASSERT_TRUE(result.hung) << "memory=" << memory;
    const RankMemory& m0 = result.ranks[0].memory;
    ASSERT_TRUE(m0.oom.has_value());
    EXPECT_EQ(m0.oom->op_id, 1);
    EXPECT_EQ(m0.oom->time_ns, 10);
    EXPECT_EQ(m0.oom->requested_bytes, kMiB);
    EXPECT_TRUE(m0.oom->injected);
    EXPECT_EQ(m0.stats.num_ooms, 0);  // the allocator itself was never asked
    ASSERT_EQ(result.blocked.size(), 3u);
    EXPECT_EQ(result.blocked[0].host_state.reason, HostBlockReason::kOutOfMemory);
    EXPECT_EQ(result.blocked[0].host_state.op_id, 1);
    for (int r = 1; r < 3; ++r) {
      const BlockedRank& waiting = result.blocked[static_cast<size_t>(r)];
      EXPECT_FALSE(result.ranks[static_cast<size_t>(r)].memory.oom.has_value());
      ASSERT_EQ(waiting.stream_states.size(), 1u);
      ASSERT_TRUE(waiting.stream_states[0].collective.has_value());
      EXPECT_EQ(waiting.stream_states[0].reason, StreamWaitReason::kRendezvous);
      EXPECT_EQ(waiting.stream_states[0].collective->seq, 2);
      EXPECT_EQ(waiting.stream_states[0].collective->type, CollectiveType::kAllGather);
      EXPECT_EQ(waiting.stream_states[0].collective->arrived_ns, 60);
      // The shared log is still right for the other ranks: their hosts ran to the end (the
      // free of a is issued right after the all-gather's launch), as in a fault-free run.
      if (memory) {
        const MemoryStats& got = result.ranks[static_cast<size_t>(r)].memory.stats;
        const MemoryStats& clean = fault_free.ranks[static_cast<size_t>(r)].memory.stats;
        EXPECT_EQ(got.allocated_bytes, 0);
        EXPECT_EQ(got.allocated_bytes_peak, kMiB);
        EXPECT_EQ(got.allocated_bytes, clean.allocated_bytes);
        EXPECT_EQ(got.reserved_bytes, clean.reserved_bytes);
        EXPECT_EQ(got.reserved_bytes_peak, clean.reserved_bytes_peak);
      }
    }
    const HangReport report = AnalyzeHang(b.schedule, result);
    ASSERT_FALSE(report.explanation.empty());
    const std::string& why = report.explanation.front();
    EXPECT_NE(why.find("rank 0 stopped: injected out of memory at op 1"), std::string::npos) << why;
    EXPECT_NE(why.find("ranks 1-2 wait in all_gather #2 on 'world' for rank 0"), std::string::npos) << why;
  }
}

TEST(EngineFaultTest, WithoutTheFaultTheSameScheduleCompletes) {
  Builder b = SharedProgramWithAllocation();
  const SimulationResult result = b.Run(WithMemory(1024 * kMiB, true));
  EXPECT_FALSE(result.hung);
  for (const RankStats& r : result.ranks) EXPECT_FALSE(r.memory.oom.has_value());
}

TEST(EngineFaultTest, BadFaultsAreInvalidInput) {
  Builder b = SharedProgramWithAllocation();
  ASSERT_TRUE(b.schedule.ResolveBindings().ok());
  FakeCosts costs;
  EngineConfig config = Launch10();
  config.inject_oom = InjectedOom{0, 0};  // op 0 is a collective, not an allocation
  EXPECT_EQ(Simulate(b.schedule, costs, config, nullptr).status().code(), StatusCode::kInvalidInput);
  config.inject_oom = InjectedOom{3, 1};  // outside the world
  EXPECT_EQ(Simulate(b.schedule, costs, config, nullptr).status().code(), StatusCode::kInvalidInput);
  config.inject_oom.reset();
  config.rank_slowdown = {{1, 0.5}};      // faster than the hardware: not a straggler
  EXPECT_EQ(Simulate(b.schedule, costs, config, nullptr).status().code(), StatusCode::kInvalidInput);
}

TEST(EngineFaultTest, StragglerKernelsAndCopiesTakeFactorTimesLonger) {
  // Both ranks: kernel K (100 ns) [op 0], all_reduce (50 ns) [op 1], copy of 40 B (40 ns)
  // [op 2], all on s0, launches [0,10], [10,20], [20,30]. Rank 0 is slowed 3x: K runs
  // 10..310 (300 ns). Rank 1's K runs 10..110 and its all-reduce arrives at 110, but the
  // collective starts only when rank 0 arrives, at 310, and runs at its own speed: 310..360 on
  // both. Then the copies: rank 0's 360..480 (3 x 40), rank 1's 360..400.
  Builder b(2);
  for (int r = 0; r < 2; ++r) b.Kernel(r, 0, 100).Coll(r, 0, 50).Add(r, MemcpyOp{MemcpyKind::kDeviceToDevice, 0, 40});
  EngineConfig config = Launch10();
  config.rank_slowdown = {{0, 3.0}};
  Recorder rec(b.schedule);
  const SimulationResult result = b.Run(config, &rec);
  EXPECT_FALSE(result.hung);
  EXPECT_EQ(rec.device.at({0, 0}), std::make_pair(int64_t{10}, int64_t{310}));
  EXPECT_EQ(rec.device.at({1, 0}), std::make_pair(int64_t{10}, int64_t{110}));
  EXPECT_EQ(rec.device.at({0, 1}), std::make_pair(int64_t{310}, int64_t{360}));
  EXPECT_EQ(rec.device.at({1, 1}), std::make_pair(int64_t{310}, int64_t{360}));
  EXPECT_EQ(rec.device.at({0, 2}), std::make_pair(int64_t{360}, int64_t{480}));
  EXPECT_EQ(rec.device.at({1, 2}), std::make_pair(int64_t{360}, int64_t{400}));
  EXPECT_EQ(result.makespan_ns, 480);
  // Without the straggler: K 10..110, all-reduce 110..160, copy 160..200.
  config.rank_slowdown.clear();
  EXPECT_EQ(b.Run(config).makespan_ns, 200);
}

// ---- Straggler attribution (RankStats::last_arrivals, SimulationResult::straggler)

TEST(EngineStragglerTest, TheRankWithExtraWorkBeforeACollectiveIsNamed) {
  // Four ranks, three all_reduces of 50 ns on stream 0. Rank 2 first runs 100 us of host work;
  // rank 1 runs a 40 us kernel before the third all_reduce.
  //   ranks 0,1,3 launch #1 at [0,10] and arrive at 10; rank 2 launches it at [100000,100010]
  //   and arrives at 100010: #1 runs 100010..100060; rank 2 arrived last, alone, and each of
  //   the other three waited 100000 ns: 300000 ns caused.
  //   #2 (launched long before) reaches every stream's head when #1 ends, at 100060: a tie,
  //   nobody is late. It runs to 100110.
  //   Rank 1's kernel runs 100110..140110; ranks 0, 2, 3 reach #3 at 100110, rank 1 at 140110:
  //   3 x 40000 = 120000 ns caused by rank 1.
  Builder b(4);
  b.Add(2, HostWorkOp{100'000});
  for (int r = 0; r < 4; ++r) {
    b.Coll(r, 0, 50).Coll(r, 0, 50);
    if (r == 1) b.Kernel(r, 0, 40'000);
    b.Coll(r, 0, 50);
  }
  const SimulationResult result = b.Run(Launch10());
  ASSERT_FALSE(result.hung);
  EXPECT_EQ(result.makespan_ns, 140'160);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(result.ranks[static_cast<size_t>(r)].collectives, 3) << "rank " << r;
  EXPECT_EQ(result.ranks[0].last_arrivals, 0);
  EXPECT_EQ(result.ranks[0].collective_wait_caused_ns, 0);
  EXPECT_EQ(result.ranks[1].last_arrivals, 1);
  EXPECT_EQ(result.ranks[1].collective_wait_caused_ns, 120'000);
  EXPECT_EQ(result.ranks[2].last_arrivals, 1);
  EXPECT_EQ(result.ranks[2].collective_wait_caused_ns, 300'000);
  EXPECT_EQ(result.ranks[3].last_arrivals, 0);
  ASSERT_TRUE(result.straggler.has_value());
  EXPECT_EQ(result.straggler->rank, 2);
  EXPECT_EQ(result.straggler->last_arrivals, 1);
  EXPECT_EQ(result.straggler->collectives, 3);
  EXPECT_EQ(result.straggler->wait_caused_ns, 300'000);
}

TEST(EngineStragglerTest, IdenticalRanksHaveNoStraggler) {
  // Every rank arrives at every collective at the same instant: ties, nothing attributed.
  Builder b(4);
  for (int r = 0; r < 4; ++r) b.Kernel(r, 0, 5'000).Coll(r, 0, 50).Kernel(r, 0, 5'000).Coll(r, 0, 50);
  const SimulationResult result = b.Run(Launch10());
  ASSERT_FALSE(result.hung);
  EXPECT_FALSE(result.straggler.has_value());
  for (const RankStats& r : result.ranks) {
    EXPECT_EQ(r.collectives, 2);
    EXPECT_EQ(r.last_arrivals, 0);
    EXPECT_EQ(r.collective_wait_caused_ns, 0);
  }
}

TEST(EngineStragglerTest, RankSlowdownNamesThatRank) {
  // Three times: kernel 1000 ns, all_reduce 50 ns. Rank 3 runs 2x slower (EngineConfig::
  // rank_slowdown): its kernels take 2000 ns, so at each all_reduce ranks 0-2 wait 1000 ns
  // for it (kernel 1 ends at 1010 vs 2010; the all_reduce ends at 2060 on every rank and the
  // next kernels start from there alike): 3 x 3 x 1000 = 9000 ns caused, last at 3 of 3.
  Builder b(4);
  for (int r = 0; r < 4; ++r) {
    for (int i = 0; i < 3; ++i) b.Kernel(r, 0, 1'000).Coll(r, 0, 50);
  }
  EngineConfig config = Launch10();
  config.rank_slowdown = {{3, 2.0}};
  const SimulationResult result = b.Run(config);
  ASSERT_TRUE(result.straggler.has_value());
  EXPECT_EQ(result.straggler->rank, 3);
  EXPECT_EQ(result.straggler->last_arrivals, 3);
  EXPECT_EQ(result.straggler->collectives, 3);
  EXPECT_EQ(result.straggler->wait_caused_ns, 9'000);
  EXPECT_EQ(result.makespan_ns, 3 * (2'000 + 50) + 10);
}

TEST(EngineStragglerTest, ALateReceiverIsAttributedItsSendersWait) {
  // The SendRecvPair schedule: rank 0 reaches its send at 10, rank 1 its recv at 35. The pair
  // is an instance of two members: rank 1 arrived last and rank 0 waited 25 ns (below the 1 us
  // needed to name a straggler).
  Builder b(2);
  b.P2p(0, CollectiveType::kSend, 1, 40);
  b.Add(1, HostWorkOp{25}).P2p(1, CollectiveType::kRecv, 0, 40);
  const SimulationResult result = b.Run(Launch10());
  EXPECT_EQ(result.ranks[1].last_arrivals, 1);
  EXPECT_EQ(result.ranks[1].collective_wait_caused_ns, 25);
  EXPECT_EQ(result.ranks[0].collectives, 1);
  EXPECT_FALSE(result.straggler.has_value());
}

// ---- all_to_all with uneven splits

TEST(EngineTest, AllToAllWithDifferentSizesPerRankRunsAtTheLargest) {
  // all_to_all_single with uneven splits: ranks send 100, 300 and 200 bytes (FakeCosts: bytes
  // ns). Legal, no mismatch: it starts when all arrive at 10 and runs 300 ns, the largest
  // member's, on every rank: 10..310.
  Builder b(3);
  b.Coll(0, 0, 100, CollectiveType::kAllToAll);
  b.Coll(1, 0, 300, CollectiveType::kAllToAll);
  b.Coll(2, 0, 200, CollectiveType::kAllToAll);
  Recorder rec(b.schedule);
  const SimulationResult result = b.Run(Launch10(), &rec);
  ASSERT_FALSE(result.hung);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(rec.device.at({r, 0}), std::make_pair(int64_t{10}, int64_t{310})) << r;
}

TEST(EngineTest, DifferentSizesStayAMismatchOutsideAllToAll) {
  for (CollectiveType type : {CollectiveType::kAllGather, CollectiveType::kReduceScatter,
                              CollectiveType::kAllReduce, CollectiveType::kBroadcast}) {
    Builder b(3);
    for (int r = 0; r < 3; ++r) {
      traces::CollectiveOp c;
      c.type = type;
      c.bytes = r == 1 ? 300 : 100;
      c.peer = type == CollectiveType::kBroadcast ? 0 : -1;
      b.Add(r, c);
    }
    const SimulationResult result = b.Run(Launch10());
    ASSERT_TRUE(result.hung) << CollectiveTypeName(type);
    ASSERT_EQ(result.rendezvous.size(), 1u);
    EXPECT_TRUE(result.rendezvous[0].mismatch);
    const HangReport report = AnalyzeHang(b.schedule, result);
    ASSERT_EQ(report.causes.size(), 1u);
    EXPECT_EQ(report.causes[0].kind, RootCauseKind::kMismatch);
    const std::string name(CollectiveTypeName(type));
    EXPECT_EQ(report.explanation[0], "rank 1 is in " + name + " #1 on 'world' (300 bytes, bf16) while ranks 0,2 are in " +
                                         name + " #1 on 'world' (100 bytes, bf16): size mismatch (SIZE_OR_SYNTAX_MISMATCH)");
  }
  // An all_to_all's sizes may differ, its dtype may not: still a mismatch, named as a dtype one.
  Builder b(2);
  b.Coll(0, 0, 100, CollectiveType::kAllToAll);
  traces::CollectiveOp c;
  c.type = CollectiveType::kAllToAll;
  c.bytes = 200;
  c.dtype = DType::kFloat32;
  b.Add(1, c);
  const SimulationResult result = b.Run(Launch10());
  ASSERT_TRUE(result.hung);
  const HangReport report = AnalyzeHang(b.schedule, result);
  ASSERT_EQ(report.causes.size(), 1u);
  EXPECT_EQ(report.explanation[0],
            "rank 0 is in all_to_all #1 on 'world' (bf16) while rank 1 is in all_to_all #1 on 'world' (fp32): dtype "
            "mismatch (COLLECTIVE_DTYPE_MISMATCH)");
}

// ---- OOM policy catch_and_sync (EngineConfig::oom_catch_and_sync, Composer automicrobatching)

// A 1-byte OOM-flag all_reduce (Composer's uint8 found_cuda_oom tensor), an agreement point.
CollectiveOp OomFlag() {
  CollectiveOp c;
  c.type = CollectiveType::kAllReduce;
  c.stream = 0;
  c.bytes = 1;
  c.dtype = DType::kInt8;
  c.oom_sync = true;
  return c;
}

// Three ranks share one program; rank 0's allocation (op 1) fails (injected):
//   op 0 all_reduce 50 | op 1 allocate a | op 2 kernel 30 | op 3 free a | op 4 OOM flag (1 ns)
//   | op 5 all_gather 100
Builder ProgramWithSyncPoint() {
  Builder b(3);
  b.Coll(0, 0, 50).Add(0, AllocateOp{0, kMiB, 0}).Kernel(0, 0, 30).Add(0, FreeOp{0});
  b.Add(0, OomFlag()).Coll(0, 0, 100, CollectiveType::kAllGather);
  for (int r = 1; r < 3; ++r) b.schedule.ranks[static_cast<size_t>(r)].program = 0;
  return b;
}

TEST(EngineOomPolicyTest, CaughtOomWithASyncPointStopsEveryRankCleanly) {
  // Rank 0: all_reduce #1 launched [0,10]; the allocation at 10 fails and is caught; it skips
  // ops 2-3 and launches the flag all_reduce (op 4) [10,20], then waits. Ranks 1-2: all_reduce
  // #1 [0,10], allocate at 10, kernel launched [10,20], free, flag [20,30], all_gather [30,40].
  // Device: all_reduce #1 runs 10..60 on every rank; ranks 1-2 run the kernel 60..90 and reach
  // the flag (all_reduce #2) at 90, rank 0 at 60: it runs 90..91. Rank 0 had run out of
  // memory, so every member stops there: no hang, although ranks 1-2 had queued the all_gather.
  for (bool memory : {false, true}) {
    Builder b = ProgramWithSyncPoint();
    EngineConfig config = memory ? WithMemory(1024 * kMiB, true) : Launch10();
    config.memory.device_alloc_ns = 0;
    config.oom_catch_and_sync = true;
    const SimulationResult clean = b.Run(config);
    ASSERT_FALSE(clean.hung) << "memory=" << memory;  // the flag is only an all_reduce then
    EXPECT_FALSE(clean.oom_agreed.has_value());
    config.inject_oom = InjectedOom{0, 1};
    const SimulationResult result = b.Run(config);
    EXPECT_FALSE(result.hung) << "memory=" << memory;
    EXPECT_TRUE(result.blocked.empty());
    ASSERT_TRUE(result.oom_agreed.has_value());
    const OomAgreement& agreed = *result.oom_agreed;
    EXPECT_EQ(agreed.communicator, 0);
    EXPECT_EQ(agreed.seq, 2);
    EXPECT_EQ(agreed.op_id, 4);
    EXPECT_EQ(agreed.time_ns, 91);
    EXPECT_EQ(agreed.oom_ranks, (std::vector<int32_t>{0}));
    EXPECT_EQ(agreed.ranks, (std::vector<int32_t>{0, 1, 2}));
    for (const RankStats& r : result.ranks) {
      EXPECT_TRUE(r.oom_handled);
      EXPECT_FALSE(r.finished);
    }
    ASSERT_TRUE(result.ranks[0].memory.oom.has_value());
    EXPECT_EQ(result.ranks[0].memory.oom->op_id, 1);
    EXPECT_FALSE(result.ranks[1].memory.oom.has_value());
    // Rank 0 never ran the kernel it skipped.
    EXPECT_EQ(result.ranks[0].compute_ns, 0);
    EXPECT_EQ(result.ranks[1].compute_ns, 30);
  }
}

TEST(EngineOomPolicyTest, RaiseKeepsTodaysBehaviourOnTheSameSchedule) {
  // Policy raise: rank 0 stops at op 1; ranks 1-2 wait in the flag all_reduce #2 for it.
  Builder b = ProgramWithSyncPoint();
  EngineConfig config = Launch10();
  config.inject_oom = InjectedOom{0, 1};
  const SimulationResult result = b.Run(config);
  ASSERT_TRUE(result.hung);
  EXPECT_FALSE(result.oom_agreed.has_value());
  ASSERT_EQ(result.blocked.size(), 3u);
  EXPECT_EQ(result.blocked[0].host_state.reason, HostBlockReason::kOutOfMemory);
  EXPECT_EQ(result.blocked[0].host_state.op_id, 1);
  for (const RankStats& r : result.ranks) EXPECT_FALSE(r.oom_handled);
}

TEST(EngineOomPolicyTest, CaughtOomWithoutHooksMismatchesThePeersAllGather) {
  // No sync hook inside the step, only Composer's end-of-batch agreement (op 4):
  //   op 0 all_reduce 50 | op 1 allocate a | op 2 all_gather 100 | op 3 free a | op 4 OOM flag
  // Rank 0 catches the OOM at op 1 (host time 10) and issues the flag at once: on 'world' its
  // collective #2 is the 1-byte all_reduce while ranks 1-2's #2 is the all_gather: a collective
  // type mismatch, the Composer FSDP deadlock.
  Builder b(3);
  b.Coll(0, 0, 50).Add(0, AllocateOp{0, kMiB, 0}).Coll(0, 0, 100, CollectiveType::kAllGather);
  b.Add(0, FreeOp{0}).Add(0, OomFlag());
  for (int r = 1; r < 3; ++r) b.schedule.ranks[static_cast<size_t>(r)].program = 0;
  EngineConfig config = Launch10();
  config.oom_catch_and_sync = true;
  config.inject_oom = InjectedOom{0, 1};
  const SimulationResult result = b.Run(config);
  ASSERT_TRUE(result.hung);
  EXPECT_FALSE(result.oom_agreed.has_value());
  ASSERT_EQ(result.rendezvous.size(), 1u);
  const PendingRendezvous& rv = result.rendezvous[0];
  EXPECT_EQ(rv.communicator, 0);
  EXPECT_EQ(rv.seq, 2);
  EXPECT_TRUE(rv.mismatch);
  ASSERT_EQ(rv.arrived.size(), 3u);
  std::map<int32_t, CollectiveType> types;
  for (const auto& arrival : rv.arrived) types[arrival.rank] = arrival.type;
  EXPECT_EQ(types[0], CollectiveType::kAllReduce);
  EXPECT_EQ(types[1], CollectiveType::kAllGather);
  EXPECT_EQ(types[2], CollectiveType::kAllGather);
  ASSERT_EQ(result.blocked.size(), 3u);
  EXPECT_EQ(result.blocked[0].host_state.reason, HostBlockReason::kOutOfMemory);
  EXPECT_EQ(result.blocked[0].host_state.op_id, 1);  // the op that ran out of memory
  // Rank 0 issued only the flag (#2); ranks 1-2 the all_gather (#2) and, their hosts running
  // ahead, the end-of-batch flag (#3) behind it.
  for (const BlockedRank& blocked : result.blocked) {
    ASSERT_EQ(blocked.pending.size(), blocked.rank == 0 ? 1u : 2u) << "rank " << blocked.rank;
    EXPECT_EQ(blocked.pending[0].second.seq, 2);
    EXPECT_EQ(blocked.pending[0].second.type,
              blocked.rank == 0 ? CollectiveType::kAllReduce : CollectiveType::kAllGather);
  }
  const HangReport report = AnalyzeHang(b.schedule, result);
  ASSERT_FALSE(report.explanation.empty());
  std::string all;
  for (const std::string& line : report.explanation) all += line + "\n";
  EXPECT_NE(all.find("mismatch"), std::string::npos) << all;
  EXPECT_NE(all.find("all_reduce #2"), std::string::npos) << all;
  EXPECT_NE(all.find("all_gather #2"), std::string::npos) << all;
}

TEST(EngineOomPolicyTest, APeerEnteringAnAllGatherBeforeTheSyncPointHangs) {
  // Hooks, but none before the second all_gather (op 5):
  //   op 0 flag | op 1 all_gather 100 | op 2 allocate a | op 3 free a | op 4 allocate b
  //   | op 5 all_gather 100 | op 6 flag | op 7 free b
  // Rank 0's allocation of b (op 4) fails: it skips to the flag (op 6), collective #3 on
  // 'world', while ranks 1-2 issue the all_gather (op 5) as their #3: a mismatch. With a flag
  // before op 5 (`hooked`) the ranks agree there instead.
  for (bool hooked : {false, true}) {
    Builder b(3);
    b.Add(0, OomFlag()).Coll(0, 0, 100, CollectiveType::kAllGather);
    b.Add(0, AllocateOp{0, kMiB, 0}).Add(0, FreeOp{0}).Add(0, AllocateOp{1, kMiB, 0});
    if (hooked) b.Add(0, OomFlag());
    b.Coll(0, 0, 100, CollectiveType::kAllGather).Add(0, OomFlag()).Add(0, FreeOp{1});
    for (int r = 1; r < 3; ++r) b.schedule.ranks[static_cast<size_t>(r)].program = 0;
    EngineConfig config = Launch10();
    config.oom_catch_and_sync = true;
    config.inject_oom = InjectedOom{0, 4};
    const SimulationResult result = b.Run(config);
    if (hooked) {
      EXPECT_FALSE(result.hung);
      ASSERT_TRUE(result.oom_agreed.has_value());
      EXPECT_EQ(result.oom_agreed->seq, 3);  // flag, all_gather, then the new flag (op 5)
      EXPECT_EQ(result.oom_agreed->op_id, 5);
      continue;
    }
    ASSERT_TRUE(result.hung) << (result.oom_agreed ? result.oom_agreed->seq : -1) << " "
                             << (result.oom_agreed ? result.oom_agreed->op_id : -1);
    ASSERT_EQ(result.rendezvous.size(), 1u);
    EXPECT_TRUE(result.rendezvous[0].mismatch);
    // Flight Recorder numbering: the flag #1, the all_gather #2, the contested one #3.
    EXPECT_EQ(result.rendezvous[0].seq, 3);
    for (const auto& arrival : result.rendezvous[0].arrived) {
      EXPECT_EQ(arrival.type, arrival.rank == 0 ? CollectiveType::kAllReduce : CollectiveType::kAllGather)
          << "rank " << arrival.rank;
    }
  }
}

TEST(EngineOomPolicyTest, CatchingIsDeterministic) {
  Builder b = ProgramWithSyncPoint();
  EngineConfig config = Launch10();
  config.oom_catch_and_sync = true;
  config.inject_oom = InjectedOom{2, 1};
  const SimulationResult first = b.Run(config);
  const SimulationResult second = b.Run(config);
  ASSERT_TRUE(first.oom_agreed.has_value());
  EXPECT_EQ(first.oom_agreed->oom_ranks, (std::vector<int32_t>{2}));
  EXPECT_EQ(first.oom_agreed->time_ns, second.oom_agreed->time_ns);
  EXPECT_EQ(first.events_processed, second.events_processed);
}

}  // namespace
}  // namespace shardscope::sim

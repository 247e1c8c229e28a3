// Exact timestamps for small schedules, computed by hand in the comments: streams, events,
// synchronization, collectives, contention, the launch queue.
#include "shardscope/sim/engine/engine.h"
#include "shardscope/sim/hangs/hang.h"

#include <gtest/gtest.h>

#include "engine_test_util.h"

namespace shardscope::sim {
namespace {

using namespace test_support::engine_tests;

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

TEST(EngineTest, IdenticalRanksHashEqualAndRunsAreDeterministic) {
  Builder b(2);
  for (int r = 0; r < 2; ++r) b.Kernel(r, 0, 100).Coll(r, 1, 70).Kernel(r, 0, 33);
  SimulationResult first = b.Run(Launch10());
  SimulationResult second = b.Run(Launch10());
  EXPECT_EQ(first.ranks[0].timeline_hash, first.ranks[1].timeline_hash);
  EXPECT_EQ(first.ranks[0].timeline_hash, second.ranks[0].timeline_hash);
  EXPECT_EQ(first.makespan_ns, second.makespan_ns);
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

}  // namespace
}  // namespace shardscope::sim

// The OOM policy catch_and_sync (EngineConfig::oom_catch_and_sync), by hand.
#include "shardscope/sim/engine/engine.h"
#include "shardscope/sim/hangs/hang.h"

#include <gtest/gtest.h>

#include "engine_test_util.h"

namespace shardscope::sim {
namespace {

using namespace test_support::engine_tests;

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
  ShareRankZerosProgram(b);
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
  ShareRankZerosProgram(b);
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
    ShareRankZerosProgram(b);
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

// Faults (EngineConfig::inject_oom, rank_slowdown) and straggler attribution, by hand.
#include "shardscope/sim/engine/engine.h"
#include "shardscope/sim/hangs/hang.h"

#include <gtest/gtest.h>

#include "engine_test_util.h"

namespace shardscope::sim {
namespace {

using namespace test_support::engine_tests;

// ---- Fault injection (EngineConfig::inject_oom, rank_slowdown)

// Three ranks share one program: all_reduce (50 ns) [op 0], allocate a 1 MiB [op 1],
// all_gather (100 ns) [op 2], free a [op 3]. The fault makes op 1 of rank 0 fail.
Builder SharedProgramWithAllocation() {
  Builder b(3);
  b.Coll(0, 0, 50).Add(0, AllocateOp{0, kMiB, 0}).Coll(0, 0, 100, CollectiveType::kAllGather).Add(0, FreeOp{0});
  ShareRankZerosProgram(b);
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

}  // namespace
}  // namespace shardscope::sim

// Hang analysis on small hand-written schedules: each test states by hand which ranks block,
// where, at which per-communicator sequence number, and why.
#include "shardscope/sim/hangs/hang.h"

#include <gtest/gtest.h>

#include <iostream>
#include <set>

#include "engine_test_support.h"

namespace shardscope::sim {
namespace {

using namespace traces;
using Builder = test_support::ScheduleBuilder;
using test_support::Launch10;

constexpr int64_t kMiB = int64_t{1} << 20;

const BlockedRank& BlockedOf(const SimulationResult& result, int32_t rank) {
  for (const BlockedRank& b : result.blocked) {
    if (b.rank == rank) return b;
  }
  ADD_FAILURE() << "rank " << rank << " is not blocked";
  return result.blocked.front();
}

std::vector<int32_t> BlockedRanks(const SimulationResult& result) {
  std::vector<int32_t> ranks;
  for (const BlockedRank& b : result.blocked) ranks.push_back(b.rank);
  return ranks;
}

TEST(HangTest, CompressRanks) {
  EXPECT_EQ(CompressRanks({0, 1, 2, 4, 5, 6, 7}), "0-2,4-7");
  EXPECT_EQ(CompressRanks({3}), "3");
  EXPECT_EQ(CompressRanks({5, 1, 3, 2}), "1-3,5");
  EXPECT_EQ(CompressRanks({}), "");
}

TEST(HangTest, OutOfMemoryRankLeavesPeersInTheNextCollective) {
  // 4 ranks: all_reduce #1 (50 ns), then an allocation (rank 3: 64 MiB on a 40 MiB device,
  // others 1 MiB, never freed: live since the warm-up step, so free of cost), then all_gather
  // #2. Rank 3 stops at its allocation (op 1); ranks 0-2 arrive in all_gather #2 and wait.
  Builder b(4, {"world"});
  for (int r = 0; r < 4; ++r) {
    b.CollOn(r, 0, 0, 50);
    b.Add(r, AllocateOp{0, r == 3 ? 64 * kMiB : kMiB, 0});
    b.CollOn(r, 0, 0, 100, CollectiveType::kAllGather);
  }
  EngineConfig config = Launch10();
  config.memory.enabled = true;
  config.memory.capacity_bytes = {40 * kMiB};
  CollectiveRecorder recorder(b.schedule, {0, 3});
  const SimulationResult result = b.Run(config, &recorder);
  ASSERT_TRUE(result.hung);
  EXPECT_EQ(BlockedRanks(result), (std::vector<int32_t>{0, 1, 2, 3}));
  const BlockedRank& oom = BlockedOf(result, 3);
  EXPECT_EQ(oom.host_state.reason, HostBlockReason::kOutOfMemory);
  EXPECT_EQ(oom.host_state.op_id, 1);
  EXPECT_TRUE(oom.pending.empty());  // all_reduce #1 finished; all_gather #2 never issued
  for (int32_t r = 0; r < 3; ++r) {
    const BlockedRank& waiting = BlockedOf(result, r);
    EXPECT_EQ(waiting.host_state.reason, HostBlockReason::kFinished);
    ASSERT_EQ(waiting.stream_states.size(), 1u);
    const BlockedStream& s = waiting.stream_states[0];
    EXPECT_EQ(s.reason, StreamWaitReason::kRendezvous);
    ASSERT_TRUE(s.collective.has_value());
    EXPECT_EQ(s.collective->seq, 2);
    EXPECT_EQ(s.collective->type, CollectiveType::kAllGather);
    // Launched at [10, 20] after the all-reduce's launch [0, 10]; arrives when all_reduce
    // #1 (started at 10 on every rank, 50 ns) ends at 60.
    EXPECT_EQ(s.collective->enqueued_ns, 10);
    EXPECT_EQ(s.collective->arrived_ns, 60);
    ASSERT_EQ(waiting.lanes.size(), 1u);
    EXPECT_EQ(waiting.lanes[0].issued, 2);
    EXPECT_EQ(waiting.lanes[0].completed, 1);
  }
  ASSERT_EQ(result.rendezvous.size(), 1u);
  EXPECT_EQ(result.rendezvous[0].seq, 2);
  EXPECT_EQ(result.rendezvous[0].arrived.size(), 3u);

  const HangReport report = AnalyzeHang(b.schedule, result);
  for (const std::string& line : report.explanation) std::cout << "explanation: " << line << "\n";
  ASSERT_EQ(report.causes.size(), 1u);
  EXPECT_EQ(report.causes[0].kind, RootCauseKind::kOutOfMemory);
  EXPECT_EQ(report.causes[0].ranks, (std::vector<int32_t>{3}));
  EXPECT_EQ(report.causes[0].waiting_ranks, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_TRUE(report.cycles.empty());
  EXPECT_EQ(report.explanation[0].rfind("rank 3 stopped: out of memory at op 1, allocating 'a', 64.00 MiB requested, 40.00 MiB free", 0), 0u)
      << report.explanation[0];
  EXPECT_NE(report.explanation[0].find("; ranks 0-2 wait in all_gather #2 on 'world' for rank 3"), std::string::npos)
      << report.explanation[0];
  // The watchdog (10 minutes) fires on the oldest pending collective: all_gather #2, launched
  // at 10 ns on rank 0 (the lowest of ranks 0-2, all equal).
  EXPECT_EQ(report.watchdog_fires_at_ns, 10 + int64_t{600} * 1'000'000'000);
  EXPECT_EQ(report.watchdog_rank, 0);
  EXPECT_EQ(report.watchdog_seq, 2);

  // Rank 0's Flight Recorder: all_reduce #1 completed [10, 60], all_gather #2 started at 60.
  const std::string fr = FlightRecorderJson(b.schedule, result, 0, &recorder);
  EXPECT_NE(fr.find("\"version\": \"2.10\""), std::string::npos);
  EXPECT_NE(fr.find("\"profiling_name\": \"nccl:all_reduce\""), std::string::npos);
  EXPECT_NE(fr.find("\"profiling_name\": \"nccl:all_gather\""), std::string::npos);
  EXPECT_NE(fr.find("\"collective_seq_id\": 2"), std::string::npos);
  EXPECT_NE(fr.find("\"state\": \"started\""), std::string::npos);
  EXPECT_NE(fr.find("\"time_discovered_completed_ns\": 60"), std::string::npos) << fr;
  EXPECT_NE(fr.find("\"time_discovered_started_ns\": 60"), std::string::npos);
  EXPECT_NE(fr.find("\"last_enqueued_collective\": 2"), std::string::npos);
  EXPECT_NE(fr.find("\"last_completed_collective\": 1"), std::string::npos);
  // all_gather of 100 bytes bf16 = 50 elements gathered over 4 ranks: input 12, output 50.
  EXPECT_NE(fr.find("\"timeout_ms\": 600000"), std::string::npos);
  // Rank 3 stopped before issuing all_gather #2: one completed entry.
  const std::string fr3 = FlightRecorderJson(b.schedule, result, 3, &recorder);
  EXPECT_EQ(fr3.find("nccl:all_gather"), std::string::npos);
  EXPECT_NE(fr3.find("\"last_completed_collective\": 1"), std::string::npos);
}

TEST(HangTest, CollectiveTypeMismatchAtTheSameSequenceNumber) {
  // all_reduce #1 on every rank, then #2 is an all_gather on ranks 0-2 and an all_reduce on
  // rank 3: the rendezvous gathers all four and never starts.
  Builder b(4, {"dp"});
  for (int r = 0; r < 4; ++r) {
    b.CollOn(r, 0, 0, 50);
    b.CollOn(r, 0, 0, 100, r == 3 ? CollectiveType::kAllReduce : CollectiveType::kAllGather);
  }
  const SimulationResult result = b.Run(Launch10());
  ASSERT_TRUE(result.hung);
  EXPECT_EQ(BlockedRanks(result), (std::vector<int32_t>{0, 1, 2, 3}));
  for (int32_t r = 0; r < 4; ++r) {
    const BlockedRank& blocked = BlockedOf(result, r);
    ASSERT_EQ(blocked.stream_states.size(), 1u);
    ASSERT_TRUE(blocked.stream_states[0].collective.has_value());
    EXPECT_EQ(blocked.stream_states[0].collective->seq, 2);
  }
  ASSERT_EQ(result.rendezvous.size(), 1u);
  EXPECT_TRUE(result.rendezvous[0].mismatch);
  EXPECT_EQ(result.rendezvous[0].seq, 2);
  const HangReport report = AnalyzeHang(b.schedule, result);
  for (const std::string& line : report.explanation) std::cout << "explanation: " << line << "\n";
  ASSERT_EQ(report.causes.size(), 1u);
  EXPECT_EQ(report.causes[0].kind, RootCauseKind::kMismatch);
  EXPECT_EQ(report.causes[0].seq, 2);
  EXPECT_EQ(report.causes[0].ranks, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(report.explanation[0],
            "rank 3 is in all_reduce #2 on 'dp' (100 bytes, bf16) while ranks 0-2 are in all_gather #2 on 'dp' "
            "(100 bytes, bf16): collective type mismatch (COLLECTIVE_TYPE_MISMATCH)");
}

TEST(HangTest, TwoCommunicatorsEnteredInOppositeOrdersFormACycle) {
  // One stream per rank. Rank 0 issues x then y, rank 1 issues y then x: rank 0's stream
  // waits in x #1 for rank 1, whose stream is behind y #1, which waits for rank 0, whose
  // stream is behind x #1.
  Builder b(2, {"x", "y"});
  b.CollOn(0, 0, 0, 50).CollOn(0, 1, 0, 50);
  b.CollOn(1, 1, 0, 50).CollOn(1, 0, 0, 50);
  const SimulationResult result = b.Run(Launch10());
  ASSERT_TRUE(result.hung);
  EXPECT_EQ(BlockedRanks(result), (std::vector<int32_t>{0, 1}));
  const BlockedRank& r0 = BlockedOf(result, 0);
  ASSERT_TRUE(r0.stream_states[0].collective.has_value());
  EXPECT_EQ(r0.stream_states[0].collective->communicator, 0);
  EXPECT_EQ(r0.stream_states[0].collective->seq, 1);
  EXPECT_EQ(r0.pending.size(), 2u);
  const BlockedRank& r1 = BlockedOf(result, 1);
  EXPECT_EQ(r1.stream_states[0].collective->communicator, 1);
  EXPECT_EQ(r1.stream_states[0].collective->seq, 1);
  const HangReport report = AnalyzeHang(b.schedule, result);
  for (const std::string& line : report.explanation) std::cout << "explanation: " << line << "\n";
  ASSERT_EQ(report.cycles.size(), 1u);
  EXPECT_EQ(report.cycles[0].size(), 4u);  // two streams, two rendezvous
  ASSERT_EQ(report.causes.size(), 1u);
  EXPECT_EQ(report.causes[0].kind, RootCauseKind::kCycle);
  EXPECT_EQ(report.causes[0].ranks, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(report.explanation[0].rfind("deadlock cycle: ", 0), 0u);
  EXPECT_NE(report.explanation[0].find("rank 0 waits in all_reduce #1 on 'x' for rank 1, whose stream 's0' is "
                                       "behind all_reduce #1 on 'y'"),
            std::string::npos)
      << report.explanation[0];
  EXPECT_NE(report.explanation[0].find("rank 1 waits in all_reduce #1 on 'y' for rank 0, whose stream 's0' is "
                                       "behind all_reduce #1 on 'x'"),
            std::string::npos)
      << report.explanation[0];
}

TEST(HangTest, OppositeOrdersOnSeparateStreamsDoNotHang) {
  // The same opposite orders with each communicator on its own stream: every collective
  // reaches its stream's head at once (NCCL orders only one communicator's work): no hang.
  Builder b(2, {"x", "y"});
  b.CollOn(0, 0, 0, 50).CollOn(0, 1, 1, 50);
  b.CollOn(1, 1, 1, 50).CollOn(1, 0, 0, 50);
  const SimulationResult result = b.Run(Launch10());
  EXPECT_FALSE(result.hung);
  EXPECT_TRUE(AnalyzeHang(b.schedule, result).causes.empty());
}

TEST(HangTest, StreamWaitsOnAnEventWhoseRecordNeverExecutes) {
  // Rank 0: all_reduce #1 on s1, then record e0 on s1; s0 waits for e0; the host
  // synchronizes the device. Rank 1 never enters the all_reduce. The record is stuck behind
  // the collective, so s0 waits for an event that is never recorded on the device. (A wait on
  // an event never recorded at all is a no-op in CUDA, and ValidateSchedule rejects it.)
  Builder b(2, {"world"});
  b.CollOn(0, 0, 1, 50).Add(0, EventRecordOp{0, 1}).Add(0, StreamWaitEventOp{0, 0});
  b.Add(0, KernelOp{0, FixedDurationDesc{20}}).Add(0, DeviceSynchronizeOp{});
  b.Add(1, KernelOp{0, FixedDurationDesc{20}});
  const SimulationResult result = b.Run(Launch10());
  ASSERT_TRUE(result.hung);
  EXPECT_EQ(BlockedRanks(result), (std::vector<int32_t>{0}));
  const BlockedRank& r0 = BlockedOf(result, 0);
  EXPECT_EQ(r0.host_state.reason, HostBlockReason::kDeviceSynchronize);
  EXPECT_EQ(r0.host_state.op_id, 4);
  ASSERT_EQ(r0.stream_states.size(), 2u);
  const BlockedStream& s0 = r0.stream_states[0];
  EXPECT_EQ(s0.stream, 0);
  EXPECT_EQ(s0.reason, StreamWaitReason::kEventRecord);
  EXPECT_EQ(s0.event, 0);
  EXPECT_EQ(s0.record_stream, 1);
  EXPECT_EQ(s0.record_op_index, 1);
  const BlockedStream& s1 = r0.stream_states[1];
  EXPECT_EQ(s1.reason, StreamWaitReason::kRendezvous);
  EXPECT_EQ(s1.collective->seq, 1);
  const HangReport report = AnalyzeHang(b.schedule, result);
  for (const std::string& line : report.explanation) std::cout << "explanation: " << line << "\n";
  ASSERT_EQ(report.causes.size(), 1u);
  EXPECT_EQ(report.causes[0].kind, RootCauseKind::kNeverIssued);
  EXPECT_EQ(report.causes[0].ranks, (std::vector<int32_t>{1}));
  EXPECT_EQ(report.causes[0].waiting_ranks, (std::vector<int32_t>{0}));
  EXPECT_EQ(report.explanation[0],
            "rank 1 finished its program without entering all_reduce #1 on 'world' (its program issues 0 "
            "collective(s) there); rank 0 waits in all_reduce #1 on 'world' for rank 1");
  // The wait-for chain: host -> s0 -> event e0 -> s1 -> the rendezvous -> rank 1's host.
  bool event_edge = false;
  for (const WaitEdge& e : report.edges) {
    if (report.vertices[e.from].label == "rank 0 stream 's0'" && report.vertices[e.to].label == "rank 0 event 'e0'") {
      event_edge = true;
    }
  }
  EXPECT_TRUE(event_edge);
}

TEST(HangTest, HalfArrivedSendNamesTheSideThatNeverPosted) {
  // On 'pp': ranks 0 -> 1 send/recv (they match and finish); rank 2 sends to rank 3, which
  // runs a kernel and finishes without posting the recv. Rank 2's send reaches its stream's
  // head at 10 (launch [0,10]) and waits there.
  Builder b(4, {"pp"});
  b.P2p(0, CollectiveType::kSend, 1, 40).P2p(1, CollectiveType::kRecv, 0, 40);
  b.P2p(2, CollectiveType::kSend, 3, 30);
  b.Kernel(3, 0, 20);
  const SimulationResult result = b.Run(Launch10());
  ASSERT_TRUE(result.hung);
  EXPECT_EQ(BlockedRanks(result), (std::vector<int32_t>{2}));
  const BlockedStream& s = BlockedOf(result, 2).stream_states.at(0);
  EXPECT_EQ(s.reason, StreamWaitReason::kRendezvous);
  ASSERT_TRUE(s.collective.has_value());
  EXPECT_EQ(s.collective->type, CollectiveType::kSend);
  EXPECT_EQ(s.collective->peer, 3);
  EXPECT_EQ(s.collective->p2p_seq, 1);
  EXPECT_EQ(s.since_ns, 10);
  const HangReport report = AnalyzeHang(b.schedule, result);
  for (const std::string& line : report.explanation) std::cout << "explanation: " << line << "\n";
  ASSERT_EQ(report.p2p.size(), 1u);
  EXPECT_EQ(report.p2p[0].rank, 2);
  EXPECT_EQ(report.p2p[0].peer, 3);
  EXPECT_EQ(report.p2p[0].type, CollectiveType::kSend);
  EXPECT_EQ(report.p2p[0].p2p_seq, 1);
  EXPECT_EQ(report.p2p[0].arrived_ns, 10);
  const std::string expected =
      "rank 2 is in send to rank 3 on 'pp' (p2p_seq_id 1); rank 3 never posted the matching recv (it finished its "
      "program)";
  EXPECT_EQ(report.p2p[0].text, expected);
  ASSERT_EQ(report.causes.size(), 1u);
  EXPECT_EQ(report.causes[0].kind, RootCauseKind::kNeverIssued);
  EXPECT_EQ(report.causes[0].ranks, (std::vector<int32_t>{3}));
  EXPECT_EQ(report.causes[0].waiting_ranks, (std::vector<int32_t>{2}));
  EXPECT_EQ(report.explanation, (std::vector<std::string>{expected}));
  EXPECT_NE(HangReportJson(b.schedule, report).find("\"p2p\":[{\"rank\":2,\"op\":\"send\",\"peer\":3"),
            std::string::npos);
  // Flight Recorder names p2p work with the ranks in the group: "nccl:send 2->3".
  EXPECT_NE(FlightRecorderJson(b.schedule, result, 2, nullptr).find("\"profiling_name\": \"nccl:send 2->3\""),
            std::string::npos);
}

TEST(HangTest, HalfArrivedRecvWhoseSenderRanOutOfMemory) {
  // Rank 3 posts a recv from rank 2; rank 2 runs out of memory (injected) at its first op, an
  // allocation of 1 MiB, before its send.
  Builder b(4, {"pp"});
  b.Add(2, AllocateOp{0, kMiB, 0}).P2p(2, CollectiveType::kSend, 3, 30);
  b.P2p(3, CollectiveType::kRecv, 2, 30);
  EngineConfig config = Launch10();
  config.inject_oom = InjectedOom{2, 0};
  const SimulationResult result = b.Run(config);
  ASSERT_TRUE(result.hung);
  EXPECT_EQ(BlockedRanks(result), (std::vector<int32_t>{2, 3}));
  const HangReport report = AnalyzeHang(b.schedule, result);
  for (const std::string& line : report.explanation) std::cout << "explanation: " << line << "\n";
  ASSERT_EQ(report.p2p.size(), 1u);
  EXPECT_EQ(report.p2p[0].text,
            "rank 3 is in recv from rank 2 on 'pp' (p2p_seq_id 1); rank 2 never posted the matching send (it stopped: "
            "out of memory at op 0, allocating 'a')");
  ASSERT_EQ(report.causes.size(), 1u);
  EXPECT_EQ(report.causes[0].kind, RootCauseKind::kOutOfMemory);
  EXPECT_EQ(report.explanation[0],
            "rank 2 stopped: injected out of memory at op 0, allocating 'a', 1.00 MiB requested, 0.00 MiB free; rank 3 "
            "waits in recv from rank 2 on 'pp' (p2p_seq_id 1)");
}

TEST(HangTest, TwoRanksSendingFirstToEachOtherFormACycle) {
  // Ranks 0 and 1 each send to the other, then receive: both sends reach their stream's head
  // at 10 and wait for a recv queued behind them on the same communicator.
  Builder b(2, {"pp"});
  b.P2p(0, CollectiveType::kSend, 1, 30).P2p(0, CollectiveType::kRecv, 1, 30);
  b.P2p(1, CollectiveType::kSend, 0, 30).P2p(1, CollectiveType::kRecv, 0, 30);
  const SimulationResult result = b.Run(Launch10());
  ASSERT_TRUE(result.hung);
  const HangReport report = AnalyzeHang(b.schedule, result);
  for (const std::string& line : report.explanation) std::cout << "explanation: " << line << "\n";
  ASSERT_EQ(report.p2p.size(), 2u);
  EXPECT_EQ(report.p2p[0].text,
            "rank 0 is in send to rank 1 on 'pp' (p2p_seq_id 1); rank 1 issued the matching recv but its stream 's0' "
            "is behind send to rank 0 on 'pp' (p2p_seq_id 1)");
  ASSERT_EQ(report.causes.size(), 1u);
  EXPECT_EQ(report.causes[0].kind, RootCauseKind::kCycle);
  EXPECT_EQ(report.causes[0].ranks, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(report.explanation[0],
            "deadlock cycle: rank 0 waits in send to rank 1 on 'pp' (p2p_seq_id 1) for rank 1, whose stream 's0' is "
            "behind send to rank 0 on 'pp' (p2p_seq_id 1); rank 1 waits in send to rank 0 on 'pp' (p2p_seq_id 1) for "
            "rank 0, whose stream 's0' is behind send to rank 1 on 'pp' (p2p_seq_id 1) (a send or recv waits for its "
            "matching op; NCCL runs each communicator's work in order per rank, so an op issued behind it never comes)");
}

// A 1-byte OOM-flag all_reduce (Composer's found_cuda_oom) on communicator slot `slot`.
CollectiveOp OomFlagOn(int32_t slot) {
  CollectiveOp c;
  c.type = CollectiveType::kAllReduce;
  c.comm = slot;
  c.bytes = 1;
  c.dtype = DType::kInt8;
  c.oom_sync = true;
  return c;
}

TEST(HangTest, CaughtOomWaitsInItsFlagWhilePeersWentOn) {
  // catch_and_sync without a sync hook in the step (engine_test's
  // CaughtOomWithoutHooksMismatchesThePeersAllGather):
  //   op 0 all_reduce 50 | op 1 allocate a | op 2 all_gather 100 | op 3 free a | op 4 OOM flag
  // Rank 0 catches the OOM at op 1 and issues the flag: its collective #2 on 'world' is the
  // flag, ranks 1-2's #2 the all_gather. Rank 0 has not left: it waits in its flag.
  Builder b(3);
  b.Coll(0, 0, 50).Add(0, AllocateOp{0, kMiB, 0}).Coll(0, 0, 100, CollectiveType::kAllGather);
  b.Add(0, FreeOp{0}).Add(0, OomFlagOn(0));
  for (int r = 1; r < 3; ++r) b.schedule.ranks[static_cast<size_t>(r)].program = 0;
  EngineConfig config = Launch10();
  config.oom_catch_and_sync = true;
  config.inject_oom = InjectedOom{0, 1};
  const SimulationResult result = b.Run(config);
  ASSERT_TRUE(result.hung);
  const BlockedHost& host = BlockedOf(result, 0).host_state;
  EXPECT_EQ(host.reason, HostBlockReason::kOutOfMemory);
  EXPECT_TRUE(host.oom_caught);
  EXPECT_EQ(host.op_index, 1);
  EXPECT_EQ(host.oom_sync_op_index, 4);
  EXPECT_EQ(host.stream, 0);
  const HangReport report = AnalyzeHang(b.schedule, result);
  for (const std::string& line : report.explanation) std::cout << "explanation: " << line << "\n";
  ASSERT_EQ(report.causes.size(), 1u);
  EXPECT_EQ(report.causes[0].kind, RootCauseKind::kMismatch);
  EXPECT_EQ(report.explanation,
            (std::vector<std::string>{
                "rank 0 caught an out-of-memory error at op 1, allocating 'a' (oom.policy catch_and_sync) and waits in "
                "its OOM-flag all_reduce #2 on 'world'; ranks 1-2 went on into all_gather #2 on 'world': collective "
                "type mismatch (COLLECTIVE_TYPE_MISMATCH)"}));
  // Its Flight Recorder holds what it issued: all_reduce #1 and the flag, not the skipped
  // all_gather.
  const std::string fr = FlightRecorderJson(b.schedule, result, 0, nullptr);
  EXPECT_EQ(fr.find("nccl:all_gather"), std::string::npos) << fr;
  EXPECT_NE(fr.find("\"last_enqueued_collective\": 2"), std::string::npos) << fr;
}

TEST(HangTest, CaughtOomOnAnotherCommunicatorIsACycleNotALeave) {
  // Two communicators over 3 ranks: the step's all_gathers on 'dp', the OOM flag on 'world'.
  //   op 0 all_gather 100 on 'dp' | op 1 allocate a | op 2 all_gather 100 on 'dp' | op 3 free a
  //   | op 4 OOM flag on 'world'
  // All run all_gather #1 10..110. Rank 0 catches the OOM at op 1 and waits in its flag,
  // all_reduce #1 on 'world' (at its stream's head at 110); ranks 1-2 wait in all_gather #2 on
  // 'dp' for rank 0, their flags queued behind it: a cycle through rank 0's host.
  Builder b(3, {"world", "dp"});
  b.CollOn(0, 1, 0, 100, CollectiveType::kAllGather).Add(0, AllocateOp{0, kMiB, 0});
  b.CollOn(0, 1, 0, 100, CollectiveType::kAllGather).Add(0, FreeOp{0}).Add(0, OomFlagOn(0));
  for (int r = 1; r < 3; ++r) b.schedule.ranks[static_cast<size_t>(r)].program = 0;
  EngineConfig config = Launch10();
  config.oom_catch_and_sync = true;
  config.inject_oom = InjectedOom{0, 1};
  const SimulationResult result = b.Run(config);
  ASSERT_TRUE(result.hung);
  const HangReport report = AnalyzeHang(b.schedule, result);
  for (const std::string& line : report.explanation) std::cout << "explanation: " << line << "\n";
  ASSERT_EQ(report.causes.size(), 1u);
  EXPECT_EQ(report.causes[0].kind, RootCauseKind::kCycle);
  ASSERT_EQ(report.explanation.size(), 1u);
  const std::string& line = report.explanation[0];
  EXPECT_EQ(line.rfind("rank 0 caught an out-of-memory error at op 1, allocating 'a' (oom.policy catch_and_sync) and "
                       "waits in its OOM-flag all_reduce #1 on 'world'; ranks 1-2 went on into all_gather #2 on 'dp'; "
                       "deadlock cycle: ",
                       0),
            0u)
      << line;
  EXPECT_EQ(line.find("stopped: out of memory"), std::string::npos) << line;
  EXPECT_NE(line.find("ranks 1-2 wait in all_gather #2 on 'dp' for rank 0"), std::string::npos) << line;
}

TEST(HangTest, TraceDrawsTheWaitForGraphAsFlows) {
  // The opposite-orders cycle: both ranks' stream 's0' (tid 1) wait at their rendezvous from 10
  // (launches [0,10]); each waits for the other's stream. The hosts finished issuing at 20,
  // the makespan: the hang slices run from 10 to 20 + 1 us.
  {
    Builder b(2, {"x", "y"});
    b.CollOn(0, 0, 0, 50).CollOn(0, 1, 0, 50);
    b.CollOn(1, 1, 0, 50).CollOn(1, 0, 0, 50);
    const SimulationResult result = b.Run(Launch10());
    ASSERT_TRUE(result.hung);
    EXPECT_EQ(result.makespan_ns, 20);
    traces::Timeline timeline;
    WriteHangTrace(b.schedule, result, AnalyzeHang(b.schedule, result), {0, 1}, timeline);
    ASSERT_EQ(timeline.slices.size(), 2u);
    for (int32_t rank = 0; rank < 2; ++rank) {
      const traces::Slice& slice = timeline.slices[static_cast<size_t>(rank)];
      EXPECT_EQ(slice.pid, rank);
      EXPECT_EQ(slice.tid, 1);
      EXPECT_EQ(slice.ts_ns, 10);
      EXPECT_EQ(slice.dur_ns, 1'010);
      EXPECT_EQ(slice.raw_category, "hang");
      EXPECT_EQ(slice.name.rfind("hang: stream 's0': op 0 ", 0), 0u) << slice.name;
      EXPECT_EQ(slice.op_id, 0);
    }
    ASSERT_EQ(timeline.flows.size(), 2u);
    const int64_t base = int64_t{1} << 62;
    EXPECT_EQ(timeline.flows[0], (traces::Flow{base, "waits for", "hang", 0, 1, 11, 1, 1, 11}));
    EXPECT_EQ(timeline.flows[1], (traces::Flow{base + 1, "waits for", "hang", 1, 1, 11, 0, 1, 11}));
  }
  // A peer that finished its program without entering: rank 0's stream waits from 10 for rank
  // 1's host, which finished when its 20 ns kernel ended (10..30). The flow ends 1 ns into
  // rank 1's slice (31); the slices end at 30 + 1 us. Untraced ranks get neither.
  {
    Builder b(2);
    b.Coll(0, 0, 50);
    b.Kernel(1, 0, 20);
    const SimulationResult result = b.Run(Launch10());
    ASSERT_TRUE(result.hung);
    EXPECT_EQ(result.makespan_ns, 30);
    const HangReport report = AnalyzeHang(b.schedule, result);
    traces::Timeline timeline;
    WriteHangTrace(b.schedule, result, report, {0, 1}, timeline);
    ASSERT_EQ(timeline.slices.size(), 2u);
    EXPECT_EQ(timeline.slices[0].pid, 0);
    EXPECT_EQ(timeline.slices[0].tid, 1);
    EXPECT_EQ(timeline.slices[0].ts_ns, 10);
    EXPECT_EQ(timeline.slices[0].dur_ns, 1'020);
    EXPECT_EQ(timeline.slices[1].pid, 1);
    EXPECT_EQ(timeline.slices[1].tid, 0);
    EXPECT_EQ(timeline.slices[1].ts_ns, 30);
    EXPECT_EQ(timeline.slices[1].dur_ns, 1'000);
    EXPECT_EQ(timeline.slices[1].name, "hang: host finished its program");
    ASSERT_EQ(timeline.flows.size(), 1u);
    EXPECT_EQ(timeline.flows[0], (traces::Flow{int64_t{1} << 62, "waits for", "hang", 0, 1, 11, 1, 0, 31}));
    traces::Timeline only_rank0;
    WriteHangTrace(b.schedule, result, report, {0}, only_rank0);
    EXPECT_EQ(only_rank0.slices.size(), 1u);
    EXPECT_TRUE(only_rank0.flows.empty());
  }
  // A mismatch (rank 3 in all_reduce #2, ranks 0-2 in all_gather #2; all arrive at 60 when
  // all_reduce #1, 10..60, ends): the rendezvous is a root of the graph; on the trace each side
  // waits for the other: 0, 1, 2 -> 3 and 3 -> 0, 1, 2, all at 61.
  {
    Builder b(4, {"dp"});
    for (int r = 0; r < 4; ++r) {
      b.CollOn(r, 0, 0, 50);
      b.CollOn(r, 0, 0, 100, r == 3 ? CollectiveType::kAllReduce : CollectiveType::kAllGather);
    }
    const SimulationResult result = b.Run(Launch10());
    traces::Timeline timeline;
    WriteHangTrace(b.schedule, result, AnalyzeHang(b.schedule, result), {0, 1, 2, 3}, timeline);
    EXPECT_EQ(timeline.slices.size(), 4u);
    std::set<std::pair<int32_t, int32_t>> pairs;
    for (const traces::Flow& flow : timeline.flows) {
      pairs.insert({flow.from_pid, flow.to_pid});
      EXPECT_EQ(flow.from_ts_ns, 61);
      EXPECT_EQ(flow.to_ts_ns, 61);
      EXPECT_EQ(flow.from_tid, 1);
      EXPECT_EQ(flow.to_tid, 1);
    }
    EXPECT_EQ(timeline.flows.size(), 6u);
    EXPECT_EQ(pairs, (std::set<std::pair<int32_t, int32_t>>{{0, 3}, {1, 3}, {2, 3}, {3, 0}, {3, 1}, {3, 2}}));
  }
}

}  // namespace
}  // namespace shardscope::sim

#include "shardscope/runtime/execution_plan.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "flight_recorder.h"
#include "plan_test_util.h"
#include "shardscope/sim/lowering/lowering.h"
#include "shardscope/sim/plan/plan.h"

namespace shardscope::runtime {
namespace {

using traces::CollectiveOp;
using traces::CollectiveType;
using traces::DType;

using test_util::Coll;
using test_util::FakeCosts;
using test_util::MakeOp;

// Four ranks, one program. Communicators: 0 "world" {0,1,2,3}; 1 "pair" {2,3}; 2 "reversed"
// {3,1} (NCCL rank order differs from global order); 3 "unused" {0,1}. Ranks 0 and 1 bind slot
// "pair" to a communicator of their own... they are not in it, so the program only uses
// "world" on every rank and "pair"/"reversed" on rank 3.
traces::Schedule FourRankSchedule() {
  traces::Schedule s;
  s.communicators = {{"world", {0, 1, 2, 3}}, {"pair", {2, 3}}, {"reversed", {3, 1}}, {"unused", {0, 1}}};
  traces::Program world_only;
  world_only.name = "world_only";
  world_only.streams = {{"compute", 0}, {"comm", -1}};
  world_only.events = {"ag_done"};
  world_only.tensors = {"buf"};
  world_only.comm_slots = {"world"};
  world_only.ops.push_back(MakeOp(10, traces::AllocateOp{0, 3000, 0}));
  world_only.ops.push_back(MakeOp(11, Coll(CollectiveType::kAllGather, 0, 4096, DType::kBFloat16)));
  world_only.ops.push_back(MakeOp(12, traces::EventRecordOp{0, 1}));
  world_only.ops.push_back(MakeOp(13, traces::StreamWaitEventOp{0, 0}));
  world_only.ops.push_back(MakeOp(14, traces::KernelOp{0, traces::GemmDesc{123, 8, 8, 1, DType::kBFloat16}}));
  world_only.ops.push_back(MakeOp(15, Coll(CollectiveType::kReduceScatter, 0, 8192, DType::kFloat32)));
  world_only.ops.push_back(MakeOp(16, traces::MemcpyOp{traces::MemcpyKind::kDeviceToHost, 0, 555}));
  world_only.ops.push_back(MakeOp(17, traces::HostWorkOp{999}));
  world_only.ops.push_back(MakeOp(18, traces::FreeOp{0}));
  world_only.ops.push_back(MakeOp(19, traces::DeviceSynchronizeOp{}));

  traces::Program rank3 = world_only;
  rank3.name = "rank3";
  rank3.comm_slots = {"world", "pair", "reversed"};
  rank3.ops.push_back(MakeOp(20, Coll(CollectiveType::kAllReduce, 1, 1000, DType::kFloat16)));
  rank3.ops.push_back(MakeOp(21, Coll(CollectiveType::kSend, 2, 64, DType::kInt8, /*peer=*/1)));
  rank3.ops.push_back(MakeOp(22, Coll(CollectiveType::kBroadcast, 1, 256, DType::kFloat32, /*peer=*/2)));
  rank3.ops.push_back(MakeOp(23, Coll(CollectiveType::kAllToAll, 0, 4000, DType::kFloat32)));

  // rank 1 receives rank 3's send on "reversed"; rank 2 joins the "pair" all_reduce and broadcast.
  traces::Program rank1 = world_only;
  rank1.name = "rank1";
  rank1.comm_slots = {"world", "reversed"};
  rank1.ops.push_back(MakeOp(21, Coll(CollectiveType::kRecv, 1, 64, DType::kInt8, /*peer=*/3)));
  traces::Program rank2 = world_only;
  rank2.name = "rank2";
  rank2.comm_slots = {"world", "pair"};
  rank2.ops.push_back(MakeOp(20, Coll(CollectiveType::kAllReduce, 1, 1000, DType::kFloat16)));
  rank2.ops.push_back(MakeOp(22, Coll(CollectiveType::kBroadcast, 1, 256, DType::kFloat32, /*peer=*/2)));

  s.programs = {world_only, rank1, rank2, rank3};
  s.ranks = {{0, {}}, {1, {}}, {2, {}}, {3, {}}};
  EXPECT_TRUE(s.ResolveBindings().ok());
  return s;
}

TEST(ExecutionPlan, RejectsAWorldSizeThatDiffersFromTheSchedule) {
  const traces::Schedule s = FourRankSchedule();
  FakeCosts costs;
  auto plan = BuildExecutionPlan(s, 0, 2, costs);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(plan.status().message().find("schedule has 4 ranks, the job has 2"), std::string::npos)
      << plan.status().message();
}

TEST(ExecutionPlan, RejectsARankOutsideTheWorld) {
  const traces::Schedule s = FourRankSchedule();
  FakeCosts costs;
  EXPECT_FALSE(BuildExecutionPlan(s, 4, 4, costs).ok());
  EXPECT_FALSE(BuildExecutionPlan(s, -1, 4, costs).ok());
}

TEST(ExecutionPlan, EveryRankSplitsEveryCommunicatorWithColorAndNcclRankAsKey) {
  const traces::Schedule s = FourRankSchedule();
  FakeCosts costs;
  auto plan3 = BuildExecutionPlan(s, 3, 4, costs);
  ASSERT_TRUE(plan3.ok()) << plan3.status().message();
  ASSERT_EQ(plan3->communicators.size(), 4u);
  // rank 3: world position 3, pair {2,3} position 1, reversed {3,1} position 0, not in unused.
  EXPECT_EQ(plan3->communicators[0].color, 0);
  EXPECT_EQ(plan3->communicators[0].key, 3);
  EXPECT_EQ(plan3->communicators[1].color, 1);
  EXPECT_EQ(plan3->communicators[1].key, 1);
  EXPECT_EQ(plan3->communicators[2].color, 2);
  EXPECT_EQ(plan3->communicators[2].key, 0);
  EXPECT_EQ(plan3->communicators[3].color, kNoColor);
  EXPECT_TRUE(plan3->communicators[1].used);
  EXPECT_FALSE(plan3->communicators[3].used);

  auto plan0 = BuildExecutionPlan(s, 0, 4, costs);
  ASSERT_TRUE(plan0.ok());
  ASSERT_EQ(plan0->communicators.size(), 4u);  // even those it is not in: the split is collective
  EXPECT_EQ(plan0->communicators[0].color, 0);
  EXPECT_EQ(plan0->communicators[1].color, kNoColor);
  EXPECT_EQ(plan0->communicators[2].color, kNoColor);
  EXPECT_EQ(plan0->communicators[3].color, 3);  // a member, though it never uses it
  EXPECT_EQ(plan0->communicators[3].key, 0);
  EXPECT_FALSE(plan0->communicators[3].used);
}

TEST(ExecutionPlan, ResolvesStreamsEventsTensorsAndDurations) {
  const traces::Schedule s = FourRankSchedule();
  FakeCosts costs;
  auto plan = BuildExecutionPlan(s, 0, 4, costs);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->streams.size(), 2u);
  EXPECT_EQ(plan->streams[1].name, "comm");
  EXPECT_EQ(plan->streams[1].priority, -1);
  EXPECT_EQ(plan->num_events, 1);
  EXPECT_EQ(plan->num_tensors, 1);
  ASSERT_EQ(plan->ops.size(), 10u);
  EXPECT_EQ(plan->ops[0].op_class, OpClass::kAllocate);
  EXPECT_EQ(plan->ops[0].bytes, 3000);
  EXPECT_EQ(plan->ops[0].tensor, 0);
  EXPECT_EQ(plan->ops[2].op_class, OpClass::kEventRecord);
  EXPECT_EQ(plan->ops[2].stream, 1);
  EXPECT_EQ(plan->ops[3].op_class, OpClass::kStreamWaitEvent);
  EXPECT_EQ(plan->ops[3].stream, 0);
  EXPECT_EQ(plan->ops[4].op_class, OpClass::kKernel);
  EXPECT_EQ(plan->ops[4].duration_ns, 123);  // the GEMM's m, from the cost provider
  EXPECT_EQ(plan->ops[6].op_class, OpClass::kMemcpy);
  EXPECT_EQ(plan->ops[6].duration_ns, 555);
  EXPECT_EQ(plan->ops[7].op_class, OpClass::kHostWork);
  EXPECT_EQ(plan->ops[7].duration_ns, 999);
  EXPECT_EQ(plan->ops[8].op_class, OpClass::kFree);
  EXPECT_EQ(plan->ops[9].op_class, OpClass::kDeviceSynchronize);
  EXPECT_EQ(plan->ops[9].op_id, 19);
}

TEST(ExecutionPlan, CollectiveBuffersFollowTheNcclTestsSizeConvention) {
  const traces::Schedule s = FourRankSchedule();
  FakeCosts costs;
  auto plan = BuildExecutionPlan(s, 3, 4, costs);
  ASSERT_TRUE(plan.ok());
  // all_gather of 4096 B bf16 on 4 ranks: 2048 elements gathered, 512 sent by each rank.
  const OpPlan& ag = plan->ops[1];
  EXPECT_EQ(ag.communicator, 0);
  EXPECT_EQ(ag.buffers.element_bytes, 2);
  EXPECT_EQ(ag.buffers.send_elements, 512);
  EXPECT_EQ(ag.buffers.recv_elements, 2048);
  // reduce_scatter of 8192 B fp32 on 4 ranks: 2048 elements in, 512 out.
  const OpPlan& rs = plan->ops[5];
  EXPECT_EQ(rs.buffers.send_elements, 2048);
  EXPECT_EQ(rs.buffers.recv_elements, 512);
  EXPECT_EQ(rs.buffers.recv_bytes(), 2048);
  // all_reduce of 1000 B fp16 on "pair": 500 elements both ways.
  const OpPlan& ar = plan->ops[10];
  EXPECT_EQ(ar.communicator, 1);
  EXPECT_EQ(ar.buffers.send_elements, 500);
  EXPECT_EQ(ar.buffers.recv_elements, 500);
  // send of 64 B to global rank 1 on "reversed" {3,1}: communicator rank 1.
  const OpPlan& send = plan->ops[11];
  EXPECT_EQ(send.communicator, 2);
  EXPECT_EQ(send.peer_comm_rank, 1);
  EXPECT_EQ(send.buffers.send_elements, 64);
  EXPECT_EQ(send.buffers.recv_elements, 0);
  // broadcast rooted at global rank 2 on "pair" {2,3}: root 0.
  const OpPlan& bcast = plan->ops[12];
  EXPECT_EQ(bcast.peer_comm_rank, 0);
  EXPECT_EQ(bcast.buffers.recv_elements, 64);
  // all_to_all of 4000 B fp32 sent by each rank: 1000 elements, 250 per peer, as many back.
  const OpPlan& a2a = plan->ops[13];
  EXPECT_EQ(a2a.buffers.send_elements, 1000);
  EXPECT_EQ(a2a.buffers.recv_elements, 1000);
  // One buffer pair per communicator, sized for its largest collective on this rank:
  // world: max(1024 B ag send, 8192 B rs send, 4000 B a2a) = 8192; recv max(4096, 2048, 4000).
  EXPECT_EQ(plan->communicators[0].max_send_bytes, 8192);
  EXPECT_EQ(plan->communicators[0].max_recv_bytes, 4096);
  // pair: all_reduce 1000 B both ways, broadcast 256 B.
  EXPECT_EQ(plan->communicators[1].max_send_bytes, 1000);
  EXPECT_EQ(plan->communicators[1].max_recv_bytes, 1000);
  // reversed: the send only.
  EXPECT_EQ(plan->communicators[2].max_send_bytes, 64);
  EXPECT_EQ(plan->communicators[2].max_recv_bytes, 0);
}

TEST(ExecutionPlan, UnevenSizesAreFlooredToWholeElementsPerRank) {
  CollectiveOp ag = Coll(CollectiveType::kAllGather, 0, 10, DType::kFloat32);  // 2 elements (+2 B)
  const CollectiveBuffers b = BuffersFor(ag, 4);                             // 2 / 4 = 0 per rank
  EXPECT_EQ(b.send_elements, 0);
  EXPECT_EQ(b.recv_elements, 0);
  CollectiveOp rs = Coll(CollectiveType::kReduceScatter, 0, 28, DType::kFloat32);  // 7 elements
  const CollectiveBuffers r = BuffersFor(rs, 2);                                   // 3 out, 6 in
  EXPECT_EQ(r.recv_elements, 3);
  EXPECT_EQ(r.send_elements, 6);
}

// ---- Flight Recorder dump

// ---- Uneven all_to_all (AllToAllPeerElements): one size per rank, one count per pair.

TEST(ExecutionPlan, AllToAllPeerCountsAreTheLargerShareOfThePair) {
  // Two ranks, S = 512 and 2048 elements: the pair exchanges max(512, 2048) / 2 = 1024 each
  // way; each rank keeps its own share with itself (512 / 2 = 256 and 2048 / 2 = 1024).
  EXPECT_EQ(AllToAllPeerElements(512, {512, 2048}), (std::vector<int64_t>{256, 1024}));
  EXPECT_EQ(AllToAllPeerElements(2048, {512, 2048}), (std::vector<int64_t>{1024, 1024}));
  // Equal sizes: the even split, S / n floored (1000 / 3 = 333).
  EXPECT_EQ(AllToAllPeerElements(1000, {1000, 1000, 1000}), (std::vector<int64_t>{333, 333, 333}));
  // A member whose matching collective is no all_to_all (-1): this rank's own size.
  EXPECT_EQ(AllToAllPeerElements(600, {-1, 600}), (std::vector<int64_t>{300, 300}));
}

// Three ranks, one all_to_all each on "world", of 300, 600 and 1500 bytes fp32 (75, 150 and
// 375 elements), each behind an even int64 all_to_all (MoE's split counts) and, on ranks 1
// and 2, a send/recv pair, so the match is by collective ordinal and dtype, not op index. By hand (n = 3): pairs (0,1) max(75,150)/3 = 50, (0,2) and (1,2)
// 375/3 = 125; self 75/3 = 25, 150/3 = 50, 375/3 = 125. Rank 0 moves 25+50+125 = 200 each way,
// rank 1 50+50+125 = 225, rank 2 3 x 125 = 375, exactly its own S.
traces::Schedule UnevenAllToAllSchedule() {
  traces::Schedule s;
  s.communicators = {{"world", {0, 1, 2}}};
  const int64_t bytes[3] = {300, 600, 1500};
  for (int32_t r = 0; r < 3; ++r) {
    traces::Program p;
    p.name = "rank" + std::to_string(r);
    p.streams = {{"compute", 0}, {"comm", -1}};
    p.comm_slots = {"world"};
    p.ops.push_back(MakeOp(1, Coll(CollectiveType::kAllToAll, 0, 24, DType::kInt64)));
    // Rank 1 issues a send/recv pair first: point-to-point ops do not count as collectives.
    if (r == 1) p.ops.push_back(MakeOp(2, Coll(CollectiveType::kSend, 0, 8, DType::kFloat32, /*peer=*/2)));
    if (r == 2) p.ops.push_back(MakeOp(2, Coll(CollectiveType::kRecv, 0, 8, DType::kFloat32, /*peer=*/1)));
    p.ops.push_back(MakeOp(3, Coll(CollectiveType::kAllToAll, 0, bytes[r], DType::kFloat32)));
    s.programs.push_back(p);
    s.ranks.push_back({r, {}});
  }
  EXPECT_TRUE(s.ResolveBindings().ok());
  return s;
}

TEST(ExecutionPlan, UnevenAllToAllCountsAgreeOnBothSidesOfEveryPair) {
  const traces::Schedule s = UnevenAllToAllSchedule();
  FakeCosts costs;
  std::vector<ExecutionPlan> plans;
  for (int32_t r = 0; r < 3; ++r) {
    auto plan = BuildExecutionPlan(s, r, 3, costs);
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    plans.push_back(std::move(*plan));
  }
  const auto a2a = [&](int32_t r) -> const OpPlan& { return plans[static_cast<size_t>(r)].ops.back(); };
  EXPECT_EQ(a2a(0).peer_elements, (std::vector<int64_t>{25, 50, 125}));
  EXPECT_EQ(a2a(1).peer_elements, (std::vector<int64_t>{50, 50, 125}));
  EXPECT_EQ(a2a(2).peer_elements, (std::vector<int64_t>{125, 125, 125}));
  for (int32_t a = 0; a < 3; ++a) {
    for (int32_t b = 0; b < 3; ++b) {
      EXPECT_EQ(a2a(a).peer_elements[static_cast<size_t>(b)], a2a(b).peer_elements[static_cast<size_t>(a)])
          << "rank " << a << " sends to rank " << b << " what rank " << b << " does not expect";
    }
  }
  // The buffers hold every peer's part: 200, 225 and 375 elements of 4 bytes.
  EXPECT_EQ(a2a(0).buffers.send_elements, 200);
  EXPECT_EQ(a2a(0).buffers.recv_elements, 200);
  EXPECT_EQ(a2a(1).buffers.send_elements, 225);
  EXPECT_EQ(a2a(2).buffers.recv_elements, 375);
  EXPECT_EQ(plans[2].communicators[0].max_send_bytes, 1500);
  // What PyTorch reports for the rank's tensors is still its own size.
  EXPECT_EQ(a2a(0).buffers.in_elements, 75);
  // The int64 split counts: 3 elements from every rank, 1 per peer.
  EXPECT_EQ(plans[1].ops.front().peer_elements, (std::vector<int64_t>{1, 1, 1}));
}

// The example the issue could not run: Mixtral-8x7B on 32 ranks, 8-way expert parallelism,
// rank 3's experts routed 1.6x the balanced tokens. Every all_to_all of every rank must send
// each peer what that peer expects from it, and rank 3 (the largest size of its group) must
// move exactly its own size.
TEST(ExecutionPlan, TheMoeImbalanceExampleAgreesOnEveryAllToAllPair) {
  StatusOr<sim::Plan> plan = sim::LoadPlanFile(std::string(SHARDSCOPE_SOURCE_DIR) +
                                               "/examples/divergence/moe-imbalance.yaml");
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  StatusOr<traces::Schedule> schedule = sim::LowerPlan(*plan);
  ASSERT_TRUE(schedule.ok()) << schedule.status().message();
  const int32_t world = schedule->world_size();
  ASSERT_EQ(world, 32);
  FakeCosts costs;
  // Per rank: its all_to_alls in order, per communicator.
  std::vector<std::map<int32_t, std::vector<const OpPlan*>>> a2as(static_cast<size_t>(world));
  std::vector<ExecutionPlan> plans;
  plans.reserve(static_cast<size_t>(world));
  for (int32_t r = 0; r < world; ++r) {
    auto built = BuildExecutionPlan(*schedule, r, world, costs);
    ASSERT_TRUE(built.ok()) << built.status().message();
    plans.push_back(std::move(*built));
  }
  int64_t checked_pairs = 0, uneven = 0;
  for (int32_t r = 0; r < world; ++r) {
    for (const OpPlan& op : plans[static_cast<size_t>(r)].ops) {
      if (!op.peer_elements.empty()) a2as[static_cast<size_t>(r)][op.communicator].push_back(&op);
    }
  }
  for (int32_t r = 0; r < world; ++r) {
    for (const auto& [comm, ops] : a2as[static_cast<size_t>(r)]) {
      const std::vector<int32_t>& members = schedule->communicators[static_cast<size_t>(comm)].ranks;
      const auto me = static_cast<size_t>(std::find(members.begin(), members.end(), r) - members.begin());
      for (size_t k = 0; k < ops.size(); ++k) {
        for (size_t q = 0; q < members.size(); ++q) {
          const auto& peer_ops = a2as[static_cast<size_t>(members[q])].at(comm);
          ASSERT_EQ(peer_ops.size(), ops.size());
          ASSERT_EQ(ops[k]->peer_elements[q], peer_ops[k]->peer_elements[me])
              << "rank " << r << " all_to_all #" << k << " on " << comm << " and rank " << members[q];
          ++checked_pairs;
        }
        if (ops[k]->buffers.send_elements != ops[k]->buffers.elements / static_cast<int64_t>(members.size()) *
                                                 static_cast<int64_t>(members.size())) {
          ++uneven;
        }
      }
    }
  }
  EXPECT_GT(checked_pairs, 0);
  EXPECT_GT(uneven, 0);  // the imbalance reaches the counts (else this test checks nothing)
  // Rank 3, the most loaded member of its group, moves exactly its own size S (floored to 8
  // parts) in every dispatch and combine.
  for (const auto& [comm, ops] : a2as[3]) {
    for (const OpPlan* op : ops) {
      const int64_t n = static_cast<int64_t>(op->peer_elements.size());
      EXPECT_EQ(op->buffers.send_elements, op->buffers.elements / n * n);
    }
  }
}

TEST(RuntimeFlightRecorder, WritesStatesSequenceNumbersAndTheBlockedCollective) {
  const traces::Schedule s = FourRankSchedule();
  // Rank 3 issued: all_gather (world #1, completed), reduce_scatter (world #2, started),
  // all_reduce (pair #1, scheduled), send (reversed p2p #1, scheduled).
  std::vector<FlightRecord> records = {
      {1, 0, 1, 0, 1, 100, 200, 300},
      {5, 0, 2, 0, 2, 400, 500, -1},
      {10, 1, 1, 0, 1, 600, -1, -1},
      {11, 2, 0, 1, 1, 700, -1, -1},
  };
  std::vector<FlightLane> lanes = {{0, 2, 2, 1}, {1, 1, 0, 0}, {2, 1, 0, 0}, {3, 0, 0, 0}};
  FlightDumpContext context;
  context.rank = 3;
  context.reason = "watchdog timeout";
  context.timeout_s = 5;
  context.missing_ranks = {1};
  const nlohmann::json j = nlohmann::json::parse(RuntimeFlightRecorderJson(s, records, lanes, context));
  ASSERT_EQ(j["entries"].size(), 4u);
  EXPECT_EQ(j["entries"][0]["state"], "completed");
  EXPECT_EQ(j["entries"][0]["duration_ms"].get<double>(), 100 / 1e6);
  EXPECT_EQ(j["entries"][0]["input_sizes"][0][0], 512);   // 4096 B bf16 / 4 ranks
  EXPECT_EQ(j["entries"][0]["output_sizes"][0][0], 2048);
  EXPECT_EQ(j["entries"][0]["input_dtypes"][0], "BFloat16");
  EXPECT_EQ(j["entries"][1]["state"], "started");
  EXPECT_EQ(j["entries"][1]["collective_seq_id"], 2);
  EXPECT_EQ(j["entries"][1]["profiling_name"], "nccl:reduce_scatter");
  EXPECT_EQ(j["entries"][1]["retired"], false);
  EXPECT_EQ(j["entries"][2]["state"], "scheduled");
  EXPECT_EQ(j["entries"][2]["process_group"][1], "pair");
  EXPECT_EQ(j["entries"][3]["is_p2p"], true);
  // Rank 3 sends to rank 1 on "pair" = [3, 1]: group ranks 0 -> 1, as ProcessGroupNCCL names it.
  EXPECT_EQ(j["entries"][3]["profiling_name"], "nccl:send 0->1");
  EXPECT_EQ(j["entries"][3]["p2p_seq_id"], 1);
  EXPECT_EQ(j["entries"][3]["timeout_ms"], 5000);
  // pg_status for the three communicators rank 3 is bound to (not "unused").
  EXPECT_EQ(j["pg_status"].size(), 3u);
  EXPECT_EQ(j["pg_status"]["0"]["last_enqueued_collective"], 2);
  EXPECT_EQ(j["pg_status"]["0"]["last_completed_collective"], 1);
  EXPECT_EQ(j["pg_config"]["2"]["ranks"], "[3, 1]");
  EXPECT_EQ(j["shardscope"]["blocked_collective"]["collective_seq_id"], 2);
  EXPECT_EQ(j["shardscope"]["blocked_collective"]["schedule_op_id"], 15);
  EXPECT_EQ(j["shardscope"]["blocked_collective"]["state"], "started");
  EXPECT_EQ(j["shardscope"]["missing_ranks"], nlohmann::json::array({1}));
}

TEST(RuntimeFlightRecorder, KeepsOnlyTheLastEntriesOfTheRingBuffer) {
  const traces::Schedule s = FourRankSchedule();
  std::vector<FlightRecord> records;
  for (int64_t i = 1; i <= 5; ++i) records.push_back({1, 0, i, 0, i, i, i, i + 1});
  FlightDumpContext context;
  context.rank = 0;
  context.entries_limit = 2;
  const nlohmann::json j = nlohmann::json::parse(RuntimeFlightRecorderJson(s, records, {}, context));
  ASSERT_EQ(j["entries"].size(), 2u);
  EXPECT_EQ(j["entries"][0]["collective_seq_id"], 4);
  EXPECT_EQ(j["entries"][0]["record_id"], 3);
  EXPECT_TRUE(j["shardscope"]["blocked_collective"].is_null());
  EXPECT_EQ(BlockedRecord(records), -1);
}

}  // namespace
}  // namespace shardscope::runtime

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "shardscope/traces/schedule.h"

namespace shardscope::traces {
namespace {

using ::testing::HasSubstr;

Op MakeOp(int64_t id, OpPayload payload) {
  Op op;
  op.id = id;
  op.payload = std::move(payload);
  return op;
}

// Two ranks running one program: allocate, all_gather, record, wait, gemm, free.
Schedule MakeValid() {
  Schedule schedule;
  schedule.communicators.push_back({"dp", {0, 1}});
  Program program;
  program.name = "main";
  program.streams = {{"compute", 0}, {"comm", -1}};
  program.events = {"gathered"};
  program.tensors = {"params"};
  program.comm_slots = {"dp"};
  program.ops.push_back(MakeOp(0, AllocateOp{.tensor = 0, .bytes = 1024, .stream = 1}));
  program.ops.push_back(MakeOp(
      1, CollectiveOp{.type = CollectiveType::kAllGather, .comm = 0, .stream = 1, .bytes = 1024}));
  program.ops.push_back(MakeOp(2, EventRecordOp{.event = 0, .stream = 1}));
  program.ops.push_back(MakeOp(3, StreamWaitEventOp{.stream = 0, .event = 0}));
  program.ops.push_back(
      MakeOp(4, KernelOp{.stream = 0, .compute = GemmDesc{.m = 8, .n = 8, .k = 8}}));
  program.ops.push_back(MakeOp(5, FreeOp{.tensor = 0}));
  schedule.programs.push_back(std::move(program));
  schedule.ranks = {{0, {0}}, {0, {0}}};
  return schedule;
}

std::string ErrorOf(const Schedule& schedule) {
  Status status = ValidateSchedule(schedule);
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.code(), StatusCode::kInvalidInput);
  return status.message();
}

Op& OpAt(Schedule& schedule, size_t index) { return schedule.programs[0].ops[index]; }

TEST(ValidateScheduleTest, AcceptsValidSchedule) {
  Status status = ValidateSchedule(MakeValid());
  EXPECT_TRUE(status.ok()) << status.message();
}

TEST(ValidateScheduleTest, RejectsBadVersion) {
  Schedule schedule = MakeValid();
  schedule.version = 2;
  EXPECT_THAT(ErrorOf(schedule), HasSubstr("schedule version 2 is not supported (expected 1)"));
}

TEST(ValidateScheduleTest, RejectsEmptyWorld) {
  Schedule schedule = MakeValid();
  schedule.ranks.clear();
  schedule.communicators.clear();
  EXPECT_THAT(ErrorOf(schedule), HasSubstr("no ranks"));
}

TEST(ValidateScheduleTest, RejectsNegativeBytes) {
  Schedule schedule = MakeValid();
  std::get<CollectiveOp>(OpAt(schedule, 1).payload).bytes = -5;
  EXPECT_EQ(ErrorOf(schedule), "rank 0, op id 1 (collective): bytes is negative (-5)");
}

TEST(ValidateScheduleTest, RejectsNegativeDurations) {
  Schedule schedule = MakeValid();
  OpAt(schedule, 4).payload = HostWorkOp{.duration_ns = -1};
  EXPECT_EQ(ErrorOf(schedule), "rank 0, op id 4 (host_work): duration_ns is negative (-1)");
  OpAt(schedule, 4).payload = KernelOp{.stream = 0, .compute = FixedDurationDesc{-2}};
  EXPECT_EQ(ErrorOf(schedule), "rank 0, op id 4 (kernel): duration_ns is negative (-2)");
}

TEST(ValidateScheduleTest, RejectsStreamOutOfRange) {
  Schedule schedule = MakeValid();
  std::get<KernelOp>(OpAt(schedule, 4).payload).stream = 2;
  EXPECT_EQ(ErrorOf(schedule),
            "rank 0, op id 4 (kernel): stream index 2 out of range (program has 2 streams)");
}

TEST(ValidateScheduleTest, RejectsNameIndexOutOfRange) {
  Schedule schedule = MakeValid();
  OpAt(schedule, 4).name = 3;
  EXPECT_THAT(ErrorOf(schedule), HasSubstr("op id 4 (kernel): name index 3 out of range"));
}

TEST(ValidateScheduleTest, RejectsWaitOnEventRecordedOnlyLater) {
  Schedule schedule = MakeValid();
  std::swap(OpAt(schedule, 2), OpAt(schedule, 3));  // wait, then record
  EXPECT_EQ(ErrorOf(schedule),
            "rank 0, op id 3 (stream_wait_event): event 'gathered' is not recorded by any "
            "earlier op");
}

TEST(ValidateScheduleTest, RejectsEventSynchronizeOnNeverRecordedEvent) {
  Schedule schedule = MakeValid();
  OpAt(schedule, 2).payload = EventSynchronizeOp{.event = 0};
  EXPECT_THAT(ErrorOf(schedule), HasSubstr("op id 2 (event_synchronize): event 'gathered' is "
                                           "not recorded"));
}

TEST(ValidateScheduleTest, RejectsBadComputeShapes) {
  Schedule schedule = MakeValid();
  std::get<KernelOp>(OpAt(schedule, 4).payload).compute = GemmDesc{.m = 8, .n = 0, .k = 8};
  EXPECT_EQ(ErrorOf(schedule), "rank 0, op id 4 (kernel): gemm n must be positive, got 0");
  std::get<KernelOp>(OpAt(schedule, 4).payload).compute =
      AttentionDesc{.batch = 1, .heads = 6, .kv_heads = 4, .seq_q = 8, .seq_kv = 8, .head_dim = 64};
  EXPECT_THAT(ErrorOf(schedule), HasSubstr("kv_heads 4 does not divide heads 6"));
  std::get<KernelOp>(OpAt(schedule, 4).payload).compute = MemoryBoundDesc{.bytes_read = -1};
  EXPECT_THAT(ErrorOf(schedule), HasSubstr("bytes_read is negative"));
}

TEST(ValidateScheduleTest, RejectsCollectiveOnCommunicatorWithoutTheRank) {
  Schedule schedule = MakeValid();
  schedule.communicators[0].ranks = {0};
  EXPECT_EQ(ErrorOf(schedule),
            "rank 1, op id 1 (collective): communicator 'dp' (slot 'dp') does not contain rank 1");
}

TEST(ValidateScheduleTest, RejectsSendToSelfAndPeersOutsideTheCommunicator) {
  Schedule schedule = MakeValid();
  schedule.communicators.push_back({"solo", {1}});
  schedule.programs.push_back(schedule.programs[0]);
  schedule.programs[1].name = "second";
  schedule.ranks[1].program = 1;
  auto& send = std::get<CollectiveOp>(schedule.programs[1].ops[1].payload);
  send.type = CollectiveType::kSend;
  send.peer = 1;
  EXPECT_EQ(ErrorOf(schedule), "rank 1, op id 1 (collective): peer 1 is the rank itself");

  send.peer = 0;
  schedule.ranks[1].comm_binding = {1};  // "solo" = {1}: peer 0 is not a member
  EXPECT_EQ(ErrorOf(schedule),
            "rank 1, op id 1 (collective): peer 0 is not in communicator 'solo'");

  send.type = CollectiveType::kBroadcast;
  EXPECT_EQ(ErrorOf(schedule),
            "rank 1, op id 1 (collective): root 0 is not in communicator 'solo'");

  send.peer = -1;
  EXPECT_THAT(ErrorOf(schedule), HasSubstr("op id 1 (collective): needs a root rank, got -1"));

  send.type = CollectiveType::kAllReduce;
  send.peer = 0;
  EXPECT_THAT(ErrorOf(schedule), HasSubstr("only send, recv, broadcast and reduce take a peer"));
}

TEST(ValidateScheduleTest, RejectsDoubleAllocateAndBadFrees) {
  Schedule schedule = MakeValid();
  OpAt(schedule, 5).payload = AllocateOp{.tensor = 0, .bytes = 8, .stream = 0};
  EXPECT_EQ(ErrorOf(schedule),
            "rank 0, op id 5 (allocate): tensor 'params' is already allocated (by op id 0)");

  schedule = MakeValid();
  OpAt(schedule, 0).payload = HostWorkOp{};
  EXPECT_EQ(ErrorOf(schedule),
            "rank 0, op id 5 (free): tensor 'params' is not allocated (no earlier allocate)");

  schedule = MakeValid();
  schedule.programs[0].ops.push_back(MakeOp(6, FreeOp{.tensor = 0}));
  EXPECT_EQ(ErrorOf(schedule),
            "rank 0, op id 6 (free): tensor 'params' is not allocated (already freed by op id 5)");

  schedule = MakeValid();
  std::get<FreeOp>(OpAt(schedule, 5).payload).tensor = 4;
  EXPECT_THAT(ErrorOf(schedule), HasSubstr("tensor index 4 out of range"));
}

TEST(ValidateScheduleTest, RejectsDuplicateOpIds) {
  Schedule schedule = MakeValid();
  OpAt(schedule, 4).id = 2;
  EXPECT_EQ(ErrorOf(schedule),
            "rank 0, op id 2 (kernel): duplicate op id (ops #2 and #4 of program 'main')");
}

TEST(ValidateScheduleTest, RejectsBadCommunicators) {
  Schedule schedule = MakeValid();
  schedule.communicators[0].ranks = {0, 2};
  EXPECT_EQ(ErrorOf(schedule), "communicator 'dp': rank 2 is outside the world [0, 2)");
  schedule.communicators[0].ranks = {1, 0, 1};
  EXPECT_EQ(ErrorOf(schedule), "communicator 'dp': rank 1 listed twice");
  schedule.communicators[0].ranks = {-1};
  EXPECT_THAT(ErrorOf(schedule), HasSubstr("rank -1 is outside the world"));
}

TEST(ValidateScheduleTest, RejectsProgramWithoutStreams) {
  Schedule schedule = MakeValid();
  schedule.programs[0].streams.clear();
  EXPECT_EQ(ErrorOf(schedule), "rank 0 (program 'main'): declares no streams (needs at least one)");
}

TEST(ValidateScheduleTest, RejectsBadBindings) {
  Schedule schedule = MakeValid();
  schedule.ranks[1].comm_binding = {};
  EXPECT_THAT(ErrorOf(schedule), HasSubstr("rank 1: binds 0 communicator slots but program "
                                           "'main' declares 1"));
  schedule.ranks[1].comm_binding = {3};
  EXPECT_THAT(ErrorOf(schedule), HasSubstr("rank 1: communicator slot 'dp' bound to "
                                           "communicator index 3, out of range"));
  schedule.ranks[1].program = 7;
  EXPECT_THAT(ErrorOf(schedule), HasSubstr("rank 1: program index 7 out of range"));
}

TEST(ValidateScheduleTest, AttributesProgramErrorsToTheFirstRankRunningIt) {
  Schedule schedule = MakeValid();
  schedule.programs.push_back(schedule.programs[0]);
  schedule.programs[1].name = "late";
  schedule.ranks[1].program = 1;
  std::get<CollectiveOp>(schedule.programs[1].ops[1].payload).bytes = -1;
  EXPECT_EQ(ErrorOf(schedule), "rank 1, op id 1 (collective): bytes is negative (-1)");
  schedule.ranks[1].program = 0;  // now no rank runs it
  EXPECT_EQ(ErrorOf(schedule), "program 'late', op id 1 (collective): bytes is negative (-1)");
}

// 1,024 ranks share one program of 20,000 ops: validation must stay near-linear.
TEST(ValidateScheduleTest, ManyRanksSharingAProgramAreFast) {
  Schedule schedule = MakeValid();
  std::vector<int32_t> everyone;
  for (int32_t r = 0; r < 1024; ++r) everyone.push_back(r);
  schedule.communicators[0].ranks = everyone;
  schedule.ranks.assign(1024, RankBinding{0, {0}});
  Program& program = schedule.programs[0];
  program.ops.pop_back();  // keep the tensor live; add many collectives and kernels
  for (int64_t i = 0; i < 20'000; ++i) {
    program.ops.push_back(MakeOp(100 + i, CollectiveOp{.type = CollectiveType::kBroadcast,
                                                       .comm = 0,
                                                       .stream = 1,
                                                       .bytes = 64,
                                                       .peer = static_cast<int32_t>(i % 1024)}));
  }
  const auto start = std::chrono::steady_clock::now();
  Status status = ValidateSchedule(schedule);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(status.ok()) << status.message();
  // Quadratic behaviour (ops x ranks = 2e7 lookups) would take far longer under sanitizers.
  EXPECT_LT(std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count(), 5000);
}

}  // namespace
}  // namespace shardscope::traces

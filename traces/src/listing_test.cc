#include "shardscope/traces/listing.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace shardscope::traces {
namespace {

using ::testing::HasSubstr;

TEST(ListingTest, OneLinePerOpWithStreamsGroupsAndExactBytes) {
  Schedule schedule;
  schedule.communicators.push_back({"world", {0, 1}});
  Program p;
  p.name = "toy";
  p.streams = {{"compute", 0}, {"comm", -1}};
  p.events = {"done"};
  p.tensors = {"buf"};
  p.comm_slots = {"dp"};
  p.names = {"gemm", "layers.0", "AG"};
  auto add = [&](OpPayload payload, NameIndex name = kNoName) {
    Op op;
    op.id = static_cast<int64_t>(p.ops.size());
    op.name = name;
    op.tags.module = 1;
    op.tags.phase = Phase::kForward;
    op.tags.micro_batch = 0;
    op.payload = payload;
    p.ops.push_back(op);
  };
  add(AllocateOp{0, 3 << 20, 1});
  add(CollectiveOp{CollectiveType::kAllGather, 0, 1, 3 << 20, DType::kBFloat16, -1}, 2);
  add(EventRecordOp{0, 1});
  add(StreamWaitEventOp{0, 0});
  add(KernelOp{0, GemmDesc{8, 16, 32, 1, DType::kBFloat16}}, 0);
  add(RecordStreamOp{0, 0});
  add(FreeOp{0});
  add(EventSynchronizeOp{0});
  schedule.programs.push_back(p);
  schedule.ranks = {{0, {0}}, {0, {0}}};
  ASSERT_TRUE(ValidateSchedule(schedule).ok());
  const std::string text = ScheduleListing(schedule, 1);
  EXPECT_THAT(text, HasSubstr("rank 1 of 2: program 'toy', 8 ops"));
  EXPECT_THAT(text, HasSubstr("comm (priority -1)"));
  EXPECT_THAT(text, HasSubstr("dp = world (2 ranks)"));
  EXPECT_THAT(text, HasSubstr("alloc buf 3145728 B (3.00 MiB)"));
  EXPECT_THAT(text, HasSubstr("all_gather AG on dp: 3145728 B (3.00 MiB) bf16"));
  EXPECT_THAT(text, HasSubstr("kernel gemm: gemm m=8 n=16 k=32 bf16"));
  EXPECT_THAT(text, HasSubstr("record_stream buf"));
  EXPECT_THAT(text, HasSubstr("HOST BLOCKS on event done"));
  // Header (3 lines), a blank line, the column titles, then one line per op.
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 5 + 8);
}

}  // namespace
}  // namespace shardscope::traces

#include "shardscope/traces/collective_counts.h"

#include <gtest/gtest.h>

namespace shardscope::traces {
namespace {

// Every figure below is nccl-tests' size S = bytes divided by the dtype's width, worked out by
// hand: 4096 bf16 bytes are 2048 elements; on 4 ranks a part is 512.

TEST(CollectiveCountsTest, AllGatherSendsOnePartReceivesAll) {
  const CollectiveCounts c = CountsOf(CollectiveType::kAllGather, DType::kBFloat16, 4096, 4);
  EXPECT_EQ(c.element_bytes, 2);
  EXPECT_EQ(c.elements, 2048);
  EXPECT_EQ(c.send_elements, 512);
  EXPECT_EQ(c.recv_elements, 2048);
  EXPECT_EQ(c.in_elements, 512);
  EXPECT_EQ(c.out_elements, 2048);
  EXPECT_EQ(c.send_bytes(), 1024);
  EXPECT_EQ(c.recv_bytes(), 4096);
}

TEST(CollectiveCountsTest, ReduceScatterSendsAllReceivesOnePart) {
  const CollectiveCounts c = CountsOf(CollectiveType::kReduceScatter, DType::kFloat32, 4096, 4);
  EXPECT_EQ(c.elements, 1024);
  EXPECT_EQ(c.send_elements, 1024);
  EXPECT_EQ(c.recv_elements, 256);
  EXPECT_EQ(c.in_elements, 1024);
  EXPECT_EQ(c.out_elements, 256);
}

TEST(CollectiveCountsTest, UnevenSizesFloorBuffersButNotTheReportedTotal) {
  // 10 fp32 elements on 4 ranks: a part is 2, the buffers hold 8, PyTorch reports 10.
  const CollectiveCounts gather = CountsOf(CollectiveType::kAllGather, DType::kFloat32, 40, 4);
  EXPECT_EQ(gather.send_elements, 2);
  EXPECT_EQ(gather.recv_elements, 8);
  EXPECT_EQ(gather.in_elements, 2);
  EXPECT_EQ(gather.out_elements, 10);
  const CollectiveCounts scatter = CountsOf(CollectiveType::kReduceScatter, DType::kFloat32, 40, 4);
  EXPECT_EQ(scatter.send_elements, 8);
  EXPECT_EQ(scatter.recv_elements, 2);
  EXPECT_EQ(scatter.in_elements, 10);
  EXPECT_EQ(scatter.out_elements, 2);
  const CollectiveCounts all_to_all = CountsOf(CollectiveType::kAllToAll, DType::kFloat32, 40, 4);
  EXPECT_EQ(all_to_all.send_elements, 8);
  EXPECT_EQ(all_to_all.recv_elements, 8);
  EXPECT_EQ(all_to_all.in_elements, 10);
  EXPECT_EQ(all_to_all.out_elements, 10);
}

TEST(CollectiveCountsTest, WholeBufferKinds) {
  for (CollectiveType type : {CollectiveType::kAllReduce, CollectiveType::kBroadcast, CollectiveType::kReduce}) {
    const CollectiveCounts c = CountsOf(type, DType::kInt8, 100, 8);
    EXPECT_EQ(c.send_elements, 100);
    EXPECT_EQ(c.recv_elements, 100);
    EXPECT_EQ(c.in_elements, 100);
    EXPECT_EQ(c.out_elements, 100);
  }
}

TEST(CollectiveCountsTest, PointToPointMovesOneWay) {
  const CollectiveCounts send = CountsOf(CollectiveType::kSend, DType::kFloat64, 80, 2);
  EXPECT_EQ(send.send_elements, 10);
  EXPECT_EQ(send.recv_elements, 0);
  const CollectiveCounts recv = CountsOf(CollectiveType::kRecv, DType::kFloat64, 80, 2);
  EXPECT_EQ(recv.send_elements, 0);
  EXPECT_EQ(recv.recv_elements, 10);
  EXPECT_EQ(recv.in_elements, 10);
  EXPECT_EQ(recv.out_elements, 10);
}

TEST(CollectiveCountsTest, GroupBelowOneCountsAsOne) {
  const CollectiveCounts c = CountsOf(CollectiveType::kAllGather, DType::kFloat32, 16, 0);
  EXPECT_EQ(c.send_elements, 4);
  EXPECT_EQ(c.recv_elements, 4);
}

TEST(CollectiveCountsTest, OpOverloadReadsTheOp) {
  CollectiveOp op;
  op.type = CollectiveType::kReduceScatter;
  op.dtype = DType::kBFloat16;
  op.bytes = 64;
  EXPECT_EQ(CountsOf(op, 2).recv_elements, 16);
}

}  // namespace
}  // namespace shardscope::traces

#include "shardscope/base/status.h"

#include <gtest/gtest.h>

namespace shardscope {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2 != 0) return Status::InvalidInput("odd number " + std::to_string(x));
  return x / 2;
}

StatusOr<int> Quarter(int x) {
  SHARDSCOPE_ASSIGN_OR_RETURN(int half, Half(x));
  SHARDSCOPE_ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

TEST(StatusTest, PropagatesFirstError) {
  EXPECT_EQ(*Quarter(8), 2);
  StatusOr<int> bad = Quarter(6);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidInput);
  EXPECT_EQ(bad.status().message(), "odd number 3");
  EXPECT_EQ(bad.status().WithContext("plan.yaml").message(), "plan.yaml: odd number 3");
}

}  // namespace
}  // namespace shardscope

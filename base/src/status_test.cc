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

TEST(StatusTest, ValueCarriesAnOkStatus) {
  const StatusOr<int> half = Half(8);
  ASSERT_TRUE(half.ok());
  EXPECT_TRUE(half.status().ok());
  EXPECT_EQ(half.value(), 4);
}

// An OK Status carries no value: building a StatusOr from one is a programming error, caught
// where it happens (before, ok() was false while status().ok() was true).
TEST(StatusDeathTest, StatusOrFromAnOkStatusIsCaught) {
  EXPECT_DEATH(
      {
        const StatusOr<int> nothing(Status::Ok());
        (void)nothing;
      },
      "status\\.h:[0-9]+: check failed: .*StatusOr constructed from an OK Status");
}

// value() on an error stops with the error's message (before, std::bad_variant_access).
TEST(StatusDeathTest, ValueOnAnErrorFailsWithTheMessage) {
  EXPECT_DEATH(
      {
        const StatusOr<int> bad = Half(3);
        (void)bad.value();
      },
      "status\\.h:[0-9]+: check failed: .*StatusOr::value\\(\\) on an error: odd number 3");
  EXPECT_DEATH(
      {
        StatusOr<int> bad = Half(5);
        (void)*bad;
      },
      "on an error: odd number 5");
  EXPECT_DEATH((void)Half(7).value(), "on an error: odd number 7");
}

}  // namespace
}  // namespace shardscope

#include "shardscope/profiler/clock_alignment.h"

#include <gtest/gtest.h>

#include <vector>

namespace shardscope::profiler {
namespace {

TEST(FitClockMapTest, TwoSamplesCorrectOffsetAndDrift) {
  // The host clock runs 50 ppm faster than CUPTI's: over 1 s of CUPTI time it gains 50 us.
  const std::vector<ClockSample> samples = {{1'000'000'000, 7'000'000'000},
                                            {2'000'000'000, 8'000'050'000}};
  auto map = FitClockMap(samples);
  ASSERT_TRUE(map.ok()) << map.status().message();
  EXPECT_DOUBLE_EQ(map->rate, 1.00005);
  EXPECT_EQ(map->Map(1'000'000'000), 7'000'000'000);
  EXPECT_EQ(map->Map(2'000'000'000), 8'000'050'000);
  // Halfway: half the drift, 25 us.
  EXPECT_EQ(map->Map(1'500'000'000), 7'500'025'000);
  // Outside the samples the line extends: 0.1 s before the start, 5 us less drift.
  EXPECT_EQ(map->Map(900'000'000), 6'899'995'000);
}

TEST(FitClockMapTest, OneSampleIsAnOffset) {
  const std::vector<ClockSample> samples = {{100, 5000}};
  auto map = FitClockMap(samples);
  ASSERT_TRUE(map.ok());
  EXPECT_EQ(map->Map(100), 5000);
  EXPECT_EQ(map->Map(1100), 6000);
}

TEST(FitClockMapTest, ManySamplesAreFittedByLeastSquares) {
  // Around y = x + 100.667 (by hand: slope sum(dx dy)/sum(dx^2) = (1000 * 1000.667 + 1000 *
  // 999.333) / 2e6 = 1; the line passes through the means (1000, 1100.667)).
  const std::vector<ClockSample> samples = {{0, 100}, {1000, 1102}, {2000, 2100}};
  auto map = FitClockMap(samples);
  ASSERT_TRUE(map.ok());
  EXPECT_NEAR(map->rate, 1.0, 1e-12);
  EXPECT_EQ(map->Map(3000), 3101);  // 3100.667, the anchor rounded to 101
}

TEST(FitClockMapTest, ShiftedAddsTheCrossRankOffset) {
  const LinearClockMap map{0, 1000, 1.0};
  EXPECT_EQ(map.Shifted(-250).Map(10), 760);
}

TEST(FitClockMapTest, RejectsSamplesThatCannotBeOneClockPair) {
  EXPECT_EQ(FitClockMap({}).status().message(), "clock alignment: no (CUPTI, host) clock samples");
  const std::vector<ClockSample> same = {{5, 1}, {5, 2}};
  EXPECT_EQ(FitClockMap(same).status().message(),
            "clock alignment: all 2 clock samples were taken at the same CUPTI time 5 ns");
  const std::vector<ClockSample> fast = {{0, 0}, {1'000'000, 1'010'000}};  // 1% apart
  EXPECT_EQ(FitClockMap(fast).status().code(), StatusCode::kInvalidInput);
}

TEST(EstimateClockOffsetTest, UsesTheMinimumRoundTripSample) {
  // Reference = local + 5000. Legs (out, back): A 40/60, B 10/10, C 5/200.
  //   A: t1 = 100 + 40 + 5000 = 5140, t2 = 200; offset (5040 + 4940) / 2 = 4990, rtt 100
  //   B: t1 = 1000 + 10 + 5000 = 6010, t2 = 1020; offset (5010 + 4990) / 2 = 5000, rtt 20
  //   C: t1 = 2000 + 5 + 5000 = 7005, t2 = 2205; offset (5005 + 4800) / 2 = 4902, rtt 205
  const std::vector<PingPongSample> samples = {{100, 5140, 200}, {1000, 6010, 1020}, {2000, 7005, 2205}};
  auto estimate = EstimateClockOffset(samples);
  ASSERT_TRUE(estimate.ok());
  EXPECT_EQ(*estimate, (ClockOffsetEstimate{5000, 20, 1}));
  // Alone, A is off by half the legs' difference: (40 - 60) / 2 = -10.
  auto only_a = EstimateClockOffset(std::span(samples.data(), 1));
  EXPECT_EQ(only_a->offset_ns, 4990);
}

TEST(EstimateClockOffsetTest, RejectsEmptyAndAcausalSamples) {
  EXPECT_FALSE(EstimateClockOffset({}).ok());
  const std::vector<PingPongSample> samples = {{10, 0, 20}, {30, 0, 25}};
  EXPECT_EQ(EstimateClockOffset(samples).status().message(),
            "clock offset: sample 1 was answered before it was sent (t0 30 ns, t2 25 ns)");
}

TEST(MeasureClockOffsetTest, RunsTheExchangeOverCallables) {
  // A simulated pair of clocks: the reference reads local + 1,000,000; each exchange takes
  // (out, back) ns on the wire. The symmetric round (7, 7) gives the exact offset.
  int64_t local = 50;
  const std::vector<std::pair<int64_t, int64_t>> legs = {{30, 50}, {7, 7}, {100, 1}};
  size_t round = 0;
  ClockSyncTransport transport;
  transport.now_ns = [&] { return local; };
  transport.ping_reference = [&]() -> StatusOr<int64_t> {
    local += legs[round].first;
    const int64_t t1 = local + 1'000'000;
    local += legs[round].second;
    ++round;
    return t1;
  };
  auto estimate = MeasureClockOffset(transport, 3);
  ASSERT_TRUE(estimate.ok());
  EXPECT_EQ(*estimate, (ClockOffsetEstimate{1'000'000, 14, 1}));
  EXPECT_FALSE(MeasureClockOffset(transport, 0).ok());
}

TEST(MeasureClockOffsetTest, PropagatesTransportErrors) {
  ClockSyncTransport transport;
  transport.now_ns = [] { return int64_t{0}; };
  transport.ping_reference = []() -> StatusOr<int64_t> { return Status::IoError("peer gone"); };
  EXPECT_EQ(MeasureClockOffset(transport, 2).status().message(), "peer gone");
}

TEST(SyncClockOverMpiTest, RefusesWithoutMpiInitialized) {
  auto estimate = SyncClockToRankZeroOverMpi(4, [] { return int64_t{0}; });
  EXPECT_FALSE(estimate.ok());
}

}  // namespace
}  // namespace shardscope::profiler

// The simulated-time horizon (traces::kMaxSimulatedNs = 2^60 ns): a run whose events pass it
// ends in an input error instead of a wrapped clock, and a run just below it is exact.
#include "shardscope/sim/engine/engine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "engine_test_util.h"

namespace shardscope::sim {
namespace {

using namespace test_support::engine_tests;

constexpr int64_t kHorizon = traces::kMaxSimulatedNs;  // 2^60 = 1152921504606846976

StatusOr<SimulationResult> RunUnchecked(Builder& b, const EngineConfig& config, const CostProvider& costs) {
  EXPECT_TRUE(b.schedule.ResolveBindings().ok());
  return Simulate(b.schedule, costs, config, nullptr);
}

TEST(EngineHorizonTest, ARunJustBelowTheHorizonIsExact) {
  // Launches [0, 10] and [10, 20]; kernel 1 runs 10 .. 10 + 2^59, kernel 2 then runs 2^59 - 128
  // more (a multiple of 128, the spacing of doubles below 2^59, so the activity set's double
  // arithmetic is exact): the run ends at 10 + 2^60 - 128 = 2^60 - 118, below the horizon.
  Builder b(1);
  b.Kernel(0, 0, kHorizon / 2).Kernel(0, 0, kHorizon / 2 - 128);
  FakeCosts costs;
  StatusOr<SimulationResult> result = RunUnchecked(b, Launch10(), costs);
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_EQ(result->makespan_ns, kHorizon - 118);
}

TEST(EngineHorizonTest, ARunPastTheHorizonIsAnInputErrorNotAWrappedClock) {
  // Three kernels of 2^59 ns: the second ends at 10 + 2^60, past the horizon. Before the
  // horizon a host_work of 2^63 - 1 ns gave "event at -9223372036854196409 ns".
  Builder b(1);
  b.Kernel(0, 0, kHorizon / 2).Kernel(0, 0, kHorizon / 2).Kernel(0, 0, kHorizon / 2);
  FakeCosts costs;
  StatusOr<SimulationResult> result = RunUnchecked(b, Launch10(), costs);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidInput);
  EXPECT_EQ(result.status().message(),
            "the simulated run passes 1152921504606846976 ns (36 years) of simulated time: a duration, a size, a "
            "bandwidth or a FLOP rate in the input is out of scale");
}

// A provider whose collectives take the clamped maximum a model returns (the horizon itself),
// and whose kernels take what the descriptor says.
class HorizonCosts : public FakeCosts {
 public:
  CollectiveCost Collective(traces::CollectiveType, int64_t, int32_t) const override {
    CollectiveCost cost;
    cost.duration_ns = kHorizon;
    return cost;
  }
};

TEST(EngineHorizonTest, ACollectiveAsLongAsTheHorizonStopsTheRunOnEveryRank) {
  Builder b(2);
  for (int r = 0; r < 2; ++r) b.Coll(r, 0, 1).Kernel(r, 0, 5);
  HorizonCosts costs;
  StatusOr<SimulationResult> result = RunUnchecked(b, Launch10(), costs);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidInput);
}

TEST(EngineHorizonTest, AStragglerFactorOnAHugeKernelIsHeldAtTheHorizon) {
  // 2^59 ns x 1000 overflows int64 if converted unclamped (the --straggler 0:1e18 of issue 17
  // once made a rank's kernels take no time); held at 2^60, it passes the horizon: an error.
  Builder b(1);
  b.Kernel(0, 0, kHorizon / 2);
  FakeCosts costs;
  EngineConfig config = Launch10();
  config.rank_slowdown = {{0, kMaxRankSlowdownFactor}};
  StatusOr<SimulationResult> result = RunUnchecked(b, config, costs);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidInput);
  // A factor past the limit is refused before anything runs.
  config.rank_slowdown = {{0, 1e18}};
  result = RunUnchecked(b, config, costs);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().message(), "straggler rank 0: slowdown factor 1e+18 must be in [1, 1000]");
}

}  // namespace
}  // namespace shardscope::sim

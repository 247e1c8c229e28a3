// The size limits (work_limits.h) as LoadInput / LoadPlan apply them: the refusals name the
// caller's knobs, warnings go to the caller's callback, and the traced-ranks check runs before
// a plan with many micro-batches is lowered. (tests/cli/inputs_test.sh checks the estimate
// itself against real lowerings.)
#include "shardscope/sim/lowering/work_limits.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lowering_test_support.h"
#include "shardscope/sim/lowering/load_input.h"

namespace shardscope::sim {
namespace {

using ::testing::HasSubstr;
using test_support::MustParsePlan;

constexpr int64_t kGiB = int64_t{1} << 30;

WorkEstimate Estimate(int64_t bytes) {
  WorkEstimate work;
  work.ops = 100;
  work.rank_ops = 100;
  work.bytes = bytes;
  work.driver = "training.grad_accum_steps 5";
  return work;
}

// The Python module's names for the knobs.
WorkLimits ModuleNames(std::vector<std::string>* warnings) {
  WorkLimits limits;
  limits.warn = [warnings](const std::string& line) { warnings->push_back(line); };
  limits.force_flag = "force=True";
  limits.trace_ranks_flag = "trace_ranks";
  limits.fewer_ranks = "trace_ranks=[0], or []";
  return limits;
}

TEST(WorkLimitsTest, PastTheMemoryLimitTheRefusalNamesTheCallersForceFlag) {
  std::vector<std::string> warnings;
  WorkLimits limits = ModuleNames(&warnings);
  // 9 GiB > the 8 GiB limit: refused, before any warning.
  const Status refused = CheckWork(Estimate(9 * kGiB), "<dict>", limits);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidInput);
  EXPECT_EQ(refused.message(),
            "<dict>: training.grad_accum_steps 5 lowers to about 100 ops (~9.0 GiB in memory), more than the 8.0 GiB "
            "limit; lower training.grad_accum_steps, or pass force=True to go on");
  EXPECT_TRUE(warnings.empty());
  // force: on, with the warning (past 1 GiB) to the callback.
  limits.force = true;
  EXPECT_TRUE(CheckWork(Estimate(9 * kGiB), "<dict>", limits).ok());
  EXPECT_THAT(warnings, ::testing::ElementsAre(
                            "warning: <dict>: training.grad_accum_steps 5 lowers to about 100 ops (~9.0 GiB in memory)"));
  // The CLI's names by default; no callback, no warning.
  const Status cli = CheckWork(Estimate(9 * kGiB), "plan.yaml", WorkLimits{});
  EXPECT_THAT(cli.message(), HasSubstr("or pass --force to go on"));
  EXPECT_TRUE(CheckWork(Estimate(2 * kGiB), "plan.yaml", WorkLimits{}).ok());
}

TEST(WorkLimitsTest, UnderAGibNothingIsSaid) {
  std::vector<std::string> warnings;
  EXPECT_TRUE(CheckWork(Estimate(kGiB), "<dict>", ModuleNames(&warnings)).ok());  // 1 GiB is not past 1 GiB
  EXPECT_TRUE(warnings.empty());
}

TEST(WorkLimitsTest, TracedRanksRefusalNamesTheCallersTraceRanks) {
  std::vector<std::string> warnings;
  SimulateEstimate estimate;
  estimate.memory_bytes = 9 * kGiB;
  const Status refused = CheckSimulate(estimate, 4, "training.grad_accum_steps 5", ModuleNames(&warnings));
  EXPECT_EQ(refused.message(),
            "the simulation would hold about 9.0 GiB in memory with 4 traced rank(s), more than the 8.0 GiB limit; "
            "trace fewer ranks (trace_ranks=[0], or []), lower training.grad_accum_steps, or pass force=True to go on");
  // A trace over 256 MiB (here 512 MiB) warns naming the knob that traces fewer ranks.
  estimate.memory_bytes = 0;
  estimate.trace_bytes = 512 << 20;
  EXPECT_TRUE(CheckSimulate(estimate, 4, "training.grad_accum_steps 5", ModuleNames(&warnings)).ok());
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0], HasSubstr("Perfetto's UI may be slow; trace_ranks traces fewer"));
}

std::string ToyPlan(int grad_accum_steps) {
  return "model: {layers: 2, hidden: 256, heads: 4, kv_heads: 4, ffn: 688, vocab: 1000}\n"
         "cluster: {preset: dgx-a100, nodes: 1}\n"
         "strategy: fsdp2\n"
         "training: {seq_len: 128, dtype: bf16, grad_accum_steps: " + std::to_string(grad_accum_steps) + "}\n";
}

TEST(LoadPlanLimitsTest, TheTracedRanksAreAskedWithTheWorldAndItsNode) {
  // One node of dgx-a100: 8 ranks, 8 per node. grad_accum_steps 1 is lowered whole and counted
  // after (EstimatePlanWork samples only past 2 micro-batches); 3 is estimated first.
  for (const int steps : {1, 3}) {
    std::vector<std::pair<int32_t, int32_t>> asked;
    LoadOptions options;
    options.traced_ranks = [&](int32_t world, int32_t gpus_per_node) -> StatusOr<int64_t> {
      asked.emplace_back(world, gpus_per_node);
      return int64_t{1};
    };
    StatusOr<LoadedInput> loaded = LoadPlan(MustParsePlan(ToyPlan(steps)), "<dict>", options);
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    EXPECT_THAT(asked, ::testing::ElementsAre(std::make_pair(8, 8))) << "grad_accum_steps " << steps;
    EXPECT_EQ(loaded->setup.label, "<dict>");
  }
}

TEST(LoadPlanLimitsTest, ABadTracedRanksStopsTheLoad) {
  LoadOptions options;
  options.traced_ranks = [](int32_t, int32_t) -> StatusOr<int64_t> {
    return Status::InvalidInput("--trace-ranks: '9' is outside the world of 8 ranks");
  };
  const StatusOr<LoadedInput> loaded = LoadPlan(MustParsePlan(ToyPlan(3)), "<dict>", options);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().message(), "--trace-ranks: '9' is outside the world of 8 ranks");
}

}  // namespace
}  // namespace shardscope::sim

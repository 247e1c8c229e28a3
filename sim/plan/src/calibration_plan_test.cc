// `cluster: {calibration: profile.yaml}`: the plan reads the profile (relative to the plan's
// folder), its fitted launch cost and contention replace the plan's, the schedule carries
// the path, and the simulation's cost provider uses the fitted efficiencies.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "shardscope/sim/models/calibration.h"
#include "shardscope/sim/models/compute_model.h"
#include "shardscope/sim/lowering/lowering.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/sim/report/report.h"

namespace shardscope::sim {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class CalibrationPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("shardscope-calibration-plan-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string PlanText(const std::string& cluster_extra) const {
    return "model: {preset: llama3-8b, layers: 2, hidden: 256, heads: 4, kv_heads: 2, ffn: 512, vocab: 1000}\n"
           "cluster: {preset: dgx-a100, nodes: 1, gpus_per_node: 2" + cluster_extra + "}\n"
           "strategy: fsdp2\n"
           "training: {seq_len: 128}\n";
  }
  StatusOr<Plan> Parse(const std::string& text) const { return ParsePlan(text, (dir_ / "plan.yaml").string()); }

  std::filesystem::path dir_;
};

CalibrationProfile ProfileFor(const std::string& gpu) {
  CalibrationProfile profile;
  profile.gpu = gpu;
  profile.launch_overhead_ns = FittedValue{7000, {10, 0.01}};
  profile.compute_slowdown = FittedValue{0.3, {10, 0.02}};
  profile.comm_slowdown = FittedValue{0.2, {10, 0.02}};
  // Every bf16 GEMM between 10^5 and 10^12 FLOPs at 10% of peak: far below the roofline's.
  for (int32_t decade = 5; decade < 12; ++decade) {
    profile.gemm.push_back(GemmCalibration{traces::DType::kBFloat16, decade, 0.1, {5, 0.01}});
  }
  return profile;
}

TEST_F(CalibrationPlanTest, AProfileReplacesLaunchCostAndContentionAndSlowsTheGemms) {
  StatusOr<Plan> uncalibrated = Parse(PlanText(""));
  ASSERT_TRUE(uncalibrated.ok()) << uncalibrated.status().message();
  ASSERT_TRUE(WriteCalibrationProfile(ProfileFor(uncalibrated->cluster.gpu.name), (dir_ / "profile.yaml").string()).ok());

  StatusOr<Plan> plan = Parse(PlanText(", calibration: profile.yaml"));
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->calibration, (dir_ / "profile.yaml").string());
  EXPECT_EQ(plan->host.launch_overhead_ns, 7000);
  EXPECT_DOUBLE_EQ(plan->contention.compute_slowdown, 0.3);
  EXPECT_DOUBLE_EQ(plan->contention.comm_slowdown, 0.2);

  StatusOr<traces::Schedule> schedule = LowerPlan(*plan);
  ASSERT_TRUE(schedule.ok()) << schedule.status().message();
  StatusOr<SimulationSetup> setup = SetupFromSchedule(*schedule, "<test>");
  ASSERT_TRUE(setup.ok()) << setup.status().message();
  ASSERT_NE(setup->calibration, nullptr);
  EXPECT_EQ(setup->host.launch_overhead_ns, 7000);

  StatusOr<traces::Schedule> base_schedule = LowerPlan(*uncalibrated);
  ASSERT_TRUE(base_schedule.ok());
  StatusOr<SimulationSetup> base_setup = SetupFromSchedule(*base_schedule, "<test>");
  ASSERT_TRUE(base_setup.ok());
  EXPECT_EQ(base_setup->calibration, nullptr);
  StatusOr<std::unique_ptr<CostProvider>> calibrated = MakeCostProvider(*schedule, *setup);
  StatusOr<std::unique_ptr<CostProvider>> roofline = MakeCostProvider(*base_schedule, *base_setup);
  ASSERT_TRUE(calibrated.ok() && roofline.ok());
  // A 4096^3 bf16 GEMM (1.4e11 FLOPs): at 10% of peak it takes longer than the roofline says.
  const traces::ComputeDesc gemm = traces::GemmDesc{4096, 4096, 4096, 1, traces::DType::kBFloat16};
  EXPECT_GT((*calibrated)->KernelNs(gemm), (*roofline)->KernelNs(gemm));
  const double peak =
      ComputeModel(setup->cluster.gpu, ComputeModelConfig::Default()).EffectivePeakFlops(traces::DType::kBFloat16);
  EXPECT_NEAR(static_cast<double>((*calibrated)->KernelNs(gemm)), 2.0 * 4096 * 4096 * 4096 / (0.1 * peak) * 1e9,
              0.02 * 2.0 * 4096 * 4096 * 4096 / (0.1 * peak) * 1e9);
}

TEST_F(CalibrationPlanTest, AMissingOrForeignProfileIsAnErrorAtTheKey) {
  EXPECT_THAT(Parse(PlanText(", calibration: missing.yaml")).status().message(),
              AllOf(HasSubstr("plan.yaml:2:70: cluster.calibration: expected a readable calibration profile"),
                    HasSubstr("missing.yaml")));
  ASSERT_TRUE(WriteCalibrationProfile(ProfileFor("h100-sxm5-80gb"), (dir_ / "h100.yaml").string()).ok());
  EXPECT_THAT(Parse(PlanText(", calibration: h100.yaml")).status().message(),
              AllOf(HasSubstr("cluster.calibration: expected a profile measured on the cluster's GPU"),
                    HasSubstr("a profile of h100-sxm5-80gb")));
}

}  // namespace
}  // namespace shardscope::sim

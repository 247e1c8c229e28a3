// What the lowering tests share: lower-and-validate, and simulate-with-the-plan's-setup.
// Test-only (included by sim/*/src/*_test.cc and analysis tests); inline so it stays out of the library.
#ifndef SHARDSCOPE_SIM_LOWERING_TEST_SUPPORT_H_
#define SHARDSCOPE_SIM_LOWERING_TEST_SUPPORT_H_

#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "shardscope/sim/engine/engine.h"
#include "shardscope/sim/lowering/lowering.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/sim/report/report.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::sim::test_support {

// A 2-block toy model (hidden 256) on one 8-GPU node under DDP, bf16, with
// `grad_accum_steps` micro-batches (the ZeRO tests set their strategy on the parsed plan).
inline std::string ToyDdpYaml(int32_t grad_accum_steps) {
  return "model: {layers: 2, hidden: 256, heads: 4, kv_heads: 4, ffn: 688, vocab: 1000}\n"
         "cluster: {preset: dgx-a100, nodes: 1}\n"
         "strategy: ddp\n"
         "training: {seq_len: 128, micro_batch_size: 1, grad_accum_steps: " +
         std::to_string(grad_accum_steps) + ", dtype: bf16}\n";
}

// ParsePlan of a test's YAML; a failure fails the test and gives a default Plan.
inline Plan MustParsePlan(const std::string& yaml) {
  StatusOr<Plan> plan = ParsePlan(yaml, "<test>");
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return plan.ok() ? *plan : Plan{};
}

// LowerPlan + ValidateSchedule; a failure fails the test and gives an empty schedule.
inline traces::Schedule MustLower(const Plan& plan) {
  StatusOr<traces::Schedule> schedule = LowerPlan(plan);
  EXPECT_TRUE(schedule.ok()) << schedule.status().message();
  if (!schedule.ok()) return {};
  const Status valid = traces::ValidateSchedule(*schedule);
  EXPECT_TRUE(valid.ok()) << valid.message();
  return *schedule;
}

// Simulates with the setup the schedule's metadata describes; a failure to run (not a hang:
// that is a result) fails the test and gives nullopt.
inline std::optional<SimulationResult> RunSimulation(const traces::Schedule& schedule) {
  StatusOr<SimulationSetup> setup = SetupFromSchedule(schedule, "<test>");
  EXPECT_TRUE(setup.ok()) << setup.status().message();
  if (!setup.ok()) return std::nullopt;
  ClusterCostProvider costs(schedule, setup->cluster);
  StatusOr<SimulationResult> result = Simulate(schedule, costs, EngineConfigFor(*setup, schedule), nullptr);
  EXPECT_TRUE(result.ok()) << result.status().message();
  if (!result.ok()) return std::nullopt;
  return std::move(result).value();
}

// Every rank finished: no hang, no rank out of memory.
inline bool Completed(const SimulationResult& result) {
  if (result.hung) return false;
  for (const RankStats& rank : result.ranks) {
    if (!rank.finished || rank.memory.oom.has_value()) return false;
  }
  return true;
}

}  // namespace shardscope::sim::test_support

#endif  // SHARDSCOPE_SIM_LOWERING_TEST_SUPPORT_H_

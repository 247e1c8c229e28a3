// What the plan tests share (plan_test.cc and plan_<section>_test.cc): plan texts built line by
// line, so a test can say which line an error must point at, and the parse helpers that expect
// success or an invalid-input error. Included by test files only; its names are in
// shardscope::sim, like the tests that use them.
#ifndef SHARDSCOPE_SIM_PLAN_TEST_SUPPORT_H_
#define SHARDSCOPE_SIM_PLAN_TEST_SUPPORT_H_

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "shardscope/sim/plan/plan.h"

namespace shardscope::sim {

inline constexpr char kSource[] = "test.yaml";

// Joins lines with '\n' so a test can say which line (1-based) an error must point at.
inline std::string Lines(std::initializer_list<std::string_view> lines) {
  std::string text;
  for (std::string_view line : lines) {
    text += line;
    text += '\n';
  }
  return text;
}

inline Plan ParseOk(const std::string& text) {
  StatusOr<Plan> plan = ParsePlan(text, kSource);
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return plan.ok() ? std::move(plan).value() : Plan{};
}

// Parses `text`, expects kInvalidInput, returns the message.
inline std::string ParseError(const std::string& text) {
  StatusOr<Plan> plan = ParsePlan(text, kSource);
  EXPECT_FALSE(plan.ok()) << "parsed without error:\n" << text;
  if (plan.ok()) return "";
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidInput) << plan.status().message();
  return plan.status().message();
}

// The valid plan most error tests start from; line numbers matter.
inline std::string BasePlan() {
  return Lines({
      "model: llama3-8b",                       // 1
      "cluster: {preset: dgx-a100, nodes: 8}",  // 2
      "strategy: fsdp2",                        // 3
      "training:",                              // 4
      "  seq_len: 8192",                        // 5
      "  micro_batch_size: 1",                  // 6
      "  dtype: bf16",                          // 7
      "fsdp2:",                                 // 8
      "  reshard_after_forward: true",          // 9
  });
}

// The name of the first GPU preset of `arch`, or "" when there is none.
inline std::string GpuPresetOfArch(GpuArch arch) {
  for (const std::string& name : GpuPresetNames()) {
    StatusOr<GpuSpec> gpu = FindGpuPreset(name);
    if (gpu.ok() && gpu->arch == arch) return name;
  }
  return "";
}

// A 4-block model on 16 GPUs (2 nodes of 8); `rest` starts at line 4.
inline constexpr char kDense4[] = "model: {preset: llama3-8b, layers: 4}";
inline constexpr char kMoe4[] = "model: {preset: mixtral-8x7b, layers: 4}";  // 8 experts

inline std::string Plan16(std::string_view model, std::string_view strategy,
                          std::initializer_list<std::string_view> rest) {
  std::string text = Lines({model, "cluster: {preset: dgx-a100, nodes: 2}",
                            std::string("strategy: ") + std::string(strategy)});
  for (std::string_view line : rest) {
    text += line;
    text += '\n';
  }
  return text;
}

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_PLAN_TEST_SUPPORT_H_

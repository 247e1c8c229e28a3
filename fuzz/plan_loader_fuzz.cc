// libFuzzer target for the plan loader: ParsePlan must turn any bytes into a Plan or a
// Status, never crash, hang or throw.
//
//   fuzz/plan_loader_fuzz fuzz/corpus/plan -max_total_time=60
// Crashing inputs are kept under tests/regressions/plan/ (replayed by plan_test.cc).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "shardscope/sim/plan/plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  shardscope::StatusOr<shardscope::sim::Plan> plan = shardscope::sim::ParsePlan(text, "fuzz.yaml");
  // Every error must say what went wrong.
  if (!plan.ok() && plan.status().message().empty()) __builtin_trap();
  return 0;
}

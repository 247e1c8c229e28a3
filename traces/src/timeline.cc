// Category names and replaying an in-memory timeline into another sink.
#include "shardscope/traces/timeline.h"

#include <array>

namespace shardscope::traces {
namespace {

// Indexed by Category; kOther's name is what a writer prints when it has no raw category.
constexpr std::array<std::string_view, 10> kCategoryNames = {
    "kernel",    "gpu_memcpy", "gpu_memset",      "cuda_runtime",        "cuda_driver",
    "cuda_sync", "cpu_op",     "user_annotation", "gpu_user_annotation", "other"};
static_assert(kCategoryNames.size() == static_cast<size_t>(Category::kOther) + 1);

}  // namespace

std::string_view CategoryName(Category category) {
  const auto index = static_cast<size_t>(category);
  return index < kCategoryNames.size() ? kCategoryNames[index] : kCategoryNames.back();
}

Category ParseCategory(std::string_view name) {
  // kOther is deliberately not matched by name: "other" is as foreign as any unknown
  // category, and keeping it in Slice::raw_category makes the round trip exact.
  for (size_t i = 0; i + 1 < kCategoryNames.size(); ++i) {
    if (kCategoryNames[i] == name) return static_cast<Category>(i);
  }
  return Category::kOther;
}

void Timeline::ReplayInto(TimelineSink& sink) const {
  for (const ProcessInfo& process : processes) sink.OnProcess(process);
  for (const ThreadInfo& thread : threads) sink.OnThread(thread);
  for (const Slice& slice : slices) sink.OnSlice(slice);
  for (const Instant& instant : instants) sink.OnInstant(instant);
  for (const CounterSample& sample : counters) sink.OnCounter(sample);
  for (const Flow& flow : flows) sink.OnFlow(flow);
}

}  // namespace shardscope::traces

// Category names and replaying an in-memory timeline into another sink.
#include "shardscope/traces/timeline.h"

#include <array>
#include <utility>

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
  // Kineto's schemaVersion 1 traces of 2021 (PyTorch 1.8/1.9) name the same activities with
  // capitals, as in kineto's tb_plugin sample resnet50_num_workers_0/
  // worker0.1623143089861.pt.trace.json: "Operator" (CPU ops and the ProfilerStep#N
  // annotations), "Runtime", "Kernel", "Memcpy", "Memset". Reading them as today's categories
  // lets every reader (import, analyze, diff, calibrate) treat old and new traces alike.
  static constexpr std::pair<std::string_view, Category> kSchema1Names[] = {
      {"Kernel", Category::kKernel},        {"Memcpy", Category::kGpuMemcpy}, {"Memset", Category::kGpuMemset},
      {"Runtime", Category::kCudaRuntime}, {"Operator", Category::kCpuOp},
  };
  for (const auto& [old_name, category] : kSchema1Names) {
    if (old_name == name) return category;
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

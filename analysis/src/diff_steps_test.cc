// Tests of the diff's step handling (diff.h SelectDiffStep): which step of a multi-step
// measured trace is compared, and what a side cut to one step holds. Every expectation is
// worked out by hand from the small traces built here.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "shardscope/traces/chrome_trace.h"
#include "shardscope/analysis/diff.h"

namespace shardscope::traces {
namespace {

using ::testing::HasSubstr;

// A `run --profile`-like trace of two ranks: per rank and step a host op over the step's
// window and a kernel inside it, both with the "step" arg. Windows (ns):
//   step:     0          1           2           3
//   rank 0: [90, 100)  [100, 150)  [150, 230)  [230, 290)
//   rank 1: [85, 95)   [100, 160)  [160, 230)  [230, 300)
// Step durations (the slower rank): 10, 60, 80, 70.
Timeline MeasuredSteps() {
  Timeline t;
  t.info.producer = "shardscope run --backend host";
  t.info.world_size = 2;
  const int64_t windows[2][4][2] = {{{90, 100}, {100, 150}, {150, 230}, {230, 290}},
                                    {{85, 95}, {100, 160}, {160, 230}, {230, 300}}};
  for (int32_t rank = 0; rank < 2; ++rank) {
    for (int64_t step = 0; step < 4; ++step) {
      const int64_t begin = windows[rank][step][0];
      const int64_t end = windows[rank][step][1];
      Slice host;
      host.pid = rank;
      host.tid = 0;
      host.ts_ns = begin;
      host.dur_ns = end - begin;
      host.name = "op";
      host.category = Category::kCpuOp;
      host.op_id = 1;
      host.args.push_back({"step", step});
      t.slices.push_back(host);
      Slice kernel = host;
      kernel.tid = 1;
      kernel.ts_ns = begin + 1;
      kernel.dur_ns = 5;
      kernel.name = "gemm";
      kernel.category = Category::kKernel;
      t.slices.push_back(kernel);
    }
  }
  return t;
}

Timeline PredictedOneStep() {
  Timeline t;
  t.info.producer = "shardscope simulate";
  Slice kernel;
  kernel.tid = 1;
  kernel.ts_ns = 0;
  kernel.dur_ns = 5;
  kernel.name = "gemm";
  kernel.category = Category::kKernel;
  kernel.op_id = 1;
  t.slices.push_back(kernel);
  return t;
}

TEST(DiffStepsTest, FindsEachRanksStepWindows) {
  const std::vector<TraceStepSpan> steps = FindTraceSteps(DiffSideFromTimeline(MeasuredSteps(), "m"));
  ASSERT_EQ(steps.size(), 8u);
  // By (step, rank): step 2 of rank 1 is [160, 230).
  EXPECT_EQ(steps[5].step, 2);
  EXPECT_EQ(steps[5].rank, 1);
  EXPECT_EQ(steps[5].begin_ns, 160);
  EXPECT_EQ(steps[5].end_ns, 230);
}

TEST(DiffStepsTest, MedianStepWithoutAndWithTheWarmUp) {
  // All four steps by duration: 10 (0), 60 (1), 70 (3), 80 (2): the lower median is step 1.
  {
    DiffSide predicted = DiffSideFromTimeline(PredictedOneStep(), "p");
    DiffSide measured = DiffSideFromTimeline(MeasuredSteps(), "m");
    ASSERT_TRUE(SelectDiffStep(predicted, measured, -1).ok());
    EXPECT_EQ(measured.selected_step, 1);
    EXPECT_EQ(predicted.selected_step, -1);  // one step: left whole
    EXPECT_TRUE(predicted.step_note.empty());
  }
  // One warm-up step: 60 (1), 70 (3), 80 (2): the median is step 3.
  DiffSide predicted = DiffSideFromTimeline(PredictedOneStep(), "p");
  DiffSide measured = DiffSideFromTimeline(MeasuredSteps(), "m");
  measured.warmup_steps = 1;
  ASSERT_TRUE(SelectDiffStep(predicted, measured, -1).ok());
  EXPECT_EQ(measured.selected_step, 3);
  EXPECT_THAT(measured.step_note, HasSubstr("step 3, the median of those after 1 warm-up step(s) of steps 0, 1, 2, 3"));
  // Cut to step 3: one host op and one kernel per rank, those of step 3.
  ASSERT_EQ(measured.files.size(), 1u);
  ASSERT_EQ(measured.files[0].slices.size(), 4u);
  for (const Slice& s : measured.files[0].slices) {
    EXPECT_GE(s.ts_ns, 230);
    EXPECT_EQ(std::get<int64_t>(s.args.at(0).value), 3);
  }
  EXPECT_TRUE(measured.warnings.empty());
}

TEST(DiffStepsTest, RequestedStepAndItsErrors) {
  DiffSide predicted = DiffSideFromTimeline(PredictedOneStep(), "p");
  DiffSide measured = DiffSideFromTimeline(MeasuredSteps(), "m");
  ASSERT_TRUE(SelectDiffStep(predicted, measured, 2).ok());
  EXPECT_EQ(measured.selected_step, 2);
  EXPECT_EQ(measured.files[0].slices.size(), 4u);

  DiffSide again = DiffSideFromTimeline(MeasuredSteps(), "m");
  const Status missing = SelectDiffStep(predicted, again, 9);
  EXPECT_EQ(missing.code(), StatusCode::kInvalidInput);
  EXPECT_THAT(missing.message(), HasSubstr("--step 9: m holds steps 0, 1, 2, 3"));

  DiffSide single = DiffSideFromTimeline(PredictedOneStep(), "single");
  EXPECT_THAT(SelectDiffStep(predicted, single, 0).message(), HasSubstr("single marks no steps"));
}

TEST(DiffStepsTest, TimeScaleOtherThanOneWarns) {
  DiffSide predicted = DiffSideFromTimeline(PredictedOneStep(), "p");
  DiffSide measured = DiffSideFromTimeline(MeasuredSteps(), "m");
  measured.time_scale = 0.001;
  ASSERT_TRUE(SelectDiffStep(predicted, measured, -1).ok());
  ASSERT_EQ(measured.warnings.size(), 1u);
  EXPECT_THAT(measured.warnings[0], HasSubstr("used --time-scale 0.001"));

  DiffSide unscaled = DiffSideFromTimeline(MeasuredSteps(), "m");
  unscaled.time_scale = 1.0;
  ASSERT_TRUE(SelectDiffStep(predicted, unscaled, -1).ok());
  EXPECT_TRUE(unscaled.warnings.empty());
}

TEST(DiffStepsTest, ProfilerStepCutFollowsLaunchesByCorrelation) {
  // ProfilerStep#5 [0, 100) us and #6 [100, 200) us on the host; kernel A launched at 10 us
  // (step 5) runs at 150 us, kernel B launched at 110 us runs at 160 us, kernel C has no
  // correlation and starts at 120 us. Step 6 keeps #6, B's launch, B and C; not A.
  Timeline t;
  t.info.producer = "torch";
  t.info.rank = 0;
  t.info.world_size = 2;
  const auto add = [&](const char* name, Category category, int32_t pid, int64_t ts_us, int64_t dur_us,
                       int64_t correlation) {
    Slice s;
    s.pid = pid;
    s.tid = pid == 0 ? 7 : 1;
    s.ts_ns = ts_us * 1000;
    s.dur_ns = dur_us * 1000;
    s.name = name;
    s.category = category;
    s.correlation = correlation;
    t.slices.push_back(s);
  };
  add("ProfilerStep#5", Category::kUserAnnotation, 100, 0, 100, -1);
  add("ProfilerStep#6", Category::kUserAnnotation, 100, 100, 100, -1);
  add("cudaLaunchKernel", Category::kCudaRuntime, 100, 10, 1, 1);
  add("cudaLaunchKernel", Category::kCudaRuntime, 100, 110, 1, 2);
  add("A", Category::kKernel, 0, 150, 5, 1);
  add("B", Category::kKernel, 0, 160, 5, 2);
  add("C", Category::kKernel, 0, 120, 5, -1);
  StatusOr<DiffSide> cut = CutToStep(DiffSideFromTimeline(std::move(t), "kineto"), 6);
  ASSERT_TRUE(cut.ok()) << cut.status().message();
  std::vector<std::string> names;
  for (const Slice& s : cut->files[0].slices) names.push_back(s.name);
  EXPECT_EQ(names, (std::vector<std::string>{"ProfilerStep#6", "cudaLaunchKernel", "B", "C"}));
}

TEST(DiffStepsTest, RunReportBesideTheTraceGivesTimeScaleAndWarmUp) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardscope_diff_steps_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  ASSERT_TRUE(WriteChromeTrace(MeasuredSteps(), (dir / "trace.json").string()).ok());
  {
    std::ofstream report(dir / "report.json");
    report << R"({"runtime": {"backend": "host", "steps": 3, "warmup": 1, "time_scale": 0.001}})";
  }
  StatusOr<DiffSide> side = LoadDiffSide(dir.string());
  ASSERT_TRUE(side.ok()) << side.status().message();
  EXPECT_EQ(side->time_scale, 0.001);
  EXPECT_EQ(side->warmup_steps, 1);
  DiffSide predicted = DiffSideFromTimeline(PredictedOneStep(), "p");
  ASSERT_TRUE(SelectDiffStep(predicted, *side, -1).ok());
  EXPECT_EQ(side->selected_step, 3);
  EXPECT_EQ(side->warnings.size(), 1u);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shardscope::traces

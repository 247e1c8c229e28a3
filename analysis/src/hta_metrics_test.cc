// Tests of HTA's metrics: a small trace whose figures are worked out by hand below, and the
// real traces in tests/fixtures/real/traces/ against the figures HTA itself gives for them
// (the fixtures' README.md).
#include "shardscope/analysis/hta_metrics.h"

#include <gtest/gtest.h>

#include <string>

#include "shardscope/traces/chrome_trace.h"
#include "shardscope/analysis/diff.h"

namespace shardscope::traces {
namespace {

constexpr int64_t kUs = 1000;

Slice Runtime(int64_t ts_us, int64_t correlation) {
  Slice s;
  s.pid = 100;
  s.tid = 100;
  s.ts_ns = ts_us * kUs;
  s.dur_ns = kUs;
  s.name = "cudaLaunchKernel";
  s.category = Category::kCudaRuntime;
  s.correlation = correlation;
  return s;
}

Slice Gpu(std::string name, Category category, int64_t stream, int64_t begin_ns, int64_t end_ns, int64_t correlation) {
  Slice s;
  s.pid = 0;
  s.tid = static_cast<int32_t>(stream);
  s.ts_ns = begin_ns;
  s.dur_ns = end_ns - begin_ns;
  s.name = std::move(name);
  s.category = category;
  s.correlation = correlation;
  s.args.push_back({"stream", stream});
  return s;
}

Slice Step(int64_t n, int64_t begin_us, int64_t end_us) {
  Slice s;
  s.pid = 100;
  s.tid = 100;
  s.ts_ns = begin_us * kUs;
  s.dur_ns = (end_us - begin_us) * kUs;
  s.name = "ProfilerStep#" + std::to_string(n);
  s.category = Category::kUserAnnotation;
  return s;
}

// Two profiler steps [0, 100) and [100, 200) us; stream 7 runs compute kernels and a copy,
// stream 20 one NCCL kernel; K7 is launched in the last step.
//   K1 compute  [20, 40)  launched at 10      K2 nccl  [30, 60)  at 15 (stream 20)
//   K3 compute  [75, 85)  at 70               K4 Memcpy [85, 95) at 16
//   K5 compute [100, 110) at 17               K6 compute [150, 160) at 18
//   K7 compute [170, 180) at 120 (last step: filtered out)
Timeline SmallTrace() {
  Timeline t;
  t.info.producer = "torch";
  t.info.rank = 3;
  t.info.world_size = 4;
  t.slices.push_back(Step(1, 0, 100));
  t.slices.push_back(Step(2, 100, 200));
  const struct {
    const char* name;
    Category category;
    int64_t stream, begin_us, end_us, launch_us;
  } kernels[] = {
      {"void gemm_kernel", Category::kKernel, 7, 20, 40, 10},
      {"ncclDevKernel_AllReduce_Sum_f32_RING_LL", Category::kKernel, 20, 30, 60, 15},
      {"elementwise", Category::kKernel, 7, 75, 85, 70},
      {"Memcpy DtoD (Device -> Device)", Category::kGpuMemcpy, 7, 85, 95, 16},
      {"elementwise", Category::kKernel, 7, 100, 110, 17},
      {"elementwise", Category::kKernel, 7, 150, 160, 18},
      {"elementwise", Category::kKernel, 7, 170, 180, 120},
  };
  int64_t correlation = 1;
  for (const auto& k : kernels) {
    t.slices.push_back(Runtime(k.launch_us, correlation));
    t.slices.push_back(Gpu(k.name, k.category, k.stream, k.begin_us * kUs, k.end_us * kUs, correlation));
    ++correlation;
  }
  return t;
}

TEST(HtaMetricsTest, SmallTraceByHand) {
  const DiffSide side = DiffSideFromTimeline(SmallTrace(), "small");
  const std::vector<HtaRankMetrics> ranks = ComputeHtaMetrics(side, HtaOptions{});
  ASSERT_EQ(ranks.size(), 1u);
  const HtaRankMetrics& m = ranks[0];
  EXPECT_EQ(m.rank, 3);
  EXPECT_TRUE(m.last_step_excluded);
  EXPECT_FALSE(m.rounded_to_us);
  EXPECT_EQ(m.gpu_events, 6);
  // Span [20, 160) = 140 us; union [20,60) + [75,95) + [100,110) + [150,160) = 80 us.
  EXPECT_EQ(m.span_ns, 140 * kUs);
  EXPECT_EQ(m.idle_ns, 60 * kUs);
  EXPECT_EQ(m.compute_ns, 50 * kUs);      // K1, K3, K5, K6
  EXPECT_EQ(m.non_compute_ns, 30 * kUs);  // nccl [40, 60) outside compute + the copy
  EXPECT_EQ(m.comm_ns, 30 * kUs);
  EXPECT_EQ(m.overlap_ns, 10 * kUs);      // [30, 40)
  EXPECT_NEAR(m.IdlePct(), 100.0 * 60 / 140, 1e-9);
  EXPECT_NEAR(m.CommCompOverlapPct(), 100.0 / 3, 1e-9);
  // Stream 7: K3's gap 35 us, launched at 70 > 40: host wait; K4 follows at once (kernel
  // wait 0); K5's gap 5 us < 30 us: kernel wait; K6's gap 40 us: other.
  ASSERT_EQ(m.streams.size(), 2u);
  EXPECT_EQ(m.streams[0].stream, 7);
  EXPECT_EQ(m.streams[0].events, 5);
  EXPECT_EQ(m.streams[0].host_wait_ns, 35 * kUs);
  EXPECT_EQ(m.streams[0].kernel_wait_ns, 5 * kUs);
  EXPECT_EQ(m.streams[0].other_ns, 40 * kUs);
  EXPECT_EQ(m.streams[0].idle_ns, 80 * kUs);
  EXPECT_EQ(m.streams[1].stream, 20);
  EXPECT_EQ(m.streams[1].idle_ns, 0);
  // Kernel types: compute alone 40, compute with comm 10, comm alone 20, memory 10.
  ASSERT_EQ(m.kernel_types.size(), 4u);
  EXPECT_EQ(m.kernel_types[0].type, "COMPUTATION");
  EXPECT_EQ(m.kernel_types[0].ns, 40 * kUs);
  EXPECT_EQ(m.kernel_types[1].type, "COMMUNICATION");
  EXPECT_EQ(m.kernel_types[1].ns, 20 * kUs);
  EXPECT_EQ(m.kernel_types[2].type, "COMPUTATION overlapping COMMUNICATION");
  EXPECT_EQ(m.kernel_types[2].ns, 10 * kUs);
  EXPECT_EQ(m.kernel_types[3].type, "MEMORY");
  EXPECT_EQ(m.kernel_types[3].ns, 10 * kUs);
}

TEST(HtaMetricsTest, IncludeLastProfilerStepKeepsItsKernels) {
  const DiffSide side = DiffSideFromTimeline(SmallTrace(), "small");
  HtaOptions options;
  options.include_last_profiler_step = true;
  const HtaRankMetrics m = ComputeHtaMetrics(side, options).at(0);
  EXPECT_FALSE(m.last_step_excluded);
  EXPECT_EQ(m.gpu_events, 7);
  EXPECT_EQ(m.span_ns, 160 * kUs);  // [20, 180)
}

TEST(HtaMetricsTest, KernelWaitThresholdIsAnOption) {
  const DiffSide side = DiffSideFromTimeline(SmallTrace(), "small");
  HtaOptions options;
  options.kernel_wait_threshold_ns = 50 * kUs;  // K6's 40 us gap becomes kernel wait
  const HtaRankMetrics m = ComputeHtaMetrics(side, options).at(0);
  EXPECT_EQ(m.streams[0].kernel_wait_ns, 45 * kUs);
  EXPECT_EQ(m.streams[0].other_ns, 0);
}

TEST(HtaMetricsTest, FractionalMicrosecondsRoundInwardAsHtaDoes) {
  Timeline t;
  t.info.producer = "torch";
  t.slices.push_back(Gpu("a", Category::kKernel, 7, 1500, 3500, -1));  // [1.5, 3.5) -> [2, 3)
  t.slices.push_back(Gpu("b", Category::kKernel, 7, 5000, 6000, -1));
  const DiffSide side = DiffSideFromTimeline(std::move(t), "fractional");
  const HtaRankMetrics rounded = ComputeHtaMetrics(side, HtaOptions{}).at(0);
  EXPECT_TRUE(rounded.rounded_to_us);
  EXPECT_EQ(rounded.span_ns, 4 * kUs);  // [2, 6)
  EXPECT_EQ(rounded.idle_ns, 2 * kUs);
  HtaOptions exact;
  exact.round_to_whole_us = false;
  const HtaRankMetrics m = ComputeHtaMetrics(side, exact).at(0);
  EXPECT_EQ(m.span_ns, 4500);
  EXPECT_EQ(m.idle_ns, 1500);
}

TEST(HtaMetricsTest, NoGpuEventsGivesZeros) {
  Timeline t;
  t.info.producer = "torch";
  t.slices.push_back(Runtime(1, 1));
  const HtaRankMetrics m = ComputeHtaMetrics(DiffSideFromTimeline(std::move(t), "host only"), HtaOptions{}).at(0);
  EXPECT_EQ(m.span_ns, 0);
  EXPECT_EQ(m.IdlePct(), 0.0);
  EXPECT_EQ(m.CommCompOverlapPct(), 0.0);
  EXPECT_TRUE(m.streams.empty());
}

std::string RealTrace(const std::string& relative) {
  return std::string(SHARDSCOPE_SOURCE_DIR) + "/tests/fixtures/real/traces/" + relative;
}

struct HtaFigures {
  const char* file;
  int32_t rank;
  double idle, compute, non_compute, overlap;
};

// HTA's own figures for the real traces (tests/fixtures/real/traces/*/README.md).
constexpr HtaFigures kRealFigures[] = {
    {"hta-resnet-ddp-a100/nccl_data.json.gz", 0, 77.78, 17.26, 4.97, 14.31},
    {"hta-recsys-2-of-128-ranks/sampled_rank-0.json.gz", 0, 53.56, 17.71, 28.74, 11.81},
    {"hta-recsys-2-of-128-ranks/sampled_rank-1.json.gz", 1, 54.72, 22.57, 22.72, 20.05},
};
constexpr double kTolerancePp = 0.5;

TEST(HtaMetricsTest, RealTracesAgreeWithHta) {
  for (const HtaFigures& expected : kRealFigures) {
    SCOPED_TRACE(expected.file);
    StatusOr<DiffSide> side = LoadDiffSide(RealTrace(expected.file));
    ASSERT_TRUE(side.ok()) << side.status().message();
    const std::vector<HtaRankMetrics> ranks = ComputeHtaMetrics(*side, HtaOptions{});
    ASSERT_EQ(ranks.size(), 1u);
    const HtaRankMetrics& m = ranks[0];
    EXPECT_EQ(m.rank, expected.rank);
    EXPECT_TRUE(m.last_step_excluded);
    EXPECT_NEAR(m.IdlePct(), expected.idle, kTolerancePp);
    EXPECT_NEAR(m.ComputePct(), expected.compute, kTolerancePp);
    EXPECT_NEAR(m.NonComputePct(), expected.non_compute, kTolerancePp);
    EXPECT_NEAR(m.CommCompOverlapPct(), expected.overlap, kTolerancePp);
    // The three parts fill the span exactly, and no stream's idle time exceeds it.
    EXPECT_EQ(m.idle_ns + m.compute_ns + m.non_compute_ns, m.span_ns);
    for (const HtaStreamIdle& s : m.streams) {
      EXPECT_LE(s.idle_ns, m.span_ns) << s.name;
      EXPECT_GE(s.host_wait_ns, 0);
      EXPECT_GE(s.kernel_wait_ns, 0);
      EXPECT_GE(s.other_ns, 0);
    }
    int64_t by_type = 0;
    for (const HtaKernelTypeTime& k : m.kernel_types) by_type += k.ns;
    EXPECT_EQ(by_type, m.span_ns - m.idle_ns);
  }
}

TEST(HtaMetricsTest, TwoRanksFromTwoFiles) {
  // A directory-less side of two files is what analyze builds from its arguments.
  StatusOr<DiffSide> a = LoadDiffSide(RealTrace(kRealFigures[1].file));
  StatusOr<DiffSide> b = LoadDiffSide(RealTrace(kRealFigures[2].file));
  ASSERT_TRUE(a.ok() && b.ok());
  DiffSide both = std::move(*a);
  both.files.push_back(std::move(b->files[0]));
  both.file_names.push_back(b->file_names[0]);
  both.file_rank.push_back(b->file_rank[0]);
  const std::vector<HtaRankMetrics> ranks = ComputeHtaMetrics(both, HtaOptions{});
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_NEAR(ranks[0].IdlePct(), 53.56, kTolerancePp);
  EXPECT_NEAR(ranks[1].IdlePct(), 54.72, kTolerancePp);
}

}  // namespace
}  // namespace shardscope::traces

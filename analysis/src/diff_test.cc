// Tests of the predicted-vs-measured diff. Expectations are computed by hand from a small
// replay of two ranks (host launches, one FIFO stream, collectives that start when every
// rank is ready), never copied from the diff's output.
#include "shardscope/analysis/diff.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>

#include <gtest/gtest.h>

#include "diff_internal.h"
#include "shardscope/traces/chrome_trace.h"

namespace shardscope::traces {
namespace {

constexpr int64_t kUs = 1000;

std::string fmt_rank(int32_t r) { return "rank " + std::to_string(r); }

struct MiniOp {
  std::string name;
  int64_t dur_ns = 0;
  std::string collective;  // "" for a compute kernel
  int64_t seq = -1;
};

struct Perturbation {
  int32_t rank = 0;
  size_t op = 0;
  double factor = 1.0;
  int64_t extra_ns = 0;
};

// A timeline of `ranks` ranks running `ops` (each rank the same program): the host launches
// op k over [k us, k+1 us] (cudaLaunchKernel, correlation k); the stream runs kernels in
// order, each starting at max(previous end, launch end); a collective starts on every rank
// at the latest rank's ready time plus `collective_delay[k]`. Op ids = k when `op_ids`.
Timeline Replay(const std::vector<MiniOp>& ops, int32_t ranks, const std::vector<Perturbation>& perturbations,
                const std::map<size_t, int64_t>& collective_delay, bool op_ids) {
  Timeline timeline;
  timeline.info.producer = "shardscope test";
  timeline.info.world_size = ranks;
  std::vector<int64_t> stream_end(static_cast<size_t>(ranks), 0);
  for (int32_t r = 0; r < ranks; ++r) {
    timeline.processes.push_back({r, fmt_rank(r), r});
    timeline.threads.push_back({r, 0, "host thread", 0});
    timeline.threads.push_back({r, 1, "stream 0 compute", 1});
  }
  for (size_t k = 0; k < ops.size(); ++k) {
    const MiniOp& op = ops[k];
    const auto launch_start = static_cast<int64_t>(k) * kUs;
    std::vector<int64_t> ready(static_cast<size_t>(ranks));
    std::vector<int64_t> dur(static_cast<size_t>(ranks), op.dur_ns);
    for (int32_t r = 0; r < ranks; ++r) {
      Slice launch;
      launch.pid = r;
      launch.tid = 0;
      launch.ts_ns = launch_start;
      launch.dur_ns = kUs;
      launch.name = "cudaLaunchKernel";
      launch.category = Category::kCudaRuntime;
      launch.op_id = op_ids ? static_cast<int64_t>(k) : -1;
      launch.correlation = static_cast<int64_t>(k) + 1;
      timeline.slices.push_back(launch);
      ready[static_cast<size_t>(r)] = std::max(stream_end[static_cast<size_t>(r)], launch_start + kUs);
      for (const Perturbation& p : perturbations) {
        if (p.rank == r && p.op == k) {
          dur[static_cast<size_t>(r)] =
              static_cast<int64_t>(static_cast<double>(op.dur_ns) * p.factor) + p.extra_ns;
        }
      }
    }
    int64_t collective_start = 0;
    if (!op.collective.empty()) {
      collective_start = *std::max_element(ready.begin(), ready.end());
      auto delay = collective_delay.find(k);
      if (delay != collective_delay.end()) collective_start += delay->second;
    }
    for (int32_t r = 0; r < ranks; ++r) {
      Slice kernel;
      kernel.pid = r;
      kernel.tid = 1;
      kernel.ts_ns = op.collective.empty() ? ready[static_cast<size_t>(r)] : collective_start;
      kernel.dur_ns = dur[static_cast<size_t>(r)];
      kernel.name = op.name;
      kernel.category = Category::kKernel;
      kernel.op_id = op_ids ? static_cast<int64_t>(k) : -1;
      kernel.correlation = static_cast<int64_t>(k) + 1;
      if (!op.collective.empty()) {
        CollectiveInfo info;
        info.collective_name = op.collective;
        info.process_group = "0";
        info.seq = op.seq;
        info.group_size = ranks;
        info.rank = r;
        kernel.collective = info;
      }
      stream_end[static_cast<size_t>(r)] = kernel.ts_ns + kernel.dur_ns;
      timeline.slices.push_back(kernel);
    }
  }
  return timeline;
}

// A: a GEMM, a memory-bound kernel, C: an all-gather, attention, B: a GEMM, an all-reduce.
std::vector<MiniOp> Program() {
  return {{"sm80_xmma_gemm_bf16bf16_128x128", 100 * kUs, "", -1},
          {"vectorized_elementwise_kernel", 20 * kUs, "", -1},
          {"ncclDevKernel_AllGather_Ring_LL", 50 * kUs, "all_gather", 0},
          {"flash_fwd_kernel", 80 * kUs, "", -1},
          {"sm80_xmma_gemm_bf16bf16_64x64", 60 * kUs, "", -1},
          {"ncclDevKernel_AllReduce_Ring_LL", 40 * kUs, "all_reduce", 1}};
}

const DiffEvent& Event(const SideAnalysis& side, int32_t index) { return side.events[static_cast<size_t>(index)]; }

TEST(DiffTest, TraceAgainstItselfHasNoErrorAndEverythingMatched) {
  const std::string path = std::string(SHARDSCOPE_SOURCE_DIR) + "/tests/golden/tiny-fsdp2-2gpu/trace.json";
  auto side = LoadDiffSide(path);
  ASSERT_TRUE(side.ok()) << side.status().message();
  auto diff = Diff(*side, *side, DiffOptions{});
  ASSERT_TRUE(diff.ok()) << diff.status().message();
  EXPECT_GT(diff->predicted.events.size(), 0u);
  EXPECT_EQ(diff->matched(), static_cast<int64_t>(diff->predicted.events.size()));
  EXPECT_EQ(diff->matched_by_op_id, diff->matched());
  for (size_t i = 0; i < diff->predicted.match.size(); ++i) EXPECT_EQ(diff->predicted.match[i], static_cast<int32_t>(i));
  EXPECT_EQ(diff->predicted.step_ns, diff->measured.step_ns);
  EXPECT_EQ(diff->predicted.critical_path.length_ns, diff->measured.critical_path.length_ns);
  for (const OpError& e : diff->errors) {
    EXPECT_EQ(e.duration_error_ns, 0);
    EXPECT_EQ(e.start_shift_ns, 0);
    EXPECT_EQ(e.contribution_ns, 0);
  }
  for (const ClassStats& c : diff->classes) {
    EXPECT_EQ(c.total_error_ns, 0) << OpClassName(c.op_class);
    EXPECT_EQ(c.contribution_ns, 0) << OpClassName(c.op_class);
  }
  EXPECT_TRUE(diff->top.empty());
  EXPECT_FALSE(diff->divergence.diverged);
  EXPECT_GT(diff->device_relative.count, 0);
  EXPECT_EQ(diff->device_relative.median, 0);
  EXPECT_EQ(diff->device_relative.p90, 0);
}

TEST(DiffTest, RelativeErrorsOfDeviceOpsAreMedianAndNinetiethPercentile) {
  // Four 100 us kernels on one rank, measured at 100, 110, 150 and 300 us: relative errors
  // 0, 0.1, 0.5, 2. Median = the lower middle (0.1); p90 = the ceil(0.9 x 4) = 4th (2).
  const std::vector<MiniOp> ops = {{"k0", 100 * kUs, "", -1}, {"k1", 100 * kUs, "", -1}, {"k2", 100 * kUs, "", -1}, {"k3", 100 * kUs, "", -1}};
  const Timeline predicted = Replay(ops, 1, {}, {}, /*op_ids=*/true);
  const Timeline measured =
      Replay(ops, 1, {{0, 1, 1.1, 0}, {0, 2, 1.5, 0}, {0, 3, 3.0, 0}}, {}, /*op_ids=*/true);
  auto diff = Diff(DiffSideFromTimeline(predicted, "p"), DiffSideFromTimeline(measured, "m"), DiffOptions{});
  ASSERT_TRUE(diff.ok()) << diff.status().message();
  EXPECT_EQ(diff->device_relative.count, 4);
  EXPECT_NEAR(diff->device_relative.median, 0.1, 1e-9);
  EXPECT_NEAR(diff->device_relative.p90, 2.0, 1e-9);
}

TEST(DiffTest, PerturbationsAreFoundAndExplainTheStepDifference) {
  const std::vector<MiniOp> ops = Program();
  const Timeline predicted = Replay(ops, 2, {}, {}, /*op_ids=*/true);
  // Rank 0: A x1.3 (+30 us), B +1 ms; the all-gather starts 200 us late on every rank.
  const Timeline measured = Replay(ops, 2, {{0, 0, 1.3, 0}, {0, 4, 1.0, 1000 * kUs}}, {{2, 200 * kUs}}, true);
  const DiffSide p = DiffSideFromTimeline(predicted, "predicted");
  const DiffSide m = DiffSideFromTimeline(measured, "measured");
  auto diff = Diff(p, m, DiffOptions{});
  ASSERT_TRUE(diff.ok()) << diff.status().message();
  // 2 ranks x 6 ops x (launch + kernel), all by op id.
  EXPECT_EQ(diff->matched_by_op_id, 24);
  // Predicted: launch 0 ends at 1 us; kernels back to back: 100+20+50+80+60+40 = 350 us.
  EXPECT_EQ(diff->predicted.step_ns, 350 * kUs);
  EXPECT_EQ(diff->predicted.critical_path.length_ns, 351 * kUs);
  // Measured: +30 us (A), +200 us (the all-gather's delay), +1000 us (B) on the slowest
  // rank; rank 1 waits for rank 0 in both collectives, so both end together.
  EXPECT_EQ(diff->measured.step_ns, (350 + 30 + 200 + 1000) * kUs);
  EXPECT_EQ(diff->measured.critical_path.length_ns, (351 + 1230) * kUs);
  ASSERT_EQ(diff->top.size(), 3u);
  // B (+1 ms), the all-gather (+200 us of wait), A (+30 us), all on rank 0.
  const std::vector<std::pair<std::string, int64_t>> expected = {
      {"sm80_xmma_gemm_bf16bf16_64x64", 1000 * kUs},
      {"ncclDevKernel_AllGather_Ring_LL", 200 * kUs},
      {"sm80_xmma_gemm_bf16bf16_128x128", 30 * kUs}};
  int64_t explained = 0;
  for (size_t k = 0; k < expected.size(); ++k) {
    const OpError& e = diff->top[k];
    ASSERT_GE(e.predicted, 0);
    const DiffEvent& pe = Event(diff->predicted, e.predicted);
    EXPECT_EQ(p.files[0].slices[pe.slice].name, expected[k].first);
    EXPECT_EQ(pe.rank, 0);
    EXPECT_EQ(e.contribution_ns, expected[k].second);
    explained += e.contribution_ns;
  }
  EXPECT_EQ(diff->top[0].duration_error_ns, 1000 * kUs);
  EXPECT_EQ(diff->top[1].duration_error_ns, 0);
  // The all-gather on rank 0 became ready at 151 us instead of 121 us, then waited 200 us.
  EXPECT_EQ(diff->top[1].start_shift_ns, 230 * kUs);
  EXPECT_EQ(diff->top[2].duration_error_ns, 30 * kUs);
  EXPECT_EQ(explained, diff->measured.critical_path.length_ns - diff->predicted.critical_path.length_ns);
  // Per class: the GEMMs carry 1030 us, the all-gather 200 us; nothing else moved.
  for (const ClassStats& c : diff->classes) {
    if (c.op_class == OpClass::kGemm) {
      EXPECT_EQ(c.count, 4);
      EXPECT_EQ(c.contribution_ns, 1030 * kUs);
      EXPECT_EQ(c.total_error_ns, 1030 * kUs);
      EXPECT_EQ(c.median_error_ns, 0);  // errors 0, 0, 30 us, 1 ms: the lower middle
      EXPECT_EQ(c.p90_abs_error_ns, 1000 * kUs);
    } else if (c.op_class == OpClass::kAllGather) {
      EXPECT_EQ(c.contribution_ns, 200 * kUs);
      EXPECT_EQ(c.total_error_ns, 0);
    } else {
      EXPECT_EQ(c.contribution_ns, 0) << OpClassName(c.op_class);
    }
  }
  EXPECT_FALSE(diff->divergence.diverged);
}

TEST(DiffTest, NameAlignmentListsMissingAndExtraKernels) {
  // No op ids: names must carry it. The measured names differ in template arguments,
  // parameters and the NCCL algorithm; one GEMM is missing and a memset is extra.
  Timeline predicted;
  Timeline measured;
  predicted.info.producer = measured.info.producer = "shardscope test";
  const auto add = [](Timeline& t, int32_t rank, int64_t ts, int64_t dur, std::string name,
                      std::optional<std::pair<std::string, int64_t>> collective) {
    Slice s;
    s.pid = rank;
    s.tid = 7;
    s.ts_ns = ts;
    s.dur_ns = dur;
    s.name = std::move(name);
    s.category = Category::kKernel;
    if (collective) {
      CollectiveInfo info;
      info.collective_name = collective->first;
      info.process_group = "0";
      info.seq = collective->second;
      s.collective = info;
    }
    t.slices.push_back(s);
  };
  for (int32_t r = 0; r < 2; ++r) {
    add(predicted, r, 0, 10, "void gemm_kernel<128, 64>(float*)", std::nullopt);
    add(predicted, r, 10, 10, "elementwise_add_1", std::nullopt);
    add(predicted, r, 20, 10, "ncclDevKernel_AllGather_Ring_LL", std::pair{std::string("all_gather"), int64_t{3}});
    add(predicted, r, 30, 10, "flash_fwd", std::nullopt);
    add(predicted, r, 40, 10, "void gemm_kernel<64, 64>(float*)", std::nullopt);  // missing below
    add(predicted, r, 50, 10, "ncclDevKernel_AllReduce_Ring_LL", std::pair{std::string("all_reduce"), int64_t{4}});
    add(measured, r, 100, 12, "void gemm_kernel<256, 32>(half*)", std::nullopt);
    add(measured, r, 112, 12, "elementwise_add_7", std::nullopt);
    add(measured, r, 124, 5, "Memset (Device)", std::nullopt);  // extra
    add(measured, r, 129, 12, "ncclDevKernel_AllGather_RING_SIMPLE(ncclDevComm*)",
        std::pair{std::string("all_gather"), int64_t{3}});
    add(measured, r, 141, 12, "flash_fwd", std::nullopt);
    add(measured, r, 153, 12, "ncclDevKernel_AllReduce_RING_LL(ncclDevComm*)",
        std::pair{std::string("all_reduce"), int64_t{4}});
  }
  const DiffSide p = DiffSideFromTimeline(predicted, "p");
  const DiffSide m = DiffSideFromTimeline(measured, "m");
  auto diff = Diff(p, m, DiffOptions{});
  ASSERT_TRUE(diff.ok()) << diff.status().message();
  EXPECT_EQ(diff->matched_by_op_id, 0);
  EXPECT_EQ(diff->matched_by_anchor, 4);  // two collectives per rank
  EXPECT_EQ(diff->matched_by_name, 6);    // gemm, add, flash per rank
  std::vector<std::string> unmatched_p;
  std::vector<std::string> unmatched_m;
  for (size_t i = 0; i < diff->predicted.events.size(); ++i) {
    if (diff->predicted.match[i] < 0) unmatched_p.push_back(p.files[0].slices[diff->predicted.events[i].slice].name);
  }
  for (size_t i = 0; i < diff->measured.events.size(); ++i) {
    if (diff->measured.match[i] < 0) unmatched_m.push_back(m.files[0].slices[diff->measured.events[i].slice].name);
  }
  EXPECT_EQ(unmatched_p, (std::vector<std::string>(2, "void gemm_kernel<64, 64>(float*)")));
  EXPECT_EQ(unmatched_m, (std::vector<std::string>(2, "Memset (Device)")));
  // The first GEMMs pair with each other (+2 ns each).
  const DiffEvent& first = diff->predicted.events[0];
  EXPECT_EQ(p.files[0].slices[first.slice].name, "void gemm_kernel<128, 64>(float*)");
  ASSERT_GE(diff->predicted.match[0], 0);
  EXPECT_EQ(m.files[0].slices[Event(diff->measured, diff->predicted.match[0]).slice].name,
            "void gemm_kernel<256, 32>(half*)");
  // The reports list the unmatched slices.
  const std::string json = DiffReportJson(p, m, *diff, DiffOptions{});
  EXPECT_NE(json.find("\"unmatched_predicted\": 2"), std::string::npos);
  EXPECT_NE(json.find("Memset (Device)"), std::string::npos);
}

TEST(DiffTest, NormalizeKernelNameDropsTemplatesParametersHashesAndDigits) {
  EXPECT_EQ(NormalizeKernelName("void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>(int, float*)"),
            "at::native::vectorized_elementwise_kernel");
  EXPECT_EQ(NormalizeKernelName("sm80_xmma_gemm_bf16bf16_128x128"), "sm#_xmma_gemm_bf#bf#_#x#");
  EXPECT_EQ(NormalizeKernelName("triton_poi_fused_add_0 0123456789abcdef0a deadbeef12"), "triton_poi_fused_add_# # deadbeef#");
  EXPECT_EQ(NormalizeKernelName("Kernel  A"), "kernel a");
}

TEST(DiffTest, CriticalPathOfTwoRanksMatchesHandComputation) {
  // rank 0: launch [0, 2] -> kernel [5, 15] -> all-gather [15, 40]
  // rank 1: launch [0, 2] -> kernel [5, 30] -> all-gather [30, 40]
  // The all-gather ends when rank 1 joins (30) plus 10 ns: the path runs rank 1's launch
  // (2), its kernel (3 of launch wait, 25 of work), into rank 1's all-gather start, then
  // rank 0's all-gather end (10). Both ends tie at 40; the lower rank's is taken.
  Timeline t;
  t.info.producer = "shardscope test";
  const auto add = [&](int32_t rank, int32_t tid, int64_t ts, int64_t dur, const char* name, Category category,
                       int64_t correlation, bool collective) {
    Slice s;
    s.pid = rank;
    s.tid = tid;
    s.ts_ns = ts;
    s.dur_ns = dur;
    s.name = name;
    s.category = category;
    s.correlation = correlation;
    if (collective) s.collective = CollectiveInfo{"all_gather", "pg", "BFloat16", 1, 2, 2, 0, rank};
    t.slices.push_back(s);
  };
  add(0, 0, 0, 2, "cudaLaunchKernel", Category::kCudaRuntime, 1, false);
  add(0, 1, 5, 10, "gemm", Category::kKernel, 1, false);
  add(0, 1, 15, 25, "ncclDevKernel_AllGather", Category::kKernel, -1, true);
  add(1, 0, 0, 2, "cudaLaunchKernel", Category::kCudaRuntime, 1, false);
  add(1, 1, 5, 25, "gemm", Category::kKernel, 1, false);
  add(1, 1, 30, 10, "ncclDevKernel_AllGather", Category::kKernel, -1, true);
  const DiffSide side = DiffSideFromTimeline(t, "hand");
  DiffOptions options;
  options.hta.round_to_whole_us = false;  // a nanosecond-scale trace
  auto diff = Diff(side, side, options);
  ASSERT_TRUE(diff.ok()) << diff.status().message();
  const CriticalPath& path = diff->predicted.critical_path;
  EXPECT_EQ(path.start_ns, 0);
  EXPECT_EQ(path.length_ns, 40);
  struct Expected {
    int32_t rank;
    const char* name;
    int64_t wait;
    int64_t dur;
  };
  const std::vector<Expected> expected = {{1, "cudaLaunchKernel", 0, 2},
                                          {1, "gemm", 3, 25},
                                          {1, "ncclDevKernel_AllGather", 0, 0},
                                          {0, "ncclDevKernel_AllGather", 0, 10}};
  ASSERT_EQ(path.steps.size(), expected.size());
  for (size_t k = 0; k < expected.size(); ++k) {
    const DiffEvent& e = Event(diff->predicted, path.steps[k].event);
    EXPECT_EQ(e.rank, expected[k].rank) << k;
    EXPECT_EQ(side.files[0].slices[e.slice].name, expected[k].name) << k;
    EXPECT_EQ(path.steps[k].wait_ns, expected[k].wait) << k;
    EXPECT_EQ(path.steps[k].dur_ns, expected[k].dur) << k;
  }
  // HTA metrics of rank 0: compute [5, 15], communication [15, 40]: no overlap.
  const RankMetrics& r0 = diff->predicted.ranks[0];
  EXPECT_EQ(r0.step_ns, 35);
  EXPECT_EQ(r0.hta.compute_ns, 10);
  EXPECT_EQ(r0.hta.comm_ns, 25);
  EXPECT_EQ(r0.hta.overlap_ns, 0);
  EXPECT_EQ(r0.exposed_comm_ns(), 25);
  // GPU span [5, 40] with no gap: HTA's temporal breakdown has no idle time.
  EXPECT_EQ(r0.hta.span_ns, 35);
  EXPECT_EQ(r0.hta.idle_ns, 0);
  EXPECT_EQ(r0.hta.non_compute_ns, 25);
  ASSERT_EQ(r0.hta.streams.size(), 1u);
  EXPECT_EQ(r0.hta.streams[0].idle_ns, 0);
}

TEST(DiffTest, IdleTimeIsSplitLikeHta) {
  // One stream: k1 [0, 10]; k2 launched at 30 (host-bound gap 10..40); k3 queued early,
  // starts 20 ns after k2 ends (kernel wait, under 30 ns); k4 500 ns later (other).
  Timeline t;
  t.info.producer = "shardscope test";
  const auto add = [&](int32_t tid, int64_t ts, int64_t dur, Category category, int64_t correlation) {
    Slice s;
    s.tid = tid;
    s.ts_ns = ts;
    s.dur_ns = dur;
    s.name = category == Category::kKernel ? "k" : "cudaLaunchKernel";
    s.category = category;
    s.correlation = correlation;
    t.slices.push_back(s);
  };
  add(0, 0, 1, Category::kCudaRuntime, 1);
  add(1, 0, 10, Category::kKernel, 1);
  add(0, 30, 10, Category::kCudaRuntime, 2);
  add(1, 40, 10, Category::kKernel, 2);
  add(0, 41, 1, Category::kCudaRuntime, 3);
  add(1, 70, 10, Category::kKernel, 3);
  add(0, 42, 1, Category::kCudaRuntime, 4);
  add(1, 580, 10, Category::kKernel, 4);
  const DiffSide side = DiffSideFromTimeline(t, "idle");
  DiffOptions options;
  options.hta.round_to_whole_us = false;       // a nanosecond-scale trace
  options.hta.kernel_wait_threshold_ns = 30;  // nanoseconds here
  auto diff = Diff(side, side, options);
  ASSERT_TRUE(diff.ok());
  const RankMetrics& r = diff->predicted.ranks[0];
  ASSERT_EQ(r.hta.streams.size(), 1u);
  const HtaStreamIdle& idle = r.hta.streams[0];
  EXPECT_EQ(idle.host_wait_ns, 30);    // 10 -> 40, launch began at 30 > 10
  EXPECT_EQ(idle.kernel_wait_ns, 20);  // 50 -> 70
  EXPECT_EQ(idle.other_ns, 500);       // 80 -> 580
  EXPECT_EQ(r.hta.idle_ns, 550);       // span [0, 590] less 40 busy
  ASSERT_EQ(r.streams.size(), 1u);
  EXPECT_EQ(r.streams[0].busy_ns, 40);
}

TEST(DiffTest, PerRankDirectoryMergesRanksAndBadInputNamesTheFile) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardscope_diff_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (int32_t rank : {1, 0}) {
    Timeline t;
    t.info.producer = "";  // like the PyTorch profiler: pid is the process, rank from distributedInfo
    t.info.rank = rank;
    t.info.world_size = 2;
    Slice s;
    s.pid = 4242 + rank;
    s.tid = 7;
    s.ts_ns = 100;
    s.dur_ns = 10 + rank;
    s.name = "gemm";
    s.category = Category::kKernel;
    t.slices.push_back(s);
    ASSERT_TRUE(WriteChromeTrace(t, (dir / ("rank" + std::to_string(rank) + ".json")).string()).ok());
  }
  auto side = LoadDiffSide(dir.string());
  ASSERT_TRUE(side.ok()) << side.status().message();
  auto diff = Diff(*side, *side, DiffOptions{});
  ASSERT_TRUE(diff.ok());
  ASSERT_EQ(diff->predicted.ranks.size(), 2u);
  EXPECT_EQ(diff->predicted.ranks[0].rank, 0);
  EXPECT_EQ(diff->predicted.ranks[1].rank, 1);
  EXPECT_EQ(diff->predicted.ranks[1].step_ns, 11);
  // Two files claiming one rank.
  fs::copy_file(dir / "rank0.json", dir / "rank9.json");
  auto duplicate = LoadDiffSide(dir.string());
  ASSERT_FALSE(duplicate.ok());
  EXPECT_EQ(duplicate.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(duplicate.status().message().find("rank9.json"), std::string::npos) << duplicate.status().message();
  auto missing = LoadDiffSide((dir / "nope").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nope"), std::string::npos);
  fs::remove_all(dir);
}


// A predicted trace (the simulator's golden FSDP2 run: one process group "dp_shard", Seq
// from 0) against an "imported" one made from it as the PyTorch profiler would have it: one
// file per rank, the group named "0", Seq from 1, no op ids, the member ranks listed on
// rank 0's kernels only (rank 1's group is known from which ranks carry it). Every
// collective must be an anchor, every other slice must match by name.
TEST(DiffTest, CollectivesAnchorAcrossRenamedGroupsAndOneBasedSeq) {
  const std::filesystem::path root(SHARDSCOPE_SOURCE_DIR);
  auto golden = ReadChromeTraceFile((root / "tests/golden/tiny-fsdp2-2gpu/trace.json").string());
  ASSERT_TRUE(golden.ok()) << golden.status().message();
  const DiffSide predicted = DiffSideFromTimeline(*golden, "predicted");
  DiffSide imported;
  imported.source = "imported";
  int64_t collectives = 0;
  int64_t slices = 0;
  for (int32_t rank = 0; rank < 2; ++rank) {
    Timeline file;
    file.info.producer = "";  // not ours: the file's events are its distributedInfo.rank
    file.info.rank = rank;
    file.info.world_size = 2;
    for (Slice s : golden->slices) {
      if (s.pid != rank || s.category == Category::kUserAnnotation || s.category == Category::kGpuUserAnnotation) {
        continue;
      }
      s.pid = 100 + rank;  // a process id, as in PyTorch traces
      s.op_id = -1;
      if (s.collective) {
        ASSERT_EQ(s.collective->process_group, "dp_shard");
        s.collective->process_group = "0";
        s.collective->seq += 1;
        if (rank == 0) s.args.push_back({"Process Group Ranks", std::string("[0, 1]")});
        ++collectives;
      }
      ++slices;
      file.slices.push_back(std::move(s));
    }
    imported.file_names.push_back("rank" + std::to_string(rank) + ".json");
    imported.files.push_back(std::move(file));
    imported.file_rank.push_back(rank);
  }
  ASSERT_EQ(collectives, 24);  // 12 per rank (Seq 0..11 in the golden trace)
  auto diff = Diff(predicted, imported, DiffOptions{});
  ASSERT_TRUE(diff.ok()) << diff.status().message();
  EXPECT_EQ(diff->matched_by_op_id, 0);
  EXPECT_EQ(diff->matched_by_anchor, collectives);
  EXPECT_EQ(diff->matched(), slices);
  // Each collective met the one with the same Seq (shifted by one) on the same rank.
  for (size_t i = 0; i < diff->predicted.events.size(); ++i) {
    const DiffEvent& p = diff->predicted.events[i];
    if (p.seq < 0) continue;
    ASSERT_GE(diff->predicted.match[i], 0);
    const DiffEvent& m = Event(diff->measured, diff->predicted.match[i]);
    EXPECT_EQ(m.seq, p.seq + 1);
    EXPECT_EQ(m.rank, p.rank);
  }
}

// Four ranks, two kinds of groups: shard groups {0, 1} and {2, 3}, replicate groups {0, 2}
// and {1, 3}, each group numbering its own collectives. The measured side names them "1".."4"
// (in another order than a sort by name would suggest), counts Seq from 1, and lists the
// members only for some groups.
TEST(DiffTest, GroupsMatchByMemberRanksNotByName) {
  struct Group {
    std::string predicted_name;
    std::string measured_name;
    std::vector<int32_t> members;
    bool listed;  // "Process Group Ranks" on the measured kernels
  };
  const std::vector<Group> groups = {{"dp_shard.0", "3", {0, 1}, true},
                                     {"dp_shard.1", "1", {2, 3}, false},
                                     {"dp_replicate.0", "4", {0, 2}, true},
                                     {"dp_replicate.1", "2", {1, 3}, false}};
  const auto group_of = [&](int32_t rank, bool shard) -> const Group& {
    for (const Group& g : groups) {
      const bool is_shard = g.predicted_name.rfind("dp_shard", 0) == 0;
      if (is_shard == shard && std::find(g.members.begin(), g.members.end(), rank) != g.members.end()) return g;
    }
    return groups[0];
  };
  // Per rank: gemm, all_gather (shard), gemm, all_reduce (replicate), gemm, all_gather (shard).
  Timeline predicted;
  predicted.info.producer = "shardscope test";
  DiffSide measured;
  measured.source = "measured";
  for (int32_t rank = 0; rank < 4; ++rank) {
    Timeline file;
    file.info.producer = "";
    file.info.rank = rank;
    std::map<std::string, int64_t> next_seq;
    for (int32_t k = 0; k < 6; ++k) {
      Slice s;
      s.pid = rank;
      s.tid = 1;
      s.ts_ns = k * 100;
      s.dur_ns = 50;
      s.category = Category::kKernel;
      s.name = "gemm";
      if (k % 2 == 1) {
        const bool shard = k != 3;
        const Group& g = group_of(rank, shard);
        CollectiveInfo info;
        info.collective_name = shard ? "all_gather" : "all_reduce";
        info.process_group = g.predicted_name;
        info.group_size = 2;
        info.seq = next_seq[g.predicted_name]++;
        info.rank = rank;
        s.collective = info;
        s.name = shard ? "ncclDevKernel_AllGather_RING_LL" : "ncclDevKernel_AllReduce_RING_LL";
      }
      predicted.slices.push_back(s);
      s.pid = 7;
      s.dur_ns = 60;
      if (s.collective) {
        const Group& g = group_of(rank, s.collective->collective_name == "all_gather");
        s.collective->process_group = g.measured_name;
        s.collective->seq += 1;
        if (g.listed) s.args.push_back({"Process Group Ranks", "[" +
                                                                   std::to_string(g.members[0]) + ", " +
                                                                   std::to_string(g.members[1]) + "]"});
      }
      file.slices.push_back(s);
    }
    measured.file_names.push_back("rank" + std::to_string(rank));
    measured.files.push_back(std::move(file));
    measured.file_rank.push_back(rank);
  }
  auto diff = Diff(DiffSideFromTimeline(predicted, "predicted"), measured, DiffOptions{});
  ASSERT_TRUE(diff.ok()) << diff.status().message();
  EXPECT_EQ(diff->matched_by_anchor, 12);  // 3 collectives on each of 4 ranks
  EXPECT_EQ(diff->matched_by_name, 12);    // the GEMMs
  EXPECT_EQ(diff->matched(), 24);
  // Every pair holds the same op (same start in both: ts = k * 100 on both sides).
  for (size_t i = 0; i < diff->predicted.events.size(); ++i) {
    ASSERT_GE(diff->predicted.match[i], 0);
    EXPECT_EQ(Event(diff->measured, diff->predicted.match[i]).ts_ns, diff->predicted.events[i].ts_ns);
  }
}

TEST(DiffTest, ParseRankListReadsPytorchsFormat) {
  EXPECT_EQ(diff_internal::ParseRankList("[0, 1, 2, 3]"), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(diff_internal::ParseRankList("[3,1]"), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(diff_internal::ParseRankList("[]"), std::nullopt);
  EXPECT_EQ(diff_internal::ParseRankList("[0, a]"), std::nullopt);
  EXPECT_EQ(diff_internal::ParseRankList("[99999999999]"), std::nullopt);
}

}  // namespace
}  // namespace shardscope::traces

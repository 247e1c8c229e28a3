// Speed of `shardscope diff` on two synthetic 1,000,000-event traces (BENCHMARKS.md).
//
// Each side: 8 ranks x 62,500 ops, each op a host launch and its kernel (1,000,000
// slices); every 16th op is an all-gather on a communication stream that starts when all
// ranks are ready. The measured side perturbs every duration by a deterministic -10..+10%.
// "op_ids": both sides carry op ids (our own traces). "names": no op ids, and the measured
// side lacks one kernel in 1,000 and has one extra in 1,000 (PyTorch-profiler traces are
// aligned by name between collective anchors).
#include <benchmark/benchmark.h>

#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <filesystem>
#include <string>

#include "shardscope/traces/chrome_trace.h"
#include "shardscope/analysis/diff.h"

namespace shardscope::traces {
namespace {

constexpr int32_t kRanks = 8;
constexpr int64_t kOpsPerRank = 62'500;
constexpr int64_t kCollectiveEvery = 16;

const std::array<const char*, 5> kKernelNames = {
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>(int, T1, T2)",
    "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>>(Params)",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, T*)",
    "nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NTN"};
constexpr std::array<int64_t, 5> kKernelNs = {30'000, 4'000, 20'000, 6'000, 25'000};

Timeline Synthetic(bool measured, bool op_ids) {
  Timeline t;
  t.info.producer = "shardscope bench";
  t.info.world_size = kRanks;
  t.slices.reserve(static_cast<size_t>(2 * kRanks * kOpsPerRank + 2 * kRanks * kOpsPerRank / 1000));
  std::array<int64_t, kRanks> compute_end{};
  std::array<int64_t, kRanks> comm_end{};
  uint64_t state = 12345;
  const auto jitter = [&](int64_t ns) {  // -10..+10%, deterministic (xorshift)
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return ns + static_cast<int64_t>(static_cast<double>(ns) * (static_cast<double>(state % 2001) / 10000.0 - 0.1));
  };
  for (int64_t k = 0; k < kOpsPerRank; ++k) {
    const bool collective = k % kCollectiveEvery == kCollectiveEvery - 1;
    const bool dropped = measured && !op_ids && k % 1000 == 500;
    const bool extra = measured && !op_ids && k % 1000 == 700;
    int64_t collective_start = 0;
    if (collective) {
      for (int32_t r = 0; r < kRanks; ++r) {
        collective_start = std::max({collective_start, comm_end[static_cast<size_t>(r)], k * 2'000 + 1'500});
      }
    }
    for (int32_t r = 0; r < kRanks; ++r) {
      Slice launch;
      launch.pid = r;
      launch.tid = 0;
      launch.ts_ns = k * 2'000;
      launch.dur_ns = 1'500;
      launch.name = "cudaLaunchKernel";
      launch.category = Category::kCudaRuntime;
      launch.op_id = op_ids ? k : -1;
      launch.correlation = k + 1;
      t.slices.push_back(launch);
      if (dropped) continue;
      Slice kernel;
      kernel.pid = r;
      kernel.category = Category::kKernel;
      kernel.op_id = launch.op_id;
      kernel.correlation = k + 1;
      if (collective) {
        kernel.tid = 2;
        kernel.name = "ncclDevKernel_AllGather_RING_LL";
        kernel.ts_ns = collective_start;
        kernel.dur_ns = measured ? jitter(40'000) : 40'000;
        CollectiveInfo info;
        info.collective_name = "all_gather";
        info.process_group = "0";
        info.seq = k / kCollectiveEvery;
        info.group_size = kRanks;
        info.rank = r;
        kernel.collective = info;
        comm_end[static_cast<size_t>(r)] = kernel.ts_ns + kernel.dur_ns;
      } else {
        const auto kind = static_cast<size_t>(k % 5);
        kernel.tid = 1;
        kernel.name = kKernelNames[kind];
        kernel.ts_ns = std::max(compute_end[static_cast<size_t>(r)], launch.ts_ns + launch.dur_ns);
        kernel.dur_ns = measured ? jitter(kKernelNs[kind]) : kKernelNs[kind];
        compute_end[static_cast<size_t>(r)] = kernel.ts_ns + kernel.dur_ns;
      }
      t.slices.push_back(std::move(kernel));
      if (extra) {
        Slice memset;
        memset.pid = r;
        memset.tid = 1;
        memset.ts_ns = compute_end[static_cast<size_t>(r)];
        memset.dur_ns = 1'000;
        memset.name = "Memset (Device)";
        memset.category = Category::kGpuMemset;
        compute_end[static_cast<size_t>(r)] += 1'000;
        t.slices.push_back(std::move(memset));
      }
    }
  }
  return t;
}

void BM_Diff1MInMemory(benchmark::State& state) {
  const bool op_ids = state.range(0) != 0;
  const DiffSide predicted = DiffSideFromTimeline(Synthetic(false, op_ids), "predicted");
  const DiffSide measured = DiffSideFromTimeline(Synthetic(true, op_ids), "measured");
  int64_t matched = 0;
  for (auto _ : state) {
    auto diff = Diff(predicted, measured, DiffOptions{});
    if (!diff.ok()) state.SkipWithError(diff.status().message().c_str());
    matched = diff->matched();
    benchmark::DoNotOptimize(diff);
  }
  state.counters["events"] = static_cast<double>(predicted.files[0].slices.size());
  state.counters["matched"] = static_cast<double>(matched);
}
BENCHMARK(BM_Diff1MInMemory)->ArgName("op_ids")->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond)->Iterations(1);

// Through files: read both traces, diff, write trace.json + report.md + report.json.
void BM_Diff1MFiles(benchmark::State& state) {
  const bool op_ids = state.range(0) != 0;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("shardscope_diff_bench_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string predicted_path = (dir / "predicted.json").string();
  const std::string measured_path = (dir / "measured.json").string();
  if (!WriteChromeTrace(Synthetic(false, op_ids), predicted_path).ok() ||
      !WriteChromeTrace(Synthetic(true, op_ids), measured_path).ok()) {
    state.SkipWithError("cannot write the synthetic traces");
    return;
  }
  using Clock = std::chrono::steady_clock;
  const auto seconds = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  // CPU time of the process (user + system): on a shared machine the wall time also counts
  // the time other processes held the core; the CPU time is the one-core cost.
  const auto cpu_now = [] {
    timespec t{};
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
  };
  // The kernel's share (page faults, copying file data), from getrusage.
  const auto sys_now = [] {
    rusage usage{};
    ::getrusage(RUSAGE_SELF, &usage);
    return static_cast<double>(usage.ru_stime.tv_sec) + static_cast<double>(usage.ru_stime.tv_usec) * 1e-6;
  };
  for (auto _ : state) {
    const auto t0 = Clock::now();
    const double c0 = cpu_now();
    const double s0 = sys_now();
    auto predicted = LoadDiffSide(predicted_path);
    auto measured = LoadDiffSide(measured_path);
    if (!predicted.ok() || !measured.ok()) {
      state.SkipWithError("cannot read the synthetic traces");
      break;
    }
    const auto t1 = Clock::now();
    const double c1 = cpu_now();
    auto diff = Diff(*predicted, *measured, DiffOptions{});
    if (!diff.ok()) {
      state.SkipWithError(diff.status().message().c_str());
      break;
    }
    const auto t2 = Clock::now();
    const double c2 = cpu_now();
    const Status written = WriteDiffOutputs(*predicted, *measured, *diff, (dir / "out").string(), DiffOptions{});
    if (!written.ok()) state.SkipWithError(written.message().c_str());
    const auto t3 = Clock::now();
    const double c3 = cpu_now();
    const double s3 = sys_now();
    // Phases: reading both files, the diff, writing the three outputs (wall and CPU seconds).
    state.counters["read_s"] = seconds(t0, t1);
    state.counters["diff_s"] = seconds(t1, t2);
    state.counters["write_s"] = seconds(t2, t3);
    state.counters["read_cpu_s"] = c1 - c0;
    state.counters["diff_cpu_s"] = c2 - c1;
    state.counters["write_cpu_s"] = c3 - c2;
    state.counters["total_cpu_s"] = c3 - c0;
    state.counters["total_sys_s"] = s3 - s0;
    // The outputs' sizes: trace.json dominates.
    state.counters["trace_MB"] = static_cast<double>(std::filesystem::file_size(dir / "out" / "trace.json")) * 1e-6;
    state.counters["report_json_kB"] =
        static_cast<double>(std::filesystem::file_size(dir / "out" / "report.json")) * 1e-3;
  }
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_Diff1MFiles)->ArgName("op_ids")->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond)->Iterations(1);

// Reading one 1,000,000-slice file alone (the "files" case reads two).
void BM_Read1MFile(benchmark::State& state) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("shardscope_read_bench_" + std::to_string(::getpid()) + ".json"))
                               .string();
  if (!WriteChromeTrace(Synthetic(false, true), path).ok()) {
    state.SkipWithError("cannot write the synthetic trace");
    return;
  }
  size_t slices = 0;
  for (auto _ : state) {
    auto timeline = ReadChromeTraceFile(path);
    if (!timeline.ok()) state.SkipWithError(timeline.status().message().c_str());
    slices = timeline->slices.size();
  }
  state.counters["slices"] = static_cast<double>(slices);
  state.counters["MB"] = static_cast<double>(std::filesystem::file_size(path)) * 1e-6;
  std::filesystem::remove(path);
}
BENCHMARK(BM_Read1MFile)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace
}  // namespace shardscope::traces

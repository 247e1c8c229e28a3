// GPU tests of the CUDA backend (ctest label "gpu", binary shardscope_runtime_gpu_tests).
// Without a usable device every test skips with "no CUDA device: <cuda error>", so CI (no
// GPU) passes them as skipped; scripts/gpu/validate_runtime.sh runs them on a GPU machine.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cuda/cuda_internal.h"
#include "shardscope/runtime/cuda_backend.h"
#include "shardscope/runtime/host_backend.h"
#include "shardscope/sim/engine/engine.h"
#include "shardscope/sim/lowering/lowering.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/sim/report/report.h"

namespace shardscope::runtime {
namespace {

#define SKIP_WITHOUT_GPU()                                                  \
  do {                                                                      \
    const StatusOr<int32_t> devices = CudaDeviceCount();                    \
    if (!devices.ok()) GTEST_SKIP() << devices.status().message();          \
  } while (0)

// MPI may be initialized once per process: one session for every test of the binary.
const MpiSession& Mpi() {
  static std::unique_ptr<MpiSession> session = [] {
    StatusOr<std::unique_ptr<MpiSession>> s = MpiSession::Init();
    if (!s.ok()) {
      std::cerr << s.status().message() << "\n";
      std::abort();
    }
    return std::move(*s);
  }();
  return *session;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The tiny FSDP2 example cut to one GPU: the golden 2-GPU plan with gpus_per_node 1.
StatusOr<std::pair<traces::Schedule, sim::SimulationSetup>> TinyOneGpu() {
  std::string yaml = ReadText(std::string(SHARDSCOPE_SOURCE_DIR) + "/examples/tiny-fsdp2-2gpu.yaml");
  const std::string from = "gpus_per_node: 2";
  const size_t at = yaml.find(from);
  if (at == std::string::npos) return Status::Internal("examples/tiny-fsdp2-2gpu.yaml has no 'gpus_per_node: 2'");
  yaml.replace(at, from.size(), "gpus_per_node: 1");
  SHARDSCOPE_ASSIGN_OR_RETURN(sim::Plan plan, sim::ParsePlan(yaml, "tiny-fsdp2-1gpu"));
  SHARDSCOPE_ASSIGN_OR_RETURN(traces::Schedule schedule, sim::LowerPlan(plan));
  SHARDSCOPE_ASSIGN_OR_RETURN(sim::SimulationSetup setup, sim::SetupFromSchedule(schedule, "tiny-fsdp2-1gpu"));
  return std::make_pair(std::move(schedule), std::move(setup));
}

// Completes on a GPU, with measured step times and the device's memory view. The peak check
// at the end is plumbing, named so: the run's allocator and the simulator's are the same
// sim::CachingAllocator fed the same calls, so equal peaks show the backend makes the
// schedule's allocator calls in order, not that the allocator model matches PyTorch's (that
// is scripts/gpu/validate_allocator.sh, docs/VALIDATION.md).
TEST(CudaBackendGpuTest, TinyFsdp2OnOneGpuCompletesPlumbingPeakAsSimulated) {
  SKIP_WITHOUT_GPU();
  StatusOr<std::pair<traces::Schedule, sim::SimulationSetup>> input = TinyOneGpu();
  ASSERT_TRUE(input.ok()) << input.status().message();
  const auto& [schedule, setup] = *input;
  ASSERT_EQ(schedule.world_size(), 1);

  // The simulator's prediction of the same schedule: one warm-up pass and a step.
  const sim::ClusterCostProvider costs(schedule, setup.cluster);
  StatusOr<sim::SimulationResult> simulated = sim::Simulate(schedule, costs, sim::EngineConfigFor(setup, schedule), nullptr);
  ASSERT_TRUE(simulated.ok()) << simulated.status().message();
  const int64_t simulated_peak = simulated->ranks[0].memory.stats.reserved_bytes_peak;
  ASSERT_GT(simulated_peak, 0);

  const std::filesystem::path out = std::filesystem::temp_directory_path() / "shardscope_cuda_gpu_test";
  std::filesystem::remove_all(out);
  CudaRunOptions options;
  options.common.source = "tiny-fsdp2-1gpu";
  options.common.out_dir = out.string();
  options.common.warmup = 1;
  options.common.steps = 2;
  options.common.timeout_s = 120;
  int64_t hooked = 0;
  options.common.hooks.before_issue = [&hooked](int64_t) { ++hooked; };
  StatusOr<RunResult> result = RunCudaBackend(Mpi(), schedule, setup, options);
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_TRUE(result->completed);
  std::cout << result->summary;
  // The hook ran once per op per step (warm-up included).
  EXPECT_EQ(hooked, 3 * static_cast<int64_t>(schedule.ProgramOf(0).ops.size()));

  const nlohmann::json report = nlohmann::json::parse(ReadText((out / "report.json").string()));
  const nlohmann::json& rank = report["ranks"][0];
  EXPECT_EQ(report["runtime"]["backend"], "cuda");
  // Plumbing (see above). The capacity is the simulator's unless the device had less free.
  if (rank["capacity_bytes"].get<int64_t>() == rank["capacity_planned_bytes"].get<int64_t>()) {
    EXPECT_EQ(rank["peak_reserved_bytes"].get<int64_t>(), simulated_peak) << "plumbing";
  }
  EXPECT_EQ(rank["step_times_ns"].size(), 2u);
  for (const auto& t : rank["step_times_ns"]) EXPECT_GT(t.get<int64_t>(), 0);
  EXPECT_GT(rank["mem_get_info_after_setup"]["total_bytes"].get<int64_t>(), 0);
  EXPECT_LE(rank["capacity_bytes"].get<int64_t>(), rank["mem_get_info_after_setup"]["free_bytes"].get<int64_t>());
}

TEST(CudaBackendGpuTest, GemmProxyReachesTheBestCublasLtAlgorithm) {
  SKIP_WITHOUT_GPU();
  // 8192^3 bf16: 1.1 TFLOP per call; the proxy takes the heuristic's first algorithm and must
  // be within 5% of the fastest the heuristic offers.
  StatusOr<cuda::GemmBenchmark> bench =
      cuda::BenchmarkGemm(traces::GemmDesc{8192, 8192, 8192, 1, traces::DType::kBFloat16}, 20, 16);
  ASSERT_TRUE(bench.ok()) << bench.status().message();
  std::cout << "GEMM 8192^3 bf16: proxy " << bench->proxy_ns * 1e-6 << " ms (" << bench->proxy_tflops()
            << " TFLOP/s), best of " << bench->algorithms << " algorithms " << bench->best_ns * 1e-6
            << " ms, ratio " << bench->best_ns / bench->proxy_ns << "\n";
  EXPECT_GE(bench->best_ns / bench->proxy_ns, 0.95);
}

TEST(CudaBackendGpuTest, CudaGraphReplayRuns) {
  SKIP_WITHOUT_GPU();
  StatusOr<std::pair<traces::Schedule, sim::SimulationSetup>> input = TinyOneGpu();
  ASSERT_TRUE(input.ok()) << input.status().message();
  const auto& [schedule, setup] = *input;
  const std::filesystem::path out = std::filesystem::temp_directory_path() / "shardscope_cuda_graph_test";
  std::filesystem::remove_all(out);
  CudaRunOptions options;
  options.common.source = "tiny-fsdp2-1gpu";
  options.common.out_dir = out.string();
  options.common.timeout_s = 120;
  options.cuda_graph = true;
  StatusOr<RunResult> result = RunCudaBackend(Mpi(), schedule, setup, options);
  ASSERT_TRUE(result.ok()) << result.status().message();
  std::cout << result->summary;
  const nlohmann::json report = nlohmann::json::parse(ReadText((out / "report.json").string()));
  EXPECT_EQ(report["ranks"][0]["graph_step_times_ns"].size(), 3u);
}

}  // namespace
}  // namespace shardscope::runtime

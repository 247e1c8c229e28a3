// Internals of the CUDA backend that its GPU tests (cuda_backend_gpu_test.cc) reach: the GEMM
// proxy's throughput against every algorithm cuBLASLt offers for the shape, and the allocator
// replay the peak comparison uses. CUDA builds only; no CUDA type here.
#ifndef SHARDSCOPE_RUNTIME_CUDA_CUDA_INTERNAL_H_
#define SHARDSCOPE_RUNTIME_CUDA_CUDA_INTERNAL_H_

#include <cstdint>

#include "shardscope/traces/schedule.h"
#include "shardscope/base/status.h"

namespace shardscope::runtime::cuda {

struct GemmBenchmark {
  double proxy_ns = 0;        // median time of the proxy's choice (the heuristic's first algo)
  double best_ns = 0;         // the fastest of every algorithm the heuristic returned
  int32_t algorithms = 0;     // how many were timed
  double proxy_tflops() const { return proxy_ns > 0 ? flops / proxy_ns * 1e-3 : 0; }
  double flops = 0;
};

// Times `gemm` on device 0 through the proxy's cuBLASLt plan and through each of up to
// `max_algorithms` heuristic results, `iterations` launches each after a warm-up.
StatusOr<GemmBenchmark> BenchmarkGemm(const traces::GemmDesc& gemm, int32_t iterations, int32_t max_algorithms);

}  // namespace shardscope::runtime::cuda

#endif  // SHARDSCOPE_RUNTIME_CUDA_CUDA_INTERNAL_H_

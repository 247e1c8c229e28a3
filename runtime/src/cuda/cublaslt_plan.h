// cuBLASLt plans for the GEMM proxies (CUDA builds only): descriptors, layouts and the
// heuristic's algorithm for an LtProblem (proxy_math.h), and one matmul launch.
#ifndef SHARDSCOPE_RUNTIME_CUDA_CUBLASLT_PLAN_H_
#define SHARDSCOPE_RUNTIME_CUDA_CUBLASLT_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "cuda/cuda_resources.h"
#include "cuda/proxy_math.h"
#include "shardscope/base/status.h"

namespace shardscope::runtime::cuda {

struct LtPlan {
  OwnedMatmulDesc desc;
  OwnedLayout a, b, c;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
};

// The cache key of a problem (its shape, transposes, leading dimensions and types).
std::string ProblemKey(const LtProblem& p);

// Builds the descriptors and asks the heuristic for up to `max_results` algorithms, best first.
Status BuildLtPlan(cublasLtHandle_t handle, const LtProblem& p, size_t workspace, int32_t max_results,
                   LtPlan* plan, std::vector<cublasLtMatmulHeuristicResult_t>* results);

// One matmul with alpha = 1, beta = 0, on `stream`.
Status RunLt(cublasLtHandle_t handle, const LtPlan& plan, const cublasLtMatmulAlgo_t& algo, const LtProblem& p,
             const void* a, const void* b, void* c, void* workspace, cudaStream_t stream);

}  // namespace shardscope::runtime::cuda

#endif  // SHARDSCOPE_RUNTIME_CUDA_CUBLASLT_PLAN_H_

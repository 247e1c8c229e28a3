#include "cuda/cublaslt_plan.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "cuda/cuda_internal.h"

namespace shardscope::runtime::cuda {

namespace {

// ---- Type maps (proxy_math's names -> the libraries' enums)

cudaDataType_t CudaType(LtDataType t) {
  switch (t) {
    case LtDataType::kF32: return CUDA_R_32F;
    case LtDataType::kBF16: return CUDA_R_16BF;
    case LtDataType::kF16: return CUDA_R_16F;
    case LtDataType::kF8E4M3: return CUDA_R_8F_E4M3;
    case LtDataType::kF8E5M2: return CUDA_R_8F_E5M2;
    case LtDataType::kF64: return CUDA_R_64F;
    case LtDataType::kI8: return CUDA_R_8I;
    case LtDataType::kI32: return CUDA_R_32I;
  }
  return CUDA_R_32F;
}

cublasComputeType_t CublasCompute(LtComputeType t) {
  switch (t) {
    case LtComputeType::k32F: return CUBLAS_COMPUTE_32F;
    case LtComputeType::k32FFastTF32: return CUBLAS_COMPUTE_32F_FAST_TF32;
    case LtComputeType::k64F: return CUBLAS_COMPUTE_64F;
    case LtComputeType::k32I: return CUBLAS_COMPUTE_32I;
  }
  return CUBLAS_COMPUTE_32F;
}


Status MakeLayout(LtDataType type, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride,
                  OwnedLayout* out) {
  cublasLtMatrixLayout_t layout = nullptr;
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cublasLtMatrixLayoutCreate(
      &layout, CudaType(type), static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
  *out = OwnedLayout(layout);
  if (batch > 1) {
    const auto count = static_cast<int32_t>(batch);
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(
        Cuda().cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cublasLtMatrixLayoutSetAttribute(
        layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
  return Status::Ok();
}

// alpha = 1, beta = 0 in the scale type.
struct Scalars {
  alignas(8) unsigned char one[8] = {};
  alignas(8) unsigned char zero[8] = {};
  explicit Scalars(LtDataType scale) {
    if (scale == LtDataType::kF64) {
      const double v = 1.0;
      std::memcpy(one, &v, sizeof v);
    } else if (scale == LtDataType::kI32) {
      const int32_t v = 1;
      std::memcpy(one, &v, sizeof v);
    } else {
      const float v = 1.0f;
      std::memcpy(one, &v, sizeof v);
    }
  }
};

}  // namespace

std::string ProblemKey(const LtProblem& p) {
  return fmt::format("{}x{}x{}x{} t{}{} ld{},{},{} {} {} {} {}", p.m, p.n, p.k, p.batch, p.transpose_a, p.transpose_b,
                     p.lda, p.ldb, p.ldc, LtDataTypeName(p.a_type), LtDataTypeName(p.b_type),
                     LtDataTypeName(p.c_type), LtComputeTypeName(p.compute));
}

Status BuildLtPlan(cublasLtHandle_t handle, const LtProblem& p, size_t workspace, int32_t max_results,
                   LtPlan* plan, std::vector<cublasLtMatmulHeuristicResult_t>* results) {
  cublasLtMatmulDesc_t desc = nullptr;
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(
      Cuda().cublasLtMatmulDescCreate(&desc, CublasCompute(p.compute), CudaType(p.scale_type)));
  plan->desc = OwnedMatmulDesc(desc);
  const cublasOperation_t ta = p.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = p.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(
      Cuda().cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(
      Cuda().cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  SHARDSCOPE_RETURN_IF_ERROR(MakeLayout(p.a_type, p.transpose_a ? p.k : p.m, p.transpose_a ? p.m : p.k, p.lda, p.batch,
                                        p.stride_a, &plan->a));
  SHARDSCOPE_RETURN_IF_ERROR(MakeLayout(p.b_type, p.transpose_b ? p.n : p.k, p.transpose_b ? p.k : p.n, p.ldb, p.batch,
                                        p.stride_b, &plan->b));
  SHARDSCOPE_RETURN_IF_ERROR(MakeLayout(p.c_type, p.m, p.n, p.ldc, p.batch, p.stride_c, &plan->c));
  cublasLtMatmulPreference_t pref_raw = nullptr;
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cublasLtMatmulPreferenceCreate(&pref_raw));
  OwnedPreference pref(pref_raw);
  const uint64_t ws = workspace;
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(
      Cuda().cublasLtMatmulPreferenceSetAttribute(pref_raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  results->assign(static_cast<size_t>(std::max(1, max_results)), cublasLtMatmulHeuristicResult_t{});
  int found = 0;
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cublasLtMatmulAlgoGetHeuristic(handle, desc, plan->a.get(), plan->b.get(),
                                                                 plan->c.get(), plan->c.get(), pref_raw,
                                                                 static_cast<int>(results->size()), results->data(),
                                                                 &found));
  if (found <= 0) {
    return Status::Internal(fmt::format("cuBLASLt has no algorithm for the GEMM {} (workspace {} bytes)", ProblemKey(p),
                                        workspace));
  }
  results->resize(static_cast<size_t>(found));
  plan->algo = (*results)[0].algo;
  plan->workspace = workspace;
  return Status::Ok();
}

Status RunLt(cublasLtHandle_t handle, const LtPlan& plan, const cublasLtMatmulAlgo_t& algo, const LtProblem& p,
             const void* a, const void* b, void* c, void* workspace, cudaStream_t stream) {
  const Scalars s(p.scale_type);
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cublasLtMatmul(handle, plan.desc.get(), s.one, a, plan.a.get(), b,
                                                        plan.b.get(), s.zero, c, plan.c.get(), c, plan.c.get(), &algo,
                                                        workspace, plan.workspace, stream));
  return Status::Ok();
}

// ---- GEMM benchmark for the GPU tests (cuda_internal.h).
StatusOr<GemmBenchmark> BenchmarkGemm(const traces::GemmDesc& gemm, int32_t iterations, int32_t max_algorithms) {
  SHARDSCOPE_RETURN_IF_ERROR(LoadCuda());
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaSetDevice(0));
  cudaDeviceProp prop{};
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaGetDeviceProperties(&prop, 0));
  const ComputeCapability cc{prop.major, prop.minor};
  const LtProblem p = GemmProblem(gemm, cc);
  const auto workspace = static_cast<size_t>(CublasWorkspaceBytes(cc));
  cublasLtHandle_t lt_raw = nullptr;
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cublasLtCreate(&lt_raw));
  OwnedLt lt(lt_raw);
  LtPlan plan;
  std::vector<cublasLtMatmulHeuristicResult_t> results;
  SHARDSCOPE_RETURN_IF_ERROR(BuildLtPlan(lt.get(), p, workspace, max_algorithms, &plan, &results));
  // Plain cudaMalloc here: a benchmark of one shape, outside any schedule.
  OperandDeviceMemory memory(int64_t{1} << 50);
  cudaStream_t stream_raw = nullptr;
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaStreamCreateWithPriority(&stream_raw, cudaStreamNonBlocking, 0));
  OwnedStream stream(stream_raw);
  void* buffers[4] = {};
  const int64_t sizes[4] = {p.a_bytes(), p.b_bytes(), p.c_bytes(), static_cast<int64_t>(workspace)};
  for (int i = 0; i < 4; ++i) {
    uint64_t address = 0;
    const int64_t bytes = std::max<int64_t>(sizes[i], 512);
    if (!memory.Allocate(bytes, &address)) {
      SHARDSCOPE_RETURN_IF_ERROR(memory.TakeError());
      return Status::Internal(fmt::format("cudaMalloc of {} bytes: out of memory", bytes));
    }
    buffers[i] = memory.PointerOf(address);
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaMemsetAsync(buffers[i], 0, static_cast<size_t>(bytes), stream.get()));
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(OwnedEvent a, MakeEvent(true));
  SHARDSCOPE_ASSIGN_OR_RETURN(OwnedEvent b, MakeEvent(true));
  auto time_algo = [&](const cublasLtMatmulAlgo_t& algo) -> StatusOr<double> {
    for (int i = 0; i < 3; ++i) {
      SHARDSCOPE_RETURN_IF_ERROR(
          RunLt(lt.get(), plan, algo, p, buffers[0], buffers[1], buffers[2], buffers[3], stream.get()));
    }
    std::vector<int64_t> times;
    for (int32_t i = 0; i < iterations; ++i) {
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaEventRecord(a.get(), stream.get()));
      SHARDSCOPE_RETURN_IF_ERROR(
          RunLt(lt.get(), plan, algo, p, buffers[0], buffers[1], buffers[2], buffers[3], stream.get()));
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaEventRecord(b.get(), stream.get()));
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaEventSynchronize(b.get()));
      float ms = 0;
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaEventElapsedTime(&ms, a.get(), b.get()));
      times.push_back(static_cast<int64_t>(static_cast<double>(ms) * 1e6));
    }
    std::sort(times.begin(), times.end());
    return static_cast<double>(times[(times.size() - 1) / 2]);
  };
  GemmBenchmark bench;
  bench.flops = p.flops();
  SHARDSCOPE_ASSIGN_OR_RETURN(bench.proxy_ns, time_algo(plan.algo));
  bench.best_ns = bench.proxy_ns;
  for (const cublasLtMatmulHeuristicResult_t& r : results) {
    if (r.state != CUBLAS_STATUS_SUCCESS || r.workspaceSize > workspace) continue;
    StatusOr<double> t = time_algo(r.algo);
    if (!t.ok()) continue;  // an algorithm the heuristic listed but that does not run: skip it
    ++bench.algorithms;
    bench.best_ns = std::min(bench.best_ns, *t);
  }
  return bench;
}


}  // namespace shardscope::runtime::cuda

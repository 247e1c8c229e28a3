// One wrapper for CUDA, cuBLASLt and NCCL results (CCCL's habit): a call's result becomes a
// Status naming the call, the library's error string and file:line. Three policies:
//   SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));   // return the error (default)
//   SHARDSCOPE_CUDA_CHECK_OR_ABORT(cudaEventRecord(e, s));        // impossible state: abort
//   SHARDSCOPE_CUDA_LOG_IF_ERROR(cudaStreamDestroy(s));           // destructors: log, go on
// Never `assert` on a result: it vanishes under NDEBUG. The error strings come from the
// loaded libraries (cuda_api.h). CUDA builds only.
#ifndef SHARDSCOPE_RUNTIME_CUDA_CUDA_CHECK_H_
#define SHARDSCOPE_RUNTIME_CUDA_CUDA_CHECK_H_

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include "cuda/cuda_api.h"
#include "shardscope/base/status.h"

namespace shardscope::runtime::cuda {

inline bool IsOk(cudaError_t e) { return e == cudaSuccess; }
inline bool IsOk(ncclResult_t e) { return e == ncclSuccess; }
inline bool IsOk(cublasStatus_t e) { return e == CUBLAS_STATUS_SUCCESS; }
inline const char* ErrorString(cudaError_t e) { return Cuda().cudaGetErrorString(e); }
inline const char* ErrorString(ncclResult_t e) { return Cuda().ncclGetErrorString(e); }
inline const char* ErrorString(cublasStatus_t e) { return Cuda().cublasLtGetStatusString(e); }

// `call` as written at the call site; "Cuda()." (the table of cuda_api.h) is not part of the
// call's name and is dropped.
template <typename Result>
Status CallStatus(Result result, std::string_view call, const char* file, int line) {
  if (IsOk(result)) return Status::Ok();
  constexpr std::string_view kTable = "Cuda().";
  if (call.substr(0, kTable.size()) == kTable) call.remove_prefix(kTable.size());
  return Status::Internal(fmt::format("{} failed: {} ({}:{})", call, ErrorString(result), file, line));
}

}  // namespace shardscope::runtime::cuda

#define SHARDSCOPE_CUDA_RETURN_IF_ERROR(call)                                                              \
  do {                                                                                                     \
    ::shardscope::Status shardscope_cuda_status_ =                                                         \
        ::shardscope::runtime::cuda::CallStatus((call), #call, __FILE__, __LINE__);                       \
    if (!shardscope_cuda_status_.ok()) return shardscope_cuda_status_;                                     \
  } while (0)

#define SHARDSCOPE_CUDA_CHECK_OR_ABORT(call)                                                               \
  do {                                                                                                     \
    ::shardscope::Status shardscope_cuda_status_ =                                                         \
        ::shardscope::runtime::cuda::CallStatus((call), #call, __FILE__, __LINE__);                       \
    if (!shardscope_cuda_status_.ok()) {                                                                   \
      std::fprintf(stderr, "shardscope: fatal: %s\n", shardscope_cuda_status_.message().c_str());        \
      std::abort();                                                                                        \
    }                                                                                                      \
  } while (0)

#define SHARDSCOPE_CUDA_LOG_IF_ERROR(call)                                                                 \
  do {                                                                                                     \
    ::shardscope::Status shardscope_cuda_status_ =                                                         \
        ::shardscope::runtime::cuda::CallStatus((call), #call, __FILE__, __LINE__);                       \
    if (!shardscope_cuda_status_.ok()) {                                                                   \
      std::fprintf(stderr, "shardscope: ignored in cleanup: %s\n", shardscope_cuda_status_.message().c_str()); \
    }                                                                                                      \
  } while (0)

#endif  // SHARDSCOPE_RUNTIME_CUDA_CUDA_CHECK_H_

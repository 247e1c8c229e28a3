// The CUDA stack the CUDA backend calls, as one table of entry points (CUDA builds only):
// the CUDA runtime (libcudart), cuBLASLt (libcublasLt) and NCCL (libnccl), opened with dlopen
// the first time `run --backend cuda` needs them, never linked. So the `shardscope` binary
// starts, and `simulate`, `analyze`, `--version` ... run, on a machine without any of them, as
// the profiler already does with CUPTI (profiler/src/cupti_api.cc); a machine without one of
// them gets an input error naming the library (exit 2) from `run --backend cuda` only.
//
//   SHARDSCOPE_RETURN_IF_ERROR(LoadCuda());          // once per process; later calls return
//   Cuda().cudaSetDevice(0);                          // the same answer
//
// Each member is named and typed after the function it points to (the headers' declarations,
// so a signature change is a compile error), and is called as `Cuda().cudaEventRecord(e, s)`.
// Tests install a fake table (SetCudaForTesting, cuda_rank_test.cc), which runs the backend's
// control flow without a GPU, a driver or the libraries.
#ifndef SHARDSCOPE_RUNTIME_CUDA_CUDA_API_H_
#define SHARDSCOPE_RUNTIME_CUDA_CUDA_API_H_

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string_view>

#include "shardscope/base/status.h"

namespace shardscope::runtime::cuda {

// The entry points, one X-macro list per library (the loader resolves each list from its
// library; the struct below declares a member per entry).
// libcudart (CUDA Runtime API). The cudaLibrary* entries and cudaLaunchKernel run the
// proxy kernels without nvcc's host stubs, which would need cudart at link time
// (proxy_kernels.h).
#define SHARDSCOPE_CUDART_ENTRIES(X) \
  X(cudaGetDeviceCount) \
  X(cudaGetErrorString) \
  X(cudaGetLastError) \
  X(cudaSetDevice) \
  X(cudaGetDeviceProperties) \
  X(cudaDeviceGetStreamPriorityRange) \
  X(cudaDeviceSynchronize) \
  X(cudaMemGetInfo) \
  X(cudaStreamCreateWithPriority) \
  X(cudaStreamDestroy) \
  X(cudaStreamSynchronize) \
  X(cudaStreamWaitEvent) \
  X(cudaEventCreateWithFlags) \
  X(cudaEventDestroy) \
  X(cudaEventRecord) \
  X(cudaEventQuery) \
  X(cudaEventSynchronize) \
  X(cudaEventElapsedTime) \
  X(cudaFree) \
  X(cudaFreeHost) \
  X(cudaMemsetAsync) \
  X(cudaMemcpyAsync) \
  X(cudaStreamBeginCapture) \
  X(cudaStreamEndCapture) \
  X(cudaGraphLaunch) \
  X(cudaGraphDestroy) \
  X(cudaGraphExecDestroy) \
  X(cudaLibraryLoadData) \
  X(cudaLibraryGetKernel) \
  X(cudaLibraryUnload)
// The runtime entries cuda_runtime.h overloads with C++ templates (nccl.h includes it), so
// `&::fn` is ambiguous: their C signatures, spelled out (a static_cast in cuda_api.cc proves
// each one against the header's declaration).
using CudaMallocFn = cudaError_t (*)(void**, size_t);
using CudaGraphInstantiateFn = cudaError_t (*)(cudaGraphExec_t*, cudaGraph_t, unsigned long long);
using CudaLaunchKernelFn = cudaError_t (*)(const void*, dim3, dim3, void**, size_t, cudaStream_t);
#define SHARDSCOPE_CUDART_TYPED_ENTRIES(Y) \
  Y(cudaMalloc, CudaMallocFn) \
  Y(cudaMallocHost, CudaMallocFn) \
  Y(cudaGraphInstantiate, CudaGraphInstantiateFn) \
  Y(cudaLaunchKernel, CudaLaunchKernelFn)
// libcublasLt.
#define SHARDSCOPE_CUBLASLT_ENTRIES(X) \
  X(cublasLtCreate) \
  X(cublasLtDestroy) \
  X(cublasLtGetStatusString) \
  X(cublasLtMatmulDescCreate) \
  X(cublasLtMatmulDescDestroy) \
  X(cublasLtMatmulDescSetAttribute) \
  X(cublasLtMatrixLayoutCreate) \
  X(cublasLtMatrixLayoutDestroy) \
  X(cublasLtMatrixLayoutSetAttribute) \
  X(cublasLtMatmulPreferenceCreate) \
  X(cublasLtMatmulPreferenceDestroy) \
  X(cublasLtMatmulPreferenceSetAttribute) \
  X(cublasLtMatmulAlgoGetHeuristic) \
  X(cublasLtMatmul)
// libnccl.
#define SHARDSCOPE_NCCL_ENTRIES(X) \
  X(ncclGetErrorString) \
  X(ncclGetUniqueId) \
  X(ncclCommInitRank) \
  X(ncclCommInitAll) \
  X(ncclCommSplit) \
  X(ncclCommDestroy) \
  X(ncclCommAbort) \
  X(ncclCommGetAsyncError) \
  X(ncclGroupStart) \
  X(ncclGroupEnd) \
  X(ncclAllGather) \
  X(ncclReduceScatter) \
  X(ncclAllReduce) \
  X(ncclBroadcast) \
  X(ncclReduce) \
  X(ncclSend) \
  X(ncclRecv)

#define SHARDSCOPE_CUDA_ENTRY(fn) decltype(&::fn) fn = nullptr;
#define SHARDSCOPE_CUDA_TYPED_ENTRY(fn, type) type fn = nullptr;
struct CudaApi {
  SHARDSCOPE_CUDART_ENTRIES(SHARDSCOPE_CUDA_ENTRY)
  SHARDSCOPE_CUDART_TYPED_ENTRIES(SHARDSCOPE_CUDA_TYPED_ENTRY)
  SHARDSCOPE_CUBLASLT_ENTRIES(SHARDSCOPE_CUDA_ENTRY)
  SHARDSCOPE_NCCL_ENTRIES(SHARDSCOPE_CUDA_ENTRY)
};
#undef SHARDSCOPE_CUDA_ENTRY
#undef SHARDSCOPE_CUDA_TYPED_ENTRY

// The libraries as dlopen finds them (the loader's search path: LD_LIBRARY_PATH, ldconfig),
// then in the toolkit this binary was built against. The sonames carry the major versions of
// the headers we were compiled with: the runtime's and cuBLASLt's CUDA major
// (libcudart.so.13, libcublasLt.so.13), NCCL's ABI major (libnccl.so.2).
struct CudaLibraryNames {
  const char* cudart;
  const char* cublaslt;
  const char* nccl;
};
CudaLibraryNames CudaLibrarySonames();

// dlopen of one library by soname, as the loader finds it, then in the toolkit's library
// directory; kInvalidInput naming it and `what` it is for when neither has it.
StatusOr<void*> OpenCudaLibrary(const char* soname, std::string_view what);

// Opens the three libraries and resolves every entry, once per process (later calls return
// the first answer). Fails with kInvalidInput naming the library that is missing, the symbol
// it lacks, and what to install ("libnccl.so.2: cannot open shared object file ...: install
// NCCL or add its directory to LD_LIBRARY_PATH"). Never aborts.
Status LoadCuda();

// The table LoadCuda filled, or the one a test installed. Calling it before either is a
// programming error (SHARDSCOPE_CHECK).
const CudaApi& Cuda();

// Installs `api` (nullptr: uninstalls) in place of the loaded libraries, for tests; LoadCuda
// then returns Ok without opening anything.
void SetCudaForTesting(const CudaApi* api);

}  // namespace shardscope::runtime::cuda

#endif  // SHARDSCOPE_RUNTIME_CUDA_CUDA_API_H_

// The CUDA backend's two proxy kernels (proxy_kernels.cu, the only device code): a
// memory-bound stream kernel in 16-byte vectors and a spin kernel on %globaltimer.
//
// nvcc compiles proxy_kernels.cu into a fatbin (sm_80 and sm_90 code, and PTX for newer GPUs)
// that the build embeds in the binary (runtime/CMakeLists.txt); at run time it is loaded with
// cudaLibraryLoadData and its kernels launched by handle with cudaLaunchKernel (CUDA Runtime
// API, "Library Management": a cudaKernel_t from cudaLibraryGetKernel is accepted wherever a
// kernel function is, cuda_runtime_api.h's \note_cudaKernel_t). nvcc's usual host stubs would
// register the kernels with a cudart linked into the binary, which the lazily loaded CUDA
// stack (cuda_api.h) rules out. Plain C++ declarations: the rest of the backend is compiled by
// the host compiler with the project's warnings. CUDA builds only.
#ifndef SHARDSCOPE_RUNTIME_CUDA_PROXY_KERNELS_H_
#define SHARDSCOPE_RUNTIME_CUDA_PROXY_KERNELS_H_

#include <cstdint>

#include <cuda_runtime_api.h>

#include "shardscope/base/status.h"

namespace shardscope::runtime::cuda {

// The kernels' entry names in the fatbin (extern "C" in proxy_kernels.cu).
inline constexpr const char* kMemoryBoundKernelName = "shardscope_memory_bound_kernel";
inline constexpr const char* kSpinKernelName = "shardscope_spin_kernel";

// The proxy kernels loaded from the embedded fatbin. Move-only; unloads the library when
// destroyed. Loaded once per rank (cudaLibrary_t is context-independent: the device is the
// current one at each launch).
class ProxyKernels {
 public:
  ProxyKernels() = default;
  ~ProxyKernels();
  ProxyKernels(ProxyKernels&& other) noexcept;
  ProxyKernels& operator=(ProxyKernels&& other) noexcept;
  ProxyKernels(const ProxyKernels&) = delete;
  ProxyKernels& operator=(const ProxyKernels&) = delete;

  static StatusOr<ProxyKernels> Load();

  // Streams `read_vectors` 16-byte vectors from `src` and writes `write_vectors` to `dst`
  // (each buffer at least that many vectors, 16-byte aligned) on `blocks` x `threads` threads
  // (proxy_math.h MemoryBoundGeometry). No launch when blocks <= 0.
  Status LaunchMemoryBound(int64_t read_vectors, int64_t write_vectors, int32_t blocks, int32_t threads,
                           const void* src, void* dst, cudaStream_t stream) const;
  // One thread spins until %globaltimer has advanced `ns` past its first read.
  Status LaunchSpin(int64_t ns, cudaStream_t stream) const;

 private:
  cudaLibrary_t library_ = nullptr;
  cudaKernel_t memory_bound_ = nullptr;
  cudaKernel_t spin_ = nullptr;
};

}  // namespace shardscope::runtime::cuda

#endif  // SHARDSCOPE_RUNTIME_CUDA_PROXY_KERNELS_H_

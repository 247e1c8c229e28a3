// Loading and launching the proxy kernels (proxy_kernels.h).
#include "cuda/proxy_kernels.h"

#include <cstddef>
#include <utility>

#include "cuda/cuda_check.h"

namespace shardscope::runtime::cuda {

// The fatbin of proxy_kernels.cu, embedded by the build (runtime/CMakeLists.txt writes the
// definitions into the build tree).
extern const unsigned char kProxyKernelsFatbin[];
extern const size_t kProxyKernelsFatbinSize;

ProxyKernels::~ProxyKernels() {
  if (library_ != nullptr) SHARDSCOPE_CUDA_LOG_IF_ERROR(Cuda().cudaLibraryUnload(library_));
}

ProxyKernels::ProxyKernels(ProxyKernels&& other) noexcept
    : library_(std::exchange(other.library_, nullptr)),
      memory_bound_(std::exchange(other.memory_bound_, nullptr)),
      spin_(std::exchange(other.spin_, nullptr)) {}

ProxyKernels& ProxyKernels::operator=(ProxyKernels&& other) noexcept {
  if (this != &other) {
    if (library_ != nullptr) SHARDSCOPE_CUDA_LOG_IF_ERROR(Cuda().cudaLibraryUnload(library_));
    library_ = std::exchange(other.library_, nullptr);
    memory_bound_ = std::exchange(other.memory_bound_, nullptr);
    spin_ = std::exchange(other.spin_, nullptr);
  }
  return *this;
}

StatusOr<ProxyKernels> ProxyKernels::Load() {
  ProxyKernels kernels;
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaLibraryLoadData(&kernels.library_, kProxyKernelsFatbin, nullptr,
                                                             nullptr, 0, nullptr, nullptr, 0));
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(
      Cuda().cudaLibraryGetKernel(&kernels.memory_bound_, kernels.library_, kMemoryBoundKernelName));
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaLibraryGetKernel(&kernels.spin_, kernels.library_, kSpinKernelName));
  return kernels;
}

Status ProxyKernels::LaunchMemoryBound(int64_t read_vectors, int64_t write_vectors, int32_t blocks, int32_t threads,
                                       const void* src, void* dst, cudaStream_t stream) const {
  if (blocks <= 0) return Status::Ok();
  // cudaLaunchKernel copies each argument from the address given (CUDA Runtime API).
  void* args[] = {&src, &dst, &read_vectors, &write_vectors};
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaLaunchKernel(reinterpret_cast<const void*>(memory_bound_),
                                                          dim3(static_cast<unsigned>(blocks)),
                                                          dim3(static_cast<unsigned>(threads)), args, 0, stream));
  return Status::Ok();
}

Status ProxyKernels::LaunchSpin(int64_t ns, cudaStream_t stream) const {
  void* args[] = {&ns};
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(
      Cuda().cudaLaunchKernel(reinterpret_cast<const void*>(spin_), dim3(1), dim3(1), args, 0, stream));
  return Status::Ok();
}

}  // namespace shardscope::runtime::cuda

// Launchers of the CUDA backend's two proxy kernels (proxy_kernels.cu, the only device code):
// a memory-bound stream kernel in 16-byte vectors and a spin kernel on %globaltimer. Plain
// C++ declarations, so the rest of the backend is compiled by the host compiler with the
// project's warnings. CUDA builds only.
#ifndef SHARDSCOPE_RUNTIME_CUDA_PROXY_KERNELS_H_
#define SHARDSCOPE_RUNTIME_CUDA_PROXY_KERNELS_H_

#include <cstdint>

#include <cuda_runtime.h>

namespace shardscope::runtime::cuda {

// Streams `read_vectors` 16-byte vectors from `src` and writes `write_vectors` to `dst` (each
// buffer at least that many vectors, 16-byte aligned) on `blocks` x `threads` threads (the
// geometry of proxy_math.h MemoryBoundGeometry). No launch when blocks <= 0. Returns the
// launch's error. (No project header here: nvcc compiles this file alone, quickly.)
cudaError_t LaunchMemoryBound(int64_t read_vectors, int64_t write_vectors, int32_t blocks, int32_t threads,
                              const void* src, void* dst, cudaStream_t stream);

// One thread spins until %globaltimer has advanced `ns` past its first read.
cudaError_t LaunchSpin(int64_t ns, cudaStream_t stream);

}  // namespace shardscope::runtime::cuda

#endif  // SHARDSCOPE_RUNTIME_CUDA_PROXY_KERNELS_H_

// The CUDA backend's device code, kept to two small kernels (nvcc is slow; CI has two cores).
// GEMMs and attention go through cuBLASLt and collectives through NCCL: no device code here.
// Compiled to a fatbin only (no host code): proxy_kernels.h loads it at run time and launches
// the kernels by their extern "C" names, so this file includes nothing of the project.
#include <cstdint>

// Grid-stride loop over max(read, write) vectors (MemoryBoundGeometry): loads and stores in
// the same pass, as an elementwise kernel does. The loaded value feeds the store (or, for
// read-only traffic, a data-dependent store that never happens) so the loads are not elided.
extern "C" __global__ void shardscope_memory_bound_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                                         int64_t read_vectors, int64_t write_vectors) {
  const int64_t vectors = read_vectors > write_vectors ? read_vectors : write_vectors;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  uint4 carry = make_uint4(0, 0, 0, 0);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors; i += stride) {
    if (i < read_vectors) {
      const uint4 v = src[i];
      carry.x ^= v.x;
      carry.y ^= v.y;
      carry.z ^= v.z;
      carry.w ^= v.w;
    }
    if (i < write_vectors) dst[i] = carry;
  }
  // Read-only traffic: keep the loads live. The buffers are zero-filled by the caller, so
  // the condition is false in practice; the compiler cannot know it.
  if (write_vectors == 0 && carry.x == 0xFFFFFFFFu && carry.y == 0x12345678u) {
    dst[0] = carry;
  }
}

// PTX ISA, "Special Registers: %globaltimer": a 64-bit nanosecond timer, readable from any
// thread.
static __device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

extern "C" __global__ void shardscope_spin_kernel(int64_t ns) {
  const uint64_t start = GlobalTimerNs();
  while (static_cast<int64_t>(GlobalTimerNs() - start) < ns) {
  }
}


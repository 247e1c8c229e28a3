// The CPU-side decisions of the CUDA backend, as pure functions with no CUDA header in sight,
// so they build and are unit-tested on a machine without a toolkit or a GPU
// (cuda_proxy_math_test.cc): how schedule stream priorities map onto the device's range,
// which cuBLASLt problem reproduces a GEMM or an attention kernel, the launch geometry of the
// memory-bound proxy, the spin kernel's calibration, the buffers a rank's proxies need, and
// which device a rank drives.
//
// The CUDA code (cuda_backend.cc) translates these structs into cudaDataType /
// cublasComputeType_t values and launches; nothing here decides anything at run time.
#ifndef SHARDSCOPE_RUNTIME_CUDA_PROXY_MATH_H_
#define SHARDSCOPE_RUNTIME_CUDA_PROXY_MATH_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shardscope/traces/schedule.h"
#include "shardscope/base/status.h"

namespace shardscope::runtime::cuda {

// ---- Streams

// cudaDeviceGetStreamPriorityRange(&least, &greatest): lower numbers are higher priorities,
// so greatest <= least (H100: greatest -5, least 0; the CUDA runtime API documents the pair).
struct PriorityRange {
  int32_t least = 0;
  int32_t greatest = 0;
};

// Device priority of every schedule stream. The schedule uses the CUDA convention (lower =
// higher priority) but any numbers; PyTorch creates its streams at 0 (default) and negative
// numbers (torch.cuda.Stream(priority=-1), ProcessGroupNCCL's TORCH_NCCL_HIGH_PRIORITY
// streams). The mapping keeps the order: the distinct levels are sorted, the lowest-priority
// level gets `least` (the default priority, what an unprioritized stream gets), each higher
// level one step higher, and levels beyond the device's range share `greatest`. So the usual
// {0, -1} stays {0, -1}; a device with a narrower range than the schedule merges the top
// levels, never inverts two.
std::vector<int32_t> MapStreamPriorities(const std::vector<int32_t>& schedule_priorities, PriorityRange range);

// ---- GEMMs through cuBLASLt

// Our names for cuBLASLt's types (cudaDataType_t, cublasComputeType_t); cuda_backend.cc maps
// them one to one.
enum class LtDataType : uint8_t { kF32, kBF16, kF16, kF8E4M3, kF8E5M2, kF64, kI8, kI32 };
enum class LtComputeType : uint8_t {
  k32F,          // CUBLAS_COMPUTE_32F: fp32 accumulate (bf16/fp16/fp8 inputs, fp32)
  k32FFastTF32,  // CUBLAS_COMPUTE_32F_FAST_TF32: fp32 data through TF32 tensor cores
  k64F,          // CUBLAS_COMPUTE_64F
  k32I,          // CUBLAS_COMPUTE_32I: int8 inputs, int32 accumulate
};
std::string_view LtDataTypeName(LtDataType t);
std::string_view LtComputeTypeName(LtComputeType t);

// One cublasLtMatmul call, column-major as cuBLAS sees it: D = alpha op(A) op(B) + beta C,
// op(A) rows x cols = m x k, op(B) = k x n, D = m x n, `batch` strided matrices each.
struct LtProblem {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  bool transpose_a = false, transpose_b = false;
  int64_t lda = 0, ldb = 0, ldc = 0;  // leading dimensions of A, B and C/D as stored
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements between batch matrices
  LtDataType a_type = LtDataType::kBF16, b_type = LtDataType::kBF16;
  LtDataType c_type = LtDataType::kBF16, d_type = LtDataType::kBF16;
  LtComputeType compute = LtComputeType::k32F;
  LtDataType scale_type = LtDataType::kF32;  // alpha / beta
  std::string note;  // a substitution made (dtype unsupported on the device, ...); empty if none

  int64_t a_bytes() const;  // one buffer holding all `batch` matrices
  int64_t b_bytes() const;
  int64_t c_bytes() const;  // C and D share one buffer (beta = 0, in place)
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) * static_cast<double>(batch); }
};
int64_t LtDataTypeSize(LtDataType t);

// Compute capability, for dtype support: fp8 tensor cores need sm_89 (Ada) or sm_90 (Hopper)
// (cuBLASLt documentation, cublasLtMatmul: "FP8 ... requires compute capability 8.9 or
// above").
struct ComputeCapability {
  int32_t major = 9, minor = 0;
  bool AtLeast(int32_t maj, int32_t min) const { return major > maj || (major == maj && minor >= min); }
};

// The cuBLASLt problem reproducing C[batch][m][n] = A[batch][m][k] x B[batch][k][n] (row-major,
// as PyTorch stores tensors). Row-major C = A B is column-major C^T = B^T A^T, so cuBLAS gets
// m' = n, n' = m and the operands swapped, no transposes, ld = the row lengths (n, k, n): the
// trick at::cuda::blas::gemm callers use (aten/src/ATen/native/cuda/Blas.cpp). fp8 differs:
// cuBLASLt takes fp8 only in the "TN" layout (A transposed, B not; cuBLASLt docs, cublasLtMatmul
// FP8 notes), so A' is stored k x m' (lda = k) and B' k x n' (ldb = k); the same FLOPs and
// bytes. Types per dtype:
//   fp32 -> 32F;  tf32 -> fp32 data, 32F_FAST_TF32;  bf16 / fp16 -> that data, 32F compute,
//   fp32 scale (PyTorch's cublasLt path);  fp8 e4m3 -> e4m3 inputs, bf16 C/D, 32F (D type
//   bf16 is one of the documented fp8 combinations);  fp8 e5m2 -> A e5m2 x B e4m3 (e5m2 x e5m2
//   is not a supported combination);  fp64 -> 64F;  int8 -> 32I with int32 C/D ("TN" too).
// fp8 on a device below sm_89 becomes bf16, and int32/int64 (not GEMM types) fp32, with a note.
LtProblem GemmProblem(const traces::GemmDesc& gemm, ComputeCapability cc);

// Attention as the batched GEMMs of FlashAttention's accounting (the simulator's FLOPs,
// sim/models/src/compute_model.cc): S = Q K^T (m = seq_q, n = seq_kv, k = head_dim) and O = P V
// (m = seq_q, n = head_dim, k = seq_kv), heads x batch as the batch count. A causal mask
// halves the score work (about half of S is computed): the proxy halves seq_kv in both GEMMs
// (n of QK^T, k of PV), the same FLOPs as the model, rounded down to a multiple of 8 (tensor
// core alignment). The backward pass is 5 GEMMs (S recomputed, dP = dO V^T of QK^T's shape;
// dV = P^T dO, dQ = dS K, dK = dS^T Q of PV's shape): 2.5x the forward FLOPs. Grouped-query
// attention: K and V are read per query head (as the FLOPs count them). A softmax-like
// memory pass moves the tensors the simulator charges attention with: forward reads Q, K, V
// and writes O; backward reads Q, K, V, O, dO and writes dQ, dK, dV.
// The S/P buffer (seq_q x seq_kv per head) is materialized by the proxy, unlike a fused
// kernel: `batch_chunk` heads x batch go per call so it stays under kMaxScoreBufferBytes.
inline constexpr int64_t kMaxScoreBufferBytes = int64_t{256} << 20;
struct AttentionProxy {
  LtProblem qk;          // per call: batch = batch_chunk
  LtProblem pv;
  int32_t qk_repeats = 1;  // GEMMs of qk's shape per chunk (1 forward, 2 backward)
  int32_t pv_repeats = 1;  // (1 forward, 3 backward)
  int64_t total_batch = 0;   // heads x batch
  int64_t batch_chunk = 0;   // per call
  int64_t calls_per_gemm() const { return batch_chunk <= 0 ? 0 : (total_batch + batch_chunk - 1) / batch_chunk; }
  int64_t memory_read_bytes = 0;
  int64_t memory_write_bytes = 0;
  double flops() const;    // of every call: equals the simulator's KernelFlops up to rounding
};
AttentionProxy AttentionProblem(const traces::AttentionDesc& attention, ComputeCapability cc);

// ---- Memory-bound proxy: a grid-stride copy in 16-byte vectors (uint4 loads and stores: the
// widest per-thread access, CUDA C++ Programming Guide, "Device Memory Accesses").
inline constexpr int64_t kVectorBytes = 16;
inline constexpr int32_t kCopyThreadsPerBlock = 256;
// Blocks per SM for a streaming kernel: enough warps in flight to saturate HBM (a common
// choice for grid-stride loops; estimate, not measured here).
inline constexpr int32_t kCopyBlocksPerSm = 4;
struct CopyGeometry {
  int64_t read_vectors = 0;   // 16-byte loads (the read bytes rounded up to 16)
  int64_t write_vectors = 0;  // 16-byte stores
  int32_t threads_per_block = kCopyThreadsPerBlock;
  int32_t blocks = 0;         // 0: nothing to move (no launch)
  int64_t moved_bytes() const { return (read_vectors + write_vectors) * kVectorBytes; }
};
// Thread i handles vectors i, i + stride, ... of max(read, write) vectors: it loads when the
// index is below read_vectors and stores when below write_vectors (reads and writes stream in
// the same pass). Blocks: enough for one vector per thread, capped at kCopyBlocksPerSm per SM.
CopyGeometry MemoryBoundGeometry(int64_t bytes_read, int64_t bytes_written, int32_t sm_count);

// ---- Fixed durations: a spin kernel on %globaltimer (PTX ISA, "Special Registers:
// %globaltimer": a 64-bit nanosecond timer), and host work as a busy-wait on steady_clock.
// Both miss their target by a fixed cost (launch and first timer read; clock reads) and a
// timer granularity; a calibration measures requested -> measured pairs and fits
// measured = slope x requested + offset by least squares, then asks for
// (target - offset) / slope.
struct SpinCalibration {
  double slope = 1.0;
  double offset_ns = 0.0;
};
// Needs at least two distinct requested durations; otherwise the identity calibration.
SpinCalibration FitSpinCalibration(const std::vector<std::pair<int64_t, int64_t>>& requested_measured);
// The duration to request for `target_ns`: never negative (a target below the fixed cost
// cannot be met; 0 asks for the shortest spin).
int64_t SpinRequestFor(const SpinCalibration& calibration, int64_t target_ns);

// ---- Buffers

// cuBLASLt workspace per stream: 32 MiB on Hopper and newer, 4 MiB before (the cuBLAS
// documentation's recommendation under cublasSetWorkspace; that PyTorch's
// aten/src/ATen/cuda/CublasHandlePool.cpp picks the same sizes is not confirmed in source).
int64_t CublasWorkspaceBytes(ComputeCapability cc);

// The operand buffers one stream's proxies need: the largest A, B and C/D of its GEMMs and
// attention GEMMs, the largest source and destination of its memory-bound kernels and copies,
// and the workspace when it runs a GEMM. Kernels on one stream run one at a time, so one set
// per stream suffices. Bytes are rounded up to 512 (the caching allocator's granularity) so
// vector accesses stay in bounds.
struct StreamOperands {
  int64_t a_bytes = 0, b_bytes = 0, c_bytes = 0;
  int64_t src_bytes = 0, dst_bytes = 0;
  int64_t workspace_bytes = 0;
  int64_t total() const { return a_bytes + b_bytes + c_bytes + src_bytes + dst_bytes + workspace_bytes; }
};
std::vector<StreamOperands> OperandBytes(const traces::Program& program, ComputeCapability cc);

// ---- Devices and processes

// The local rank the launcher gives a process: OMPI_COMM_WORLD_LOCAL_RANK (Open MPI),
// MPI_LOCALRANKID (MPICH / Intel MPI), SLURM_LOCALID (srun), in that order; nullopt when none
// is set (the caller then splits MPI_COMM_WORLD with MPI_COMM_TYPE_SHARED). `getenv` is
// injected for tests.
std::optional<int32_t> LocalRankFromEnvironment(const char* (*getenv_fn)(const char*));

// How one job maps onto processes and devices.
struct DeviceAssignment {
  bool one_process_drives_all = false;  // no MPI world: this process runs every rank
  std::vector<int32_t> devices;         // the devices this process drives, by its local ranks
};
// One process per GPU (the MPI world equals the schedule's): device = local rank, which must
// be below the local device count. A single process (no mpirun) with at least as many local
// devices as the schedule has ranks drives them all, rank r on device r. Anything else is an
// input error naming the three numbers and the launch that would work.
StatusOr<DeviceAssignment> AssignDevices(int32_t schedule_world, int32_t mpi_world, int32_t local_rank,
                                         int32_t local_devices);

// The message of a run that finds no usable device: "no CUDA device: <cudaGetErrorString>".
std::string NoDeviceMessage(std::string_view cuda_error);

}  // namespace shardscope::runtime::cuda

#endif  // SHARDSCOPE_RUNTIME_CUDA_PROXY_MATH_H_

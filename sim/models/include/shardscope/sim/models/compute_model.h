// How long one kernel takes on one GPU, from its shape and the GPU's own measured figures.
//
// * GEMMs (cuBLAS/CUTLASS style): the output is cut into tiles of the tile shape the
//   architecture's kernels use; one thread block per SM runs a tile, so the tiles run in waves
//   of `sm_count` (wave quantization); each tile walks k in steps of the tile depth after a
//   pipeline fill of (stages - 1) steps. When the tiles cannot fill the GPU the k loop is split
//   (split-K) and the partial sums are reduced through memory. The per-SM rate is normalized so
//   that the shape the GPU's sustained GEMM throughput was measured on takes exactly the measured
//   time (GpuSpec::measured). A memory term (A, B, C streamed once at the measured copy
//   bandwidth) bounds skinny shapes. duration = kernel floor + max(compute, memory) + split-K
//   reduction.
// * Attention (fused kernels): throughput interpolated from published single-kernel
//   measurements per kernel family and GPU (AttentionSeries), by sequence length (log scale),
//   head dim, causality and pass. A family without measurements on a GPU derives from one that
//   has them only where a published relative measurement says how (xFormers' CUTLASS kernel on
//   Volta, relative to the unfused path), else it is unsupported (AttentionSupported).
// * Memory-bound kernels: kernel floor + bytes read and written / measured copy bandwidth.
// * Fixed durations are returned as given.
// Every constant lives in ComputeModelConfig::Default() or the GPU presets with its source.
#ifndef SHARDSCOPE_SIM_COMPUTE_MODEL_H_
#define SHARDSCOPE_SIM_COMPUTE_MODEL_H_

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "shardscope/sim/presets/hardware.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::sim {

// The GEMM tile an architecture's tensor-core kernels use, and their software pipeline depth.
struct GemmTiling {
  GpuArch arch = GpuArch::kHopper;
  std::vector<std::array<int32_t, 2>> tiles;  // candidate (tile_m, tile_n), all equally efficient
  int32_t tile_k = 64;                        // k per main-loop step
  int32_t stages = 3;                         // shared-memory pipeline stages
};

// Published throughput of one attention kernel family on one GPU architecture: TFLOP/s at
// sequence lengths 512, 1k, 2k, 4k, 8k, 16k (batch x seq = 16k tokens, hidden 2048: the
// FlashAttention benchmark grid), with FLOPs counted as KernelFlops does.
struct AttentionSeries {
  traces::AttentionImpl impl = traces::AttentionImpl::kFlash2;
  GpuArch arch = GpuArch::kAmpere;
  int32_t head_dim = 128;
  bool causal = false;
  bool backward = false;
  std::array<double, 6> tflops{};
};

struct ComputeModelConfig {
  std::vector<GemmTiling> tiling;       // one per architecture
  std::vector<int32_t> split_k;         // split factors cuBLAS may use, ascending from 1
  std::vector<AttentionSeries> attention;
  // xFormers' CUTLASS kernel on Volta relative to PyTorch's unfused attention (same shape).
  double mem_efficient_volta_forward_speedup = 1;
  double mem_efficient_volta_backward_slowdown = 1;
  int64_t memcpy_floor_ns = 0;          // shortest cudaMemcpyAsync (any kind)

  static ComputeModelConfig Default();
};

// FLOPs performed by a kernel (GEMM 2mnk·batch; attention forward 4·b·h·sq·skv·d, halved
// when causal, backward 2.5x forward; memory-bound and fixed: 0).
double KernelFlops(const traces::ComputeDesc& desc);
// Bytes moved through HBM by a kernel (GEMM: A, B and C once; attention forward: Q, K, V,
// O; attention backward: those and their gradients (Q, K, V, O, dO read; dQ, dK, dV
// written); memory-bound: read + written; fixed: 0).
double KernelBytes(const traces::ComputeDesc& desc);

// How the GEMM model ran one GEMM (for tests and explanations).
struct GemmCost {
  int32_t tile_m = 0, tile_n = 0, split_k = 1;
  int64_t ctas = 0;          // tiles x batch x split_k thread blocks
  int64_t waves = 0;         // ceil(ctas / sm_count)
  int64_t k_steps = 0;       // main-loop steps per thread block
  double compute_ns = 0;     // waves x (k_steps + stages - 1) x one step's time
  double memory_ns = 0;      // A + B + C at the copy bandwidth
  double reduce_ns = 0;      // split-K: partial fp32 sums written and read back
  int64_t duration_ns = 0;   // floor + max(compute, memory) + reduce, rounded up
};

class ComputeModel {
 public:
  explicit ComputeModel(GpuSpec gpu, ComputeModelConfig config = ComputeModelConfig::Default());

  // A FixedDurationDesc returns its duration as given (no floor).
  int64_t KernelDurationNs(const traces::ComputeDesc& desc) const;
  GemmCost Gemm(const traces::GemmDesc& gemm) const;
  // Fused attention throughput in FLOP/s for this shape (0 when unsupported on this GPU).
  double AttentionFlopsPerSecond(const traces::AttentionDesc& attention) const;
  // PyTorch's unfused attention ("math" backend): two batched GEMMs around memory-bound
  // scale / mask / softmax passes over the b x h x sq x skv scores (fp32 softmax).
  int64_t MathAttentionNs(const traces::AttentionDesc& attention) const;
  // h2d / d2h: bytes over the PCIe bandwidth; d2d: read + write at the copy bandwidth. Never
  // less than memcpy_floor_ns (0 bytes: 0).
  int64_t MemcpyDurationNs(traces::MemcpyKind kind, int64_t bytes) const;
  // The datasheet FLOP/s for `dtype` (fp32 rate when the GPU has no tensor-core rate for it).
  double EffectivePeakFlops(traces::DType dtype) const;
  // Sustained GEMM FLOP/s for `dtype` on this GPU (measured, or the datasheet rate scaled by the
  // measured 16-bit fraction).
  double AchievableMatmulFlops(traces::DType dtype) const;
  double CopyBandwidth() const;         // bytes read + written per second
  int64_t KernelFloorNs() const;
  const GpuSpec& gpu() const { return gpu_; }
  const ComputeModelConfig& config() const { return config_; }

 private:
  const GemmTiling& Tiling() const;
  GemmCost GemmWith(const traces::GemmDesc& gemm, double sm_step_flops_per_ns) const;
  GpuSpec gpu_;
  ComputeModelConfig config_;
  // Per-SM tensor-core FLOP/ns at 16 bits, normalized on the measured shape.
  double sm_flops_per_ns_16bit_ = 0;
};

// Whether a fused attention family has measurements (or a published derivation) on `arch`.
bool AttentionSupported(traces::AttentionImpl impl, GpuArch arch,
                        const ComputeModelConfig& config = ComputeModelConfig::Default());

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_COMPUTE_MODEL_H_

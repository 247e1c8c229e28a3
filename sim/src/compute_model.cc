// Roofline cost of one kernel: see compute_model.h for the formula. The constants live in
// ComputeModelConfig::Default() below, each with its source or marked as an estimate that
// calibration replaces.
#include "shardscope/sim/compute_model.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>

namespace shardscope::sim {
namespace {

using traces::AttentionDesc;
using traces::DType;
using traces::FixedDurationDesc;
using traces::GemmDesc;
using traces::MemoryBoundDesc;

constexpr double kNsPerSecond = 1e9;

// C = A x B: one multiply and one add per (m, n, k).
constexpr double kFlopsPerMac = 2;
// Attention FLOP accounting of the FlashAttention-2 paper (Dao 2023, arXiv 2307.08691,
// section 4.1): forward = 4 x seqlen^2 x head_dim x heads (S = QK^T and O = PV, two GEMMs of
// 2 x sq x skv x d each), halved with a causal mask (about half the scores are computed),
// backward = 2.5 x forward (5 matmuls against 2, with recomputation).
constexpr double kAttentionForwardGemms = 2;
constexpr double kCausalFraction = 0.5;
constexpr double kAttentionBackwardFactor = 2.5;
// The backward pass reads Q, K, V, O and dO and writes dQ, dK and dV: twice the forward
// tensors.
constexpr double kAttentionBackwardTraffic = 2;

int64_t Elements(int64_t a, int64_t b, int64_t c) { return a * b * c; }

double AttentionForwardFlops(const AttentionDesc& a) {
  double f = kAttentionForwardGemms * kFlopsPerMac * static_cast<double>(a.batch) *
             static_cast<double>(a.heads) * static_cast<double>(a.seq_q) *
             static_cast<double>(a.seq_kv) * static_cast<double>(a.head_dim);
  if (a.causal) f *= kCausalFraction;
  return f;
}

}  // namespace

double KernelFlops(const traces::ComputeDesc& desc) {
  return std::visit(
      [](const auto& d) -> double {
        using T = std::decay_t<decltype(d)>;
        if constexpr (std::is_same_v<T, GemmDesc>) {
          return kFlopsPerMac * static_cast<double>(d.m) * static_cast<double>(d.n) *
                 static_cast<double>(d.k) * static_cast<double>(d.batch);
        } else if constexpr (std::is_same_v<T, AttentionDesc>) {
          const double fwd = AttentionForwardFlops(d);
          return d.backward ? fwd * kAttentionBackwardFactor : fwd;
        } else {
          return 0.0;  // memory-bound and fixed-duration kernels
        }
      },
      desc);
}

double KernelBytes(const traces::ComputeDesc& desc) {
  return std::visit(
      [](const auto& d) -> double {
        using T = std::decay_t<decltype(d)>;
        if constexpr (std::is_same_v<T, GemmDesc>) {
          const double elems = static_cast<double>(d.m) * static_cast<double>(d.k) +
                               static_cast<double>(d.k) * static_cast<double>(d.n) +
                               static_cast<double>(d.m) * static_cast<double>(d.n);
          return elems * static_cast<double>(d.batch) *
                 static_cast<double>(traces::DTypeSize(d.dtype));
        } else if constexpr (std::is_same_v<T, AttentionDesc>) {
          const int64_t kv_heads = d.kv_heads > 0 ? d.kv_heads : d.heads;
          const double q_or_o = static_cast<double>(Elements(d.batch, d.heads, d.seq_q)) *
                                static_cast<double>(d.head_dim);
          const double k_or_v = static_cast<double>(Elements(d.batch, kv_heads, d.seq_kv)) *
                                static_cast<double>(d.head_dim);
          const double fwd = (2 * q_or_o + 2 * k_or_v) *
                             static_cast<double>(traces::DTypeSize(d.dtype));
          return d.backward ? fwd * kAttentionBackwardTraffic : fwd;
        } else if constexpr (std::is_same_v<T, MemoryBoundDesc>) {
          return static_cast<double>(d.bytes_read) + static_cast<double>(d.bytes_written);
        } else {
          return 0.0;
        }
      },
      desc);
}

ComputeModelConfig ComputeModelConfig::Default() {
  ComputeModelConfig c;
  // GEMM efficiency by FLOP count. Only the last row rests on a measurement:
  //   an 8192^3 bf16 GEMM (2 x 8192^3 = 1.1e12 FLOPs) runs at ~790-800 TFLOP/s on an H100
  //   SXM (reference/collectives-and-hardware.md), i.e. 795 / 989.5 = 0.80 of the dense
  //   peak; we apply it from 1e11 FLOPs up.
  // The smaller buckets are INITIAL ESTIMATES, replaced by calibration. Why they fall: a
  // GEMM needs several waves of output tiles over all SMs to amortise wave quantisation and
  // the prologue / epilogue (a 128x128-tile kernel on 1024x1024 outputs makes 64 tiles for
  // 108-132 SMs: half the GPU idles); below ~1 GFLOP the memory term and the kernel floor
  // dominate anyway.
  constexpr double kMeasuredH100Bf16GemmTflops = 795;  // midpoint of the 790-800 reported
  constexpr double kH100Bf16PeakTflops = 989.5;        // H100 SXM datasheet 1979 / 2
  c.gemm_efficiency = {
      {0, 0.35},     // < 1 GFLOP: under one wave (estimate)
      {1e9, 0.55},   // 1-10 GFLOP: one to a few waves (estimate)
      {1e10, 0.70},  // 10-100 GFLOP: many waves, tails still visible (estimate)
      {1e11, kMeasuredH100Bf16GemmTflops / kH100Bf16PeakTflops},  // measured, see above
  };
  // FlashAttention-2 (Dao 2023, arXiv 2307.08691, abstract): "reaching 50-73% of the
  // theoretical maximum FLOPs/s on A100" (forward). We take the middle of that range for
  // both passes (the backward pass is slower in the paper's plots: an optimistic estimate
  // for it).
  constexpr double kFlashAttention2MinFraction = 0.50;
  constexpr double kFlashAttention2MaxFraction = 0.73;
  c.attention_efficiency = (kFlashAttention2MinFraction + kFlashAttention2MaxFraction) / 2;
  // Device-to-device copy on an H100 SXM (HBM3, 3.35 TB/s peak) measures ~3.0 TB/s of read
  // + write (reference/collectives-and-hardware.md): 3.0 / 3.35 = 0.896.
  constexpr double kMeasuredH100CopyTbps = 3.0;
  constexpr double kH100HbmTbps = 3.35;
  c.memory_efficiency = kMeasuredH100CopyTbps / kH100HbmTbps;
  // ESTIMATE, replaced by calibration: the launch-to-retire time of a near-empty kernel as a
  // profiler shows it on A100 / H100 is of the order of 1-3 us (block scheduling, the
  // kernel's own prologue, the completion write); we take 2 us. Host launch overhead is
  // separate (HostConfig::launch_overhead_ns).
  c.kernel_floor_ns = 2000;
  // ESTIMATE, replaced by calibration: a tiny cudaMemcpyAsync (copy-engine setup, a PCIe or
  // HBM round trip and the completion semaphore) takes a few microseconds on the device; we
  // use the same 2 us as a kernel.
  c.memcpy_floor_ns = 2000;
  return c;
}

ComputeModel::ComputeModel(GpuSpec gpu, ComputeModelConfig config)
    : gpu_(std::move(gpu)), config_(std::move(config)) {}

double ComputeModel::GemmEfficiency(double flops) const {
  const auto& rows = config_.gemm_efficiency;
  if (rows.empty()) return 1.0;
  double efficiency = rows.front().efficiency;
  for (const GemmEfficiencyRow& row : rows) {
    if (flops < row.min_flops) break;
    efficiency = row.efficiency;
  }
  return efficiency;
}

double ComputeModel::EffectivePeakFlops(DType dtype) const {
  const double peak = PeakFlops(gpu_, dtype);
  // No tensor-core rate (bf16 / fp8 on V100, fp8 on Ampere, integer or fp64 GEMMs): PyTorch
  // runs the matmul on the CUDA cores, which we cost at the fp32 rate.
  return peak > 0 ? peak : gpu_.peak_flops_fp32;
}

int64_t ComputeModel::KernelDurationNs(const traces::ComputeDesc& desc) const {
  if (const auto* fixed = std::get_if<FixedDurationDesc>(&desc)) {
    return std::max<int64_t>(fixed->duration_ns, 0);
  }
  const double flops = KernelFlops(desc);
  double compute_s = 0;
  if (flops > 0) {
    double rate = 0;
    if (const auto* gemm = std::get_if<GemmDesc>(&desc)) {
      rate = EffectivePeakFlops(gemm->dtype) * GemmEfficiency(flops);
    } else if (const auto* attn = std::get_if<AttentionDesc>(&desc)) {
      rate = EffectivePeakFlops(attn->dtype) * config_.attention_efficiency;
    }
    if (rate > 0) compute_s = flops / rate;
  }
  const double bytes = KernelBytes(desc);
  const double memory_rate = gpu_.hbm_bandwidth * config_.memory_efficiency;
  const double memory_s = bytes > 0 && memory_rate > 0 ? bytes / memory_rate : 0;
  const double ns = std::max(compute_s, memory_s) * kNsPerSecond;
  return std::max(static_cast<int64_t>(std::ceil(ns)), config_.kernel_floor_ns);
}

int64_t ComputeModel::MemcpyDurationNs(traces::MemcpyKind kind, int64_t bytes) const {
  if (bytes <= 0) return 0;
  // A device-to-device copy reads and writes every byte through HBM.
  constexpr double kD2dTrafficFactor = 2;
  double seconds = 0;
  if (kind == traces::MemcpyKind::kDeviceToDevice) {
    const double rate = gpu_.hbm_bandwidth * config_.memory_efficiency;
    if (rate > 0) seconds = kD2dTrafficFactor * static_cast<double>(bytes) / rate;
  } else if (gpu_.pcie_bandwidth > 0) {
    // h2d / d2h at the theoretical PCIe rate (pinned host memory assumed).
    seconds = static_cast<double>(bytes) / gpu_.pcie_bandwidth;
  }
  const int64_t ns = static_cast<int64_t>(std::ceil(seconds * kNsPerSecond));
  return std::max(ns, config_.memcpy_floor_ns);
}

}  // namespace shardscope::sim

// Kernel durations from shapes and the GPU's measured figures: see compute_model.h for the
// model. Architecture tables (GEMM tiling, attention measurements) live in
// ComputeModelConfig::Default() below, each row with its source; the per-GPU measurements live
// with the GPU presets (hardware.cc).
#include "shardscope/sim/models/compute_model.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>

namespace shardscope::sim {
namespace {

using traces::AttentionDesc;
using traces::AttentionImpl;
using traces::DType;
using traces::FixedDurationDesc;
using traces::GemmDesc;
using traces::MemoryBoundDesc;

constexpr double kNsPerSecond = 1e9;
constexpr double kTera = 1e12;

// C = A x B: one multiply and one add per (m, n, k).
constexpr double kFlopsPerMac = 2;
// Attention FLOP accounting of the FlashAttention-2 paper (Dao 2023, arXiv 2307.08691,
// section 4.1) and its benchmark script (benchmarks/benchmark_flash_attention.py: "4 * batch *
// seqlen**2 * nheads * headdim // (2 if causal else 1)", backward "2.5 * f"): forward = two
// GEMMs of 2 x sq x skv x d each per head, halved with a causal mask, backward = 2.5 x forward
// (5 matmuls against 2, with recomputation). The published throughputs below use it too.
constexpr double kAttentionForwardGemms = 2;
constexpr double kCausalFraction = 0.5;
constexpr double kAttentionBackwardFactor = 2.5;
// The backward pass reads Q, K, V, O and dO and writes dQ, dK and dV: twice the forward
// tensors.
constexpr double kAttentionBackwardTraffic = 2;
// A split-K slice keeps at least this many main-loop steps (shorter slices are all pipeline
// fill).
constexpr int32_t kMinStepsPerSplit = 2;
// Split-K partial sums are fp32 (cuBLAS accumulates 16-bit GEMMs in fp32).
constexpr double kPartialSumBytes = 4;
// The math path's softmax runs in fp32 for 16-bit inputs (autocast's fp32 list).
constexpr double kSoftmaxBytes = 4;
// Sequence lengths of the FlashAttention benchmark grid (AttentionSeries::tflops).
constexpr std::array<double, 6> kSeriesSeqLens = {512, 1024, 2048, 4096, 8192, 16384};

int64_t Elements(int64_t a, int64_t b, int64_t c) { return a * b * c; }

double AttentionForwardFlops(const AttentionDesc& a) {
  double f = kAttentionForwardGemms * kFlopsPerMac * static_cast<double>(a.batch) *
             static_cast<double>(a.heads) * static_cast<double>(a.seq_q) *
             static_cast<double>(a.seq_kv) * static_cast<double>(a.head_dim);
  if (a.causal) f *= kCausalFraction;
  return f;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t CeilNs(double ns) {
  // Clamped to the simulator's horizon (traces::kMaxSimulatedNs): the conversion is defined for
  // any shape, and an op that long stops the run with an error (the engine's horizon check)
  // instead of a wrapped clock. NaN (0 / 0 on a GPU without a rate) becomes 0.
  constexpr auto kMaxNs = static_cast<double>(traces::kMaxSimulatedNs);
  if (!(ns > 0)) return 0;
  return static_cast<int64_t>(std::ceil(std::min(ns, kMaxNs)));
}

// a + b for durations already clamped to the horizon: saturates there.
int64_t AddNs(int64_t a, int64_t b) { return std::min(a + b, traces::kMaxSimulatedNs); }

bool SixteenBit(DType dtype) { return dtype == DType::kBFloat16 || dtype == DType::kFloat16; }

// Linear interpolation of a series over log2(seq), clamped to the measured range.
double AtSeq(const std::array<double, 6>& tflops, double seq) {
  const double x = std::log2(std::max(seq, 1.0));
  const double x0 = std::log2(kSeriesSeqLens.front());
  const double pos = std::clamp(x - x0, 0.0, static_cast<double>(kSeriesSeqLens.size() - 1));
  const auto i = static_cast<size_t>(std::min(pos, static_cast<double>(kSeriesSeqLens.size() - 2)));
  const double f = pos - static_cast<double>(i);
  return tflops[i] + (tflops[i + 1] - tflops[i]) * f;
}

const AttentionSeries* FindSeries(const ComputeModelConfig& config, AttentionImpl impl, GpuArch arch,
                                  int32_t head_dim, bool causal, bool backward) {
  for (const AttentionSeries& s : config.attention) {
    if (s.impl == impl && s.arch == arch && s.head_dim == head_dim && s.causal == causal &&
        s.backward == backward) {
      return &s;
    }
  }
  return nullptr;
}

// Throughput of (impl, arch, causal, backward) at one measured head dim, or 0. A causal
// backward without its own measurement is the non-causal backward scaled by the same kernel's
// causal / non-causal forward ratio at that length (ESTIMATE: the FlashAttention-3 paper gives
// no causal backward figures; the masked blocks skipped are the same in both passes).
double SeriesAt(const ComputeModelConfig& config, AttentionImpl impl, GpuArch arch, int32_t head_dim,
                bool causal, bool backward, double seq) {
  if (const AttentionSeries* s = FindSeries(config, impl, arch, head_dim, causal, backward)) {
    return AtSeq(s->tflops, seq);
  }
  if (causal && backward) {
    const AttentionSeries* nc_bwd = FindSeries(config, impl, arch, head_dim, false, true);
    const AttentionSeries* c_fwd = FindSeries(config, impl, arch, head_dim, true, false);
    const AttentionSeries* nc_fwd = FindSeries(config, impl, arch, head_dim, false, false);
    if (nc_bwd != nullptr && c_fwd != nullptr && nc_fwd != nullptr) {
      return AtSeq(nc_bwd->tflops, seq) * AtSeq(c_fwd->tflops, seq) / AtSeq(nc_fwd->tflops, seq);
    }
  }
  return 0;
}

// Interpolates linearly between the measured head dims around `head_dim` (clamped to the
// measured range); head dims measured for the forward pass only (FlashAttention-3's 256) take
// the nearest measured backward one. Returns TFLOP/s, or 0 without measurements.
double SeriesTflops(const ComputeModelConfig& config, AttentionImpl impl, GpuArch arch, const AttentionDesc& a) {
  std::vector<int32_t> dims;
  for (const AttentionSeries& s : config.attention) {
    if (s.impl != impl || s.arch != arch || s.backward != a.backward) continue;
    if (std::find(dims.begin(), dims.end(), s.head_dim) == dims.end()) dims.push_back(s.head_dim);
  }
  if (dims.empty()) return 0;
  std::sort(dims.begin(), dims.end());
  const double seq = static_cast<double>(a.seq_q);
  const double d = static_cast<double>(a.head_dim);
  if (d <= dims.front()) return SeriesAt(config, impl, arch, dims.front(), a.causal, a.backward, seq);
  if (d >= dims.back()) return SeriesAt(config, impl, arch, dims.back(), a.causal, a.backward, seq);
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    if (d > dims[i + 1]) continue;
    const double lo = SeriesAt(config, impl, arch, dims[i], a.causal, a.backward, seq);
    const double hi = SeriesAt(config, impl, arch, dims[i + 1], a.causal, a.backward, seq);
    const double f = (d - dims[i]) / (dims[i + 1] - dims[i]);
    return lo + (hi - lo) * f;
  }
  return 0;
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
  // ---- GEMM tiling.
  // NVIDIA, "Matrix Multiplication Background User's Guide" (Deep Learning Performance docs),
  // section 2.3 "Typical Tile Dimensions In cuBLAS And Performance": cuBLAS picks among tiles
  // "256x128 and 128x256 (most efficient) / 128x128 / ... / 64x64 (least efficient)"; section
  // 3.2: one thread block of a 256x128 tile per SM on A100, so 108 tiles make a wave. We offer
  // the two most efficient classes and treat them as equally efficient per FLOP (ESTIMATE: the
  // guide ranks but does not quantify them); smaller tiles only matter below one wave, where
  // split-K and the memory term decide. Depth and pipeline stages per architecture:
  // - Volta: CUTLASS DefaultGemmConfiguration<OpClassTensorOp, Sm70> ThreadblockShape 128x256x32,
  //   kStages 2 (include/cutlass/gemm/device/default_gemm_configuration.h).
  // - Ampere: the same file's Sm80 configuration, 128x256x64, kStages 3.
  // - Hopper: cuBLAS's sm90 kernels run 128x128x64 and 256x128x64 tiles (kernel names in
  //   vllm-project/vllm docs/contributing/profiling.md); stages: as many 128x256x64 bf16 stages
  //   ((128 + 256) x 64 x 2 B = 48 KiB) as fit the 227 KiB of shared memory per block (H100
  //   whitepaper): 4 (derived).
  const std::vector<std::array<int32_t, 2>> menu = {{128, 256}, {256, 128}, {128, 128}};
  c.tiling = {
      {GpuArch::kVolta, menu, 32, 2},
      {GpuArch::kAmpere, menu, 64, 3},
      {GpuArch::kHopper, menu, 64, 4},
  };
  // cuBLAS splits k across thread blocks when the output tiles cannot fill the SMs
  // (split-K / stream-K); powers of two as its heuristics use.
  c.split_k = {1, 2, 4, 8, 16};

  // ---- Attention measurements. TFLOP/s at seqlen 512, 1k, 2k, 4k, 8k, 16k.
  using A = AttentionImpl;
  // H100 80GB SXM5, FP16, from the FlashAttention-3 paper (Shah et al. 2024, arXiv 2407.08608 v1,
  // Figures 5 (forward) and 6 (backward, non-causal only); the bar labels read from the PDF's
  // text layer). Same grid as FlashAttention-2's benchmark. The paper's "FlashAttention-2" bars
  // on H100 are FA2 on Hopper.
  const auto h = GpuArch::kHopper;
  c.attention = {
      // forward
      {A::kFlash2, h, 64, false, false, {282, 306, 318, 321, 322, 324}},
      {A::kCudnn, h, 64, false, false, {335, 373, 395, 408, 412, 413}},
      {A::kFlash3, h, 64, false, false, {333, 392, 460, 476, 496, 497}},
      {A::kFlash2, h, 64, true, false, {180, 229, 262, 284, 295, 299}},
      {A::kCudnn, h, 64, true, false, {225, 288, 334, 363, 379, 388}},
      {A::kFlash3, h, 64, true, false, {197, 265, 371, 420, 460, 473}},
      {A::kFlash2, h, 128, false, false, {309, 350, 362, 368, 370, 370}},
      {A::kCudnn, h, 128, false, false, {497, 574, 617, 609, 600, 595}},
      {A::kFlash3, h, 128, false, false, {467, 565, 625, 638, 646, 648}},
      {A::kFlash2, h, 128, true, false, {191, 260, 298, 319, 333, 335}},
      {A::kCudnn, h, 128, true, false, {315, 410, 484, 518, 529, 539}},
      {A::kFlash3, h, 128, true, false, {292, 423, 521, 579, 602, 616}},
      {A::kFlash2, h, 256, false, false, {275, 313, 321, 323, 324, 326}},
      {A::kCudnn, h, 256, false, false, {470, 546, 580, 581, 580, 581}},
      {A::kFlash3, h, 256, false, false, {482, 627, 707, 736, 746, 756}},
      {A::kFlash2, h, 256, true, false, {208, 251, 278, 293, 297, 298}},
      {A::kCudnn, h, 256, true, false, {308, 391, 450, 483, 497, 509}},
      {A::kFlash3, h, 256, true, false, {286, 427, 537, 612, 628, 642}},
      // backward (non-causal; causal derives, see SeriesAt)
      {A::kFlash2, h, 64, false, true, {198, 238, 264, 279, 287, 291}},
      {A::kCudnn, h, 64, false, true, {266, 348, 395, 417, 432, 433}},
      {A::kFlash3, h, 64, false, true, {272, 363, 422, 453, 472, 474}},
      {A::kFlash2, h, 128, false, true, {214, 260, 291, 310, 318, 322}},
      {A::kCudnn, h, 128, false, true, {305, 408, 465, 499, 518, 516}},
      {A::kFlash3, h, 128, false, true, {316, 424, 501, 542, 559, 561}},
  };
  // A100 80GB SXM4, FP16, FlashAttention-2 (Dao 2023, arXiv 2307.08691, Figures 4-6; the
  // paper's text: "up to 73% of the theoretical max throughput in the forward pass, and up to 63%
  // ... in the backward pass"). The figures are images; their bar values come from:
  // - non-causal rows: a transcription of Figures 5 and 6 whose 2k-16k cells satisfy the
  //   benchmark's identity fwd+bwd = 3.5 / (1/fwd + 2.5/bwd) against Figure 4 to 0.2%; the 512 and
  //   1k cells do not (low confidence, kept: nothing better exists);
  // - causal forward: FA2 forward times printed by the Triton fused-attention tutorial in
  //   triton-lang/triton issue #1934 (batch 4, 32 heads; the GPU is not named, but its causal
  //   head-dim-64 series matches the paper's A100 panel); 512 from the transcription;
  // - causal backward: derived from Figure 4's fwd+bwd values (head dim 64: extracted bar by bar
  //   from the e-print's vector figure; 128: transcription) and the forward above, by the same
  //   identity (bwd = 2.5 / (3.5/fwd_bwd - 1/fwd)).
  // The least certain rows are the causal head-dim-128 ones; bf16 runs the same kernels.
  const auto a = GpuArch::kAmpere;
  c.attention.insert(c.attention.end(), {
      {A::kFlash2, a, 64, false, false, {128, 149, 193, 192, 192, 192}},
      {A::kFlash2, a, 128, false, false, {122, 157, 200, 224, 222, 225}},
      {A::kFlash2, a, 64, true, false, {115, 117, 150.1, 168.8, 177.5, 182}},
      {A::kFlash2, a, 128, true, false, {108, 142.4, 176.6, 197.8, 206.2, 210.4}},
      {A::kFlash2, a, 64, false, true, {120, 152, 163, 169, 170, 170}},
      {A::kFlash2, a, 128, false, true, {114, 175, 187, 193, 196, 196}},
      {A::kFlash2, a, 64, true, true, {80.4, 119.8, 136.3, 151.4, 160.5, 167.0}},
      {A::kFlash2, a, 128, true, true, {95.8, 126.9, 147.8, 176.4, 182.9, 181.6}},
  });
  // xFormers' CUTLASS ("memory-efficient") kernel on V100, fp16, relative to PyTorch's unfused
  // attention on the same shapes: "the CUTLASS-based implementation is 25% faster on average
  // compared to vanilla implementation" (forward) and "For the backward and fp16,
  // CUTLASS-based implementation is 19% slower on average" (facebookresearch/xformers PR #362,
  // "Use cutlass for memory-efficient attention", 2022). No absolute V100 figure was found.
  c.mem_efficient_volta_forward_speedup = 1.25;
  c.mem_efficient_volta_backward_slowdown = 1.19;
  // ESTIMATE: a tiny cudaMemcpyAsync (copy-engine setup, a PCIe or HBM round trip and the
  // completion semaphore) takes a few microseconds on the device; 2 us, as a kernel.
  c.memcpy_floor_ns = 2000;
  return c;
}

ComputeModel::ComputeModel(GpuSpec gpu, ComputeModelConfig config)
    : gpu_(std::move(gpu)), config_(std::move(config)) {
  // Normalize the per-SM rate on the measured shape: the model must take exactly the measured
  // time there. A GPU without a GEMM measurement (a hand-written schedule's custom figures)
  // runs at its datasheet peak (an upper bound).
  const GpuMeasuredFigures& m = gpu_.measured;
  const double sixteen_bit_peak = std::max(gpu_.peak_flops_bf16, gpu_.peak_flops_fp16);
  const int32_t sms = std::max(gpu_.sm_count, 1);
  if (m.matmul_flops_16bit > 0 && m.matmul_m > 0 && m.matmul_n > 0 && m.matmul_k > 0) {
    const GemmDesc shape{m.matmul_m, m.matmul_n, m.matmul_k, 1, DType::kFloat16};
    const double measured_ns = KernelFlops(shape) / m.matmul_flops_16bit * kNsPerSecond;
    // With a unit rate the compute term is the normalized work; the floor is paid on top.
    const GemmCost unit = GemmWith(shape, 1.0);
    const double compute_ns = measured_ns - static_cast<double>(KernelFloorNs());
    sm_flops_per_ns_16bit_ = compute_ns > 0 ? unit.compute_ns / compute_ns : 0;
  }
  if (!(sm_flops_per_ns_16bit_ > 0)) sm_flops_per_ns_16bit_ = sixteen_bit_peak / sms / kNsPerSecond;
}

const GemmTiling& ComputeModel::Tiling() const {
  for (const GemmTiling& t : config_.tiling) {
    if (t.arch == gpu_.arch) return t;
  }
  return config_.tiling.back();
}

double ComputeModel::AchievableMatmulFlops(DType dtype) const {
  const GpuMeasuredFigures& m = gpu_.measured;
  const double sixteen_bit_peak = std::max(gpu_.peak_flops_bf16, gpu_.peak_flops_fp16);
  const double fraction = m.matmul_flops_16bit > 0 && sixteen_bit_peak > 0 ? m.matmul_flops_16bit / sixteen_bit_peak
                                                                          : 1.0;
  const double peak = PeakFlops(gpu_, dtype);
  if (SixteenBit(dtype) && peak > 0) return m.matmul_flops_16bit > 0 ? m.matmul_flops_16bit : peak;
  if (peak > 0 && dtype != DType::kFloat32) return peak * fraction;  // tf32, fp8: ESTIMATE
  // fp32, and dtypes without a tensor-core rate (bf16 on Volta): CUDA cores.
  return m.matmul_flops_fp32 > 0 ? m.matmul_flops_fp32 : gpu_.peak_flops_fp32 * fraction;
}

double ComputeModel::CopyBandwidth() const {
  return gpu_.measured.copy_bandwidth > 0 ? gpu_.measured.copy_bandwidth : gpu_.hbm_bandwidth;
}

int64_t ComputeModel::KernelFloorNs() const { return std::max<int64_t>(gpu_.measured.kernel_floor_ns, 0); }

GemmCost ComputeModel::GemmWith(const GemmDesc& g, double sm_flops_per_ns) const {
  const GemmTiling& tiling = Tiling();
  const int64_t sms = std::max(gpu_.sm_count, 1);
  const double elem = static_cast<double>(traces::DTypeSize(g.dtype));
  const double bandwidth_per_ns = CopyBandwidth() / kNsPerSecond;
  GemmCost best;
  double best_ns = -1;
  for (const auto& [tile_m, tile_n] : tiling.tiles) {
    const int64_t tiles = CeilDiv(g.m, tile_m) * CeilDiv(g.n, tile_n) * std::max<int64_t>(g.batch, 1);
    for (int32_t split : config_.split_k) {
      // Split only when the tiles alone cannot fill one wave, and keep at least two k steps per
      // split; the reduction's memory traffic decides how far splitting pays.
      if (split > 1 && (tiles >= sms || g.k < int64_t{kMinStepsPerSplit} * split * tiling.tile_k)) break;
      GemmCost c;
      c.tile_m = tile_m;
      c.tile_n = tile_n;
      c.split_k = split;
      c.ctas = tiles * split;
      c.waves = CeilDiv(c.ctas, sms);
      c.k_steps = CeilDiv(g.k, int64_t{split} * tiling.tile_k);
      const double step_flops = kFlopsPerMac * tile_m * tile_n * tiling.tile_k;
      c.compute_ns = static_cast<double>(c.waves) * static_cast<double>(c.k_steps + tiling.stages - 1) *
                     step_flops / sm_flops_per_ns;
      c.memory_ns = KernelBytes(g) / bandwidth_per_ns;
      if (split > 1) {
        const double outputs = static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.batch);
        c.reduce_ns = (2 * split * kPartialSumBytes * outputs + elem * outputs) / bandwidth_per_ns;
      }
      const double ns = std::max(c.compute_ns, c.memory_ns) + c.reduce_ns;
      if (best_ns < 0 || ns < best_ns) {
        best_ns = ns;
        best = c;
      }
    }
  }
  best.duration_ns = CeilNs(static_cast<double>(KernelFloorNs()) + std::max(best_ns, 0.0));
  return best;
}

GemmCost ComputeModel::Gemm(const GemmDesc& gemm) const {
  if (gemm.m <= 0 || gemm.n <= 0 || gemm.k <= 0 || gemm.batch <= 0) {
    GemmCost empty;
    empty.duration_ns = KernelFloorNs();
    return empty;
  }
  const double sixteen_bit = AchievableMatmulFlops(DType::kFloat16);
  const double rate = AchievableMatmulFlops(gemm.dtype);
  const double scale = sixteen_bit > 0 ? rate / sixteen_bit : 1.0;
  return GemmWith(gemm, sm_flops_per_ns_16bit_ * scale);
}

double ComputeModel::AttentionFlopsPerSecond(const AttentionDesc& a) const {
  return SeriesTflops(config_, a.impl, gpu_.arch, a) * kTera;
}

int64_t ComputeModel::MathAttentionNs(const AttentionDesc& a) const {
  const int64_t bh = a.batch * a.heads;
  const double scores = static_cast<double>(bh) * static_cast<double>(a.seq_q) * static_cast<double>(a.seq_kv);
  const double elem = static_cast<double>(traces::DTypeSize(a.dtype));
  const auto memory = [&](double read, double written) {
    return MemoryBoundDesc{static_cast<int64_t>(std::min(read, 9.0e18)), static_cast<int64_t>(std::min(written, 9.0e18))};
  };
  std::vector<traces::ComputeDesc> kernels;
  if (!a.backward) {
    kernels.push_back(GemmDesc{a.seq_q, a.seq_kv, a.head_dim, bh, a.dtype});           // Q K^T
    kernels.push_back(memory(scores * elem, scores * elem));                          // * scale
    if (a.causal) kernels.push_back(memory(scores * elem, scores * elem));             // + mask
    kernels.push_back(memory(scores * elem, scores * kSoftmaxBytes));                  // softmax
    kernels.push_back(GemmDesc{a.seq_q, a.head_dim, a.seq_kv, bh, a.dtype});           // P V
  } else {
    kernels.push_back(GemmDesc{a.seq_q, a.seq_kv, a.head_dim, bh, a.dtype});           // dP = dO V^T
    kernels.push_back(GemmDesc{a.seq_kv, a.head_dim, a.seq_q, bh, a.dtype});           // dV = P^T dO
    kernels.push_back(memory(scores * (kSoftmaxBytes + elem), scores * elem));         // softmax bwd
    kernels.push_back(memory(scores * elem, scores * elem));                           // scale bwd
    kernels.push_back(GemmDesc{a.seq_q, a.head_dim, a.seq_kv, bh, a.dtype});           // dQ = dS K
    kernels.push_back(GemmDesc{a.seq_kv, a.head_dim, a.seq_q, bh, a.dtype});           // dK = dS^T Q
  }
  int64_t ns = 0;
  for (const traces::ComputeDesc& k : kernels) ns = AddNs(ns, KernelDurationNs(k));
  return ns;
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
  if (const auto* gemm = std::get_if<GemmDesc>(&desc)) return Gemm(*gemm).duration_ns;
  const int64_t floor = KernelFloorNs();
  if (const auto* attn = std::get_if<AttentionDesc>(&desc)) {
    const double rate = AttentionFlopsPerSecond(*attn);
    if (rate > 0) return std::max(CeilNs(KernelFlops(desc) / rate * kNsPerSecond), floor);
    if (attn->impl == AttentionImpl::kMemEfficient && gpu_.arch == GpuArch::kVolta) {
      const double math = static_cast<double>(MathAttentionNs(*attn));
      return CeilNs(attn->backward ? math * config_.mem_efficient_volta_backward_slowdown
                                   : math / config_.mem_efficient_volta_forward_speedup);
    }
    // No measurement for this family here (a hand-written schedule; plans are checked with
    // AttentionSupported): the unfused path's time, an upper bound.
    return MathAttentionNs(*attn);
  }
  const double bytes = KernelBytes(desc);
  const double bandwidth = CopyBandwidth();
  return CeilNs(static_cast<double>(floor) + (bandwidth > 0 ? bytes / bandwidth * kNsPerSecond : 0));
}

int64_t ComputeModel::MemcpyDurationNs(traces::MemcpyKind kind, int64_t bytes) const {
  if (bytes <= 0) return 0;
  // A device-to-device copy reads and writes every byte; the copy bandwidth counts both.
  constexpr double kD2dTrafficFactor = 2;
  double seconds = 0;
  if (kind == traces::MemcpyKind::kDeviceToDevice) {
    const double rate = CopyBandwidth();
    if (rate > 0) seconds = kD2dTrafficFactor * static_cast<double>(bytes) / rate;
  } else if (gpu_.pcie_bandwidth > 0) {
    // h2d / d2h at the theoretical PCIe rate (pinned host memory assumed).
    seconds = static_cast<double>(bytes) / gpu_.pcie_bandwidth;
  }
  return std::max(CeilNs(seconds * kNsPerSecond), config_.memcpy_floor_ns);
}

bool AttentionSupported(AttentionImpl impl, GpuArch arch, const ComputeModelConfig& config) {
  for (const AttentionSeries& s : config.attention) {
    if (s.impl == impl && s.arch == arch) return true;
  }
  return impl == AttentionImpl::kMemEfficient && arch == GpuArch::kVolta;
}

}  // namespace shardscope::sim

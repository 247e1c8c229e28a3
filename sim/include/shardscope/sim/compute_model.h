// Roofline cost of one kernel on one GPU.
//
// duration = max(FLOPs / (peak(dtype) x efficiency(shape)), bytes / (HBM bandwidth x
// memory efficiency)), and never less than a fixed launch-to-completion floor; rounded up to
// whole nanoseconds. GEMM efficiency depends on the shape through a small table (by FLOP
// count bucket); calibration (a later issue) replaces the table with fitted rows. Every
// constant lives in ComputeModelConfig::Default() with its source.
//
// A dtype the GPU has no tensor-core rate for (PeakFlops == 0, e.g. bf16 on V100) runs at
// the fp32 rate: PyTorch runs such matmuls on the CUDA cores.
#ifndef SHARDSCOPE_SIM_COMPUTE_MODEL_H_
#define SHARDSCOPE_SIM_COMPUTE_MODEL_H_

#include <cstdint>
#include <vector>

#include "shardscope/sim/hardware.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::sim {

// One row of the GEMM efficiency table: GEMMs with at least `min_flops` FLOPs (and fewer
// than the next row's) reach `efficiency` of peak.
struct GemmEfficiencyRow {
  double min_flops = 0;
  double efficiency = 1.0;
};

struct ComputeModelConfig {
  std::vector<GemmEfficiencyRow> gemm_efficiency;  // ascending by min_flops
  double attention_efficiency = 0;                 // fraction of peak for flash attention
  double memory_efficiency = 0;                    // fraction of HBM bandwidth achieved
  int64_t kernel_floor_ns = 0;                     // shortest kernel (launch-to-retire)
  int64_t memcpy_floor_ns = 0;                     // shortest cudaMemcpyAsync (any kind)

  static ComputeModelConfig Default();
};

// FLOPs performed by a kernel (GEMM 2mnk·batch; attention forward 4·b·h·sq·skv·d, halved
// when causal, backward 2.5x forward; memory-bound and fixed: 0).
double KernelFlops(const traces::ComputeDesc& desc);
// Bytes moved through HBM by a kernel (GEMM: A, B and C once; attention forward: Q, K, V,
// O; attention backward: those and their gradients (Q, K, V, O, dO read; dQ, dK, dV
// written); memory-bound: read + written; fixed: 0).
double KernelBytes(const traces::ComputeDesc& desc);

class ComputeModel {
 public:
  ComputeModel(GpuSpec gpu, ComputeModelConfig config);

  // A FixedDurationDesc returns its duration as given (no floor).
  int64_t KernelDurationNs(const traces::ComputeDesc& desc) const;
  // h2d / d2h: bytes over the PCIe bandwidth; d2d: read + write through HBM at the memory
  // efficiency. Never less than memcpy_floor_ns (0 bytes: 0).
  int64_t MemcpyDurationNs(traces::MemcpyKind kind, int64_t bytes) const;
  // The FLOP/s a kernel in `dtype` runs at before efficiency (fp32 rate when the GPU has no
  // rate for the dtype).
  double EffectivePeakFlops(traces::DType dtype) const;
  const GpuSpec& gpu() const { return gpu_; }
  const ComputeModelConfig& config() const { return config_; }

 private:
  double GemmEfficiency(double flops) const;
  GpuSpec gpu_;
  ComputeModelConfig config_;
};

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_COMPUTE_MODEL_H_

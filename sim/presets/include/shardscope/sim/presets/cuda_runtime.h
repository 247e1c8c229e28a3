// What the CUDA stack under PyTorch takes from a GPU before the caching allocator sees any of
// it, and which CUDA a PyTorch release runs with: the CUDA version of a release's default
// wheel, whether modules load lazily, the CUDA context that leaves on the device, and the
// cuBLAS workspaces PyTorch asks for. Every figure is in cuda_runtime.cc with its source;
// estimates are marked there.
//
//   const CudaVersion cuda = DefaultCudaForPytorch({2, 6});              // 12.4
//   const bool lazy = LazyModuleLoading({2, 6}, cuda);                   // true
//   const int64_t context = CudaContextBytes(GpuArch::kHopper, cuda, lazy);
//   const CublasWorkspace ws = CublasWorkspaceOf(GpuArch::kHopper, {2, 6});
#ifndef SHARDSCOPE_SIM_PRESETS_CUDA_RUNTIME_H_
#define SHARDSCOPE_SIM_PRESETS_CUDA_RUNTIME_H_

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "shardscope/sim/presets/hardware.h"
#include "shardscope/sim/presets/nccl_env.h"

namespace shardscope::sim {

// A "major.minor" release number (CUDA's or PyTorch's).
struct ReleaseVersion {
  int32_t major = 0;
  int32_t minor = 0;
  auto operator<=>(const ReleaseVersion&) const = default;
};
using CudaVersion = ReleaseVersion;
using PytorchVersion = ReleaseVersion;

std::string ReleaseVersionText(ReleaseVersion version);  // "12.4"
// "12.4" or "12.4.1" (the patch is ignored); nullopt for anything else.
std::optional<ReleaseVersion> ParseReleaseVersion(std::string_view text);

// The CUDA of the release's default wheel on PyPI (`pip install torch`), which is what a
// job runs unless it installed another build.
CudaVersion DefaultCudaForPytorch(PytorchVersion pytorch);
// The oldest CUDA that builds kernels for the architecture (sm_80: CUDA 11.0; sm_90: 11.8).
CudaVersion MinimumCudaFor(GpuArch arch);
// What a release runs on the GPU by default: its PyPI wheel, or, when that wheel's CUDA cannot
// run the GPU, the release's own build for it (the PyTorch 1.x CUDA 11 wheels on Ampere).
CudaVersion DefaultCudaFor(PytorchVersion pytorch, GpuArch arch);

// Whether CUDA loads kernel modules on first use (CUDA_MODULE_LOADING=LAZY) rather than all
// of them when the context is created.
bool LazyModuleLoading(PytorchVersion pytorch, CudaVersion cuda);

// Device memory the CUDA context of a PyTorch process holds (driver reservations, the loaded
// kernel images) before the caching allocator allocates anything.
int64_t CudaContextBytes(GpuArch arch, CudaVersion cuda, bool lazy);
// The source of the CudaContextBytes figure, for reports ("estimate: ...").
std::string_view CudaContextSource(CudaVersion cuda, bool lazy);

// The cuBLAS workspace PyTorch sets per (cuBLAS handle, stream), at the first GEMM on that
// stream from that handle's thread.
struct CublasWorkspace {
  int64_t bytes = 0;
  // true: allocated by the caching allocator (reserved memory the allocator sees); false:
  // cuBLAS allocates it itself (cudaMalloc), outside the allocator.
  bool through_caching_allocator = true;
};
CublasWorkspace CublasWorkspaceOf(GpuArch arch, PytorchVersion pytorch);

// cuBLAS handles that run a training step's GEMMs on one GPU: PyTorch keeps one handle per
// thread (CublasHandlePool.cpp: a thread-local PoolWindow), and a step's GEMMs come from two
// threads: the forward from the Python thread, the backward (with any recompute) from the
// autograd engine's device thread (torch/csrc/autograd/engine.cpp: one worker thread per
// device runs CUDA backward work).
inline constexpr int32_t kCublasHandlesPerTrainingStep = 2;

// Whether an NCCL release connects every ring and tree channel when a communicator is created
// (before NCCL 2.22) rather than at the first collective that needs the algorithm
// (NCCL_RUNTIME_CONNECT, default on from 2.22). The release is the job's (cluster.nccl.version,
// by default the one PyTorch's wheel bundles: nccl_env.h).
bool NcclConnectsAtInit(NcclVersion nccl);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_PRESETS_CUDA_RUNTIME_H_

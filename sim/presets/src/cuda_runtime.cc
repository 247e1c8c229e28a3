// The CUDA stack under PyTorch: default CUDA per release, lazy module loading, the CUDA
// context left on the device, cuBLAS workspaces and when NCCL connects its channels. Tables in
// the style of NCCL's tuning.cc: one row per fact, its source beside it.
#include "shardscope/sim/presets/cuda_runtime.h"

#include <array>
#include <charconv>

#include <fmt/format.h>

namespace shardscope::sim {
namespace {

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = int64_t{1} << 20;

// ---- The CUDA of each release's default wheel -------------------------------------------------
// PyTorch RELEASE.md, "Release Compatibility Matrix" (the CUDA builds of every release) and its
// "Special support cases" ("our CUDA 11 binaries do not currently meet the size restrictions for
// publishing on PyPI so the default version that is published to PyPI is CUDA 10.2", the 1.x
// releases). A row holds from its release until the next row's.
struct DefaultCudaRow {
  PytorchVersion from;
  CudaVersion cuda;
};
constexpr std::array<DefaultCudaRow, 8> kDefaultCuda = {{
    {{1, 8}, {10, 2}},   // 1.8-1.12: CUDA 10.2 on PyPI (RELEASE.md, special support cases)
    {{1, 13}, {11, 7}},  // 1.13: the first PyPI wheel on CUDA 11 (cu117, the nvidia-*-cu11 wheels)
    {{2, 0}, {11, 7}},   // 2.0: matrix "CUDA 11.7" (stable)
    {{2, 1}, {12, 1}},   // 2.1-2.4: the cu121 wheel (matrix: 12.1 experimental in 2.1-2.3, stable in 2.4)
    {{2, 5}, {12, 4}},   // 2.5, 2.6: cu124 (matrix: stable 12.4)
    {{2, 7}, {12, 6}},   // 2.7: cu126 (matrix: stable 11.8, 12.6)
    {{2, 8}, {12, 8}},   // 2.8-2.10: cu128 (matrix: stable 12.6, 12.8)
    // 2.11 lists 12.6, 12.8 and 13.0 as stable and RELEASE.md does not say which is on PyPI:
    // ESTIMATE, 12.8 kept (every CUDA >= 12 row below gives the same context).
    {{2, 11}, {12, 8}},
}};

// The CUDA 11 build of the 1.x releases whose PyPI wheel is CUDA 10.2 (an A100 needs it): the
// cu111 wheels of 1.8 and 1.9 ("torch==1.8.0+cu111" on download.pytorch.org), cu113 of 1.10 and
// 1.11, and 1.12's stable CUDA 11.3 (RELEASE.md matrix).
constexpr std::array<DefaultCudaRow, 2> kCuda11Build = {{
    {{1, 8}, {11, 1}},
    {{1, 10}, {11, 3}},
}};
// The first toolkit with each architecture's SASS target: sm_80 in CUDA 11.0, sm_90 in CUDA 11.8
// (CUDA toolkit release notes). Volta (sm_70) is in every CUDA PyTorch 1.8 was built with.
constexpr CudaVersion kMinimumCudaAmpere = {11, 0};
constexpr CudaVersion kMinimumCudaHopper = {11, 8};
constexpr CudaVersion kMinimumCudaVolta = {9, 0};

// ---- Lazy module loading ------------------------------------------------------------------------
// CUDA 11.7 introduced lazy loading (CUDA_MODULE_LOADING=LAZY, CUDA C Programming Guide,
// "Lazy Loading"); CUDA 12.2 made it the default. PyTorch sets CUDA_MODULE_LOADING=LAZY when
// the user has not set it from 1.13 (pytorch PR #86509, "[1.13] Sets CUDA_MODULE_LOADING to LAZY
// when not set by the user", torch/cuda/__init__.py _lazy_init).
constexpr CudaVersion kLazyLoadingCuda = {11, 7};
constexpr CudaVersion kLazyByDefaultCuda = {12, 2};
constexpr PytorchVersion kPytorchSetsLazy = {1, 13};

// ---- The CUDA context ---------------------------------------------------------------------------
// Device memory a PyTorch process holds once CUDA is initialized, outside the caching allocator
// (nvidia-smi's per-process usage, or cudaMemGetInfo's total - free, less what the allocator
// reserved). No measurement on a V100, A100, H100 or H200 was found, so every row is an
// ESTIMATE taken from another GPU; the same figure stands for every architecture (the loaded
// images are the kernels of one architecture, whose sizes are alike). Lazy rows are the bare
// context: kernels a training step uses are loaded on first use and add to it (not modelled).
struct ContextRow {
  CudaVersion from;  // the row holds from this CUDA until the next row's
  bool lazy;
  int64_t bytes;
  std::string_view source;
};
constexpr std::array<ContextRow, 5> kCudaContext = {{
    // pytorch issue #55277 (2022-04-12 table): torch 1.8.2+cu101 on a GTX 1080 (Pascal), 721 MiB
    // in nvidia-smi after torch.Tensor(1).cuda(), less the 2 MiB small-pool segment of that
    // tensor. Every kernel of the CUDA 10 libraries is loaded at context creation.
    {{10, 0}, false, 719 * kMiB,
     "estimate: torch 1.8.2+cu101 on a GTX 1080, 721 MiB in nvidia-smi less a 2 MiB segment (pytorch issue #55277)"},
    // The same table: torch 1.8.2+cu111 on an RTX 3090 (Ampere GA102), 1687 MiB less 2 MiB: the
    // CUDA 11 libraries (cuBLAS 11, cuDNN 8) load far more kernels at context creation.
    {{11, 0}, false, 1685 * kMiB,
     "estimate: torch 1.8.2+cu111 on an RTX 3090, 1687 MiB in nvidia-smi less a 2 MiB segment (pytorch issue #55277)"},
    // pytorch PR #86509 (torch 1.13, cu117, GPU not named): cudaMemGetInfo total - free after a
    // 6.4 MB tensor was 666,632,192 B with CUDA_MODULE_LOADING=DEFAULT and 287,047,680 B with
    // LAZY; the tensor's request (<= 10 MiB) took a 20 MiB segment (kLargeBuffer), subtracted.
    {{11, 7}, false, 666'632'192 - 20 * kMiB,
     "estimate: torch 1.13+cu117, CUDA_MODULE_LOADING=DEFAULT, 666,632,192 B total-free less a 20 MiB segment (pytorch PR #86509)"},
    {{11, 7}, true, 287'047'680 - 20 * kMiB,
     "estimate: torch 1.13+cu117, CUDA_MODULE_LOADING=LAZY, 287,047,680 B total-free less a 20 MiB segment (pytorch PR #86509)"},
    // unslothai/unsloth-zoo PR #1053: torch 2.10.0+cu130 on an RTX 6000 Ada, 426 MiB in
    // nvidia-smi after torch.cuda.mem_get_info() alone (the allocator reserved nothing).
    {{12, 0}, true, 426 * kMiB,
     "estimate: torch 2.10.0+cu130 on an RTX 6000 Ada, 426 MiB in nvidia-smi after torch.cuda.mem_get_info() (unsloth-zoo PR #1053)"},
}};

// ---- cuBLAS workspaces --------------------------------------------------------------------------
// aten/src/ATen/cuda/CublasHandlePool.cpp, getCurrentCUDABlasHandle -> setWorkspaceForHandle: a
// workspace per (handle, stream), `c10::cuda::CUDACachingAllocator::get()->allocate(
// getChosenWorkspaceSize())`; parseChosenWorkspaceSize: CUBLAS_WORKSPACE_CONFIG, default
// ":4096:2:16:8" (4096 KiB x 2 + 16 KiB x 8), "32MiB for Hopper" (sm_90).
constexpr int64_t kCublasDefaultWorkspace = 4096 * kKiB * 2 + 16 * kKiB * 8;  // 8,519,680 B
constexpr int64_t kCublasHopperWorkspace = 4096 * kKiB * 8;                   // 32 MiB
// pytorch PR #83461 ("Explicitly set the workspace for cuBLAS handles", PyTorch 1.13) first
// allocated the workspace through the caching allocator, 4096 KiB by default; PR #89027
// ("Fix default cuBLAS workspace size", PyTorch 2.0) made the default :4096:2:16:8 and 32 MiB
// on Hopper, "to match selected cuBLAS kernels before the explicit allocation change".
constexpr PytorchVersion kWorkspaceThroughAllocator = {1, 13};
constexpr PytorchVersion kWorkspaceDefaultsPerArch = {2, 0};
constexpr int64_t kCublasWorkspace113 = 4096 * kKiB;
// Before 1.13 cuBLAS kept its own workspace per handle (cudaMalloc, outside the allocator), of
// the size PR #89027 restored: ESTIMATE that it was :4096:2:16:8 on every architecture.

// ---- NCCL's connection setup --------------------------------------------------------------------
// NCCL 2.22 added NCCL_RUNTIME_CONNECT (default 1): channels of an algorithm are connected at the
// first collective that runs it (NCCL 2.22 release notes; src/init.cc). Earlier releases
// connected every ring and tree channel in ncclCommInitRank (initTransportsRank).
constexpr NcclVersion kNcclWithRuntimeConnect = {2, 22, 0};

}  // namespace

std::string ReleaseVersionText(ReleaseVersion version) { return fmt::format("{}.{}", version.major, version.minor); }

std::optional<ReleaseVersion> ParseReleaseVersion(std::string_view text) {
  ReleaseVersion v;
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  auto [p1, ec1] = std::from_chars(begin, end, v.major);
  if (ec1 != std::errc() || p1 == end || *p1 != '.') return std::nullopt;
  auto [p2, ec2] = std::from_chars(p1 + 1, end, v.minor);
  if (ec2 != std::errc()) return std::nullopt;
  if (p2 != end) {
    int32_t patch = 0;
    if (*p2 != '.') return std::nullopt;
    auto [p3, ec3] = std::from_chars(p2 + 1, end, patch);
    if (ec3 != std::errc() || p3 != end || patch < 0) return std::nullopt;
  }
  if (v.major < 0 || v.minor < 0) return std::nullopt;
  return v;
}

CudaVersion DefaultCudaForPytorch(PytorchVersion pytorch) {
  CudaVersion cuda = kDefaultCuda.front().cuda;
  for (const DefaultCudaRow& row : kDefaultCuda) {
    if (pytorch >= row.from) cuda = row.cuda;
  }
  return cuda;
}

CudaVersion MinimumCudaFor(GpuArch arch) {
  switch (arch) {
    case GpuArch::kVolta: return kMinimumCudaVolta;
    case GpuArch::kAmpere: return kMinimumCudaAmpere;
    case GpuArch::kHopper: return kMinimumCudaHopper;
  }
  return kMinimumCudaVolta;
}

CudaVersion DefaultCudaFor(PytorchVersion pytorch, GpuArch arch) {
  CudaVersion cuda = DefaultCudaForPytorch(pytorch);
  const CudaVersion minimum = MinimumCudaFor(arch);
  if (cuda >= minimum) return cuda;
  for (const DefaultCudaRow& row : kCuda11Build) {
    if (pytorch >= row.from) cuda = row.cuda;
  }
  // No release before 2.0 built sm_90 kernels: the first toolkit that does stands in (ESTIMATE).
  return cuda >= minimum ? cuda : minimum;
}

bool LazyModuleLoading(PytorchVersion pytorch, CudaVersion cuda) {
  if (cuda < kLazyLoadingCuda) return false;
  return pytorch >= kPytorchSetsLazy || cuda >= kLazyByDefaultCuda;
}

namespace {

const ContextRow& ContextRowOf(CudaVersion cuda, bool lazy) {
  const ContextRow* chosen = nullptr;
  for (const ContextRow& row : kCudaContext) {
    if (row.lazy != lazy || cuda < row.from) continue;
    chosen = &row;
  }
  // Lazy loading exists from CUDA 11.7 only: an eager row covers anything earlier.
  if (chosen == nullptr) return ContextRowOf(cuda, false);
  return *chosen;
}

}  // namespace

int64_t CudaContextBytes(GpuArch /*arch*/, CudaVersion cuda, bool lazy) {
  // CUDA < 10 is not a release any supported PyTorch ships: the first row stands for it.
  if (cuda < kCudaContext.front().from) return kCudaContext.front().bytes;
  return ContextRowOf(cuda, lazy && cuda >= kLazyLoadingCuda).bytes;
}

std::string_view CudaContextSource(CudaVersion cuda, bool lazy) {
  if (cuda < kCudaContext.front().from) return kCudaContext.front().source;
  return ContextRowOf(cuda, lazy && cuda >= kLazyLoadingCuda).source;
}

CublasWorkspace CublasWorkspaceOf(GpuArch arch, PytorchVersion pytorch) {
  if (pytorch < kWorkspaceThroughAllocator) return {kCublasDefaultWorkspace, false};
  if (pytorch < kWorkspaceDefaultsPerArch) return {kCublasWorkspace113, true};
  return {arch == GpuArch::kHopper ? kCublasHopperWorkspace : kCublasDefaultWorkspace, true};
}

bool NcclConnectsAtInit(NcclVersion nccl) { return nccl < kNcclWithRuntimeConnect; }

}  // namespace shardscope::sim

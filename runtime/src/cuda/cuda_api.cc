// The CUDA stack opened at run time (cuda_api.h).
#include "cuda/cuda_api.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <string>
#include <type_traits>

#include <fmt/format.h>

#include "shardscope/base/check.h"

namespace shardscope::runtime::cuda {

namespace {

// Stringifies after expansion: a header may map a name onto a versioned symbol with a macro
// (CUDA 12's cudaGetDeviceProperties -> cudaGetDeviceProperties_v2), and dlsym needs the
// symbol's own name.
#define SHARDSCOPE_CUDA_STR2(x) #x
#define SHARDSCOPE_CUDA_STR(x) SHARDSCOPE_CUDA_STR2(x)

std::atomic<const CudaApi*> g_installed{nullptr};  // what Cuda() returns
std::mutex g_mutex;                                // guards the two below
const CudaApi* g_for_testing = nullptr;
const StatusOr<CudaApi>* g_loaded = nullptr;       // LoadCuda's answer, kept for the process

}  // namespace

StatusOr<void*> OpenCudaLibrary(const char* soname, std::string_view what) {
  void* handle = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  std::string tried = soname;
  std::string why;
  if (handle == nullptr) {
    const char* e = dlerror();
    why = e != nullptr ? e : "not found";
  }
#if defined(SHARDSCOPE_CUDA_LIBRARY_DIR)
  if (handle == nullptr) {
    const std::string path = fmt::format("{}/{}", SHARDSCOPE_CUDA_LIBRARY_DIR, soname);
    handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    tried += ", " + path;
  }
#endif
  if (handle == nullptr) {
    return Status::InvalidInput(fmt::format(
        "--backend cuda needs {} ({}), which this machine does not have: {} (tried {}); install it or add its "
        "directory to LD_LIBRARY_PATH (every other command runs without it)",
        soname, what, why, tried));
  }
  return handle;
}

namespace {

template <typename Fn>
Status Resolve(void* handle, const char* soname, const char* symbol, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(handle, symbol));
  if (fn == nullptr) {
    return Status::InvalidInput(fmt::format(
        "--backend cuda: {} has no symbol {} (an older release than the headers this shardscope was built with)",
        soname, symbol));
  }
  return Status::Ok();
}

StatusOr<CudaApi> OpenAll() {
  const CudaLibraryNames names = CudaLibrarySonames();
  CudaApi api;
  SHARDSCOPE_ASSIGN_OR_RETURN(void* cudart, OpenCudaLibrary(names.cudart, "the CUDA runtime"));
  SHARDSCOPE_ASSIGN_OR_RETURN(void* cublaslt, OpenCudaLibrary(names.cublaslt, "cuBLASLt, for the GEMM proxies"));
  SHARDSCOPE_ASSIGN_OR_RETURN(void* nccl, OpenCudaLibrary(names.nccl, "NCCL, for the collectives"));
  // The handles stay open for the life of the process (the libraries are never unloaded).
#define SHARDSCOPE_RESOLVE_CUDART(fn) \
  SHARDSCOPE_RETURN_IF_ERROR(Resolve(cudart, names.cudart, SHARDSCOPE_CUDA_STR(fn), api.fn));
#define SHARDSCOPE_RESOLVE_CUDART_TYPED(fn, type) \
  static_assert(std::is_same_v<decltype(static_cast<type>(&::fn)), type>); \
  SHARDSCOPE_RETURN_IF_ERROR(Resolve(cudart, names.cudart, SHARDSCOPE_CUDA_STR(fn), api.fn));
#define SHARDSCOPE_RESOLVE_CUBLASLT(fn) \
  SHARDSCOPE_RETURN_IF_ERROR(Resolve(cublaslt, names.cublaslt, SHARDSCOPE_CUDA_STR(fn), api.fn));
#define SHARDSCOPE_RESOLVE_NCCL(fn) \
  SHARDSCOPE_RETURN_IF_ERROR(Resolve(nccl, names.nccl, SHARDSCOPE_CUDA_STR(fn), api.fn));
  SHARDSCOPE_CUDART_ENTRIES(SHARDSCOPE_RESOLVE_CUDART)
  SHARDSCOPE_CUDART_TYPED_ENTRIES(SHARDSCOPE_RESOLVE_CUDART_TYPED)
  SHARDSCOPE_CUBLASLT_ENTRIES(SHARDSCOPE_RESOLVE_CUBLASLT)
  SHARDSCOPE_NCCL_ENTRIES(SHARDSCOPE_RESOLVE_NCCL)
#undef SHARDSCOPE_RESOLVE_CUDART
#undef SHARDSCOPE_RESOLVE_CUDART_TYPED
#undef SHARDSCOPE_RESOLVE_CUBLASLT
#undef SHARDSCOPE_RESOLVE_NCCL
  return api;
}

}  // namespace

CudaLibraryNames CudaLibrarySonames() {
  // CUDART_VERSION is 1000 x major + 10 x minor (cuda_runtime_api.h); cuBLASLt shares the
  // toolkit's major (CUBLAS_VER_MAJOR, cublas_api.h); NCCL's soname is its major
  // (NCCL_MAJOR, nccl.h: libnccl.so.2).
  static const std::string cudart = fmt::format("libcudart.so.{}", CUDART_VERSION / 1000);
  static const std::string cublaslt = fmt::format("libcublasLt.so.{}", CUBLAS_VER_MAJOR);
  static const std::string nccl = fmt::format("libnccl.so.{}", NCCL_MAJOR);
  return {cudart.c_str(), cublaslt.c_str(), nccl.c_str()};
}

Status LoadCuda() {
  std::lock_guard lock(g_mutex);
  if (g_for_testing != nullptr) return Status::Ok();
  // Once per process: the answer, good or bad, is kept (a library does not appear later, and
  // the handles are never closed).
  if (g_loaded == nullptr) g_loaded = new StatusOr<CudaApi>(OpenAll());
  if (!g_loaded->ok()) return g_loaded->status();
  g_installed.store(&g_loaded->value(), std::memory_order_release);
  return Status::Ok();
}

const CudaApi& Cuda() {
  const CudaApi* api = g_installed.load(std::memory_order_acquire);
  SHARDSCOPE_CHECK(api != nullptr, "the CUDA libraries are not loaded (call LoadCuda first)");
  return *api;
}

void SetCudaForTesting(const CudaApi* api) {
  std::lock_guard lock(g_mutex);
  g_for_testing = api;
  const CudaApi* loaded = g_loaded != nullptr && g_loaded->ok() ? &g_loaded->value() : nullptr;
  g_installed.store(api != nullptr ? api : loaded, std::memory_order_release);
}

}  // namespace shardscope::runtime::cuda

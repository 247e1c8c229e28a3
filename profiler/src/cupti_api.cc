// The real CuptiApi, and the probe that decides whether capture can run.
//
// Compiled against the CUPTI headers only when cmake/Cuda.cmake found the toolkit
// (SHARDSCOPE_HAVE_CUPTI). Even then nothing links libcupti or libcuda: both are opened at
// run time (dlopen), so the same binary runs on a machine without a driver, without a GPU or
// without libcupti, and `run --profile` there falls back to the host timeline with a warning
// (ProbeCuptiCapture) instead of failing to load.
#include <fmt/format.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cupti_activity_source.h"
#include "cupti_records.h"
#include "shardscope/profiler/activity.h"

#if defined(SHARDSCOPE_HAVE_CUPTI)
#include <cupti.h>
#include <dlfcn.h>
#endif

namespace shardscope::profiler {

std::string FallbackWarning(const Status& probe) {
  return fmt::format("warning: --profile: {}; writing the host-side timeline only (no device records)",
                     probe.ok() ? std::string("CUPTI capture was not started") : probe.message());
}

#if !defined(SHARDSCOPE_HAVE_CUPTI)

Status ProbeCuptiCapture() {
  return Status::IoError(
      "CUPTI capture unavailable: shardscope was built without CUDA (configure with "
      "-DSHARDSCOPE_CUDA=ON where the CUDA toolkit is installed)");
}

StatusOr<std::unique_ptr<ActivitySource>> CreateCuptiActivitySource(ActivitySink&, const BufferPoolOptions&) {
  return ProbeCuptiCapture();
}

StatusOr<uint32_t> CuptiStreamId(void*) { return ProbeCuptiCapture(); }

int CuptiDlopenAttemptsForTesting() { return 0; }

#else  // SHARDSCOPE_HAVE_CUPTI

namespace {

constexpr const char* kUnavailable = "CUPTI capture unavailable";

// CUPTI's buffer callbacks carry no user data, so the live source is reached through this
// one process-wide pointer (CUPTI's activity state is process-wide anyway). At most one
// source exists at a time (CreateCuptiActivitySource refuses a second).
std::atomic<ActivityBufferCallbacks*> g_callbacks{nullptr};
std::atomic<bool> g_source_alive{false};

void CUPTIAPI OnBufferRequested(uint8_t** buffer, size_t* size, size_t* max_num_records) {
  *max_num_records = 0;  // 0: fill the buffer with as many records as fit
  ActivityBufferCallbacks* callbacks = g_callbacks.load(std::memory_order_acquire);
  *buffer = callbacks != nullptr ? callbacks->RequestBuffer(size) : nullptr;
  if (*buffer == nullptr) *size = 0;
}

void CUPTIAPI OnBufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid_size) {
  ActivityBufferCallbacks* callbacks = g_callbacks.load(std::memory_order_acquire);
  if (callbacks != nullptr) callbacks->CompleteBuffer(buffer, valid_size);
}

// The driver entry points the probe needs (cuda.h); resolved from libcuda.so.1.
using CuInitFn = CUresult (*)(unsigned int);
using CuDeviceGetCountFn = CUresult (*)(int*);

// libcupti's entry points, resolved with dlsym.
struct CuptiLibrary {
  decltype(&::cuptiGetVersion) get_version = nullptr;
  decltype(&::cuptiGetResultString) get_result_string = nullptr;
  decltype(&::cuptiActivityEnable) enable = nullptr;
  decltype(&::cuptiActivityDisable) disable = nullptr;
  decltype(&::cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&::cuptiActivitySetAttribute) set_attribute = nullptr;
  decltype(&::cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&::cuptiActivityGetNumDroppedRecords) get_num_dropped = nullptr;
  decltype(&::cuptiActivityGetNextRecord) get_next_record = nullptr;
  decltype(&::cuptiGetTimestamp) get_timestamp = nullptr;
  decltype(&::cuptiActivityPushExternalCorrelationId) push_external_id = nullptr;
  decltype(&::cuptiActivityPopExternalCorrelationId) pop_external_id = nullptr;
  decltype(&::cuptiGetCallbackName) get_callback_name = nullptr;
  decltype(&::cuptiFinalize) finalize = nullptr;
  decltype(&::cuptiGetStreamIdEx) get_stream_id = nullptr;
};

template <typename Fn>
Status Resolve(void* handle, const char* library, const char* symbol, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(handle, symbol));
  if (fn == nullptr) {
    return Status::IoError(fmt::format("{}: {} has no symbol {}", kUnavailable, library, symbol));
  }
  return Status::Ok();
}

// Process-wide loading state: a library is opened at most once per process (a second
// dlopen would only bump its reference count, but each attempt costs a search of the
// loader's path, and CuptiStreamId runs once per stream). The answers are kept, good or bad.
std::mutex g_load_mutex;
std::atomic<int> g_cupti_dlopen_attempts{0};

// A GPU this process can use: the driver loads, initializes and reports a device.
Status ProbeDriverOnce() {
  // The driver's soname (NVIDIA driver installation guide: libcuda.so.1).
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (cuda == nullptr) {
    const char* why = dlerror();
    return Status::IoError(fmt::format("{}: no NVIDIA driver (libcuda.so.1: {})", kUnavailable,
                                       why != nullptr ? why : "not found"));
  }
  CuInitFn cu_init = nullptr;
  CuDeviceGetCountFn cu_device_get_count = nullptr;
  SHARDSCOPE_RETURN_IF_ERROR(Resolve(cuda, "libcuda.so.1", "cuInit", cu_init));
  SHARDSCOPE_RETURN_IF_ERROR(Resolve(cuda, "libcuda.so.1", "cuDeviceGetCount", cu_device_get_count));
  // The driver stays loaded: it is never unloaded once initialized.
  if (const CUresult result = cu_init(0); result != CUDA_SUCCESS) {
    return Status::IoError(fmt::format("{}: cuInit(0) failed with CUDA error {} (no usable GPU)", kUnavailable,
                                       static_cast<int>(result)));
  }
  int devices = 0;
  if (const CUresult result = cu_device_get_count(&devices); result != CUDA_SUCCESS || devices == 0) {
    return Status::IoError(fmt::format("{}: no CUDA device (cuDeviceGetCount: error {}, {} devices)", kUnavailable,
                                       static_cast<int>(result), devices));
  }
  return Status::Ok();
}

Status ProbeDriver() {
  std::lock_guard lock(g_load_mutex);
  static const Status* probed = new Status(ProbeDriverOnce());
  return *probed;
}

// libcupti, loaded once: the records a library writes follow its own version, read through
// CuptiRecordLayoutFor (cupti_records.h).
struct LoadedCupti {
  CuptiLibrary lib;
  CuptiRecordLayout layout;
  std::string soname;
};

// libcupti of CUDA 13 (the headers' major) or 12, each first as the loader finds it, then
// from the toolkit we were built against.
StatusOr<LoadedCupti> LoadCuptiOnce() {
  g_cupti_dlopen_attempts.fetch_add(1);
  std::string tried, why;
  void* handle = nullptr;
  LoadedCupti loaded;
  for (const char* soname : {"libcupti.so.13", "libcupti.so.12"}) {
    std::vector<std::string> paths = {soname};
#if defined(SHARDSCOPE_CUPTI_LIBRARY_DIR)
    paths.push_back(fmt::format("{}/{}", SHARDSCOPE_CUPTI_LIBRARY_DIR, soname));
#endif
    for (const std::string& path : paths) {
      handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      tried += (tried.empty() ? "" : ", ") + path;
      if (handle != nullptr) break;
      if (const char* e = dlerror(); e != nullptr && why.empty()) why = e;
    }
    if (handle != nullptr) {
      loaded.soname = soname;
      break;
    }
  }
  if (handle == nullptr) {
    return Status::IoError(fmt::format("{}: libcupti not found (tried {}: {})", kUnavailable, tried,
                                       why.empty() ? "not found" : why));
  }
  CuptiLibrary& lib = loaded.lib;
  const char* name = loaded.soname.c_str();
  SHARDSCOPE_RETURN_IF_ERROR(Resolve(handle, name, "cuptiGetVersion", lib.get_version));
  SHARDSCOPE_RETURN_IF_ERROR(Resolve(handle, name, "cuptiGetResultString", lib.get_result_string));
  SHARDSCOPE_RETURN_IF_ERROR(Resolve(handle, name, "cuptiActivityEnable", lib.enable));
  SHARDSCOPE_RETURN_IF_ERROR(Resolve(handle, name, "cuptiActivityDisable", lib.disable));
  SHARDSCOPE_RETURN_IF_ERROR(Resolve(handle, name, "cuptiActivityRegisterCallbacks", lib.register_callbacks));
  SHARDSCOPE_RETURN_IF_ERROR(Resolve(handle, name, "cuptiActivitySetAttribute", lib.set_attribute));
  SHARDSCOPE_RETURN_IF_ERROR(Resolve(handle, name, "cuptiActivityFlushAll", lib.flush_all));
  SHARDSCOPE_RETURN_IF_ERROR(Resolve(handle, name, "cuptiActivityGetNumDroppedRecords", lib.get_num_dropped));
  SHARDSCOPE_RETURN_IF_ERROR(Resolve(handle, name, "cuptiActivityGetNextRecord", lib.get_next_record));
  SHARDSCOPE_RETURN_IF_ERROR(Resolve(handle, name, "cuptiGetTimestamp", lib.get_timestamp));
  SHARDSCOPE_RETURN_IF_ERROR(
      Resolve(handle, name, "cuptiActivityPushExternalCorrelationId", lib.push_external_id));
  SHARDSCOPE_RETURN_IF_ERROR(Resolve(handle, name, "cuptiActivityPopExternalCorrelationId", lib.pop_external_id));
  SHARDSCOPE_RETURN_IF_ERROR(Resolve(handle, name, "cuptiGetCallbackName", lib.get_callback_name));
  SHARDSCOPE_RETURN_IF_ERROR(Resolve(handle, name, "cuptiFinalize", lib.finalize));
  SHARDSCOPE_RETURN_IF_ERROR(Resolve(handle, name, "cuptiGetStreamIdEx", lib.get_stream_id));
  uint32_t version = 0;
  if (lib.get_version(&version) != CUPTI_SUCCESS) {
    return Status::IoError(fmt::format("{}: cuptiGetVersion failed", kUnavailable));
  }
  // The records are read in the layout this library writes (CUDA 12.0 and newer).
  StatusOr<CuptiRecordLayout> layout = CuptiRecordLayoutFor(version);
  if (!layout.ok()) return Status::IoError(fmt::format("{}: {}", kUnavailable, layout.status().message()));
  loaded.layout = *layout;
  return loaded;
}

StatusOr<const LoadedCupti*> LoadCupti() {
  std::lock_guard lock(g_load_mutex);
  static const StatusOr<LoadedCupti>* loaded = new StatusOr<LoadedCupti>(LoadCuptiOnce());
  if (!loaded->ok()) return loaded->status();
  return &loaded->value();
}

CUpti_ActivityKind ToCupti(ActivityKind kind) {
  switch (kind) {
    case ActivityKind::kConcurrentKernel: return CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
    case ActivityKind::kMemcpy: return CUPTI_ACTIVITY_KIND_MEMCPY;
    case ActivityKind::kMemset: return CUPTI_ACTIVITY_KIND_MEMSET;
    case ActivityKind::kSynchronization: return CUPTI_ACTIVITY_KIND_SYNCHRONIZATION;
    case ActivityKind::kRuntime: return CUPTI_ACTIVITY_KIND_RUNTIME;
    case ActivityKind::kDriver: return CUPTI_ACTIVITY_KIND_DRIVER;
    case ActivityKind::kExternalCorrelation: return CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
    case ActivityKind::kOverhead: return CUPTI_ACTIVITY_KIND_OVERHEAD;
  }
  return CUPTI_ACTIVITY_KIND_INVALID;
}

class RealCuptiApi final : public CuptiApi {
 public:
  explicit RealCuptiApi(const LoadedCupti& loaded) : lib_(loaded.lib), layout_(loaded.layout) {}
  ~RealCuptiApi() override {
    g_callbacks.store(nullptr, std::memory_order_release);
    g_source_alive.store(false, std::memory_order_release);
  }

  Status EnableKind(ActivityKind kind) override {
    return Check(lib_.enable(ToCupti(kind)), "cuptiActivityEnable", __LINE__);
  }
  Status DisableKind(ActivityKind kind) override {
    return Check(lib_.disable(ToCupti(kind)), "cuptiActivityDisable", __LINE__);
  }
  Status RegisterCallbacks(ActivityBufferCallbacks* callbacks) override {
    // Our pool hands out zeroed buffers, so CUPTI need not zero them on the issuing thread.
    uint8_t zeroed = 1;
    size_t value_size = sizeof(zeroed);
    SHARDSCOPE_RETURN_IF_ERROR(Check(
        lib_.set_attribute(CUPTI_ACTIVITY_ATTR_ZEROED_OUT_ACTIVITY_BUFFER, &value_size, &zeroed),
        "cuptiActivitySetAttribute(ZEROED_OUT_ACTIVITY_BUFFER)", __LINE__));
    g_callbacks.store(callbacks, std::memory_order_release);
    return Check(lib_.register_callbacks(OnBufferRequested, OnBufferCompleted), "cuptiActivityRegisterCallbacks",
                 __LINE__);
  }
  Status FlushAll(bool forced) override {
    return Check(lib_.flush_all(forced ? CUPTI_ACTIVITY_FLAG_FLUSH_FORCED : 0), "cuptiActivityFlushAll", __LINE__);
  }
  int64_t TakeDroppedRecords() override {
    size_t dropped = 0;
    // Context NULL: the global queue (all buffers are global since CUDA 6.0, cupti_activity.h).
    if (lib_.get_num_dropped(nullptr, 0, &dropped) != CUPTI_SUCCESS) return 0;
    return static_cast<int64_t>(dropped);
  }
  Status Decode(const uint8_t* buffer, size_t valid_bytes, std::vector<ActivityRecord>& out) override;
  int64_t Timestamp() override {
    uint64_t now = 0;
    lib_.get_timestamp(&now);
    return static_cast<int64_t>(now);
  }
  // Results are not checked on the issuing path: a failed push shows up downstream as
  // records without an op id (ActivityCollector's unmatched count).
  void PushExternalId(uint64_t id) override {
    lib_.push_external_id(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, id);
  }
  void PopExternalId() override {
    uint64_t last = 0;
    lib_.pop_external_id(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &last);
  }
  Status Finalize() override {
    Status status = Check(lib_.finalize(), "cuptiFinalize", __LINE__);
    g_callbacks.store(nullptr, std::memory_order_release);
    return status;
  }

 private:
  Status Check(CUptiResult result, const char* call, int line) const {
    if (result == CUPTI_SUCCESS) return Status::Ok();
    const char* text = nullptr;
    if (lib_.get_result_string(result, &text) != CUPTI_SUCCESS) text = nullptr;
    return Status::Internal(fmt::format("{} failed: {} (CUPTI error {}) at {}:{}", call,
                                        text != nullptr ? text : "unknown error", static_cast<int>(result),
                                        __FILE__, line));
  }
  const std::string& ApiName(CUpti_CallbackDomain domain, uint32_t cbid) {
    auto [it, inserted] = api_names_.try_emplace({static_cast<int>(domain), cbid});
    if (inserted) {
      const char* name = nullptr;
      if (lib_.get_callback_name(domain, cbid, &name) == CUPTI_SUCCESS && name != nullptr) {
        it->second = std::string(StripApiVersionSuffix(name));
      } else {
        it->second = fmt::format("{} cbid {}", domain == CUPTI_CB_DOMAIN_DRIVER_API ? "driver" : "runtime", cbid);
      }
    }
    return it->second;
  }

  const CuptiLibrary& lib_;
  const CuptiRecordLayout layout_;
  std::map<std::pair<int, uint32_t>, std::string> api_names_;  // filled at decode time only
};

Status RealCuptiApi::Decode(const uint8_t* buffer, size_t valid_bytes, std::vector<ActivityRecord>& out) {
  if (buffer == nullptr || valid_bytes == 0) return Status::Ok();
  auto* data = const_cast<uint8_t*>(buffer);  // CUPTI's iterator takes a non-const buffer
  CUpti_Activity* record = nullptr;
  const CuptiApiNamer namer = [this](bool driver, uint32_t cbid) -> const std::string& {
    return ApiName(driver ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API, cbid);
  };
  while (true) {
    const CUptiResult result = lib_.get_next_record(data, valid_bytes, &record);
    if (result == CUPTI_ERROR_MAX_LIMIT_REACHED) return Status::Ok();  // end of the buffer
    SHARDSCOPE_RETURN_IF_ERROR(Check(result, "cuptiActivityGetNextRecord", __LINE__));
    DecodeCuptiRecord(record, layout_, namer, out);
  }
}

}  // namespace

Status ProbeCuptiCapture() {
  SHARDSCOPE_RETURN_IF_ERROR(ProbeDriver());
  return LoadCupti().status();
}

int CuptiDlopenAttemptsForTesting() { return g_cupti_dlopen_attempts.load(); }

StatusOr<std::unique_ptr<ActivitySource>> CreateCuptiActivitySource(ActivitySink& sink,
                                                                    const BufferPoolOptions& options) {
  SHARDSCOPE_RETURN_IF_ERROR(ProbeDriver());
  SHARDSCOPE_ASSIGN_OR_RETURN(const LoadedCupti* loaded, LoadCupti());
  SHARDSCOPE_ASSIGN_OR_RETURN(std::unique_ptr<ActivityBufferPool> pool, ActivityBufferPool::Create(options));
  if (g_source_alive.exchange(true, std::memory_order_acq_rel)) {
    return Status::Internal("a CUPTI activity source is already alive in this process (CUPTI is process-wide)");
  }
  return std::unique_ptr<ActivitySource>(
      std::make_unique<CuptiActivitySource>(std::make_unique<RealCuptiApi>(*loaded), std::move(pool), sink));
}

StatusOr<uint32_t> CuptiStreamId(void* cuda_stream) {
  SHARDSCOPE_ASSIGN_OR_RETURN(const LoadedCupti* loaded, LoadCupti());
  const CuptiLibrary& lib = loaded->lib;
  uint32_t id = 0;
  // Context NULL: "typically this parameter should be null" (cupti_activity.h,
  // cuptiGetStreamIdEx); perThreadStream 0: the runtime creates explicit streams.
  const CUptiResult result = lib.get_stream_id(nullptr, static_cast<CUstream>(cuda_stream), 0, &id);
  if (result != CUPTI_SUCCESS) {
    const char* text = nullptr;
    if (lib.get_result_string(result, &text) != CUPTI_SUCCESS) text = nullptr;
    return Status::Internal(fmt::format("cuptiGetStreamIdEx failed: {} (CUPTI error {})",
                                        text != nullptr ? text : "unknown error", static_cast<int>(result)));
  }
  return id;
}

#endif  // SHARDSCOPE_HAVE_CUPTI

}  // namespace shardscope::profiler

// Activity records captured on a GPU, and the sources that deliver them.
//
// These are our own plain records mirroring the fields shardscope needs from CUPTI's
// activity records (cupti_activity.h, CUDA 13: CUpti_ActivityKernel10, CUpti_ActivityMemcpy6,
// CUpti_ActivityMemset4, CUpti_ActivitySynchronization2, CUpti_ActivityAPI,
// CUpti_ActivityExternalCorrelation, CUpti_ActivityOverhead3). No CUDA or CUPTI header is
// included here (Kineto keeps CUPTI out of its public includes too): everything that turns
// records into a timeline, and the tests, build on a machine without the toolkit.
//
// Capture (the Kineto CuptiActivityApi model):
//
//   SHARDSCOPE_RETURN_IF_ERROR(ProbeCuptiCapture());          // else: host timeline only
//   SHARDSCOPE_ASSIGN_OR_RETURN(auto source, CreateCuptiActivitySource(collector, {}));
//   SHARDSCOPE_RETURN_IF_ERROR(source->Enable(kDefaultActivityKinds));
//   ... for every op: source->PushOpId(op.id); issue it; source->PopOpId(); ...
//   SHARDSCOPE_RETURN_IF_ERROR(source->Flush());              // between steps: recycles buffers
//   ... cudaDeviceSynchronize() ...
//   SHARDSCOPE_RETURN_IF_ERROR(source->Finalize());           // forced flush, detach CUPTI
//
// Every record batch goes to an ActivitySink (collector.h's ActivityCollector is one).
// Timestamps are the source's clock (CUPTI: ns, see Timestamp()); clock_alignment.h maps
// them onto the host clock.
#ifndef SHARDSCOPE_PROFILER_ACTIVITY_H_
#define SHARDSCOPE_PROFILER_ACTIVITY_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "shardscope/base/status.h"

namespace shardscope::profiler {

// The activity kinds shardscope enables; CUPTI's CUpti_ActivityKind value in comments
// (cupti_activity.h). CUPTI_ACTIVITY_KIND_KERNEL (3) is deliberately absent: its documentation
// says that kind "may significantly change the overall performance characteristics of the
// application because all kernel executions are serialized on the GPU"; CONCURRENT_KERNEL
// "doesn't break kernel concurrency". Overlap of compute and communication is what we
// measure, so serializing kernels would measure something else.
enum class ActivityKind : uint8_t {
  kConcurrentKernel,     // CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL = 10
  kMemcpy,               // CUPTI_ACTIVITY_KIND_MEMCPY = 1
  kMemset,               // CUPTI_ACTIVITY_KIND_MEMSET = 2
  kSynchronization,      // CUPTI_ACTIVITY_KIND_SYNCHRONIZATION = 38
  kRuntime,              // CUPTI_ACTIVITY_KIND_RUNTIME = 5
  kDriver,               // CUPTI_ACTIVITY_KIND_DRIVER = 4
  kExternalCorrelation,  // CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION = 39
  kOverhead,             // CUPTI_ACTIVITY_KIND_OVERHEAD = 17
};
inline constexpr int kNumActivityKinds = 8;
// What Kineto enables for a GPU trace (CuptiActivityApi::enableCuptiActivities with the
// default activity set), and what `run --profile` enables.
inline constexpr std::array<ActivityKind, kNumActivityKinds> kDefaultActivityKinds = {
    ActivityKind::kConcurrentKernel, ActivityKind::kMemcpy,  ActivityKind::kMemset,
    ActivityKind::kSynchronization,  ActivityKind::kRuntime, ActivityKind::kDriver,
    ActivityKind::kExternalCorrelation, ActivityKind::kOverhead};
// "concurrent_kernel", "memcpy", "memset", "synchronization", "runtime", "driver",
// "external_correlation", "overhead" (the JSON "kind" of capture files).
std::string_view ActivityKindName(ActivityKind kind);
std::optional<ActivityKind> ParseActivityKind(std::string_view name);

// A kernel as it ran (CUpti_ActivityKernel10). Times in the source's clock, ns.
struct KernelRecord {
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  uint32_t device = 0;
  uint32_t context = 0;
  uint32_t stream = 0;         // CUPTI's stream id (not a cudaStream_t)
  uint32_t correlation = 0;    // the launching runtime/driver call's correlation id
  std::string name;            // as CUPTI reports it (mangled for C++ kernels)
  std::array<int32_t, 3> grid = {0, 0, 0};
  std::array<int32_t, 3> block = {0, 0, 0};
  int32_t registers_per_thread = 0;
  int32_t static_shared_memory = 0;   // bytes per block
  int32_t dynamic_shared_memory = 0;  // bytes per block
  bool operator==(const KernelRecord&) const = default;
};

// CUpti_ActivityMemcpyKind, reduced to what a schedule issues (the others map to kOther).
enum class MemcpyDirection : uint8_t {
  kUnknown,         // CUPTI_ACTIVITY_MEMCPY_KIND_UNKNOWN = 0
  kHostToDevice,    // HTOD = 1
  kDeviceToHost,    // DTOH = 2
  kDeviceToDevice,  // DTOD = 8
  kHostToHost,      // HTOH = 9
  kPeerToPeer,      // PTOP = 10
  kOther,           // array copies (3..7)
};
std::string_view MemcpyDirectionName(MemcpyDirection direction);  // "HtoD", "DtoH", ... (Kineto)
std::optional<MemcpyDirection> ParseMemcpyDirection(std::string_view name);

// CUpti_ActivityMemoryKind, reduced.
enum class MemoryKind : uint8_t { kUnknown, kPageable, kPinned, kDevice, kArray, kManaged };
std::string_view MemoryKindName(MemoryKind kind);  // "Unknown", "Pageable", "Pinned", ...
std::optional<MemoryKind> ParseMemoryKind(std::string_view name);

struct MemcpyRecord {
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  MemcpyDirection direction = MemcpyDirection::kUnknown;
  MemoryKind src_memory = MemoryKind::kUnknown;
  MemoryKind dst_memory = MemoryKind::kUnknown;
  int64_t bytes = 0;
  uint32_t device = 0;
  uint32_t context = 0;
  uint32_t stream = 0;
  uint32_t correlation = 0;
  bool operator==(const MemcpyRecord&) const = default;
};

struct MemsetRecord {
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  int64_t bytes = 0;
  uint32_t value = 0;
  MemoryKind memory = MemoryKind::kUnknown;
  uint32_t device = 0;
  uint32_t context = 0;
  uint32_t stream = 0;
  uint32_t correlation = 0;
  bool operator==(const MemsetRecord&) const = default;
};

// CUpti_ActivitySynchronizationType.
enum class SyncType : uint8_t {
  kUnknown,             // 0
  kEventSynchronize,    // 1: cudaEventSynchronize
  kStreamWaitEvent,     // 2: cudaStreamWaitEvent
  kStreamSynchronize,   // 3: cudaStreamSynchronize
  kContextSynchronize,  // 4: cudaDeviceSynchronize / cuCtxSynchronize
};
// Display names "Event Sync", "Stream Wait Event", "Stream Sync", "Context Sync", "Unknown
// Sync", after Kineto's syncTypeString (CuptiActivity.cpp; the exact strings not confirmed in
// source). The JSON names are snake_case
// ("event_synchronize", ...), see SyncTypeJsonName.
std::string_view SyncTypeName(SyncType type);
std::string_view SyncTypeJsonName(SyncType type);
std::optional<SyncType> ParseSyncType(std::string_view json_name);

// A host-side wait (CUpti_ActivitySynchronization2): start/end bracket the blocking call.
struct SynchronizationRecord {
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  SyncType type = SyncType::kUnknown;
  uint32_t context = 0;
  std::optional<uint32_t> stream;  // absent: CUPTI_SYNCHRONIZATION_INVALID_VALUE
  std::optional<uint32_t> event;   // cudaEventId, absent when not applicable
  uint32_t correlation = 0;
  bool operator==(const SynchronizationRecord&) const = default;
};

// A CUDA runtime or driver API call (CUpti_ActivityAPI, kinds RUNTIME and DRIVER).
enum class ApiDomain : uint8_t { kRuntime, kDriver };
struct ApiRecord {
  ApiDomain domain = ApiDomain::kRuntime;
  uint32_t cbid = 0;          // CUpti_runtime_api_trace_cbid / CUpti_driver_api_trace_cbid
  std::string name;           // "cudaLaunchKernel" (version suffix stripped, as Kineto shows it)
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  uint32_t process_id = 0;
  uint32_t thread_id = 0;     // OS thread id of the caller
  uint32_t correlation = 0;
  bool operator==(const ApiRecord&) const = default;
};

// CUpti_ExternalCorrelationKind: shardscope pushes op ids as CUSTOM0, as Kineto does for its
// CPU ops (CuptiActivityApi::pushCorrelationID, CorrelationFlowType::Default).
enum class ExternalKind : uint8_t { kUnknown, kOpenAcc, kCustom0, kCustom1, kCustom2 };
std::string_view ExternalKindName(ExternalKind kind);  // "unknown", "openacc", "custom0", ...
std::optional<ExternalKind> ParseExternalKind(std::string_view name);

// CUPTI emits one for every API call made while an external id is pushed on the calling
// thread: it ties that call's correlation id (and so every kernel, copy and sync it caused)
// to the external id — for us, the schedule op id.
struct ExternalCorrelationRecord {
  ExternalKind kind = ExternalKind::kCustom0;
  uint64_t external_id = 0;
  uint32_t correlation = 0;
  bool operator==(const ExternalCorrelationRecord&) const = default;
};

// Time CUPTI itself spent (CUpti_ActivityOverhead3): buffer flushes, instrumentation,
// resource allocation. Kept to attribute measurement overhead, never matched to ops.
struct OverheadRecord {
  std::string kind;  // "CUPTI Buffer Flush", "CUPTI Instrumentation", ... (Kineto's names)
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  uint32_t correlation = 0;  // 0: CUPTI_CORRELATION_ID_UNKNOWN
  bool operator==(const OverheadRecord&) const = default;
};

using ActivityRecord = std::variant<KernelRecord, MemcpyRecord, MemsetRecord, SynchronizationRecord,
                                    ApiRecord, ExternalCorrelationRecord, OverheadRecord>;
ActivityKind KindOf(const ActivityRecord& record);

// "cudaLaunchKernel_v7000" -> "cudaLaunchKernel": cuptiGetCallbackName returns versioned
// names; Kineto's traces show them without the suffix. Other names are returned unchanged.
std::string_view StripApiVersionSuffix(std::string_view name);

// Receives record batches as the source decodes them (in the source's delivery order, which
// is not time order: CUPTI fills buffers per thread and per device).
class ActivitySink {
 public:
  virtual ~ActivitySink() = default;
  virtual void OnActivities(std::span<const ActivityRecord> batch) = 0;
};

// What a source did, for the run report and the <= 2% overhead / zero-drop checks.
struct ActivitySourceStats {
  std::array<int64_t, kNumActivityKinds> records_by_kind = {};  // delivered, by ActivityKind
  int64_t dropped_records = 0;     // records CUPTI could not store (cuptiActivityGetNumDroppedRecords)
  int64_t buffers_requested = 0;   // CUPTI asked for a buffer
  int64_t buffers_refused = 0;     // ... and the pool was empty (records then get dropped)
  int64_t buffers_completed = 0;
  int64_t buffer_high_water = 0;   // most buffers held by CUPTI or awaiting Flush at once
  int64_t flushes = 0;
  bool operator==(const ActivitySourceStats&) const = default;
};

// A producer of activity records. One per process; not thread-safe except Push/PopOpId,
// which are called on the issuing thread while CUPTI's own threads complete buffers.
class ActivitySource {
 public:
  virtual ~ActivitySource() = default;
  // Starts collecting these kinds. Fails (naming the kind) if the backend refuses one.
  virtual Status Enable(std::span<const ActivityKind> kinds) = 0;
  // Delivers every completed buffer's records to the sink and returns the buffers to the
  // pool. Call it between steps: it decodes and allocates, so never inside a timed region.
  virtual Status Flush() = 0;
  // Forces out partially filled buffers (CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), delivers them,
  // disables the kinds and detaches (cuptiFinalize). The caller must have synchronized the
  // device first (cupti_activity.h, cuptiFinalize). Idempotent.
  virtual Status Finalize() = 0;
  // Now, in the clock of the records (CUPTI: cuptiGetTimestamp), for clock alignment.
  virtual int64_t Timestamp() const = 0;
  virtual int64_t DroppedRecords() const = 0;
  virtual ActivitySourceStats Stats() const = 0;
  // Tie every API call issued on this thread until PopOpId to `op_id` (external
  // correlation, CUSTOM0). Pushes nest; never allocates.
  virtual void PushOpId(int64_t op_id) = 0;
  virtual void PopOpId() = 0;
};

// The pre-allocated buffer pool CUPTI fills. Kineto's defaults: 4 MiB per buffer
// (CuptiActivityApi.cpp kBufSize: "CUPTI recommends between 1MB to 10MB") and at most
// 128 MiB in all (activitiesMaxGpuBufferSize default, Config.cpp) = 32 buffers.
struct BufferPoolOptions {
  int64_t buffer_bytes = int64_t{4} << 20;
  int32_t buffer_count = 32;
};

// Whether CUPTI can be loaded in this process: Ok, or an error saying why not (built without
// CUDA, no driver (libcuda.so.1), no device, no libcupti of CUDA 13 or 12, or one older than
// CUDA 12.0). Loading is not initializing: whether capture runs is decided by creating the
// source and enabling its kinds, which initializes CUPTI (`run --profile` does exactly that
// before the run, on every rank, and agrees on the outcome). The driver and libcupti are
// opened once per process, whoever asks. Never aborts; safe to call on any machine.
Status ProbeCuptiCapture();
// "warning: --profile: <reason>; writing the host-side timeline only (no device records)".
std::string FallbackWarning(const Status& probe);

// The CUPTI-backed source (cupti_activity_source.cc), with its buffer pool allocated now.
// Fails as ProbeCuptiCapture does where capture cannot run, and if another CUPTI source is
// alive in this process (CUPTI's buffer callbacks are process-wide and carry no user data).
StatusOr<std::unique_ptr<ActivitySource>> CreateCuptiActivitySource(ActivitySink& sink,
                                                                    const BufferPoolOptions& options);

// CUPTI's id of a CUDA stream (cuptiGetStreamIdEx), the `stream` field of the device
// records launched on it: the runtime hands over the cudaStream_t handles it created (as
// void*, no CUDA header here) and the caller builds CollectorOptions::stream_map from the
// answers. The stream's device must be current. Fails as ProbeCuptiCapture does where CUPTI
// cannot load (always, in a build without CUDA).
StatusOr<uint32_t> CuptiStreamId(void* cuda_stream);

// Callables for the runtime's OpHooks {before_issue(op_id), after_issue(op_id)}
// (runtime/include/shardscope/runtime/op_hooks.h; profiler does not depend on runtime):
// before_issue pushes the op id as CUPTI's external correlation id, after_issue pops it, so
// every runtime/driver call the op makes — and through their correlation ids every kernel,
// copy and sync — maps to the op exactly. The source must outlive the callables.
struct OpIssueCallbacks {
  std::function<void(int64_t)> before_issue;
  std::function<void(int64_t)> after_issue;
};
OpIssueCallbacks MakeOpIssueCallbacks(ActivitySource& source);

}  // namespace shardscope::profiler

#endif  // SHARDSCOPE_PROFILER_ACTIVITY_H_

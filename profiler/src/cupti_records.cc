// Decoding CUPTI activity records by the loaded library's version (cupti_records.h).
#include "cupti_records.h"

#if defined(SHARDSCOPE_HAVE_CUPTI)

#include <cstddef>
#include <utility>

#include <fmt/format.h>

namespace shardscope::profiler {

namespace {

// The newest record versions these headers declare, through which every version is read.
#if CUPTI_API_VERSION >= 130000
using KernelRecordT = CUpti_ActivityKernel10;
#else
using KernelRecordT = CUpti_ActivityKernel9;
#endif
#if CUPTI_API_VERSION >= 26
using MemcpyRecordT = CUpti_ActivityMemcpy6;
using SyncRecordT = CUpti_ActivitySynchronization2;
#else
using MemcpyRecordT = CUpti_ActivityMemcpy5;
using SyncRecordT = CUpti_ActivitySynchronization;
#endif
using OverheadRecordT = CUpti_ActivityOverhead3;

// The older versions a CUDA 12 libcupti writes put every field we read where the newer ones
// do (same offset, same size): one decode serves both.
#define SHARDSCOPE_SAME_FIELD(Old, New, field)                                               \
  static_assert(offsetof(Old, field) == offsetof(New, field) && sizeof(Old::field) == sizeof(New::field), \
                #Old "::" #field " moved in " #New)
SHARDSCOPE_SAME_FIELD(CUpti_ActivityKernel9, KernelRecordT, start);
SHARDSCOPE_SAME_FIELD(CUpti_ActivityKernel9, KernelRecordT, end);
SHARDSCOPE_SAME_FIELD(CUpti_ActivityKernel9, KernelRecordT, deviceId);
SHARDSCOPE_SAME_FIELD(CUpti_ActivityKernel9, KernelRecordT, contextId);
SHARDSCOPE_SAME_FIELD(CUpti_ActivityKernel9, KernelRecordT, streamId);
SHARDSCOPE_SAME_FIELD(CUpti_ActivityKernel9, KernelRecordT, correlationId);
SHARDSCOPE_SAME_FIELD(CUpti_ActivityKernel9, KernelRecordT, name);
SHARDSCOPE_SAME_FIELD(CUpti_ActivityKernel9, KernelRecordT, gridX);
SHARDSCOPE_SAME_FIELD(CUpti_ActivityKernel9, KernelRecordT, gridY);
SHARDSCOPE_SAME_FIELD(CUpti_ActivityKernel9, KernelRecordT, gridZ);
SHARDSCOPE_SAME_FIELD(CUpti_ActivityKernel9, KernelRecordT, blockX);
SHARDSCOPE_SAME_FIELD(CUpti_ActivityKernel9, KernelRecordT, blockY);
SHARDSCOPE_SAME_FIELD(CUpti_ActivityKernel9, KernelRecordT, blockZ);
SHARDSCOPE_SAME_FIELD(CUpti_ActivityKernel9, KernelRecordT, registersPerThread);
SHARDSCOPE_SAME_FIELD(CUpti_ActivityKernel9, KernelRecordT, staticSharedMemory);
SHARDSCOPE_SAME_FIELD(CUpti_ActivityKernel9, KernelRecordT, dynamicSharedMemory);
SHARDSCOPE_SAME_FIELD(CUpti_ActivityMemcpy5, MemcpyRecordT, copyKind);
SHARDSCOPE_SAME_FIELD(CUpti_ActivityMemcpy5, MemcpyRecordT, srcKind);
SHARDSCOPE_SAME_FIELD(CUpti_ActivityMemcpy5, MemcpyRecordT, dstKind);
SHARDSCOPE_SAME_FIELD(CUpti_ActivityMemcpy5, MemcpyRecordT, bytes);
SHARDSCOPE_SAME_FIELD(CUpti_ActivityMemcpy5, MemcpyRecordT, start);
SHARDSCOPE_SAME_FIELD(CUpti_ActivityMemcpy5, MemcpyRecordT, end);
SHARDSCOPE_SAME_FIELD(CUpti_ActivityMemcpy5, MemcpyRecordT, deviceId);
SHARDSCOPE_SAME_FIELD(CUpti_ActivityMemcpy5, MemcpyRecordT, contextId);
SHARDSCOPE_SAME_FIELD(CUpti_ActivityMemcpy5, MemcpyRecordT, streamId);
SHARDSCOPE_SAME_FIELD(CUpti_ActivityMemcpy5, MemcpyRecordT, correlationId);
SHARDSCOPE_SAME_FIELD(CUpti_ActivitySynchronization, SyncRecordT, type);
SHARDSCOPE_SAME_FIELD(CUpti_ActivitySynchronization, SyncRecordT, start);
SHARDSCOPE_SAME_FIELD(CUpti_ActivitySynchronization, SyncRecordT, end);
SHARDSCOPE_SAME_FIELD(CUpti_ActivitySynchronization, SyncRecordT, correlationId);
SHARDSCOPE_SAME_FIELD(CUpti_ActivitySynchronization, SyncRecordT, contextId);
SHARDSCOPE_SAME_FIELD(CUpti_ActivitySynchronization, SyncRecordT, streamId);
SHARDSCOPE_SAME_FIELD(CUpti_ActivitySynchronization, SyncRecordT, cudaEventId);
SHARDSCOPE_SAME_FIELD(CUpti_ActivityOverhead, OverheadRecordT, overheadKind);
SHARDSCOPE_SAME_FIELD(CUpti_ActivityOverhead, OverheadRecordT, start);
SHARDSCOPE_SAME_FIELD(CUpti_ActivityOverhead, OverheadRecordT, end);
#undef SHARDSCOPE_SAME_FIELD
// CUpti_ActivityOverhead ends where Overhead3's correlationId begins: never read it there.
static_assert(sizeof(CUpti_ActivityOverhead) <= offsetof(OverheadRecordT, correlationId));

MemcpyDirection FromCuptiCopyKind(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_UNKNOWN: return MemcpyDirection::kUnknown;
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return MemcpyDirection::kHostToDevice;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return MemcpyDirection::kDeviceToHost;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return MemcpyDirection::kDeviceToDevice;
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return MemcpyDirection::kHostToHost;
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return MemcpyDirection::kPeerToPeer;
    default: return MemcpyDirection::kOther;
  }
}

MemoryKind FromCuptiMemoryKind(uint32_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE: return MemoryKind::kPageable;
    case CUPTI_ACTIVITY_MEMORY_KIND_PINNED: return MemoryKind::kPinned;
    case CUPTI_ACTIVITY_MEMORY_KIND_DEVICE:
    case CUPTI_ACTIVITY_MEMORY_KIND_DEVICE_STATIC: return MemoryKind::kDevice;
    case CUPTI_ACTIVITY_MEMORY_KIND_ARRAY: return MemoryKind::kArray;
    case CUPTI_ACTIVITY_MEMORY_KIND_MANAGED:
    case CUPTI_ACTIVITY_MEMORY_KIND_MANAGED_STATIC: return MemoryKind::kManaged;
    default: return MemoryKind::kUnknown;
  }
}

SyncType FromCuptiSyncType(CUpti_ActivitySynchronizationType type) {
  switch (type) {
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE: return SyncType::kEventSynchronize;
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT: return SyncType::kStreamWaitEvent;
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE: return SyncType::kStreamSynchronize;
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE: return SyncType::kContextSynchronize;
    default: return SyncType::kUnknown;
  }
}

ExternalKind FromCuptiExternalKind(CUpti_ExternalCorrelationKind kind) {
  switch (kind) {
    case CUPTI_EXTERNAL_CORRELATION_KIND_OPENACC: return ExternalKind::kOpenAcc;
    case CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0: return ExternalKind::kCustom0;
    case CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM1: return ExternalKind::kCustom1;
    case CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2: return ExternalKind::kCustom2;
    default: return ExternalKind::kUnknown;
  }
}

// CUpti_ActivityOverheadKind (cupti_activity.h), named after the enumerators.
std::string OverheadKindName(CUpti_ActivityOverheadKind kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_OVERHEAD_DRIVER_COMPILER: return "Driver Compiler";
    case CUPTI_ACTIVITY_OVERHEAD_CUPTI_BUFFER_FLUSH: return "CUPTI Buffer Flush";
    case CUPTI_ACTIVITY_OVERHEAD_CUPTI_INSTRUMENTATION: return "CUPTI Instrumentation";
    case CUPTI_ACTIVITY_OVERHEAD_CUPTI_RESOURCE: return "CUPTI Resource";
    case CUPTI_ACTIVITY_OVERHEAD_RUNTIME_TRIGGERED_MODULE_LOADING: return "Runtime Triggered Module Loading";
    case CUPTI_ACTIVITY_OVERHEAD_LAZY_FUNCTION_LOADING: return "Lazy Function Loading";
    case CUPTI_ACTIVITY_OVERHEAD_COMMAND_BUFFER_FULL: return "Command Buffer Full";
    case CUPTI_ACTIVITY_OVERHEAD_ACTIVITY_BUFFER_REQUEST: return "Activity Buffer Request";
    default: return "Unknown Overhead";
  }
}

int64_t Ns(uint64_t cupti_ns) { return static_cast<int64_t>(cupti_ns); }

}  // namespace

StatusOr<CuptiRecordLayout> CuptiRecordLayoutFor(uint32_t api_version) {
  if (api_version < kOldestCuptiApiVersion) {
    return Status::InvalidInput(fmt::format(
        "libcupti API version {} is older than CUDA 12.0's ({}): its activity records are not read by this build",
        api_version, kOldestCuptiApiVersion));
  }
  CuptiRecordLayout layout;
  layout.api_version = api_version;
  layout.overhead_has_correlation = api_version >= kCuptiOverheadCorrelationVersion;
  return layout;
}

void DecodeCuptiRecord(const CUpti_Activity* record, const CuptiRecordLayout& layout, const CuptiApiNamer& api_name,
                       std::vector<ActivityRecord>& out) {
  switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto* k = reinterpret_cast<const KernelRecordT*>(record);
      KernelRecord r;
      r.start_ns = Ns(k->start);
      r.end_ns = Ns(k->end);
      r.device = k->deviceId;
      r.context = k->contextId;
      r.stream = k->streamId;
      r.correlation = k->correlationId;
      r.name = k->name != nullptr ? k->name : "";
      r.grid = {k->gridX, k->gridY, k->gridZ};
      r.block = {k->blockX, k->blockY, k->blockZ};
      r.registers_per_thread = k->registersPerThread;
      r.static_shared_memory = k->staticSharedMemory;
      r.dynamic_shared_memory = k->dynamicSharedMemory;
      out.emplace_back(std::move(r));
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto* m = reinterpret_cast<const MemcpyRecordT*>(record);
      MemcpyRecord r;
      r.start_ns = Ns(m->start);
      r.end_ns = Ns(m->end);
      r.direction = FromCuptiCopyKind(m->copyKind);
      r.src_memory = FromCuptiMemoryKind(m->srcKind);
      r.dst_memory = FromCuptiMemoryKind(m->dstKind);
      r.bytes = static_cast<int64_t>(m->bytes);
      r.device = m->deviceId;
      r.context = m->contextId;
      r.stream = m->streamId;
      r.correlation = m->correlationId;
      out.emplace_back(r);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
      MemsetRecord r;
      r.start_ns = Ns(m->start);
      r.end_ns = Ns(m->end);
      r.bytes = static_cast<int64_t>(m->bytes);
      r.value = m->value;
      r.memory = FromCuptiMemoryKind(m->memoryKind);
      r.device = m->deviceId;
      r.context = m->contextId;
      r.stream = m->streamId;
      r.correlation = m->correlationId;
      out.emplace_back(r);
      break;
    }
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
      const auto* s = reinterpret_cast<const SyncRecordT*>(record);
      SynchronizationRecord r;
      r.start_ns = Ns(s->start);
      r.end_ns = Ns(s->end);
      r.type = FromCuptiSyncType(s->type);
      r.context = s->contextId;
      if (s->streamId != CUPTI_SYNCHRONIZATION_INVALID_VALUE) r.stream = s->streamId;
      if (s->cudaEventId != CUPTI_SYNCHRONIZATION_INVALID_VALUE) r.event = s->cudaEventId;
      r.correlation = s->correlationId;
      out.emplace_back(r);
      break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: {
      const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
      const bool driver = record->kind == CUPTI_ACTIVITY_KIND_DRIVER;
      ApiRecord r;
      r.domain = driver ? ApiDomain::kDriver : ApiDomain::kRuntime;
      r.cbid = a->cbid;
      r.name = api_name(driver, a->cbid);
      r.start_ns = Ns(a->start);
      r.end_ns = Ns(a->end);
      r.process_id = a->processId;
      r.thread_id = a->threadId;
      r.correlation = a->correlationId;
      out.emplace_back(std::move(r));
      break;
    }
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
      const auto* e = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(record);
      out.emplace_back(ExternalCorrelationRecord{FromCuptiExternalKind(e->externalKind), e->externalId,
                                                 e->correlationId});
      break;
    }
    case CUPTI_ACTIVITY_KIND_OVERHEAD: {
      const auto* o = reinterpret_cast<const OverheadRecordT*>(record);
      // CUpti_ActivityOverhead (libcupti before CUDA 12.6) ends before correlationId.
      const uint32_t correlation = layout.overhead_has_correlation ? o->correlationId : 0;
      out.emplace_back(OverheadRecord{OverheadKindName(o->overheadKind), Ns(o->start), Ns(o->end), correlation});
      break;
    }
    default:
      break;  // a kind we did not enable: nothing to map (Kineto counts these too)
  }
}

}  // namespace shardscope::profiler

#endif  // SHARDSCOPE_HAVE_CUPTI

#include "shardscope/profiler/activity.h"

#include <cctype>

namespace shardscope::profiler {
namespace {

template <typename Enum, size_t N>
std::optional<Enum> ParseByName(std::string_view name, const std::array<std::string_view, N>& names) {
  for (size_t i = 0; i < N; ++i) {
    if (names[i] == name) return static_cast<Enum>(i);
  }
  return std::nullopt;
}

constexpr std::array<std::string_view, kNumActivityKinds> kActivityKindNames = {
    "concurrent_kernel", "memcpy", "memset", "synchronization", "runtime", "driver", "external_correlation",
    "overhead"};
constexpr std::array<std::string_view, 7> kMemcpyDirectionNames = {"Unknown", "HtoD", "DtoH", "DtoD",
                                                                   "HtoH",    "PtoP", "Other"};
constexpr std::array<std::string_view, 6> kMemoryKindNames = {"Unknown", "Pageable", "Pinned",
                                                              "Device",  "Array",    "Managed"};
constexpr std::array<std::string_view, 5> kSyncTypeNames = {"Unknown Sync", "Event Sync", "Stream Wait Event",
                                                            "Stream Sync", "Context Sync"};
constexpr std::array<std::string_view, 5> kSyncTypeJsonNames = {
    "unknown", "event_synchronize", "stream_wait_event", "stream_synchronize", "context_synchronize"};
constexpr std::array<std::string_view, 5> kExternalKindNames = {"unknown", "openacc", "custom0", "custom1",
                                                                "custom2"};

}  // namespace

std::string_view ActivityKindName(ActivityKind kind) { return kActivityKindNames[static_cast<size_t>(kind)]; }
std::optional<ActivityKind> ParseActivityKind(std::string_view name) {
  return ParseByName<ActivityKind>(name, kActivityKindNames);
}
std::string_view MemcpyDirectionName(MemcpyDirection direction) {
  return kMemcpyDirectionNames[static_cast<size_t>(direction)];
}
std::optional<MemcpyDirection> ParseMemcpyDirection(std::string_view name) {
  return ParseByName<MemcpyDirection>(name, kMemcpyDirectionNames);
}
std::string_view MemoryKindName(MemoryKind kind) { return kMemoryKindNames[static_cast<size_t>(kind)]; }
std::optional<MemoryKind> ParseMemoryKind(std::string_view name) {
  return ParseByName<MemoryKind>(name, kMemoryKindNames);
}
std::string_view SyncTypeName(SyncType type) { return kSyncTypeNames[static_cast<size_t>(type)]; }
std::string_view SyncTypeJsonName(SyncType type) { return kSyncTypeJsonNames[static_cast<size_t>(type)]; }
std::optional<SyncType> ParseSyncType(std::string_view json_name) {
  return ParseByName<SyncType>(json_name, kSyncTypeJsonNames);
}
std::string_view ExternalKindName(ExternalKind kind) { return kExternalKindNames[static_cast<size_t>(kind)]; }
std::optional<ExternalKind> ParseExternalKind(std::string_view name) {
  return ParseByName<ExternalKind>(name, kExternalKindNames);
}

ActivityKind KindOf(const ActivityRecord& record) {
  struct Visitor {
    ActivityKind operator()(const KernelRecord&) const { return ActivityKind::kConcurrentKernel; }
    ActivityKind operator()(const MemcpyRecord&) const { return ActivityKind::kMemcpy; }
    ActivityKind operator()(const MemsetRecord&) const { return ActivityKind::kMemset; }
    ActivityKind operator()(const SynchronizationRecord&) const { return ActivityKind::kSynchronization; }
    ActivityKind operator()(const ApiRecord& api) const {
      return api.domain == ApiDomain::kDriver ? ActivityKind::kDriver : ActivityKind::kRuntime;
    }
    ActivityKind operator()(const ExternalCorrelationRecord&) const { return ActivityKind::kExternalCorrelation; }
    ActivityKind operator()(const OverheadRecord&) const { return ActivityKind::kOverhead; }
  };
  return std::visit(Visitor{}, record);
}

std::string_view StripApiVersionSuffix(std::string_view name) {
  // "_v" followed by one or more digits, at the very end.
  const size_t pos = name.rfind("_v");
  if (pos == std::string_view::npos || pos + 2 == name.size()) return name;
  for (size_t i = pos + 2; i < name.size(); ++i) {
    if (std::isdigit(static_cast<unsigned char>(name[i])) == 0) return name;
  }
  return name.substr(0, pos);
}

}  // namespace shardscope::profiler

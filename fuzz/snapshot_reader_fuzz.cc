// libFuzzer target for memory snapshots: bytes -> pickle -> snapshot -> replay through the
// allocator model -> both reports. Any input must give a snapshot and a verdict or a Status,
// never crash, hang or throw.
//
//   fuzz/snapshot_reader_fuzz fuzz/corpus/snapshot -max_total_time=60
// Crashing inputs are kept under tests/regressions/snapshot/.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "shardscope/analysis/memory_snapshot.h"

namespace {
// A bounded replay: enough to reach every rule, small enough to stay fast.
constexpr size_t kMaxActions = 4096;
constexpr size_t kMaxSegments = 256;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardscope;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto doc = sim::ParseMemorySnapshotPickle(bytes, "fuzz.pickle");
  if (!doc.ok()) {
    if (doc.status().message().empty()) __builtin_trap();
    return 0;
  }
  auto snapshot = sim::ReadMemorySnapshot((*doc)->root(), "fuzz.pickle");
  if (!snapshot.ok()) {
    if (snapshot.status().message().empty()) __builtin_trap();
    return 0;
  }
  if (snapshot->trace.size() > kMaxActions || snapshot->segments.size() > kMaxSegments) return 0;
  auto replay = sim::ReplaySnapshot(*snapshot, {});
  if (!replay.ok()) {
    if (replay.status().message().empty()) __builtin_trap();
    return 0;
  }
  // A divergence always says where and what.
  if (!replay->exact && (!replay->first_divergence || replay->first_divergence->what.empty())) __builtin_trap();
  const std::string text = sim::SnapshotReplayText(*snapshot, *replay, "fuzz.pickle");
  const std::string json = sim::SnapshotReplayJson(*snapshot, *replay, "fuzz.pickle");
  if (text.empty() || json.empty()) __builtin_trap();
  return 0;
}

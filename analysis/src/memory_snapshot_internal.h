// Private to analysis/: what the files of memory-snapshot replay share (memory_snapshot.cc:
// the start state and the replay; memory_snapshot_read.cc: reading the pickle;
// memory_snapshot_report.cc: the JSON and text reports).
#ifndef SHARDSCOPE_ANALYSIS_SRC_MEMORY_SNAPSHOT_INTERNAL_H_
#define SHARDSCOPE_ANALYSIS_SRC_MEMORY_SNAPSHOT_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "shardscope/analysis/memory_snapshot.h"

namespace shardscope::sim::snapshot_internal {

// c10/cuda/CUDACachingAllocator.cpp constants the reconstruction relies on.
inline constexpr int64_t kSmallSize = 1 * kMiB;    // largest request of the small pool
inline constexpr int64_t kSmallBuffer = 2 * kMiB;  // the small pool's segment size
// "No limit" when nothing in the trace bounds the device: more than any GPU holds, small
// enough that sums of segment sizes stay far from overflowing.
inline constexpr int64_t kUnlimitedCapacity = int64_t{1} << 56;
// The allocation-trace format's stream limit (alloc_trace.cc kMaxStreams).
inline constexpr size_t kMaxStreams = 1024;

// "device_traces[0][12]": where in the snapshot an action is, for messages.
std::string Where(int32_t device, int64_t index);
// "alloc 0x7f00 (512 B, stream 0)", for messages and reports.
std::string Describe(const std::string& action, uint64_t address, int64_t size, int64_t stream);
// The position of `stream` in the sorted list of a snapshot's streams.
int32_t StreamIndex(const std::vector<int64_t>& streams, int64_t stream);

}  // namespace shardscope::sim::snapshot_internal

#endif  // SHARDSCOPE_ANALYSIS_SRC_MEMORY_SNAPSHOT_INTERNAL_H_

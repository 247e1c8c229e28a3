// The host timeline's records (host_timeline.h) without MPI: what a rank records per issued
// op and how the records travel to rank 0 (kSliceFields int64 each), so the runtime core and
// its tests include them without mpi.h.
#ifndef SHARDSCOPE_RUNTIME_SRC_HOST_TIMELINE_SLICES_H_
#define SHARDSCOPE_RUNTIME_SRC_HOST_TIMELINE_SLICES_H_

#include <cstdint>
#include <vector>

namespace shardscope::runtime {

// One slice: tid 0 = host thread, 1 + stream index. op_index indexes the rank's program ops;
// seq is the collective's per-communicator sequence number (-1: not a collective slice).
struct SliceRecord {
  int64_t tid = 0, op_index = 0, start_ns = 0, end_ns = 0, step = 0, seq = -1;
};
inline constexpr int kSliceFields = 6;

// Every rank's slices, flattened, in rank order (rank 0 only after GatherTimelineSlices).
struct TimelineSlices {
  std::vector<int64_t> values;   // kSliceFields per slice
  std::vector<int> counts;       // values per rank
};

// Appends `slices` to `flat` (kSliceFields values each).
void AppendFlattened(const std::vector<SliceRecord>& slices, std::vector<int64_t>& flat);

}  // namespace shardscope::runtime

#endif  // SHARDSCOPE_RUNTIME_SRC_HOST_TIMELINE_SLICES_H_

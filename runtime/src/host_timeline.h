// The host-side timeline both backends write (DIR/host_timeline.json): one slice per issued
// op on the rank's host thread (tid 0), and, where the backend knows when a stream ran an op
// (the host backend's stream threads), one slice on tid 1 + stream. Tracks and names are
// sim's TraceRecorder's (pid = rank "rank N", tid 0 "host thread", tid 1 + s "stream s
// <name>"), so `shardscope diff` matches the slices to a prediction by op id.
//
// Each rank records SliceRecords; they travel to rank 0 flattened (kSliceFields int64 each),
// by MPI_Gatherv or, when one process runs every rank, by concatenation; rank 0 writes.
#ifndef SHARDSCOPE_RUNTIME_SRC_HOST_TIMELINE_H_
#define SHARDSCOPE_RUNTIME_SRC_HOST_TIMELINE_H_

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "host_timeline_slices.h"
#include "shardscope/traces/schedule.h"
#include "shardscope/base/status.h"

namespace shardscope::runtime {

// Collective over `comm` (every rank calls it): rank 0 of `comm` receives every rank's flat
// slices. A rank's share is truncated to whole slices below 2^28 values (MPI int counts).
StatusOr<TimelineSlices> GatherTimelineSlices(MPI_Comm comm, std::vector<int64_t> flat);

// Writes the timeline (Chrome trace JSON, traces::ChromeTraceWriter) for ranks
// 0..counts.size()-1 of `schedule`. `producer` names the backend ("shardscope X run
// --backend host"); `backend` is the communication backend label ("mpi", "nccl").
Status WriteHostTimeline(const std::string& path, const traces::Schedule& schedule, const TimelineSlices& slices,
                         const std::string& producer, const std::string& backend);

}  // namespace shardscope::runtime

#endif  // SHARDSCOPE_RUNTIME_SRC_HOST_TIMELINE_H_

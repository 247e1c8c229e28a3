// A human-readable listing of one rank's program: one line per op with its phase, micro-batch,
// module, stream, and what it does (kernels with their shapes, collectives with group and
// bytes, waits, host syncs, allocations and frees). For reviewing a lowering against the
// framework source, and for golden files a reviewer can read.
#ifndef SHARDSCOPE_TRACES_LISTING_H_
#define SHARDSCOPE_TRACES_LISTING_H_

#include <cstdint>
#include <string>

#include "shardscope/traces/schedule.h"

namespace shardscope::traces {

// Requires ValidateSchedule(schedule) to pass and 0 <= rank < world_size.
std::string ScheduleListing(const Schedule& schedule, int32_t rank);

}  // namespace shardscope::traces

#endif  // SHARDSCOPE_TRACES_LISTING_H_

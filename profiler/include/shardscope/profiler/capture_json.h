// The JSON form of one rank's capture: its activity records and what the collector needs
// beside them (stream map, clock samples, dropped count). Test fixtures are written by hand
// in it (tests/fixtures/cupti/), and `run --profile` can keep the raw capture next to the
// timeline (DIR/cupti/rank_<r>.json) so a conversion can be re-run without the GPU.
//
//   {
//     "version": 1,
//     "rank": 0,
//     "dropped_records": 0,
//     "stream_map": [{"cuda_stream": 7, "stream": 0}],     // CUPTI stream id -> schedule stream index
//     "clock_samples": [{"cupti_ns": 1000, "host_ns": 5000}],
//     "records": [
//       {"kind": "external_correlation", "external_kind": "custom0", "external_id": 4, "correlation": 11},
//       {"kind": "runtime", "cbid": 211, "name": "cudaLaunchKernel", "start": 100, "end": 104,
//        "process_id": 1, "thread_id": 1, "correlation": 11},
//       {"kind": "concurrent_kernel", "name": "gemm", "start": 110, "end": 150, "stream": 7,
//        "correlation": 11, "device": 0, "context": 1, "grid": [80, 1, 1], "block": [256, 1, 1],
//        "registers_per_thread": 32, "static_shared_memory": 0, "dynamic_shared_memory": 0},
//       {"kind": "memcpy", "copy_kind": "HtoD", "src_memory": "Pinned", "dst_memory": "Device",
//        "bytes": 4096, "start": 1, "end": 2, "stream": 7, "correlation": 12},
//       {"kind": "memset", "bytes": 64, "value": 0, "memory": "Device", "start": 1, "end": 2,
//        "stream": 7, "correlation": 13},
//       {"kind": "synchronization", "type": "stream_synchronize", "start": 1, "end": 2,
//        "stream": 7, "event": 3, "correlation": 14},
//       {"kind": "driver", ...as runtime...},
//       {"kind": "overhead", "overhead_kind": "CUPTI Buffer Flush", "start": 1, "end": 2}
//     ]
//   }
//
// Required per record: kind; start and end (all but external_correlation); correlation (all
// but overhead); stream (kernel, memcpy, memset); name (kernel, runtime, driver); type
// (synchronization); external_id (external_correlation). Other fields default to 0 /
// "Unknown" / absent. Unknown keys are errors. Times are CUPTI ns; ids are unsigned 32-bit
// except external_id (unsigned 64-bit). Errors name the source and the JSON path:
//   rank0.json: /records/3/stream: expected an unsigned 32-bit integer, got -1
#ifndef SHARDSCOPE_PROFILER_CAPTURE_JSON_H_
#define SHARDSCOPE_PROFILER_CAPTURE_JSON_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "shardscope/profiler/activity.h"
#include "shardscope/profiler/clock_alignment.h"
#include "shardscope/base/status.h"

namespace shardscope::profiler {

inline constexpr int kActivityCaptureVersion = 1;

struct ActivityCapture {
  int32_t rank = 0;
  int64_t dropped_records = 0;
  std::map<uint32_t, int32_t> stream_map;
  std::vector<ClockSample> clock_samples;  // source = CUPTI, target = host
  std::vector<ActivityRecord> records;
  bool operator==(const ActivityCapture&) const = default;
};

StatusOr<ActivityCapture> ParseActivityCaptureJson(std::string_view text, const std::string& source);
StatusOr<ActivityCapture> ReadActivityCaptureFile(const std::string& path);
// Fixed key order, one record per line; parsing it gives an equal capture.
std::string ActivityCaptureToJson(const ActivityCapture& capture);
// Written under a temporary name and renamed into place.
Status WriteActivityCaptureFile(const ActivityCapture& capture, const std::string& path);

}  // namespace shardscope::profiler

#endif  // SHARDSCOPE_PROFILER_CAPTURE_JSON_H_

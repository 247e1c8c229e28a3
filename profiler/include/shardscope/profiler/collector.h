// ActivityCollector: activity records of one rank -> the measured timeline, on the tracks of
// the predicted one.
//
// Tracks are sim's TraceRecorder's (sim/report/src/report.cc): pid = rank ("rank N"), tid 0 =
// the host thread that issues the schedule's ops, tid 1 + s = schedule stream s ("stream s
// <name>"). CUPTI stream ids are mapped to schedule streams by CollectorOptions::stream_map
// (the runtime created the streams and knows the pairs). What has no place there still gets
// a track after those, never dropped: a CUDA stream missing from the map ("cuda stream N (not
// in the schedule)"), other OS threads' API calls ("thread T"), CUPTI's own overhead.
//
// Op ids are exact: a device record's correlation id is its launching API call's, and the
// EXTERNAL_CORRELATION record of that call carries the op id pushed around the issue
// (ActivitySource::PushOpId). Records that reach no op (no external id, or an id that is not
// an op of this rank's program) are kept with op_id -1 and an "unmatched" arg saying why.
//
// Categories and names are Kineto's (CuptiActivity.cpp): kernel (the demangled kernel
// name), gpu_memcpy ("Memcpy HtoD (Pinned -> Device)"), gpu_memset ("Memset (Device)"),
// cuda_runtime / cuda_driver (API name), cuda_sync ("Stream Sync", ...; on the stream's track
// when it names one, else on the calling host thread). Kernels of a collective op carry its
// CollectiveInfo (communicator name, per-communicator Seq counted as the simulator counts it:
// collectives per communicator from 0, send/recv per (communicator, sender, receiver)).
// Every device record launched by a recorded API call gets an "ac2g" flow from that call,
// as in the predicted trace (flow id = rank << 32 | correlation).
//
// Output is sorted, so the same records in any delivery order give the same timeline.
#ifndef SHARDSCOPE_PROFILER_COLLECTOR_H_
#define SHARDSCOPE_PROFILER_COLLECTOR_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "shardscope/profiler/activity.h"
#include "shardscope/profiler/clock_alignment.h"
#include "shardscope/traces/schedule.h"
#include "shardscope/base/status.h"
#include "shardscope/traces/timeline.h"

namespace shardscope::profiler {

struct CollectorOptions {
  int32_t rank = 0;
  // CUPTI stream id -> index into the rank's Program::streams.
  std::map<uint32_t, int32_t> stream_map;
  // CUPTI timestamps -> timeline timestamps (the host clock of the host timeline, shifted
  // onto rank 0's clock). Identity by default.
  LinearClockMap clock;
  // Steps executed before the first captured one (warm-up): Seq continues from them.
  int64_t first_step = 0;
  // The OS thread that issued the ops; unset: the thread of most op-matched API calls.
  std::optional<uint32_t> host_thread_id;
};

struct CollectorReport {
  std::array<int64_t, kNumActivityKinds> records_by_kind = {};
  int64_t unmatched_device_records = 0;  // kernels, copies, memsets with no op
  int64_t unmatched_api_records = 0;     // runtime/driver calls with no op
  int64_t unknown_op_ids = 0;            // external ids that are not ops of the program
  int64_t unmapped_stream_records = 0;   // device records on a CUDA stream not in stream_map
  int64_t conflicting_correlations = 0;  // a correlation id given two op ids (the smaller kept)
  int64_t flows = 0;
  int64_t dropped_records = 0;           // from the source (SetDroppedRecords)
  bool operator==(const CollectorReport&) const = default;
};

class ActivityCollector final : public ActivitySink {
 public:
  // Fails if the rank is not in the schedule or a stream index is not in its program.
  static StatusOr<std::unique_ptr<ActivityCollector>> Create(const traces::Schedule& schedule,
                                                             CollectorOptions options);

  void OnActivities(std::span<const ActivityRecord> batch) override;
  // The source's dropped-record count, carried into the report (never silently lost).
  void SetDroppedRecords(int64_t dropped) { dropped_records_ = dropped; }
  const std::vector<ActivityRecord>& records() const { return records_; }

  // Writes the process, thread and every record's slice and flow into `sink`.
  CollectorReport WriteTimeline(traces::TimelineSink& sink) const;

 private:
  ActivityCollector(const traces::Schedule& schedule, CollectorOptions options);

  const traces::Schedule& schedule_;
  CollectorOptions options_;
  std::vector<ActivityRecord> records_;
  int64_t dropped_records_ = 0;
};

// A readable kernel name: Itanium-demangled when it is mangled ("_Z..."), else unchanged.
std::string DemangleKernelName(const std::string& name);

}  // namespace shardscope::profiler

#endif  // SHARDSCOPE_PROFILER_COLLECTOR_H_

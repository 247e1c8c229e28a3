// Clock alignment: CUPTI's timestamps onto the host clock of a rank, and each rank's host
// clock onto rank 0's.
//
// Within a rank: CUPTI timestamps (cuptiGetTimestamp, ns) and the host clock the runtime's
// host timeline uses are read in pairs (ClockSample) at capture start and end. FitClockMap
// fits target = target_anchor + (source - source_anchor) * rate through them (least squares;
// exact through two samples), so a drift between the two clocks is corrected linearly, not
// only their offset. Kineto instead assumes one offset (CUPTI's timestamps and
// system_clock, its ApproximateClock / getTimeOffset path) — fine for one process, not for
// comparing ranks to a prediction to the microsecond.
//
// Across ranks: NTP's offset estimate (RFC 5905, section 8) from ping-pong samples with rank
// 0: t0 local send, t1 rank 0's receive/reply time (its clock), t2 local receive;
// offset = ((t1 - t0) + (t1 - t2)) / 2 is rank 0's clock minus ours, exact when both legs
// take equal time, and in error by at most half the round trip otherwise — so the sample
// with the smallest round trip is used (NTP's clock filter keeps the minimum-delay sample).
// MeasureClockOffset runs the exchange over callables (testable without MPI);
// SyncClockToRankZeroOverMpi (mpi_clock_sync.cc) is the MPI transport.
#ifndef SHARDSCOPE_PROFILER_CLOCK_ALIGNMENT_H_
#define SHARDSCOPE_PROFILER_CLOCK_ALIGNMENT_H_

#include <cstdint>
#include <functional>
#include <span>

#include "shardscope/base/status.h"

namespace shardscope::profiler {

// One simultaneous reading of two clocks (in practice: read back to back).
struct ClockSample {
  int64_t source_ns = 0;  // the clock being mapped (CUPTI)
  int64_t target_ns = 0;  // the clock mapped onto (host)
  bool operator==(const ClockSample&) const = default;
};

// target = target_anchor_ns + round((source - source_anchor_ns) * rate). Anchored so that
// the double only ever holds a difference (absolute ns since the epoch exceed 2^53).
struct LinearClockMap {
  int64_t source_anchor_ns = 0;
  int64_t target_anchor_ns = 0;
  double rate = 1.0;
  int64_t Map(int64_t source_ns) const;
  // The same map followed by adding `offset_ns` (e.g. the offset to rank 0's clock).
  LinearClockMap Shifted(int64_t offset_ns) const;
  bool operator==(const LinearClockMap&) const = default;
};

// Two clocks that both count ns drift by parts per million (crystal tolerance); a fitted rate
// further than this from 1 means the samples are wrong (mixed clocks, swapped pairs).
// estimate: 1000 ppm, an order of magnitude above common oscillator tolerances.
inline constexpr double kMaxClockRateDeviation = 1e-3;

// One sample: the offset only (rate 1). Two or more: least squares. Errors: no samples, all
// samples at one source time, or a rate outside 1 +- kMaxClockRateDeviation (naming it).
StatusOr<LinearClockMap> FitClockMap(std::span<const ClockSample> samples);

// One ping-pong exchange with the reference rank.
struct PingPongSample {
  int64_t t0_ns = 0;  // local clock, request sent
  int64_t t1_ns = 0;  // reference clock, request received and answered
  int64_t t2_ns = 0;  // local clock, answer received
  bool operator==(const PingPongSample&) const = default;
};

struct ClockOffsetEstimate {
  int64_t offset_ns = 0;      // reference clock - local clock (add it to local times)
  int64_t round_trip_ns = 0;  // of the sample used; |error| <= round_trip_ns / 2
  int32_t sample_index = -1;  // which sample (the first of equal minimum round trips)
  bool operator==(const ClockOffsetEstimate&) const = default;
};

// The minimum-round-trip sample's offset ((t1 - t0) + (t1 - t2)) / 2, rounded toward zero.
// Errors: no samples, or a sample with t2 < t0 (naming its index).
StatusOr<ClockOffsetEstimate> EstimateClockOffset(std::span<const PingPongSample> samples);

// The exchange, over callables: `now_ns` reads the local clock; `ping_reference` sends one
// request to the reference and returns its reply time t1 (reference clock).
struct ClockSyncTransport {
  std::function<int64_t()> now_ns;
  std::function<StatusOr<int64_t>()> ping_reference;
};
// `rounds` (>= 1) exchanges, then EstimateClockOffset.
StatusOr<ClockOffsetEstimate> MeasureClockOffset(const ClockSyncTransport& transport, int32_t rounds);

// Collective over MPI_COMM_WORLD (MPI must be initialized; every rank calls it): each rank > 0
// runs `rounds` ping-pongs with rank 0, which answers with `now_ns()`. Returns this rank's
// offset to rank 0 (rank 0: zero). Fails if shardscope was built without MPI.
// Recommended: 16 rounds, at a quiet point (before the first step).
StatusOr<ClockOffsetEstimate> SyncClockToRankZeroOverMpi(int32_t rounds, const std::function<int64_t()>& now_ns);

}  // namespace shardscope::profiler

#endif  // SHARDSCOPE_PROFILER_CLOCK_ALIGNMENT_H_

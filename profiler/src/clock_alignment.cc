#include "shardscope/profiler/clock_alignment.h"

#include <fmt/format.h>

#include <cmath>
#include <vector>

namespace shardscope::profiler {

int64_t LinearClockMap::Map(int64_t source_ns) const {
  const double delta = static_cast<double>(source_ns - source_anchor_ns) * rate;
  return target_anchor_ns + std::llround(delta);
}

LinearClockMap LinearClockMap::Shifted(int64_t offset_ns) const {
  LinearClockMap shifted = *this;
  shifted.target_anchor_ns += offset_ns;
  return shifted;
}

StatusOr<LinearClockMap> FitClockMap(std::span<const ClockSample> samples) {
  if (samples.empty()) return Status::InvalidInput("clock alignment: no (CUPTI, host) clock samples");
  LinearClockMap map;
  map.source_anchor_ns = samples[0].source_ns;
  map.target_anchor_ns = samples[0].target_ns;
  if (samples.size() == 1) return map;
  // Least squares over differences from the first sample (small numbers, exact in a double).
  const double n = static_cast<double>(samples.size());
  double mean_x = 0, mean_y = 0;
  for (const ClockSample& s : samples) {
    mean_x += static_cast<double>(s.source_ns - samples[0].source_ns);
    mean_y += static_cast<double>(s.target_ns - samples[0].target_ns);
  }
  mean_x /= n;
  mean_y /= n;
  double sxx = 0, sxy = 0;
  for (const ClockSample& s : samples) {
    const double dx = static_cast<double>(s.source_ns - samples[0].source_ns) - mean_x;
    const double dy = static_cast<double>(s.target_ns - samples[0].target_ns) - mean_y;
    sxx += dx * dx;
    sxy += dx * dy;
  }
  if (sxx == 0) {
    return Status::InvalidInput(fmt::format(
        "clock alignment: all {} clock samples were taken at the same CUPTI time {} ns", samples.size(),
        samples[0].source_ns));
  }
  map.rate = sxy / sxx;
  if (std::abs(map.rate - 1.0) > kMaxClockRateDeviation) {
    return Status::InvalidInput(fmt::format(
        "clock alignment: the host clock advances {:.6f} ns per CUPTI ns over the samples; expected "
        "within {} of 1 (samples of different clocks?)",
        map.rate, kMaxClockRateDeviation));
  }
  // The fitted line passes through the means: y = mean_y + rate * (x - mean_x); at x = 0
  // (the first sample's source time) it is mean_y - rate * mean_x.
  map.target_anchor_ns = samples[0].target_ns + std::llround(mean_y - map.rate * mean_x);
  return map;
}

StatusOr<ClockOffsetEstimate> EstimateClockOffset(std::span<const PingPongSample> samples) {
  if (samples.empty()) return Status::InvalidInput("clock offset: no ping-pong samples");
  ClockOffsetEstimate best;
  for (size_t i = 0; i < samples.size(); ++i) {
    const PingPongSample& s = samples[i];
    if (s.t2_ns < s.t0_ns) {
      return Status::InvalidInput(fmt::format(
          "clock offset: sample {} was answered before it was sent (t0 {} ns, t2 {} ns)", i, s.t0_ns, s.t2_ns));
    }
    const int64_t round_trip = s.t2_ns - s.t0_ns;
    if (best.sample_index < 0 || round_trip < best.round_trip_ns) {
      best.sample_index = static_cast<int32_t>(i);
      best.round_trip_ns = round_trip;
      best.offset_ns = ((s.t1_ns - s.t0_ns) + (s.t1_ns - s.t2_ns)) / 2;
    }
  }
  return best;
}

StatusOr<ClockOffsetEstimate> MeasureClockOffset(const ClockSyncTransport& transport, int32_t rounds) {
  if (rounds < 1) return Status::InvalidInput(fmt::format("clock offset: expected at least 1 round, got {}", rounds));
  std::vector<PingPongSample> samples;
  samples.reserve(static_cast<size_t>(rounds));
  for (int32_t round = 0; round < rounds; ++round) {
    PingPongSample sample;
    sample.t0_ns = transport.now_ns();
    SHARDSCOPE_ASSIGN_OR_RETURN(sample.t1_ns, transport.ping_reference());
    sample.t2_ns = transport.now_ns();
    samples.push_back(sample);
  }
  return EstimateClockOffset(samples);
}

}  // namespace shardscope::profiler

// Steps of a diff side: finding them, cutting a side to one, and choosing which (diff.h,
// SelectDiffStep; docs/DIFF.md "Steps").
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "diff_internal.h"

namespace shardscope::traces {
namespace {

// The runtime's and the CUPTI collector's per-slice step (runtime/src/host_timeline.cc,
// profiler/src/collector.cc: "step").
constexpr std::string_view kStepArg = "step";
// torch.profiler.profile.step() names its record_function "ProfilerStep#<n>".
constexpr std::string_view kProfilerStepPrefix = "ProfilerStep#";

std::optional<int64_t> StepArg(const Slice& slice) {
  for (const Arg& arg : slice.args) {
    if (arg.key != kStepArg) continue;
    if (const auto* value = std::get_if<int64_t>(&arg.value)) return *value;
  }
  return std::nullopt;
}

std::optional<int64_t> ProfilerStepNumber(const Slice& slice) {
  if (diff_internal::IsDeviceCategory(slice.category)) return std::nullopt;
  if (!std::string_view(slice.name).starts_with(kProfilerStepPrefix)) return std::nullopt;
  const std::string_view digits = std::string_view(slice.name).substr(kProfilerStepPrefix.size());
  if (digits.empty() || digits.size() > 18) return std::nullopt;
  int64_t n = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + (c - '0');
  }
  return n;
}

bool HasStepArgs(const DiffSide& side) {
  for (const Timeline& file : side.files) {
    for (const Slice& slice : file.slices) {
      if (StepArg(slice)) return true;
    }
  }
  return false;
}

// Steps by number: each the longest of its ranks' windows.
std::map<int64_t, int64_t> StepDurations(const std::vector<TraceStepSpan>& spans) {
  std::map<int64_t, int64_t> out;
  for (const TraceStepSpan& s : spans) out[s.step] = std::max(out[s.step], s.end_ns - s.begin_ns);
  return out;
}

// The median step of `durations` restricted to steps >= `first`: sorted by (duration, step),
// the lower middle one.
std::optional<int64_t> MedianStep(const std::map<int64_t, int64_t>& durations, int64_t first) {
  std::vector<std::pair<int64_t, int64_t>> order;  // (duration, step)
  for (const auto& [step, duration] : durations) {
    if (step >= first) order.emplace_back(duration, step);
  }
  if (order.empty()) return std::nullopt;
  std::sort(order.begin(), order.end());
  return order[(order.size() - 1) / 2].second;
}

std::string StepList(const std::map<int64_t, int64_t>& durations) {
  std::string out;
  for (const auto& [step, duration] : durations) out += fmt::format("{}{}", out.empty() ? "" : ", ", step);
  return out;
}

}  // namespace

std::vector<TraceStepSpan> FindTraceSteps(const DiffSide& side) {
  const bool by_arg = HasStepArgs(side);
  std::map<std::pair<int64_t, int32_t>, std::pair<int64_t, int64_t>> windows;  // (step, rank) -> [begin, end)
  for (size_t f = 0; f < side.files.size(); ++f) {
    for (const Slice& slice : side.files[f].slices) {
      const std::optional<int64_t> step = by_arg ? StepArg(slice) : ProfilerStepNumber(slice);
      if (!step) continue;
      const int32_t rank = diff_internal::RankOf(side, f, slice.pid);
      auto [it, inserted] = windows.try_emplace({*step, rank}, slice.ts_ns, slice.ts_ns + slice.dur_ns);
      if (!inserted) {
        it->second.first = std::min(it->second.first, slice.ts_ns);
        it->second.second = std::max(it->second.second, slice.ts_ns + slice.dur_ns);
      }
    }
  }
  std::vector<TraceStepSpan> out;
  for (const auto& [key, window] : windows) out.push_back({key.second, key.first, window.first, window.second});
  return out;
}

StatusOr<DiffSide> CutToStep(const DiffSide& side, int64_t step) {
  const bool by_arg = HasStepArgs(side);
  std::map<int32_t, std::pair<int64_t, int64_t>> window;  // rank -> [begin, end)
  for (const TraceStepSpan& s : FindTraceSteps(side)) {
    if (s.step == step) window[s.rank] = {s.begin_ns, s.end_ns};
  }
  if (window.empty()) {
    return Status::InvalidInput(fmt::format("{}: no step {} in the trace", side.source, step));
  }
  DiffSide out;
  out.source = side.source;
  out.file_names = side.file_names;
  out.file_rank = side.file_rank;
  out.time_scale = side.time_scale;
  out.warmup_steps = side.warmup_steps;
  out.warnings = side.warnings;
  for (size_t f = 0; f < side.files.size(); ++f) {
    const Timeline& in = side.files[f];
    Timeline cut;
    cut.info = in.info;
    cut.processes = in.processes;
    cut.threads = in.threads;
    const auto window_of = [&](int32_t pid) -> const std::pair<int64_t, int64_t>* {
      auto it = window.find(diff_internal::RankOf(side, f, pid));
      return it == window.end() ? nullptr : &it->second;
    };
    const auto inside = [&](int32_t pid, int64_t ts) {
      const auto* w = window_of(pid);
      return w != nullptr && ts >= w->first && ts < w->second;
    };
    // Host slices first, so that a device slice can follow its launch (same rank and
    // correlation id): kept with it when the trace holds the launch, else by its start.
    std::map<std::pair<int32_t, int64_t>, bool> launch_kept;  // (rank, correlation) -> kept
    std::vector<bool> keep(in.slices.size(), false);
    for (size_t i = 0; i < in.slices.size(); ++i) {
      const Slice& s = in.slices[i];
      if (diff_internal::IsDeviceCategory(s.category)) continue;
      const std::optional<int64_t> arg = by_arg ? StepArg(s) : std::nullopt;
      keep[i] = arg ? *arg == step : inside(s.pid, s.ts_ns);
      if (s.correlation >= 0) {
        bool& kept = launch_kept[{diff_internal::RankOf(side, f, s.pid), s.correlation}];
        kept = kept || keep[i];
      }
    }
    for (size_t i = 0; i < in.slices.size(); ++i) {
      const Slice& s = in.slices[i];
      if (!diff_internal::IsDeviceCategory(s.category)) continue;
      const std::optional<int64_t> arg = by_arg ? StepArg(s) : std::nullopt;
      auto launch = s.correlation >= 0 ? launch_kept.find({diff_internal::RankOf(side, f, s.pid), s.correlation})
                                       : launch_kept.end();
      if (arg) {
        keep[i] = *arg == step;
      } else if (launch != launch_kept.end()) {
        keep[i] = launch->second;
      } else {
        keep[i] = inside(s.pid, s.ts_ns);
      }
    }
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (size_t i = 0; i < in.slices.size(); ++i) {
      if (!keep[i]) continue;
      cut.slices.push_back(in.slices[i]);
      lo = std::min(lo, in.slices[i].ts_ns);
      hi = std::max(hi, in.slices[i].ts_ns + in.slices[i].dur_ns);
    }
    const auto kept_time = [&](int64_t ts) { return ts >= lo && ts <= hi; };
    for (const Instant& i : in.instants) {
      if (kept_time(i.ts_ns)) cut.instants.push_back(i);
    }
    for (const CounterSample& c : in.counters) {
      if (kept_time(c.ts_ns)) cut.counters.push_back(c);
    }
    for (const Flow& flow : in.flows) {
      if (kept_time(flow.from_ts_ns) && kept_time(flow.to_ts_ns)) cut.flows.push_back(flow);
    }
    out.files.push_back(std::move(cut));
  }
  out.selected_step = step;
  return out;
}

Status SelectDiffStep(DiffSide& predicted, DiffSide& measured, int64_t requested) {
  // The host backend's --time-scale: kernels busy-wait predicted x scale, so measured
  // durations are not comparable with predicted ones unless it is 1 (runtime/host_backend.h).
  if (measured.time_scale >= 0 && measured.time_scale != 1.0) {
    measured.warnings.push_back(fmt::format(
        "{}: the measured run used --time-scale {:g}: its kernels busy-waited the predicted durations x {:g}, so "
        "measured durations are not comparable with predicted ones (run with --time-scale 1 to compare)",
        measured.source, measured.time_scale, measured.time_scale));
  }
  const std::map<int64_t, int64_t> measured_steps = StepDurations(FindTraceSteps(measured));
  if (measured_steps.empty() && requested >= 0) {
    return Status::InvalidInput(fmt::format("--step {}: {} marks no steps", requested, measured.source));
  }
  int64_t chosen = -1;
  if (requested >= 0) {
    if (measured_steps.count(requested) == 0) {
      return Status::InvalidInput(fmt::format("--step {}: {} holds steps {}", requested, measured.source,
                                              StepList(measured_steps)));
    }
    chosen = requested;
    measured.step_note = fmt::format("step {} (--step) of steps {}", chosen, StepList(measured_steps));
  } else if (measured_steps.size() > 1) {
    const int64_t first_measured = measured.warmup_steps > 0 ? measured.warmup_steps : INT64_MIN;
    std::optional<int64_t> median = MedianStep(measured_steps, first_measured);
    if (!median) median = MedianStep(measured_steps, INT64_MIN);
    chosen = *median;
    measured.step_note = fmt::format(
        "step {}, the median{} of steps {} (--step N picks another)", chosen,
        measured.warmup_steps > 0 ? fmt::format(" of those after {} warm-up step(s)", measured.warmup_steps) : "",
        StepList(measured_steps));
  }
  if (chosen >= 0) {
    SHARDSCOPE_ASSIGN_OR_RETURN(DiffSide cut, CutToStep(measured, chosen));
    cut.step_note = measured.step_note;
    measured = std::move(cut);
  }
  const std::map<int64_t, int64_t> predicted_steps = StepDurations(FindTraceSteps(predicted));
  if (predicted_steps.size() > 1) {
    const int64_t p = predicted_steps.count(chosen) != 0 ? chosen : *MedianStep(predicted_steps, INT64_MIN);
    std::string note = p == chosen ? fmt::format("step {}, as the measured side", p)
                                   : fmt::format("step {}, the median of steps {}", p, StepList(predicted_steps));
    SHARDSCOPE_ASSIGN_OR_RETURN(DiffSide cut, CutToStep(predicted, p));
    cut.step_note = std::move(note);
    predicted = std::move(cut);
  }
  return Status::Ok();
}

}  // namespace shardscope::traces

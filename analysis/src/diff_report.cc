// The diff's outputs: report.md (terminal and pull-request friendly), report.json (schema in
// docs/DIFF.md) and the merged Perfetto trace (predicted and measured side by side per rank).
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <span>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "diff_internal.h"
#include "shardscope/traces/chrome_trace.h"

namespace shardscope::traces {
namespace {

using diff_internal::SliceOf;
using Json = nlohmann::ordered_json;

// "12.345 ms", "-3.2 us", "850 ns" (signed when asked).
std::string Duration(int64_t ns, bool sign = false) {
  const double value = static_cast<double>(ns);
  const char* plus = sign && ns > 0 ? "+" : "";
  if (std::llabs(ns) >= 1'000'000) return fmt::format("{}{:.3f} ms", plus, value * 1e-6);
  if (std::llabs(ns) >= 1'000) return fmt::format("{}{:.1f} us", plus, value * 1e-3);
  return fmt::format("{}{} ns", plus, ns);
}

std::string Percent(int64_t part, int64_t whole, bool sign = false) {
  if (whole == 0) return "-";
  const double percent = 100.0 * static_cast<double>(part) / static_cast<double>(whole);
  return sign ? fmt::format("{:+.1f}%", percent) : fmt::format("{:.1f}%", percent);
}

// Markdown table cells must not contain '|'.
std::string Cell(std::string_view text) {
  std::string out;
  for (char c : text) out += c == '|' ? '/' : c;
  if (out.size() > 60) out = out.substr(0, 57) + "...";
  return out;
}

std::string Describe(const DiffSide& side, const SideAnalysis& analysis, int32_t index) {
  const DiffEvent& e = analysis.events[static_cast<size_t>(index)];
  std::string text = fmt::format("rank {} {}", e.rank, Cell(SliceOf(side, e).name));
  if (e.op_id >= 0) text += fmt::format(" (op {})", e.op_id);
  return text;
}

int64_t Unmatched(const SideAnalysis& side) {
  int64_t count = 0;
  for (int32_t m : side.match) count += m < 0 ? 1 : 0;
  return count;
}

std::set<int32_t> AllRanks(const DiffResult& diff) {
  std::set<int32_t> ranks;
  for (const RankMetrics& m : diff.predicted.ranks) ranks.insert(m.rank);
  for (const RankMetrics& m : diff.measured.ranks) ranks.insert(m.rank);
  return ranks;
}

Json EventJson(const DiffSide& side, const SideAnalysis& analysis, int32_t index) {
  if (index < 0) return nullptr;
  const DiffEvent& e = analysis.events[static_cast<size_t>(index)];
  Json j;
  j["rank"] = e.rank;
  j["track"] = analysis.tracks[static_cast<size_t>(e.track)].name;
  j["name"] = SliceOf(side, e).name;
  j["op_id"] = e.op_id;
  j["ts_ns"] = e.ts_ns;
  j["dur_ns"] = e.dur_ns;
  return j;
}

Json OpErrorJson(const DiffSide& predicted, const DiffSide& measured, const DiffResult& diff, const OpError& error) {
  Json j;
  j["class"] = OpClassName(error.op_class);
  j["predicted"] = EventJson(predicted, diff.predicted, error.predicted);
  j["measured"] = EventJson(measured, diff.measured, error.measured);
  j["duration_error_ns"] = error.duration_error_ns;
  j["start_shift_ns"] = error.start_shift_ns;
  j["contribution_ns"] = error.contribution_ns;
  return j;
}

Json SideJson(const DiffSide& side, const SideAnalysis& analysis, const DiffOptions& options) {
  Json j;
  j["source"] = side.source;
  j["files"] = side.file_names;
  j["selected_step"] = side.selected_step;
  j["step_note"] = side.step_note;
  j["time_scale"] = side.time_scale;
  j["warnings"] = side.warnings;
  j["events"] = analysis.events.size();
  j["step_ns"] = analysis.step_ns;
  Json ranks = Json::array();
  for (const RankMetrics& m : analysis.ranks) {
    Json r;
    r["rank"] = m.rank;
    r["step_start_ns"] = m.step_start_ns;
    r["step_ns"] = m.step_ns;
    r["steps"] = m.steps;
    r["step_from"] = m.from_profiler_steps ? "ProfilerStep" : "device span";
    Json streams = Json::array();
    for (const StreamBusy& s : m.streams) {
      streams.push_back({{"track", analysis.tracks[static_cast<size_t>(s.track)].name}, {"busy_ns", s.busy_ns}});
    }
    r["streams"] = std::move(streams);
    // Holistic Trace Analysis's metrics (hta_metrics.h), as `shardscope analyze --json`
    // gives them; idle time is per stream, never summed over streams.
    const HtaRankMetrics& h = m.hta;
    r["compute_ns"] = h.compute_ns;
    r["communication_ns"] = h.comm_ns;
    r["overlap_ns"] = h.overlap_ns;
    r["overlap_ratio"] = h.comm_ns > 0 ? static_cast<double>(h.overlap_ns) / static_cast<double>(h.comm_ns) : 0.0;
    r["exposed_communication_ns"] = m.exposed_comm_ns();
    Json hta;
    hta["span_ns"] = h.span_ns;
    hta["idle_pct"] = h.IdlePct();
    hta["compute_pct"] = h.ComputePct();
    hta["non_compute_pct"] = h.NonComputePct();
    hta["comm_comp_overlap_pct"] = h.CommCompOverlapPct();
    hta["last_step_excluded"] = h.last_step_excluded;
    Json idle = Json::array();
    for (const HtaStreamIdle& st : h.streams) {
      idle.push_back({{"stream", st.stream},
                      {"name", st.name},
                      {"idle_ns", st.idle_ns},
                      {"host_wait_ns", st.host_wait_ns},
                      {"kernel_wait_ns", st.kernel_wait_ns},
                      {"other_ns", st.other_ns}});
    }
    hta["streams"] = std::move(idle);
    r["hta"] = std::move(hta);
    ranks.push_back(std::move(r));
  }
  j["ranks"] = std::move(ranks);
  Json path;
  path["start_ns"] = analysis.critical_path.start_ns;
  path["length_ns"] = analysis.critical_path.length_ns;
  // Every step with --full; else the top_n steps holding the most time (wait + duration),
  // in path order: a 1,000,000-event path has hundreds of thousands of steps.
  const std::vector<CriticalPathStep>& all = analysis.critical_path.steps;
  std::vector<size_t> listed(all.size());
  for (size_t k = 0; k < all.size(); ++k) listed[k] = k;
  const auto top_n = static_cast<size_t>(std::max(0, options.top_n));
  if (!options.full_report && listed.size() > top_n) {
    std::stable_sort(listed.begin(), listed.end(), [&](size_t a, size_t b) {
      return all[a].wait_ns + all[a].dur_ns > all[b].wait_ns + all[b].dur_ns;
    });
    listed.resize(top_n);
    std::sort(listed.begin(), listed.end());
  }
  path["step_count"] = all.size();
  path["steps_listed"] = options.full_report ? "all" : "top_n";
  Json steps = Json::array();
  for (size_t k : listed) {
    const CriticalPathStep& step = all[k];
    const DiffEvent& e = analysis.events[static_cast<size_t>(step.event)];
    steps.push_back({{"index", k},
                     {"rank", e.rank},
                     {"name", SliceOf(side, e).name},
                     {"op_id", e.op_id},
                     {"ts_ns", e.ts_ns},
                     {"wait_ns", step.wait_ns},
                     {"on_path_ns", step.dur_ns}});
  }
  path["steps"] = std::move(steps);
  j["critical_path"] = std::move(path);
  Json unmatched = Json::array();
  for (size_t i = 0; i < analysis.events.size(); ++i) {
    if (analysis.match[i] < 0) unmatched.push_back(EventJson(side, analysis, static_cast<int32_t>(i)));
  }
  j["unmatched"] = std::move(unmatched);
  return j;
}

// Names of unmatched events with their counts, most frequent first.
std::vector<std::pair<std::string, int64_t>> UnmatchedNames(const DiffSide& side, const SideAnalysis& analysis) {
  std::map<std::string, int64_t> counts;
  for (size_t i = 0; i < analysis.events.size(); ++i) {
    if (analysis.match[i] < 0) ++counts[SliceOf(side, analysis.events[i]).name];
  }
  std::vector<std::pair<std::string, int64_t>> sorted(counts.begin(), counts.end());
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return sorted;
}

Status WriteTextAtomically(const std::string& path, const std::string& text) {
  const std::string temp = path + ".tmp";
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out) return Status::IoError(fmt::format("cannot write '{}': {}", temp, std::strerror(errno)));
    out << text;
    out.flush();
    if (!out) {
      std::remove(temp.c_str());
      return Status::IoError(fmt::format("writing '{}' failed (disk full?)", temp));
    }
  }
  std::error_code error;
  std::filesystem::rename(temp, path, error);
  if (error) return Status::IoError(fmt::format("cannot rename '{}' to '{}': {}", temp, path, error.message()));
  return Status::Ok();
}

}  // namespace

std::string DiffReportMarkdown(const DiffSide& predicted, const DiffSide& measured, const DiffResult& diff,
                               const DiffOptions& options) {
  const SideAnalysis& p = diff.predicted;
  const SideAnalysis& m = diff.measured;
  std::string out = "# shardscope diff\n\n";
  out += fmt::format("- predicted: `{}` ({} events, {} rank(s))\n", predicted.source, p.events.size(), p.ranks.size());
  out += fmt::format("- measured: `{}` ({} events, {} rank(s))\n", measured.source, m.events.size(), m.ranks.size());
  if (options.rank >= 0) out += fmt::format("- rank {} only\n", options.rank);
  for (const auto& [label, side] : {std::pair{"predicted", &predicted}, std::pair{"measured", &measured}}) {
    if (!side->step_note.empty()) out += fmt::format("- {} side compared at {}\n", label, side->step_note);
  }
  for (const DiffSide* side : {&predicted, &measured}) {
    for (const std::string& warning : side->warnings) out += fmt::format("- **warning:** {}\n", warning);
  }
  out += "\n## Step time\n\n| | predicted | measured | difference |\n|---|---:|---:|---:|\n";
  out += fmt::format("| step (slowest rank) | {} | {} | {} ({}) |\n", Duration(p.step_ns), Duration(m.step_ns),
                     Duration(m.step_ns - p.step_ns, true), Percent(m.step_ns - p.step_ns, p.step_ns, true));
  const int64_t cp_delta = m.critical_path.length_ns - p.critical_path.length_ns;
  out += fmt::format("| critical path | {} | {} | {} ({}) |\n\n", Duration(p.critical_path.length_ns),
                     Duration(m.critical_path.length_ns), Duration(cp_delta, true),
                     Percent(cp_delta, p.critical_path.length_ns, true));
  out += "The critical path spans each side from its first event to its last; the contributions below add up to\n"
         "its difference exactly. The step time is the device span (or the ProfilerStep# annotations).\n";
  out += fmt::format("\nPer device op (kernels, copies, collectives; {} matched): |measured - predicted| / predicted is "
                     "{:.1f}% at the median, {:.1f}% at the 90th percentile.\n",
                     diff.device_relative.count, 100.0 * diff.device_relative.median, 100.0 * diff.device_relative.p90);

  out += fmt::format("\n## Matching\n\n{} matched ({} by op id, {} collective anchors, {} by name); unmatched: {} "
                     "predicted, {} measured.\n",
                     diff.matched(), diff.matched_by_op_id, diff.matched_by_anchor, diff.matched_by_name, Unmatched(p),
                     Unmatched(m));

  out += "\n## Per rank (Holistic Trace Analysis metrics, as `shardscope analyze` computes them)\n\n"
         "| rank | side | step | GPU span | idle | compute | non-compute | comm/comp overlap | exposed comm |\n"
         "|---:|---|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& [label, side] : {std::pair{"predicted", &p}, std::pair{"measured", &m}}) {
    for (const RankMetrics& r : side->ranks) {
      out += fmt::format("| {} | {} | {} | {} | {:.1f}% | {:.1f}% | {:.1f}% | {:.1f}% | {} |\n", r.rank, label,
                         Duration(r.step_ns), Duration(r.hta.span_ns), r.hta.IdlePct(), r.hta.ComputePct(),
                         r.hta.NonComputePct(), r.hta.CommCompOverlapPct(), Duration(r.exposed_comm_ns()));
    }
  }
  out += "\nIdle time per stream (HTA's split; a stream's idle time is within the GPU span, streams are not summed):\n\n"
         "| rank | side | stream | idle | host wait | kernel wait | other |\n"
         "|---:|---|---|---:|---:|---:|---:|\n";
  for (const auto& [label, side] : {std::pair{"predicted", &p}, std::pair{"measured", &m}}) {
    for (const RankMetrics& r : side->ranks) {
      for (const HtaStreamIdle& st : r.hta.streams) {
        out += fmt::format("| {} | {} | {} | {} | {} | {} | {} |\n", r.rank, label, st.name, Duration(st.idle_ns),
                           Duration(st.host_wait_ns), Duration(st.kernel_wait_ns), Duration(st.other_ns));
      }
    }
  }

  out += "\n## Error by class\n\n"
         "| class | matched | median error | p90 abs error | total error | contribution |\n"
         "|---|---:|---:|---:|---:|---:|\n";
  for (const ClassStats& c : diff.classes) {
    out += fmt::format("| {} | {} | {} | {} | {} | {} |\n", OpClassName(c.op_class), c.count,
                       Duration(c.median_error_ns, true), Duration(c.p90_abs_error_ns), Duration(c.total_error_ns, true),
                       Duration(c.contribution_ns, true));
  }

  out += fmt::format("\n## Top {} ops by contribution to the difference\n\n", options.top_n);
  if (diff.top.empty()) {
    out += "No op differs.\n";
  } else {
    out += "| # | op | class | predicted | measured | duration error | start shift | contribution |\n"
           "|---:|---|---|---:|---:|---:|---:|---:|\n";
    for (size_t k = 0; k < diff.top.size(); ++k) {
      const OpError& e = diff.top[k];
      const std::string what = e.predicted >= 0 ? Describe(predicted, p, e.predicted)
                                                : Describe(measured, m, e.measured) + " (measured only)";
      const std::string pd = e.predicted >= 0 ? Duration(p.events[static_cast<size_t>(e.predicted)].dur_ns) : "-";
      const std::string md = e.measured >= 0 ? Duration(m.events[static_cast<size_t>(e.measured)].dur_ns) : "-";
      const bool pair = e.predicted >= 0 && e.measured >= 0;
      out += fmt::format("| {} | {}{} | {} | {} | {} | {} | {} | {} |\n", k + 1, what,
                         e.measured < 0 ? " (predicted only)" : "", OpClassName(e.op_class), pd, md,
                         pair ? Duration(e.duration_error_ns, true) : "-", pair ? Duration(e.start_shift_ns, true) : "-",
                         Duration(e.contribution_ns, true));
    }
  }

  out += "\n## Critical paths\n\n";
  out += fmt::format("- predicted: {} over {} ops\n", Duration(p.critical_path.length_ns), p.critical_path.steps.size());
  out += fmt::format("- measured: {} over {} ops\n", Duration(m.critical_path.length_ns), m.critical_path.steps.size());
  const Divergence& d = diff.divergence;
  if (!d.diverged) {
    out += "- both paths run through the same ops.\n";
  } else {
    out += fmt::format("- they part at step {}", d.index);
    if (d.last_common_predicted >= 0) out += fmt::format(", after {}", Describe(predicted, p, d.last_common_predicted));
    out += fmt::format(": predicted continues with {}, measured with {}.\n",
                       d.predicted >= 0 ? Describe(predicted, p, d.predicted) : "(its end)",
                       d.measured >= 0 ? Describe(measured, m, d.measured) : "(its end)");
  }

  out += "\n## Unmatched\n\n";
  for (const auto& [label, side, analysis] :
       {std::tuple{"predicted", &predicted, &p}, std::tuple{"measured", &measured, &m}}) {
    const auto names = UnmatchedNames(*side, *analysis);
    out += fmt::format("- {}: {} slice(s)", label, Unmatched(*analysis));
    for (size_t k = 0; k < std::min<size_t>(names.size(), 8); ++k) {
      out += fmt::format("{} `{}` x{}", k == 0 ? ":" : ",", Cell(names[k].first), names[k].second);
    }
    if (names.size() > 8) out += ", ...";
    out += "\n";
  }
  out += "\nEvery unmatched slice is listed in report.json and kept in trace.json (arg \"diff\": \"unmatched\").\n";
  return out;
}

std::string DiffReportJson(const DiffSide& predicted, const DiffSide& measured, const DiffResult& diff,
                           const DiffOptions& options) {
  const SideAnalysis& p = diff.predicted;
  const SideAnalysis& m = diff.measured;
  Json j;
  j["schema"] = "shardscope.diff/3";
  j["options"] = {{"top_n", options.top_n}, {"rank", options.rank}, {"full", options.full_report},
                  {"kernel_wait_threshold_ns", options.hta.kernel_wait_threshold_ns}};
  j["step"] = {{"predicted_ns", p.step_ns},
               {"measured_ns", m.step_ns},
               {"difference_ns", m.step_ns - p.step_ns},
               {"critical_path_predicted_ns", p.critical_path.length_ns},
               {"critical_path_measured_ns", m.critical_path.length_ns},
               {"critical_path_difference_ns", m.critical_path.length_ns - p.critical_path.length_ns}};
  j["device_ops"] = {{"matched", diff.device_relative.count},
                     {"median_abs_relative_error", diff.device_relative.median},
                     {"p90_abs_relative_error", diff.device_relative.p90}};
  j["matching"] = {{"matched", diff.matched()},
                   {"by_op_id", diff.matched_by_op_id},
                   {"by_anchor", diff.matched_by_anchor},
                   {"by_name", diff.matched_by_name},
                   {"unmatched_predicted", Unmatched(p)},
                   {"unmatched_measured", Unmatched(m)}};
  Json classes = Json::array();
  for (const ClassStats& c : diff.classes) {
    classes.push_back({{"class", OpClassName(c.op_class)},
                       {"count", c.count},
                       {"median_error_ns", c.median_error_ns},
                       {"p90_abs_error_ns", c.p90_abs_error_ns},
                       {"total_error_ns", c.total_error_ns},
                       {"contribution_ns", c.contribution_ns}});
  }
  j["classes"] = std::move(classes);
  Json top = Json::array();
  for (const OpError& e : diff.top) top.push_back(OpErrorJson(predicted, measured, diff, e));
  j["top"] = std::move(top);
  const Divergence& d = diff.divergence;
  j["divergence"] = d.diverged ? Json{{"index", d.index},
                                      {"last_common", EventJson(predicted, p, d.last_common_predicted)},
                                      {"predicted", EventJson(predicted, p, d.predicted)},
                                      {"measured", EventJson(measured, m, d.measured)}}
                               : Json(nullptr);
  j["predicted"] = SideJson(predicted, p, options);
  j["measured"] = SideJson(measured, m, options);
  return j.dump(1) + "\n";
}

Status WriteDiffTrace(const DiffSide& predicted, const DiffSide& measured, const DiffResult& diff,
                      const std::string& path) {
  TraceInfo info;
  info.producer = "shardscope diff";
  const std::set<int32_t> ranks = AllRanks(diff);
  info.world_size = ranks.empty() ? 1 : *ranks.rbegin() + 1;
  SHARDSCOPE_ASSIGN_OR_RETURN(std::unique_ptr<ChromeTraceWriter> writer, ChromeTraceWriter::Open(path, info));
  for (int32_t rank : ranks) {
    writer->OnProcess({2 * rank, fmt::format("rank {} predicted", rank), 2 * rank});
    writer->OnProcess({2 * rank + 1, fmt::format("rank {} measured", rank), 2 * rank + 1});
  }
  // Output tid of each track: its position among its rank's tracks on its side.
  const auto local_tids = [](const SideAnalysis& side) {
    std::vector<int32_t> tids(side.tracks.size(), 0);
    for (size_t t = 1; t < side.tracks.size(); ++t) {
      tids[t] = side.tracks[t].rank == side.tracks[t - 1].rank ? tids[t - 1] + 1 : 0;
    }
    return tids;
  };
  const std::vector<int32_t> p_tids = local_tids(diff.predicted);
  const std::vector<int32_t> m_tids = local_tids(diff.measured);
  struct SideView {
    const DiffSide& side;
    const SideAnalysis& analysis;
    const std::vector<int32_t>& tids;
    int32_t pid_offset;  // 0 predicted, 1 measured
  };
  const SideView views[2] = {{predicted, diff.predicted, p_tids, 0}, {measured, diff.measured, m_tids, 1}};
  for (const SideView& view : views) {
    for (size_t t = 0; t < view.analysis.tracks.size(); ++t) {
      const DiffTrack& track = view.analysis.tracks[t];
      writer->OnThread({2 * track.rank + view.pid_offset, view.tids[t], track.name, view.tids[t]});
    }
  }
  std::vector<int64_t> error_of(diff.predicted.events.size(), INT64_MIN);
  for (const OpError& e : diff.errors) error_of[static_cast<size_t>(e.predicted)] = e.duration_error_ns;
  // The args every slice gains, built once and updated in place (no copy of the slice).
  std::array<Arg, 2> extra = {Arg{"diff", std::string()}, Arg{"duration error (ns)", int64_t{0}}};
  for (const SideView& view : views) {
    const int64_t origin = view.analysis.critical_path.start_ns;
    for (size_t i = 0; i < view.analysis.events.size(); ++i) {
      const DiffEvent& e = view.analysis.events[i];
      const int32_t other = view.analysis.match[i];
      std::get<std::string>(extra[0].value) = other >= 0 ? "matched" : "unmatched";
      if (other >= 0) {
        const size_t p_index = view.pid_offset == 0 ? i : static_cast<size_t>(other);
        extra[1].value = error_of[p_index];
      }
      writer->OnSliceAt(SliceOf(view.side, e), 2 * e.rank + view.pid_offset, view.tids[static_cast<size_t>(e.track)],
                        e.ts_ns - origin, std::span<const Arg>(extra.data(), other >= 0 ? 2 : 1));
    }
    for (size_t f = 0; f < view.side.files.size(); ++f) {
      for (CounterSample sample : view.side.files[f].counters) {
        const int32_t rank = diff_internal::RankOf(view.side, f, sample.pid);
        if (!ranks.contains(rank)) continue;
        sample.pid = 2 * rank + view.pid_offset;
        sample.ts_ns -= origin;
        writer->OnCounter(sample);
      }
    }
  }
  // Matched device ops: a flow from the predicted slice to the measured one (host slices are
  // left out: their kernels carry the link, and flows for both would double the file).
  const int64_t p_origin = diff.predicted.critical_path.start_ns;
  const int64_t m_origin = diff.measured.critical_path.start_ns;
  constexpr int64_t kDiffFlowIdBase = int64_t{1} << 56;  // apart from the sides' ac2g ids
  for (size_t k = 0; k < diff.errors.size(); ++k) {
    const DiffEvent& pe = diff.predicted.events[static_cast<size_t>(diff.errors[k].predicted)];
    const DiffEvent& me = diff.measured.events[static_cast<size_t>(diff.errors[k].measured)];
    if (!pe.device) continue;
    Flow flow;
    flow.id = kDiffFlowIdBase + static_cast<int64_t>(k);
    flow.name = "match";
    flow.category = "diff";
    flow.from_pid = 2 * pe.rank;
    flow.from_tid = p_tids[static_cast<size_t>(pe.track)];
    flow.from_ts_ns = pe.ts_ns - p_origin;
    flow.to_pid = 2 * me.rank + 1;
    flow.to_tid = m_tids[static_cast<size_t>(me.track)];
    flow.to_ts_ns = me.ts_ns - m_origin;
    writer->OnFlow(flow);
  }
  // The top-N ops.
  for (size_t k = 0; k < diff.top.size(); ++k) {
    const OpError& error = diff.top[k];
    const bool on_measured = error.measured >= 0;
    const SideAnalysis& analysis = on_measured ? diff.measured : diff.predicted;
    const DiffEvent& e = analysis.events[static_cast<size_t>(on_measured ? error.measured : error.predicted)];
    Instant instant;
    instant.pid = 2 * e.rank + (on_measured ? 1 : 0);
    instant.tid = (on_measured ? m_tids : p_tids)[static_cast<size_t>(e.track)];
    instant.ts_ns = e.ts_ns - (on_measured ? m_origin : p_origin);
    instant.name = fmt::format("diff #{}: {} {}", k + 1, Duration(error.contribution_ns, true),
                               SliceOf(on_measured ? measured : predicted, e).name);
    instant.category = "diff";
    instant.args = {{"contribution (ns)", error.contribution_ns},
                    {"duration error (ns)", error.duration_error_ns},
                    {"start shift (ns)", error.start_shift_ns},
                    {"class", std::string(OpClassName(error.op_class))}};
    writer->OnInstant(instant);
  }
  return writer->Finish().WithContext(path);
}

Status WriteDiffOutputs(const DiffSide& predicted, const DiffSide& measured, const DiffResult& diff,
                        const std::string& dir, const DiffOptions& options) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return Status::IoError(fmt::format("cannot create '{}': {}", dir, error.message()));
  const std::filesystem::path base(dir);
  SHARDSCOPE_RETURN_IF_ERROR(WriteDiffTrace(predicted, measured, diff, (base / "trace.json").string()));
  SHARDSCOPE_RETURN_IF_ERROR(
      WriteTextAtomically((base / "report.md").string(), DiffReportMarkdown(predicted, measured, diff, options)));
  return WriteTextAtomically((base / "report.json").string(), DiffReportJson(predicted, measured, diff, options));
}

}  // namespace shardscope::traces

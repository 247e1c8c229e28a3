// The measured side of the module: import PyTorch-profiler traces, read any trace, HTA's
// metrics (analyze), the predicted-vs-measured diff and the Flight Recorder analysis, each
// through the library function its CLI command calls.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "shardscope/analysis/flight_recorder_analysis.h"
#include "shardscope/analysis/import.h"
#include "shardscope/analysis/trace_commands.h"
#include "shardscope/traces/flight_recorder.h"

namespace shardscope::python {
namespace {

py::dict Import(const std::vector<std::string>& paths, std::optional<std::string> output) {
  traces::ImportedTrace imported;
  {
    py::gil_scoped_release release;
    imported = Take(traces::ImportPytorchTraces(paths));
    // DIR/trace.json replaced only when written whole, as `import -o` does.
    if (output) Take(traces::WriteImportedTrace(imported, *output));
  }
  py::list ranks;
  for (const traces::ImportedRank& r : imported.ranks) {
    py::dict d;
    d["rank"] = r.rank;
    d["source"] = r.source;
    d["streams"] = r.streams;
    d["kernels"] = r.kernels;
    d["collectives"] = r.collectives;
    ranks.append(d);
  }
  py::list steps;
  for (const traces::ImportedStep& s : imported.steps) {
    py::dict d;
    d["rank"] = s.rank;
    d["step"] = s.step;
    d["start_ns"] = s.start_ns;
    d["end_ns"] = s.end_ns;
    steps.append(d);
  }
  py::dict out;
  out["summary"] = traces::ImportSummaryText(imported);
  out["ranks"] = ranks;
  out["steps"] = steps;
  out["warnings"] = imported.warnings;
  out["timeline"] = TimelineColumns(imported.timeline);
  return out;
}

// Any trace the diff reads (a file, a folder holding trace.json, a folder of per-rank files),
// as columns per pid and file.
py::dict ReadTrace(const std::string& path) {
  traces::DiffSide side;
  {
    py::gil_scoped_release release;
    side = Take(traces::LoadDiffSide(path));
  }
  py::dict out;
  out["source"] = side.source;
  py::list files;
  for (size_t i = 0; i < side.files.size(); ++i) {
    py::dict f;
    f["name"] = side.file_names[i];
    f["rank"] = side.file_rank[i];  // -1: pid is the rank
    f["producer"] = side.files[i].info.producer;
    f["timeline"] = TimelineColumns(side.files[i]);
    files.append(f);
  }
  out["files"] = files;
  return out;
}

py::dict Analyze(const std::vector<std::string>& paths, std::optional<int32_t> rank,
                 std::optional<double> kernel_wait_threshold_us, bool include_last_step, bool exact_ns) {
  // None: the library's default, as the CLI's flags have it.
  traces::AnalyzeRequest request;
  request.traces = paths;
  request.rank = rank;
  if (kernel_wait_threshold_us) request.kernel_wait_threshold_us = *kernel_wait_threshold_us;
  request.include_last_step = include_last_step;
  request.exact_ns = exact_ns;
  traces::AnalyzeRun run;
  std::string json, text;
  {
    py::gil_scoped_release release;
    run = Take(traces::RunAnalyze(request));
    json = traces::HtaMetricsJson(run.ranks, run.options);
    text = traces::HtaMetricsText(run.ranks);
  }
  py::dict out = ParseJson(json).cast<py::dict>();
  out["text"] = text;
  out["warnings"] = run.warnings;
  return out;
}

py::dict DiffPaths(const std::string& predicted, const std::string& measured, const std::string& output,
                   std::optional<int32_t> top_n, std::optional<int32_t> rank, bool full, std::optional<int64_t> step) {
  // None: the library's default, as the CLI's flags have it.
  traces::DiffRequest request;
  request.predicted = predicted;
  request.measured = measured;
  request.out_dir = output;
  if (top_n) request.top_n = *top_n;
  request.rank = rank;
  request.full = full;
  request.step = step;
  std::vector<std::string> warnings;
  traces::TraceCommandOutput notes;
  notes.warn = [&](const std::string& w) { warnings.push_back(w); };
  traces::DiffRun run;
  {
    py::gil_scoped_release release;
    run = Take(traces::RunDiff(request, notes));
  }
  const traces::DiffResult& diff = run.diff;
  // Every matched pair: its class, the two durations and the error (measured - predicted).
  py::list cls, name, rank_col, op_id, predicted_ns, measured_ns, error_ns, shift_ns, contribution_ns;
  for (const traces::OpError& e : diff.errors) {
    if (e.predicted < 0 || e.measured < 0) continue;
    const traces::DiffEvent& p = diff.predicted.events[static_cast<size_t>(e.predicted)];
    const traces::DiffEvent& m = diff.measured.events[static_cast<size_t>(e.measured)];
    cls.append(std::string(traces::OpClassName(e.op_class)));
    name.append(p.name_id >= 0 ? diff.names[static_cast<size_t>(p.name_id)] : std::string());
    rank_col.append(p.rank);
    op_id.append(p.op_id);
    predicted_ns.append(p.dur_ns);
    measured_ns.append(m.dur_ns);
    error_ns.append(e.duration_error_ns);
    shift_ns.append(e.start_shift_ns);
    contribution_ns.append(e.contribution_ns);
  }
  py::dict errors;
  errors["class"] = cls;
  errors["name"] = name;
  errors["rank"] = rank_col;
  errors["op_id"] = op_id;
  errors["predicted_ns"] = predicted_ns;
  errors["measured_ns"] = measured_ns;
  errors["error_ns"] = error_ns;
  errors["start_shift_ns"] = shift_ns;
  errors["contribution_ns"] = contribution_ns;
  // Both critical paths, step by step: where each op starts on its side's axis and how long
  // the path spends waiting for it and in it.
  const auto path_columns = [&](const traces::SideAnalysis& side) {
    py::list path_name, path_rank, path_op, path_class, path_start, path_wait, path_dur;
    for (const traces::CriticalPathStep& s : side.critical_path.steps) {
      const traces::DiffEvent& e = side.events[static_cast<size_t>(s.event)];
      path_name.append(e.name_id >= 0 ? diff.names[static_cast<size_t>(e.name_id)] : std::string());
      path_rank.append(e.rank);
      path_op.append(e.op_id);
      path_class.append(std::string(traces::OpClassName(e.op_class)));
      path_start.append(e.ts_ns - side.critical_path.start_ns);
      path_wait.append(s.wait_ns);
      path_dur.append(s.dur_ns);
    }
    py::dict d;
    d["name"] = path_name;
    d["rank"] = path_rank;
    d["op_id"] = path_op;
    d["class"] = path_class;
    d["start_ns"] = path_start;
    d["wait_ns"] = path_wait;
    d["duration_ns"] = path_dur;
    d["length_ns"] = side.critical_path.length_ns;
    return d;
  };
  py::dict out;
  out["report"] = ParseJson([&] {
    std::ifstream in(std::filesystem::path(output) / "report.json", std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }());
  out["headline"] = run.headline;
  out["predicted_step_note"] = run.predicted_step_note;
  out["measured_step_note"] = run.measured_step_note;
  out["warnings"] = warnings;
  out["errors"] = errors;
  out["critical_path_predicted"] = path_columns(diff.predicted);
  out["critical_path_measured"] = path_columns(diff.measured);
  return out;
}

py::dict FlightRecorder(const std::string& dir, const std::string& prefix) {
  std::string json, text;
  {
    py::gil_scoped_release release;
    traces::FlightRecorderDirOptions options;
    options.prefix = prefix;
    const std::vector<traces::FlightRecorderDump> dumps = Take(traces::ReadFlightRecorderDir(dir, options));
    const traces::FlightRecorderAnalysis analysis = traces::AnalyzeFlightRecorder(dumps);
    json = traces::FlightRecorderJsonReport(analysis);
    text = traces::FlightRecorderText(analysis);
  }
  py::dict out = ParseJson(json).cast<py::dict>();
  out["text"] = text;
  return out;
}

}  // namespace

void BindAnalysis(py::module_& m) {
  m.def("_import", &Import, py::arg("paths"), py::arg("output"));
  m.def("_read_trace", &ReadTrace, py::arg("path"));
  m.def("_analyze", &Analyze, py::arg("paths"), py::arg("rank"), py::arg("kernel_wait_threshold_us"),
        py::arg("include_last_step"), py::arg("exact_ns"));
  m.def("_diff", &DiffPaths, py::arg("predicted"), py::arg("measured"), py::arg("output"), py::arg("top_n"),
        py::arg("rank"), py::arg("full"), py::arg("step"));
  m.def("_flight_recorder", &FlightRecorder, py::arg("dir"), py::arg("prefix"));
}

}  // namespace shardscope::python

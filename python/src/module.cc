// _shardscope: the C++ half of the `shardscope` Python package (python/shardscope/ holds the
// Python half, which users import). Over the same libraries as the CLI: nothing here decides
// anything a command of the CLI decides; it converts arguments, calls the library and converts
// results. docs/PYTHON.md is the reference.
#include <map>
#include <set>
#include <string>
#include <utility>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "shardscope/sim/report/version.h"

namespace shardscope::python {

void Raise(const Status& status) {
  if (status.code() == StatusCode::kInvalidInput) throw InputError(status.message());
  throw Error(status.message());
}

py::object ParseJson(const std::string& text) { return py::module_::import("json").attr("loads")(text); }

py::dict TimelineColumns(const traces::Timeline& timeline) {
  struct Columns {
    py::list tid, thread, op_id, name, category, start_ns, duration_ns;
  };
  std::map<std::pair<int32_t, int32_t>, std::string> thread_names;
  for (const traces::ThreadInfo& t : timeline.threads) thread_names[{t.pid, t.tid}] = t.name;
  std::map<int32_t, Columns> slices;
  for (const traces::Slice& s : timeline.slices) {
    Columns& c = slices[s.pid];
    c.tid.append(s.tid);
    const auto it = thread_names.find({s.pid, s.tid});
    c.thread.append(it == thread_names.end() ? std::string() : it->second);
    c.op_id.append(s.op_id);
    c.name.append(s.name);
    c.category.append(s.category == traces::Category::kOther ? s.raw_category
                                                             : std::string(traces::CategoryName(s.category)));
    c.start_ns.append(s.ts_ns);
    c.duration_ns.append(s.dur_ns);
  }
  // Counters: per pid and name, a time column and one column per key.
  std::map<int32_t, std::map<std::string, py::dict>> counters;
  for (const traces::CounterSample& sample : timeline.counters) {
    py::dict& track = counters[sample.pid][sample.name];
    if (!track.contains("time_ns")) track["time_ns"] = py::list();
    track["time_ns"].cast<py::list>().append(sample.ts_ns);
    for (const auto& [key, value] : sample.values) {
      if (!track.contains(key.c_str())) track[key.c_str()] = py::list();
      track[key.c_str()].cast<py::list>().append(value);
    }
  }
  py::dict out;
  std::set<int32_t> pids;
  for (const auto& [pid, c] : slices) pids.insert(pid);
  for (const auto& [pid, c] : counters) pids.insert(pid);
  for (int32_t pid : pids) {
    py::dict rank;
    py::dict columns;
    if (const auto it = slices.find(pid); it != slices.end()) {
      const Columns& c = it->second;
      columns["tid"] = c.tid;
      columns["thread"] = c.thread;
      columns["op_id"] = c.op_id;
      columns["name"] = c.name;
      columns["category"] = c.category;
      columns["start_ns"] = c.start_ns;
      columns["duration_ns"] = c.duration_ns;
    }
    rank["slices"] = columns;
    py::dict tracks;
    if (const auto it = counters.find(pid); it != counters.end()) {
      for (const auto& [name, track] : it->second) tracks[name.c_str()] = track;
    }
    rank["counters"] = tracks;
    out[py::int_(pid)] = rank;
  }
  return out;
}

}  // namespace shardscope::python

PYBIND11_MODULE(_shardscope, m) {
  namespace py = pybind11;
  using namespace shardscope::python;
  m.doc() = "shardscope's C++ core; import the `shardscope` package instead (docs/PYTHON.md)";
  // Translators are tried newest first: the most derived class is registered last.
  static py::exception<Error> error(m, "Error");
  static py::exception<InputError> input_error(m, "InputError", error.ptr());
  static py::exception<PlanError> plan_error(m, "PlanError", input_error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const PlanError& e) {
      plan_error(e.what());
    } catch (const InputError& e) {
      input_error(e.what());
    } catch (const Error& e) {
      error(e.what());
    }
  });
  m.attr("__version__") = std::string(shardscope::sim::Version());
  BindSimulate(m);
  BindAnalysis(m);
}

// The shardscope Python module's C++ side (_shardscope): what the bindings share. Library
// errors arrive as Status values and leave as Python exceptions of the module
// (shardscope.InputError for bad input, shardscope.Error for the rest); results leave as
// plain Python objects (dicts, lists, str), JSON texts parsed with Python's json module so
// they hold exactly what the CLI writes.
#ifndef SHARDSCOPE_PYTHON_BINDINGS_H_
#define SHARDSCOPE_PYTHON_BINDINGS_H_

#include <stdexcept>
#include <string>
#include <utility>

#include <pybind11/pybind11.h>

#include "shardscope/base/status.h"
#include "shardscope/sim/lowering/load_input.h"
#include "shardscope/traces/timeline.h"

namespace shardscope::python {

namespace py = pybind11;

// Thrown inside the bindings only; pybind11 turns them into the module's exception classes.
struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct PlanError : InputError {
  using InputError::InputError;
};
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws the exception for `status` (InvalidInput -> InputError, others -> Error).
[[noreturn]] void Raise(const Status& status);
inline void Check(const Status& status) {
  if (!status.ok()) Raise(status);
}
template <typename T>
T Take(StatusOr<T> value) {
  if (!value.ok()) Raise(value.status());
  return std::move(value).value();
}

// A loaded plan or schedule: what sim::LoadInput gives, and what it was loaded from.
struct PlanHandle {
  sim::LoadedInput input;
  std::string label;  // the path, or "<dict>"
  std::string yaml;   // the YAML text parsed, for a plan made from a dict ("" for a file)
};

// Python's json.loads(text).
py::object ParseJson(const std::string& text);

// The slices and counters of `timeline` as columns (lists), one dict per pid:
// {pid: {"slices": {"tid", "thread", "op_id", "name", "category", "start_ns", "duration_ns"},
//        "counters": {name: {"time_ns", <key>: [...]}}}}
py::dict TimelineColumns(const traces::Timeline& timeline);

// Registers the functions of each part.
void BindSimulate(py::module_& m);  // plans, simulate, compare, memory, fit, check, schedule ops
void BindAnalysis(py::module_& m);  // import, read_trace, analyze, diff, flight_recorder

}  // namespace shardscope::python

#endif  // SHARDSCOPE_PYTHON_BINDINGS_H_

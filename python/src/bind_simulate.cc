// The simulator's side of the module: plans, simulate, compare, memory, fit, check, and a
// rank's program (to pick an op for an injected OOM). Each function converts its arguments,
// releases the GIL, calls the library function the CLI calls, and converts the result.
#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "shardscope/base/file_io.h"
#include "shardscope/base/output_dir.h"
#include "shardscope/sim/hangs/check.h"
#include "shardscope/sim/memory/memory_report.h"
#include "shardscope/sim/memory/memory_text.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/sim/report/report.h"
#include "shardscope/sim/report/simulate_run.h"
#include "shardscope/sim/report/version.h"
#include "shardscope/sim/simulate/simulate.h"
#include "shardscope/traces/chrome_trace.h"

namespace shardscope::python {
namespace {

// A plan error (bad YAML, a bad key) is a PlanError; other failures keep their class.
[[noreturn]] void RaiseLoad(const Status& status) {
  if (status.code() == StatusCode::kInvalidInput) throw PlanError(status.message());
  Raise(status);
}

// The size limits (work_limits.h) as the module's arguments name them; the warnings are kept
// for Warn.
sim::WorkLimits ModuleLimits(bool force, std::vector<std::string>* warnings) {
  sim::WorkLimits limits;
  limits.force = force;
  limits.warn = [warnings](const std::string& line) { warnings->push_back(line); };
  limits.force_flag = "force=True";
  limits.trace_ranks_flag = "trace_ranks";
  limits.fewer_ranks = "trace_ranks=[0], or []";
  return limits;
}

// Each warning as a Python UserWarning (the CLI prints them on stderr).
void Warn(const std::vector<std::string>& warnings) {
  if (warnings.empty()) return;
  const py::object warn = py::module_::import("warnings").attr("warn");
  for (const std::string& line : warnings) warn(line);
}

// The load options of load_plan (simulate_ranks nullopt) and of simulate given a path or a
// dict, which checks what the simulation will hold before the plan is lowered, as
// `shardscope simulate` does: simulate_ranks is the number of traced ranks, or
// kDefaultTraceRanks (the first node) or kAllRanks.
constexpr int64_t kDefaultTraceRanks = -1;
constexpr int64_t kAllRanks = -2;
sim::LoadOptions ModuleLoadOptions(bool force, std::optional<int64_t> simulate_ranks,
                                   std::vector<std::string>* warnings) {
  sim::LoadOptions options;
  options.limits = ModuleLimits(force, warnings);
  if (simulate_ranks) {
    const int64_t ranks = *simulate_ranks;
    options.traced_ranks = [ranks](int32_t world, int32_t gpus_per_node) -> StatusOr<int64_t> {
      if (ranks == kAllRanks) return static_cast<int64_t>(world);
      if (ranks == kDefaultTraceRanks) return static_cast<int64_t>(std::min(world, gpus_per_node));
      return ranks;
    };
  }
  return options;
}

PlanHandle LoadPath(const std::string& path, bool force, std::optional<int64_t> simulate_ranks) {
  std::vector<std::string> warnings;
  StatusOr<sim::LoadedInput> loaded = [&] {
    py::gil_scoped_release release;
    return sim::LoadInput(path, ModuleLoadOptions(force, simulate_ranks, &warnings));
  }();
  Warn(warnings);
  if (!loaded.ok()) RaiseLoad(loaded.status());
  return PlanHandle{std::move(loaded).value(), path, ""};
}

// `text` is the YAML the Python side made from a dict; `source` names it in messages.
PlanHandle LoadYaml(const std::string& text, const std::string& source, bool force,
                    std::optional<int64_t> simulate_ranks) {
  std::vector<std::string> warnings;
  StatusOr<sim::LoadedInput> loaded = [&]() -> StatusOr<sim::LoadedInput> {
    py::gil_scoped_release release;
    SHARDSCOPE_ASSIGN_OR_RETURN(sim::Plan plan, sim::ParsePlan(text, source));
    return sim::LoadPlan(std::move(plan), source, ModuleLoadOptions(force, simulate_ranks, &warnings));
  }();
  Warn(warnings);
  if (!loaded.ok()) RaiseLoad(loaded.status());
  return PlanHandle{std::move(loaded).value(), source, text};
}

py::list Ops(const PlanHandle& plan, int32_t rank) {
  const traces::Schedule& schedule = plan.input.schedule;
  if (rank < 0 || rank >= schedule.world_size()) {
    throw InputError(fmt::format("rank: expected 0 <= rank < {}, got {}", schedule.world_size(), rank));
  }
  const traces::Program& program = schedule.ProgramOf(rank);
  py::list ops;
  for (const traces::Op& op : program.ops) {
    py::dict d;
    d["id"] = op.id;
    d["kind"] = std::string(traces::OpKindName(op.payload));
    d["name"] = std::string(program.NameOf(op.name));
    d["phase"] = std::string(traces::PhaseName(op.tags.phase));
    d["micro_batch"] = op.tags.micro_batch;
    d["module"] = std::string(program.NameOf(op.tags.module));
    std::visit(
        [&](const auto& payload) {
          using T = std::decay_t<decltype(payload)>;
          if constexpr (std::is_same_v<T, traces::AllocateOp>) {
            d["tensor"] = program.tensors[static_cast<size_t>(payload.tensor)];
            d["bytes"] = payload.bytes;
          }
          if constexpr (requires { payload.stream; }) {
            d["stream"] = program.streams[static_cast<size_t>(payload.stream)].name;
          }
        },
        op.payload);
    ops.append(d);
  }
  return ops;
}

// Events to both the in-memory timeline (the arrays handed back) and, with an output
// folder, trace.json.
class TeeSink : public traces::TimelineSink {
 public:
  TeeSink(traces::TimelineSink& a, traces::TimelineSink* b) : a_(a), b_(b) {}
  void OnProcess(const traces::ProcessInfo& x) override { a_.OnProcess(x); if (b_) b_->OnProcess(x); }
  void OnThread(const traces::ThreadInfo& x) override { a_.OnThread(x); if (b_) b_->OnThread(x); }
  void OnSlice(const traces::Slice& x) override { a_.OnSlice(x); if (b_) b_->OnSlice(x); }
  void OnInstant(const traces::Instant& x) override { a_.OnInstant(x); if (b_) b_->OnInstant(x); }
  void OnCounter(const traces::CounterSample& x) override { a_.OnCounter(x); if (b_) b_->OnCounter(x); }
  void OnFlow(const traces::Flow& x) override { a_.OnFlow(x); if (b_) b_->OnFlow(x); }

 private:
  traces::TimelineSink& a_;
  traces::TimelineSink* b_;
};

// `size_checked`: the plan was loaded for this simulation (LoadOptions::traced_ranks), so what
// it will hold was checked before lowering; otherwise it is checked here.
py::dict SimulatePlan(const PlanHandle& plan, std::optional<std::vector<int32_t>> trace_ranks,
                      const std::map<int32_t, double>& stragglers, std::optional<std::pair<int64_t, int64_t>> inject_oom,
                      std::optional<std::string> output, bool force, bool size_checked) {
  const traces::Schedule& schedule = plan.input.schedule;
  const int32_t world = schedule.world_size();
  sim::SimulateRunOptions options;
  for (const auto& [rank, factor] : stragglers) {
    if (!sim::ValidStraggler(rank, factor, world)) {
      throw InputError(fmt::format("stragglers: expected {{rank: factor}} with 0 <= rank < {} and 1 <= factor <= {}, "
                                   "got {{{}: {}}}",
                                   world, sim::kMaxRankSlowdownFactor, rank, factor));
    }
  }
  options.stragglers = stragglers;
  if (inject_oom) {
    StatusOr<sim::InjectedOom> at = sim::InjectedOomAt(schedule, inject_oom->first, inject_oom->second);
    if (!at.ok()) {
      throw InputError(fmt::format("inject_oom: expected (rank, op_id) of an allocate op in that rank's program "
                                   "(Plan.ops(rank) lists them), got ({}, {}): {}",
                                   inject_oom->first, inject_oom->second, at.status().message()));
    }
    options.inject_oom = *at;
  }
  if (trace_ranks) {
    for (int32_t rank : *trace_ranks) {
      if (rank < 0 || rank >= world) {
        throw InputError(fmt::format("trace_ranks: rank {} is outside the world of {} ranks", rank, world));
      }
    }
    options.trace_ranks = std::move(trace_ranks);
  }
  if (!size_checked) {
    std::vector<std::string> warnings;
    const int64_t traced = options.trace_ranks ? static_cast<int64_t>(options.trace_ranks->size())
                                               : std::min(world, plan.input.setup.cluster.gpus_per_node);
    const Status size = sim::CheckSimulateOf(plan.input, traced, ModuleLimits(force, &warnings));
    Warn(warnings);
    Check(size);
  }
  traces::Timeline timeline;
  std::map<std::string, std::string> dumps;  // flight_recorder_rank<N>.json
  std::vector<std::string> written;
  sim::SimulateRun run;
  {
    py::gil_scoped_release release;
    // With an output folder, the files go into its staging folder and replace the folder's
    // previous set as one (base/output_dir.h), as `simulate -o` does.
    std::unique_ptr<OutputDir> out;
    std::unique_ptr<traces::ChromeTraceWriter> writer;
    if (output) {
      out = Take(OutputDir::Create(*output, sim::SimulateOutputs()));
      traces::TraceInfo info;
      info.world_size = world;
      info.producer = fmt::format("shardscope {} simulate", sim::Version());
      writer = Take(traces::ChromeTraceWriter::Open(out->StagingPath("trace.json"), info));
    }
    TeeSink sink(timeline, writer.get());
    const auto write_file = [&](const std::string& name, const std::string& content) -> Status {
      if (name.starts_with("flight_recorder_rank")) dumps[name] = content;
      if (!out) return Status::Ok();
      written.push_back(out->FinalPath(name));
      return traces::WriteFileAtomically(out->StagingPath(name), content);
    };
    run = Take(sim::RunSimulation(plan.input, options, sink, write_file));
    if (writer) {
      Check(writer->Finish());
      Check(traces::WriteFileAtomically(out->StagingPath("report.json"), run.report_json));
      Check(out->Commit());
      written.push_back(out->FinalPath("trace.json"));
      written.push_back(out->FinalPath("report.json"));
    }
  }
  py::dict out;
  out["report"] = ParseJson(run.report_json);
  out["summary"] = sim::SimulateSummaryText(plan.input, run);
  out["timeline"] = TimelineColumns(timeline);
  py::dict flight_recorder;
  for (int32_t rank : run.flight_recorder_ranks) {
    flight_recorder[py::int_(rank)] = ParseJson(dumps[fmt::format("flight_recorder_rank{}.json", rank)]);
  }
  out["flight_recorder"] = flight_recorder;
  out["files"] = written;
  return out;
}

py::dict Compare(const PlanHandle& a, const PlanHandle& b) {
  std::string text, report_a, report_b;
  {
    py::gil_scoped_release release;
    const sim::SimulationResult result_a = Take(sim::SimulateUntraced(a.input));
    const sim::SimulationResult result_b = Take(sim::SimulateUntraced(b.input));
    text = sim::CompareText(sim::ComparedRun{a.label, &a.input.schedule, &a.input.setup, &result_a},
                            sim::ComparedRun{b.label, &b.input.schedule, &b.input.setup, &result_b});
    report_a = sim::ReportJson(a.input.schedule, a.input.setup, result_a);
    report_b = sim::ReportJson(b.input.schedule, b.input.setup, result_b);
  }
  py::dict out;
  out["text"] = text;
  out["reports"] = py::make_tuple(ParseJson(report_a), ParseJson(report_b));
  return out;
}

py::dict Memory(const PlanHandle& plan, std::optional<std::vector<int32_t>> ranks) {
  std::string json, text;
  {
    py::gil_scoped_release release;
    const std::vector<sim::MemoryBreakdown> breakdowns =
        ranks ? Take(sim::SimulateMemory(plan.input.schedule, plan.input.setup, *ranks))
              : Take(sim::SimulateMemoryDefaultRanks(plan.input.schedule, plan.input.setup));
    json = sim::MemoryBreakdownsJson(plan.label, plan.input.schedule.world_size(), breakdowns);
    for (const sim::MemoryBreakdown& b : breakdowns) text += "\n" + sim::MemoryBreakdownText(b);
  }
  py::dict out = ParseJson(json).cast<py::dict>();
  out["text"] = text;
  return out;
}

py::dict Fit(const PlanHandle& plan, const std::string& search, std::optional<int64_t> max_micro_batch) {
  if (!plan.input.plan) throw InputError(fmt::format("{}: fit needs a plan, not a schedule JSON", plan.label));
  const std::optional<sim::FitDimension> dimension = sim::ParseFitDimension(search);
  if (!dimension) {
    throw InputError(
        fmt::format("search: expected micro_batch_size or activation_checkpointing, got '{}'", search));
  }
  sim::FitResult fit;
  {
    py::gil_scoped_release release;
    fit = Take(sim::FitSearch(*plan.input.plan, *dimension, max_micro_batch.value_or(sim::kDefaultFitMaxMicroBatch), {}));
  }
  py::list candidates;
  for (const sim::FitCandidate& c : fit.candidates) {
    py::dict d;
    d["micro_batch_size"] = c.micro_batch_size;
    d["activation_checkpointing"] = std::string(sim::ActivationCheckpointingName(c.ac));
    d["fits"] = c.fits;
    d["peak_reserved_bytes"] = c.peak_reserved_bytes;
    d["num_alloc_retries"] = c.num_alloc_retries;
    d["oom_ranks"] = c.oom_ranks;
    d["step_time_ns"] = c.step_time_ns;
    d["tokens_per_second_per_gpu"] = c.tokens_per_second_per_gpu;
    d["init_oom"] = c.init_oom;
    d["note"] = c.note;
    candidates.append(d);
  }
  py::dict out;
  out["dimension"] = std::string(sim::FitDimensionName(fit.dimension));
  out["capacity_bytes"] = fit.capacity_bytes;
  out["candidates"] = candidates;
  out["best"] = fit.best ? py::object(py::int_(*fit.best)) : py::object(py::none());
  out["reason"] = fit.reason;
  out["text"] = sim::FitReportText(plan.label, fit);
  return out;
}

py::dict CheckPlan(const PlanHandle& plan, const std::vector<int32_t>& oom_ranks,
                   const std::map<int32_t, double>& stragglers, std::optional<double> watchdog_minutes,
                   std::optional<double> seq_len_factor, std::optional<double> moe_load, std::optional<double> held_gib,
                   std::optional<int> threads) {
  // None: the library's default, as the CLI's flags have it.
  sim::CheckSettings settings;
  settings.oom_ranks = oom_ranks;
  settings.stragglers = stragglers;
  if (watchdog_minutes) settings.watchdog_minutes = *watchdog_minutes;
  if (seq_len_factor) settings.seq_len_factor = *seq_len_factor;
  if (moe_load) settings.moe_load = *moe_load;
  if (held_gib) settings.held_gib = *held_gib;
  if (threads) settings.threads = *threads;
  const int32_t world = plan.input.schedule.world_size();
  for (int32_t rank : oom_ranks) {
    if (rank < 0 || rank >= world) {
      throw InputError(fmt::format("oom_ranks: rank {} is outside the world of {} ranks", rank, world));
    }
  }
  for (const auto& [rank, factor] : stragglers) {
    if (!sim::ValidStraggler(rank, factor, world)) {
      throw InputError(fmt::format("stragglers: expected {{rank: factor}} with 0 <= rank < {} and 1 <= factor <= {}, "
                                   "got {{{}: {}}}",
                                   world, sim::kMaxRankSlowdownFactor, rank, factor));
    }
  }
  std::string text;
  sim::CheckRun run;
  {
    py::gil_scoped_release release;
    run = Take(sim::RunCheck(plan.input, plan.label, settings, [&](const std::string& s) { text += s; }, {}));
  }
  static constexpr const char* kVerdicts[] = {"safe", "hangs", "baseline-hangs", "baseline-oom"};
  py::list cases;
  for (const sim::FaultCaseResult& r : run.results) {
    py::dict d;
    d["label"] = r.fault.Label();
    d["kind"] = std::string(r.fault.kind == sim::FaultKind::kOom          ? "oom"
                            : r.fault.kind == sim::FaultKind::kStraggler  ? "straggler"
                            : r.fault.kind == sim::FaultKind::kDivergence ? "divergence"
                                                                          : "memory-held");
    d["rank"] = r.fault.rank;
    d["op_id"] = r.fault.op_id;
    d["boundary"] = r.fault.boundary;
    d["outcome"] = std::string(sim::FaultOutcomeName(r.outcome));
    d["safe"] = r.Safe();
    d["where"] = r.where;
    d["blocked_ranks"] = r.blocked_ranks;
    d["step_ns"] = r.step_ns;
    d["watchdog_fires_at_ns"] = r.watchdog_fires_at_ns;
    d["cost_ns"] = r.cost_ns;
    cases.append(d);
  }
  py::dict out;
  out["verdict"] = kVerdicts[static_cast<int>(run.verdict)];
  out["baseline_step_ns"] = run.baseline_step_ns;
  out["cases"] = cases;
  out["baseline_why"] = run.baseline_why;
  out["failure"] = run.failure;
  out["text"] = text;
  return out;
}

}  // namespace

void BindSimulate(py::module_& m) {
  py::class_<PlanHandle, std::shared_ptr<PlanHandle>>(m, "Plan",
                                                     "A plan (YAML file or dict) or schedule JSON, loaded and lowered")
      .def_readonly("label", &PlanHandle::label, "The file, or '<dict>'")
      .def_readonly("yaml", &PlanHandle::yaml, "The YAML text made from a dict (messages' line numbers point into it)")
      .def_property_readonly("world_size", [](const PlanHandle& p) { return p.input.schedule.world_size(); })
      .def_property_readonly("is_plan", [](const PlanHandle& p) { return p.input.plan.has_value(); })
      .def_property_readonly("strategy",
                             [](const PlanHandle& p) {
                               return p.input.plan ? std::string(sim::StrategyName(p.input.plan->strategy))
                                                   : std::string();
                             })
      .def_property_readonly("gpus_per_node", [](const PlanHandle& p) { return p.input.setup.cluster.gpus_per_node; })
      .def("ops", &Ops, py::arg("rank") = 0, "The ops of a rank's program, in program order");
  m.def("_load_path", &LoadPath, py::arg("path"), py::arg("force"), py::arg("simulate_ranks"));
  m.def("_load_yaml", &LoadYaml, py::arg("text"), py::arg("source"), py::arg("force"), py::arg("simulate_ranks"));
  m.attr("_DEFAULT_TRACE_RANKS") = kDefaultTraceRanks;
  m.attr("_ALL_RANKS") = kAllRanks;
  m.def("_simulate", &SimulatePlan, py::arg("plan"), py::arg("trace_ranks"), py::arg("stragglers"),
        py::arg("inject_oom"), py::arg("output"), py::arg("force"), py::arg("size_checked"));
  m.def("_compare", &Compare, py::arg("a"), py::arg("b"));
  m.def("_memory", &Memory, py::arg("plan"), py::arg("ranks"));
  m.def("_fit", &Fit, py::arg("plan"), py::arg("search"), py::arg("max_micro_batch"));
  m.def("_check", &CheckPlan, py::arg("plan"), py::arg("oom_ranks"), py::arg("stragglers"),
        py::arg("watchdog_minutes"), py::arg("seq_len_factor"), py::arg("moe_load"), py::arg("held_gib"),
        py::arg("threads"));
}

}  // namespace shardscope::python

// `shardscope calibrate MEASURED... --schedule SCHEDULE -o profile.yaml`: fits the cost models
// to measured timelines of a schedule (shardscope's own traces, which carry op ids: from
// `shardscope simulate` today, `shardscope run --profile` later), writes the calibration
// profile and prints the residual table. docs/CALIBRATION.md has the method.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "progress.h"
#include "inputs.h"
#include "shardscope/analysis/calibration_fit.h"
#include "shardscope/traces/chrome_trace.h"

namespace shardscope::cli {
namespace {

// The run a measured trace came from, as the report.json that `simulate` and `run` write
// beside their trace.json says (docs/REPORT.md): which GPU preset, which device, which backend.
struct RunReport {
  std::string gpu;          // cluster.gpu (a preset name)
  std::string device_name;  // runtime.device_name (CUDA backend: cudaDeviceProp::name)
  std::string backend;      // runtime.backend: "host" | "cuda" ("" for simulate)
  double time_scale = 1;    // runtime.time_scale (host backend)
};

// nullopt when there is no report.json beside `trace_path` (a trace copied elsewhere).
StatusOr<std::optional<RunReport>> ReadRunReportBeside(const std::string& trace_path) {
  const std::filesystem::path path = std::filesystem::path(trace_path).parent_path() / "report.json";
  std::ifstream in(path);
  if (!in) return std::optional<RunReport>();
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::InvalidInput(fmt::format("{}: not a JSON object (the report beside {})", path.string(), trace_path));
  }
  RunReport report;
  if (j.contains("cluster") && j["cluster"].is_object() && j["cluster"].contains("gpu") &&
      j["cluster"]["gpu"].is_string()) {
    report.gpu = j["cluster"]["gpu"].get<std::string>();
  }
  if (j.contains("runtime") && j["runtime"].is_object()) {
    const nlohmann::json& r = j["runtime"];
    if (r.contains("device_name") && r["device_name"].is_string()) report.device_name = r["device_name"].get<std::string>();
    if (r.contains("backend") && r["backend"].is_string()) report.backend = r["backend"].get<std::string>();
    if (r.contains("time_scale") && r["time_scale"].is_number()) report.time_scale = r["time_scale"].get<double>();
  }
  return std::optional<RunReport>(report);
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// Refuses a trace measured on another GPU than the schedule's cluster: fitted efficiencies are
// fractions of one GPU's peak. The preset's family ("h100" of "h100-sxm5-80gb") must appear in
// the CUDA device name ("NVIDIA H100 80GB HBM3").
Status CheckRunMatches(const std::string& trace_path, const RunReport& report, const sim::GpuSpec& gpu) {
  if (!report.gpu.empty() && report.gpu != gpu.name) {
    return Status::InvalidInput(fmt::format(
        "{}: measured with GPU preset {} (report.json beside it), but the schedule's cluster has {}: efficiencies "
        "are fractions of one GPU's peak and do not transfer",
        trace_path, report.gpu, gpu.name));
  }
  const std::string family = gpu.name.substr(0, gpu.name.find('-'));
  if (!report.device_name.empty() && Lower(report.device_name).find(family) == std::string::npos) {
    return Status::InvalidInput(fmt::format(
        "{}: measured on a \"{}\" (report.json beside it), which is not the schedule's GPU {}", trace_path,
        report.device_name, gpu.name));
  }
  return Status::Ok();
}

struct CalibrateOptions {
  std::vector<std::string> measured;
  std::string schedule;
  std::string output = "profile.yaml";
  bool quiet = false;
};

Status RunCalibrate(const CalibrateOptions& options) {
  SHARDSCOPE_ASSIGN_OR_RETURN(LoadedInput loaded,
                              LoadInput(options.schedule, LoadOptionsWith(false, options.quiet)));
  std::vector<traces::Timeline> timelines;
  timelines.reserve(options.measured.size());
  std::vector<std::string> notes;
  for (const std::string& path : options.measured) {
    SHARDSCOPE_ASSIGN_OR_RETURN(std::optional<RunReport> report, ReadRunReportBeside(path));
    if (report) {
      SHARDSCOPE_RETURN_IF_ERROR(CheckRunMatches(path, *report, loaded.setup.cluster.gpu));
      if (report->backend == "host") {
        notes.push_back(fmt::format("{}: a host-backend run (kernels busy-wait the prediction x {}): the fit "
                                    "describes the prediction, not a GPU",
                                    path, report->time_scale));
      }
    }
    Progress::Note(options.quiet, fmt::format("reading {}", path));
    SHARDSCOPE_ASSIGN_OR_RETURN(traces::Timeline timeline, traces::ReadChromeTraceFile(path));
    timelines.push_back(std::move(timeline));
  }
  std::vector<const traces::Timeline*> measured;
  for (const traces::Timeline& t : timelines) measured.push_back(&t);
  SHARDSCOPE_ASSIGN_OR_RETURN(sim::CalibrationFit fit,
                              sim::FitCalibration(loaded.schedule, loaded.setup.cluster, measured, options.measured));
  // What a simulation would refuse to read (calibration.cc's limits: an efficiency above 1, a
  // launch cost above a second...) is not written: the traces cannot be this GPU's.
  if (StatusOr<sim::CalibrationProfile> back =
          sim::ParseCalibrationProfile(sim::CalibrationProfileYaml(fit.profile), options.output);
      !back.ok()) {
    std::string why;
    for (const std::string& warning : fit.warnings) why += "; " + warning;
    return Status::InvalidInput(fmt::format(
        "the measured traces give a profile no simulation can use, so {} is not written: {}{}",
        options.output, back.status().message(), why));
  }
  SHARDSCOPE_RETURN_IF_ERROR(sim::WriteCalibrationProfile(fit.profile, options.output));
  std::cout << fmt::format("{} trace(s) of {}: {} slice(s) joined to schedule ops, {} with unknown op ids\n",
                           options.measured.size(), options.schedule, fit.joined_slices, fit.unmatched_slices);
  std::cout << sim::CalibrationTableText(fit.profile, loaded.setup.cluster);
  for (const std::string& note : fit.notes) std::cout << "note: " << note << "\n";
  for (const std::string& note : notes) std::cout << "note: " << note << "\n";
  if (!options.quiet) {
    for (const std::string& warning : fit.warnings) std::cerr << "warning: implausible fit: " << warning << "\n";
  }
  std::cout << fmt::format("wrote {}\n", options.output);
  return Status::Ok();
}

}  // namespace

CommandRunner AddCalibrateCommand(CLI::App& app) {
  auto options = std::make_shared<CalibrateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "calibrate", "Fit the cost models (GEMM/attention efficiency, bandwidth, NCCL alpha/beta, launch cost, "
                   "contention) to measured traces of a schedule; write a calibration profile");
  cmd->add_option("measured", options->measured, "Measured trace.json files with op ids (one or more)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--schedule", options->schedule, "The schedule JSON (or plan YAML) the traces ran")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("-o,--output", options->output, "Calibration profile YAML to write")->capture_default_str();
  cmd->add_flag("-q,--quiet", options->quiet, "No progress messages or warnings on stderr");
  return [cmd, options]() -> std::optional<Status> {
    if (!*cmd) return std::nullopt;
    return RunCalibrate(*options);
  };
}

}  // namespace shardscope::cli

// `shardscope calibrate MEASURED... --schedule SCHEDULE -o profile.yaml`: fits the cost models
// to measured timelines of a schedule (shardscope's own traces, which carry op ids: from
// `shardscope simulate` today, `shardscope run --profile` later), writes the calibration
// profile and prints the residual table. docs/CALIBRATION.md has the method.
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "commands.h"
#include "inputs.h"
#include "shardscope/sim/calibration.h"
#include "shardscope/traces/chrome_trace.h"

namespace shardscope::cli {
namespace {

struct CalibrateOptions {
  std::vector<std::string> measured;
  std::string schedule;
  std::string output = "profile.yaml";
};

Status RunCalibrate(const CalibrateOptions& options) {
  SHARDSCOPE_ASSIGN_OR_RETURN(LoadedInput loaded, LoadInput(options.schedule));
  std::vector<traces::Timeline> timelines;
  timelines.reserve(options.measured.size());
  for (const std::string& path : options.measured) {
    SHARDSCOPE_ASSIGN_OR_RETURN(traces::Timeline timeline, traces::ReadChromeTraceFile(path));
    timelines.push_back(std::move(timeline));
  }
  std::vector<const traces::Timeline*> measured;
  for (const traces::Timeline& t : timelines) measured.push_back(&t);
  SHARDSCOPE_ASSIGN_OR_RETURN(sim::CalibrationFit fit, sim::FitCalibration(loaded.schedule, loaded.setup.cluster, measured));
  SHARDSCOPE_RETURN_IF_ERROR(sim::WriteCalibrationProfile(fit.profile, options.output));
  std::cout << fmt::format("{} trace(s) of {}: {} slice(s) joined to schedule ops, {} with unknown op ids\n",
                           options.measured.size(), options.schedule, fit.joined_slices, fit.unmatched_slices);
  std::cout << sim::CalibrationTableText(fit.profile, loaded.setup.cluster);
  for (const std::string& note : fit.notes) std::cout << "note: " << note << "\n";
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
  return [cmd, options]() -> std::optional<Status> {
    if (!*cmd) return std::nullopt;
    return RunCalibrate(*options);
  };
}

}  // namespace shardscope::cli

// Fuzzes the simulate path: a schedule JSON through the reader, the metadata (SetupFromSchedule),
// the cost models, the engine and the report (report.json, the summary, the hang analysis, a
// Flight Recorder dump of a blocked rank). Any input must end in a result or an InvalidInput
// status: never a crash, an undefined operation (UBSan), a hang, or an overflowing clock.
//
// Per-input work stays small so the fuzzer explores inputs rather than long runs: at most
// kMaxRanks ranks and kMaxOps ops in all (bigger inputs are returned early), and no file is
// read (cluster.calibration is dropped from the metadata: it names a profile on disk).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "shardscope/sim/engine/engine.h"
#include "shardscope/sim/hangs/hang.h"
#include "shardscope/sim/lowering/schedule_metadata.h"
#include "shardscope/sim/report/report.h"
#include "shardscope/sim/simulate/simulate.h"
#include "shardscope/traces/schedule_json.h"

namespace {

constexpr int32_t kMaxRanks = 16;
constexpr size_t kMaxOps = 4096;

void RequireInvalidInput(const shardscope::Status& status) {
  if (!status.ok() && status.code() != shardscope::StatusCode::kInvalidInput) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardscope;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  StatusOr<traces::Schedule> read = traces::ParseScheduleJson(text, "fuzz");
  if (!read.ok()) {
    RequireInvalidInput(read.status());
    return 0;
  }
  traces::Schedule schedule = std::move(read).value();
  size_t ops = 0;
  for (const traces::Program& program : schedule.programs) ops += program.ops.size();
  if (schedule.world_size() > kMaxRanks || ops > kMaxOps) return 0;
  schedule.metadata.erase("cluster.calibration");

  StatusOr<sim::SimulationSetup> setup = sim::SetupFromSchedule(schedule, "fuzz");
  if (!setup.ok()) {
    RequireInvalidInput(setup.status());
    return 0;
  }
  StatusOr<std::unique_ptr<sim::CostProvider>> costs = sim::MakeCostProvider(schedule, *setup);
  if (!costs.ok()) {
    RequireInvalidInput(costs.status());
    return 0;
  }
  sim::EngineConfig config = sim::EngineConfigFor(*setup, schedule);
  StatusOr<sim::SimulationResult> result = sim::Simulate(schedule, **costs, config, nullptr);
  if (!result.ok()) {
    // The engine's one input error is a run past the simulated-time horizon; anything else
    // (kInternal: a model scheduling an event in the past) is a bug.
    RequireInvalidInput(result.status());
    return 0;
  }
  // Every rank's clock stays near the horizon, so the report's arithmetic cannot overflow.
  // (Events stay below the horizon; a host clock adds at most its program's host costs to one.)
  if (result->makespan_ns < 0 || result->makespan_ns > 2 * traces::kMaxSimulatedNs) std::abort();
  const std::string report = sim::ReportJson(schedule, *setup, *result, nullptr);
  const std::string summary = sim::SummaryText(schedule, *setup, *result);
  if (report.empty() || summary.empty()) std::abort();
  if (result->hung && !result->blocked.empty()) {
    const sim::HangReport hang = sim::AnalyzeHang(schedule, *result);
    if (sim::HangReportJson(schedule, hang).empty()) std::abort();
  }
  return 0;
}

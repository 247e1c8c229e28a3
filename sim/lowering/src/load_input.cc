#include "shardscope/sim/lowering/load_input.h"

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include "shardscope/sim/lowering/lowering.h"
#include "shardscope/traces/schedule_json.h"

namespace shardscope::sim {
namespace {

// The driver of a schedule JSON's size: its ops as given.
constexpr const char* kScheduleDriver = "the schedule's ops";

StatusOr<bool> LooksLikeScheduleJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IoError(fmt::format("cannot read '{}': {}", path, std::strerror(errno)));
  char c = 0;
  while (in.get(c)) {
    if (!std::isspace(static_cast<unsigned char>(c))) return c == '{';
  }
  return false;
}

// What the simulation will hold and write, when the caller says which ranks it traces.
Status CheckTraced(const LoadOptions& options, const WorkEstimate& work, int32_t world, int32_t gpus_per_node) {
  if (!options.traced_ranks) return Status::Ok();
  SHARDSCOPE_ASSIGN_OR_RETURN(const int64_t traced, options.traced_ranks(world, gpus_per_node));
  return CheckSimulate(EstimateSimulate(work, traced), traced, work.driver, options.limits);
}

}  // namespace

StatusOr<LoadedInput> LoadInput(const std::string& path, const LoadOptions& options) {
  SHARDSCOPE_ASSIGN_OR_RETURN(bool is_json, LooksLikeScheduleJson(path));
  if (is_json) {
    LoadedInput loaded;
    SHARDSCOPE_ASSIGN_OR_RETURN(loaded.schedule, traces::ReadScheduleFile(path));
    SHARDSCOPE_ASSIGN_OR_RETURN(loaded.setup, SetupFromSchedule(loaded.schedule, path));
    loaded.setup.simulate_every_rank = options.simulate_every_rank;
    SHARDSCOPE_RETURN_IF_ERROR(CheckTraced(options, ScheduleWork(loaded.schedule, kScheduleDriver),
                                               loaded.schedule.world_size(), loaded.setup.cluster.gpus_per_node));
    return loaded;
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(Plan plan, LoadPlanFile(path));
  return LoadPlan(std::move(plan), path, options);
}

StatusOr<LoadedInput> LoadPlan(Plan plan, const std::string& label, const LoadOptions& options) {
  // Before lowering: a plan too big to hold is refused before it is built.
  SHARDSCOPE_ASSIGN_OR_RETURN(WorkEstimate estimate, EstimatePlanWork(plan));
  if (estimate.ops > 0) {
    SHARDSCOPE_RETURN_IF_ERROR(CheckWork(estimate, label, options.limits));
    SHARDSCOPE_RETURN_IF_ERROR(
        CheckTraced(options, estimate, plan.cluster.world_size(), plan.cluster.gpus_per_node));
  }
  LoadedInput loaded;
  SHARDSCOPE_ASSIGN_OR_RETURN(loaded.schedule, LowerPlan(plan));
  if (estimate.ops == 0) {  // lowered whole: counted now
    const WorkEstimate lowered = ScheduleWork(loaded.schedule, estimate.driver);
    SHARDSCOPE_RETURN_IF_ERROR(CheckWork(lowered, label, options.limits));
    SHARDSCOPE_RETURN_IF_ERROR(
        CheckTraced(options, lowered, plan.cluster.world_size(), plan.cluster.gpus_per_node));
  }
  loaded.plan = std::move(plan);
  SHARDSCOPE_ASSIGN_OR_RETURN(loaded.setup, SetupFromSchedule(loaded.schedule, label));
  loaded.setup.simulate_every_rank = options.simulate_every_rank;
  return loaded;
}

Status CheckSimulateOf(const LoadedInput& input, int64_t traced_ranks, const WorkLimits& limits) {
  const WorkEstimate work = LoadedWork(input);
  return CheckSimulate(EstimateSimulate(work, traced_ranks), traced_ranks, work.driver, limits);
}

WorkEstimate LoadedWork(const LoadedInput& input) {
  return ScheduleWork(input.schedule, input.plan ? PlanWorkDriver(*input.plan) : std::string(kScheduleDriver));
}

}  // namespace shardscope::sim

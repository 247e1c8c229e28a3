#include "inputs.h"

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "shardscope/sim/lowering/lowering.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/traces/schedule_json.h"
#include "work_limits.h"

namespace shardscope::cli {
namespace {

StatusOr<bool> LooksLikeScheduleJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IoError(fmt::format("cannot read '{}': {}", path, std::strerror(errno)));
  char c = 0;
  while (in.get(c)) {
    if (!std::isspace(static_cast<unsigned char>(c))) return c == '{';
  }
  return false;
}

}  // namespace

StatusOr<LoadedInput> LoadInput(const std::string& path, const LoadOptions& options) {
  SHARDSCOPE_ASSIGN_OR_RETURN(bool is_json, LooksLikeScheduleJson(path));
  LoadedInput loaded;
  // What the simulation will hold and write, when the command says which ranks it traces.
  const auto check_simulate = [&](const WorkEstimate& work, int32_t world, int32_t gpus_per_node) -> Status {
    if (!options.traced_ranks) return Status::Ok();
    SHARDSCOPE_ASSIGN_OR_RETURN(const int64_t traced, options.traced_ranks(world, gpus_per_node));
    return CheckSimulate(EstimateSimulate(work, traced), traced, work.driver, options.force, options.quiet);
  };
  if (is_json) {
    SHARDSCOPE_ASSIGN_OR_RETURN(loaded.schedule, traces::ReadScheduleFile(path));
    SHARDSCOPE_ASSIGN_OR_RETURN(loaded.setup, sim::SetupFromSchedule(loaded.schedule, path));
    SHARDSCOPE_RETURN_IF_ERROR(check_simulate(ScheduleWork(loaded.schedule, "the schedule's ops"),
                                              loaded.schedule.world_size(), loaded.setup.cluster.gpus_per_node));
    return loaded;
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(sim::Plan plan, sim::LoadPlanFile(path));
  // Before lowering: a plan too big to hold is refused before it is built.
  SHARDSCOPE_ASSIGN_OR_RETURN(WorkEstimate estimate, EstimatePlanWork(plan));
  if (estimate.ops > 0) {
    SHARDSCOPE_RETURN_IF_ERROR(CheckWork(estimate, path, options.force, options.quiet));
    SHARDSCOPE_RETURN_IF_ERROR(check_simulate(estimate, plan.cluster.world_size(), plan.cluster.gpus_per_node));
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(loaded.schedule, sim::LowerPlan(plan));
  if (estimate.ops == 0) {  // lowered whole: counted now
    const WorkEstimate lowered = ScheduleWork(loaded.schedule, estimate.driver);
    SHARDSCOPE_RETURN_IF_ERROR(CheckWork(lowered, path, options.force, options.quiet));
    SHARDSCOPE_RETURN_IF_ERROR(check_simulate(lowered, plan.cluster.world_size(), plan.cluster.gpus_per_node));
  }
  loaded.plan = std::move(plan);
  SHARDSCOPE_ASSIGN_OR_RETURN(loaded.setup, sim::SetupFromSchedule(loaded.schedule, path));
  return loaded;
}

StatusOr<std::vector<int32_t>> ParseRankList(const std::string& text, int32_t world, const std::string& option) {
  std::vector<int32_t> ranks;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    int64_t lo = 0, hi = 0;
    char dash = 0;
    std::stringstream part(item);
    if (!(part >> lo)) return Status::InvalidInput(fmt::format("{}: expected a rank, got '{}'", option, item));
    hi = lo;
    if (part >> dash && (dash != '-' || !(part >> hi))) {
      return Status::InvalidInput(fmt::format("{}: expected a rank or 'A-B', got '{}'", option, item));
    }
    if (lo > hi) {
      return Status::InvalidInput(
          fmt::format("{}: '{}' is an empty range (write the lower rank first, like '{}-{}')", option, item, hi, lo));
    }
    if (lo < 0 || hi >= world) {
      return Status::InvalidInput(fmt::format("{}: '{}' is outside the world of {} ranks", option, item, world));
    }
    for (int64_t r = lo; r <= hi; ++r) ranks.push_back(static_cast<int32_t>(r));
  }
  if (ranks.empty()) return Status::InvalidInput(fmt::format("{}: expected a list like '0-7,12', got nothing", option));
  return ranks;
}

}  // namespace shardscope::cli

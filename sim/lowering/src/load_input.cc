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

StatusOr<LoadedInput> LoadInput(const std::string& path) {
  SHARDSCOPE_ASSIGN_OR_RETURN(bool is_json, LooksLikeScheduleJson(path));
  LoadedInput loaded;
  if (is_json) {
    SHARDSCOPE_ASSIGN_OR_RETURN(loaded.schedule, traces::ReadScheduleFile(path));
  } else {
    SHARDSCOPE_ASSIGN_OR_RETURN(Plan plan, LoadPlanFile(path));
    SHARDSCOPE_ASSIGN_OR_RETURN(loaded.schedule, LowerPlan(plan));
    loaded.plan = std::move(plan);
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(loaded.setup, SetupFromSchedule(loaded.schedule, path));
  return loaded;
}

StatusOr<LoadedInput> LoadPlan(Plan plan, const std::string& label) {
  LoadedInput loaded;
  SHARDSCOPE_ASSIGN_OR_RETURN(loaded.schedule, LowerPlan(plan));
  loaded.plan = std::move(plan);
  SHARDSCOPE_ASSIGN_OR_RETURN(loaded.setup, SetupFromSchedule(loaded.schedule, label));
  return loaded;
}

}  // namespace shardscope::sim

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

StatusOr<LoadedInput> LoadInput(const std::string& path) {
  SHARDSCOPE_ASSIGN_OR_RETURN(bool is_json, LooksLikeScheduleJson(path));
  LoadedInput loaded;
  if (is_json) {
    SHARDSCOPE_ASSIGN_OR_RETURN(loaded.schedule, traces::ReadScheduleFile(path));
  } else {
    SHARDSCOPE_ASSIGN_OR_RETURN(sim::Plan plan, sim::LoadPlanFile(path));
    SHARDSCOPE_ASSIGN_OR_RETURN(loaded.schedule, sim::LowerPlan(plan));
    loaded.plan = std::move(plan);
  }
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
    if (lo < 0 || lo > hi || hi >= world) {
      return Status::InvalidInput(fmt::format("{}: '{}' is outside the world of {} ranks", option, item, world));
    }
    for (int64_t r = lo; r <= hi; ++r) ranks.push_back(static_cast<int32_t>(r));
  }
  if (ranks.empty()) return Status::InvalidInput(fmt::format("{}: expected a list like '0-7,12', got nothing", option));
  return ranks;
}

}  // namespace shardscope::cli

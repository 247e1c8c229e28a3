#include "inputs.h"

#include <sstream>

#include <fmt/format.h>

#include "progress.h"

namespace shardscope::cli {

sim::WorkLimits WorkLimitsWith(bool force, bool quiet) {
  sim::WorkLimits limits;
  limits.force = force;
  limits.warn = [quiet](const std::string& line) { Progress::Note(quiet, line); };
  return limits;
}

LoadOptions LoadOptionsWith(bool force, bool quiet, bool all_ranks) {
  LoadOptions options;
  options.limits = WorkLimitsWith(force, quiet);
  options.simulate_every_rank = all_ranks;
  return options;
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

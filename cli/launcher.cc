#include "launcher.h"

#include <atomic>
#include <charconv>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

namespace shardscope::cli {
namespace {

std::atomic<bool> ranks_diverged{false};

std::optional<int32_t> IntFrom(const char* (*getenv_fn)(const char*), const char* name) {
  const char* value = getenv_fn(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  const std::string_view text(value);
  int32_t parsed = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), parsed);
  if (ec != std::errc() || end != text.data() + text.size() || parsed < 0) return std::nullopt;
  return parsed;
}

const char* GetEnv(const char* name) { return std::getenv(name); }

}  // namespace

std::optional<LauncherRank> LauncherRankFromEnvironment(const char* (*getenv_fn)(const char*)) {
  // (rank, size) variable pairs: Open MPI's mpirun, MPICH/Intel MPI (PMI), PMIx launchers, Slurm's srun.
  constexpr std::pair<const char*, const char*> kPairs[] = {{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                                            {"PMI_RANK", "PMI_SIZE"},
                                                            {"PMIX_RANK", "PMIX_SIZE"},
                                                            {"SLURM_PROCID", "SLURM_NTASKS"}};
  for (const auto& [rank_name, size_name] : kPairs) {
    const std::optional<int32_t> rank = IntFrom(getenv_fn, rank_name);
    const std::optional<int32_t> size = IntFrom(getenv_fn, size_name);
    if (rank && size && *rank < *size) return LauncherRank{*rank, *size};
  }
  return std::nullopt;
}

void MarkRanksDiverged() { ranks_diverged = true; }

std::string ErrorLine(const Status& status, const std::optional<LauncherRank>& launcher, bool diverged) {
  if (status.ok()) return "";
  if (!launcher || launcher->size <= 1) return fmt::format("shardscope: error: {}\n", status.message());
  if (status.code() == StatusCode::kAborted) return "";  // the failing rank says why
  if (!diverged) {
    if (launcher->rank != 0) return "";
    return fmt::format("shardscope: error: rank 0 (all {} ranks stopped alike): {}\n", launcher->size,
                       status.message());
  }
  return fmt::format("shardscope: error: rank {}: {}\n", launcher->rank, status.message());
}

std::string ErrorLineForThisProcess(const Status& status) {
  return ErrorLine(status, LauncherRankFromEnvironment(GetEnv), ranks_diverged);
}

}  // namespace shardscope::cli

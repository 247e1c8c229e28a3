// Errors under a launcher (mpirun, srun): every rank runs the same command, and a bad plan
// would be reported N times, interleaved. The CLI prints an error once:
//  - before the ranks diverge (loading and checking the input, identical on every rank), only
//    the job's rank 0 prints it, saying every rank stopped the same way;
//  - after `run` has started its ranks (MarkRanksDiverged), each error is that rank's own and
//    carries its rank; a rank that stopped only because another failed (kAborted) prints
//    nothing, since the failing rank says why.
// The rank and size come from the launcher's environment (Open MPI, MPICH/Intel MPI's PMI,
// PMIx, Slurm), so this works before MPI is initialised and without it.
#ifndef SHARDSCOPE_CLI_LAUNCHER_H_
#define SHARDSCOPE_CLI_LAUNCHER_H_

#include <cstdint>
#include <optional>
#include <string>

#include "shardscope/base/status.h"

namespace shardscope::cli {

struct LauncherRank {
  int32_t rank = 0;
  int32_t size = 1;
};

// The job rank and size from the environment, or nullopt outside a launcher. `getenv_fn` is
// std::getenv (a parameter for tests).
std::optional<LauncherRank> LauncherRankFromEnvironment(const char* (*getenv_fn)(const char*));

// Called by `run` once its ranks may fail differently (after the MPI session starts).
void MarkRanksDiverged();

// What main prints for an error (empty: nothing), given where the process runs.
std::string ErrorLine(const Status& status, const std::optional<LauncherRank>& launcher, bool diverged);
// ErrorLine for this process (its environment and MarkRanksDiverged).
std::string ErrorLineForThisProcess(const Status& status);

}  // namespace shardscope::cli

#endif  // SHARDSCOPE_CLI_LAUNCHER_H_

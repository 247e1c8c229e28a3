// ProcessGroup over MPI_COMM_WORLD (process_group.h).
#include "shardscope/runtime/process_group.h"

#include <mpi.h>

#include <limits>

#include <fmt/format.h>

#include "mpi_status.h"

namespace shardscope::runtime {

StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Join() {
  int initialized = 0;
  SHARDSCOPE_RETURN_IF_ERROR(MpiStatus(MPI_Initialized(&initialized), "MPI_Initialized"));
  if (initialized) return Status::Internal("ProcessGroup::Join: MPI is already initialized in this process");
  SHARDSCOPE_RETURN_IF_ERROR(MpiStatus(MPI_Init(nullptr, nullptr), "MPI_Init"));
  int rank = 0, size = 1;
  SHARDSCOPE_RETURN_IF_ERROR(MpiStatus(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank"));
  SHARDSCOPE_RETURN_IF_ERROR(MpiStatus(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size"));
  return std::unique_ptr<ProcessGroup>(new ProcessGroup(rank, size));
}

ProcessGroup::~ProcessGroup() {
  // Never throws; a failure to finalize at exit has nobody left to tell.
  MPI_Finalize();
}

StatusOr<std::vector<std::string>> ProcessGroup::AllGather(const std::string& mine) const {
  if (mine.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return Status::Internal(fmt::format("ProcessGroup::AllGather: {} bytes is more than MPI counts", mine.size()));
  }
  const int length = static_cast<int>(mine.size());
  std::vector<int> lengths(static_cast<size_t>(size_));
  SHARDSCOPE_RETURN_IF_ERROR(
      MpiStatus(MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, MPI_COMM_WORLD), "MPI_Allgather"));
  std::vector<int> offsets(static_cast<size_t>(size_));
  int64_t total = 0;
  for (size_t p = 0; p < lengths.size(); ++p) {
    if (total + lengths[p] > std::numeric_limits<int>::max()) {
      return Status::Internal("ProcessGroup::AllGather: the gathered texts are more than MPI counts");
    }
    offsets[p] = static_cast<int>(total);
    total += lengths[p];
  }
  std::string all(static_cast<size_t>(total), '\0');
  SHARDSCOPE_RETURN_IF_ERROR(MpiStatus(MPI_Allgatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(),
                                                      offsets.data(), MPI_CHAR, MPI_COMM_WORLD),
                                       "MPI_Allgatherv"));
  std::vector<std::string> out;
  for (size_t p = 0; p < lengths.size(); ++p) {
    out.push_back(all.substr(static_cast<size_t>(offsets[p]), static_cast<size_t>(lengths[p])));
  }
  return out;
}

}  // namespace shardscope::runtime

#include "mpi_status.h"

#include <mpi.h>

#include <string>

#include <fmt/format.h>

namespace shardscope::runtime {

Status MpiStatus(int rc, std::string_view call) {
  if (rc == MPI_SUCCESS) return Status::Ok();
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  return Status::Internal(fmt::format("{} failed: {}", call, std::string(text, static_cast<size_t>(length))));
}

}  // namespace shardscope::runtime

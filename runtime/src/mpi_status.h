// MPI results as Status, for every MPI call of the runtime (both backends, the host timeline's
// gather): "CALL failed: <MPI_Error_string>".
#ifndef SHARDSCOPE_RUNTIME_SRC_MPI_STATUS_H_
#define SHARDSCOPE_RUNTIME_SRC_MPI_STATUS_H_

#include <string_view>

#include "shardscope/base/status.h"

namespace shardscope::runtime {

// Ok when rc is MPI_SUCCESS.
Status MpiStatus(int rc, std::string_view call);

}  // namespace shardscope::runtime

#endif  // SHARDSCOPE_RUNTIME_SRC_MPI_STATUS_H_

// The CUDA backend's entry points in a build without CUDA (SHARDSCOPE_HAVE_CUDA off): the
// same declarations, each failing with an input error that says so, so `run --backend cuda`
// exits 2 with a message instead of the option disappearing.
#include "shardscope/runtime/cuda_backend.h"

namespace shardscope::runtime {

namespace {
Status NotBuilt() {
  return Status::InvalidInput(
      "--backend cuda: this build has no CUDA backend (configure with -DSHARDSCOPE_CUDA=ON and a CUDA toolkit); "
      "run the schedule's semantics without a GPU with --backend host");
}
}  // namespace

bool CudaBackendBuilt() { return false; }

StatusOr<int32_t> CudaDeviceCount() { return NotBuilt(); }

StatusOr<RunResult> RunCudaBackend(const MpiSession& /*mpi*/, const traces::Schedule& /*schedule*/,
                                   const sim::SimulationSetup& /*setup*/, const CudaRunOptions& /*options*/) {
  return NotBuilt();
}

}  // namespace shardscope::runtime

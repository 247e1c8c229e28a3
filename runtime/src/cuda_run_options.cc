// CheckCudaRunOptions (cuda_backend.h): the CUDA backend's option checks, in every build, so
// `run --backend cuda` refuses bad options the same way on a machine with or without a GPU.
#include <fmt/format.h>

#include "shardscope/runtime/cuda_backend.h"

namespace shardscope::runtime {

Status CheckCudaRunOptions(const CudaRunOptions& options) {
  if (options.common.steps < 1) {
    return Status::InvalidInput(fmt::format("--steps: expected >= 1, got {}", options.common.steps));
  }
  if (options.common.warmup < 1) {
    return Status::InvalidInput(fmt::format(
        "--warmup {} with --backend cuda: expected at least 1 warm-up step. The first step on a GPU loads the "
        "kernels' modules (CUDA lazy loading, the default since CUDA 12.2), connects NCCL's point-to-point peers and "
        "loads cuBLASLt's kernels, costs no training step pays again; a measured first step would time them",
        options.common.warmup));
  }
  if (!(options.common.timeout_s > 0) || options.common.timeout_s > 1e6) {
    return Status::InvalidInput(fmt::format("--timeout: expected seconds in (0, 1e6], got {}", options.common.timeout_s));
  }
  if (options.cuda_graph && options.graph_replays < 1) {
    return Status::InvalidInput(fmt::format("graph replays: expected >= 1, got {}", options.graph_replays));
  }
  return Status::Ok();
}

}  // namespace shardscope::runtime

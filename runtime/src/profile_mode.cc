#include "shardscope/runtime/profile_mode.h"

#include <fmt/format.h>

namespace shardscope::runtime {

ProfileDecision DecideProfileMode(bool profile, bool cuda_backend, int32_t ranks_in_this_process,
                                  const Status& cupti_probe) {
  if (!profile) return {ProfileMode::kOff, Status::Ok()};
  if (!cuda_backend) return {ProfileMode::kHostTimeline, Status::Ok()};
  if (ranks_in_this_process > 1) {
    return {ProfileMode::kCuptiUnavailable,
            Status::InvalidInput(fmt::format("this process drives {} ranks and CUPTI's activity buffers are "
                                             "process-wide; run under mpirun with one process per GPU to capture "
                                             "device records",
                                             ranks_in_this_process))};
  }
  if (!cupti_probe.ok()) return {ProfileMode::kCuptiUnavailable, cupti_probe};
  return {ProfileMode::kCupti, Status::Ok()};
}

}  // namespace shardscope::runtime

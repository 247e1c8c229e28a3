// What `shardscope run --profile` records, decided per process before the run
// (cli/run_command.cc), so the decision is testable without a GPU.
//
//   host backend                      -> kHostTimeline: the measured timeline is the host
//                                        timeline (streams are threads; there is no CUPTI)
//   cuda backend, CUPTI probe Ok,
//     one rank in this process        -> kCupti: device records through CUPTI
//   cuda backend otherwise            -> kCuptiUnavailable: warn (profiler::FallbackWarning
//                                        with `reason`) and write the host timeline instead
//
// One process driving several GPUs cannot capture per rank: CUPTI's activity buffers are
// process-wide (cupti_activity.h, cuptiActivityRegisterCallbacks) and carry no rank.
#ifndef SHARDSCOPE_RUNTIME_PROFILE_MODE_H_
#define SHARDSCOPE_RUNTIME_PROFILE_MODE_H_

#include <cstdint>

#include "shardscope/base/status.h"

namespace shardscope::runtime {

enum class ProfileMode { kOff, kHostTimeline, kCupti, kCuptiUnavailable };

struct ProfileDecision {
  ProfileMode mode = ProfileMode::kOff;
  Status reason = Status::Ok();  // kCuptiUnavailable: why
};

// `cupti_probe` is profiler::ProbeCuptiCapture()'s answer (read only for the CUDA backend).
ProfileDecision DecideProfileMode(bool profile, bool cuda_backend, int32_t ranks_in_this_process,
                                  const Status& cupti_probe);

}  // namespace shardscope::runtime

#endif  // SHARDSCOPE_RUNTIME_PROFILE_MODE_H_

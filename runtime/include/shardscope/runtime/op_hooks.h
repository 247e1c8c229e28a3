// Hooks around the issue of every schedule op, for tools that need to tag what an op causes:
// the profiler pushes the op id as CUPTI's external correlation id in before_issue and pops
// it in after_issue (cuptiActivityPushExternalCorrelationId / Pop), so every kernel, memcpy
// and NCCL kernel the op launches carries its op id. Both backends call them, on the thread
// that issues the op (a rank's host thread), once per op per step, in program order.
//
//   RunOptions options;
//   options.hooks.before_issue = [](int64_t op_id) { ... };
//
// Empty functions are skipped. No CUDA here: the hooks are plain callables.
//
// The CUDA backend also calls, on the rank's host thread (what `run --profile` needs to
// capture CUPTI records per measured step, cli/run_command.cc):
//   streams_created(rank, streams): once, after the rank created its streams, with their
//     cudaStream_t handles in schedule stream order (the device is current);
//   before_step(step, measured) / after_step(step, measured): around each warm-up and measured
//     step; after_step runs after the step's cudaDeviceSynchronize.
// A hook's error stops the rank like a failed op.
#ifndef SHARDSCOPE_RUNTIME_OP_HOOKS_H_
#define SHARDSCOPE_RUNTIME_OP_HOOKS_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "shardscope/base/status.h"

namespace shardscope::runtime {

struct OpHooks {
  std::function<void(int64_t op_id)> before_issue;
  std::function<void(int64_t op_id)> after_issue;
  std::function<Status(int32_t rank, const std::vector<void*>& cuda_streams)> streams_created;
  std::function<Status(int32_t step, bool measured)> before_step;
  std::function<Status(int32_t step, bool measured)> after_step;
};

}  // namespace shardscope::runtime

#endif  // SHARDSCOPE_RUNTIME_OP_HOOKS_H_

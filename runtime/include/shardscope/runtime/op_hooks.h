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
#ifndef SHARDSCOPE_RUNTIME_OP_HOOKS_H_
#define SHARDSCOPE_RUNTIME_OP_HOOKS_H_

#include <cstdint>
#include <functional>

namespace shardscope::runtime {

struct OpHooks {
  std::function<void(int64_t op_id)> before_issue;
  std::function<void(int64_t op_id)> after_issue;
};

}  // namespace shardscope::runtime

#endif  // SHARDSCOPE_RUNTIME_OP_HOOKS_H_

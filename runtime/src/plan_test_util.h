// Test helpers for runtime's unit tests (execution_plan_test.cc, rank_executor_test.cc): ops
// of a hand-written schedule and a cost provider whose predictions are recognizable.
#ifndef SHARDSCOPE_RUNTIME_SRC_PLAN_TEST_UTIL_H_
#define SHARDSCOPE_RUNTIME_SRC_PLAN_TEST_UTIL_H_

#include <cstdint>
#include <utility>
#include <variant>

#include "shardscope/sim/engine/engine.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::runtime::test_util {

// Durations chosen so each op's prediction is recognizable: a GEMM costs its m, a memcpy its bytes.
class FakeCosts : public sim::CostProvider {
 public:
  int64_t KernelNs(const traces::ComputeDesc& desc) const override {
    if (const auto* g = std::get_if<traces::GemmDesc>(&desc)) return g->m;
    return 7;
  }
  int64_t MemcpyNs(traces::MemcpyKind, int64_t bytes) const override { return bytes; }
  sim::CollectiveCost Collective(traces::CollectiveType, int64_t, int32_t) const override { return {}; }
};

inline traces::Op MakeOp(int64_t id, traces::OpPayload payload) {
  traces::Op op;
  op.id = id;
  op.payload = std::move(payload);
  return op;
}

// A collective on stream 1.
inline traces::CollectiveOp Coll(traces::CollectiveType type, traces::CommSlot slot, int64_t bytes,
                                 traces::DType dtype, int32_t peer = -1) {
  traces::CollectiveOp c;
  c.type = type;
  c.comm = slot;
  c.stream = 1;
  c.bytes = bytes;
  c.dtype = dtype;
  c.peer = peer;
  return c;
}

}  // namespace shardscope::runtime::test_util

#endif  // SHARDSCOPE_RUNTIME_SRC_PLAN_TEST_UTIL_H_

// Helpers of the ZeRO lowering tests (lowering_zero_test.cc for ZeRO-1/2,
// lowering_zero3_test.cc): the toy plan, closed-form parameter counts, and lookups of
// collectives, ops and allocations in rank 0's program.
#ifndef SHARDSCOPE_SIM_LOWERING_ZERO_TEST_SUPPORT_H_
#define SHARDSCOPE_SIM_LOWERING_ZERO_TEST_SUPPORT_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "lowering_test_support.h"
#include "shardscope/sim/engine/engine.h"
#include "shardscope/sim/lowering/lowering.h"
#include "shardscope/sim/presets/model.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/sim/report/report.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::sim::zero_test {

using traces::CollectiveOp;

using traces::CollectiveType;

using traces::Schedule;

constexpr int64_t kWorld = 8;

constexpr int64_t kBf16 = 2;

// A 2-block toy model on one 8-GPU node. The plan parser does not know the zero strategies
// yet: parse as ddp and set the strategy and knobs directly.
inline Plan ToyPlan(Strategy strategy, int32_t grad_accum = 1) {
  Plan out = test_support::MustParsePlan(test_support::ToyDdpYaml(grad_accum));
  out.strategy = strategy;
  out.zero.overlap_comm = strategy == Strategy::kZero3;  // DeepSpeed's resolved default
  return out;
}

inline std::vector<ParamTensor> Params(const Plan& plan) {
  std::vector<ParamTensor> params;
  for (const ModuleKernels& m :
       DecomposeModel(plan.model, WorkloadOf(plan))) {
    params.insert(params.end(), m.params.begin(), m.params.end());
  }
  return params;
}

inline int64_t Psi(const Plan& plan) {
  int64_t total = 0;
  for (const ParamTensor& p : Params(plan)) total += p.numel;
  return total;
}

using test_support::MustLower;

inline SimulationResult MustSimulate(const Schedule& schedule) {
  std::optional<SimulationResult> result = test_support::RunSimulation(schedule);
  if (!result) return SimulationResult{};
  EXPECT_FALSE(result->hung);
  for (const RankStats& rank : result->ranks) EXPECT_TRUE(rank.finished);
  return std::move(*result);
}

// Bytes of rank 0's collectives whose op name is `name`.
inline int64_t CollectiveBytes(const Schedule& schedule, const std::string& name, CollectiveType type) {
  const traces::Program& program = schedule.ProgramOf(0);
  int64_t bytes = 0;
  for (const traces::Op& op : program.ops) {
    const auto* c = std::get_if<CollectiveOp>(&op.payload);
    if (c != nullptr && c->type == type && program.NameOf(op.name) == name) bytes += c->bytes;
  }
  return bytes;
}

inline int64_t CountOps(const Schedule& schedule, const std::string& name) {
  const traces::Program& program = schedule.ProgramOf(0);
  int64_t n = 0;
  for (const traces::Op& op : program.ops) n += program.NameOf(op.name) == name ? 1 : 0;
  return n;
}

// Bytes of every allocation of rank 0 whose tensor name starts with `prefix`, with the
// number of allocations.
inline std::pair<int64_t, int64_t> Allocated(const Schedule& schedule, const std::string& prefix,
                                             int32_t micro_batch = -2) {
  const traces::Program& program = schedule.ProgramOf(0);
  int64_t bytes = 0, count = 0;
  for (const traces::Op& op : program.ops) {
    const auto* a = std::get_if<traces::AllocateOp>(&op.payload);
    if (a == nullptr || program.tensors[static_cast<size_t>(a->tensor)].rfind(prefix, 0) != 0) continue;
    if (micro_batch != -2 && op.tags.micro_batch != micro_batch) continue;
    bytes += a->bytes;
    ++count;
  }
  return {bytes, count};
}

// The flat bit16 group is padded to a multiple of 2 x world (nccl_start_alignment_factor).
inline int64_t FlatNumel(const Plan& plan) { return (Psi(plan) + 2 * kWorld - 1) / (2 * kWorld) * (2 * kWorld); }

// grads_in_partition (copy_grads_in_partition): the whole numel of every parameter that
// overlaps the rank's partition (get_partition_info: a straddling parameter counts whole);
// the program follows the rank where that is largest.
inline int64_t GradsInPartitionNumel(const Plan& plan) {
  const int64_t partition = FlatNumel(plan) / kWorld;
  int64_t best = 0;
  for (int64_t rank = 0; rank < kWorld; ++rank) {
    int64_t offset = 0, whole = 0;
    for (const ParamTensor& p : Params(plan)) {
      if (offset < (rank + 1) * partition && offset + p.numel > rank * partition) whole += p.numel;
      offset += p.numel;
    }
    best = std::max(best, whole);
  }
  return best;
}

// Σ over parameters of numel rounded up to a multiple of the world size (each rank holds
// ceil(numel / N) of every parameter); only parameters above `threshold` (not persistent:
// ds_numel <= threshold persists) when given.
inline int64_t PaddedNumel(const Plan& plan, int64_t threshold = -1) {
  int64_t total = 0;
  for (const ParamTensor& p : Params(plan)) {
    if (p.numel > threshold) total += (p.numel + kWorld - 1) / kWorld * kWorld;
  }
  return total;
}

inline Plan Zero3NoPrefetchPlan(int32_t grad_accum = 1) {
  Plan plan = ToyPlan(Strategy::kZero3, grad_accum);
  plan.zero.stage3_param_persistence_threshold = 0;  // nothing persistent
  plan.zero.stage3_max_reuse_distance = 0;           // release after every use
  plan.zero.stage3_prefetch_bucket_size = 0;         // fetch on demand only
  return plan;
}

// Index of every op of rank 0's program, with helpers to find allocations and frees.
struct OpIndex {
  explicit OpIndex(const Schedule& schedule) : program(schedule.ProgramOf(0)) {}
  std::string_view Name(const traces::Op& op) const { return program.NameOf(op.name); }
  std::string_view Module(const traces::Op& op) const { return program.NameOf(op.tags.module); }
  const std::string* Tensor(const traces::Op& op) const {
    if (const auto* a = std::get_if<traces::AllocateOp>(&op.payload)) return &program.tensors[static_cast<size_t>(a->tensor)];
    if (const auto* f = std::get_if<traces::FreeOp>(&op.payload)) return &program.tensors[static_cast<size_t>(f->tensor)];
    return nullptr;
  }
  const traces::Program& program;
};

}  // namespace shardscope::sim::zero_test

#endif  // SHARDSCOPE_SIM_LOWERING_ZERO_TEST_SUPPORT_H_

// Helpers of the FSDP1 / fairscale lowering tests (lowering_fsdp1_test.cc,
// lowering_fsdp1_fairscale_test.cc): the toy plan, closed-form sizes of the FlatParameters,
// and lookups of ops in rank 0's program.
#ifndef SHARDSCOPE_SIM_LOWERING_FSDP1_TEST_SUPPORT_H_
#define SHARDSCOPE_SIM_LOWERING_FSDP1_TEST_SUPPORT_H_

#include <gtest/gtest.h>

#include <algorithm>
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
#include "shardscope/traces/timeline.h"

namespace shardscope::sim::fsdp1_test {

using traces::CollectiveType;

using traces::Schedule;

// A 2-block toy model on one 8-GPU node. The YAML says fsdp2 (the parser does not know the
// fsdp1 section yet); the strategy and its knobs are set on the struct.
inline Plan ToyPlan(const std::string& extra_model = "", const std::string& cluster = "{preset: dgx-a100, nodes: 1}",
                    int32_t layers = 2) {
  const std::string yaml = "model: {layers: " + std::to_string(layers) +
                           ", hidden: 256, heads: 4, kv_heads: 4, ffn: 688, vocab: 1000" + extra_model +
                           "}\ncluster: " + cluster +
                           "\nstrategy: fsdp2\ntraining: {seq_len: 128, micro_batch_size: 1}\n";
  Plan p = test_support::MustParsePlan(yaml);
  p.strategy = Strategy::kFsdp1;
  return p;
}

using test_support::MustLower;

inline SimulationResult MustSimulate(const Schedule& schedule) {
  std::optional<SimulationResult> result = test_support::RunSimulation(schedule);
  if (!result) return SimulationResult{};
  EXPECT_TRUE(test_support::Completed(*result));
  return std::move(*result);
}

// A wider model (hidden 1024, 8 heads), so gradients and collectives outweigh activations.
inline void Widen(Plan& plan) {
  plan.model.hidden = 1024;
  plan.model.ffn = 2816;
  plan.model.heads = 8;
  plan.model.kv_heads = 8;
}

// Bytes per collective type in one rank's program (nccl-tests sizes).
inline std::map<CollectiveType, int64_t> CollectiveBytes(const Schedule& schedule, int32_t rank = 0) {
  std::map<CollectiveType, int64_t> bytes;
  for (const traces::Op& op : schedule.ProgramOf(rank).ops) {
    if (const auto* c = std::get_if<traces::CollectiveOp>(&op.payload)) bytes[c->type] += c->bytes;
  }
  return bytes;
}

inline int64_t Get(const std::map<CollectiveType, int64_t>& bytes, CollectiveType type) {
  const auto it = bytes.find(type);
  return it == bytes.end() ? 0 : it->second;
}

// Parameters of the FSDP units as the auto-wrap builds them: one per block, the root holding
// the rest (embedding, final norm, output).
struct UnitNumels {
  int64_t root = 0;
  std::vector<int64_t> blocks;
};

inline UnitNumels Units(const Plan& plan) {
  UnitNumels units;
  for (const ModuleKernels& m : DecomposeModel(plan.model, WorkloadOf(plan))) {
    if (m.name.rfind("layers.", 0) == 0) {
      units.blocks.push_back(m.param_numel());
    } else {
      units.root += m.param_numel();
    }
  }
  return units;
}

// A FlatParameter of n elements sharded over g ranks: ceil(n / g) per rank, g chunks.
inline int64_t Shard(int64_t n, int64_t g) { return (n + g - 1) / g; }
inline int64_t Padded(int64_t n, int64_t g) { return Shard(n, g) * g; }

inline int64_t SumPadded(const UnitNumels& u, int64_t g, bool with_root) {
  int64_t sum = with_root ? Padded(u.root, g) : 0;
  for (int64_t b : u.blocks) sum += Padded(b, g);
  return sum;
}

constexpr int64_t kBf16 = 2, kFp32 = 4;

constexpr int64_t kClipNormBytes = 4;  // clip_grad_norm_'s all-reduce of one fp32 norm

inline int CountEventSyncs(const Schedule& schedule) {
  int count = 0;
  for (const traces::Op& op : schedule.ProgramOf(0).ops) {
    count += std::holds_alternative<traces::EventSynchronizeOp>(op.payload) ? 1 : 0;
  }
  return count;
}

// Index in rank 0's program of the first op matching `pred`, or -1.
template <typename Pred>
int64_t FirstOp(const traces::Program& program, Pred pred) {
  for (size_t i = 0; i < program.ops.size(); ++i) {
    if (pred(program.ops[i])) return static_cast<int64_t>(i);
  }
  return -1;
}

inline std::string ModuleOf(const traces::Program& program, const traces::Op& op) {
  return op.tags.module == traces::kNoName ? "" : program.names[static_cast<size_t>(op.tags.module)];
}

struct BackwardOrder {
  int64_t all_gather_block0 = -1;   // the backward all-gather of layers.0's FlatParameter
  int64_t first_kernel_block1 = -1; // layers.1's first backward kernel
  int64_t last_kernel_block1 = -1;  // layers.1's last backward kernel
  int64_t reduce_scatter_block1 = -1;
};

inline BackwardOrder OrderOf(const Schedule& schedule) {
  const traces::Program& p = schedule.ProgramOf(0);
  BackwardOrder order;
  for (size_t i = 0; i < p.ops.size(); ++i) {
    const traces::Op& op = p.ops[i];
    if (op.tags.phase != traces::Phase::kBackward || ModuleOf(p, op) != "layers.1") continue;
    const int64_t index = static_cast<int64_t>(i);
    if (const auto* c = std::get_if<traces::CollectiveOp>(&op.payload)) {
      if (c->type == CollectiveType::kReduceScatter) order.reduce_scatter_block1 = index;
    } else if (std::holds_alternative<traces::KernelOp>(op.payload)) {
      // The block's own backward kernels (not the FSDP casts / copies on side streams).
      const std::string& name = p.names[static_cast<size_t>(op.name)];
      if (name.rfind("FSDP::", 0) == 0 || name == "AccumulateGrad") continue;
      if (order.first_kernel_block1 < 0) order.first_kernel_block1 = index;
      order.last_kernel_block1 = index;
    }
  }
  return order;
}

// The backward all-gather of layers.0 by op position: the first all-gather after layers.1's
// pre-backward in backward with the size of a block's FlatParameter, whichever module tag.
inline int64_t BackwardAllGatherOfBlock0(const Schedule& schedule, int64_t block_bytes) {
  const traces::Program& p = schedule.ProgramOf(0);
  int seen = 0;
  for (size_t i = 0; i < p.ops.size(); ++i) {
    const traces::Op& op = p.ops[i];
    if (op.tags.phase != traces::Phase::kBackward) continue;
    if (const auto* c = std::get_if<traces::CollectiveOp>(&op.payload)) {
      // Backward all-gathers: layers.1 first, then layers.0.
      if (c->type == CollectiveType::kAllGather && c->bytes == block_bytes && ++seen == 2) {
        return static_cast<int64_t>(i);
      }
    }
  }
  return -1;
}

// Ops of rank 0's program whose name starts with `prefix`.
template <typename Payload>
std::vector<const traces::Op*> OpsNamed(const traces::Program& p, const std::string& prefix) {
  std::vector<const traces::Op*> ops;
  for (const traces::Op& op : p.ops) {
    if (std::holds_alternative<Payload>(op.payload) && p.names[static_cast<size_t>(op.name)].rfind(prefix, 0) == 0) {
      ops.push_back(&op);
    }
  }
  return ops;
}

inline bool TensorStartsWith(const traces::Program& p, traces::TensorIndex tensor, const std::string& prefix) {
  return p.tensors[static_cast<size_t>(tensor)].rfind(prefix, 0) == 0;
}

inline Plan FairscalePlan() {
  Plan plan = ToyPlan();
  plan.fsdp1.implementation = Fsdp1Implementation::kFairscale;
  plan.fsdp1.optimize_backward_concat = true;
  return plan;
}

// Backward all-gathers of rank 0 with the module tag of the hook that issued them.
inline std::vector<std::pair<int64_t, std::string>> AllGathersIn(const Schedule& schedule, traces::Phase phase) {
  const traces::Program& p = schedule.ProgramOf(0);
  std::vector<std::pair<int64_t, std::string>> out;
  for (size_t i = 0; i < p.ops.size(); ++i) {
    const traces::Op& op = p.ops[i];
    if (op.tags.phase != phase) continue;
    if (const auto* c = std::get_if<traces::CollectiveOp>(&op.payload); c && c->type == CollectiveType::kAllGather) {
      out.emplace_back(static_cast<int64_t>(i), ModuleOf(p, op));
    }
  }
  return out;
}

inline int64_t FirstComputeKernel(const Schedule& schedule, traces::Phase phase, const std::string& module) {
  const traces::Program& p = schedule.ProgramOf(0);
  return FirstOp(p, [&](const traces::Op& op) {
    if (op.tags.phase != phase || !std::holds_alternative<traces::KernelOp>(op.payload)) return false;
    const std::string& name = p.names[static_cast<size_t>(op.name)];
    return ModuleOf(p, op) == module && name.rfind("FSDP::", 0) != 0 && name.rfind("fairscale::", 0) != 0;
  });
}

// ---- oom.policy catch_and_sync: Composer's OOM-flag agreements

struct OomSyncCounts {
  int64_t oom_sync = 0;        // oom_sync all-reduces (1 byte each)
  int64_t oom_sync_bytes = 0;
  int64_t reads = 0;           // D2H copies of a flag (.item())
  std::map<std::string, int64_t> hooks;  // "composer::sync_hook (<place>)" host work per place
  bool unshard_hook_before_every_all_gather = true;
};

inline OomSyncCounts CountOomSync(const Schedule& schedule) {
  OomSyncCounts counts;
  const traces::Program& program = schedule.ProgramOf(0);
  for (size_t i = 0; i < program.ops.size(); ++i) {
    const traces::Op& op = program.ops[i];
    if (const auto* c = std::get_if<traces::CollectiveOp>(&op.payload)) {
      if (c->oom_sync) {
        ++counts.oom_sync;
        counts.oom_sync_bytes += c->bytes;
        EXPECT_EQ(c->type, CollectiveType::kAllReduce);
        EXPECT_EQ(program.comm_slots[static_cast<size_t>(c->comm)], "dp");
      }
      if (c->type == CollectiveType::kAllGather) {
        // The op before the all-gather: the hook's MIN all-reduce on the same stream.
        const auto* before = i > 0 ? std::get_if<traces::CollectiveOp>(&program.ops[i - 1].payload) : nullptr;
        if (before == nullptr || !before->oom_sync || before->stream != c->stream) {
          counts.unshard_hook_before_every_all_gather = false;
        }
      }
    } else if (const auto* copy = std::get_if<traces::MemcpyOp>(&op.payload)) {
      if (copy->kind == traces::MemcpyKind::kDeviceToHost && copy->bytes == 1) ++counts.reads;
    } else if (std::holds_alternative<traces::HostWorkOp>(op.payload) && op.name != traces::kNoName) {
      const std::string name(program.NameOf(op.name));
      if (name.rfind("composer::sync_hook (", 0) == 0) ++counts.hooks[name.substr(21, name.size() - 22)];
    }
  }
  return counts;
}

}  // namespace shardscope::sim::fsdp1_test

#endif  // SHARDSCOPE_SIM_LOWERING_FSDP1_TEST_SUPPORT_H_

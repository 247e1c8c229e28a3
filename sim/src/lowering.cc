// LowerPlan: decomposes the model, hands the plan to its strategy's lowering
// (lowering_<strategy>.cc) and binds every rank's communicator slots to its groups.
//
// Shapes of the work come from DecomposeModel (model.h); the strategy files decide the
// order, the streams, the waits and the allocations, following the framework sources cited
// inline. Adding a strategy means adding a file, not changing the others.
#include "shardscope/sim/lowering.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "lowering_internal.h"
#include "schedule_metadata.h"

namespace shardscope::sim {
namespace {

// The groups of one kind, and which of them each rank belongs to.
struct GroupKind {
  std::vector<traces::Communicator> groups;
  std::vector<int32_t> group_of_rank;
};

// Consecutive blocks of `size` ranks: group g = ranks g*size .. g*size+size-1.
GroupKind Consecutive(const std::string& name, int32_t world, int32_t size) {
  GroupKind kind;
  kind.group_of_rank.resize(static_cast<size_t>(world));
  for (int32_t g = 0; g * size < world; ++g) {
    traces::Communicator comm{world / size == 1 ? name : fmt::format("{}.{}", name, g), {}};
    for (int32_t r = g * size; r < (g + 1) * size; ++r) {
      comm.ranks.push_back(r);
      kind.group_of_rank[static_cast<size_t>(r)] = g;
    }
    kind.groups.push_back(std::move(comm));
  }
  return kind;
}

// Ranks with the same index modulo `stride`: group i = ranks i, i+stride, i+2*stride, ...
GroupKind Strided(const std::string& name, int32_t world, int32_t stride) {
  GroupKind kind;
  kind.group_of_rank.resize(static_cast<size_t>(world));
  for (int32_t i = 0; i < stride; ++i) {
    traces::Communicator comm{stride == 1 ? name : fmt::format("{}.{}", name, i), {}};
    for (int32_t r = i; r < world; r += stride) {
      comm.ranks.push_back(r);
      kind.group_of_rank[static_cast<size_t>(r)] = i;
    }
    kind.groups.push_back(std::move(comm));
  }
  return kind;
}

}  // namespace

StatusOr<traces::Schedule> LowerPlan(const Plan& plan) {
  // fp8 training runs its GEMMs in fp8 but keeps bf16 activations between kernels
  // (torchao.float8 Float8Linear casts inputs and weights per GEMM).
  const traces::DType activations =
      plan.training.dtype == traces::DType::kFloat8E4M3 ? traces::DType::kBFloat16 : plan.training.dtype;
  LoweringContext ctx{plan, {}, plan.cluster.world_size(), activations};
  const Workload workload{plan.training.micro_batch_size, plan.training.seq_len, plan.training.dtype};
  SHARDSCOPE_RETURN_IF_ERROR(ValidateModel(plan.model).WithContext(plan.source));
  SHARDSCOPE_RETURN_IF_ERROR(ValidateWorkload(plan.model, workload).WithContext(plan.source));
  ctx.modules = DecomposeModel(plan.model, workload);
  if (ctx.modules.empty()) return Status::InvalidInput(plan.source + ": the model has no modules");

  const int32_t world = ctx.world_size;
  const DataParallelMesh mesh = MeshOf(plan);
  const int32_t ep = std::max<int32_t>(1, plan.moe.expert_parallel);
  if (mesh.replicate * mesh.shard != world) {
    return Status::InvalidInput(fmt::format("{}: mesh {} x {} does not cover the {} ranks", plan.source,
                                            mesh.replicate, mesh.shard, world));
  }
  if (world % ep != 0) {
    return Status::InvalidInput(
        fmt::format("{}: moe.expert_parallel {} does not divide the {} ranks", plan.source, ep, world));
  }

  StatusOr<LoweredPrograms> lowered = Status::InvalidInput("unknown strategy");
  switch (plan.strategy) {
    case Strategy::kFsdp2: lowered = LowerFsdp2(ctx); break;
    case Strategy::kFsdp1: lowered = LowerFsdp1(ctx); break;
    case Strategy::kZero1:
    case Strategy::kZero2:
    case Strategy::kZero3: lowered = LowerZero(ctx); break;
    case Strategy::kDdp: lowered = LowerDdp(ctx); break;
  }
  if (!lowered.ok()) return lowered.status().WithContext(plan.source);

  traces::Schedule schedule;
  schedule.programs = std::move(lowered->programs);

  // The groups every slot name stands for; only the kinds some program uses are listed.
  std::map<std::string, GroupKind> kinds;
  kinds.emplace(kCommWorld, Consecutive(kCommWorld, world, world));
  kinds.emplace(kCommShard, Consecutive(kCommShard, world, mesh.shard));
  kinds.emplace(kCommReplicate, Strided(kCommReplicate, world, mesh.shard));
  kinds.emplace(kCommExpert, Consecutive(kCommExpert, world, ep));
  kinds.emplace(kCommExpertData, Strided(kCommExpertData, world, ep));
  if (plan.strategy == Strategy::kFsdp2 && plan.fsdp2.reshard_after_forward == ReshardAfterForward::kInt &&
      plan.fsdp2.reshard_after_forward_size > 0 && mesh.shard % plan.fsdp2.reshard_after_forward_size == 0) {
    kinds.emplace(kCommPostForward, Consecutive(kCommPostForward, world, plan.fsdp2.reshard_after_forward_size));
  }
  std::map<std::string, int32_t> first_group;  // kind -> index of its first communicator
  for (const traces::Program& program : schedule.programs) {
    for (const std::string& slot : program.comm_slots) {
      if (kinds.find(slot) == kinds.end()) {
        return Status::Internal(fmt::format("program '{}' uses unknown communicator slot '{}'", program.name, slot));
      }
      if (first_group.count(slot) != 0) continue;
      first_group[slot] = static_cast<int32_t>(schedule.communicators.size());
      for (traces::Communicator& comm : kinds[slot].groups) schedule.communicators.push_back(std::move(comm));
    }
  }
  for (int32_t rank = 0; rank < world; ++rank) {
    const int32_t program = lowered->program_of_rank.empty() ? 0 : lowered->program_of_rank[static_cast<size_t>(rank)];
    traces::RankBinding binding{program, {}};
    for (const std::string& slot : schedule.programs[static_cast<size_t>(program)].comm_slots) {
      binding.comm_binding.push_back(first_group[slot] + kinds[slot].group_of_rank[static_cast<size_t>(rank)]);
    }
    schedule.ranks.push_back(std::move(binding));
  }
  SHARDSCOPE_RETURN_IF_ERROR(schedule.ResolveBindings());

  const int64_t tokens = plan.training.micro_batch_size * plan.training.seq_len * plan.training.grad_accum_steps;
  WritePlanMetadata(plan, schedule.metadata);
  schedule.metadata[kMetaTokensPerRankStep] = std::to_string(tokens);
  schedule.metadata[kMetaModelFlopsPerRankStep] =
      fmt::format("{:.17g}", TrainingFlopsPerToken(plan.model, plan.training.seq_len) * static_cast<double>(tokens));
  return schedule;
}

}  // namespace shardscope::sim

// LowerPlan: decomposes the model, hands the plan to its strategy's lowering
// (lowering_<strategy>.cc) and binds every rank's communicator slots to its groups.
//
// Shapes of the work come from DecomposeModel (model.h); the strategy files decide the
// order, the streams, the waits and the allocations, following the framework sources cited
// inline. Adding a strategy means adding a file, not changing the others.
#include "shardscope/sim/lowering/lowering.h"

#include <algorithm>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "lowering_internal.h"
#include "shardscope/sim/lowering/init_program.h"
#include "shardscope/sim/lowering/schedule_metadata.h"
#include "shardscope/sim/presets/mfu_conventions.h"

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

// One plan's programs: the model decomposed for its workload, handed to its strategy.
StatusOr<LoweredPrograms> LowerPrograms(const Plan& plan) {
  // fp8 training runs its GEMMs in fp8 but keeps bf16 activations between kernels
  // (torchao.float8 Float8Linear casts inputs and weights per GEMM).
  const traces::DType activations =
      plan.training.dtype == traces::DType::kFloat8E4M3 ? traces::DType::kBFloat16 : plan.training.dtype;
  LoweringContext ctx{plan, {}, plan.cluster.world_size(), activations, nullptr};
  if (plan.training.precision == Precision::kPureBf16) ctx.master_dtype = traces::DType::kBFloat16;
  const Workload workload = WorkloadOf(plan);
  SHARDSCOPE_RETURN_IF_ERROR(ValidateModel(plan.model).WithContext(plan.source));
  SHARDSCOPE_RETURN_IF_ERROR(ValidateWorkload(plan.model, workload).WithContext(plan.source));
  ctx.modules = DecomposeModel(plan.model, workload);
  if (ctx.modules.empty()) return Status::InvalidInput(plan.source + ": the model has no modules");
  std::vector<ActivationMode> modes;
  modes.reserve(ctx.modules.size());
  for (const ModuleKernels& module : ctx.modules) modes.push_back(ActivationModeOf(ctx, module));
  ctx.activations = std::make_shared<const ActivationPlan>(ActivationPlan::Build(ctx.modules, modes));

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
  if (lowered->program_of_rank.empty()) lowered->program_of_rank.assign(static_cast<size_t>(ctx.world_size), 0);
  return lowered;
}

}  // namespace

StatusOr<traces::Schedule> LowerPlan(const Plan& plan) {
  const int32_t world = plan.cluster.world_size();
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

  SHARDSCOPE_ASSIGN_OR_RETURN(LoweredPrograms base, LowerPrograms(plan));
  // Ranks in a divergence variant run that variant's program for their rank instead
  // (plan.h DivergenceConfig); only the programs some rank runs are kept: the plan's own
  // first, then the variants' in order of their first rank.
  std::vector<const LoweredPrograms*> source_of_rank(static_cast<size_t>(world), &base);
  std::vector<LoweredPrograms> variants;
  variants.reserve(plan.divergence.variants.size());
  for (const RankVariant& variant : plan.divergence.variants) {
    SHARDSCOPE_ASSIGN_OR_RETURN(LoweredPrograms lowered, LowerPrograms(*variant.plan));
    for (traces::Program& program : lowered.programs) {
      program.name = fmt::format("{} [{}]", program.name, variant.description);
    }
    variants.push_back(std::move(lowered));
    for (int32_t rank : variant.ranks) {
      if (rank < 0 || rank >= world) {
        return Status::InvalidInput(fmt::format("{}: divergence rank {} is outside 0..{}", plan.source, rank, world - 1));
      }
      source_of_rank[static_cast<size_t>(rank)] = &variants.back();
    }
  }
  traces::Schedule schedule;
  std::map<std::pair<const LoweredPrograms*, int32_t>, int32_t> kept;
  // The plan's own programs keep their order (and, without divergence, their indices).
  std::vector<bool> base_used(base.programs.size(), false);
  for (int32_t rank = 0; rank < world; ++rank) {
    if (source_of_rank[static_cast<size_t>(rank)] == &base) {
      base_used[static_cast<size_t>(base.program_of_rank[static_cast<size_t>(rank)])] = true;
    }
  }
  for (size_t p = 0; p < base.programs.size(); ++p) {
    if (!base_used[p]) continue;
    kept.emplace(std::make_pair(&base, static_cast<int32_t>(p)), static_cast<int32_t>(schedule.programs.size()));
    schedule.programs.push_back(base.programs[p]);
  }
  std::vector<int32_t> program_of_rank(static_cast<size_t>(world));
  for (int32_t rank = 0; rank < world; ++rank) {
    const LoweredPrograms* source = source_of_rank[static_cast<size_t>(rank)];
    const int32_t original = source->program_of_rank[static_cast<size_t>(rank)];
    auto [it, inserted] = kept.emplace(std::make_pair(source, original), static_cast<int32_t>(schedule.programs.size()));
    if (inserted) schedule.programs.push_back(source->programs[static_cast<size_t>(original)]);
    program_of_rank[static_cast<size_t>(rank)] = it->second;
  }

  // The groups a slot name stands for, built only for the slots some program uses.
  const auto groups_of = [&](const std::string& slot) -> std::optional<GroupKind> {
    if (slot == kCommWorld) return Consecutive(kCommWorld, world, world);
    if (slot == kCommShard) return Consecutive(kCommShard, world, mesh.shard);
    if (slot == kCommReplicate) return Strided(kCommReplicate, world, mesh.shard);
    if (slot == kCommExpert) return Consecutive(kCommExpert, world, ep);
    if (slot == kCommExpertData) return Strided(kCommExpertData, world, ep);
    if (slot == kCommPostForward && plan.strategy == Strategy::kFsdp2 &&
        plan.fsdp2.reshard_after_forward == ReshardAfterForward::kInt && plan.fsdp2.reshard_after_forward_size > 0 &&
        mesh.shard % plan.fsdp2.reshard_after_forward_size == 0) {
      return Consecutive(kCommPostForward, world, plan.fsdp2.reshard_after_forward_size);
    }
    return std::nullopt;
  };
  struct BoundKind {
    int32_t first = 0;                  // index of the kind's first communicator
    std::vector<int32_t> group_of_rank;
  };
  std::map<std::string, BoundKind> bound;
  // Per program, per slot: the kind it binds to (so the per-rank loop does no lookups).
  std::vector<std::vector<const BoundKind*>> slot_kinds(schedule.programs.size());
  for (size_t p = 0; p < schedule.programs.size(); ++p) {
    const traces::Program& program = schedule.programs[p];
    for (const std::string& slot : program.comm_slots) {
      auto it = bound.find(slot);
      if (it == bound.end()) {
        std::optional<GroupKind> kind = groups_of(slot);
        if (!kind) {
          return Status::Internal(fmt::format("program '{}' uses unknown communicator slot '{}'", program.name, slot));
        }
        it = bound.emplace(slot, BoundKind{static_cast<int32_t>(schedule.communicators.size()),
                                           std::move(kind->group_of_rank)}).first;
        for (traces::Communicator& comm : kind->groups) schedule.communicators.push_back(std::move(comm));
      }
      slot_kinds[p].push_back(&it->second);
    }
  }
  for (int32_t rank = 0; rank < world; ++rank) {
    const int32_t program = program_of_rank[static_cast<size_t>(rank)];
    traces::RankBinding binding{program, {}};
    for (const BoundKind* kind : slot_kinds[static_cast<size_t>(program)]) {
      binding.comm_binding.push_back(kind->first + kind->group_of_rank[static_cast<size_t>(rank)]);
    }
    schedule.ranks.push_back(std::move(binding));
  }
  SHARDSCOPE_RETURN_IF_ERROR(schedule.ResolveBindings());

  const int64_t tokens = plan.training.micro_batch_size * plan.training.seq_len * plan.training.grad_accum_steps;
  WritePlanMetadata(plan, schedule.metadata);
  WriteInitProgram(InitProgramOf(plan), schedule.metadata);
  schedule.metadata[kMetaTokensPerRankStep] = std::to_string(tokens);
  schedule.metadata[kMetaModelFlopsPerRankStep] =
      fmt::format("{:.17g}", TrainingFlopsPerToken(plan.model, plan.training.seq_len) * static_cast<double>(tokens));
  for (MfuConvention convention : kMfuConventions) {
    const std::string key = fmt::format("mfu.{}.", MfuConventionName(convention));
    schedule.metadata[key + "flops_per_token"] =
        fmt::format("{:.17g}", ConventionFlopsPerToken(convention, plan.model, plan.training.seq_len));
    schedule.metadata[key + "peak_flops"] =
        fmt::format("{:.17g}", ConventionPeakFlops(convention, plan.cluster.gpu, plan.training.dtype));
  }
  return schedule;
}

}  // namespace shardscope::sim

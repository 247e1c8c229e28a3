// The moe: section: expert parallelism for an MoE model, read after the strategy sections
// (its group is carved out of the HSDP shard group).
#include <fmt/format.h>

#include <cstdint>
#include <string>

#include "plan_parser.h"

namespace shardscope::sim::plan_internal {

Status PlanParser::ReadMoe(const Entry& entry, const Plan& plan, MoeConfig* out) const {
  SHARDSCOPE_ASSIGN_OR_RETURN(Fields fields,
                              ReadMapping(entry.value, MarkOf(entry), "moe", kMoeKeys));
  const Entry* e = fields.Find("expert_parallel");
  if (e == nullptr) return Status::Ok();
  const std::string path = "moe.expert_parallel";
  int32_t ep = 1;
  SHARDSCOPE_RETURN_IF_ERROR(ReadInt32(*e, path, 1, kMaxExperts, &ep));
  if (ep > 1) {
    if (plan.model.experts <= 1) {
      return Error(*e, path,
                   "1 for a dense model (model.experts is 1): expert parallelism splits the "
                   "experts of an MoE model");
    }
    if (plan.strategy != Strategy::kFsdp2 && plan.strategy != Strategy::kFsdp1) {
      // The simulator lowers expert parallelism with FSDP2 (torchtitan) and FSDP1 (fairscale)
      // only. DeepSpeed ZeRO-3 itself refuses its MoE layers ("MoE not supported with Stage
      // 3", engine._configure_zero_optimizer).
      return Error(MarkOf(*e), path,
                   "1 with this strategy (expert parallelism is simulated with fsdp2 and fsdp1)",
                   fmt::format("{} with strategy {}", Describe(e->value),
                               StrategyName(plan.strategy)));
    }
    if (plan.model.experts % ep != 0) {
      return Error(*e, path,
                   fmt::format("a divisor of the model's {} experts (each rank of the "
                               "expert-parallel group holds experts / expert_parallel)",
                               plan.model.experts));
    }
    const int32_t world = plan.cluster.world_size();
    if (world % ep != 0) {
      return Error(*e, path, fmt::format("a divisor of the world size {}", world));
    }
    // torchtitan ParallelDims._build_mesh_with_ep (torchtitan/distributed/parallel_dims.py)
    // carves the expert-parallel dimension out of dp_shard (dp_shard_mod_ep = dp_shard * cp
    // / ep): with HSDP the experts are split inside a shard group.
    if (plan.strategy == Strategy::kFsdp2 && plan.fsdp2.mesh.replicate > 1 &&
        plan.fsdp2.mesh.shard % ep != 0) {
      return Error(*e, path,
                   fmt::format("a divisor of the HSDP shard group size {} (torchtitan carves "
                               "expert parallelism out of dp_shard)",
                               plan.fsdp2.mesh.shard));
    }
  }
  out->expert_parallel = ep;
  return Status::Ok();
}

}  // namespace shardscope::sim::plan_internal

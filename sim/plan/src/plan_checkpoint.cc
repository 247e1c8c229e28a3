// The checkpoint: section: FSDP1's optimizer-state consolidation (torch full_optim_state_dict,
// fairscale gather_full_optim_state_dict), read after moe: (fairscale's no_broadcast_optim_state
// concerns expert state).
#include <fmt/format.h>

#include <string>

#include "plan_parser.h"

namespace shardscope::sim::plan_internal {

Status PlanParser::ReadCheckpoint(const Entry& entry, const Plan& plan,
                                  CheckpointConfig* out) const {
  // torch FSDP.full_optim_state_dict / fairscale FSDP.gather_full_optim_state_dict are FSDP1
  // APIs; FSDP2 and DeepSpeed checkpoint through other paths (DCP, engine.save_checkpoint).
  if (plan.strategy != Strategy::kFsdp1) {
    return KeyError(entry, "checkpoint",
                    "a checkpoint section only with strategy fsdp1 (optimizer-state "
                    "consolidation is FSDP1's full_optim_state_dict / fairscale's "
                    "gather_full_optim_state_dict)",
                    fmt::format("strategy {}", StrategyName(plan.strategy)));
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(
      Fields fields, ReadMapping(entry.value, MarkOf(entry), "checkpoint", kCheckpointKeys));
  if (const Entry* e = fields.Find("consolidate_optimizer_state")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadBool(*e, "checkpoint.consolidate_optimizer_state",
                                        &out->consolidate_optimizer_state));
  }
  if (const Entry* e = fields.Find("no_broadcast_optim_state")) {
    const std::string path = "checkpoint.no_broadcast_optim_state";
    SHARDSCOPE_RETURN_IF_ERROR(ReadBool(*e, path, &out->no_broadcast_optim_state));
    if (out->no_broadcast_optim_state) {
      // fairscale FullyShardedDataParallel(no_broadcast_optim_state=True): "useful for
      // situations, like Mixture Of Experts, where all but a few parameters can fit on one
      // node" — the expert state stays on its rank in gather_full_optim_state_dict.
      if (plan.fsdp1.implementation != Fsdp1Implementation::kFairscale) {
        return KeyError(*e, path,
                        "no_broadcast_optim_state only with fsdp1.implementation fairscale (an "
                        "argument of fairscale's FullyShardedDataParallel)",
                        "implementation torch");
      }
      if (plan.model.experts <= 1 || plan.moe.expert_parallel <= 1) {
        return KeyError(*e, path,
                        "no_broadcast_optim_state only for an MoE model with "
                        "moe.expert_parallel > 1 (it keeps expert state on the rank that "
                        "owns it)",
                        fmt::format("model.experts {} and moe.expert_parallel {}",
                                    plan.model.experts, plan.moe.expert_parallel));
      }
      if (!out->consolidate_optimizer_state) {
        return KeyError(*e, path,
                        "no_broadcast_optim_state only with consolidate_optimizer_state: true "
                        "(it changes gather_full_optim_state_dict, which runs only then)",
                        "consolidate_optimizer_state false");
      }
    }
  }
  return Status::Ok();
}

}  // namespace shardscope::sim::plan_internal

// FSDP2's units (lowering_fsdp2.h): fully_shard per transformer block (or group of blocks)
// plus the embedding, [norm, output] and the root, as torchtitan's apply_fsdp wraps a model,
// with nested expert units under expert parallelism; reshard_after_forward as fully_shard
// resolves it; the forward and backward prefetch lists; which units reduce gradients in a
// micro-batch. Paths are in pytorch/pytorch under torch/distributed/fsdp/_fully_shard/ unless
// they name torchtitan.
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lowering_fsdp2.h"

namespace shardscope::sim {

Status Fsdp2Lowering::BuildUnits() {
  const Fsdp2Config& cfg = ctx_.plan.fsdp2;
  const int32_t shard = mesh_.shard;
  const int32_t ep = std::max<int32_t>(1, ctx_.plan.moe.expert_parallel);
  // torchtitan/models/llama4/infra/parallelize.py apply_fsdp: with ep_degree > 1, every MoE
  // block's routed experts get their own fully_shard on the dp_mod_ep ("efsdp") mesh —
  // the world_size / ep ranks holding the same experts (our ep_dp group) — before the block's
  // fully_shard on dp_mesh, which then holds the block's dense part (attention, router,
  // norms). Without EP the experts stay inside the block's unit.
  const bool nested_experts = ep > 1 && ctx_.plan.model.experts > 1;
  const int32_t expert_group = ctx_.world_size / ep;

  if (cfg.blocks_per_unit < 1) {
    return Status::InvalidInput(fmt::format("fsdp2.blocks_per_unit must be at least 1, got {}", cfg.blocks_per_unit));
  }
  if (cfg.forward_prefetch < 0 || cfg.backward_prefetch < 0 || cfg.gradient_sync_every_k_blocks < 0) {
    return Status::InvalidInput("fsdp2.forward_prefetch, backward_prefetch and gradient_sync_every_k_blocks "
                                "must not be negative");
  }

  // reshard_after_forward as fully_shard resolves it (_fully_shard.py fully_shard:
  // auto_reshard_after_forward = reshard_after_forward is None, and None is passed on as True;
  // _fsdp_init.py _get_post_forward_mesh_info: an int must divide the shard-group size, 1
  // means False and the shard-group size means True; otherwise a post-forward mesh of
  // mesh.view(-1, k) — consecutive groups of k ranks, our dp_post_forward slot).
  AfterForward knob = AfterForward::kReshard;
  int32_t post_forward_size = 0;
  switch (cfg.reshard_after_forward) {
    case ReshardAfterForward::kTrue:
    case ReshardAfterForward::kNone: knob = AfterForward::kReshard; break;
    case ReshardAfterForward::kFalse: knob = AfterForward::kKeep; break;
    case ReshardAfterForward::kInt: {
      const int32_t k = cfg.reshard_after_forward_size;
      if (k < 1 || k > shard || shard % k != 0) {
        return Status::InvalidInput(fmt::format(
            "fsdp2.reshard_after_forward {} must be a factor of the shard-group size {} "
            "(fully_shard raises the same ValueError)", k, shard));
      }
      if (k == 1) {
        knob = AfterForward::kKeep;
      } else if (k == shard) {
        knob = AfterForward::kReshard;
      } else {
        knob = AfterForward::kPostForward;
        post_forward_size = k;
      }
      break;
    }
  }

  const auto add_unit = [&](std::string name, std::vector<size_t> modules, AfterForward after) {
    Fsdp2Unit unit;
    unit.name = std::move(name);
    unit.modules = std::move(modules);
    unit.group_size = shard;
    unit.comm = kCommShard;
    unit.after_forward = after;
    unit.post_forward_size = after == AfterForward::kPostForward ? post_forward_size : 0;
    unit.first_block = BlockIndex(ctx_.modules[unit.modules.front()]);
    order_.push_back(units_.size());
    units_.push_back(std::move(unit));
    return units_.size() - 1;
  };

  const size_t n = ctx_.modules.size();
  unit_of_module_.assign(n, kNoUnit);
  experts_of_module_.assign(n, {});
  if (cfg.root_only) {
    // fully_shard(model) alone: one parameter group for the whole model, which is the root.
    // FSDPState._lazy_init (_fsdp_state.py): for the root, when reshard_after_forward was
    // left None, post_forward_mesh_info = None — it keeps its parameters after forward ("the
    // parameters would be freed and all-gathered immediately"); it does so only when
    // _auto_reshard_after_forward, so an explicit True / int is honoured for the root as for
    // any unit. torchtitan never wraps a model this way.
    std::vector<size_t> all(n);
    for (size_t m = 0; m < n; ++m) all[m] = m;
    const AfterForward root_after = cfg.reshard_after_forward == ReshardAfterForward::kNone ? AfterForward::kKeep : knob;
    const size_t u = add_unit("root", all, root_after);
    for (size_t m = 0; m < n; ++m) unit_of_module_[m] = u;
  } else {
    // Units as torchtitan's apply_fsdp (torchtitan/models/llama3/infra/parallelize.py) wraps
    // a model: fully_shard(tok_embeddings), fully_shard(block) for each block (here: each
    // group of blocks_per_unit consecutive blocks), fully_shard([norm, output]), then
    // fully_shard(model) — a root that holds no parameters of its own, so reshard_after_forward
    // None behaves as True for every unit. The embedding and the blocks follow
    // reshard_after_forward; [norm, output] keeps its parameters after forward (torchtitan
    // passes reshard_after_forward_policy == "always", False by default: backward needs them
    // at once).
    for (size_t m = 0; m < n;) {
      const ModuleKernels& module = ctx_.modules[m];
      std::vector<size_t> members{m};
      if (IsBlock(module)) {
        while (members.size() < static_cast<size_t>(cfg.blocks_per_unit) && m + members.size() < n &&
               IsBlock(ctx_.modules[m + members.size()])) {
          members.push_back(m + members.size());
        }
      }
      const bool head = m + members.size() == n && !IsBlock(module) && m != 0;
      const size_t u = add_unit(module.name, members, head ? AfterForward::kKeep : knob);
      for (size_t member : members) unit_of_module_[member] = u;
      m += members.size();
    }
  }

  // Parameters of each unit, and the nested expert units.
  for (size_t u = 0, count = units_.size(); u < count; ++u) {
    for (size_t m : units_[u].modules) {
      const ModuleKernels& module = ctx_.modules[m];
      const bool split = nested_experts && IsBlock(module) && LocalExpertNumel(ctx_, module) > 0;
      int64_t dense = 0;
      for (const ParamTensor& param : module.params) {
        if (split && IsExpertParam(param)) continue;
        // FSDPParam shards dim 0 with padding to a multiple of the group size; with only
        // numel known we pad the flat size (exact for 1-D and for dim-0 multiples).
        units_[u].shard_numel += (param.numel + shard - 1) / shard;
        dense += param.numel;
      }
      units_[u].grads.emplace_back("grad." + module.name, dense);
      if (!split) continue;
      Fsdp2Unit experts;
      experts.name = module.name + ".moe.experts";
      experts.modules = {m};
      experts.expert = true;
      experts.first_block = BlockIndex(module);
      experts.group_size = expert_group;
      experts.comm = kCommExpertData;
      // torchtitan passes the blocks' reshard_after_forward to the experts. A post-forward
      // mesh for them would be a view of the efsdp mesh (ranks strided by ep), which is not
      // the dp_post_forward group: estimate — an int reshards them fully. (None: the experts
      // are never the root, so True.)
      experts.after_forward = knob == AfterForward::kPostForward ? AfterForward::kReshard : knob;
      for (const ParamTensor& param : module.params) {
        if (!IsExpertParam(param)) continue;
        const int64_t local = param.numel / ep;  // ExpertParallel shards dim 0 (experts) over ep
        experts.shard_numel += (local + expert_group - 1) / expert_group;
      }
      experts.grads.emplace_back("grad." + experts.name, LocalExpertNumel(ctx_, module));
      units_[u].expert_units.push_back(units_.size());
      experts_of_module_[m].push_back(units_.size());
      units_.push_back(std::move(experts));
    }
  }
  return Status::Ok();
}

int64_t Fsdp2Lowering::GradNumel(const Fsdp2Unit& u) const {
  int64_t numel = 0;
  for (const auto& [name, count] : u.grads) numel += count;
  return numel;
}

StatusOr<std::vector<size_t>> Fsdp2Lowering::ResolveNames(const std::string& owner,
                                                          const std::vector<std::string>& names) const {
  std::vector<size_t> out;
  for (const std::string& name : names) {
    const auto it = std::find_if(units_.begin(), units_.end(), [&](const Fsdp2Unit& u) { return u.name == name; });
    if (it == units_.end()) {
      std::string known;
      for (const Fsdp2Unit& u : units_) known += (known.empty() ? "" : ", ") + u.name;
      return Status::InvalidInput(fmt::format("fsdp2.{} names unknown unit '{}' (units: {})", owner, name, known));
    }
    out.push_back(static_cast<size_t>(it - units_.begin()));
  }
  return out;
}

// A count-based prefetch of a block's successor also prefetches that block's experts, as
// torchtitan does with EP (apply_fsdp: transformer_block.set_modules_to_forward_prefetch(
// [next_block, next_block.moe.experts]), and the same backwards); the embedding and the
// head prefetch only the neighbouring block.
void Fsdp2Lowering::AppendWithExperts(std::vector<size_t>& targets, size_t source, size_t target) const {
  targets.push_back(target);
  if (units_[source].first_block < 0 || units_[source].expert) return;
  for (size_t e : units_[target].expert_units) targets.push_back(e);
}

Status Fsdp2Lowering::BuildPrefetchTargets() {
  const Fsdp2Config& cfg = ctx_.plan.fsdp2;
  forward_prefetch_.assign(units_.size(), {});
  backward_prefetch_.assign(units_.size(), {});
  bool has_experts = false;
  for (const Fsdp2Unit& u : units_) has_experts = has_experts || u.expert;
  // torchtitan sets explicit prefetching whenever ep_degree > 1 ("D2H syncs in EP could
  // interfere with implicit prefetching"): one unit ahead both ways, with the experts. We
  // follow it when the plan asks for nothing else.
  const bool plan_sets_prefetch = cfg.forward_prefetch != 0 || cfg.backward_prefetch != 1 ||
                                  !cfg.forward_prefetch_units.empty() || !cfg.backward_prefetch_units.empty();
  const int32_t forward_count = has_experts && !plan_sets_prefetch ? 1 : cfg.forward_prefetch;
  const int32_t backward_count = cfg.backward_prefetch;

  for (size_t pos = 0; pos < order_.size(); ++pos) {
    const size_t u = order_[pos];
    // set_modules_to_forward_prefetch: FSDPState._pre_forward unshards these after the
    // unit's own pre_forward (unshard + wait_for_unshard), in forward order.
    for (int32_t k = 1; k <= forward_count && pos + static_cast<size_t>(k) < order_.size(); ++k) {
      AppendWithExperts(forward_prefetch_[u], u, order_[pos + static_cast<size_t>(k)]);
    }
    // Backward: FSDPParamGroup._backward_prefetch (default_prefetch, one unit ahead in the
    // reverse post-forward order) when no explicit list; set_modules_to_backward_prefetch
    // replaces it (FSDPState._pre_backward: default_prefetch = no explicit list). A count
    // n > 1 is the explicit list of the next n units; 0 prefetches nothing.
    for (int32_t k = 1; k <= backward_count && pos >= static_cast<size_t>(k); ++k) {
      AppendWithExperts(backward_prefetch_[u], u, order_[pos - static_cast<size_t>(k)]);
    }
  }
  for (const auto& [name, targets] : cfg.forward_prefetch_units) {
    SHARDSCOPE_ASSIGN_OR_RETURN(std::vector<size_t> owner, ResolveNames("forward_prefetch_units", {name}));
    SHARDSCOPE_ASSIGN_OR_RETURN(forward_prefetch_[owner.front()],
                                ResolveNames("forward_prefetch_units." + name, targets));
  }
  for (const auto& [name, targets] : cfg.backward_prefetch_units) {
    SHARDSCOPE_ASSIGN_OR_RETURN(std::vector<size_t> owner, ResolveNames("backward_prefetch_units", {name}));
    SHARDSCOPE_ASSIGN_OR_RETURN(backward_prefetch_[owner.front()],
                                ResolveNames("backward_prefetch_units." + name, targets));
  }
  return Status::Ok();
}

bool Fsdp2Lowering::ReducesThisMicroBatch(const Fsdp2Unit& u, int32_t micro_batch) const {
  const Fsdp2Config& cfg = ctx_.plan.fsdp2;
  if (LastMicroBatch(micro_batch) || cfg.requires_gradient_sync == GradientSync::kEveryMicroBatch) return true;
  // set_requires_gradient_sync(False, recurse=False) on all but every k-th block: those keep
  // reducing every micro-batch (FSDPModule.set_requires_gradient_sync sets reduce_grads per
  // parameter group). The embedding, the head and the root are not blocks.
  const int32_t k = cfg.gradient_sync_every_k_blocks;
  return k > 0 && u.first_block >= 0 && u.first_block % k == 0;
}

}  // namespace shardscope::sim

// FSDP2's lowering class (private to sim/lowering), declared here because it spans two
// files: lowering_fsdp2_units.cc (the units as fully_shard / torchtitan's apply_fsdp build
// them, and their prefetch lists) and lowering_fsdp2.cc (unshard / reshard, forward, the
// hooks of the shared backward walk (lowering_fsdp_common.h) with foreach_reduce, the
// optimizer step). Sources are listed at the top of lowering_fsdp2.cc.
#ifndef SHARDSCOPE_SIM_LOWERING_FSDP2_H_
#define SHARDSCOPE_SIM_LOWERING_FSDP2_H_

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "lowering_fsdp_common.h"
#include "lowering_internal.h"

namespace shardscope::sim {

constexpr size_t kNoUnit = std::numeric_limits<size_t>::max();

// What a unit does with its unsharded parameters at post-forward
// (FSDPParamGroup.reshard in the FORWARD state, _fsdp_param_group.py).
enum class AfterForward : uint8_t {
  kReshard,      // post_forward_mesh_info == mesh_info: free, all-gather again in backward
  kKeep,         // post_forward_mesh_info None: keep them for backward
  kPostForward,  // a smaller post-forward mesh: keep a 1/k slice (to_sharded_post_forward)
};

// ---------------------------------------------------------------------------------------
// FSDP2: fully_shard per transformer block plus the root module, as torchtitan's apply_fsdp
// wraps a model.

struct Fsdp2Unit {
  std::string name;             // "embed", "layers.<i>" (first block), "head", "root",
                                // "layers.<i>.moe.experts"
  std::vector<size_t> modules;  // indices into ctx.modules (an expert unit: its block)
  bool expert = false;          // fully_shard(transformer_block.moe.experts) nested in a block
  int32_t first_block = -1;     // block index of the unit's first block (its expert's block)
  std::vector<size_t> expert_units;  // a block unit: its blocks' nested expert units
  int64_t shard_numel = 0;      // per rank, every parameter padded to a multiple of the group
  int32_t group_size = 1;       // ranks the unit is sharded over
  std::string comm;             // their communicator slot
  // Unsharded gradients autograd produces for the unit (tensor name, elements).
  std::vector<std::pair<std::string, int64_t>> grads;
  AfterForward after_forward = AfterForward::kReshard;
  int32_t post_forward_size = 0;  // kPostForward: ranks of the post-forward shard group

  // Lowering state.
  bool unsharded = false;             // unsharded parameters are allocated
  bool all_gather_issued = false;     // all-gather issued, not yet waited for
  bool post_forward_sharded = false;  // holds the post-forward slice instead of its shard
  bool grad_shard = false;            // the sharded fp32 .grad exists
  bool accumulated_grad = false;      // unsharded_accumulated_grad (or a kept .grad) exists
  DType accumulated_dtype = DType::kFloat32;
  bool partial_reduce = false;        // HSDP: reduce-scattered but not yet all-reduced output
};

class Fsdp2Lowering : public FsdpBackwardHooks {
 public:
  explicit Fsdp2Lowering(const LoweringContext& ctx) : ctx_(ctx), b_("fsdp2") {}

  StatusOr<traces::Program> Lower();

 private:
  Status BuildUnits();
  StatusOr<std::vector<size_t>> ResolveNames(const std::string& owner, const std::vector<std::string>& names) const;
  Status BuildPrefetchTargets();
  void AppendWithExperts(std::vector<size_t>& targets, size_t source, size_t target) const;

  int64_t ParamBytes() const { return DTypeSize(param_dtype_); }
  int64_t ReduceBytes() const { return DTypeSize(reduce_dtype_); }
  int64_t UnshardedNumel(const Fsdp2Unit& u) const { return u.shard_numel * u.group_size; }
  int64_t GradNumel(const Fsdp2Unit& u) const;
  bool Hsdp(const Fsdp2Unit& u) const { return mesh_.replicate > 1 && !u.expert; }
  bool LastMicroBatch(int32_t micro_batch) const {
    return micro_batch + 1 == ctx_.plan.training.grad_accum_steps;
  }
  bool ReducesThisMicroBatch(const Fsdp2Unit& u, int32_t micro_batch) const;

  // The backward walk (WalkFsdpBackward) with FSDP2's hooks.
  size_t UnitCount() const override { return units_.size(); }
  size_t UnitOfModule(size_t module) const override { return unit_of_module_[module]; }
  bool CompletesUnit(size_t unit, size_t module) const override { return units_[unit].modules.front() == module; }
  std::vector<size_t> NestedUnits(size_t module) const override { return experts_of_module_[module]; }
  void UnshardUnit(size_t unit) override;
  void WaitForBackwardUnshard(size_t unit) override { WaitForUnshard(unit, /*forward=*/false); }
  std::vector<size_t> BackwardPrefetchTargets(size_t unit) const override { return backward_prefetch_[unit]; }
  void AllocateGradients(size_t module) override;
  void PostBackward(size_t unit) override;
  void FinalCallback() override;

  void WaitForUnshard(size_t unit, bool forward);
  void ReleaseForwardAllGatherState();
  void ReshardAfterForward(size_t unit);
  void Reshard(size_t unit);
  void PreForward(size_t unit);
  // The previous reduce-scatter's input, freed once the current stream waited for it.
  void FreeReduceScatterState();
  void Forward();
  void Backward(int32_t micro_batch);

  const LoweringContext& ctx_;
  ProgramBuilder b_;
  DataParallelMesh mesh_;
  DType param_dtype_ = DType::kBFloat16;
  DType reduce_dtype_ = DType::kFloat32;
  traces::StreamIndex compute_ = 0, copy_in_ = 0, all_gather_ = 0, reduce_scatter_ = 0, all_reduce_ = 0;
  std::vector<Fsdp2Unit> units_;
  std::vector<size_t> order_;                      // non-expert units in forward order
  std::vector<size_t> unit_of_module_;
  std::vector<std::vector<size_t>> experts_of_module_;  // expert units nested in a module
  std::vector<std::vector<size_t>> forward_prefetch_, backward_prefetch_;
  int64_t forward_all_gather_state_ = -1;  // unit whose all-gather output awaits its free
  int64_t reduce_scatter_state_ = -1;      // unit whose reduce-scatter input awaits its free
  std::string last_post_reduce_rs_;        // last post-reduce event on the reduce-scatter stream
  std::string last_post_reduce_ar_;        // ... on the all-reduce stream (HSDP)
  std::vector<std::string> all_reduce_state_;  // HSDP all-reduce buffers kept to end of backward
  int32_t micro_batch_ = 0;                // the micro-batch whose backward is being lowered
};

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_LOWERING_FSDP2_H_

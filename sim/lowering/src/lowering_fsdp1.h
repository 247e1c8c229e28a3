// FSDP1's lowering class (private to sim/lowering), declared here because it spans two
// files: lowering_fsdp1.cc (units, unshard / reshard with their streams and the all-gather
// limiter, forward, the optimizer step) and lowering_fsdp1_backward.cc (the hooks of the
// shared backward walk, lowering_fsdp_common.h: gradient reduction, no_sync accumulation,
// fairscale's fp32 gradient accumulation and reduce-scatter bucketer). Sources are listed at
// the top of lowering_fsdp1.cc.
#ifndef SHARDSCOPE_SIM_LOWERING_FSDP1_H_
#define SHARDSCOPE_SIM_LOWERING_FSDP1_H_

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "lowering_fsdp_common.h"
#include "lowering_internal.h"

namespace shardscope::sim {

// One FSDP instance: one FlatParameter (FlatParamHandle.flatten_tensors concatenates the
// instance's parameters; _get_shard pads the flat tensor to a multiple of the group size and
// gives each rank one chunk).
struct FlatParam {
  std::string name;          // "root", "layers.<i>", "layers.<i>.experts"
  int64_t numel = 0;         // unpadded parameters of the instance (experts: this rank's)
  int32_t group_size = 1;    // ranks the FlatParameter is sharded over (1: NO_SHARD)
  int64_t shard_numel = 0;   // per rank: ceil(numel / group_size)
  traces::CommSlot shard_comm = 0;
  bool expert = false;
  bool unsharded = false;    // the padded unsharded flat parameter is allocated
  bool prefetched = false;   // handle._prefetched: an unshard was issued ahead of its use
  bool grad_live = false;    // the unsharded gradient (param_dtype) exists
  bool fp32_live = false;    // fairscale concat: the flat fp32 gradient buffer exists
  // fairscale, the old way (optimize_backward_concat false): the per-parameter fp32
  // gradients accumulated so far, one tensor each, in the order they were made.
  std::vector<std::string> fp32_param_grads;
  bool grad_shard_live = false;  // the sharded fp32 gradient (_saved_grad_shard) exists
  int32_t lowp_param_grads = 0;  // fairscale concat: per-parameter low-precision grads kept
  bool grad_flat_live = false;   // fairscale concat: the flat low-precision gradient exists
  int64_t padded_numel() const { return shard_numel * group_size; }
};

// What one hook acts on: the FlatParameter of a block (or of the root: embed + head) and,
// with expert parallelism, the nested expert instance of that block (fairscale MoE style:
// the experts are wrapped in their own FSDP over the expert-data-parallel group). The nested
// instance is unsharded and resharded together with its block (estimate: its own hooks run
// when the experts are called, a few kernels later).
struct Fsdp1Unit {
  std::string name;
  std::vector<size_t> modules;    // indices into ctx.modules
  std::vector<FlatParam> params;  // [dense] or [dense, experts]
  bool is_root = false;
};

class Fsdp1Lowering : public FsdpBackwardHooks {
 public:
  Fsdp1Lowering(const LoweringContext& ctx, bool is_rank0)
      : ctx_(ctx), cfg_(ctx.plan.fsdp1), b_(is_rank0 ? "fsdp1.rank0" : "fsdp1"), is_rank0_(is_rank0) {}

  StatusOr<traces::Program> Lower();

 private:
  bool Torch() const { return cfg_.implementation == Fsdp1Implementation::kTorch; }
  bool Sharded() const { return cfg_.sharding_strategy != Fsdp1ShardingStrategy::kNoShard; }
  bool Hybrid() const {
    return cfg_.sharding_strategy == Fsdp1ShardingStrategy::kHybridShard ||
           cfg_.sharding_strategy == Fsdp1ShardingStrategy::kHybridShardZero2;
  }
  // RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES (_flat_param.py): FULL_SHARD and HYBRID_SHARD.
  bool ReshardAfterForwardStrategy() const {
    return cfg_.sharding_strategy == Fsdp1ShardingStrategy::kFullShard ||
           cfg_.sharding_strategy == Fsdp1ShardingStrategy::kHybridShard;
  }
  bool MixedPrecision() const { return param_dtype_ != DType::kFloat32; }
  // fairscale with mixed_precision and fp32_reduce_scatter accumulates fp32 gradients
  // across micro-batches (the optimize_backward_concat paths).
  bool FairscaleFp32Accumulation() const {
    return !Torch() && MixedPrecision() && cfg_.reduce_dtype == DType::kFloat32;
  }

  // The backward walk (WalkFsdpBackward) with FSDP1's and fairscale's hooks
  // (lowering_fsdp1_backward.cc).
  size_t UnitCount() const override { return units_.size(); }
  size_t UnitOfModule(size_t module) const override { return unit_of_module_[module]; }
  bool CompletesUnit(size_t unit, size_t module) const override { return units_[unit].modules.front() == module; }
  void BeforePreBackward(size_t unit) override;
  void UnshardUnit(size_t unit) override;
  void WaitForBackwardUnshard(size_t unit) override;
  std::vector<size_t> BackwardPrefetchTargets(size_t unit) const override;
  void AfterPreBackward(size_t unit) override;
  void AfterModuleBackward(size_t module) override;
  void PostBackward(size_t unit) override;
  void FinalCallback() override;

  Status BuildUnits();
  void WaitStream(traces::StreamIndex waiter, traces::StreamIndex producer);
  void Unshard(FlatParam& p);
  // Whether `unit` is a unit whose pre-forward / pre-backward hook has not run this pass.
  bool Prefetchable(int64_t unit) const;
  void PrefetchUnit(int64_t unit);
  void WaitForUnshard();
  void Reshard(FlatParam& p, bool free);
  void FairscaleFreeFullParams(size_t unit, bool free);
  int64_t BackwardPrefetchTarget(size_t unit) const;
  void AllocateFp32Grads(size_t unit);
  void DivideIfNeeded(traces::StreamIndex stream, const char* name, double factor, int64_t numel, DType dtype);
  void BucketReduceScatter(FlatParam& p, int64_t input_numel);
  void FlushBucket(traces::CommSlot comm);
  void Forward();
  void Backward(bool sync);
  void ReduceGradient(FlatParam& p);
  void Optimizer();
  // oom.policy catch_and_sync (Composer automicrobatching): one OOM-flag agreement.
  void OomFlagSync(traces::StreamIndex stream, std::string_view where, bool read_finished_flag);
  bool SyncHooks() const { return ctx_.plan.oom.policy == OomPolicy::kCatchAndSync && ctx_.plan.oom.sync_hooks; }

  const LoweringContext& ctx_;
  const Fsdp1Config& cfg_;
  ProgramBuilder b_;
  bool is_rank0_ = false;
  DType param_dtype_ = DType::kBFloat16;
  DType reduce_dtype_ = DType::kFloat32;
  traces::StreamIndex compute_ = 0, unshard_ = 0, pre_unshard_ = 0, post_backward_ = 0, all_reduce_ = 0;
  traces::CommSlot world_ = 0, replicate_ = 0;
  int32_t replicate_size_ = 1;
  std::vector<Fsdp1Unit> units_;        // forward (pre-forward) order: root, layers.0 ..
  std::vector<size_t> unit_of_module_;
  std::vector<bool> hook_ran_;          // per unit: its pre-forward / pre-backward ran this pass
  bool sync_ = true;                    // this micro-batch's backward reduces (not under no_sync)
  std::deque<traces::EventIndex> free_events_;  // _FreeEventQueue
  int64_t free_event_count_ = 0;
  // fairscale ReduceScatterBucketer: one bucket per process group (the key is dtype, device,
  // group; every gradient is fp32 here). Shards waiting in a bucket are finished (post-divide,
  // kept as the sharded gradient) by the flush's callbacks.
  struct Bucket {
    traces::CommSlot comm = 0;
    int32_t group_size = 1;
    int64_t shard_capacity = 0;  // elements per rank
    int64_t offset = 0;          // elements filled per rank
    bool allocated = false;
    int64_t flushes = 0;
    std::vector<FlatParam*> pending;
    int64_t element_bytes = 4;   // the gradients' dtype (reduce_dtype)
  };
  std::vector<Bucket> buckets_;
};

// The gradient pre-divide factor of a data-parallel world (lowering_fsdp1_backward.cc).
double GradientPredivideFactor(int32_t world_size);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_LOWERING_FSDP1_H_

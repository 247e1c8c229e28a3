// Lowering of FSDP1 (torch.distributed.fsdp.FullyShardedDataParallel) and of fairscale's
// FullyShardedDataParallel, which FSDP1 descends from.
//
// torch: torch/distributed/fsdp/_runtime_utils.py (hooks, streams, unshard / reshard, gradient
// reduction), _flat_param.py (FlatParamHandle: the flat parameter, its padding, mixed
// precision), _limiter_utils.py (the all-gather rate limiter), _init_utils.py (sharding
// strategies, HSDP process groups).
// fairscale: fairscale/nn/data_parallel/fully_sharded_data_parallel.py and
// fairscale/nn/misc/flatten_params_wrapper.py.
#include <algorithm>
#include <cmath>
#include <deque>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lowering_internal.h"

namespace shardscope::sim {
namespace {

using traces::CollectiveType;
using traces::DType;
using traces::DTypeSize;
using traces::Phase;

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
  bool fp32_live = false;    // fairscale: fp32 accumulated gradient storage exists
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

class Fsdp1Lowering {
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

  Status BuildUnits();
  void WaitStream(traces::StreamIndex waiter, traces::StreamIndex producer);
  void Unshard(FlatParam& p);
  void UnshardUnit(size_t unit);
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
  void PostBackward(size_t unit, bool sync);
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

// fairscale FullyShardedDataParallel._get_gradient_predivide_factor, the same loop as torch's
// DefaultState._get_gradient_predivide_factor (torch/distributed/algorithms/_comm_hooks/
// default_hooks.py): double the factor while it divides the world size and world / factor >
// factor. Post-divide: world / pre-divide.
double GradientPredivideFactor(int32_t world_size) {
  int32_t factor = 1;
  while (world_size % factor == 0 && world_size / factor > factor) factor *= 2;
  return static_cast<double>(factor);
}

// Units as the usual transformer auto-wrap builds them (transformer_auto_wrap_policy in
// torch/distributed/fsdp/wrap.py; fairscale.nn.wrap.auto_wrap): one FSDP instance per block,
// the root instance holding what no block holds (token embedding, final norm and output).
Status Fsdp1Lowering::BuildUnits() {
  const Plan& plan = ctx_.plan;
  const DataParallelMesh mesh = MeshOf(plan);
  const int32_t ep = std::max<int32_t>(1, plan.moe.expert_parallel);
  // _init_utils.py _init_process_group_state: HYBRID_SHARD / _HYBRID_SHARD_ZERO2 shard over
  // the intra-node group and all-reduce over the inter-node group (here the mesh's shard and
  // replicate groups); the other strategies shard over the whole process group.
  int32_t dense_group = ctx_.world_size;
  traces::CommSlot dense_comm = world_;
  if (Hybrid()) {
    dense_group = mesh.shard;
    dense_comm = b_.Comm(kCommShard);
    replicate_size_ = mesh.replicate;
    if (replicate_size_ > 1) replicate_ = b_.Comm(kCommReplicate);
  }
  if (!Sharded()) dense_group = 1;
  const auto make_param = [&](std::string name, int64_t numel, int32_t group, traces::CommSlot comm, bool expert) {
    FlatParam p;
    p.name = std::move(name);
    p.numel = numel;
    p.group_size = group;
    p.shard_numel = (numel + group - 1) / group;
    p.shard_comm = comm;
    p.expert = expert;
    return p;
  };

  Fsdp1Unit root{"root", {}, {}, true};
  int64_t root_numel = 0;
  unit_of_module_.assign(ctx_.modules.size(), 0);
  units_.push_back(Fsdp1Unit{});  // the root, filled below
  for (size_t m = 0; m < ctx_.modules.size(); ++m) {
    const ModuleKernels& module = ctx_.modules[m];
    if (!IsBlock(module)) {
      root.modules.push_back(m);
      root_numel += module.param_numel();
      unit_of_module_[m] = 0;
      continue;
    }
    Fsdp1Unit unit{module.name, {m}, {}, false};
    const bool expert_parallel = ep > 1 && plan.model.experts > 1 && LocalExpertNumel(ctx_, module) > 0;
    if (expert_parallel) {
      // Expert parameters: data-parallel over the ranks holding the same experts
      // (world / ep ranks, kCommExpertData), outside the dense shard.
      unit.params.push_back(make_param(module.name, DenseNumel(module), dense_group, dense_comm, false));
      const int32_t expert_group = Sharded() ? ctx_.world_size / ep : 1;
      unit.params.push_back(make_param(module.name + ".experts", LocalExpertNumel(ctx_, module), expert_group,
                                       b_.Comm(kCommExpertData), true));
    } else {
      unit.params.push_back(make_param(module.name, module.param_numel(), dense_group, dense_comm, false));
    }
    unit_of_module_[m] = units_.size();
    units_.push_back(std::move(unit));
  }
  root.params.push_back(make_param("root", root_numel, dense_group, dense_comm, false));
  units_[0] = std::move(root);
  return Status::Ok();
}

// stream.wait_stream(other): an event recorded at the other stream's tail, waited on.
void Fsdp1Lowering::WaitStream(traces::StreamIndex waiter, traces::StreamIndex producer) {
  const traces::EventIndex event = b_.Event(fmt::format("wait_stream.{}.{}", waiter, producer));
  b_.Record(event, producer);
  b_.Wait(waiter, event);
}

// _runtime_utils._unshard, in its order: on the pre-unshard stream the low-precision shard is
// made (FlatParamHandle.pre_unshard -> _use_low_precision_shard: the fp32 shard cast into
// _mp_shard) and the unshard stream waits for the pre-unshard stream; THEN, with
// limit_all_gathers, the oldest free event is dequeued once two are queued and the host
// blocks on it (_free_event_queue.dequeue_if_needed(); event.synchronize()): at most two
// unsharded flat parameters in flight ("empirically chosen", _limiter_utils._FreeEventQueue).
// Then the unshard stream allocates the padded unsharded flat parameter in param_dtype and
// all-gathers into it (FlatParamHandle.unshard -> _alloc_padded_unsharded_flat_param,
// _all_gather_flat_param); post_unshard frees _mp_shard after record_stream on the unshard
// stream. fairscale _rebuild_full_params does the same on its fp32_to_fp16 and all_gather
// streams, without a limiter.
void Fsdp1Lowering::Unshard(FlatParam& p) {
  const auto limit_all_gathers = [&] {
    if (Torch() && cfg_.limit_all_gathers && Sharded() && free_events_.size() >= 2) {
      b_.EventSync("FSDP::limit_all_gathers", free_events_.front());
      free_events_.pop_front();
    }
  };
  if (p.unsharded) {  // FlatParamHandle.needs_unshard() is false: nothing to gather
    limit_all_gathers();
    p.prefetched = true;
    return;
  }
  const int64_t pbytes = DTypeSize(param_dtype_);
  if (!Sharded()) {
    // NO_SHARD: the low-precision copy of the full parameter is the "unsharded" one (the
    // _mp_shard of an unsharded handle); no communication.
    if (MixedPrecision()) {
      b_.Allocate("unsharded." + p.name, p.numel * pbytes, pre_unshard_);
      b_.MemoryKernel(pre_unshard_, "FSDP::cast_to_param_dtype", p.numel * kFp32Bytes, p.numel * pbytes);
      WaitStream(unshard_, pre_unshard_);
    }
    p.unsharded = true;
    p.prefetched = true;
    return;
  }
  const int64_t shard_bytes = p.shard_numel * pbytes;
  if (MixedPrecision()) {
    b_.Allocate("mp_shard." + p.name, shard_bytes, pre_unshard_);
    b_.MemoryKernel(pre_unshard_, "FSDP::cast_to_param_dtype", p.shard_numel * kFp32Bytes, shard_bytes);
    WaitStream(unshard_, pre_unshard_);
  }
  limit_all_gathers();
  b_.Allocate("unsharded." + p.name, p.padded_numel() * pbytes, unshard_);
  // Composer's unshard_with_sync (composer/trainer/_patch_pytorch.py, patched into
  // FlatParamHandle.unshard by patch_unshard_for_automicrobatching): the sync hook runs right
  // after _alloc_padded_unsharded_flat_param, before the all-gather ("prevents deadlocks when
  // some ranks OOM after the alloc call"). _unshard runs handle.unshard() under
  // stream(unshard_stream): the hook's all_reduce and .item() are on the unshard stream.
  if (SyncHooks()) OomFlagSync(unshard_, "unshard", false);
  b_.Collective(unshard_, "FSDP::all_gather", CollectiveType::kAllGather, p.shard_comm, p.padded_numel() * pbytes,
                param_dtype_);
  if (MixedPrecision()) {
    b_.RecordStream("mp_shard." + p.name, unshard_);
    b_.Free("mp_shard." + p.name);
  }
  p.unsharded = true;
  p.prefetched = true;
}

void Fsdp1Lowering::UnshardUnit(size_t unit) {
  for (FlatParam& p : units_[unit].params) {
    if (!p.prefetched) Unshard(p);
  }
}

// _prefetch_handle / _get_handle_to_prefetch: unshard the target handle if it still needs its
// pre-forward (pre-backward) unshard — its hook has not run yet in this pass
// (_needs_pre_backward_unshard) — and it is not prefetched already (handle._prefetched).
// fairscale's prefetch (_rebuild_full_params(wait_for_all_gather=False)) is likewise a no-op
// for an instance that already has its full parameters.
void Fsdp1Lowering::PrefetchUnit(int64_t unit) {
  if (unit < 0 || unit >= static_cast<int64_t>(units_.size())) return;
  if (hook_ran_[static_cast<size_t>(unit)]) return;
  for (FlatParam& p : units_[static_cast<size_t>(unit)].params) {
    if (!p.prefetched) Unshard(p);
  }
}

// _pre_forward_unshard / _pre_backward_hook: current_stream.wait_stream(unshard_stream).
void Fsdp1Lowering::WaitForUnshard() { WaitStream(compute_, unshard_); }

// The unit the backward prefetch targets.
// torch: _ExecOrderData.get_handle_to_backward_prefetch (_exec_order_utils.py) indexes the
// POST-FORWARD order (record_post_forward: layers.0, layers.1, .., and the root last, its
// post-forward running after the whole model's forward) at current index - 1: the root
// prefetches the last block, block i block i-1, block 0 nothing.
// fairscale: _pre_backward_hook, when reshard_after_forward, prefetches
// _fsdp_forward_ordering[idx - 1], the order of the instances' forward() calls (root,
// layers.0, ..): block i block i-1 (block 0: the root, which already has its parameters);
// the root (reshard_after_forward off) prefetches nothing. Not confirmed in the stored
// source: the stored fairscale main-branch fully_sharded_data_parallel.py (before
// optimize_backward_concat) has no _fsdp_forward_ordering (PR #865 proposed it); this follows
// the review of the optimize_backward_concat version (PRs #1184/#1186).
int64_t Fsdp1Lowering::BackwardPrefetchTarget(size_t unit) const {
  if (Torch()) {
    if (units_[unit].is_root) return units_.size() > 1 ? static_cast<int64_t>(units_.size()) - 1 : -1;
    return unit >= 2 ? static_cast<int64_t>(unit) - 1 : -1;
  }
  if (units_[unit].is_root || !ReshardAfterForwardStrategy()) return -1;
  return static_cast<int64_t>(unit) - 1;
}

// fairscale _free_full_params: per parameter record_stream(current stream) and
// free_storage_, then torch.cuda.current_stream().synchronize(): the host blocks until the
// compute stream has drained (fairscale PR #1144). Not confirmed in the stored source: the
// stored main-branch _free_full_params ends after free_storage_; the synchronize is in the
// optimize_backward_concat version reviewed.
void Fsdp1Lowering::FairscaleFreeFullParams(size_t unit, bool free) {
  if (!free || !Sharded()) {
    for (FlatParam& p : units_[unit].params) Reshard(p, false);
    return;
  }
  for (FlatParam& p : units_[unit].params) Reshard(p, true);
  b_.StreamSync("fairscale::free_full_params.synchronize", compute_);
}

// fairscale FlattenParamsWrapper._unflatten_params_as_views (optimize_backward_concat): when
// fp32_grads is None it makes torch.zeros(total numel, float32) on the host and moves it with
// .cuda(): a pageable host-to-device copy of numel * 4 bytes on the current stream, which
// blocks the host until it is done (aten/src/ATen/native/cuda/Copy.cu copy_kernel_cuda ->
// memcpy_and_sync for non-pinned host memory). Called from the instance's forward, so the flat
// fp32 gradient of every unit exists from its pre-forward until its post-backward hook
// drops it (fp32_grads = None) after a synced micro-batch. Not confirmed in the stored
// source (flatten_params_wrapper.py there predates PR #1186); PR #1186's description says
// it "directly allocate[s] flattened fp32 grads".
void Fsdp1Lowering::AllocateFp32Grads(size_t unit) {
  for (FlatParam& p : units_[unit].params) {
    if (p.fp32_live) continue;
    b_.Allocate("fp32_grads." + p.name, p.numel * kFp32Bytes, compute_);
    b_.Memcpy(compute_, "fairscale::fp32_grads.cuda", traces::MemcpyKind::kHostToDevice, p.numel * kFp32Bytes);
    b_.StreamSync("fairscale::fp32_grads.cuda.sync", compute_);
    p.fp32_live = true;
  }
}

// torch _div_if_needed (_runtime_utils.py) / fairscale's div_ guards: divide in place only when
// the factor is above 1; a memory-bound kernel reading and writing the tensor.
void Fsdp1Lowering::DivideIfNeeded(traces::StreamIndex stream, const char* name, double factor, int64_t numel,
                                   DType dtype) {
  if (factor <= 1) return;
  const int64_t bytes = numel * DTypeSize(dtype);
  b_.MemoryKernel(stream, name, bytes, bytes);
}

// _runtime_utils._reshard -> FlatParamHandle.reshard -> _free_unsharded_flat_param: record
// the unsharded flat parameter on the current (compute) stream (_no_dispatch_record_stream:
// its block is not reused until the compute work queued so far is done), free it, and with
// limit_all_gathers record a free event on the current stream and enqueue it.
// handle._prefetched is reset whether or not the parameter was freed.
void Fsdp1Lowering::Reshard(FlatParam& p, bool free) {
  p.prefetched = false;
  if (!free || !p.unsharded) return;
  b_.RecordStream("unsharded." + p.name, compute_);
  b_.Free("unsharded." + p.name);
  p.unsharded = false;
  if (Torch() && cfg_.limit_all_gathers && Sharded()) {
    const traces::EventIndex event = b_.Event(fmt::format("free_event.{}", free_event_count_++));
    b_.Record(event, compute_);
    free_events_.push_back(event);
  }
}

StatusOr<traces::Program> Fsdp1Lowering::Lower() {
  const Plan& plan = ctx_.plan;
  if (!Torch() && cfg_.sharding_strategy != Fsdp1ShardingStrategy::kFullShard &&
      cfg_.sharding_strategy != Fsdp1ShardingStrategy::kShardGradOp) {
    return Status::InvalidInput(
        "fsdp1: fairscale's FSDP has only reshard_after_forward true / false (sharding_strategy FULL_SHARD or "
        "SHARD_GRAD_OP)");
  }
  const DataParallelMesh mesh = MeshOf(plan);
  if (Hybrid() && mesh.replicate * mesh.shard != ctx_.world_size) {
    return Status::InvalidInput("fsdp1: the hybrid mesh does not cover the ranks");
  }
  // MixedPrecision(param_dtype, reduce_dtype) as the plan resolved them.
  param_dtype_ = cfg_.param_dtype;
  reduce_dtype_ = cfg_.reduce_dtype;

  compute_ = b_.Stream("compute", 0);
  if (Torch()) {
    // _init_streams (_runtime_utils.py): unshard, post_backward and pre_unshard streams at
    // priority -1 only with limit_all_gathers under HSDP ("prioritize all-gathers /
    // reduce-scatters over async all-reduce"), 0 otherwise; an all_reduce stream only for
    // HSDP (otherwise the default stream).
    const int32_t priority = cfg_.limit_all_gathers && Hybrid() ? -1 : 0;
    unshard_ = b_.Stream("unshard", priority);
    post_backward_ = b_.Stream("post_backward", priority);
    pre_unshard_ = b_.Stream("pre_unshard", priority);
    all_reduce_ = Hybrid() ? b_.Stream("all_reduce", 0) : compute_;
  } else {
    // fairscale FullyShardedDataParallel._setup_streams: fp32_to_fp16, all_gather and
    // post_backward streams, default priority.
    pre_unshard_ = b_.Stream("fp32_to_fp16", 0);
    unshard_ = b_.Stream("all_gather", 0);
    post_backward_ = b_.Stream("post_backward", 0);
    all_reduce_ = compute_;
  }
  world_ = b_.Comm(kCommWorld);
  SHARDSCOPE_RETURN_IF_ERROR(BuildUnits());

  // Model states that live across steps: the fp32 sharded flat parameters and AdamW's two fp32
  // moments of the local shard.
  b_.SetPhase(Phase::kNone);
  for (const Fsdp1Unit& unit : units_) {
    for (const FlatParam& p : unit.params) {
      b_.SetModule(p.name);
      for (const char* state : {"param_shard.", "exp_avg.", "exp_avg_sq."}) {
        b_.Allocate(state + p.name, p.shard_numel * kFp32Bytes, compute_);
      }
    }
  }

  const int32_t steps = std::max<int32_t>(1, plan.training.grad_accum_steps);
  for (int32_t mb = 0; mb < steps; ++mb) {
    b_.SetMicroBatch(mb);
    // no_sync() (fully_sharded_data_parallel.py FullyShardedDataParallel.no_sync) around
    // every micro-batch but the last: _sync_gradients is False there.
    const bool sync = !cfg_.no_sync || mb + 1 == steps;
    Forward();
    Backward(sync);
  }
  Optimizer();
  // Composer Trainer._train_batch with automicrobatching: after the optimizer step every rank
  // runs the `while not all_ranks_finished` agreement (all_reduce MAX of found_cuda_oom,
  // .item(), all_reduce MIN of all_ranks_finished, .item()); a rank that caught an OOM jumps
  // here from wherever it failed.
  if (ctx_.plan.oom.policy == OomPolicy::kCatchAndSync) {
    OomFlagSync(compute_, "end_of_batch", true);
  }

  // checkpoint.consolidate_optimizer_state: one unit per FSDP instance (and expert instance).
  // NO_SHARD keeps full optimizer state on every rank: nothing to gather (not modelled).
  if (Sharded()) {
    std::vector<ConsolidationUnit> consolidation;
    for (const Fsdp1Unit& unit : units_) {
      for (const FlatParam& p : unit.params) {
        consolidation.push_back(ConsolidationUnit{p.name, p.shard_numel, p.shard_comm, p.group_size, p.expert});
      }
    }
    EmitOptimizerStateConsolidation(ctx_, b_, compute_, consolidation, is_rank0_);
  }
  return b_.Finish();
}

void Fsdp1Lowering::Forward() {
  const int64_t hook_ns = ctx_.plan.host.hook_overhead_ns;
  b_.SetPhase(Phase::kForward);
  // _root_pre_forward -> _wait_for_computation_stream: the unshard and pre-unshard streams
  // wait for the computation stream (the previous step / micro-batch).
  b_.SetModule(ctx_.modules.front().name);
  b_.HostWork("FSDP::root_pre_forward", hook_ns);
  if (Torch() || !MixedPrecision()) {
    WaitStream(unshard_, compute_);
    if (Torch()) WaitStream(pre_unshard_, compute_);
  } else {
    // fairscale _wait_for_previous_optim_step with mixed precision: only the fp32_to_fp16
    // stream waits for the current stream (the all-gather stream follows it through
    // _rebuild_full_params). Not confirmed in the stored source (reviewed version); estimate
    // for fairscale without mixed precision: the all_gather stream waits instead.
    WaitStream(pre_unshard_, compute_);
  }
  std::vector<bool>& pre_forward_done = hook_ran_;
  pre_forward_done.assign(units_.size(), false);
  for (size_t m = 0; m < ctx_.modules.size(); ++m) {
    const ModuleKernels& module = ctx_.modules[m];
    const size_t unit = unit_of_module_[m];
    b_.SetModule(module.name);
    if (!pre_forward_done[unit]) {
      // _pre_forward -> _pre_forward_unshard: unshard unless prefetched, the current stream
      // waits for the unshard stream, then _prefetch_handle(FORWARD) unshards the next handle
      // in forward execution order when forward_prefetch is set.
      // fairscale forward(): _rebuild_full_params() (waits for the all_gather stream), then,
      // once _fsdp_forward_ordering is recorded (every step after the first: the steady
      // state), _fsdp_forward_ordering[idx + 1]._rebuild_full_params(wait_for_all_gather=
      // False): the next instance's all-gather is issued without waiting. Not confirmed in the
      // stored (main-branch) source; per the review of the optimize_backward_concat version.
      pre_forward_done[unit] = true;
      // Composer _readd_fsdp_sync_hooks (composer/trainer/trainer.py):
      // register_forward_pre_hook(sync_hook, prepend=True) on every FSDP module: the flag
      // agreement runs before FSDP's own pre-forward (and its unshard).
      if (SyncHooks()) OomFlagSync(compute_, "pre_forward", false);
      b_.HostWork("FSDP::pre_forward", hook_ns);
      UnshardUnit(unit);
      WaitForUnshard();
      if (Torch() ? cfg_.forward_prefetch : true) PrefetchUnit(static_cast<int64_t>(unit) + 1);
      // fairscale optimize_backward_concat: the wrapped FlattenParamsWrapper's forward makes
      // the flat fp32 gradient buffer when there is none.
      if (FairscaleFp32Accumulation() && cfg_.optimize_backward_concat) AllocateFp32Grads(unit);
    }
    EmitForwardKernels(ctx_, b_, compute_, module, KernelPart::kModel);
    if (units_[unit].modules.back() == m) {
      // _post_forward -> _post_forward_reshard: free for FULL_SHARD / HYBRID_SHARD, never
      // for the root ("immediately used for backward"); fairscale: reshard_after_forward,
      // which _lazy_init turns off for the root.
      b_.HostWork("FSDP::post_forward", hook_ns);
      const bool free = !units_[unit].is_root && ReshardAfterForwardStrategy();
      if (Torch()) {
        for (FlatParam& p : units_[unit].params) Reshard(p, free && Sharded());
      } else {
        FairscaleFreeFullParams(unit, free);
      }
    }
  }
  // Composer Trainer._train_microbatch with automicrobatching: after the model's forward and
  // before the loss, "Check if other ranks OOMed after forward pass" (all_reduce MAX of the
  // flag, .item(), all_reduce MIN), hooks or not.
  if (ctx_.plan.oom.policy == OomPolicy::kCatchAndSync) OomFlagSync(compute_, "after_forward", false);
  // The loss runs after the root's forward has returned (KernelPart).
  EmitLossForward(ctx_, b_, compute_);
}

void Fsdp1Lowering::Backward(bool sync) {
  const int64_t hook_ns = ctx_.plan.host.hook_overhead_ns;
  const int64_t pbytes = DTypeSize(param_dtype_);
  b_.SetPhase(Phase::kBackward);
  std::vector<bool>& pre_backward_done = hook_ran_;
  pre_backward_done.assign(units_.size(), false);
  // The loss's backward first: the root's pre-backward hook fires on the model output's
  // gradient (_register_pre_backward_hooks on the forward outputs).
  EmitLossBackward(ctx_, b_, compute_);
  // Module order in backward: head, layers.L-1 .. layers.0, embed. The root's pre-backward
  // hook fires first (on the loss side), its post-backward hook last (the embedding's
  // gradient completes its FlatParameter's gradient).
  for (size_t step = 0; step < ctx_.modules.size(); ++step) {
    const size_t m = ctx_.modules.size() - 1 - step;
    const ModuleKernels& module = ctx_.modules[m];
    const size_t unit = unit_of_module_[m];
    b_.SetModule(module.name);
    if (!pre_backward_done[unit]) {
      // _pre_backward_hook: unshard unless prefetched (a no-op for parameters kept since
      // forward), the current stream waits for the unshard stream, then with
      // BACKWARD_PRE _prefetch_handle(BACKWARD) unshards the handle before this one in
      // forward execution order (_ExecOrderData.get_handle_to_backward_prefetch) — before
      // this unit's gradients are computed. fairscale's _pre_backward_hook only rebuilds its
      // own full parameters (no prefetch option).
      // fairscale: the root (reshard_after_forward turned off by disable_reshard_on_root)
      // only switches to its full parameters (_use_full_params): no all-gather, no stream
      // wait; the others rebuild and prefetch (BackwardPrefetchTarget).
      pre_backward_done[unit] = true;
      // Composer _readd_fsdp_sync_hooks: register_full_backward_pre_hook(sync_hook,
      // prepend=True) on every FSDP module: before FSDP's pre-backward unshard / prefetch.
      if (SyncHooks()) OomFlagSync(compute_, "pre_backward", false);
      b_.HostWork("FSDP::pre_backward", hook_ns);
      UnshardUnit(unit);
      if (Torch() || !units_[unit].is_root) WaitForUnshard();
      if (!Torch() || cfg_.backward_prefetch == Fsdp1BackwardPrefetch::kBackwardPre) {
        PrefetchUnit(BackwardPrefetchTarget(unit));
      }
      // The unit's flat gradient, produced by autograd in param_dtype on the compute stream
      // (estimate: allocated when the unit's backward starts). Under no_sync the previous
      // micro-batches' unsharded gradient is still there: the new one is added into it.
      if (!FairscaleFp32Accumulation()) {
        for (FlatParam& p : units_[unit].params) {
          b_.Allocate((p.grad_live ? "grad_new." : "grad.") + p.name, p.numel * pbytes, compute_);
        }
      }
    }
    EmitBackwardKernels(ctx_, b_, compute_, module, KernelPart::kModel);
    if (FairscaleFp32Accumulation()) {
      // FlattenParamsWrapper._grad_accumulation_hook runs per parameter as autograd produces
      // its low-precision gradient: the gradient is added into fp32 storage and dropped, so
      // one parameter's low-precision gradient is alive at a time. The fp32 storage is made
      // by the first micro-batch since the last reduction: per-parameter fp32 gradients
      // (optimize_backward_concat false, the path before fairscale PR #1186) or one flat
      // buffer whose slices the hooks fill (true: _unflatten_params_as_views allocates
      // fp32_grads = zeros(total numel, float32) in forward (AllocateFp32Grads) and each hook
      // adds into fp32_grads[start:end]).
      // The backward reaches the flat parameter (the views' SplitWithSizesBackward, a
      // torch.cat of the per-parameter low-precision gradients) on every micro-batch the old
      // way, and with optimize_backward_concat only on the synced one (PR #1184: "only let the
      // backward() pass propagate to FSDP.flat_params, which will invoke the
      // FSDP._post_backward_hook() and concat() op, when _require_backward_grad_sync is True";
      // its traces: "SplitWithSizesBackward triggered every microbatch per FSDP module" before,
      // "only in last microbatch" after). Then the per-parameter low-precision gradients stay
      // until the concatenation (below).
      Fsdp1Unit& u = units_[unit];
      const bool keep_lowp = sync || !cfg_.optimize_backward_concat;
      for (const ParamTensor& param : module.params) {
        FlatParam& p = u.params.size() > 1 && IsExpertParam(param) ? u.params[1] : u.params[0];
        const int64_t numel = p.expert ? param.numel / std::max<int32_t>(1, ctx_.plan.moe.expert_parallel) : param.numel;
        if (!p.fp32_live) {
          // The old way: each parameter's fp32 gradient is made by its first accumulation
          // (estimate: the unit's as one allocation at its first parameter).
          b_.Allocate("fp32_grads." + p.name, p.numel * kFp32Bytes, compute_);
          p.fp32_live = true;
        }
        const std::string lowp = fmt::format("grad_lowp.{}.{}", p.name, p.lowp_param_grads);
        b_.Allocate(lowp, numel * pbytes, compute_);
        b_.MemoryKernel(compute_, "fairscale::fp32_grad_accumulate", numel * (pbytes + kFp32Bytes), numel * kFp32Bytes);
        if (keep_lowp) {
          ++p.lowp_param_grads;
        } else {
          b_.Free(lowp);
        }
      }
      if (keep_lowp && units_[unit].modules.front() == m) {
        // SplitWithSizesBackward: torch.cat of the per-parameter gradients into the flat
        // parameter's low-precision gradient, after which they are dropped.
        for (FlatParam& p : u.params) {
          b_.Allocate("grad_flat." + p.name, p.numel * pbytes, compute_);
          b_.MemoryKernel(compute_, "fairscale::SplitWithSizesBackward.cat", p.numel * pbytes, p.numel * pbytes);
          for (int32_t k = 0; k < p.lowp_param_grads; ++k) b_.Free(fmt::format("grad_lowp.{}.{}", p.name, k));
          p.lowp_param_grads = 0;
          p.grad_flat_live = true;
        }
      }
    }
    if (units_[unit].modules.front() == m) PostBackward(unit, sync);
  }
  // _post_backward_final_callback: with gradient sync the current stream waits for the
  // post-backward stream and, for HSDP, the all-reduce stream (fairscale
  // _wait_for_post_backward: current_stream().wait_stream(post_backward)).
  b_.SetModule("");
  if (sync) {
    // fairscale _wait_for_post_backward: self._reducer.flush() on the post-backward stream
    // (every partly filled bucket is reduce-scattered), then the wait.
    for (Bucket& bucket : buckets_) FlushBucket(bucket.comm);
    WaitStream(compute_, post_backward_);
    if (all_reduce_ != compute_) WaitStream(compute_, all_reduce_);
  }
  // fairscale _wait_for_post_backward -> self._reducer.teardown(): the buckets' buffers are
  // freed at the end of every backward (Bucket.teardown; "allocated during the backward pass
  // and freed at the end of the backward pass").
  for (Bucket& bucket : buckets_) {
    if (!bucket.allocated) continue;
    const std::string name = fmt::format("reduce_scatter_bucket.{}", bucket.comm);
    b_.RecordStream(name + ".data", compute_);
    b_.Free(name + ".data");
    b_.RecordStream(name + ".output_shard", compute_);
    b_.Free(name + ".output_shard");
    bucket.allocated = false;
  }
}

// _post_backward_hook (torch) / FullyShardedDataParallel._post_backward_hook (fairscale).
void Fsdp1Lowering::PostBackward(size_t unit, bool sync) {
  const int64_t pbytes = DTypeSize(param_dtype_);
  // Autograd finishes the FlatParameter's gradient before the hook (registered on its
  // AccumulateGrad) runs.
  for (FlatParam& p : units_[unit].params) {
    if (FairscaleFp32Accumulation()) {
      if (!sync && p.grad_flat_live) {
        // Not reduced: the flat low-precision gradient is dropped (estimate: by the hook).
        b_.Free("grad_flat." + p.name);
        p.grad_flat_live = false;
      }
      if (sync && !cfg_.optimize_backward_concat) {
        // The old way: on the reducing micro-batch the per-parameter fp32 gradients are
        // concatenated into one flat fp32 gradient for the reduce-scatter (the flat
        // parameter's split backward, a torch.cat): a transient second copy of the unit's
        // unsharded fp32 gradient (PR #1186: "avoid extra memory usage caused by concat(),
        // directly allocate flattened fp32 grads"). Estimate: the per-parameter fp32
        // gradients are released right after the concatenation.
        b_.Allocate("fp32_flat_grad." + p.name, p.numel * kFp32Bytes, compute_);
        b_.MemoryKernel(compute_, "fairscale::cat_fp32_grads", p.numel * kFp32Bytes, p.numel * kFp32Bytes);
        b_.Free("fp32_grads." + p.name);
        p.fp32_live = false;
      }
    } else if (p.grad_live) {
      // AccumulateGrad into the unsharded gradient kept by no_sync.
      b_.MemoryKernel(compute_, "AccumulateGrad", 2 * p.numel * pbytes, p.numel * pbytes);
      b_.Free("grad_new." + p.name);
    } else {
      p.grad_live = true;
    }
  }
  // Composer _readd_fsdp_sync_hooks: register_full_backward_hook(sync_hook) on the modules of
  // state.fsdp_modules that are not FSDP instances: it fires when a wrapped module's gradients
  // are computed, before FSDP's post-backward (its reshard, a BACKWARD_POST prefetch and the
  // reduce-scatter). Estimate: one such module per FSDP unit.
  if (SyncHooks()) OomFlagSync(compute_, "post_backward", false);
  b_.HostWork("FSDP::post_backward", ctx_.plan.host.hook_overhead_ns);
  // _post_backward_reshard: free the unsharded parameters when _should_free_in_backward
  // (sharded, and gradients are synced or the strategy reshards after forward: under no_sync
  // SHARD_GRAD_OP keeps them for the next micro-batch); fairscale frees when
  // _require_backward_grad_sync or reshard_after_forward. NO_SHARD drops its low-precision
  // copy (post_reshard -> _free_low_precision_sharded_param).
  for (FlatParam& p : units_[unit].params) {
    if (!Sharded()) {
      if (MixedPrecision() && p.unsharded) {
        b_.RecordStream("unsharded." + p.name, compute_);
        b_.Free("unsharded." + p.name);
        p.unsharded = false;
      }
      p.prefetched = false;
      continue;
    }
    if (Torch()) Reshard(p, sync || ReshardAfterForwardStrategy());
  }
  if (!Torch() && Sharded()) FairscaleFreeFullParams(unit, sync || (ReshardAfterForwardStrategy() && !units_[unit].is_root));
  // BACKWARD_POST: _post_backward_reshard prefetches after this unit's gradient computation,
  // before its reduce-scatter is issued (same target as BACKWARD_PRE).
  if (Torch() && cfg_.backward_prefetch == Fsdp1BackwardPrefetch::kBackwardPost) {
    PrefetchUnit(BackwardPrefetchTarget(unit));
  }
  // Without sync, _post_backward_hook returns here: the unsharded gradient stays (torch: in
  // param_dtype, before the reduce_dtype cast) for the next micro-batch.
  if (!sync) return;
  // post_backward_stream.wait_stream(current_stream), then the reduction on that stream.
  WaitStream(post_backward_, compute_);
  for (FlatParam& p : units_[unit].params) {
    if (p.grad_flat_live) {
      // The flat low-precision gradient autograd produced is not what fairscale reduces (the
      // fp32 main gradient is): dropped before the reduce-scatter (estimate).
      b_.RecordStream("grad_flat." + p.name, post_backward_);
      b_.Free("grad_flat." + p.name);
      p.grad_flat_live = false;
    }
    ReduceGradient(p);
  }
}

// _reduce_grad / _reduce_grad_no_shard (torch), _post_backward_hook + _post_reduction_hook
// (fairscale), on the post-backward stream.
void Fsdp1Lowering::ReduceGradient(FlatParam& p) {
  const int64_t pbytes = DTypeSize(param_dtype_);
  const int64_t rbytes = DTypeSize(reduce_dtype_);
  std::string source;
  std::vector<std::string> post_backward_temporaries;
  std::string current;
  // Gradient averaging. torch: _init_core_state sets _gradient_predivide_factor /
  // _gradient_postdivide_factor from DefaultState._get_gradient_predivide_factor of the
  // data-parallel world (estimate for HSDP: shard x replicate group sizes), applied by
  // _div_if_needed before and after the reduction. fairscale: gradient_predivide_factor /
  // gradient_postdivide_factor of its process group's size (__init__), `div_` before the
  // reduce-scatter in _post_backward_hook and after it in _post_reduction_hook, each only when
  // the factor is above 1.
  const int32_t dp_world = Sharded() ? p.group_size * (Hybrid() && !p.expert ? replicate_size_ : 1)
                                     : ctx_.world_size;
  const double predivide = GradientPredivideFactor(dp_world);
  const double postdivide = static_cast<double>(dp_world) / predivide;
  if (FairscaleFp32Accumulation()) {
    // The fp32 gradient is reduced as it is (fp32_reduce_scatter); its buffer is dropped after
    // the reduction (fp32_grads = None in _post_backward_hook).
    source = (cfg_.optimize_backward_concat ? "fp32_grads." : "fp32_flat_grad.") + p.name;
    current = source;
  } else {
    source = "grad." + p.name;
    current = source;
    // Cast to reduce_dtype (flat_param.grad.to(handle._reduce_dtype)) on this stream.
    if (reduce_dtype_ != param_dtype_) {
      current = "grad_reduce_dtype." + p.name;
      b_.Allocate(current, p.numel * rbytes, post_backward_);
      b_.MemoryKernel(post_backward_, "FSDP::cast_to_reduce_dtype", p.numel * pbytes, p.numel * rbytes);
      post_backward_temporaries.push_back(current);
    }
  }
  // fairscale divides the unsharded gradient before chunk_and_pad.
  if (!Torch()) DivideIfNeeded(post_backward_, "fairscale::gradient_predivide", predivide, p.numel, reduce_dtype_);
  if (!Sharded()) {
    // _reduce_grad_no_shard: _div_if_needed, all_reduce of the whole gradient over the
    // process group, _div_if_needed; it becomes (or, with accumulation, is added into) the
    // full fp32 .grad.
    DivideIfNeeded(post_backward_, "FSDP::gradient_predivide", predivide, p.numel, reduce_dtype_);
    b_.Collective(post_backward_, "FSDP::all_reduce", CollectiveType::kAllReduce, world_, p.numel * rbytes,
                  reduce_dtype_);
    DivideIfNeeded(post_backward_, "FSDP::gradient_postdivide", postdivide, p.numel, reduce_dtype_);
    if (!p.grad_shard_live) {
      b_.Allocate("grad_shard." + p.name, p.numel * kFp32Bytes, post_backward_);
      b_.MemoryKernel(post_backward_, "FSDP::cast_grad_to_param_dtype", p.numel * rbytes, p.numel * kFp32Bytes);
    } else {
      b_.MemoryKernel(post_backward_, "FSDP::accumulate_grad", p.numel * (rbytes + kFp32Bytes), p.numel * kFp32Bytes);
    }
    p.grad_shard_live = true;
  } else {
    // _get_reduce_scatter_tensors: F.pad to a multiple of the group size (a new tensor) and
    // an empty sharded output; reduce_scatter_tensor on the post-backward stream.
    // fairscale: chunk_and_pad likewise.
    if (p.padded_numel() != p.numel) {
      const std::string padded = "grad_padded." + p.name;
      b_.Allocate(padded, p.padded_numel() * rbytes, post_backward_);
      b_.MemoryKernel(post_backward_, "FSDP::pad", p.numel * rbytes, p.padded_numel() * rbytes);
      post_backward_temporaries.push_back(padded);
      current = padded;
    }
    if (Torch()) DivideIfNeeded(post_backward_, "FSDP::gradient_predivide", predivide, p.padded_numel(), reduce_dtype_);
    // fairscale ReduceScatterBucketer.reduce_scatter_async: a chunk of at most
    // _get_shard_size(element size, world) elements goes into the group's bucket; larger
    // ones are reduce-scattered at once.
    const int64_t bucket_shard_cap =
        Torch() ? 0
                : static_cast<int64_t>(std::floor(cfg_.bucket_cap_mb * 1024.0 * 1024.0 / static_cast<double>(rbytes) /
                                                  static_cast<double>(p.group_size)));
    if (!Torch() && cfg_.bucket_cap_mb > 0 && p.shard_numel <= bucket_shard_cap) {
      BucketReduceScatter(p, bucket_shard_cap);
    } else {
      const bool direct = !p.grad_shard_live && reduce_dtype_ == DType::kFloat32;
      const std::string output = direct ? "grad_shard." + p.name : "new_sharded_grad." + p.name;
      b_.Allocate(output, p.shard_numel * rbytes, post_backward_);
      b_.Collective(post_backward_, "FSDP::reduce_scatter", CollectiveType::kReduceScatter, p.shard_comm,
                    p.padded_numel() * rbytes, reduce_dtype_);
      traces::StreamIndex accumulate_stream = post_backward_;
      if (Hybrid() && !p.expert && replicate_size_ > 1) {
        // HSDP: the all-reduce stream waits for the post-backward stream; the new shard is
        // recorded on it and all-reduced over the replicate (inter-node) group.
        WaitStream(all_reduce_, post_backward_);
        b_.RecordStream(output, all_reduce_);
        b_.Collective(all_reduce_, "FSDP::all_reduce", CollectiveType::kAllReduce, replicate_,
                      p.shard_numel * rbytes, reduce_dtype_);
        accumulate_stream = all_reduce_;
      }
      DivideIfNeeded(accumulate_stream, Torch() ? "FSDP::gradient_postdivide" : "fairscale::gradient_postdivide",
                     postdivide, p.shard_numel, reduce_dtype_);
      // _accumulate_sharded_grad: cast to the parameter dtype (fp32), keep the first as
      // _saved_grad_shard, add later ones into it.
      if (!direct) {
        if (!p.grad_shard_live) {
          b_.Allocate("grad_shard." + p.name, p.shard_numel * kFp32Bytes, accumulate_stream);
          b_.MemoryKernel(accumulate_stream, "FSDP::cast_grad_to_param_dtype", p.shard_numel * rbytes,
                          p.shard_numel * kFp32Bytes);
        } else {
          b_.MemoryKernel(accumulate_stream, "FSDP::accumulate_sharded_grad", p.shard_numel * (rbytes + kFp32Bytes),
                          p.shard_numel * kFp32Bytes);
        }
        b_.Free(output);
      }
      p.grad_shard_live = true;
    }
  }
  for (const std::string& temporary : post_backward_temporaries) b_.Free(temporary);
  // The gradient autograd computed on the compute stream is consumed here:
  // _no_dispatch_record_stream(autograd_computed_grad, post_backward_stream), then dropped
  // (flat_param.grad = None in _reduce_grad).
  b_.RecordStream(source, post_backward_);
  b_.Free(source);
  p.grad_live = false;
  p.fp32_live = false;
}

// fairscale ReduceScatterBucketer (fairscale/utils/reduce_scatter_bucketer.py): the group's
// Bucket is a (world x shard capacity) buffer plus an output shard, made on first use
// (_get_bucket -> Bucket.setup). If the chunk does not fit in what is left, the bucket is
// flushed first; then the chunks are stacked into the bucket's columns
// (torch.stack(input_list) and copy_: estimate, one kernel of twice the traffic, the stack's
// temporary not modelled).
void Fsdp1Lowering::BucketReduceScatter(FlatParam& p, int64_t shard_capacity) {
  auto it = std::find_if(buckets_.begin(), buckets_.end(), [&](const Bucket& b) { return b.comm == p.shard_comm; });
  if (it == buckets_.end()) {
    buckets_.push_back(Bucket{p.shard_comm, p.group_size, shard_capacity, 0, false, 0, {}});
    buckets_.back().element_bytes = DTypeSize(reduce_dtype_);
    it = buckets_.end() - 1;
  }
  Bucket& bucket = *it;
  const std::string name = fmt::format("reduce_scatter_bucket.{}", bucket.comm);
  if (!bucket.allocated) {
    b_.Allocate(name + ".data", bucket.group_size * bucket.shard_capacity * bucket.element_bytes, post_backward_);
    b_.Allocate(name + ".output_shard", bucket.shard_capacity * bucket.element_bytes, post_backward_);
    bucket.allocated = true;
  }
  if (p.shard_numel > bucket.shard_capacity - bucket.offset) FlushBucket(bucket.comm);
  const int64_t bytes = p.padded_numel() * bucket.element_bytes;
  b_.MemoryKernel(post_backward_, "fairscale::bucket_copy", 2 * bytes, 2 * bytes);
  bucket.offset += p.shard_numel;
  bucket.pending.push_back(&p);
}

// Bucket.flush: one reduce-scatter of the filled columns (input world x offset elements), then
// the post-reduction callbacks of the chunks in it (_post_reduction_hook: post-divide, the
// shard kept as the parameter's gradient; estimate: as its own tensor, not a view into the
// output shard), and the bucket is zeroed for reuse.
void Fsdp1Lowering::FlushBucket(traces::CommSlot comm) {
  auto it = std::find_if(buckets_.begin(), buckets_.end(), [&](const Bucket& b) { return b.comm == comm; });
  if (it == buckets_.end() || it->offset == 0) return;
  Bucket& bucket = *it;
  const int64_t input_bytes = bucket.group_size * bucket.offset * bucket.element_bytes;
  b_.Collective(post_backward_, "fairscale::bucket_reduce_scatter", CollectiveType::kReduceScatter, bucket.comm,
                input_bytes, reduce_dtype_);
  const double predivide = GradientPredivideFactor(bucket.group_size);
  const double postdivide = static_cast<double>(bucket.group_size) / predivide;
  for (FlatParam* p : bucket.pending) {
    DivideIfNeeded(post_backward_, "fairscale::gradient_postdivide", postdivide, p->shard_numel, reduce_dtype_);
    if (!p->grad_shard_live) {
      b_.Allocate("grad_shard." + p->name, p->shard_numel * kFp32Bytes, post_backward_);
      b_.MemoryKernel(post_backward_, "fairscale::keep_reduced_shard", p->shard_numel * kFp32Bytes,
                      p->shard_numel * kFp32Bytes);
    } else {
      b_.MemoryKernel(post_backward_, "FSDP::accumulate_sharded_grad", 2 * p->shard_numel * kFp32Bytes,
                      p->shard_numel * kFp32Bytes);
    }
    p->grad_shard_live = true;
  }
  b_.MemoryKernel(post_backward_, "fairscale::bucket_zero", 0, input_bytes);
  bucket.pending.clear();
  bucket.offset = 0;
  ++bucket.flushes;
}

void Fsdp1Lowering::Optimizer() {
  b_.SetPhase(Phase::kOptimizer);
  b_.SetMicroBatch(-1);
  b_.SetModule("");
  // _finalize_params -> prepare_gradient_for_optim: _saved_grad_shard becomes .grad.
  // FSDP.clip_grad_norm_: the local norm of the sharded gradients all-reduced over the
  // process group (NO_SHARD alone falls back to torch.nn.utils.clip_grad_norm_).
  int64_t local_numel = 0;
  for (const Fsdp1Unit& unit : units_) {
    for (const FlatParam& p : unit.params) local_numel += p.shard_numel;
  }
  EmitClipGradNorm(ctx_, b_, compute_, local_numel, Sharded(), world_);
  for (const Fsdp1Unit& unit : units_) {
    for (const FlatParam& p : unit.params) {
      b_.SetModule(p.name);
      b_.HostWork("python op", ctx_.plan.host.python_op_overhead_ns);
      EmitAdamW(b_, compute_, p.shard_numel, kFp32Bytes);
    }
  }
  // zero_grad(set_to_none=True) frees the sharded gradients.
  for (Fsdp1Unit& unit : units_) {
    for (FlatParam& p : unit.params) {
      if (p.grad_shard_live) b_.Free("grad_shard." + p.name);
      p.grad_shard_live = false;
    }
  }
}

}  // namespace

// One OOM-flag agreement as Composer's sync_hook (composer/trainer/trainer.py
// _create_sync_hook) runs it: the flag tensor([0], dtype=torch.uint8) all-reduced with MAX on
// the default (world) process group, read on the host with .item() (a D2H copy and a stream
// synchronize), then tensor([0]) all-reduced with MIN ("Signal current rank is still in
// batch"). `read_finished_flag`: the trainer's end-of-batch loop also reads the MIN result.
// Both all-reduces are agreement points (CollectiveOp::oom_sync). The dtype is 1-byte uint8;
// int8 is the schedule's 1-byte integer type.
void Fsdp1Lowering::OomFlagSync(traces::StreamIndex stream, std::string_view where, bool read_finished_flag) {
  constexpr int64_t kFlagBytes = 1;
  b_.HostWork(fmt::format("composer::sync_hook ({})", where), ctx_.plan.host.hook_overhead_ns);
  b_.OomSyncAllReduce(stream, "composer::all_reduce found_cuda_oom (MAX)", world_, kFlagBytes, DType::kInt8);
  b_.Memcpy(stream, "composer::found_cuda_oom.item()", traces::MemcpyKind::kDeviceToHost, kFlagBytes);
  b_.StreamSync("composer::found_cuda_oom.item()", stream);
  b_.OomSyncAllReduce(stream, "composer::all_reduce all_ranks_finished (MIN)", world_, kFlagBytes, DType::kInt8);
  if (read_finished_flag) {
    b_.Memcpy(stream, "composer::all_ranks_finished.item()", traces::MemcpyKind::kDeviceToHost, kFlagBytes);
    b_.StreamSync("composer::all_ranks_finished.item()", stream);
  }
}

StatusOr<LoweredPrograms> LowerFsdp1(const LoweringContext& ctx) {
  LoweredPrograms out;
  SHARDSCOPE_ASSIGN_OR_RETURN(traces::Program program, Fsdp1Lowering(ctx, false).Lower());
  out.programs.push_back(std::move(program));
  if (ctx.plan.checkpoint.consolidate_optimizer_state) {
    // Only rank 0 copies the gathered state to the CPU: it runs a program of its own.
    SHARDSCOPE_ASSIGN_OR_RETURN(traces::Program rank0, Fsdp1Lowering(ctx, true).Lower());
    out.programs.push_back(std::move(rank0));
    out.program_of_rank.assign(static_cast<size_t>(ctx.world_size), 0);
    out.program_of_rank[0] = 1;
  }
  return out;
}

}  // namespace shardscope::sim

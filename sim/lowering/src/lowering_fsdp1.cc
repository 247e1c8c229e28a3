// Lowering of FSDP1 (torch.distributed.fsdp.FullyShardedDataParallel) and of fairscale's
// FullyShardedDataParallel, which FSDP1 descends from.
//
// torch: torch/distributed/fsdp/_runtime_utils.py (hooks, streams, unshard / reshard, gradient
// reduction), _flat_param.py (FlatParamHandle: the flat parameter, its padding, mixed
// precision), _limiter_utils.py (the all-gather rate limiter), _init_utils.py (sharding
// strategies, HSDP process groups).
// fairscale: fairscale/nn/data_parallel/fully_sharded_data_parallel.py and
// fairscale/nn/misc/flatten_params_wrapper.py.
//
// This file: units, unshard / reshard with their streams and the all-gather limiter, forward,
// the step; the backward hooks and the gradient reduction are in lowering_fsdp1_backward.cc.
#include <algorithm>
#include <deque>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lowering_fsdp1.h"

namespace shardscope::sim {

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
bool Fsdp1Lowering::Prefetchable(int64_t unit) const {
  return unit >= 0 && unit < static_cast<int64_t>(units_.size()) && !hook_ran_[static_cast<size_t>(unit)];
}

void Fsdp1Lowering::PrefetchUnit(int64_t unit) {
  if (Prefetchable(unit)) UnshardUnit(static_cast<size_t>(unit));
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
      AllocateOptimizerState(b_, compute_, p.name, p.shard_numel * kFp32Bytes);
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
      EmitAdamWStep(ctx_, b_, compute_, p.name, p.shard_numel, kFp32Bytes);
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

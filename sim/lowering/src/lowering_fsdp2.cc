// Lowering of FSDP2 (torch.distributed.fsdp.fully_shard).
//
// Every fsdp2 knob of the plan (plan.h Fsdp2Config) maps to the fully_shard argument or
// FSDPModule setter of the same name; the source each decision follows is cited beside it.
// Paths are in pytorch/pytorch under torch/distributed/fsdp/_fully_shard/ unless they name
// torchtitan.
//
// This file: unshard / reshard, forward, the backward hooks with foreach_reduce and the step;
// the units and their prefetch lists are built in lowering_fsdp2_units.cc.
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lowering_fsdp2.h"

namespace shardscope::sim {

StatusOr<traces::Program> Fsdp2Lowering::Lower() {
  const Plan& plan = ctx_.plan;
  mesh_ = MeshOf(plan);
  // MixedPrecisionPolicy(param_dtype, reduce_dtype) from the plan (torchtitan's defaults:
  // mixed_precision_param = training dtype, mixed_precision_reduce = float32). The sharded
  // parameters, gradients and optimizer states stay fp32 (the original dtype).
  param_dtype_ = plan.fsdp2.param_dtype;
  reduce_dtype_ = plan.fsdp2.reduce_dtype;
  SHARDSCOPE_RETURN_IF_ERROR(BuildUnits());
  SHARDSCOPE_RETURN_IF_ERROR(BuildPrefetchTargets());

  // FSDPCommContext.lazy_init (_fsdp_param_group.py): all-gather copy-in, all-gather and
  // reduce-scatter streams at high priority (-1); compute on the current stream; HSDP's
  // all-reduce stream at default priority ("run the HSDP all-reduces concurrently with
  // all-gather/reduce-scatter").
  compute_ = b_.Stream("compute", 0);
  copy_in_ = b_.Stream("all_gather_copy_in", -1);
  all_gather_ = b_.Stream("all_gather", -1);
  reduce_scatter_ = b_.Stream("reduce_scatter", -1);
  if (mesh_.replicate > 1) all_reduce_ = b_.Stream("all_reduce", 0);

  // Model states that live across steps: the fp32 sharded parameters and AdamW's two fp32
  // moments (12 bytes per parameter / group size, the ZeRO paper's 16Ψ/N with gradients).
  b_.SetPhase(Phase::kNone);
  for (const Fsdp2Unit& unit : units_) {
    b_.SetModule(unit.name);
    AllocateOptimizerState(b_, compute_, unit.name, unit.shard_numel * ctx_.MasterBytes());
  }

  for (int32_t mb = 0; mb < plan.training.grad_accum_steps; ++mb) {
    b_.SetMicroBatch(mb);
    Forward();
    Backward(mb);
  }

  // clip_grad_norm_ over the sharded fp32 gradients (torchtitan's train step, max_norm
  // 1.0 by default; torchtitan/distributed/utils.py clip_grad_norm_): the total norm is a
  // DTensor Partial over the shard dimension only (HSDP gradients are Replicate over the
  // replicate dimension), so full_tensor() all-reduces over the shard group. With EP the
  // expert gradients live on the (ep, efsdp) mesh that spans every rank
  // (_clip_grad_norm_with_ep: a second all-reduce, folded here into one over the world).
  b_.SetPhase(Phase::kOptimizer);
  b_.SetMicroBatch(-1);
  b_.SetModule("");
  int64_t local_grad_numel = 0;
  bool has_experts = false;
  for (const Fsdp2Unit& unit : units_) {
    local_grad_numel += unit.shard_numel;
    has_experts = has_experts || unit.expert;
  }
  EmitClipGradNorm(ctx_, b_, compute_, local_grad_numel, /*sharded=*/true,
                   b_.Comm(has_experts ? kCommWorld : kCommShard));

  // Optimizer step on the local shards, then zero_grad(set_to_none=True) frees the sharded
  // gradients (torch/optim/optimizer.py Optimizer.zero_grad).
  for (const Fsdp2Unit& unit : units_) {
    EmitAdamWStep(ctx_, b_, compute_, unit.name, unit.shard_numel, ctx_.MasterBytes());
  }
  for (Fsdp2Unit& unit : units_) {
    if (unit.grad_shard) b_.Free("grad_shard." + unit.name);
    unit.grad_shard = false;
  }
  return b_.Finish();
}

// FSDPParamGroup.unshard -> foreach_all_gather (_fsdp_collectives.py): on the copy-in
// stream, cast the fp32 shard to param_dtype, allocate the flat all-gather output and copy
// the local shard into it (all_gather_copy_in); the all-gather stream waits for the
// copy-in and runs all_gather_into_tensor; an event marks its completion.
void Fsdp2Lowering::UnshardUnit(size_t unit_index) {
  Fsdp2Unit& u = units_[unit_index];
  if (u.unsharded || u.all_gather_issued) return;
  const std::string& n = u.name;
  const int64_t unsharded_bytes = UnshardedNumel(u) * ParamBytes();
  if (u.post_forward_sharded) {
    // Resharded to the post-forward mesh: the all-gather streams wait for the reshard's
    // event (_reshard_after_forward_event, FSDPParamGroup.unshard), the all-gather input is
    // the post-forward slice, already in param_dtype (FSDPParam.all_gather_inputs in the
    // SHARDED_POST_FORWARD state), gathered over the k ranks of the post-forward group.
    const int64_t slice_bytes = unsharded_bytes / u.post_forward_size;
    b_.Wait(copy_in_, b_.Event("reshard_after_forward." + n));
    b_.Wait(all_gather_, b_.Event("reshard_after_forward." + n));
    b_.Allocate("all_gather_output." + n, unsharded_bytes, copy_in_);
    b_.MemoryKernel(copy_in_, "FSDP::all_gather_copy_in", slice_bytes, slice_bytes);
    b_.Record(b_.Event("copy_in." + n), copy_in_);
    b_.Wait(all_gather_, b_.Event("copy_in." + n));
    b_.Collective(all_gather_, "FSDP::all_gather", CollectiveType::kAllGather, b_.Comm(kCommPostForward),
                  unsharded_bytes, param_dtype_);
    b_.Record(b_.Event("all_gather." + n), all_gather_);
    u.all_gather_issued = true;
    return;
  }
  const int64_t shard_bytes = u.shard_numel * ParamBytes();
  // MixedPrecisionPolicy.param_dtype None or the parameters' own dtype: the shard is the
  // all-gather input, no cast (FSDPParam.init_dtype_attrs: param_dtype equal to the original
  // dtype is None).
  const bool cast_param = param_dtype_ != ctx_.master_dtype;
  if (cast_param) {
    b_.Allocate("cast." + n, shard_bytes, copy_in_);
    b_.MemoryKernel(copy_in_, "FSDP::cast_to_param_dtype", u.shard_numel * ctx_.MasterBytes(), shard_bytes);
  }
  b_.Allocate("all_gather_output." + n, shard_bytes * u.group_size, copy_in_);
  b_.MemoryKernel(copy_in_, "FSDP::all_gather_copy_in", shard_bytes, shard_bytes);
  if (cast_param) b_.Free("cast." + n);
  b_.Record(b_.Event("copy_in." + n), copy_in_);
  b_.Wait(all_gather_, b_.Event("copy_in." + n));
  b_.Collective(all_gather_, "FSDP::all_gather", CollectiveType::kAllGather, b_.Comm(u.comm),
                shard_bytes * u.group_size, param_dtype_);
  b_.Record(b_.Event("all_gather." + n), all_gather_);
  u.all_gather_issued = true;
}

// FSDPParamGroup.wait_for_unshard: in forward (implicit prefetch) first release the
// previous unit's all-gather output after making the side streams wait for its copy-out;
// the current stream waits for this all-gather, allocates the unsharded parameters and
// copies out (foreach_all_gather_copy_out, split_with_sizes_copy). In forward the output's
// free is deferred to the next unit; in backward it is freed at once.
void Fsdp2Lowering::WaitForUnshard(size_t unit_index, bool forward) {
  Fsdp2Unit& u = units_[unit_index];
  if (!u.all_gather_issued) return;
  const std::string& n = u.name;
  if (forward) ReleaseForwardAllGatherState();
  b_.Wait(compute_, b_.Event("all_gather." + n));
  const int64_t unsharded_bytes = UnshardedNumel(u) * ParamBytes();
  b_.Allocate("unsharded." + n, unsharded_bytes, compute_);
  b_.MemoryKernel(compute_, "FSDP::all_gather_copy_out", unsharded_bytes, unsharded_bytes);
  b_.Record(b_.Event("copy_out." + n), compute_);
  if (u.post_forward_sharded) {
    // FSDPParam.to_unsharded drops _sharded_post_forward_param_data after the copy-out.
    b_.Free("unsharded.post_forward." + n);
    u.post_forward_sharded = false;
  }
  if (forward) {
    forward_all_gather_state_ = static_cast<int64_t>(unit_index);
  } else {
    b_.Wait(copy_in_, b_.Event("copy_out." + n));
    b_.Wait(all_gather_, b_.Event("copy_out." + n));
    b_.Free("all_gather_output." + n);
  }
  u.all_gather_issued = false;
  u.unsharded = true;
}

// _wait_all_gather_streams_on_event + dropping comm_ctx.all_gather_state.
void Fsdp2Lowering::ReleaseForwardAllGatherState() {
  if (forward_all_gather_state_ < 0) return;
  const std::string& prev = units_[static_cast<size_t>(forward_all_gather_state_)].name;
  b_.Wait(copy_in_, b_.Event("copy_out." + prev));
  b_.Wait(all_gather_, b_.Event("copy_out." + prev));
  b_.Free("all_gather_output." + prev);
  forward_all_gather_state_ = -1;
}

// FSDPParamGroup.reshard in the FORWARD state: nothing without a post-forward mesh
// (_reshard_after_forward False); to_sharded_post_forward with a smaller one — clone this
// rank's 1/k slice of the unsharded parameters (FSDPParam.to_sharded_post_forward:
// all_gather_outputs[0].narrow(...).clone()), free them, record the reshard event; otherwise
// free them (to_sharded).
void Fsdp2Lowering::ReshardAfterForward(size_t unit_index) {
  Fsdp2Unit& u = units_[unit_index];
  if (!u.unsharded) return;
  switch (u.after_forward) {
    case AfterForward::kKeep: return;
    case AfterForward::kReshard: Reshard(unit_index); return;
    case AfterForward::kPostForward: {
      const std::string& n = u.name;
      const int64_t slice_bytes = UnshardedNumel(u) * ParamBytes() / u.post_forward_size;
      b_.Allocate("unsharded.post_forward." + n, slice_bytes, compute_);
      b_.MemoryKernel(compute_, "FSDP::to_sharded_post_forward", slice_bytes, slice_bytes);
      Reshard(unit_index);
      b_.Record(b_.Event("reshard_after_forward." + n), compute_);
      u.post_forward_sharded = true;
      return;
    }
  }
}

// FSDPParamGroup.reshard (to_sharded): free the unsharded parameters (stream-ordered on compute).
void Fsdp2Lowering::Reshard(size_t unit_index) {
  Fsdp2Unit& u = units_[unit_index];
  if (!u.unsharded) return;
  b_.Free("unsharded." + u.name);
  u.unsharded = false;
}

// FSDPState._pre_forward: FSDPParamGroup.pre_forward (unshard, wait_for_unshard), then the
// explicit forward prefetches (_prefetch_unshard of each set_modules_to_forward_prefetch
// target). Without explicit prefetch, the next unit's unshard is issued when the CPU reaches
// its pre-forward while this unit still computes: FSDP2's implicit forward prefetch.
void Fsdp2Lowering::PreForward(size_t unit) {
  b_.HostWork("FSDP::pre_forward", ctx_.plan.host.hook_overhead_ns);
  UnshardUnit(unit);
  WaitForUnshard(unit, /*forward=*/true);
  for (size_t target : forward_prefetch_[unit]) UnshardUnit(target);
}

void Fsdp2Lowering::Forward() {
  b_.SetPhase(Phase::kForward);
  // FSDPState._root_pre_forward: the all-gather streams wait for the current stream, so a
  // micro-batch's first all-gather does not start before the previous backward has ended.
  b_.SetModule(ctx_.modules.front().name);
  b_.HostWork("FSDP::root_pre_forward", ctx_.plan.host.hook_overhead_ns);
  b_.Record(b_.Event("root_pre_forward"), compute_);
  b_.Wait(copy_in_, b_.Event("root_pre_forward"));
  b_.Wait(all_gather_, b_.Event("root_pre_forward"));
  for (size_t m = 0; m < ctx_.modules.size(); ++m) {
    const ModuleKernels& module = ctx_.modules[m];
    const size_t unit = unit_of_module_[m];
    const bool first_of_unit = units_[unit].modules.front() == m;
    const bool last_of_unit = units_[unit].modules.back() == m;
    b_.SetModule(module.name);
    if (first_of_unit) PreForward(unit);
    // The nested experts' pre-forward: their all-gather (over ep_dp) after the block's own
    // unshard, before the block's kernels (in the model the experts' hook fires inside the
    // block, after attention; the copy-out is what the expert GEMMs wait for).
    for (size_t experts : experts_of_module_[m]) PreForward(experts);
    EmitForwardKernels(ctx_, b_, compute_, module, KernelPart::kModel);
    for (size_t experts : experts_of_module_[m]) {
      b_.HostWork("FSDP::post_forward", ctx_.plan.host.hook_overhead_ns);
      ReshardAfterForward(experts);
    }
    if (last_of_unit) {
      // FSDPState._post_forward -> FSDPParamGroup.post_forward: reshard per
      // reshard_after_forward. After the last unit, the forward root (the parameter-less
      // fully_shard(model), or the only unit with root_only) frees the last all-gather state.
      b_.HostWork("FSDP::post_forward", ctx_.plan.host.hook_overhead_ns);
      ReshardAfterForward(unit);
      if (m + 1 == ctx_.modules.size()) ReleaseForwardAllGatherState();  // the root's post_forward
    }
  }
  // The loss runs after the root's forward has returned (KernelPart).
  EmitLossForward(ctx_, b_, compute_);
}

void Fsdp2Lowering::Backward(int32_t micro_batch) {
  micro_batch_ = micro_batch;
  WalkFsdpBackward(ctx_, b_, compute_, *this);
}

// Autograd allocates the unsharded gradients (param dtype) as the block's backward runs:
// the unit's gradient of this module, then its nested experts'. Units in backward order are
// the reverse of post-forward order ([norm, output] first, the embedding last; FSDP2's
// _backward_prefetch walks post_forward_order backwards). Activation checkpointing
// recomputes inside the unit, whose parameters are unsharded: no extra all-gather
// (FSDPState._pre_forward skips the unshard in PRE_BACKWARD). The block's experts run first
// in its backward (the MoE is the block's last part); their pre-backward hook fires after the
// block's, so their unshard (a no-op when the previous unit prefetched them, as torchtitan's
// EP lists do) queues behind the block's prefetches, and their post-backward (their input
// gradient is ready before attention's backward) comes before the unit's.
void Fsdp2Lowering::AllocateGradients(size_t m) {
  const ModuleKernels& module = ctx_.modules[m];
  for (const auto& [grad, numel] : units_[unit_of_module_[m]].grads) {
    if (grad == "grad." + module.name) b_.Allocate(grad, numel * ParamBytes(), compute_);
  }
  for (size_t experts : experts_of_module_[m]) {
    for (const auto& [grad, numel] : units_[experts].grads) b_.Allocate(grad, numel * ParamBytes(), compute_);
  }
}

void Fsdp2Lowering::FreeReduceScatterState() {
  if (reduce_scatter_state_ < 0) return;
  const std::string& prev = units_[static_cast<size_t>(reduce_scatter_state_)].name;
  b_.Wait(compute_, b_.Event("reduce_scatter." + prev));
  b_.Free("reduce_scatter_input." + prev);
  reduce_scatter_state_ = -1;
}

// FSDPState._root_post_backward_final_callback -> finalize_backward: the current stream
// waits for each group's post-reduce event (each stream is FIFO, so its last event covers
// the others) and for the last reduce-scatter, whose input is then freed; HSDP's
// all-reduce buffers (_all_reduce_state) are dropped.
void Fsdp2Lowering::FinalCallback() {
  if (!last_post_reduce_rs_.empty()) {
    b_.Wait(compute_, b_.Event(last_post_reduce_rs_));
    last_post_reduce_rs_.clear();
  }
  if (!last_post_reduce_ar_.empty()) {
    b_.Wait(compute_, b_.Event(last_post_reduce_ar_));
    last_post_reduce_ar_.clear();
  }
  FreeReduceScatterState();
  for (const std::string& buffer : all_reduce_state_) b_.Free(buffer);
  all_reduce_state_.clear();
}

// FSDPParamGroup.post_backward -> foreach_reduce (_fsdp_collectives.py).
void Fsdp2Lowering::PostBackward(size_t unit_index) {
  const int32_t micro_batch = micro_batch_;
  Fsdp2Unit& u = units_[unit_index];
  const std::string& n = u.name;
  const Fsdp2Config& cfg = ctx_.plan.fsdp2;
  b_.HostWork("FSDP::post_backward", ctx_.plan.host.hook_overhead_ns);
  const int64_t grad_numel = GradNumel(u);
  const std::string accumulated = "grad.accumulated." + n;
  const auto free_grads = [&] {
    for (const auto& [grad, numel] : u.grads) b_.Free(grad);
  };
  // FSDPParam.accumulate_unsharded_grad_if_needed: a gradient kept from earlier micro-batches
  // absorbs this one (unsharded_accumulated_grad += grad; .grad = None).
  if (u.accumulated_grad) {
    b_.MemoryKernel(compute_, "FSDP::accumulate_unsharded_grad",
                    grad_numel * (DTypeSize(u.accumulated_dtype) + ParamBytes()),
                    grad_numel * DTypeSize(u.accumulated_dtype));
    free_grads();
  }
  // set_reshard_after_backward(False) keeps the parameters for the next micro-batch's forward
  // (its unshard is then a no-op). FSDP2 never reshards them by itself (finalize_backward does
  // not): the last backward must run with it True again, or the next step would compute with
  // stale parameters — so the last micro-batch reshards.
  const bool reshard = cfg.reshard_after_backward || LastMicroBatch(micro_batch);

  if (!ReducesThisMicroBatch(u, micro_batch)) {
    // reduce_grads False (set_requires_gradient_sync(False)): reshard, then
    // FSDPParam.to_accumulated_grad_if_needed — with reduce_dtype other than the parameters'
    // dtype the unsharded gradient is cast once into unsharded_accumulated_grad; otherwise
    // autograd keeps accumulating into the unsharded .grad (a rename here, no kernel).
    if (reshard) Reshard(unit_index);
    if (!u.accumulated_grad) {
      u.accumulated_dtype = reduce_dtype_ != param_dtype_ ? reduce_dtype_ : param_dtype_;
      if (reduce_dtype_ != param_dtype_) {
        b_.Allocate(accumulated, grad_numel * DTypeSize(reduce_dtype_), compute_);
        b_.MemoryKernel(compute_, "FSDP::to_accumulated_grad", grad_numel * ParamBytes(),
                        grad_numel * DTypeSize(reduce_dtype_));
        free_grads();
      } else {
        free_grads();
        b_.Allocate(accumulated, grad_numel * ParamBytes(), compute_);
      }
      u.accumulated_grad = true;
    }
    return;
  }

  if (reshard) Reshard(unit_index);
  // The previous reduce-scatter's input is freed once the current stream has waited for it
  // (comm_ctx.reduce_scatter_state), so about one reduce-scatter runs ahead of compute.
  FreeReduceScatterState();
  // foreach_reduce: the reduce-scatter input in reduce_dtype, padded to the group
  // (_get_dim0_padded_size); chunk_cat widens (bf16 -> fp32) in one kernel, a narrowing
  // (fp32 -> bf16) goes through a gradient-dtype buffer and a copy.
  const DType grad_dtype = u.accumulated_grad ? u.accumulated_dtype : param_dtype_;
  const int64_t unsharded_numel = UnshardedNumel(u);
  const int64_t input_bytes = unsharded_numel * ReduceBytes();
  b_.Allocate("reduce_scatter_input." + n, input_bytes, compute_);
  // torch.promote_types(grad_dtype, reduce_dtype) == reduce_dtype: a widening cast.
  const bool widening = grad_dtype == reduce_dtype_ || reduce_dtype_ == DType::kFloat32 ||
                        reduce_dtype_ == DType::kFloat64;
  if (!widening) {
    b_.Allocate("reduce_scatter_input.grad_dtype." + n, unsharded_numel * DTypeSize(grad_dtype), compute_);
    b_.MemoryKernel(compute_, "FSDP::chunk_cat", grad_numel * DTypeSize(grad_dtype),
                    unsharded_numel * DTypeSize(grad_dtype));
    b_.MemoryKernel(compute_, "FSDP::copy_to_reduce_dtype", unsharded_numel * DTypeSize(grad_dtype), input_bytes);
    b_.Free("reduce_scatter_input.grad_dtype." + n);
  } else {
    b_.MemoryKernel(compute_, "FSDP::chunk_cat", grad_numel * DTypeSize(grad_dtype), input_bytes);
  }
  // "Only after the copy-in finishes can we free the gradients" (unsharded_grads.clear()).
  if (u.accumulated_grad) {
    b_.Free(accumulated);
    u.accumulated_grad = false;
  } else {
    free_grads();
  }
  // reduce_scatter_stream.wait_stream(current_stream), then the reduce-scatter.
  b_.Record(b_.Event("grads_ready." + n), compute_);
  b_.Wait(reduce_scatter_, b_.Event("grads_ready." + n));

  // The output in reduce_dtype, allocated on the reduce-scatter stream. With reduce_dtype
  // fp32 (the sharded parameters' dtype) it becomes the sharded .grad itself (views into it)
  // when none exists yet; otherwise it is cast / added into .grad and dropped.
  const bool cast = reduce_dtype_ != ctx_.master_dtype;
  const bool all_reduce_now = Hsdp(u) && (cfg.requires_all_reduce || LastMicroBatch(micro_batch));
  const bool defer_all_reduce = Hsdp(u) && !all_reduce_now;
  const int64_t shard_bytes = u.shard_numel * ReduceBytes();
  std::string output = "reduce_scatter_output." + n;
  bool output_is_grad = false;
  if (defer_all_reduce && !u.partial_reduce) {
    output = "reduce_scatter_output.partial." + n;
  } else if (!defer_all_reduce && !cast && !u.grad_shard) {
    output = "grad_shard." + n;
    output_is_grad = true;
  }
  b_.Allocate(output, shard_bytes, reduce_scatter_);
  // _get_gradient_divide_factors: fp32 and bf16 reduce with NCCL's AVG; other reduce dtypes
  // (fp16) risk overflow, so SUM with a divide by about sqrt(N) before and after
  // (_div_if_needed on the input, then on the output on the post-reduce stream).
  const bool divide_kernels = reduce_dtype_ != DType::kFloat32 && reduce_dtype_ != DType::kBFloat16;
  if (divide_kernels) b_.MemoryKernel(reduce_scatter_, "FSDP::predivide", input_bytes, input_bytes);
  b_.Collective(reduce_scatter_, "FSDP::reduce_scatter", CollectiveType::kReduceScatter, b_.Comm(u.comm),
                input_bytes, reduce_dtype_);
  // foreach_reduce records the reduce-scatter event right after the collective (it frees
  // the input); the post-reduce event follows the accumulation into .grad.
  b_.Record(b_.Event("reduce_scatter." + n), reduce_scatter_);
  traces::StreamIndex post_reduce = reduce_scatter_;

  if (defer_all_reduce) {
    // set_requires_all_reduce(False) (HSDP gradient accumulation with reduce-scatter only):
    // the output accumulates into partial_reduce_output on the reduce-scatter stream and
    // foreach_reduce returns before the all-reduce and before setting .grad.
    if (u.partial_reduce) {
      b_.MemoryKernel(reduce_scatter_, "FSDP::accumulate_partial_reduce", 2 * shard_bytes, shard_bytes);
      b_.Free(output);
    }
    u.partial_reduce = true;
    b_.Record(b_.Event("post_reduce." + n), reduce_scatter_);
    last_post_reduce_rs_ = "post_reduce." + n;
    reduce_scatter_state_ = static_cast<int64_t>(unit_index);
    return;
  }
  if (all_reduce_now) {
    if (u.partial_reduce) {  // reduce_output += partial_reduce_output
      b_.MemoryKernel(reduce_scatter_, "FSDP::accumulate_partial_reduce", 2 * shard_bytes, shard_bytes);
      b_.Free("reduce_scatter_output.partial." + n);
      u.partial_reduce = false;
    }
    // all_reduce_stream.wait_stream(reduce_scatter_stream); all_reduce over the replicate
    // group; the post-reduce work then runs on the all-reduce stream.
    b_.Record(b_.Event("reduce_scatter_done." + n), reduce_scatter_);
    b_.Wait(all_reduce_, b_.Event("reduce_scatter_done." + n));
    b_.Collective(all_reduce_, "FSDP::all_reduce", CollectiveType::kAllReduce, b_.Comm(kCommReplicate),
                  shard_bytes, reduce_dtype_);
    post_reduce = all_reduce_;
  }
  if (divide_kernels) b_.MemoryKernel(post_reduce, "FSDP::postdivide", shard_bytes, shard_bytes);
  std::string new_grad = output;
  if (cast) {
    // _to_dtype_if_needed(reduce_output, orig_dtype): a new fp32 tensor for the fp32 optimizer.
    new_grad = u.grad_shard ? "grad_tmp." + n : "grad_shard." + n;
    const int64_t master_bytes = u.shard_numel * ctx_.MasterBytes();
    b_.Allocate(new_grad, master_bytes, post_reduce);
    b_.MemoryKernel(post_reduce, "FSDP::cast_to_orig_dtype", shard_bytes, master_bytes);
    output_is_grad = !u.grad_shard;
    // HSDP keeps the all-reduce buffer (_all_reduce_state) until the end of backward so the
    // next reduce-scatter cannot reuse it while the all-reduce still runs.
    if (all_reduce_now) {
      all_reduce_state_.push_back(output);
    } else {
      b_.Free(output);
    }
  }
  if (!output_is_grad) {
    // The sharded .grad exists: sharded_param.grad._local_tensor += new_sharded_grad.
    const int64_t master_bytes = u.shard_numel * ctx_.MasterBytes();
    b_.MemoryKernel(post_reduce, "FSDP::accumulate_grad", 2 * master_bytes, master_bytes);
    if (!cast && all_reduce_now) {
      all_reduce_state_.push_back(output);  // the fp32 all-reduce buffer, held as above
    } else {
      b_.Free(new_grad);
    }
  }
  u.grad_shard = true;
  b_.Record(b_.Event("post_reduce." + n), post_reduce);
  (post_reduce == reduce_scatter_ ? last_post_reduce_rs_ : last_post_reduce_ar_) = "post_reduce." + n;
  reduce_scatter_state_ = static_cast<int64_t>(unit_index);
}

StatusOr<LoweredPrograms> LowerFsdp2(const LoweringContext& ctx) {
  LoweredPrograms out;
  SHARDSCOPE_ASSIGN_OR_RETURN(traces::Program program, Fsdp2Lowering(ctx).Lower());
  out.programs.push_back(std::move(program));
  return out;
}

}  // namespace shardscope::sim

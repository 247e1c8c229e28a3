// Lowering of DeepSpeed ZeRO stages 1 and 2: deepspeed/runtime/zero/stage_1_and_2.py
// (DeepSpeedZeroOptimizer). Knob names and defaults: runtime/zero/config.py (plan.h
// ZeroConfig); data types as lowering_zero.cc states them for every stage.
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lowering_zero_internal.h"

namespace shardscope::sim {
namespace {

// ---------------------------------------------------------------------------------------
// ZeRO-1 and ZeRO-2: stage_1_and_2.py DeepSpeedZeroOptimizer.
//
// One optimizer parameter group: every bit16 parameter lives in one flat buffer
// (bit16_groups_flat, flatten_dense_tensors_aligned to nccl_start_alignment_factor (2) x
// world size), replicated on every rank, in parameter order (round_robin_gradients is off by
// default); each rank owns one equal partition of it as an fp32 master copy
// (single_partition_of_fp32_groups) with the Adam moments. get_partition_info: the
// parameters "in partition" are those that overlap the rank's range, a parameter that
// straddles a boundary counting whole on both sides.
//
// Every rank runs one program; the ranks differ only in which parameters they own. The
// program follows the rank whose owned parameters are largest in total (straddling
// parameters whole): the rank whose gradient partition peaks highest.

class Zero12Lowering {
 public:
  explicit Zero12Lowering(const LoweringContext& ctx)
      : ctx_(ctx), stage2_(ctx.plan.strategy == Strategy::kZero2), b_(stage2_ ? "zero2" : "zero1") {}
  traces::Program Lower();

 private:
  struct Param {
    int64_t numel = 0;
    int64_t own = 0;            // elements inside this rank's partition
    bool in_partition = false;  // is_param_in_current_partition
    int64_t offset = 0;         // first element in the flat group
  };
  void SetupBuckets();
  void AddGradToIpgBucket(size_t param);
  void ReduceIpgGrads();
  void LegacyReducePerRank();
  void FinishIpgReduction();
  void CopyGradsInPartition(int64_t numel);
  void ReleaseIpgBuffers(bool keep_grads_in_partition);
  int64_t ElementBytes() const { return DTypeSize(ctx_.compute_dtype); }
  // Autograd's gradient of module.params[param] (one tensor per parameter), or the new one a
  // later micro-step adds into it.
  static std::string GradTensor(const ModuleKernels& module, size_t param, bool accumulating) {
    return fmt::format("{}.{}.{}", accumulating ? "grad_tmp" : "grad", module.name, module.params[param].name);
  }

  const LoweringContext& ctx_;
  const bool stage2_;
  ProgramBuilder b_;
  traces::StreamIndex compute_ = 0, reduction_ = 0;
  traces::CommSlot dp_ = 0;
  std::vector<Param> params_;          // flat (forward) order
  int64_t partition_numel_ = 0;
  int64_t grads_in_partition_numel_ = 0;
  std::vector<size_t> ipg_params_;     // the bucket's parameters
  int64_t elements_in_ipg_bucket_ = 0;
  int32_t ipg_buffers_ = 0;            // allocated IPG buffers (0 when released)
  std::string grads_in_partition_;     // this backward's grads_in_partition ("" when None)
  std::string kept_grads_in_partition_;  // the step's first one, held by averaged_gradients
  int32_t grads_in_partition_count_ = 0;
  int32_t reductions_ = 0;
};

traces::Program Zero12Lowering::Lower() {
  const Plan& plan = ctx_.plan;
  const ZeroConfig& zero = plan.zero;
  const int64_t world = ctx_.world_size;
  const int64_t es = ElementBytes();
  compute_ = b_.Stream("compute", 0);
  // DeepSpeedZeroOptimizer.__init__: with overlap_comm the reductions run on their own
  // stream (reduction_stream = get_accelerator().Stream()), otherwise on the current stream.
  reduction_ = zero.overlap_comm ? b_.Stream("reduction", 0) : compute_;
  dp_ = b_.Comm(kCommWorld);

  int64_t total_numel = 0;
  for (const ModuleKernels& module : ctx_.modules) {
    for (const ParamTensor& p : module.params) {
      params_.push_back({p.numel, 0, false});
      total_numel += p.numel;
    }
  }
  // flatten_dense_tensors_aligned(..., nccl_start_alignment_factor * world size): the flat
  // group is padded so that it splits into `world` equal partitions.
  const int64_t flat_numel = RoundUp(total_numel, 2 * world);
  const int64_t partition_numel = flat_numel / world;
  int64_t best_rank = 0;
  for (int64_t rank = 0; rank < world; ++rank) {
    const int64_t start = rank * partition_numel, end = start + partition_numel;
    int64_t whole = 0, offset = 0;
    for (const Param& p : params_) {
      if (offset < end && offset + p.numel > start) whole += p.numel;
      offset += p.numel;
    }
    if (whole > grads_in_partition_numel_) {
      grads_in_partition_numel_ = whole;
      best_rank = rank;
    }
  }
  {
    const int64_t start = best_rank * partition_numel, end = start + partition_numel;
    int64_t offset = 0;
    for (Param& p : params_) {
      p.own = std::max<int64_t>(0, std::min(end, offset + p.numel) - std::max(start, offset));
      p.in_partition = p.own > 0;
      p.offset = offset;
      offset += p.numel;
    }
  }
  partition_numel_ = partition_numel;

  // Model states: bit16_groups_flat (the replicated parameters), the fp32 master partition
  // and the Adam moments of the partition (created by the first step and kept).
  // grads_in_partition is not kept: copy_grads_in_partition allocates it lazily in every
  // backward and _release_ipg_buffers drops it in every epilogue.
  b_.SetPhase(Phase::kNone);
  b_.Allocate("unsharded.bit16_groups_flat", flat_numel * es, compute_);
  AllocateOptimizerState(b_, compute_, "fp32_partition", partition_numel * kFp32Bytes);

  const int32_t steps = std::max<int32_t>(1, plan.training.grad_accum_steps);
  for (int32_t mb = 0; mb < steps; ++mb) {
    const bool boundary = mb + 1 == steps;
    // process_gradients: the hook reduces only if partition_gradients (stage 2) or
    // overlap_comm; reduce_ready_partitions_and_remove_grads then reduces every micro-step in
    // stage 2, only at the accumulation boundary in stage 1. In between, stage 1 lets autograd
    // accumulate the full bit16 gradients in .grad.
    const bool reduce_in_hooks = (stage2_ || zero.overlap_comm) && (stage2_ || boundary);
    // engine.py allreduce_gradients: stage 2 runs the epilogue after every backward; stage 1
    // calls reduce_gradients at the boundary only.
    const bool epilogue = stage2_ || boundary;
    b_.SetMicroBatch(mb);
    b_.SetPhase(Phase::kForward);
    for (const ModuleKernels& module : ctx_.modules) {
      b_.SetModule(module.name);
      EmitForwardKernels(ctx_, b_, compute_, module);
    }

    b_.SetPhase(Phase::kBackward);
    b_.SetModule("");
    size_t param_base = params_.size();
    std::vector<std::vector<LeafModule>> leaves_of(ctx_.modules.size());
    for (size_t m = 0; m < ctx_.modules.size(); ++m) leaves_of[m] = LeafModulesOf(ctx_.modules[m]);
    for (size_t step = 0; step < ctx_.modules.size(); ++step) {
      const size_t m = ctx_.modules.size() - 1 - step;
      const ModuleKernels& module = ctx_.modules[m];
      param_base -= module.params.size();
      b_.SetModule(module.name);
      EmitRecompute(ctx_, b_, compute_, module);
      const std::vector<LeafModule>& leaves = leaves_of[m];
      if (leaves.empty()) EmitBackwardRange(ctx_, b_, compute_, module, 0, module.backward.size());
      // create_gradient_handling_hooks -> register_grad_hook: one hook per parameter, run by
      // autograd as soon as that parameter's gradient is accumulated — interleaved with the
      // module's backward kernels, leaf by leaf in reverse forward order.
      for (size_t l = leaves.size(); l-- > 0;) {
        const LeafModule& leaf = leaves[l];
        const int64_t grad_bytes = leaf.numel * es;
        // Autograd: the first micro-step's gradients become .grad (zero_grad(set_to_none)
        // left none); later ones are added into the kept .grad (stage 1 only: stage 2's
        // epilogue dropped them). One tensor per parameter.
        const bool accumulate = !stage2_ && mb > 0;
        for (size_t i : leaf.params) {
          b_.Allocate(GradTensor(module, i, accumulate), module.params[i].numel * es, compute_);
        }
        const auto [begin, end] = BackwardShare(module, l, leaves.size());
        EmitBackwardRange(ctx_, b_, compute_, module, begin, end);
        if (accumulate) {
          b_.MemoryKernel(compute_, "AccumulateGrad", 2 * grad_bytes, grad_bytes);
          for (size_t i : leaf.params) b_.Free(GradTensor(module, i, true));
        }
        for (auto it = leaf.params.rbegin(); it != leaf.params.rend(); ++it) {
          b_.HostWork("ZeRO::grad_handling_hook", plan.host.hook_overhead_ns);
          // process_gradients -> setup_buckets: the first hook of a backward (not
          // ready_for_gradients) allocates the IPG buffer(s).
          SetupBuckets();
          if (reduce_in_hooks) {
            AddGradToIpgBucket(param_base + *it);
            // With contiguous_gradients the gradient now lives in the IPG buffer (grad.data =
            // the buffer's slice): the autograd tensor is dropped.
            b_.Free(GradTensor(module, *it, false));
          }
        }
      }
    }
    b_.SetModule("");
    if (boundary && !stage2_ && !zero.overlap_comm) {
      // reduce_gradients (stage 1 without overlap_comm): after backward, walk bit16_groups in
      // parameter (forward) order and reduce every gradient through the IPG bucket.
      size_t index = 0;
      for (size_t m = 0; m < ctx_.modules.size(); ++m) {
        const size_t base = index;
        for (const LeafModule& leaf : leaves_of[m]) {
          for (size_t i : leaf.params) {
            AddGradToIpgBucket(base + i);
            b_.Free(GradTensor(ctx_.modules[m], i, false));
          }
        }
        index += ctx_.modules[m].params.size();
      }
    }
    if (epilogue) {
      // independent_gradient_partition_epilogue: reduce what is left in the bucket; with
      // overlap_comm, get_accelerator().synchronize() before the partition is read.
      ReduceIpgGrads();
      if (zero.overlap_comm) b_.DeviceSync("ZeRO::ipg_epilogue.synchronize");
      // all_grad_tensors: the first epilogue of a step keeps references to the gradients
      // in partition (views of grads_in_partition), later ones add the new ones into them.
      const bool first_of_step = !stage2_ || mb == 0;
      if (!first_of_step) {
        b_.MemoryKernel(compute_, "ZeRO::accumulate_all_grad_tensors", 2 * grads_in_partition_numel_ * es,
                        grads_in_partition_numel_ * es);
      }
      // _release_ipg_buffers: the IPG buffers and grads_in_partition are dropped; the first
      // micro-step's grads_in_partition storage lives on through all_grad_tensors (then
      // averaged_gradients) until the step.
      ReleaseIpgBuffers(first_of_step);
    }
  }

  // DeepSpeedZeroOptimizer.step: the gradient norm over the partition (scaled_global_norm ->
  // get_grad_norm_direct on the bit16 averaged_gradients); the partition's gradient as one
  // flat fp32 tensor; averaged_gradients dropped; unscale_and_clip_grads; the optimizer on
  // the fp32 partition; the fp32 gradient dropped; the bit16 partition updated from the fp32
  // master; then all_gather_dp_groups.
  b_.SetPhase(Phase::kOptimizer);
  b_.SetMicroBatch(-1);
  b_.SetModule("");
  b_.HostWork("python op", plan.host.python_op_overhead_ns);
  std::vector<int64_t> owned;  // averaged_gradients: the owned slice of each parameter
  for (const Param& p : params_) {
    if (p.in_partition) owned.push_back(p.own);
  }
  EmitGradNormDirect(ctx_, b_, compute_, dp_, owned, /*fp64_scalar=*/false);
  b_.HostWork("python op", plan.host.python_op_overhead_ns);
  b_.Allocate("grad_shard.flat_bit16", partition_numel * es, compute_);
  b_.MemoryKernel(compute_, "ZeRO::flatten_grad_partition", partition_numel * es, partition_numel * es);
  b_.HostWork("python op", plan.host.python_op_overhead_ns);
  b_.Allocate("grad_shard.fp32_partition", partition_numel * kFp32Bytes, compute_);
  b_.MemoryKernel(compute_, "ZeRO::grad_partition.to_fp32", partition_numel * es, partition_numel * kFp32Bytes);
  b_.Free("grad_shard.flat_bit16");
  // free_grad_in_param_list(params_in_partition); averaged_gradients[i] = None.
  if (!kept_grads_in_partition_.empty()) b_.Free(kept_grads_in_partition_);
  kept_grads_in_partition_.clear();
  b_.HostWork("python op", plan.host.python_op_overhead_ns);
  b_.MemoryKernel(compute_, "ZeRO::unscale_and_clip_grads.mul_", partition_numel * kFp32Bytes,
                  partition_numel * kFp32Bytes);
  EmitAdamW(b_, compute_, partition_numel, kFp32Bytes);
  b_.Free("grad_shard.fp32_partition");
  b_.MemoryKernel(compute_, "ZeRO::copy_fp32_to_bit16_partition", partition_numel * kFp32Bytes,
                  partition_numel * es);
  // runtime/utils.py all_gather_dp_groups: where torch has all_gather_into_tensor (every
  // current version), all_gather_into_tensor_dp_groups issues one all_gather_into_tensor
  // of the whole flat group per parameter group, synchronously on the current stream; the
  // allgather_bucket_size chunking survives only in the fallback path.
  b_.Collective(compute_, "ZeRO::all_gather_dp_groups", CollectiveType::kAllGather, dp_, flat_numel * es,
                ctx_.compute_dtype);
  return b_.Finish();
}

// setup_buckets: with contiguous_gradients, the IPG buffer of reduce_bucket_size elements,
// and a second one with overlap_comm ("double buffers to avoid data access conflict"),
// allocated by the first gradient hook of a backward (ready_for_gradients false).
void Zero12Lowering::SetupBuckets() {
  const ZeroConfig& zero = ctx_.plan.zero;
  if (ipg_buffers_ > 0 || !zero.contiguous_gradients) return;
  ipg_buffers_ = zero.overlap_comm ? 2 : 1;
  for (int32_t i = 0; i < ipg_buffers_; ++i) {
    b_.Allocate(fmt::format("bucket.ipg.{}", i), zero.reduce_bucket_size * ElementBytes(), compute_);
  }
}

// reduce_independent_p_g_buckets_and_remove_grads: a gradient that would overflow the bucket
// first triggers reduce_ipg_grads (and, with contiguous_gradients and overlap_comm, a swap to
// the other IPG buffer); the gradient is then copied into the IPG buffer on the current
// stream (contiguous_gradients), except a parameter larger than the bucket, reduced from its
// own gradient (extra_large_param_to_reduce).
void Zero12Lowering::AddGradToIpgBucket(size_t param) {
  const ZeroConfig& zero = ctx_.plan.zero;
  const int64_t numel = params_[param].numel;
  if (elements_in_ipg_bucket_ + numel > zero.reduce_bucket_size) ReduceIpgGrads();
  if (zero.contiguous_gradients && numel <= zero.reduce_bucket_size) {
    b_.MemoryKernel(compute_, "ZeRO::copy_grad_to_ipg_buffer", numel * ElementBytes(), numel * ElementBytes());
  }
  ipg_params_.push_back(param);
  elements_in_ipg_bucket_ += numel;
}

// copy_grads_in_partition: grads_in_partition (the total numel of the parameters in
// partition, straddling ones whole) is allocated by the first call of a backward; the whole
// gradient of the parameter is copied in.
void Zero12Lowering::CopyGradsInPartition(int64_t numel) {
  const int64_t es = ElementBytes();
  if (grads_in_partition_.empty()) {
    grads_in_partition_ = fmt::format("grad_shard.grads_in_partition.{}", grads_in_partition_count_++);
    b_.Allocate(grads_in_partition_, grads_in_partition_numel_ * es, reduction_);
  }
  b_.MemoryKernel(reduction_, "ZeRO::copy_grads_in_partition", numel * es, numel * es);
}

// After a bucket's reduction, per parameter: the owned ones are copied whole into
// grads_in_partition (contiguous_gradients); the bucket starts empty again.
void Zero12Lowering::FinishIpgReduction() {
  if (ctx_.plan.zero.contiguous_gradients) {
    for (size_t p : ipg_params_) {
      if (params_[p].in_partition) CopyGradsInPartition(params_[p].numel);
    }
  }
  ipg_params_.clear();
  elements_in_ipg_bucket_ = 0;
  ++reductions_;
}

void Zero12Lowering::ReleaseIpgBuffers(bool keep_grads_in_partition) {
  for (int32_t i = 0; i < ipg_buffers_; ++i) b_.Free(fmt::format("bucket.ipg.{}", i));
  ipg_buffers_ = 0;
  if (grads_in_partition_.empty()) return;
  if (keep_grads_in_partition) {
    kept_grads_in_partition_ = grads_in_partition_;
  } else {
    b_.Free(grads_in_partition_);
  }
  grads_in_partition_.clear();
}

// reduce_ipg_grads -> average_tensor (reduce_scatter=True, the default) ->
// allreduce_and_scatter -> allreduce_and_copy_with_multiple_ranks -> allreduce_bucket.
// With overlap_comm the reduction stream waits on the current stream and the current stream
// waits on the reduction stream (so the previous bucket's reduction finishes before the
// other IPG buffer is refilled). On the reduction stream: the bucket is divided by the world
// size (tensor.div_), the per-rank slices are flattened (a new tensor: self.flatten), the
// flat bucket is all-reduced (use_multi_rank_bucket_allreduce: one all_reduce of the whole
// bucket, not a reduce-scatter), and the rank copies back only the slices it owns
// (buf.copy_(synced) where bucket_rank is this rank). Then, per parameter of the bucket:
// stage 2 drops the gradients of parameters outside the partition (clear_grad_attribute)
// and both stages copy the owned parameters whole into grads_in_partition.
void Zero12Lowering::ReduceIpgGrads() {
  if (ipg_params_.empty()) return;
  if (ctx_.plan.zero.legacy_reduce_per_rank) {
    LegacyReducePerRank();
    return;
  }
  const int64_t es = ElementBytes();
  const int64_t bucket_bytes = elements_in_ipg_bucket_ * es;
  int64_t own_bytes = 0;
  for (size_t p : ipg_params_) own_bytes += params_[p].own * es;
  if (reduction_ != compute_) {
    const std::string n = std::to_string(reductions_);
    b_.Record(b_.Event("ipg_ready." + n), compute_);
    b_.Record(b_.Event("reduction_drained." + n), reduction_);
    b_.Wait(reduction_, b_.Event("ipg_ready." + n));
    b_.Wait(compute_, b_.Event("reduction_drained." + n));
  }
  b_.MemoryKernel(reduction_, "ZeRO::average_tensor.div_", bucket_bytes, bucket_bytes);
  b_.Allocate("reduce_scatter_input.flat_bucket", bucket_bytes, reduction_);
  b_.MemoryKernel(reduction_, "ZeRO::allreduce_bucket.flatten", bucket_bytes, bucket_bytes);
  b_.Collective(reduction_, "ZeRO::allreduce_bucket", CollectiveType::kAllReduce, dp_, bucket_bytes,
                ctx_.compute_dtype);
  if (own_bytes > 0) b_.MemoryKernel(reduction_, "ZeRO::copy_own_slices", own_bytes, own_bytes);
  b_.Free("reduce_scatter_input.flat_bucket");
  FinishIpgReduction();
}

// The 2021 stage 1/2 average_tensor (DeepSpeed 0.3.x stage2.py, fp16-only era): with
// overlap_comm the host synchronizes the whole device (torch.cuda.synchronize()), then on the
// reduction stream the bucket is divided by the world size and every run of consecutive
// elements owned by one rank (rank_and_offsets) is reduced to that rank with its own
// dist.reduce — about one bucket of traffic in all, where today's all-reduce moves two.
void Zero12Lowering::LegacyReducePerRank() {
  const int64_t es = ElementBytes();
  const int64_t py = ctx_.plan.host.python_op_overhead_ns;
  if (ctx_.plan.zero.overlap_comm) b_.DeviceSync("ZeRO::legacy.average_tensor.synchronize");
  b_.HostWork("python op", py);
  b_.MemoryKernel(reduction_, "ZeRO::average_tensor.div_", elements_in_ipg_bucket_ * es, elements_in_ipg_bucket_ * es);
  std::vector<std::pair<int64_t, int64_t>> slices;  // (owning rank, elements)
  for (size_t p : ipg_params_) {
    const Param& param = params_[p];
    for (int64_t at = param.offset; at < param.offset + param.numel;) {
      const int64_t rank = at / partition_numel_;
      const int64_t end = std::min(param.offset + param.numel, (rank + 1) * partition_numel_);
      if (!slices.empty() && slices.back().first == rank) {
        slices.back().second += end - at;
      } else {
        slices.emplace_back(rank, end - at);
      }
      at = end;
    }
  }
  for (const auto& [rank, numel] : slices) {
    b_.HostWork("python op", 2 * py);  // narrow, dist.reduce
    b_.Collective(reduction_, "ZeRO::reduce", CollectiveType::kReduce, dp_, numel * es, ctx_.compute_dtype,
                  static_cast<int32_t>(rank));
  }
  FinishIpgReduction();
}

}  // namespace

traces::Program LowerZero12(const LoweringContext& ctx) { return Zero12Lowering(ctx).Lower(); }

}  // namespace shardscope::sim

// Lowering of DeepSpeed ZeRO stages 1, 2 and 3 (deepspeed/runtime/zero/).
//
// ZeRO-1/2 follow stage_1_and_2.py (DeepSpeedZeroOptimizer), ZeRO-3 follows stage3.py
// (DeepSpeedZeroOptimizer_Stage3), partitioned_param_coordinator.py
// (PartitionedParameterCoordinator) and partition_parameters.py (all_gather_coalesced).
// Knob names and defaults: runtime/zero/config.py (plan.h ZeroConfig).
//
// Data types: parameters and gradients in the model dtype (training.dtype, bf16);
// engine.py get_data_types gives grad_accum_dtype = model dtype under ZeRO, and the
// reductions run in communication_data_type, the model dtype by default. The optimizer keeps
// the fp32 master partition and the two fp32 Adam moments (12 bytes per partitioned element).
//
// Expert parallelism is not lowered for ZeRO (DeepSpeed partitions expert parameters over
// the expert-data-parallel group, a separate optimizer group): LowerZero reports it.
#include <algorithm>
#include <deque>
#include <map>
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

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

// ---------------------------------------------------------------------------------------
// Shared by every stage.

// The leaf modules that hold parameters: one per distinct parameter-name prefix
// (attention_norm, attention.wq, ..., feed_forward.w2), in the module's parameter order.
// A module's kernels are divided in order among them (estimate: the decomposition does not
// say which kernel belongs to which leaf).
struct LeafModule {
  std::string name;              // "layers.0.attention.wq"
  std::vector<size_t> params;    // indices into module.params
  int64_t numel = 0;
};

std::vector<LeafModule> LeafModulesOf(const ModuleKernels& module) {
  std::vector<LeafModule> leaves;
  std::map<std::string, size_t> by_prefix;
  for (size_t i = 0; i < module.params.size(); ++i) {
    const std::string& name = module.params[i].name;
    const size_t dot = name.rfind('.');
    const std::string prefix = dot == std::string::npos ? name : name.substr(0, dot);
    auto it = by_prefix.find(prefix);
    if (it == by_prefix.end()) {
      it = by_prefix.emplace(prefix, leaves.size()).first;
      leaves.push_back({module.name + "." + prefix, {}, 0});
    }
    leaves[it->second].params.push_back(i);
    leaves[it->second].numel += module.params[i].numel;
  }
  return leaves;
}

// The backward kernels [begin, end) of the leaf that is `first`-th of `count` in forward
// order: the backward runs in reverse, so the r-th leaf from the end takes the r-th share.
std::pair<size_t, size_t> BackwardShare(const ModuleKernels& module, size_t first, size_t count) {
  const size_t k = module.backward.size();
  const size_t r = count - 1 - first;
  return {r * k / count, (r + 1) * k / count};
}

// get_grad_norm_direct over the rank's gradient tensors (no CPU offload):
// - stage3.py: grad_norms.append(g.to(device).double().norm(2)) per gradient partition,
//   torch.sum(torch.pow(torch.stack(grad_norms), 2)) — an fp64 scalar — all_reduce(SUM)
//   over the data-parallel group, then ** (1/2) and the isinf/isnan/where masking;
// - stage_1_and_2.py (current main): torch.linalg.vector_norm(g.data.double()) per tensor of
//   averaged_gradients, torch.stack(all_norms).square().sum().float() — an fp32 scalar —
//   all_reduce(SUM), pow(1/2), mask_nan_or_inf_with_val_inplace. No .item(): no host sync.
// Each .double() is a new fp64 copy of the bit16 tensor, dropped after its norm. Then the
// caller's torch.linalg.vector_norm(torch.stack(norm_groups)) (one group).
void EmitGradNormDirect(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex stream,
                        traces::CommSlot comm, const std::vector<int64_t>& tensor_numels, bool fp64_scalar) {
  constexpr int64_t kFp64Bytes = 8;
  const int64_t es = DTypeSize(ctx.compute_dtype);
  const int64_t python_ns = ctx.plan.host.python_op_overhead_ns;
  for (int64_t numel : tensor_numels) {
    b.HostWork("python op", python_ns);
    b.Allocate("grad_norm.double", numel * kFp64Bytes, stream);
    b.MemoryKernel(stream, "ZeRO::get_grad_norm_direct.double", numel * es, numel * kFp64Bytes);
    b.HostWork("python op", python_ns);
    b.MemoryKernel(stream, "ZeRO::get_grad_norm_direct.norm", numel * kFp64Bytes, kFp64Bytes);
    b.Free("grad_norm.double");
  }
  const int64_t n = static_cast<int64_t>(tensor_numels.size());
  b.HostWork("python op", python_ns);
  b.MemoryKernel(stream, "ZeRO::get_grad_norm_direct.stack_square_sum", n * kFp64Bytes,
                 fp64_scalar ? kFp64Bytes : kFp32Bytes);
  b.Collective(stream, "ZeRO::get_grad_norm_direct.all_reduce", CollectiveType::kAllReduce, comm,
               fp64_scalar ? kFp64Bytes : kFp32Bytes, fp64_scalar ? DType::kFloat64 : DType::kFloat32);
  b.HostWork("python op", python_ns);
  b.MemoryKernel(stream, "ZeRO::get_grad_norm_direct.pow_and_mask", kFp64Bytes, kFp64Bytes);
  b.HostWork("python op", python_ns);
  b.MemoryKernel(stream, "ZeRO::global_norm.vector_norm", kFp64Bytes, kFp32Bytes);
}

// The fp32 gradient of the partition, in two steps (stage_1_and_2.py step:
// self.flatten(self.averaged_gradients[i]).to(fp32); stage3.py
// _prepare_fp32_grad_for_sub_group: the same expression): a bit16 flat copy (its own
// allocation), then the cast into a new fp32 tensor; the bit16 temporary dies with the
// expression. Then unscale_and_clip_grads: grad.mul_(1 / combined_scale), issued whether or
// not clipping is on (combined_scale is the loss scale without it).
void EmitFlattenToFp32AndUnscale(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex stream,
                                 int64_t partition_numel) {
  const int64_t es = DTypeSize(ctx.compute_dtype);
  const int64_t python_ns = ctx.plan.host.python_op_overhead_ns;
  b.HostWork("python op", python_ns);
  b.Allocate("grad_shard.flat_bit16", partition_numel * es, stream);
  b.MemoryKernel(stream, "ZeRO::flatten_grad_partition", partition_numel * es, partition_numel * es);
  b.HostWork("python op", python_ns);
  b.Allocate("grad_shard.fp32_partition", partition_numel * kFp32Bytes, stream);
  b.MemoryKernel(stream, "ZeRO::grad_partition.to_fp32", partition_numel * es, partition_numel * kFp32Bytes);
  b.Free("grad_shard.flat_bit16");
  b.HostWork("python op", python_ns);
  b.MemoryKernel(stream, "ZeRO::unscale_and_clip_grads.mul_", partition_numel * kFp32Bytes,
                 partition_numel * kFp32Bytes);
}

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
  b_.Allocate("param_shard.fp32_partition", partition_numel * kFp32Bytes, compute_);
  b_.Allocate("exp_avg.fp32_partition", partition_numel * kFp32Bytes, compute_);
  b_.Allocate("exp_avg_sq.fp32_partition", partition_numel * kFp32Bytes, compute_);

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
        // epilogue dropped them).
        const bool accumulate = !stage2_ && mb > 0;
        b_.Allocate(accumulate ? "grad_tmp." + leaf.name : "grad." + leaf.name, grad_bytes, compute_);
        const auto [begin, end] = BackwardShare(module, l, leaves.size());
        EmitBackwardRange(ctx_, b_, compute_, module, begin, end);
        if (accumulate) {
          b_.MemoryKernel(compute_, "AccumulateGrad", 2 * grad_bytes, grad_bytes);
          b_.Free("grad_tmp." + leaf.name);
        }
        for (auto it = leaf.params.rbegin(); it != leaf.params.rend(); ++it) {
          b_.HostWork("ZeRO::grad_handling_hook", plan.host.hook_overhead_ns);
          // process_gradients -> setup_buckets: the first hook of a backward (not
          // ready_for_gradients) allocates the IPG buffer(s).
          SetupBuckets();
          if (reduce_in_hooks) AddGradToIpgBucket(param_base + *it);
        }
        // With contiguous_gradients the gradient now lives in the IPG buffer (grad.data =
        // the buffer's slice): the autograd tensor is dropped.
        if (reduce_in_hooks) b_.Free("grad." + leaf.name);
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
          for (size_t i : leaf.params) AddGradToIpgBucket(base + i);
          b_.Free("grad." + leaf.name);
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

// ---------------------------------------------------------------------------------------
// ZeRO-3.
//
// Submodules: DeepSpeed registers its hooks on every nn.Module (parameter_offload.py
// DeepSpeedZeRoOffload._register_hooks_recursively) and fetches a module's own parameters
// (iter_params with recurse=False). The decomposition gives parameter tensors, not modules:
// one submodule per distinct parameter-name prefix (attention_norm, attention.wq, ...,
// feed_forward.w2) stands for the leaf modules that hold parameters. Container modules (the
// block, attention, feed_forward) hold none, so their hooks fetch nothing; their hook time
// is not charged (estimate). A module's kernels are divided in order among its submodules
// (estimate: the decomposition does not say which kernel belongs to which leaf).

struct Zero3Submodule {
  std::string name;             // "layers.0.attention.wq"
  size_t module = 0;            // index into ctx.modules
  size_t first = 0, count = 0;  // its share of the module's submodules (for kernel slices)
  int64_t numel = 0;            // all its parameters (ds_numel)
  int64_t fetch_numel = 0;      // its non-persistent parameters
  int64_t fetch_partition = 0;  // sum of ceil(numel / world) over its non-persistent parameters
  int64_t fetch_params = 0;     // how many non-persistent parameters
  int64_t persistent_numel = 0;
  int64_t persistent_padded = 0;
  std::vector<int64_t> param_numels;
  std::vector<int64_t> fetch_param_numels;  // its non-persistent parameters, one by one
  std::vector<std::pair<std::string, int64_t>> persistent;  // name, numel
};

enum class ParamStatus : uint8_t { kNotAvailable, kInflight, kAvailable };

class Zero3Lowering {
 public:
  explicit Zero3Lowering(const LoweringContext& ctx) : ctx_(ctx), b_("zero3") {}
  traces::Program Lower();

 private:
  int64_t ElementBytes() const { return DTypeSize(ctx_.compute_dtype); }
  void BuildSubmodules();
  void BuildTrace();
  void ResetStep();
  void AllGatherParams(const std::vector<size_t>& subs);
  void LegacyAllGatherParam(size_t sub, size_t param);
  void LegacySynchronizeCommunication();
  void LegacyDebugNorms(size_t sub);
  std::string LegacyBuffer(size_t sub, size_t param) const {
    return fmt::format("unsharded.{}.p{}", subs_[sub].name, param);
  }
  void FetchSubModule(size_t sub);
  void ReleaseSubModule(size_t sub);
  void LegacyReleaseParams(size_t sub);
  void ReleaseAll();
  void ForwardSlice(size_t sub, bool recompute = false);
  void BackwardSlice(size_t sub);
  void ReduceIndependent(size_t sub, int32_t micro_batch);
  void ReduceAndPartitionIpgGrads(int32_t micro_batch);
  void LegacyReduceIndependent(size_t sub, int32_t micro_batch);
  void LegacyReduceIpgGrads(int32_t micro_batch);
  void LegacyPartitionPreviousGrads(int32_t micro_batch);
  void LegacyReduceEpilogue(int32_t micro_batch);
  void LegacyStepHostChecks(const std::vector<int64_t>& grad_partitions);
  void LegacyPlaceholder();

  const LoweringContext& ctx_;
  ProgramBuilder b_;
  traces::StreamIndex compute_ = 0, all_gather_ = 0, reduce_ = 0;
  traces::CommSlot dp_ = 0;
  std::vector<Zero3Submodule> subs_;
  std::vector<std::vector<size_t>> subs_of_module_;
  std::vector<size_t> trace_;  // submodule fetched at each step (forward, then backward)

  // PartitionedParameterCoordinator state.
  std::vector<ParamStatus> status_;
  std::vector<int64_t> handle_of_;          // the all-gather handle of an inflight submodule
  std::vector<bool> in_registry_;           // __inflight_param_registry holds it
  std::vector<int64_t> most_recent_step_;   // __most_recent_step_id_param_fetched_for
  std::deque<size_t> param_queue_;          // trace steps not yet popped (__param_queue)
  struct Handle {
    std::vector<size_t> subs;
    int64_t flat_bytes = 0;
    bool single = false;        // the len(params) == 1 branch: no flat buffer
    bool complete = false;
    size_t in_registry = 0;     // its submodules still in __inflight_param_registry
  };
  void PopFromRegistry(size_t sub);
  std::vector<Handle> handles_;
  int64_t n_available_ = 0;
  size_t step_id_ = 0;
  std::deque<int64_t> ongoing_fetch_events_;
  int64_t fetch_events_ = 0;
  int64_t stream_waits_ = 0;
  std::vector<size_t> legacy_inflight_;     // 2021 path: submodules gathered, not yet waited for

  // Gradient reduction state (stage3.py).
  int64_t elements_in_ipg_bucket_ = 0;
  int64_t padded_in_ipg_bucket_ = 0;
  int64_t params_in_ipg_bucket_ = 0;
  std::vector<std::string> grads_to_free_at_reduce_;
  std::deque<int64_t> param_reduce_events_;
  int64_t reduce_events_ = 0;
  int64_t grad_ready_events_ = 0;
  // 2021 path: the parameters (numels) of the IPG bucket being filled, and of the bucket
  // reduced last, whose partitioning lags one bucket behind.
  std::vector<int64_t> legacy_bucket_, legacy_previous_bucket_;
};

void Zero3Lowering::BuildSubmodules() {
  const int64_t world = ctx_.world_size;
  const int64_t threshold = ctx_.plan.zero.stage3_param_persistence_threshold;
  subs_of_module_.resize(ctx_.modules.size());
  for (size_t m = 0; m < ctx_.modules.size(); ++m) {
    const ModuleKernels& module = ctx_.modules[m];
    std::map<std::string, size_t> by_prefix;
    for (const ParamTensor& p : module.params) {
      const size_t dot = p.name.rfind('.');
      const std::string prefix = dot == std::string::npos ? p.name : p.name.substr(0, dot);
      auto it = by_prefix.find(prefix);
      if (it == by_prefix.end()) {
        it = by_prefix.emplace(prefix, subs_.size()).first;
        Zero3Submodule sub;
        sub.name = module.name + "." + prefix;
        sub.module = m;
        subs_.push_back(sub);
        subs_of_module_[m].push_back(it->second);
      }
      Zero3Submodule& sub = subs_[it->second];
      sub.numel += p.numel;
      sub.param_numels.push_back(p.numel);
      // partition_parameters.py _convert_to_deepspeed_param: ds_persist when
      // ds_numel <= param_persistence_threshold (stage3_param_persistence_threshold; the
      // model_persistence_threshold budget is unlimited by default): kept whole on every
      // rank between steps and never released by the coordinator (__params_to_release).
      if (p.numel <= threshold) {
        sub.persistent_numel += p.numel;
        sub.persistent_padded += RoundUp(p.numel, world);
        sub.persistent.emplace_back(module.name + "." + p.name, p.numel);
      } else {
        ++sub.fetch_params;
        sub.fetch_numel += p.numel;
        sub.fetch_param_numels.push_back(p.numel);
        // partition_parameters.py _partition_param: each rank holds ceil(numel / world).
        sub.fetch_partition += CeilDiv(p.numel, world);
      }
    }
    for (size_t i = 0; i < subs_of_module_[m].size(); ++i) {
      subs_[subs_of_module_[m][i]].first = i;
      subs_[subs_of_module_[m][i]].count = subs_of_module_[m].size();
    }
  }
}

// The trace (PartitionedParameterCoordinator.record_module, complete after the first step):
// the submodules in fetch order — forward order, then in backward the reverse order; a
// checkpointed block's recompute fetches its submodules in forward order again first.
void Zero3Lowering::BuildTrace() {
  for (size_t m = 0; m < ctx_.modules.size(); ++m) {
    for (size_t s : subs_of_module_[m]) trace_.push_back(s);
  }
  for (size_t step = 0; step < ctx_.modules.size(); ++step) {
    const size_t m = ctx_.modules.size() - 1 - step;
    if (Checkpointed(ctx_, ctx_.modules[m])) {
      for (size_t s : subs_of_module_[m]) trace_.push_back(s);
    }
    for (auto it = subs_of_module_[m].rbegin(); it != subs_of_module_[m].rend(); ++it) trace_.push_back(*it);
  }
}

// PartitionedParameterCoordinator.reset_step: the step counter and the prefetch queue
// (every parameter of the trace in order) start again each forward+backward.
void Zero3Lowering::ResetStep() {
  step_id_ = 0;
  param_queue_.clear();
  for (size_t t = 0; t < trace_.size(); ++t) param_queue_.push_back(t);
  std::fill(most_recent_step_.begin(), most_recent_step_.end(), -1);
}

// __all_gather_params -> partition_parameters.py all_gather_coalesced, on the all-gather
// stream. __n_available_params counts ds_numel.
// - len(params) == 1 ("an opportunity to avoid some intermediate memory allocations"): one
//   buffer of ceil(ds_numel / world) x world elements, all_gather_into_tensor straight from
//   ds_tensor into it, the parameter a view of it (AllGatherHandle: wait() only waits).
// - several parameters (_all_gather_dtype): one flat buffer of partition_sz x world, the
//   local partitions copied in (torch.cat(..., out=partitions[rank])), one
//   all_gather_into_tensor; AllGatherCoalescedHandle keeps the per-rank views (partitions)
//   of the flat buffer, and its wait() copies each parameter out (torch.cat).
void Zero3Lowering::AllGatherParams(const std::vector<size_t>& candidates) {
  if (ctx_.plan.zero.legacy_per_parameter_path) {
    for (size_t s : candidates) {
      if (status_[s] != ParamStatus::kNotAvailable || subs_[s].fetch_numel == 0) continue;
      for (size_t p = 0; p < subs_[s].fetch_param_numels.size(); ++p) LegacyAllGatherParam(s, p);
      status_[s] = ParamStatus::kInflight;
      legacy_inflight_.push_back(s);
      n_available_ += subs_[s].fetch_numel;
    }
    return;
  }
  std::vector<size_t> subs;
  int64_t partition = 0, params = 0;
  for (size_t s : candidates) {
    if (status_[s] != ParamStatus::kNotAvailable || subs_[s].fetch_numel == 0) continue;
    subs.push_back(s);
    partition += subs_[s].fetch_partition;
    params += subs_[s].fetch_params;
  }
  if (subs.empty()) return;
  const int64_t es = ElementBytes();
  const int64_t id = static_cast<int64_t>(handles_.size());
  Handle handle{subs, partition * ctx_.world_size * es, params == 1, false, subs.size()};
  if (handle.single) {
    const std::string unsharded = "unsharded." + subs_[subs.front()].name;
    b_.Allocate(unsharded, handle.flat_bytes, all_gather_);
    b_.Collective(all_gather_, "ZeRO::all_gather_coalesced", CollectiveType::kAllGather, dp_, handle.flat_bytes,
                  ctx_.compute_dtype);
  } else {
    const std::string flat = fmt::format("all_gather_output.h{}", id);
    b_.Allocate(flat, handle.flat_bytes, all_gather_);
    b_.MemoryKernel(all_gather_, "ZeRO::all_gather_coalesced.copy_in", partition * es, partition * es);
    b_.Collective(all_gather_, "ZeRO::all_gather_coalesced", CollectiveType::kAllGather, dp_, handle.flat_bytes,
                  ctx_.compute_dtype);
  }
  for (size_t s : subs) {
    status_[s] = ParamStatus::kInflight;
    handle_of_[s] = id;
    in_registry_[s] = true;
    n_available_ += subs_[s].fetch_numel;
  }
  handles_.push_back(std::move(handle));
}

// __inflight_param_registry.pop(param): the handle (and, for a coalesced one, its
// partitions — views of the flat buffer) lives while any of its parameters is still in the
// registry; the flat buffer is freed when the last one leaves.
void Zero3Lowering::PopFromRegistry(size_t s) {
  if (!in_registry_[s]) return;
  in_registry_[s] = false;
  Handle& handle = handles_[static_cast<size_t>(handle_of_[s])];
  if (--handle.in_registry == 0 && !handle.single) b_.Free(fmt::format("all_gather_output.h{}", handle_of_[s]));
}

// The 2021 ZeRO-3 (DeepSpeed before the coordinator rewrite of PR #1453; partition_parameters.py
// _all_gather / _allgather_param at microsoft/DeepSpeed c4ec23fc) gathers one parameter at a
// time on the all-gather stream: flat_tensor = torch.zeros(aligned size); torch.cuda.synchronize();
// world_size partitions as flat_tensor.narrow(...); the local shard copied into its partition;
// torch.distributed.all_gather(partitions, ...), which in ProcessGroupNCCL flattens the output
// list into a new buffer, runs ncclAllGather into it and copies each of the world_size chunks
// back into its partition (one copy kernel per rank, from C++). Host time per parameter,
// measured with DeepSpeed 0.3.16 and PyTorch 1.8.0 on 8 x A100 (DeepSpeed issue #1069, zarzen,
// 2021-06-21: "The pre_launch typically takes 130us, the launch takes 250us about, and there
// is a torch.cuda.synchronize() sync point"): what the other host costs of this model already
// charge at that world size is taken out, the rest is the calls' own Python bookkeeping; the
// world-size-dependent parts (narrow views, copy-outs) scale with the group.
constexpr int64_t kLegacyPreLaunchNs = 130'000;
constexpr int64_t kLegacyLaunchNs = 250'000;
constexpr int64_t kLegacyMeasuredWorld = 8;

void Zero3Lowering::LegacyAllGatherParam(size_t s, size_t p) {
  const HostConfig& host = ctx_.plan.host;
  const int64_t es = ElementBytes();
  const int64_t world = ctx_.world_size;
  const int64_t part = CeilDiv(subs_[s].fetch_param_numels[p], world);
  const int64_t aligned = part * world;
  const int64_t py = host.python_op_overhead_ns, cpp = host.cpp_op_overhead_ns, launch = host.launch_overhead_ns;
  // At the measured world size: zeros and copy_ (Python op + launch each), the narrow views.
  const int64_t pre_modelled = 2 * (py + launch) + kLegacyMeasuredWorld * py;
  // The all_gather call (a Python op + the NCCL launch) and the copy-outs (C++ op + launch).
  const int64_t launch_modelled = (py + launch) + kLegacyMeasuredWorld * (cpp + launch);
  const std::string buffer = LegacyBuffer(s, p);
  b_.HostWork("ZeRO::legacy.allgather_param.pre_launch", std::max<int64_t>(0, kLegacyPreLaunchNs - pre_modelled));
  b_.HostWork("python op", py);
  b_.Allocate(buffer, aligned * es, all_gather_);
  b_.MemoryKernel(all_gather_, "ZeRO::legacy.allgather_param.zeros", 0, aligned * es);
  b_.DeviceSync("ZeRO::legacy.allgather_param.synchronize");
  b_.HostWork("ZeRO::legacy.allgather_param.narrow", world * py);
  b_.HostWork("python op", py);
  b_.MemoryKernel(all_gather_, "ZeRO::legacy.allgather_param.copy_partition", part * es, part * es);
  b_.HostWork("ZeRO::legacy.allgather_param.launch", std::max<int64_t>(0, kLegacyLaunchNs - launch_modelled));
  b_.HostWork("python op", py);
  const std::string flat = buffer + ".flat";
  b_.Allocate(flat, aligned * es, all_gather_);
  b_.Collective(all_gather_, "ZeRO::all_gather", CollectiveType::kAllGather, dp_, aligned * es, ctx_.compute_dtype);
  for (int64_t r = 0; r < world; ++r) {
    b_.HostWork("aten op", cpp);
    b_.MemoryKernel(all_gather_, "ZeRO::legacy.allgather_param.copy_out", part * es, part * es);
  }
  b_.Free(flat);
}

// 2021 stage3.py _synchronize_communication: handle.wait() for every in-flight gather (the
// current stream waits on the all-gather stream), then, with the blocking switches,
// comm_stream.synchronize() and torch.cuda.synchronize().
void Zero3Lowering::LegacySynchronizeCommunication() {
  const ZeroConfig& zero = ctx_.plan.zero;
  for (size_t h : legacy_inflight_) {
    for (size_t p = 0; p < subs_[h].fetch_param_numels.size(); ++p) b_.HostWork("aten op", ctx_.plan.host.cpp_op_overhead_ns);
    status_[h] = ParamStatus::kAvailable;
  }
  legacy_inflight_.clear();
  const std::string waited = fmt::format("all_gather_stream.{}", stream_waits_++);
  b_.Record(b_.Event(waited), all_gather_);
  b_.Wait(compute_, b_.Event(waited));
  if (zero.legacy_stream_sync_in_fetch_release) {
    b_.StreamSync("ZeRO::legacy.all_gather_stream.synchronize", all_gather_);
    b_.DeviceSync("ZeRO::legacy.fetch.synchronize");
  }
}

// 2021 fetch_sub_module: for each parameter of the submodule, print_rank_0(f"... norm=
// {param.norm()}", force=False): the f-string is built (a norm kernel, and .item() to format
// it: a device-to-host copy and a stream synchronize) even though nothing prints. PR #1188
// ("Removing the norm computation in debug printing") removed it.
void Zero3Lowering::LegacyDebugNorms(size_t s) {
  const int64_t es = ElementBytes();
  for (int64_t numel : subs_[s].param_numels) {
    b_.HostWork("python op", ctx_.plan.host.python_op_overhead_ns);
    b_.MemoryKernel(compute_, "ZeRO::legacy.debug_norm", numel * es, kFp32Bytes);
    b_.HostWork("python op", ctx_.plan.host.python_op_overhead_ns);
    b_.Memcpy(compute_, "ZeRO::legacy.debug_norm.item", traces::MemcpyKind::kDeviceToHost, kFp32Bytes);
    b_.StreamSync("ZeRO::legacy.debug_norm.item.synchronize", compute_);
  }
}

// PartitionedParameterCoordinator.fetch_sub_module.
void Zero3Lowering::FetchSubModule(size_t s) {
  const ZeroConfig& zero = ctx_.plan.zero;
  const int64_t es = ElementBytes();
  const size_t step = step_id_;
  // 1. kick off the all-gather of the submodule's own parameters.
  if (status_[s] == ParamStatus::kNotAvailable) AllGatherParams({s});
  if (zero.legacy_per_parameter_path) {
    // 2021: wait for every gather in flight (its own and earlier prefetches).
    if (!legacy_inflight_.empty()) LegacySynchronizeCommunication();
    if (zero.legacy_debug_norm_sync) LegacyDebugNorms(s);
  }
  // 2. wait for them. With more than __max_ongoing_fetch_events (2) recorded fetch events,
  // the host synchronizes the oldest (completed ones are dropped first with query(); an
  // event synchronize on a completed event returns at once, so always synchronizing the
  // oldest is the same). handle.wait(): the flat buffer is copied out into each parameter
  // (torch.cat per parameter, record_stream on the consumer) and freed; an event is recorded
  // on the all-gather stream.
  if (in_registry_[s]) {
    if (ongoing_fetch_events_.size() > 2) {
      b_.EventSync("ZeRO::fetch_event.synchronize",
                   b_.Event(fmt::format("fetch_event.{}", ongoing_fetch_events_.front())));
      ongoing_fetch_events_.pop_front();
    }
    Handle& handle = handles_[static_cast<size_t>(handle_of_[s])];
    if (!handle.complete) {
      for (size_t h : handle.subs) {
        const std::string unsharded = "unsharded." + subs_[h].name;
        if (!handle.single) {
          b_.Allocate(unsharded, subs_[h].fetch_numel * es, all_gather_);
          b_.MemoryKernel(all_gather_, "ZeRO::all_gather_coalesced.wait.cat", subs_[h].fetch_numel * es,
                          subs_[h].fetch_numel * es);
        }
        // free_param at release: param.data.record_stream(current_stream()).
        b_.RecordStream(unsharded, compute_);
        status_[h] = ParamStatus::kAvailable;
      }
      handle.complete = true;
    }
    PopFromRegistry(s);
    const int64_t event = fetch_events_++;
    b_.Record(b_.Event(fmt::format("fetch_event.{}", event)), all_gather_);
    ongoing_fetch_events_.push_back(event);
    if (zero.legacy_stream_sync_in_fetch_release) {
      // 2021 behaviour (stage3.py _synchronize_communication at microsoft/DeepSpeed 70adb32a:
      // comm_stream.synchronize(); torch.cuda.synchronize()), here on the current coordinator.
      b_.StreamSync("ZeRO::legacy.all_gather_stream.synchronize", all_gather_);
      b_.DeviceSync("ZeRO::legacy.fetch.synchronize");
    }
  }
  // current_stream().wait_stream(allgather_stream).
  const std::string waited = fmt::format("all_gather_stream.{}", stream_waits_++);
  b_.Record(b_.Event(waited), all_gather_);
  b_.Wait(compute_, b_.Event(waited));
  if (zero.legacy_debug_norm_sync && !zero.legacy_per_parameter_path) LegacyDebugNorms(s);
  // 3. prefetch from the trace: first pop the current submodule's own entry (when it was not
  // already fetched for this step), then pop entries while the numel to prefetch stays below
  // min(max_live_parameters - available, prefetch_bucket_size); a NOT_AVAILABLE submodule
  // is prefetched, an available one only has its most recent use advanced (so its release
  // keeps it). All prefetched parameters go in one all_gather_coalesced.
  if (most_recent_step_[s] < static_cast<int64_t>(step)) {
    while (!param_queue_.empty() && param_queue_.front() <= step) {
      const size_t t = param_queue_.front();
      param_queue_.pop_front();
      most_recent_step_[trace_[t]] = std::max(most_recent_step_[trace_[t]], static_cast<int64_t>(t));
      if (t == step) break;
    }
  }
  // 2021 behaviour (DeepSpeed issue #1069, jfc4050 2021-05-27: "a pre sub module hook is
  // executing before the pre module hook ... this causes the rest of the step ids in the
  // forward pass to be off by 1, which was causing the prefetches to be skipped"; fixed by PR
  // #1170): get_params_to_prefetch compares the submodule with the trace at the step id,
  // misses ("Tracing failed. Prefetching is disabled") and returns nothing.
  if (zero.stage3_prefetch_bucket_size > 0 && !zero.legacy_prefetch_off_by_one) {
    const int64_t max_to_prefetch =
        std::min(zero.stage3_max_live_parameters - n_available_, zero.stage3_prefetch_bucket_size);
    std::vector<size_t> to_prefetch;
    int64_t numel_prefetching = 0;
    while (!param_queue_.empty() && numel_prefetching < max_to_prefetch) {
      const size_t t = param_queue_.front();
      param_queue_.pop_front();
      const size_t p = trace_[t];
      const bool do_prefetch = status_[p] == ParamStatus::kNotAvailable && subs_[p].fetch_numel > 0 &&
                               std::find(to_prefetch.begin(), to_prefetch.end(), p) == to_prefetch.end();
      most_recent_step_[p] = std::max(most_recent_step_[p], static_cast<int64_t>(t));
      if (do_prefetch) {
        to_prefetch.push_back(p);
        numel_prefetching += subs_[p].fetch_numel;
      }
    }
    AllGatherParams(to_prefetch);
  }
  ++step_id_;
}

// PartitionedParameterCoordinator.release_sub_module -> __params_to_release: not persistent,
// not already fetched for a later step by a prefetch that skipped it, and not used again
// within stage3_max_reuse_distance elements of the trace from the current step
// (params_traversed counts ds_numel of every submodule passed).
void Zero3Lowering::ReleaseSubModule(size_t s) {
  const ZeroConfig& zero = ctx_.plan.zero;
  if (zero.legacy_stream_sync_in_fetch_release && !zero.legacy_per_parameter_path) {
    // 2021 behaviour: the post-submodule deallocation blocked the host on
    // cudaStreamSynchronize until the submodule's kernels had finished with the parameters
    // (DeepSpeed issue #1069, 2021-05-20: moving that deallocation onto its own stream,
    // non-blocking, removed "the big cudaStreamSynchronize" and took the forward from 839 to
    // 622 ms). The host cannot run ahead of the GPU: every next fetch is issued only after
    // the current submodule's compute has drained.
    b_.StreamSync("ZeRO::legacy.release.synchronize", compute_);
  }
  if (status_[s] != ParamStatus::kAvailable || subs_[s].fetch_numel == 0) return;
  // With the off-by-one trace, get_reuse_distance_in_numel misses too ("Tracing failed.
  // Cannot tell if the sub_module ... is reused") and answers a distance beyond any limit.
  if (!zero.legacy_prefetch_off_by_one) {
    if (most_recent_step_[s] > static_cast<int64_t>(step_id_)) return;
    int64_t traversed = 0;
    for (size_t t = step_id_; t < trace_.size(); ++t) {
      if (traversed >= zero.stage3_max_reuse_distance) break;
      if (trace_[t] == s) return;
      traversed += subs_[trace_[t]].numel;
    }
  }
  // __release_param -> param.partition(): the gathered data is freed.
  if (zero.legacy_per_parameter_path) {
    LegacyReleaseParams(s);
  } else {
    b_.Free("unsharded." + subs_[s].name);
  }
  status_[s] = ParamStatus::kNotAvailable;
  n_available_ -= subs_[s].fetch_numel;
}

// 2021 partition_parameters.py _partition_param, per released parameter: the gathered
// tensor is dropped and param.data replaced by torch.ones(1).half().to(param.device) — a
// pageable host-to-device copy, which PyTorch's copy_ follows with cudaStreamSynchronize on
// the current stream. That is the per-parameter "big cudaStreamSynchronize" of DeepSpeed
// issue #1069: the host waits for the submodule's kernels before the next fetch is issued.
void Zero3Lowering::LegacyReleaseParams(size_t s) {
  for (size_t p = 0; p < subs_[s].fetch_param_numels.size(); ++p) {
    b_.Free(LegacyBuffer(s, p));
    if (ctx_.plan.zero.legacy_stream_sync_in_fetch_release) LegacyPlaceholder();
  }
}

void Zero3Lowering::LegacyPlaceholder() {
  b_.HostWork("python op", ctx_.plan.host.python_op_overhead_ns);
  b_.Memcpy(compute_, "ZeRO::legacy.partition.placeholder", traces::MemcpyKind::kHostToDevice, ElementBytes());
  b_.StreamSync("ZeRO::legacy.release.synchronize", compute_);
}

// The end of a forward+backward: whatever is still gathered goes back to its partition
// (release_and_reset_all waits for in-flight gathers first).
void Zero3Lowering::ReleaseAll() {
  if (ctx_.plan.zero.legacy_per_parameter_path) {
    // stage3.py backward -> _partition_all_parameters: every parameter still available,
    // persistent ones included, goes through param.partition() (its placeholder copy).
    if (!legacy_inflight_.empty()) LegacySynchronizeCommunication();
    for (size_t s = 0; s < subs_.size(); ++s) {
      if (status_[s] == ParamStatus::kAvailable && subs_[s].fetch_numel > 0) {
        LegacyReleaseParams(s);
        status_[s] = ParamStatus::kNotAvailable;
      }
      if (ctx_.plan.zero.legacy_stream_sync_in_fetch_release) {
        for (size_t p = 0; p < subs_[s].persistent.size(); ++p) LegacyPlaceholder();
      }
    }
    n_available_ = 0;
    return;
  }
  for (size_t s = 0; s < subs_.size(); ++s) {
    if (status_[s] == ParamStatus::kInflight) {
      Handle& handle = handles_[static_cast<size_t>(handle_of_[s])];
      if (!handle.complete) {
        // Estimate: gathered and dropped without the wait's copies (nothing is in flight at
        // the end of a backward with a complete trace).
        for (size_t h : handle.subs) status_[h] = ParamStatus::kNotAvailable;
        if (handle.single) b_.Free("unsharded." + subs_[handle.subs.front()].name);
        handle.complete = true;
      }
    }
    PopFromRegistry(s);
    if (status_[s] == ParamStatus::kAvailable && subs_[s].fetch_numel > 0) {
      b_.Free("unsharded." + subs_[s].name);
    }
    if (subs_[s].fetch_numel > 0) status_[s] = ParamStatus::kNotAvailable;
  }
  n_available_ = 0;
}

// The submodule's share of its module's forward kernels (or of their recompute).
void Zero3Lowering::ForwardSlice(size_t s, bool recompute) {
  const Zero3Submodule& sub = subs_[s];
  const ModuleKernels& module = ctx_.modules[sub.module];
  const size_t k = module.forward.size();
  const size_t begin = sub.first * k / sub.count, end = (sub.first + 1) * k / sub.count;
  if (recompute) {
    EmitRecompute(ctx_, b_, compute_, module, begin, end);
  } else {
    EmitForwardRange(ctx_, b_, compute_, module, begin, end);
  }
}

// The backward kernels run in reverse forward order; the submodule that is r-th from the end
// takes the r-th share.
void Zero3Lowering::BackwardSlice(size_t s) {
  const Zero3Submodule& sub = subs_[s];
  const ModuleKernels& module = ctx_.modules[sub.module];
  const size_t k = module.backward.size();
  const size_t r = sub.count - 1 - sub.first;
  EmitBackwardRange(ctx_, b_, compute_, module, r * k / sub.count, (r + 1) * k / sub.count);
}

// stage3.py reduce_independent_p_g_buckets_and_remove_grads (per parameter, from the
// gradient hook): a non-empty bucket that would overflow is reduced first; then
// __add_grad_to_ipg_bucket: the reduce stream waits on the default stream and, with
// contiguous_gradients, copies the gradient into the flat IPG buffer (record_stream, the
// autograd gradient dropped).
void Zero3Lowering::ReduceIndependent(size_t s, int32_t micro_batch) {
  const ZeroConfig& zero = ctx_.plan.zero;
  if (zero.legacy_per_parameter_path) {
    LegacyReduceIndependent(s, micro_batch);
    return;
  }
  const int64_t es = ElementBytes();
  const std::string grad = "grad." + subs_[s].name;
  bool all_copied = true;
  for (auto it = subs_[s].param_numels.rbegin(); it != subs_[s].param_numels.rend(); ++it) {
    const int64_t numel = *it;
    b_.HostWork("ZeRO::reduce_partition_and_remove_grads", ctx_.plan.host.hook_overhead_ns);
    if (elements_in_ipg_bucket_ > 0 && elements_in_ipg_bucket_ + numel > zero.reduce_bucket_size) {
      ReduceAndPartitionIpgGrads(micro_batch);
    }
    if (reduce_ != compute_) {
      const std::string ready = fmt::format("grad_ready.{}", grad_ready_events_++);
      b_.Record(b_.Event(ready), compute_);
      b_.Wait(reduce_, b_.Event(ready));
    }
    if (zero.contiguous_gradients && elements_in_ipg_bucket_ + numel <= zero.reduce_bucket_size) {
      b_.MemoryKernel(reduce_, "ZeRO::copy_grad_to_ipg_bucket", numel * es, numel * es);
    } else {
      all_copied = false;
    }
    elements_in_ipg_bucket_ += numel;
    padded_in_ipg_bucket_ += RoundUp(numel, ctx_.world_size);
    ++params_in_ipg_bucket_;
  }
  if (all_copied) {
    b_.RecordStream(grad, reduce_);
    b_.Free(grad);
  } else {
    grads_to_free_at_reduce_.push_back(grad);
  }
}

// stage3.py __reduce_and_partition_ipg_grads: more than max_param_reduce_events (2) pending
// reduce events make the host synchronize the oldest; on the reduce stream,
// __avg_scatter_grads -> comm/coalesced_collectives.py reduce_scatter_coalesced
// (reduce_scatter=True): a single tensor whose numel divides by the world size is used as it
// is (a view: "an opportunity to avoid a memory allocation"), otherwise the per-rank chunks
// of every gradient, padded to ceil(numel / world), are interleaved into a new flat tensor
// (torch.cat); then always the pre-divide tensor_partition_flat_buffer.div_(world) and one
// reduce-scatter in place. The outputs are views of the flat buffer: partition_grads copies
// (first micro-step) or adds (later ones) the rank's slice into its gradient partition,
// the gradients are dropped, an event is recorded; only then is the flat buffer released.
void Zero3Lowering::ReduceAndPartitionIpgGrads(int32_t micro_batch) {
  if (elements_in_ipg_bucket_ == 0) return;
  const int64_t es = ElementBytes();
  if (param_reduce_events_.size() > 2) {
    b_.EventSync("ZeRO::param_reduce_event.synchronize",
                 b_.Event(fmt::format("param_reduce_event.{}", param_reduce_events_.front())));
    param_reduce_events_.pop_front();
  }
  const int64_t padded_bytes = padded_in_ipg_bucket_ * es;
  const int64_t own_bytes = padded_in_ipg_bucket_ / ctx_.world_size * es;
  const bool in_place = params_in_ipg_bucket_ == 1 && elements_in_ipg_bucket_ % ctx_.world_size == 0;
  if (!in_place) {
    b_.Allocate("reduce_scatter_input.ipg", padded_bytes, reduce_);
    b_.MemoryKernel(reduce_, "ZeRO::reduce_scatter_coalesced.cat", elements_in_ipg_bucket_ * es, padded_bytes);
  }
  b_.MemoryKernel(reduce_, "ZeRO::reduce_scatter_coalesced.div_", padded_bytes, padded_bytes);
  b_.Collective(reduce_, "ZeRO::reduce_scatter_coalesced", CollectiveType::kReduceScatter, dp_, padded_bytes,
                ctx_.compute_dtype);
  if (micro_batch == 0) {
    b_.MemoryKernel(reduce_, "ZeRO::partition_grads.copy", own_bytes, own_bytes);
  } else {
    b_.MemoryKernel(reduce_, "ZeRO::partition_grads.add", 2 * own_bytes, own_bytes);
  }
  for (const std::string& grad : grads_to_free_at_reduce_) {
    b_.RecordStream(grad, reduce_);
    b_.Free(grad);
  }
  grads_to_free_at_reduce_.clear();
  const int64_t event = reduce_events_++;
  b_.Record(b_.Event(fmt::format("param_reduce_event.{}", event)), reduce_);
  param_reduce_events_.push_back(event);
  if (!in_place) b_.Free("reduce_scatter_input.ipg");
  elements_in_ipg_bucket_ = 0;
  padded_in_ipg_bucket_ = 0;
  params_in_ipg_bucket_ = 0;
}

// 2021 stage3.py reduce_independent_p_g_buckets_and_remove_grads (microsoft/DeepSpeed
// 70adb32a), per parameter from its gradient hook: a bucket that would overflow is reduced
// first; the gradient is copied into the IPG buffer on the current (compute) stream —
// nothing orders the reduction stream after that copy, the device synchronizes of the
// per-parameter gathers do — and param.grad becomes a view of the buffer.
void Zero3Lowering::LegacyReduceIndependent(size_t s, int32_t micro_batch) {
  const ZeroConfig& zero = ctx_.plan.zero;
  const int64_t es = ElementBytes();
  const int64_t py = ctx_.plan.host.python_op_overhead_ns;
  bool all_copied = true;
  for (auto it = subs_[s].param_numels.rbegin(); it != subs_[s].param_numels.rend(); ++it) {
    const int64_t numel = *it;
    b_.HostWork("ZeRO::reduce_partition_and_remove_grads", ctx_.plan.host.hook_overhead_ns);
    if (elements_in_ipg_bucket_ > 0 && elements_in_ipg_bucket_ + numel > zero.reduce_bucket_size) {
      LegacyReduceIpgGrads(micro_batch);
    }
    if (numel <= zero.reduce_bucket_size) {
      b_.HostWork("python op", 2 * py);  // narrow, copy_
      b_.MemoryKernel(compute_, "ZeRO::copy_grad_to_ipg_bucket", numel * es, numel * es);
    } else {
      all_copied = false;  // extra_large_param_to_reduce: reduced from its own gradient
    }
    elements_in_ipg_bucket_ += numel;
    legacy_bucket_.push_back(numel);
  }
  const std::string grad = "grad." + subs_[s].name;
  if (all_copied) {
    b_.Free(grad);
  } else {
    grads_to_free_at_reduce_.push_back(grad);
  }
}

// 2021 reduce_ipg_grads: with overlap_comm the host waits for the reduction stream, the
// previous bucket is partitioned, then average_tensor on the reduction stream: div_ over the
// whole IPG buffer (all reduce_bucket_size elements, however full) and, per parameter,
// partition_parameters.py _reduce_scatter_gradient — world_size narrow views and one
// torch.distributed.reduce_scatter, which ProcessGroupNCCL runs by copying the world_size
// inputs into a new flat buffer (one copy kernel each, from C++) and one ncclReduceScatter.
void Zero3Lowering::LegacyReduceIpgGrads(int32_t micro_batch) {
  if (legacy_bucket_.empty()) return;
  const ZeroConfig& zero = ctx_.plan.zero;
  const int64_t es = ElementBytes();
  const int64_t world = ctx_.world_size;
  const HostConfig& host = ctx_.plan.host;
  if (zero.overlap_comm) b_.StreamSync("ZeRO::legacy.reduction_stream.synchronize", reduce_);
  LegacyPartitionPreviousGrads(micro_batch);
  b_.HostWork("python op", host.python_op_overhead_ns);
  b_.MemoryKernel(reduce_, "ZeRO::legacy.average_tensor.div_", zero.reduce_bucket_size * es,
                  zero.reduce_bucket_size * es);
  for (int64_t numel : legacy_bucket_) {
    const int64_t part = CeilDiv(numel, world);
    b_.HostWork("ZeRO::legacy.reduce_scatter_gradient.narrow", world * host.python_op_overhead_ns);
    b_.HostWork("python op", host.python_op_overhead_ns);
    b_.Allocate("reduce_scatter_input.flat", part * world * es, reduce_);
    for (int64_t r = 0; r < world; ++r) {
      b_.HostWork("aten op", host.cpp_op_overhead_ns);
      b_.MemoryKernel(reduce_, "ZeRO::legacy.reduce_scatter.copy_in", part * es, part * es);
    }
    b_.Collective(reduce_, "ZeRO::reduce_scatter", CollectiveType::kReduceScatter, dp_, part * world * es,
                  ctx_.compute_dtype);
    b_.Free("reduce_scatter_input.flat");
  }
  for (const std::string& grad : grads_to_free_at_reduce_) {
    b_.RecordStream(grad, reduce_);
    b_.Free(grad);
  }
  grads_to_free_at_reduce_.clear();
  legacy_previous_bucket_ = std::move(legacy_bucket_);
  legacy_bucket_.clear();
  elements_in_ipg_bucket_ = 0;
}

// 2021 partition_previous_reduced_grads, on copy_grad_stream after
// reduction_stream.synchronize() (the host waits again): each parameter's reduced slice is
// copied (first micro-step) or added into the bit16 grads_in_partition.
void Zero3Lowering::LegacyPartitionPreviousGrads(int32_t micro_batch) {
  if (legacy_previous_bucket_.empty()) return;
  const int64_t es = ElementBytes();
  b_.StreamSync("ZeRO::legacy.reduction_stream.synchronize", reduce_);
  for (int64_t numel : legacy_previous_bucket_) {
    const int64_t own = CeilDiv(numel, ctx_.world_size) * es;
    b_.HostWork("python op", ctx_.plan.host.python_op_overhead_ns);
    if (micro_batch == 0) {
      b_.MemoryKernel(reduce_, "ZeRO::partition_grads.copy", own, own);
    } else {
      b_.MemoryKernel(reduce_, "ZeRO::partition_grads.add", 2 * own, own);
    }
  }
  legacy_previous_bucket_.clear();
}

// 2021 independent_gradient_partition_epilogue: the last bucket, the reduction stream
// synchronized, its partitioning; then the IPG buffers are dropped.
void Zero3Lowering::LegacyReduceEpilogue(int32_t micro_batch) {
  LegacyReduceIpgGrads(micro_batch);
  if (ctx_.plan.zero.overlap_comm) b_.StreamSync("ZeRO::legacy.reduction_stream.synchronize", reduce_);
  LegacyPartitionPreviousGrads(micro_batch);
  b_.Free("bucket.ipg");
  if (ctx_.plan.zero.overlap_comm) b_.Free("bucket.ipg.1");
}

// 2021 step, before the update: has_overflow_partitioned_grads_serial —
// float(grad.float().sum()) per parameter (an fp32 copy, a sum, a device-to-host copy the host
// waits for), the flag sent to the GPU and all-reduced (MAX) and read back; then
// get_grad_norm_direct — per parameter g.double().norm(2).item(), the total sent to the GPU,
// all-reduced and read back. (With overlap_comm, the unused gpu_sum is read back first.)
void Zero3Lowering::LegacyStepHostChecks(const std::vector<int64_t>& grad_partitions) {
  const int64_t es = ElementBytes();
  const int64_t py = ctx_.plan.host.python_op_overhead_ns;
  constexpr int64_t kFp64Bytes = 8;
  const auto read_back = [&](const char* name, int64_t bytes) {
    b_.HostWork("python op", py);
    b_.Memcpy(compute_, name, traces::MemcpyKind::kDeviceToHost, bytes);
    b_.StreamSync("ZeRO::legacy.item.synchronize", compute_);
  };
  const auto send = [&](const char* name, int64_t bytes) {
    b_.HostWork("python op", py);
    b_.Memcpy(compute_, name, traces::MemcpyKind::kHostToDevice, bytes);
    b_.StreamSync("ZeRO::legacy.to_device.synchronize", compute_);
  };
  if (ctx_.plan.zero.overlap_comm) {
    read_back("ZeRO::legacy.gpu_sum.item", kFp32Bytes);
    send("ZeRO::legacy.gpu_sum.zeros", kFp32Bytes);
  }
  // Per gradient partition: widen into a temporary, reduce it to a scalar, read that back.
  const auto widen_reduce_read = [&](const char* temporary, const char* widen, const char* reduce,
                                     const char* item, int64_t wide_bytes) {
    for (int64_t numel : grad_partitions) {
      b_.HostWork("python op", py);
      b_.Allocate(temporary, numel * wide_bytes, compute_);
      b_.MemoryKernel(compute_, widen, numel * es, numel * wide_bytes);
      b_.HostWork("python op", py);
      b_.MemoryKernel(compute_, reduce, numel * wide_bytes, wide_bytes);
      b_.Free(temporary);
      read_back(item, wide_bytes);
    }
  };
  widen_reduce_read("overflow_check.float", "ZeRO::legacy.has_inf_or_nan.float", "ZeRO::legacy.has_inf_or_nan.sum",
                    "ZeRO::legacy.has_inf_or_nan.item", kFp32Bytes);
  send("ZeRO::legacy.overflow_flag", 1);
  b_.Collective(compute_, "ZeRO::legacy.overflow.all_reduce", CollectiveType::kAllReduce, dp_, 1, DType::kInt8);  // a ByteTensor
  read_back("ZeRO::legacy.overflow.item", 1);
  widen_reduce_read("grad_norm.double", "ZeRO::get_grad_norm_direct.double", "ZeRO::get_grad_norm_direct.norm",
                    "ZeRO::legacy.grad_norm.item", kFp64Bytes);
  send("ZeRO::legacy.total_norm", kFp32Bytes);
  b_.Collective(compute_, "ZeRO::get_grad_norm_direct.all_reduce", CollectiveType::kAllReduce, dp_, kFp32Bytes,
                DType::kFloat32);
  read_back("ZeRO::legacy.total_norm.item", kFp32Bytes);
}

traces::Program Zero3Lowering::Lower() {
  const Plan& plan = ctx_.plan;
  const ZeroConfig& zero = plan.zero;
  const int64_t es = ElementBytes();
  const int64_t hook_ns = plan.host.hook_overhead_ns;
  compute_ = b_.Stream("compute", 0);
  // parameter_offload.py DeepSpeedZeRoOffload: the coordinator's all-gather stream is its own
  // stream with overlap_comm, the default stream otherwise (recalled, not re-read); stage3.py
  // reduce_and_partition_stream = Stream() if overlap_comm else default_stream().
  all_gather_ = zero.overlap_comm ? b_.Stream("all_gather", 0) : compute_;
  reduce_ = zero.overlap_comm ? b_.Stream("reduce_and_partition", 0) : compute_;
  dp_ = b_.Comm(kCommWorld);

  BuildSubmodules();
  BuildTrace();
  status_.assign(subs_.size(), ParamStatus::kNotAvailable);
  handle_of_.assign(subs_.size(), -1);
  in_registry_.assign(subs_.size(), false);
  most_recent_step_.assign(subs_.size(), -1);
  int64_t partition_numel = 0;
  std::vector<int64_t> grad_partitions;  // averaged_gradients: one partition per parameter
  std::vector<std::pair<std::string, int64_t>> persistent;
  for (const Zero3Submodule& sub : subs_) {
    if (sub.fetch_numel == 0) status_[static_cast<size_t>(&sub - subs_.data())] = ParamStatus::kAvailable;
    persistent.insert(persistent.end(), sub.persistent.begin(), sub.persistent.end());
    for (int64_t n : sub.param_numels) {
      partition_numel += CeilDiv(n, ctx_.world_size);
      grad_partitions.push_back(CeilDiv(n, ctx_.world_size));
    }
  }

  // Model states per rank: the bit16 partitions (ds_tensor), the fp32 master partition and
  // the Adam moments (fp32_partitioned_groups_flat and its optimizer state), the gradient
  // partitions (__param_id_to_grad_partition, one flat buffer in the model dtype), the
  // persistent parameters whole (each in the buffer the previous step's _post_step gathered
  // it into: ceil(numel / world) x world elements), and the IPG bucket
  // (__ipg_bucket_flat_buffer, reduce_bucket_size elements, allocated once when
  // contiguous_gradients).
  b_.SetPhase(Phase::kNone);
  b_.Allocate("param_shard.bit16_partition", partition_numel * es, compute_);
  b_.Allocate("param_shard.fp32_partition", partition_numel * kFp32Bytes, compute_);
  b_.Allocate("exp_avg.fp32_partition", partition_numel * kFp32Bytes, compute_);
  b_.Allocate("exp_avg_sq.fp32_partition", partition_numel * kFp32Bytes, compute_);
  b_.Allocate("grad_shard.grad_partitions_flat", partition_numel * es, compute_);
  const auto persistent_buffer_bytes = [&](int64_t numel) { return RoundUp(numel, ctx_.world_size) * es; };
  // (a single persistent parameter is copied out of the gather buffer into its own tensor)
  const auto persistent_bytes = [&](int64_t numel) {
    return persistent.size() == 1 ? numel * es : persistent_buffer_bytes(numel);
  };
  for (const auto& [name, numel] : persistent) {
    b_.Allocate("unsharded.persistent." + name, persistent_bytes(numel), compute_);
  }
  if (zero.contiguous_gradients && !zero.legacy_per_parameter_path) {
    b_.Allocate("bucket.ipg", zero.reduce_bucket_size * es, compute_);
  }

  const int32_t steps = std::max<int32_t>(1, plan.training.grad_accum_steps);
  for (int32_t mb = 0; mb < steps; ++mb) {
    b_.SetMicroBatch(mb);
    ResetStep();
    b_.SetPhase(Phase::kForward);
    for (size_t m = 0; m < ctx_.modules.size(); ++m) {
      const ModuleKernels& module = ctx_.modules[m];
      b_.SetModule(module.name);
      if (subs_of_module_[m].empty()) EmitForwardKernels(ctx_, b_, compute_, module);
      for (size_t s : subs_of_module_[m]) {
        // parameter_offload.py _pre_forward_module_hook -> pre_sub_module_forward_function:
        // fetch_sub_module; then the submodule runs; _post_forward_module_hook ->
        // post_sub_module_forward_function: release_sub_module.
        b_.HostWork("ZeRO::pre_forward_hook", hook_ns);
        FetchSubModule(s);
        ForwardSlice(s);
        b_.HostWork("ZeRO::post_forward_hook", hook_ns);
        ReleaseSubModule(s);
      }
    }

    b_.SetPhase(Phase::kBackward);
    if (zero.legacy_per_parameter_path) {
      // 2021 stage3.py backward: the IPG buffer (two with overlap_comm, "double buffers to
      // avoid data access conflict") allocated on every backward.
      b_.Allocate("bucket.ipg", zero.reduce_bucket_size * es, compute_);
      if (zero.overlap_comm) b_.Allocate("bucket.ipg.1", zero.reduce_bucket_size * es, compute_);
    }
    for (size_t step = 0; step < ctx_.modules.size(); ++step) {
      const size_t m = ctx_.modules.size() - 1 - step;
      const ModuleKernels& module = ctx_.modules[m];
      b_.SetModule(module.name);
      if (Checkpointed(ctx_, module)) {
        // torch.utils.checkpoint reruns the block's forward inside backward: its forward
        // hooks fetch (and release) the submodules again.
        for (size_t s : subs_of_module_[m]) {
          b_.HostWork("ZeRO::pre_forward_hook", hook_ns);
          FetchSubModule(s);
          ForwardSlice(s, /*recompute=*/true);
          b_.HostWork("ZeRO::post_forward_hook", hook_ns);
          ReleaseSubModule(s);
        }
      }
      if (subs_of_module_[m].empty()) EmitBackwardKernels(ctx_, b_, compute_, module);
      for (auto it = subs_of_module_[m].rbegin(); it != subs_of_module_[m].rend(); ++it) {
        const size_t s = *it;
        // _pre_backward_module_hook -> pre_sub_module_backward_function: fetch_sub_module;
        // autograd computes the gradients; the per-parameter gradient hooks reduce
        // (reduction every micro-step in stage 3); _post_backward_module_hook: release.
        b_.HostWork("ZeRO::pre_backward_hook", hook_ns);
        FetchSubModule(s);
        b_.Allocate("grad." + subs_[s].name, subs_[s].numel * es, compute_);
        BackwardSlice(s);
        ReduceIndependent(s, mb);
        b_.HostWork("ZeRO::post_backward_hook", hook_ns);
        ReleaseSubModule(s);
      }
    }
    // independent_gradient_partition_epilogue: reduce the rest, then
    // reduce_and_partition_stream.synchronize() (the host waits for every reduction).
    b_.SetModule("");
    if (zero.legacy_per_parameter_path) {
      LegacyReduceEpilogue(mb);
    } else {
      ReduceAndPartitionIpgGrads(mb);
      b_.StreamSync("ZeRO::reduce_and_partition_stream.synchronize", reduce_);
    }
    ReleaseAll();
  }

  // DeepSpeedZeroOptimizer_Stage3.step: _partition_all_parameters first (reaching the
  // coordinator's release_and_reset_all through parameter_offload.py: recalled, not re-read;
  // release_and_reset_all itself calls __release_param -> param.partition() on every
  // available parameter, ds_persist or not, so the persistent copies are freed); the norm of the bit16
  // gradient partitions (_get_norm_groups -> get_grad_norm_direct, before any fp32 copy);
  // the fp32 gradient of the partition (_prepare_fp32_grad_for_sub_group); unscale and clip;
  // the optimizer on the fp32 partition; the bit16 partition updated from it
  // (_reassign_or_swap_out_partitioned_parameters: no all-gather after the step in stage 3);
  // then _post_step gathers the persistent parameters again.
  b_.SetPhase(Phase::kOptimizer);
  b_.SetMicroBatch(-1);
  b_.HostWork("python op", plan.host.python_op_overhead_ns);
  for (const auto& [name, numel] : persistent) b_.Free("unsharded.persistent." + name);
  if (zero.legacy_per_parameter_path) {
    LegacyStepHostChecks(grad_partitions);
  } else {
    EmitGradNormDirect(ctx_, b_, compute_, dp_, grad_partitions, /*fp64_scalar=*/true);
  }
  EmitFlattenToFp32AndUnscale(ctx_, b_, compute_, partition_numel);
  EmitAdamW(b_, compute_, partition_numel, kFp32Bytes);
  b_.Free("grad_shard.fp32_partition");
  b_.MemoryKernel(compute_, "ZeRO::copy_fp32_to_bit16_partition", partition_numel * kFp32Bytes,
                  partition_numel * es);
  // _post_step: persistent_parameters[0].all_gather(persistent_parameters) -> Init._all_gather
  // (async_op=False). Several parameters: _allgather_params_coalesced — one buffer of
  // ds_tensor.ds_numel x world per parameter and one all_gather_into_tensor each (on the
  // current stream), the parameter a view of its buffer, then get_accelerator().synchronize().
  // A single one: _allgather_params — a flat buffer, the partition copied in, one blocking
  // all_gather_into_tensor, and the parameter copied out into its own tensor.
  if (persistent.size() == 1) {
    const auto& [name, numel] = persistent.front();
    const int64_t part = CeilDiv(numel, ctx_.world_size) * es;
    b_.Allocate("all_gather_output.persistent", persistent_buffer_bytes(numel), compute_);
    b_.MemoryKernel(compute_, "ZeRO::allgather_params.copy_in", part, part);
    b_.Collective(compute_, "ZeRO::all_gather_persistent_parameters", CollectiveType::kAllGather, dp_,
                  persistent_buffer_bytes(numel), ctx_.compute_dtype);
    b_.Allocate("unsharded.persistent." + name, persistent_bytes(numel), compute_);
    b_.MemoryKernel(compute_, "ZeRO::allgather_params.copy_out", numel * es, numel * es);
    b_.Free("all_gather_output.persistent");
  } else if (!persistent.empty()) {
    for (const auto& [name, numel] : persistent) {
      b_.Allocate("unsharded.persistent." + name, persistent_buffer_bytes(numel), compute_);
      b_.Collective(compute_, "ZeRO::all_gather_persistent_parameters", CollectiveType::kAllGather, dp_,
                    persistent_buffer_bytes(numel), ctx_.compute_dtype);
    }
    b_.DeviceSync("ZeRO::allgather_params_coalesced.synchronize");
  }
  return b_.Finish();
}

}  // namespace

StatusOr<LoweredPrograms> LowerZero(const LoweringContext& ctx) {
  if (ctx.plan.moe.expert_parallel > 1) {
    return Status::InvalidInput(std::string("strategy ") + std::string(StrategyName(ctx.plan.strategy)) +
                                " is not lowered with moe.expert_parallel > 1");
  }
  LoweredPrograms out;
  switch (ctx.plan.strategy) {
    case Strategy::kZero1:
    case Strategy::kZero2: out.programs.push_back(Zero12Lowering(ctx).Lower()); break;
    case Strategy::kZero3: out.programs.push_back(Zero3Lowering(ctx).Lower()); break;
    default:
      return Status::Internal(std::string("LowerZero called for strategy ") +
                              std::string(StrategyName(ctx.plan.strategy)));
  }
  return out;
}

}  // namespace shardscope::sim

// Lowering of DeepSpeed ZeRO stage 3 (lowering_zero3.h): the forward and backward slices of
// each submodule, stage3.py's gradient reduction (the IPG bucket, reduce_and_partition) and
// the optimizer step; the parameter coordinator is in lowering_zero3_coordinator.cc.
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lowering_zero3.h"

namespace shardscope::sim {

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

// The gradient hook's host time, then the reduction of the IPG bucket first when a non-empty
// bucket cannot take the parameter's `numel` elements (both paths of
// reduce_independent_p_g_buckets_and_remove_grads).
void Zero3Lowering::GradHookReduceIfFull(int64_t numel, int32_t micro_batch) {
  b_.HostWork("ZeRO::reduce_partition_and_remove_grads", ctx_.plan.host.hook_overhead_ns);
  if (elements_in_ipg_bucket_ == 0 || elements_in_ipg_bucket_ + numel <= ctx_.plan.zero.reduce_bucket_size) return;
  if (ctx_.plan.zero.legacy_per_parameter_path) {
    LegacyReduceIpgGrads(micro_batch);
  } else {
    ReduceAndPartitionIpgGrads(micro_batch);
  }
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
  const std::vector<int64_t>& numels = subs_[s].param_numels;
  for (size_t k = numels.size(); k-- > 0;) {
    const int64_t numel = numels[k];
    const std::string grad = GradTensor(s, k);
    GradHookReduceIfFull(numel, micro_batch);
    if (reduce_ != compute_) {
      const std::string ready = fmt::format("grad_ready.{}", grad_ready_events_++);
      b_.Record(b_.Event(ready), compute_);
      b_.Wait(reduce_, b_.Event(ready));
    }
    if (zero.contiguous_gradients && elements_in_ipg_bucket_ + numel <= zero.reduce_bucket_size) {
      b_.MemoryKernel(reduce_, "ZeRO::copy_grad_to_ipg_bucket", numel * es, numel * es);
      b_.RecordStream(grad, reduce_);
      b_.Free(grad);
    } else {
      grads_to_free_at_reduce_.push_back(grad);
    }
    elements_in_ipg_bucket_ += numel;
    padded_in_ipg_bucket_ += RoundUp(numel, ctx_.world_size);
    ++params_in_ipg_bucket_;
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
  const std::vector<int64_t>& numels = subs_[s].param_numels;
  for (size_t k = numels.size(); k-- > 0;) {
    const int64_t numel = numels[k];
    GradHookReduceIfFull(numel, micro_batch);
    if (numel <= zero.reduce_bucket_size) {
      b_.HostWork("python op", 2 * py);  // narrow, copy_
      b_.MemoryKernel(compute_, "ZeRO::copy_grad_to_ipg_bucket", numel * es, numel * es);
      b_.Free(GradTensor(s, k));
    } else {
      // extra_large_param_to_reduce: reduced from its own gradient
      grads_to_free_at_reduce_.push_back(GradTensor(s, k));
    }
    elements_in_ipg_bucket_ += numel;
    legacy_bucket_.push_back(numel);
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
  if (!grad_partition_alive_) {
    // "if allocate_grads_in_partition": grads_in_partition = torch.zeros(Σ ds_tensor.ds_numel,
    // dtype) on the current stream, the reduction stream of reduce_ipg_grads' `with
    // torch.cuda.stream(self.reduction_stream)`; the first reduced bucket of a step allocates
    // it (the step dropped the previous one, Lower()).
    b_.HostWork("python op", ctx_.plan.host.python_op_overhead_ns);
    b_.Allocate("grad_shard.grad_partitions_flat", partition_numel_ * es, reduce_);
    b_.MemoryKernel(reduce_, "ZeRO::legacy.grads_in_partition.zeros", 0, partition_numel_ * es);
    grad_partition_alive_ = true;
  }
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
  // Both all-reduces run on self.dp_process_group, the engine's group (dp_engine_).
  b_.Collective(compute_, "ZeRO::legacy.overflow.all_reduce", CollectiveType::kAllReduce, dp_engine_, 1,
                DType::kInt8);  // a ByteTensor
  read_back("ZeRO::legacy.overflow.item", 1);
  widen_reduce_read("grad_norm.double", "ZeRO::get_grad_norm_direct.double", "ZeRO::get_grad_norm_direct.norm",
                    "ZeRO::legacy.grad_norm.item", kFp64Bytes);
  send("ZeRO::legacy.total_norm", kFp32Bytes);
  b_.Collective(compute_, "ZeRO::get_grad_norm_direct.all_reduce", CollectiveType::kAllReduce, dp_engine_,
                kFp32Bytes, DType::kFloat32);
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
  // The 2021 code partitions over Init's group, WORLD (partition_parameters.py Init:
  // data_parallel_group None -> torch.distributed.group.WORLD: every gather and reduce-scatter),
  // while the optimizer's dp_process_group is the engine's data_parallel_group, a new_group of
  // every rank (engine.py _configure_distributed_model -> zero/utils.py
  // _initialize_parameter_parallel_groups): its own NCCL communicator, used by the step's
  // overflow and norm all-reduces (and _broadcast_model, init_program.cc). Today's lowering
  // keeps one slot (an open item: today's reduce-scatters run on the engine's group too).
  if (zero.legacy_per_parameter_path) dp_engine_ = b_.Comm(kCommEngineDp);

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
  partition_numel_ = partition_numel;

  // Model states per rank: the bit16 partitions (ds_tensor), the fp32 master partition and
  // the Adam moments (fp32_partitioned_groups_flat and its optimizer state), the gradient
  // partitions (__param_id_to_grad_partition, one flat buffer in the model dtype), the
  // persistent parameters whole (each in the buffer the previous step's _post_step gathered
  // it into: ceil(numel / world) x world elements), and the IPG bucket
  // (__ipg_bucket_flat_buffer, reduce_bucket_size elements, allocated once when
  // contiguous_gradients).
  b_.SetPhase(Phase::kNone);
  b_.Allocate("param_shard.bit16_partition", partition_numel * es, compute_);
  AllocateOptimizerState(b_, compute_, "fp32_partition", partition_numel * kFp32Bytes);
  // 2021 with contiguous_gradients: _release_ipg_buffers (the backward's epilogue) sets
  // self.grads_in_partition = None at the accumulation boundary and the step's zero_grad drops
  // the gradients' views of it, so it is freed in every step and allocated again by the next
  // backward (LegacyPartitionPreviousGrads); without contiguous_gradients it is kept.
  const bool lazy_grad_partition = zero.legacy_per_parameter_path && zero.contiguous_gradients;
  if (!lazy_grad_partition) b_.Allocate("grad_shard.grad_partitions_flat", partition_numel * es, compute_);
  grad_partition_alive_ = !lazy_grad_partition;
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
        // Autograd's gradients, one tensor per parameter (each its own block).
        for (size_t k = 0; k < subs_[s].param_numels.size(); ++k) {
          b_.Allocate(GradTensor(s, k), subs_[s].param_numels[k] * es, compute_);
        }
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
  if (lazy_grad_partition) {
    // 2021 _prepare_fp32_grad_for_sub_group: after the fp32 copy, self.zero_grad() (every
    // param.grad = None) and averaged_gradients[i] = None drop the last views of
    // grads_in_partition: freed before the optimizer (here after unscale's in-place mul_,
    // with no allocation between: the same to the allocator).
    b_.Free("grad_shard.grad_partitions_flat");
    grad_partition_alive_ = false;
  }
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
traces::Program LowerZero3(const LoweringContext& ctx) { return Zero3Lowering(ctx).Lower(); }

}  // namespace shardscope::sim

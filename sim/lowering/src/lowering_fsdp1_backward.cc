// FSDP1's and fairscale's backward (lowering_fsdp1.h): the hooks the shared backward walk
// (lowering_fsdp_common.h) calls — pre-backward unshard and prefetch, the flat gradient and
// its no_sync accumulation, fairscale's per-parameter fp32 accumulation, the post-backward
// reshard and gradient reduction (reduce-scatter, HSDP all-reduce, NO_SHARD all-reduce,
// fairscale's ReduceScatterBucketer) and the final callback. Sources: see lowering_fsdp1.cc.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lowering_fsdp1.h"

namespace shardscope::sim {

// fairscale FullyShardedDataParallel._get_gradient_predivide_factor, the same loop as torch's
// DefaultState._get_gradient_predivide_factor (torch/distributed/algorithms/_comm_hooks/
// default_hooks.py): double the factor while it divides the world size and world / factor >
// factor. Post-divide: world / pre-divide.
double GradientPredivideFactor(int32_t world_size) {
  int32_t factor = 1;
  while (world_size % factor == 0 && world_size / factor > factor) factor *= 2;
  return static_cast<double>(factor);
}

void Fsdp1Lowering::Backward(bool sync) {
  sync_ = sync;
  hook_ran_.assign(units_.size(), false);
  WalkFsdpBackward(ctx_, b_, compute_, *this);
}

// _pre_backward_hook: unshard unless prefetched (a no-op for parameters kept since forward),
// the current stream waits for the unshard stream, then with BACKWARD_PRE
// _prefetch_handle(BACKWARD) unshards the handle before this one in forward execution order
// (_ExecOrderData.get_handle_to_backward_prefetch) — before this unit's gradients are
// computed. fairscale's _pre_backward_hook only rebuilds its own full parameters (no prefetch
// option).
// fairscale: the root (reshard_after_forward turned off by disable_reshard_on_root) only
// switches to its full parameters (_use_full_params): no all-gather, no stream wait; the
// others rebuild and prefetch (BackwardPrefetchTarget).
void Fsdp1Lowering::BeforePreBackward(size_t unit) {
  hook_ran_[unit] = true;
  // Composer _readd_fsdp_sync_hooks: register_full_backward_pre_hook(sync_hook,
  // prepend=True) on every FSDP module: before FSDP's pre-backward unshard / prefetch.
  if (SyncHooks()) OomFlagSync(compute_, "pre_backward", false);
}

void Fsdp1Lowering::WaitForBackwardUnshard(size_t unit) {
  if (Torch() || !units_[unit].is_root) WaitForUnshard();
}

std::vector<size_t> Fsdp1Lowering::BackwardPrefetchTargets(size_t unit) const {
  if (Torch() && cfg_.backward_prefetch != Fsdp1BackwardPrefetch::kBackwardPre) return {};
  const int64_t target = BackwardPrefetchTarget(unit);
  if (!Prefetchable(target)) return {};
  return {static_cast<size_t>(target)};
}

// The unit's flat gradient, produced by autograd in param_dtype on the compute stream
// (estimate: allocated when the unit's backward starts). Under no_sync the previous
// micro-batches' unsharded gradient is still there: the new one is added into it.
void Fsdp1Lowering::AfterPreBackward(size_t unit) {
  if (FairscaleFp32Accumulation()) return;
  for (FlatParam& p : units_[unit].params) {
    b_.Allocate((p.grad_live ? "grad_new." : "grad.") + p.name, p.numel * DTypeSize(param_dtype_), compute_);
  }
}

// FlattenParamsWrapper._grad_accumulation_hook runs per parameter as autograd produces
// its low-precision gradient: the gradient is added into fp32 storage and dropped, so
// one parameter's low-precision gradient is alive at a time. The fp32 storage is made
// by the first micro-batch since the last reduction: one fp32 gradient tensor per
// parameter, each made by that parameter's first accumulation and its own caching-allocator
// block (optimize_backward_concat false, the path before fairscale PR #1186: a list of fp32
// gradients indexed by parameter — the hook's commented-out `param_index` argument in
// fairscale/nn/misc/flatten_params_wrapper.py _grad_accumulation_hook is what is left of
// it — which PR #1186 replaced "to directly allocate flattened fp32 grads"), or one flat
// buffer whose slices the hooks fill (true: _unflatten_params_as_views allocates
// fp32_grads = torch.zeros(total numel, float32).cuda() in forward (AllocateFp32Grads) and
// each hook adds into fp32_grads[start:end]). The hooks fire in the order autograd finishes
// the parameters' gradients: the module's parameters from the last used to the first.
// The backward reaches the flat parameter (the views' SplitWithSizesBackward, a
// torch.cat of the per-parameter low-precision gradients) on every micro-batch the old
// way, and with optimize_backward_concat only on the synced one (PR #1184: "only let the
// backward() pass propagate to FSDP.flat_params, which will invoke the
// FSDP._post_backward_hook() and concat() op, when _require_backward_grad_sync is True";
// its traces: "SplitWithSizesBackward triggered every microbatch per FSDP module" before,
// "only in last microbatch" after). Then the per-parameter low-precision gradients stay
// until the concatenation (below).
void Fsdp1Lowering::AfterModuleBackward(size_t m) {
  if (!FairscaleFp32Accumulation()) return;
  const ModuleKernels& module = ctx_.modules[m];
  const size_t unit = unit_of_module_[m];
  const int64_t pbytes = DTypeSize(param_dtype_);
  Fsdp1Unit& u = units_[unit];
  const bool keep_lowp = sync_ || !cfg_.optimize_backward_concat;
  for (auto it = module.params.rbegin(); it != module.params.rend(); ++it) {
    const ParamTensor& param = *it;
    FlatParam& p = u.params.size() > 1 && IsExpertParam(param) ? u.params[1] : u.params[0];
    const int64_t numel = p.expert ? param.numel / std::max<int32_t>(1, ctx_.plan.moe.expert_parallel) : param.numel;
    if (!p.fp32_live) {
      // The old way: this parameter's fp32 gradient, made by its first accumulation since
      // the last reduction (numel x 4 B, its own block) and kept across micro-batches.
      const std::string fp32 = fmt::format("fp32_grads.{}.{}", module.name, param.name);
      if (std::find(p.fp32_param_grads.begin(), p.fp32_param_grads.end(), fp32) == p.fp32_param_grads.end()) {
        b_.Allocate(fp32, numel * kFp32Bytes, compute_);
        p.fp32_param_grads.push_back(fp32);
      }
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

void Fsdp1Lowering::FinalCallback() {
  // _post_backward_final_callback: with gradient sync the current stream waits for the
  // post-backward stream and, for HSDP, the all-reduce stream (fairscale
  // _wait_for_post_backward: current_stream().wait_stream(post_backward)).
  b_.SetModule("");
  if (sync_) {
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
void Fsdp1Lowering::PostBackward(size_t unit) {
  const int64_t pbytes = DTypeSize(param_dtype_);
  // Autograd finishes the FlatParameter's gradient before the hook (registered on its
  // AccumulateGrad) runs.
  for (FlatParam& p : units_[unit].params) {
    if (FairscaleFp32Accumulation()) {
      if (!sync_ && p.grad_flat_live) {
        // Not reduced: the flat low-precision gradient is dropped (estimate: by the hook).
        b_.Free("grad_flat." + p.name);
        p.grad_flat_live = false;
      }
      if (sync_ && !cfg_.optimize_backward_concat) {
        // The old way: on the reducing micro-batch the per-parameter fp32 gradients are
        // concatenated into one flat fp32 gradient for the reduce-scatter (a torch.cat into a
        // new numel x 4 B tensor, which becomes param.unsharded_main_grad in
        // _post_backward_hook): while it runs, the unit's unsharded fp32 gradient exists twice
        // (PR #1186: "avoid extra memory usage caused by concat(), directly allocate flattened
        // fp32 grads"). Then the list is dropped (fp32_grads = None in _post_backward_hook,
        // as the optimize_backward_concat path still does), freeing every per-parameter block.
        b_.Allocate("fp32_flat_grad." + p.name, p.numel * kFp32Bytes, compute_);
        b_.MemoryKernel(compute_, "fairscale::cat_fp32_grads", p.numel * kFp32Bytes, p.numel * kFp32Bytes);
        for (const std::string& fp32 : p.fp32_param_grads) b_.Free(fp32);
        p.fp32_param_grads.clear();
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
    if (Torch()) Reshard(p, sync_ || ReshardAfterForwardStrategy());
  }
  if (!Torch() && Sharded()) FairscaleFreeFullParams(unit, sync_ || (ReshardAfterForwardStrategy() && !units_[unit].is_root));
  // BACKWARD_POST: _post_backward_reshard prefetches after this unit's gradient computation,
  // before its reduce-scatter is issued (same target as BACKWARD_PRE).
  if (Torch() && cfg_.backward_prefetch == Fsdp1BackwardPrefetch::kBackwardPost) {
    PrefetchUnit(BackwardPrefetchTarget(unit));
  }
  // Without sync, _post_backward_hook returns here: the unsharded gradient stays (torch: in
  // param_dtype, before the reduce_dtype cast) for the next micro-batch.
  if (!sync_) return;
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

// torch _div_if_needed (_runtime_utils.py) / fairscale's div_ guards: divide in place only when
// the factor is above 1; a memory-bound kernel reading and writing the tensor.
void Fsdp1Lowering::DivideIfNeeded(traces::StreamIndex stream, const char* name, double factor, int64_t numel,
                                   DType dtype) {
  if (factor <= 1) return;
  const int64_t bytes = numel * DTypeSize(dtype);
  b_.MemoryKernel(stream, name, bytes, bytes);
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

}  // namespace shardscope::sim

// Lowering of FSDP2 (torch.distributed.fsdp.fully_shard).
#include <algorithm>
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

// ---------------------------------------------------------------------------------------
// FSDP2: torch/distributed/fsdp/_fully_shard/ (fully_shard per transformer block plus the
// root module, as torchtitan's apply_fsdp wraps a model).

struct Fsdp2Unit {
  std::string name;             // "root" or "layers.<i>"
  std::vector<size_t> modules;  // indices into ctx.modules
  int64_t shard_numel = 0;      // per rank, every parameter padded to a multiple of world size
  bool reshard_after_forward = true;
  bool unsharded = false;       // unsharded parameters are allocated
  bool all_gather_issued = false;
};

class Fsdp2Lowering {
 public:
  explicit Fsdp2Lowering(const LoweringContext& ctx) : ctx_(ctx), b_("fsdp2") {}

  traces::Program Lower();

 private:
  int64_t ParamBytes() const { return DTypeSize(param_dtype_); }
  int64_t UnshardedNumel(const Fsdp2Unit& u) const { return u.shard_numel * ctx_.world_size; }
  void Unshard(size_t unit);
  void WaitForUnshard(size_t unit, bool forward);
  void ReleaseForwardAllGatherState();
  void Reshard(size_t unit);
  void PostBackward(size_t unit, int32_t micro_batch);
  void Forward();
  void Backward(int32_t micro_batch);

  const LoweringContext& ctx_;
  ProgramBuilder b_;
  DType param_dtype_ = DType::kBFloat16;
  traces::StreamIndex compute_ = 0, copy_in_ = 0, all_gather_ = 0, reduce_scatter_ = 0;
  traces::CommSlot dp_ = 0;
  std::vector<Fsdp2Unit> units_;
  std::vector<size_t> unit_of_module_;
  int64_t forward_all_gather_state_ = -1;  // unit whose all-gather output awaits its free
  int64_t reduce_scatter_state_ = -1;      // unit whose reduce-scatter input awaits its free
  int64_t last_post_reduce_ = -1;          // unit whose post-reduce event the final wait needs
};

traces::Program Fsdp2Lowering::Lower() {
  const Plan& plan = ctx_.plan;
  // MixedPrecisionPolicy(param_dtype=training.dtype, reduce_dtype=float32), torchtitan's
  // defaults (torchtitan/config: mixed_precision_param bf16, mixed_precision_reduce fp32).
  param_dtype_ = ctx_.compute_dtype;
  // FSDPCommContext.lazy_init (_fsdp_param_group.py): all-gather copy-in, all-gather and
  // reduce-scatter streams at high priority (-1); compute on the current stream.
  compute_ = b_.Stream("compute", 0);
  copy_in_ = b_.Stream("all_gather_copy_in", -1);
  all_gather_ = b_.Stream("all_gather", -1);
  reduce_scatter_ = b_.Stream("reduce_scatter", -1);
  dp_ = b_.Comm("dp");

  // Units as torchtitan's apply_fsdp (torchtitan/models/llama3/infra/parallelize.py) wraps a
  // model: fully_shard(tok_embeddings), fully_shard(block) for each block,
  // fully_shard([norm, output]), then fully_shard(model) — a root that holds no parameters
  // of its own. The embedding and the blocks follow reshard_after_forward; [norm, output]
  // keeps its parameters after forward (torchtitan passes reshard_after_forward=False
  // there: backward needs them at once).
  unit_of_module_.resize(ctx_.modules.size());
  for (size_t m = 0; m < ctx_.modules.size(); ++m) {
    const ModuleKernels& module = ctx_.modules[m];
    const bool last = m + 1 == ctx_.modules.size();
    unit_of_module_[m] = units_.size();
    units_.push_back(Fsdp2Unit{module.name, {m}, 0, last ? false : plan.fsdp2.reshard_after_forward != ReshardAfterForward::kFalse, false, false});
  }
  for (Fsdp2Unit& unit : units_) {
    for (size_t m : unit.modules) {
      for (const ParamTensor& param : ctx_.modules[m].params) {
        // FSDPParam shards dim 0 with padding to a multiple of the world size; with only
        // numel known we pad the flat size (exact for 1-D and for dim-0 multiples).
        unit.shard_numel += (param.numel + ctx_.world_size - 1) / ctx_.world_size;
      }
    }
  }

  // Model states that live across steps: the fp32 sharded parameters and AdamW's two fp32
  // moments (12 bytes per parameter / world size, the ZeRO paper's 16Ψ/N with gradients).
  b_.SetPhase(Phase::kNone);
  for (const Fsdp2Unit& unit : units_) {
    b_.SetModule(unit.name);
    for (const char* state : {"param_shard.", "exp_avg.", "exp_avg_sq."}) {
      b_.Allocate(state + unit.name, unit.shard_numel * kFp32Bytes, compute_);
    }
  }

  for (int32_t mb = 0; mb < plan.training.grad_accum_steps; ++mb) {
    b_.SetMicroBatch(mb);
    Forward();
    Backward(mb);
  }

  // Optimizer step on the local shards, then zero_grad(set_to_none=True) frees the sharded
  // gradients (torch/optim/optimizer.py Optimizer.zero_grad).
  b_.SetPhase(Phase::kOptimizer);
  b_.SetMicroBatch(-1);
  for (const Fsdp2Unit& unit : units_) {
    b_.SetModule(unit.name);
    b_.HostWork("python op", plan.host.python_op_overhead_ns);
    EmitAdamW(b_, compute_, unit.shard_numel);
  }
  for (const Fsdp2Unit& unit : units_) b_.Free("grad_shard." + unit.name);
  return b_.Finish();
}

// FSDPParamGroup.unshard -> foreach_all_gather (_fsdp_collectives.py): on the copy-in
// stream, cast the fp32 shard to param_dtype, allocate the flat all-gather output and copy
// the local shard into it (all_gather_copy_in); the all-gather stream waits for the
// copy-in and runs all_gather_into_tensor; an event marks its completion.
void Fsdp2Lowering::Unshard(size_t unit_index) {
  Fsdp2Unit& u = units_[unit_index];
  if (u.unsharded || u.all_gather_issued) return;
  const std::string& n = u.name;
  const int64_t shard_bytes = u.shard_numel * ParamBytes();
  if (param_dtype_ != DType::kFloat32) {
    b_.Allocate("cast." + n, shard_bytes, copy_in_);
    b_.MemoryKernel(copy_in_, "FSDP::cast_to_param_dtype", u.shard_numel * kFp32Bytes, shard_bytes);
  }
  b_.Allocate("all_gather_output." + n, shard_bytes * ctx_.world_size, copy_in_);
  b_.MemoryKernel(copy_in_, "FSDP::all_gather_copy_in", shard_bytes, shard_bytes);
  if (param_dtype_ != DType::kFloat32) b_.Free("cast." + n);
  b_.Record(b_.Event("copy_in." + n), copy_in_);
  b_.Wait(all_gather_, b_.Event("copy_in." + n));
  b_.Collective(all_gather_, "FSDP::all_gather", CollectiveType::kAllGather, dp_,
                shard_bytes * ctx_.world_size, param_dtype_);
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

// FSDPParamGroup.reshard: free the unsharded parameters (stream-ordered on compute).
void Fsdp2Lowering::Reshard(size_t unit_index) {
  Fsdp2Unit& u = units_[unit_index];
  if (!u.unsharded) return;
  b_.Free("unsharded." + u.name);
  u.unsharded = false;
}

void Fsdp2Lowering::Forward() {
  const int64_t hook_ns = ctx_.plan.host.hook_overhead_ns;
  b_.SetPhase(Phase::kForward);
  // FSDPState._root_pre_forward: the all-gather streams wait for the current stream, so a
  // micro-batch's first all-gather does not start before the previous backward has ended.
  b_.SetModule(ctx_.modules.front().name);
  b_.HostWork("FSDP::root_pre_forward", hook_ns);
  b_.Record(b_.Event("root_pre_forward"), compute_);
  b_.Wait(copy_in_, b_.Event("root_pre_forward"));
  b_.Wait(all_gather_, b_.Event("root_pre_forward"));
  for (size_t m = 0; m < ctx_.modules.size(); ++m) {
    const ModuleKernels& module = ctx_.modules[m];
    const size_t unit = unit_of_module_[m];
    const bool first_of_unit = units_[unit].modules.front() == m;
    const bool last_of_unit = units_[unit].modules.back() == m;
    b_.SetModule(module.name);
    if (first_of_unit) {
      // FSDPState._pre_forward -> FSDPParamGroup.pre_forward: unshard(); wait_for_unshard().
      // The next unit's unshard is issued when the CPU reaches its pre-forward, while this
      // unit still computes: that is FSDP2's implicit forward prefetch.
      b_.HostWork("FSDP::pre_forward", hook_ns);
      Unshard(unit);
      WaitForUnshard(unit, /*forward=*/true);
    }
    b_.Allocate("activations." + module.name, SavedBytes(ctx_, module), compute_);
    EmitForwardKernels(ctx_, b_, compute_, module);
    if (last_of_unit) {
      // FSDPState._post_forward -> FSDPParamGroup.post_forward: reshard if
      // reshard_after_forward. After the last unit, the forward root (the parameter-less
      // fully_shard(model)) frees the last all-gather state.
      b_.HostWork("FSDP::post_forward", hook_ns);
      if (units_[unit].reshard_after_forward) Reshard(unit);
      if (m + 1 == ctx_.modules.size()) ReleaseForwardAllGatherState();  // the root's post_forward
    }
  }
}

// FSDPParamGroup.post_backward -> foreach_reduce (_fsdp_collectives.py).
void Fsdp2Lowering::PostBackward(size_t unit_index, int32_t micro_batch) {
  Fsdp2Unit& u = units_[unit_index];
  const std::string& n = u.name;
  b_.HostWork("FSDP::post_backward", ctx_.plan.host.hook_overhead_ns);
  Reshard(unit_index);
  // The previous reduce-scatter's input is freed once the current stream has waited for it
  // (comm_ctx.reduce_scatter_state), so about one reduce-scatter runs ahead of compute.
  if (reduce_scatter_state_ >= 0) {
    const std::string& prev = units_[static_cast<size_t>(reduce_scatter_state_)].name;
    b_.Wait(compute_, b_.Event("reduce_scatter." + prev));
    b_.Free("reduce_scatter_input." + prev);
    reduce_scatter_state_ = -1;
  }
  // reduce_dtype float32: chunk_cat casts the unsharded bf16 gradients into the padded fp32
  // reduce-scatter input on the current stream; the unsharded gradients are then dropped.
  const int64_t unsharded_numel = UnshardedNumel(u);
  const int64_t grad_bytes = unsharded_numel * ParamBytes();
  b_.Allocate("reduce_scatter_input." + n, unsharded_numel * kFp32Bytes, compute_);
  b_.MemoryKernel(compute_, "FSDP::chunk_cat", grad_bytes, unsharded_numel * kFp32Bytes);
  for (size_t m : u.modules) b_.Free("grad." + ctx_.modules[m].name);
  // reduce_scatter_stream.wait_stream(current_stream), then the reduce-scatter (AVG).
  b_.Record(b_.Event("grads_ready." + n), compute_);
  b_.Wait(reduce_scatter_, b_.Event("grads_ready." + n));
  const int64_t shard_bytes = u.shard_numel * kFp32Bytes;
  // The first micro-batch's reduce-scatter output becomes the sharded .grad (views into
  // it); later ones are added into it and freed.
  const std::string output = micro_batch == 0 ? "grad_shard." + n : "reduce_scatter_output." + n;
  b_.Allocate(output, shard_bytes, reduce_scatter_);
  b_.Collective(reduce_scatter_, "FSDP::reduce_scatter", CollectiveType::kReduceScatter, dp_,
                unsharded_numel * kFp32Bytes, DType::kFloat32);
  // foreach_reduce records the reduce-scatter event right after the collective (it frees
  // the input); the post-reduce event follows the accumulation into .grad.
  b_.Record(b_.Event("reduce_scatter." + n), reduce_scatter_);
  if (micro_batch > 0) {
    b_.MemoryKernel(reduce_scatter_, "FSDP::accumulate_grad", 2 * shard_bytes, shard_bytes);
    b_.Free(output);
  }
  b_.Record(b_.Event("post_reduce." + n), reduce_scatter_);
  reduce_scatter_state_ = static_cast<int64_t>(unit_index);
  last_post_reduce_ = static_cast<int64_t>(unit_index);
}

void Fsdp2Lowering::Backward(int32_t micro_batch) {
  b_.SetPhase(Phase::kBackward);
  // Backward order of units: the reverse of post-forward order ([norm, output] first, the
  // embedding last; FSDP2's _backward_prefetch walks post_forward_order backwards).
  std::vector<size_t> unit_order;
  for (size_t u = units_.size(); u-- > 0;) unit_order.push_back(u);
  std::vector<bool> pre_backward_done(units_.size(), false);
  // Module order in backward: head, layers.L-1 .. layers.0, embed.
  for (size_t step = 0; step < ctx_.modules.size(); ++step) {
    const size_t m = ctx_.modules.size() - 1 - step;
    const ModuleKernels& module = ctx_.modules[m];
    const size_t unit = unit_of_module_[m];
    b_.SetModule(module.name);
    if (!pre_backward_done[unit]) {
      // FSDPParamGroup.pre_backward: unshard + wait (a no-op when prefetched or kept), then
      // _backward_prefetch: unshard the next unit in backward order (one ahead by default).
      pre_backward_done[unit] = true;
      b_.HostWork("FSDP::pre_backward", ctx_.plan.host.hook_overhead_ns);
      Unshard(unit);
      WaitForUnshard(unit, /*forward=*/false);
      const auto pos = std::find(unit_order.begin(), unit_order.end(), unit);
      if (pos + 1 != unit_order.end()) Unshard(*(pos + 1));
    }
    // Autograd allocates the unsharded gradients (param dtype) as the block's backward runs.
    b_.Allocate("grad." + module.name, module.param_numel() * ParamBytes(), compute_);
    EmitBackwardKernels(ctx_, b_, compute_, module, Checkpointed(ctx_, module));
    b_.Free("activations." + module.name);
    if (units_[unit].modules.front() == m) PostBackward(unit, micro_batch);
  }
  // FSDPState._root_post_backward_final_callback: the current stream waits for the
  // post-reduce work (the reduce-scatter stream is FIFO, so the last event covers all) and
  // for the last reduce-scatter, whose input is then freed.
  if (last_post_reduce_ >= 0) {
    b_.Wait(compute_, b_.Event("post_reduce." + units_[static_cast<size_t>(last_post_reduce_)].name));
    last_post_reduce_ = -1;
  }
  if (reduce_scatter_state_ >= 0) {
    const std::string& prev = units_[static_cast<size_t>(reduce_scatter_state_)].name;
    b_.Wait(compute_, b_.Event("reduce_scatter." + prev));
    b_.Free("reduce_scatter_input." + prev);
    reduce_scatter_state_ = -1;
  }
}

}  // namespace

StatusOr<LoweredPrograms> LowerFsdp2(const LoweringContext& ctx) {
  LoweredPrograms out;
  out.programs.push_back(Fsdp2Lowering(ctx).Lower());
  return out;
}

}  // namespace shardscope::sim

// Lowering of FSDP2 (fully_shard) and DDP into schedules.
//
// Shapes of the work come from DecomposeModel (model.h); this file decides the order, the
// streams, the waits and the allocations, following the framework sources cited inline.
// Each strategy is a function of (LoweringContext) -> Program, so adding one (the next issue
// adds FSDP1, ZeRO-1/2/3, HSDP) means adding a function, not changing the others.
#include "shardscope/sim/lowering.h"

#include <algorithm>
#include <fmt/format.h>

#include "program_builder.h"
#include "schedule_metadata.h"

namespace shardscope::sim {
namespace {

using traces::CollectiveType;
using traces::DType;
using traces::DTypeSize;
using traces::Phase;

constexpr int64_t kFp32Bytes = 4;

struct LoweringContext {
  const Plan& plan;
  std::vector<ModuleKernels> modules;  // forward order: embed, layers.*, head
  int32_t world_size = 1;
  DType compute_dtype = DType::kBFloat16;
};

bool IsBlock(const ModuleKernels& module) { return module.name.rfind("layers.", 0) == 0; }

// Forward kernels of one module, each preceded by the Python + dispatcher time eager mode
// spends issuing it.
void EmitForwardKernels(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex stream,
                        const ModuleKernels& module) {
  for (const ModuleKernel& kernel : module.forward) {
    b.HostWork("python op", ctx.plan.host.python_op_overhead_ns);
    b.Kernel(stream, kernel.name, kernel.compute);
  }
}

// Backward kernels run from the C++ autograd engine: no Python time per kernel.
// With full activation checkpointing (torch.utils.checkpoint, one checkpoint per
// transformer block as torchtitan applies it) the block's forward is recomputed first,
// from Python, re-creating the saved activations for the duration of its backward.
void EmitBackwardKernels(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex stream,
                         const ModuleKernels& module, bool recompute) {
  if (recompute) {
    b.Allocate("recomputed." + module.name, module.saved_bytes(), stream);
    EmitForwardKernels(ctx, b, stream, module);
  }
  for (const ModuleKernel& kernel : module.backward) b.Kernel(stream, kernel.name, kernel.compute);
  if (recompute) b.Free("recomputed." + module.name);
}

bool Checkpointed(const LoweringContext& ctx, const ModuleKernels& module) {
  return ctx.plan.training.activation_checkpointing == ActivationCheckpointing::kFull && IsBlock(module);
}

// Bytes a module keeps alive from its forward to its backward.
int64_t SavedBytes(const LoweringContext& ctx, const ModuleKernels& module) {
  if (!Checkpointed(ctx, module)) return module.saved_bytes();
  // A checkpointed block keeps only its input: tokens x hidden in the activation dtype.
  const Workload workload{ctx.plan.training.micro_batch_size, ctx.plan.training.seq_len, ctx.compute_dtype};
  return workload.micro_batch * workload.seq_len * ctx.plan.model.hidden * DTypeSize(workload.dtype);
}

// AdamW over `numel` fp32 parameters: reads param, grad, exp_avg, exp_avg_sq and writes
// param, exp_avg, exp_avg_sq (torch/optim/adamw.py, _fused_adamw: one multi-tensor kernel).
void EmitAdamW(ProgramBuilder& b, traces::StreamIndex stream, int64_t numel) {
  b.MemoryKernel(stream, "optimizer.adamw", 4 * kFp32Bytes * numel, 3 * kFp32Bytes * numel);
}

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
    units_.push_back(Fsdp2Unit{module.name, {m}, 0, last ? false : plan.fsdp2.reshard_after_forward, false, false});
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

// ---------------------------------------------------------------------------------------
// DDP: torch/nn/parallel/distributed.py and torch/csrc/distributed/c10d/reducer.cpp, with
// torch.autocast(bf16): fp32 parameters and gradients, bf16 GEMMs.

struct DdpBucket {
  int64_t bytes = 0;
  size_t last_module = 0;  // the module (forward index) whose gradients complete it
};

traces::Program LowerDdp(const LoweringContext& ctx) {
  const Plan& plan = ctx.plan;
  ProgramBuilder b("ddp");
  const traces::StreamIndex compute = b.Stream("compute", 0);
  // ProcessGroupNCCL runs async collectives on its own stream, which first waits on the
  // caller's stream (ProcessGroupNCCL::collective, syncStream).
  const traces::StreamIndex nccl = b.Stream("nccl", 0);
  const traces::CommSlot dp = b.Comm("dp");

  // The steady-state buckets (Reducer::rebuild_buckets after the first iteration; the first
  // iteration runs one bucket). Buckets over parameters in reverse registration order (which
  // is the order gradients become ready); the first holds 1 MiB (dist._DEFAULT_FIRST_BUCKET_BYTES), the rest
  // bucket_cap_mb; a bucket closes once it reaches its cap
  // (reducer.cpp compute_bucket_assignment_by_size).
  std::vector<DdpBucket> buckets;
  {
    int64_t cap = static_cast<int64_t>(plan.ddp.first_bucket_mb * 1024 * 1024);
    DdpBucket current;
    for (size_t step = 0; step < ctx.modules.size(); ++step) {
      const size_t m = ctx.modules.size() - 1 - step;
      const auto& params = ctx.modules[m].params;
      for (auto it = params.rbegin(); it != params.rend(); ++it) {
        current.bytes += it->numel * kFp32Bytes;
        current.last_module = m;
        if (current.bytes >= cap) {
          buckets.push_back(current);
          current = DdpBucket{};
          cap = static_cast<int64_t>(plan.ddp.bucket_cap_mb * 1024 * 1024);
        }
      }
    }
    if (current.bytes > 0) buckets.push_back(current);
  }
  int64_t total_numel = 0;
  for (const ModuleKernels& module : ctx.modules) total_numel += module.param_numel();

  const auto cast_numel = [&](const ModuleKernels& module) {
    int64_t numel = 0;
    if (ctx.compute_dtype == DType::kFloat32) return numel;
    for (const ParamTensor& p : module.params) numel += p.matmul ? p.numel : 0;
    return numel;
  };
  const auto cast_bytes = [&](const ModuleKernels& module) {
    return cast_numel(module) * DTypeSize(ctx.compute_dtype);
  };

  // Model states: fp32 parameters, AdamW moments, and the reducer's flat bucket buffers.
  b.SetPhase(Phase::kNone);
  b.Allocate("params", total_numel * kFp32Bytes, compute);
  b.Allocate("exp_avg", total_numel * kFp32Bytes, compute);
  b.Allocate("exp_avg_sq", total_numel * kFp32Bytes, compute);
  for (size_t i = 0; i < buckets.size(); ++i) {
    b.Allocate(fmt::format("bucket.{}", i), buckets[i].bytes, compute);
  }

  for (int32_t mb = 0; mb < plan.training.grad_accum_steps; ++mb) {
    b.SetMicroBatch(mb);
    b.SetPhase(Phase::kForward);
    for (const ModuleKernels& module : ctx.modules) {
      b.SetModule(module.name);
      // autocast casts the fp32 weights of GEMMs (linear weights and biases; norms run in fp32
      // and the embedding lookup reads its fp32 table) to bf16 once per forward
      // (aten/src/ATen/autocast_mode.cpp: the lower-precision op list and its cast cache).
      // Autograd keeps the copies for the GEMMs' backward; under activation checkpointing
      // the forward's copies die when autocast exits and the recompute casts again.
      if (cast_bytes(module) > 0) {
        b.Allocate("weight_cast." + module.name, cast_bytes(module), compute);
        b.MemoryKernel(compute, "autocast::to_copy", cast_numel(module) * kFp32Bytes, cast_bytes(module));
      }
      b.Allocate("activations." + module.name, SavedBytes(ctx, module), compute);
      EmitForwardKernels(ctx, b, compute, module);
    }
    for (const ModuleKernels& module : ctx.modules) {  // autocast exits: only saved copies live on
      if (Checkpointed(ctx, module) && cast_bytes(module) > 0) b.Free("weight_cast." + module.name);
    }
    b.SetPhase(Phase::kBackward);
    size_t next_bucket = 0;
    for (size_t step = 0; step < ctx.modules.size(); ++step) {
      const size_t m = ctx.modules.size() - 1 - step;
      const ModuleKernels& module = ctx.modules[m];
      b.SetModule(module.name);
      const int64_t grad_bytes = module.param_numel() * kFp32Bytes;
      // AccumulateGrad: the first micro-batch's gradients become .grad; later ones are
      // added into it.
      const std::string grad = mb == 0 ? "grad." + module.name : "grad_tmp." + module.name;
      b.Allocate(grad, grad_bytes, compute);
      const bool recompute = Checkpointed(ctx, module);
      if (recompute && cast_bytes(module) > 0) {  // the recompute runs under autocast again
        b.Allocate("weight_cast." + module.name, cast_bytes(module), compute);
        b.MemoryKernel(compute, "autocast::to_copy", cast_numel(module) * kFp32Bytes, cast_bytes(module));
      }
      // The GEMMs produce bf16 weight gradients; the cast's backward turns them into fp32.
      if (cast_bytes(module) > 0) b.Allocate("grad_lowp." + module.name, cast_bytes(module), compute);
      EmitBackwardKernels(ctx, b, compute, module, recompute);
      if (cast_bytes(module) > 0) {
        b.MemoryKernel(compute, "autocast::to_copy_backward", cast_bytes(module), cast_numel(module) * kFp32Bytes);
        b.Free("grad_lowp." + module.name);
        b.Free("weight_cast." + module.name);
      }
      if (mb > 0) {
        b.MemoryKernel(compute, "AccumulateGrad", 2 * grad_bytes, grad_bytes);
        b.Free(grad);
      }
      b.Free("activations." + module.name);
      // Reducer::autograd_hook -> mark_variable_ready: copy the gradient into its bucket
      // (gradient_as_bucket_view=False), launch every bucket now complete, in order.
      b.HostWork("DDP::autograd_hook", plan.host.hook_overhead_ns);
      b.MemoryKernel(compute, "DDP::copy_grad_to_bucket", grad_bytes, grad_bytes);
      while (next_bucket < buckets.size() && buckets[next_bucket].last_module == m) {
        const std::string ready = fmt::format("bucket_ready.{}", next_bucket);
        b.Record(b.Event(ready), compute);
        b.Wait(nccl, b.Event(ready));
        b.Collective(nccl, "DDP::all_reduce", CollectiveType::kAllReduce, dp, buckets[next_bucket].bytes,
                     DType::kFloat32);
        b.Record(b.Event(fmt::format("bucket_done.{}", next_bucket)), nccl);
        ++next_bucket;
      }
    }
    // Reducer::finalize_backward: for each bucket in order, wait for its all-reduce
    // (future_work->wait() makes the current stream wait), then copy the averaged bucket
    // back into .grad — so early buckets' copies overlap later all-reduces.
    b.SetModule("");
    for (size_t i = 0; i < buckets.size(); ++i) {
      b.Wait(compute, b.Event(fmt::format("bucket_done.{}", i)));
      b.MemoryKernel(compute, "DDP::copy_bucket_to_grad", buckets[i].bytes, buckets[i].bytes);
    }
  }

  b.SetPhase(Phase::kOptimizer);
  b.SetMicroBatch(-1);
  for (const ModuleKernels& module : ctx.modules) {
    b.SetModule(module.name);
    b.HostWork("python op", plan.host.python_op_overhead_ns);
    EmitAdamW(b, compute, module.param_numel());
  }
  for (const ModuleKernels& module : ctx.modules) b.Free("grad." + module.name);
  return b.Finish();
}

}  // namespace

StatusOr<traces::Schedule> LowerPlan(const Plan& plan) {
  LoweringContext ctx{plan, {}, plan.cluster.world_size(), plan.training.dtype};
  const Workload workload{plan.training.micro_batch_size, plan.training.seq_len, plan.training.dtype};
  SHARDSCOPE_RETURN_IF_ERROR(ValidateModel(plan.model).WithContext(plan.source));
  SHARDSCOPE_RETURN_IF_ERROR(ValidateWorkload(plan.model, workload).WithContext(plan.source));
  ctx.modules = DecomposeModel(plan.model, workload);
  if (ctx.modules.empty()) return Status::InvalidInput(plan.source + ": the model has no modules");

  traces::Schedule schedule;
  switch (plan.strategy) {
    case Strategy::kFsdp2: schedule.programs.push_back(Fsdp2Lowering(ctx).Lower()); break;
    case Strategy::kDdp: schedule.programs.push_back(LowerDdp(ctx)); break;
  }
  traces::Communicator dp{"dp", {}};
  for (int32_t rank = 0; rank < ctx.world_size; ++rank) {
    dp.ranks.push_back(rank);
    schedule.ranks.push_back(traces::RankBinding{0, {}});
  }
  schedule.communicators.push_back(std::move(dp));
  SHARDSCOPE_RETURN_IF_ERROR(schedule.ResolveBindings());

  const int64_t tokens = plan.training.micro_batch_size * plan.training.seq_len * plan.training.grad_accum_steps;
  WritePlanMetadata(plan, schedule.metadata);
  schedule.metadata[kMetaTokensPerRankStep] = std::to_string(tokens);
  schedule.metadata[kMetaModelFlopsPerRankStep] =
      fmt::format("{:.17g}", TrainingFlopsPerToken(plan.model, plan.training.seq_len) * static_cast<double>(tokens));
  return schedule;
}

}  // namespace shardscope::sim

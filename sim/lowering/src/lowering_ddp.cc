// Lowering of DDP (torch.nn.parallel.DistributedDataParallel).
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lowering_internal.h"

namespace shardscope::sim {
namespace {

// ---------------------------------------------------------------------------------------
// DDP: torch/nn/parallel/distributed.py and torch/csrc/distributed/c10d/reducer.cpp, with
// torch.autocast(bf16): fp32 parameters and gradients, bf16 GEMMs.

struct DdpBucket {
  int64_t bytes = 0;
  int64_t last_param = 0;  // position, in gradient-ready order, of the parameter completing it
};

traces::Program LowerDdpProgram(const LoweringContext& ctx) {
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
    int64_t position = 0;
    for (size_t step = 0; step < ctx.modules.size(); ++step) {
      const size_t m = ctx.modules.size() - 1 - step;
      const auto& params = ctx.modules[m].params;
      for (auto it = params.rbegin(); it != params.rend(); ++it) {
        current.bytes += it->numel * ctx.MasterBytes();
        current.last_param = position++;
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
    if (ctx.compute_dtype == ctx.master_dtype) return numel;  // nothing for autocast to cast
    for (const ParamTensor& p : module.params) numel += p.matmul ? p.numel : 0;
    return numel;
  };
  const auto cast_bytes = [&](const ModuleKernels& module) {
    return cast_numel(module) * DTypeSize(ctx.compute_dtype);
  };

  // Per-parameter tensors: the caching allocator sees one block per parameter (and per
  // parameter's gradient, cast and moment), as PyTorch makes them.
  const auto param_tensor = [](const char* prefix, const ModuleKernels& module, const ParamTensor& param) {
    return fmt::format("{}.{}.{}", prefix, module.name, param.name);
  };
  const auto casts = [&](const ParamTensor& param) { return param.matmul && ctx.compute_dtype != ctx.master_dtype; };

  // Model states: the parameters (fp32, or bf16 under pure_bf16), each its own tensor
  // (nn.Linear / nn.Embedding / RMSNorm __init__: Parameter(torch.empty(...)) per weight,
  // moved to the GPU one by one by Module._apply); AdamW's moments, also one per parameter
  // (torch/optim/adamw.py _init_group: state["exp_avg"] = torch.zeros_like(p) and
  // state["exp_avg_sq"] likewise, made by the first step and kept); and the reducer's flat
  // bucket buffers, one per bucket (reducer.cpp Reducer::initialize_buckets:
  // bucket.gradients = at::empty({offset}, options), the parameters' gradients copied into
  // views of it).
  const int64_t master = ctx.MasterBytes();
  b.SetPhase(Phase::kNone);
  for (const char* state : {"params", "exp_avg", "exp_avg_sq"}) {
    for (const ModuleKernels& module : ctx.modules) {
      b.SetModule(module.name);
      for (const ParamTensor& param : module.params) {
        b.Allocate(param_tensor(state, module, param), param.numel * master, compute);
      }
    }
  }
  b.SetModule("");
  for (size_t i = 0; i < buckets.size(); ++i) {
    b.Allocate(fmt::format("bucket.{}", i), buckets[i].bytes, compute);
  }

  for (int32_t mb = 0; mb < plan.training.grad_accum_steps; ++mb) {
    b.SetMicroBatch(mb);
    // ddp.no_sync: every micro-batch but the last runs under DistributedDataParallel.no_sync()
    // (torch/nn/parallel/distributed.py): require_backward_grad_sync is False, so forward
    // does not call reducer.prepare_for_backward and Reducer::autograd_hook returns before
    // mark_variable_ready (reducer.cpp: expect_autograd_hooks_ is false) — no bucket copy,
    // no all-reduce, gradients accumulate locally in .grad. The last micro-batch syncs the
    // accumulated gradients.
    const bool sync = !plan.ddp.no_sync || mb + 1 == plan.training.grad_accum_steps;
    b.SetPhase(Phase::kForward);
    for (const ModuleKernels& module : ctx.modules) {
      b.SetModule(module.name);
      // autocast casts the fp32 weights of GEMMs (linear weights and biases; norms run in fp32
      // and the embedding lookup reads its fp32 table) to bf16 once per forward
      // (aten/src/ATen/autocast_mode.cpp: the lower-precision op list and its cast cache, one
      // cached copy per weight tensor). Autograd keeps the copies for the GEMMs' backward;
      // under activation checkpointing the forward's copies die when autocast exits and the
      // recompute casts again.
      if (cast_bytes(module) > 0) {
        for (const ParamTensor& param : module.params) {
          if (casts(param)) {
            b.Allocate(param_tensor("weight_cast", module, param), param.numel * DTypeSize(ctx.compute_dtype), compute);
          }
        }
        b.MemoryKernel(compute, "autocast::to_copy", cast_numel(module) * master, cast_bytes(module));
      }
      EmitForwardKernels(ctx, b, compute, module);
    }
    const auto free_casts = [&](const ModuleKernels& module) {
      for (const ParamTensor& param : module.params) {
        if (casts(param)) b.Free(param_tensor("weight_cast", module, param));
      }
    };
    for (const ModuleKernels& module : ctx.modules) {  // autocast exits: only saved copies live on
      if (Checkpointed(ctx, module)) free_casts(module);
    }
    b.SetPhase(Phase::kBackward);
    // The loss's backward runs first, before any parameter gradient exists (KernelPart).
    EmitLossBackward(ctx, b, compute);
    size_t next_bucket = 0;
    int64_t params_ready = 0;  // parameters whose gradient is complete, in gradient-ready order
    for (size_t step = 0; step < ctx.modules.size(); ++step) {
      const size_t m = ctx.modules.size() - 1 - step;
      const ModuleKernels& module = ctx.modules[m];
      b.SetModule(module.name);
      // AccumulateGrad: the first micro-batch's gradient of a parameter becomes its .grad
      // (its own tensor: gradient_as_bucket_view is False by default, distributed.py); later
      // ones are added into it and dropped.
      const auto grad = [&](const ParamTensor& param) { return param_tensor(mb == 0 ? "grad" : "grad_tmp", module, param); };
      const bool recompute = Checkpointed(ctx, module);
      if (recompute && cast_bytes(module) > 0) {  // the recompute runs under autocast again
        for (const ParamTensor& param : module.params) {
          if (casts(param)) {
            b.Allocate(param_tensor("weight_cast", module, param), param.numel * DTypeSize(ctx.compute_dtype), compute);
          }
        }
        b.MemoryKernel(compute, "autocast::to_copy", cast_numel(module) * master, cast_bytes(module));
      }
      EmitRecompute(ctx, b, compute, module);
      // Reducer::autograd_hook runs per parameter, from AccumulateGrad's post-hook, as soon as
      // that parameter's gradient is complete (reducer.cpp mark_variable_ready): the gradient
      // is copied into its bucket (gradient_as_bucket_view=False) and every bucket now
      // complete is launched, in order (mark_bucket_ready) — while the module's remaining
      // backward kernels still run.
      // Each parameter's gradient is allocated by the kernel that produces it: a GEMM under
      // autocast writes a bf16 weight gradient (its own tensor), which autocast's
      // ToCopyBackward turns into the fp32 gradient (a new tensor; the bf16 one is dropped);
      // a kernel in the parameter's own dtype (norms, the embedding, no autocast) writes it
      // directly.
      const std::vector<std::vector<size_t>> ready_after = GradReadyAfter(module);
      for (size_t k = 0; k < module.backward.size(); ++k) {
        const ModuleKernel& kernel = module.backward[k];
        if (IsLossKernel(kernel)) continue;
        for (size_t p : ready_after[k]) {
          const ParamTensor& param = module.params[p];
          if (casts(param)) {
            b.Allocate(param_tensor("grad_lowp", module, param), param.numel * DTypeSize(ctx.compute_dtype), compute);
          } else {
            b.Allocate(grad(param), param.numel * master, compute);
          }
        }
        EmitBackwardRange(ctx, b, compute, module, k, k + 1);
        if (ready_after[k].empty()) continue;
        int64_t numel = 0, cast = 0;
        for (size_t p : ready_after[k]) {
          numel += module.params[p].numel;
          cast += casts(module.params[p]) ? module.params[p].numel : 0;
        }
        params_ready += static_cast<int64_t>(ready_after[k].size());
        // autocast's ToCopyBackward: the bf16 weight gradients become fp32.
        if (cast > 0) {
          for (size_t p : ready_after[k]) {
            if (casts(module.params[p])) b.Allocate(grad(module.params[p]), module.params[p].numel * master, compute);
          }
          b.MemoryKernel(compute, "autocast::to_copy_backward", cast * DTypeSize(ctx.compute_dtype), cast * master);
          for (size_t p : ready_after[k]) {
            if (casts(module.params[p])) b.Free(param_tensor("grad_lowp", module, module.params[p]));
          }
        }
        if (mb > 0) {
          b.MemoryKernel(compute, "AccumulateGrad", 2 * numel * master, numel * master);
          for (size_t p : ready_after[k]) b.Free(grad(module.params[p]));
        }
        if (!sync) continue;
        b.HostWork("DDP::autograd_hook", plan.host.hook_overhead_ns);
        b.MemoryKernel(compute, "DDP::copy_grad_to_bucket", numel * master, numel * master);
        while (next_bucket < buckets.size() && buckets[next_bucket].last_param < params_ready) {
          const std::string ready = fmt::format("bucket_ready.{}", next_bucket);
          b.Record(b.Event(ready), compute);
          b.Wait(nccl, b.Event(ready));
          b.Collective(nccl, "DDP::all_reduce", CollectiveType::kAllReduce, dp, buckets[next_bucket].bytes,
                       ctx.master_dtype);
          b.Record(b.Event(fmt::format("bucket_done.{}", next_bucket)), nccl);
          ++next_bucket;
        }
      }
      // The module's backward is done: autograd drops the saved weight casts.
      free_casts(module);
    }
    // Reducer::finalize_backward: for each bucket in order, wait for its all-reduce
    // (future_work->wait() makes the current stream wait), then copy the averaged bucket
    // back into .grad — so early buckets' copies overlap later all-reduces.
    b.SetModule("");
    for (size_t i = 0; sync && i < buckets.size(); ++i) {
      b.Wait(compute, b.Event(fmt::format("bucket_done.{}", i)));
      b.MemoryKernel(compute, "DDP::copy_bucket_to_grad", buckets[i].bytes, buckets[i].bytes);
    }
  }

  b.SetPhase(Phase::kOptimizer);
  b.SetMicroBatch(-1);
  // clip_grad_norm_ before the step: DDP gradients are replicated (all-reduced), so every
  // rank computes the same total norm locally — no collective.
  b.SetModule("");
  EmitClipGradNorm(ctx, b, compute, total_numel, /*sharded=*/false, dp);
  for (const ModuleKernels& module : ctx.modules) {
    EmitAdamWStep(ctx, b, compute, module.name, module.param_numel(), ctx.MasterBytes());
  }
  // zero_grad(set_to_none=True): every parameter's .grad is dropped.
  for (const ModuleKernels& module : ctx.modules) {
    for (const ParamTensor& param : module.params) b.Free(param_tensor("grad", module, param));
  }
  return b.Finish();
}

}  // namespace

StatusOr<LoweredPrograms> LowerDdp(const LoweringContext& ctx) {
  LoweredPrograms out;
  out.programs.push_back(LowerDdpProgram(ctx));
  return out;
}

}  // namespace shardscope::sim

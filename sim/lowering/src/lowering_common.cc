// Emitters every strategy lowering shares (lowering_internal.h).
#include <algorithm>
#include <cmath>
#include <charconv>
#include <string_view>

#include <fmt/format.h>

#include "lowering_internal.h"

namespace shardscope::sim {

DataParallelMesh MeshOf(const Plan& plan) {
  const int32_t world = plan.cluster.world_size();
  DataParallelMesh mesh;
  switch (plan.strategy) {
    case Strategy::kFsdp2: mesh = plan.fsdp2.mesh; break;
    case Strategy::kFsdp1: {
      mesh = plan.fsdp1.mesh;
      // Hybrid strategies without an explicit mesh shard within a node and replicate across
      // nodes (torch/distributed/fsdp/_init_utils.py _init_intra_and_inter_node_groups).
      const bool hybrid = plan.fsdp1.sharding_strategy == Fsdp1ShardingStrategy::kHybridShard ||
                          plan.fsdp1.sharding_strategy == Fsdp1ShardingStrategy::kHybridShardZero2;
      if (hybrid && mesh.shard < 1 && mesh.replicate <= 1) {
        mesh.shard = std::min(world, plan.cluster.gpus_per_node);
        mesh.replicate = world / mesh.shard;
      }
      break;
    }
    default: break;
  }
  if (mesh.replicate < 1) mesh.replicate = 1;
  if (mesh.shard < 1) mesh.shard = world / mesh.replicate;
  return mesh;
}

bool IsBlock(const ModuleKernels& module) { return module.name.rfind("layers.", 0) == 0; }

int32_t BlockIndex(const ModuleKernels& module) {
  if (!IsBlock(module)) return -1;
  const std::string_view digits = std::string_view(module.name).substr(7);
  int32_t index = -1;
  std::from_chars(digits.data(), digits.data() + digits.size(), index);
  return index;
}

bool IsExpertParam(const ParamTensor& param) {
  return param.name.rfind("feed_forward.experts.", 0) == 0;
}

int64_t DenseNumel(const ModuleKernels& module) {
  int64_t numel = 0;
  for (const ParamTensor& p : module.params) numel += IsExpertParam(p) ? 0 : p.numel;
  return numel;
}

int64_t LocalExpertNumel(const LoweringContext& ctx, const ModuleKernels& module) {
  int64_t numel = 0;
  for (const ParamTensor& p : module.params) numel += IsExpertParam(p) ? p.numel : 0;
  return numel / std::max<int32_t>(1, ctx.plan.moe.expert_parallel);
}

bool Checkpointed(const LoweringContext& ctx, const ModuleKernels& module) {
  if (!IsBlock(module)) return false;
  switch (ctx.plan.training.activation_checkpointing) {
    case ActivationCheckpointing::kNone: return false;
    case ActivationCheckpointing::kFull:
    case ActivationCheckpointing::kSelectiveOp: return true;
    case ActivationCheckpointing::kSelective: {
      // torchtitan apply_ac (torchtitan/models/llama3/infra/parallelize.py,
      // _apply_ac_to_transformer_block): layer SAC counts blocks from 1 and wraps a block in
      // checkpoint_wrapper when count % ac_freq == 0, i.e. block i when (i + 1) % k == 0.
      const int32_t k = std::max<int32_t>(1, ctx.plan.training.selective_ac_every);
      return (BlockIndex(module) + 1) % k == 0;
    }
  }
  return false;
}

ActivationMode ActivationModeOf(const LoweringContext& ctx, const ModuleKernels& module) {
  if (!Checkpointed(ctx, module)) return ActivationMode::kKeep;
  return ctx.plan.training.activation_checkpointing == ActivationCheckpointing::kSelectiveOp
             ? ActivationMode::kOpSelective
             : ActivationMode::kFullRecompute;
}

namespace {

// Expert parallelism (torchtitan/distributed/expert_parallel.py, ExpertParallel
// _token_dispatch / _token_combine): the routed tokens of this rank (tokens x top_k rows of
// hidden) go to the ranks holding their experts with all_to_all_single on the current
// stream, after a small all-to-all of the per-expert token counts whose result the host
// reads (.tolist() after a device-to-host copy: the host waits for the device).
bool ExpertParallel(const LoweringContext& ctx, const ModuleKernels& module) {
  return ctx.plan.moe.expert_parallel > 1 && IsBlock(module) && ctx.plan.model.experts > 1;
}

// The bytes of one dispatch or combine on this rank. Balanced: every rank sends and receives
// its T x top_k routed rows. A rank whose experts get `rank_load` times that receives (and, in
// the combine, sends back) that many more rows; the all-to-all's grouped send/recv is bounded
// by the larger of its send and receive sides, so a lightly loaded rank still moves its own
// rows (torchtitan ExpertParallel: all_to_all_single with input/output split sizes).
int64_t RoutedBytes(const LoweringContext& ctx) {
  const int64_t balanced = ctx.plan.training.micro_batch_size * ctx.plan.training.seq_len *
                           ctx.plan.model.experts_per_token * ctx.plan.model.hidden *
                           DTypeSize(ctx.compute_dtype);
  const double load = std::max(1.0, ctx.plan.moe.rank_load);
  return static_cast<int64_t>(std::llround(static_cast<double>(balanced) * load));
}

void EmitAllToAll(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex stream,
                  std::string_view name, bool with_splits) {
  const traces::CommSlot ep = b.Comm(kCommExpert);
  if (with_splits) {
    // num_tokens_per_expert: one int64 count per expert from every rank.
    b.Collective(stream, "MoE::all_to_all_splits", CollectiveType::kAllToAll, ep,
                 ctx.plan.model.experts * int64_t{8}, DType::kInt64);
    b.Memcpy(stream, "MoE::splits_to_host", traces::MemcpyKind::kDeviceToHost,
             ctx.plan.model.experts * int64_t{8});
    b.StreamSync("MoE::splits_tolist", stream);
  }
  b.Collective(stream, name, CollectiveType::kAllToAll, ep, RoutedBytes(ctx), ctx.compute_dtype);
}

}  // namespace

bool IsLossKernel(const ModuleKernel& kernel) { return kernel.name.rfind("loss.", 0) == 0; }

namespace {

bool InPart(const ModuleKernel& kernel, KernelPart part) {
  return part == KernelPart::kAll || (part == KernelPart::kLoss) == IsLossKernel(kernel);
}

size_t ModuleIndex(const LoweringContext& ctx, const ModuleKernels& module) {
  return static_cast<size_t>(&module - ctx.modules.data());
}

// One planned kernel: the host time of its issuer, its outputs allocated, the launch, the
// tensors whose last use it was freed.
void EmitPlanned(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex stream,
                 const ModuleKernel& kernel, const PlannedKernel& planned) {
  const HostConfig& host = ctx.plan.host;
  b.HostWork(kernel.dispatch == KernelDispatch::kPython ? "python op" : "aten op",
             kernel.dispatch == KernelDispatch::kPython ? host.python_op_overhead_ns : host.cpp_op_overhead_ns);
  for (const auto& [tensor, bytes] : planned.allocs) b.Allocate(tensor, bytes, stream);
  b.Kernel(stream, kernel.name, kernel.compute);
  for (const std::string& tensor : planned.frees) b.Free(tensor);
}

void EmitForwardPlanned(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex stream,
                        const ModuleKernels& module, const PlannedKernel& planned) {
  const ModuleKernel& kernel = module.forward[static_cast<size_t>(planned.index)];
  const bool ep = ExpertParallel(ctx, module);
  if (ep && kernel.name == "moe.unpermute") EmitAllToAll(ctx, b, stream, "MoE::combine", false);
  EmitPlanned(ctx, b, stream, kernel, planned);
  if (ep && kernel.name == "moe.permute") EmitAllToAll(ctx, b, stream, "MoE::dispatch", true);
}

void EmitBackwardPlanned(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex stream,
                         const ModuleKernels& module, const PlannedKernel& planned) {
  // Autograd runs the all-to-alls' backward: the combine's gradient goes back to the expert
  // ranks after unpermute's backward, the dispatch's after the experts' backward.
  const ModuleKernel& kernel = module.backward[static_cast<size_t>(planned.index)];
  const bool ep = ExpertParallel(ctx, module);
  if (ep && kernel.name == "moe.permute.bwd") EmitAllToAll(ctx, b, stream, "MoE::dispatch.bwd", false);
  EmitPlanned(ctx, b, stream, kernel, planned);
  if (ep && kernel.name == "moe.unpermute.bwd") EmitAllToAll(ctx, b, stream, "MoE::combine.bwd", false);
}

}  // namespace

void EmitForwardKernels(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex stream,
                        const ModuleKernels& module, KernelPart part) {
  for (const PlannedKernel& planned : ctx.activations->Of(ModuleIndex(ctx, module)).forward) {
    if (InPart(module.forward[static_cast<size_t>(planned.index)], part)) EmitForwardPlanned(ctx, b, stream, module, planned);
  }
}

void EmitForwardRange(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex stream,
                      const ModuleKernels& module, size_t begin, size_t end) {
  for (const PlannedKernel& planned : ctx.activations->Of(ModuleIndex(ctx, module)).forward) {
    const auto k = static_cast<size_t>(planned.index);
    if (k >= begin && k < end) EmitForwardPlanned(ctx, b, stream, module, planned);
  }
}

void EmitRecompute(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex stream,
                   const ModuleKernels& module, size_t begin, size_t end) {
  for (const PlannedKernel& planned : ctx.activations->Of(ModuleIndex(ctx, module)).recompute) {
    const auto k = static_cast<size_t>(planned.index);
    if (k >= begin && k < end) EmitForwardPlanned(ctx, b, stream, module, planned);
  }
}

void EmitBackwardKernels(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex stream,
                         const ModuleKernels& module, KernelPart part) {
  if (part != KernelPart::kLoss) EmitRecompute(ctx, b, stream, module);
  for (const PlannedKernel& planned : ctx.activations->Of(ModuleIndex(ctx, module)).backward) {
    if (InPart(module.backward[static_cast<size_t>(planned.index)], part)) {
      EmitBackwardPlanned(ctx, b, stream, module, planned);
    }
  }
}

void EmitBackwardRange(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex stream,
                       const ModuleKernels& module, size_t begin, size_t end) {
  for (const PlannedKernel& planned : ctx.activations->Of(ModuleIndex(ctx, module)).backward) {
    const auto k = static_cast<size_t>(planned.index);
    if (k >= begin && k < end) EmitBackwardPlanned(ctx, b, stream, module, planned);
  }
}

std::vector<std::vector<size_t>> GradReadyAfter(const ModuleKernels& module) {
  std::vector<std::vector<size_t>> ready(module.backward.size());
  if (module.backward.empty()) return ready;
  const auto ends_with = [](const std::string& s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  size_t next = module.params.size();  // params are consumed from the back
  for (size_t k = 0; k < module.backward.size(); ++k) {
    const ModuleKernel& kernel = module.backward[k];
    if (!kernel.weight_grad) continue;
    if (ends_with(kernel.name, ".wgrad") && !ends_with(kernel.name, ".rem.wgrad")) {
      const auto* gemm = std::get_if<traces::GemmDesc>(&kernel.compute);
      if (gemm == nullptr) continue;
      const int64_t weight_elements = gemm->m * gemm->n * gemm->batch;
      int64_t consumed = 0;
      while (next > 0 && consumed < weight_elements && module.params[next - 1].matmul) {
        --next;
        consumed += module.params[next].numel;
        ready[k].push_back(next);
      }
    } else if (kernel.name.find("norm") != std::string::npos) {
      while (next > 0 && !module.params[next - 1].matmul && !IsExpertParam(module.params[next - 1]) &&
             module.params[next - 1].name.find("norm") != std::string::npos) {
        --next;
        ready[k].push_back(next);
      }
    }
  }
  while (next > 0) ready.back().push_back(--next);
  return ready;
}

void EmitLossForward(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex stream) {
  b.SetModule(ctx.modules.back().name);
  EmitForwardKernels(ctx, b, stream, ctx.modules.back(), KernelPart::kLoss);
}

void EmitLossBackward(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex stream) {
  b.SetModule(ctx.modules.back().name);
  EmitBackwardKernels(ctx, b, stream, ctx.modules.back(), KernelPart::kLoss);
}

void EmitAdamW(ProgramBuilder& b, traces::StreamIndex stream, int64_t numel, int64_t state_bytes) {
  // torch/optim/adamw.py (_fused_adamw, one multi-tensor kernel): reads param, grad, exp_avg,
  // exp_avg_sq and writes param, exp_avg, exp_avg_sq (all in the parameters' dtype: the
  // moments are zeros_like(param)).
  b.MemoryKernel(stream, "optimizer.adamw", 4 * state_bytes * numel, 3 * state_bytes * numel);
}

void AllocateOptimizerState(ProgramBuilder& b, traces::StreamIndex stream, const std::string& name, int64_t bytes) {
  for (const char* state : {"param_shard.", "exp_avg.", "exp_avg_sq."}) b.Allocate(state + name, bytes, stream);
}

void EmitAdamWStep(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex stream,
                   const std::string& module, int64_t numel, int64_t state_bytes) {
  b.SetModule(module);
  b.HostWork("python op", ctx.plan.host.python_op_overhead_ns);
  EmitAdamW(b, stream, numel, state_bytes);
}

void EmitClipGradNorm(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex stream,
                      int64_t grad_numel, bool sharded, traces::CommSlot comm) {
  if (ctx.plan.training.max_grad_norm <= 0) return;
  // torch/nn/utils/clip_grad.py clip_grad_norm_: _get_total_norm (foreach_norm over the
  // gradients, then the norm of the norms) and _clip_grads_with_norm_ (foreach_mul_ by the
  // clamped coefficient): no host sync. With DTensor gradients (FSDP2) the total norm is a
  // partial sum: full_tensor() all-reduces it (torchtitan dist_utils.clip_grad_norm_).
  b.HostWork("python op", ctx.plan.host.python_op_overhead_ns);
  const int64_t grad_bytes = grad_numel * ctx.MasterBytes();
  b.MemoryKernel(stream, "clip_grad_norm.foreach_norm", grad_bytes, 0);
  if (sharded) {
    b.Collective(stream, "clip_grad_norm.all_reduce", CollectiveType::kAllReduce, comm, kFp32Bytes,
                 DType::kFloat32);
  }
  b.HostWork("python op", ctx.plan.host.python_op_overhead_ns);
  b.MemoryKernel(stream, "clip_grad_norm.foreach_mul", grad_bytes, grad_bytes);
}

void EmitOptimizerStateConsolidation(const LoweringContext& ctx, ProgramBuilder& b,
                                     traces::StreamIndex stream,
                                     const std::vector<ConsolidationUnit>& units, bool is_rank0) {
  if (!ctx.plan.checkpoint.consolidate_optimizer_state) return;
  b.SetPhase(traces::Phase::kCheckpoint);
  b.SetMicroBatch(-1);
  const traces::CommSlot world = b.Comm(kCommWorld);
  for (const ConsolidationUnit& unit : units) {
    b.SetModule(unit.name);
    const int64_t state_bytes = unit.shard_numel * ctx.MasterBytes();
    if (unit.expert && ctx.plan.checkpoint.no_broadcast_optim_state) {
      // _remove_uncollectable_params_from_optim_state_dict: rank 0 moves its own state of
      // the instance to the CPU; nothing is communicated.
      if (is_rank0) {
        for (const char* state : {"exp_avg", "exp_avg_sq"}) {
          b.Memcpy(stream, fmt::format("consolidate.{}.to_cpu", state), traces::MemcpyKind::kDeviceToHost,
                   state_bytes);
        }
        b.StreamSync("consolidate.cpu_copy", stream);
      }
      continue;
    }
    // An expert instance that is broadcast: every rank's experts differ, so the state is
    // gathered from the whole world.
    const traces::CommSlot comm = unit.expert ? world : unit.comm;
    const int32_t group = unit.expert ? ctx.world_size : unit.group_size;
    const int64_t full_bytes = state_bytes * group;
    b.Allocate("consolidate.buffer." + unit.name, full_bytes, stream);
    for (const char* state : {"exp_avg", "exp_avg_sq"}) {
      b.HostWork("python op", ctx.plan.host.python_op_overhead_ns);
      b.Collective(stream, fmt::format("consolidate.all_gather.{}", state), CollectiveType::kAllGather, comm,
                   full_bytes, DType::kFloat32);
      if (is_rank0) {
        b.Memcpy(stream, fmt::format("consolidate.{}.to_cpu", state), traces::MemcpyKind::kDeviceToHost,
                 full_bytes);
        b.StreamSync("consolidate.cpu_copy", stream);
      }
    }
    b.Free("consolidate.buffer." + unit.name);
  }
}

}  // namespace shardscope::sim

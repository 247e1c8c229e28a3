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
//
// This file: the helpers every stage shares (lowering_zero_internal.h) and LowerZero, which
// picks the stage's lowering: lowering_zero12.cc (ZeRO-1/2), lowering_zero3.cc (ZeRO-3's
// forward, backward, gradient reduction and step) with its parameter coordinator in
// lowering_zero3_coordinator.cc.
#include <map>
#include <string>
#include <vector>

#include "lowering_zero_internal.h"

namespace shardscope::sim {

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
StatusOr<LoweredPrograms> LowerZero(const LoweringContext& ctx) {
  if (ctx.plan.moe.expert_parallel > 1) {
    return Status::InvalidInput(std::string("strategy ") + std::string(StrategyName(ctx.plan.strategy)) +
                                " is not lowered with moe.expert_parallel > 1");
  }
  LoweredPrograms out;
  switch (ctx.plan.strategy) {
    case Strategy::kZero1:
    case Strategy::kZero2: out.programs.push_back(LowerZero12(ctx)); break;
    case Strategy::kZero3: out.programs.push_back(LowerZero3(ctx)); break;
    default:
      return Status::Internal(std::string("LowerZero called for strategy ") +
                              std::string(StrategyName(ctx.plan.strategy)));
  }
  return out;
}

}  // namespace shardscope::sim

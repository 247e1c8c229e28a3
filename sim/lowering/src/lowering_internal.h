// What the strategy lowerings share: the context, the communicator slot names LowerPlan
// binds, and the emitters for work every strategy issues the same way (a module's forward and
// backward kernels with activation checkpointing and MoE all-to-alls, AdamW, gradient
// clipping, the checkpoint's optimizer-state consolidation). Private to sim/.
//
// One strategy per file (lowering_<strategy>.cc); each cites, beside the code, the framework
// file and function whose behaviour it encodes.
#ifndef SHARDSCOPE_SIM_LOWERING_INTERNAL_H_
#define SHARDSCOPE_SIM_LOWERING_INTERNAL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "activation_plan.h"
#include "program_builder.h"
#include "shardscope/sim/presets/model.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/traces/schedule.h"
#include "shardscope/base/status.h"

namespace shardscope::sim {

// The schedule IR's names every lowering file spells often (this header is private to
// sim/lowering, so the shorthand stays inside the stage).
using traces::CollectiveType;
using traces::DType;
using traces::DTypeSize;
using traces::Phase;

inline constexpr int64_t kFp32Bytes = 4;

struct LoweringContext {
  const Plan& plan;
  std::vector<ModuleKernels> modules;  // forward order: embed, layers.0 .. layers.{L-1}, head
  int32_t world_size = 1;
  traces::DType compute_dtype = traces::DType::kBFloat16;  // activations and GEMM inputs
  // Where each activation is allocated and freed (one micro-batch; the emitters below).
  std::shared_ptr<const ActivationPlan> activations;
  // The parameters' own dtype, which their gradients and AdamW's moments share: fp32 under
  // mixed precision, bf16 under training.precision pure_bf16.
  traces::DType master_dtype = traces::DType::kFloat32;
  int64_t MasterBytes() const { return traces::DTypeSize(master_dtype); }
};

// Communicator slots. A program names the groups it uses; LowerPlan binds each rank's slot
// to that rank's group (schedule.h RankBinding):
inline constexpr char kCommWorld[] = "dp";             // every rank
inline constexpr char kCommShard[] = "dp_shard";       // the rank's shard group of the mesh
                                                       // (consecutive ranks)
inline constexpr char kCommReplicate[] = "dp_replicate";  // ranks with the same shard index
inline constexpr char kCommExpert[] = "ep";            // expert-parallel group (consecutive)
inline constexpr char kCommExpertData[] = "ep_dp";     // ranks holding the same experts
// FSDP2 reshard_after_forward=k: the consecutive groups of k ranks inside a shard group that
// hold the post-forward slice (the backward all-gather runs over this group).
inline constexpr char kCommPostForward[] = "dp_post_forward";
// DeepSpeed's engine data-parallel group: every rank again, but a process group of its own
// (engine.py _configure_distributed_model -> zero/utils.py _initialize_parameter_parallel_groups
// -> torch.distributed.new_group), so its own NCCL communicator. Only the 2021 ZeRO-3 lowering
// (zero.legacy_per_parameter_path) tells it apart from WORLD's kCommWorld.
inline constexpr char kCommEngineDp[] = "dp_engine";

// The programs a strategy produces; rank r runs programs[program_of_rank[r]] (all run
// program 0 when program_of_rank is empty).
struct LoweredPrograms {
  std::vector<traces::Program> programs;
  std::vector<int32_t> program_of_rank;
};

// The mesh a strategy uses: (replicate, shard) with shard * replicate == world size.
// LowerPlan builds the dp_shard / dp_replicate groups from it.
DataParallelMesh MeshOf(const Plan& plan);

StatusOr<LoweredPrograms> LowerFsdp2(const LoweringContext& ctx);
StatusOr<LoweredPrograms> LowerFsdp1(const LoweringContext& ctx);
StatusOr<LoweredPrograms> LowerZero(const LoweringContext& ctx);  // zero1, zero2, zero3
StatusOr<LoweredPrograms> LowerDdp(const LoweringContext& ctx);

// ---- Modules -----------------------------------------------------------------------------

bool IsBlock(const ModuleKernels& module);       // "layers.<i>"
int32_t BlockIndex(const ModuleKernels& module);  // i for "layers.<i>", -1 otherwise

// Expert parameters ("feed_forward.experts.*"): split over the expert-parallel group and
// data-parallel over kCommExpertData, outside the dense shard.
bool IsExpertParam(const ParamTensor& param);
int64_t DenseNumel(const ModuleKernels& module);
// The expert parameters this rank holds: all experts' / moe.expert_parallel.
int64_t LocalExpertNumel(const LoweringContext& ctx, const ModuleKernels& module);

// Whether the module's forward runs under torch.utils.checkpoint (full: every block;
// selective: every selective_ac_every-th block, torchtitan's layer SAC; selective_op: every
// block, with torchtitan's op-level policy).
bool Checkpointed(const LoweringContext& ctx, const ModuleKernels& module);
ActivationMode ActivationModeOf(const LoweringContext& ctx, const ModuleKernels& module);

// The loss (the logits' upcast and the cross-entropy, kernels named "loss.*") is computed
// outside the model's forward: torchtitan's train.py forward_backward_step runs
// `pred = model(inputs)` and then `loss_fn(pred, labels)`, so the FSDP post-forward hooks
// fire before the loss kernels, and the pre-backward hooks (registered on `pred`) after the
// loss's backward. Strategies that model hooks emit the head in two parts.
enum class KernelPart : uint8_t { kAll, kModel, kLoss };
bool IsLossKernel(const ModuleKernel& kernel);
// The loss's forward after the model's (tagged with the last module, the head), and its
// backward before the model's.
void EmitLossForward(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex stream);
void EmitLossBackward(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex stream);

// Forward kernels of one module on `stream` (those of `part`, or forward[begin, end)), each
// with the host time its issuer spends (a Python op, or an ATen op from C++) and the
// allocations and frees of ActivationPlan around it; with expert parallelism, the token
// dispatch and combine all-to-alls on the kCommExpert slot around the expert GEMMs.
void EmitForwardKernels(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex stream,
                        const ModuleKernels& module, KernelPart part = KernelPart::kAll);
void EmitForwardRange(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex stream,
                      const ModuleKernels& module, size_t begin, size_t end);
// A checkpointed module's recompute of forward[begin, end) (nothing for other modules): the
// forward kernels again (op-level selective checkpointing skips the ops whose outputs it kept).
void EmitRecompute(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex stream,
                   const ModuleKernels& module, size_t begin = 0, size_t end = SIZE_MAX);
// Backward kernels (from the C++ autograd engine), after the recompute when checkpointed (the
// loss part never is); MoE all-to-alls as in forward.
void EmitBackwardKernels(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex stream,
                         const ModuleKernels& module, KernelPart part = KernelPart::kAll);
// backward[begin, end) only (no recompute), for strategies that interleave hooks.
void EmitBackwardRange(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex stream,
                       const ModuleKernels& module, size_t begin, size_t end);

// Which parameters' gradients are complete after each backward kernel of `module`:
// result[k] lists indices into module.params whose gradient the k-th backward kernel
// finishes (autograd's AccumulateGrad runs right after the kernel producing the gradient;
// DDP's and ZeRO's per-parameter hooks fire there). Matched from the kernels that write
// weight gradients (ModuleKernel::weight_grad): a "*.wgrad" GEMM completes the linear
// parameters (weights and biases, walking the parameter list backwards) whose weight elements
// make up its m x n x batch output; a norm's weight reduction the norm's parameters. Anything
// not matched (embeddings, tied weights) completes with the module's last backward kernel.
std::vector<std::vector<size_t>> GradReadyAfter(const ModuleKernels& module);

// ---- Optimizer step ------------------------------------------------------------------------

// AdamW over `numel` parameters of `state_bytes` each (with their gradient and two moments in
// the same dtype): one multi-tensor kernel.
void EmitAdamW(ProgramBuilder& b, traces::StreamIndex stream, int64_t numel, int64_t state_bytes);

// The optimizer state of one parameter shard that lives across steps: its master copy
// ("param_shard.<name>") and AdamW's two moments ("exp_avg.<name>", "exp_avg_sq.<name>"),
// `bytes` each.
void AllocateOptimizerState(ProgramBuilder& b, traces::StreamIndex stream, const std::string& name, int64_t bytes);

// The step over one module's (or FSDP unit's) parameters, tagged with it: the Python op of
// the optimizer's per-group loop, then EmitAdamW.
void EmitAdamWStep(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex stream,
                   const std::string& module, int64_t numel, int64_t state_bytes);

// clip_grad_norm_(max_norm) over the rank's `grad_numel` fp32 gradients: a norm kernel, the
// all-reduce of the squared norm over `comm` when gradients are sharded (`sharded`), and the
// scaling kernel. Nothing when training.max_grad_norm is 0.
void EmitClipGradNorm(const LoweringContext& ctx, ProgramBuilder& b, traces::StreamIndex stream,
                      int64_t grad_numel, bool sharded, traces::CommSlot comm);

// checkpoint.consolidate_optimizer_state, as fairscale's FSDP.gather_full_optim_state_dict
// (fairscale/nn/data_parallel/fully_sharded_data_parallel.py, _gather_optim_state): after the
// step, for every FSDP instance, each AdamW state tensor (fp32 exp_avg, exp_avg_sq) is
// all-gathered into a full-size buffer that every rank allocates, and rank 0 copies the
// gathered chunks to the CPU (synchronous .cpu()). Expert instances marked
// no_broadcast_optim_state are left out; rank 0 copies only its own expert state.
struct ConsolidationUnit {
  std::string name;
  int64_t shard_numel = 0;   // this rank's parameters of the instance
  traces::CommSlot comm = 0; // the group the instance is sharded or replicated over
  int32_t group_size = 1;
  bool expert = false;       // subject to checkpoint.no_broadcast_optim_state
};
void EmitOptimizerStateConsolidation(const LoweringContext& ctx, ProgramBuilder& b,
                                     traces::StreamIndex stream,
                                     const std::vector<ConsolidationUnit>& units, bool is_rank0);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_LOWERING_INTERNAL_H_

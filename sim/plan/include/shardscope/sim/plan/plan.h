// The plan file: what a user's training job does, in YAML.
//
//   model: llama3-8b                      # a preset, or a mapping of dimensions
//   cluster: {preset: dgx-a100, nodes: 8} # optional overrides of any hardware figure
//   strategy: fsdp2                       # fsdp2 | fsdp1 | zero1 | zero2 | zero3 | ddp
//   training: {seq_len: 8192, micro_batch_size: 1, grad_accum_steps: 1,
//              activation_checkpointing: none, dtype: bf16}
//   fsdp2: {reshard_after_forward: true}  # one section per strategy, framework knob names
//   ddp: {bucket_cap_mb: 25}              # (fsdp1:, zero:, ddp:), plus moe: and checkpoint:
//   host: {launch_overhead_us: ..., hook_overhead_us: ...}
//   oom: {policy: raise | catch_and_sync, sync_hooks: false}
//
// Unknown keys, wrong types and impossible values are errors naming the file, line, key and
// what was expected. A plan may take values from the job's own config files:
// `model: {hf_config: config.json}`, `zero: {deepspeed_config: ds_config.json}` and
// `torchtitan: {job_config: job.toml}` (paths relative to the plan; docs/PLAN.md).
#ifndef SHARDSCOPE_SIM_PLAN_H_
#define SHARDSCOPE_SIM_PLAN_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardscope/sim/models/caching_allocator.h"
#include "shardscope/sim/models/cost_provider.h"
#include "shardscope/sim/presets/hardware.h"
#include "shardscope/sim/presets/model.h"
#include "shardscope/traces/schedule.h"
#include "shardscope/base/status.h"

namespace shardscope::sim {

enum class Strategy : uint8_t { kFsdp2, kDdp, kFsdp1, kZero1, kZero2, kZero3 };
std::string_view StrategyName(Strategy strategy);  // "fsdp2", "ddp", "fsdp1", "zero1", ...

// none: every activation saved. full: torch.utils.checkpoint around every transformer block.
// selective: torchtitan's layer-level selective AC, a checkpoint around every k-th block
// (training.selective_ac_every, torchtitan's selective_ac_option default "2"). selective_op:
// torchtitan's op-level selective AC (selective_ac_option "op", its llama3_8b.toml): every block
// checkpointed, the outputs of every other matmul and of attention kept.
enum class ActivationCheckpointing : uint8_t { kNone, kFull, kSelective, kSelectiveOp };

// training.attention: what runs scaled-dot-product attention. sdpa: PyTorch's dispatch for the
// GPU and training.pytorch_version; eager: the unfused matmul-softmax-matmul.
enum class AttentionChoice : uint8_t { kSdpa, kFlash2, kFlash3, kCudnn, kMemEfficient, kEager };

// How parameters, gradients and optimizer states are stored.
enum class Precision : uint8_t {
  kMixed,     // fp32 master parameters, gradients and Adam states; compute in training.dtype
  kPureBf16,  // everything bf16, no fp32 master copy (torchtune's default: its recipes say
              // "all activations, gradients and optimizer states are in bfloat16")
};

// Where the model's parameters are created before the framework wraps it (training.init.device):
// on the CPU (a plain `Model(config)`), on the GPU (`with torch.device("cuda")` or `.cuda()`
// before wrapping) or on the meta device (no storage; the framework materializes what it keeps:
// torchtitan's fully_shard + model.to_empty, FSDP1's param_init_fn).
enum class InitDevice : uint8_t { kCpu, kCuda, kMeta };

struct TrainingConfig {
  int64_t seq_len = 2048;
  int64_t micro_batch_size = 1;
  int32_t grad_accum_steps = 1;
  ActivationCheckpointing activation_checkpointing = ActivationCheckpointing::kNone;
  int32_t selective_ac_every = 2;   // selective: blocks whose (index + 1) % k == 0 are checkpointed
  traces::DType dtype = traces::DType::kBFloat16;
  double max_grad_norm = 1.0;       // clip_grad_norm_ (torchtitan max_norm 1.0); 0 = no clipping
  Precision precision = Precision::kMixed;
  // The PyTorch release (major.minor) and the framework's model code: they decide the kernels
  // a block launches (model.h KernelChoices). Defaults: the newest release modelled, and the
  // strategy's usual framework (fsdp2: torchtitan; the others: transformers).
  int32_t pytorch_major = 2, pytorch_minor = 11;
  std::optional<ModelImplementation> implementation;
  bool compile = false;             // torch.compile per block and on the loss (torchtitan's knob)
  AttentionChoice attention = AttentionChoice::kSdpa;
  std::optional<RmsNormKernel> rms_norm;  // unset: what nn.RMSNorm / LlamaRMSNorm run
  KernelChoices kernels;            // resolved by the loader from the fields above
  // training.cuda_version: the CUDA under PyTorch; resolved by the loader to the CUDA of the
  // release's default wheel when not given (presets/cuda_runtime.h DefaultCudaForPytorch).
  int32_t cuda_major = 0, cuda_minor = 0;
  // training.init.device; unset: the strategy's usual setup (InitDeviceOf).
  std::optional<InitDevice> init_device;
};

// The 2-D data-parallel device mesh (replicate, shard). Ranks r*shard .. r*shard+shard-1 form
// shard group r (consecutive ranks: NVLink first); ranks with equal r % shard form a
// replicate group. replicate == 1: plain FSDP; HSDP otherwise.
struct DataParallelMesh {
  int32_t replicate = 1;
  int32_t shard = 0;                // 0 until resolved by the loader: world_size / replicate
};

// FSDP2's reshard_after_forward: True / False / an int (reshard to a smaller world of that
// many ranks after forward) / None (True except the root, which keeps its parameters).
enum class ReshardAfterForward : uint8_t { kTrue, kFalse, kInt, kNone };

// When gradients are reduced under gradient accumulation.
enum class GradientSync : uint8_t {
  kEveryMicroBatch,  // reduce-scatter every micro-batch, accumulate sharded gradients
  kLastMicroBatch,   // set_requires_gradient_sync(False) / no_sync() until the last one:
                     // unsharded gradients kept between micro-batches
};

// torch.distributed.fsdp.fully_shard knobs (the names fully_shard uses).
struct Fsdp2Config {
  ReshardAfterForward reshard_after_forward = ReshardAfterForward::kTrue;
  int32_t reshard_after_forward_size = 0;  // kInt: the int given
  // Explicit prefetch (set_modules_to_forward_prefetch / _backward_prefetch): a count of
  // units ahead for every unit, or per-unit lists of unit names (the lists win for the units
  // they name). forward_prefetch 0 = implicit prefetch only; backward_prefetch 1 = default.
  int32_t forward_prefetch = 0;
  int32_t backward_prefetch = 1;
  std::map<std::string, std::vector<std::string>> forward_prefetch_units;
  std::map<std::string, std::vector<std::string>> backward_prefetch_units;
  // MixedPrecisionPolicy, resolved by the loader: the plan's defaults are torchtitan's
  // (param_dtype = training.dtype, fp8 training keeps bf16 params; reduce_dtype fp32);
  // `null` means None in the policy (param: fp32, no cast; reduce: param_dtype).
  traces::DType param_dtype = traces::DType::kBFloat16;
  traces::DType reduce_dtype = traces::DType::kFloat32;
  DataParallelMesh mesh;            // HSDP when mesh.replicate > 1
  GradientSync requires_gradient_sync = GradientSync::kEveryMicroBatch;
  // With kLastMicroBatch: blocks whose index % k == 0 still reduce every micro-batch
  // (set_requires_gradient_sync per block); 0 = none do.
  int32_t gradient_sync_every_k_blocks = 0;
  bool requires_all_reduce = true;  // HSDP: all-reduce across replicas on every reduction
  bool reshard_after_backward = true;
  // Wrap granularity: fully_shard on groups of `blocks_per_unit` blocks (1 = every block);
  // root_only: one fully_shard on the whole model.
  int32_t blocks_per_unit = 1;
  bool root_only = false;
};

// torch.distributed.fsdp.FullyShardedDataParallel (FSDP1) and fairscale's FSDP.
enum class Fsdp1ShardingStrategy : uint8_t {
  kFullShard, kShardGradOp, kNoShard, kHybridShard, kHybridShardZero2};
enum class Fsdp1BackwardPrefetch : uint8_t { kBackwardPre, kBackwardPost, kNone };
enum class Fsdp1Implementation : uint8_t { kTorch, kFairscale };

struct Fsdp1Config {
  Fsdp1ShardingStrategy sharding_strategy = Fsdp1ShardingStrategy::kFullShard;
  Fsdp1BackwardPrefetch backward_prefetch = Fsdp1BackwardPrefetch::kBackwardPre;
  bool forward_prefetch = false;
  bool limit_all_gathers = true;
  bool no_sync = false;             // no_sync() around every micro-batch but the last
  // MixedPrecision(param_dtype, reduce_dtype), resolved like Fsdp2Config's.
  traces::DType param_dtype = traces::DType::kBFloat16;
  traces::DType reduce_dtype = traces::DType::kFloat32;
  DataParallelMesh mesh;            // hybrid strategies: shard = gpus_per_node by default
  Fsdp1Implementation implementation = Fsdp1Implementation::kTorch;
  // fairscale only: fp32 gradients accumulated per parameter and concatenated (false, the
  // old way) or accumulated into slices of one flat fp32 buffer (true).
  bool optimize_backward_concat = false;
  // fairscale only: ReduceScatterBucketer's bucket_cap_mb (FSDP's default 25): gradient
  // shards smaller than bucket_cap_mb / 4 B / world elements are batched into one bucket
  // per group; 0 disables bucketing.
  double bucket_cap_mb = 25;
  // FullyShardedDataParallel(sync_module_states=..., device_id=...) (torch FSDP1 defaults: False,
  // None): broadcast rank 0's unit states at construction, and move each unit to the GPU before
  // flattening and sharding it (without device_id a CPU module is sharded on the CPU).
  bool sync_module_states = false;
  bool device_id = false;
};

// DeepSpeed ZeRO (runtime/zero/config.py names; sizes in elements).
struct ZeroConfig {
  int64_t reduce_bucket_size = 500'000'000;
  int64_t allgather_bucket_size = 500'000'000;
  bool overlap_comm = false;        // resolved by the loader: DeepSpeed's default is true for
                                    // stage 3 only
  bool contiguous_gradients = true;
  int64_t stage3_prefetch_bucket_size = 50'000'000;
  int64_t stage3_max_live_parameters = 1'000'000'000;
  int64_t stage3_max_reuse_distance = 1'000'000'000;
  int64_t stage3_param_persistence_threshold = 100'000;
  // The 2021 ZeRO-3 behaviours, to reproduce the slow runs and show the fix.
  bool legacy_prefetch_off_by_one = false;          // trace step ids off by one: no prefetch
  bool legacy_stream_sync_in_fetch_release = false;// cudaStreamSynchronize in fetch and release
  bool legacy_debug_norm_sync = false;             // a debug string's tensor.norm() per fetch
  bool legacy_reduce_per_rank = false;             // stages 1/2: a device synchronize, then a
                                                   // dist.reduce per owning rank per bucket
  bool legacy_per_parameter_path = false;          // the 2021 per-parameter code: an all_gather
                                                   // per parameter after a torch.cuda.synchronize(),
                                                   // a reduce_scatter per parameter, two host
                                                   // syncs per parameter in the step
  // The model is built under deepspeed.zero.Init (stage 3): parameters are partitioned as each
  // module is constructed, so the full model never exists on one GPU.
  bool zero_init = false;
};

// torch.nn.parallel.DistributedDataParallel knobs.
struct DdpConfig {
  double bucket_cap_mb = 25;        // kDefaultBucketBytesCap (torch/nn/parallel/distributed.py)
  double first_bucket_mb = 1;       // dist._DEFAULT_FIRST_BUCKET_BYTES when bucket_cap_mb is
                                    // not given; bucket_cap_mb when it is
  bool no_sync = false;             // no_sync() around every micro-batch but the last
};

// Mixture of experts: experts split over an expert-parallel group of consecutive ranks,
// tokens dispatched and combined with all-to-alls; expert parameters are data-parallel over
// the ranks holding the same experts (world_size / expert_parallel), outside the dense shard.
struct MoeConfig {
  int32_t expert_parallel = 1;
  // The tokens this rank's experts receive, relative to the balanced average (routing
  // imbalance). Set only on a divergence variant (divergence.moe_load); 1 everywhere else.
  double rank_load = 1;
};

// After the step: the optimizer state consolidated on rank 0 for a checkpoint
// (fairscale FSDP.gather_full_optim_state_dict / torch FSDP.full_optim_state_dict).
struct CheckpointConfig {
  bool consolidate_optimizer_state = false;
  bool no_broadcast_optim_state = false;  // fairscale: expert state stays on its rank
};

// The CUDA caching allocator the job runs with, and what else holds device memory.
//   allocator: {conf: "expandable_segments:True", memory_fraction: 1.0,
//               memory_reserved_by_others_gb: 0.5,
//               memory_reserved_by_others_gb_per_rank: {3: 12.0}}
struct MemoryPlan {
  std::string alloc_conf;                 // PYTORCH_CUDA_ALLOC_CONF
  AllocatorConfig allocator;              // parsed from alloc_conf, plus memory_fraction
  int64_t reserved_by_others_bytes = 0;   // device memory other processes hold, every rank
  std::map<int32_t, int64_t> reserved_by_others_per_rank;  // overrides for some ranks
};

// What a rank does when it runs out of device memory.
//   oom: {policy: catch_and_sync, sync_hooks: true}
enum class OomPolicy : uint8_t {
  kRaise,         // torch.OutOfMemoryError is not caught: the rank leaves, its peers hang in
                  // their next collective with it (the default)
  kCatchAndSync,  // Composer's automicrobatching (composer/trainer/trainer.py
                  // Trainer._train_batch): the OOM is caught and the rank all-reduces an OOM
                  // flag so every rank agrees, then all retry with a smaller micro-batch
};

struct OomConfig {
  OomPolicy policy = OomPolicy::kRaise;
  // Composer's FSDP sync hooks (trainer.py _create_sync_hook / _readd_fsdp_sync_hooks and
  // composer/trainer/_patch_pytorch.py unshard_with_sync): an all_reduce MAX of an OOM flag,
  // then an all_reduce MIN of an "all ranks finished" flag, before every FSDP module's
  // forward and backward, after a module's backward, and right after the unshard's
  // allocation. FSDP1 with catch_and_sync only.
  bool sync_hooks = false;
};

struct Plan;

// Ranks whose step differs from the others': the sources of divergence `shardscope check`
// looks for (issue 5). A rank may appear in several maps but in at most one override.
//   divergence:
//     slowdown: {3: 1.5}     # a straggler: rank 3's kernels and copies take 1.5x as long
//     seq_len: {5: 12288}    # variable-length batches: rank 5's sequences are 12288 long
//     moe_load: {2: 1.8}     # routing imbalance (expert parallel): rank 2's experts get 1.8x
//                            # the balanced number of tokens
//     overrides:             # ranks that run a different plan (order or size divergence)
//       - {ranks: [3], fsdp2: {backward_prefetch: 0}}
//       - {ranks: [5], training: {grad_accum_steps: 3}}
// Device memory held by other processes on some ranks is allocator.
// memory_reserved_by_others_gb_per_rank.
struct RankVariant {
  std::vector<int32_t> ranks;       // ascending
  std::string description;          // "training.seq_len 12288", "fsdp2 {backward_prefetch: 0}"
  std::shared_ptr<const Plan> plan; // the whole plan these ranks run (no divergence of its own)
};

struct DivergenceConfig {
  std::map<int32_t, double> slowdown;   // rank -> factor on its kernel and copy durations
  std::vector<RankVariant> variants;    // disjoint rank sets, in order of their first rank
  bool empty() const { return slowdown.empty() && variants.empty(); }
};

struct Plan {
  std::string source;               // file the plan came from (for messages)
  ModelSpec model;
  ClusterSpec cluster;
  ContentionConfig contention;
  Strategy strategy = Strategy::kFsdp2;
  TrainingConfig training;
  Fsdp2Config fsdp2;
  Fsdp1Config fsdp1;
  ZeroConfig zero;
  DdpConfig ddp;
  MoeConfig moe;
  CheckpointConfig checkpoint;
  HostConfig host;
  MemoryPlan memory;
  OomConfig oom;
  DivergenceConfig divergence;
  // cluster.calibration: a profile written by `shardscope calibrate` (calibration.h), the path
  // resolved against the plan's folder. Its fitted launch cost and contention factors
  // replace the plan's; the simulation costs kernels and collectives with it.
  std::string calibration;
};

// The plan every rank would run without its divergence section (slowdowns and variants
// dropped): the baseline a divergence's cost is measured against.
Plan WithoutDivergence(const Plan& plan);

// `plan` with ranks that run `variant` instead (added to, or merged into, its divergence).
// Checks what LoadPlan checks for an override: the same strategy, world, mesh and experts.
// `description` names the change ("fsdp2.backward_prefetch 0").
StatusOr<Plan> WithRankVariant(const Plan& plan, std::vector<int32_t> ranks, Plan variant,
                               std::string description);

// The workload one micro-batch of `plan` runs (model.h DecomposeModel): sizes, dtype, the
// rank's expert load and the resolved kernel choices.
Workload WorkloadOf(const Plan& plan);

// training.init.device, or the strategy's usual setup when unset: fsdp2 on the meta device
// (torchtitan builds the model under torch.device("meta"), train.py), every other strategy on
// the CPU (the frameworks' examples build `Model(config)` and hand it over).
InitDevice InitDeviceOf(const Plan& plan);
std::string_view InitDeviceName(InitDevice device);  // "cpu", "cuda", "meta"

// The plan-file spellings of the precision and of the resolved kernel choices ("pure_bf16",
// "torchtitan", "composite"), for the schedule's metadata.
std::string_view PrecisionName(Precision precision);
// training.activation_checkpointing and fsdp1.sharding_strategy as a plan spells them
// ("selective_op", "_HYBRID_SHARD_ZERO2").
std::string_view CheckpointingName(ActivationCheckpointing ac);
std::string_view Fsdp1ShardingStrategyName(Fsdp1ShardingStrategy strategy);
std::string_view ModelImplementationName(ModelImplementation implementation);
std::string_view RmsNormKernelName(RmsNormKernel kernel);

// Defaults with their sources (also used when a schedule JSON carries no host section).
HostConfig DefaultHostConfig();
ContentionConfig DefaultContentionConfig();

StatusOr<Plan> LoadPlanFile(const std::string& path);
// `source` names the text in messages (a path, or "<string>").
StatusOr<Plan> ParsePlan(std::string_view yaml_text, const std::string& source);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_PLAN_H_

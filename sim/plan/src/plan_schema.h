// What a plan may say: the keys of every section, the spellings of its enum values and the
// limits on its numbers. Private to sim/plan/: the section readers (plan_<section>.cc) check a
// plan against these tables; docs/PLAN.md documents them for users.
#ifndef SHARDSCOPE_SIM_PLAN_SCHEMA_H_
#define SHARDSCOPE_SIM_PLAN_SCHEMA_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "shardscope/sim/plan/plan.h"

namespace shardscope::sim::plan_internal {

// ---------------------------------------------------------------------------------------------
// Limits on user values. Generous: far above any published model or cluster, chosen so the
// parameter, byte and FLOP arithmetic downstream cannot overflow int64_t.
// ---------------------------------------------------------------------------------------------

inline constexpr int64_t kMaxWorldSize = int64_t{1} << 20;  // 1,048,576 GPUs
inline constexpr int64_t kMaxLayers = 16'384;
inline constexpr int64_t kMaxHidden = int64_t{1} << 20;
inline constexpr int64_t kMaxHeads = int64_t{1} << 16;
inline constexpr int64_t kMaxFfn = int64_t{1} << 24;
inline constexpr int64_t kMaxVocab = int64_t{1} << 26;
inline constexpr int64_t kMaxPositions = int64_t{1} << 24;
inline constexpr int64_t kMaxExperts = int64_t{1} << 16;
inline constexpr int64_t kMaxTokenTypes = int64_t{1} << 16;
inline constexpr int64_t kMaxSeqLen = int64_t{1} << 24;  // 16M-token context
inline constexpr int64_t kMaxMicroBatch = int64_t{1} << 20;
inline constexpr int64_t kMaxGradAccum = int64_t{1} << 20;
// Parameters (estimated in double): x 16 bytes of fp32 weights, grads and Adam state stays
// below 2^54 bytes.
inline constexpr double kMaxParameters = 1125899906842624.0;  // 2^50
// Activation elements of one micro-batch: tokens x (layers x (hidden + ffn x top-k) + vocab).
inline constexpr double kMaxActivationElements = 1125899906842624.0;  // 2^50
inline constexpr double kMaxBandwidthGbps = 1e5;                      // GB/s per GPU (100 TB/s)
// 0.1 GB/s: below 1 Gb/s Ethernet (125 MB/s), the slowest link a GPU job could cross; the
// schedule metadata's lower bound too (sim/lowering/src/schedule_metadata.cc).
inline constexpr double kMinBandwidthGbps = 0.1;
inline constexpr double kMaxGpuMemoryGb = 1e5;                        // 100 TB
inline constexpr double kMaxSlowdown = 100;
inline constexpr double kMaxHostOverheadUs = 1e6;  // one second
inline constexpr double kMaxBucketCapMb = 1e6;
inline constexpr double kMaxGradNorm = 1e6;
inline constexpr double kMaxDropout = 1;
// pytorch_version bounds: far beyond any release, so the comparisons below stay plain integers.
inline constexpr int32_t kMaxPytorchMajor = 99;
inline constexpr int32_t kMaxPytorchMinor = 999;
// cuda_version bounds: CUDA 10 is the oldest toolkit any PyTorch from 1.8 was built with.
inline constexpr int32_t kMinCudaMajor = 10;
inline constexpr int32_t kMaxCudaMajor = 99;
inline constexpr int32_t kMaxCudaMinor = 99;
// DeepSpeed bucket and threshold sizes, in elements: 2^50 keeps element x byte arithmetic
// inside int64_t and every value exactly representable in the double a "5e8" is read as.
inline constexpr int64_t kMaxZeroElements = int64_t{1} << 50;
inline constexpr size_t kMaxPlanFileBytes = size_t{16} << 20;  // plans are a few hundred bytes

// Units in key names. Bandwidths in GB/s are decimal (10^9 bytes/s), as datasheets give them.
// GPU memory "GB" is binary: an "A100 80GB" has 81920 MiB, and hardware.cc stores the
// presets as N GiB, so gpu_memory_gb: 80 reproduces the preset.
inline constexpr double kBytesPerGbps = 1e9;
inline constexpr double kBytesPerMemoryGb = 1073741824.0;  // 2^30
inline constexpr double kNsPerUs = 1e3;

// ---------------------------------------------------------------------------------------------
// Schema.
// ---------------------------------------------------------------------------------------------

using KeyList = std::span<const std::string_view>;

// clang-format off
inline constexpr std::array<std::string_view, 15> kTopKeys = {
    "model", "cluster", "strategy", "training", "fsdp2", "fsdp1", "zero", "ddp", "moe",
    "checkpoint", "host", "allocator", "oom", "divergence", "expect"};
// expect: what a plan's author says the simulation shows (tests/cli/examples_test.sh checks
// every example against it); the loader checks the spelling and otherwise ignores it.
inline constexpr std::array<std::string_view, 3> kExpectKeys = {"outcome", "cause", "oom_ranks"};
inline constexpr std::array<std::string_view, 4> kExpectOutcomes = {"completes", "hangs", "oom_agreed",
                                                                     "out_of_memory"};
// The root-cause kinds of a hang report (sim/hangs hang_render.cc CauseKindName).
inline constexpr std::array<std::string_view, 5> kExpectCauses = {"mismatch", "cycle", "never_issued",
                                                                   "out_of_memory", "other"};
inline constexpr std::array<std::string_view, 4> kDivergenceKeys = {"slowdown", "seq_len", "moe_load",
                                                             "overrides"};
// What an override may change: the workload, the host costs, the OOM handling and the
// strategy's own knobs. The model, the cluster, the strategy and the experts are the job's.
inline constexpr std::array<std::string_view, 8> kOverrideKeys = {
    "ranks", "training", "host", "oom", "fsdp2", "fsdp1", "zero", "ddp"};
inline constexpr double kMaxRankSlowdown = 1000;  // a factor on a rank's durations
inline constexpr double kMaxMoeLoad = 1000;
inline constexpr std::array<std::string_view, 2> kOomKeys = {"policy", "sync_hooks"};
inline constexpr std::array<std::string_view, 4> kAllocatorKeys = {
    "conf", "memory_fraction", "memory_reserved_by_others_gb",
    "memory_reserved_by_others_gb_per_rank"};
inline constexpr double kMaxReservedByOthersGb = 1 << 20;
inline constexpr std::array<std::string_view, 26> kModelKeys = {
    "preset", "name", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "max_positions",
    "learned_positions", "tied_embeddings", "bias", "mlp", "norm", "attention", "experts",
    "experts_per_token",
    // Architecture details of ModelSpec beyond the dimensions (BERT/RoBERTa, MPT); without
    // them an override of such a preset could reach a state the file cannot repair.
    "alibi", "norm_bias", "reserved_position_rows", "token_types", "embedding_norm", "post_norm",
    "lm_head_transform", "fused_qkv", "dropout"};
inline constexpr std::array<std::string_view, 12> kClusterKeys = {
    "preset", "nodes", "gpu", "gpus_per_node", "intra_node_bandwidth_gbps",
    "inter_node_bandwidth_gbps", "gpu_memory_gb", "contention", "calibration", "nccl", "network",
    "link_sharing"};
// cluster.nccl: the release and NCCL's own environment-variable names (presets/nccl_env.h).
inline constexpr std::array<std::string_view, 10> kNcclKeys = {
    "version", "NCCL_ALGO", "NCCL_PROTO", "NCCL_NVLS_ENABLE", "NCCL_PAT_ENABLE", "NCCL_COLLNET_ENABLE",
    "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_NVLS_NCHANNELS", "NCCL_BUFFSIZE"};
inline constexpr std::array<std::string_view, 2> kNetworkKeys = {"nodes_per_leaf", "switch_latency_ns"};
// NCCL_MIN/MAX_NCHANNELS, NCCL_NVLS_NCHANNELS: NCCL clamps to MAXCHANNELS itself; a bound far
// above any release's keeps the arithmetic plain.
inline constexpr int64_t kMaxNcclChannels = 1024;
inline constexpr int64_t kMaxNcclBuffsize = int64_t{1} << 40;
inline constexpr int64_t kMaxSwitchLatencyNs = 1'000'000;  // 1 ms: far above any switch
inline constexpr std::array<std::string_view, 2> kContentionKeys = {"compute_slowdown", "comm_slowdown"};
inline constexpr std::array<std::string_view, 15> kTrainingKeys = {
    "seq_len", "micro_batch_size", "grad_accum_steps", "activation_checkpointing",
    "selective_ac_every", "dtype", "max_grad_norm", "precision", "pytorch_version",
    "implementation", "compile", "attention", "rms_norm", "cuda_version", "init"};
inline constexpr std::array<std::string_view, 1> kInitKeys = {"device"};
inline constexpr std::array<std::string_view, 11> kFsdp2Keys = {
    "reshard_after_forward", "forward_prefetch", "backward_prefetch", "mixed_precision", "mesh",
    "requires_gradient_sync", "gradient_sync_every_k_blocks", "requires_all_reduce",
    "reshard_after_backward", "blocks_per_unit", "wrap"};
inline constexpr std::array<std::string_view, 13> kFsdp1Keys = {
    "sharding_strategy", "backward_prefetch", "forward_prefetch", "limit_all_gathers", "no_sync",
    "mixed_precision", "mesh", "implementation", "optimize_backward_concat",
    "reshard_after_forward", "bucket_cap_mb", "sync_module_states", "device_id"};
inline constexpr std::array<std::string_view, 14> kZeroKeys = {
    "reduce_bucket_size", "allgather_bucket_size", "overlap_comm", "contiguous_gradients",
    "stage3_prefetch_bucket_size", "stage3_max_live_parameters", "stage3_max_reuse_distance",
    "stage3_param_persistence_threshold", "legacy_prefetch_off_by_one",
    "legacy_stream_sync_in_fetch_release", "legacy_debug_norm_sync", "legacy_per_parameter_path", "legacy_reduce_per_rank",
    "zero_init"};
inline constexpr std::array<std::string_view, 2> kMixedPrecisionKeys = {"param_dtype", "reduce_dtype"};
inline constexpr std::array<std::string_view, 2> kMeshKeys = {"replicate", "shard"};
inline constexpr std::array<std::string_view, 2> kDdpKeys = {"bucket_cap_mb", "no_sync"};
inline constexpr std::array<std::string_view, 1> kMoeKeys = {"expert_parallel"};
inline constexpr std::array<std::string_view, 2> kCheckpointKeys = {"consolidate_optimizer_state",
                                                             "no_broadcast_optim_state"};
inline constexpr std::array<std::string_view, 7> kHostKeys = {
    "launch_overhead_us", "hook_overhead_us", "python_op_overhead_us", "cpp_op_overhead_us",
    "max_queued_launches_per_stream", "cuda_malloc_us", "cuda_free_us"};
// clang-format on

template <typename Enum>
struct EnumName {
  std::string_view name;
  Enum value;
};

inline constexpr std::array<EnumName<InitDevice>, 3> kInitDevices = {{
    {"cpu", InitDevice::kCpu}, {"cuda", InitDevice::kCuda}, {"meta", InitDevice::kMeta}}};
inline constexpr std::array<EnumName<OomPolicy>, 2> kOomPolicies = {{
    {"raise", OomPolicy::kRaise}, {"catch_and_sync", OomPolicy::kCatchAndSync}}};
inline constexpr std::array<EnumName<Strategy>, 6> kStrategies = {{{"fsdp2", Strategy::kFsdp2},
                                                            {"fsdp1", Strategy::kFsdp1},
                                                            {"zero1", Strategy::kZero1},
                                                            {"zero2", Strategy::kZero2},
                                                            {"zero3", Strategy::kZero3},
                                                            {"ddp", Strategy::kDdp}}};
// Names users reach for that are not strategies of their own, and what to write instead.
struct StrategyAlias {
  std::string_view name;
  std::string_view instead;
};
inline constexpr std::array<StrategyAlias, 1> kStrategyAliases = {
    {{"hsdp",
      "HSDP is not a strategy of its own: it is fsdp2 with fsdp2.mesh.replicate > 1, or fsdp1 "
      "with fsdp1.sharding_strategy HYBRID_SHARD"}}};
// The strategy section each strategy reads its knobs from.
struct StrategySection {
  std::string_view section;
  Strategy strategy;
};
inline constexpr std::array<StrategySection, 6> kStrategySections = {{{"fsdp2", Strategy::kFsdp2},
                                                               {"fsdp1", Strategy::kFsdp1},
                                                               {"zero", Strategy::kZero1},
                                                               {"zero", Strategy::kZero2},
                                                               {"zero", Strategy::kZero3},
                                                               {"ddp", Strategy::kDdp}}};
inline constexpr std::array<EnumName<ActivationCheckpointing>, 4> kCheckpointing = {
    {{"none", ActivationCheckpointing::kNone},
     {"full", ActivationCheckpointing::kFull},
     {"selective", ActivationCheckpointing::kSelective},
     {"selective_op", ActivationCheckpointing::kSelectiveOp}}};
inline constexpr std::array<EnumName<Precision>, 2> kPrecisions = {
    {{"mixed", Precision::kMixed}, {"pure_bf16", Precision::kPureBf16}}};
inline constexpr std::array<EnumName<ModelImplementation>, 2> kImplementations = {
    {{"torchtitan", ModelImplementation::kTorchtitan}, {"huggingface", ModelImplementation::kHuggingFace}}};
inline constexpr std::array<EnumName<AttentionChoice>, 6> kAttentionChoices = {
    {{"sdpa", AttentionChoice::kSdpa},
     {"flash2", AttentionChoice::kFlash2},
     {"flash3", AttentionChoice::kFlash3},
     {"cudnn", AttentionChoice::kCudnn},
     {"mem_efficient", AttentionChoice::kMemEfficient},
     {"eager", AttentionChoice::kEager}}};
inline constexpr std::array<EnumName<RmsNormKernel>, 3> kRmsNormKernels = {
    {{"fused", RmsNormKernel::kFused}, {"composite", RmsNormKernel::kComposite}, {"python", RmsNormKernel::kPython}}};
// fp8 means the e4m3 format training recipes use for forward GEMMs.
inline constexpr std::array<EnumName<traces::DType>, 4> kTrainingDTypes = {
    {{"bf16", traces::DType::kBFloat16},
     {"fp16", traces::DType::kFloat16},
     {"fp32", traces::DType::kFloat32},
     {"fp8", traces::DType::kFloat8E4M3}}};
// MixedPrecisionPolicy / MixedPrecision take torch dtypes; fp8 is not one of them (fp8
// training casts per GEMM inside Float8Linear, the parameters stay bf16).
inline constexpr std::array<EnumName<traces::DType>, 3> kMixedPrecisionDTypes = {
    {{"bf16", traces::DType::kBFloat16},
     {"fp16", traces::DType::kFloat16},
     {"fp32", traces::DType::kFloat32}}};
inline constexpr std::array<EnumName<GradientSync>, 2> kGradientSyncModes = {
    {{"every_micro_batch", GradientSync::kEveryMicroBatch},
     {"last_micro_batch", GradientSync::kLastMicroBatch}}};
// wrap: block -> root_only false; root -> root_only true.
inline constexpr std::array<EnumName<bool>, 2> kWrapModes = {{{"block", false}, {"root", true}}};
// torch.distributed.fsdp.ShardingStrategy member names (torch/distributed/fsdp/api.py).
inline constexpr std::array<EnumName<Fsdp1ShardingStrategy>, 5> kFsdp1ShardingStrategies = {
    {{"FULL_SHARD", Fsdp1ShardingStrategy::kFullShard},
     {"SHARD_GRAD_OP", Fsdp1ShardingStrategy::kShardGradOp},
     {"NO_SHARD", Fsdp1ShardingStrategy::kNoShard},
     {"HYBRID_SHARD", Fsdp1ShardingStrategy::kHybridShard},
     {"_HYBRID_SHARD_ZERO2", Fsdp1ShardingStrategy::kHybridShardZero2}}};
// torch.distributed.fsdp.BackwardPrefetch member names; null is backward_prefetch=None.
inline constexpr std::array<EnumName<Fsdp1BackwardPrefetch>, 2> kFsdp1BackwardPrefetches = {
    {{"BACKWARD_PRE", Fsdp1BackwardPrefetch::kBackwardPre},
     {"BACKWARD_POST", Fsdp1BackwardPrefetch::kBackwardPost}}};
inline constexpr std::array<EnumName<Fsdp1Implementation>, 2> kFsdp1Implementations = {
    {{"torch", Fsdp1Implementation::kTorch}, {"fairscale", Fsdp1Implementation::kFairscale}}};
inline constexpr std::array<EnumName<MlpKind>, 2> kMlpKinds = {
    {{"swiglu", MlpKind::kSwiGlu}, {"gelu", MlpKind::kGelu}}};
inline constexpr std::array<EnumName<NormKind>, 2> kNormKinds = {
    {{"rmsnorm", NormKind::kRmsNorm}, {"layernorm", NormKind::kLayerNorm}}};
inline constexpr std::array<EnumName<AttentionKind>, 2> kAttentionKinds = {
    {{"causal", AttentionKind::kCausal}, {"bidirectional", AttentionKind::kBidirectional}}};

}  // namespace shardscope::sim::plan_internal

#endif  // SHARDSCOPE_SIM_PLAN_SCHEMA_H_

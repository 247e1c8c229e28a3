// Plan files: the YAML schema, its strict parser, and the host / contention defaults with
// their sources.
//
// The parser walks only the keys the schema defines, so its depth is bounded by the schema
// whatever the input nests. Every mapping is checked for unknown and duplicate keys before
// any value is read; every scalar is parsed with std::from_chars rather than yaml-cpp's
// as<T>(), so each failure becomes a Status naming the key and the accepted range (as<T>()
// throws a BadConversion that knows neither) and ".inf" / ".nan", which as<double>() turns
// into values, are refused. Quoted scalars are strings, never numbers or booleans. No
// yaml-cpp exception leaves this file: ParsePlan catches them all.
#include "shardscope/sim/plan/plan.h"

#include "shardscope/sim/models/compute_model.h"

#include "shardscope/sim/models/calibration.h"
#include "shardscope/base/rank_ranges.h"

#include "plan_sources.h"  // hf_config, deepspeed_config, torchtitan job_config

#include <fmt/format.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace shardscope::sim {
namespace {

// ---------------------------------------------------------------------------------------------
// Defaults and their sources.
// ---------------------------------------------------------------------------------------------

// CPU time to enqueue one asynchronous kernel launch (cudaLaunchKernel, no synchronization).
// Source: ahrefs/ocannl issue #488 (2026), a standalone CUDA probe timing N no-op kernels
// enqueued asynchronously: 2.62-2.81 us per launch (RTX 5070 Ti, CUDA 13.3), median of 200
// repetitions. Consistent with the "~1-3 us on CUDA 12+ drivers" usually quoted for
// cudaLaunchKernel. NCCL collectives cost more to issue (group calls, proxy work); the
// engine charges this figure for every launch, so collective issue cost is a lower bound.
constexpr int64_t kDefaultLaunchOverheadNs = 2'700;

// Python interpreter + ATen dispatcher + autograd bookkeeping for one eager framework op,
// excluding the driver launch above. Source: pytorch/pytorch issue #41383 ("Large overhead
// (7 microseconds) for PyTorch operation", 2020): `y = 2*x` on a 1-element tensor with
// requires_grad=True costs ~7 us per op (5 us without autograd); the tensor work itself is
// negligible there, so it is all dispatch. ngimel's reply there puts about half of it in
// Python argument parsing.
constexpr int64_t kDefaultPythonOpOverheadNs = 7'000;

// Dispatcher time of one ATen op issued from C++ (the autograd engine's backward kernels, the
// ops inside a composite ATen op), excluding the driver launch. Source: the same issue #41383,
// ngimel: "Approx half of it is python parsing overhead (same operation called using c++ API
// would take about a microsecond)".
constexpr int64_t kDefaultCppOpOverheadNs = 1'000;

// CPU time of one framework hook (FSDP2 pre-forward / post-forward / pre-backward /
// post-backward, DDP's per-bucket work), excluding the ops the hook issues (those are charged
// as ops and launches). ESTIMATE, not a measurement: an FSDP2 hook runs roughly 10-20 Python
// function calls, a tree_flatten/unflatten of the module's args, a state-machine update and,
// in pre-forward, the apply() of a RegisterPostBackwardFunction autograd function (itself
// about one op, kDefaultPythonOpOverheadNs). At ~1 us per Python call plus one op that is
// ~20-30 us. Upper bound seen in the wild: pytorch/pytorch issue #173680 (2026) reports
// FSDP::pre_forward taking ~1 ms per module on a Xeon with torch 2.10, but that includes
// the copy-in and all-gather ops of many small parameters, which this model charges
// separately.
constexpr int64_t kDefaultHookOverheadNs = 25'000;

// Work items one CUDA stream queues before the next launch onto it blocks the host until the
// oldest retires. Measured, not documented by NVIDIA: launches of a ~190 us kernel return in
// 4-5 us until about 1,000 are queued on a stream, then each takes one kernel's duration;
// with three streams each queued about 1,000 (Stack Overflow question 53970187, and NVIDIA
// developer forum thread 68937, "CUDA stream are blocked when launch lots of kernels
// (>1000)", 2018). 1,024 is that observation rounded to the power of two queues use. 0 in a
// plan means unlimited.
constexpr int32_t kDefaultMaxQueuedLaunchesPerStream = 1024;

// Host time of cudaMalloc and cudaFree. Source: University of Virginia CUDA overhead study
// ("Memory Allocation Overhead", cs.virginia.edu/~mwb7w/cuda_support/
// memory_management_overhead.html): cudaMalloc costs a roughly constant ~50 us from 4 KiB to
// 512 KiB and more above. Measured on GPUs of that time; the allocator's segments are 2 MiB
// and up, so this is a lower bound until calibration measures it. cudaFree: the same figure,
// an ESTIMATE (its synchronization with the device is modelled separately).
constexpr int64_t kDefaultCudaMallocNs = 50'000;
constexpr int64_t kDefaultCudaFreeNs = 50'000;
constexpr int64_t kMaxQueuedLaunchesPerStream = int64_t{1} << 24;

// Compute slowdown while a collective runs on the same GPU. Source: Lee et al.,
// "Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep
// Learning: Performance and Power Implications", arXiv:2507.03114 (2025): overlapping
// computation with communication slows computation by 18.9% on average (40.0% max) versus
// the same computation without concurrent communication, measured on GPT and LLaMA training
// across 4x A100, H100, MI250 and MI210.
constexpr double kDefaultComputeSlowdown = 0.189;

// Collective slowdown while compute runs on the same GPU. ESTIMATE: no published per-
// collective measurement on NVIDIA GPUs was found (the papers above report the compute side
// or whole-step effects only). NCCL kernels occupy few SMs and are bound by link bandwidth,
// so they lose less than the GEMMs beside them; their main loss is HBM bandwidth shared with
// memory-bound kernels. 10% is chosen as a conservative value below the measured compute
// slowdown; replace it when a measurement exists.
constexpr double kDefaultCommSlowdown = 0.10;

// ---------------------------------------------------------------------------------------------
// Limits on user values. Generous: far above any published model or cluster, chosen so the
// parameter, byte and FLOP arithmetic downstream cannot overflow int64_t.
// ---------------------------------------------------------------------------------------------

constexpr int64_t kMaxWorldSize = int64_t{1} << 20;  // 1,048,576 GPUs
constexpr int64_t kMaxLayers = 16'384;
constexpr int64_t kMaxHidden = int64_t{1} << 20;
constexpr int64_t kMaxHeads = int64_t{1} << 16;
constexpr int64_t kMaxFfn = int64_t{1} << 24;
constexpr int64_t kMaxVocab = int64_t{1} << 26;
constexpr int64_t kMaxPositions = int64_t{1} << 24;
constexpr int64_t kMaxExperts = int64_t{1} << 16;
constexpr int64_t kMaxTokenTypes = int64_t{1} << 16;
constexpr int64_t kMaxSeqLen = int64_t{1} << 24;  // 16M-token context
constexpr int64_t kMaxMicroBatch = int64_t{1} << 20;
constexpr int64_t kMaxGradAccum = int64_t{1} << 20;
// Parameters (estimated in double): x 16 bytes of fp32 weights, grads and Adam state stays
// below 2^54 bytes.
constexpr double kMaxParameters = 1125899906842624.0;  // 2^50
// Activation elements of one micro-batch: tokens x (layers x (hidden + ffn x top-k) + vocab).
constexpr double kMaxActivationElements = 1125899906842624.0;  // 2^50
constexpr double kMaxBandwidthGbps = 1e5;                      // GB/s per GPU (100 TB/s)
constexpr double kMaxGpuMemoryGb = 1e5;                        // 100 TB
constexpr double kMaxSlowdown = 100;
constexpr double kMaxHostOverheadUs = 1e6;  // one second
constexpr double kMaxBucketCapMb = 1e6;
constexpr double kMaxGradNorm = 1e6;
constexpr double kMaxDropout = 1;
// pytorch_version bounds: far beyond any release, so the comparisons below stay plain integers.
constexpr int32_t kMaxPytorchMajor = 99;
constexpr int32_t kMaxPytorchMinor = 999;
// DeepSpeed bucket and threshold sizes, in elements: 2^50 keeps element x byte arithmetic
// inside int64_t and every value exactly representable in the double a "5e8" is read as.
constexpr int64_t kMaxZeroElements = int64_t{1} << 50;
constexpr size_t kMaxPlanFileBytes = size_t{16} << 20;  // plans are a few hundred bytes

// Units in key names. Bandwidths in GB/s are decimal (10^9 bytes/s), as datasheets give them.
// GPU memory "GB" is binary: an "A100 80GB" has 81920 MiB, and hardware.cc stores the
// presets as N GiB, so gpu_memory_gb: 80 reproduces the preset.
constexpr double kBytesPerGbps = 1e9;
constexpr double kBytesPerMemoryGb = 1073741824.0;  // 2^30
constexpr double kNsPerUs = 1e3;

// ---------------------------------------------------------------------------------------------
// Schema.
// ---------------------------------------------------------------------------------------------

using KeyList = std::span<const std::string_view>;

// clang-format off
constexpr std::array<std::string_view, 14> kTopKeys = {
    "model", "cluster", "strategy", "training", "fsdp2", "fsdp1", "zero", "ddp", "moe",
    "checkpoint", "host", "allocator", "oom", "divergence"};
constexpr std::array<std::string_view, 4> kDivergenceKeys = {"slowdown", "seq_len", "moe_load",
                                                             "overrides"};
// What an override may change: the workload, the host costs, the OOM handling and the
// strategy's own knobs. The model, the cluster, the strategy and the experts are the job's.
constexpr std::array<std::string_view, 8> kOverrideKeys = {
    "ranks", "training", "host", "oom", "fsdp2", "fsdp1", "zero", "ddp"};
constexpr double kMaxRankSlowdown = 1000;  // a factor on a rank's durations
constexpr double kMaxMoeLoad = 1000;
constexpr std::array<std::string_view, 2> kOomKeys = {"policy", "sync_hooks"};
constexpr std::array<std::string_view, 4> kAllocatorKeys = {
    "conf", "memory_fraction", "memory_reserved_by_others_gb",
    "memory_reserved_by_others_gb_per_rank"};
constexpr double kMaxReservedByOthersGb = 1 << 20;
constexpr std::array<std::string_view, 26> kModelKeys = {
    "preset", "name", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "max_positions",
    "learned_positions", "tied_embeddings", "bias", "mlp", "norm", "attention", "experts",
    "experts_per_token",
    // Architecture details of ModelSpec beyond the dimensions (BERT/RoBERTa, MPT); without
    // them an override of such a preset could reach a state the file cannot repair.
    "alibi", "norm_bias", "reserved_position_rows", "token_types", "embedding_norm", "post_norm",
    "lm_head_transform", "fused_qkv", "dropout"};
constexpr std::array<std::string_view, 9> kClusterKeys = {
    "preset", "nodes", "gpu", "gpus_per_node", "intra_node_bandwidth_gbps",
    "inter_node_bandwidth_gbps", "gpu_memory_gb", "contention", "calibration"};
constexpr std::array<std::string_view, 2> kContentionKeys = {"compute_slowdown", "comm_slowdown"};
constexpr std::array<std::string_view, 13> kTrainingKeys = {
    "seq_len", "micro_batch_size", "grad_accum_steps", "activation_checkpointing",
    "selective_ac_every", "dtype", "max_grad_norm", "precision", "pytorch_version",
    "implementation", "compile", "attention", "rms_norm"};
constexpr std::array<std::string_view, 11> kFsdp2Keys = {
    "reshard_after_forward", "forward_prefetch", "backward_prefetch", "mixed_precision", "mesh",
    "requires_gradient_sync", "gradient_sync_every_k_blocks", "requires_all_reduce",
    "reshard_after_backward", "blocks_per_unit", "wrap"};
constexpr std::array<std::string_view, 11> kFsdp1Keys = {
    "sharding_strategy", "backward_prefetch", "forward_prefetch", "limit_all_gathers", "no_sync",
    "mixed_precision", "mesh", "implementation", "optimize_backward_concat",
    "reshard_after_forward", "bucket_cap_mb"};
constexpr std::array<std::string_view, 13> kZeroKeys = {
    "reduce_bucket_size", "allgather_bucket_size", "overlap_comm", "contiguous_gradients",
    "stage3_prefetch_bucket_size", "stage3_max_live_parameters", "stage3_max_reuse_distance",
    "stage3_param_persistence_threshold", "legacy_prefetch_off_by_one",
    "legacy_stream_sync_in_fetch_release", "legacy_debug_norm_sync", "legacy_per_parameter_path", "legacy_reduce_per_rank"};
constexpr std::array<std::string_view, 2> kMixedPrecisionKeys = {"param_dtype", "reduce_dtype"};
constexpr std::array<std::string_view, 2> kMeshKeys = {"replicate", "shard"};
constexpr std::array<std::string_view, 2> kDdpKeys = {"bucket_cap_mb", "no_sync"};
constexpr std::array<std::string_view, 1> kMoeKeys = {"expert_parallel"};
constexpr std::array<std::string_view, 2> kCheckpointKeys = {"consolidate_optimizer_state",
                                                             "no_broadcast_optim_state"};
constexpr std::array<std::string_view, 7> kHostKeys = {
    "launch_overhead_us", "hook_overhead_us", "python_op_overhead_us", "cpp_op_overhead_us",
    "max_queued_launches_per_stream", "cuda_malloc_us", "cuda_free_us"};
// clang-format on

template <typename Enum>
struct EnumName {
  std::string_view name;
  Enum value;
};

constexpr std::array<EnumName<OomPolicy>, 2> kOomPolicies = {{
    {"raise", OomPolicy::kRaise}, {"catch_and_sync", OomPolicy::kCatchAndSync}}};
constexpr std::array<EnumName<Strategy>, 6> kStrategies = {{{"fsdp2", Strategy::kFsdp2},
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
constexpr std::array<StrategyAlias, 1> kStrategyAliases = {
    {{"hsdp",
      "HSDP is not a strategy of its own: it is fsdp2 with fsdp2.mesh.replicate > 1, or fsdp1 "
      "with fsdp1.sharding_strategy HYBRID_SHARD"}}};
// The strategy section each strategy reads its knobs from.
struct StrategySection {
  std::string_view section;
  Strategy strategy;
};
constexpr std::array<StrategySection, 6> kStrategySections = {{{"fsdp2", Strategy::kFsdp2},
                                                               {"fsdp1", Strategy::kFsdp1},
                                                               {"zero", Strategy::kZero1},
                                                               {"zero", Strategy::kZero2},
                                                               {"zero", Strategy::kZero3},
                                                               {"ddp", Strategy::kDdp}}};
constexpr std::array<EnumName<ActivationCheckpointing>, 4> kCheckpointing = {
    {{"none", ActivationCheckpointing::kNone},
     {"full", ActivationCheckpointing::kFull},
     {"selective", ActivationCheckpointing::kSelective},
     {"selective_op", ActivationCheckpointing::kSelectiveOp}}};
constexpr std::array<EnumName<Precision>, 2> kPrecisions = {
    {{"mixed", Precision::kMixed}, {"pure_bf16", Precision::kPureBf16}}};
constexpr std::array<EnumName<ModelImplementation>, 2> kImplementations = {
    {{"torchtitan", ModelImplementation::kTorchtitan}, {"huggingface", ModelImplementation::kHuggingFace}}};
constexpr std::array<EnumName<AttentionChoice>, 6> kAttentionChoices = {
    {{"sdpa", AttentionChoice::kSdpa},
     {"flash2", AttentionChoice::kFlash2},
     {"flash3", AttentionChoice::kFlash3},
     {"cudnn", AttentionChoice::kCudnn},
     {"mem_efficient", AttentionChoice::kMemEfficient},
     {"eager", AttentionChoice::kEager}}};
constexpr std::array<EnumName<RmsNormKernel>, 3> kRmsNormKernels = {
    {{"fused", RmsNormKernel::kFused}, {"composite", RmsNormKernel::kComposite}, {"python", RmsNormKernel::kPython}}};
// fp8 means the e4m3 format training recipes use for forward GEMMs.
constexpr std::array<EnumName<traces::DType>, 4> kTrainingDTypes = {
    {{"bf16", traces::DType::kBFloat16},
     {"fp16", traces::DType::kFloat16},
     {"fp32", traces::DType::kFloat32},
     {"fp8", traces::DType::kFloat8E4M3}}};
// MixedPrecisionPolicy / MixedPrecision take torch dtypes; fp8 is not one of them (fp8
// training casts per GEMM inside Float8Linear, the parameters stay bf16).
constexpr std::array<EnumName<traces::DType>, 3> kMixedPrecisionDTypes = {
    {{"bf16", traces::DType::kBFloat16},
     {"fp16", traces::DType::kFloat16},
     {"fp32", traces::DType::kFloat32}}};
constexpr std::array<EnumName<GradientSync>, 2> kGradientSyncModes = {
    {{"every_micro_batch", GradientSync::kEveryMicroBatch},
     {"last_micro_batch", GradientSync::kLastMicroBatch}}};
// wrap: block -> root_only false; root -> root_only true.
constexpr std::array<EnumName<bool>, 2> kWrapModes = {{{"block", false}, {"root", true}}};
// torch.distributed.fsdp.ShardingStrategy member names (torch/distributed/fsdp/api.py).
constexpr std::array<EnumName<Fsdp1ShardingStrategy>, 5> kFsdp1ShardingStrategies = {
    {{"FULL_SHARD", Fsdp1ShardingStrategy::kFullShard},
     {"SHARD_GRAD_OP", Fsdp1ShardingStrategy::kShardGradOp},
     {"NO_SHARD", Fsdp1ShardingStrategy::kNoShard},
     {"HYBRID_SHARD", Fsdp1ShardingStrategy::kHybridShard},
     {"_HYBRID_SHARD_ZERO2", Fsdp1ShardingStrategy::kHybridShardZero2}}};
// torch.distributed.fsdp.BackwardPrefetch member names; null is backward_prefetch=None.
constexpr std::array<EnumName<Fsdp1BackwardPrefetch>, 2> kFsdp1BackwardPrefetches = {
    {{"BACKWARD_PRE", Fsdp1BackwardPrefetch::kBackwardPre},
     {"BACKWARD_POST", Fsdp1BackwardPrefetch::kBackwardPost}}};
constexpr std::array<EnumName<Fsdp1Implementation>, 2> kFsdp1Implementations = {
    {{"torch", Fsdp1Implementation::kTorch}, {"fairscale", Fsdp1Implementation::kFairscale}}};
constexpr std::array<EnumName<MlpKind>, 2> kMlpKinds = {
    {{"swiglu", MlpKind::kSwiGlu}, {"gelu", MlpKind::kGelu}}};
constexpr std::array<EnumName<NormKind>, 2> kNormKinds = {
    {{"rmsnorm", NormKind::kRmsNorm}, {"layernorm", NormKind::kLayerNorm}}};
constexpr std::array<EnumName<AttentionKind>, 2> kAttentionKinds = {
    {{"causal", AttentionKind::kCausal}, {"bidirectional", AttentionKind::kBidirectional}}};

// ---------------------------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------------------------

std::string JoinPath(std::string_view parent, std::string_view key) {
  if (parent.empty()) return std::string(key);
  return fmt::format("{}.{}", parent, key);
}

template <typename Range>
std::string JoinNames(const Range& names) {
  std::string out;
  for (const auto& name : names) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

template <typename Enum, size_t N>
std::string EnumNames(const std::array<EnumName<Enum>, N>& table) {
  std::vector<std::string_view> names;
  for (const auto& entry : table) names.push_back(entry.name);
  return JoinNames(names);
}

// A scalar as it appears in a message: quoted, at most 40 characters, control bytes escaped
// (a fuzzed or binary file must not put raw bytes into a terminal).
std::string Quote(std::string_view text) {
  constexpr size_t kMaxShown = 40;
  std::string out = "'";
  for (size_t i = 0; i < text.size() && i < kMaxShown; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  if (text.size() > kMaxShown) out += "...";
  out += "'";
  return out;
}

// yaml-cpp tags a quoted scalar "!" (non-specific) and a plain one "?".
bool IsQuoted(const YAML::Node& node) { return node.IsScalar() && node.Tag() == "!"; }

// What a node is, for the "got ..." half of a message.
std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
      return "nothing";
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Scalar:
      return IsQuoted(node) ? fmt::format("the string {}", Quote(node.Scalar()))
                            : Quote(node.Scalar());
    case YAML::NodeType::Sequence:
      return "a sequence";
    case YAML::NodeType::Map:
      return "a mapping";
  }
  return "an unknown YAML node";
}

std::string ExpectedInt(int64_t min, int64_t max) {
  if (min == 1) return fmt::format("a positive integer <= {}", max);
  if (min == 0) return fmt::format("a non-negative integer <= {}", max);
  return fmt::format("an integer in [{}, {}]", min, max);
}

// A YAML 1.2 core-schema boolean, or nothing when the node is something else.
std::optional<bool> AsBool(const YAML::Node& node) {
  if (!node.IsScalar() || IsQuoted(node)) return std::nullopt;
  const std::string& text = node.Scalar();
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  return std::nullopt;
}

bool IsHybrid(Fsdp1ShardingStrategy strategy) {
  return strategy == Fsdp1ShardingStrategy::kHybridShard ||
         strategy == Fsdp1ShardingStrategy::kHybridShardZero2;
}

template <typename Enum, size_t N>
std::string_view NameOf(const std::array<EnumName<Enum>, N>& table, Enum value) {
  for (const auto& entry : table) {
    if (entry.value == value) return entry.name;
  }
  return "?";
}

// The FSDP2 units a plan wraps, by name, for messages: "embed, layers.0, layers.2, head".
std::string Fsdp2UnitNames(const Fsdp2Config& config, int32_t layers) {
  if (config.root_only) return "none: with wrap: root the root is the only FSDP module";
  const int32_t k = std::max<int32_t>(1, config.blocks_per_unit);
  const int32_t units = (layers + k - 1) / k;
  std::vector<std::string> names = {"embed"};
  constexpr int32_t kShownBlockUnits = 4;
  for (int32_t u = 0; u < units; ++u) {
    if (units > kShownBlockUnits && u == 2) {
      names.push_back("...");
      u = units - 1;
    }
    names.push_back(fmt::format("layers.{}", u * k));
  }
  names.push_back("head");
  return JoinNames(names);
}

// Counts documents without building them, stopping at the second. YAML::LoadAll is not used:
// in yaml-cpp 0.7 it never returns on some malformed input (a document "!a,b!" yields
// documents without consuming the input; found by fuzz/plan_loader_fuzz), while Load and a
// bounded number of HandleNextDocument calls do return.
class DiscardEvents : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override { last_start_ = mark; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}

  const YAML::Mark& last_start() const { return last_start_; }

 private:
  YAML::Mark last_start_ = YAML::Mark::null_mark();
};

struct DocumentCount {
  int count = 0;  // 0, 1 or 2 (meaning "2 or more")
  YAML::Mark second_start = YAML::Mark::null_mark();
};

DocumentCount CountDocuments(const std::string& text) {
  std::istringstream stream(text);
  YAML::Parser parser(stream);
  DiscardEvents discard;
  DocumentCount result;
  while (result.count < 2 && parser.HandleNextDocument(discard)) {
    ++result.count;
    if (result.count == 2) result.second_start = discard.last_start();
  }
  return result;
}

// Whether the GPU's tensor cores (or fp32 units) run GEMMs in `dtype`. Hopper runs fp8 even
// where a GPU preset leaves the fp8 rate blank.
bool DTypeSupported(const GpuSpec& gpu, traces::DType dtype) {
  return PeakFlops(gpu, dtype) > 0 ||
         (dtype == traces::DType::kFloat8E4M3 && gpu.arch == GpuArch::kHopper);
}

std::string ExpectedDType(const GpuSpec& gpu) {
  std::vector<std::string_view> supported;
  for (const auto& candidate : kTrainingDTypes) {
    if (DTypeSupported(gpu, candidate.value)) supported.push_back(candidate.name);
  }
  return fmt::format("a dtype the GPU {} supports ({})", gpu.name, JoinNames(supported));
}

// One key: value pair of a mapping. The key's mark locates errors about null values, whose
// own mark yaml-cpp sets to wherever the next token starts.
struct Entry {
  std::string key;
  YAML::Node key_node;
  YAML::Node value;
};

// The checked keys of one mapping.
struct Fields {
  YAML::Mark mark;
  std::vector<Entry> entries;

  const Entry* Find(std::string_view key) const {
    for (const Entry& entry : entries) {
      if (entry.key == key) return &entry;
    }
    return nullptr;
  }
};

// Parses one plan text. Keeps the source name for messages; holds no other state.
class PlanParser {
 public:
  explicit PlanParser(const std::string& source) : source_(source) {}

  StatusOr<Plan> Parse(std::string_view text);

 private:
  // "<file>:<line>:<column>" (1-based) for a node, falling back to 1:1 for nodes without one.
  std::string Where(const YAML::Mark& mark) const {
    if (mark.is_null() || mark.line < 0 || mark.column < 0) return fmt::format("{}:1:1", source_);
    return fmt::format("{}:{}:{}", source_, mark.line + 1, mark.column + 1);
  }
  YAML::Mark MarkOf(const Entry& entry) const {
    return entry.value.IsNull() ? entry.key_node.Mark() : entry.value.Mark();
  }
  Status Error(const YAML::Mark& mark, std::string_view path, std::string_view expected,
               std::string_view got) const {
    // A value merged in from a framework config file has no mark in the plan: the error
    // points at the file, line and key it came from.
    if (mark.is_null()) {
      if (const std::string* origin = OriginOf(path)) {
        return Status::InvalidInput(
            fmt::format("{}: {}: expected {}, got {}", *origin, path, expected, got));
      }
    }
    return Status::InvalidInput(
        fmt::format("{}: {}: expected {}, got {}", Where(mark), path, expected, got));
  }
  Status Error(const Entry& entry, std::string_view path, std::string_view expected) const {
    return Error(MarkOf(entry), path, expected, Describe(entry.value));
  }

  StatusOr<Fields> ReadMapping(const YAML::Node& node, const YAML::Mark& mark,
                               std::string_view path, KeyList allowed) const;
  // ReadMapping, or no fields when the section is absent (`entry` null).
  StatusOr<Fields> SectionFields(const Entry* entry, std::string_view path,
                                 KeyList allowed) const;
  // An error about a key that does not apply in this combination: located at the key.
  Status KeyError(const Entry& entry, std::string_view path, std::string_view expected,
                  std::string_view got) const;
  Status Require(const Fields& fields, std::string_view parent, std::string_view key,
                 std::string_view expected) const;

  Status ReadInt(const Entry& entry, std::string_view path, int64_t min, int64_t max,
                 int64_t* out) const;
  Status ReadInt32(const Entry& entry, std::string_view path, int64_t min, int64_t max,
                   int32_t* out) const;
  // A finite number in (min, max] (exclusive_min) or [min, max].
  Status ReadNumber(const Entry& entry, std::string_view path, double min, bool exclusive_min,
                    double max, double* out) const;
  Status ReadBool(const Entry& entry, std::string_view path, bool* out) const;
  Status ReadString(const Entry& entry, std::string_view path, std::string_view expected,
                    std::string* out) const;
  template <typename Enum, size_t N>
  Status ReadEnum(const Entry& entry, std::string_view path,
                  const std::array<EnumName<Enum>, N>& table, Enum* out) const;

  // ReadEnum that also accepts null (Python's None), reported through `is_null`.
  template <typename Enum, size_t N>
  Status ReadEnumOrNull(const Entry& entry, std::string_view path,
                        const std::array<EnumName<Enum>, N>& table, Enum* out,
                        bool* is_null) const;

  Status ReadStrategy(const Entry& entry, Strategy* out) const;
  Status ReadModel(const Entry& entry, ModelSpec* out) const;
  Status ReadModelFields(const Fields& fields, ModelSpec* model, bool* modified) const;
  Status ReadCluster(const Entry& entry, ClusterSpec* cluster, ContentionConfig* contention) const;
  // cluster.calibration: the profile path, resolved and read (its GPU must be the cluster's);
  // the fitted launch cost and contention factors go into `plan`.
  Status ReadCalibration(const Entry& entry, Plan* plan) const;
  // Also says whether the dtype was given, and where seq_len is (for later checks).
  Status ReadTraining(const Entry& entry, const GpuSpec& gpu, TrainingConfig* out,
                      bool* dtype_given, YAML::Mark* seq_len_mark, YAML::Mark* dtype_mark,
                      YAML::Mark* kernels_mark) const;
  // training.kernels from the PyTorch version, the framework code, the GPU and the knobs.
  Status ResolveKernelChoices(const YAML::Mark& mark, Plan* plan) const;
  // Strategy sections read after model, cluster and training: their checks need the world
  // size, the layer and expert counts and the training dtype from `plan`.
  // `entry` null: the section is absent and only the defaults are resolved.
  Status ReadFsdp2(const Entry* entry, const Plan& plan, Fsdp2Config* out) const;
  Status ReadFsdp1(const Entry* entry, const Plan& plan, Fsdp1Config* out) const;
  Status ReadZero(const Entry* entry, const Plan& plan, ZeroConfig* out) const;
  Status ReadDdp(const Entry& entry, DdpConfig* out) const;
  Status ReadMoe(const Entry& entry, const Plan& plan, MoeConfig* out) const;
  Status ReadCheckpoint(const Entry& entry, const Plan& plan, CheckpointConfig* out) const;

  // MixedPrecisionPolicy / MixedPrecision: the resolved param and reduce dtypes (`entry` may
  // be null: the defaults).
  Status ReadMixedPrecision(const Entry* entry, std::string_view path, const Plan& plan,
                            traces::DType* param_dtype, traces::DType* reduce_dtype) const;
  // {replicate, shard}, either may be omitted; replicate x shard must be the world size.
  Status ReadMesh(const Entry& entry, std::string_view path, int32_t world_size,
                  DataParallelMesh* out) const;
  // A count of units ahead, or a mapping unit -> [units] (FSDP2 explicit prefetch).
  Status ReadPrefetch(const Entry& entry, std::string_view path, std::string_view method,
                      const Fsdp2Config& wrap, int32_t layers, int32_t* count,
                      std::map<std::string, std::vector<std::string>>* units) const;
  Status CheckUnitName(const YAML::Node& node, std::string_view path, std::string_view method,
                       const Fsdp2Config& wrap, int32_t layers) const;
  // A whole number of elements: an integer, or a float such as 5e8 with no fractional part
  // (DeepSpeed configs write sizes that way; pydantic turns them into ints).
  Status ReadElementCount(const Entry& entry, std::string_view path, int64_t min,
                          int64_t* out) const;
  Status ReadHost(const Entry& entry, HostConfig* out) const;
  Status ReadHostField(const Fields& fields, std::string_view key, int64_t* out_ns) const;
  Status ReadAllocator(const Entry& entry, int32_t world_size, MemoryPlan* out) const;
  Status ReadOom(const Entry& entry, const Plan& plan, OomConfig* out) const;

  // The plan of an already loaded YAML document (Parse minus the text checks).
  StatusOr<Plan> ParseRoot(const YAML::Node& root, const std::string& text) const;
  // divergence: slowdowns, and the variants (seq_len, moe_load, overrides) each re-read from
  // `text` with the variant's keys merged in, so every check of a plan applies to them too.
  Status ReadDivergence(const Entry& entry, const std::string& text, Plan* plan) const;
  // A mapping rank -> number in (min, max]; ranks below the world size.
  Status ReadRankNumbers(const Entry& entry, std::string_view path, int32_t world_size, double min,
                         double max, std::vector<std::pair<int32_t, Entry>>* out) const;

  // ---- framework config files (plan_sources.h) ----
  // What the config files leave for later: values that need the model or the world size.
  struct PendingSources {
    bool deepspeed = false;
    DeepSpeedSettings deepspeed_settings;
    std::vector<PlanSetting> auto_sizes;  // zero.* "auto": HF fills them from model.hidden
    std::string deepspeed_file;
    bool torchtitan = false;
    TorchtitanSettings torchtitan_settings;
    int64_t sliding_window = 0;  // hf_config: seq_len must stay within it
    std::string sliding_window_origin;
  };
  // Reads the files the plan names (model.hf_config, zero.deepspeed_config,
  // torchtitan.job_config) and merges their settings into `root`, before anything is read.
  StatusOr<PendingSources> ReadSources(YAML::Node root) const;
  // After the model and the cluster are read: the DeepSpeed batch and "auto" sizes, the
  // torchtitan gradient accumulation.
  Status ApplyPendingSources(const PendingSources& pending, YAML::Node root,
                             const Plan& plan) const;
  // Sets `setting` in `root`. Where the plan already has the key: the plan wins (`plan_wins`,
  // hf_config's rule) or a different value is an error naming both places.
  Status MergeSetting(YAML::Node root, const PlanSetting& setting, bool plan_wins) const;
  // A config file's text, its path resolved against the plan's folder.
  StatusOr<std::string> ReadSourceFile(const Entry& entry, std::string_view path,
                                       std::string_view what, std::string* resolved) const;
  // The origin of a merged value at `path` (or the section holding it, or a value in it).
  const std::string* OriginOf(std::string_view path) const;

  const std::string& source_;
  // Plan key path -> "file:line:column (key)" of the values merged from config files.
  mutable std::map<std::string, std::string, std::less<>> origins_;
};

StatusOr<Fields> PlanParser::ReadMapping(const YAML::Node& node, const YAML::Mark& mark,
                                         std::string_view path, KeyList allowed) const {
  const std::string shown_path = path.empty() ? std::string("(top level)") : std::string(path);
  if (!node.IsMap()) {
    return Error(mark, shown_path, fmt::format("a mapping with keys {}", JoinNames(allowed)),
                 Describe(node));
  }
  Fields fields;
  fields.mark = mark;
  // Copies, not references: yaml-cpp's iterator yields a temporary pair, and a reference
  // into it dangles after the statement.
  for (const auto& pair : node) {
    const YAML::Node key = pair.first;
    if (!key.IsScalar()) {
      return Error(key.Mark(), shown_path,
                   fmt::format("a plain key (one of {})", JoinNames(allowed)), Describe(key));
    }
    const std::string& name = key.Scalar();
    bool known = false;
    for (std::string_view allowed_key : allowed) known = known || allowed_key == name;
    if (!known) {
      return Error(key.Mark(), JoinPath(path, name),
                   fmt::format("one of the keys {}", JoinNames(allowed)),
                   fmt::format("unknown key {}", Quote(name)));
    }
    if (const Entry* first = fields.Find(name); first != nullptr) {
      return Error(key.Mark(), JoinPath(path, name), "each key at most once",
                   fmt::format("a duplicate (first at line {})", first->key_node.Mark().line + 1));
    }
    fields.entries.push_back(Entry{name, key, pair.second});
  }
  return fields;
}

Status PlanParser::Require(const Fields& fields, std::string_view parent, std::string_view key,
                           std::string_view expected) const {
  if (fields.Find(key) != nullptr) return Status::Ok();
  return Error(fields.mark, JoinPath(parent, key), expected, "nothing (the key is missing)");
}

Status PlanParser::ReadInt(const Entry& entry, std::string_view path, int64_t min, int64_t max,
                           int64_t* out) const {
  const std::string expected = ExpectedInt(min, max);
  if (!entry.value.IsScalar() || IsQuoted(entry.value)) return Error(entry, path, expected);
  std::string_view text = entry.value.Scalar();
  if (text.size() > 1 && text[0] == '+' && text[1] >= '0' && text[1] <= '9') text.remove_prefix(1);
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec == std::errc() && end == text.data() + text.size()) {
    if (value < min || value > max) return Error(entry, path, expected);
    *out = value;
    return Status::Ok();
  }
  // Name the common mistake: a float where an integer belongs.
  double as_double = 0;
  const auto [dend, dec] = std::from_chars(text.data(), text.data() + text.size(), as_double);
  if (ec != std::errc::result_out_of_range && dec == std::errc() &&
      dend == text.data() + text.size()) {
    return Error(MarkOf(entry), path, expected,
                 fmt::format("{} (not an integer)", Describe(entry.value)));
  }
  return Error(entry, path, expected);
}

Status PlanParser::ReadInt32(const Entry& entry, std::string_view path, int64_t min, int64_t max,
                             int32_t* out) const {
  int64_t value = 0;
  SHARDSCOPE_RETURN_IF_ERROR(ReadInt(entry, path, min, max, &value));
  *out = static_cast<int32_t>(value);  // every int32 field's max is below 2^31
  return Status::Ok();
}

Status PlanParser::ReadNumber(const Entry& entry, std::string_view path, double min,
                              bool exclusive_min, double max, double* out) const {
  const std::string expected =
      fmt::format("a number {} {} and <= {}", exclusive_min ? ">" : ">=", min, max);
  if (!entry.value.IsScalar() || IsQuoted(entry.value)) return Error(entry, path, expected);
  std::string_view text = entry.value.Scalar();
  if (text.size() > 1 && text[0] == '+' && text[1] >= '0' && text[1] <= '9') text.remove_prefix(1);
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  // from_chars accepts "inf" and "nan"; a plan value must be finite.
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value) ||
      value < min || (exclusive_min && value == min) || value > max) {
    return Error(entry, path, expected);
  }
  *out = value;
  return Status::Ok();
}

Status PlanParser::ReadBool(const Entry& entry, std::string_view path, bool* out) const {
  // YAML 1.2 core schema booleans only: yes/no/on/off are strings there, so they are refused
  // rather than guessed.
  if (std::optional<bool> value = AsBool(entry.value)) {
    *out = *value;
    return Status::Ok();
  }
  return Error(entry, path, "true or false");
}

Status PlanParser::ReadString(const Entry& entry, std::string_view path, std::string_view expected,
                              std::string* out) const {
  if (!entry.value.IsScalar() || entry.value.Scalar().empty()) {
    return Error(entry, path, expected);
  }
  *out = entry.value.Scalar();
  return Status::Ok();
}

template <typename Enum, size_t N>
Status PlanParser::ReadEnum(const Entry& entry, std::string_view path,
                            const std::array<EnumName<Enum>, N>& table, Enum* out) const {
  if (entry.value.IsScalar()) {
    for (const auto& candidate : table) {
      if (candidate.name == entry.value.Scalar()) {
        *out = candidate.value;
        return Status::Ok();
      }
    }
  }
  return Error(entry, path, fmt::format("one of {}", EnumNames(table)));
}

Status PlanParser::ReadStrategy(const Entry& entry, Strategy* out) const {
  if (entry.value.IsScalar()) {
    for (const StrategyAlias& alias : kStrategyAliases) {
      if (alias.name == entry.value.Scalar()) {
        return Error(MarkOf(entry), "strategy", fmt::format("one of {}", EnumNames(kStrategies)),
                     fmt::format("{} ({})", Describe(entry.value), alias.instead));
      }
    }
  }
  return ReadEnum(entry, "strategy", kStrategies, out);
}

// ---- model ----------------------------------------------------------------------------------

Status PlanParser::ReadModel(const Entry& entry, ModelSpec* out) const {
  const std::string presets = JoinNames(ModelPresetNames());
  if (entry.value.IsScalar()) {
    auto preset = FindModelPreset(entry.value.Scalar());
    if (!preset.ok()) {
      return Error(entry, "model", fmt::format("a model preset ({}) or a mapping", presets));
    }
    *out = std::move(preset).value();
    return Status::Ok();
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(Fields fields,
                              ReadMapping(entry.value, MarkOf(entry), "model", kModelKeys));
  ModelSpec model;
  bool from_preset = false;
  if (const Entry* preset_entry = fields.Find("preset"); preset_entry != nullptr) {
    const std::string expected = fmt::format("a model preset ({})", presets);
    std::string name;
    SHARDSCOPE_RETURN_IF_ERROR(ReadString(*preset_entry, "model.preset", expected, &name));
    auto preset = FindModelPreset(name);
    if (!preset.ok()) return Error(*preset_entry, "model.preset", expected);
    model = std::move(preset).value();
    from_preset = true;
  } else {
    // A model from scratch needs its shape; everything else has a default.
    for (std::string_view key : {"layers", "hidden", "heads", "ffn", "vocab"}) {
      SHARDSCOPE_RETURN_IF_ERROR(
          Require(fields, "model", key,
                  "a positive integer (a model without 'preset' must give layers, hidden, "
                  "heads, ffn and vocab)"));
    }
    model.name = "custom";
  }
  bool modified = false;
  SHARDSCOPE_RETURN_IF_ERROR(ReadModelFields(fields, &model, &modified));
  if (!from_preset && fields.Find("kv_heads") == nullptr) model.kv_heads = model.heads;
  // A changed preset must not be reported under the preset's own name.
  if (from_preset && modified && fields.Find("name") == nullptr) model.name += " (modified)";

  if (Status status = ValidateModel(model); !status.ok()) {
    return Status::InvalidInput(
        fmt::format("{}: model: {}", Where(MarkOf(entry)), status.message()));
  }
  // Keeps ParameterCount and the byte arithmetic built on it inside int64_t.
  const double h = static_cast<double>(model.hidden);
  const double per_layer = 4 * h * h + 3 * h * static_cast<double>(model.ffn) * model.experts +
                           h * model.experts + 8 * h;
  const double parameters = model.layers * per_layer + 2 * static_cast<double>(model.vocab) * h +
                            static_cast<double>(model.max_positions) * h;
  if (parameters > kMaxParameters) {
    return Error(MarkOf(entry), "model", "at most 2^50 parameters",
                 fmt::format("about {:.3g} parameters", parameters));
  }
  *out = std::move(model);
  return Status::Ok();
}

Status PlanParser::ReadModelFields(const Fields& fields, ModelSpec* model, bool* modified) const {
  for (const Entry& entry : fields.entries) {
    const std::string path = JoinPath("model", entry.key);
    const std::string_view key = entry.key;
    if (key == "preset") continue;
    if (key != "name") *modified = true;
    if (key == "name") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadString(entry, path, "a non-empty name", &model->name));
    } else if (key == "layers") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadInt32(entry, path, 1, kMaxLayers, &model->layers));
    } else if (key == "hidden") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadInt(entry, path, 1, kMaxHidden, &model->hidden));
    } else if (key == "heads") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadInt32(entry, path, 1, kMaxHeads, &model->heads));
    } else if (key == "kv_heads") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadInt32(entry, path, 1, kMaxHeads, &model->kv_heads));
    } else if (key == "ffn") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadInt(entry, path, 1, kMaxFfn, &model->ffn));
    } else if (key == "vocab") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadInt(entry, path, 1, kMaxVocab, &model->vocab));
    } else if (key == "max_positions") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadInt(entry, path, 0, kMaxPositions, &model->max_positions));
    } else if (key == "learned_positions") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(entry, path, &model->learned_positions));
    } else if (key == "tied_embeddings") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(entry, path, &model->tied_embeddings));
    } else if (key == "bias") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(entry, path, &model->bias));
    } else if (key == "mlp") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadEnum(entry, path, kMlpKinds, &model->mlp));
    } else if (key == "norm") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadEnum(entry, path, kNormKinds, &model->norm));
    } else if (key == "attention") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadEnum(entry, path, kAttentionKinds, &model->attention));
    } else if (key == "experts") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadInt32(entry, path, 1, kMaxExperts, &model->experts));
    } else if (key == "experts_per_token") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadInt32(entry, path, 1, kMaxExperts, &model->experts_per_token));
    } else if (key == "alibi") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(entry, path, &model->alibi));
    } else if (key == "norm_bias") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(entry, path, &model->norm_bias));
    } else if (key == "reserved_position_rows") {
      SHARDSCOPE_RETURN_IF_ERROR(
          ReadInt(entry, path, 0, kMaxPositions, &model->reserved_position_rows));
    } else if (key == "token_types") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadInt(entry, path, 0, kMaxTokenTypes, &model->token_types));
    } else if (key == "embedding_norm") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(entry, path, &model->embedding_norm));
    } else if (key == "post_norm") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(entry, path, &model->post_norm));
    } else if (key == "lm_head_transform") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(entry, path, &model->lm_head_transform));
    } else if (key == "fused_qkv") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(entry, path, &model->fused_qkv));
    } else if (key == "dropout") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadNumber(entry, path, 0, false, kMaxDropout, &model->dropout));
      if (!(model->dropout < 1)) return Error(entry, path, "a dropout probability in [0, 1)");
    }
  }
  return Status::Ok();
}

// ---- cluster --------------------------------------------------------------------------------

Status PlanParser::ReadCluster(const Entry& entry, ClusterSpec* cluster,
                               ContentionConfig* contention) const {
  const std::string presets = JoinNames(ClusterPresetNames());
  if (entry.value.IsScalar()) {
    auto preset = FindClusterPreset(entry.value.Scalar(), 1);
    if (!preset.ok()) {
      return Error(entry, "cluster", fmt::format("a cluster preset ({}) or a mapping", presets));
    }
    *cluster = std::move(preset).value();
    return Status::Ok();
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(Fields fields,
                              ReadMapping(entry.value, MarkOf(entry), "cluster", kClusterKeys));

  int32_t nodes = 1;
  if (const Entry* e = fields.Find("nodes")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadInt32(*e, "cluster.nodes", 1, kMaxWorldSize, &nodes));
  }
  ClusterSpec spec;
  if (const Entry* e = fields.Find("preset")) {
    const std::string expected = fmt::format("a cluster preset ({})", presets);
    std::string name;
    SHARDSCOPE_RETURN_IF_ERROR(ReadString(*e, "cluster.preset", expected, &name));
    auto preset = FindClusterPreset(name, nodes);
    if (!preset.ok()) return Error(*e, "cluster.preset", expected);
    spec = std::move(preset).value();
  } else {
    // A cluster from scratch: the GPU and its links must be named.
    const std::string why =
        "(a cluster without 'preset' must give gpu, gpus_per_node and "
        "intra_node_bandwidth_gbps)";
    SHARDSCOPE_RETURN_IF_ERROR(
        Require(fields, "cluster", "gpu", fmt::format("a GPU preset {}", why)));
    SHARDSCOPE_RETURN_IF_ERROR(
        Require(fields, "cluster", "gpus_per_node", fmt::format("a positive integer {}", why)));
    SHARDSCOPE_RETURN_IF_ERROR(Require(fields, "cluster", "intra_node_bandwidth_gbps",
                                       fmt::format("a number > 0 {}", why)));
    if (nodes > 1) {
      SHARDSCOPE_RETURN_IF_ERROR(Require(fields, "cluster", "inter_node_bandwidth_gbps",
                                         "a number > 0 (a multi-node cluster without 'preset' "
                                         "must give the network bandwidth)"));
    }
    spec.name = "custom";
    spec.nodes = nodes;
  }

  // The GPU swap comes before the numeric overrides so gpu_memory_gb applies to the new GPU.
  if (const Entry* e = fields.Find("gpu")) {
    const std::string expected = fmt::format("a GPU preset ({})", JoinNames(GpuPresetNames()));
    std::string name;
    SHARDSCOPE_RETURN_IF_ERROR(ReadString(*e, "cluster.gpu", expected, &name));
    auto gpu = FindGpuPreset(name);
    if (!gpu.ok()) return Error(*e, "cluster.gpu", expected);
    spec.gpu = std::move(gpu).value();
  }
  if (const Entry* e = fields.Find("gpus_per_node")) {
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadInt32(*e, "cluster.gpus_per_node", 1, kMaxWorldSize, &spec.gpus_per_node));
  }
  // world_size() multiplies two int32_t; check the product in 64 bits first.
  const int64_t world = int64_t{spec.gpus_per_node} * int64_t{spec.nodes};
  if (world > kMaxWorldSize) {
    const Entry* e = fields.Find("nodes");
    if (e == nullptr) e = fields.Find("gpus_per_node");
    return Error(e != nullptr ? MarkOf(*e) : fields.mark, "cluster",
                 fmt::format("a world size (nodes x gpus_per_node) <= {}", kMaxWorldSize),
                 fmt::format("{} x {} = {}", spec.nodes, spec.gpus_per_node, world));
  }
  double value = 0;
  if (const Entry* e = fields.Find("intra_node_bandwidth_gbps")) {
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadNumber(*e, "cluster.intra_node_bandwidth_gbps", 0, true, kMaxBandwidthGbps, &value));
    spec.intra_node_bandwidth = value * kBytesPerGbps;
  }
  if (const Entry* e = fields.Find("inter_node_bandwidth_gbps")) {
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadNumber(*e, "cluster.inter_node_bandwidth_gbps", 0, true, kMaxBandwidthGbps, &value));
    spec.inter_node_bandwidth = value * kBytesPerGbps;
  }
  if (const Entry* e = fields.Find("gpu_memory_gb")) {
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadNumber(*e, "cluster.gpu_memory_gb", 0, true, kMaxGpuMemoryGb, &value));
    spec.gpu.hbm_bytes = std::llround(value * kBytesPerMemoryGb);
  }
  if (const Entry* e = fields.Find("contention")) {
    SHARDSCOPE_ASSIGN_OR_RETURN(
        Fields inner, ReadMapping(e->value, MarkOf(*e), "cluster.contention", kContentionKeys));
    if (const Entry* c = inner.Find("compute_slowdown")) {
      SHARDSCOPE_RETURN_IF_ERROR(ReadNumber(*c, "cluster.contention.compute_slowdown", 0, false,
                                            kMaxSlowdown, &contention->compute_slowdown));
    }
    if (const Entry* c = inner.Find("comm_slowdown")) {
      SHARDSCOPE_RETURN_IF_ERROR(ReadNumber(*c, "cluster.contention.comm_slowdown", 0, false,
                                            kMaxSlowdown, &contention->comm_slowdown));
    }
  }
  *cluster = std::move(spec);
  return Status::Ok();
}

// ---- training, strategy sections, host -------------------------------------------------------

Status PlanParser::ReadTraining(const Entry& entry, const GpuSpec& gpu, TrainingConfig* out,
                                bool* dtype_given, YAML::Mark* seq_len_mark,
                                YAML::Mark* dtype_mark, YAML::Mark* kernels_mark) const {
  SHARDSCOPE_ASSIGN_OR_RETURN(Fields fields,
                              ReadMapping(entry.value, MarkOf(entry), "training", kTrainingKeys));
  if (const Entry* e = fields.Find("seq_len")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadInt(*e, "training.seq_len", 1, kMaxSeqLen, &out->seq_len));
    *seq_len_mark = MarkOf(*e);
  }
  if (const Entry* e = fields.Find("micro_batch_size")) {
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadInt(*e, "training.micro_batch_size", 1, kMaxMicroBatch, &out->micro_batch_size));
  }
  if (const Entry* e = fields.Find("grad_accum_steps")) {
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadInt32(*e, "training.grad_accum_steps", 1, kMaxGradAccum, &out->grad_accum_steps));
  }
  if (const Entry* e = fields.Find("activation_checkpointing")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadEnum(*e, "training.activation_checkpointing", kCheckpointing,
                                        &out->activation_checkpointing));
  }
  if (const Entry* e = fields.Find("selective_ac_every")) {
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadInt32(*e, "training.selective_ac_every", 1, kMaxLayers, &out->selective_ac_every));
    // torchtitan reads selective_ac_option only in selective mode; here a value that would be
    // ignored is a mistake worth naming.
    if (out->activation_checkpointing != ActivationCheckpointing::kSelective) {
      return KeyError(*e, "training.selective_ac_every",
                      "no selective_ac_every unless activation_checkpointing is selective",
                      fmt::format("selective_ac_every with activation_checkpointing {}",
                                  NameOf(kCheckpointing, out->activation_checkpointing)));
    }
  }
  if (const Entry* e = fields.Find("max_grad_norm")) {
    // clip_grad_norm_(max_norm); 0 here means no clipping at all.
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadNumber(*e, "training.max_grad_norm", 0, false, kMaxGradNorm, &out->max_grad_norm));
  }
  if (const Entry* e = fields.Find("precision")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadEnum(*e, "training.precision", kPrecisions, &out->precision));
  }
  if (const Entry* e = fields.Find("pytorch_version")) {
    // The scalar's text as written: an unquoted 2.10 must not become the float 2.1.
    const std::string expected = "a PyTorch release as \"major.minor\" (e.g. \"2.5\"), from 1.8";
    if (!e->value.IsScalar()) return Error(*e, "training.pytorch_version", expected);
    const std::string text = e->value.Scalar();
    int32_t major = 0, minor = 0;
    const char* begin = text.data();
    const char* end = text.data() + text.size();
    auto [p1, ec1] = std::from_chars(begin, end, major);
    bool ok = ec1 == std::errc() && p1 < end && *p1 == '.';
    if (ok) {
      auto [p2, ec2] = std::from_chars(p1 + 1, end, minor);
      // An optional patch release: "2.4.1".
      int32_t patch = 0;
      ok = ec2 == std::errc() &&
           (p2 == end || (*p2 == '.' && std::from_chars(p2 + 1, end, patch).ptr == end && patch >= 0));
    }
    if (!ok || major < 1 || minor < 0 || major > kMaxPytorchMajor || minor > kMaxPytorchMinor ||
        (major == 1 && minor < 8)) {
      return Error(*e, "training.pytorch_version", expected);
    }
    out->pytorch_major = major;
    out->pytorch_minor = minor;
    *kernels_mark = MarkOf(*e);
  }
  if (const Entry* e = fields.Find("implementation")) {
    ModelImplementation implementation = ModelImplementation::kTorchtitan;
    SHARDSCOPE_RETURN_IF_ERROR(ReadEnum(*e, "training.implementation", kImplementations, &implementation));
    out->implementation = implementation;
  }
  if (const Entry* e = fields.Find("compile")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadBool(*e, "training.compile", &out->compile));
  }
  if (const Entry* e = fields.Find("attention")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadEnum(*e, "training.attention", kAttentionChoices, &out->attention));
    *kernels_mark = MarkOf(*e);
  }
  if (const Entry* e = fields.Find("rms_norm")) {
    RmsNormKernel kernel = RmsNormKernel::kFused;
    SHARDSCOPE_RETURN_IF_ERROR(ReadEnum(*e, "training.rms_norm", kRmsNormKernels, &kernel));
    out->rms_norm = kernel;
  }
  if (const Entry* e = fields.Find("dtype")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadEnum(*e, "training.dtype", kTrainingDTypes, &out->dtype));
    if (!DTypeSupported(gpu, out->dtype)) {
      return Error(*e, "training.dtype", ExpectedDType(gpu));
    }
    *dtype_given = true;
    *dtype_mark = MarkOf(*e);
  }
  return Status::Ok();
}

// What PyTorch and the framework code launch for this job (model.h KernelChoices).
Status PlanParser::ResolveKernelChoices(const YAML::Mark& mark, Plan* plan) const {
  TrainingConfig& t = plan->training;
  KernelChoices& k = t.kernels;
  const auto at_least = [&t](int32_t major, int32_t minor) {
    return t.pytorch_major > major || (t.pytorch_major == major && t.pytorch_minor >= minor);
  };
  const auto is = [&t](int32_t major, int32_t minor) { return t.pytorch_major == major && t.pytorch_minor == minor; };
  // The framework whose model code runs: torchtitan drives FSDP2; DeepSpeed, FSDP1 and DDP jobs
  // usually train transformers' models.
  k.implementation = t.implementation.value_or(plan->strategy == Strategy::kFsdp2 ? ModelImplementation::kTorchtitan
                                                                                : ModelImplementation::kHuggingFace);
  k.compile = t.compile;
  // The loss: transformers computes it inside the compiled forward. torchtitan left it out
  // through 2024 (train.py: "TODO: compiling loss function causes CUDA errors, turning off
  // for now") and compiles it from 2025 (components/loss.py build_cross_entropy_loss, later
  // compile.components); PyTorch 2.7 (April 2025) is taken as the boundary — an ESTIMATE of
  // the date, the framework's version is not a plan key.
  k.compile_loss = t.compile && (k.implementation != ModelImplementation::kTorchtitan || at_least(2, 7));
  // RMSNorm: transformers' LlamaRMSNorm is Python; torchtitan uses nn.RMSNorm, whose ATen op is
  // composite from PyTorch 2.4 (PR #121364) and dispatches to the fused CUDA kernel from 2.9
  // (PR #153666 merged after the 2.8 branch cut of 2025-06-24 and before 2.9's of 2025-09-08);
  // before 2.4 torchtitan's norms.py had its own Python RMSNorm.
  if (t.rms_norm) {
    k.rms_norm = *t.rms_norm;
  } else if (k.implementation == ModelImplementation::kHuggingFace || !at_least(2, 4)) {
    k.rms_norm = RmsNormKernel::kPython;
  } else {
    k.rms_norm = at_least(2, 9) ? RmsNormKernel::kFused : RmsNormKernel::kComposite;
  }
  // Attention. scaled_dot_product_attention exists from PyTorch 2.0; before it every framework
  // ran the unfused path. Its dispatch (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp):
  // flash needs sm80+ (FlashAttention-2 from 2.2), so Volta takes the memory-efficient kernel;
  // on Hopper cuDNN comes first in 2.5.0 (PyTorch 2.5 release blog), was deprioritized again
  // for 2.6 (PR #141274), and is preferred again once the bundled cuDNN passes the runtime gate
  // cudnn_version > 91500: the CUDA 12.8 wheels of 2.11 ship cuDNN 9.17.1 (RELEASE.md
  // compatibility matrix), 2.9's and 2.10's 9.10.2 (issue #165801, PR #171895).
  const GpuArch arch = plan->cluster.gpu.arch;
  k.eager_attention = false;
  switch (t.attention) {
    case AttentionChoice::kSdpa:
      if (!at_least(2, 0)) {
        k.eager_attention = true;
      } else if (arch == GpuArch::kVolta) {
        k.attention = traces::AttentionImpl::kMemEfficient;
      } else if (arch == GpuArch::kHopper && (is(2, 5) || at_least(2, 11))) {
        k.attention = traces::AttentionImpl::kCudnn;
      } else {
        k.attention = traces::AttentionImpl::kFlash2;
      }
      break;
    case AttentionChoice::kEager: k.eager_attention = true; break;
    case AttentionChoice::kFlash2: k.attention = traces::AttentionImpl::kFlash2; break;
    case AttentionChoice::kFlash3: k.attention = traces::AttentionImpl::kFlash3; break;
    case AttentionChoice::kCudnn: k.attention = traces::AttentionImpl::kCudnn; break;
    case AttentionChoice::kMemEfficient: k.attention = traces::AttentionImpl::kMemEfficient; break;
  }
  if (!k.eager_attention && !AttentionSupported(k.attention, arch)) {
    std::vector<std::string> supported;
    for (const auto& [name, choice] : kAttentionChoices) {
      if (choice == AttentionChoice::kSdpa || choice == AttentionChoice::kEager) continue;
      const auto impl = traces::ParseAttentionImpl(name);
      if (impl && AttentionSupported(*impl, arch)) supported.push_back(std::string(name));
    }
    return Error(mark, "training.attention",
                 fmt::format("an attention kernel with published measurements on {} ({}, sdpa or eager)",
                             plan->cluster.gpu.name, fmt::join(supported, ", ")),
                 Quote(traces::AttentionImplName(k.attention)));
  }
  // Grouped-query attention: the unfused path and torchtitan's model code until its
  // "GQA without kv repeats" change (pytorch/torchtitan PR #2259, early 2026: modelled from
  // PyTorch 2.11) materialize K and V per query head (repeat_kv); transformers' SDPA path
  // passes enable_gqa from PyTorch 2.5 (integrations/sdpa_attention.py use_gqa_in_sdpa).
  k.repeat_kv = k.eager_attention ||
                (k.implementation == ModelImplementation::kTorchtitan ? !at_least(2, 11) : !at_least(2, 5));
  // The unfused path materializes batch x heads x seq^2 scores: keep their byte counts in range.
  if (k.eager_attention) {
    const double scores = static_cast<double>(t.micro_batch_size) * plan->model.heads *
                          static_cast<double>(t.seq_len) * static_cast<double>(t.seq_len);
    if (scores > kMaxActivationElements) {
      return Error(mark, "training.attention",
                   "a fused kernel for this length (the unfused path's batch x heads x seq^2 scores exceed 2^50)",
                   "eager");
    }
  }
  return Status::Ok();
}

// ---- strategy sections ----------------------------------------------------------------------

StatusOr<Fields> PlanParser::SectionFields(const Entry* entry, std::string_view path,
                                           KeyList allowed) const {
  if (entry == nullptr) return Fields{};
  return ReadMapping(entry->value, MarkOf(*entry), path, allowed);
}

Status PlanParser::KeyError(const Entry& entry, std::string_view path, std::string_view expected,
                            std::string_view got) const {
  return Error(entry.key_node.Mark(), path, expected, got);
}

template <typename Enum, size_t N>
Status PlanParser::ReadEnumOrNull(const Entry& entry, std::string_view path,
                                  const std::array<EnumName<Enum>, N>& table, Enum* out,
                                  bool* is_null) const {
  *is_null = entry.value.IsNull();
  if (*is_null) return Status::Ok();
  if (entry.value.IsScalar()) {
    for (const auto& candidate : table) {
      if (candidate.name == entry.value.Scalar()) {
        *out = candidate.value;
        return Status::Ok();
      }
    }
  }
  return Error(entry, path, fmt::format("one of {} or null", EnumNames(table)));
}

Status PlanParser::ReadElementCount(const Entry& entry, std::string_view path, int64_t min,
                                    int64_t* out) const {
  const std::string expected = fmt::format(
      "a whole number of elements in [{}, 2^50] (an integer, or a float such as 5e8)", min);
  if (!entry.value.IsScalar() || IsQuoted(entry.value)) return Error(entry, path, expected);
  std::string_view text = entry.value.Scalar();
  if (text.size() > 1 && text[0] == '+' && text[1] >= '0' && text[1] <= '9') text.remove_prefix(1);
  int64_t integer = 0;
  const auto [iend, iec] = std::from_chars(text.data(), text.data() + text.size(), integer);
  if (iec == std::errc() && iend == text.data() + text.size()) {
    if (integer < min || integer > kMaxZeroElements) return Error(entry, path, expected);
    *out = integer;
    return Status::Ok();
  }
  double value = 0;
  const auto [dend, dec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (dec != std::errc() || dend != text.data() + text.size() || !std::isfinite(value) ||
      value < static_cast<double>(min) || value > static_cast<double>(kMaxZeroElements)) {
    return Error(entry, path, expected);
  }
  if (std::floor(value) != value) {
    return Error(MarkOf(entry), path, expected,
                 fmt::format("{} (not a whole number)", Describe(entry.value)));
  }
  *out = static_cast<int64_t>(value);
  return Status::Ok();
}

Status PlanParser::ReadMesh(const Entry& entry, std::string_view path, int32_t world_size,
                            DataParallelMesh* out) const {
  SHARDSCOPE_ASSIGN_OR_RETURN(Fields fields,
                              ReadMapping(entry.value, MarkOf(entry), path, kMeshKeys));
  const Entry* replicate_entry = fields.Find("replicate");
  const Entry* shard_entry = fields.Find("shard");
  const std::string replicate_path = JoinPath(path, "replicate");
  const std::string shard_path = JoinPath(path, "shard");
  int32_t replicate = 1;
  int32_t shard = world_size;
  if (replicate_entry != nullptr) {
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadInt32(*replicate_entry, replicate_path, 1, kMaxWorldSize, &replicate));
  }
  if (shard_entry != nullptr) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadInt32(*shard_entry, shard_path, 1, kMaxWorldSize, &shard));
  }
  // A DeviceMesh covers every rank of the job: init_device_mesh lays arange(world) out in the
  // mesh shape, and the data-parallel mesh is all of it here (no TP/PP dimensions).
  const std::string world = fmt::format("the world size {} (nodes x gpus_per_node)", world_size);
  if (replicate_entry != nullptr && shard_entry == nullptr) {
    if (world_size % replicate != 0) {
      return Error(*replicate_entry, replicate_path, fmt::format("a divisor of {}", world));
    }
    shard = world_size / replicate;
  } else if (shard_entry != nullptr && replicate_entry == nullptr) {
    if (world_size % shard != 0) {
      return Error(*shard_entry, shard_path, fmt::format("a divisor of {}", world));
    }
    replicate = world_size / shard;
  } else if (int64_t{replicate} * shard != world_size) {
    return Error(MarkOf(entry), std::string(path), fmt::format("replicate x shard = {}", world),
                 fmt::format("{} x {} = {}", replicate, shard, int64_t{replicate} * shard));
  }
  out->replicate = replicate;
  out->shard = shard;
  return Status::Ok();
}

Status PlanParser::ReadMixedPrecision(const Entry* entry, std::string_view path, const Plan& plan,
                                      traces::DType* param_dtype,
                                      traces::DType* reduce_dtype) const {
  // torchtitan's job config defaults are mixed_precision_param "bfloat16" and
  // mixed_precision_reduce "float32". The plan takes the param dtype from training.dtype
  // (bf16 by default, torchtitan's value): parameters are all-gathered and computed in the
  // training dtype; fp8 training keeps bf16 parameters (torchao Float8Linear casts per GEMM)
  // and fp32 training casts nothing.
  traces::DType param = plan.training.dtype == traces::DType::kFloat8E4M3
                            ? traces::DType::kBFloat16
                            : plan.training.dtype;
  // Pure bf16 (torchtune) applies no MixedPrecisionPolicy: the bf16 parameters are gathered
  // as they are and the gradients reduced in their own dtype.
  traces::DType reduce =
      plan.training.precision == Precision::kPureBf16 ? traces::DType::kBFloat16 : traces::DType::kFloat32;
  SHARDSCOPE_ASSIGN_OR_RETURN(Fields fields, SectionFields(entry, path, kMixedPrecisionKeys));
  if (const Entry* e = fields.Find("param_dtype")) {
    const std::string field_path = JoinPath(path, "param_dtype");
    bool is_null = false;
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadEnumOrNull(*e, field_path, kMixedPrecisionDTypes, &param, &is_null));
    // MixedPrecisionPolicy(param_dtype=None) / MixedPrecision(param_dtype=None): no cast,
    // the parameters keep their original (fp32) dtype.
    if (is_null) param = traces::DType::kFloat32;
    if (!DTypeSupported(plan.cluster.gpu, param)) {
      return Error(*e, field_path, ExpectedDType(plan.cluster.gpu));
    }
  }
  if (const Entry* e = fields.Find("reduce_dtype")) {
    bool is_null = false;
    SHARDSCOPE_RETURN_IF_ERROR(ReadEnumOrNull(*e, JoinPath(path, "reduce_dtype"),
                                              kMixedPrecisionDTypes, &reduce, &is_null));
    // reduce_dtype=None: gradients are reduced in the parameters' compute dtype
    // (FSDPParamGroup: reduce_dtype defaults to param_dtype; FSDP1 MixedPrecision the same).
    if (is_null) reduce = param;
  }
  *param_dtype = param;
  *reduce_dtype = reduce;
  return Status::Ok();
}

Status PlanParser::CheckUnitName(const YAML::Node& node, std::string_view path,
                                 std::string_view method, const Fsdp2Config& wrap,
                                 int32_t layers) const {
  const std::string expected = fmt::format(
      "a unit name ({}); {} takes only modules fully_shard was applied to "
      "(_assert_all_fsdp_modules, torch/distributed/fsdp/_fully_shard/_fully_shard.py)",
      Fsdp2UnitNames(wrap, layers), method);
  if (!node.IsScalar()) return Error(node.Mark(), path, expected, Describe(node));
  const std::string& name = node.Scalar();
  bool known = false;
  if (!wrap.root_only) {
    known = name == "embed" || name == "head";
    constexpr std::string_view kPrefix = "layers.";
    if (!known && name.size() > kPrefix.size() && name.compare(0, kPrefix.size(), kPrefix) == 0) {
      const std::string_view digits = std::string_view(name).substr(kPrefix.size());
      int32_t index = -1;
      const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
      const bool canonical = digits.size() == 1 || digits[0] != '0';  // "layers.01" is no name
      const int32_t k = std::max<int32_t>(1, wrap.blocks_per_unit);
      known = ec == std::errc() && end == digits.data() + digits.size() && canonical &&
              index >= 0 && index < layers && index % k == 0;
    }
  }
  if (!known) {
    return Error(node.Mark(), path, expected, fmt::format("unknown unit {}", Quote(name)));
  }
  return Status::Ok();
}

Status PlanParser::ReadPrefetch(const Entry& entry, std::string_view path, std::string_view method,
                                const Fsdp2Config& wrap, int32_t layers, int32_t* count,
                                std::map<std::string, std::vector<std::string>>* units) const {
  if (!entry.value.IsMap()) {
    int64_t value = 0;
    if (!ReadInt(entry, path, 0, kMaxLayers, &value).ok()) {
      return Error(entry, path,
                   fmt::format("a count of units to prefetch (0 to {}) or a mapping of unit "
                               "name to a list of unit names ({})",
                               kMaxLayers, method));
    }
    *count = static_cast<int32_t>(value);
    return Status::Ok();
  }
  for (const auto& pair : entry.value) {
    const YAML::Node key = pair.first;
    const YAML::Node value = pair.second;
    SHARDSCOPE_RETURN_IF_ERROR(CheckUnitName(key, path, method, wrap, layers));
    const std::string& name = key.Scalar();
    const std::string unit_path = JoinPath(path, name);
    if (units->count(name) != 0) {
      return Error(key.Mark(), unit_path, "each unit at most once", "a duplicate");
    }
    if (!value.IsSequence()) {
      return Error(value.IsNull() ? key.Mark() : value.Mark(), unit_path,
                   "a list of unit names to prefetch", Describe(value));
    }
    std::vector<std::string>& targets = (*units)[name];
    for (const auto& target : value) {
      SHARDSCOPE_RETURN_IF_ERROR(CheckUnitName(target, unit_path, method, wrap, layers));
      targets.push_back(target.Scalar());
    }
  }
  return Status::Ok();
}

Status PlanParser::ReadFsdp2(const Entry* entry, const Plan& plan, Fsdp2Config* out) const {
  SHARDSCOPE_ASSIGN_OR_RETURN(Fields fields, SectionFields(entry, "fsdp2", kFsdp2Keys));
  const int32_t world = plan.cluster.world_size();
  const int32_t layers = plan.model.layers;

  // The mesh first: the int form of reshard_after_forward and requires_all_reduce depend on
  // it. fully_shard(mesh=2-D) is HSDP (FSDPMeshInfo / HSDPMeshInfo, _fsdp_common.py).
  out->mesh = DataParallelMesh{1, world};
  if (const Entry* e = fields.Find("mesh")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadMesh(*e, "fsdp2.mesh", world, &out->mesh));
  }
  SHARDSCOPE_RETURN_IF_ERROR(ReadMixedPrecision(fields.Find("mixed_precision"),
                                                "fsdp2.mixed_precision", plan, &out->param_dtype,
                                                &out->reduce_dtype));

  if (const Entry* e = fields.Find("reshard_after_forward")) {
    const std::string path = "fsdp2.reshard_after_forward";
    const int32_t shard = out->mesh.shard;
    if (e->value.IsNull()) {
      // None: True for every module but the root, which keeps its parameters.
      out->reshard_after_forward = ReshardAfterForward::kNone;
    } else if (std::optional<bool> flag = AsBool(e->value)) {
      out->reshard_after_forward = *flag ? ReshardAfterForward::kTrue : ReshardAfterForward::kFalse;
    } else {
      // _get_post_forward_mesh_info (torch/distributed/fsdp/_fully_shard/_fsdp_init.py): an
      // int must be a factor of the shard mesh size ("If passing reshard_after_forward as an
      // int, it should be a factor of ..."); 1 becomes False (with a warning that it means
      // a world of one, not True) and the shard size itself becomes True.
      const std::string expected = fmt::format(
          "true, false, null or an int that is a factor of the shard mesh size {} (FSDP2: "
          "\"if passing reshard_after_forward as an int, it should be a factor of {}\")",
          shard, shard);
      int64_t size = 0;
      if (!ReadInt(*e, path, 1, shard, &size).ok() || shard % size != 0) {
        return Error(*e, path, expected);
      }
      out->reshard_after_forward_size = 0;
      if (size == 1) {
        out->reshard_after_forward = ReshardAfterForward::kFalse;
      } else if (size == shard) {
        out->reshard_after_forward = ReshardAfterForward::kTrue;
      } else {
        out->reshard_after_forward = ReshardAfterForward::kInt;
        out->reshard_after_forward_size = static_cast<int32_t>(size);
      }
    }
  }

  // Wrap granularity before the prefetch lists: it decides which unit names exist.
  if (const Entry* e = fields.Find("wrap")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadEnum(*e, "fsdp2.wrap", kWrapModes, &out->root_only));
  }
  if (const Entry* e = fields.Find("blocks_per_unit")) {
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadInt32(*e, "fsdp2.blocks_per_unit", 1, layers, &out->blocks_per_unit));
    if (out->root_only) {
      return KeyError(*e, "fsdp2.blocks_per_unit",
                      "no blocks_per_unit with wrap: root (one fully_shard on the whole model "
                      "has no block units)",
                      fmt::format("blocks_per_unit {} with wrap: root", out->blocks_per_unit));
    }
  }
  if (const Entry* e = fields.Find("forward_prefetch")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadPrefetch(*e, "fsdp2.forward_prefetch",
                                            "set_modules_to_forward_prefetch", *out, layers,
                                            &out->forward_prefetch, &out->forward_prefetch_units));
  }
  if (const Entry* e = fields.Find("backward_prefetch")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadPrefetch(
        *e, "fsdp2.backward_prefetch", "set_modules_to_backward_prefetch", *out, layers,
        &out->backward_prefetch, &out->backward_prefetch_units));
  }

  if (const Entry* e = fields.Find("requires_gradient_sync")) {
    // FSDPModule.set_requires_gradient_sync(bool): true reduces every micro-batch.
    if (std::optional<bool> flag = AsBool(e->value)) {
      out->requires_gradient_sync =
          *flag ? GradientSync::kEveryMicroBatch : GradientSync::kLastMicroBatch;
    } else if (!ReadEnum(*e, "fsdp2.requires_gradient_sync", kGradientSyncModes,
                         &out->requires_gradient_sync)
                    .ok()) {
      return Error(*e, "fsdp2.requires_gradient_sync",
                   "one of every_micro_batch, last_micro_batch, true (every micro-batch) or "
                   "false (the last only)");
    }
  }
  if (const Entry* e = fields.Find("gradient_sync_every_k_blocks")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadInt32(*e, "fsdp2.gradient_sync_every_k_blocks", 1, layers,
                                         &out->gradient_sync_every_k_blocks));
    if (out->requires_gradient_sync != GradientSync::kLastMicroBatch) {
      return KeyError(*e, "fsdp2.gradient_sync_every_k_blocks",
                      "no gradient_sync_every_k_blocks unless requires_gradient_sync is "
                      "last_micro_batch (it picks the blocks that still reduce every "
                      "micro-batch)",
                      "requires_gradient_sync every_micro_batch");
    }
  }
  if (const Entry* e = fields.Find("requires_all_reduce")) {
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadBool(*e, "fsdp2.requires_all_reduce", &out->requires_all_reduce));
    // FSDPModule.set_requires_all_reduce: HSDP only skips the all-reduce across replicas; a
    // 1-D mesh has no replicate dimension to skip.
    if (!out->requires_all_reduce && out->mesh.replicate == 1) {
      return Error(MarkOf(*e), "fsdp2.requires_all_reduce",
                   "true unless the mesh is HSDP (fsdp2.mesh.replicate > 1): "
                   "set_requires_all_reduce(False) skips the all-reduce across replicas",
                   "false with mesh.replicate 1");
    }
  }
  if (const Entry* e = fields.Find("reshard_after_backward")) {
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadBool(*e, "fsdp2.reshard_after_backward", &out->reshard_after_backward));
  }
  return Status::Ok();
}

Status PlanParser::ReadFsdp1(const Entry* entry, const Plan& plan, Fsdp1Config* out) const {
  SHARDSCOPE_ASSIGN_OR_RETURN(Fields fields, SectionFields(entry, "fsdp1", kFsdp1Keys));
  if (const Entry* e = fields.Find("implementation")) {
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadEnum(*e, "fsdp1.implementation", kFsdp1Implementations, &out->implementation));
  }
  const bool fairscale = out->implementation == Fsdp1Implementation::kFairscale;
  // fairscale's FullyShardedDataParallel.__init__ (fairscale/nn/data_parallel/
  // fully_sharded_data_parallel.py) takes process_group, reshard_after_forward,
  // mixed_precision, fp32_reduce_scatter, bucket_cap_mb, ...: none of torch FSDP1's
  // sharding_strategy, backward_prefetch, forward_prefetch or limit_all_gathers.
  auto reject_for_fairscale = [&](const Entry& e, std::string_view key) {
    return KeyError(
        e, JoinPath("fsdp1", key),
        fmt::format("no {} with implementation fairscale (fairscale's FullyShardedDataParallel "
                    "has no such argument; its own knobs are reshard_after_forward, "
                    "mixed_precision, fp32_reduce_scatter and bucket_cap_mb)",
                    key),
        fmt::format("{} {}", key, Describe(e.value)));
  };

  if (const Entry* e = fields.Find("sharding_strategy")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadEnum(*e, "fsdp1.sharding_strategy", kFsdp1ShardingStrategies,
                                        &out->sharding_strategy));
    if (fairscale && out->sharding_strategy != Fsdp1ShardingStrategy::kFullShard &&
        out->sharding_strategy != Fsdp1ShardingStrategy::kShardGradOp) {
      return Error(*e, "fsdp1.sharding_strategy",
                   "FULL_SHARD or SHARD_GRAD_OP with implementation fairscale (fairscale's FSDP "
                   "has no sharding_strategy; its own knob is reshard_after_forward: true = "
                   "FULL_SHARD, false = SHARD_GRAD_OP; it has no hybrid or no-shard mode)");
    }
  }
  if (const Entry* e = fields.Find("reshard_after_forward")) {
    bool reshard = true;
    SHARDSCOPE_RETURN_IF_ERROR(ReadBool(*e, "fsdp1.reshard_after_forward", &reshard));
    if (!fairscale) {
      return KeyError(*e, "fsdp1.reshard_after_forward",
                      "no reshard_after_forward with implementation torch (torch FSDP1's knob "
                      "is sharding_strategy: FULL_SHARD reshards after forward, SHARD_GRAD_OP "
                      "keeps the parameters)",
                      "reshard_after_forward with implementation torch");
    }
    if (fields.Find("sharding_strategy") != nullptr) {
      return KeyError(*e, "fsdp1.reshard_after_forward",
                      "either sharding_strategy or fairscale's reshard_after_forward",
                      "both");
    }
    out->sharding_strategy =
        reshard ? Fsdp1ShardingStrategy::kFullShard : Fsdp1ShardingStrategy::kShardGradOp;
  }
  if (const Entry* e = fields.Find("backward_prefetch")) {
    if (fairscale) return reject_for_fairscale(*e, "backward_prefetch");
    bool is_null = false;
    SHARDSCOPE_RETURN_IF_ERROR(ReadEnumOrNull(*e, "fsdp1.backward_prefetch",
                                              kFsdp1BackwardPrefetches, &out->backward_prefetch,
                                              &is_null));
    if (is_null) out->backward_prefetch = Fsdp1BackwardPrefetch::kNone;
  }
  if (const Entry* e = fields.Find("forward_prefetch")) {
    if (fairscale) return reject_for_fairscale(*e, "forward_prefetch");
    SHARDSCOPE_RETURN_IF_ERROR(ReadBool(*e, "fsdp1.forward_prefetch", &out->forward_prefetch));
  }
  if (const Entry* e = fields.Find("limit_all_gathers")) {
    if (fairscale) return reject_for_fairscale(*e, "limit_all_gathers");
    SHARDSCOPE_RETURN_IF_ERROR(ReadBool(*e, "fsdp1.limit_all_gathers", &out->limit_all_gathers));
  }
  if (const Entry* e = fields.Find("no_sync")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadBool(*e, "fsdp1.no_sync", &out->no_sync));
  }
  if (const Entry* e = fields.Find("optimize_backward_concat")) {
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadBool(*e, "fsdp1.optimize_backward_concat", &out->optimize_backward_concat));
    // A fairscale FSDP argument (facebookresearch/fairscale pull requests #1184, #1186, 2024);
    // torch FSDP1 has no counterpart.
    if (!fairscale) {
      return KeyError(*e, "fsdp1.optimize_backward_concat",
                      "no optimize_backward_concat with implementation torch (it is an argument "
                      "of fairscale's FullyShardedDataParallel only)",
                      "optimize_backward_concat with implementation torch");
    }
  }
  if (const Entry* e = fields.Find("bucket_cap_mb")) {
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadNumber(*e, "fsdp1.bucket_cap_mb", 0, false, kMaxBucketCapMb, &out->bucket_cap_mb));
    // fairscale FullyShardedDataParallel(bucket_cap_mb=25): its ReduceScatterBucketer; torch
    // FSDP1 reduce-scatters each FlatParameter on its own.
    if (!fairscale) {
      return KeyError(*e, "fsdp1.bucket_cap_mb",
                      "no bucket_cap_mb with implementation torch (torch FSDP1 has no reduce-scatter "
                      "bucketing; it is an argument of fairscale's FullyShardedDataParallel)",
                      "bucket_cap_mb with implementation torch");
    }
  }
  SHARDSCOPE_RETURN_IF_ERROR(ReadMixedPrecision(fields.Find("mixed_precision"),
                                                "fsdp1.mixed_precision", plan, &out->param_dtype,
                                                &out->reduce_dtype));

  const int32_t world = plan.cluster.world_size();
  const bool hybrid = IsHybrid(out->sharding_strategy);
  if (hybrid) {
    // _init_process_group_state_for_hybrid_shard (torch/distributed/fsdp/_init_utils.py)
    // without a process group or device mesh calls _init_intra_and_inter_node_groups with
    // the device count of the node: shard within a node, replicate across nodes.
    out->mesh = DataParallelMesh{plan.cluster.nodes, plan.cluster.gpus_per_node};
  } else {
    out->mesh = DataParallelMesh{1, world};
  }
  if (const Entry* e = fields.Find("mesh")) {
    // _init_process_group_state: a non-hybrid strategy shards over the whole process group
    // (a device_mesh there is used 1-D); only the hybrid strategies take a 2-D mesh
    // (_is_valid_hybrid_shard_device_mesh: "Expected device_mesh to have ndim=2").
    if (!hybrid) {
      return KeyError(*e, "fsdp1.mesh",
                      "a mesh only with sharding_strategy HYBRID_SHARD or _HYBRID_SHARD_ZERO2 "
                      "(other strategies shard over every rank)",
                      fmt::format("a mesh with sharding_strategy {}",
                                  NameOf(kFsdp1ShardingStrategies, out->sharding_strategy)));
    }
    SHARDSCOPE_RETURN_IF_ERROR(ReadMesh(*e, "fsdp1.mesh", world, &out->mesh));
  }
  return Status::Ok();
}

Status PlanParser::ReadZero(const Entry* entry, const Plan& plan, ZeroConfig* out) const {
  SHARDSCOPE_ASSIGN_OR_RETURN(Fields fields, SectionFields(entry, "zero", kZeroKeys));
  const bool stage3 = plan.strategy == Strategy::kZero3;
  // DeepSpeedZeroConfig.overlap_comm_valid (deepspeed/runtime/zero/config.py): overlap_comm
  // left unset becomes `stage == ZeroStageEnum.weights`, i.e. true for stage 3 only.
  out->overlap_comm = stage3;
  for (const Entry& e : fields.entries) {
    const std::string path = JoinPath("zero", e.key);
    const std::string_view key = e.key;
    const bool stage3_key =
        key.rfind("stage3_", 0) == 0 || (key.rfind("legacy_", 0) == 0 && key != "legacy_reduce_per_rank");
    // engine._configure_zero_optimizer passes the stage3_* sizes to
    // DeepSpeedZeroOptimizer_Stage3 only and allgather_bucket_size to the stage 1/2
    // DeepSpeedZeroOptimizer only; DeepSpeed ignores them elsewhere, the plan refuses them.
    if (stage3_key && !stage3) {
      return KeyError(e, path,
                      fmt::format("{} only with strategy zero3 (it only applies to ZeRO stage 3)",
                                  key),
                      fmt::format("{} with strategy {}", key, StrategyName(plan.strategy)));
    }
    if (key == "legacy_reduce_per_rank" && stage3) {
      return KeyError(e, path,
                      "legacy_reduce_per_rank only with zero1 or zero2 (the 2021 stage 1/2 "
                      "reduction; stage 3's is legacy_per_parameter_path)",
                      "legacy_reduce_per_rank with strategy zero3");
    }
    if (key == "allgather_bucket_size" && stage3) {
      return KeyError(e, path,
                      "allgather_bucket_size only with zero1 or zero2 (it only applies to ZeRO "
                      "stages 1 and 2; stage 3 fetches parameters by "
                      "stage3_prefetch_bucket_size)",
                      "allgather_bucket_size with strategy zero3");
    }
    // Sizes: pydantic Field(ge=0) in DeepSpeedZeroConfig for every one of them.
    if (key == "reduce_bucket_size") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadElementCount(e, path, 0, &out->reduce_bucket_size));
    } else if (key == "allgather_bucket_size") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadElementCount(e, path, 0, &out->allgather_bucket_size));
    } else if (key == "stage3_prefetch_bucket_size") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadElementCount(e, path, 0, &out->stage3_prefetch_bucket_size));
    } else if (key == "stage3_max_live_parameters") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadElementCount(e, path, 0, &out->stage3_max_live_parameters));
    } else if (key == "stage3_max_reuse_distance") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadElementCount(e, path, 0, &out->stage3_max_reuse_distance));
    } else if (key == "stage3_param_persistence_threshold") {
      SHARDSCOPE_RETURN_IF_ERROR(
          ReadElementCount(e, path, 0, &out->stage3_param_persistence_threshold));
    } else if (key == "overlap_comm") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(e, path, &out->overlap_comm));
    } else if (key == "contiguous_gradients") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(e, path, &out->contiguous_gradients));
    } else if (key == "legacy_prefetch_off_by_one") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(e, path, &out->legacy_prefetch_off_by_one));
    } else if (key == "legacy_stream_sync_in_fetch_release") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(e, path, &out->legacy_stream_sync_in_fetch_release));
    } else if (key == "legacy_debug_norm_sync") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(e, path, &out->legacy_debug_norm_sync));
    } else if (key == "legacy_reduce_per_rank") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(e, path, &out->legacy_reduce_per_rank));
    } else if (key == "legacy_per_parameter_path") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(e, path, &out->legacy_per_parameter_path));
    }
  }
  return Status::Ok();
}

Status PlanParser::ReadDdp(const Entry& entry, DdpConfig* out) const {
  SHARDSCOPE_ASSIGN_OR_RETURN(Fields fields,
                              ReadMapping(entry.value, MarkOf(entry), "ddp", kDdpKeys));
  if (const Entry* e = fields.Find("bucket_cap_mb")) {
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadNumber(*e, "ddp.bucket_cap_mb", 0, true, kMaxBucketCapMb, &out->bucket_cap_mb));
    // DistributedDataParallel.__init__ (torch/nn/parallel/distributed.py): the 1 MiB first
    // bucket applies only when bucket_cap_mb is left None (bucket_bytes_cap_default); a
    // bucket_cap_mb given explicitly caps the first bucket too.
    out->first_bucket_mb = out->bucket_cap_mb;
  }
  if (const Entry* e = fields.Find("no_sync")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadBool(*e, "ddp.no_sync", &out->no_sync));
  }
  return Status::Ok();
}

Status PlanParser::ReadMoe(const Entry& entry, const Plan& plan, MoeConfig* out) const {
  SHARDSCOPE_ASSIGN_OR_RETURN(Fields fields,
                              ReadMapping(entry.value, MarkOf(entry), "moe", kMoeKeys));
  const Entry* e = fields.Find("expert_parallel");
  if (e == nullptr) return Status::Ok();
  const std::string path = "moe.expert_parallel";
  int32_t ep = 1;
  SHARDSCOPE_RETURN_IF_ERROR(ReadInt32(*e, path, 1, kMaxExperts, &ep));
  if (ep > 1) {
    if (plan.model.experts <= 1) {
      return Error(*e, path,
                   "1 for a dense model (model.experts is 1): expert parallelism splits the "
                   "experts of an MoE model");
    }
    if (plan.strategy != Strategy::kFsdp2 && plan.strategy != Strategy::kFsdp1) {
      // The simulator lowers expert parallelism with FSDP2 (torchtitan) and FSDP1 (fairscale)
      // only. DeepSpeed ZeRO-3 itself refuses its MoE layers ("MoE not supported with Stage
      // 3", engine._configure_zero_optimizer).
      return Error(MarkOf(*e), path,
                   "1 with this strategy (expert parallelism is simulated with fsdp2 and fsdp1)",
                   fmt::format("{} with strategy {}", Describe(e->value),
                               StrategyName(plan.strategy)));
    }
    if (plan.model.experts % ep != 0) {
      return Error(*e, path,
                   fmt::format("a divisor of the model's {} experts (each rank of the "
                               "expert-parallel group holds experts / expert_parallel)",
                               plan.model.experts));
    }
    const int32_t world = plan.cluster.world_size();
    if (world % ep != 0) {
      return Error(*e, path, fmt::format("a divisor of the world size {}", world));
    }
    // torchtitan ParallelDims._build_mesh_with_ep (torchtitan/distributed/parallel_dims.py)
    // carves the expert-parallel dimension out of dp_shard (dp_shard_mod_ep = dp_shard * cp
    // / ep): with HSDP the experts are split inside a shard group.
    if (plan.strategy == Strategy::kFsdp2 && plan.fsdp2.mesh.replicate > 1 &&
        plan.fsdp2.mesh.shard % ep != 0) {
      return Error(*e, path,
                   fmt::format("a divisor of the HSDP shard group size {} (torchtitan carves "
                               "expert parallelism out of dp_shard)",
                               plan.fsdp2.mesh.shard));
    }
  }
  out->expert_parallel = ep;
  return Status::Ok();
}

Status PlanParser::ReadCheckpoint(const Entry& entry, const Plan& plan,
                                  CheckpointConfig* out) const {
  // torch FSDP.full_optim_state_dict / fairscale FSDP.gather_full_optim_state_dict are FSDP1
  // APIs; FSDP2 and DeepSpeed checkpoint through other paths (DCP, engine.save_checkpoint).
  if (plan.strategy != Strategy::kFsdp1) {
    return KeyError(entry, "checkpoint",
                    "a checkpoint section only with strategy fsdp1 (optimizer-state "
                    "consolidation is FSDP1's full_optim_state_dict / fairscale's "
                    "gather_full_optim_state_dict)",
                    fmt::format("strategy {}", StrategyName(plan.strategy)));
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(
      Fields fields, ReadMapping(entry.value, MarkOf(entry), "checkpoint", kCheckpointKeys));
  if (const Entry* e = fields.Find("consolidate_optimizer_state")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadBool(*e, "checkpoint.consolidate_optimizer_state",
                                        &out->consolidate_optimizer_state));
  }
  if (const Entry* e = fields.Find("no_broadcast_optim_state")) {
    const std::string path = "checkpoint.no_broadcast_optim_state";
    SHARDSCOPE_RETURN_IF_ERROR(ReadBool(*e, path, &out->no_broadcast_optim_state));
    if (out->no_broadcast_optim_state) {
      // fairscale FullyShardedDataParallel(no_broadcast_optim_state=True): "useful for
      // situations, like Mixture Of Experts, where all but a few parameters can fit on one
      // node" — the expert state stays on its rank in gather_full_optim_state_dict.
      if (plan.fsdp1.implementation != Fsdp1Implementation::kFairscale) {
        return KeyError(*e, path,
                        "no_broadcast_optim_state only with fsdp1.implementation fairscale (an "
                        "argument of fairscale's FullyShardedDataParallel)",
                        "implementation torch");
      }
      if (plan.model.experts <= 1 || plan.moe.expert_parallel <= 1) {
        return KeyError(*e, path,
                        "no_broadcast_optim_state only for an MoE model with "
                        "moe.expert_parallel > 1 (it keeps expert state on the rank that "
                        "owns it)",
                        fmt::format("model.experts {} and moe.expert_parallel {}",
                                    plan.model.experts, plan.moe.expert_parallel));
      }
      if (!out->consolidate_optimizer_state) {
        return KeyError(*e, path,
                        "no_broadcast_optim_state only with consolidate_optimizer_state: true "
                        "(it changes gather_full_optim_state_dict, which runs only then)",
                        "consolidate_optimizer_state false");
      }
    }
  }
  return Status::Ok();
}

Status PlanParser::ReadHostField(const Fields& fields, std::string_view key,
                                 int64_t* out_ns) const {
  const Entry* e = fields.Find(key);
  if (e == nullptr) return Status::Ok();
  double us = 0;
  SHARDSCOPE_RETURN_IF_ERROR(
      ReadNumber(*e, JoinPath("host", key), 0, false, kMaxHostOverheadUs, &us));
  *out_ns = std::llround(us * kNsPerUs);
  return Status::Ok();
}

Status PlanParser::ReadHost(const Entry& entry, HostConfig* out) const {
  SHARDSCOPE_ASSIGN_OR_RETURN(Fields fields,
                              ReadMapping(entry.value, MarkOf(entry), "host", kHostKeys));
  SHARDSCOPE_RETURN_IF_ERROR(ReadHostField(fields, "launch_overhead_us", &out->launch_overhead_ns));
  SHARDSCOPE_RETURN_IF_ERROR(ReadHostField(fields, "hook_overhead_us", &out->hook_overhead_ns));
  SHARDSCOPE_RETURN_IF_ERROR(
      ReadHostField(fields, "python_op_overhead_us", &out->python_op_overhead_ns));
  SHARDSCOPE_RETURN_IF_ERROR(ReadHostField(fields, "cpp_op_overhead_us", &out->cpp_op_overhead_ns));
  SHARDSCOPE_RETURN_IF_ERROR(ReadHostField(fields, "cuda_malloc_us", &out->cuda_malloc_ns));
  SHARDSCOPE_RETURN_IF_ERROR(ReadHostField(fields, "cuda_free_us", &out->cuda_free_ns));
  if (const Entry* e = fields.Find("max_queued_launches_per_stream")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadInt32(*e, "host.max_queued_launches_per_stream", 0,
                                         kMaxQueuedLaunchesPerStream,
                                         &out->max_queued_launches_per_stream));
  }
  return Status::Ok();
}

Status PlanParser::ReadAllocator(const Entry& entry, int32_t world_size, MemoryPlan* out) const {
  SHARDSCOPE_ASSIGN_OR_RETURN(Fields fields,
                              ReadMapping(entry.value, MarkOf(entry), "allocator", kAllocatorKeys));
  if (const Entry* e = fields.Find("conf")) {
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadString(*e, "allocator.conf", "a PYTORCH_CUDA_ALLOC_CONF string", &out->alloc_conf));
    StatusOr<AllocatorConfig> parsed = AllocatorConfig::Parse(out->alloc_conf);
    if (!parsed.ok()) {
      return Error(MarkOf(*e), "allocator.conf", "a valid PYTORCH_CUDA_ALLOC_CONF",
                   fmt::format("{} ({})", Quote(out->alloc_conf), parsed.status().message()));
    }
    out->allocator = *parsed;
  }
  if (const Entry* e = fields.Find("memory_fraction")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadNumber(*e, "allocator.memory_fraction", 0, true, 1.0,
                                          &out->allocator.memory_fraction));
  }
  auto gib = [](double gb) { return static_cast<int64_t>(std::llround(gb * (1 << 30))); };
  if (const Entry* e = fields.Find("memory_reserved_by_others_gb")) {
    double gb = 0;
    SHARDSCOPE_RETURN_IF_ERROR(ReadNumber(*e, "allocator.memory_reserved_by_others_gb", 0, false,
                                          kMaxReservedByOthersGb, &gb));
    out->reserved_by_others_bytes = gib(gb);
  }
  if (const Entry* e = fields.Find("memory_reserved_by_others_gb_per_rank")) {
    const std::string path = "allocator.memory_reserved_by_others_gb_per_rank";
    if (!e->value.IsMap()) return Error(*e, path, "a mapping of rank: GiB");
    for (const auto& pair : e->value) {
      const Entry rank_entry{pair.first.Scalar(), pair.first, pair.first};
      int64_t rank = 0;
      SHARDSCOPE_RETURN_IF_ERROR(ReadInt(rank_entry, path + " (rank)", 0, world_size - 1, &rank));
      const Entry value_entry{rank_entry.key, pair.first, pair.second};
      double gb = 0;
      SHARDSCOPE_RETURN_IF_ERROR(
          ReadNumber(value_entry, JoinPath(path, rank_entry.key), 0, false, kMaxReservedByOthersGb, &gb));
      out->reserved_by_others_per_rank[static_cast<int32_t>(rank)] = gib(gb);
    }
  }
  return Status::Ok();
}

// ---- the whole plan -------------------------------------------------------------------------

StatusOr<Plan> PlanParser::Parse(std::string_view text) {
  const std::string owned_text(text);
  const DocumentCount documents = CountDocuments(owned_text);
  if (documents.count == 0) {
    return Status::InvalidInput(fmt::format(
        "{}:1:1: (top level): expected a mapping with keys model, cluster and strategy, got an "
        "empty file",
        source_));
  }
  if (documents.count > 1) {
    return Error(documents.second_start, "(top level)", "one YAML document",
                 "more than one (a second starts here)");
  }
  return ParseRoot(YAML::Load(owned_text), owned_text);
}

StatusOr<Plan> PlanParser::ParseRoot(const YAML::Node& root, const std::string& text) const {
  // The framework config files first: their values join the tree and are read like the
  // plan's own. (A copy of the handle: the tree is this parse's own.)
  SHARDSCOPE_ASSIGN_OR_RETURN(PendingSources pending, ReadSources(YAML::Node(root)));
  SHARDSCOPE_ASSIGN_OR_RETURN(Fields top, ReadMapping(root, root.Mark(), "", kTopKeys));

  SHARDSCOPE_RETURN_IF_ERROR(
      Require(top, "", "model", "a model preset or a mapping of model dimensions"));
  SHARDSCOPE_RETURN_IF_ERROR(
      Require(top, "", "cluster", "a cluster preset or a mapping with 'preset'"));
  SHARDSCOPE_RETURN_IF_ERROR(
      Require(top, "", "strategy", fmt::format("one of {}", EnumNames(kStrategies))));

  Plan plan;
  plan.source = source_;
  plan.contention = DefaultContentionConfig();
  plan.host = DefaultHostConfig();

  // The strategy first: it decides which strategy section is allowed.
  SHARDSCOPE_RETURN_IF_ERROR(ReadStrategy(*top.Find("strategy"), &plan.strategy));
  SHARDSCOPE_RETURN_IF_ERROR(ReadModel(*top.Find("model"), &plan.model));
  SHARDSCOPE_RETURN_IF_ERROR(ReadCluster(*top.Find("cluster"), &plan.cluster, &plan.contention));
  // cluster.calibration is read last: its fitted costs replace the host and contention
  // sections' values.
  std::optional<Entry> calibration;
  if (const Entry* cluster = top.Find("cluster"); cluster->value.IsMap()) {
    for (const auto& pair : cluster->value) {
      if (pair.first.IsScalar() && pair.first.Scalar() == "calibration") {
        calibration = Entry{"calibration", pair.first, pair.second};
      }
    }
  }
  // Config-file values that need the model's hidden size or the world size.
  SHARDSCOPE_RETURN_IF_ERROR(ApplyPendingSources(pending, YAML::Node(root), plan));
  // After the cluster: the dtype is checked against the GPU.
  const Entry* training = top.Find("training");
  // Errors about the workload as a whole point at the training section, or else at the model.
  const YAML::Mark training_mark = MarkOf(training != nullptr ? *training : *top.Find("model"));
  bool dtype_given = false;
  YAML::Mark seq_len_mark = training_mark;
  YAML::Mark dtype_mark = training_mark;
  YAML::Mark kernels_mark = training_mark;
  if (training != nullptr) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadTraining(*training, plan.cluster.gpu, &plan.training,
                                            &dtype_given, &seq_len_mark, &dtype_mark, &kernels_mark));
  }
  SHARDSCOPE_RETURN_IF_ERROR(ResolveKernelChoices(kernels_mark, &plan));
  // The default dtype must suit the GPU too (bf16 on a V100, say); an explicit one was
  // checked where it was read.
  if (!dtype_given && !DTypeSupported(plan.cluster.gpu, plan.training.dtype)) {
    // Points at the training section, or else at the cluster that chose the GPU.
    return Error(MarkOf(training != nullptr ? *training : *top.Find("cluster")), "training.dtype",
                 ExpectedDType(plan.cluster.gpu),
                 fmt::format("the default {}", Quote(traces::DTypeName(plan.training.dtype))));
  }

  // One strategy section, the chosen strategy's own.
  std::string_view own_section;
  for (const StrategySection& entry : kStrategySections) {
    if (entry.strategy == plan.strategy) own_section = entry.section;
  }
  for (const StrategySection& entry : kStrategySections) {
    const Entry* section = top.Find(entry.section);
    if (section == nullptr || entry.section == own_section) continue;
    return Error(section->key_node.Mark(), entry.section,
                 fmt::format("only the '{}' section", own_section),
                 fmt::format("section '{}' given but strategy is {}", entry.section,
                             StrategyName(plan.strategy)));
  }
  const bool zero = plan.strategy == Strategy::kZero1 || plan.strategy == Strategy::kZero2 ||
                    plan.strategy == Strategy::kZero3;
  if (plan.training.precision == Precision::kPureBf16) {
    const YAML::Node node = training->value["precision"];
    const YAML::Mark mark = node ? node.Mark() : training_mark;
    if (plan.training.dtype != traces::DType::kBFloat16) {
      return Error(mark, "training.precision",
                   "mixed, or training.dtype bf16 (pure_bf16 keeps parameters, gradients and "
                   "optimizer states in bf16)",
                   fmt::format("'pure_bf16' with training.dtype {}", Quote(traces::DTypeName(plan.training.dtype))));
    }
    if (plan.strategy != Strategy::kFsdp2 && plan.strategy != Strategy::kDdp) {
      return Error(mark, "training.precision",
                   fmt::format("mixed with strategy {} (pure_bf16 is modelled for fsdp2 and ddp, "
                               "the way torchtune's recipes shard a bf16 model)",
                               StrategyName(plan.strategy)),
                   "'pure_bf16'");
    }
  }
  if (zero && plan.training.dtype == traces::DType::kFloat8E4M3) {
    // DeepSpeed's precisions are its fp16 and bf16 config sections or fp32
    // (deepspeed/runtime/config.py: get_fp16_enabled, get_bfloat16_enabled; DtypeEnum has
    // fp16, fp32, int8, bf16); ZeRO keeps its flat partitions in that dtype and has no fp8.
    return Error(dtype_mark, "training.dtype",
                 fmt::format("bf16, fp16 or fp32 with strategy {} (DeepSpeed ZeRO has no fp8 "
                             "precision: its config knows fp16, bf16 and fp32)",
                             StrategyName(plan.strategy)),
                 "'fp8'");
  }
  // Every strategy's defaults are resolved (mixed precision, mesh, overlap_comm), so a plan
  // whose strategy a caller changes afterwards still holds consistent values.
  SHARDSCOPE_RETURN_IF_ERROR(ReadFsdp2(top.Find("fsdp2"), plan, &plan.fsdp2));
  SHARDSCOPE_RETURN_IF_ERROR(ReadFsdp1(top.Find("fsdp1"), plan, &plan.fsdp1));
  SHARDSCOPE_RETURN_IF_ERROR(ReadZero(top.Find("zero"), plan, &plan.zero));
  if (const Entry* e = top.Find("ddp")) SHARDSCOPE_RETURN_IF_ERROR(ReadDdp(*e, &plan.ddp));
  // After the strategy sections: expert parallelism depends on the HSDP mesh, and the
  // checkpoint on fairscale and on expert parallelism.
  if (const Entry* e = top.Find("moe")) SHARDSCOPE_RETURN_IF_ERROR(ReadMoe(*e, plan, &plan.moe));
  if (const Entry* e = top.Find("checkpoint")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadCheckpoint(*e, plan, &plan.checkpoint));
  }
  if (const Entry* e = top.Find("host")) SHARDSCOPE_RETURN_IF_ERROR(ReadHost(*e, &plan.host));
  if (const Entry* e = top.Find("allocator")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadAllocator(*e, plan.cluster.world_size(), &plan.memory));
  }
  // After fsdp1: the policy is Composer's, on torch FSDP1.
  if (const Entry* e = top.Find("oom")) SHARDSCOPE_RETURN_IF_ERROR(ReadOom(*e, plan, &plan.oom));

  // The model's own limits on the workload (seq_len within learned position embeddings).
  Workload workload;
  workload.micro_batch = plan.training.micro_batch_size;
  workload.seq_len = plan.training.seq_len;
  workload.dtype = plan.training.dtype;
  if (Status status = ValidateWorkload(plan.model, workload); !status.ok()) {
    return Status::InvalidInput(
        fmt::format("{}: training.seq_len: {}", Where(seq_len_mark), status.message()));
  }

  // Keeps activation byte counts inside int64_t.
  const double tokens = static_cast<double>(plan.training.seq_len) *
                        static_cast<double>(plan.training.micro_batch_size);
  const double per_token =
      plan.model.layers * (static_cast<double>(plan.model.hidden) +
                           static_cast<double>(plan.model.ffn) * plan.model.experts_per_token) +
      static_cast<double>(plan.model.vocab);
  if (tokens * per_token > kMaxActivationElements) {
    return Error(training_mark, "training",
                 "a micro-batch of at most 2^50 activation elements (seq_len x "
                 "micro_batch_size x per-token width)",
                 fmt::format("about {:.3g}", tokens * per_token));
  }
  if (pending.sliding_window > 0 && plan.training.seq_len > pending.sliding_window) {
    // Mistral's sliding window equals full causal attention only up to the window.
    return Status::InvalidInput(fmt::format(
        "{}: sliding_window: unsupported: a window of {} tokens with training.seq_len {} "
        "(sliding-window attention is not modelled; it is full causal attention only for "
        "sequences up to the window)",
        pending.sliding_window_origin, pending.sliding_window, plan.training.seq_len));
  }
  if (calibration) SHARDSCOPE_RETURN_IF_ERROR(ReadCalibration(*calibration, &plan));
  // Last: its variants are whole plans read like this one.
  if (const Entry* e = top.Find("divergence")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadDivergence(*e, text, &plan));
  }
  return plan;
}

// ---- divergence -----------------------------------------------------------------------------

// Why ranks running `variant` cannot share a job with ranks running `base`, or nothing: the
// communicators are built once for the job, from the model, the world and the mesh.
std::optional<std::string> VariantIncompatibility(const Plan& base, const Plan& variant) {
  if (variant.strategy != base.strategy) return "the same strategy on every rank";
  if (variant.cluster.world_size() != base.cluster.world_size()) return "the same world size";
  if (variant.model.layers != base.model.layers || variant.model.experts != base.model.experts) {
    return "the same model on every rank";
  }
  if (variant.moe.expert_parallel != base.moe.expert_parallel) {
    return "the same moe.expert_parallel on every rank";
  }
  const auto same_mesh = [](const DataParallelMesh& a, const DataParallelMesh& b) {
    return a.replicate == b.replicate && a.shard == b.shard;
  };
  if (!same_mesh(variant.fsdp2.mesh, base.fsdp2.mesh) || !same_mesh(variant.fsdp1.mesh, base.fsdp1.mesh) ||
      IsHybrid(variant.fsdp1.sharding_strategy) != IsHybrid(base.fsdp1.sharding_strategy)) {
    return "the same device mesh on every rank (its process groups are created on all ranks)";
  }
  // reshard_after_forward=k all-gathers over groups of k ranks created for the job.
  const auto post_forward_group = [](const Plan& p) {
    return p.fsdp2.reshard_after_forward == ReshardAfterForward::kInt ? p.fsdp2.reshard_after_forward_size : 0;
  };
  if (post_forward_group(variant) != 0 && post_forward_group(variant) != post_forward_group(base)) {
    return "fsdp2.reshard_after_forward as an int only when the plan itself uses the same int (the "
           "post-forward groups are created for the job)";
  }
  return std::nullopt;
}

// One line for a YAML value in a description: the flow-style dump ("{backward_prefetch: 0}").
std::string FlowText(const YAML::Node& node) {
  YAML::Emitter out;
  out << YAML::Flow << node;
  return out.c_str();
}

Status PlanParser::ReadRankNumbers(const Entry& entry, std::string_view path, int32_t world_size,
                                   double min, double max,
                                   std::vector<std::pair<int32_t, Entry>>* out) const {
  if (!entry.value.IsMap()) {
    return Error(entry, path, fmt::format("a mapping of rank (0 to {}): value", world_size - 1));
  }
  for (const auto& pair : entry.value) {
    const Entry rank_entry{pair.first.IsScalar() ? pair.first.Scalar() : std::string(), pair.first,
                           pair.first};
    int64_t rank = 0;
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadInt(rank_entry, fmt::format("{} (rank)", path), 0, world_size - 1, &rank));
    const Entry value_entry{rank_entry.key, pair.first, pair.second};
    double value = 0;
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadNumber(value_entry, JoinPath(path, rank_entry.key), min, true, max, &value));
    for (const auto& [seen, first] : *out) {
      if (seen == rank) {
        return Error(pair.first.Mark(), JoinPath(path, rank_entry.key), "each rank at most once",
                     fmt::format("a duplicate (first at line {})", first.key_node.Mark().line + 1));
      }
    }
    out->emplace_back(static_cast<int32_t>(rank), value_entry);
  }
  return Status::Ok();
}

Status PlanParser::ReadDivergence(const Entry& entry, const std::string& text, Plan* plan) const {
  SHARDSCOPE_ASSIGN_OR_RETURN(Fields fields,
                              ReadMapping(entry.value, MarkOf(entry), "divergence", kDivergenceKeys));
  const int32_t world = plan->cluster.world_size();

  std::vector<std::pair<int32_t, Entry>> slowdowns;
  if (const Entry* e = fields.Find("slowdown")) {
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadRankNumbers(*e, "divergence.slowdown", world, 0, kMaxRankSlowdown, &slowdowns));
  }
  for (const auto& [rank, value_entry] : slowdowns) {
    double factor = 0;
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadNumber(value_entry, "divergence.slowdown", 0, true, kMaxRankSlowdown, &factor));
    plan->divergence.slowdown[rank] = factor;
  }

  // What each rank runs differently: its sequence length node, its expert load, its override.
  struct RankChange {
    const YAML::Node* seq_len = nullptr;
    int64_t seq_len_value = 0;
    double moe_load = 1;
    int32_t override_index = -1;
  };
  std::map<int32_t, RankChange> changes;

  std::vector<std::pair<int32_t, Entry>> seq_lens;
  if (const Entry* e = fields.Find("seq_len")) {
    if (!e->value.IsMap()) {
      return Error(*e, "divergence.seq_len", fmt::format("a mapping of rank (0 to {}): seq_len", world - 1));
    }
    for (const auto& pair : e->value) {
      const Entry rank_entry{pair.first.IsScalar() ? pair.first.Scalar() : std::string(), pair.first, pair.first};
      int64_t rank = 0;
      SHARDSCOPE_RETURN_IF_ERROR(ReadInt(rank_entry, "divergence.seq_len (rank)", 0, world - 1, &rank));
      if (changes.count(static_cast<int32_t>(rank)) != 0) {
        return Error(pair.first.Mark(), JoinPath("divergence.seq_len", rank_entry.key), "each rank at most once",
                     "a duplicate");
      }
      seq_lens.emplace_back(static_cast<int32_t>(rank), Entry{rank_entry.key, pair.first, pair.second});
      RankChange& change = changes[static_cast<int32_t>(rank)];
      int64_t value = 0;
      // The full check (positions, activation limits) runs when the variant is read.
      SHARDSCOPE_RETURN_IF_ERROR(ReadInt(seq_lens.back().second, JoinPath("divergence.seq_len", rank_entry.key), 1,
                                         int64_t{1} << 40, &value));
      change.seq_len_value = value;
    }
    for (auto& [rank, value_entry] : seq_lens) changes[rank].seq_len = &value_entry.value;
  }

  if (const Entry* e = fields.Find("moe_load")) {
    // Routing moves work between ranks only when experts live on different ranks
    // (torchtitan ExpertParallel: tokens go to the rank holding their expert).
    if (plan->moe.expert_parallel <= 1 || plan->model.experts <= 1) {
      return KeyError(*e, "divergence.moe_load",
                      "moe_load only with experts split over ranks (moe.expert_parallel > 1): without "
                      "expert parallelism every rank runs all experts on its own tokens",
                      plan->model.experts <= 1 ? "a dense model" : "moe.expert_parallel 1");
    }
    std::vector<std::pair<int32_t, Entry>> loads;
    SHARDSCOPE_RETURN_IF_ERROR(ReadRankNumbers(*e, "divergence.moe_load", world, 0, kMaxMoeLoad, &loads));
    for (const auto& [rank, value_entry] : loads) {
      SHARDSCOPE_RETURN_IF_ERROR(ReadNumber(value_entry, JoinPath("divergence.moe_load", value_entry.key), 0, true,
                                            kMaxMoeLoad, &changes[rank].moe_load));
    }
  }

  std::vector<Fields> overrides;
  if (const Entry* e = fields.Find("overrides")) {
    if (!e->value.IsSequence()) {
      return Error(*e, "divergence.overrides",
                   "a list of mappings, each with 'ranks' and the sections those ranks run differently");
    }
    for (size_t i = 0; i < e->value.size(); ++i) {
      const YAML::Node item = e->value[i];
      const std::string path = fmt::format("divergence.overrides[{}]", i);
      SHARDSCOPE_ASSIGN_OR_RETURN(Fields item_fields, ReadMapping(item, item.Mark(), path, kOverrideKeys));
      SHARDSCOPE_RETURN_IF_ERROR(Require(item_fields, path, "ranks", "a rank or a list of ranks"));
      const Entry& ranks_entry = *item_fields.Find("ranks");
      std::vector<YAML::Node> rank_nodes;
      if (ranks_entry.value.IsSequence()) {
        for (const auto& node : ranks_entry.value) rank_nodes.push_back(node);
      } else {
        rank_nodes.push_back(ranks_entry.value);
      }
      if (rank_nodes.empty()) return Error(ranks_entry, JoinPath(path, "ranks"), "at least one rank");
      for (const YAML::Node& node : rank_nodes) {
        int64_t rank = 0;
        SHARDSCOPE_RETURN_IF_ERROR(ReadInt(Entry{"ranks", ranks_entry.key_node, node}, JoinPath(path, "ranks"), 0,
                                           world - 1, &rank));
        RankChange& change = changes[static_cast<int32_t>(rank)];
        if (change.override_index >= 0) {
          return Error(node.Mark(), JoinPath(path, "ranks"), "each rank in at most one override",
                       fmt::format("rank {} (already in divergence.overrides[{}])", rank, change.override_index));
        }
        change.override_index = static_cast<int32_t>(i);
      }
      // Only the chosen strategy's section, as at the top level.
      std::string_view own_section;
      for (const StrategySection& candidate : kStrategySections) {
        if (candidate.strategy == plan->strategy) own_section = candidate.section;
      }
      for (const Entry& section : item_fields.entries) {
        if (section.key == "ranks") continue;
        for (const StrategySection& candidate : kStrategySections) {
          if (candidate.section != section.key || section.key == own_section) continue;
          return Error(section.key_node.Mark(), JoinPath(path, section.key),
                       fmt::format("only the '{}' section among the strategy sections", own_section),
                       fmt::format("section '{}' but strategy is {}", section.key, StrategyName(plan->strategy)));
        }
        if (!section.value.IsMap()) {
          return Error(section, JoinPath(path, section.key), "a mapping of that section's keys");
        }
      }
      overrides.push_back(std::move(item_fields));
    }
  }

  // Ranks with the same change run the same variant: group them (map order: deterministic).
  std::map<std::tuple<int32_t, int64_t, double>, std::vector<int32_t>> groups;
  for (const auto& [rank, change] : changes) {
    groups[{change.override_index, change.seq_len_value, change.moe_load}].push_back(rank);
  }
  std::vector<RankVariant> variants;
  for (const auto& [key, ranks] : groups) {
    const RankChange& change = changes.at(ranks.front());
    // The plan text again, with the variant's keys merged into their sections.
    YAML::Node doc = YAML::Load(text);
    doc.remove("divergence");
    std::vector<std::string> described;
    if (change.override_index >= 0) {
      for (const Entry& section : overrides[static_cast<size_t>(change.override_index)].entries) {
        if (section.key == "ranks") continue;
        // Key by key into the section (created when the plan has none): the override's own
        // nodes are shared, never modified, so ranks with other seq_lens read them intact.
        if (!doc[section.key].IsMap()) doc[section.key] = YAML::Node(YAML::NodeType::Map);
        YAML::Node target = doc[section.key];
        for (const auto& pair : section.value) {
          // Looked up through a const view: a non-const operator[] would add the key.
          if (std::as_const(target)[pair.first.Scalar()]) {
            target[pair.first.Scalar()] = pair.second;
          } else {
            // The override's own key node: errors about it point at the override's line.
            target.force_insert(pair.first, pair.second);
          }
        }
        described.push_back(fmt::format("{} {}", section.key, FlowText(section.value)));
      }
    }
    if (change.seq_len != nullptr) {
      doc["training"]["seq_len"] = *change.seq_len;
      described.push_back(fmt::format("training.seq_len {}", change.seq_len_value));
    }
    SHARDSCOPE_ASSIGN_OR_RETURN(Plan variant, ParseRoot(doc, std::string()));
    variant.moe.rank_load = change.moe_load;
    if (change.moe_load != 1) described.push_back(fmt::format("moe_load {:g}", change.moe_load));
    if (std::optional<std::string> why = VariantIncompatibility(*plan, variant)) {
      return Error(MarkOf(entry), "divergence", *why,
                   fmt::format("ranks {} run {}", CompressRanks(ranks), JoinNames(described)));
    }
    if (described.empty()) continue;  // e.g. moe_load: {3: 1}: the rank runs the plan
    std::string description;
    for (const std::string& part : described) description += (description.empty() ? "" : ", ") + part;
    variants.push_back(RankVariant{ranks, std::move(description), std::make_shared<const Plan>(std::move(variant))});
  }
  std::sort(variants.begin(), variants.end(),
            [](const RankVariant& a, const RankVariant& b) { return a.ranks.front() < b.ranks.front(); });
  plan->divergence.variants = std::move(variants);
  return Status::Ok();
}

Status PlanParser::ReadCalibration(const Entry& entry, Plan* plan) const {
  std::string path;
  SHARDSCOPE_RETURN_IF_ERROR(
      ReadString(entry, "cluster.calibration", "the path of a profile written by `shardscope calibrate`", &path));
  // Relative to the plan's folder, so a plan and its profile move together.
  std::filesystem::path resolved(path);
  if (resolved.is_relative() && !source_.empty() && source_.front() != '<') {
    resolved = std::filesystem::path(source_).parent_path() / resolved;
  }
  StatusOr<CalibrationProfile> profile = ReadCalibrationProfile(resolved.string());
  if (!profile.ok()) {
    return Error(MarkOf(entry), "cluster.calibration", "a readable calibration profile", profile.status().message());
  }
  if (!profile->gpu.empty() && profile->gpu != plan->cluster.gpu.name) {
    return Error(MarkOf(entry), "cluster.calibration",
                 fmt::format("a profile measured on the cluster's GPU ({}): efficiencies are fractions of that "
                             "GPU's peak",
                             plan->cluster.gpu.name),
                 fmt::format("a profile of {}", profile->gpu));
  }
  plan->calibration = resolved.string();
  ApplyCalibration(*profile, plan->host, plan->contention);
  return Status::Ok();
}

Status PlanParser::ReadOom(const Entry& entry, const Plan& plan, OomConfig* out) const {
  SHARDSCOPE_ASSIGN_OR_RETURN(Fields fields,
                              ReadMapping(entry.value, MarkOf(entry), "oom", kOomKeys));
  if (const Entry* e = fields.Find("policy")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadEnum(*e, "oom.policy", kOomPolicies, &out->policy));
    // catch_and_sync is Composer's automicrobatching (composer/trainer/trainer.py
    // Trainer._train_batch), modelled on torch FSDP1: its sync hooks patch
    // torch.distributed.fsdp._flat_param.FlatParamHandle.unshard
    // (composer/trainer/_patch_pytorch.py patch_unshard_for_automicrobatching).
    if (out->policy == OomPolicy::kCatchAndSync &&
        (plan.strategy != Strategy::kFsdp1 ||
         plan.fsdp1.implementation != Fsdp1Implementation::kTorch)) {
      return KeyError(*e, "oom.policy",
                      "catch_and_sync only with strategy fsdp1 and implementation torch "
                      "(Composer's automicrobatching with its FSDP1 sync hooks; other "
                      "strategies keep policy raise)",
                      plan.strategy != Strategy::kFsdp1
                          ? fmt::format("strategy {}", StrategyName(plan.strategy))
                          : std::string("implementation fairscale"));
    }
  }
  if (const Entry* e = fields.Find("sync_hooks")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadBool(*e, "oom.sync_hooks", &out->sync_hooks));
    if (out->sync_hooks && out->policy != OomPolicy::kCatchAndSync) {
      return KeyError(*e, "oom.sync_hooks",
                      "sync_hooks only with policy catch_and_sync (the hooks all-reduce the "
                      "OOM flag that catch_and_sync raises)",
                      "policy raise");
    }
  }
  return Status::Ok();
}

// ---- framework config files ------------------------------------------------------------------

// The entry of `key` in the mapping `map`, if there is one (read without operator[], which
// would add the key to a non-const node).
std::optional<Entry> FindEntry(const YAML::Node& map, std::string_view key) {
  if (!map.IsMap()) return std::nullopt;
  for (const auto& pair : map) {
    if (pair.first.IsScalar() && pair.first.Scalar() == key) {
      return Entry{std::string(key), pair.first, pair.second};
    }
  }
  return std::nullopt;
}

// Whether a plan scalar says what a config file's value says: the same text, the same number
// (5e8 and 500000000) or the same boolean.
bool SameValue(const YAML::Node& node, std::string_view value) {
  if (!node.IsScalar() || IsQuoted(node)) return node.IsScalar() && node.Scalar() == value;
  const std::string& text = node.Scalar();
  if (text == value) return true;
  if (std::optional<bool> flag = AsBool(node)) {
    return (value == "true" && *flag) || (value == "false" && !*flag);
  }
  double a = 0, b = 0;
  const auto [aend, aec] = std::from_chars(text.data(), text.data() + text.size(), a);
  const auto [bend, bec] = std::from_chars(value.data(), value.data() + value.size(), b);
  return aec == std::errc() && bec == std::errc() && aend == text.data() + text.size() &&
         bend == value.data() + value.size() && a == b;
}

// The file named in an origin ("ds_config.json:4:3 (key)" -> "ds_config.json").
std::string_view OriginFile(std::string_view origin) {
  const size_t space = origin.find(" (");
  std::string_view where = origin.substr(0, space);
  for (int i = 0; i < 2; ++i) {
    const size_t colon = where.rfind(':');
    if (colon == std::string_view::npos) break;
    const std::string_view tail = where.substr(colon + 1);
    if (tail.empty() || tail.find_first_not_of("0123456789") != std::string_view::npos) break;
    where = where.substr(0, colon);
  }
  return where;
}

const std::string* PlanParser::OriginOf(std::string_view path) const {
  if (auto it = origins_.find(path); it != origins_.end()) return &it->second;
  // The section holding the value ("fsdp2.mesh" for "fsdp2.mesh.shard")...
  std::string_view prefix = path;
  while (true) {
    const size_t dot = prefix.rfind('.');
    if (dot == std::string_view::npos) break;
    prefix = prefix.substr(0, dot);
    if (auto it = origins_.find(prefix); it != origins_.end()) return &it->second;
  }
  // ...or a value in the section the error is about ("training" for "training.dtype").
  const std::string inside = fmt::format("{}.", path);
  for (auto it = origins_.lower_bound(inside); it != origins_.end(); ++it) {
    if (it->first.rfind(inside, 0) != 0) break;
    return &it->second;
  }
  return nullptr;
}

StatusOr<std::string> PlanParser::ReadSourceFile(const Entry& entry, std::string_view path,
                                                 std::string_view what,
                                                 std::string* resolved) const {
  std::string name;
  SHARDSCOPE_RETURN_IF_ERROR(ReadString(entry, path, fmt::format("the path of {}", what), &name));
  // Relative to the plan's folder, so a plan and its configs move together.
  std::filesystem::path file(name);
  if (file.is_relative() && !source_.empty() && source_.front() != '<') {
    file = std::filesystem::path(source_).parent_path() / file;
  }
  *resolved = file.string();
  StatusOr<std::string> text = ReadConfigFile(*resolved);
  if (!text.ok()) return Error(MarkOf(entry), path, fmt::format("a readable {}", what), text.status().message());
  return text;
}

Status PlanParser::MergeSetting(YAML::Node root, const PlanSetting& setting,
                                bool plan_wins) const {
  std::vector<std::string> parts;
  for (size_t begin = 0; begin <= setting.path.size();) {
    const size_t dot = std::min(setting.path.find('.', begin), setting.path.size());
    parts.push_back(setting.path.substr(begin, dot - begin));
    begin = dot + 1;
  }
  // Down the sections, creating the missing ones. Nodes are passed on by copy construction:
  // yaml-cpp's Node::operator= would overwrite the node it refers to.
  std::vector<YAML::Node> chain{root};
  std::string walked;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    walked = walked.empty() ? parts[i] : fmt::format("{}.{}", walked, parts[i]);
    const YAML::Node& parent = chain.back();
    std::optional<Entry> child = FindEntry(parent, parts[i]);
    if (!child) {
      YAML::Node created(YAML::NodeType::Map);
      YAML::Node parent_handle(parent);
      parent_handle[parts[i]] = created;
      chain.push_back(created);
      continue;
    }
    if (!child->value.IsMap()) {
      if (plan_wins) return Status::Ok();
      return Error(MarkOf(*child), walked,
                   fmt::format("a mapping: {} sets {} here", setting.origin, setting.path),
                   Describe(child->value));
    }
    chain.push_back(child->value);
  }
  YAML::Node parent(chain.back());
  const std::string& leaf = parts.back();
  if (std::optional<Entry> existing = FindEntry(parent, leaf)) {
    if (plan_wins || SameValue(existing->value, setting.value)) return Status::Ok();
    return Error(MarkOf(*existing), setting.path,
                 fmt::format("{} as {} sets it, or no {} here (the plan and {} disagree: set "
                             "it in one place)",
                             setting.value, setting.origin, leaf, OriginFile(setting.origin)),
                 Describe(existing->value));
  }
  parent[leaf] = setting.value;
  origins_[setting.path] = setting.origin;
  return Status::Ok();
}

StatusOr<PlanParser::PendingSources> PlanParser::ReadSources(YAML::Node root) const {
  PendingSources pending;
  if (!root.IsMap()) return pending;

  // model: {hf_config: config.json, <keys that override it>}
  if (std::optional<Entry> model = FindEntry(root, "model"); model && model->value.IsMap()) {
    if (std::optional<Entry> hf = FindEntry(model->value, "hf_config")) {
      if (std::optional<Entry> preset = FindEntry(model->value, "preset")) {
        return KeyError(*preset, "model.preset",
                        "no preset beside hf_config (the config file describes the model)",
                        "both preset and hf_config");
      }
      std::string file;
      SHARDSCOPE_ASSIGN_OR_RETURN(
          std::string text,
          ReadSourceFile(*hf, "model.hf_config", "Hugging Face config.json", &file));
      SHARDSCOPE_ASSIGN_OR_RETURN(HfModelSettings hf_settings, ReadHfConfig(text, file));
      YAML::Node(model->value).remove("hf_config");
      // The plan's own model keys beside hf_config override the file's.
      for (const PlanSetting& setting : hf_settings.model) {
        SHARDSCOPE_RETURN_IF_ERROR(MergeSetting(root, setting, /*plan_wins=*/true));
      }
      pending.sliding_window = hf_settings.sliding_window;
      pending.sliding_window_origin = hf_settings.sliding_window_origin;
    }
  }

  // zero: {deepspeed_config: ds_config.json, <keys that must agree with it>}
  if (std::optional<Entry> zero = FindEntry(root, "zero"); zero && zero->value.IsMap()) {
    if (std::optional<Entry> ds = FindEntry(zero->value, "deepspeed_config")) {
      SHARDSCOPE_ASSIGN_OR_RETURN(
          std::string text, ReadSourceFile(*ds, "zero.deepspeed_config", "DeepSpeed JSON config",
                                           &pending.deepspeed_file));
      SHARDSCOPE_ASSIGN_OR_RETURN(pending.deepspeed_settings,
                                  ReadDeepSpeedConfig(text, pending.deepspeed_file));
      YAML::Node(zero->value).remove("deepspeed_config");
      pending.deepspeed = true;
      const std::optional<Entry> training = FindEntry(root, "training");
      auto plan_gives = [&](std::string_view key) {
        return training && FindEntry(training->value, key).has_value();
      };
      for (const PlanSetting& setting : pending.deepspeed_settings.settings) {
        if (setting.value != "auto") {
          SHARDSCOPE_RETURN_IF_ERROR(MergeSetting(root, setting, /*plan_wins=*/false));
        } else if (setting.path == "training.dtype" && !plan_gives("dtype")) {
          // transformers' HfTrainerDeepSpeedConfig fills fp16/bf16 "enabled" from
          // TrainingArguments --fp16 / --bf16 (default off); the plan's training section
          // plays TrainingArguments' part and must say which.
          return Status::InvalidInput(fmt::format(
              "{}: training.dtype: expected the plan's training.dtype (\"auto\" is filled from "
              "the Hugging Face Trainer's --bf16 / --fp16; give it in the plan), got nothing",
              setting.origin));
        } else if (setting.path.rfind("zero.", 0) == 0) {
          pending.auto_sizes.push_back(setting);
        }
        // training.max_grad_norm "auto": the plan's value (TrainingArguments.max_grad_norm and
        // the plan both default to 1.0).
      }
      const DeepSpeedBatchValue& micro = pending.deepspeed_settings.micro_batch;
      if (micro.is_auto && !plan_gives("micro_batch_size")) {
        return Status::InvalidInput(fmt::format(
            "{}: training.micro_batch_size: expected the plan's training.micro_batch_size "
            "(\"auto\" is filled from the Hugging Face Trainer's per_device_train_batch_size, "
            "default 8; give it in the plan), got nothing",
            micro.origin));
      }
    }
  }

  // torchtitan: {job_config: llama3_8b.toml}
  if (std::optional<Entry> titan = FindEntry(root, "torchtitan")) {
    static constexpr std::array<std::string_view, 1> kTorchtitanKeys = {"job_config"};
    SHARDSCOPE_ASSIGN_OR_RETURN(
        Fields fields, ReadMapping(titan->value, MarkOf(*titan), "torchtitan", kTorchtitanKeys));
    SHARDSCOPE_RETURN_IF_ERROR(
        Require(fields, "torchtitan", "job_config", "the path of a torchtitan TOML job config"));
    std::string file;
    SHARDSCOPE_ASSIGN_OR_RETURN(std::string text,
                                ReadSourceFile(*fields.Find("job_config"), "torchtitan.job_config",
                                               "torchtitan TOML job config", &file));
    SHARDSCOPE_ASSIGN_OR_RETURN(pending.torchtitan_settings, ReadTorchtitanConfig(text, file));
    root.remove("torchtitan");
    pending.torchtitan = true;
    const TorchtitanSettings& settings = pending.torchtitan_settings;
    if (!settings.unmapped_model.empty() && !FindEntry(root, "model")) {
      return Status::InvalidInput(fmt::format(
          "{}: model: expected a plan preset for torchtitan's {} (llama3 8B / 70B, llama2 13B "
          "/ 70B have one), or the plan's own model describing it, got neither",
          settings.unmapped_model_origin, settings.unmapped_model));
    }
    for (const PlanSetting& setting : settings.settings) {
      SHARDSCOPE_RETURN_IF_ERROR(MergeSetting(root, setting, /*plan_wins=*/false));
    }
  }
  return pending;
}

Status PlanParser::ApplyPendingSources(const PendingSources& pending, YAML::Node root,
                                       const Plan& plan) const {
  const int64_t world = plan.cluster.world_size();
  const std::optional<Entry> training = FindEntry(root, "training");
  // The plan's own integer at training.<key>, if it gives one.
  auto plan_int = [&](std::string_view key, int64_t max, std::optional<int64_t>* out) -> Status {
    if (!training) return Status::Ok();
    std::optional<Entry> entry = FindEntry(training->value, key);
    if (!entry) return Status::Ok();
    int64_t value = 0;
    SHARDSCOPE_RETURN_IF_ERROR(ReadInt(*entry, JoinPath("training", key), 1, max, &value));
    *out = value;
    return Status::Ok();
  };

  if (pending.deepspeed) {
    // transformers HfTrainerDeepSpeedConfig.trainer_config_finalize: reduce_bucket_size =
    // hidden^2; at stage 3 stage3_prefetch_bucket_size = int(0.9 hidden^2) and
    // stage3_param_persistence_threshold = 10 hidden.
    const int64_t h = plan.model.hidden;
    for (const PlanSetting& setting : pending.auto_sizes) {
      int64_t value = h * h;
      if (setting.path == "zero.stage3_prefetch_bucket_size") {
        value = static_cast<int64_t>(0.9 * static_cast<double>(h) * static_cast<double>(h));
      } else if (setting.path == "zero.stage3_param_persistence_threshold") {
        value = 10 * h;
      }
      SHARDSCOPE_RETURN_IF_ERROR(MergeSetting(
          root,
          PlanSetting{setting.path, fmt::format("{}", value),
                      fmt::format("{} = \"auto\", from model.hidden {} as the Hugging Face "
                                  "Trainer fills it",
                                  setting.origin, h)},
          /*plan_wins=*/false));
    }

    // The batch: DeepSpeedConfig._set_batch_related_parameters, then _batch_assertion.
    // "auto" takes the plan's value (the Trainer fills it from TrainingArguments); an
    // "auto" train_batch_size is the product, as the Trainer fills it.
    const DeepSpeedSettings& ds = pending.deepspeed_settings;
    std::optional<int64_t> train, micro, accum, plan_micro, plan_accum;
    SHARDSCOPE_RETURN_IF_ERROR(plan_int("micro_batch_size", kMaxMicroBatch, &plan_micro));
    SHARDSCOPE_RETURN_IF_ERROR(plan_int("grad_accum_steps", kMaxGradAccum, &plan_accum));
    if (ds.train_batch_size.given && !ds.train_batch_size.is_auto) train = ds.train_batch_size.value;
    if (ds.micro_batch.given) micro = ds.micro_batch.is_auto ? plan_micro : ds.micro_batch.value;
    if (ds.grad_accum.given) {
      accum = ds.grad_accum.is_auto ? plan_accum.value_or(1) : ds.grad_accum.value;
    }
    std::string origin = ds.train_batch_size.given ? ds.train_batch_size.origin : ds.micro_batch.origin;
    auto product = [](int64_t a, int64_t b, int64_t c) -> std::optional<int64_t> {
      int64_t ab = 0, abc = 0;
      if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, &abc)) return std::nullopt;
      return abc;
    };
    if (train && micro && accum) {
      // all three given: nothing derived
    } else if (train && micro) {
      accum = *train / *micro / world;
    } else if (train && accum) {
      micro = *train / world / *accum;
    } else if (micro && accum) {
      train = product(*micro, *accum, world);
    } else if (train) {
      accum = 1;
      micro = *train / world;
    } else if (micro) {
      train = product(*micro, 1, world);
      accum = 1;
    } else {
      return Status::InvalidInput(fmt::format(
          "{}: train_batch_size: expected train_batch_size or train_micro_batch_size_per_gpu "
          "(DeepSpeed: \"Either train_batch_size or train_micro_batch_size_per_gpu needs to be "
          "provided\"), got neither",
          pending.deepspeed_file));
    }
    const std::optional<int64_t> expected = micro && accum ? product(*micro, *accum, world) : std::nullopt;
    if (!train || !expected || *micro < 1 || *accum < 1 || *train != *expected) {
      return Status::InvalidInput(fmt::format(
          "{}: train_batch_size: expected train_micro_batch_size_per_gpu x "
          "gradient_accumulation_steps x world size ({} x {} x {}), each at least 1, as "
          "DeepSpeedConfig._batch_assertion checks, got {}",
          origin, micro.value_or(0), accum.value_or(0), world,
          train ? fmt::format("{}", *train) : std::string("an overflow")));
    }
    SHARDSCOPE_RETURN_IF_ERROR(MergeSetting(
        root,
        PlanSetting{"training.micro_batch_size", fmt::format("{}", *micro),
                    ds.micro_batch.given ? ds.micro_batch.origin
                                         : fmt::format("{} (train_batch_size / world size)", origin)},
        /*plan_wins=*/false));
    SHARDSCOPE_RETURN_IF_ERROR(MergeSetting(
        root,
        PlanSetting{"training.grad_accum_steps", fmt::format("{}", *accum),
                    ds.grad_accum.given ? ds.grad_accum.origin
                                        : fmt::format("{} (derived as DeepSpeed does)", origin)},
        /*plan_wins=*/false));
  }

  if (pending.torchtitan) {
    // torchtitan/train.py Trainer.__init__: global_batch_size -1 is local x dp degree; it
    // must be a multiple of that; gradient_accumulation_steps = global / (local x dp). The
    // data-parallel degree is the world size (tensor, pipeline and context parallelism are 1).
    const TorchtitanSettings& tt = pending.torchtitan_settings;
    const int64_t per_step = tt.local_batch_size * world;
    const int64_t global = tt.global_batch_size < 0 ? per_step : tt.global_batch_size;
    if (global % per_step != 0) {
      return Status::InvalidInput(fmt::format(
          "{}: training.global_batch_size: expected a multiple of local_batch_size x the "
          "data-parallel degree ({} x {} = {}), as torchtitan's Trainer asserts, got {}",
          tt.global_batch_origin, tt.local_batch_size, world, per_step, global));
    }
    SHARDSCOPE_RETURN_IF_ERROR(MergeSetting(
        root,
        PlanSetting{"training.grad_accum_steps", fmt::format("{}", global / per_step),
                    tt.global_batch_size < 0
                        ? fmt::format("{} (global_batch_size -1: one micro-batch per step)",
                                      tt.local_batch_origin)
                        : tt.global_batch_origin},
        /*plan_wins=*/false));
  }
  return Status::Ok();
}

}  // namespace

Plan WithoutDivergence(const Plan& plan) {
  Plan uniform = plan;
  uniform.divergence = DivergenceConfig{};
  return uniform;
}

StatusOr<Plan> WithRankVariant(const Plan& plan, std::vector<int32_t> ranks, Plan variant,
                               std::string description) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  const int32_t world = plan.cluster.world_size();
  if (ranks.empty() || ranks.front() < 0 || ranks.back() >= world) {
    return Status::InvalidInput(fmt::format("{}: a rank variant needs ranks in 0..{}", plan.source, world - 1));
  }
  if (std::optional<std::string> why = VariantIncompatibility(plan, variant)) {
    return Status::InvalidInput(
        fmt::format("{}: ranks {} run {}: expected {}", plan.source, CompressRanks(ranks), description, *why));
  }
  Plan out = plan;
  // The ranks leave the variants they were in; emptied variants go.
  std::vector<RankVariant> kept;
  for (RankVariant& existing : out.divergence.variants) {
    std::erase_if(existing.ranks, [&](int32_t r) { return std::binary_search(ranks.begin(), ranks.end(), r); });
    if (!existing.ranks.empty()) kept.push_back(std::move(existing));
  }
  variant.divergence = DivergenceConfig{};
  kept.push_back(RankVariant{std::move(ranks), std::move(description), std::make_shared<const Plan>(std::move(variant))});
  std::sort(kept.begin(), kept.end(),
            [](const RankVariant& a, const RankVariant& b) { return a.ranks.front() < b.ranks.front(); });
  out.divergence.variants = std::move(kept);
  return out;
}

std::string_view PrecisionName(Precision precision) { return NameOf(kPrecisions, precision); }
std::string_view ModelImplementationName(ModelImplementation implementation) {
  return NameOf(kImplementations, implementation);
}
std::string_view RmsNormKernelName(RmsNormKernel kernel) { return NameOf(kRmsNormKernels, kernel); }

std::string_view StrategyName(Strategy strategy) {
  for (const auto& entry : kStrategies) {
    if (entry.value == strategy) return entry.name;
  }
  return "unknown";
}

HostConfig DefaultHostConfig() {
  HostConfig host;
  host.launch_overhead_ns = kDefaultLaunchOverheadNs;
  host.hook_overhead_ns = kDefaultHookOverheadNs;
  host.python_op_overhead_ns = kDefaultPythonOpOverheadNs;
  host.cpp_op_overhead_ns = kDefaultCppOpOverheadNs;
  host.max_queued_launches_per_stream = kDefaultMaxQueuedLaunchesPerStream;
  host.cuda_malloc_ns = kDefaultCudaMallocNs;
  host.cuda_free_ns = kDefaultCudaFreeNs;
  return host;
}

Workload WorkloadOf(const Plan& plan) {
  Workload w;
  w.micro_batch = plan.training.micro_batch_size;
  w.seq_len = plan.training.seq_len;
  w.dtype = plan.training.dtype;
  w.expert_load = plan.moe.rank_load;
  w.kernels = plan.training.kernels;
  return w;
}

ContentionConfig DefaultContentionConfig() {
  ContentionConfig contention;
  contention.compute_slowdown = kDefaultComputeSlowdown;
  contention.comm_slowdown = kDefaultCommSlowdown;
  return contention;
}

StatusOr<Plan> ParsePlan(std::string_view yaml_text, const std::string& source) {
  try {
    return PlanParser(source).Parse(yaml_text);
  } catch (const YAML::Exception& e) {
    // Syntax errors (ParserException, including yaml-cpp's nesting-depth guard) carry a mark.
    const int line = e.mark.is_null() ? 1 : e.mark.line + 1;
    const int column = e.mark.is_null() ? 1 : e.mark.column + 1;
    return Status::InvalidInput(
        fmt::format("{}:{}:{}: invalid YAML: {}", source, line, column, e.msg));
  } catch (const std::exception& e) {
    return Status::Internal(fmt::format("{}: reading the plan failed: {}", source, e.what()));
  } catch (...) {
    return Status::Internal(fmt::format("{}: reading the plan failed", source));
  }
}

StatusOr<Plan> LoadPlanFile(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    return Status::IoError(fmt::format("cannot read plan '{}': {}", path, std::strerror(errno)));
  }
  std::string text;
  std::array<char, 65536> buffer;
  size_t n = 0;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), file)) > 0) {
    text.append(buffer.data(), n);
    if (text.size() > kMaxPlanFileBytes) {
      std::fclose(file);
      return Status::InvalidInput(
          fmt::format("{}:1:1: (top level): expected a plan file of at most {} bytes, got more",
                      path, kMaxPlanFileBytes));
    }
  }
  // fopen succeeds on a directory; the read then fails with EISDIR.
  const bool failed = std::ferror(file) != 0;
  const int read_errno = errno;
  std::fclose(file);
  if (failed) {
    return Status::IoError(
        fmt::format("cannot read plan '{}': {}", path, std::strerror(read_errno)));
  }
  return ParsePlan(text, path);
}

}  // namespace shardscope::sim

// The fsdp2: and fsdp1: sections (torch fully_shard and FullyShardedDataParallel, fairscale's
// FSDP), and what the two share: the (replicate, shard) device mesh and the mixed-precision
// policy. HSDP is either one with a 2-D mesh.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "plan_parser.h"

namespace shardscope::sim::plan_internal {
namespace {

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

}  // namespace

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
  // FullyShardedDataParallel(sync_module_states=False, device_id=None) (torch/distributed/fsdp/
  // fully_sharded_data_parallel.py); fairscale's constructor has neither (it shards the module
  // where it lives and moves to its compute_device lazily).
  for (const std::string_view key : {std::string_view("sync_module_states"), std::string_view("device_id")}) {
    const Entry* e = fields.Find(key);
    if (e == nullptr) continue;
    if (fairscale) return reject_for_fairscale(*e, key);
    SHARDSCOPE_RETURN_IF_ERROR(ReadBool(*e, JoinPath("fsdp1", key),
                                        key == "device_id" ? &out->device_id : &out->sync_module_states));
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

}  // namespace shardscope::sim::plan_internal

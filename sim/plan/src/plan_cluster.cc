// The cluster: section: a cluster preset, a preset with figures changed, or a cluster from its
// GPU and links; cluster.contention; cluster.network (leaf/spine tiers); cluster.link_sharing;
// cluster.nccl (the NCCL release and its knobs, resolved after training.pytorch_version, from
// plan.cc); and cluster.calibration, a profile written by `shardscope calibrate` whose fitted
// costs replace the defaults (read last, from plan.cc).
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>

#include "plan_parser.h"
#include "shardscope/sim/models/calibration.h"

namespace shardscope::sim::plan_internal {

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
        ReadNumber(*e, "cluster.intra_node_bandwidth_gbps", kMinBandwidthGbps, false, kMaxBandwidthGbps, &value));
    spec.intra_node_bandwidth = value * kBytesPerGbps;
  }
  if (const Entry* e = fields.Find("inter_node_bandwidth_gbps")) {
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadNumber(*e, "cluster.inter_node_bandwidth_gbps", kMinBandwidthGbps, false, kMaxBandwidthGbps, &value));
    spec.inter_node_bandwidth = value * kBytesPerGbps;
  }
  if (const Entry* e = fields.Find("gpu_memory_gb")) {
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadNumber(*e, "cluster.gpu_memory_gb", 0, true, kMaxGpuMemoryGb, &value));
    spec.gpu.hbm_bytes = std::llround(value * kBytesPerMemoryGb);
    // What a user can read off the machine is what CUDA reports (torch.cuda.get_device_properties
    // .total_memory): the override is the usable capacity too.
    spec.gpu.usable_bytes = spec.gpu.hbm_bytes;
  }
  if (const Entry* e = fields.Find("link_sharing")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadBool(*e, "cluster.link_sharing", &spec.link_sharing));
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
  if (const Entry* e = fields.Find("network")) SHARDSCOPE_RETURN_IF_ERROR(ReadNetwork(*e, &spec.network));
  *cluster = std::move(spec);
  return Status::Ok();
}

Status PlanParser::ReadNetwork(const Entry& entry, NetworkTiers* out) const {
  SHARDSCOPE_ASSIGN_OR_RETURN(Fields fields, ReadMapping(entry.value, MarkOf(entry), "cluster.network", kNetworkKeys));
  // Both figures are the fabric's own: no default switch latency is assumed (docs/PLAN.md).
  SHARDSCOPE_RETURN_IF_ERROR(Require(fields, "cluster.network", "nodes_per_leaf",
                                     "a positive integer (the nodes whose NICs share their rails' leaf switches)"));
  SHARDSCOPE_RETURN_IF_ERROR(Require(fields, "cluster.network", "switch_latency_ns",
                                     "a switch's port-to-port latency in ns, from its datasheet"));
  SHARDSCOPE_RETURN_IF_ERROR(
      ReadInt32(*fields.Find("nodes_per_leaf"), "cluster.network.nodes_per_leaf", 1, kMaxWorldSize, &out->nodes_per_leaf));
  return ReadInt(*fields.Find("switch_latency_ns"), "cluster.network.switch_latency_ns", 0, kMaxSwitchLatencyNs,
                 &out->switch_latency_ns);
}

Status PlanParser::ResolveNccl(const Entry* cluster, Plan* plan) const {
  NcclEnv& env = plan->cluster.nccl;
  env = NcclEnv{};
  const TrainingConfig& t = plan->training;
  env.version = NcclForPytorch(t.pytorch_major, t.pytorch_minor);
  env.version_source = fmt::format("PyTorch {}.{}'s wheels (training.pytorch_version)", t.pytorch_major, t.pytorch_minor);
  const Entry* nccl = nullptr;
  Fields cluster_fields;
  if (cluster != nullptr && cluster->value.IsMap()) {
    SHARDSCOPE_ASSIGN_OR_RETURN(cluster_fields, ReadMapping(cluster->value, MarkOf(*cluster), "cluster", kClusterKeys));
    nccl = cluster_fields.Find("nccl");
  }
  if (nccl == nullptr) return Status::Ok();
  SHARDSCOPE_ASSIGN_OR_RETURN(Fields fields, ReadMapping(nccl->value, MarkOf(*nccl), "cluster.nccl", kNcclKeys));
  if (const Entry* e = fields.Find("version")) {
    // The scalar's text as written: an unquoted 2.20 must not become the float 2.2.
    const std::string expected = fmt::format("an NCCL release as \"2.minor.patch\" (e.g. \"2.21.5\"), from {}.{}",
                                             kOldestModelledNccl.major, kOldestModelledNccl.minor);
    const std::optional<NcclVersion> version = e->value.IsScalar() ? ParseNcclVersion(e->value.Scalar()) : std::nullopt;
    if (!version || *version < kOldestModelledNccl) return Error(*e, "cluster.nccl.version", expected);
    env.version = *version;
    env.version_source = "cluster.nccl.version";
  }
  const auto read_list = [&](const char* key, std::string* text, NcclEnableMask* mask, bool algo) -> Status {
    const Entry* e = fields.Find(key);
    if (e == nullptr) return Status::Ok();
    const std::string path = fmt::format("cluster.nccl.{}", key);
    SHARDSCOPE_RETURN_IF_ERROR(ReadString(*e, path, algo ? "a list of NCCL algorithms" : "a list of NCCL protocols", text));
    StatusOr<NcclEnableMask> parsed = algo ? ParseNcclAlgoList(*text, env.version) : ParseNcclProtoList(*text, env.version);
    if (!parsed.ok()) return Error(*e, path, parsed.status().message());
    *mask = *parsed;
    if (algo) env.algo_where = Where(MarkOf(*e));
    return Status::Ok();
  };
  SHARDSCOPE_RETURN_IF_ERROR(read_list("NCCL_ALGO", &env.algo, &env.algo_enabled, true));
  SHARDSCOPE_RETURN_IF_ERROR(read_list("NCCL_PROTO", &env.proto, &env.proto_enabled, false));
  if (env.algo_where.empty() && fields.Find("NCCL_PROTO") != nullptr) env.algo_where = Where(MarkOf(*fields.Find("NCCL_PROTO")));
  // 0 off, 1 on, 2 NCCL decides (the default): NCCL_PARAM(NvlsEnable, ...), NCCL_PARAM(PatEnable, ...).
  if (const Entry* e = fields.Find("NCCL_NVLS_ENABLE")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadInt32(*e, "cluster.nccl.NCCL_NVLS_ENABLE", 0, kNcclAuto, &env.nvls_enable));
  }
  if (const Entry* e = fields.Find("NCCL_PAT_ENABLE")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadInt32(*e, "cluster.nccl.NCCL_PAT_ENABLE", 0, kNcclAuto, &env.pat_enable));
  }
  if (const Entry* e = fields.Find("NCCL_COLLNET_ENABLE")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadInt32(*e, "cluster.nccl.NCCL_COLLNET_ENABLE", 0, 1, &env.collnet_enable));
    if (env.collnet_enable != 0) {
      return Error(MarkOf(*e), "cluster.nccl.NCCL_COLLNET_ENABLE",
                   "0: CollNet (in-network reduction over IB SHARP) is not modelled", Describe(e->value));
    }
  }
  if (const Entry* e = fields.Find("NCCL_MIN_NCHANNELS")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadInt32(*e, "cluster.nccl.NCCL_MIN_NCHANNELS", 1, kMaxNcclChannels, &env.min_nchannels));
  }
  if (const Entry* e = fields.Find("NCCL_MAX_NCHANNELS")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadInt32(*e, "cluster.nccl.NCCL_MAX_NCHANNELS", 1, kMaxNcclChannels, &env.max_nchannels));
  }
  if (const Entry* e = fields.Find("NCCL_NVLS_NCHANNELS")) {
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadInt32(*e, "cluster.nccl.NCCL_NVLS_NCHANNELS", 1, kMaxNcclChannels, &env.nvls_nchannels));
  }
  if (const Entry* e = fields.Find("NCCL_BUFFSIZE")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadInt(*e, "cluster.nccl.NCCL_BUFFSIZE", 1, kMaxNcclBuffsize, &env.buffsize));
  }
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

}  // namespace shardscope::sim::plan_internal

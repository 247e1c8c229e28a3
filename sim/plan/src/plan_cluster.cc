// The cluster: section: a cluster preset, a preset with figures changed, or a cluster from its
// GPU and links; cluster.contention; and cluster.calibration, a profile written by `shardscope
// calibrate` whose fitted costs replace the defaults (read last, from plan.cc).
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
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

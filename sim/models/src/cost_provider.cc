// ClusterCostProvider: the roofline compute model and the NCCL model over the cluster.
#include "shardscope/sim/models/cost_provider.h"

#include <fmt/format.h>

#include <set>
#include <utility>
#include <variant>

namespace shardscope::sim {

using traces::Schedule;

ClusterCostProvider::ClusterCostProvider(const Schedule& schedule, const ClusterSpec& cluster)
    : compute_(cluster.gpu, ComputeModelConfig::Default()), nccl_(NcclModelConfig::For(cluster.nccl)) {
  topologies_.reserve(schedule.communicators.size());
  topology_key_.reserve(schedule.communicators.size());
  std::vector<size_t> distinct;  // index into topologies_ of each distinct topology
  for (const traces::Communicator& comm : schedule.communicators) {
    topologies_.push_back(TopologyOf(cluster, comm.ranks));
    const CommTopology& t = topologies_.back();
    // Few distinct shapes (one per group size and node span), so a linear search.
    size_t key = 0;
    while (key < distinct.size() && !(topologies_[distinct[key]] == t)) ++key;
    if (key == distinct.size()) distinct.push_back(topologies_.size() - 1);
    topology_key_.push_back(static_cast<int32_t>(key));
  }
}

int64_t ClusterCostProvider::CommunicatorCostKey(int32_t communicator) const {
  return topology_key_[static_cast<size_t>(communicator)];
}

int64_t ClusterCostProvider::KernelNs(const traces::ComputeDesc& desc) const {
  if (const auto* fixed = std::get_if<traces::FixedDurationDesc>(&desc)) return fixed->duration_ns;
  return compute_.KernelDurationNs(desc);
}

int64_t ClusterCostProvider::MemcpyNs(traces::MemcpyKind kind, int64_t bytes) const {
  return compute_.MemcpyDurationNs(kind, bytes);
}

CollectiveCost ClusterCostProvider::Collective(traces::CollectiveType type, int64_t bytes,
                                               int32_t communicator) const {
  return nccl_.Estimate(type, bytes, topologies_[static_cast<size_t>(communicator)]);
}

Status CheckNcclChoices(const Schedule& schedule, const ClusterSpec& cluster) {
  const NcclModel nccl(NcclModelConfig::For(cluster.nccl));
  if (nccl.config().tables.algo_scope != NcclAlgoScope::kStrict) return Status::Ok();
  // (program, slot, type) issued, then (communicator, type) over the ranks' bindings.
  std::set<std::pair<int32_t, traces::CollectiveType>> used_by_slot;
  std::set<std::pair<int32_t, traces::CollectiveType>> used;
  for (size_t p = 0; p < schedule.programs.size(); ++p) {
    used_by_slot.clear();
    for (const traces::Op& op : schedule.programs[p].ops) {
      if (const auto* coll = std::get_if<traces::CollectiveOp>(&op.payload)) {
        used_by_slot.insert({static_cast<int32_t>(coll->comm), coll->type});
      }
    }
    for (const traces::RankBinding& binding : schedule.ranks) {
      if (binding.program != static_cast<int32_t>(p)) continue;
      for (const auto& [slot, type] : used_by_slot) {
        if (slot >= 0 && static_cast<size_t>(slot) < binding.comm_binding.size()) {
          used.insert({binding.comm_binding[static_cast<size_t>(slot)], type});
        }
      }
    }
  }
  for (const auto& [comm_index, type] : used) {
    if (comm_index < 0 || static_cast<size_t>(comm_index) >= schedule.communicators.size()) continue;
    const traces::Communicator& comm = schedule.communicators[static_cast<size_t>(comm_index)];
    const CommTopology topology = TopologyOf(cluster, comm.ranks);
    if (nccl.AnyEnabled(type, topology)) continue;
    const NcclEnv& env = cluster.nccl;
    const auto quoted_or_unset = [](const std::string& v) { return v.empty() ? std::string("unset") : '"' + v + '"'; };
    const std::string where = env.algo_where.empty() ? std::string("cluster.nccl") : env.algo_where;
    return Status::InvalidInput(fmt::format(
        "{}: cluster.nccl.NCCL_ALGO / NCCL_PROTO: expected a choice that leaves NCCL {} an algorithm and protocol "
        "for {} on communicator '{}' ({} ranks on {} node(s)), got NCCL_ALGO {}, NCCL_PROTO {}, "
        "NCCL_NVLS_ENABLE {}, NCCL_PAT_ENABLE {} (NCCL {} refuses such a call: \"no algorithm/protocol available\")",
        where, env.version.ToString(), traces::CollectiveTypeName(type), comm.name, topology.nranks, topology.nnodes,
        quoted_or_unset(env.algo), quoted_or_unset(env.proto), env.nvls_enable, env.pat_enable,
        env.version.ToString()));
  }
  return Status::Ok();
}

}  // namespace shardscope::sim

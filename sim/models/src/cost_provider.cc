// ClusterCostProvider: the roofline compute model and the NCCL model over the cluster.
#include "shardscope/sim/models/cost_provider.h"

#include <variant>

namespace shardscope::sim {

using traces::Schedule;

ClusterCostProvider::ClusterCostProvider(const Schedule& schedule, const ClusterSpec& cluster)
    : compute_(cluster.gpu, ComputeModelConfig::Default()), nccl_(NcclModelConfig::Default()) {
  topologies_.reserve(schedule.communicators.size());
  for (const traces::Communicator& comm : schedule.communicators) {
    topologies_.push_back(TopologyOf(cluster, comm.ranks));
  }
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

}  // namespace shardscope::sim

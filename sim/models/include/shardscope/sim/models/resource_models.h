// The resource models a simulation runs with, built from its settings: links first (they run
// collectives), then GPU compute sharing (it runs kernels and copies), then compute-
// communication contention. That order is the order shares apply in (a kernel: 1/n, then
// 1/(1 + compute_slowdown); a collective: its link share, then 1/(1 + comm_slowdown)).
#ifndef SHARDSCOPE_SIM_MODELS_RESOURCE_MODELS_H_
#define SHARDSCOPE_SIM_MODELS_RESOURCE_MODELS_H_

#include <memory>
#include <vector>

#include "shardscope/base/status.h"
#include "shardscope/sim/models/contention_model.h"
#include "shardscope/sim/models/cost_provider.h"
#include "shardscope/sim/models/gpu_sharing_model.h"
#include "shardscope/sim/models/link_model.h"
#include "shardscope/sim/models/resource_model.h"

namespace shardscope::sim {

struct ResourceModelsConfig {
  ComputeSharing compute_sharing = ComputeSharing::kFairShare;
  ContentionConfig contention;
  std::vector<LinkSpec> links;   // none: every communicator on its own unlimited virtual link
  std::vector<CommTopology> link_topologies;  // per communicator, for kNvlink / kNic links
};

// `communicators`: Schedule::communicators.size(). kInvalidInput for a bad link.
StatusOr<std::vector<std::unique_ptr<ResourceModel>>> MakeResourceModels(const ResourceModelsConfig& config,
                                                                         int32_t communicators);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_MODELS_RESOURCE_MODELS_H_

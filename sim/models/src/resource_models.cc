// Builds the resource models of a simulation (resource_models.h).
#include "shardscope/sim/models/resource_models.h"

#include <utility>

namespace shardscope::sim {

StatusOr<std::vector<std::unique_ptr<ResourceModel>>> MakeResourceModels(const ResourceModelsConfig& config,
                                                                         int32_t communicators) {
  std::vector<std::unique_ptr<ResourceModel>> models;
  SHARDSCOPE_ASSIGN_OR_RETURN(std::unique_ptr<LinkModel> links, LinkModel::Create(config.links, config.link_topologies, communicators));
  models.push_back(std::move(links));
  models.push_back(std::make_unique<GpuSharingModel>(config.compute_sharing));
  models.push_back(std::make_unique<ContentionModel>(config.contention));
  return models;
}

}  // namespace shardscope::sim

// Private to sim/lowering/: the cluster's NCCL release and knobs (cluster.nccl) and its
// network tiers (cluster.network) in a schedule's metadata, written by WritePlanMetadata and
// read back by SetupFromSchedule (schedule_metadata.cc), so a schedule JSON simulates as its
// plan does. Keys: "nccl.version", "nccl.version_source", "nccl.NCCL_ALGO", ... (NCCL's own
// names, written when set), "network.nodes_per_leaf", "network.switch_latency_ns".
#ifndef SHARDSCOPE_SIM_LOWERING_NCCL_METADATA_H_
#define SHARDSCOPE_SIM_LOWERING_NCCL_METADATA_H_

#include <map>
#include <string>

#include "shardscope/base/status.h"
#include "shardscope/sim/presets/hardware.h"

namespace shardscope::sim {

void WriteNcclMetadata(const ClusterSpec& cluster, std::map<std::string, std::string>& metadata);

// Fills cluster.nccl and cluster.network. A schedule without "nccl.version" gets the NCCL of
// its "training.pytorch_version" when it has one, else NcclEnv's default. InvalidInput naming
// the key ("<label>: /metadata/nccl.NCCL_ALGO: ...") on a bad value.
Status ReadNcclMetadata(const std::map<std::string, std::string>& metadata, const std::string& label,
                        ClusterSpec* cluster);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_LOWERING_NCCL_METADATA_H_

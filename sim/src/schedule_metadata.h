// The plan context a schedule carries in Schedule::metadata, so a schedule JSON can be
// simulated without the plan that produced it. Private to sim/.
#ifndef SHARDSCOPE_SIM_SCHEDULE_METADATA_H_
#define SHARDSCOPE_SIM_SCHEDULE_METADATA_H_

#include <map>
#include <string>

#include "shardscope/sim/plan.h"

namespace shardscope::sim {

// Writes every hardware figure, the contention factors and the host costs.
void WritePlanMetadata(const Plan& plan, std::map<std::string, std::string>& metadata);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_SCHEDULE_METADATA_H_

// Private to sim/report/: report.json's "nccl" section (docs/REPORT.md): the NCCL release the
// simulation modelled and how it was chosen, the knobs, the network tiers, and the algorithm,
// protocol and channels NCCL's model picks for each kind of collective rank 0 issues.
#ifndef SHARDSCOPE_SIM_REPORT_REPORT_NCCL_H_
#define SHARDSCOPE_SIM_REPORT_REPORT_NCCL_H_

#include <nlohmann/json.hpp>

#include "shardscope/sim/lowering/schedule_metadata.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::sim {

nlohmann::ordered_json NcclReportJson(const traces::Schedule& schedule, const SimulationSetup& setup);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_REPORT_REPORT_NCCL_H_

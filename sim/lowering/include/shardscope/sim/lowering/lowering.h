// Lowering: a plan (model + cluster + strategy + knobs) becomes a schedule, the per-rank
// program of host ops the framework really issues, stream by stream, wait by wait,
// allocation by allocation.
//
// Each strategy's lowering cites, next to the code, the framework file and function whose
// behaviour it encodes. Ranks that run the same program share it (schedule.h).
#ifndef SHARDSCOPE_SIM_LOWERING_H_
#define SHARDSCOPE_SIM_LOWERING_H_

#include "shardscope/sim/plan/plan.h"
#include "shardscope/traces/schedule.h"
#include "shardscope/base/status.h"

namespace shardscope::sim {

// Metadata keys the lowering writes into the schedule (read back by simulation.h).
inline constexpr char kMetaModelFlopsPerRankStep[] = "model.flops_per_rank_step";
inline constexpr char kMetaTokensPerRankStep[] = "model.tokens_per_rank_step";

StatusOr<traces::Schedule> LowerPlan(const Plan& plan);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_LOWERING_H_

// Lowering of fsdp1 (in progress on a branch; LowerPlan reports it as not lowered meanwhile).
#include "lowering_internal.h"

namespace shardscope::sim {

StatusOr<LoweredPrograms> LowerFsdp1(const LoweringContext& ctx) {
  return Status::InvalidInput(std::string("strategy ") + std::string(StrategyName(ctx.plan.strategy)) +
                              " is not lowered yet");
}

}  // namespace shardscope::sim

// The version string printed by `shardscope --version` and written into reports.
#include "shardscope/sim/report/version.h"

namespace shardscope::sim {
std::string_view Version() { return "0.1.0"; }
}  // namespace shardscope::sim

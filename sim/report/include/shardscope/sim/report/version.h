// shardscope's version, written into every report so results can be traced to a build.
#ifndef SHARDSCOPE_SIM_VERSION_H_
#define SHARDSCOPE_SIM_VERSION_H_

#include <string_view>

namespace shardscope::sim {
std::string_view Version();
}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_VERSION_H_

// Rank lists as people write them: "0-2,4-7". Used wherever a message or a report names a
// set of ranks (hang analysis, plan errors, the Flight Recorder analysis).
#ifndef SHARDSCOPE_BASE_RANK_RANGES_H_
#define SHARDSCOPE_BASE_RANK_RANGES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace shardscope {

// "0-2,4-7" for {0,1,2,4,5,6,7} (sorted, duplicates dropped).
std::string CompressRanks(std::vector<int32_t> ranks);

}  // namespace shardscope

#endif  // SHARDSCOPE_BASE_RANK_RANGES_H_

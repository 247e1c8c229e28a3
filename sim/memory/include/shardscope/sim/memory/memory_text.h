// What `shardscope memory` and `shardscope fit` print, as text and JSON, for the CLI and the
// Python module alike. (Moved from cli/memory_commands.cc.)
#ifndef SHARDSCOPE_SIM_MEMORY_MEMORY_TEXT_H_
#define SHARDSCOPE_SIM_MEMORY_MEMORY_TEXT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "shardscope/sim/memory/memory_report.h"

namespace shardscope::sim {

// One rank's breakdown as a table: bytes by category at the allocated peak, the allocator's
// overhead, peak reserved, headroom, retries and the OOM, in GiB and % of capacity; then where
// the capacity comes from (usable less the CUDA context, NCCL, cuBLAS, other processes) and
// the init phase's peak.
std::string MemoryBreakdownText(const MemoryBreakdown& breakdown);

// `shardscope memory --json`: {"input", "world_size", "ranks": [breakdown...]}, indented by
// two, with a final newline. Bytes are integers; categories by MemoryCategoryName.
std::string MemoryBreakdownsJson(const std::string& input, int32_t world_size,
                                 const std::vector<MemoryBreakdown>& breakdowns);

// `shardscope fit`'s output: the header naming `plan_label` and the allocator capacity, one
// row per candidate (the best marked), then the verdict line ("largest micro_batch_size that
// fits: ..." or "nothing fits: <reason>").
std::string FitReportText(const std::string& plan_label, const FitResult& fit);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_MEMORY_MEMORY_TEXT_H_

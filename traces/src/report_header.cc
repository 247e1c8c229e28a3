#include "shardscope/traces/report_header.h"

#include <utility>

namespace shardscope::traces {

ReportHeader ReportHeaderOf(const Schedule& schedule, std::string version, std::string source, ReportCluster cluster) {
  ReportHeader h;
  h.version = std::move(version);
  h.source = std::move(source);
  auto it = schedule.metadata.find("plan.strategy");
  h.strategy = it != schedule.metadata.end() ? it->second : "";
  it = schedule.metadata.find("plan.model");
  h.model = it != schedule.metadata.end() ? it->second : "";
  h.world_size = schedule.world_size();
  h.cluster = std::move(cluster);
  return h;
}

}  // namespace shardscope::traces

// The first keys of every report.json shardscope writes (docs/REPORT.md): `simulate`'s
// (sim/report/src/report.cc) and `run`'s on either backend (runtime/src/run_result.cc), written by
// one function so the reports stay comparable key for key.
//
//   nlohmann::ordered_json j;
//   traces::WriteReportHeader(traces::ReportHeaderOf(schedule, version, source, cluster), j);
//
// The JSON type is a template parameter so traces' public headers do not depend on
// nlohmann's; any ordered JSON object with operator[] and initializer lists works.
#ifndef SHARDSCOPE_TRACES_REPORT_HEADER_H_
#define SHARDSCOPE_TRACES_REPORT_HEADER_H_

#include <cstdint>
#include <string>

#include "shardscope/traces/schedule.h"

namespace shardscope::traces {

// The cluster as the report names it (sim::ClusterSpec's fields; traces does not know sim).
struct ReportCluster {
  std::string name;
  std::string gpu;
  int32_t nodes = 0;
  int32_t gpus_per_node = 0;
};

struct ReportHeader {
  std::string version;   // sim::Version()
  std::string source;    // the input file
  std::string strategy;  // schedule metadata "plan.strategy", "" when absent
  std::string model;     // schedule metadata "plan.model", "" when absent
  int32_t world_size = 0;
  ReportCluster cluster;
};

ReportHeader ReportHeaderOf(const Schedule& schedule, std::string version, std::string source, ReportCluster cluster);

// Writes shardscope_version, source, strategy, model, world_size and cluster, in that order.
template <typename Json>
void WriteReportHeader(const ReportHeader& h, Json& j) {
  j["shardscope_version"] = h.version;
  j["source"] = h.source;
  j["strategy"] = h.strategy;
  j["model"] = h.model;
  j["world_size"] = h.world_size;
  j["cluster"] = {{"name", h.cluster.name},
                  {"gpu", h.cluster.gpu},
                  {"nodes", h.cluster.nodes},
                  {"gpus_per_node", h.cluster.gpus_per_node}};
}

// The "memory" section: over every rank, the largest reserved peak and the first rank with
// it, the largest allocated peak, and the sums of allocator retries and out-of-memory errors.
struct ReportMemory {
  int64_t peak_reserved = 0;
  int32_t peak_reserved_rank = 0;
  int64_t peak_allocated = 0;
  int64_t retries = 0;
  int64_t ooms = 0;
  void AddRank(int32_t rank, int64_t reserved_peak, int64_t allocated_peak, int64_t alloc_retries, int64_t num_ooms) {
    if (reserved_peak > peak_reserved) {
      peak_reserved = reserved_peak;
      peak_reserved_rank = rank;
    }
    if (allocated_peak > peak_allocated) peak_allocated = allocated_peak;
    retries += alloc_retries;
    ooms += num_ooms;
  }
};

// j["memory"] = {peak_reserved_bytes, peak_reserved_rank, peak_allocated_bytes,
// num_alloc_retries, num_ooms, allocator_conf}.
template <typename Json>
void WriteReportMemory(const ReportMemory& m, const std::string& allocator_conf, Json& j) {
  j["memory"] = {{"peak_reserved_bytes", m.peak_reserved},
                 {"peak_reserved_rank", m.peak_reserved_rank},
                 {"peak_allocated_bytes", m.peak_allocated},
                 {"num_alloc_retries", m.retries},
                 {"num_ooms", m.ooms},
                 {"allocator_conf", allocator_conf}};
}

}  // namespace shardscope::traces

#endif  // SHARDSCOPE_TRACES_REPORT_HEADER_H_

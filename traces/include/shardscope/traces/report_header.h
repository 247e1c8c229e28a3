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
#include <vector>

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

// Where a GPU's memory goes outside and before the step (docs/REPORT.md; `run` writes it with
// its measured peaks and no init phase):
// what CUDA reports, what the CUDA stack takes before the allocator sees anything, the init
// phase (the model reaching the GPU, the optimizer states built) and the step, for one class of
// ranks that agree on all of them.
struct ReportMemoryClass {
  std::string ranks;                       // "0-7"
  int64_t usable_bytes = 0;                // cudaMemGetInfo total
  int64_t cuda_context_bytes = 0;
  int64_t nccl_bytes = 0;                  // the ranks' communicators' buffers
  int32_t nccl_communicators = 0;
  int64_t cublas_workspace_bytes = 0;      // all of a rank's workspaces
  bool cublas_in_allocator = true;         // inside the allocator's reserved memory, or outside
  int64_t reserved_by_others_bytes = 0;
  int64_t allocator_capacity_bytes = 0;    // what the step's allocator may reserve
  bool init_simulated = false;
  int64_t init_capacity_bytes = 0;         // usable - context - others (before NCCL exists)
  int64_t init_nccl_bytes = 0;             // NCCL buffers created during init
  int64_t init_peak_reserved_bytes = 0;
  std::string init_peak_at;                // the framework step that reached the peak
  bool init_oom = false;
  std::string init_oom_at;
  int64_t init_oom_requested_bytes = 0;
  int64_t step_peak_reserved_bytes = 0;    // max over the class's ranks
  bool step_oom = false;
  int64_t headroom_bytes = 0;              // allocator capacity - step peak (< 0: does not fit)
};

struct ReportMemoryPhases {
  std::string cuda_version;                // "12.4"
  bool lazy_loading = false;
  std::string init_framework;              // "" when no init phase was simulated
  std::vector<ReportMemoryClass> classes;
};

// Adds j["memory"]["cuda"] = {version, lazy_loading} and j["memory"]["phases"] = [one object per
// class: ranks, usable_bytes, cuda_context_bytes, nccl_buffer_bytes, nccl_communicators,
// cublas_workspace_bytes, cublas_workspace_in_allocator, reserved_by_others_bytes,
// allocator_capacity_bytes, init {framework, capacity_bytes, nccl_buffer_bytes,
// peak_reserved_bytes, peak_at, verdict, oom_at, oom_requested_bytes} or null, step
// {peak_reserved_bytes, verdict, headroom_bytes}]. After WriteReportMemory.
template <typename Json>
void WriteReportMemoryPhases(const ReportMemoryPhases& p, Json& j) {
  j["memory"]["cuda"] = {{"version", p.cuda_version}, {"lazy_loading", p.lazy_loading}};
  Json classes = Json::array();
  for (const ReportMemoryClass& c : p.classes) {
    Json init = nullptr;
    if (c.init_simulated) {
      init = {{"framework", p.init_framework},
              {"capacity_bytes", c.init_capacity_bytes},
              {"nccl_buffer_bytes", c.init_nccl_bytes},
              {"peak_reserved_bytes", c.init_peak_reserved_bytes},
              {"peak_at", c.init_peak_at},
              {"verdict", c.init_oom ? "out of memory" : "fits"},
              {"oom_at", c.init_oom ? Json(c.init_oom_at) : Json(nullptr)},
              {"oom_requested_bytes", c.init_oom ? Json(c.init_oom_requested_bytes) : Json(nullptr)}};
    }
    classes.push_back({{"ranks", c.ranks},
                       {"usable_bytes", c.usable_bytes},
                       {"cuda_context_bytes", c.cuda_context_bytes},
                       {"nccl_buffer_bytes", c.nccl_bytes},
                       {"nccl_communicators", c.nccl_communicators},
                       {"cublas_workspace_bytes", c.cublas_workspace_bytes},
                       {"cublas_workspace_in_allocator", c.cublas_in_allocator},
                       {"reserved_by_others_bytes", c.reserved_by_others_bytes},
                       {"allocator_capacity_bytes", c.allocator_capacity_bytes},
                       {"init", init},
                       {"step",
                        {{"peak_reserved_bytes", c.step_peak_reserved_bytes},
                         {"verdict", c.step_oom ? "out of memory" : "fits"},
                         {"headroom_bytes", c.headroom_bytes}}}});
  }
  j["memory"]["phases"] = std::move(classes);
}

}  // namespace shardscope::traces

#endif  // SHARDSCOPE_TRACES_REPORT_HEADER_H_

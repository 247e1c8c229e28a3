#include "shardscope/traces/report_header.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace shardscope::traces {
namespace {

TEST(ReportHeaderTest, WritesTheKeysInOrderWithMetadata) {
  Schedule schedule;
  schedule.metadata["plan.strategy"] = "fsdp2";
  schedule.metadata["plan.model"] = "llama3-8b";
  const ReportHeader h = ReportHeaderOf(schedule, "1.2.3", "plan.yaml", {"dgx-h100", "h100-sxm5-80gb", 2, 8});
  nlohmann::ordered_json j;
  WriteReportHeader(h, j);
  EXPECT_EQ(j.dump(),
            R"({"shardscope_version":"1.2.3","source":"plan.yaml","strategy":"fsdp2","model":"llama3-8b",)"
            R"("world_size":0,"cluster":{"name":"dgx-h100","gpu":"h100-sxm5-80gb","nodes":2,"gpus_per_node":8}})");
}

TEST(ReportHeaderTest, MissingMetadataIsEmpty) {
  const ReportHeader h = ReportHeaderOf(Schedule{}, "v", "s", {});
  EXPECT_EQ(h.strategy, "");
  EXPECT_EQ(h.model, "");
}

TEST(ReportHeaderTest, MemoryTakesTheFirstRankWithTheLargestReservedPeakAndSums) {
  ReportMemory m;
  m.AddRank(0, 100, 90, 1, 0);
  m.AddRank(1, 300, 50, 0, 2);
  m.AddRank(2, 300, 120, 4, 1);  // ties rank 1's reserved peak: rank 1 stays
  nlohmann::ordered_json j;
  WriteReportMemory(m, "expandable_segments:True", j);
  EXPECT_EQ(j.dump(),
            R"({"memory":{"peak_reserved_bytes":300,"peak_reserved_rank":1,"peak_allocated_bytes":120,)"
            R"("num_alloc_retries":5,"num_ooms":3,"allocator_conf":"expandable_segments:True"}})");
}

TEST(ReportHeaderTest, MemoryPhasesPerClass) {
  ReportMemoryPhases p;
  p.cuda_version = "11.1";
  p.lazy_loading = false;
  p.init_framework = "DeepSpeed ZeRO-3";
  ReportMemoryClass c;
  c.ranks = "0-7";
  c.usable_bytes = 1000;
  c.cuda_context_bytes = 100;
  c.nccl_bytes = 50;
  c.nccl_communicators = 1;
  c.cublas_workspace_bytes = 16;
  c.cublas_in_allocator = false;
  c.allocator_capacity_bytes = 834;
  c.init_simulated = true;
  c.init_capacity_bytes = 900;
  c.init_peak_reserved_bytes = 700;
  c.init_peak_at = "x";
  c.init_oom = true;
  c.init_oom_at = "y";
  c.init_oom_requested_bytes = 300;
  c.step_peak_reserved_bytes = 800;
  c.headroom_bytes = 34;
  p.classes.push_back(c);
  c.ranks = "8";
  c.init_simulated = false;
  c.step_oom = true;
  p.classes.push_back(c);
  nlohmann::ordered_json j;
  WriteReportMemory(ReportMemory{}, "", j);
  WriteReportMemoryPhases(p, j);
  EXPECT_EQ(j["memory"]["cuda"].dump(), R"({"version":"11.1","lazy_loading":false})");
  EXPECT_EQ(j["memory"]["phases"][0].dump(),
            R"({"ranks":"0-7","usable_bytes":1000,"cuda_context_bytes":100,"nccl_buffer_bytes":50,)"
            R"("nccl_communicators":1,"cublas_workspace_bytes":16,"cublas_workspace_in_allocator":false,)"
            R"("reserved_by_others_bytes":0,"allocator_capacity_bytes":834,"init":{"framework":"DeepSpeed ZeRO-3",)"
            R"("capacity_bytes":900,"nccl_buffer_bytes":0,"peak_reserved_bytes":700,"peak_at":"x","verdict":"out of memory",)"
            R"("oom_at":"y","oom_requested_bytes":300},"step":{"peak_reserved_bytes":800,"verdict":"fits","headroom_bytes":34}})");
  EXPECT_TRUE(j["memory"]["phases"][1]["init"].is_null());
  EXPECT_EQ(j["memory"]["phases"][1]["step"]["verdict"], "out of memory");
  // The first six keys stay where run's report has them.
  EXPECT_EQ(j["memory"].begin().key(), "peak_reserved_bytes");
}

}  // namespace
}  // namespace shardscope::traces

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

}  // namespace
}  // namespace shardscope::traces

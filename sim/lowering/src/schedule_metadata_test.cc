// SetupFromSchedule's bounds on a hand-written schedule's metadata: every figure a model
// divides by or multiplies with is in range, and a 0 is accepted only where it means
// something. A lowered plan's metadata passes them (every example simulates: cli_examples).
#include "shardscope/sim/lowering/schedule_metadata.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

namespace shardscope::sim {
namespace {

using ::testing::HasSubstr;

traces::Schedule OneRank(std::map<std::string, std::string> metadata) {
  traces::Schedule schedule;
  schedule.metadata = std::move(metadata);
  schedule.metadata.emplace("cluster.preset", "dgx-a100");
  schedule.metadata.emplace("cluster.nodes", "1");
  traces::Program program;
  program.name = "main";
  program.streams = {{"s", 0}};
  schedule.programs = {program};
  schedule.ranks = {traces::RankBinding{0, {}}};
  return schedule;
}

std::string ErrorOf(std::map<std::string, std::string> metadata) {
  StatusOr<SimulationSetup> setup = SetupFromSchedule(OneRank(std::move(metadata)), "s.json");
  EXPECT_FALSE(setup.ok());
  if (setup.ok()) return "";
  EXPECT_EQ(setup.status().code(), StatusCode::kInvalidInput);
  return setup.status().message();
}

TEST(ScheduleMetadataTest, APresetPassesItsOwnBounds) {
  for (const std::string& preset : ClusterPresetNames()) {
    traces::Schedule schedule = OneRank({{"cluster.preset", preset}});
    StatusOr<SimulationSetup> setup = SetupFromSchedule(schedule, "s.json");
    EXPECT_TRUE(setup.ok()) << preset << ": " << setup.status().message();
  }
}

TEST(ScheduleMetadataTest, ZeroOrAbsurdFiguresNameTheirKey) {
  // peak_flops_bf16 0 is "not supported" (the V100's own figure); both 16-bit rates 0 is no
  // tensor-core GPU at all, once accepted and silently costed at the fp32 rate.
  EXPECT_EQ(ErrorOf({{"gpu.peak_flops_bf16", "0"}, {"gpu.peak_flops_fp16", "0"}}),
            "s.json: /metadata: gpu.peak_flops_bf16 and gpu.peak_flops_fp16 are both 0: a GPU without 16-bit tensor "
            "cores is not modelled (give the datasheet's dense figures)");
  EXPECT_EQ(ErrorOf({{"gpu.peak_flops_fp32", "0"}}),
            "s.json: /metadata/gpu.peak_flops_fp32: expected a number in [1e+11, 1e+18], got \"0\"");
  EXPECT_EQ(ErrorOf({{"gpu.peak_flops_bf16", "5"}}),
            "s.json: /metadata/gpu.peak_flops_bf16: expected a number in [1e+11, 1e+18], or 0 (not supported: such "
            "GEMMs run on the CUDA cores at the fp32 rate), got \"5\"");
  // A bandwidth of 1000 B/s was honoured, 0 silently ignored.
  EXPECT_EQ(ErrorOf({{"gpu.hbm_bandwidth", "1000"}}),
            "s.json: /metadata/gpu.hbm_bandwidth: expected a number in [1e+08, 1e+14], got \"1000\"");
  EXPECT_THAT(ErrorOf({{"gpu.pcie_bandwidth", "1000"}}), HasSubstr("/metadata/gpu.pcie_bandwidth"));
  EXPECT_THAT(ErrorOf({{"cluster.nodes", "2"}, {"cluster.inter_node_bandwidth", "0"}}),
              HasSubstr("/metadata/cluster.inter_node_bandwidth: expected a number in [1e+08, 1e+14], got \"0\""));
  EXPECT_THAT(ErrorOf({{"gpu.hbm_bytes", "9223372036854775807"}}),
              HasSubstr("/metadata/gpu.hbm_bytes: expected a number in [0, 1.1259e+15]"));
  EXPECT_THAT(ErrorOf({{"host.launch_overhead_ns", "2000000000"}}),
              HasSubstr("/metadata/host.launch_overhead_ns: expected a number in [0, 1e+09]"));
  EXPECT_THAT(ErrorOf({{"contention.comm_slowdown", "1e9"}}),
              HasSubstr("/metadata/contention.comm_slowdown: expected a number in [0, 100]"));
  EXPECT_THAT(ErrorOf({{"divergence.slowdown.0", "1e18"}}),
              HasSubstr("/metadata/divergence.slowdown.0: a slowdown factor must be in (0, 1000]"));
  EXPECT_THAT(ErrorOf({{"allocator.reserved_by_others_bytes", "9223372036854775807"}}),
              HasSubstr("/metadata/allocator.reserved_by_others_bytes"));
  // 2,000,000 nodes: past the plan's world-size limit (2^20).
  EXPECT_THAT(ErrorOf({{"cluster.nodes", "2000000"}}), HasSubstr("nodes and gpus_per_node in [1, 1048576]"));
}

}  // namespace
}  // namespace shardscope::sim

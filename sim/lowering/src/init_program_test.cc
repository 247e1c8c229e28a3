// The init programs of each framework (init_program.cc), their metadata round trip, and the
// refusal of malformed metadata naming the key.
#include "shardscope/sim/lowering/init_program.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "lowering_test_support.h"

namespace shardscope::sim {
namespace {

using ::testing::HasSubstr;
using test_support::MustParsePlan;

std::string ToyPlan(std::string_view strategy, std::string_view extra) {
  return "model: {layers: 2, hidden: 256, heads: 4, kv_heads: 4, ffn: 688, vocab: 1000}\n"
         "cluster: {preset: dgx-a100, nodes: 1}\n"
         "strategy: " + std::string(strategy) + "\n"
         "training: {seq_len: 128, dtype: bf16}\n" + std::string(extra);
}

TEST(InitProgramTest, UnitsAreTheModulesParameters) {
  const Plan plan = MustParsePlan(ToyPlan("ddp", ""));
  const InitProgram p = InitProgramOf(plan);
  // embed, layers.0, layers.1, head.
  ASSERT_EQ(p.units.size(), 4u);
  int64_t total = 0;
  for (const auto& unit : p.units) {
    for (int64_t n : unit) total += n;
  }
  EXPECT_EQ(total, ParameterCount(plan.model));
  EXPECT_EQ(p.units[1], p.units[2]);  // identical blocks
}

TEST(InitProgramTest, DeepSpeedStage3MaterializesThenPartitions) {
  const InitProgram p = InitProgramOf(MustParsePlan(ToyPlan("zero3", "")));
  EXPECT_EQ(p.framework, "DeepSpeed ZeRO-3");
  // module.half().to(device); broadcast; per unit partition; flat partitions; optimizer states.
  ASSERT_EQ(p.phases.size(), 5u);
  EXPECT_FALSE(p.phases[0].per_unit);
  EXPECT_EQ(p.phases[0].ops[0].what, InitWhat::kModelHalf);
  EXPECT_EQ(p.phases[0].ops[0].element_bytes, 2);  // bf16
  EXPECT_EQ(p.phases[1].ops[0].kind, InitOpKind::kCollective);
  EXPECT_EQ(p.phases[1].ops[0].slot, "dp");
  EXPECT_TRUE(p.phases[2].per_unit);
  EXPECT_EQ(p.phases[2].ops[0].what, InitWhat::kPartition);
  EXPECT_EQ(p.phases[2].ops[0].divide, 8);  // 8 ranks
  EXPECT_EQ(p.phases[4].ops.back().kind, InitOpKind::kFree);  // the fp32 gradient partition

  const InitProgram z = InitProgramOf(MustParsePlan(ToyPlan("zero3", "zero: {zero_init: true}\n")));
  EXPECT_EQ(z.framework, "DeepSpeed ZeRO-3 with zero.Init");
  ASSERT_FALSE(z.phases.empty());
  EXPECT_TRUE(z.phases[0].per_unit);  // the full model never exists at once
  EXPECT_EQ(z.phases[0].ops[0].what, InitWhat::kZeroInitParam);
}

TEST(InitProgramTest, Fsdp2OnMetaAllocatesOnlyShards) {
  const InitProgram p = InitProgramOf(MustParsePlan(ToyPlan("fsdp2", "")));
  ASSERT_EQ(p.phases.size(), 1u);
  ASSERT_EQ(p.phases[0].ops.size(), 1u);
  EXPECT_TRUE(p.phases[0].per_unit);
  EXPECT_EQ(p.phases[0].ops[0].what, InitWhat::kShardMaterialized);
  EXPECT_EQ(p.phases[0].ops[0].divide, 8);
}

TEST(InitProgramTest, Fsdp1WithoutDeviceIdShardsOnTheCpu) {
  const InitProgram cpu = InitProgramOf(MustParsePlan(ToyPlan("fsdp1", "")));
  ASSERT_EQ(cpu.phases.size(), 1u);
  EXPECT_EQ(cpu.phases[0].ops.size(), 1u);
  EXPECT_EQ(cpu.phases[0].ops[0].what, InitWhat::kShard);
  const InitProgram moved =
      InitProgramOf(MustParsePlan(ToyPlan("fsdp1", "fsdp1: {device_id: true, sync_module_states: true}\n")));
  ASSERT_EQ(moved.phases.size(), 1u);
  // unit to GPU, broadcast, flatten, free the unit's parameters, shard, free the flat copy.
  ASSERT_EQ(moved.phases[0].ops.size(), 6u);
  EXPECT_EQ(moved.phases[0].ops[1].kind, InitOpKind::kCollective);
  EXPECT_EQ(moved.phases[0].ops[2].what, InitWhat::kFlatten);
}

TEST(InitProgramTest, MetadataRoundTrip) {
  const InitProgram p = InitProgramOf(MustParsePlan(ToyPlan("zero2", "")));
  std::map<std::string, std::string> m;
  WriteInitProgram(p, m);
  // The two identical blocks are one run: "1*embed;2*block;1*head".
  EXPECT_EQ(std::count(m["init.units"].begin(), m["init.units"].end(), ';'), 2);
  StatusOr<InitProgram> back = ReadInitProgram(m, "<test>");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->framework, p.framework);
  EXPECT_EQ(back->units, p.units);
  ASSERT_EQ(back->phases.size(), p.phases.size());
  for (size_t i = 0; i < p.phases.size(); ++i) {
    EXPECT_EQ(back->phases[i].per_unit, p.phases[i].per_unit);
    ASSERT_EQ(back->phases[i].ops.size(), p.phases[i].ops.size());
    for (size_t j = 0; j < p.phases[i].ops.size(); ++j) {
      const InitOp& a = p.phases[i].ops[j];
      const InitOp& b = back->phases[i].ops[j];
      EXPECT_EQ(a.kind, b.kind);
      EXPECT_EQ(a.group, b.group);
      EXPECT_EQ(a.element_bytes, b.element_bytes);
      EXPECT_EQ(a.divide, b.divide);
      EXPECT_EQ(a.multiply, b.multiply);
      EXPECT_EQ(a.cap_bytes, b.cap_bytes);
      EXPECT_EQ(a.slot, b.slot);
      EXPECT_EQ(a.what, b.what);
    }
  }
  // No program: no keys, and reading none gives an empty program.
  std::map<std::string, std::string> none;
  WriteInitProgram(InitProgram{}, none);
  EXPECT_TRUE(none.empty());
  EXPECT_TRUE(ReadInitProgram(none, "<test>")->empty());
}

TEST(InitProgramTest, MalformedMetadataNamesTheKey) {
  std::map<std::string, std::string> m = {{"init.phases", "1"}, {"init.units", "2*10,20"}, {"init.phase.0", "all"}};
  EXPECT_THAT(ReadInitProgram(m, "s.json").status().message(), HasSubstr("s.json: /metadata/init.phase.0: expected"));
  m["init.phase.0"] = "all:alloc_each m 4 1 1 0 - no_such_step";
  EXPECT_THAT(ReadInitProgram(m, "s.json").status().message(), HasSubstr("/metadata/init.phase.0"));
  m["init.phase.0"] = "all:alloc_each m 4 0 1 0 - model_to_gpu";  // divide 0
  EXPECT_THAT(ReadInitProgram(m, "s.json").status().message(), HasSubstr("/metadata/init.phase.0"));
  m["init.phase.0"] = "all:alloc_each m 4 1 1 0 - model_to_gpu";
  m["init.units"] = "x*10";
  EXPECT_THAT(ReadInitProgram(m, "s.json").status().message(), HasSubstr("/metadata/init.units"));
  m["init.units"] = "2*10,0";
  EXPECT_THAT(ReadInitProgram(m, "s.json").status().message(), HasSubstr("/metadata/init.units"));
  m["init.units"] = "2*10,20";
  m["init.phases"] = "-1";
  EXPECT_THAT(ReadInitProgram(m, "s.json").status().message(), HasSubstr("/metadata/init.phases"));
  m["init.phases"] = "1";
  StatusOr<InitProgram> ok = ReadInitProgram(m, "s.json");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->units.size(), 2u);
}

}  // namespace
}  // namespace shardscope::sim

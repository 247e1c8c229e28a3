// The fault sweep on the 2-GPU toy FSDP2 plan (examples/tiny-fsdp2-2gpu.yaml): the case
// list is the module boundaries of rank 0's program, and the outcomes are deterministic.
#include "shardscope/sim/hangs/fault_sweep.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "shardscope/sim/lowering/lowering.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/sim/report/report.h"

namespace shardscope::sim {
namespace {

// examples/tiny-fsdp2-2gpu.yaml
constexpr const char* kTinyPlan = R"(
model: {name: tiny, layers: 2, hidden: 256, heads: 4, ffn: 688, vocab: 1000}
cluster: {preset: dgx-a100, nodes: 1, gpus_per_node: 2}
strategy: fsdp2
training: {seq_len: 128, micro_batch_size: 1, grad_accum_steps: 1, activation_checkpointing: none, dtype: bf16}
fsdp2: {reshard_after_forward: true}
)";

struct Tiny {
  traces::Schedule schedule;
  SimulationSetup setup;
};

Tiny LowerTiny() {
  StatusOr<Plan> plan = ParsePlan(kTinyPlan, "<tiny>");
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  StatusOr<traces::Schedule> schedule = LowerPlan(*plan);
  EXPECT_TRUE(schedule.ok()) << schedule.status().message();
  StatusOr<SimulationSetup> setup = SetupFromSchedule(*schedule, "<tiny>");
  EXPECT_TRUE(setup.ok()) << setup.status().message();
  return Tiny{std::move(*schedule), std::move(*setup)};
}

TEST(FaultSweepTest, CasesAreTheModuleBoundariesOfRankZeroThenAStraggler) {
  const Tiny tiny = LowerTiny();
  StatusOr<std::vector<FaultCase>> cases = BuildFaultCases(tiny.schedule, {});
  ASSERT_TRUE(cases.ok()) << cases.status().message();
  // One program for both ranks: rank 0 stands for both. The model is embed, layers.0,
  // layers.1, head; forward visits them in order, backward in reverse; one micro-batch. No
  // optimizer-phase allocation (AdamW updates in place).
  const std::vector<std::string> expected = {
      "forward mb 0 embed",   "forward mb 0 layers.0",  "forward mb 0 layers.1",  "forward mb 0 head",
      "backward mb 0 head",   "backward mb 0 layers.1", "backward mb 0 layers.0", "backward mb 0 embed"};
  ASSERT_EQ(cases->size(), expected.size() + 1);
  const traces::Program& program = tiny.schedule.ProgramOf(0);
  for (size_t i = 0; i < expected.size(); ++i) {
    const FaultCase& c = (*cases)[i];
    EXPECT_EQ(c.kind, FaultKind::kOom);
    EXPECT_EQ(c.rank, 0);
    EXPECT_EQ(c.boundary, expected[i]);
    // The boundary is an allocation, and no earlier allocation has the same tags.
    const traces::Op& op = program.ops[static_cast<size_t>(c.op_index)];
    EXPECT_EQ(op.id, c.op_id);
    ASSERT_TRUE(std::holds_alternative<traces::AllocateOp>(op.payload));
    for (int32_t earlier = 0; earlier < c.op_index; ++earlier) {
      const traces::Op& e = program.ops[static_cast<size_t>(earlier)];
      if (std::holds_alternative<traces::AllocateOp>(e.payload)) {
        EXPECT_FALSE(e.tags == op.tags) << c.Label();
      }
    }
  }
  // FSDP2's pre-forward starts with the copy-in cast of the module's parameters.
  const auto& first = std::get<traces::AllocateOp>(program.ops[static_cast<size_t>((*cases)[0].op_index)].payload);
  EXPECT_EQ(program.tensors[static_cast<size_t>(first.tensor)], "cast.embed");
  EXPECT_EQ(cases->back().kind, FaultKind::kStraggler);
  EXPECT_EQ(cases->back().rank, 0);
  EXPECT_EQ(cases->back().slowdown, 2.0);
}

TEST(FaultSweepTest, EveryBoundaryOomHangsThePeerAndTheStragglerCosts) {
  const Tiny tiny = LowerTiny();
  ClusterCostProvider costs(tiny.schedule, tiny.setup.cluster);
  EngineConfig config = EngineConfigFor(tiny.setup, tiny.schedule);
  config.memory.record_history = false;
  StatusOr<SimulationResult> baseline = Simulate(tiny.schedule, costs, config, nullptr);
  ASSERT_TRUE(baseline.ok());
  ASSERT_FALSE(baseline->hung);
  StatusOr<std::vector<FaultCase>> cases = BuildFaultCases(tiny.schedule, {});
  ASSERT_TRUE(cases.ok());
  StatusOr<std::vector<FaultCaseResult>> serial = RunFaultSweep(tiny.schedule, costs, config, *cases, baseline->step_ns, 1);
  StatusOr<std::vector<FaultCaseResult>> parallel =
      RunFaultSweep(tiny.schedule, costs, config, *cases, baseline->step_ns, 3);
  ASSERT_TRUE(serial.ok() && parallel.ok());
  EXPECT_EQ(FaultTableText(*serial), FaultTableText(*parallel));  // threads do not change the result
  ASSERT_EQ(serial->size(), cases->size());

  // `raise` policy: rank 0 leaves at its OOM; rank 1 issues the next collective alone. At the
  // first forward boundary that is the first all-gather (embed's parameters), #1 on dp_shard.
  const FaultCaseResult& first = serial->front();
  EXPECT_EQ(first.outcome, FaultOutcome::kHang);
  EXPECT_EQ(first.blocked_ranks, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(first.where, "rank 1 waits in all_gather #1 on 'dp_shard' for rank 0");
  // The watchdog fires 10 minutes after rank 1 entered that all-gather, early in the step.
  EXPECT_GE(first.watchdog_fires_at_ns, int64_t{600} * 1'000'000'000);
  EXPECT_LT(first.watchdog_fires_at_ns, int64_t{600} * 1'000'000'000 + baseline->step_ns);
  // Forward boundaries k = 0..3 wait in all-gather #(k+1): one all-gather per module.
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ((*serial)[k].outcome, FaultOutcome::kHang);
    EXPECT_NE((*serial)[k].where.find(fmt::format("all_gather #{} on 'dp_shard'", k + 1)), std::string::npos)
        << (*serial)[k].where;
  }
  for (size_t k = 0; k + 1 < serial->size(); ++k) EXPECT_FALSE((*serial)[k].Safe()) << (*serial)[k].fault.Label();

  const FaultCaseResult& straggler = serial->back();
  EXPECT_EQ(straggler.outcome, FaultOutcome::kOk);
  EXPECT_GT(straggler.step_ns, baseline->step_ns);
  EXPECT_EQ(straggler.cost_ns, straggler.step_ns - baseline->step_ns);
}

TEST(FaultSweepTest, BadRanksAndFactorsAreInvalidInput) {
  const Tiny tiny = LowerTiny();
  FaultSweepOptions options;
  options.oom_ranks = {2};
  EXPECT_EQ(BuildFaultCases(tiny.schedule, options).status().code(), StatusCode::kInvalidInput);
  options.oom_ranks = {1};
  options.stragglers = {{1, 0.9}};
  EXPECT_EQ(BuildFaultCases(tiny.schedule, options).status().code(), StatusCode::kInvalidInput);
  options.stragglers = {{1, 1.5}};
  StatusOr<std::vector<FaultCase>> cases = BuildFaultCases(tiny.schedule, options);
  ASSERT_TRUE(cases.ok());
  EXPECT_EQ(cases->front().rank, 1);
  EXPECT_EQ(cases->back().Label(), "straggler rank 1 x1.5");
}

}  // namespace
}  // namespace shardscope::sim

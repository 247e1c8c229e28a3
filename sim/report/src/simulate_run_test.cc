// RunSimulation (the pipeline `shardscope simulate` and the Python module share), and the
// fault and straggler checks both call (InjectedOomAt, ValidStraggler in simulate.h). The
// pipeline's outputs are pinned byte for byte by the golden files (tests/golden); these tests
// check what it decides: which ranks it traces, which files it hands over, when it measures a
// divergence.
#include "shardscope/sim/report/simulate_run.h"

#include <limits>
#include <map>
#include <set>
#include <string>
#include <variant>

#include <gtest/gtest.h>

#include "shardscope/sim/simulate/simulate.h"
#include "shardscope/traces/timeline.h"

namespace shardscope::sim {
namespace {

// examples/tiny-fsdp2-2gpu.yaml: two ranks on one node of two GPUs.
constexpr char kTinyPlan[] = R"(
model: {name: tiny, layers: 2, hidden: 256, heads: 4, ffn: 688, vocab: 1000}
cluster: {preset: dgx-a100, nodes: 1, gpus_per_node: 2}
strategy: fsdp2
training: {seq_len: 128, micro_batch_size: 1, grad_accum_steps: 1, activation_checkpointing: none, dtype: bf16}
)";

LoadedInput Tiny() {
  StatusOr<Plan> plan = ParsePlan(kTinyPlan, "<tiny>");
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  StatusOr<LoadedInput> input = LoadPlan(std::move(plan).value(), "<tiny>");
  EXPECT_TRUE(input.ok()) << input.status().message();
  return std::move(input).value();
}

struct Files {
  std::map<std::string, std::string> written;
  SimulateFileWriter Writer() {
    return [this](const std::string& name, const std::string& content) {
      written[name] = content;
      return Status::Ok();
    };
  }
};

int64_t FirstAllocate(const traces::Program& program) {
  for (const traces::Op& op : program.ops) {
    if (std::holds_alternative<traces::AllocateOp>(op.payload) && op.tags.phase == traces::Phase::kBackward) {
      return op.id;
    }
  }
  return -1;
}

TEST(RunSimulationTest, TracesTheRanksAskedForAndSnapshotsThem) {
  const LoadedInput input = Tiny();
  SimulateRunOptions options;
  options.trace_ranks = std::vector<int32_t>{1};
  traces::Timeline trace;
  Files files;
  StatusOr<SimulateRun> run = RunSimulation(input, options, trace, files.Writer());
  ASSERT_TRUE(run.ok()) << run.status().message();
  std::set<int32_t> pids;
  for (const traces::Slice& slice : trace.slices) pids.insert(slice.pid);
  EXPECT_EQ(pids, std::set<int32_t>{1});
  // Only the traced rank records its allocator history: one snapshot, as JSON and pickle.
  std::set<std::string> names;
  for (const auto& [name, content] : files.written) names.insert(name);
  EXPECT_EQ(names, (std::set<std::string>{"memory_snapshot_rank1.json", "memory_snapshot_rank1.pickle"}));
  EXPECT_FALSE(run->result.hung);
  EXPECT_FALSE(run->divergence.has_value());  // no straggler, no variant: no second run
  EXPECT_FALSE(run->report_json.empty());
}

TEST(RunSimulationTest, AnInjectedOomHangsAndDumpsTheWaitingRank) {
  const LoadedInput input = Tiny();
  const int64_t op = FirstAllocate(input.schedule.ProgramOf(0));
  ASSERT_GE(op, 0);
  SimulateRunOptions options;
  options.inject_oom = InjectedOom{0, op};
  traces::Timeline trace;
  Files files;
  StatusOr<SimulateRun> run = RunSimulation(input, options, trace, files.Writer());
  ASSERT_TRUE(run.ok()) << run.status().message();
  EXPECT_TRUE(run->result.hung);
  // Rank 0 stopped at the allocation; rank 1 waits for it in its next collective: a blocked
  // rank, so it gets a Flight Recorder dump, handed over under the CLI's file name.
  ASSERT_FALSE(run->flight_recorder_ranks.empty());
  for (int32_t rank : run->flight_recorder_ranks) {
    EXPECT_TRUE(files.written.contains("flight_recorder_rank" + std::to_string(rank) + ".json")) << rank;
  }
  EXPECT_TRUE(files.written.contains("flight_recorder_rank1.json"));
}

TEST(RunSimulationTest, AStragglerIsMeasuredAgainstEveryRankAlike) {
  const LoadedInput input = Tiny();
  SimulateRunOptions options;
  options.trace_ranks = std::vector<int32_t>{};
  options.stragglers = {{1, 2.0}};
  traces::Timeline trace;
  Files files;
  StatusOr<SimulateRun> run = RunSimulation(input, options, trace, files.Writer());
  ASSERT_TRUE(run.ok()) << run.status().message();
  ASSERT_TRUE(run->divergence.has_value());
  EXPECT_EQ(run->divergence->sources, std::vector<std::string>{"rank 1 (kernels and copies x2)"});
  EXPECT_TRUE(run->divergence->uniform_completed);
  // Rank 1's kernels take twice as long and rank 0 waits for it at each collective: the step
  // is longer than with both ranks alike.
  EXPECT_GT(run->result.step_ns, run->divergence->uniform_step_ns);
  EXPECT_TRUE(trace.slices.empty());
  EXPECT_NE(SimulateSummaryText(input, *run).find("DIVERGENCE: rank 1 (kernels and copies x2): step "),
            std::string::npos);
}

TEST(InjectedOomAtTest, NamesWhyAnOpCannotFail) {
  const LoadedInput input = Tiny();
  const traces::Program& program = input.schedule.ProgramOf(0);
  int64_t kernel = -1;
  for (const traces::Op& op : program.ops) {
    if (std::holds_alternative<traces::KernelOp>(op.payload)) {
      kernel = op.id;
      break;
    }
  }
  ASSERT_GE(kernel, 0);
  EXPECT_EQ(InjectedOomAt(input.schedule, 2, kernel).status().message(), "rank outside the world of 2 ranks");
  EXPECT_EQ(InjectedOomAt(input.schedule, -1, kernel).status().message(), "rank outside the world of 2 ranks");
  EXPECT_EQ(InjectedOomAt(input.schedule, 0, kernel).status().message(),
            "op " + std::to_string(kernel) + " is a kernel, not an allocate");
  EXPECT_EQ(InjectedOomAt(input.schedule, 0, 999999).status().message(),
            "rank 0's program ('" + program.name + "') has no op 999999");
  const int64_t allocate = FirstAllocate(program);
  StatusOr<InjectedOom> ok = InjectedOomAt(input.schedule, 1, allocate);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->rank, 1);
  EXPECT_EQ(ok->op_id, allocate);
}

TEST(ValidStragglerTest, RankInTheWorldAndAFiniteFactorOfAtLeastOne) {
  EXPECT_TRUE(ValidStraggler(0, 1.0, 2));
  EXPECT_TRUE(ValidStraggler(1, 1.5, 2));
  EXPECT_FALSE(ValidStraggler(2, 1.5, 2));
  EXPECT_FALSE(ValidStraggler(-1, 1.5, 2));
  EXPECT_FALSE(ValidStraggler(0, 0.99, 2));
  EXPECT_FALSE(ValidStraggler(0, std::numeric_limits<double>::infinity(), 2));
  EXPECT_FALSE(ValidStraggler(0, std::numeric_limits<double>::quiet_NaN(), 2));
}

}  // namespace
}  // namespace shardscope::sim

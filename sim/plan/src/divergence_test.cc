// Sources of divergence in the plan (plan.h DivergenceConfig): ranks that run a different
// plan than their peers. Parsing and its errors, the lowering of variants, and the hangs and
// costs they cause, with the blocked ranks and sequence numbers derived by hand from the
// framework's collective order.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lowering_test_support.h"
#include "shardscope/sim/hangs/fault_sweep.h"
#include "shardscope/sim/hangs/hang.h"
#include "shardscope/sim/lowering/lowering.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/sim/report/report.h"

namespace shardscope::sim {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using test_support::Completed;
using test_support::MustLower;
using test_support::RunSimulation;

// The 2-block toy of tests/golden/listings/fsdp2.yaml: torchtitan wrapping (embed, each block,
// [norm, output]), on `gpus` GPUs of one node.
std::string ToyPlan(int gpus, const std::string& extra, const std::string& strategy = "fsdp2",
                    int grad_accum = 1) {
  return "model: {preset: llama3-8b, layers: 2, hidden: 256, heads: 4, kv_heads: 2, ffn: 512, vocab: 1000}\n"
         "cluster: {preset: dgx-a100, nodes: 1, gpus_per_node: " + std::to_string(gpus) + "}\n"
         "strategy: " + strategy + "\n"
         "training: {seq_len: 128, micro_batch_size: 1, grad_accum_steps: " + std::to_string(grad_accum) + "}\n" +
         extra;
}

Plan MustParse(const std::string& text) {
  StatusOr<Plan> plan = ParsePlan(text, "test.yaml");
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return plan.ok() ? *plan : Plan{};
}

std::string ParseError(const std::string& text) {
  StatusOr<Plan> plan = ParsePlan(text, "test.yaml");
  EXPECT_FALSE(plan.ok());
  return plan.ok() ? std::string() : plan.status().message();
}

// 2 m n k x batch over the program's GEMM kernels.
double GemmFlops(const traces::Program& program) {
  double flops = 0;
  for (const traces::Op& op : program.ops) {
    const auto* kernel = std::get_if<traces::KernelOp>(&op.payload);
    if (kernel == nullptr) continue;
    if (const auto* gemm = std::get_if<traces::GemmDesc>(&kernel->compute)) {
      flops += 2.0 * static_cast<double>(gemm->m) * static_cast<double>(gemm->n) * static_cast<double>(gemm->k) *
               static_cast<double>(gemm->batch);
    }
  }
  return flops;
}

TEST(DivergenceTest, ParsesSlowdownsAndGroupsRanksIntoVariants) {
  const Plan plan = MustParse(ToyPlan(4,
                                      "divergence:\n"
                                      "  slowdown: {3: 1.5}\n"
                                      "  seq_len: {1: 256, 2: 256}\n"
                                      "  overrides:\n"
                                      "    - {ranks: [3], fsdp2: {backward_prefetch: 0}}\n"));
  EXPECT_EQ(plan.divergence.slowdown, (std::map<int32_t, double>{{3, 1.5}}));
  ASSERT_EQ(plan.divergence.variants.size(), 2u);
  const RankVariant& longer = plan.divergence.variants[0];
  EXPECT_EQ(longer.ranks, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(longer.description, "training.seq_len 256");
  EXPECT_EQ(longer.plan->training.seq_len, 256);
  EXPECT_EQ(longer.plan->fsdp2.backward_prefetch, 1);
  const RankVariant& no_prefetch = plan.divergence.variants[1];
  EXPECT_EQ(no_prefetch.ranks, (std::vector<int32_t>{3}));
  EXPECT_EQ(no_prefetch.description, "fsdp2 {backward_prefetch: 0}");
  EXPECT_EQ(no_prefetch.plan->fsdp2.backward_prefetch, 0);
  EXPECT_EQ(no_prefetch.plan->training.seq_len, 128);
  EXPECT_TRUE(no_prefetch.plan->divergence.empty());
  // The rest of the plan is untouched.
  EXPECT_EQ(plan.training.seq_len, 128);
  EXPECT_TRUE(WithoutDivergence(plan).divergence.empty());
}

TEST(DivergenceTest, ABadDivergenceNamesTheLineAndKey) {
  EXPECT_THAT(ParseError(ToyPlan(4, "divergence:\n  seq_len: {4: 256}\n")),
              AllOf(HasSubstr("test.yaml:6:13: divergence.seq_len (rank): expected"), HasSubstr("3")));
  EXPECT_THAT(ParseError(ToyPlan(4, "divergence:\n  overrides:\n    - {ranks: [1], fsdp2: {backward_prefetch: 0}}\n"
                                    "    - {ranks: [2, 1], training: {grad_accum_steps: 2}}\n")),
              AllOf(HasSubstr("test.yaml:8:19: divergence.overrides[1].ranks"),
                    HasSubstr("each rank in at most one override"), HasSubstr("rank 1 (already in divergence.overrides[0])")));
  EXPECT_THAT(ParseError(ToyPlan(4, "divergence:\n  overrides:\n    - {ranks: 1, ddp: {bucket_cap_mb: 5}}\n")),
              AllOf(HasSubstr("test.yaml:7:18: divergence.overrides[0].ddp"), HasSubstr("strategy is fsdp2")));
  EXPECT_THAT(ParseError(ToyPlan(4, "divergence:\n  overrides:\n    - {ranks: 1, model: {layers: 3}}\n")),
              AllOf(HasSubstr("test.yaml:7:18: divergence.overrides[0].model"), HasSubstr("unknown key 'model'")));
  // The override's own keys are checked like the plan's, at the override's line.
  EXPECT_THAT(ParseError(ToyPlan(4, "divergence:\n  overrides:\n    - {ranks: 1, fsdp2: {prefetch: 2}}\n")),
              AllOf(HasSubstr("test.yaml:7:26: fsdp2.prefetch"), HasSubstr("unknown key 'prefetch'")));
  EXPECT_THAT(ParseError(ToyPlan(4, "divergence:\n  overrides:\n    - {ranks: 1, fsdp2: {mesh: {replicate: 2}}}\n")),
              HasSubstr("the same device mesh on every rank"));
  EXPECT_THAT(ParseError(ToyPlan(4, "divergence:\n  moe_load: {1: 2}\n")),
              AllOf(HasSubstr("test.yaml:6:3: divergence.moe_load"), HasSubstr("a dense model")));
  EXPECT_THAT(ParseError(ToyPlan(4, "divergence:\n  slowdown: {1: 0}\n")),
              AllOf(HasSubstr("test.yaml:6:17: divergence.slowdown.1"), HasSubstr("a number > 0")));
}

TEST(DivergenceTest, VariantRanksRunTheirOwnPrograms) {
  const Plan plan = MustParse(ToyPlan(4,
                                      "divergence:\n"
                                      "  seq_len: {1: 256, 2: 256}\n"
                                      "  overrides: [{ranks: [3], fsdp2: {backward_prefetch: 0}}]\n"));
  const traces::Schedule schedule = MustLower(plan);
  ASSERT_EQ(schedule.world_size(), 4);
  // Base (rank 0), the longer sequences (ranks 1, 2), the prefetch variant (rank 3).
  ASSERT_EQ(schedule.programs.size(), 3u);
  EXPECT_EQ(schedule.ranks[1].program, schedule.ranks[2].program);
  EXPECT_NE(schedule.ranks[0].program, schedule.ranks[1].program);
  EXPECT_NE(schedule.ranks[3].program, schedule.ranks[0].program);
  EXPECT_THAT(schedule.ProgramOf(1).name, HasSubstr("[training.seq_len 256]"));
  // Every GEMM's rows are the tokens: twice the sequence, twice the GEMM FLOPs.
  EXPECT_DOUBLE_EQ(GemmFlops(schedule.ProgramOf(1)), 2 * GemmFlops(schedule.ProgramOf(0)));
  EXPECT_DOUBLE_EQ(GemmFlops(schedule.ProgramOf(3)), GemmFlops(schedule.ProgramOf(0)));
  // FSDP's collectives move parameters and gradients: the same bytes whatever the sequence.
  EXPECT_EQ(CollectiveBytesPerStep(schedule, 1), CollectiveBytesPerStep(schedule, 0));
}

TEST(DivergenceTest, LongerSequencesOnOneRankCostTimeWithoutHanging) {
  const Plan plan = MustParse(ToyPlan(2, "divergence: {seq_len: {1: 4096}}\n"));
  const std::optional<SimulationResult> with = RunSimulation(MustLower(plan));
  const std::optional<SimulationResult> uniform = RunSimulation(MustLower(WithoutDivergence(plan)));
  ASSERT_TRUE(with && uniform);
  EXPECT_TRUE(Completed(*with));
  EXPECT_TRUE(Completed(*uniform));
  // Rank 0 waits for rank 1 at every collective after its compute: the step is rank 1's.
  EXPECT_GT(with->step_ns, uniform->step_ns);
  ASSERT_TRUE(with->straggler.has_value());
  EXPECT_EQ(with->straggler->rank, 1);
  EXPECT_FALSE(uniform->straggler.has_value());
}

// FLOPs of the GEMMs whose display name starts with `prefix`.
double GemmFlopsNamed(const traces::Program& program, const std::string& prefix) {
  double flops = 0;
  for (const traces::Op& op : program.ops) {
    const auto* kernel = std::get_if<traces::KernelOp>(&op.payload);
    if (kernel == nullptr || program.NameOf(op.name).rfind(prefix, 0) != 0) continue;
    if (const auto* gemm = std::get_if<traces::GemmDesc>(&kernel->compute)) {
      flops += 2.0 * static_cast<double>(gemm->m) * static_cast<double>(gemm->n) * static_cast<double>(gemm->k) *
               static_cast<double>(gemm->batch);
    }
  }
  return flops;
}

int64_t AllToAllBytesNamed(const traces::Program& program, const std::string& name) {
  int64_t bytes = 0;
  for (const traces::Op& op : program.ops) {
    const auto* c = std::get_if<traces::CollectiveOp>(&op.payload);
    if (c != nullptr && c->type == traces::CollectiveType::kAllToAll && program.NameOf(op.name) == name) bytes += c->bytes;
  }
  return bytes;
}

// Expert parallelism over 2 ranks: rank 1's experts get twice the balanced tokens. Its
// expert GEMMs run twice the rows (twice the FLOPs), its dispatch receives twice the bytes
// (the all-to-all is bounded by its larger side), the uneven all-to-all still meets, and rank
// 1 is the rank its peer waits for.
TEST(DivergenceTest, MoeRoutingImbalanceLoadsOneRanksExperts) {
  const Plan plan = MustParse(
      "model: {preset: llama3-8b, layers: 2, hidden: 256, heads: 4, kv_heads: 2, ffn: 512, vocab: 1000, experts: 4,"
      " experts_per_token: 2}\n"
      "cluster: {preset: dgx-a100, nodes: 1, gpus_per_node: 2}\n"
      "strategy: fsdp2\n"
      "training: {seq_len: 1024}\n"
      "moe: {expert_parallel: 2}\n"
      "divergence: {moe_load: {1: 2}}\n");
  ASSERT_EQ(plan.divergence.variants.size(), 1u);
  EXPECT_EQ(plan.divergence.variants[0].description, "moe_load 2");
  const traces::Schedule schedule = MustLower(plan);
  const traces::Program& balanced = schedule.ProgramOf(0);
  const traces::Program& loaded = schedule.ProgramOf(1);
  ASSERT_GT(GemmFlopsNamed(balanced, "moe.experts."), 0);
  EXPECT_DOUBLE_EQ(GemmFlopsNamed(loaded, "moe.experts."), 2 * GemmFlopsNamed(balanced, "moe.experts."));
  // Dense GEMMs run the rank's own tokens either way.
  ASSERT_GT(GemmFlopsNamed(balanced, "attn."), 0);
  EXPECT_DOUBLE_EQ(GemmFlopsNamed(loaded, "attn."), GemmFlopsNamed(balanced, "attn."));
  // T x top_k x hidden x 2 B per dispatch (forward, and its backward), doubled on rank 1.
  const int64_t routed = int64_t{1024} * 2 * 256 * 2;
  ASSERT_GT(AllToAllBytesNamed(balanced, "MoE::dispatch"), 0);
  EXPECT_EQ(AllToAllBytesNamed(balanced, "MoE::dispatch") % routed, 0);
  EXPECT_EQ(AllToAllBytesNamed(loaded, "MoE::dispatch"), 2 * AllToAllBytesNamed(balanced, "MoE::dispatch"));
  const std::optional<SimulationResult> result = RunSimulation(schedule);
  ASSERT_TRUE(result);
  EXPECT_TRUE(Completed(*result));
  ASSERT_TRUE(result->straggler.has_value());
  EXPECT_EQ(result->straggler->rank, 1);
}

TEST(DivergenceTest, SlowdownReachesTheEngineThroughTheSchedule) {
  const Plan plan = MustParse(ToyPlan(2, "divergence: {slowdown: {1: 3}}\n"));
  const traces::Schedule schedule = MustLower(plan);
  StatusOr<SimulationSetup> setup = SetupFromSchedule(schedule, "<test>");
  ASSERT_TRUE(setup.ok()) << setup.status().message();
  EXPECT_EQ(setup->rank_slowdown, (std::map<int32_t, double>{{1, 3.0}}));
  EXPECT_EQ(EngineConfigFor(*setup, schedule).rank_slowdown, (std::map<int32_t, double>{{1, 3.0}}));
}

// FSDP2, torchtitan wrapping: embed, layers.0, layers.1, [norm, output]; the last two keep
// their parameters after forward. On 'dp_shard', forward all-gathers embed #1, layers.0 #2,
// layers.1 #3, [norm, output] #4. In backward, [norm, output]'s pre_backward prefetches
// layers.1 (backward_prefetch 1: FSDPParamGroup.pre_backward -> _backward_prefetch) before its
// own reduce-scatter in post_backward, so #5 is the all-gather of layers.1 and #6 the
// reduce-scatter of [norm, output]. Without the prefetch layers.1 unshards in its own
// pre_backward, after [norm, output]'s reduce-scatter: #5 is that reduce-scatter.
TEST(DivergenceTest, RankDependentPrefetchHangsAtTheFirstReorderedCollective) {
  const Plan plan = MustParse(ToyPlan(2, "divergence: {overrides: [{ranks: [1], fsdp2: {backward_prefetch: 0}}]}\n"));
  const traces::Schedule schedule = MustLower(plan);
  const std::optional<SimulationResult> result = RunSimulation(schedule);
  ASSERT_TRUE(result);
  ASSERT_TRUE(result->hung);
  std::vector<int32_t> blocked;
  for (const BlockedRank& b : result->blocked) blocked.push_back(b.rank);
  EXPECT_EQ(blocked, (std::vector<int32_t>{0, 1}));
  ASSERT_EQ(result->rendezvous.size(), 1u);
  const PendingRendezvous& meeting = result->rendezvous[0];
  EXPECT_EQ(schedule.communicators[static_cast<size_t>(meeting.communicator)].name, "dp_shard");
  EXPECT_EQ(meeting.seq, 5);
  EXPECT_TRUE(meeting.mismatch);
  ASSERT_EQ(meeting.arrived.size(), 2u);
  for (const PendingRendezvous::Arrival& arrival : meeting.arrived) {
    EXPECT_EQ(arrival.type, arrival.rank == 0 ? traces::CollectiveType::kAllGather
                                              : traces::CollectiveType::kReduceScatter);
  }
  const HangReport report = AnalyzeHang(schedule, *result);
  ASSERT_FALSE(report.causes.empty());
  EXPECT_EQ(report.causes[0].kind, RootCauseKind::kMismatch);
  EXPECT_EQ(report.causes[0].seq, 5);
}

// One micro-batch on 'dp_shard' is 11 collectives: the 4 forward all-gathers above, then in
// backward the all-gather of layers.1 (#5), [norm, output]'s reduce-scatter (#6), the
// prefetched all-gather of layers.0 (#7), layers.1's reduce-scatter (#8), the prefetched
// all-gather of embed (#9), the reduce-scatters of layers.0 (#10) and embed (#11). A rank
// that skips the second micro-batch goes to clip_grad_norm_'s all-reduce of the squared norm
// (4 bytes, fp32) as #12 while its peer all-gathers embed for micro-batch 1.
TEST(DivergenceTest, ARankThatSkipsAMicroBatchHangsInTheOptimizerStep) {
  const Plan plan =
      MustParse(ToyPlan(2, "divergence: {overrides: [{ranks: 0, training: {grad_accum_steps: 1}}]}\n", "fsdp2", 2));
  const traces::Schedule schedule = MustLower(plan);
  const std::optional<SimulationResult> result = RunSimulation(schedule);
  ASSERT_TRUE(result);
  ASSERT_TRUE(result->hung);
  ASSERT_EQ(result->rendezvous.size(), 1u);
  const PendingRendezvous& meeting = result->rendezvous[0];
  EXPECT_EQ(meeting.seq, 12);
  ASSERT_EQ(meeting.arrived.size(), 2u);
  for (const PendingRendezvous::Arrival& arrival : meeting.arrived) {
    if (arrival.rank == 0) {
      EXPECT_EQ(arrival.type, traces::CollectiveType::kAllReduce);
      EXPECT_EQ(arrival.bytes, 4);
    } else {
      EXPECT_EQ(arrival.type, traces::CollectiveType::kAllGather);
      EXPECT_EQ(arrival.bytes, 1000 * 256 * 2);  // the embedding, vocab x hidden in bf16
    }
  }
}

// DDP buckets gradients in reverse registration order up to bucket_cap_mb (the first bucket
// to its own cap); a rank with another cap all-reduces buckets of other sizes. The first
// all-reduce whose size differs between the two programs is where NCCL's rendezvous breaks.
TEST(DivergenceTest, DifferentBucketLayoutsHangAtTheFirstDifferentSize) {
  const Plan plan = MustParse(ToyPlan(2, "ddp: {bucket_cap_mb: 1}\ndivergence: {overrides: [{ranks: 1, ddp: {bucket_cap_mb: 2}}]}\n",
                                      "ddp"));
  const traces::Schedule schedule = MustLower(plan);
  const auto all_reduce_bytes = [&](int32_t rank) {
    std::vector<int64_t> bytes;
    for (const traces::Op& op : schedule.ProgramOf(rank).ops) {
      const auto* c = std::get_if<traces::CollectiveOp>(&op.payload);
      if (c != nullptr && c->type == traces::CollectiveType::kAllReduce) bytes.push_back(c->bytes);
    }
    return bytes;
  };
  const std::vector<int64_t> rank0 = all_reduce_bytes(0), rank1 = all_reduce_bytes(1);
  size_t first_different = 0;
  while (first_different < rank0.size() && first_different < rank1.size() &&
         rank0[first_different] == rank1[first_different]) {
    ++first_different;
  }
  ASSERT_LT(first_different, std::min(rank0.size(), rank1.size())) << "the layouts should differ";
  const std::optional<SimulationResult> result = RunSimulation(schedule);
  ASSERT_TRUE(result);
  ASSERT_TRUE(result->hung);
  ASSERT_EQ(result->rendezvous.size(), 1u);
  EXPECT_EQ(result->rendezvous[0].seq, static_cast<int64_t>(first_different) + 1);
  EXPECT_TRUE(result->rendezvous[0].mismatch);
  const HangReport report = AnalyzeHang(schedule, *result);
  ASSERT_FALSE(report.causes.empty());
  EXPECT_EQ(report.causes[0].kind, RootCauseKind::kMismatch);
  EXPECT_THAT(report.explanation[0], HasSubstr("size mismatch"));
}

TEST(DivergenceTest, SweepAddsOneCasePerDivergenceSource) {
  const Plan plan = MustParse(ToyPlan(2, "", "fsdp2", 2));
  StatusOr<std::vector<FaultCase>> cases = BuildDivergenceCases(plan, 0, FaultSweepOptions{});
  ASSERT_TRUE(cases.ok()) << cases.status().message();
  std::vector<std::string> labels;
  for (const FaultCase& c : *cases) labels.push_back(c.Label());
  EXPECT_EQ(labels, (std::vector<std::string>{"rank 0 runs seq_len x1.5 (training.seq_len 192)",
                                              "rank 0 runs one micro-batch fewer (training.grad_accum_steps 1)",
                                              "rank 0 runs fsdp2.backward_prefetch 0",
                                              "rank 0: 1.00 GiB held by another process"}));
  const traces::Schedule schedule = MustLower(plan);
  StatusOr<SimulationSetup> setup = SetupFromSchedule(schedule, "<test>");
  ASSERT_TRUE(setup.ok());
  ClusterCostProvider costs(schedule, setup->cluster);
  const EngineConfig config = EngineConfigFor(*setup, schedule);
  StatusOr<SimulationResult> baseline = Simulate(schedule, costs, config, nullptr);
  ASSERT_TRUE(baseline.ok());
  StatusOr<std::vector<FaultCaseResult>> results =
      RunFaultSweep(schedule, costs, config, *cases, baseline->step_ns, 2);
  ASSERT_TRUE(results.ok()) << results.status().message();
  std::vector<FaultOutcome> outcomes;
  for (const FaultCaseResult& r : *results) outcomes.push_back(r.outcome);
  // Longer sequences and 1 GiB less memory fit on an 80 GB GPU; the order divergences hang.
  EXPECT_EQ(outcomes, (std::vector<FaultOutcome>{FaultOutcome::kOk, FaultOutcome::kHang, FaultOutcome::kHang,
                                                 FaultOutcome::kOk}));
  EXPECT_GE((*results)[0].cost_ns, 0);
}

TEST(DivergenceTest, MemoryHeldByAnotherProcessCanRunTheRankOutOfMemory) {
  // An 80 GB GPU with all but 1 MiB held by another process: rank 0's allocator cannot
  // hold the toy's model states; it stops and rank 1 waits for it.
  const Plan plan = MustParse(ToyPlan(2, ""));
  const traces::Schedule schedule = MustLower(plan);
  StatusOr<SimulationSetup> setup = SetupFromSchedule(schedule, "<test>");
  ASSERT_TRUE(setup.ok());
  FaultSweepOptions options;
  options.held_bytes = AllocatorCapacity(*setup, 0) - (int64_t{1} << 20);
  StatusOr<std::vector<FaultCase>> cases = BuildDivergenceCases(plan, 0, options);
  ASSERT_TRUE(cases.ok());
  ASSERT_FALSE(cases->empty());
  const FaultCase& held = cases->back();
  ASSERT_EQ(held.kind, FaultKind::kMemoryHeld);
  ClusterCostProvider costs(schedule, setup->cluster);
  StatusOr<FaultCaseResult> result = RunFaultCase(schedule, costs, EngineConfigFor(*setup, schedule), held, 0);
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_EQ(result->outcome, FaultOutcome::kHang);
  EXPECT_EQ(result->blocked_ranks, (std::vector<int32_t>{0, 1}));
}

}  // namespace
}  // namespace shardscope::sim

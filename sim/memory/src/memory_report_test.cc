// Tests of the memory breakdown at the reserved peak and of the fit search.
#include "shardscope/sim/memory/memory_report.h"

#include <numeric>
#include <string>

#include <gtest/gtest.h>

#include "shardscope/sim/lowering/lowering.h"
#include "shardscope/sim/presets/model.h"

namespace shardscope::sim {
namespace {

// The 2-layer toy model of the integration tests, under FSDP2 on the 8 GPUs of one node.
constexpr char kTinyPlan[] =
    "model: {layers: 2, hidden: 256, heads: 4, kv_heads: 4, ffn: 688, vocab: 1000}\n"
    "cluster: {preset: dgx-a100, nodes: 1}\n"
    "strategy: fsdp2\n"
    "training: {seq_len: 128}\n";

// A model whose activations dominate its memory: the reserved peak grows with each sample
// (mb 1: 0.35 GiB, 2: 0.44 GiB on the A100 preset; 3 and 4 fill the capacity only by releasing
// the cache and retrying). The allocator may use gpu_memory_gb (what CUDA reports) less the CUDA
// context (426 MiB, CUDA 12.8 with lazy loading) and the ring buffers of the dp_shard
// communicator (NCCL 2.28.9 connects the ring only at runtime, on its 24 execution channels:
// 24 x 12 MiB = 288 MiB): 1.19 GiB = 1218.56 MiB leaves 504.56 MiB (0.49 GiB): micro-batch 2
// fits, 3 and 4 do not.
constexpr char kFitPlan[] =
    "model: {layers: 2, hidden: 1024, heads: 8, kv_heads: 8, ffn: 2816, vocab: 1000}\n"
    "cluster: {preset: dgx-a100, nodes: 1, gpu_memory_gb: 1.19}\n"
    "strategy: fsdp2\n"
    "training: {seq_len: 1024}\n";

Plan MustParse(const char* yaml) {
  StatusOr<Plan> plan = ParsePlan(yaml, "<test>");
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return plan.ok() ? *plan : Plan{};
}

struct Lowered {
  traces::Schedule schedule;
  SimulationSetup setup;
};

Lowered MustLower(const Plan& plan) {
  Lowered lowered;
  StatusOr<traces::Schedule> schedule = LowerPlan(plan);
  EXPECT_TRUE(schedule.ok()) << schedule.status().message();
  if (!schedule.ok()) return lowered;
  lowered.schedule = *schedule;
  StatusOr<SimulationSetup> setup = SetupFromSchedule(lowered.schedule, "<test>");
  EXPECT_TRUE(setup.ok()) << setup.status().message();
  if (setup.ok()) lowered.setup = *setup;
  return lowered;
}

int64_t ModuleNumel(const Plan& plan, const std::string& name) {
  for (const ModuleKernels& m : DecomposeModel(plan.model, WorkloadOf(plan))) {
    if (m.name == name) return m.param_numel();
  }
  ADD_FAILURE() << "no module " << name;
  return 0;
}

int64_t Sum(const std::array<int64_t, kNumMemoryCategories>& bytes) {
  return std::accumulate(bytes.begin(), bytes.end(), int64_t{0});
}

TEST(MemoryCategory, EachPrefixOfTheLowering) {
  EXPECT_EQ(CategoryOfTensor("param_shard.layers.0"), MemoryCategory::kParameters);
  EXPECT_EQ(CategoryOfTensor("params"), MemoryCategory::kParameters);
  EXPECT_EQ(CategoryOfTensor("params.layers.0.attention.wq.weight"), MemoryCategory::kParameters);
  EXPECT_EQ(CategoryOfTensor("unsharded.root"), MemoryCategory::kParameters);
  EXPECT_EQ(CategoryOfTensor("weight_cast.layers.3"), MemoryCategory::kParameters);
  EXPECT_EQ(CategoryOfTensor("grad.head"), MemoryCategory::kGradients);
  EXPECT_EQ(CategoryOfTensor("grad_tmp.layers.1"), MemoryCategory::kGradients);
  EXPECT_EQ(CategoryOfTensor("grad_shard.layers.1"), MemoryCategory::kGradients);
  EXPECT_EQ(CategoryOfTensor("exp_avg.root"), MemoryCategory::kOptimizerStates);
  EXPECT_EQ(CategoryOfTensor("exp_avg_sq.root"), MemoryCategory::kOptimizerStates);
  EXPECT_EQ(CategoryOfTensor("exp_avg"), MemoryCategory::kOptimizerStates);
  EXPECT_EQ(CategoryOfTensor("exp_avg_sq"), MemoryCategory::kOptimizerStates);
  EXPECT_EQ(CategoryOfTensor("act.layers.0.attn.wq.out"), MemoryCategory::kActivations);
  EXPECT_EQ(CategoryOfTensor("act.layers.0.attn.sdpa.bwd.workspace"), MemoryCategory::kActivations);
  EXPECT_EQ(CategoryOfTensor("all_gather_output.layers.0"), MemoryCategory::kCommunicationBuffers);
  EXPECT_EQ(CategoryOfTensor("cast.layers.0"), MemoryCategory::kCommunicationBuffers);
  EXPECT_EQ(CategoryOfTensor("reduce_scatter_input.root"), MemoryCategory::kCommunicationBuffers);
  EXPECT_EQ(CategoryOfTensor("reduce_scatter_output.root"), MemoryCategory::kCommunicationBuffers);
  EXPECT_EQ(CategoryOfTensor("bucket.3"), MemoryCategory::kCommunicationBuffers);
  // Near misses: a bare name is not a prefix, and a prefix needs its dot.
  EXPECT_EQ(CategoryOfTensor("params_extra"), MemoryCategory::kOther);
  EXPECT_EQ(CategoryOfTensor("gradient"), MemoryCategory::kOther);
  EXPECT_EQ(CategoryOfTensor("exp_avg_sqrt"), MemoryCategory::kOther);
  EXPECT_EQ(CategoryOfTensor("workspace"), MemoryCategory::kOther);
  EXPECT_EQ(CategoryOfTensor(""), MemoryCategory::kOther);
  // Names no rule lists: by the words they contain.
  EXPECT_EQ(CategoryOfTensor("partial_grad.layers.2"), MemoryCategory::kGradients);
  EXPECT_EQ(CategoryOfTensor("ipg_bucket.0"), MemoryCategory::kCommunicationBuffers);
  EXPECT_EQ(CategoryOfTensor("flat.all_gather.h3"), MemoryCategory::kCommunicationBuffers);
  EXPECT_EQ(CategoryOfTensor("fp32_grads.layers.0"), MemoryCategory::kGradients);
  EXPECT_EQ(MemoryCategoryName(MemoryCategory::kCommunicationBuffers), "communication_buffers");
}

TEST(MemoryBreakdown, CategoriesPlusOverheadIsPeakReserved) {
  traces::Schedule schedule;
  schedule.programs.push_back(traces::Program{});
  schedule.programs[0].tensors = {"param_shard.a", "grad.a", "exp_avg.a", "act.a", "bucket.0", "tmp"};
  schedule.ranks.push_back(traces::RankBinding{});
  RankMemory memory;
  memory.capacity_bytes = 1000;
  memory.stats.reserved_bytes_peak = 400;
  memory.stats.allocated_bytes_peak = 350;
  memory.stats.num_alloc_retries = 2;
  memory.allocated_at_reserved_peak = 330;
  memory.live_at_allocated_peak = {{0, 10}, {1, 20}, {2, 30}, {3, 100}, {4, 50}, {5, 5}, {2, 30}};
  const MemoryBreakdown b = BreakdownAtPeak(schedule, 0, memory);
  EXPECT_EQ(b.bytes(MemoryCategory::kParameters), 10);
  EXPECT_EQ(b.bytes(MemoryCategory::kGradients), 20);
  EXPECT_EQ(b.bytes(MemoryCategory::kOptimizerStates), 60);
  EXPECT_EQ(b.bytes(MemoryCategory::kActivations), 100);
  EXPECT_EQ(b.bytes(MemoryCategory::kCommunicationBuffers), 50);
  EXPECT_EQ(b.bytes(MemoryCategory::kOther), 5);
  EXPECT_EQ(b.allocator_overhead_bytes, 400 - 245);
  EXPECT_EQ(Sum(b.bytes_by_category) + b.allocator_overhead_bytes, b.peak_reserved_bytes);
  EXPECT_EQ(b.headroom_bytes, 600);
  EXPECT_EQ(b.num_alloc_retries, 2);
  EXPECT_FALSE(b.oom.has_value());
}

// ZeRO's model states: 16 bytes per parameter over N ranks (fp32 shard 4Ψ/N, exp_avg 4Ψ/N,
// exp_avg_sq 4Ψ/N, fp32 gradients 4Ψ/N). The tiny model has Ψ = 2,094,336, a multiple of
// N = 8 for every tensor, so FSDP2's padding adds nothing and shards are exact.
//
// The breakdown is of the allocated peak. It is reached in layers.0's backward, once its
// unsharded bf16 gradients are allocated. Live then besides the model states: layers.0's
// unsharded bf16 parameters and bf16 gradients, the fp32 gradient shards of the units already
// reduce-scattered ([norm, output] and layers.1 — the head unit was resharded in its own
// post-backward), and layers.0's activations.
TEST(MemoryBreakdown, TinyFsdp2ModelStatesMatchClosedForm) {
  const Plan plan = MustParse(kTinyPlan);
  const Lowered lowered = MustLower(plan);
  const int64_t n = plan.cluster.world_size();
  ASSERT_EQ(n, 8);
  const int64_t psi = ParameterCount(plan.model);
  ASSERT_EQ(psi % n, 0);
  StatusOr<std::vector<MemoryBreakdown>> breakdowns = SimulateMemory(lowered.schedule, lowered.setup, {0, 5, 0});
  ASSERT_TRUE(breakdowns.ok()) << breakdowns.status().message();
  ASSERT_EQ(breakdowns->size(), 2u);  // the duplicate 0 is dropped
  EXPECT_EQ((*breakdowns)[0].rank, 0);
  EXPECT_EQ((*breakdowns)[1].rank, 5);

  const MemoryBreakdown& b = (*breakdowns)[0];
  constexpr int64_t kFp32 = 4, kBf16 = 2;
  const int64_t layer0 = ModuleNumel(plan, "layers.0");
  EXPECT_EQ(b.bytes(MemoryCategory::kOptimizerStates), 2 * kFp32 * psi / n);
  EXPECT_EQ(b.bytes(MemoryCategory::kParameters), kFp32 * psi / n + kBf16 * layer0);
  EXPECT_EQ(b.bytes(MemoryCategory::kGradients),
            kBf16 * layer0 + kFp32 * (ModuleNumel(plan, "layers.1") + ModuleNumel(plan, "head")) / n);
  // cuBLAS's two workspaces (:4096:2:16:8 = 8,519,680 B each on an A100, PyTorch 2.11) are
  // reserved blocks no tensor of the program names: categories + overhead + workspaces.
  ASSERT_TRUE(b.cublas_in_allocator);
  EXPECT_EQ(b.cublas_workspace_bytes, 2 * 8'519'680);
  EXPECT_EQ(Sum(b.bytes_by_category) + b.allocator_overhead_bytes + b.cublas_workspace_bytes, b.peak_reserved_bytes);
  EXPECT_EQ(b.capacity_bytes - b.peak_reserved_bytes, b.headroom_bytes);
  EXPECT_GE(b.allocator_overhead_bytes, 0);
  // Allocated bytes are the live requests rounded up to 512 B blocks, and the workspaces' blocks:
  // a cached block they reuse keeps a remainder of up to 1 MiB unsplit (large pool), each.
  EXPECT_GE(b.peak_allocated_bytes, Sum(b.bytes_by_category) + b.cublas_workspace_bytes);
  EXPECT_LT(b.peak_allocated_bytes - Sum(b.bytes_by_category) - b.cublas_workspace_bytes, 2 * kMiB + 512 * 64);
  EXPECT_FALSE(b.oom.has_value());
  EXPECT_EQ(b.num_alloc_retries, 0);
  // Data-parallel ranks run the same program: rank 5 has the same breakdown.
  EXPECT_EQ((*breakdowns)[1].bytes_by_category, b.bytes_by_category);
}

TEST(MemoryBreakdown, RanksOutsideTheWorldAreRejected) {
  const Lowered lowered = MustLower(MustParse(kTinyPlan));
  StatusOr<std::vector<MemoryBreakdown>> breakdowns = SimulateMemory(lowered.schedule, lowered.setup, {8});
  ASSERT_FALSE(breakdowns.ok());
  EXPECT_EQ(breakdowns.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(breakdowns.status().message().find("rank 8"), std::string::npos);
}

TEST(MemoryBreakdown, DefaultRanksShowRankZeroWhenAllRanksAreAlike) {
  const Lowered lowered = MustLower(MustParse(kTinyPlan));
  StatusOr<std::vector<MemoryBreakdown>> breakdowns = SimulateMemoryDefaultRanks(lowered.schedule, lowered.setup);
  ASSERT_TRUE(breakdowns.ok()) << breakdowns.status().message();
  ASSERT_EQ(breakdowns->size(), 1u);
  EXPECT_EQ((*breakdowns)[0].rank, 0);
  EXPECT_GT((*breakdowns)[0].bytes(MemoryCategory::kOptimizerStates), 0);
}

TEST(FitSearch, MicroBatchDoublesThenBisects) {
  const Plan plan = MustParse(kFitPlan);
  std::vector<int> done_seen;
  StatusOr<FitResult> fit = FitSearch(plan, FitDimension::kMicroBatchSize, 64,
                                      [&](int done, int total, const FitCandidate&) {
                                        EXPECT_LE(done, total);
                                        done_seen.push_back(done);
                                      });
  ASSERT_TRUE(fit.ok()) << fit.status().message();
  std::vector<int64_t> order;
  for (const FitCandidate& c : fit->candidates) order.push_back(c.micro_batch_size);
  ASSERT_EQ(order, (std::vector<int64_t>{1, 2, 4, 3}));
  EXPECT_EQ(done_seen, (std::vector<int>{1, 2, 3, 4}));
  const auto& c = fit->candidates;
  // If the model's memory changed, these say by how much (the plan's comment has the sizes).
  ASSERT_LT(c[1].peak_reserved_bytes, fit->capacity_bytes);
  EXPECT_TRUE(c[0].fits && c[1].fits);
  EXPECT_FALSE(c[2].fits);
  EXPECT_FALSE(c[3].fits);
  EXPECT_FALSE(c[3].note.empty());
  ASSERT_TRUE(fit->best.has_value());
  EXPECT_EQ(c[*fit->best].micro_batch_size, 2);
  EXPECT_EQ(c[1].num_alloc_retries, 0);
  EXPECT_EQ(c[1].oom_ranks, 0);
  EXPECT_GT(c[1].step_time_ns, 0);
  // Twice the tokens per step in less than twice the time.
  EXPECT_GT(c[1].tokens_per_second_per_gpu, c[0].tokens_per_second_per_gpu);
  EXPECT_TRUE(fit->reason.empty());
}

TEST(FitSearch, MicroBatchStopsAtTheMaximum) {
  const Plan plan = MustParse(kTinyPlan);
  StatusOr<FitResult> fit = FitSearch(plan, FitDimension::kMicroBatchSize, 3, nullptr);
  ASSERT_TRUE(fit.ok()) << fit.status().message();
  std::vector<int64_t> order;
  for (const FitCandidate& c : fit->candidates) order.push_back(c.micro_batch_size);
  EXPECT_EQ(order, (std::vector<int64_t>{1, 2, 3}));
  ASSERT_TRUE(fit->best.has_value());
  EXPECT_EQ(fit->candidates[*fit->best].micro_batch_size, 3);
}

TEST(FitSearch, NothingFitsSaysWhy) {
  Plan plan = MustParse(kFitPlan);
  // 64 MiB reported by CUDA: less than the CUDA context alone leaves the allocator nothing.
  plan.cluster.gpu.hbm_bytes = plan.cluster.gpu.usable_bytes = 64 * kMiB;
  StatusOr<FitResult> fit = FitSearch(plan, FitDimension::kMicroBatchSize, 8, nullptr);
  ASSERT_TRUE(fit.ok()) << fit.status().message();
  ASSERT_EQ(fit->candidates.size(), 1u);
  EXPECT_FALSE(fit->best.has_value());
  EXPECT_GT(fit->candidates[0].oom_ranks, 0);
  EXPECT_EQ(fit->candidates[0].step_time_ns, 0);
  EXPECT_NE(fit->reason.find("micro_batch_size 1"), std::string::npos) << fit->reason;
}

TEST(FitSearch, RejectsANonPositiveMaximum) {
  StatusOr<FitResult> fit = FitSearch(MustParse(kTinyPlan), FitDimension::kMicroBatchSize, 0, nullptr);
  ASSERT_FALSE(fit.ok());
  EXPECT_EQ(fit.status().code(), StatusCode::kInvalidInput);
}

TEST(FitSearch, ActivationCheckpointingTriesNoneThenFull) {
  const Plan plan = MustParse(kTinyPlan);
  StatusOr<FitResult> fit = FitSearch(plan, FitDimension::kActivationCheckpointing, 0, nullptr);
  ASSERT_TRUE(fit.ok()) << fit.status().message();
  ASSERT_EQ(fit->candidates.size(), 2u);
  EXPECT_EQ(fit->candidates[0].ac, ActivationCheckpointing::kNone);
  EXPECT_EQ(fit->candidates[1].ac, ActivationCheckpointing::kFull);
  for (const FitCandidate& c : fit->candidates) {
    EXPECT_EQ(c.micro_batch_size, plan.training.micro_batch_size);
    EXPECT_TRUE(c.fits) << c.note;
  }
  // Both fit on an 80 GB GPU; recomputing the forward makes full checkpointing slower.
  EXPECT_GT(fit->candidates[1].step_time_ns, fit->candidates[0].step_time_ns);
  ASSERT_TRUE(fit->best.has_value());
  EXPECT_EQ(*fit->best, 0u);
}

TEST(FitSearch, DimensionNamesRoundTrip) {
  for (FitDimension d : {FitDimension::kMicroBatchSize, FitDimension::kActivationCheckpointing}) {
    EXPECT_EQ(ParseFitDimension(FitDimensionName(d)), d);
  }
  EXPECT_FALSE(ParseFitDimension("batch").has_value());
}

}  // namespace
}  // namespace shardscope::sim

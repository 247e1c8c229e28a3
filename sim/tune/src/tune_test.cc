// tune: the search space, the closed-form bounds by hand, candidates that are plans simulate
// reads, the verdicts, pruning that never changes the answer, and the same result on any
// number of threads and processes.
#include "shardscope/sim/tune/tune.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "shardscope/sim/plan/plan.h"
#include "shardscope/sim/presets/model.h"
#include "tune_bounds.h"
#include "tune_candidates.h"

namespace shardscope::sim {
namespace {

namespace fs = std::filesystem;

// A plan file in a scratch folder (tune reads files: relative paths resolve against them).
std::string WritePlan(const std::string& name, const std::string& yaml) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("shardscope-tune-test-{}", ::getpid());
  fs::create_directories(dir);
  const fs::path path = dir / name;
  std::ofstream(path) << yaml;
  return path.string();
}

constexpr const char* kTinyModel = "model: {layers: 2, hidden: 256, heads: 4, kv_heads: 4, ffn: 512, vocab: 1024}\n";

std::string TinyPlan(int nodes, const std::string& extra = "") {
  return std::string(kTinyModel) + fmt::format("cluster: {{preset: dgx-a100, nodes: {}}}\nstrategy: fsdp2\n", nodes) +
         "training: {seq_len: 256, micro_batch_size: 2, grad_accum_steps: 2}\n" + extra;
}

TEST(TuneSpace, ParsesNamesAndRefusesUnknownOnes) {
  StatusOr<TuneSpace> all = ParseTuneSpace("all");
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->strategy && all->compile && all->mesh);
  StatusOr<TuneSpace> two = ParseTuneSpace("ac,micro_batch");
  ASSERT_TRUE(two.ok());
  EXPECT_TRUE(two->checkpointing && two->micro_batch);
  EXPECT_FALSE(two->strategy || two->mesh || two->reshard || two->prefetch || two->buckets || two->compile);
  StatusOr<TuneSpace> bad = ParseTuneSpace("ac,precision");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(bad.status().message().find("'precision'"), std::string::npos) << bad.status().message();
}

// The bounds of tune_bounds.h, computed by hand for a 2-layer model on 16 GPUs.
TEST(TuneBounds, ModelStatesAndActivationsByHand) {
  const std::string base = std::string(kTinyModel) + "cluster: {preset: dgx-a100, nodes: 2}\n";
  const auto bounds = [&](const std::string& rest) {
    StatusOr<Plan> plan = ParsePlan(base + rest, "<test>");
    EXPECT_TRUE(plan.ok()) << plan.status().message();
    return tune_internal::BoundsOf(*plan);
  };
  StatusOr<Plan> any = ParsePlan(base + "strategy: ddp\n", "<test>");
  ASSERT_TRUE(any.ok());
  const int64_t p = ParameterCount(any->model);
  const int64_t n = 16;
  EXPECT_EQ(bounds("strategy: ddp\n").states_bytes, 16 * p);
  EXPECT_EQ(bounds("strategy: zero1\n").states_bytes, 4 * p + (12 * p + n - 1) / n);
  EXPECT_EQ(bounds("strategy: zero2\n").states_bytes, 2 * p + (14 * p + n - 1) / n);
  EXPECT_EQ(bounds("strategy: zero3\n").states_bytes, (16 * p + n - 1) / n);
  EXPECT_EQ(bounds("strategy: fsdp2\n").states_bytes, (16 * p + n - 1) / n);
  // HSDP shards over its group of 8, and without resharding keeps every unit's bf16 parameters.
  EXPECT_EQ(bounds("strategy: fsdp2\nfsdp2: {mesh: {replicate: 2}, reshard_after_forward: false}\n").states_bytes,
            (16 * p + 7) / 8 + 2 * p);
  EXPECT_EQ(bounds("strategy: fsdp1\nfsdp1: {sharding_strategy: HYBRID_SHARD}\n").states_bytes, (16 * p + 7) / 8);
  EXPECT_EQ(bounds("strategy: ddp\ntraining: {precision: pure_bf16}\n").states_bytes, 8 * p);
  // Activations: 2 blocks, 2 x 128 tokens, bf16. Not checkpointed: (3 x 256 + 512) per token.
  const int64_t tokens = 2 * 128;
  const std::string shape = "strategy: fsdp2\ntraining: {seq_len: 128, micro_batch_size: 2, activation_checkpointing: ";
  EXPECT_EQ(bounds(shape + "none}\n").activations_bytes, 2 * (3 * 256 + 512) * tokens * 2);
  EXPECT_EQ(bounds(shape + "full}\n").activations_bytes, 2 * 256 * tokens * 2);
  EXPECT_EQ(bounds(shape + "selective, selective_ac_every: 2}\n").activations_bytes,
            (3 * 256 + 512) * tokens * 2 + 256 * tokens * 2);
  // Time: the model's training FLOPs at the A100's 312 TFLOP/s bf16, one more forward per
  // checkpointed block.
  const double flops = TrainingFlopsPerToken(any->model, 128) * tokens;
  EXPECT_NEAR(static_cast<double>(bounds(shape + "none}\n").time_ns), flops / 312e12 * 1e9, 1.0);
  EXPECT_NEAR(static_cast<double>(bounds(shape + "full}\n").time_ns), flops * 4.0 / 3.0 / 312e12 * 1e9, 1.0);
}

TEST(TuneCandidates, EveryCandidateIsAPlanTheLoaderReads) {
  const std::string path = WritePlan("cand.yaml", TinyPlan(2, "expect: {outcome: completes}\n"));
  TuneOptions options;
  options.gpus = 16;
  StatusOr<tune_internal::SearchBase> base = tune_internal::LoadSearchBase(path, options);
  ASSERT_TRUE(base.ok()) << base.status().message();
  EXPECT_EQ(base->global_batch, 2 * 2 * 16);
  EXPECT_EQ(base->per_rank_batch, 4);
  const std::vector<TuneKnobs> knobs = tune_internal::EnumerateKnobs(*base, TuneSpace{}, 64);
  // fsdp2: meshes 16 and 8 (2 x 8) x reshard 2 x prefetch 2 x units 2; fsdp1: (flat, hybrid) x
  // (reshard, not) x 2 prefetch; zero1-3 and ddp: 2 buckets each. Every one x micro-batches
  // {1, 2, 4} x 4 checkpointing modes x compile 2.
  EXPECT_EQ(knobs.size(), static_cast<size_t>((2 * 2 * 2 * 2 + 4 * 2 + 4 * 2) * 3 * 4 * 2));
  for (size_t i = 0; i < knobs.size(); i += 7) {
    const std::string yaml = tune_internal::CandidateYaml(*base, knobs[i]);
    StatusOr<Plan> plan = ParsePlan(yaml, path);
    ASSERT_TRUE(plan.ok()) << tune_internal::KnobsLabel(knobs[i], 16) << "\n" << yaml << plan.status().message();
    EXPECT_EQ(StrategyName(plan->strategy), knobs[i].strategy);
    EXPECT_EQ(plan->cluster.world_size(), 16);
    EXPECT_EQ(plan->training.micro_batch_size * plan->training.grad_accum_steps, 4);
    EXPECT_EQ(plan->training.compile, knobs[i].compile);
    EXPECT_EQ(yaml.find("expect"), std::string::npos);
  }
}

TEST(TuneCandidates, RefusesWhatItCannotSearch) {
  TuneOptions options;
  options.gpus = 12;  // not a multiple of 8
  StatusOr<TuneResult> odd = Tune(WritePlan("odd.yaml", TinyPlan(1)), options);
  ASSERT_FALSE(odd.ok());
  EXPECT_EQ(odd.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(odd.status().message().find("--gpus 12"), std::string::npos) << odd.status().message();
  options.gpus = 16;
  options.global_batch = 20;  // 20 sequences over 16 GPUs
  StatusOr<TuneResult> batch = Tune(WritePlan("batch.yaml", TinyPlan(1)), options);
  ASSERT_FALSE(batch.ok());
  EXPECT_NE(batch.status().message().find("--global-batch"), std::string::npos) << batch.status().message();
}

// Small enough to tune in a second: the AC and micro-batch knobs of one strategy.
TuneOptions SmallSearch(int32_t gpus) {
  TuneOptions options;
  options.gpus = gpus;
  options.space = *ParseTuneSpace("ac,micro_batch,reshard");
  options.threads = 1;
  return options;
}

TEST(Tune, RanksKeptPlansFastestFirstAndWritesAPlanSimulateReads) {
  const std::string path = WritePlan("rank.yaml", TinyPlan(1));
  StatusOr<TuneResult> result = Tune(path, SmallSearch(8));
  ASSERT_TRUE(result.ok()) << result.status().message();
  ASSERT_FALSE(result->ranking.empty());
  for (size_t i = 1; i < result->ranking.size(); ++i) {
    const TuneCandidate& a = result->candidates[static_cast<size_t>(result->ranking[i - 1])];
    const TuneCandidate& b = result->candidates[static_cast<size_t>(result->ranking[i])];
    EXPECT_LE(a.step_ns, b.step_ns);
  }
  // The Pareto front: each member needs less memory than every faster one.
  for (size_t i = 1; i < result->pareto.size(); ++i) {
    EXPECT_LT(result->candidates[static_cast<size_t>(result->pareto[i])].peak_reserved_bytes,
              result->candidates[static_cast<size_t>(result->pareto[i - 1])].peak_reserved_bytes);
  }
  const TuneCandidate& best = result->candidates[static_cast<size_t>(result->ranking.front())];
  EXPECT_EQ(best.verdict, TuneVerdict::kKept);
  EXPECT_GT(best.tokens_per_second_per_gpu, 0);
  EXPECT_EQ(best.mfu_convention, "torchtitan");
  const std::string yaml = TuneBestPlanYaml(*result, fs::path(path).parent_path().string());
  StatusOr<Plan> reread = ParsePlan(yaml, path);
  ASSERT_TRUE(reread.ok()) << yaml << reread.status().message();
  EXPECT_EQ(reread->training.micro_batch_size, best.knobs.micro_batch_size);
  const std::string text = TuneText(*result, SmallSearch(8));
  EXPECT_NE(text.find("best: " + best.label), std::string::npos) << text;
  EXPECT_NE(TuneRankingJson(*result).find("\"verdict\": \"kept\""), std::string::npos);
}

TEST(Tune, SaysWhyEveryCandidateOfAGpuTooSmallIsRejected) {
  // 2 GiB GPUs: the 1.1B-parameter model's states do not fit on 8 of them under any strategy.
  const std::string path = WritePlan(
      "small.yaml", "model: {layers: 16, hidden: 2048, heads: 16, ffn: 8192, vocab: 32000}\n"
                    "cluster: {preset: dgx-a100, nodes: 1, gpu_memory_gb: 2}\nstrategy: fsdp2\n"
                    "training: {seq_len: 2048, micro_batch_size: 1}\n");
  TuneOptions options = SmallSearch(8);
  options.space.strategy = true;
  StatusOr<TuneResult> result = Tune(path, options);
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_TRUE(result->ranking.empty());
  int bound = 0;
  for (const TuneCandidate& c : result->candidates) {
    EXPECT_NE(c.verdict, TuneVerdict::kKept);
    EXPECT_FALSE(c.why.empty()) << c.label;
    bound += c.verdict == TuneVerdict::kBound;
  }
  EXPECT_GT(bound, 0);
  const std::string text = TuneText(*result, options);
  EXPECT_NE(text.find("ddp: "), std::string::npos) << text;
  EXPECT_NE(text.find("none kept: "), std::string::npos) << text;
  EXPECT_NE(text.find("memory bound: model states"), std::string::npos) << text;
  EXPECT_TRUE(TuneBestPlanYaml(*result, "/tmp").empty());
}

// The time bound only skips plans that could be neither in the top nor on the Pareto front:
// the top plans and the front are the same with a horizon of one as with one past every plan.
// A model whose step is mostly compute (the tiny one's is launch overhead), so that the bound
// bites: 128 candidates, four batches.
TEST(Tune, PruningNeverChangesTheTopOrTheFront) {
  const std::string path = WritePlan("prune.yaml", "model: {layers: 4, hidden: 2048, heads: 16, ffn: 8192, vocab: 32000}\n"
                                                   "cluster: {preset: dgx-a100, nodes: 1}\nstrategy: fsdp2\n"
                                                   "training: {seq_len: 1024, micro_batch_size: 2}\n");
  TuneOptions narrow;
  narrow.gpus = 8;
  narrow.space = *ParseTuneSpace("strategy,ac,reshard,micro_batch,compile");
  narrow.threads = 2;
  narrow.top = 1;
  TuneOptions wide = narrow;
  wide.top = 100000;
  StatusOr<TuneResult> a = Tune(path, narrow);
  StatusOr<TuneResult> b = Tune(path, wide);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_FALSE(a->ranking.empty());
  int pruned = 0;
  for (const TuneCandidate& c : a->candidates) pruned += c.verdict == TuneVerdict::kDominated;
  EXPECT_GT(pruned, 0) << "the bound never bit: the test shows nothing";
  EXPECT_LT(a->simulated, b->simulated);
  EXPECT_EQ(a->ranking.front(), b->ranking.front());
  EXPECT_EQ(a->pareto, b->pareto);
  for (const TuneCandidate& c : b->candidates) EXPECT_NE(c.verdict, TuneVerdict::kDominated);
}

TEST(Tune, TheSameResultOnAnyNumberOfThreads) {
  const std::string path = WritePlan("threads.yaml", TinyPlan(2));
  TuneOptions one = SmallSearch(16);
  TuneOptions many = one;
  many.threads = 4;
  StatusOr<TuneResult> a = Tune(path, one);
  StatusOr<TuneResult> b = Tune(path, many);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(TuneRankingJson(*a), TuneRankingJson(*b));
}

// Two "processes" in one test: each runs Tune with its rank, and the all-gather meets on a
// shared board. Each simulates its half of every batch; both must end with the single
// process's result.
TEST(Tune, SplitOverProcessesGivesTheSingleProcessResult) {
  const std::string path = WritePlan("procs.yaml", TinyPlan(2));
  struct Board {
    std::mutex mutex;
    std::condition_variable changed;
    // One pair of texts per round parity: a process can be at most one round ahead of the
    // other, so the round it writes next never overwrites what the other still reads.
    std::vector<std::string> texts[2] = {std::vector<std::string>(2), std::vector<std::string>(2)};
    int arrived = 0;
    int round = 0;
  } board;
  const auto gather = [&board](int32_t rank, const std::string& mine) -> StatusOr<std::vector<std::string>> {
    std::unique_lock<std::mutex> lock(board.mutex);
    const int round = board.round;
    std::vector<std::string>& texts = board.texts[round % 2];
    texts[static_cast<size_t>(rank)] = mine;
    if (++board.arrived == 2) {
      board.arrived = 0;
      ++board.round;
      board.changed.notify_all();
    } else {
      board.changed.wait(lock, [&] { return board.round != round; });
    }
    return texts;
  };
  std::vector<StatusOr<TuneResult>> results(2, Status::Internal("not run"));
  std::vector<std::thread> processes;
  for (int32_t rank = 0; rank < 2; ++rank) {
    processes.emplace_back([&, rank] {
      TuneOptions options = SmallSearch(16);
      options.processes.rank = rank;
      options.processes.size = 2;
      options.processes.all_gather = [&gather, rank](const std::string& mine) { return gather(rank, mine); };
      results[static_cast<size_t>(rank)] = Tune(path, options);
    });
  }
  for (std::thread& t : processes) t.join();
  StatusOr<TuneResult> single = Tune(path, SmallSearch(16));
  ASSERT_TRUE(single.ok() && results[0].ok() && results[1].ok());
  EXPECT_EQ(TuneRankingJson(*results[0]), TuneRankingJson(*single));
  EXPECT_EQ(TuneRankingJson(*results[1]), TuneRankingJson(*single));
}

}  // namespace
}  // namespace shardscope::sim

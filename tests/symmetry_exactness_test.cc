// The symmetry reduction (engine/rank_classes.h) is exact: simulating one rank per class of
// identical ranks gives report.json, trace.json, the Flight Recorder dumps and the memory
// snapshots byte for byte as simulating every rank does, on every bundled example and on a
// randomized set of plans (strategies, meshes, links, stragglers, divergent ranks, OOMs, hangs;
// 40, or 12 under the sanitizers). A hang found by a reduced run without an observer (check's
// fault sweep) is described rank by rank from its classes: the hang report, every blocked
// rank and every pending rendezvous equal the full run's, and so does `check`'s whole text.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "shardscope/sim/engine/engine.h"
#include "shardscope/sim/hangs/check.h"
#include "shardscope/sim/hangs/hang.h"
#include "shardscope/sim/lowering/load_input.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/sim/report/simulate_run.h"
#include "shardscope/sim/simulate/simulate.h"
#include "shardscope/traces/chrome_trace.h"

namespace shardscope {
namespace {

namespace fs = std::filesystem;

struct Outputs {
  std::string report;
  std::string trace;
  std::map<std::string, std::string> files;  // dumps and snapshots, by name
  sim::SymmetryReduction symmetry;
  int32_t world = 0;
};

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// simulate as the CLI runs it, into memory; `every_rank`: --all-ranks.
StatusOr<Outputs> Simulate(const sim::LoadedInput& loaded_in, bool every_rank,
                           const std::optional<std::vector<int32_t>>& trace_ranks, const fs::path& scratch) {
  sim::LoadedInput loaded = loaded_in;
  loaded.setup.simulate_every_rank = every_rank;
  Outputs out;
  out.world = loaded.schedule.world_size();
  traces::TraceInfo info;
  info.world_size = loaded.schedule.world_size();
  info.producer = "exactness test";
  const fs::path trace_path = scratch / (every_rank ? "full.json" : "reduced.json");
  SHARDSCOPE_ASSIGN_OR_RETURN(auto writer, traces::ChromeTraceWriter::Open(trace_path.string(), info));
  sim::SimulateRunOptions options;
  options.trace_ranks = trace_ranks;
  const auto write_file = [&](const std::string& name, const std::string& content) {
    out.files[name] = content;
    return Status::Ok();
  };
  SHARDSCOPE_ASSIGN_OR_RETURN(sim::SimulateRun run, sim::RunSimulation(loaded, options, *writer, write_file));
  SHARDSCOPE_RETURN_IF_ERROR(writer->Finish());
  out.report = run.report_json;
  out.trace = ReadAll(trace_path);
  out.symmetry = run.result.symmetry;
  return out;
}

// The first line where two texts differ, for a readable failure.
std::string FirstDifference(const std::string& a, const std::string& b) {
  std::istringstream in_a(a), in_b(b);
  std::string line_a, line_b;
  for (int line = 1;; ++line) {
    const bool more_a = static_cast<bool>(std::getline(in_a, line_a));
    const bool more_b = static_cast<bool>(std::getline(in_b, line_b));
    if (!more_a && !more_b) return "identical";
    if (line_a != line_b || more_a != more_b) {
      return fmt::format("line {}:\n  reduced: {}\n  full:    {}", line, line_a.substr(0, 300), line_b.substr(0, 300));
    }
  }
}

struct Tally {
  int compared = 0;
  int reduced = 0;  // runs that did simulate fewer ranks than the world
};

void ExpectSameOutputs(const sim::LoadedInput& loaded, const std::optional<std::vector<int32_t>>& trace_ranks,
                       const std::string& what, Tally& tally) {
  const fs::path scratch = fs::temp_directory_path() / fmt::format("shardscope-exactness-{}", ::getpid());
  fs::create_directories(scratch);
  StatusOr<Outputs> reduced = Simulate(loaded, false, trace_ranks, scratch);
  StatusOr<Outputs> full = Simulate(loaded, true, trace_ranks, scratch);
  fs::remove_all(scratch);
  ASSERT_EQ(reduced.ok(), full.ok()) << what;
  if (!reduced.ok()) {
    EXPECT_EQ(reduced.status().message(), full.status().message()) << what;
    return;
  }
  ++tally.compared;
  if (reduced->symmetry.reduced) ++tally.reduced;
  EXPECT_FALSE(full->symmetry.reduced) << what;
  EXPECT_EQ(full->symmetry.simulated_ranks, full->world) << what;
  EXPECT_TRUE(reduced->report == full->report) << what << ": report.json differs at "
                                               << FirstDifference(reduced->report, full->report);
  EXPECT_TRUE(reduced->trace == full->trace) << what << ": trace.json differs at "
                                             << FirstDifference(reduced->trace, full->trace);
  EXPECT_EQ(reduced->files.size(), full->files.size()) << what;
  for (const auto& [name, content] : full->files) {
    auto it = reduced->files.find(name);
    ASSERT_NE(it, reduced->files.end()) << what << ": " << name << " only in the full run";
    EXPECT_TRUE(it->second == content) << what << ": " << name << " differs";
  }
}

// Every plan under examples/, in path order.
std::vector<fs::path> BundledExamplePlans() {
  std::vector<fs::path> plans;
  for (const auto& entry : fs::recursive_directory_iterator(fs::path(SHARDSCOPE_SOURCE_DIR) / "examples")) {
    if (entry.path().extension() == ".yaml") plans.push_back(entry.path());
  }
  std::sort(plans.begin(), plans.end());
  return plans;
}

// Every bundled example, tracing its last rank (alone in its class: the others' classes are
// simulated through representatives). One traced rank: writing a trace costs far more than
// simulating these worlds, and the randomized plans below trace the default ranks.
TEST(SymmetryExactness, EveryBundledExample) {
  Tally tally;
  const std::vector<fs::path> plans = BundledExamplePlans();
  ASSERT_GE(plans.size(), 30u);
  for (const fs::path& plan : plans) {
    sim::LoadOptions options;
    options.limits.force = true;  // the traced-rank limit concerns eight traced ranks; one is traced here
    StatusOr<sim::LoadedInput> loaded = sim::LoadInput(plan.string(), options);
    ASSERT_TRUE(loaded.ok()) << plan << ": " << loaded.status().message();
    const int32_t last = loaded->schedule.world_size() - 1;
    ExpectSameOutputs(*loaded, std::vector<int32_t>{last}, plan.string(), tally);
  }
  EXPECT_EQ(tally.compared, static_cast<int>(plans.size()));
  // Most examples run more ranks than the two traced: those must have been reduced.
  EXPECT_GE(tally.reduced, static_cast<int>(plans.size()) / 2) << tally.reduced << " of " << tally.compared;
}

// A plan drawn at random: small models, so each runs in milliseconds.
std::string RandomPlan(std::mt19937_64& rng) {
  const auto pick = [&](int n) { return static_cast<int>(std::uniform_int_distribution<int>(0, n - 1)(rng)); };
  const auto coin = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; };
  std::string yaml;
  const bool moe = coin(0.2);
  yaml += fmt::format("model: {{layers: {}, hidden: {}, heads: 4, kv_heads: {}, ffn: 512, vocab: 1024{}}}\n",
                      2 + pick(3), moe ? 256 : (pick(2) == 0 ? 128 : 256), pick(2) == 0 ? 4 : 2,
                      moe ? ", experts: 4, experts_per_token: 2" : "");
  static const char* kPresets[] = {"dgx-a100", "dgx-h100", "aws-p4d", "aws-p3dn"};
  const int nodes = 1 + pick(4);
  const int gpus_per_node = pick(3) == 0 ? 4 : 8;
  const int world = nodes * gpus_per_node;
  std::string cluster = fmt::format("cluster: {{preset: {}, nodes: {}, gpus_per_node: {}", kPresets[pick(4)], nodes,
                                    gpus_per_node);
  if (coin(0.3)) cluster += ", link_sharing: false";
  if (coin(0.15)) cluster += ", gpu_memory_gb: 2";  // small: some rank may run out of memory
  yaml += cluster + "}\n";
  static const char* kStrategies[] = {"fsdp2", "fsdp1", "zero1", "zero2", "zero3", "ddp"};
  const std::string strategy = moe ? "fsdp2" : kStrategies[pick(6)];
  yaml += "strategy: " + strategy + "\n";
  static const char* kAc[] = {"none", "full", "selective"};
  const int accum = 1 + pick(2);
  yaml += fmt::format("training: {{seq_len: {}, micro_batch_size: {}, grad_accum_steps: {}, activation_checkpointing: {}}}\n",
                      pick(2) == 0 ? 128 : 256, 1 + pick(2), accum, kAc[pick(3)]);
  if (strategy == "fsdp2") {
    std::vector<int> replicas;
    for (int r = 1; r <= world; ++r) {
      if (world % r == 0) replicas.push_back(r);
    }
    const int replicate = replicas[static_cast<size_t>(pick(static_cast<int>(replicas.size())))];
    yaml += fmt::format("fsdp2: {{mesh: {{replicate: {}}}, reshard_after_forward: {}, backward_prefetch: {}{}}}\n",
                        replicate, coin(0.7) ? "true" : "false", pick(3),
                        accum > 1 && coin(0.5) ? ", requires_gradient_sync: last_micro_batch" : "");
  } else if (strategy == "fsdp1") {
    static const char* kSharding[] = {"FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD"};
    yaml += fmt::format("fsdp1: {{sharding_strategy: {}, limit_all_gathers: {}}}\n", kSharding[pick(4)],
                        coin(0.5) ? "true" : "false");
    if (coin(0.3)) yaml += "oom: {policy: catch_and_sync}\n";
  } else if (strategy == "ddp") {
    yaml += fmt::format("ddp: {{bucket_cap_mb: {}}}\n", pick(2) == 0 ? 1 : 25);
  } else {
    yaml += fmt::format("zero: {{overlap_comm: {}}}\n", coin(0.5) ? "true" : "false");
  }
  if (moe) yaml += fmt::format("moe: {{expert_parallel: {}}}\n", world % 4 == 0 ? 4 : 2);
  // Divergence: a straggler, a rank with longer sequences, memory held by another process, or
  // a rank running another prefetch (a hang).
  const int odd_rank = pick(world);
  switch (pick(6)) {
    case 0: yaml += fmt::format("divergence: {{slowdown: {{{}: 1.5}}}}\n", odd_rank); break;
    case 1: yaml += fmt::format("divergence: {{seq_len: {{{}: 512}}}}\n", odd_rank); break;
    case 2: yaml += fmt::format("allocator: {{memory_reserved_by_others_gb_per_rank: {{{}: 1.0}}}}\n", odd_rank); break;
    case 3:
      if (strategy == "fsdp2") yaml += fmt::format("divergence: {{overrides: [{{ranks: [{}], fsdp2: {{backward_prefetch: 3}}}}]}}\n", odd_rank);
      break;
    default: break;
  }
  return yaml;
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kUnderSanitizers = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kUnderSanitizers = true;
#else
constexpr bool kUnderSanitizers = false;
#endif
#else
constexpr bool kUnderSanitizers = false;
#endif

// Plans compared: fewer under the sanitizers, where each costs ten times as much (the release
// build compares all of them).
constexpr int kRandomPlans = kUnderSanitizers ? 12 : 40;

TEST(SymmetryExactness, RandomizedPlans) {
  std::mt19937_64 rng(20261202);
  Tally tally;
  int drawn = 0, refused = 0;
  while (tally.compared < kRandomPlans && drawn < 400) {
    ++drawn;
    const std::string yaml = RandomPlan(rng);
    StatusOr<sim::Plan> plan = sim::ParsePlan(yaml, "<random>");
    if (!plan.ok()) {
      ++refused;  // a combination the loader refuses (a mesh, a section the strategy lacks)
      continue;
    }
    StatusOr<sim::LoadedInput> loaded = sim::LoadPlan(*plan, "<random>");
    if (!loaded.ok()) {
      ++refused;
      continue;
    }
    // The default trace (the first node and every rank whose timeline differs) half the time,
    // else one rank inside the world.
    std::optional<std::vector<int32_t>> trace_ranks;
    if (drawn % 2 == 1) trace_ranks = std::vector<int32_t>{loaded->schedule.world_size() / 2};
    ExpectSameOutputs(*loaded, trace_ranks, yaml, tally);
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_EQ(tally.compared, kRandomPlans) << refused << " of " << drawn << " drawn plans were refused";
  EXPECT_GE(tally.reduced, kRandomPlans / 2) << "too few reduced runs: " << tally.reduced;
}

// What a hang leaves for its report, as text: the report's JSON, each blocked rank's
// description and each pending rendezvous's arrivals.
std::string HangText(const traces::Schedule& schedule, const sim::SimulationResult& result) {
  std::string text = fmt::format("hung {} oom_agreed {}\n", result.hung, result.oom_agreed.has_value());
  if (!result.hung) return text;
  text += sim::HangReportJson(schedule, sim::AnalyzeHang(schedule, result, sim::HangOptions{})) + "\n";
  for (const sim::BlockedRank& b : result.blocked) {
    text += fmt::format("rank {}: {}", b.rank, b.host);
    for (const std::string& stream : b.streams) text += " | " + stream;
    for (const sim::CommLaneState& lane : b.lanes) text += fmt::format(" lane {} {}/{}", lane.communicator, lane.completed, lane.issued);
    for (const auto& [index, pending] : b.pending) {
      text += fmt::format(" pending {}@{} #{} arrived {}", index, pending.communicator, pending.seq, pending.arrived_ns);
    }
    text += "\n";
  }
  for (const sim::PendingRendezvous& rv : result.rendezvous) {
    text += fmt::format("rendezvous {} #{} mismatch {}:", rv.communicator, rv.seq, rv.mismatch);
    std::vector<int32_t> ranks;
    for (const auto& a : rv.arrived) ranks.push_back(a.rank);
    std::sort(ranks.begin(), ranks.end());  // the full run lists them in arrival order
    for (int32_t rank : ranks) text += fmt::format(" {}", rank);
    text += "\n";
  }
  return text;
}

struct HangTally {
  int hangs = 0;
  int described = 0;  // hangs a reduced run described from its classes
};

// An OOM injected at a few allocations of `rank`: the reduced run (no observer, as check runs
// it) against the full one.
void ExpectSameHangs(const sim::LoadedInput& loaded, int32_t rank, const std::string& what, HangTally& tally) {
  const traces::Schedule& schedule = loaded.schedule;
  StatusOr<std::unique_ptr<sim::CostProvider>> costs = sim::MakeCostProvider(schedule, loaded.setup);
  ASSERT_TRUE(costs.ok()) << what << ": " << costs.status().message();
  std::vector<int64_t> allocations;
  for (const traces::Op& op : schedule.ProgramOf(rank).ops) {
    if (std::holds_alternative<traces::AllocateOp>(op.payload)) allocations.push_back(op.id);
  }
  if (allocations.empty()) return;
  constexpr size_t kPerRank = 4;
  for (size_t i = 0; i < kPerRank; ++i) {
    const int64_t op_id = allocations[(allocations.size() - 1) * i / (kPerRank - 1)];
    sim::EngineConfig config = sim::EngineConfigFor(loaded.setup, schedule);
    config.memory.record_history = false;
    config.inject_oom = sim::InjectedOom{rank, op_id};
    config.reduce_symmetry = true;
    StatusOr<sim::SimulationResult> reduced = sim::Simulate(schedule, **costs, config, nullptr);
    config.reduce_symmetry = false;
    StatusOr<sim::SimulationResult> full = sim::Simulate(schedule, **costs, config, nullptr);
    const std::string where = fmt::format("{}: OOM at rank {} op {}", what, rank, op_id);
    ASSERT_EQ(reduced.ok(), full.ok()) << where;
    if (!reduced.ok()) continue;
    if (full->hung) ++tally.hangs;
    if (reduced->symmetry.reduced && reduced->symmetry.hang_described) ++tally.described;
    const std::string reduced_text = HangText(schedule, *reduced), full_text = HangText(schedule, *full);
    EXPECT_TRUE(reduced_text == full_text) << where << ": differs at " << FirstDifference(reduced_text, full_text);
  }
}

// Bundled examples up to this many ranks (the full runs are the cost). Like EveryBundledExample
// this runs in the release build only (scripts/test.sh leaves it out under the sanitizers).
constexpr int32_t kMaxHangExampleRanks = 256;

TEST(SymmetryExactness, HangsOfEveryBundledExample) {
  HangTally tally;
  const std::vector<fs::path> plans = BundledExamplePlans();
  for (const fs::path& plan : plans) {
    sim::LoadOptions options;
    options.limits.force = true;
    StatusOr<sim::LoadedInput> loaded = sim::LoadInput(plan.string(), options);
    ASSERT_TRUE(loaded.ok()) << plan << ": " << loaded.status().message();
    const int32_t world = loaded->schedule.world_size();
    if (world > kMaxHangExampleRanks) continue;
    ExpectSameHangs(*loaded, 0, plan.string(), tally);
    if (world > 1) ExpectSameHangs(*loaded, world / 2 + 1 < world ? world / 2 + 1 : world - 1, plan.string(), tally);
    if (::testing::Test::HasFailure()) return;
  }
  ::testing::Test::RecordProperty("hangs", tally.hangs);
  ::testing::Test::RecordProperty("described_from_classes", tally.described);
  EXPECT_GE(tally.hangs, 40) << "too few hangs compared";
  EXPECT_GE(tally.described, tally.hangs / 2) << tally.described << " of " << tally.hangs << " hangs described from classes";
}

TEST(SymmetryExactness, HangsOfRandomizedPlans) {
  std::mt19937_64 rng(20261203);
  HangTally tally;
  int compared = 0, drawn = 0;
  while (compared < kRandomPlans && drawn < 400) {
    ++drawn;
    const std::string yaml = RandomPlan(rng);
    StatusOr<sim::Plan> plan = sim::ParsePlan(yaml, "<random>");
    if (!plan.ok()) continue;
    StatusOr<sim::LoadedInput> loaded = sim::LoadPlan(*plan, "<random>");
    if (!loaded.ok()) continue;
    ++compared;
    ExpectSameHangs(*loaded, loaded->schedule.world_size() - 1, yaml, tally);
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_EQ(compared, kRandomPlans);
  ::testing::Test::RecordProperty("hangs", tally.hangs);
  ::testing::Test::RecordProperty("described_from_classes", tally.described);
  EXPECT_GE(tally.described, 1) << "no hang was described from classes";
}

// `shardscope check`'s whole text, reduced against --all-ranks, on two small examples (release
// build only, as above).
TEST(SymmetryExactness, CheckTextOfSmallExamples) {
  int compared = 0;
  for (const char* name : {"examples/small-fsdp2-8gpu.yaml", "examples/llama3-8b-fsdp2-64xa100.yaml"}) {
    const std::string path = fs::path(SHARDSCOPE_SOURCE_DIR) / name;
    std::string texts[2];
    for (int every_rank = 0; every_rank < 2; ++every_rank) {
      sim::LoadOptions options;
      options.simulate_every_rank = every_rank == 1;
      StatusOr<sim::LoadedInput> loaded = sim::LoadInput(path, options);
      ASSERT_TRUE(loaded.ok()) << path << ": " << loaded.status().message();
      sim::CheckSettings settings;
      settings.threads = 2;
      StatusOr<sim::CheckRun> run =
          sim::RunCheck(*loaded, name, settings, [&](const std::string& piece) { texts[every_rank] += piece; }, {});
      ASSERT_TRUE(run.ok()) << path << ": " << run.status().message();
      texts[every_rank] += run->failure;
    }
    EXPECT_TRUE(texts[0] == texts[1]) << name << ": differs at " << FirstDifference(texts[0], texts[1]);
    ++compared;
  }
  EXPECT_EQ(compared, 2);
}

}  // namespace
}  // namespace shardscope

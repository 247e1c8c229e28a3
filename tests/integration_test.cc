// Plan -> schedule -> simulation, end to end, checked against closed forms and invariants.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <iostream>
#include <map>

#include "shardscope/sim/hangs/hang.h"
#include "shardscope/sim/lowering/lowering.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/sim/report/report.h"
#include "shardscope/traces/chrome_trace.h"
#include "shardscope/traces/schedule_json.h"

namespace shardscope {
namespace {

using sim::Plan;
using traces::Schedule;

Plan MustParse(const std::string& yaml) {
  StatusOr<Plan> plan = sim::ParsePlan(yaml, "<test>");
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return *plan;
}

Schedule MustLower(const Plan& plan) {
  StatusOr<Schedule> schedule = sim::LowerPlan(plan);
  EXPECT_TRUE(schedule.ok()) << schedule.status().message();
  return *schedule;
}

struct SimRun {
  sim::SimulationSetup setup;
  sim::SimulationResult result;
  traces::Timeline timeline;
  std::string report;
};

SimRun MustSimulate(const Schedule& schedule, std::vector<int32_t> trace_ranks = {0}) {
  SimRun run;
  StatusOr<sim::SimulationSetup> setup = sim::SetupFromSchedule(schedule, "<test>");
  EXPECT_TRUE(setup.ok()) << setup.status().message();
  run.setup = *setup;
  sim::ClusterCostProvider costs(schedule, run.setup.cluster);
  sim::TraceRecorder recorder(schedule, trace_ranks, run.timeline);
  StatusOr<sim::SimulationResult> result = sim::Simulate(schedule, costs, sim::EngineConfigFor(run.setup, schedule), &recorder);
  EXPECT_TRUE(result.ok()) << result.status().message();
  run.result = *result;
  run.report = sim::ReportJson(schedule, run.setup, run.result);
  return run;
}

std::string TinyModel() {
  return "model: {layers: 2, hidden: 256, heads: 4, kv_heads: 4, ffn: 688, vocab: 1000}\n";
}

// Sum of collective bytes in rank 0's program, by collective type.
std::map<traces::CollectiveType, int64_t> CollectiveBytes(const Schedule& schedule) {
  std::map<traces::CollectiveType, int64_t> bytes;
  for (const traces::Op& op : schedule.ProgramOf(0).ops) {
    if (const auto* c = std::get_if<traces::CollectiveOp>(&op.payload)) bytes[c->type] += c->bytes;
  }
  return bytes;
}

// Parameters padded the way FSDP2 shards them: each tensor to a multiple of the world size;
// of one module only when `module` is given.
int64_t PaddedParams(const Plan& plan, bool blocks_only, const std::string& module = "") {
  const int64_t w = plan.cluster.world_size();
  int64_t total = 0;
  for (const sim::ModuleKernels& m : sim::DecomposeModel(plan.model, sim::WorkloadOf(plan))) {
    if (blocks_only && m.name.rfind("layers.", 0) != 0) continue;
    if (!module.empty() && m.name != module) continue;
    for (const sim::ParamTensor& p : m.params) total += (p.numel + w - 1) / w * w;
  }
  return total;
}

class StrategyMatrix : public ::testing::TestWithParam<std::tuple<std::string, std::string, int, bool>> {};

// Every combination lowers to a valid schedule that finishes without hanging and whose
// report is self-consistent.
TEST_P(StrategyMatrix, LowersValidSchedulesThatFinish) {
  const auto& [strategy, ac, accum, reshard] = GetParam();
  std::string yaml = TinyModel() + "cluster: {preset: dgx-h100, nodes: 2}\nstrategy: " + strategy + "\n" +
                     fmt::format("training: {{seq_len: 128, micro_batch_size: 2, grad_accum_steps: {}, "
                                 "activation_checkpointing: {}}}\n", accum, ac);
  if (strategy == "fsdp2") yaml += fmt::format("fsdp2: {{reshard_after_forward: {}}}\n", reshard);
  const Schedule schedule = MustLower(MustParse(yaml));
  ASSERT_TRUE(traces::ValidateSchedule(schedule).ok()) << traces::ValidateSchedule(schedule).message();
  const SimRun run = MustSimulate(schedule);
  EXPECT_FALSE(run.result.hung);
  for (const sim::RankStats& r : run.result.ranks) {
    EXPECT_TRUE(r.finished);
    EXPECT_LE(r.overlap_ns, std::min(r.compute_ns, r.comm_ns));
    EXPECT_LE(r.end_ns, run.result.makespan_ns);
    EXPECT_GT(r.compute_ns, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(All, StrategyMatrix,
                         ::testing::Combine(::testing::Values("fsdp2", "ddp"), ::testing::Values("none", "full"),
                                            ::testing::Values(1, 3), ::testing::Bool()));

TEST(ClosedForm, Fsdp2FullShardMovesThreePsi) {
  // ZeRO paper: full sharding moves 3Ψ per step: all-gather in forward (Ψ) and backward
  // (Ψ), reduce-scatter (Ψ). The [norm, output] unit keeps its parameters after forward (as
  // torchtitan wraps it), so the backward all-gather covers Ψ minus the head. Params in bf16
  // (2 B), gradients reduced in fp32 (4 B).
  const Plan plan = MustParse(TinyModel() + "cluster: {preset: dgx-a100, nodes: 1}\nstrategy: fsdp2\n"
                                            "training: {seq_len: 128, micro_batch_size: 1}\n");
  const auto bytes = CollectiveBytes(MustLower(plan));
  const int64_t psi = PaddedParams(plan, false), head = PaddedParams(plan, false, "head");
  EXPECT_EQ(bytes.at(traces::CollectiveType::kAllGather), 2 * (psi + psi - head));
  EXPECT_EQ(bytes.at(traces::CollectiveType::kReduceScatter), 4 * psi);
}

TEST(ClosedForm, Fsdp2WithoutReshardMovesTwoPsi) {
  const Plan plan = MustParse(TinyModel() + "cluster: {preset: dgx-a100, nodes: 1}\nstrategy: fsdp2\n"
                                            "training: {seq_len: 128, micro_batch_size: 1}\n"
                                            "fsdp2: {reshard_after_forward: false}\n");
  const auto bytes = CollectiveBytes(MustLower(plan));
  const int64_t psi = PaddedParams(plan, false);
  EXPECT_EQ(bytes.at(traces::CollectiveType::kAllGather), 2 * psi);
  EXPECT_EQ(bytes.at(traces::CollectiveType::kReduceScatter), 4 * psi);
}

TEST(ClosedForm, DdpAllReducesEveryGradientOncePerMicroBatch) {
  const Plan plan = MustParse(TinyModel() + "cluster: {preset: dgx-a100, nodes: 1}\nstrategy: ddp\n"
                                            "training: {seq_len: 128, micro_batch_size: 1, grad_accum_steps: 2}\n");
  const auto bytes = CollectiveBytes(MustLower(plan));
  EXPECT_EQ(bytes.at(traces::CollectiveType::kAllReduce), 2 * 4 * sim::ParameterCount(plan.model));
  EXPECT_EQ(bytes.count(traces::CollectiveType::kAllGather), 0u);
}

TEST(ClosedForm, ModelFlopsInReportMatchSixNPlusAttention) {
  const Plan plan = MustParse("model: llama3-8b\ncluster: {preset: dgx-h100, nodes: 1}\nstrategy: fsdp2\n"
                              "training: {seq_len: 8192, micro_batch_size: 1, grad_accum_steps: 2}\n");
  const Schedule schedule = MustLower(plan);
  // 6N + 12·L·h·s/2 per token (causal). N counts parameters in matrix products:
  // 8,030,261,248 total − 525,336,576 input embedding − 65 x 4096 RMSNorm weights.
  const double per_token = 6.0 * (8030261248.0 - 525336576.0 - 65.0 * 4096) + 12.0 * 32 * 4096 * 8192 / 2;
  EXPECT_DOUBLE_EQ(std::stod(schedule.metadata.at(sim::kMetaModelFlopsPerRankStep)), per_token * 8192 * 2);
}

TEST(Pipeline, ScheduleJsonRoundTripSimulatesIdentically) {
  const Schedule schedule = MustLower(MustParse(TinyModel() + "cluster: {preset: dgx-a100, nodes: 1}\nstrategy: fsdp2\n"));
  StatusOr<Schedule> reread = traces::ParseScheduleJson(traces::ScheduleToJson(schedule), "<json>");
  ASSERT_TRUE(reread.ok()) << reread.status().message();
  EXPECT_EQ(traces::ScheduleToJson(*reread), traces::ScheduleToJson(schedule));
  EXPECT_EQ(MustSimulate(*reread).report, MustSimulate(schedule).report);
}

TEST(Pipeline, DeterministicTraceAndReport) {
  const Schedule schedule = MustLower(MustParse(TinyModel() + "cluster: {preset: dgx-h100, nodes: 2}\nstrategy: fsdp2\n"));
  const SimRun a = MustSimulate(schedule, {0, 9});
  const SimRun b = MustSimulate(schedule, {0, 9});
  EXPECT_EQ(a.report, b.report);
  ASSERT_EQ(a.timeline.slices.size(), b.timeline.slices.size());
  for (size_t i = 0; i < a.timeline.slices.size(); ++i) {
    EXPECT_EQ(a.timeline.slices[i].ts_ns, b.timeline.slices[i].ts_ns);
    EXPECT_EQ(a.timeline.slices[i].name, b.timeline.slices[i].name);
  }
}

TEST(Pipeline, TraceHasTracksKernelsCollectivesAndFlows) {
  const Schedule schedule = MustLower(MustParse(TinyModel() + "cluster: {preset: dgx-a100, nodes: 1}\nstrategy: fsdp2\n"));
  const SimRun run = MustSimulate(schedule, {0, 1});
  EXPECT_EQ(run.timeline.processes.size(), 2u);
  // host thread + compute, all_gather_copy_in, all_gather, reduce_scatter per rank.
  EXPECT_EQ(run.timeline.threads.size(), 2u * 5u);
  int64_t kernels = 0, collectives = 0, launches = 0;
  for (const traces::Slice& s : run.timeline.slices) {
    EXPECT_GE(s.op_id, 0);
    if (s.category == traces::Category::kKernel) {
      ++kernels;
      EXPECT_GE(s.tid, 1);
      if (s.collective) {
        ++collectives;
        EXPECT_EQ(s.collective->process_group, "dp_shard");
        EXPECT_EQ(s.collective->group_size, 8);
        EXPECT_EQ(s.name.rfind("ncclDevKernel_", 0), 0u);
      }
    }
    if (s.name == "cudaLaunchKernel") ++launches;
  }
  EXPECT_EQ(kernels, launches);
  EXPECT_EQ(static_cast<int64_t>(run.timeline.flows.size()), launches);
  // FSDP2 on 4 units (embedding, 2 blocks, [norm, output]): 4 forward and 3 backward
  // all-gathers (the head stays unsharded), 4 reduce-scatters, clip_grad_norm_'s all-reduce;
  // on 2 traced ranks.
  EXPECT_EQ(collectives, 2 * (4 + 3 + 4 + 1));
  for (const traces::Flow& f : run.timeline.flows) EXPECT_LE(f.from_ts_ns, f.to_ts_ns);
}

TEST(Pipeline, CollectivesOfOneGroupCarryMatchingSequenceNumbers) {
  const Schedule schedule = MustLower(MustParse(TinyModel() + "cluster: {preset: dgx-a100, nodes: 1}\nstrategy: fsdp2\n"));
  const SimRun run = MustSimulate(schedule, {0, 5});
  std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> by_seq;  // seq -> (rank, start)
  for (const traces::Slice& s : run.timeline.slices) {
    if (s.collective) by_seq[s.collective->seq].push_back({s.pid, s.ts_ns});
  }
  ASSERT_EQ(by_seq.size(), 12u);
  for (const auto& [seq, starts] : by_seq) {
    ASSERT_EQ(starts.size(), 2u) << "seq " << seq;
    EXPECT_EQ(starts[0].second, starts[1].second) << "a collective starts on every member at once";
  }
}

// Ranks without a trace share one allocator run per (program, capacity); traced ranks keep a
// live allocator. Both must give the same report, whichever ranks are traced.
TEST(Pipeline, SharedAllocatorOutcomesEqualLiveAllocators) {
  for (const std::string strategy : {"fsdp2", "ddp"}) {
    const Schedule schedule = MustLower(MustParse(
        TinyModel() + "cluster: {preset: dgx-h100, nodes: 2}\nstrategy: " + strategy +
        "\ntraining: {seq_len: 128, micro_batch_size: 2, grad_accum_steps: 2}\n"));
    std::vector<int32_t> all;
    for (int32_t r = 0; r < schedule.world_size(); ++r) all.push_back(r);
    const SimRun live = MustSimulate(schedule, all);
    const SimRun shared = MustSimulate(schedule, {});
    // (The engine's own event count differs, a shared log's mallocs need not wait for the
    // global clock, Engine::LogOutcomeIsTimeless; report.json does not carry it.)
    EXPECT_EQ(live.report, shared.report) << strategy;
    EXPECT_GT(live.result.ranks[3].memory.stats.reserved_bytes_peak, 0);
  }
}

TEST(Pipeline, MissingClusterInScheduleIsAClearError) {
  Schedule schedule = MustLower(MustParse(TinyModel() + "cluster: {preset: dgx-a100, nodes: 1}\nstrategy: fsdp2\n"));
  schedule.metadata.clear();
  StatusOr<sim::SimulationSetup> setup = sim::SetupFromSchedule(schedule, "s.json");
  ASSERT_FALSE(setup.ok());
  EXPECT_EQ(setup.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(setup.status().message().find("cluster.preset"), std::string::npos);
}

// A plan-level hang: rank 3 of 8 has almost no free device memory (another process holds
// the rest), so its first allocation fails before it issues any collective. Every other rank
// enters FSDP2's first all-gather (sequence number 1 on the world group) and waits for rank 3
// forever; the report names rank 3 as the root and ranks 0-2,4-7 as waiting in all_gather #1.
TEST(HangIntegration, OutOfMemoryRankHangsItsPeersInTheFirstAllGather) {
  const Schedule schedule = MustLower(MustParse(TinyModel() + "cluster: {preset: dgx-a100, nodes: 1}\nstrategy: fsdp2\n"
                                                "training: {seq_len: 128, micro_batch_size: 2}\n"));
  StatusOr<sim::SimulationSetup> setup = sim::SetupFromSchedule(schedule, "<test>");
  ASSERT_TRUE(setup.ok()) << setup.status().message();
  setup->memory.reserved_by_others_per_rank[3] = sim::AllocatorCapacity(*setup, 3) - (int64_t{1} << 20);
  sim::ClusterCostProvider costs(schedule, setup->cluster);
  StatusOr<sim::SimulationResult> result =
      sim::Simulate(schedule, costs, sim::EngineConfigFor(*setup, schedule), nullptr);
  ASSERT_TRUE(result.ok()) << result.status().message();
  ASSERT_TRUE(result->hung);
  ASSERT_EQ(result->blocked.size(), 8u);
  for (const sim::BlockedRank& b : result->blocked) {
    if (b.rank == 3) {
      EXPECT_EQ(b.host_state.reason, sim::HostBlockReason::kOutOfMemory);
      EXPECT_TRUE(b.pending.empty());
      continue;
    }
    // The first collective of the step on every other rank, stuck at its rendezvous.
    ASSERT_FALSE(b.pending.empty()) << "rank " << b.rank;
    EXPECT_EQ(b.pending.front().second.seq, 1);
    EXPECT_EQ(b.pending.front().second.type, traces::CollectiveType::kAllGather);
    EXPECT_GE(b.pending.front().second.arrived_ns, 0);
  }
  const sim::HangReport report = sim::AnalyzeHang(schedule, *result);
  ASSERT_EQ(report.causes.size(), 1u);
  EXPECT_EQ(report.causes[0].kind, sim::RootCauseKind::kOutOfMemory);
  EXPECT_EQ(report.causes[0].ranks, (std::vector<int32_t>{3}));
  EXPECT_EQ(sim::CompressRanks(report.causes[0].waiting_ranks), "0-2,4-7");
  const std::string comm = schedule.communicators[static_cast<size_t>(result->rendezvous.at(0).communicator)].name;
  EXPECT_NE(report.explanation[0].find(fmt::format("; ranks 0-2,4-7 wait in all_gather #1 on '{}' for rank 3", comm)),
            std::string::npos)
      << report.explanation[0];
  std::cout << "explanation: " << report.explanation[0] << "\n";
  const std::string summary = sim::SummaryText(schedule, *setup, *result);
  EXPECT_NE(summary.find("WHY: rank 3 stopped: out of memory"), std::string::npos) << summary;
  EXPECT_NE(summary.find("WATCHDOG: a NCCL watchdog (600000 ms timeout)"), std::string::npos) << summary;
  const std::string json = sim::ReportJson(schedule, *setup, *result);
  EXPECT_NE(json.find("\"hang_report\": {"), std::string::npos);
  EXPECT_NE(json.find("\"kind\": \"out_of_memory\""), std::string::npos);
  const std::string fr = sim::FlightRecorderJson(schedule, *result, 0, nullptr);
  EXPECT_NE(fr.find("\"state\": \"started\""), std::string::npos);
  EXPECT_NE(fr.find("\"collective_seq_id\": 1"), std::string::npos);
}

}  // namespace
}  // namespace shardscope

// Calibration recovers the constants a "measured" run was simulated with, and a simulation
// with the fitted profile reproduces that run's step time.
//
// The "measured" run is a simulation whose cost provider differs from the defaults in known
// ways (GEMM efficiency 0.55 everywhere, attention 0.60, memory bandwidth x 0.8, NCCL
// bandwidth x 0.7 and latency + 5 us, launch cost 4 us, contention 0.30 / 0.15), so the
// expected fitted values are those constants, known before anything runs.
#include "shardscope/analysis/calibration_fit.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <iostream>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include "lowering_test_support.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/sim/report/report.h"

namespace shardscope::sim {
namespace {

using ::testing::HasSubstr;
using traces::CollectiveType;

constexpr double kTrueGemmEfficiency = 0.55;
constexpr double kTrueAttentionEfficiency = 0.60;
constexpr double kMemoryBandwidthFactor = 0.8;
constexpr double kNcclBandwidthFactor = 0.7;
constexpr double kExtraLatencyUs = 5;
constexpr int64_t kTrueLaunchNs = 4'000;
constexpr double kTrueComputeSlowdown = 0.30;
constexpr double kTrueCommSlowdown = 0.15;
constexpr double kTolerance = 0.01;  // 1%

// The plan: big enough that the layer GEMMs are compute-bound on an H100, two nodes so
// there are collectives of two group sizes (HSDP: shard within a node, replicate across).
Plan CalibrationPlan() {
  const std::string yaml =
      "model: {layers: 4, hidden: 2048, heads: 16, kv_heads: 16, ffn: 5504, vocab: 32000}\n"
      "cluster: {preset: dgx-h100, nodes: 1, gpus_per_node: 4}\n"
      "strategy: fsdp2\n"
      "training: {seq_len: 2048, micro_batch_size: 2, grad_accum_steps: 2}\n";
  StatusOr<Plan> plan = ParsePlan(yaml, "<test>");
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return *plan;
}

// What the measured cluster "really" does.
class TrueCosts : public CostProvider {
 public:
  TrueCosts(const traces::Schedule& schedule, const ClusterSpec& cluster) : compute_(cluster.gpu), base_(schedule, cluster) {}
  // The calibration's own model form (calibration.h): GEMMs and attention at a fixed fraction
  // of the datasheet peak against the memory roofline, never under the kernel floor;
  // memory-bound kernels at the floor plus their bytes at a fixed bandwidth.
  int64_t KernelNs(const traces::ComputeDesc& desc) const override {
    const double floor = static_cast<double>(compute_.KernelFloorNs());
    const double bytes = KernelBytes(desc);
    if (const auto* fixed = std::get_if<traces::FixedDurationDesc>(&desc)) return fixed->duration_ns;
    if (std::holds_alternative<traces::MemoryBoundDesc>(desc)) {
      return static_cast<int64_t>(std::ceil(floor + bytes / TrueBandwidth(compute_) * 1e9));
    }
    const bool gemm = std::holds_alternative<traces::GemmDesc>(desc);
    const traces::DType dtype =
        gemm ? std::get<traces::GemmDesc>(desc).dtype : std::get<traces::AttentionDesc>(desc).dtype;
    const double efficiency = gemm ? kTrueGemmEfficiency : kTrueAttentionEfficiency;
    const double compute_ns = KernelFlops(desc) / (compute_.EffectivePeakFlops(dtype) * efficiency) * 1e9;
    const double memory_ns = bytes / compute_.CopyBandwidth() * 1e9;
    return std::max(static_cast<int64_t>(std::ceil(std::max(compute_ns, memory_ns))), compute_.KernelFloorNs());
  }
  static double TrueBandwidth(const ComputeModel& model) { return model.CopyBandwidth() * kMemoryBandwidthFactor; }
  int64_t MemcpyNs(traces::MemcpyKind kind, int64_t bytes) const override { return base_.MemcpyNs(kind, bytes); }
  // The base model's (algorithm, protocol) choice with latency + 5 us and bandwidth x 0.7.
  CollectiveCost Collective(CollectiveType type, int64_t bytes, int32_t communicator) const override {
    CollectiveCost cost = base_.Collective(type, bytes, communicator);
    if (bytes <= 0) return cost;
    const auto [alpha_ns, beta] = AlphaBeta(type, bytes, communicator);
    cost.latency_us = alpha_ns / 1e3;
    cost.algo_bandwidth = beta;
    cost.duration_ns = static_cast<int64_t>(std::ceil(alpha_ns + static_cast<double>(bytes) / beta * 1e9));
    return cost;
  }
  // alpha and beta of the true model for a collective, from the base model's choice.
  std::pair<double, double> AlphaBeta(CollectiveType type, int64_t bytes, int32_t communicator) const {
    const CollectiveCost base = base_.Collective(type, bytes, communicator);
    return {(base.latency_us + kExtraLatencyUs) * 1e3, base.algo_bandwidth * kNcclBandwidthFactor};
  }

 private:
  ComputeModel compute_;
  ClusterCostProvider base_;
};

EngineConfig TrueEngineConfig(const SimulationSetup& setup, const traces::Schedule& schedule) {
  EngineConfig config = EngineConfigFor(setup, schedule);
  config.launch_overhead_ns = kTrueLaunchNs;
  config.compute_slowdown = kTrueComputeSlowdown;
  config.comm_slowdown = kTrueCommSlowdown;
  config.memory.record_history = false;
  return config;
}

void ExpectWithin(double actual, double expected, const std::string& what) {
  EXPECT_NEAR(actual / expected, 1.0, kTolerance) << what << ": fitted " << actual << ", used " << expected;
}

struct Measured {
  traces::Schedule schedule;
  SimulationSetup setup;
  traces::Timeline timeline;
  SimulationResult result;
};

Measured MeasureWithTrueCosts() {
  Measured m;
  m.schedule = test_support::MustLower(CalibrationPlan());
  StatusOr<SimulationSetup> setup = SetupFromSchedule(m.schedule, "<test>");
  EXPECT_TRUE(setup.ok()) << setup.status().message();
  m.setup = *setup;
  const TrueCosts costs(m.schedule, m.setup.cluster);
  std::vector<int32_t> all;
  for (int32_t r = 0; r < m.schedule.world_size(); ++r) all.push_back(r);
  m.timeline.info.world_size = m.schedule.world_size();  // as the trace writer's header says
  TraceRecorder recorder(m.schedule, all, m.timeline);
  StatusOr<SimulationResult> result =
      Simulate(m.schedule, costs, TrueEngineConfig(m.setup, m.schedule), &recorder);
  EXPECT_TRUE(result.ok()) << result.status().message();
  m.result = *result;
  EXPECT_TRUE(test_support::Completed(m.result));
  return m;
}

TEST(Calibration, RecoversTheConstantsTheMeasuredRunUsed) {
  const Measured m = MeasureWithTrueCosts();
  StatusOr<CalibrationFit> fit = FitCalibration(m.schedule, m.setup.cluster, {&m.timeline});
  ASSERT_TRUE(fit.ok()) << fit.status().message();
  const CalibrationProfile& p = fit->profile;
  std::cout << CalibrationTableText(p, m.setup.cluster);
  for (const std::string& note : fit->notes) std::cout << "note: " << note << "\n";
  EXPECT_EQ(fit->unmatched_slices, 0);
  EXPECT_EQ(p.gpu, "h100-sxm5-80gb");

  ASSERT_FALSE(p.gemm.empty());
  for (const GemmCalibration& g : p.gemm) {
    ExpectWithin(g.efficiency, kTrueGemmEfficiency, fmt::format("gemm 1e{}", g.flops_decade));
    EXPECT_LT(g.fit.rms_relative_error, kTolerance);
  }
  ASSERT_FALSE(p.attention.empty());
  for (const AttentionCalibration& a : p.attention) ExpectWithin(a.efficiency, kTrueAttentionEfficiency, "attention");
  ASSERT_TRUE(p.memory_bandwidth.has_value());
  const double true_bandwidth = TrueCosts::TrueBandwidth(ComputeModel(m.setup.cluster.gpu));
  ExpectWithin(p.memory_bandwidth->value, true_bandwidth, "memory bandwidth");

  // Collectives: every bucket's (alpha, beta) against the true ones of the ops it covers.
  const TrueCosts truth(m.schedule, m.setup.cluster);
  ASSERT_FALSE(p.collectives.empty());
  int checked = 0, both_fitted = 0;
  for (const CollectiveCalibration& row : p.collectives) {
    std::set<std::pair<double, double>> used;
    std::map<double, int> sizes;
    for (int32_t rank = 0; rank < m.schedule.world_size(); ++rank) {
      const traces::RankBinding& binding = m.schedule.ranks[static_cast<size_t>(rank)];
      for (const traces::Op& op : m.schedule.ProgramOf(rank).ops) {
        const auto* c = std::get_if<traces::CollectiveOp>(&op.payload);
        if (c == nullptr || c->type != row.type || c->bytes <= 0) continue;
        const int32_t comm = binding.comm_binding[static_cast<size_t>(c->comm)];
        if (static_cast<int32_t>(m.schedule.communicators[static_cast<size_t>(comm)].ranks.size()) != row.group_size) continue;
        if (static_cast<int32_t>(std::floor(std::log10(static_cast<double>(c->bytes)))) != row.bytes_decade) continue;
        used.insert(truth.AlphaBeta(c->type, c->bytes, comm));
        sizes[static_cast<double>(c->bytes)] = 0;
      }
    }
    ASSERT_FALSE(used.empty());
    if (used.size() != 1) continue;  // the base model switches protocol inside the bucket
    const auto [alpha_ns, beta] = *used.begin();
    const std::string name = fmt::format("{} x{} 1e{}", traces::CollectiveTypeName(row.type), row.group_size, row.bytes_decade);
    // Whatever the method, the bucket's time at each of its sizes is the true one.
    for (const auto& [bytes, unused] : sizes) {
      (void)unused;
      ExpectWithin(row.alpha_ns + bytes / row.beta_bytes_per_s * 1e9, alpha_ns + bytes / beta * 1e9, name + " time");
    }
    if (row.method == CollectiveFitMethod::kAlphaBeta) {
      ExpectWithin(row.alpha_ns, alpha_ns, name + " alpha");
      ExpectWithin(row.beta_bytes_per_s, beta, name + " beta");
      ++both_fitted;
    }
    ++checked;
  }
  EXPECT_GT(both_fitted, 0);
  EXPECT_GT(checked, 0);

  ASSERT_TRUE(p.launch_overhead_ns.has_value());
  ExpectWithin(p.launch_overhead_ns->value, kTrueLaunchNs, "launch");
  ASSERT_TRUE(p.compute_slowdown.has_value());
  ExpectWithin(p.compute_slowdown->value, kTrueComputeSlowdown, "compute slowdown");
  ASSERT_TRUE(p.comm_slowdown.has_value());
  ExpectWithin(p.comm_slowdown->value, kTrueCommSlowdown, "comm slowdown");
}

TEST(Calibration, SimulatingWithTheProfileReproducesTheMeasuredStep) {
  const Measured m = MeasureWithTrueCosts();
  StatusOr<CalibrationFit> fit = FitCalibration(m.schedule, m.setup.cluster, {&m.timeline});
  ASSERT_TRUE(fit.ok()) << fit.status().message();
  StatusOr<std::unique_ptr<CostProvider>> costs = MakeCalibratedCostProvider(m.schedule, m.setup.cluster, fit->profile);
  ASSERT_TRUE(costs.ok()) << costs.status().message();
  EngineConfig config = EngineConfigFor(m.setup, m.schedule);
  config.memory.record_history = false;
  ApplyCalibration(fit->profile, config);
  StatusOr<SimulationResult> calibrated = Simulate(m.schedule, **costs, config, nullptr);
  ASSERT_TRUE(calibrated.ok());
  ExpectWithin(static_cast<double>(calibrated->step_ns), static_cast<double>(m.result.step_ns), "step time");

  // Without calibration the prediction is off by more than the tolerance (the test can fail).
  ClusterCostProvider defaults(m.schedule, m.setup.cluster);
  StatusOr<SimulationResult> uncalibrated =
      Simulate(m.schedule, defaults, EngineConfigFor(m.setup, m.schedule), nullptr);
  ASSERT_TRUE(uncalibrated.ok());
  EXPECT_GT(std::abs(static_cast<double>(uncalibrated->step_ns) / static_cast<double>(m.result.step_ns) - 1), 0.05);
}

TEST(Calibration, ProfileYamlRoundTripsExactly) {
  CalibrationProfile p;
  p.gpu = "a100-sxm4-80gb";
  p.gemm = {{traces::DType::kBFloat16, 9, 0.5512345678901234, {12, 0.0012}}};
  p.attention = {{traces::DType::kFloat16, true, 0.41, {3, 0}}};
  p.memory_bandwidth = FittedValue{1.6e12 / 3, {40, 0.25}};
  p.collectives = {{CollectiveType::kAllGather, 8, 7, 37123.456, 1.23e11, CollectiveFitMethod::kBetaOnly, {6, 1e-9}}};
  p.launch_overhead_ns = FittedValue{4000, {96, 0}};
  p.comm_slowdown = FittedValue{0.1, {5, 0.02}};
  StatusOr<CalibrationProfile> back = ParseCalibrationProfile(CalibrationProfileYaml(p), "p.yaml");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_TRUE(*back == p) << CalibrationProfileYaml(*back);

  const std::string path = ::testing::TempDir() + "/calibration_test_" + std::to_string(::getpid()) + ".yaml";
  ASSERT_TRUE(WriteCalibrationProfile(p, path).ok());
  StatusOr<CalibrationProfile> read = ReadCalibrationProfile(path);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_TRUE(*read == p);
  std::remove(path.c_str());
}

TEST(Calibration, ProfileErrorsNameFileLineAndKey) {
  const auto error = [](const std::string& yaml) {
    StatusOr<CalibrationProfile> p = ParseCalibrationProfile(yaml, "prof.yaml");
    EXPECT_FALSE(p.ok());
    return p.ok() ? std::string() : p.status().message();
  };
  EXPECT_THAT(error("version: 1\ngpu: h100-sxm5-80gb\ngemm:\n  - {dtype: bf16, flops_decade: 9, efficiency: fast, "
                    "points: 1, rms_relative_error: 0}\n"),
              HasSubstr("prof.yaml:4:"));
  EXPECT_THAT(error("version: 1\ngpu: x\ngemm:\n  - {dtype: bf16, flops_decade: 9, efficiency: fast, points: 1, "
                    "rms_relative_error: 0}\n"),
              HasSubstr("gemm[0].efficiency: expected a number, got 'fast'"));
  EXPECT_THAT(error("version: 1\ngpu: x\nlaunch_overhead: 3\n"), HasSubstr("prof.yaml:3:1: (top level).launch_overhead: unknown key"));
  EXPECT_THAT(error("version: 2\ngpu: x\n"), HasSubstr("version: expected 1, got 2"));
  EXPECT_THAT(error("gpu: x\n"), HasSubstr("(top level).version: missing"));
  EXPECT_THAT(error("version: 1\ngpu: x\ncollectives:\n  - {type: allgather, group_size: 8, bytes_decade: 7, alpha_ns: 1, "
                    "beta_bytes_per_s: 1, method: alpha_beta, points: 1, rms_relative_error: 0}\n"),
              HasSubstr("collectives[0].type: unknown collective 'allgather'"));
  EXPECT_THAT(error("version: 1\ngpu: [x\n"), HasSubstr("prof.yaml:"));
  StatusOr<CalibrationProfile> missing = ReadCalibrationProfile("/nonexistent/profile.yaml");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("/nonexistent/profile.yaml"));
}

// The profile's limits (calibration.cc): what a simulation with the profile could not use is
// refused at the profile's own file, line and key.
TEST(Calibration, ProfileValuesAreBoundedAndBucketsUnique) {
  const auto error = [](const std::string& yaml) {
    StatusOr<CalibrationProfile> p = ParseCalibrationProfile(yaml, "prof.yaml");
    EXPECT_FALSE(p.ok()) << yaml;
    return p.ok() ? std::string() : p.status().message();
  };
  const std::string head = "version: 1\ngpu: x\n";
  // An efficiency is achieved / peak: 5.0 beats the tensor cores fivefold.
  EXPECT_EQ(error(head + "gemm:\n  - {dtype: bf16, flops_decade: 9, efficiency: 5.0, points: 1, "
                         "rms_relative_error: 0}\n"),
            "prof.yaml:4:48: gemm[0].efficiency: expected a number <= 1 (the limit), got 5");
  EXPECT_THAT(error(head + "attention:\n  - {dtype: bf16, pass: forward, efficiency: 1.5, points: 1, "
                           "rms_relative_error: 0}\n"),
              HasSubstr("attention[0].efficiency: expected a number <= 1 (the limit), got 1.5"));
  // Two rows for one bucket: the lookups would use the first and ignore the second.
  EXPECT_EQ(error(head + "gemm:\n  - {dtype: bf16, flops_decade: 9, efficiency: 0.5, points: 1, rms_relative_error: 0}\n"
                         "  - {dtype: bf16, flops_decade: 9, efficiency: 0.7, points: 1, rms_relative_error: 0}\n"),
            "prof.yaml:5:5: gemm[1]: the bucket (bf16, flops_decade 9) already calibrated by gemm[0]");
  EXPECT_THAT(error(head + "collectives:\n"
                           "  - {type: all_gather, group_size: 8, bytes_decade: 7, alpha_ns: 1, beta_bytes_per_s: 1e11, "
                           "method: alpha_beta, points: 1, rms_relative_error: 0}\n"
                           "  - {type: all_gather, group_size: 8, bytes_decade: 7, alpha_ns: 2, beta_bytes_per_s: 1e11, "
                           "method: alpha_beta, points: 1, rms_relative_error: 0}\n"),
              HasSubstr("collectives[1]: the bucket (all_gather, group_size 8, bytes_decade 7) already calibrated by "
                        "collectives[0]"));
  // A key given twice (yaml-cpp would keep one of them without a word).
  EXPECT_EQ(error("version: 1\ngpu: x\ngpu: y\n"), "prof.yaml:3:1: (top level).gpu: key given twice");
  EXPECT_THAT(error(head + "launch_overhead_ns: {value: 3, value: 4, points: 1, rms_relative_error: 0}\n"),
              HasSubstr("launch_overhead_ns.value: key given twice"));
  // A launch cost of 1e20 ns (once llround'ed past int64 and reported against the plan's own
  // host keys): at most one second, the plan's limit, reported at the profile's key.
  EXPECT_EQ(error(head + "launch_overhead_ns: {value: 1e20, points: 1, rms_relative_error: 0}\n"),
            "prof.yaml:3:29: launch_overhead_ns.value: expected a number <= 1000000000 (the limit), got 1e+20");
  EXPECT_THAT(error(head + "memory_bandwidth_bytes_per_s: {value: 1000, points: 1, rms_relative_error: 0}\n"),
              HasSubstr("memory_bandwidth_bytes_per_s.value: expected a number >= 100000000 and <= 100000000000000, got 1000"));
  EXPECT_THAT(error(head + "comm_slowdown: {value: 1000, points: 1, rms_relative_error: 0}\n"),
              HasSubstr("comm_slowdown.value: expected a number <= 100 (the limit), got 1000"));
}

TEST(Calibration, ProviderFallsBackWhereTheProfileHasNoBucketAndChecksTheGpu) {
  const traces::Schedule schedule = test_support::MustLower(CalibrationPlan());
  StatusOr<SimulationSetup> setup = SetupFromSchedule(schedule, "<test>");
  ASSERT_TRUE(setup.ok());
  const ClusterCostProvider base(schedule, setup->cluster);
  CalibrationProfile profile;
  profile.gpu = setup->cluster.gpu.name;
  profile.gemm = {{traces::DType::kBFloat16, 12, 0.5, {1, 0}}};  // 1e12..1e13 FLOPs only
  const CalibratedCostProvider costs(schedule, setup->cluster, base, profile);
  // 2 x 4096^3 = 1.37e11 FLOPs: no bucket, the base model's answer.
  const traces::GemmDesc small{4096, 4096, 4096, 1, traces::DType::kBFloat16};
  EXPECT_EQ(costs.KernelNs(small), base.KernelNs(small));
  // 2 x 8192^2 x 16384 = 2.2e12 FLOPs at 0.5 of the bf16 peak, by hand.
  const traces::GemmDesc big{8192, 8192, 16384, 1, traces::DType::kBFloat16};
  const double expected_ns = 2.0 * 8192 * 8192 * 16384 / (setup->cluster.gpu.peak_flops_bf16 * 0.5) * 1e9;
  EXPECT_NEAR(static_cast<double>(costs.KernelNs(big)), expected_ns, 1.0);
  EXPECT_EQ(costs.Collective(CollectiveType::kAllGather, 1 << 20, 0).duration_ns,
            base.Collective(CollectiveType::kAllGather, 1 << 20, 0).duration_ns);

  profile.gpu = "a100-sxm4-80gb";
  StatusOr<std::unique_ptr<CostProvider>> wrong = MakeCalibratedCostProvider(schedule, setup->cluster, profile);
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.status().message(), HasSubstr("measured on GPU 'a100-sxm4-80gb'"));
}

TEST(Calibration, ATraceOfAnotherScheduleJoinsNothing) {
  const traces::Schedule schedule = test_support::MustLower(CalibrationPlan());
  StatusOr<SimulationSetup> setup = SetupFromSchedule(schedule, "<test>");
  ASSERT_TRUE(setup.ok());
  traces::Timeline foreign;
  foreign.info.world_size = schedule.world_size();
  traces::Slice s;
  s.op_id = -1;  // an imported PyTorch trace: no op ids
  s.name = "sm90_xmma_gemm";
  foreign.slices.push_back(s);
  StatusOr<CalibrationFit> fit = FitCalibration(schedule, setup->cluster, {&foreign});
  ASSERT_FALSE(fit.ok());
  EXPECT_THAT(fit.status().message(), HasSubstr("no measured slice joins an op of the schedule"));
}

TEST(Calibration, RefusesATraceOfAnotherWorldSize) {
  Measured m = MeasureWithTrueCosts();
  m.timeline.info.world_size = m.schedule.world_size() * 2;
  StatusOr<CalibrationFit> fit = FitCalibration(m.schedule, m.setup.cluster, {&m.timeline}, {"run/trace.json"});
  ASSERT_FALSE(fit.ok());
  EXPECT_EQ(fit.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(fit.status().message(), HasSubstr("run/trace.json: distributedInfo.world_size is"));
}

TEST(Calibration, RefusesATraceWhoseOpIdsJoinOpsOfAnotherKind) {
  Measured m = MeasureWithTrueCosts();
  // Every kernel slice relabelled as a copy: the op ids exist, but no kernel op launches a
  // copy, so (almost) nothing joins with the right kind.
  int64_t relabelled = 0;
  for (traces::Slice& s : m.timeline.slices) {
    if (s.tid != 0 && s.op_id >= 0 && s.category == traces::Category::kKernel) {
      s.category = traces::Category::kGpuMemcpy;
      ++relabelled;
    }
  }
  ASSERT_GT(relabelled, 0);
  StatusOr<CalibrationFit> fit = FitCalibration(m.schedule, m.setup.cluster, {&m.timeline}, {"other/trace.json"});
  ASSERT_FALSE(fit.ok());
  EXPECT_THAT(fit.status().message(), HasSubstr("other/trace.json: only"));
  EXPECT_THAT(fit.status().message(), HasSubstr("this trace is a run of another schedule"));
}

TEST(Calibration, FlagsFitsNoRunOfTheGpuCanProduce) {
  Measured m = MeasureWithTrueCosts();
  {
    StatusOr<CalibrationFit> fit = FitCalibration(m.schedule, m.setup.cluster, {&m.timeline});
    ASSERT_TRUE(fit.ok()) << fit.status().message();
    EXPECT_THAT(fit->warnings, ::testing::IsEmpty()) << "the true costs are plausible";
  }
  // The host backend at --time-scale 0.01: every device duration a hundredth of the GPU's.
  for (traces::Slice& s : m.timeline.slices) {
    if (s.tid == 0) continue;
    s.ts_ns /= 100;
    s.dur_ns = std::max<int64_t>(1, s.dur_ns / 100);
  }
  StatusOr<CalibrationFit> fit = FitCalibration(m.schedule, m.setup.cluster, {&m.timeline});
  ASSERT_TRUE(fit.ok()) << fit.status().message();
  ASSERT_THAT(fit->warnings, ::testing::Not(::testing::IsEmpty()));
  std::string all;
  for (const std::string& w : fit->warnings) all += w + "\n";
  EXPECT_THAT(all, HasSubstr("memory bandwidth")) << all;
  EXPECT_THAT(all, HasSubstr("datasheet")) << all;
}

}  // namespace
}  // namespace shardscope::sim

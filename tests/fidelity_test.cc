// The fidelity suite (docs/FIDELITY.md): every published end-to-end result the model is judged
// against, simulated from its plan in tests/fidelity/, with the error against the published
// figure. Prints the table; fails when a judged row leaves its stated tolerance, and when a
// row recorded as a known gap comes back within it (the table in the docs must stay true).
// Published figures judge the model; no constant is fitted to them.
//
// Two kinds of row: a plan (tests/fidelity/<plan>.yaml) simulated whole, or one collective
// (`collective`, `bytes`, `cluster`, `nodes`, optional `nccl` as in a plan's cluster.nccl)
// costed by the cost provider a simulation of that cluster uses, and scored as nccl-tests
// scores it (metric busbw_gbps: algbw = S / t, busbw = algbw x 2(n-1)/n for all_reduce,
// (n-1)/n for all_gather and reduce_scatter; doc/PERFORMANCE.md of NVIDIA/nccl-tests).
//
// SHARDSCOPE_FIDELITY_TABLE=path writes the Markdown table there too
// (scripts/regen-fidelity.sh splices it into docs/FIDELITY.md).
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "shardscope/sim/lowering/lowering.h"
#include "shardscope/sim/models/cost_provider.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/sim/report/report.h"

namespace shardscope {
namespace {

const std::string kDir = std::string(SHARDSCOPE_SOURCE_DIR) + "/tests/fidelity/";

struct Row {
  std::string id, plan, source, setup, metric, note, known_gap;
  std::string numerator, denominator;  // metric "ratio": tokens/s of one row over another's
  // A collective row: what nccl-tests ran (nccl: the cluster.nccl mapping, in YAML flow form).
  std::string collective, cluster, nccl;
  int64_t bytes = 0;
  int32_t nodes = 1;
  double published = 0;
  double tolerance = 0;  // relative; 0 = not judged (shown for information)
};

std::string Field(const YAML::Node& node, const char* key) {
  return node[key] ? node[key].as<std::string>() : std::string();
}

std::vector<Row> ReadRows() {
  const YAML::Node root = YAML::LoadFile(kDir + "published.yaml");
  std::vector<Row> rows;
  for (const YAML::Node& n : root) {
    Row r;
    r.id = Field(n, "id");
    r.plan = Field(n, "plan");
    r.source = Field(n, "source");
    r.setup = Field(n, "setup");
    r.metric = Field(n, "metric");
    r.note = Field(n, "note");
    r.known_gap = Field(n, "known_gap");
    r.numerator = Field(n, "numerator");
    r.denominator = Field(n, "denominator");
    r.collective = Field(n, "collective");
    r.cluster = Field(n, "cluster");
    if (n["bytes"]) r.bytes = n["bytes"].as<int64_t>();
    if (n["nodes"]) r.nodes = n["nodes"].as<int32_t>();
    if (n["nccl"]) {
      YAML::Emitter flow;
      flow << YAML::Flow << n["nccl"];
      r.nccl = flow.c_str();
    }
    r.published = n["published"].as<double>();
    r.tolerance = n["tolerance"] ? n["tolerance"].as<double>() : 0.0;
    rows.push_back(r);
  }
  return rows;
}

// report.json of each plan, simulated once.
const nlohmann::json& Report(const std::string& plan_file) {
  static std::map<std::string, nlohmann::json> reports;
  auto it = reports.find(plan_file);
  if (it != reports.end()) return it->second;
  nlohmann::json report;
  StatusOr<sim::Plan> plan = sim::LoadPlanFile(kDir + plan_file);
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  if (plan.ok()) {
    StatusOr<traces::Schedule> schedule = sim::LowerPlan(*plan);
    EXPECT_TRUE(schedule.ok()) << schedule.status().message();
    if (schedule.ok()) {
      StatusOr<sim::SimulationSetup> setup = sim::SetupFromSchedule(*schedule, plan_file);
      EXPECT_TRUE(setup.ok()) << setup.status().message();
      if (setup.ok()) {
        sim::ClusterCostProvider costs(*schedule, setup->cluster);
        StatusOr<sim::SimulationResult> result =
            sim::Simulate(*schedule, costs, sim::EngineConfigFor(*setup, *schedule), nullptr);
        EXPECT_TRUE(result.ok()) << result.status().message();
        if (result.ok()) report = nlohmann::json::parse(sim::ReportJson(*schedule, *setup, *result));
      }
    }
  }
  return reports.emplace(plan_file, std::move(report)).first->second;
}

// nccl-tests' busbw of one collective on a cluster, through the plan parser (so the row's
// `nccl` mapping is read as a plan's cluster.nccl is) and the simulation's cost provider.
std::optional<double> CollectiveBusbw(const Row& row) {
  const std::string text =
      fmt::format("model: llama3-8b\ncluster: {{preset: {}, nodes: {}{}}}\nstrategy: ddp\n", row.cluster, row.nodes,
                  row.nccl.empty() ? "" : ", nccl: " + row.nccl);
  StatusOr<sim::Plan> plan = sim::ParsePlan(text, row.id);
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  const std::optional<traces::CollectiveType> type = traces::ParseCollectiveType(row.collective);
  EXPECT_TRUE(type.has_value()) << row.id << ": unknown collective " << row.collective;
  if (!plan.ok() || !type) return std::nullopt;
  const int32_t n = plan->cluster.world_size();
  traces::Schedule schedule;
  traces::Communicator world{"world", {}};
  for (int32_t r = 0; r < n; ++r) world.ranks.push_back(r);
  schedule.communicators.push_back(world);
  const sim::ClusterCostProvider costs(schedule, plan->cluster);
  const sim::CollectiveCost cost = costs.Collective(*type, row.bytes, 0);
  if (cost.duration_ns <= 0) return std::nullopt;
  const double algbw_gbps = static_cast<double>(row.bytes) / static_cast<double>(cost.duration_ns);
  const double factor = *type == traces::CollectiveType::kAllReduce ? 2.0 * (n - 1) / n
                        : *type == traces::CollectiveType::kAllGather || *type == traces::CollectiveType::kReduceScatter
                            ? static_cast<double>(n - 1) / n
                            : 1.0;
  return algbw_gbps * factor;
}

// The row's predicted figure (nullopt when the run did not complete: an OOM, a hang).
std::optional<double> Predicted(const Row& row, const std::map<std::string, const Row*>& by_id) {
  if (row.metric == "busbw_gbps") return CollectiveBusbw(row);
  if (row.metric == "ratio") {
    const auto a = by_id.find(row.numerator), b = by_id.find(row.denominator);
    if (a == by_id.end() || b == by_id.end()) return std::nullopt;
    const nlohmann::json& ra = Report(a->second->plan);
    const nlohmann::json& rb = Report(b->second->plan);
    const double x = ra.value("tokens_per_second_per_gpu", 0.0), y = rb.value("tokens_per_second_per_gpu", 0.0);
    if (x <= 0 || y <= 0) return std::nullopt;
    return x / y;
  }
  const nlohmann::json& report = Report(row.plan);
  // A published verdict: 1 when the job completes its step, 0 when it runs out of memory (in
  // the init phase or the step) or hangs.
  if (row.metric == "fits") {
    if (report.is_null()) return std::nullopt;
    return report.value("completed", false) ? 1.0 : 0.0;
  }
  if (report.is_null() || !report.value("completed", false)) {
    if (row.metric == "peak_reserved_gib" && !report.is_null()) {
      return static_cast<double>(report["memory"]["peak_reserved_bytes"].get<int64_t>()) / (1 << 30);
    }
    return std::nullopt;
  }
  if (row.metric == "tokens_per_second_per_gpu") return report["tokens_per_second_per_gpu"].get<double>();
  if (row.metric == "peak_reserved_gib") {
    return static_cast<double>(report["memory"]["peak_reserved_bytes"].get<int64_t>()) / (1 << 30);
  }
  for (const char* prefix : {"tflops_per_gpu.", "mfu."}) {
    const std::string p = prefix;
    if (row.metric.rfind(p, 0) != 0) continue;
    const nlohmann::json& c = report["mfu_by_convention"][row.metric.substr(p.size())];
    const nlohmann::json& v = c[p == "mfu." ? "mfu" : "tflops_per_gpu"];
    if (v.is_null()) return std::nullopt;
    return v.get<double>();
  }
  ADD_FAILURE() << row.id << ": unknown metric '" << row.metric << "'";
  return std::nullopt;
}

std::string Figure(double v) {
  if (std::abs(v) >= 100) return fmt::format("{:.0f}", v);
  if (std::abs(v) >= 10) return fmt::format("{:.1f}", v);
  return fmt::format("{:.3f}", v);
}

TEST(Fidelity, PublishedResultsWithinTheirTolerance) {
  const std::vector<Row> rows = ReadRows();
  ASSERT_FALSE(rows.empty());
  std::map<std::string, const Row*> by_id;
  for (const Row& r : rows) by_id[r.id] = &r;

  std::string table =
      "| id | published result (source) | setup | metric | published | predicted | error | tolerance | status |\n"
      "|---|---|---|---|---|---|---|---|---|\n";
  std::vector<double> judged_errors;
  int off = 0;
  for (const Row& row : rows) {
    const std::optional<double> predicted = Predicted(row, by_id);
    std::string error_text = "—", status;
    double error = 0;
    const bool verdict = row.metric == "fits";
    if (predicted && verdict) {
      error = *predicted - row.published;  // 0: the verdicts agree
      error_text = error == 0 ? "agrees" : "differs";
    } else if (predicted) {
      error = *predicted / row.published - 1;
      error_text = fmt::format("{:+.1f}%", 100 * error);
    }
    const bool judged = row.tolerance > 0;
    const bool within = predicted && std::abs(error) <= row.tolerance;
    if (!judged) {
      status = "not judged";
    } else if (!row.known_gap.empty()) {
      status = "**off** (known gap)";
      ++off;
      EXPECT_FALSE(within) << row.id << " is back within its tolerance: drop its known_gap and update docs/FIDELITY.md";
    } else {
      status = within ? "ok" : "**off**";
      EXPECT_TRUE(within) << row.id << ": predicted " << (predicted ? Figure(*predicted) : "nothing (did not complete)")
                          << " against " << row.published << " (tolerance ±" << 100 * row.tolerance << "%)";
    }
    if (judged && predicted && !verdict) judged_errors.push_back(std::abs(error));
    table += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", row.id, row.source, row.setup, row.metric,
                         verdict ? (row.published > 0 ? "fits" : "OOM") : Figure(row.published),
                         !predicted ? "did not complete" : verdict ? (*predicted > 0 ? "fits" : "OOM") : Figure(*predicted),
                         error_text, judged ? (verdict ? "verdict" : fmt::format("±{:.0f}%", 100 * row.tolerance)) : "—",
                         status);
  }
  std::sort(judged_errors.begin(), judged_errors.end());
  double mean = 0;
  for (double e : judged_errors) mean += e / static_cast<double>(judged_errors.size());
  const double median = judged_errors.empty() ? 0
                        : judged_errors.size() % 2 == 1
                            ? judged_errors[judged_errors.size() / 2]
                            : (judged_errors[judged_errors.size() / 2 - 1] + judged_errors[judged_errors.size() / 2]) / 2;
  table += fmt::format(
      "\nJudged rows: {}; absolute error mean {:.1f}%, median {:.1f}%, worst {:.1f}%; {} row(s) off (known gaps).\n",
      judged_errors.size(), 100 * mean, 100 * median, judged_errors.empty() ? 0.0 : 100 * judged_errors.back(), off);
  std::string notes;
  for (const Row& row : rows) {
    if (!row.note.empty()) notes += fmt::format("- `{}`: {}\n", row.id, row.note);
    if (!row.known_gap.empty()) notes += fmt::format("- `{}` (known gap): {}\n", row.id, row.known_gap);
  }
  if (!notes.empty()) table += "\nNotes:\n" + notes;
  std::cout << table;
  if (const char* out = std::getenv("SHARDSCOPE_FIDELITY_TABLE")) std::ofstream(out) << table;
}

}  // namespace
}  // namespace shardscope

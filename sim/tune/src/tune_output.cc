// What tune prints and writes: the ranked table, the Pareto front, the families it rejected and
// why, ranking.json and best.yaml (tune.h).
#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "shardscope/sim/tune/tune.h"

namespace shardscope::sim {
namespace {

constexpr double kGiB = double(int64_t{1} << 30);

std::string GiB(int64_t bytes) { return fmt::format("{:.1f} GiB", static_cast<double>(bytes) / kGiB); }

std::string SearchedKnobs(const TuneSpace& s) {
  std::vector<std::string> names;
  if (s.strategy) names.push_back("strategy");
  if (s.mesh) names.push_back("mesh");
  if (s.reshard) names.push_back("reshard");
  if (s.prefetch) names.push_back("prefetch");
  if (s.buckets) names.push_back("buckets");
  if (s.micro_batch) names.push_back("micro_batch");
  if (s.checkpointing) names.push_back("ac");
  if (s.compile) names.push_back("compile");
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ",") + n;
  return out.empty() ? "nothing" : out;
}

// Per family, in order of first appearance: its candidates by verdict.
struct Family {
  std::string name;
  std::vector<const TuneCandidate*> members;
  std::map<TuneVerdict, std::vector<const TuneCandidate*>> by_verdict;
};

std::vector<Family> Families(const TuneResult& result) {
  std::vector<Family> families;
  std::map<std::string, size_t> at;
  for (const TuneCandidate& c : result.candidates) {
    auto [it, inserted] = at.try_emplace(c.family, families.size());
    if (inserted) families.push_back(Family{c.family, {}, {}});
    Family& f = families[it->second];
    f.members.push_back(&c);
    f.by_verdict[c.verdict].push_back(&c);
  }
  return families;
}

// A family's rejected candidates in a line: counts by verdict and the reason of the one that came
// closest (the smallest memory bound among the commonest verdict).
std::string Rejections(const Family& f) {
  std::string counts;
  TuneVerdict commonest = TuneVerdict::kBudget;
  size_t most = 0;
  for (const auto& [verdict, members] : f.by_verdict) {
    if (verdict == TuneVerdict::kKept) continue;
    counts += fmt::format("{}{} {}", counts.empty() ? "" : ", ", members.size(), TuneVerdictName(verdict));
    if (members.size() > most) {
      most = members.size();
      commonest = verdict;
    }
  }
  if (most == 0) return "";
  const auto& members = f.by_verdict.at(commonest);
  const TuneCandidate* closest = *std::min_element(members.begin(), members.end(), [](const TuneCandidate* a, const TuneCandidate* b) {
    return a->memory_bound_bytes != b->memory_bound_bytes ? a->memory_bound_bytes < b->memory_bound_bytes
                                                          : a->index < b->index;
  });
  return fmt::format("{}; e.g. {}: {}", counts, closest->label, closest->why);
}

}  // namespace

std::string TuneText(const TuneResult& result, const TuneOptions& options) {
  std::string out;
  std::map<TuneVerdict, int> counts;
  for (const TuneCandidate& c : result.candidates) ++counts[c.verdict];
  out += fmt::format("shardscope tune: {} on {} GPUs, global batch {} sequences ({} per GPU)\n", result.plan_path,
                     result.gpus, result.global_batch, result.global_batch / std::max(1, result.gpus));
  out += fmt::format("  searched {}: {} candidates; {} simulated, {} ruled out by the memory bound, {} by the time bound, "
                     "{} refused by the loader{}\n",
                     SearchedKnobs(options.space), result.candidates.size(), result.simulated, counts[TuneVerdict::kBound],
                     counts[TuneVerdict::kDominated], counts[TuneVerdict::kInvalid],
                     result.budget_ran_out ? fmt::format(", {} left when the budget ran out", counts[TuneVerdict::kBudget]) : "");
  out += fmt::format("  kept: completes, no rank out of memory (init phase included), no allocator retries{}\n",
                     options.held_bytes > 0 ? fmt::format(", and safe with {:.2f} GiB held by another process on rank 0 (check)",
                                                          static_cast<double>(options.held_bytes) / kGiB)
                                            : "");
  if (result.ranking.empty()) {
    out += "\n  no candidate was kept\n";
  } else {
    out += fmt::format("\n  {:>4}  {:>10}  {:>12}  {:>18}  {:>13}  {:>12}  {}\n", "rank", "step (ms)", "tokens/s/GPU",
                       "MFU (convention)", "peak reserved", "exposed comm", "plan");
    const size_t rows = std::min(result.ranking.size(), static_cast<size_t>(std::max(1, options.top)));
    for (size_t i = 0; i < rows; ++i) {
      const TuneCandidate& c = result.candidates[static_cast<size_t>(result.ranking[i])];
      out += fmt::format("  {:>4}  {:>10.1f}  {:>12.0f}  {:>18}  {:>13}  {:>9.1f} ms  {}\n", i + 1,
                         static_cast<double>(c.step_ns) * 1e-6, c.tokens_per_second_per_gpu,
                         fmt::format("{:.3f} {}", c.mfu, c.mfu_convention), GiB(c.peak_reserved_bytes),
                         static_cast<double>(c.exposed_comm_ns) * 1e-6, c.label);
    }
    if (result.ranking.size() > rows) out += fmt::format("  ... {} more kept (ranking.json)\n", result.ranking.size() - rows);
    out += "\n  Pareto front, step time against peak reserved:\n";
    for (int32_t index : result.pareto) {
      const TuneCandidate& c = result.candidates[static_cast<size_t>(index)];
      out += fmt::format("    {:>10.1f} ms  {:>9}  {}\n", static_cast<double>(c.step_ns) * 1e-6, GiB(c.peak_reserved_bytes),
                         c.label);
    }
  }
  out += "\n  families:\n";
  for (const Family& f : Families(result)) {
    const auto kept = f.by_verdict.find(TuneVerdict::kKept);
    const size_t n_kept = kept == f.by_verdict.end() ? 0 : kept->second.size();
    const std::string rejected = Rejections(f);
    if (n_kept == 0) {
      out += fmt::format("    {}: {} candidate(s), none kept: {}\n", f.name, f.members.size(), rejected);
    } else {
      const TuneCandidate* best = *std::min_element(kept->second.begin(), kept->second.end(), [](const TuneCandidate* a, const TuneCandidate* b) {
        return a->step_ns != b->step_ns ? a->step_ns < b->step_ns : a->index < b->index;
      });
      out += fmt::format("    {}: {} candidate(s), {} kept (fastest {:.1f} ms){}\n", f.name, f.members.size(), n_kept,
                         static_cast<double>(best->step_ns) * 1e-6, rejected.empty() ? "" : "; the others: " + rejected);
    }
  }
  if (!result.ranking.empty()) {
    const TuneCandidate& best = result.candidates[static_cast<size_t>(result.ranking.front())];
    out += fmt::format("\n  best: {} ({:.1f} ms per step, {} peak reserved of {})\n", best.label,
                       static_cast<double>(best.step_ns) * 1e-6, GiB(best.peak_reserved_bytes), GiB(best.capacity_bytes));
  }
  return out;
}

std::string TuneRankingJson(const TuneResult& result) {
  nlohmann::ordered_json j;
  j["plan"] = result.plan_path;
  j["gpus"] = result.gpus;
  j["global_batch"] = result.global_batch;
  j["candidates"] = result.candidates.size();
  j["simulated"] = result.simulated;
  j["budget_ran_out"] = result.budget_ran_out;
  const auto knobs_json = [](const TuneKnobs& k) {
    nlohmann::ordered_json o;
    o["strategy"] = k.strategy;
    if (k.strategy == "fsdp2") {
      o["replicate"] = k.replicate;
      o["reshard_after_forward"] = k.reshard;
      if (k.forward_prefetch >= 0) o["forward_prefetch"] = k.forward_prefetch;
      if (k.backward_prefetch >= 0) o["backward_prefetch"] = k.backward_prefetch;
      if (k.bucket > 0) o["blocks_per_unit"] = static_cast<int64_t>(k.bucket);
    } else if (k.strategy == "fsdp1") {
      o["sharding_strategy"] = k.fsdp1_sharding;
      if (k.backward_prefetch >= 0) o["backward_prefetch"] = k.backward_prefetch == 0 ? "BACKWARD_PRE" : "BACKWARD_POST";
    } else if (k.bucket > 0) {
      o[k.strategy == "ddp" ? "bucket_cap_mb" : k.strategy == "zero3" ? "stage3_prefetch_bucket_size" : "reduce_bucket_size"] = k.bucket;
    }
    o["micro_batch_size"] = k.micro_batch_size;
    o["grad_accum_steps"] = k.grad_accum_steps;
    o["activation_checkpointing"] = k.checkpointing;
    o["compile"] = k.compile;
    return o;
  };
  const auto candidate_json = [&](const TuneCandidate& c) {
    nlohmann::ordered_json o;
    o["index"] = c.index;
    o["label"] = c.label;
    o["family"] = c.family;
    o["knobs"] = knobs_json(c.knobs);
    o["verdict"] = std::string(TuneVerdictName(c.verdict));
    o["why"] = c.verdict == TuneVerdict::kKept ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(c.why);
    o["memory_bound_bytes"] = c.memory_bound_bytes;
    o["time_bound_ns"] = c.time_bound_ns;
    if (c.step_ns > 0) {
      o["step_time_ns"] = c.step_ns;
      o["tokens_per_second_per_gpu"] = c.tokens_per_second_per_gpu;
      o["mfu"] = c.mfu;
      o["mfu_convention"] = c.mfu_convention;
      o["peak_reserved_bytes"] = c.peak_reserved_bytes;
      o["capacity_bytes"] = c.capacity_bytes;
      o["exposed_comm_ns"] = c.exposed_comm_ns;
      o["simulated_ranks"] = c.simulated_ranks;
    }
    return o;
  };
  nlohmann::ordered_json ranking = nlohmann::ordered_json::array();
  for (int32_t index : result.ranking) ranking.push_back(candidate_json(result.candidates[static_cast<size_t>(index)]));
  j["ranking"] = std::move(ranking);
  j["pareto"] = result.pareto;
  nlohmann::ordered_json families = nlohmann::ordered_json::array();
  for (const Family& f : Families(result)) {
    nlohmann::ordered_json verdicts = nlohmann::ordered_json::object();
    for (const auto& [verdict, members] : f.by_verdict) verdicts[std::string(TuneVerdictName(verdict))] = members.size();
    families.push_back({{"family", f.name}, {"candidates", f.members.size()}, {"verdicts", verdicts}, {"why", Rejections(f)}});
  }
  j["families"] = std::move(families);
  nlohmann::ordered_json rejected = nlohmann::ordered_json::array();
  for (const TuneCandidate& c : result.candidates) {
    if (c.verdict != TuneVerdict::kKept) rejected.push_back(candidate_json(c));
  }
  j["rejected"] = std::move(rejected);
  return j.dump(2) + "\n";
}

std::string TuneBestPlanYaml(const TuneResult& result, const std::string& out_dir) {
  if (result.ranking.empty()) return "";
  const TuneCandidate& best = result.candidates[static_cast<size_t>(result.ranking.front())];
  YAML::Node root = YAML::Load(best.plan_yaml);
  // Paths the plan names are relative to its own folder; best.yaml lives in `out_dir`.
  namespace fs = std::filesystem;
  const fs::path plan_dir = fs::absolute(fs::path(result.plan_path)).parent_path();
  const fs::path target = fs::absolute(fs::path(out_dir));
  const auto relink = [&](YAML::Node node) {
    if (!node || !node.IsScalar()) return;
    fs::path file(node.as<std::string>());
    if (file.is_absolute()) return;
    node = fs::relative(plan_dir / file, target).generic_string();
  };
  if (root["model"] && root["model"].IsMap()) relink(root["model"]["hf_config"]);
  if (root["cluster"] && root["cluster"].IsMap()) relink(root["cluster"]["calibration"]);
  YAML::Emitter out;
  out << root;
  return fmt::format("# Written by shardscope tune from {} for {} GPUs (global batch {}): the fastest of {} candidates\n"
                     "# that fits, never retries an allocation and passes the check.\n"
                     "# {}\n"
                     "# Predicted: {:.1f} ms per step, {:.0f} tokens/s per GPU, MFU {:.3f} ({}), peak reserved {:.2f} GiB.\n"
                     "{}\n",
                     result.plan_path, result.gpus, result.global_batch, result.candidates.size(), best.label,
                     static_cast<double>(best.step_ns) * 1e-6, best.tokens_per_second_per_gpu, best.mfu,
                     best.mfu_convention, static_cast<double>(best.peak_reserved_bytes) / kGiB, out.c_str());
}

}  // namespace shardscope::sim

// The divergence: section (ranks that run a different plan than their peers: stragglers,
// per-rank sequence lengths, MoE routing imbalance, per-rank overrides) and WithRankVariant,
// which adds such ranks from code. Each variant is a whole plan re-read from the file with its
// keys merged in, so every check of a plan applies to it.
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "plan_parser.h"
#include "shardscope/base/rank_ranges.h"
#include "shardscope/sim/plan/plan.h"

namespace shardscope::sim::plan_internal {
namespace {

// Why ranks running `variant` cannot share a job with ranks running `base`, or nothing: the
// communicators are built once for the job, from the model, the world and the mesh.
std::optional<std::string> VariantIncompatibility(const Plan& base, const Plan& variant) {
  if (variant.strategy != base.strategy) return "the same strategy on every rank";
  if (variant.cluster.world_size() != base.cluster.world_size()) return "the same world size";
  if (variant.model.layers != base.model.layers || variant.model.experts != base.model.experts) {
    return "the same model on every rank";
  }
  if (variant.moe.expert_parallel != base.moe.expert_parallel) {
    return "the same moe.expert_parallel on every rank";
  }
  const auto same_mesh = [](const DataParallelMesh& a, const DataParallelMesh& b) {
    return a.replicate == b.replicate && a.shard == b.shard;
  };
  if (!same_mesh(variant.fsdp2.mesh, base.fsdp2.mesh) || !same_mesh(variant.fsdp1.mesh, base.fsdp1.mesh) ||
      IsHybrid(variant.fsdp1.sharding_strategy) != IsHybrid(base.fsdp1.sharding_strategy)) {
    return "the same device mesh on every rank (its process groups are created on all ranks)";
  }
  // reshard_after_forward=k all-gathers over groups of k ranks created for the job.
  const auto post_forward_group = [](const Plan& p) {
    return p.fsdp2.reshard_after_forward == ReshardAfterForward::kInt ? p.fsdp2.reshard_after_forward_size : 0;
  };
  if (post_forward_group(variant) != 0 && post_forward_group(variant) != post_forward_group(base)) {
    return "fsdp2.reshard_after_forward as an int only when the plan itself uses the same int (the "
           "post-forward groups are created for the job)";
  }
  return std::nullopt;
}

// One line for a YAML value in a description: the flow-style dump ("{backward_prefetch: 0}").
std::string FlowText(const YAML::Node& node) {
  YAML::Emitter out;
  out << YAML::Flow << node;
  return out.c_str();
}

}  // namespace

Status PlanParser::ReadRankNumbers(const Entry& entry, std::string_view path, int32_t world_size,
                                   double min, double max,
                                   std::vector<std::pair<int32_t, Entry>>* out) const {
  if (!entry.value.IsMap()) {
    return Error(entry, path, fmt::format("a mapping of rank (0 to {}): value", world_size - 1));
  }
  for (const auto& pair : entry.value) {
    const Entry rank_entry{pair.first.IsScalar() ? pair.first.Scalar() : std::string(), pair.first,
                           pair.first};
    int64_t rank = 0;
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadInt(rank_entry, fmt::format("{} (rank)", path), 0, world_size - 1, &rank));
    const Entry value_entry{rank_entry.key, pair.first, pair.second};
    double value = 0;
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadNumber(value_entry, JoinPath(path, rank_entry.key), min, true, max, &value));
    for (const auto& [seen, first] : *out) {
      if (seen == rank) {
        return Error(pair.first.Mark(), JoinPath(path, rank_entry.key), "each rank at most once",
                     fmt::format("a duplicate (first at line {})", first.key_node.Mark().line + 1));
      }
    }
    out->emplace_back(static_cast<int32_t>(rank), value_entry);
  }
  return Status::Ok();
}

Status PlanParser::ReadDivergence(const Entry& entry, const std::string& text, Plan* plan) const {
  SHARDSCOPE_ASSIGN_OR_RETURN(Fields fields,
                              ReadMapping(entry.value, MarkOf(entry), "divergence", kDivergenceKeys));
  const int32_t world = plan->cluster.world_size();

  std::vector<std::pair<int32_t, Entry>> slowdowns;
  if (const Entry* e = fields.Find("slowdown")) {
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadRankNumbers(*e, "divergence.slowdown", world, 0, kMaxRankSlowdown, &slowdowns));
  }
  for (const auto& [rank, value_entry] : slowdowns) {
    double factor = 0;
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadNumber(value_entry, "divergence.slowdown", 0, true, kMaxRankSlowdown, &factor));
    plan->divergence.slowdown[rank] = factor;
  }

  // What each rank runs differently: its sequence length node, its expert load, its override.
  struct RankChange {
    const YAML::Node* seq_len = nullptr;
    int64_t seq_len_value = 0;
    double moe_load = 1;
    int32_t override_index = -1;
  };
  std::map<int32_t, RankChange> changes;

  std::vector<std::pair<int32_t, Entry>> seq_lens;
  if (const Entry* e = fields.Find("seq_len")) {
    if (!e->value.IsMap()) {
      return Error(*e, "divergence.seq_len", fmt::format("a mapping of rank (0 to {}): seq_len", world - 1));
    }
    for (const auto& pair : e->value) {
      const Entry rank_entry{pair.first.IsScalar() ? pair.first.Scalar() : std::string(), pair.first, pair.first};
      int64_t rank = 0;
      SHARDSCOPE_RETURN_IF_ERROR(ReadInt(rank_entry, "divergence.seq_len (rank)", 0, world - 1, &rank));
      if (changes.count(static_cast<int32_t>(rank)) != 0) {
        return Error(pair.first.Mark(), JoinPath("divergence.seq_len", rank_entry.key), "each rank at most once",
                     "a duplicate");
      }
      seq_lens.emplace_back(static_cast<int32_t>(rank), Entry{rank_entry.key, pair.first, pair.second});
      RankChange& change = changes[static_cast<int32_t>(rank)];
      int64_t value = 0;
      // The full check (positions, activation limits) runs when the variant is read.
      SHARDSCOPE_RETURN_IF_ERROR(ReadInt(seq_lens.back().second, JoinPath("divergence.seq_len", rank_entry.key), 1,
                                         int64_t{1} << 40, &value));
      change.seq_len_value = value;
    }
    for (auto& [rank, value_entry] : seq_lens) changes[rank].seq_len = &value_entry.value;
  }

  if (const Entry* e = fields.Find("moe_load")) {
    // Routing moves work between ranks only when experts live on different ranks
    // (torchtitan ExpertParallel: tokens go to the rank holding their expert).
    if (plan->moe.expert_parallel <= 1 || plan->model.experts <= 1) {
      return KeyError(*e, "divergence.moe_load",
                      "moe_load only with experts split over ranks (moe.expert_parallel > 1): without "
                      "expert parallelism every rank runs all experts on its own tokens",
                      plan->model.experts <= 1 ? "a dense model" : "moe.expert_parallel 1");
    }
    std::vector<std::pair<int32_t, Entry>> loads;
    SHARDSCOPE_RETURN_IF_ERROR(ReadRankNumbers(*e, "divergence.moe_load", world, 0, kMaxMoeLoad, &loads));
    for (const auto& [rank, value_entry] : loads) {
      SHARDSCOPE_RETURN_IF_ERROR(ReadNumber(value_entry, JoinPath("divergence.moe_load", value_entry.key), 0, true,
                                            kMaxMoeLoad, &changes[rank].moe_load));
    }
  }

  std::vector<Fields> overrides;
  if (const Entry* e = fields.Find("overrides")) {
    if (!e->value.IsSequence()) {
      return Error(*e, "divergence.overrides",
                   "a list of mappings, each with 'ranks' and the sections those ranks run differently");
    }
    for (size_t i = 0; i < e->value.size(); ++i) {
      const YAML::Node item = e->value[i];
      const std::string path = fmt::format("divergence.overrides[{}]", i);
      SHARDSCOPE_ASSIGN_OR_RETURN(Fields item_fields, ReadMapping(item, item.Mark(), path, kOverrideKeys));
      SHARDSCOPE_RETURN_IF_ERROR(Require(item_fields, path, "ranks", "a rank or a list of ranks"));
      const Entry& ranks_entry = *item_fields.Find("ranks");
      std::vector<YAML::Node> rank_nodes;
      if (ranks_entry.value.IsSequence()) {
        for (const auto& node : ranks_entry.value) rank_nodes.push_back(node);
      } else {
        rank_nodes.push_back(ranks_entry.value);
      }
      if (rank_nodes.empty()) return Error(ranks_entry, JoinPath(path, "ranks"), "at least one rank");
      for (const YAML::Node& node : rank_nodes) {
        int64_t rank = 0;
        SHARDSCOPE_RETURN_IF_ERROR(ReadInt(Entry{"ranks", ranks_entry.key_node, node}, JoinPath(path, "ranks"), 0,
                                           world - 1, &rank));
        RankChange& change = changes[static_cast<int32_t>(rank)];
        if (change.override_index >= 0) {
          return Error(node.Mark(), JoinPath(path, "ranks"), "each rank in at most one override",
                       fmt::format("rank {} (already in divergence.overrides[{}])", rank, change.override_index));
        }
        change.override_index = static_cast<int32_t>(i);
      }
      // Only the chosen strategy's section, as at the top level.
      std::string_view own_section;
      for (const StrategySection& candidate : kStrategySections) {
        if (candidate.strategy == plan->strategy) own_section = candidate.section;
      }
      for (const Entry& section : item_fields.entries) {
        if (section.key == "ranks") continue;
        for (const StrategySection& candidate : kStrategySections) {
          if (candidate.section != section.key || section.key == own_section) continue;
          return Error(section.key_node.Mark(), JoinPath(path, section.key),
                       fmt::format("only the '{}' section among the strategy sections", own_section),
                       fmt::format("section '{}' but strategy is {}", section.key, StrategyName(plan->strategy)));
        }
        if (!section.value.IsMap()) {
          return Error(section, JoinPath(path, section.key), "a mapping of that section's keys");
        }
      }
      overrides.push_back(std::move(item_fields));
    }
  }

  // Ranks with the same change run the same variant: group them (map order: deterministic).
  std::map<std::tuple<int32_t, int64_t, double>, std::vector<int32_t>> groups;
  for (const auto& [rank, change] : changes) {
    groups[{change.override_index, change.seq_len_value, change.moe_load}].push_back(rank);
  }
  std::vector<RankVariant> variants;
  for (const auto& [key, ranks] : groups) {
    const RankChange& change = changes.at(ranks.front());
    // The plan text again, with the variant's keys merged into their sections.
    YAML::Node doc = YAML::Load(text);
    doc.remove("divergence");
    std::vector<std::string> described;
    if (change.override_index >= 0) {
      for (const Entry& section : overrides[static_cast<size_t>(change.override_index)].entries) {
        if (section.key == "ranks") continue;
        // Key by key into the section (created when the plan has none): the override's own
        // nodes are shared, never modified, so ranks with other seq_lens read them intact.
        if (!doc[section.key].IsMap()) doc[section.key] = YAML::Node(YAML::NodeType::Map);
        YAML::Node target = doc[section.key];
        for (const auto& pair : section.value) {
          // Looked up through a const view: a non-const operator[] would add the key.
          if (std::as_const(target)[pair.first.Scalar()]) {
            target[pair.first.Scalar()] = pair.second;
          } else {
            // The override's own key node: errors about it point at the override's line.
            target.force_insert(pair.first, pair.second);
          }
        }
        described.push_back(fmt::format("{} {}", section.key, FlowText(section.value)));
      }
    }
    if (change.seq_len != nullptr) {
      doc["training"]["seq_len"] = *change.seq_len;
      described.push_back(fmt::format("training.seq_len {}", change.seq_len_value));
    }
    SHARDSCOPE_ASSIGN_OR_RETURN(Plan variant, ParseRoot(doc, std::string()));
    variant.moe.rank_load = change.moe_load;
    if (change.moe_load != 1) described.push_back(fmt::format("moe_load {:g}", change.moe_load));
    if (std::optional<std::string> why = VariantIncompatibility(*plan, variant)) {
      return Error(MarkOf(entry), "divergence", *why,
                   fmt::format("ranks {} run {}", CompressRanks(ranks), JoinNames(described)));
    }
    if (described.empty()) continue;  // e.g. moe_load: {3: 1}: the rank runs the plan
    std::string description;
    for (const std::string& part : described) description += (description.empty() ? "" : ", ") + part;
    variants.push_back(RankVariant{ranks, std::move(description), std::make_shared<const Plan>(std::move(variant))});
  }
  std::sort(variants.begin(), variants.end(),
            [](const RankVariant& a, const RankVariant& b) { return a.ranks.front() < b.ranks.front(); });
  plan->divergence.variants = std::move(variants);
  return Status::Ok();
}

}  // namespace shardscope::sim::plan_internal

namespace shardscope::sim {

using plan_internal::VariantIncompatibility;

Plan WithoutDivergence(const Plan& plan) {
  Plan uniform = plan;
  uniform.divergence = DivergenceConfig{};
  return uniform;
}

StatusOr<Plan> WithRankVariant(const Plan& plan, std::vector<int32_t> ranks, Plan variant,
                               std::string description) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  const int32_t world = plan.cluster.world_size();
  if (ranks.empty() || ranks.front() < 0 || ranks.back() >= world) {
    return Status::InvalidInput(fmt::format("{}: a rank variant needs ranks in 0..{}", plan.source, world - 1));
  }
  if (std::optional<std::string> why = VariantIncompatibility(plan, variant)) {
    return Status::InvalidInput(
        fmt::format("{}: ranks {} run {}: expected {}", plan.source, CompressRanks(ranks), description, *why));
  }
  Plan out = plan;
  // The ranks leave the variants they were in; emptied variants go.
  std::vector<RankVariant> kept;
  for (RankVariant& existing : out.divergence.variants) {
    std::erase_if(existing.ranks, [&](int32_t r) { return std::binary_search(ranks.begin(), ranks.end(), r); });
    if (!existing.ranks.empty()) kept.push_back(std::move(existing));
  }
  variant.divergence = DivergenceConfig{};
  kept.push_back(RankVariant{std::move(ranks), std::move(description), std::make_shared<const Plan>(std::move(variant))});
  std::sort(kept.begin(), kept.end(),
            [](const RankVariant& a, const RankVariant& b) { return a.ranks.front() < b.ranks.front(); });
  out.divergence.variants = std::move(kept);
  return out;
}

}  // namespace shardscope::sim

// The search's candidates (tune_candidates.h).
#include "tune_candidates.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace shardscope::sim::tune_internal {
namespace {

// The settings each searched knob takes. Sources: PyTorch's and DeepSpeed's defaults and the
// values their docs suggest trying; they span the knob, none is a tuned figure.
constexpr int32_t kFsdp2Prefetch[][2] = {{0, 1}, {1, 2}};  // (forward, backward) units: FSDP2's default, one more each way
constexpr int32_t kFsdp2BlocksPerUnit[] = {1, 2};          // fully_shard per block, per pair of blocks
constexpr double kDdpBucketMb[] = {25, 100};               // DDP's default bucket_cap_mb, and 4x
constexpr double kZeroBucketElements[] = {2e8, 5e8};       // ZeRO-1/2 reduce/allgather bucket: DeepSpeed's 5e8 default, and less
constexpr double kZero3PrefetchElements[] = {5e7, 2e8};    // stage3_prefetch_bucket_size: DeepSpeed's 5e7 default, and 4x
constexpr const char* kCheckpointing[] = {"none", "selective_op", "selective", "full"};
constexpr int32_t kSelectiveEvery = 2;                     // torchtitan's selective_ac_option default "2"

const char* Fsdp1Sharding(bool reshard, bool hybrid) {
  if (hybrid) return reshard ? "HYBRID_SHARD" : "_HYBRID_SHARD_ZERO2";
  return reshard ? "FULL_SHARD" : "SHARD_GRAD_OP";
}

}  // namespace

StatusOr<SearchBase> LoadSearchBase(const std::string& path, const TuneOptions& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::InvalidInput(fmt::format("{}: cannot open the plan", path));
  std::stringstream text;
  text << in.rdbuf();
  return SearchBaseOf(text.str(), path, options);
}

StatusOr<SearchBase> SearchBaseOf(std::string_view text, const std::string& path, const TuneOptions& options) {
  SearchBase base;
  base.path = path;
  SHARDSCOPE_ASSIGN_OR_RETURN(base.plan, ParsePlan(text, path));
  try {
    base.yaml = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return Status::InvalidInput(fmt::format("{}: {}", path, e.what()));
  }
  // The search rewrites the strategy, its section and the batch; a plan that takes them from
  // a framework's config would have them fixed by that file.
  if (base.yaml["torchtitan"]) {
    return Status::InvalidInput(fmt::format(
        "{}: torchtitan.job_config: tune changes the strategy, its section and the training keys, which this plan "
        "takes from the torchtitan job config; write them into the plan (`shardscope schedule` shows what they resolve "
        "to) and tune that",
        path));
  }
  if (base.yaml["zero"] && base.yaml["zero"].IsMap() && base.yaml["zero"]["deepspeed_config"]) {
    return Status::InvalidInput(fmt::format(
        "{}: zero.deepspeed_config: tune changes the strategy, its section and the batch, which this plan takes "
        "from the DeepSpeed config; write them into the plan and tune that",
        path));
  }
  if (options.gpus <= 0) return Status::InvalidInput(fmt::format("--gpus: expected a positive GPU count, got {}", options.gpus));
  const int32_t per_node = base.plan.cluster.gpus_per_node;
  if (options.gpus % per_node == 0) {
    base.nodes = options.gpus / per_node;
    base.gpus_per_node = per_node;
  } else if (options.gpus < per_node) {
    base.nodes = 1;
    base.gpus_per_node = options.gpus;
  } else {
    return Status::InvalidInput(fmt::format("--gpus {}: expected a multiple of the {} GPUs per node of {}'s cluster",
                                            options.gpus, per_node, path));
  }
  base.gpus = options.gpus;
  const int64_t plan_world = base.plan.cluster.world_size();
  base.global_batch = options.global_batch > 0 ? options.global_batch
                                               : base.plan.training.micro_batch_size * base.plan.training.grad_accum_steps * plan_world;
  if (base.global_batch % base.gpus != 0) {
    return Status::InvalidInput(fmt::format(
        "--global-batch: {} sequences per step{} do not split over {} GPUs; give --global-batch a multiple of {}",
        base.global_batch,
        options.global_batch > 0 ? ""
                                 : fmt::format(" (the plan's {} x {} x {} GPUs)", base.plan.training.micro_batch_size,
                                               base.plan.training.grad_accum_steps, plan_world),
        base.gpus, base.gpus));
  }
  base.per_rank_batch = base.global_batch / base.gpus;
  if (!options.space.micro_batch && base.per_rank_batch % base.plan.training.micro_batch_size != 0) {
    return Status::InvalidInput(fmt::format(
        "--search without micro_batch keeps micro_batch_size {}, which does not divide the {} sequences per GPU",
        base.plan.training.micro_batch_size, base.per_rank_batch));
  }
  return base;
}

std::vector<TuneKnobs> EnumerateKnobs(const SearchBase& base, const TuneSpace& space, int64_t max_micro_batch) {
  const Plan& plan = base.plan;
  const int32_t world = base.gpus;
  std::vector<std::string> strategies;
  if (space.strategy) {
    strategies = {"fsdp2", "fsdp1", "zero1", "zero2", "zero3", "ddp"};
  } else {
    strategies = {std::string(StrategyName(plan.strategy))};
  }
  // The training dimensions every strategy shares.
  std::vector<std::pair<int64_t, int32_t>> batches;  // (micro-batch size, accumulation)
  if (space.micro_batch) {
    for (int64_t m = 1; m <= std::min(base.per_rank_batch, max_micro_batch); ++m) {
      if (base.per_rank_batch % m == 0) batches.emplace_back(m, static_cast<int32_t>(base.per_rank_batch / m));
    }
  } else {
    batches.emplace_back(plan.training.micro_batch_size,
                         static_cast<int32_t>(base.per_rank_batch / plan.training.micro_batch_size));
  }
  std::vector<std::string> checkpointing;
  if (space.checkpointing) {
    checkpointing.assign(std::begin(kCheckpointing), std::end(kCheckpointing));
  } else {
    checkpointing = {std::string(CheckpointingName(plan.training.activation_checkpointing))};
  }
  std::vector<bool> compiles = space.compile ? std::vector<bool>{false, true} : std::vector<bool>{plan.training.compile};

  std::vector<TuneKnobs> out;
  const auto add_training = [&](TuneKnobs knobs) {
    for (const auto& [micro, accum] : batches) {
      for (const std::string& ac : checkpointing) {
        for (bool compile : compiles) {
          knobs.micro_batch_size = micro;
          knobs.grad_accum_steps = accum;
          knobs.checkpointing = ac;
          knobs.compile = compile;
          out.push_back(knobs);
        }
      }
    }
  };
  const bool multi_node = base.nodes > 1;
  for (const std::string& strategy : strategies) {
    const bool same = strategy == StrategyName(plan.strategy);
    TuneKnobs knobs;
    knobs.strategy = strategy;
    if (strategy == "fsdp2") {
      std::vector<int32_t> replicas;
      if (space.mesh) {
        replicas.push_back(1);
        for (int64_t shard = base.gpus_per_node; shard < world; shard *= 2) {
          if (world % shard == 0) replicas.push_back(static_cast<int32_t>(world / shard));
        }
      } else {
        replicas.push_back(same ? plan.fsdp2.mesh.replicate : 1);
      }
      std::vector<bool> reshards = space.reshard ? std::vector<bool>{true, false}
                                                 : std::vector<bool>{!same || plan.fsdp2.reshard_after_forward != ReshardAfterForward::kFalse};
      std::vector<std::pair<int32_t, int32_t>> prefetches;
      if (space.prefetch) {
        for (const auto& p : kFsdp2Prefetch) prefetches.emplace_back(p[0], p[1]);
      } else {
        prefetches.emplace_back(-1, -1);  // the plan's
      }
      std::vector<double> units;
      if (space.buckets && !(same && plan.fsdp2.root_only)) {
        units.assign(std::begin(kFsdp2BlocksPerUnit), std::end(kFsdp2BlocksPerUnit));
      } else {
        units.push_back(0);
      }
      for (int32_t replicate : replicas) {
        for (bool reshard : reshards) {
          for (const auto& [forward, backward] : prefetches) {
            for (double unit : units) {
              knobs.replicate = replicate;
              knobs.reshard = reshard;
              knobs.forward_prefetch = forward;
              knobs.backward_prefetch = backward;
              knobs.bucket = unit;
              add_training(knobs);
            }
          }
        }
      }
    } else if (strategy == "fsdp1") {
      const bool fairscale = same && plan.fsdp1.implementation == Fsdp1Implementation::kFairscale;
      std::vector<std::string> shardings;
      if (!space.reshard && !space.mesh && same) {
        shardings.emplace_back(Fsdp1ShardingStrategyName(plan.fsdp1.sharding_strategy));
      } else {
        const Fsdp1ShardingStrategy own = same ? plan.fsdp1.sharding_strategy : Fsdp1ShardingStrategy::kFullShard;
        const bool own_reshard = own != Fsdp1ShardingStrategy::kShardGradOp && own != Fsdp1ShardingStrategy::kHybridShardZero2;
        const bool own_hybrid = own == Fsdp1ShardingStrategy::kHybridShard || own == Fsdp1ShardingStrategy::kHybridShardZero2;
        const std::vector<bool> reshards = space.reshard ? std::vector<bool>{true, false} : std::vector<bool>{own_reshard};
        std::vector<bool> hybrids = space.mesh ? std::vector<bool>{false, true} : std::vector<bool>{own_hybrid};
        for (bool hybrid : hybrids) {
          if (hybrid && (fairscale || !multi_node)) continue;  // fairscale has no hybrid mode; one node has no inter-node group
          for (bool reshard : reshards) shardings.push_back(Fsdp1Sharding(reshard, hybrid));
        }
      }
      std::vector<int32_t> prefetches = space.prefetch && !fairscale ? std::vector<int32_t>{0, 1} : std::vector<int32_t>{-1};
      for (const std::string& sharding : shardings) {
        for (int32_t prefetch : prefetches) {
          knobs.fsdp1_sharding = sharding;
          knobs.backward_prefetch = prefetch;
          knobs.forward_prefetch = -1;
          knobs.reshard = sharding == "FULL_SHARD" || sharding == "HYBRID_SHARD";
          add_training(knobs);
        }
      }
    } else {
      std::vector<double> buckets;
      if (space.buckets) {
        if (strategy == "ddp") buckets.assign(std::begin(kDdpBucketMb), std::end(kDdpBucketMb));
        if (strategy == "zero1" || strategy == "zero2") {
          buckets.assign(std::begin(kZeroBucketElements), std::end(kZeroBucketElements));
        }
        if (strategy == "zero3") buckets.assign(std::begin(kZero3PrefetchElements), std::end(kZero3PrefetchElements));
      } else {
        buckets.push_back(0);
      }
      for (double bucket : buckets) {
        knobs.bucket = bucket;
        add_training(knobs);
      }
    }
  }
  return out;
}

std::string CandidateYaml(const SearchBase& base, const TuneKnobs& knobs) {
  YAML::Node root = YAML::Clone(base.yaml);
  root.remove("expect");  // what the input plan's example expects says nothing of a candidate
  // The cluster for `gpus`.
  if (root["cluster"].IsScalar()) {
    const std::string preset = root["cluster"].as<std::string>();
    YAML::Node cluster;
    cluster["preset"] = preset;
    root["cluster"] = cluster;
  }
  root["cluster"]["nodes"] = base.nodes;
  if (base.gpus_per_node != base.plan.cluster.gpus_per_node) root["cluster"]["gpus_per_node"] = base.gpus_per_node;

  const bool same = knobs.strategy == StrategyName(base.plan.strategy);
  root["strategy"] = knobs.strategy;
  const char* section = knobs.strategy == "fsdp2" ? "fsdp2" : knobs.strategy == "fsdp1" ? "fsdp1"
                        : knobs.strategy == "ddp" ? "ddp" : "zero";
  for (const char* other : {"fsdp2", "fsdp1", "zero", "ddp"}) {
    if (std::string(other) != section || !same) root.remove(other);
  }
  if (!root[section] || !root[section].IsMap()) root[section] = YAML::Node(YAML::NodeType::Map);
  YAML::Node s = root[section];
  if (knobs.strategy == "fsdp2") {
    YAML::Node mesh(YAML::NodeType::Map);
    mesh["replicate"] = knobs.replicate;
    s["mesh"] = mesh;
    s["reshard_after_forward"] = knobs.reshard;
    if (knobs.forward_prefetch >= 0) s["forward_prefetch"] = knobs.forward_prefetch;
    if (knobs.backward_prefetch >= 0) s["backward_prefetch"] = knobs.backward_prefetch;
    if (knobs.bucket > 0) s["blocks_per_unit"] = static_cast<int64_t>(knobs.bucket);
  } else if (knobs.strategy == "fsdp1") {
    s["sharding_strategy"] = knobs.fsdp1_sharding;
    s.remove("reshard_after_forward");  // fairscale's spelling of the same choice: one of the two
    if (knobs.fsdp1_sharding.find("HYBRID") == std::string::npos) s.remove("mesh");  // only hybrid strategies take one
    if (knobs.backward_prefetch >= 0) s["backward_prefetch"] = knobs.backward_prefetch == 0 ? "BACKWARD_PRE" : "BACKWARD_POST";
  } else if (knobs.strategy == "ddp") {
    if (knobs.bucket > 0) s["bucket_cap_mb"] = knobs.bucket;
  } else if (knobs.bucket > 0) {
    if (knobs.strategy == "zero3") {
      s["stage3_prefetch_bucket_size"] = static_cast<int64_t>(knobs.bucket);
    } else {
      s["reduce_bucket_size"] = static_cast<int64_t>(knobs.bucket);
      s["allgather_bucket_size"] = static_cast<int64_t>(knobs.bucket);
    }
  }
  if (s.size() == 0) root.remove(section);

  YAML::Node training = root["training"];
  if (!training || !training.IsMap()) {
    root["training"] = YAML::Node(YAML::NodeType::Map);
    training = root["training"];
  }
  training["micro_batch_size"] = knobs.micro_batch_size;
  training["grad_accum_steps"] = knobs.grad_accum_steps;
  training["activation_checkpointing"] = knobs.checkpointing;
  if (knobs.checkpointing == "selective") {
    if (!training["selective_ac_every"] || CheckpointingName(base.plan.training.activation_checkpointing) != "selective") {
      training["selective_ac_every"] = kSelectiveEvery;
    }
  } else {
    training.remove("selective_ac_every");  // the loader refuses it with the other modes
  }
  training["compile"] = knobs.compile;
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str()) + "\n";
}

std::string KnobsFamily(const TuneKnobs& knobs, int32_t gpus) {
  if (knobs.strategy == "fsdp2") {
    if (knobs.replicate <= 1) return "fsdp2";
    return fmt::format("fsdp2 HSDP {}x{}", knobs.replicate, gpus / knobs.replicate);
  }
  if (knobs.strategy == "fsdp1") return "fsdp1 " + knobs.fsdp1_sharding;
  return knobs.strategy;
}

std::string KnobsLabel(const TuneKnobs& knobs, int32_t gpus) {
  std::string label = KnobsFamily(knobs, gpus);
  if (knobs.strategy == "fsdp2") {
    label += knobs.reshard ? ", reshard" : ", no reshard";
    if (knobs.forward_prefetch >= 0) label += fmt::format(", prefetch {}/{}", knobs.forward_prefetch, knobs.backward_prefetch);
    if (knobs.bucket > 0) label += fmt::format(", {} block(s)/unit", static_cast<int64_t>(knobs.bucket));
  } else if (knobs.strategy == "fsdp1") {
    if (knobs.backward_prefetch >= 0) label += knobs.backward_prefetch == 0 ? ", BACKWARD_PRE" : ", BACKWARD_POST";
  } else if (knobs.strategy == "ddp") {
    if (knobs.bucket > 0) label += fmt::format(", bucket {:g} MB", knobs.bucket);
  } else if (knobs.bucket > 0) {
    label += fmt::format(", {} {:g}", knobs.strategy == "zero3" ? "prefetch bucket" : "bucket", knobs.bucket);
  }
  label += fmt::format(", mbs {} x {}, ac {}{}", knobs.micro_batch_size, knobs.grad_accum_steps, knobs.checkpointing,
                       knobs.compile ? ", compile" : "");
  return label;
}

}  // namespace shardscope::sim::tune_internal

// Merging the framework config files a plan names (model.hf_config, zero.deepspeed_config,
// torchtitan.job_config; read by the readers of plan_sources.h) into the plan's YAML tree
// before it is read, and finishing what needs the model or the world size: DeepSpeed's batch
// rules and "auto" sizes, torchtitan's gradient accumulation. Merged values remember where
// they came from, so errors about them point at the config file (PlanParser::OriginOf).
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "plan_parser.h"

namespace shardscope::sim::plan_internal {
namespace {

// The entry of `key` in the mapping `map`, if there is one (read without operator[], which
// would add the key to a non-const node).
std::optional<Entry> FindEntry(const YAML::Node& map, std::string_view key) {
  if (!map.IsMap()) return std::nullopt;
  for (const auto& pair : map) {
    if (pair.first.IsScalar() && pair.first.Scalar() == key) {
      return Entry{std::string(key), pair.first, pair.second};
    }
  }
  return std::nullopt;
}

// Whether a plan scalar says what a config file's value says: the same text, the same number
// (5e8 and 500000000) or the same boolean.
bool SameValue(const YAML::Node& node, std::string_view value) {
  if (!node.IsScalar() || IsQuoted(node)) return node.IsScalar() && node.Scalar() == value;
  const std::string& text = node.Scalar();
  if (text == value) return true;
  if (std::optional<bool> flag = AsBool(node)) {
    return (value == "true" && *flag) || (value == "false" && !*flag);
  }
  double a = 0, b = 0;
  const auto [aend, aec] = std::from_chars(text.data(), text.data() + text.size(), a);
  const auto [bend, bec] = std::from_chars(value.data(), value.data() + value.size(), b);
  return aec == std::errc() && bec == std::errc() && aend == text.data() + text.size() &&
         bend == value.data() + value.size() && a == b;
}

// The file named in an origin ("ds_config.json:4:3 (key)" -> "ds_config.json").
std::string_view OriginFile(std::string_view origin) {
  const size_t space = origin.find(" (");
  std::string_view where = origin.substr(0, space);
  for (int i = 0; i < 2; ++i) {
    const size_t colon = where.rfind(':');
    if (colon == std::string_view::npos) break;
    const std::string_view tail = where.substr(colon + 1);
    if (tail.empty() || tail.find_first_not_of("0123456789") != std::string_view::npos) break;
    where = where.substr(0, colon);
  }
  return where;
}

}  // namespace

const std::string* PlanParser::OriginOf(std::string_view path) const {
  if (auto it = origins_.find(path); it != origins_.end()) return &it->second;
  // The section holding the value ("fsdp2.mesh" for "fsdp2.mesh.shard")...
  std::string_view prefix = path;
  while (true) {
    const size_t dot = prefix.rfind('.');
    if (dot == std::string_view::npos) break;
    prefix = prefix.substr(0, dot);
    if (auto it = origins_.find(prefix); it != origins_.end()) return &it->second;
  }
  // ...or a value in the section the error is about ("training" for "training.dtype").
  const std::string inside = fmt::format("{}.", path);
  for (auto it = origins_.lower_bound(inside); it != origins_.end(); ++it) {
    if (it->first.rfind(inside, 0) != 0) break;
    return &it->second;
  }
  return nullptr;
}

StatusOr<std::string> PlanParser::ReadSourceFile(const Entry& entry, std::string_view path,
                                                 std::string_view what,
                                                 std::string* resolved) const {
  std::string name;
  SHARDSCOPE_RETURN_IF_ERROR(ReadString(entry, path, fmt::format("the path of {}", what), &name));
  // Relative to the plan's folder, so a plan and its configs move together.
  std::filesystem::path file(name);
  if (file.is_relative() && !source_.empty() && source_.front() != '<') {
    file = std::filesystem::path(source_).parent_path() / file;
  }
  *resolved = file.string();
  StatusOr<std::string> text = ReadConfigFile(*resolved);
  if (!text.ok()) return Error(MarkOf(entry), path, fmt::format("a readable {}", what), text.status().message());
  return text;
}

Status PlanParser::MergeSetting(YAML::Node root, const PlanSetting& setting,
                                bool plan_wins) const {
  std::vector<std::string> parts;
  for (size_t begin = 0; begin <= setting.path.size();) {
    const size_t dot = std::min(setting.path.find('.', begin), setting.path.size());
    parts.push_back(setting.path.substr(begin, dot - begin));
    begin = dot + 1;
  }
  // Down the sections, creating the missing ones. Nodes are passed on by copy construction:
  // yaml-cpp's Node::operator= would overwrite the node it refers to.
  std::vector<YAML::Node> chain{root};
  std::string walked;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    walked = walked.empty() ? parts[i] : fmt::format("{}.{}", walked, parts[i]);
    const YAML::Node& parent = chain.back();
    std::optional<Entry> child = FindEntry(parent, parts[i]);
    if (!child) {
      YAML::Node created(YAML::NodeType::Map);
      YAML::Node parent_handle(parent);
      parent_handle[parts[i]] = created;
      chain.push_back(created);
      continue;
    }
    if (!child->value.IsMap()) {
      if (plan_wins) return Status::Ok();
      return Error(MarkOf(*child), walked,
                   fmt::format("a mapping: {} sets {} here", setting.origin, setting.path),
                   Describe(child->value));
    }
    chain.push_back(child->value);
  }
  YAML::Node parent(chain.back());
  const std::string& leaf = parts.back();
  if (std::optional<Entry> existing = FindEntry(parent, leaf)) {
    if (plan_wins || SameValue(existing->value, setting.value)) return Status::Ok();
    return Error(MarkOf(*existing), setting.path,
                 fmt::format("{} as {} sets it, or no {} here (the plan and {} disagree: set "
                             "it in one place)",
                             setting.value, setting.origin, leaf, OriginFile(setting.origin)),
                 Describe(existing->value));
  }
  parent[leaf] = setting.value;
  origins_[setting.path] = setting.origin;
  return Status::Ok();
}

StatusOr<PlanParser::PendingSources> PlanParser::ReadSources(YAML::Node root) const {
  PendingSources pending;
  if (!root.IsMap()) return pending;

  // model: {hf_config: config.json, <keys that override it>}
  if (std::optional<Entry> model = FindEntry(root, "model"); model && model->value.IsMap()) {
    if (std::optional<Entry> hf = FindEntry(model->value, "hf_config")) {
      if (std::optional<Entry> preset = FindEntry(model->value, "preset")) {
        return KeyError(*preset, "model.preset",
                        "no preset beside hf_config (the config file describes the model)",
                        "both preset and hf_config");
      }
      std::string file;
      SHARDSCOPE_ASSIGN_OR_RETURN(
          std::string text,
          ReadSourceFile(*hf, "model.hf_config", "Hugging Face config.json", &file));
      SHARDSCOPE_ASSIGN_OR_RETURN(HfModelSettings hf_settings, ReadHfConfig(text, file));
      YAML::Node(model->value).remove("hf_config");
      // The plan's own model keys beside hf_config override the file's.
      for (const PlanSetting& setting : hf_settings.model) {
        SHARDSCOPE_RETURN_IF_ERROR(MergeSetting(root, setting, /*plan_wins=*/true));
      }
      pending.sliding_window = hf_settings.sliding_window;
      pending.sliding_window_origin = hf_settings.sliding_window_origin;
    }
  }

  // zero: {deepspeed_config: ds_config.json, <keys that must agree with it>}
  if (std::optional<Entry> zero = FindEntry(root, "zero"); zero && zero->value.IsMap()) {
    if (std::optional<Entry> ds = FindEntry(zero->value, "deepspeed_config")) {
      SHARDSCOPE_ASSIGN_OR_RETURN(
          std::string text, ReadSourceFile(*ds, "zero.deepspeed_config", "DeepSpeed JSON config",
                                           &pending.deepspeed_file));
      SHARDSCOPE_ASSIGN_OR_RETURN(pending.deepspeed_settings,
                                  ReadDeepSpeedConfig(text, pending.deepspeed_file));
      YAML::Node(zero->value).remove("deepspeed_config");
      pending.deepspeed = true;
      const std::optional<Entry> training = FindEntry(root, "training");
      auto plan_gives = [&](std::string_view key) {
        return training && FindEntry(training->value, key).has_value();
      };
      for (const PlanSetting& setting : pending.deepspeed_settings.settings) {
        if (setting.value != "auto") {
          SHARDSCOPE_RETURN_IF_ERROR(MergeSetting(root, setting, /*plan_wins=*/false));
        } else if (setting.path == "training.dtype" && !plan_gives("dtype")) {
          // transformers' HfTrainerDeepSpeedConfig fills fp16/bf16 "enabled" from
          // TrainingArguments --fp16 / --bf16 (default off); the plan's training section
          // plays TrainingArguments' part and must say which.
          return Status::InvalidInput(fmt::format(
              "{}: training.dtype: expected the plan's training.dtype (\"auto\" is filled from "
              "the Hugging Face Trainer's --bf16 / --fp16; give it in the plan), got nothing",
              setting.origin));
        } else if (setting.path.rfind("zero.", 0) == 0) {
          pending.auto_sizes.push_back(setting);
        }
        // training.max_grad_norm "auto": the plan's value (TrainingArguments.max_grad_norm and
        // the plan both default to 1.0).
      }
      const DeepSpeedBatchValue& micro = pending.deepspeed_settings.micro_batch;
      if (micro.is_auto && !plan_gives("micro_batch_size")) {
        return Status::InvalidInput(fmt::format(
            "{}: training.micro_batch_size: expected the plan's training.micro_batch_size "
            "(\"auto\" is filled from the Hugging Face Trainer's per_device_train_batch_size, "
            "default 8; give it in the plan), got nothing",
            micro.origin));
      }
    }
  }

  // torchtitan: {job_config: llama3_8b.toml}
  if (std::optional<Entry> titan = FindEntry(root, "torchtitan")) {
    static constexpr std::array<std::string_view, 1> kTorchtitanKeys = {"job_config"};
    SHARDSCOPE_ASSIGN_OR_RETURN(
        Fields fields, ReadMapping(titan->value, MarkOf(*titan), "torchtitan", kTorchtitanKeys));
    SHARDSCOPE_RETURN_IF_ERROR(
        Require(fields, "torchtitan", "job_config", "the path of a torchtitan TOML job config"));
    std::string file;
    SHARDSCOPE_ASSIGN_OR_RETURN(std::string text,
                                ReadSourceFile(*fields.Find("job_config"), "torchtitan.job_config",
                                               "torchtitan TOML job config", &file));
    SHARDSCOPE_ASSIGN_OR_RETURN(pending.torchtitan_settings, ReadTorchtitanConfig(text, file));
    root.remove("torchtitan");
    pending.torchtitan = true;
    const TorchtitanSettings& settings = pending.torchtitan_settings;
    if (!settings.unmapped_model.empty() && !FindEntry(root, "model")) {
      return Status::InvalidInput(fmt::format(
          "{}: model: expected a plan preset for torchtitan's {} (llama3 8B / 70B, llama2 13B "
          "/ 70B have one), or the plan's own model describing it, got neither",
          settings.unmapped_model_origin, settings.unmapped_model));
    }
    for (const PlanSetting& setting : settings.settings) {
      SHARDSCOPE_RETURN_IF_ERROR(MergeSetting(root, setting, /*plan_wins=*/false));
    }
  }
  return pending;
}

Status PlanParser::ApplyPendingSources(const PendingSources& pending, YAML::Node root,
                                       const Plan& plan) const {
  const int64_t world = plan.cluster.world_size();
  const std::optional<Entry> training = FindEntry(root, "training");
  // The plan's own integer at training.<key>, if it gives one.
  auto plan_int = [&](std::string_view key, int64_t max, std::optional<int64_t>* out) -> Status {
    if (!training) return Status::Ok();
    std::optional<Entry> entry = FindEntry(training->value, key);
    if (!entry) return Status::Ok();
    int64_t value = 0;
    SHARDSCOPE_RETURN_IF_ERROR(ReadInt(*entry, JoinPath("training", key), 1, max, &value));
    *out = value;
    return Status::Ok();
  };

  if (pending.deepspeed) {
    // transformers HfTrainerDeepSpeedConfig.trainer_config_finalize: reduce_bucket_size =
    // hidden^2; at stage 3 stage3_prefetch_bucket_size = int(0.9 hidden^2) and
    // stage3_param_persistence_threshold = 10 hidden.
    const int64_t h = plan.model.hidden;
    for (const PlanSetting& setting : pending.auto_sizes) {
      int64_t value = h * h;
      if (setting.path == "zero.stage3_prefetch_bucket_size") {
        value = static_cast<int64_t>(0.9 * static_cast<double>(h) * static_cast<double>(h));
      } else if (setting.path == "zero.stage3_param_persistence_threshold") {
        value = 10 * h;
      }
      SHARDSCOPE_RETURN_IF_ERROR(MergeSetting(
          root,
          PlanSetting{setting.path, fmt::format("{}", value),
                      fmt::format("{} = \"auto\", from model.hidden {} as the Hugging Face "
                                  "Trainer fills it",
                                  setting.origin, h)},
          /*plan_wins=*/false));
    }

    // The batch: DeepSpeedConfig._set_batch_related_parameters, then _batch_assertion.
    // "auto" takes the plan's value (the Trainer fills it from TrainingArguments); an
    // "auto" train_batch_size is the product, as the Trainer fills it.
    const DeepSpeedSettings& ds = pending.deepspeed_settings;
    std::optional<int64_t> train, micro, accum, plan_micro, plan_accum;
    SHARDSCOPE_RETURN_IF_ERROR(plan_int("micro_batch_size", kMaxMicroBatch, &plan_micro));
    SHARDSCOPE_RETURN_IF_ERROR(plan_int("grad_accum_steps", kMaxGradAccum, &plan_accum));
    if (ds.train_batch_size.given && !ds.train_batch_size.is_auto) train = ds.train_batch_size.value;
    if (ds.micro_batch.given) micro = ds.micro_batch.is_auto ? plan_micro : ds.micro_batch.value;
    if (ds.grad_accum.given) {
      accum = ds.grad_accum.is_auto ? plan_accum.value_or(1) : ds.grad_accum.value;
    }
    std::string origin = ds.train_batch_size.given ? ds.train_batch_size.origin : ds.micro_batch.origin;
    auto product = [](int64_t a, int64_t b, int64_t c) -> std::optional<int64_t> {
      int64_t ab = 0, abc = 0;
      if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, &abc)) return std::nullopt;
      return abc;
    };
    if (train && micro && accum) {
      // all three given: nothing derived
    } else if (train && micro) {
      accum = *train / *micro / world;
    } else if (train && accum) {
      micro = *train / world / *accum;
    } else if (micro && accum) {
      train = product(*micro, *accum, world);
    } else if (train) {
      accum = 1;
      micro = *train / world;
    } else if (micro) {
      train = product(*micro, 1, world);
      accum = 1;
    } else {
      return Status::InvalidInput(fmt::format(
          "{}: train_batch_size: expected train_batch_size or train_micro_batch_size_per_gpu "
          "(DeepSpeed: \"Either train_batch_size or train_micro_batch_size_per_gpu needs to be "
          "provided\"), got neither",
          pending.deepspeed_file));
    }
    const std::optional<int64_t> expected = micro && accum ? product(*micro, *accum, world) : std::nullopt;
    if (!train || !expected || *micro < 1 || *accum < 1 || *train != *expected) {
      return Status::InvalidInput(fmt::format(
          "{}: train_batch_size: expected train_micro_batch_size_per_gpu x "
          "gradient_accumulation_steps x world size ({} x {} x {}), each at least 1, as "
          "DeepSpeedConfig._batch_assertion checks, got {}",
          origin, micro.value_or(0), accum.value_or(0), world,
          train ? fmt::format("{}", *train) : std::string("an overflow")));
    }
    SHARDSCOPE_RETURN_IF_ERROR(MergeSetting(
        root,
        PlanSetting{"training.micro_batch_size", fmt::format("{}", *micro),
                    ds.micro_batch.given ? ds.micro_batch.origin
                                         : fmt::format("{} (train_batch_size / world size)", origin)},
        /*plan_wins=*/false));
    SHARDSCOPE_RETURN_IF_ERROR(MergeSetting(
        root,
        PlanSetting{"training.grad_accum_steps", fmt::format("{}", *accum),
                    ds.grad_accum.given ? ds.grad_accum.origin
                                        : fmt::format("{} (derived as DeepSpeed does)", origin)},
        /*plan_wins=*/false));
  }

  if (pending.torchtitan) {
    // torchtitan/train.py Trainer.__init__: global_batch_size -1 is local x dp degree; it
    // must be a multiple of that; gradient_accumulation_steps = global / (local x dp). The
    // data-parallel degree is the world size (tensor, pipeline and context parallelism are 1).
    const TorchtitanSettings& tt = pending.torchtitan_settings;
    const int64_t per_step = tt.local_batch_size * world;
    const int64_t global = tt.global_batch_size < 0 ? per_step : tt.global_batch_size;
    if (global % per_step != 0) {
      return Status::InvalidInput(fmt::format(
          "{}: training.global_batch_size: expected a multiple of local_batch_size x the "
          "data-parallel degree ({} x {} = {}), as torchtitan's Trainer asserts, got {}",
          tt.global_batch_origin, tt.local_batch_size, world, per_step, global));
    }
    SHARDSCOPE_RETURN_IF_ERROR(MergeSetting(
        root,
        PlanSetting{"training.grad_accum_steps", fmt::format("{}", global / per_step),
                    tt.global_batch_size < 0
                        ? fmt::format("{} (global_batch_size -1: one micro-batch per step)",
                                      tt.local_batch_origin)
                        : tt.global_batch_origin},
        /*plan_wins=*/false));
  }
  return Status::Ok();
}

}  // namespace shardscope::sim::plan_internal

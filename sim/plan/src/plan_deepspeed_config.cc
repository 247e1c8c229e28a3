// A DeepSpeed JSON config as plan settings (`zero: {deepspeed_config: ds_config.json}`).
//
// Names and defaults from DeepSpeed: deepspeed/runtime/config.py (DeepSpeedConfig: the batch keys,
// gradient_clipping with default 0.0, the fp16 / bf16 sections) and
// deepspeed/runtime/zero/config.py (DeepSpeedZeroConfig and its offload configs). Every key is
// used, accepted as irrelevant to the cost of a step (kIgnored*), accepted only at DeepSpeed's
// default (kDefaultOnly*: a change there changes what the step does and the plan cannot model it),
// or refused by name. "auto" (the Hugging Face Trainer fills it in,
// transformers/integrations/deepspeed.py HfTrainerDeepSpeedConfig) is passed on for
// plan_sources_merge.cc to resolve from the plan where the Trainer would resolve it, and refused
// elsewhere.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "config_json.h"
#include "plan_sources.h"

namespace shardscope::sim {
namespace {

// Top-level keys that do not change a training step's computation or communication:
// the optimizer's hyperparameters and schedule, logging, monitoring and profiling, checkpoint
// I/O, NVMe I/O settings (unused without NVMe offload, which is refused), and DeepSpeed's own
// activation checkpointing API (it acts only where the model code calls
// deepspeed.checkpointing.checkpoint; the plan's training.activation_checkpointing says what
// the model does).
constexpr std::string_view kIgnoredTop[] = {
    "scheduler", "steps_per_print", "wall_clock_breakdown", "dump_state", "memory_breakdown",
    "tensorboard", "wandb", "csv_monitor", "comet", "flops_profiler", "comms_logger",
    "monitor_config", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
    "checkpoint", "aio", "autotuning", "activation_checkpointing", "nebula",
    "gradient_predivide_factor", "prescale_gradients", "sparse_gradients",
    "seq_parallel_communication_data_type", "use_node_local_storage", "load_universal_checkpoint"};

// Top-level sections for features the plan does not model: accepted only when they are
// empty or say "enabled": false.
constexpr std::string_view kRefusedUnlessDisabled[] = {
    "amp", "elasticity", "pipeline", "sparse_attention", "compression_training",
    "curriculum_learning", "data_efficiency", "progressive_layer_drop", "hybrid_engine",
    "compile", "tensor_parallel", "weight_quantization", "eigenvalue", "quantize_training"};

constexpr std::string_view kFp16Ignored[] = {
    "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
    "consecutive_hysteresis", "min_loss_scale", "auto_cast"};
constexpr std::string_view kBf16Ignored[] = {"immediate_grad_update", "check_grad_overflow",
                                             "check_overflow"};

// zero_optimization keys with no effect on a step's cost: checkpoint loading and saving,
// unused-parameter checking, CPU-offload-only knobs (offload itself is refused), and
// nn.Module.apply patching.
constexpr std::string_view kZeroIgnored[] = {
    "load_from_fp32_weights", "elastic_checkpoint", "stage3_gather_16bit_weights_on_model_save",
    "gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
    "ignore_unused_parameters", "round_robin_gradients", "cpu_offload_use_pin_memory",
    "override_module_apply", "pipeline_loading_checkpoint", "log_trace_cache_warnings"};

// zero_optimization keys accepted only at DeepSpeedZeroConfig's default: anything else
// changes the collectives or kernels (reduce instead of reduce-scatter, broadcasts instead
// of all-gathers, ZeRO++ quantization and hierarchical partitioning, MiCS, all-reduce fetch,
// coarse fetch granularity, per-sub-group optimizer steps, the legacy stage 1).
struct DefaultOnly {
  std::string_view key;
  std::string_view value;  // JSON text of the default; numbers compared by value
};
constexpr DefaultOnly kZeroDefaultOnly[] = {
    {"reduce_scatter", "true"},
    {"allgather_partitions", "true"},
    {"use_multi_rank_bucket_allreduce", "true"},
    {"sub_group_size", "1000000000"},
    {"stage3_model_persistence_threshold", "9223372036854775807"},
    {"model_persistence_threshold", "9223372036854775807"},
    {"stage3_module_granularity_threshold", "0"},
    {"module_granularity_threshold", "0"},
    {"stage3_use_all_reduce_for_fetch_params", "false"},
    {"use_all_reduce_for_fetch_params", "false"},
    {"zero_hpz_partition_size", "1"},
    {"zero_quantized_weights", "false"},
    {"zero_quantized_nontrainable_weights", "false"},
    {"zero_quantized_gradients", "false"},
    {"mics_shard_size", "-1"},
    {"mics_hierarchical_params_gather", "false"},
    {"legacy_stage1", "false"},
    {"cpu_offload", "false"},
    {"cpu_offload_param", "false"},
    {"memory_efficient_linear", "true"},
    {"zeropp_loco_param", "null"},
};

// zero_optimization keys the plan's zero section has; `stages` says where DeepSpeed uses
// them (engine._configure_zero_optimizer passes allgather_bucket_size to the stage 1/2
// optimizer only and the stage3_* sizes to DeepSpeedZeroOptimizer_Stage3 only; elsewhere
// DeepSpeed ignores them, and so does this reader). Aliases are DeepSpeedZeroConfig's
// pydantic field names beside the stage3_ spellings.
struct ZeroKey {
  std::string_view key;
  std::string_view plan_key;
  bool stage3_only;
  bool stages12_only;
  bool size;  // an element count (HF "auto" fills reduce_bucket_size and two stage-3 sizes)
};
constexpr ZeroKey kZeroKeys[] = {
    {"overlap_comm", "overlap_comm", false, false, false},
    {"contiguous_gradients", "contiguous_gradients", false, false, false},
    {"reduce_bucket_size", "reduce_bucket_size", false, false, true},
    {"allgather_bucket_size", "allgather_bucket_size", false, true, true},
    {"stage3_prefetch_bucket_size", "stage3_prefetch_bucket_size", true, false, true},
    {"prefetch_bucket_size", "stage3_prefetch_bucket_size", true, false, true},
    {"stage3_param_persistence_threshold", "stage3_param_persistence_threshold", true, false, true},
    {"param_persistence_threshold", "stage3_param_persistence_threshold", true, false, true},
    {"stage3_max_live_parameters", "stage3_max_live_parameters", true, false, true},
    {"max_live_parameters", "stage3_max_live_parameters", true, false, true},
    {"stage3_max_reuse_distance", "stage3_max_reuse_distance", true, false, true},
    {"max_reuse_distance", "stage3_max_reuse_distance", true, false, true},
};

// The offload configs' own keys (zero/offload_config.py): only `device` matters here, and
// only "none" is modelled.
constexpr std::string_view kOffloadIgnored[] = {
    "pin_memory", "buffer_count", "buffer_size", "max_in_cpu", "nvme_path", "pipeline_read",
    "pipeline_write", "fast_init", "ratio", "pipeline"};

constexpr int64_t kMaxElements = int64_t{1} << 50;
constexpr int64_t kMaxBatch = int64_t{1} << 40;

template <size_t N>
bool Contains(const std::string_view (&keys)[N], std::string_view key) {
  return std::find(std::begin(keys), std::end(keys), key) != std::end(keys);
}

// Whether a JSON value equals a default written as JSON text (numbers compared by value).
bool EqualsDefault(const YAML::Node& value, std::string_view json_default) {
  if (json_default == "null") return value.IsNull();
  if (!value.IsScalar() || value.Tag() == "!") return false;
  const std::string& text = value.Scalar();
  if (text == json_default) return true;
  const double a = std::strtod(text.c_str(), nullptr);
  const double b = std::strtod(std::string(json_default).c_str(), nullptr);
  return json_default != "true" && json_default != "false" && text != "true" && text != "false" &&
         a == b;
}

class DeepSpeedReader {
 public:
  explicit DeepSpeedReader(const std::string& source) : json_(source), source_(source) {}

  StatusOr<DeepSpeedSettings> Read(std::string_view text);

 private:
  Status ReadZero(const JsonMember& section, DeepSpeedSettings* out);
  Status ReadOffload(const JsonMember& member);
  // fp16 / bf16: whether enabled is true, "auto" or false.
  enum class Enabled { kFalse, kTrue, kAuto };
  // `origin`: where "enabled" is, or the section when it is absent.
  StatusOr<Enabled> ReadPrecision(const JsonMember& section, bool bf16, std::string* origin);
  Status ReadBatch(const JsonMember& member, DeepSpeedBatchValue* out);

  void Set(DeepSpeedSettings* out, std::string path, std::string value, std::string origin) {
    out->settings.push_back(PlanSetting{std::move(path), std::move(value), std::move(origin)});
  }

  JsonReader json_;
  const std::string& source_;
};

Status DeepSpeedReader::ReadBatch(const JsonMember& member, DeepSpeedBatchValue* out) {
  out->given = true;
  out->origin = json_.Origin(member);
  if (JsonReader::IsAuto(member.value)) {
    out->is_auto = true;
    return Status::Ok();
  }
  // DeepSpeedConfig._batch_assertion: each must be > 0.
  SHARDSCOPE_ASSIGN_OR_RETURN(out->value, json_.Int(member, 1, kMaxBatch));
  return Status::Ok();
}

StatusOr<DeepSpeedReader::Enabled> DeepSpeedReader::ReadPrecision(const JsonMember& section,
                                                                 bool bf16, std::string* origin) {
  SHARDSCOPE_ASSIGN_OR_RETURN(std::vector<JsonMember> members, json_.Members(section));
  Enabled enabled = Enabled::kFalse;
  *origin = json_.Origin(section);
  for (const JsonMember& m : members) {
    if (m.key == "enabled") {
      *origin = json_.Origin(m);
      if (JsonReader::IsAuto(m.value)) {
        enabled = Enabled::kAuto;
      } else {
        SHARDSCOPE_ASSIGN_OR_RETURN(bool on, json_.Bool(m));
        enabled = on ? Enabled::kTrue : Enabled::kFalse;
      }
    } else if (!bf16 && Contains(kFp16Ignored, m.key)) {
      continue;  // dynamic loss scaling: its checks cost the same whatever the settings
    } else if (bf16 && Contains(kBf16Ignored, m.key)) {
      continue;
    } else if (m.key == "fp16_master_weights_and_grads" || m.key == "bf16_master_weights_and_grads" ||
               m.key == "bf16_optimizer_states") {
      SHARDSCOPE_ASSIGN_OR_RETURN(bool on, json_.Bool(m));
      if (on) {
        return json_.Unsupported(m, "16-bit master weights, gradients or optimizer states (the "
                                    "plan keeps fp32 master weights and Adam states with ZeRO)");
      }
    } else {
      return json_.UnknownKey(m, bf16 ? "enabled, bf16_master_weights_and_grads, "
                                        "bf16_optimizer_states, immediate_grad_update, "
                                        "check_grad_overflow"
                                      : "enabled, fp16_master_weights_and_grads, loss_scale, "
                                        "initial_scale_power, loss_scale_window, hysteresis, "
                                        "consecutive_hysteresis, min_loss_scale, auto_cast");
    }
  }
  return enabled;
}

Status DeepSpeedReader::ReadOffload(const JsonMember& member) {
  if (JsonReader::IsNull(member.value)) return Status::Ok();
  SHARDSCOPE_ASSIGN_OR_RETURN(std::vector<JsonMember> members, json_.Members(member));
  for (const JsonMember& m : members) {
    if (m.key == "device") {
      if (JsonReader::IsNull(m.value)) continue;
      SHARDSCOPE_ASSIGN_OR_RETURN(std::string device, json_.String(m));
      if (device != "none") {
        return json_.Unsupported(m, "offloading to the CPU or NVMe (the plan keeps parameters, "
                                    "gradients and optimizer states on the GPU); device \"none\" "
                                    "is accepted");
      }
    } else if (!Contains(kOffloadIgnored, m.key)) {
      return json_.UnknownKey(m, "device, pin_memory, buffer_count, buffer_size, max_in_cpu, "
                                 "nvme_path, pipeline_read, pipeline_write, fast_init, ratio");
    }
  }
  return Status::Ok();
}

Status DeepSpeedReader::ReadZero(const JsonMember& section, DeepSpeedSettings* out) {
  // `"zero_optimization": true` is DeepSpeed's deprecated form (read_zero_config_deprecated).
  if (!section.value.IsMap()) {
    return json_.Error(section, "an object with stage and the ZeRO knobs");
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(std::vector<JsonMember> members, json_.Members(section));
  // The stage first: it decides which keys DeepSpeed uses.
  const JsonMember* stage = nullptr;
  for (const JsonMember& m : members) {
    if (m.key == "stage") stage = &m;
  }
  if (stage == nullptr) {
    return json_.Error(section.key_node.Mark(), "zero_optimization.stage",
                       "a ZeRO stage 1, 2 or 3 (DeepSpeedZeroConfig.stage defaults to 0: ZeRO "
                       "disabled, which is not a zero strategy)",
                       "nothing (the key is missing)");
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(int64_t stage_value, json_.Int(*stage, 0, 3));
  if (stage_value == 0) {
    return json_.Unsupported(*stage, "stage 0 (ZeRO disabled: plain data parallelism; a plan "
                                     "models that as strategy ddp)");
  }
  out->stage = static_cast<int32_t>(stage_value);
  Set(out, "strategy", fmt::format("zero{}", stage_value), json_.Origin(*stage));
  const bool stage3 = stage_value == 3;

  for (const JsonMember& m : members) {
    if (m.key == "stage" || Contains(kZeroIgnored, m.key)) continue;
    if (m.key == "offload_optimizer" || m.key == "offload_param") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadOffload(m));
      continue;
    }
    const DefaultOnly* default_only = nullptr;
    for (const DefaultOnly& d : kZeroDefaultOnly) {
      if (d.key == m.key) default_only = &d;
    }
    if (default_only != nullptr) {
      if (JsonReader::IsNull(m.value) && default_only->value != "true") continue;  // None: off
      if (!EqualsDefault(m.value, default_only->value)) {
        return json_.Unsupported(
            m, fmt::format("{} other than DeepSpeed's default {} (it changes the step's "
                           "collectives or kernels in a way the plan does not model)",
                           m.key, default_only->value));
      }
      continue;
    }
    const ZeroKey* known = nullptr;
    for (const ZeroKey& k : kZeroKeys) {
      if (k.key == m.key) known = &k;
    }
    if (known == nullptr) {
      return json_.UnknownKey(
          m, "stage, overlap_comm, contiguous_gradients, reduce_bucket_size, "
             "allgather_bucket_size, stage3_prefetch_bucket_size, "
             "stage3_param_persistence_threshold, stage3_max_live_parameters, "
             "stage3_max_reuse_distance, offload_optimizer, offload_param, and the keys "
             "docs/PLAN.md lists as ignored or accepted at their default");
    }
    // DeepSpeed ignores the other stages' sizes; so does the plan read from its config.
    if ((known->stage3_only && !stage3) || (known->stages12_only && stage3)) continue;
    const std::string path = fmt::format("zero.{}", known->plan_key);
    if (JsonReader::IsAuto(m.value)) {
      // trainer_config_finalize fills reduce_bucket_size, and at stage 3
      // stage3_prefetch_bucket_size and stage3_param_persistence_threshold; nothing else.
      const bool filled = known->plan_key == "reduce_bucket_size" ||
                          known->plan_key == "stage3_prefetch_bucket_size" ||
                          known->plan_key == "stage3_param_persistence_threshold";
      if (!filled) {
        return json_.Error(m, "a number: the Hugging Face Trainer fills \"auto\" only in "
                              "reduce_bucket_size, stage3_prefetch_bucket_size and "
                              "stage3_param_persistence_threshold");
      }
      Set(out, path, "auto", json_.Origin(m));
    } else if (known->size) {
      // Field(ge=0) for each size.
      SHARDSCOPE_ASSIGN_OR_RETURN(int64_t size, json_.Int(m, 0, kMaxElements));
      Set(out, path, fmt::format("{}", size), json_.Origin(m));
    } else {
      if (JsonReader::IsNull(m.value) && known->plan_key == "overlap_comm") continue;  // None
      SHARDSCOPE_ASSIGN_OR_RETURN(bool flag, json_.Bool(m));
      Set(out, path, flag ? "true" : "false", json_.Origin(m));
    }
  }
  return Status::Ok();
}

StatusOr<DeepSpeedSettings> DeepSpeedReader::Read(std::string_view text) {
  SHARDSCOPE_ASSIGN_OR_RETURN(YAML::Node root, json_.Load(text));
  SHARDSCOPE_ASSIGN_OR_RETURN(std::vector<JsonMember> members, json_.Members(root, root.Mark(), ""));
  DeepSpeedSettings out;
  const JsonMember* zero = nullptr;
  const JsonMember* fp16 = nullptr;
  const JsonMember* bf16 = nullptr;
  for (const JsonMember& m : members) {
    const std::string_view key = m.key;
    if (Contains(kIgnoredTop, key)) continue;
    if (key == "zero_optimization") {
      zero = &m;
    } else if (key == "fp16") {
      fp16 = &m;
    } else if (key == "bf16" || key == "bfloat16") {  // BFLOAT16_OLD is the older spelling
      if (bf16 != nullptr) return json_.Error(m, "one of bf16 and bfloat16");
      bf16 = &m;
    } else if (key == "train_batch_size") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBatch(m, &out.train_batch_size));
    } else if (key == "train_micro_batch_size_per_gpu") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBatch(m, &out.micro_batch));
    } else if (key == "gradient_accumulation_steps") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBatch(m, &out.grad_accum));
    } else if (key == "gradient_clipping") {
      if (JsonReader::IsAuto(m.value)) {
        Set(&out, "training.max_grad_norm", "auto", json_.Origin(m));
      } else {
        SHARDSCOPE_ASSIGN_OR_RETURN(double clip, json_.Number(m, 0, 1e9));
        Set(&out, "training.max_grad_norm", fmt::format("{}", clip), json_.Origin(m));
      }
    } else if (key == "optimizer") {
      // DeepSpeed lower-cases the type (runtime/engine.py _configure_basic_optimizer); the
      // plan's optimizer state is Adam's (two fp32 moments per parameter).
      SHARDSCOPE_ASSIGN_OR_RETURN(std::vector<JsonMember> fields, json_.Members(m));
      for (const JsonMember& f : fields) {
        if (f.key == "params") continue;  // lr, betas, eps, weight_decay: same cost
        if (f.key != "type") {
          return json_.UnknownKey(f, "type, params");
        }
        SHARDSCOPE_ASSIGN_OR_RETURN(std::string type, json_.String(f));
        std::string lower = type;
        std::transform(lower.begin(), lower.end(), lower.begin(),
                       [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
        if (lower != "adam" && lower != "adamw" && lower != "fusedadam") {
          return json_.Unsupported(f, "an optimizer other than Adam / AdamW (the plan's "
                                      "optimizer state is Adam's two fp32 moments)");
        }
      }
    } else if (key == "communication_data_type" || key == "data_types") {
      // A reduction dtype other than the model's changes the bytes every reduction moves.
      if (!JsonReader::IsNull(m.value) && !(m.value.IsMap() && m.value.size() == 0)) {
        bool all_null = m.value.IsMap();
        if (all_null) {
          for (const auto& pair : m.value) all_null = all_null && pair.second.IsNull();
        }
        if (!all_null) {
          return json_.Unsupported(m, "a communication or gradient-accumulation dtype other "
                                      "than the training dtype");
        }
      }
    } else if (Contains(kRefusedUnlessDisabled, key)) {
      bool disabled = JsonReader::IsNull(m.value) || (m.value.IsMap() && m.value.size() == 0);
      if (!disabled && m.value.IsMap()) {
        const YAML::Node enabled = m.value["enabled"];
        disabled = enabled && enabled.IsScalar() && enabled.Scalar() == "false";
      }
      if (!disabled) {
        return json_.Unsupported(m, fmt::format("DeepSpeed's {} feature (accepted only with "
                                                "\"enabled\": false)",
                                                key));
      }
    } else {
      return json_.UnknownKey(
          m, "train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps, "
             "gradient_clipping, fp16, bf16, zero_optimization, optimizer, and the keys "
             "docs/PLAN.md lists as ignored");
    }
  }

  if (zero == nullptr) {
    return json_.Error(root.Mark(), "zero_optimization",
                       "a zero_optimization section with stage 1, 2 or 3 (without it DeepSpeed "
                       "runs stage 0, plain data parallelism)",
                       "nothing (the key is missing)");
  }
  SHARDSCOPE_RETURN_IF_ERROR(ReadZero(*zero, &out));

  // The training dtype: fp16.enabled or bf16.enabled, else fp32 (DeepSpeedConfig:
  // get_fp16_enabled / get_bfloat16_enabled; "bfloat16 and fp16 modes cannot be
  // simultaneously enabled").
  Enabled fp16_on = Enabled::kFalse, bf16_on = Enabled::kFalse;
  std::string fp16_origin, bf16_origin;
  if (fp16 != nullptr) {
    SHARDSCOPE_ASSIGN_OR_RETURN(fp16_on, ReadPrecision(*fp16, false, &fp16_origin));
  }
  if (bf16 != nullptr) {
    SHARDSCOPE_ASSIGN_OR_RETURN(bf16_on, ReadPrecision(*bf16, true, &bf16_origin));
  }
  if (fp16_on == Enabled::kTrue && bf16_on == Enabled::kTrue) {
    return json_.Error(*bf16, "bf16 or fp16 enabled, not both (DeepSpeed: \"bfloat16 and fp16 "
                              "modes cannot be simultaneously enabled\")");
  }
  if (fp16_on == Enabled::kTrue) {
    Set(&out, "training.dtype", "fp16", fp16_origin);
  } else if (bf16_on == Enabled::kTrue) {
    Set(&out, "training.dtype", "bf16", bf16_origin);
  } else if (fp16_on == Enabled::kAuto || bf16_on == Enabled::kAuto) {
    Set(&out, "training.dtype", "auto", fp16_on == Enabled::kAuto ? fp16_origin : bf16_origin);
  } else {
    Set(&out, "training.dtype", "fp32",
        fmt::format("{} (neither fp16 nor bf16 enabled: DeepSpeed trains in fp32)", source_));
  }
  // gradient_clipping defaults to 0.0: no clipping (GRADIENT_CLIPPING_DEFAULT).
  const bool clipping_given =
      std::any_of(out.settings.begin(), out.settings.end(),
                  [](const PlanSetting& s) { return s.path == "training.max_grad_norm"; });
  if (!clipping_given) {
    Set(&out, "training.max_grad_norm", "0",
        fmt::format("{} (gradient_clipping absent: DeepSpeed's default 0.0, no clipping)", source_));
  }
  return out;
}

}  // namespace

StatusOr<DeepSpeedSettings> ReadDeepSpeedConfig(std::string_view text, const std::string& source) {
  return DeepSpeedReader(source).Read(text);
}

}  // namespace shardscope::sim

// A torchtitan TOML job config as plan settings (`torchtitan: {job_config: llama3_8b.toml}`).
//
// Sections, keys and defaults from torchtitan/config/job_config.py (JobConfig and its
// dataclasses), with the older spellings its train_configs/*.toml still use (training.
// batch_size before local_batch_size; [compile] enable/components beside training.compile).
// A key the file leaves out takes torchtitan's default, so the plan describes what torchtitan
// would run: local_batch_size 8, seq_len 2048, max_norm 1.0, bf16 parameters with fp32
// reduction, and activation checkpointing "selective" every 2nd block. Every key is used,
// accepted as irrelevant to a step's cost (kIgnored), or refused by name with its line.
// Parsed with toml++ (Debian libtomlplusplus-dev), which gives every key's line and column.
#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <charconv>
#include <exception>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "plan_sources.h"

namespace shardscope::sim {
namespace {

// Keys that do not change a training step's computation or communication, per section:
// job bookkeeping, profiling and metrics, tokenizer and dataset paths, the optimizer's
// hyperparameters and LR schedule, step counts, checkpoint I/O (not part of a step),
// communication timeouts and the flight recorder, validation runs, and the settings of
// features that only act when enabled elsewhere (Float8 / MX settings without their model
// converter, which is refused; pipeline / context-parallel settings without their degree,
// which must be 1).
struct SectionKeys {
  std::string_view section;
  std::vector<std::string_view> ignored;
};
const std::vector<SectionKeys>& IgnoredKeys() {
  static const std::vector<SectionKeys> kIgnored = {
      {"job", {"config_file", "dump_folder", "description", "use_for_integration_test",
               "print_args"}},
      {"profiling", {"enable_profiling", "save_traces_folder", "profile_freq",
                     "enable_memory_snapshot", "save_memory_snapshot_folder", "profiler_active",
                     "profiler_warmup"}},
      {"metrics", {"log_freq", "enable_tensorboard", "disable_color_printing", "save_tb_folder",
                   "save_for_all_ranks", "enable_wandb", "rank_0_only"}},
      {"model", {"tokenizer_path", "hf_assets_path", "print_after_conversion"}},
      {"optimizer", {"lr", "beta1", "beta2", "eps", "weight_decay", "implementation"}},
      {"lr_scheduler", {"warmup_steps", "decay_ratio", "decay_type", "lr_min"}},
      {"training", {"dataset", "dataset_path", "steps", "gc_freq", "gc_debug", "seed",
                    "deterministic", "warmup_steps"}},
      {"parallelism", {"disable_loss_parallel", "enable_async_tensor_parallel",
                       "pipeline_parallel_split_points", "pipeline_parallel_layers_per_stage",
                       "pipeline_parallel_schedule", "pipeline_parallel_schedule_csv",
                       "pipeline_parallel_microbatch_size", "context_parallel_rotate_method"}},
      {"checkpoint", {"enable_checkpoint", "folder", "initial_load_path",
                      "initial_load_model_only", "interval", "last_save_model_only",
                      "export_dtype", "create_seed_checkpoint", "async_mode", "keep_latest_k",
                      "load_step", "exclude_from_loading", "enable_first_step_checkpoint",
                      "last_save_in_hf", "interval_type", "model_weights_only"}},
      {"activation_checkpoint", {"per_op_sac_force_recompute_mm_shapes_by_fqns"}},
      {"float8", {"enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp",
                  "force_recompute_fp8_weight_in_bwd", "recipe_name", "filter_fqns", "emulate",
                  "moe_fqns_prototype"}},
      {"mx", {"mxfp8_dim1_cast_kernel_choice", "recipe_name", "filter_fqns"}},
      {"comm", {"init_timeout_seconds", "train_timeout_seconds", "trace_buf_size",
                "save_traces_folder"}},
      {"memory_estimation", {"enabled", "disable_fake_mode"}},
      {"fault_tolerance", {"process_group", "process_group_timeout_ms", "replica_id",
                           "group_size", "min_replica_size", "semi_sync_method", "sync_steps",
                           "should_quantize", "fragment_sync_delay", "fragment_update_alpha"}},
      {"validation", {"enabled", "dataset", "dataset_path", "local_batch_size", "seq_len", "freq",
                      "steps"}},
      {"experimental", {}},
      {"compile", {}},
  };
  return kIgnored;
}

// torchtitan [model] name/flavor -> plan preset, where the flavor's TransformerModelArgs
// (torchtitan/models/llama3/__init__.py llama3_configs; llama2's in older releases) equal the
// preset's dimensions (docs and sources in sim/presets/src/model.cc).
struct FlavorPreset {
  std::string_view name, flavor, preset;
};
constexpr FlavorPreset kFlavors[] = {
    {"llama3", "8B", "llama3-8b"},
    {"llama3", "70B", "llama3-70b"},
    {"llama2", "13B", "llama2-13b"},
    {"llama2", "70B", "llama2-70b"},
};

constexpr int64_t kMaxValue = int64_t{1} << 40;

std::string Where(const std::string& source, const toml::source_region& region) {
  return fmt::format("{}:{}:{}", source, std::max<int64_t>(1, region.begin.line),
                     std::max<int64_t>(1, region.begin.column));
}

std::string DescribeNode(const toml::node& node) {
  if (const auto* s = node.as_string()) return fmt::format("'{}'", s->get().substr(0, 60));
  if (const auto* i = node.as_integer()) return fmt::format("{}", i->get());
  if (const auto* f = node.as_floating_point()) return fmt::format("{}", f->get());
  if (const auto* b = node.as_boolean()) return b->get() ? "true" : "false";
  if (node.is_table()) return "a table";
  if (node.is_array()) return "an array";
  return "a date or time";
}

class TorchtitanReader {
 public:
  explicit TorchtitanReader(const std::string& source) : source_(source) {}

  StatusOr<TorchtitanSettings> Read(std::string_view text);

 private:
  // One key of a section: its dotted name, its location and its value.
  struct Key {
    std::string path;  // "training.seq_len"
    std::string where;
    const toml::node* value;
  };
  Status Error(const Key& key, std::string_view expected) const {
    return Status::InvalidInput(fmt::format("{}: {}: expected {}, got {}", key.where, key.path,
                                            expected, DescribeNode(*key.value)));
  }
  Status Unsupported(const Key& key, std::string_view why) const {
    return Status::InvalidInput(fmt::format("{}: {}: unsupported: {} (got {})", key.where,
                                            key.path, why, DescribeNode(*key.value)));
  }
  std::string Origin(const Key& key) const { return fmt::format("{} ({})", key.where, key.path); }

  StatusOr<int64_t> Int(const Key& key, int64_t min, int64_t max) const {
    const auto* i = key.value->as_integer();
    if (i == nullptr || i->get() < min || i->get() > max) {
      return Error(key, fmt::format("an integer from {} to {}", min, max));
    }
    return i->get();
  }
  StatusOr<bool> Bool(const Key& key) const {
    const auto* b = key.value->as_boolean();
    if (b == nullptr) return Error(key, "true or false");
    return b->get();
  }
  StatusOr<std::string> String(const Key& key, std::string_view expected) const {
    const auto* s = key.value->as_string();
    if (s == nullptr) return Error(key, expected);
    return s->get();
  }
  StatusOr<double> Number(const Key& key, double min, double max) const {
    double value = 0;
    if (const auto* f = key.value->as_floating_point()) {
      value = f->get();
    } else if (const auto* i = key.value->as_integer()) {
      value = static_cast<double>(i->get());
    } else {
      return Error(key, "a number");
    }
    if (!(value >= min && value <= max)) {
      return Error(key, fmt::format("a number from {} to {}", min, max));
    }
    return value;
  }
  // A list of strings, or a comma-separated string (torchtitan's CLI form).
  StatusOr<std::vector<std::string>> StringList(const Key& key) const;

  void Set(std::string path, std::string value, std::string origin) {
    out_.settings.push_back(PlanSetting{std::move(path), std::move(value), std::move(origin)});
  }

  const std::string& source_;
  TorchtitanSettings out_;
};

StatusOr<std::vector<std::string>> TorchtitanReader::StringList(const Key& key) const {
  std::vector<std::string> items;
  if (const auto* s = key.value->as_string()) {
    std::string_view text = s->get();
    while (!text.empty()) {
      const size_t comma = text.find(',');
      std::string_view item = text.substr(0, comma);
      while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
      while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
      if (!item.empty()) items.emplace_back(item);
      if (comma == std::string_view::npos) break;
      text.remove_prefix(comma + 1);
    }
    return items;
  }
  const auto* array = key.value->as_array();
  if (array == nullptr) return Error(key, "a list of strings");
  for (const toml::node& element : *array) {
    const auto* s = element.as_string();
    if (s == nullptr) return Error(key, "a list of strings");
    items.push_back(s->get());
  }
  return items;
}

StatusOr<TorchtitanSettings> TorchtitanReader::Read(std::string_view text) {
  toml::table root;
  try {
    root = toml::parse(text, std::string_view(source_));
  } catch (const toml::parse_error& e) {
    return Status::InvalidInput(fmt::format("{}: invalid TOML: {}", Where(source_, e.source()),
                                            e.description()));
  } catch (const std::exception& e) {
    return Status::Internal(fmt::format("{}: reading the TOML failed: {}", source_, e.what()));
  }

  // Values torchtitan takes when the file leaves a key out (job_config.py defaults).
  std::string model_name = "llama3", model_flavor = "debugmodel";
  bool flavor_given = false;
  std::string model_origin = fmt::format("{} (torchtitan's default model llama3 debugmodel)", source_);
  int64_t replicate = 1, shard = -1;
  std::string replicate_origin, shard_origin;
  const std::string default_origin = fmt::format("{} (torchtitan's default)", source_);
  std::string ac_mode = "selective", ac_option = "2";
  std::string ac_origin = default_origin;
  bool compile = false, compile_given = false;
  std::string compile_origin = default_origin;
  std::optional<Key> compile_components;
  std::string param_dtype = "bfloat16", reduce_dtype = "float32";
  std::string param_origin = default_origin, reduce_origin = default_origin;
  std::string reshard = "default", reshard_origin = default_origin;
  double max_norm = 1.0;
  std::string max_norm_origin = default_origin;
  int64_t seq_len = 2048;
  std::string seq_len_origin = default_origin;
  out_.local_batch_origin = default_origin;
  bool local_batch_given = false;

  for (const auto& [section_key, section_node] : root) {
    const std::string section(section_key.str());
    const std::string section_where = Where(source_, section_key.source());
    const auto* table = section_node.as_table();
    const std::vector<std::string_view>* ignored = nullptr;
    for (const SectionKeys& s : IgnoredKeys()) {
      if (s.section == section) ignored = &s.ignored;
    }
    if (table == nullptr || ignored == nullptr) {
      return Status::InvalidInput(fmt::format(
          "{}: {}: expected a section of torchtitan's JobConfig (job, profiling, metrics, "
          "model, optimizer, lr_scheduler, training, parallelism, checkpoint, "
          "activation_checkpoint, compile, float8, mx, comm, memory_estimation, "
          "fault_tolerance, experimental, validation), got {}",
          section_where, section, table == nullptr ? "a value outside a section" : "an unknown section"));
    }
    for (const auto& [name_key, value] : *table) {
      const std::string name(name_key.str());
      const Key key{fmt::format("{}.{}", section, name), Where(source_, name_key.source()), &value};
      if (std::find(ignored->begin(), ignored->end(), name) != ignored->end()) continue;
      const std::string unknown = fmt::format("{}: {}: unknown key '{}' in [{}] (docs/PLAN.md lists the keys read, "
                                              "ignored and refused)",
                                              key.where, key.path, name, section);
      if (section == "model") {
        if (name == "name") {
          SHARDSCOPE_ASSIGN_OR_RETURN(model_name, String(key, "a model name"));
          // The flavor names the model more precisely: its line wins whichever comes first
          // (toml++ tables iterate in key order, not the file's).
          if (!flavor_given) model_origin = Origin(key);
        } else if (name == "flavor") {
          SHARDSCOPE_ASSIGN_OR_RETURN(model_flavor, String(key, "a flavor"));
          model_origin = Origin(key);
          flavor_given = true;
        } else if (name == "converters") {
          SHARDSCOPE_ASSIGN_OR_RETURN(std::vector<std::string> converters, StringList(key));
          if (!converters.empty()) {
            return Unsupported(key, "model converters (float8, mx: torchao's Float8Linear / "
                                    "MXLinear swaps and their FSDP all-gathers are not modelled)");
          }
        } else if (name == "norm_type") {
          SHARDSCOPE_ASSIGN_OR_RETURN(std::string norm, String(key, "rmsnorm"));
          if (norm != "rmsnorm") return Unsupported(key, "a norm other than rmsnorm");
        } else {
          return Status::InvalidInput(unknown);
        }
      } else if (section == "optimizer") {
        if (name != "name") return Status::InvalidInput(unknown);
        SHARDSCOPE_ASSIGN_OR_RETURN(std::string optimizer, String(key, "an optimizer name"));
        if (optimizer != "AdamW" && optimizer != "Adam") {
          return Unsupported(key, "an optimizer other than AdamW / Adam (the plan's optimizer "
                                  "state is Adam's two fp32 moments)");
        }
      } else if (section == "lr_scheduler" || section == "job" ||
                 section == "profiling" || section == "metrics" || section == "checkpoint" ||
                 section == "float8" || section == "mx" || section == "comm" ||
                 section == "memory_estimation" || section == "validation") {
        return Status::InvalidInput(unknown);
      } else if (section == "training") {
        if (name == "local_batch_size" || name == "batch_size") {
          if (local_batch_given) return Error(key, "one of local_batch_size and batch_size");
          SHARDSCOPE_ASSIGN_OR_RETURN(out_.local_batch_size, Int(key, 1, kMaxValue));
          out_.local_batch_origin = Origin(key);
          local_batch_given = true;
        } else if (name == "global_batch_size") {
          // -1 (the default): local_batch_size x the data-parallel degree.
          SHARDSCOPE_ASSIGN_OR_RETURN(out_.global_batch_size, Int(key, -1, kMaxValue));
          if (out_.global_batch_size == 0) return Error(key, "-1 or a positive integer");
          out_.global_batch_origin = Origin(key);
        } else if (name == "seq_len") {
          SHARDSCOPE_ASSIGN_OR_RETURN(seq_len, Int(key, 1, kMaxValue));
          seq_len_origin = Origin(key);
        } else if (name == "max_norm") {
          SHARDSCOPE_ASSIGN_OR_RETURN(max_norm, Number(key, 0, 1e9));
          max_norm_origin = Origin(key);
        } else if (name == "mixed_precision_param") {
          SHARDSCOPE_ASSIGN_OR_RETURN(param_dtype, String(key, "bfloat16 or float32"));
          if (param_dtype != "bfloat16" && param_dtype != "float32") {
            return Error(key, "bfloat16 or float32");
          }
          param_origin = Origin(key);
        } else if (name == "mixed_precision_reduce") {
          SHARDSCOPE_ASSIGN_OR_RETURN(reduce_dtype, String(key, "float32 or bfloat16"));
          if (reduce_dtype != "bfloat16" && reduce_dtype != "float32") {
            return Error(key, "float32 or bfloat16");
          }
          reduce_origin = Origin(key);
        } else if (name == "compile") {
          // The older spelling of [compile] enable: both may not disagree.
          SHARDSCOPE_ASSIGN_OR_RETURN(bool on, Bool(key));
          if (compile_given && on != compile) {
            return Error(key, fmt::format("the value of {} (the same switch)", compile_origin));
          }
          compile = on;
          compile_given = true;
          compile_origin = Origin(key);
        } else if (name == "enable_cpu_offload") {
          SHARDSCOPE_ASSIGN_OR_RETURN(bool offload, Bool(key));
          if (offload) return Unsupported(key, "CPU offload (FSDP2 CPUOffloadPolicy)");
        } else {
          return Status::InvalidInput(unknown);
        }
      } else if (section == "parallelism") {
        if (name == "data_parallel_replicate_degree") {
          SHARDSCOPE_ASSIGN_OR_RETURN(replicate, Int(key, 1, kMaxValue));
          replicate_origin = Origin(key);
        } else if (name == "data_parallel_shard_degree") {
          // -1: the ranks left after the other dimensions (ParallelDims).
          SHARDSCOPE_ASSIGN_OR_RETURN(shard, Int(key, -1, kMaxValue));
          if (shard == 0) return Error(key, "-1 or a positive integer");
          shard_origin = Origin(key);
        } else if (name == "fsdp_reshard_after_forward") {
          SHARDSCOPE_ASSIGN_OR_RETURN(reshard, String(key, "default, always or never"));
          if (reshard != "default" && reshard != "always" && reshard != "never") {
            return Error(key, "default, always or never");
          }
          reshard_origin = Origin(key);
        } else if (name == "tensor_parallel_degree" || name == "pipeline_parallel_degree" ||
                   name == "context_parallel_degree" || name == "expert_parallel_degree") {
          SHARDSCOPE_ASSIGN_OR_RETURN(int64_t degree, Int(key, 1, kMaxValue));
          if (degree != 1) {
            return Unsupported(key, "a parallelism other than data parallelism (the plan "
                                    "models FSDP2 and HSDP only; 1 is accepted)");
          }
        } else if (name == "enable_compiled_autograd") {
          SHARDSCOPE_ASSIGN_OR_RETURN(bool on, Bool(key));
          if (on) return Unsupported(key, "compiled autograd");
        } else {
          return Status::InvalidInput(unknown);
        }
      } else if (section == "activation_checkpoint") {
        if (name == "mode") {
          SHARDSCOPE_ASSIGN_OR_RETURN(ac_mode, String(key, "none, selective or full"));
          if (ac_mode != "none" && ac_mode != "selective" && ac_mode != "full") {
            return Error(key, "none, selective or full");
          }
          ac_origin = Origin(key);
        } else if (name == "selective_ac_option") {
          // A string: "op", or an int as text ("2"); an integer is accepted as the same.
          if (const auto* i = value.as_integer()) {
            ac_option = fmt::format("{}", i->get());
          } else {
            SHARDSCOPE_ASSIGN_OR_RETURN(ac_option, String(key, "\"op\" or a positive integer"));
          }
          int64_t every = 0;
          const auto [end, ec] =
              std::from_chars(ac_option.data(), ac_option.data() + ac_option.size(), every);
          if (ac_option != "op" &&
              (ec != std::errc() || end != ac_option.data() + ac_option.size() || every < 1 ||
               every > 16384)) {
            return Error(key, "\"op\" or a positive integer (every k-th block)");
          }
          ac_origin = Origin(key);
        } else {
          return Status::InvalidInput(unknown);
        }
      } else if (section == "compile") {
        if (name == "enable") {
          SHARDSCOPE_ASSIGN_OR_RETURN(bool on, Bool(key));
          if (compile_given && on != compile) {
            return Error(key, fmt::format("the value of {} (the same switch)", compile_origin));
          }
          compile = on;
          compile_given = true;
          compile_origin = Origin(key);
        } else if (name == "components") {
          compile_components = key;
        } else {
          return Status::InvalidInput(unknown);
        }
      } else if (section == "fault_tolerance") {
        if (name != "enable") return Status::InvalidInput(unknown);
        SHARDSCOPE_ASSIGN_OR_RETURN(bool on, Bool(key));
        if (on) return Unsupported(key, "TorchFT fault tolerance");
      } else if (section == "experimental") {
        if (name != "custom_import" && name != "custom_args_module") {
          return Status::InvalidInput(unknown);
        }
        SHARDSCOPE_ASSIGN_OR_RETURN(std::string module, String(key, "a module name"));
        if (!module.empty()) {
          return Unsupported(key, "custom code (a model or config the plan cannot read)");
        }
      } else {
        return Status::InvalidInput(unknown);
      }
    }
  }

  // The model: a preset where torchtitan's flavor has one.
  std::string preset;
  for (const FlavorPreset& f : kFlavors) {
    if (f.name == model_name && f.flavor == model_flavor) preset = f.preset;
  }
  if (preset.empty()) {
    out_.unmapped_model = fmt::format("{} {}", model_name, model_flavor);
    out_.unmapped_model_origin = model_origin;
  } else {
    Set("model", preset, model_origin);
  }
  Set("strategy", "fsdp2", fmt::format("{} (torchtitan applies FSDP2)", source_));
  Set("training.implementation", "torchtitan", fmt::format("{} (torchtitan)", source_));

  // Data parallelism: dp_shard 1 with replicas is torchtitan's DDP (apply_ddp), not FSDP2.
  if (shard == 1 && replicate > 1) {
    return Status::InvalidInput(fmt::format(
        "{}: parallelism.data_parallel_shard_degree: unsupported: 1 with "
        "data_parallel_replicate_degree {} (torchtitan then applies DDP; write a plan with "
        "strategy ddp)",
        shard_origin.empty() ? source_ : shard_origin, replicate));
  }
  if (!replicate_origin.empty()) {
    Set("fsdp2.mesh.replicate", fmt::format("{}", replicate), replicate_origin);
  }
  if (shard > 0) Set("fsdp2.mesh.shard", fmt::format("{}", shard), shard_origin);
  // parallelize_llama: "default" is `not pp_enabled` (pipeline parallelism is refused here).
  Set("fsdp2.reshard_after_forward", reshard == "never" ? "false" : "true", reshard_origin);
  // MixedPrecisionPolicy(param_dtype, reduce_dtype) from mixed_precision_param / _reduce; the
  // compute runs in the parameter dtype.
  const std::string param = param_dtype == "bfloat16" ? "bf16" : "fp32";
  Set("training.dtype", param, param_origin);
  Set("fsdp2.mixed_precision.param_dtype", param, param_origin);
  Set("fsdp2.mixed_precision.reduce_dtype", reduce_dtype == "bfloat16" ? "bf16" : "fp32",
      reduce_origin);

  Set("training.seq_len", fmt::format("{}", seq_len), seq_len_origin);
  Set("training.micro_batch_size", fmt::format("{}", out_.local_batch_size),
      out_.local_batch_origin);
  Set("training.max_grad_norm", fmt::format("{}", max_norm), max_norm_origin);

  // Activation checkpointing (torchtitan/distributed/activation_checkpoint.py apply_ac).
  if (ac_mode == "none" || ac_mode == "full") {
    Set("training.activation_checkpointing", ac_mode, ac_origin);
  } else if (ac_option == "op") {
    Set("training.activation_checkpointing", "selective_op", ac_origin);
  } else {
    Set("training.activation_checkpointing", "selective", ac_origin);
    Set("training.selective_ac_every", ac_option, ac_origin);
  }

  // torch.compile: the plan compiles the blocks and, where torchtitan does, the loss.
  if (compile && compile_components) {
    SHARDSCOPE_ASSIGN_OR_RETURN(std::vector<std::string> components, StringList(*compile_components));
    std::sort(components.begin(), components.end());
    if (components != std::vector<std::string>{"loss", "model"}) {
      return Unsupported(*compile_components,
                         "compiling only some components (the plan's training.compile compiles "
                         "the model's blocks and the loss: components [\"model\", \"loss\"])");
    }
  }
  Set("training.compile", compile ? "true" : "false", compile_origin);
  return std::move(out_);
}

}  // namespace

StatusOr<TorchtitanSettings> ReadTorchtitanConfig(std::string_view text, const std::string& source) {
  return TorchtitanReader(source).Read(text);
}

}  // namespace shardscope::sim

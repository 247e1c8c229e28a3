// Readers for the framework config files a plan may name instead of restating their values:
// a Hugging Face config.json (`model: {hf_config: config.json}`), a DeepSpeed JSON config
// (`zero: {deepspeed_config: ds_config.json}`) and a torchtitan TOML job config
// (`torchtitan: {job_config: llama3_8b.toml}`). Private to sim/plan/.
//
// Each reader turns a file's text into plan settings: plan key paths with values in plan syntax,
// each remembering the file, line, column and key it came from. plan_sources_merge.cc merges them
// into the plan's YAML tree before reading it, so every check the plan loader makes applies to them
// too and its errors point at the config file. A reader itself refuses what the plan cannot
// express: every key of the file is either used, accepted as irrelevant to the cost of a step
// (named in the reader's list), accepted only at the framework's default, or refused by name with
// file:line:column. Nothing is ignored because it is unknown.
#ifndef SHARDSCOPE_SIM_PLAN_SOURCES_H_
#define SHARDSCOPE_SIM_PLAN_SOURCES_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "shardscope/base/status.h"

namespace shardscope::sim {

// One plan value a config file sets.
struct PlanSetting {
  std::string path;    // the plan key: "training.micro_batch_size", "model", "fsdp2.mesh.shard"
  std::string value;   // in plan syntax: "1", "true", "bf16", "llama3-8b"; "auto" for a DeepSpeed
                       // value the Hugging Face Trainer fills in (DeepSpeedSettings)
  std::string origin;  // "ds_config.json:4:3 (train_micro_batch_size_per_gpu)"
};

// A Hugging Face config.json (transformers' PretrainedConfig subclasses of the model types
// below), as `model.*` settings.
struct HfModelSettings {
  std::vector<PlanSetting> model;  // paths "model.<key>"
  // Sliding-window attention (Mistral's sliding_window): attention is the same as full causal
  // attention for sequences up to this many tokens, which is all the plan models. 0: none.
  int64_t sliding_window = 0;
  std::string sliding_window_origin;
};
StatusOr<HfModelSettings> ReadHfConfig(std::string_view text, const std::string& source);

// A DeepSpeed config (deepspeed/runtime/config.py DeepSpeedConfig, zero/config.py
// DeepSpeedZeroConfig): `strategy`, `zero.*`, `training.dtype` and `training.max_grad_norm`
// settings, and the batch keys, which need the world size (plan_sources_merge.cc applies
// DeepSpeed's rules once the cluster is read).
struct DeepSpeedBatchValue {
  bool given = false;
  bool is_auto = false;  // "auto": filled in by the Hugging Face Trainer
  int64_t value = 0;
  std::string origin;
};
struct DeepSpeedSettings {
  int32_t stage = 0;
  std::vector<PlanSetting> settings;     // value "auto" for training.dtype / max_grad_norm and
                                         // the zero sizes the HF Trainer fills in
  DeepSpeedBatchValue train_batch_size;  // train_batch_size
  DeepSpeedBatchValue micro_batch;       // train_micro_batch_size_per_gpu
  DeepSpeedBatchValue grad_accum;        // gradient_accumulation_steps
};
StatusOr<DeepSpeedSettings> ReadDeepSpeedConfig(std::string_view text, const std::string& source);

// A torchtitan job config (torchtitan/config/job_config.py JobConfig, as its
// train_configs/*.toml write it): `model`, `strategy`, `training.*` and `fsdp2.*` settings.
struct TorchtitanSettings {
  std::vector<PlanSetting> settings;
  // [model] name/flavor with no plan preset ("llama3 debugmodel"): the plan's own `model` must
  // describe it. Empty when the flavor maps to a preset (then a `model` setting is present).
  std::string unmapped_model;
  std::string unmapped_model_origin;
  // The batch: global_batch_size -1 means local_batch_size x the data-parallel degree
  // (torchtitan/train.py Trainer.__init__); plan_sources_merge.cc divides once the world size
  // is known.
  int64_t local_batch_size = 8;
  std::string local_batch_origin;
  int64_t global_batch_size = -1;
  std::string global_batch_origin;
};
StatusOr<TorchtitanSettings> ReadTorchtitanConfig(std::string_view text, const std::string& source);

// Reads a config file a plan names: a regular file of at most kMaxConfigFileBytes (a FIFO or a
// device would block or never end). Implemented in config_json.cc.
inline constexpr int64_t kMaxConfigFileBytes = int64_t{4} << 20;
StatusOr<std::string> ReadConfigFile(const std::string& path);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_PLAN_SOURCES_H_

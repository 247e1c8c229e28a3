// A Hugging Face config.json as plan `model.*` settings (`model: {hf_config: config.json}`).
//
// Model types: llama (LlamaConfig), mistral (MistralConfig) and mixtral (MixtralConfig),
// transformers' src/transformers/models/<type>/configuration_<type>.py. A key the file leaves
// out takes that class's default, as PretrainedConfig.from_dict does; num_key_value_heads
// defaults to num_attention_heads (LlamaConfig.__post_init__). Every key of the file is used,
// accepted as irrelevant to the cost of a training step (kIgnoredKeys), accepted only at the
// value the model describes, or refused by name.
#include <fmt/format.h>

#include <array>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "config_json.h"
#include "plan_sources.h"

namespace shardscope::sim {
namespace {

// The per-type defaults (the classes' field defaults in transformers).
struct HfModelType {
  std::string_view name;
  int64_t vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads;
  int64_t num_key_value_heads;  // 0: num_attention_heads
  int64_t sliding_window;       // 0: None
  int64_t num_local_experts;    // 0: a dense model (no MoE keys)
  int64_t num_experts_per_tok;
};
constexpr std::array<HfModelType, 3> kModelTypes = {{
    // LlamaConfig: vocab 32000, hidden 4096, intermediate 11008, 32 layers, 32 heads,
    // num_key_value_heads None.
    {"llama", 32000, 4096, 11008, 32, 32, 0, 0, 0, 0},
    // MistralConfig: intermediate 14336, num_key_value_heads 8, sliding_window 4096.
    {"mistral", 32000, 4096, 14336, 32, 32, 8, 4096, 0, 0},
    // MixtralConfig (transformers models/mixtral/configuration_mixtral.py): as Mistral but
    // sliding_window None, num_local_experts 8, num_experts_per_tok 2.
    {"mixtral", 32000, 4096, 14336, 32, 32, 8, 0, 8, 2},
}};

// Keys that do not change what a training step computes or moves: identification,
// tokenizer ids, initialization, inference and generation settings, numerics that cost the
// same whatever their value (RMSNorm epsilon, RoPE base and scaling: the same kernels), the
// checkpoint's storage dtype (the plan's training.dtype decides the compute), Mixtral's
// router-loss settings (a few element-wise kernels on a tokens x experts tensor), and
// max_position_embeddings (RoPE has no position table).
constexpr std::string_view kIgnoredKeys[] = {
    "architectures", "_name_or_path", "transformers_version", "torch_dtype", "dtype",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "initializer_range", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
    "max_position_embeddings", "use_cache", "output_router_logits", "router_aux_loss_coef",
    "router_jitter_noise", "tokenizer_class", "return_dict", "output_hidden_states",
    "output_attentions", "torchscript", "use_bfloat16", "is_encoder_decoder", "is_decoder",
    "add_cross_attention", "tie_encoder_decoder", "problem_type", "id2label", "label2id",
    "finetuning_task", "prefix", "task_specific_params", "max_length", "min_length",
    "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty",
    "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty",
    "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values"};

// The keys used (or checked against what the model describes).
constexpr std::string_view kUsedKeys[] = {
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "tie_word_embeddings",
    "hidden_act", "attention_bias", "mlp_bias", "attention_dropout", "pretraining_tp",
    "sliding_window", "num_local_experts"};

constexpr int64_t kMaxDimension = int64_t{1} << 26;

template <size_t N>
bool Contains(const std::string_view (&keys)[N], std::string_view key) {
  for (std::string_view k : keys) {
    if (k == key) return true;
  }
  return false;
}

std::string AcceptedKeys() {
  std::vector<std::string_view> keys(std::begin(kUsedKeys), std::end(kUsedKeys));
  keys.push_back("num_experts_per_tok");
  keys.push_back("(and the ignored keys listed in docs/PLAN.md)");
  return JoinKeys(keys);
}

}  // namespace

StatusOr<HfModelSettings> ReadHfConfig(std::string_view text, const std::string& source) {
  const JsonReader json(source);
  SHARDSCOPE_ASSIGN_OR_RETURN(YAML::Node root, json.Load(text));
  SHARDSCOPE_ASSIGN_OR_RETURN(std::vector<JsonMember> members,
                              json.Members(root, root.Mark(), ""));

  // model_type first: it decides the defaults and which keys exist.
  const JsonMember* type_member = nullptr;
  for (const JsonMember& m : members) {
    if (m.key == "model_type") type_member = &m;
  }
  if (type_member == nullptr) {
    return json.Error(root.Mark(), "model_type",
                      "a model_type (llama, mistral or mixtral: the types the plan models)",
                      "nothing (the key is missing)");
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(std::string type_name, json.String(*type_member));
  const HfModelType* type = nullptr;
  for (const HfModelType& candidate : kModelTypes) {
    if (candidate.name == type_name) type = &candidate;
  }
  if (type == nullptr) {
    // Qwen2 is the near miss worth naming: its q/k/v projections carry biases and o_proj and
    // the MLP do not, which the model's single `bias` switch cannot say.
    const std::string why =
        type_name == "qwen2"
            ? "qwen2's q, k and v projections carry biases while o_proj and the MLP do not; the "
              "plan's model has one bias switch for every linear layer"
            : "the plan models llama, mistral and mixtral configs";
    return json.Unsupported(*type_member, fmt::format("model_type '{}': {}", type_name, why));
  }
  const bool moe = type->num_local_experts > 0;

  HfModelSettings out;
  auto set = [&](std::string_view key, std::string value, std::string origin) {
    out.model.push_back(PlanSetting{fmt::format("model.{}", key), std::move(value),
                                    std::move(origin)});
  };
  const std::string file_origin = fmt::format("{} (default of {})", source, type_name);

  int64_t vocab = type->vocab_size, hidden = type->hidden_size, ffn = type->intermediate_size;
  int64_t layers = type->num_hidden_layers, heads = type->num_attention_heads;
  int64_t kv_heads = type->num_key_value_heads;
  int64_t experts = type->num_local_experts, experts_per_token = type->num_experts_per_tok;
  bool tied = false, attention_bias = false, mlp_bias = false;
  std::string origin_of[8] = {file_origin, file_origin, file_origin, file_origin,
                              file_origin, file_origin, file_origin, file_origin};
  const JsonMember* head_dim = nullptr;
  const JsonMember* attention_bias_member = nullptr;
  const JsonMember* mlp_bias_member = nullptr;
  out.sliding_window = type->sliding_window;
  out.sliding_window_origin = file_origin;

  for (const JsonMember& m : members) {
    const std::string_view key = m.key;
    if (Contains(kIgnoredKeys, key) || key == "model_type") continue;
    if (key == "vocab_size") {
      SHARDSCOPE_ASSIGN_OR_RETURN(vocab, json.Int(m, 1, kMaxDimension));
      origin_of[0] = json.Origin(m);
    } else if (key == "hidden_size") {
      SHARDSCOPE_ASSIGN_OR_RETURN(hidden, json.Int(m, 1, kMaxDimension));
      origin_of[1] = json.Origin(m);
    } else if (key == "intermediate_size") {
      SHARDSCOPE_ASSIGN_OR_RETURN(ffn, json.Int(m, 1, kMaxDimension));
      origin_of[2] = json.Origin(m);
    } else if (key == "num_hidden_layers") {
      SHARDSCOPE_ASSIGN_OR_RETURN(layers, json.Int(m, 1, kMaxDimension));
      origin_of[3] = json.Origin(m);
    } else if (key == "num_attention_heads") {
      SHARDSCOPE_ASSIGN_OR_RETURN(heads, json.Int(m, 1, kMaxDimension));
      origin_of[4] = json.Origin(m);
    } else if (key == "num_key_value_heads") {
      if (!json.IsNull(m.value)) {
        SHARDSCOPE_ASSIGN_OR_RETURN(kv_heads, json.Int(m, 1, kMaxDimension));
        origin_of[5] = json.Origin(m);
      } else {
        kv_heads = 0;
      }
    } else if (key == "tie_word_embeddings") {
      SHARDSCOPE_ASSIGN_OR_RETURN(tied, json.Bool(m));
      origin_of[6] = json.Origin(m);
    } else if (key == "head_dim") {
      if (!json.IsNull(m.value)) head_dim = &m;
    } else if (key == "hidden_act") {
      // The gated MLP act_fn(gate_proj(x)) * up_proj(x) with SiLU is the plan's swiglu.
      SHARDSCOPE_ASSIGN_OR_RETURN(std::string act, json.String(m));
      if (act != "silu") {
        return json.Unsupported(m, "a gated MLP with an activation other than silu (the plan's "
                                   "mlp: swiglu)");
      }
    } else if (key == "attention_bias") {
      SHARDSCOPE_ASSIGN_OR_RETURN(attention_bias, json.Bool(m));
      attention_bias_member = &m;
    } else if (key == "mlp_bias") {
      SHARDSCOPE_ASSIGN_OR_RETURN(mlp_bias, json.Bool(m));
      mlp_bias_member = &m;
    } else if (key == "attention_dropout") {
      SHARDSCOPE_ASSIGN_OR_RETURN(double p, json.Number(m, 0, 1));
      if (p != 0) {
        return json.Unsupported(m, "attention dropout alone (the plan's model.dropout also drops "
                                   "after the embeddings and each sub-layer)");
      }
    } else if (key == "pretraining_tp") {
      // LlamaMLP / LlamaAttention split their matmuls into pretraining_tp slices when > 1.
      if (!json.IsNull(m.value)) {
        SHARDSCOPE_ASSIGN_OR_RETURN(int64_t tp, json.Int(m, 1, kMaxDimension));
        if (tp != 1) {
          return json.Unsupported(m, "pretraining_tp > 1 (the linear layers split into slices)");
        }
      }
    } else if (key == "sliding_window" && type->name != "llama") {
      if (json.IsNull(m.value)) {
        out.sliding_window = 0;
      } else {
        SHARDSCOPE_ASSIGN_OR_RETURN(out.sliding_window, json.Int(m, 1, kMaxDimension));
        out.sliding_window_origin = json.Origin(m);
      }
    } else if (moe && key == "num_local_experts") {
      SHARDSCOPE_ASSIGN_OR_RETURN(experts, json.Int(m, 1, 65536));
      origin_of[7] = json.Origin(m);
    } else if (moe && key == "num_experts_per_tok") {
      SHARDSCOPE_ASSIGN_OR_RETURN(experts_per_token, json.Int(m, 1, 65536));
    } else if (key == "quantization_config") {
      return json.Unsupported(m, "a quantized model (the plan trains dense bf16/fp16/fp32 weights)");
    } else {
      return json.UnknownKey(m, AcceptedKeys());
    }
  }

  // transformers' own checks (LlamaConfig.validate_architecture: hidden a multiple of heads).
  if (hidden % heads != 0) {
    return Status::InvalidInput(fmt::format(
        "{}: hidden_size: expected a multiple of num_attention_heads ({}), got {}",
        origin_of[1], heads, hidden));
  }
  if (kv_heads == 0) {
    kv_heads = heads;  // LlamaConfig.__post_init__: num_key_value_heads None -> heads
    origin_of[5] = origin_of[4];
  }
  // Grouped-query attention: each key/value head serves heads / kv_heads query heads
  // (LlamaAttention.num_key_value_groups).
  if (heads % kv_heads != 0) {
    return Status::InvalidInput(fmt::format(
        "{}: num_key_value_heads: expected a divisor of num_attention_heads ({}), got {}",
        origin_of[5], heads, kv_heads));
  }
  if (head_dim != nullptr) {
    SHARDSCOPE_ASSIGN_OR_RETURN(int64_t dim, json.Int(*head_dim, 1, kMaxDimension));
    if (dim != hidden / heads) {
      return json.Unsupported(
          *head_dim, fmt::format("head_dim other than hidden_size / num_attention_heads ({}): "
                                 "the plan's model derives it",
                                 hidden / heads));
    }
  }
  // The plan's `bias` puts biases on every linear layer: both switches or neither.
  if (attention_bias != mlp_bias) {
    const JsonMember* which = attention_bias ? attention_bias_member : mlp_bias_member;
    return json.Unsupported(*which, "biases on the attention or on the MLP projections alone "
                                    "(the plan's model.bias is for every linear layer)");
  }

  set("name", fmt::format("{} ({})", type_name, source), fmt::format("{} (model_type)", source));
  set("layers", fmt::format("{}", layers), origin_of[3]);
  set("hidden", fmt::format("{}", hidden), origin_of[1]);
  set("heads", fmt::format("{}", heads), origin_of[4]);
  set("kv_heads", fmt::format("{}", kv_heads), origin_of[5]);
  set("ffn", fmt::format("{}", ffn), origin_of[2]);
  set("vocab", fmt::format("{}", vocab), origin_of[0]);
  set("tied_embeddings", tied ? "true" : "false", origin_of[6]);
  set("bias", attention_bias ? "true" : "false", json.Where(root.Mark()));
  set("mlp", "swiglu", file_origin);
  set("norm", "rmsnorm", file_origin);
  set("attention", "causal", file_origin);
  set("experts", fmt::format("{}", moe ? experts : 1), origin_of[7]);
  set("experts_per_token", fmt::format("{}", moe ? experts_per_token : 1), origin_of[7]);
  return out;
}

}  // namespace shardscope::sim

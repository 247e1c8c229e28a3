// Model presets and their parameter and FLOP counts (model.h). The decomposition of a
// training step into the kernels PyTorch launches is in model_kernels.cc.
#include "shardscope/sim/presets/model.h"

#include "model_params.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace shardscope::sim {
namespace {

// 6N: forward 2 FLOPs per parameter per token (multiply + add), backward 4 (dgrad + wgrad).
constexpr double kTrainingFlopsPerMatmulParam = 6.0;
// Attention scores and values: 2 GEMM-like products of 2 FLOPs x seq x (heads x head_dim)
// per token forward, x3 for forward + backward = 12 (reference: 12 x layers x hidden x seq).
constexpr double kTrainingAttentionFlopsFactor = 12.0;
// A causal mask leaves half of the score matrix as useful work.
constexpr double kCausalFraction = 0.5;

// ---- Presets

// The dimensions every family shares; each family then sets its architecture.
ModelSpec Dimensions(std::string name, int32_t layers, int64_t hidden, int32_t heads, int32_t kv_heads,
                     int64_t ffn, int64_t vocab) {
  ModelSpec m;
  m.name = std::move(name);
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.kv_heads = kv_heads;
  m.ffn = ffn;
  m.vocab = vocab;
  return m;
}

// Llama family: SwiGLU, RMSNorm, RoPE, no biases, untied output head.
ModelSpec LlamaFamily(std::string name, int32_t layers, int64_t hidden, int32_t heads,
                      int32_t kv_heads, int64_t ffn, int64_t vocab) {
  ModelSpec m = Dimensions(std::move(name), layers, hidden, heads, kv_heads, ffn, vocab);
  m.mlp = MlpKind::kSwiGlu;
  m.norm = NormKind::kRmsNorm;
  return m;
}

// GPT-3 (GPT-2 architecture, Brown et al. 2020 Sec. 2.1): GeLU 4h MLP, LayerNorm with bias,
// biases on every linear, learned absolute positions, output head tied to the token embedding.
// Attention is modelled dense: GPT-3's alternating locally banded sparse layers are not.
ModelSpec Gpt3Family(std::string name, int32_t layers, int64_t hidden, int32_t heads,
                     int64_t ffn, int64_t vocab, int64_t max_positions) {
  ModelSpec m = Dimensions(std::move(name), layers, hidden, heads, heads, ffn, vocab);
  m.max_positions = max_positions;
  m.learned_positions = true;
  m.tied_embeddings = true;
  m.bias = true;
  m.norm_bias = true;
  m.mlp = MlpKind::kGelu;
  m.norm = NormKind::kLayerNorm;
  // GPT-2's attention projects q, k and v with one Conv1D (transformers' GPT2Attention.c_attn).
  m.fused_qkv = true;
  return m;
}

// MPT (llm-foundry): ALiBi instead of positions (MPTConfig turns learned_pos_emb off when
// alibi is on), no_bias = true drops the biases of linears and LayerNorms, GeLU MLP with
// expansion_ratio 4, output head tied to wte.
ModelSpec MptFamily(std::string name, int32_t layers, int64_t hidden, int32_t heads,
                    int64_t ffn, int64_t vocab) {
  ModelSpec m = Dimensions(std::move(name), layers, hidden, heads, heads, ffn, vocab);
  m.alibi = true;
  m.tied_embeddings = true;
  m.mlp = MlpKind::kGelu;
  m.norm = NormKind::kLayerNorm;
  // llm-foundry's MultiheadAttention projects q, k and v with one Wqkv linear; MPTConfig's
  // attn_pdrop, resid_pdrop and emb_pdrop default to 0.
  m.fused_qkv = true;
  return m;
}

// RoBERTa (HF RobertaForMaskedLM, FacebookAI/roberta-large config.json): bidirectional
// encoder, post-LN, biases everywhere, GeLU, learned positions with 2 extra rows (positions
// start at padding_idx + 1 = 2, hence max_position_embeddings = 514 for 512 tokens), one
// token-type row, LayerNorm after the embeddings, and the LM head dense + GeLU + LayerNorm
// with a decoder tied to the word embedding plus its own vocab-sized bias. max_positions is
// the usable 512, so seq_len is checked against what the model accepts; the 2 reserved rows
// still count as parameters because the checkpoint has them.
ModelSpec RobertaFamily(std::string name, int32_t layers, int64_t hidden, int32_t heads,
                        int64_t ffn, int64_t vocab, int64_t max_positions) {
  ModelSpec m = Dimensions(std::move(name), layers, hidden, heads, heads, ffn, vocab);
  m.max_positions = max_positions;
  m.learned_positions = true;
  m.reserved_position_rows = 2;
  m.token_types = 1;
  m.embedding_norm = true;
  m.post_norm = true;
  m.lm_head_transform = true;
  m.tied_embeddings = true;
  m.bias = true;
  m.norm_bias = true;
  m.mlp = MlpKind::kGelu;
  m.norm = NormKind::kLayerNorm;
  m.attention = AttentionKind::kBidirectional;
  // RobertaConfig (BertConfig defaults): hidden_dropout_prob 0.1, attention_probs_dropout_prob 0.1.
  m.dropout = 0.1;
  return m;
}

ModelSpec WithExperts(ModelSpec m, int32_t experts, int32_t experts_per_token) {
  m.experts = experts;
  m.experts_per_token = experts_per_token;
  return m;
}

std::vector<ModelSpec> PresetTable() {
  return {
      // meta-llama/Meta-Llama-3-8B config.json: num_hidden_layers 32, hidden_size 4096,
      // num_attention_heads 32, num_key_value_heads 8, intermediate_size 14336,
      // vocab_size 128256, tie_word_embeddings false.
      LlamaFamily("llama3-8b", 32, 4096, 32, 8, 14336, 128256),
      // meta-llama/Meta-Llama-3-70B config.json: 80 layers, 8192 hidden, 64 heads, 8 kv heads,
      // intermediate_size 28672, vocab 128256.
      LlamaFamily("llama3-70b", 80, 8192, 64, 8, 28672, 128256),
      // meta-llama/Llama-2-13b-hf config.json: 40 layers, 5120 hidden, 40 heads (no GQA),
      // intermediate_size 13824, vocab 32000.
      LlamaFamily("llama2-13b", 40, 5120, 40, 40, 13824, 32000),
      // meta-llama/Llama-2-70b-hf config.json: 80 layers, 8192 hidden, 64 heads, 8 kv heads,
      // intermediate_size 28672, vocab 32000.
      LlamaFamily("llama2-70b", 80, 8192, 64, 8, 28672, 32000),
      // Brown et al. 2020, Table 2.1 (GPT-3 175B): n_layers 96, d_model 12288, n_heads 96,
      // d_ff = 4 d_model, n_ctx 2048; GPT-2 BPE vocabulary of 50257.
      Gpt3Family("gpt3-175b", 96, 12288, 96, 49152, 50257, 2048),
      // mosaicml/mpt-7b config.json: n_layers 32, d_model 4096, n_heads 32,
      // expansion_ratio 4, vocab_size 50432, alibi true, no_bias true.
      MptFamily("mpt-7b", 32, 4096, 32, 16384, 50432),
      // mosaicml/mpt-30b config.json: n_layers 48, d_model 7168, n_heads 64,
      // expansion_ratio 4, vocab_size 50432, alibi true, no_bias true.
      MptFamily("mpt-30b", 48, 7168, 64, 28672, 50432),
      // No public checkpoint: the RoBERTa architecture (FacebookAI/roberta-large config.json:
      // vocab 50265, 512 positions + 2 reserved, type_vocab_size 1, gelu) scaled to the
      // project reference's dimensions (model-accounting.md: 30 x 5120, 40 heads, ffn 20480).
      RobertaFamily("roberta-10b", 30, 5120, 40, 20480, 50265, 512),
      // mistralai/Mixtral-8x7B-v0.1 config.json: 32 layers, 4096 hidden, 32 heads, 8 kv heads,
      // intermediate_size 14336 per expert, num_local_experts 8, num_experts_per_tok 2,
      // vocab 32000, tie_word_embeddings false.
      WithExperts(LlamaFamily("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000), 8, 2),
  };
}

}  // namespace

// ---- Parameters

namespace {

void AddNormParams(std::vector<ParamTensor>& params, const std::string& prefix,
                   const ModelSpec& m) {
  params.push_back({prefix + ".weight", m.hidden});
  if (m.norm_bias) params.push_back({prefix + ".bias", m.hidden});
}

// A linear layer in -> out; `copies` stacks that many (MoE experts, stored as one tensor the
// way grouped-GEMM implementations keep them).
void AddLinearParams(std::vector<ParamTensor>& params, const std::string& prefix, int64_t in,
                     int64_t out, bool bias, int64_t copies = 1) {
  params.push_back({prefix + ".weight", copies * in * out, /*matmul=*/true});
  if (bias) params.push_back({prefix + ".bias", copies * out, /*matmul=*/true});
}

// One expert's MLP: SwiGLU w1 (gate), w3 (up), w2 (down); GeLU w1 (up), w2 (down).
void AddMlpParams(std::vector<ParamTensor>& params, const std::string& prefix,
                  const ModelSpec& m, int64_t copies) {
  AddLinearParams(params, prefix + ".w1", m.hidden, m.ffn, m.bias, copies);
  if (m.mlp == MlpKind::kSwiGlu) {
    AddLinearParams(params, prefix + ".w3", m.hidden, m.ffn, m.bias, copies);
  }
  AddLinearParams(params, prefix + ".w2", m.ffn, m.hidden, m.bias, copies);
}

}  // namespace

std::vector<ParamTensor> EmbedParams(const ModelSpec& m) {
  std::vector<ParamTensor> params;
  params.push_back({"tok_embeddings.weight", m.vocab * m.hidden});
  if (m.position_rows() > 0) {
    params.push_back({"pos_embeddings.weight", m.position_rows() * m.hidden});
  }
  if (m.token_types > 0) {
    params.push_back({"token_type_embeddings.weight", m.token_types * m.hidden});
  }
  if (m.embedding_norm) AddNormParams(params, "norm", m);
  return params;
}

int64_t ExpertParams(const ModelSpec& m) {
  std::vector<ParamTensor> params;
  AddMlpParams(params, "expert", m, 1);
  int64_t n = 0;
  for (const ParamTensor& p : params) n += p.numel;
  return n;
}

std::vector<ParamTensor> LayerParams(const ModelSpec& m) {
  const int64_t hq = static_cast<int64_t>(m.heads) * m.head_dim();
  const int64_t hkv = static_cast<int64_t>(m.kv_heads) * m.head_dim();
  std::vector<ParamTensor> params;
  AddNormParams(params, "attention_norm", m);
  AddLinearParams(params, "attention.wq", m.hidden, hq, m.bias);
  AddLinearParams(params, "attention.wk", m.hidden, hkv, m.bias);
  AddLinearParams(params, "attention.wv", m.hidden, hkv, m.bias);
  AddLinearParams(params, "attention.wo", hq, m.hidden, m.bias);
  AddNormParams(params, "ffn_norm", m);
  if (m.experts > 1) {
    AddLinearParams(params, "feed_forward.router", m.hidden, m.experts, m.bias);
    AddMlpParams(params, "feed_forward.experts", m, m.experts);
  } else {
    AddMlpParams(params, "feed_forward", m, 1);
  }
  return params;
}

std::vector<ParamTensor> HeadParams(const ModelSpec& m) {
  std::vector<ParamTensor> params;
  if (!m.post_norm) AddNormParams(params, "norm", m);
  if (m.lm_head_transform) {
    AddLinearParams(params, "dense", m.hidden, m.hidden, m.bias);
    AddNormParams(params, "transform_norm", m);
  }
  if (!m.tied_embeddings) params.push_back({"output.weight", m.vocab * m.hidden, /*matmul=*/true});
  if (m.lm_head_transform) params.push_back({"output.bias", m.vocab, /*matmul=*/true});
  return params;
}

int64_t SumNumel(const std::vector<ParamTensor>& params) {
  int64_t n = 0;
  for (const ParamTensor& p : params) n += p.numel;
  return n;
}

// ---- Public API

std::vector<std::string> ModelPresetNames() {
  std::vector<std::string> names;
  for (const ModelSpec& m : PresetTable()) names.push_back(m.name);
  return names;
}

StatusOr<ModelSpec> FindModelPreset(std::string_view name) {
  for (ModelSpec& m : PresetTable()) {
    if (m.name == name) return std::move(m);
  }
  return Status::InvalidInput(fmt::format("unknown model preset '{}'; expected one of: {}",
                                          name, fmt::join(ModelPresetNames(), ", ")));
}

Status ValidateModel(const ModelSpec& m) {
  auto invalid = [&m](const std::string& what) {
    return Status::InvalidInput(fmt::format("model '{}': {}", m.name, what));
  };
  auto positive = [&invalid](std::string_view field, int64_t value) -> Status {
    if (value > 0) return Status::Ok();
    return invalid(fmt::format("{} must be positive, got {}", field, value));
  };
  SHARDSCOPE_RETURN_IF_ERROR(positive("layers", m.layers));
  SHARDSCOPE_RETURN_IF_ERROR(positive("hidden", m.hidden));
  SHARDSCOPE_RETURN_IF_ERROR(positive("heads", m.heads));
  SHARDSCOPE_RETURN_IF_ERROR(positive("kv_heads", m.kv_heads));
  SHARDSCOPE_RETURN_IF_ERROR(positive("ffn", m.ffn));
  SHARDSCOPE_RETURN_IF_ERROR(positive("vocab", m.vocab));
  SHARDSCOPE_RETURN_IF_ERROR(positive("experts", m.experts));
  SHARDSCOPE_RETURN_IF_ERROR(positive("experts_per_token", m.experts_per_token));
  if (m.hidden % m.heads != 0) {
    return invalid(fmt::format("hidden ({}) must be divisible by heads ({})", m.hidden, m.heads));
  }
  if (m.heads % m.kv_heads != 0) {
    return invalid(
        fmt::format("kv_heads ({}) must divide heads ({})", m.kv_heads, m.heads));
  }
  if (m.experts_per_token > m.experts) {
    return invalid(fmt::format("experts_per_token ({}) must not exceed experts ({})",
                               m.experts_per_token, m.experts));
  }
  if (m.max_positions < 0 || m.reserved_position_rows < 0 || m.token_types < 0) {
    const char* field = m.max_positions < 0            ? "max_positions"
                        : m.reserved_position_rows < 0 ? "reserved_position_rows"
                                                       : "token_types";
    return invalid(fmt::format("{} must not be negative", field));
  }
  if (m.learned_positions && m.max_positions == 0) {
    return invalid("max_positions must be positive with learned_positions");
  }
  if (m.learned_positions && m.alibi) {
    return invalid("alibi and learned_positions are exclusive position encodings");
  }
  if (m.norm_bias && m.norm == NormKind::kRmsNorm) {
    return invalid("norm_bias needs norm: layer_norm (RMSNorm has no bias)");
  }
  return Status::Ok();
}

Status ValidateWorkload(const ModelSpec& m, const Workload& w) {
  if (w.micro_batch <= 0) {
    return Status::InvalidInput(
        fmt::format("micro_batch must be positive, got {}", w.micro_batch));
  }
  if (w.seq_len <= 0) {
    return Status::InvalidInput(fmt::format("seq_len must be positive, got {}", w.seq_len));
  }
  if (!std::isfinite(w.expert_load) || w.expert_load <= 0) {
    return Status::InvalidInput(fmt::format("expert_load must be a positive number, got {}", w.expert_load));
  }
  if (m.learned_positions && w.seq_len > m.max_positions) {
    return Status::InvalidInput(
        fmt::format("seq_len ({}) exceeds max_positions ({}) of model '{}', whose position "
                    "embeddings are learned",
                    w.seq_len, m.max_positions, m.name));
  }
  return Status::Ok();
}

std::vector<ModuleParams> ModelParameters(const ModelSpec& model) {
  std::vector<ModuleParams> modules;
  modules.reserve(static_cast<size_t>(model.layers) + 2);
  modules.push_back({"embed", EmbedParams(model)});
  const std::vector<ParamTensor> layer = LayerParams(model);
  for (int32_t i = 0; i < model.layers; ++i) modules.push_back({fmt::format("layers.{}", i), layer});
  modules.push_back({"head", HeadParams(model)});
  return modules;
}

int64_t ParameterCount(const ModelSpec& model) {
  return SumNumel(EmbedParams(model)) + model.layers * SumNumel(LayerParams(model)) +
         SumNumel(HeadParams(model));
}

int64_t ActiveParameterCount(const ModelSpec& model) {
  const int64_t idle_experts = model.experts - model.experts_per_token;
  return ParameterCount(model) - model.layers * idle_experts * ExpertParams(model);
}

int64_t ActiveMatmulParameterCount(const ModelSpec& model) {
  const int64_t h = model.hidden;
  const int64_t hq = static_cast<int64_t>(model.heads) * model.head_dim();
  const int64_t hkv = static_cast<int64_t>(model.kv_heads) * model.head_dim();
  const int64_t mlp_matrices = model.mlp == MlpKind::kSwiGlu ? 3 : 2;
  int64_t layer = h * (hq + 2 * hkv) + hq * h +
                  model.experts_per_token * mlp_matrices * h * model.ffn;
  if (model.experts > 1) layer += h * model.experts;  // router
  const int64_t head = (model.lm_head_transform ? h * h : 0) + model.vocab * h;
  return model.layers * layer + head;
}

double TrainingFlopsPerToken(const ModelSpec& model, int64_t seq_len) {
  const double hq = static_cast<double>(model.heads) * static_cast<double>(model.head_dim());
  const double attention = kTrainingAttentionFlopsFactor * model.layers * hq *
                           static_cast<double>(seq_len) *
                           (model.attention == AttentionKind::kCausal ? kCausalFraction : 1.0);
  return kTrainingFlopsPerMatmulParam * static_cast<double>(ActiveMatmulParameterCount(model)) +
         attention;
}

}  // namespace shardscope::sim

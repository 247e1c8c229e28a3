// Model presets, parameter and FLOP counts, and the decomposition of a training step into the
// kernels a real implementation launches (see model.h).
//
// Kernel accounting. T = micro_batch x seq_len tokens, b = bytes per activation element
// (Workload::dtype), h = hidden, hq = heads x head_dim, hkv = kv_heads x head_dim, f = ffn,
// V = vocab, E = experts, k = experts_per_token.
//
// * GEMMs (y = x W): forward m = T, k = in, n = out. Backward emits, right after each other,
//   dgrad (m = T, n = in, k = out) and wgrad (m = in, n = out, k = T), so backward GEMM FLOPs
//   are exactly twice the forward ones. Biases are folded into the GEMM epilogues (forward
//   bias add; bias gradient = BGRADB epilogue of the wgrad GEMM), as cuBLASLt / Megatron /
//   Transformer Engine do, so they add no kernel and no FLOPs. QKV and SwiGLU gate+up run as
//   one fused GEMM each (Megatron's layout); the parameter tensors keep the HF / torchtitan
//   split (wq, wk, wv; w1, w3) because that is what FSDP shards.
// * Attention is flash attention (AttentionDesc): no s^2 score matrix is stored.
// * Memory-bound kernels read and write whole activations; parameters (vectors of h) and
//   reductions into them are left out, they are < 1/T of the traffic. The backward of an
//   elementwise kernel reads the incoming gradient plus what the forward saved and writes the
//   input gradient(s): roughly 1.5-2x the forward bytes, derived per kernel below rather than
//   from a blanket factor. Norm backward is one fused pass (Apex / Transformer Engine / Liger).
// * The backward of a residual add is the identity, so it launches nothing where the add was;
//   the gradient of the skip path is merged with the branch's input gradient after the
//   branch's first kernel backward (read 2Thb, write Thb): "<sublayer>.residual_add.bwd".
// * Dropout is off (modern LLM pre-training; RoBERTa's 0.1 dropout masks would add 2Tbh per
//   layer, 1 byte per element, Korthikanti et al. Table 2).
//
// Saved activations (Korthikanti et al. 2022, "Reducing Activation Recomputation", Sec. 4.1,
// adapted to the kernels above). A tensor two kernels keep is charged once:
// * norm: its input (Thb) plus fp32 statistics per token (RMSNorm: rstd; LayerNorm: mean and
//   rstd). Korthikanti's "layer norms 4sbh" is the 2 x 2sbh of the inputs.
// * GEMM: its input, for the weight gradient. The output projection's input is the attention
//   output, which flash attention already keeps, so out_proj charges nothing.
// * attention: q, k, v (T(hq + 2hkv)b), the output O (Thb) and the fp32 log-sum-exp
//   (micro_batch x heads x seq x 4). Korthikanti's 11sbh + 5as^2b becomes 10sbh for MHA
//   (no dropout mask, no score matrix) plus the log-sum-exp.
// * RoPE: nothing (its backward needs only the cos/sin tables).
// * SwiGLU: gate and up outputs (2Tfb; a fused SwiGLU kernel recomputes silu(gate)); the
//   down projection keeps its input (Tfb). GeLU MLP: the GeLU input (Tfb) and the down
//   projection input (Tfb): with the up-projection input this is Korthikanti's 19sbh less
//   the dropout mask.
// * So a GPT layer keeps 32sbh + 16sb (LayerNorm stats) + 4asb (log-sum-exp) bytes, the
//   reference's 34sbh less its two dropout masks.
// * Loss: PyTorch eager cross_entropy after an fp32 upcast of the logits, as HF
//   (ForCausalLMLoss: logits.float()) and torchtitan (cross_entropy(pred.float())) do. It keeps
//   the fp32 log-probabilities (4TV) and the targets; the bf16 logits die after the upcast.
#include "shardscope/sim/model.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace shardscope::sim {
namespace {

using traces::AttentionDesc;
using traces::ComputeDesc;
using traces::DType;
using traces::GemmDesc;
using traces::MemoryBoundDesc;

// Norm statistics, flash attention's log-sum-exp, router probabilities (HF Mixtral:
// softmax(dtype=float)) and the upcast logits are fp32.
constexpr int64_t kFp32Bytes = 4;
// Token ids, targets and expert indices are torch.long.
constexpr int64_t kIndexBytes = 8;
// RoPE reads cos and sin (fp32) for head_dim / 2 frequencies per position: 4 x head_dim bytes.
constexpr int64_t kRopeTableBytesPerDim = 4;
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

// ---- Parameters

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

// One expert's MLP: SwiGLU w1 (gate), w3 (up), w2 (down); GeLU w1 (up), w2 (down).
void AddMlpParams(std::vector<ParamTensor>& params, const std::string& prefix,
                  const ModelSpec& m, int64_t copies) {
  AddLinearParams(params, prefix + ".w1", m.hidden, m.ffn, m.bias, copies);
  if (m.mlp == MlpKind::kSwiGlu) {
    AddLinearParams(params, prefix + ".w3", m.hidden, m.ffn, m.bias, copies);
  }
  AddLinearParams(params, prefix + ".w2", m.ffn, m.hidden, m.bias, copies);
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

// ---- Decomposition

// Shapes shared by the kernels of one workload.
struct Shapes {
  int64_t micro_batch = 0;
  int64_t seq = 0;
  int64_t tokens = 0;  // T
  int64_t bytes = 0;   // b
  DType dtype = DType::kBFloat16;
  int64_t hidden = 0, hq = 0, hkv = 0, ffn = 0, vocab = 0;
  int64_t experts = 1, top_k = 1;
  int64_t expert_rows = 0;  // token rows the rank's experts run: T x top_k x expert load

  int64_t Act(int64_t width) const { return tokens * width * bytes; }
};

// Collects one module's kernels. Each forward kernel carries its own backward kernels; the
// module's backward is the reverse of the forward order, each kernel's list kept in order.
class ModuleBuilder {
 public:
  explicit ModuleBuilder(std::string name) { module_.name = std::move(name); }

  void SetParams(std::vector<ParamTensor> params) { module_.params = std::move(params); }

  void Forward(std::string name, ComputeDesc compute, int64_t saved_bytes,
               std::vector<ModuleKernel> backward) {
    module_.forward.push_back({std::move(name), compute, saved_bytes});
    backward_of_.push_back(std::move(backward));
  }

  // y[batch][m][n] = x[batch][m][k] W[batch][k][n]; keeps x for the weight gradient when
  // `save_input`.
  void Gemm(const std::string& name, int64_t m, int64_t n, int64_t k, int64_t batch,
            DType dtype, bool save_input, int64_t bytes) {
    if (m == 0 || batch == 0) return;  // an empty expert group launches nothing
    const int64_t saved = save_input ? batch * m * k * bytes : 0;
    Forward(name, GemmDesc{m, n, k, batch, dtype}, saved,
            {{name + ".dgrad", GemmDesc{m, k, n, batch, dtype}, 0},
             {name + ".wgrad", GemmDesc{k, n, m, batch, dtype}, 0}});
  }

  void MemoryBound(std::string name, int64_t read, int64_t written, int64_t saved_bytes,
                   int64_t bwd_read, int64_t bwd_written) {
    std::string bwd_name = name + ".bwd";
    Forward(std::move(name), MemoryBoundDesc{read, written}, saved_bytes,
            {{std::move(bwd_name), MemoryBoundDesc{bwd_read, bwd_written}, 0}});
  }

  // The next forward kernel consumes a residual branch's input: its backward produces the
  // branch's input gradient, where MergeResidualGrad adds the skip path's gradient.
  void BeginBranch() { branch_start_ = module_.forward.size(); }
  void MergeResidualGrad(std::string name, int64_t act_bytes) {
    backward_of_[branch_start_].push_back(
        {std::move(name), MemoryBoundDesc{2 * act_bytes, act_bytes}, 0});
  }

  ModuleKernels Build() && {
    for (size_t i = backward_of_.size(); i-- > 0;) {
      for (ModuleKernel& kernel : backward_of_[i]) module_.backward.push_back(std::move(kernel));
    }
    return std::move(module_);
  }

 private:
  ModuleKernels module_;
  std::vector<std::vector<ModuleKernel>> backward_of_;
  size_t branch_start_ = 0;
};

// RMSNorm / LayerNorm over hidden: forward reads x, writes y, keeps x and the fp32 statistics;
// backward reads dy, x and the statistics, writes dx.
void AddNorm(ModuleBuilder& b, const std::string& name, const ModelSpec& m, const Shapes& s) {
  const int64_t act = s.Act(s.hidden);
  const int64_t stats = s.tokens * kFp32Bytes * (m.norm == NormKind::kLayerNorm ? 2 : 1);
  b.MemoryBound(name, act, act, act + stats, 2 * act + stats, act);
}

// x + branch: reads both, writes the sum, keeps nothing. Its backward is the merge added by
// MergeResidualGrad.
void AddResidual(ModuleBuilder& b, const std::string& name, const Shapes& s) {
  const int64_t act = s.Act(s.hidden);
  b.Forward(name, MemoryBoundDesc{2 * act, act}, 0, {});
  b.MergeResidualGrad(name + ".bwd", act);
}

// Elementwise activation over `width` columns of `rows` rows. SwiGLU reads gate and up, writes
// silu(gate) * up and keeps gate and up; its backward reads dy, gate, up and writes dgate, dup.
// GeLU reads x, writes gelu(x) and keeps x; its backward reads dy, x and writes dx.
void AddActivation(ModuleBuilder& b, const std::string& name, MlpKind kind, int64_t rows,
                   int64_t width, const Shapes& s) {
  const int64_t out = rows * width * s.bytes;
  if (kind == MlpKind::kSwiGlu) {
    b.MemoryBound(name, 2 * out, out, 2 * out, 3 * out, 2 * out);
  } else {
    b.MemoryBound(name, out, out, out, 2 * out, out);
  }
}

// Experts run as grouped GEMMs (batch = experts), as torchtitan's grouped_mm and Megatron's
// GroupedMLP launch them, with the routed tokens T x top_k spread evenly (a balanced router,
// the load-balancing loss's target). When T x top_k is not a multiple of the expert count,
// the groups that take one extra token run as a second grouped GEMM, so the FLOPs stay exact.
// Under routing imbalance (Workload::expert_load) the rank's experts run that many more rows.
void AddExpertGemm(ModuleBuilder& b, const std::string& name, int64_t n, int64_t k,
                   const Shapes& s) {
  const int64_t routed = s.expert_rows;
  const int64_t per_expert = routed / s.experts;
  const int64_t with_extra = routed % s.experts;
  b.Gemm(name, per_expert, n, k, s.experts - with_extra, s.dtype, true, s.bytes);
  b.Gemm(name + ".rem", per_expert + 1, n, k, with_extra, s.dtype, true, s.bytes);
}

void AddDenseMlp(ModuleBuilder& b, const ModelSpec& m, const Shapes& s) {
  if (m.mlp == MlpKind::kSwiGlu) {
    b.Gemm("mlp.gate_up_proj", s.tokens, 2 * s.ffn, s.hidden, 1, s.dtype, true, s.bytes);
  } else {
    b.Gemm("mlp.up_proj", s.tokens, s.ffn, s.hidden, 1, s.dtype, true, s.bytes);
  }
  AddActivation(b, "mlp.act", m.mlp, s.tokens, s.ffn, s);
  b.Gemm("mlp.down_proj", s.tokens, s.hidden, s.ffn, 1, s.dtype, true, s.bytes);
}

// Mixtral-style sparse MLP: router GEMM, softmax + top-k, permute tokens into expert order,
// expert GEMMs, weighted unpermute back to token order.
void AddMoeMlp(ModuleBuilder& b, const ModelSpec& m, const Shapes& s) {
  const int64_t act = s.Act(s.hidden);
  const int64_t routed = s.tokens * s.top_k;
  const int64_t permuted = routed * s.hidden * s.bytes;
  const int64_t logits = s.tokens * s.experts * s.bytes;
  const int64_t probs = s.tokens * s.experts * kFp32Bytes;
  const int64_t indices = routed * kIndexBytes;
  const int64_t weights = routed * s.bytes;
  // The router's dgrad accumulates into the permute backward's output (GEMM beta = 1), so the
  // two gradients of the normed input need no separate add.
  b.Gemm("moe.router", s.tokens, s.experts, s.hidden, 1, s.dtype, true, s.bytes);
  // softmax in fp32, top-k, renormalised weights: keeps the probabilities and the indices.
  b.MemoryBound("moe.topk", logits, probs + weights + indices, probs + indices,
                weights + probs + indices, logits);
  // Gather: each token's row read once per chosen expert. Backward scatter-adds them back.
  b.MemoryBound("moe.permute", permuted + indices, permuted, 0, permuted + indices, act);
  const bool swiglu = m.mlp == MlpKind::kSwiGlu;
  AddExpertGemm(b, swiglu ? "moe.experts.gate_up_proj" : "moe.experts.up_proj",
                swiglu ? 2 * s.ffn : s.ffn, s.hidden, s);
  AddActivation(b, "moe.experts.act", m.mlp, s.expert_rows, s.ffn, s);
  AddExpertGemm(b, "moe.experts.down_proj", s.hidden, s.ffn, s);
  // out[t] = sum_j w[t][j] y[t][j]: keeps y and w (d w needs y, d y needs w). Backward reads
  // dout, y, w and writes dy (in expert order) and dw.
  b.MemoryBound("moe.unpermute", permuted + weights + indices, act, permuted + weights,
                act + permuted + weights + indices, permuted + weights);
}

ModuleKernels BuildLayer(const ModelSpec& m, const Shapes& s, std::string name) {
  ModuleBuilder b(std::move(name));
  b.SetParams(LayerParams(m));
  const bool causal = m.attention == AttentionKind::kCausal;
  const int64_t head_dim = m.head_dim();

  // Attention sub-layer.
  b.BeginBranch();
  if (!m.post_norm) AddNorm(b, "attn.norm", m, s);
  b.Gemm("attn.qkv_proj", s.tokens, s.hq + 2 * s.hkv, s.hidden, 1, s.dtype, true, s.bytes);
  if (m.rope()) {
    // Rotates q and k in place of a position table.
    const int64_t qk = s.Act(s.hq + s.hkv);
    const int64_t table = s.seq * head_dim * kRopeTableBytesPerDim;
    b.MemoryBound("attn.rope", qk + table, qk, 0, qk + table, qk);
  }
  const AttentionDesc attention{s.micro_batch, m.heads,  m.kv_heads, s.seq,  s.seq,
                                head_dim,      causal,   false,      s.dtype};
  AttentionDesc attention_bwd = attention;
  attention_bwd.backward = true;
  const int64_t lse = s.micro_batch * m.heads * s.seq * kFp32Bytes;
  b.Forward("attn.core", attention, s.Act(s.hq + 2 * s.hkv) + s.Act(s.hq) + lse,
            {{"attn.core.bwd", attention_bwd, 0}});
  b.Gemm("attn.out_proj", s.tokens, s.hidden, s.hq, 1, s.dtype, false, s.bytes);
  AddResidual(b, "attn.residual_add", s);
  if (m.post_norm) AddNorm(b, "attn.norm", m, s);

  // MLP sub-layer.
  b.BeginBranch();
  if (!m.post_norm) AddNorm(b, "mlp.norm", m, s);
  if (m.experts > 1) {
    AddMoeMlp(b, m, s);
  } else {
    AddDenseMlp(b, m, s);
  }
  AddResidual(b, "mlp.residual_add", s);
  if (m.post_norm) AddNorm(b, "mlp.norm", m, s);
  return std::move(b).Build();
}

ModuleKernels BuildEmbed(const ModelSpec& m, const Shapes& s) {
  ModuleBuilder b("embed");
  b.SetParams(EmbedParams(m));
  const int64_t act = s.Act(s.hidden);
  const int64_t ids = s.tokens * kIndexBytes;
  const int64_t table = m.vocab * m.hidden * s.bytes;
  // Row gather. Backward (embedding_dense_backward) zero-fills a dense vocab x hidden gradient
  // and scatter-adds the T incoming rows into it (read-modify-write of the touched rows).
  // With tied embeddings the output head's weight gradient is already in .grad, and autograd
  // adds this one to it.
  std::vector<ModuleKernel> lookup_bwd = {
      {"embed.lookup.bwd", MemoryBoundDesc{2 * act + ids, table + act}, 0}};
  if (m.tied_embeddings) {
    lookup_bwd.push_back(
        {"embed.tied_grad_accumulate", MemoryBoundDesc{2 * table, table}, 0});
  }
  b.Forward("embed.lookup", MemoryBoundDesc{act + ids, act}, 0, std::move(lookup_bwd));
  if (m.position_rows() > 0 || m.token_types > 0) {
    // One fused add of the position rows (broadcast over the micro-batch) and the token-type
    // row. Backward reduces the gradient into both tables (zero-filled, dense).
    const int64_t rows_read = (m.learned_positions ? s.seq : 0) + (m.token_types > 0 ? 1 : 0);
    const int64_t table_rows = m.position_rows() + m.token_types;
    b.MemoryBound("embed.positions", act + rows_read * m.hidden * s.bytes, act, 0, act,
                  table_rows * m.hidden * s.bytes);
  }
  if (m.embedding_norm) AddNorm(b, "embed.norm", m, s);
  return std::move(b).Build();
}

ModuleKernels BuildHead(const ModelSpec& m, const Shapes& s) {
  ModuleBuilder b("head");
  b.SetParams(HeadParams(m));
  if (!m.post_norm) AddNorm(b, "final_norm", m, s);
  if (m.lm_head_transform) {
    b.Gemm("lm_head.dense", s.tokens, s.hidden, s.hidden, 1, s.dtype, true, s.bytes);
    AddActivation(b, "lm_head.act", MlpKind::kGelu, s.tokens, s.hidden, s);
    AddNorm(b, "lm_head.norm", m, s);
  }
  b.Gemm("output_proj", s.tokens, s.vocab, s.hidden, 1, s.dtype, true, s.bytes);
  const int64_t logits = s.Act(s.vocab);
  const int64_t logits32 = s.tokens * s.vocab * kFp32Bytes;
  const int64_t targets = s.tokens * kIndexBytes;
  // logits.float(): keeps nothing; backward casts the fp32 gradient back.
  b.MemoryBound("loss.upcast", logits, logits32, 0, logits32, logits);
  // log_softmax (a max/sum pass and a normalising pass over each row: rows of vocab fp32 do
  // not fit on chip) + nll_loss gather; keeps the log-probabilities and the targets.
  // Backward: nll_loss_backward writes a dense zero-filled gradient with -1/N at the targets,
  // log_softmax_backward reads it and the log-probabilities and writes the logits' gradient.
  b.MemoryBound("loss.cross_entropy", 2 * logits32 + targets, logits32,
                logits32 + targets, 2 * logits32 + targets, 2 * logits32);
  return std::move(b).Build();
}

}  // namespace

// ---- Public API

int64_t ModuleKernels::param_numel() const { return SumNumel(params); }

int64_t ModuleKernels::saved_bytes() const {
  int64_t n = 0;
  for (const ModuleKernel& kernel : forward) n += kernel.saved_bytes;
  return n;
}

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

std::vector<ModuleKernels> DecomposeModel(const ModelSpec& model, const Workload& workload) {
  if (!ValidateModel(model).ok() || !ValidateWorkload(model, workload).ok()) return {};
  Shapes s;
  s.micro_batch = workload.micro_batch;
  s.seq = workload.seq_len;
  s.tokens = workload.micro_batch * workload.seq_len;
  s.bytes = traces::DTypeSize(workload.dtype);
  s.dtype = workload.dtype;
  s.hidden = model.hidden;
  s.hq = static_cast<int64_t>(model.heads) * model.head_dim();
  s.hkv = static_cast<int64_t>(model.kv_heads) * model.head_dim();
  s.ffn = model.ffn;
  s.vocab = model.vocab;
  s.experts = model.experts;
  s.top_k = model.experts_per_token;
  s.expert_rows = std::max<int64_t>(
      1, static_cast<int64_t>(std::llround(static_cast<double>(s.tokens * s.top_k) * workload.expert_load)));

  std::vector<ModuleKernels> modules;
  modules.reserve(static_cast<size_t>(model.layers) + 2);
  modules.push_back(BuildEmbed(model, s));
  // Every block is the same; build one and copy it under each name.
  const ModuleKernels layer = BuildLayer(model, s, "layers.0");
  for (int32_t i = 0; i < model.layers; ++i) {
    modules.push_back(layer);
    modules.back().name = fmt::format("layers.{}", i);
  }
  modules.push_back(BuildHead(model, s));
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

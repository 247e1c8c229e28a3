// Transformer model presets and their decomposition into the kernels a real
// implementation runs (QKV, attention, output projection, MLP GEMMs, norms, residuals,
// embedding, output head, loss), with parameter tensors and saved activations.
//
// The lowering (sim/lowering.h) turns these per-block kernel lists into schedule ops; the
// memory model and the FLOP accounting read the same lists, so counts agree by construction.
#ifndef SHARDSCOPE_SIM_MODEL_H_
#define SHARDSCOPE_SIM_MODEL_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "shardscope/traces/schedule.h"
#include "shardscope/base/status.h"

namespace shardscope::sim {

enum class MlpKind : uint8_t { kSwiGlu, kGelu };          // SwiGLU: gate, up, down
enum class NormKind : uint8_t { kRmsNorm, kLayerNorm };
enum class AttentionKind : uint8_t { kCausal, kBidirectional };  // decoder vs encoder

struct ModelSpec {
  std::string name;               // preset name or "custom"
  int32_t layers = 0;
  int64_t hidden = 0;
  int32_t heads = 0;
  int32_t kv_heads = 0;           // == heads without grouped-query attention
  int64_t ffn = 0;                // intermediate size (per expert for MoE)
  int64_t vocab = 0;
  int64_t max_positions = 0;      // learned position embeddings when > 0 and learned_positions
  bool learned_positions = false; // GPT/RoBERTa-style absolute position embedding table
  bool tied_embeddings = false;   // output head shares the input embedding
  bool bias = false;              // linear layers carry biases (GPT-3, RoBERTa)
  MlpKind mlp = MlpKind::kSwiGlu;
  NormKind norm = NormKind::kRmsNorm;
  AttentionKind attention = AttentionKind::kCausal;
  int32_t experts = 1;            // MoE: experts per layer (1 = dense)
  int32_t experts_per_token = 1;  // MoE: top-k routing

  // Architecture details beyond the table's dimensions. The defaults describe a Llama-style
  // decoder, so a plan that only gives dimensions gets the most common architecture.
  bool alibi = false;             // ALiBi (MPT): no position table and no RoPE kernel. With
                                  // neither alibi nor learned_positions the model uses RoPE.
  bool norm_bias = false;         // LayerNorm carries a bias (GPT-3, RoBERTa; not MPT, which
                                  // drops every bias). Never with RMSNorm.
  int64_t reserved_position_rows = 0;  // position-table rows beyond max_positions (RoBERTa:
                                       // 2, positions start after padding_idx = 1)
  int64_t token_types = 0;        // segment-embedding rows added to the input (RoBERTa: 1)
  bool embedding_norm = false;    // LayerNorm right after the embedding sum (BERT/RoBERTa)
  bool post_norm = false;         // BERT-style post-LN: each sub-layer's norm follows its
                                  // residual add, and there is no final norm before the head
  bool lm_head_transform = false; // BERT/RoBERTa LM head: dense(h, h) + GeLU + LayerNorm
                                  // before the output projection, whose bias (vocab) exists
                                  // even when its weight is tied
  bool fused_qkv = false;         // one GEMM makes q, k and v (GPT-2's c_attn, MPT's Wqkv);
                                  // otherwise three (Llama's wq/wk/wv, BERT's query/key/value)
  double dropout = 0;             // dropout probability after the embeddings, on the attention
                                  // probabilities and on each sub-layer's output (BERT's
                                  // hidden_dropout_prob and attention_probs_dropout_prob)

  int64_t head_dim() const { return hidden / heads; }
  bool rope() const { return !learned_positions && !alibi; }
  int64_t position_rows() const {
    return learned_positions ? max_positions + reserved_position_rows : 0;
  }
};

StatusOr<ModelSpec> FindModelPreset(std::string_view name);
std::vector<std::string> ModelPresetNames();
// Checks dimensions (positive, heads divide hidden, kv_heads divide heads, experts_per_token
// <= experts) and that the architecture flags agree (learned positions need max_positions,
// not with alibi; norm_bias needs LayerNorm). The message names the offending field.
Status ValidateModel(const ModelSpec& model);

// One parameter tensor of a module (for sharding, bucketing and memory).
struct ParamTensor {
  std::string name;   // e.g. "attention.wq.weight"
  int64_t numel = 0;
  bool matmul = false;  // used by a GEMM (linear weights and biases): autocast casts it
};

// An activation (or activation gradient) tensor of one module's forward or backward pass.
struct ActivationTensor {
  std::string name;        // module-local: "attn.q", "d.attn.q" (its gradient), ...
  int64_t bytes = 0;
  bool external = false;   // not allocated by the step (token ids, the loss's seed gradient)
  int32_t view_of = -1;    // a view: shares that tensor's storage (allocated with it)
};

// Who issues a kernel, which decides the host time before its launch (plan.h HostConfig).
enum class KernelDispatch : uint8_t {
  kPython,  // a Python-level op of the model code (eager forward, a checkpoint's recompute)
  kCpp,     // an ATen op issued from C++: the autograd engine's backward kernels, the ops a
            // composite ATen op (nn.RMSNorm before PyTorch 2.9) runs inside one Python call
};

// One kernel a module runs and the tensors it touches. `writes` are fresh tensors, allocated
// right before the launch (as the caching allocator sees PyTorch allocate an op's outputs);
// `reads` are the tensors it reads. An in-place kernel reads and writes an existing tensor: it
// lists it under `reads` only.
struct ModuleKernel {
  std::string name;                 // e.g. "attn.wq", "mlp.w2.dgrad", "loss.log_softmax"
  traces::ComputeDesc compute;
  std::vector<int32_t> reads;       // indices into ModuleKernels::tensors
  std::vector<int32_t> writes;
  int64_t workspace_bytes = 0;      // allocated for this kernel alone (flash backward's dq_accum)
  KernelDispatch dispatch = KernelDispatch::kPython;
  // Backward: writes parameter gradients (a wgrad GEMM, a norm's weight reduction, a bias sum,
  // the embedding's scatter). DDP's and ZeRO's per-parameter hooks fire after it.
  bool weight_grad = false;
  // Forward: an op whose outputs torchtitan's op-level selective checkpointing saves (matmuls
  // and fused attention; the policy keeps every other matmul, see lowering).
  bool matmul = false;
  bool fused_attention = false;
};

// A module as FSDP wraps it: a transformer block, the embedding, or the final norm + head +
// loss. forward and backward are in execution order; backward is what autograd launches for
// this module's ops in reverse order: input gradients (dgrad), weight gradients (wgrad), the
// additions where a tensor's gradients from several uses meet. A module reads the previous
// module's output as `input` and hands it `input_grad`; the lowering links the two
// (lowering_internal.h ActivationPlan).
struct ModuleKernels {
  std::string name;                 // "embed", "layers.0", ..., "head"
  std::vector<ParamTensor> params;
  std::vector<ActivationTensor> tensors;
  int32_t input = -1;               // the previous module's output (embed: the token ids)
  int32_t output = -1;              // what the next module reads (head: the loss)
  int32_t output_grad = -1;         // the gradient of `output` the next module's backward produces
  int32_t input_grad = -1;          // the gradient of `input` this backward produces (-1: none)
  std::vector<ModuleKernel> forward;
  std::vector<ModuleKernel> backward;
  int64_t param_numel() const;
  // Bytes autograd keeps from the forward for the backward without activation checkpointing:
  // the forward tensors backward kernels read (the module's input included).
  int64_t saved_bytes() const;
};

// How the training job's framework code runs a model on the GPU: which kernels it launches.
// sim/plan/src/plan_training.cc (ResolveKernelChoices) resolves the defaults from the framework, the PyTorch version and the GPU.
enum class ModelImplementation : uint8_t {
  kTorchtitan,   // torchtitan's model code (wq/wk/wv, RoPE through complex64, nn.RMSNorm)
  kHuggingFace,  // transformers' modeling_*.py (LlamaRMSNorm in Python, rotate_half RoPE)
};
enum class RmsNormKernel : uint8_t {
  kFused,      // torch._fused_rms_norm: one kernel (nn.RMSNorm from PyTorch 2.9)
  kComposite,  // ATen's composite rms_norm (nn.RMSNorm in PyTorch 2.4-2.8): fp32 upcast, pow,
               // mean, add_, rsqrt, mul, mul(weight), cast, from C++
  kPython,     // the Python RMSNorm of transformers' LlamaRMSNorm and torchtitan's early norms.py
};
struct KernelChoices {
  ModelImplementation implementation = ModelImplementation::kTorchtitan;
  RmsNormKernel rms_norm = RmsNormKernel::kFused;
  // torch.compile on each block: Inductor's fused kernels (estimate, see model_kernels.cc).
  bool compile = false;
  // torch.compile on the loss too (no T x V fp32 logits materialized).
  bool compile_loss = false;
  // Unfused attention (matmul, scale, mask, softmax, dropout, matmul), as transformers' "eager"
  // attention and PyTorch before scaled_dot_product_attention (2.0); otherwise one fused kernel.
  bool eager_attention = false;
  traces::AttentionImpl attention = traces::AttentionImpl::kFlash2;
  // Grouped-query attention by materialized K/V copies (torchtitan's repeat_kv) rather than
  // the kernel reading kv_heads heads (enable_gqa).
  bool repeat_kv = false;
};

struct Workload {
  int64_t micro_batch = 1;
  int64_t seq_len = 2048;
  traces::DType dtype = traces::DType::kBFloat16;  // activations and GEMMs
  // Tokens this rank's experts process relative to a balanced router (expert parallelism:
  // the rank runs its experts on the tokens routed to them from every rank). 1 = balanced.
  double expert_load = 1;
  KernelChoices kernels;
};

// Checks the workload against the model: micro_batch and seq_len positive, seq_len within
// max_positions when positions are learned. The message names the offending field.
Status ValidateWorkload(const ModelSpec& model, const Workload& workload);

// The modules of one forward/backward pass in forward order: embed, layers.0 ..
// layers.{L-1}, head (final norm + output projection + cross-entropy loss).
// Requires ValidateModel and ValidateWorkload to pass; returns an empty vector otherwise.
// With tied embeddings the shared matrix is listed once, under embed.
std::vector<ModuleKernels> DecomposeModel(const ModelSpec& model, const Workload& workload);

// The parameter tensors of each module, in DecomposeModel's order and names (embed, layers.0 ..
// layers.{L-1}, head), without the kernels: what a framework materializes before the first step.
struct ModuleParams {
  std::string name;
  std::vector<ParamTensor> params;
};
std::vector<ModuleParams> ModelParameters(const ModelSpec& model);

// Parameter counts. Total = embedding (+ positions) + layers x block + final norm + head
// (0 when tied).
int64_t ParameterCount(const ModelSpec& model);
// Parameters used per token (MoE: only the routed experts count).
int64_t ActiveParameterCount(const ModelSpec& model);

// Parameters taking part in matrix products per token (MoE: routed experts only): what the
// 6N of the FLOP count multiplies. Leaves out embedding lookups (token, position, segment),
// norms and biases (an epilogue add, not a product); keeps the output projection even when
// tied to the embedding.
int64_t ActiveMatmulParameterCount(const ModelSpec& model);

// Model FLOPs per token for one training step (forward + backward, no recompute):
// 6 x (active params in matrix products, i.e. without the input embedding lookup) + attention
// (12 x layers x hidden x seq, halved for causal attention). See model-accounting reference.
// Equals the GEMM + attention FLOPs of DecomposeModel per token when attention backward is
// counted as 2x forward (model FLOPs; flash attention's recompute is not model work).
double TrainingFlopsPerToken(const ModelSpec& model, int64_t seq_len);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_MODEL_H_

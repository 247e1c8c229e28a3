#include "shardscope/sim/presets/mfu_conventions.h"

#include <string>

namespace shardscope::sim {

namespace {

// Every framework here counts 2 FLOPs per multiply-add and the backward as twice the forward.
constexpr double kTrainingFlopsPerParam = 6.0;
// Q K^T and (Q K^T) V: 2 x 2 x seq x (heads x head_dim) forward per layer and token, x 3 for
// training, over the full seq x seq score matrix (none of these halve it for a causal mask).
constexpr double kFullAttentionTrainingFactor = 12.0;

double D(int64_t v) { return static_cast<double>(v); }

// Parameters of the model's nn.Embedding tables (token, learned positions, token types).
int64_t EmbeddingTableNumel(const ModelSpec& m) {
  return (m.vocab + m.position_rows() + m.token_types) * m.hidden;
}

bool Contains(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

}  // namespace

std::string_view MfuConventionName(MfuConvention convention) {
  switch (convention) {
    case MfuConvention::kTorchtitan: return "torchtitan";
    case MfuConvention::kMegatron: return "megatron";
    case MfuConvention::kLlmFoundry: return "llm_foundry";
    case MfuConvention::kDeepSpeed: return "deepspeed";
  }
  return "unknown";
}

double ConventionFlopsPerToken(MfuConvention convention, const ModelSpec& m, int64_t seq_len) {
  const double q_width = D(m.heads) * D(m.head_dim());
  const double full_attention = kFullAttentionTrainingFactor * D(m.layers) * q_width * D(seq_len);
  switch (convention) {
    case MfuConvention::kTorchtitan: {
      // torchtitan models/utils.py get_dense_model_nparams_and_flops (and the MoE variant,
      // which counts only the routed experts): 6 x (every parameter but the nn.Embedding
      // children; a table shared with the output head stays) + 12 x layers x heads x head_dim
      // x seq_len ("we follow the convention and do not account for sparsity in causal
      // attention").
      const int64_t embedding = m.tied_embeddings ? EmbeddingTableNumel(m) - m.vocab * m.hidden
                                                  : EmbeddingTableNumel(m);
      return kTrainingFlopsPerParam * D(ActiveParameterCount(m) - embedding) + full_attention;
    }
    case MfuConvention::kMegatron:
      // Megatron-LM training.py num_floating_point_operations (2025+): GQA- and SwiGLU-aware
      // projections, attention halved for the causal mask, 6 x hidden x vocab for the logits;
      // shardscope's own model FLOPs are this formula.
      return TrainingFlopsPerToken(m, seq_len);
    case MfuConvention::kLlmFoundry: {
      // llm-foundry ComposerMPTCausalLM.flops_per_batch: (2 x params x msl + 2 x 2 x n_layers x
      // d_model x msl^2) x 3 per sequence, params = n_active_params less wte when untied
      // ("embedding layers are lookup tables"); a tied wte counts as the LM head.
      const int64_t wte = m.tied_embeddings ? 0 : m.vocab * m.hidden;
      return kTrainingFlopsPerParam * D(ActiveParameterCount(m) - wte) +
             kFullAttentionTrainingFactor * D(m.layers) * D(m.hidden) * D(seq_len);
    }
    case MfuConvention::kDeepSpeed:
      // DeepSpeed flops profiler: F.linear counts 2 x input.numel() x out_features (no bias),
      // F.scaled_dot_product_attention the full score matrix (is_causal ignored), F.embedding
      // 0; the engine prints 3 x the forward (recompute_fwd_factor defaults to 0). Norms,
      // activations and elementwise ops, which the profiler also counts, are left out here
      // (under 0.1% of a transformer's forward).
      return kTrainingFlopsPerParam * D(ActiveMatmulParameterCount(m)) + full_attention;
  }
  return 0;
}

double ConventionPeakFlops(MfuConvention convention, const GpuSpec& gpu, traces::DType dtype) {
  const bool sixteen_bit = dtype == traces::DType::kBFloat16 || dtype == traces::DType::kFloat16;
  switch (convention) {
    case MfuConvention::kTorchtitan:
      // torchtitan tools/utils.py get_peak_flops (by device name, bf16 whatever the dtype):
      // A100 312e12; H100 NVL 835e12, PCIe 756e12, SXM and other H100s 989e12; H200 989e12;
      // anything else "fallback to A100" 312e12.
      if (Contains(gpu.name, "h100")) {
        if (Contains(gpu.name, "nvl")) return 835e12;
        if (Contains(gpu.name, "pcie")) return 756e12;
        return 989e12;
      }
      if (Contains(gpu.name, "h200")) return 989e12;
      return 312e12;
    case MfuConvention::kLlmFoundry:
      // Composer callbacks/speed_monitor.py GPU_AVAILABLE_FLOPS (amp_bf16 / amp_fp16 rows):
      // a100 312e12, h100-sxm and h200-sxm 1.979e15 / 2, v100-sxm fp16 125e12 (no bf16 row).
      if (!sixteen_bit) return 0;
      if (Contains(gpu.name, "a100")) return 312e12;
      if (Contains(gpu.name, "h100-sxm") || Contains(gpu.name, "h200")) return 1.979e15 / 2;
      if (Contains(gpu.name, "v100-sxm")) return dtype == traces::DType::kFloat16 ? 125e12 : 0;
      return 0;
    case MfuConvention::kMegatron:
    case MfuConvention::kDeepSpeed:
      // Both print TFLOP/s per GPU; MFU is that over the datasheet's dense peak.
      return PeakFlops(gpu, dtype);
  }
  return 0;
}

}  // namespace shardscope::sim

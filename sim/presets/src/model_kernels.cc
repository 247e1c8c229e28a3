// The kernels PyTorch launches for one training step of a model, op by op (model.h
// DecomposeModel), with the tensors each op allocates and what autograd saves.
//
// Each module is recorded as the eager ops its framework code runs, in order. An op has at most
// one forward kernel; its outputs are allocated right before it. Its backward is what the op's
// derivative formula launches (tools/autograd/derivatives.yaml), reading the gradients of the
// op's outputs and the tensors the formula needs (what autograd saves), and writing fresh
// gradients of its inputs. GraphBuilder::Build walks the ops in reverse, as the autograd engine
// does, and adds the additions where a tensor's gradients from several uses meet
// (torch/csrc/autograd/input_buffer.cpp InputBuffer::add: in place into the first buffer when
// nothing else holds it, otherwise out of place). Views launch nothing and are not recorded.
//
// Notation: T = micro_batch x seq_len tokens, b = bytes per activation element (Workload::dtype),
// h = hidden, hq = heads x head_dim, hkv = kv_heads x head_dim, f = ffn, V = vocab. Norm
// statistics, flash attention's log-sum-exp and the loss's upcast logits are fp32 (4 bytes);
// token ids, targets and expert indices int64.
//
// The per-family op lists and their sources:
// * Llama (torchtitan): torchtitan/models/llama3/model/model.py: TransformerBlock.forward
//   (h = x + attention(attention_norm(x)); out = h + feed_forward(ffn_norm(h))), Attention
//   (wq, wk, wv as three nn.Linear; apply_rotary_emb through view_as_complex of xq.float() times
//   freqs_cis, view_as_real, type_as; repeat_kv = unsqueeze/expand/reshape, a copy; SDPA with
//   is_causal; output.transpose(1, 2).contiguous() is already contiguous after flash attention),
//   FeedForward w2(F.silu(w1(x)) * w3(x)); nn.RMSNorm. Loss: components/loss.py
//   cross_entropy(pred.flatten(0, 1).float(), labels): the fp32 upcast, log_softmax, nll_loss.
// * Llama (transformers): models/llama/modeling_llama.py: LlamaRMSNorm in Python
//   (hidden_states.to(float32), pow(2).mean(-1), rsqrt(variance + eps), .to(input_dtype),
//   weight *), apply_rotary_pos_emb (q * cos + rotate_half(q) * sin, rotate_half = cat(-x2,
//   x1)), q/k/v/o_proj, LlamaMLP; loss/loss_utils.py ForCausalLMLoss (logits.float()).
// * RoBERTa (transformers, 2021 eager): models/roberta/modeling_roberta.py: query/key/value
//   linears with bias, matmul(q, k^T) / sqrt(d) + mask, softmax, dropout, matmul(probs, v),
//   permute().contiguous(); dense + dropout + LayerNorm(x + residual) (post-LN); intermediate
//   dense + gelu, output dense + dropout + LayerNorm; LM head dense + gelu + LayerNorm +
//   decoder; CrossEntropyLoss on the (fp16) logits.
// * GPT-3 / MPT: one fused q/k/v linear (GPT-2's c_attn, llm-foundry's Wqkv), LayerNorm (one
//   native_layer_norm kernel), GeLU MLP, fused attention.
// Backward kernel counts per op follow derivatives.yaml and the kernels' sources: mm -> two
// GEMMs (mm_mat1_backward, mm_mat2_backward); a broadcast operand's gradient adds a sum_to
// reduction (torch/csrc/autograd/engine.cpp validate_outputs); pow(x, 2) -> pow(x, 1) (a copy,
// Pow.cpp), x 2, x grad; rsqrt -> result.pow(3), x -0.5, x grad; nll_loss_backward -> a
// zero-fill and a scatter (counted as one kernel writing the dense gradient);
// _fused_rms_norm_backward -> dX and dgamma kernels (layer_norm_kernel.cu); flash attention's
// backward (flash_api.cpp mha_bwd) allocates an fp32 dq accumulator and, for grouped-query
// attention, dk/dv expanded to every query head, summed after.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "autograd_graph.h"
#include "model_params.h"
#include "shardscope/sim/presets/model.h"

namespace shardscope::sim {
namespace {

using traces::AttentionDesc;
using traces::ComputeDesc;
using traces::DType;
using traces::GemmDesc;
using traces::MemoryBoundDesc;

constexpr int64_t kFp32Bytes = 4;
constexpr int64_t kIndexBytes = 8;
constexpr int64_t kMaskBytes = 1;  // native_dropout's mask is torch.bool
// torchtitan's freqs_cis: complex64 (8 bytes) per (position, head_dim / 2).
constexpr int64_t kComplex64Bytes = 8;
// flash_api.cpp mha_bwd: seqlen_q_rounded = round_multiple(seqlen_q, 128); head_size_rounded =
// round_multiple(head_size, head_size <= 128 ? 32 : 64).
constexpr int64_t kFlashSeqRound = 128;

int64_t RoundUp(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// Shapes shared by the kernels of one workload.
struct Shapes {
  int64_t micro_batch = 0;
  int64_t seq = 0;
  int64_t tokens = 0;  // T
  int64_t bytes = 0;   // b
  DType dtype = DType::kBFloat16;
  int64_t hidden = 0, hq = 0, hkv = 0, ffn = 0, vocab = 0, head_dim = 0;
  int64_t heads = 0, kv_heads = 0;
  int64_t experts = 1, top_k = 1;
  int64_t expert_rows = 0;  // token rows the rank's experts run: T x top_k x expert load
  KernelChoices kernels;

  int64_t Act(int64_t width) const { return tokens * width * bytes; }
};

using kernels_internal::BackwardStep;
using kernels_internal::GraphBuilder;
using kernels_internal::Mem;

// ---- Op helpers -------------------------------------------------------------------------------

// nn.Linear on T rows: y = x W^T (+ bias in the GEMM's epilogue: addmm). Saves x for the
// weight gradient. Backward: the bias gradient (a sum over T rows, for addmm), dgrad, wgrad.
int32_t Linear(GraphBuilder& g, const Shapes& s, const std::string& name, int32_t x, int64_t in, int64_t out,
               bool bias, int64_t rows = -1, int64_t batch = 1, int32_t into = -1) {
  const int64_t m = rows < 0 ? s.tokens : rows;
  const int32_t y = into >= 0 ? into : g.Tensor(name + ".out", batch * m * out * s.bytes);
  std::vector<BackwardStep> bwd;
  if (bias) {
    bwd.push_back({".bias_grad", Mem(batch * m * out * s.bytes, batch * out * s.bytes), {}, {}, {}, {}, {}, 0, true, true});
  }
  bwd.push_back({".dgrad", GemmDesc{m, in, out, batch, s.dtype}, {}, {x}, {}, {}, {}, 0});
  bwd.push_back({".wgrad", GemmDesc{in, out, m, batch, s.dtype}, {x}, {}, {}, {}, {}, 0, true, true});
  g.Op(name, GemmDesc{m, out, in, batch, s.dtype}, {x}, {y}, std::move(bwd), KernelDispatch::kPython,
       /*matmul=*/true);
  return y;
}

// An elementwise op that keeps nothing and passes its gradient through a kernel of the same
// size (a dtype cast: its backward casts back).
int32_t Cast(GraphBuilder& g, const std::string& name, int32_t x, int64_t elements, int64_t in_bytes,
             int64_t out_bytes, KernelDispatch dispatch = KernelDispatch::kPython) {
  const int32_t y = g.Tensor(name + ".out", elements * out_bytes);
  g.Op(name, Mem(elements * in_bytes, elements * out_bytes), {x}, {y},
       {{".bwd", Mem(elements * out_bytes, elements * in_bytes), {}, {x}, {}, {}, {}, 0}}, dispatch);
  return y;
}

// a + b (same shape): the gradient passes through to both.
int32_t Add(GraphBuilder& g, const std::string& name, int32_t a, int32_t b, int64_t bytes) {
  const int32_t y = g.Tensor(name + ".out", bytes);
  g.Op(name, Mem(2 * bytes, bytes), {a, b}, {y}, {{"", std::nullopt, {}, {a, b}, {}, {}, {}, 0}});
  return y;
}

// native_dropout: writes the output and a bool mask (saved); backward masks and scales.
int32_t Dropout(GraphBuilder& g, const std::string& name, int32_t x, int64_t elements, int64_t elem_bytes) {
  const int32_t y = g.Tensor(name + ".out", elements * elem_bytes);
  const int32_t mask = g.Tensor(name + ".mask", elements * kMaskBytes, false);
  g.Op(name, Mem(elements * elem_bytes, elements * (elem_bytes + kMaskBytes)), {x}, {y, mask},
       {{".bwd", Mem(elements * (elem_bytes + kMaskBytes), elements * elem_bytes), {mask}, {x}, {}, {}, {}, 0}});
  return y;
}

// RMSNorm / LayerNorm over `width` of `rows` rows.
int32_t Norm(GraphBuilder& g, const Shapes& s, const ModelSpec& m, const std::string& name, int32_t x,
             int64_t rows = -1) {
  const int64_t T = rows < 0 ? s.tokens : rows;
  const int64_t h = s.hidden;
  const int64_t act = T * h * s.bytes;
  const int64_t act32 = T * h * kFp32Bytes;
  const int64_t stat = T * kFp32Bytes;
  const int64_t weight = h * s.bytes;
  if (m.norm == NormKind::kLayerNorm || s.kernels.rms_norm == RmsNormKernel::kFused || s.kernels.compile) {
    // One kernel (native_layer_norm; _fused_rms_norm; an Inductor reduction): saves the input and
    // the fp32 statistics (LayerNorm: mean and rstd). Backward: dX, then dgamma (+dbeta).
    const int64_t stats = stat * (m.norm == NormKind::kLayerNorm ? 2 : 1);
    const int32_t y = g.Tensor(name + ".out", act);
    const int32_t st = g.Tensor(name + ".stats", stats, false);
    g.Op(name, Mem(act + weight, act + stats), {x}, {y, st},
         {{".bwd_input", Mem(2 * act + stats + weight, act), {x, st}, {x}, {}, {}, {}, 0},
          {".bwd", Mem(2 * act + stats, weight * (m.norm_bias ? 2 : 1)), {x, st}, {}, {}, {}, {}, 0, true, true}});
    return y;
  }
  const bool composite = s.kernels.rms_norm == RmsNormKernel::kComposite;
  const KernelDispatch d = composite ? KernelDispatch::kCpp : KernelDispatch::kPython;
  // x.to(float32)
  const int32_t x32 = g.Tensor(name + ".x_fp32", act32);
  g.Op(name + ".to_fp32", Mem(act, act32), {x}, {x32}, {{".bwd", Mem(act32, act), {}, {x}, {}, {}, {}, 0}},
       composite ? KernelDispatch::kPython : d);
  // pow(x32, 2): saves x32. Backward: x32.pow(1) (a copy), * 2, * grad.
  const int32_t p = g.Tensor(name + ".pow", act32);
  const int32_t t1 = g.Tensor(name + ".pow.bwd_t1", act32, false);
  const int32_t t2 = g.Tensor(name + ".pow.bwd_t2", act32, false);
  g.Op(name + ".pow", Mem(act32, act32), {x32}, {p},
       {{".bwd_pow1", Mem(act32, act32), {x32}, {}, {}, {t1}, {}, 0, false},
        {".bwd_scale", Mem(act32, act32), {}, {}, {}, {t2}, {t1}, 0, false},
        {".bwd", Mem(2 * act32, act32), {}, {x32}, {}, {}, {t2}, 0}},
       d);
  // mean(-1, keepdim): backward expands the gradient / h: one full-size kernel.
  const int32_t mean = g.Tensor(name + ".mean", stat);
  g.Op(name + ".mean", Mem(act32, stat), {p}, {mean}, {{".bwd", Mem(stat, act32), {}, {p}, {}, {}, {}, 0}}, d);
  int32_t var = mean;
  if (composite) {
    // .add_(eps): in place, its backward the identity.
    g.Op(name + ".add_eps", Mem(stat, stat), {mean}, {}, {}, d);
  } else {
    var = g.Tensor(name + ".add_eps", stat);
    g.Op(name + ".add_eps", Mem(stat, stat), {mean}, {var}, {{"", std::nullopt, {}, {mean}, {}, {}, {}, 0}}, d);
  }
  // rsqrt: saves its result; backward result.pow(3), * -0.5, * grad (tiny).
  const int32_t r = g.Tensor(name + ".rsqrt", stat);
  const int32_t r1 = g.Tensor(name + ".rsqrt.bwd_t1", stat, false);
  const int32_t r2 = g.Tensor(name + ".rsqrt.bwd_t2", stat, false);
  g.Op(name + ".rsqrt", Mem(stat, stat), {var}, {r},
       {{".bwd_pow3", Mem(stat, stat), {r}, {}, {}, {r1}, {}, 0, false},
        {".bwd_scale", Mem(stat, stat), {}, {}, {}, {r2}, {r1}, 0, false},
        {".bwd", Mem(2 * stat, stat), {}, {var}, {}, {}, {r2}, 0}},
       d);
  // x32 * r (r broadcast over h): saves both; r's gradient needs a sum over h.
  const int32_t y32 = g.Tensor(name + ".normed_fp32", act32);
  const int32_t u = g.Tensor(name + ".mul.bwd_t", act32, false);
  g.Op(name + ".mul", Mem(act32 + stat, act32), {x32, r}, {y32},
       {{".bwd_input", Mem(act32 + stat, act32), {r}, {x32}, {}, {}, {}, 0},
        {".bwd_rstd", Mem(2 * act32, act32), {x32}, {}, {}, {u}, {}, 0},
        {".bwd_rstd_sum", Mem(act32, stat), {}, {r}, {}, {}, {u}, 0, false}},
       d);
  // The weight: composite multiplies in fp32 before the cast back; the Python norms cast first
  // and multiply in the activation dtype. Its gradient: grad * normed, summed over T rows.
  const int64_t wbytes = composite ? kFp32Bytes : s.bytes;
  int32_t before_weight = y32;
  if (!composite) before_weight = Cast(g, name + ".to_input_dtype", y32, T * h, kFp32Bytes, s.bytes, d);
  const int64_t wact = T * h * wbytes;
  const int32_t yw = g.Tensor(name + ".weighted", wact);
  const int32_t w1 = g.Tensor(name + ".mul_weight.bwd_t", wact, false);
  g.Op(name + ".mul_weight", Mem(wact + weight, wact), {before_weight}, {yw},
       {{".bwd_input", Mem(wact + weight, wact), {}, {before_weight}, {}, {}, {}, 0},
        {".bwd_weight", Mem(2 * wact, wact), {before_weight}, {}, {}, {w1}, {}, 0},
        {".bwd", Mem(wact, weight), {}, {}, {}, {}, {w1}, 0, false, true}},
       d);
  if (!composite) return yw;
  return Cast(g, name + ".to_input_dtype", yw, T * h, kFp32Bytes, s.bytes, d);
}

// Rotary embedding of one of q / k (`width` = heads x head_dim columns).
int32_t Rope(GraphBuilder& g, const Shapes& s, const std::string& name, int32_t x, int64_t width) {
  const int64_t n = s.tokens * width;
  if (s.kernels.implementation == ModelImplementation::kTorchtitan) {
    // apply_rotary_emb: xq.float() (a copy), view_as_complex (a view) * freqs_cis (complex64,
    // seq x head_dim / 2: it needs no grad, so nothing is saved), view_as_real + flatten (views),
    // type_as(xq). Backward: the cast back, the multiply by conj(freqs_cis) (materialized
    // first: mul has no conjugate fallthrough), the cast.
    const int64_t freqs = s.seq * s.head_dim / 2 * kComplex64Bytes;
    const int32_t x32 = Cast(g, name + ".to_fp32", x, n, s.bytes, kFp32Bytes);
    const int32_t rot = g.Tensor(name + ".rotated", n * kFp32Bytes);
    const int32_t conj = g.Tensor(name + ".bwd_conj", freqs, false);
    g.Op(name + ".mul", Mem(n * kFp32Bytes + freqs, n * kFp32Bytes), {x32}, {rot},
         {{".bwd_conj", Mem(freqs, freqs), {}, {}, {}, {conj}, {}, 0, false},
          {".bwd", Mem(n * kFp32Bytes + freqs, n * kFp32Bytes), {}, {x32}, {}, {}, {conj}, 0}});
    return Cast(g, name + ".type_as", rot, n, kFp32Bytes, s.bytes);
  }
  // transformers: q * cos + rotate_half(q) * sin, rotate_half = cat((-x2, x1)); cos / sin
  // (seq x head_dim, activation dtype) need no grad. Backward of the halves: slice_backward
  // (a zero fill and a copy, counted as one kernel writing the full size) per half.
  const int64_t table = s.seq * s.head_dim * s.bytes;
  const int64_t full = n * s.bytes;
  const int32_t c = g.Tensor(name + ".cos", full);
  g.Op(name + ".mul_cos", Mem(full + table, full), {x}, {c}, {{".bwd", Mem(full + table, full), {}, {x}, {}, {}, {}, 0}});
  const int32_t neg = g.Tensor(name + ".neg", full / 2);
  g.Op(name + ".neg", Mem(full / 2, full / 2), {x}, {neg}, {{".bwd", Mem(full / 2, full), {}, {x}, {}, {}, {}, 0}});
  const int32_t cat = g.Tensor(name + ".rotate_half", full);
  g.Op(name + ".cat", Mem(full, full), {neg, x}, {cat},
       {{".bwd_neg", std::nullopt, {}, {neg}, {}, {}, {}, 0}, {".bwd", Mem(full / 2, full), {}, {x}, {}, {}, {}, 0}});
  const int32_t sn = g.Tensor(name + ".sin", full);
  g.Op(name + ".mul_sin", Mem(full + table, full), {cat}, {sn},
       {{".bwd", Mem(full + table, full), {}, {cat}, {}, {}, {}, 0}});
  return Add(g, name + ".add", c, sn, full);
}

// repeat_kv: unsqueeze/expand/reshape of a strided view: a copy to `heads` heads. Backward:
// the expand's sum_to over the repeats.
int32_t RepeatKv(GraphBuilder& g, const Shapes& s, const std::string& name, int32_t x) {
  const int64_t in = s.tokens * s.hkv * s.bytes;
  const int64_t out = s.tokens * s.hq * s.bytes;
  const int32_t y = g.Tensor(name + ".out", out);
  g.Op(name, Mem(in, out), {x}, {y}, {{".bwd", Mem(out, in), {}, {x}, {}, {}, {}, 0}});
  return y;
}

// Scaled dot-product attention on q (hq columns) and k, v (`kv_width` columns each).
int32_t Attention(GraphBuilder& g, const Shapes& s, const ModelSpec& m, int32_t q, int32_t k, int32_t v,
                  int64_t kv_heads) {
  const bool causal = m.attention == AttentionKind::kCausal;
  if (s.kernels.eager_attention) {
    // transformers' eager attention / PyTorch before SDPA: scores materialized (b x heads x s x s).
    const int64_t bh = s.micro_batch * s.heads;
    const int64_t sc = bh * s.seq * s.seq;
    const int64_t e = s.bytes;
    const int32_t k_full = kv_heads < s.heads ? RepeatKv(g, s, "attn.repeat_k", k) : k;
    const int32_t v_full = kv_heads < s.heads ? RepeatKv(g, s, "attn.repeat_v", v) : v;
    const int32_t scores = g.Tensor("attn.scores", sc * e);
    g.Op("attn.scores", GemmDesc{s.seq, s.seq, s.head_dim, bh, s.dtype}, {q, k_full}, {scores},
         {{".dgrad_q", GemmDesc{s.seq, s.head_dim, s.seq, bh, s.dtype}, {k_full}, {q}, {}, {}, {}, 0},
          {".dgrad_k", GemmDesc{s.seq, s.head_dim, s.seq, bh, s.dtype}, {q}, {k_full}, {}, {}, {}, 0}},
         KernelDispatch::kPython, /*matmul=*/true);
    const int32_t scaled = g.Tensor("attn.scale", sc * e);
    g.Op("attn.scale", Mem(sc * e, sc * e), {scores}, {scaled}, {{".bwd", Mem(sc * e, sc * e), {}, {scores}, {}, {}, {}, 0}});
    // + the (broadcast) attention mask: the gradient passes through.
    const int32_t masked = g.Tensor("attn.mask_add", sc * e);
    g.Op("attn.mask_add", Mem(sc * e, sc * e), {scaled}, {masked}, {{"", std::nullopt, {}, {scaled}, {}, {}, {}, 0}});
    // softmax: saves its output.
    const int32_t probs = g.Tensor("attn.softmax", sc * e);
    g.Op("attn.softmax", Mem(sc * e, sc * e), {masked}, {probs},
         {{".bwd", Mem(2 * sc * e, sc * e), {probs}, {masked}, {}, {}, {}, 0}});
    const int32_t dropped = m.dropout > 0 ? Dropout(g, "attn.dropout", probs, sc, e) : probs;
    const int32_t ctx = g.Tensor("attn.context", s.tokens * s.hq * e);
    g.Op("attn.context", GemmDesc{s.seq, s.head_dim, s.seq, bh, s.dtype}, {dropped, v_full}, {ctx},
         {{".dgrad_probs", GemmDesc{s.seq, s.seq, s.head_dim, bh, s.dtype}, {v_full}, {dropped}, {}, {}, {}, 0},
          {".dgrad_v", GemmDesc{s.seq, s.head_dim, s.seq, bh, s.dtype}, {dropped}, {v_full}, {}, {}, {}, 0}},
         KernelDispatch::kPython, /*matmul=*/true);
    // permute(0, 2, 1, 3).contiguous(): a copy back to (tokens, heads x head_dim).
    return Cast(g, "attn.context_contiguous", ctx, s.tokens * s.hq, e, e);
  }
  // One fused kernel (flash / cuDNN / memory-efficient): reads q, k, v (kv_heads heads); writes
  // the output and the fp32 log-sum-exp; saves q, k, v, output and log-sum-exp.
  const AttentionDesc fwd{s.micro_batch, s.heads, kv_heads, s.seq, s.seq, s.head_dim, causal, false, s.dtype,
                          s.kernels.attention};
  AttentionDesc bwd = fwd;
  bwd.backward = true;
  const int64_t out_bytes = s.tokens * s.hq * s.bytes;
  const int64_t lse = s.micro_batch * s.heads * s.seq * kFp32Bytes;
  const int32_t out = g.Tensor("attn.sdpa.out", out_bytes);
  const int32_t lse_t = g.Tensor("attn.sdpa.logsumexp", lse, false);
  // Backward workspace (flash_api.cpp mha_bwd): dq_accum fp32 (batch, seqlen_q rounded to 128,
  // heads, head_dim rounded to 32) and softmax_d fp32 (batch, heads, seqlen_q rounded).
  const int64_t seq_r = RoundUp(s.seq, kFlashSeqRound);
  const int64_t hd_r = RoundUp(s.head_dim, s.head_dim <= 128 ? 32 : 64);
  const int64_t workspace = s.micro_batch * seq_r * s.heads * hd_r * kFp32Bytes + s.micro_batch * s.heads * seq_r * kFp32Bytes;
  std::vector<BackwardStep> steps;
  if (kv_heads < s.heads) {
    // Grouped-query attention read natively: dk and dv are written for every query head, then
    // summed over the groups (at::sum_out).
    const int64_t expanded = s.tokens * s.hq * s.bytes;
    const int64_t kv = s.tokens * kv_heads * s.head_dim * s.bytes;
    const int32_t dk_x = g.Tensor("attn.sdpa.dk_expanded", expanded, false);
    const int32_t dv_x = g.Tensor("attn.sdpa.dv_expanded", expanded, false);
    steps.push_back({".bwd", bwd, {q, k, v, out, lse_t}, {q}, {}, {dk_x, dv_x}, {}, workspace});
    steps.push_back({".bwd_sum_dk", Mem(expanded, kv), {}, {k}, {}, {}, {dk_x}, 0, false});
    steps.push_back({".bwd_sum_dv", Mem(expanded, kv), {}, {v}, {}, {}, {dv_x}, 0, false});
  } else {
    steps.push_back({".bwd", bwd, {q, k, v, out, lse_t}, {q, k, v}, {}, {}, {}, workspace});
  }
  g.Op("attn.sdpa", fwd, {q, k, v}, {out, lse_t}, std::move(steps), KernelDispatch::kPython, false,
       /*fused_attention=*/true);
  return out;
}

// ---- Modules ----------------------------------------------------------------------------------

// The attention sub-layer on the (normed) input `x`; returns the output projection's output.
int32_t AttentionSublayer(GraphBuilder& g, const Shapes& s, const ModelSpec& m, int32_t x) {
  int32_t q = -1, k = -1, v = -1;
  if (m.fused_qkv) {
    // One GEMM, then q, k, v are views of its output (split): the attention kernel reads them.
    const int32_t qkv = Linear(g, s, "attn.wqkv", x, s.hidden, s.hq + 2 * s.hkv, m.bias);
    // split: q, k, v are views of the GEMM's output; the split's backward concatenates their
    // gradients into one tensor (one kernel).
    q = g.View("attn.q", qkv, s.Act(s.hq));
    k = g.View("attn.k", qkv, s.Act(s.hkv));
    v = g.View("attn.v", qkv, s.Act(s.hkv));
    const int64_t all = s.Act(s.hq + 2 * s.hkv);
    g.Op("attn.split_qkv", std::nullopt, {qkv}, {q, k, v}, {{".bwd", Mem(all, all), {}, {qkv}, {}, {}, {}, 0}});
  } else {
    q = Linear(g, s, "attn.wq", x, s.hidden, s.hq, m.bias);
    k = Linear(g, s, "attn.wk", x, s.hidden, s.hkv, m.bias);
    v = Linear(g, s, "attn.wv", x, s.hidden, s.hkv, m.bias);
  }
  if (m.rope()) {
    if (s.kernels.compile) {
      // Inductor fuses both rotations (and repeat_kv's copies) into one pointwise kernel;
      // ESTIMATE of the fusion, see the file comment.
      const bool repeat = s.kernels.repeat_kv && m.kv_heads < m.heads;
      const int64_t kw = repeat ? s.hq : s.hkv;
      const int64_t in = s.Act(s.hq + s.hkv) + (repeat ? s.Act(s.hkv) : 0);
      const int64_t out = s.Act(s.hq + kw) + (repeat ? s.Act(s.hq) : 0);
      const int32_t qr = g.Tensor("attn.rope.q", s.Act(s.hq));
      const int32_t kr = g.Tensor("attn.rope.k", s.Act(kw));
      std::vector<int32_t> ins = {q, k}, outs = {qr, kr};
      std::vector<int32_t> grads = {q, k};
      int32_t vr = v;
      if (repeat) {
        vr = g.Tensor("attn.rope.v", s.Act(s.hq));
        ins.push_back(v);
        outs.push_back(vr);
        grads.push_back(v);
      }
      g.Op("attn.rope", Mem(in, out), ins, outs, {{".bwd", Mem(out, in), {}, grads, {}, {}, {}, 0}});
      return Linear(g, s, "attn.wo", Attention(g, s, m, qr, kr, vr, repeat ? m.heads : m.kv_heads), s.hq, s.hidden, m.bias);
    }
    q = Rope(g, s, "attn.rope_q", q, s.hq);
    k = Rope(g, s, "attn.rope_k", k, s.hkv);
  }
  int64_t kv_heads = m.kv_heads;
  if (!s.kernels.eager_attention && s.kernels.repeat_kv && m.kv_heads < m.heads) {
    k = RepeatKv(g, s, "attn.repeat_k", k);
    v = RepeatKv(g, s, "attn.repeat_v", v);
    kv_heads = m.heads;
  }
  const int32_t out = Attention(g, s, m, q, k, v, kv_heads);
  return Linear(g, s, "attn.wo", out, s.hq, s.hidden, m.bias);
}

// Experts run as grouped GEMMs (batch = experts), as torchtitan's grouped_mm and Megatron's
// GroupedMLP launch them, with the routed tokens T x top_k spread evenly (a balanced router,
// the load-balancing loss's target). When T x top_k is not a multiple of the expert count,
// the groups that take one extra token run as a second grouped GEMM, so the FLOPs stay exact.
// Under routing imbalance (Workload::expert_load) the rank's experts run that many more rows.
// Both GEMMs write their rows of one output buffer; their dgrads each write a full-size
// contribution to the input's gradient (an estimate: the real kernels write disjoint rows), added
// like any two uses.
int32_t ExpertLinear(GraphBuilder& g, const Shapes& s, const std::string& name, int32_t x, int64_t in, int64_t out) {
  const int64_t per_expert = s.expert_rows / s.experts;
  const int64_t with_extra = s.expert_rows % s.experts;
  const int32_t y = g.Tensor(name + ".out", s.expert_rows * out * s.bytes);
  if (per_expert > 0) Linear(g, s, name, x, in, out, false, per_expert, s.experts - with_extra, y);
  if (with_extra > 0) Linear(g, s, name + ".rem", x, in, out, false, per_expert + 1, with_extra, y);
  return y;
}

// The MLP on the (normed) input `x`; returns the down projection's output.
int32_t Mlp(GraphBuilder& g, const Shapes& s, const ModelSpec& m, int32_t x) {
  if (m.experts > 1) {
    // Mixtral-style sparse MLP: router GEMM, softmax (fp32) + top-k, permute tokens into expert
    // order, expert GEMMs, weighted unpermute back to token order.
    const int64_t routed = s.tokens * s.top_k;
    const int64_t permuted = s.expert_rows * s.hidden * s.bytes;
    const int64_t probs = s.tokens * s.experts * kFp32Bytes;
    const int64_t indices = routed * kIndexBytes;
    const int64_t weights = routed * s.bytes;
    const int32_t logits = Linear(g, s, "moe.router", x, s.hidden, s.experts, m.bias);
    const int32_t topk = g.Tensor("moe.topk", probs + weights + indices);
    g.Op("moe.topk", Mem(s.tokens * s.experts * s.bytes, probs + weights + indices), {logits}, {topk},
         {{".bwd", Mem(weights + probs + indices, s.tokens * s.experts * s.bytes), {topk}, {logits}, {}, {}, {}, 0}});
    // Gather: each token's row read once per chosen expert. Backward scatter-adds them back.
    const int32_t perm = g.Tensor("moe.permute", permuted);
    g.Op("moe.permute", Mem(permuted + indices, permuted), {x}, {perm},
         {{".bwd", Mem(permuted + indices, s.Act(s.hidden)), {topk}, {x}, {}, {}, {}, 0}});
    const bool swiglu = m.mlp == MlpKind::kSwiGlu;
    const int64_t act = s.expert_rows * s.ffn * s.bytes;
    int32_t h = -1;
    if (swiglu) {
      const int32_t gate = ExpertLinear(g, s, "moe.experts.w1", perm, s.hidden, s.ffn);
      const int32_t silu = g.Tensor("moe.experts.silu", act);
      g.Op("moe.experts.silu", Mem(act, act), {gate}, {silu}, {{".bwd", Mem(2 * act, act), {gate}, {gate}, {}, {}, {}, 0}});
      const int32_t up = ExpertLinear(g, s, "moe.experts.w3", perm, s.hidden, s.ffn);
      h = g.Tensor("moe.experts.mul", act);
      g.Op("moe.experts.mul", Mem(2 * act, act), {silu, up}, {h},
           {{".bwd_a", Mem(2 * act, act), {up}, {silu}, {}, {}, {}, 0},
            {".bwd_b", Mem(2 * act, act), {silu}, {up}, {}, {}, {}, 0}});
    } else {
      const int32_t up = ExpertLinear(g, s, "moe.experts.w1", perm, s.hidden, s.ffn);
      h = g.Tensor("moe.experts.gelu", act);
      g.Op("moe.experts.gelu", Mem(act, act), {up}, {h}, {{".bwd", Mem(2 * act, act), {up}, {up}, {}, {}, {}, 0}});
    }
    const int32_t down = ExpertLinear(g, s, "moe.experts.w2", h, s.ffn, s.hidden);
    // out[t] = sum_j w[t][j] y[t][j]: keeps y and w (d w needs y, d y needs w).
    const int32_t out = g.Tensor("moe.unpermute", s.Act(s.hidden));
    g.Op("moe.unpermute", Mem(permuted + weights + indices, s.Act(s.hidden)), {down, topk}, {out},
         {{".bwd", Mem(s.Act(s.hidden) + permuted + weights + indices, permuted + weights), {down, topk}, {down, topk},
           {}, {}, {}, 0}});
    return out;
  }
  const int64_t act = s.Act(s.ffn);
  if (m.mlp == MlpKind::kSwiGlu) {
    const int32_t gate = Linear(g, s, "mlp.w1", x, s.hidden, s.ffn, m.bias);
    if (s.kernels.compile) {
      // Inductor: silu(w1 x) * w3 x in one kernel; its backward recomputes silu.
      const int32_t up = Linear(g, s, "mlp.w3", x, s.hidden, s.ffn, m.bias);
      const int32_t prod = g.Tensor("mlp.silu_mul", act);
      g.Op("mlp.silu_mul", Mem(2 * act, act), {gate, up}, {prod},
           {{".bwd", Mem(3 * act, 2 * act), {gate, up}, {gate, up}, {}, {}, {}, 0}});
      return Linear(g, s, "mlp.w2", prod, s.ffn, s.hidden, m.bias);
    }
    // F.silu(w1(x)) * w3(x): silu saves its input; the product saves both factors.
    const int32_t silu = g.Tensor("mlp.silu", act);
    g.Op("mlp.silu", Mem(act, act), {gate}, {silu}, {{".bwd", Mem(2 * act, act), {gate}, {gate}, {}, {}, {}, 0}});
    const int32_t up = Linear(g, s, "mlp.w3", x, s.hidden, s.ffn, m.bias);
    const int32_t prod = g.Tensor("mlp.mul", act);
    g.Op("mlp.mul", Mem(2 * act, act), {silu, up}, {prod},
         {{".bwd_a", Mem(2 * act, act), {up}, {silu}, {}, {}, {}, 0},
          {".bwd_b", Mem(2 * act, act), {silu}, {up}, {}, {}, {}, 0}});
    return Linear(g, s, "mlp.w2", prod, s.ffn, s.hidden, m.bias);
  }
  const int32_t up = Linear(g, s, "mlp.w1", x, s.hidden, s.ffn, m.bias);
  // GeLU: saves its input.
  const int32_t gelu = g.Tensor("mlp.gelu", act);
  g.Op("mlp.gelu", Mem(act, act), {up}, {gelu}, {{".bwd", Mem(2 * act, act), {up}, {up}, {}, {}, {}, 0}});
  return Linear(g, s, "mlp.w2", gelu, s.ffn, s.hidden, m.bias);
}

ModuleKernels BuildLayer(const ModelSpec& m, const Shapes& s, std::string name) {
  GraphBuilder g(std::move(name));
  g.SetParams(LayerParams(m));
  const int64_t act = s.Act(s.hidden);
  const int32_t x = g.Input(act);
  if (m.post_norm) {
    // BERT: each sub-layer's output goes through dropout, the residual add and then its norm.
    int32_t a = AttentionSublayer(g, s, m, x);
    if (m.dropout > 0) a = Dropout(g, "attn.out_dropout", a, s.tokens * s.hidden, s.bytes);
    const int32_t h = Norm(g, s, m, "attn.norm", Add(g, "attn.residual_add", a, x, act));
    int32_t o = Mlp(g, s, m, h);
    if (m.dropout > 0) o = Dropout(g, "mlp.out_dropout", o, s.tokens * s.hidden, s.bytes);
    const int32_t out = Norm(g, s, m, "mlp.norm", Add(g, "mlp.residual_add", o, h, act));
    return std::move(g).Build(out);
  }
  const int32_t a = AttentionSublayer(g, s, m, Norm(g, s, m, "attn.norm", x));
  const int32_t h = Add(g, "attn.residual_add", x, a, act);
  const int32_t o = Mlp(g, s, m, Norm(g, s, m, "mlp.norm", h));
  const int32_t out = Add(g, "mlp.residual_add", h, o, act);
  return std::move(g).Build(out);
}

ModuleKernels BuildEmbed(const ModelSpec& m, const Shapes& s) {
  GraphBuilder g("embed");
  g.SetParams(EmbedParams(m));
  const int64_t act = s.Act(s.hidden);
  const int64_t ids = s.tokens * kIndexBytes;
  const int64_t table = m.vocab * m.hidden * s.bytes;
  const int32_t input = g.Input(ids, /*requires_grad=*/false, /*external=*/true);
  // Row gather. Backward (embedding_dense_backward) zero-fills a dense vocab x hidden gradient
  // and scatter-adds the T incoming rows into it. With tied embeddings the output head's weight
  // gradient is already in .grad, and autograd adds this one to it.
  int32_t out = g.Tensor("embed.lookup", act);
  std::vector<BackwardStep> lookup_bwd = {{".bwd", Mem(2 * act + ids, table + act), {input}, {}, {}, {}, {}, 0, true, true}};
  if (m.tied_embeddings) {
    lookup_bwd.push_back({".tied_grad_accumulate", Mem(2 * table, table), {}, {}, {}, {}, {}, 0, false, true});
  }
  g.Op("embed.lookup", Mem(act + ids, act), {input}, {out}, std::move(lookup_bwd));
  if (m.position_rows() > 0 || m.token_types > 0) {
    // One fused add of the position rows (broadcast over the micro-batch) and the token-type
    // row. Backward reduces the gradient into both tables (zero-filled, dense).
    const int64_t rows_read = (m.learned_positions ? s.seq : 0) + (m.token_types > 0 ? 1 : 0);
    const int64_t table_rows = m.position_rows() + m.token_types;
    const int32_t pos = g.Tensor("embed.positions", act);
    g.Op("embed.positions", Mem(act + rows_read * m.hidden * s.bytes, act), {out}, {pos},
         {{".bwd", Mem(act, table_rows * m.hidden * s.bytes), {}, {}, {}, {}, {}, 0, true, true},
          {"", std::nullopt, {}, {out}, {}, {}, {}, 0}});
    out = pos;
  }
  if (m.embedding_norm) out = Norm(g, s, m, "embed.norm", out);
  if (m.dropout > 0) out = Dropout(g, "embed.dropout", out, s.tokens * s.hidden, s.bytes);
  return std::move(g).Build(out);
}

ModuleKernels BuildHead(const ModelSpec& m, const Shapes& s) {
  GraphBuilder g("head");
  g.SetParams(HeadParams(m));
  int32_t x = g.Input(s.Act(s.hidden));
  if (!m.post_norm) x = Norm(g, s, m, "final_norm", x);
  if (m.lm_head_transform) {
    const int32_t dense = Linear(g, s, "lm_head.dense", x, s.hidden, s.hidden, m.bias);
    const int64_t act = s.Act(s.hidden);
    const int32_t gelu = g.Tensor("lm_head.gelu", act);
    g.Op("lm_head.gelu", Mem(act, act), {dense}, {gelu}, {{".bwd", Mem(2 * act, act), {dense}, {dense}, {}, {}, {}, 0}});
    x = Norm(g, s, m, "lm_head.norm", gelu);
  }
  const int32_t logits = Linear(g, s, "output", x, s.hidden, s.vocab, m.lm_head_transform);
  const int64_t TV = s.tokens * s.vocab;
  const int64_t targets = s.tokens * kIndexBytes;
  const int32_t labels = g.Tensor("loss.targets", targets, false, /*external=*/true);
  const int32_t loss = g.Tensor("loss.value", kFp32Bytes, true);
  if (s.kernels.compile_loss) {
    // torch.compile'd cross_entropy(pred.float()): ESTIMATE of Inductor's fusion: one pass
    // computes each row's log-sum-exp from the activation-dtype logits and gathers the target
    // (nothing fp32 of size T x V is materialized); the backward recomputes the softmax and
    // writes the logits' gradient directly.
    const int32_t lse = g.Tensor("loss.logsumexp", s.tokens * kFp32Bytes, false);
    g.Op("loss.cross_entropy", Mem(TV * s.bytes + targets, s.tokens * kFp32Bytes + kFp32Bytes), {logits, labels},
         {lse, loss}, {{".bwd", Mem(TV * s.bytes + s.tokens * kFp32Bytes + targets, TV * s.bytes), {logits, lse, labels}, {logits}, {}, {}, {}, 0}});
    return std::move(g).Build(loss, /*output_grad_external=*/true);
  }
  // Causal LMs upcast the logits before the loss (torchtitan pred.float(), transformers
  // ForCausalLMLoss logits.float()): the fp32 copy is log_softmax's input. The masked-LM heads
  // (RoBERTa) take the logits as they are.
  int32_t scores = logits;
  int64_t e = s.bytes;
  if (m.attention == AttentionKind::kCausal) {
    scores = Cast(g, "loss.upcast", logits, TV, s.bytes, kFp32Bytes);
    e = kFp32Bytes;
  }
  // log_softmax (a max/sum pass and a normalizing pass over each row): saves its output.
  const int32_t logp = g.Tensor("loss.log_softmax", TV * e);
  g.Op("loss.log_softmax", Mem(TV * e, TV * e), {scores}, {logp},
       {{".bwd", Mem(2 * TV * e, TV * e), {logp}, {scores}, {}, {}, {}, 0}});
  // nll_loss: gathers the targets' log-probabilities. Backward: a zero-filled dense gradient
  // with -1/N at the targets.
  g.Op("loss.nll", Mem(targets + s.tokens * e, kFp32Bytes), {logp, labels}, {loss},
       {{".bwd", Mem(targets, TV * e), {labels}, {logp}, {}, {}, {}, 0}});
  return std::move(g).Build(loss, /*output_grad_external=*/true);
}

}  // namespace

int64_t ModuleKernels::param_numel() const { return SumNumel(params); }

int64_t ModuleKernels::saved_bytes() const {
  // Forward tensors (activations, not gradients) that a backward kernel reads.
  std::vector<bool> forward_tensor(tensors.size(), false);
  for (const ModuleKernel& k : forward) {
    for (int32_t t : k.writes) forward_tensor[static_cast<size_t>(t)] = true;
  }
  if (input >= 0) forward_tensor[static_cast<size_t>(input)] = true;
  std::vector<bool> counted(tensors.size(), false);
  int64_t bytes = 0;
  for (const ModuleKernel& k : backward) {
    for (int32_t t : k.reads) {
      while (tensors[static_cast<size_t>(t)].view_of >= 0) t = tensors[static_cast<size_t>(t)].view_of;
      const auto i = static_cast<size_t>(t);
      if (!forward_tensor[i] || counted[i] || tensors[i].external) continue;
      counted[i] = true;
      bytes += tensors[i].bytes;
    }
  }
  return bytes;
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
  s.head_dim = model.head_dim();
  s.heads = model.heads;
  s.kv_heads = model.kv_heads;
  s.hq = static_cast<int64_t>(model.heads) * model.head_dim();
  s.hkv = static_cast<int64_t>(model.kv_heads) * model.head_dim();
  s.ffn = model.ffn;
  s.vocab = model.vocab;
  s.experts = model.experts;
  s.top_k = model.experts_per_token;
  s.expert_rows = std::max<int64_t>(
      1, static_cast<int64_t>(std::llround(static_cast<double>(s.tokens * s.top_k) * workload.expert_load)));
  s.kernels = workload.kernels;

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

}  // namespace shardscope::sim
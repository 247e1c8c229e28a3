#include "shardscope/sim/presets/model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <variant>
#include <vector>

namespace shardscope::sim {
namespace {

using ::testing::HasSubstr;
using traces::AttentionDesc;
using traces::GemmDesc;

ModelSpec Preset(std::string_view name) {
  StatusOr<ModelSpec> model = FindModelPreset(name);
  EXPECT_TRUE(model.ok()) << model.status().message();
  return model.ok() ? *model : ModelSpec{};
}

double GemmFlops(const traces::ComputeDesc& desc) {
  const auto* g = std::get_if<GemmDesc>(&desc);
  if (g == nullptr) return 0;
  return 2.0 * static_cast<double>(g->m) * static_cast<double>(g->n) *
         static_cast<double>(g->k) * static_cast<double>(g->batch);
}

// Model FLOPs of attention: forward QK^T and PV, 2 x 2 x b x heads x sq x skv x d, halved by a
// causal mask; backward twice forward (dV, dP, dQ, dK). Flash attention's recompute of the
// scores is hardware work, not model work, so it is not counted here (compute_model's
// KernelFlops counts it: 2.5x).
double AttentionModelFlops(const traces::ComputeDesc& desc) {
  const auto* a = std::get_if<AttentionDesc>(&desc);
  if (a == nullptr) return 0;
  double flops = 4.0 * static_cast<double>(a->batch) * static_cast<double>(a->heads) *
                 static_cast<double>(a->seq_q) * static_cast<double>(a->seq_kv) *
                 static_cast<double>(a->head_dim);
  if (a->causal) flops *= 0.5;
  if (a->backward) flops *= 2.0;
  return flops;
}

double ModelFlops(const std::vector<ModuleKernels>& modules) {
  double flops = 0;
  for (const ModuleKernels& module : modules) {
    for (const auto* kernels : {&module.forward, &module.backward}) {
      for (const ModuleKernel& k : *kernels) {
        flops += GemmFlops(k.compute) + AttentionModelFlops(k.compute);
      }
    }
  }
  return flops;
}

const ModuleKernels& FindModule(const std::vector<ModuleKernels>& modules,
                                std::string_view name) {
  for (const ModuleKernels& m : modules) {
    if (m.name == name) return m;
  }
  ADD_FAILURE() << "no module " << name;
  return modules.front();
}

std::vector<std::string> Names(const std::vector<ModuleKernel>& kernels) {
  std::vector<std::string> names;
  for (const ModuleKernel& k : kernels) names.push_back(k.name);
  return names;
}

const ModuleKernel* FindKernel(const std::vector<ModuleKernel>& kernels,
                               std::string_view name) {
  for (const ModuleKernel& k : kernels) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

// ---- Presets

TEST(ModelPresetTest, EveryPresetIsFoundAndValid) {
  const std::vector<std::string> names = ModelPresetNames();
  EXPECT_EQ(names, (std::vector<std::string>{"llama3-8b", "llama3-70b", "llama2-13b",
                                             "llama2-70b", "gpt3-175b", "mpt-7b", "mpt-30b",
                                             "roberta-10b", "mixtral-8x7b"}));
  for (const std::string& name : names) {
    ModelSpec model = Preset(name);
    EXPECT_EQ(model.name, name);
    EXPECT_TRUE(ValidateModel(model).ok()) << name << ": " << ValidateModel(model).message();
  }
}

TEST(ModelPresetTest, UnknownPresetListsTheKnownOnes) {
  StatusOr<ModelSpec> model = FindModelPreset("llama4-1t");
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(model.status().message(), HasSubstr("'llama4-1t'"));
  EXPECT_THAT(model.status().message(), HasSubstr("llama3-8b, llama3-70b"));
}

TEST(ModelPresetTest, ArchitectureFlags) {
  const ModelSpec llama = Preset("llama3-8b");
  EXPECT_TRUE(llama.rope());
  EXPECT_FALSE(llama.tied_embeddings || llama.bias || llama.learned_positions);
  EXPECT_EQ(llama.mlp, MlpKind::kSwiGlu);
  EXPECT_EQ(llama.norm, NormKind::kRmsNorm);

  const ModelSpec gpt3 = Preset("gpt3-175b");
  EXPECT_TRUE(gpt3.learned_positions && gpt3.tied_embeddings && gpt3.bias && gpt3.norm_bias);
  EXPECT_EQ(gpt3.position_rows(), 2048);
  EXPECT_EQ(gpt3.mlp, MlpKind::kGelu);

  const ModelSpec mpt = Preset("mpt-7b");
  EXPECT_TRUE(mpt.alibi && mpt.tied_embeddings);
  EXPECT_FALSE(mpt.rope() || mpt.learned_positions || mpt.bias || mpt.norm_bias);
  EXPECT_EQ(mpt.norm, NormKind::kLayerNorm);

  const ModelSpec roberta = Preset("roberta-10b");
  EXPECT_EQ(roberta.attention, AttentionKind::kBidirectional);
  EXPECT_EQ(roberta.max_positions, 512);   // usable positions
  EXPECT_EQ(roberta.position_rows(), 514);  // rows in the checkpoint (padding_idx offset)

  const ModelSpec mixtral = Preset("mixtral-8x7b");
  EXPECT_EQ(mixtral.experts, 8);
  EXPECT_EQ(mixtral.experts_per_token, 2);
  EXPECT_EQ(mixtral.kv_heads, 8);
}

// ---- Parameter counts

struct Published {
  const char* preset;
  double total;
  const char* source;
};

TEST(ModelParameterCountTest, MatchesPublishedTotals) {
  const Published kPublished[] = {
      // HF meta-llama/Meta-Llama-3-8B safetensors total.
      {"llama3-8b", 8'030'261'248, "HF Meta-Llama-3-8B"},
      // HF meta-llama/Meta-Llama-3-70B safetensors total ("70.6B").
      {"llama3-70b", 70'553'706'496, "HF Meta-Llama-3-70B"},
      // HF meta-llama/Llama-2-13b-hf safetensors total.
      {"llama2-13b", 13'015'864'320, "HF Llama-2-13b-hf"},
      // HF meta-llama/Llama-2-70b-hf safetensors total (the paper's "70B" is nominal).
      {"llama2-70b", 68'976'648'192, "HF Llama-2-70b-hf"},
      // Brown et al. 2020, Table 2.1: 175.0B.
      {"gpt3-175b", 175.0e9, "GPT-3 paper Table 2.1"},
      // mosaicml/mpt-7b bf16 checkpoint, 13.3 GB = 6.65B parameters x 2 bytes. The model
      // card's "6.7B" is rounded loosely (6.649B is 0.76% below it).
      {"mpt-7b", 6.65e9, "mpt-7b checkpoint size"},
      // mosaicml/mpt-30b model card: n_parameters 29.95B.
      {"mpt-30b", 29.95e9, "MPT-30B model card"},
      // Mistral AI, "Mixtral of experts" (2023): 46.7B total parameters.
      {"mixtral-8x7b", 46.7e9, "Mixtral announcement"},
      // roberta-10b has no public checkpoint: see the RoBERTa tests below.
  };
  for (const Published& p : kPublished) {
    const double count = static_cast<double>(ParameterCount(Preset(p.preset)));
    EXPECT_NEAR(count / p.total, 1.0, 0.005)
        << p.preset << ": " << count << " vs " << p.total << " (" << p.source << ")";
  }
  // Where the published figure is an exact checkpoint count, match it exactly.
  EXPECT_EQ(ParameterCount(Preset("llama3-8b")), 8'030'261'248);
  EXPECT_EQ(ParameterCount(Preset("llama3-70b")), 70'553'706'496);
  EXPECT_EQ(ParameterCount(Preset("llama2-13b")), 13'015'864'320);
  EXPECT_EQ(ParameterCount(Preset("llama2-70b")), 68'976'648'192);
  EXPECT_EQ(ParameterCount(Preset("mixtral-8x7b")), 46'702'792'704);  // HF safetensors total
}

TEST(ModelParameterCountTest, Llama3_8bBlockClosedForm) {
  const ModelSpec m = Preset("llama3-8b");
  const int64_t h = 4096, f = 14336, hq = 32 * 128, hkv = 8 * 128, vocab = 128256;
  // 2 RMSNorm weights + wq + wk + wv + wo + SwiGLU w1, w3, w2.
  const int64_t block = 2 * h + h * hq + 2 * h * hkv + hq * h + 3 * h * f;
  EXPECT_EQ(block, 218'112'000);
  const std::vector<ModuleKernels> modules = DecomposeModel(m, Workload{});
  EXPECT_EQ(FindModule(modules, "layers.0").param_numel(), block);
  EXPECT_EQ(FindModule(modules, "layers.31").param_numel(), block);
  EXPECT_EQ(FindModule(modules, "embed").param_numel(), vocab * h);
  EXPECT_EQ(FindModule(modules, "head").param_numel(), h + vocab * h);  // norm + untied output
  EXPECT_EQ(ParameterCount(m), 2 * vocab * h + 32 * block + h);
}

TEST(ModelParameterCountTest, RobertaArchitectureMatchesRobertaLargeCheckpoint) {
  // The roberta-10b flags at roberta-large's dimensions (FacebookAI/roberta-large config.json)
  // give the HF RobertaForMaskedLM checkpoint's tensor total, 355,412,057 (F32): word +
  // 514 position + 1 token-type rows, embedding LayerNorm, 24 post-LN blocks with biases, LM
  // head dense + LayerNorm + vocab bias, decoder weight tied.
  ModelSpec m = Preset("roberta-10b");
  m.name = "roberta-large";
  m.layers = 24;
  m.hidden = 1024;
  m.heads = 16;
  m.kv_heads = 16;
  m.ffn = 4096;
  ASSERT_TRUE(ValidateModel(m).ok());
  EXPECT_EQ(ParameterCount(m), 355'412'057);
}

TEST(ModelParameterCountTest, Roberta10bClosedForm) {
  const int64_t V = 50265, h = 5120, f = 20480, L = 30;
  const int64_t embed = V * h + 514 * h + 1 * h + 2 * h;       // + embedding LayerNorm
  const int64_t layer = 4 * h * h + 4 * h + 2 * h + 2 * h * f + f + h + 2 * h;
  const int64_t head = h * h + h + 2 * h + V;                  // dense, LayerNorm, bias
  EXPECT_EQ(ParameterCount(Preset("roberta-10b")), embed + L * layer + head);
  EXPECT_EQ(embed + L * layer + head, 9'725'464'665);
  // The name's "10B" is nominal (no checkpoint to match): 2.7% below it.
  EXPECT_NEAR(static_cast<double>(embed + L * layer + head) / 10e9, 1.0, 0.03);
}

TEST(ModelParameterCountTest, ModuleParamsSumToParameterCount) {
  for (const std::string& name : ModelPresetNames()) {
    const ModelSpec m = Preset(name);
    Workload w;
    w.seq_len = m.learned_positions ? m.max_positions : 4096;
    const std::vector<ModuleKernels> modules = DecomposeModel(m, w);
    ASSERT_EQ(modules.size(), static_cast<size_t>(m.layers) + 2) << name;
    int64_t total = 0;
    for (const ModuleKernels& module : modules) {
      EXPECT_GT(module.param_numel(), 0) << name << " " << module.name;
      total += module.param_numel();
    }
    EXPECT_EQ(total, ParameterCount(m)) << name;
  }
}

TEST(ModelParameterCountTest, MixtralActiveVersusTotal) {
  const ModelSpec m = Preset("mixtral-8x7b");
  const int64_t h = 4096, f = 14336, L = 32;
  const int64_t expert = 3 * h * f;  // w1, w3, w2
  // 6 of 8 experts idle per token in every layer.
  EXPECT_EQ(ParameterCount(m) - ActiveParameterCount(m), L * 6 * expert);
  EXPECT_EQ(ActiveParameterCount(m), 12'879'925'248);
  // Mistral AI, "Mixtral of experts": 12.9B active parameters per token.
  EXPECT_NEAR(static_cast<double>(ActiveParameterCount(m)) / 12.9e9, 1.0, 0.005);
  // Dense models: every parameter is active.
  EXPECT_EQ(ActiveParameterCount(Preset("llama3-8b")), ParameterCount(Preset("llama3-8b")));
}

// ---- FLOPs

TEST(ModelFlopsTest, Llama3_8bDecompositionMatchesTrainingFlopsPerToken) {
  const ModelSpec m = Preset("llama3-8b");
  const int64_t L = 32, h = 4096, hq = 4096, hkv = 1024, f = 14336, V = 128256, s = 8192;
  // Matmul parameters: QKV + out projection + SwiGLU per block, plus the untied output
  // projection. The input embedding is a lookup; norms have no product.
  const int64_t n_matmul = L * (h * (hq + 2 * hkv) + hq * h + 3 * h * f) + V * h;
  EXPECT_EQ(n_matmul, 7'504'658'432);
  EXPECT_EQ(ActiveMatmulParameterCount(m), n_matmul);
  // 6N + 12 L h s / 2 (causal) = 45,027,950,592 + 6,442,450,944.
  const double per_token = 6.0 * n_matmul + 12.0 * L * h * s * 0.5;
  EXPECT_EQ(per_token, 51'470'401'536.0);
  EXPECT_EQ(TrainingFlopsPerToken(m, s), per_token);

  Workload w;
  w.micro_batch = 1;
  w.seq_len = s;
  const double decomposed = ModelFlops(DecomposeModel(m, w));
  EXPECT_NEAR(decomposed / (s * TrainingFlopsPerToken(m, s)), 1.0, 0.01);
  // Both sides count the same products, so they agree to rounding.
  EXPECT_NEAR(decomposed / (s * TrainingFlopsPerToken(m, s)), 1.0, 1e-12);
}

TEST(ModelFlopsTest, Gpt3MatchesMegatronFormula) {
  // Megatron-LM (Narayanan et al. 2021, eq. 3) per step without recompute:
  // 72 B s l h^2 (1 + s / (6h) + V / (12 l h)), full (non-causal) attention.
  ModelSpec m = Preset("gpt3-175b");
  m.attention = AttentionKind::kBidirectional;
  const double B = 8, s = 2048, l = 96, h = 12288, V = 50257;
  const double megatron = 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
  EXPECT_NEAR(B * s * TrainingFlopsPerToken(m, 2048) / megatron, 1.0, 1e-12);
  // Causal attention halves the attention term only.
  const double causal_saving = 12 * l * h * s * 0.5;
  EXPECT_NEAR(TrainingFlopsPerToken(Preset("gpt3-175b"), 2048),
              TrainingFlopsPerToken(m, 2048) - causal_saving, 1.0);
}

TEST(ModelFlopsTest, BackwardGemmFlopsAreTwiceForward) {
  for (const std::string& name : ModelPresetNames()) {
    const ModelSpec m = Preset(name);
    Workload w;
    w.micro_batch = 2;
    w.seq_len = 512;
    for (const ModuleKernels& module : DecomposeModel(m, w)) {
      double fwd = 0, bwd = 0;
      for (const ModuleKernel& k : module.forward) fwd += GemmFlops(k.compute);
      for (const ModuleKernel& k : module.backward) bwd += GemmFlops(k.compute);
      EXPECT_EQ(bwd, 2 * fwd) << name << " " << module.name;
    }
  }
}

TEST(ModelFlopsTest, MoeDecompositionMatchesActiveFlops) {
  const ModelSpec m = Preset("mixtral-8x7b");
  // 4096 tokens x top-2 spread evenly over 8 experts; 7 tokens x 2 = 14 is not a multiple of
  // 8 and takes the remainder path.
  for (int64_t seq : {4096, 7}) {
    Workload w;
    w.seq_len = seq;
    EXPECT_NEAR(ModelFlops(DecomposeModel(m, w)) /
                    (static_cast<double>(seq) * TrainingFlopsPerToken(m, seq)),
                1.0, 1e-12)
        << seq;
  }
}

// ---- Decomposition

std::vector<std::string> TensorNames(const ModuleKernels& module, const std::vector<int32_t>& ids) {
  std::vector<std::string> names;
  for (int32_t t : ids) names.push_back(module.tensors[static_cast<size_t>(t)].name);
  return names;
}

TEST(ModelDecomposeTest, TorchtitanLlamaBlockIsTheEagerOpList) {
  // torchtitan's Attention / FeedForward / TransformerBlock with nn.RMSNorm on PyTorch 2.9+
  // (one fused kernel), RoPE through complex64, wq/wk/wv apart, enable_gqa (no repeat_kv).
  Workload w;
  w.micro_batch = 2;
  w.seq_len = 4096;
  const std::vector<ModuleKernels> modules = DecomposeModel(Preset("llama3-8b"), w);
  ASSERT_EQ(modules.size(), 34u);
  EXPECT_EQ(modules.front().name, "embed");
  EXPECT_EQ(modules[1].name, "layers.0");
  EXPECT_EQ(modules[32].name, "layers.31");
  EXPECT_EQ(modules.back().name, "head");

  const ModuleKernels& layer = modules[1];
  EXPECT_EQ(Names(layer.forward),
            (std::vector<std::string>{"attn.norm", "attn.wq", "attn.wk", "attn.wv", "attn.rope_q.to_fp32",
                                      "attn.rope_q.mul", "attn.rope_q.type_as", "attn.rope_k.to_fp32",
                                      "attn.rope_k.mul", "attn.rope_k.type_as", "attn.sdpa", "attn.wo",
                                      "attn.residual_add", "mlp.norm", "mlp.w1", "mlp.silu", "mlp.w3",
                                      "mlp.mul", "mlp.w2", "mlp.residual_add"}));
  // The backward in autograd's order: the MLP's ops reversed, wq/wk/wv's dgrads added into one
  // gradient of the norm's output (two additions), the residual's gradient added to each norm's.
  EXPECT_EQ(Names(layer.backward),
            (std::vector<std::string>{
                "mlp.w2.dgrad", "mlp.w2.wgrad", "mlp.mul.bwd_a", "mlp.mul.bwd_b", "mlp.w3.dgrad", "mlp.w3.wgrad",
                "mlp.silu.bwd", "mlp.w1.dgrad", "mlp.norm.out.grad_accumulate", "mlp.w1.wgrad",
                "mlp.norm.bwd_input", "attn.residual_add.out.grad_accumulate", "mlp.norm.bwd", "attn.wo.dgrad",
                "attn.wo.wgrad", "attn.sdpa.bwd", "attn.sdpa.bwd_sum_dk", "attn.sdpa.bwd_sum_dv",
                "attn.rope_k.type_as.bwd", "attn.rope_k.mul.bwd_conj", "attn.rope_k.mul.bwd",
                "attn.rope_k.to_fp32.bwd", "attn.rope_q.type_as.bwd", "attn.rope_q.mul.bwd_conj",
                "attn.rope_q.mul.bwd", "attn.rope_q.to_fp32.bwd", "attn.wv.dgrad", "attn.wv.wgrad",
                "attn.wk.dgrad", "attn.norm.out.grad_accumulate", "attn.wk.wgrad", "attn.wq.dgrad",
                "attn.norm.out.grad_accumulate", "attn.wq.wgrad", "attn.norm.bwd_input", "input.grad_accumulate",
                "attn.norm.bwd"}));
  const int64_t T = 8192;
  const auto& wk = std::get<GemmDesc>(FindKernel(layer.forward, "attn.wk")->compute);
  EXPECT_EQ(std::vector<int64_t>({wk.m, wk.n, wk.k}), std::vector<int64_t>({T, 8 * 128, 4096}));
  const auto& attention = std::get<AttentionDesc>(FindKernel(layer.forward, "attn.sdpa")->compute);
  EXPECT_EQ(attention.batch, 2);
  EXPECT_EQ(attention.heads, 32);
  EXPECT_EQ(attention.kv_heads, 8);
  EXPECT_EQ(attention.seq_q, 4096);
  EXPECT_EQ(attention.head_dim, 128);
  EXPECT_TRUE(attention.causal);
  EXPECT_FALSE(attention.backward);
  EXPECT_TRUE(std::get<AttentionDesc>(FindKernel(layer.backward, "attn.sdpa.bwd")->compute).backward);
  // RoPE: xq.float() writes 4 bytes per element of q, the complex multiply reads it and the
  // seq x 64 complex64 table, type_as writes it back in bf16.
  const auto& mul = std::get<traces::MemoryBoundDesc>(FindKernel(layer.forward, "attn.rope_q.mul")->compute);
  EXPECT_EQ(mul.bytes_read, T * 4096 * 4 + 4096 * 64 * 8);
  EXPECT_EQ(mul.bytes_written, T * 4096 * 4);
  // Forward ops come from Python, backward ones from the autograd engine.
  for (const ModuleKernel& k : layer.forward) EXPECT_EQ(k.dispatch, KernelDispatch::kPython) << k.name;
  for (const ModuleKernel& k : layer.backward) EXPECT_EQ(k.dispatch, KernelDispatch::kCpp) << k.name;

  EXPECT_EQ(Names(modules.back().forward),
            (std::vector<std::string>{"final_norm", "output", "loss.upcast", "loss.log_softmax", "loss.nll"}));
  EXPECT_EQ(std::get<GemmDesc>(modules.back().forward[1].compute).n, 128256);
  EXPECT_EQ(Names(modules.front().forward), (std::vector<std::string>{"embed.lookup"}));
}

TEST(ModelDecomposeTest, EveryLinearHasDgradAndWgrad) {
  for (const std::string& name : ModelPresetNames()) {
    Workload w;
    w.seq_len = 512;
    for (bool eager : {false, true}) {
      w.kernels.eager_attention = eager;
      for (const ModuleKernels& module : DecomposeModel(Preset(name), w)) {
        int forward_gemms = 0, backward_gemms = 0;
        for (const ModuleKernel& k : module.backward) backward_gemms += std::holds_alternative<GemmDesc>(k.compute) ? 1 : 0;
        for (const ModuleKernel& k : module.forward) {
          const auto* fwd = std::get_if<GemmDesc>(&k.compute);
          if (fwd == nullptr) continue;
          ++forward_gemms;
          if (k.name == "attn.scores" || k.name == "attn.context") continue;  // the unfused attention's bmm
          const ModuleKernel* dgrad = FindKernel(module.backward, k.name + ".dgrad");
          const ModuleKernel* wgrad = FindKernel(module.backward, k.name + ".wgrad");
          ASSERT_NE(dgrad, nullptr) << name << " " << k.name;
          ASSERT_NE(wgrad, nullptr) << name << " " << k.name;
          EXPECT_TRUE(wgrad->weight_grad);
          const auto& d = std::get<GemmDesc>(dgrad->compute);
          const auto& g = std::get<GemmDesc>(wgrad->compute);
          // dgrad: m = T, n = k_in, k = n_out. wgrad: m = k_in, n = n_out, k = T.
          EXPECT_EQ(std::vector<int64_t>({d.m, d.n, d.k, d.batch}), std::vector<int64_t>({fwd->m, fwd->k, fwd->n, fwd->batch}));
          EXPECT_EQ(std::vector<int64_t>({g.m, g.n, g.k, g.batch}), std::vector<int64_t>({fwd->k, fwd->n, fwd->m, fwd->batch}));
        }
        EXPECT_EQ(backward_gemms, 2 * forward_gemms) << name << " " << module.name;
      }
    }
  }
}

TEST(ModelDecomposeTest, EveryTensorIsWrittenBeforeItIsReadAndEveryGradientReachesTheInput) {
  for (const std::string& name : ModelPresetNames()) {
    Workload w;
    w.seq_len = 256;
    w.kernels.repeat_kv = true;
    for (const ModuleKernels& module : DecomposeModel(Preset(name), w)) {
      std::vector<bool> written(module.tensors.size(), false);
      const auto base = [&](int32_t t) {
        while (module.tensors[static_cast<size_t>(t)].view_of >= 0) t = module.tensors[static_cast<size_t>(t)].view_of;
        return static_cast<size_t>(t);
      };
      written[static_cast<size_t>(module.input)] = true;  // the previous module's output
      written[static_cast<size_t>(module.output_grad)] = true;
      for (const auto* kernels : {&module.forward, &module.backward}) {
        for (const ModuleKernel& k : *kernels) {
          for (int32_t t : k.reads) {
            EXPECT_TRUE(written[base(t)] || module.tensors[base(t)].external)
                << name << " " << module.name << ": " << k.name << " reads " << module.tensors[base(t)].name;
          }
          for (int32_t t : k.writes) written[base(t)] = true;
        }
      }
      // Blocks and the head hand a gradient back; the embedding's input is the token ids.
      EXPECT_EQ(module.input_grad >= 0, module.name != "embed") << name << " " << module.name;
    }
  }
}

TEST(ModelDecomposeTest, Gpt3LayerSavedBytesMatchKorthikanti) {
  // Korthikanti et al.: 34sbh + 5as^2b per layer. Flash attention drops 5as^2b, no dropout
  // drops the two sbh masks; what is left is 32sbh, plus the LayerNorm statistics
  // (2 norms x mean, rstd in fp32 = 16sb) and the attention log-sum-exp (4asb). One fused QKV
  // GEMM: its output is q, k and v.
  const double s = 2048, b = 4, h = 12288, a = 96;
  Workload w;
  w.micro_batch = 4;
  w.seq_len = 2048;
  const std::vector<ModuleKernels> modules = DecomposeModel(Preset("gpt3-175b"), w);
  EXPECT_EQ(static_cast<double>(FindModule(modules, "layers.7").saved_bytes()),
            32 * s * b * h + 16 * s * b + 4 * a * s * b);
}

TEST(ModelDecomposeTest, LlamaLayerSavedBytesClosedForm) {
  // Per token, bf16, fused RMSNorm and enable_gqa: the block input and the attention norm's
  // output (2h), q and the attention output (2hq), k and v (2hkv), the residual sum and the MLP
  // norm's output (2h), w1 x, silu(w1 x), w3 x and their product (4f); fp32 rstd (2 x 4 bytes)
  // and log-sum-exp (4 bytes x heads).
  const double T = 8192, h = 4096, hq = 4096, hkv = 1024, f = 14336, a = 32;
  Workload w;
  w.seq_len = 8192;
  const std::vector<ModuleKernels> modules = DecomposeModel(Preset("llama3-8b"), w);
  EXPECT_EQ(static_cast<double>(FindModule(modules, "layers.0").saved_bytes()),
            T * (2 * (4 * h + 2 * hq + 2 * hkv + 4 * f) + 2 * 4 + 4 * a));
  // repeat_kv: K and V are saved at every query head.
  w.kernels.repeat_kv = true;
  EXPECT_EQ(static_cast<double>(FindModule(DecomposeModel(Preset("llama3-8b"), w), "layers.0").saved_bytes()),
            T * (2 * (4 * h + 4 * hq + 4 * f) + 2 * 4 + 4 * a));
  // The composite nn.RMSNorm (PyTorch 2.4-2.8) keeps, per norm, the fp32 upcast input, the fp32
  // rsqrt and the fp32 normalized value instead of the input and rstd: 8h + 4 bytes per token
  // in place of 2h + 4.
  w.kernels.repeat_kv = false;
  w.kernels.rms_norm = RmsNormKernel::kComposite;
  EXPECT_EQ(static_cast<double>(FindModule(DecomposeModel(Preset("llama3-8b"), w), "layers.0").saved_bytes()),
            T * (2 * (4 * h + 2 * hq + 2 * hkv + 4 * f) + 2 * 4 + 4 * a) + 2 * T * (8 * h - 2 * h));
  // transformers' Python RMSNorm casts before the weight: the normalized value is kept in bf16.
  w.kernels.rms_norm = RmsNormKernel::kPython;
  EXPECT_EQ(static_cast<double>(FindModule(DecomposeModel(Preset("llama3-8b"), w), "layers.0").saved_bytes()),
            T * (2 * (4 * h + 2 * hq + 2 * hkv + 4 * f) + 2 * 4 + 4 * a) + 2 * T * (6 * h - 2 * h));
  // The head keeps the final norm's input and output and the fp32 log-probabilities (4 T V).
  const double V = 128256;
  EXPECT_EQ(static_cast<double>(FindModule(modules, "head").saved_bytes()), T * (2 * h + 4) + T * 2 * h + T * 4 * V);
}

TEST(ModelDecomposeTest, TheLossHoldsTenBytesPerLogitAtItsForwardPeak) {
  // bf16 logits (2TV), their fp32 copy (4TV) and the fp32 log-probabilities (4TV) are all live
  // while log_softmax runs: the copy dies after it, the bf16 logits once the loss is computed.
  Workload w;
  w.seq_len = 1024;
  const ModuleKernels head = DecomposeModel(Preset("llama3-8b"), w).back();
  const int64_t TV = 1024 * int64_t{128256};
  const ModuleKernel* log_softmax = FindKernel(head.forward, "loss.log_softmax");
  ASSERT_NE(log_softmax, nullptr);
  EXPECT_EQ(TensorNames(head, log_softmax->reads), std::vector<std::string>{"loss.upcast.out"});
  EXPECT_EQ(TensorNames(head, log_softmax->writes), std::vector<std::string>{"loss.log_softmax"});
  EXPECT_EQ(head.tensors[static_cast<size_t>(log_softmax->reads[0])].bytes, 4 * TV);
  EXPECT_EQ(head.tensors[static_cast<size_t>(log_softmax->writes[0])].bytes, 4 * TV);
  // Compiled, the loss materializes nothing fp32 of size T x V.
  w.kernels.compile = true;
  w.kernels.compile_loss = true;
  const ModuleKernels compiled = DecomposeModel(Preset("llama3-8b"), w).back();
  for (const ActivationTensor& t : compiled.tensors) EXPECT_LT(t.bytes, 4 * TV) << t.name;
}

TEST(ModelDecomposeTest, EagerAttentionMaterializesTheScores) {
  // transformers' 2021 RoBERTa self-attention: matmul, / sqrt(d), + mask, softmax, dropout,
  // matmul, permute().contiguous(). Autograd keeps the softmax output, the dropout mask (1 byte)
  // and the dropped probabilities: Korthikanti's 5 a s^2 b bytes.
  Workload w;
  w.micro_batch = 8;
  w.seq_len = 512;
  w.dtype = traces::DType::kFloat16;
  w.kernels.eager_attention = true;
  const std::vector<ModuleKernels> modules = DecomposeModel(Preset("roberta-10b"), w);
  const ModuleKernels& layer = modules[1];
  EXPECT_EQ(Names(layer.forward),
            (std::vector<std::string>{"attn.wq", "attn.wk", "attn.wv", "attn.scores", "attn.scale", "attn.mask_add",
                                      "attn.softmax", "attn.dropout", "attn.context", "attn.context_contiguous",
                                      "attn.wo", "attn.out_dropout", "attn.residual_add", "attn.norm", "mlp.w1",
                                      "mlp.gelu", "mlp.w2", "mlp.out_dropout", "mlp.residual_add", "mlp.norm"}));
  // Korthikanti et al. (2022, Sec. 4.1) exactly: attention 11sbh + 5as^2b (x, q, k, v, the
  // context, the output dropout's 1-byte mask; softmax output, 1-byte dropout mask, dropped
  // probabilities), MLP 19sbh (the norm output, the GeLU input and output at 4h, the mask),
  // the two LayerNorms' inputs 4sbh; plus their fp32 mean and rstd (2 x 8 bytes per token).
  const double s = 512, b = 8, h = 5120, a = 40;
  const double expected = 34 * s * b * h + 5 * a * s * s * b + 16 * s * b;
  EXPECT_EQ(static_cast<double>(layer.saved_bytes()), expected);
  EXPECT_FALSE(std::get<GemmDesc>(FindKernel(layer.forward, "attn.scores")->compute).batch != 8 * 40);
  EXPECT_EQ(Names(modules.back().forward),
            (std::vector<std::string>{"lm_head.dense", "lm_head.gelu", "lm_head.norm", "output", "loss.log_softmax",
                                      "loss.nll"}));
  EXPECT_EQ(Names(modules.front().forward),
            (std::vector<std::string>{"embed.lookup", "embed.positions", "embed.norm", "embed.dropout"}));
}

TEST(ModelDecomposeTest, TiedHeadSharesTheEmbedding) {
  Workload w;
  w.seq_len = 2048;
  const std::vector<ModuleKernels> modules = DecomposeModel(Preset("gpt3-175b"), w);
  const ModuleKernels& head = modules.back();
  for (const ParamTensor& p : head.params) EXPECT_NE(p.name, "output.weight");
  EXPECT_EQ(std::get<GemmDesc>(FindKernel(head.forward, "output")->compute).n, 50257);
  const ModuleKernels& embed = modules.front();
  EXPECT_EQ(Names(embed.forward), (std::vector<std::string>{"embed.lookup", "embed.positions"}));
  // The embedding's gradient is added to the head's, which autograd already put in .grad.
  EXPECT_EQ(Names(embed.backward), (std::vector<std::string>{"embed.positions.bwd", "embed.lookup.bwd",
                                                             "embed.lookup.tied_grad_accumulate"}));
  // No RoPE with learned positions; one fused q/k/v GEMM.
  EXPECT_EQ(FindKernel(modules[1].forward, "attn.rope_q.mul"), nullptr);
  EXPECT_NE(FindKernel(modules[1].forward, "attn.wqkv"), nullptr);
  // MPT: ALiBi, so neither a position table nor RoPE.
  const std::vector<ModuleKernels> mpt = DecomposeModel(Preset("mpt-7b"), w);
  EXPECT_EQ(Names(mpt.front().forward), (std::vector<std::string>{"embed.lookup"}));
  EXPECT_EQ(FindKernel(mpt[1].forward, "attn.rope_q.mul"), nullptr);
}

TEST(ModelDecomposeTest, MoeRemainderTokensGoToASecondGroupedGemm) {
  Workload w;
  w.seq_len = 7;  // 14 routed tokens over 8 experts: 2 experts take 1, 6 take 2
  const std::vector<ModuleKernels> modules = DecomposeModel(Preset("mixtral-8x7b"), w);
  const ModuleKernels& layer = modules[1];
  const auto& even = std::get<GemmDesc>(FindKernel(layer.forward, "moe.experts.w1")->compute);
  const auto& rem = std::get<GemmDesc>(FindKernel(layer.forward, "moe.experts.w1.rem")->compute);
  EXPECT_EQ(even.batch, 2);
  EXPECT_EQ(even.m, 1);
  EXPECT_EQ(rem.batch, 6);
  EXPECT_EQ(rem.m, 2);
  EXPECT_EQ(even.m * even.batch + rem.m * rem.batch, 7 * 2);
  EXPECT_EQ(std::get<GemmDesc>(FindKernel(layer.forward, "moe.router")->compute).n, 8);

  // Evenly divisible: one grouped GEMM over all experts.
  w.seq_len = 4096;
  const ModuleKernels even_layer = DecomposeModel(Preset("mixtral-8x7b"), w)[1];
  const auto& grouped = std::get<GemmDesc>(FindKernel(even_layer.forward, "moe.experts.w1")->compute);
  EXPECT_EQ(grouped.batch, 8);
  EXPECT_EQ(grouped.m, 4096 * 2 / 8);
  EXPECT_EQ(FindKernel(even_layer.forward, "moe.experts.w1.rem"), nullptr);
}

// ---- Validation

TEST(ModelValidateTest, RejectsBadDimsNamingTheField) {
  struct Case {
    const char* field;
    void (*mutate)(ModelSpec&);
  };
  const Case kCases[] = {
      {"layers must be positive, got 0", [](ModelSpec& m) { m.layers = 0; }},
      {"hidden must be positive", [](ModelSpec& m) { m.hidden = -4096; }},
      {"vocab must be positive", [](ModelSpec& m) { m.vocab = 0; }},
      {"ffn must be positive", [](ModelSpec& m) { m.ffn = 0; }},
      {"kv_heads must be positive", [](ModelSpec& m) { m.kv_heads = 0; }},
      {"hidden (4100) must be divisible by heads (32)", [](ModelSpec& m) { m.hidden = 4100; }},
      {"kv_heads (5) must divide heads (32)", [](ModelSpec& m) { m.kv_heads = 5; }},
      {"experts_per_token (3) must not exceed experts (2)",
       [](ModelSpec& m) {
         m.experts = 2;
         m.experts_per_token = 3;
       }},
      {"max_positions must be positive", [](ModelSpec& m) { m.learned_positions = true; }},
      {"alibi and learned_positions",
       [](ModelSpec& m) {
         m.learned_positions = true;
         m.max_positions = 2048;
         m.alibi = true;
       }},
      {"norm_bias", [](ModelSpec& m) { m.norm_bias = true; }},
      {"token_types must not be negative", [](ModelSpec& m) { m.token_types = -1; }},
  };
  for (const Case& c : kCases) {
    ModelSpec m = Preset("llama3-8b");
    c.mutate(m);
    const Status status = ValidateModel(m);
    EXPECT_EQ(status.code(), StatusCode::kInvalidInput) << c.field;
    EXPECT_THAT(status.message(), HasSubstr(c.field));
    EXPECT_THAT(status.message(), HasSubstr("model 'llama3-8b'"));
    EXPECT_EQ(DecomposeModel(m, Workload{}).size(), 0u) << c.field;
  }
}

TEST(ModelValidateTest, WorkloadNamesTheField) {
  const ModelSpec gpt3 = Preset("gpt3-175b");
  Workload w;
  w.seq_len = 4096;
  EXPECT_THAT(ValidateWorkload(gpt3, w).message(),
              HasSubstr("seq_len (4096) exceeds max_positions (2048)"));
  EXPECT_EQ(DecomposeModel(gpt3, w).size(), 0u);
  // RoPE and ALiBi models have no table to run past.
  EXPECT_TRUE(ValidateWorkload(Preset("llama3-8b"), w).ok());
  EXPECT_TRUE(ValidateWorkload(Preset("mpt-7b"), w).ok());
  w.seq_len = 512;
  EXPECT_TRUE(ValidateWorkload(Preset("roberta-10b"), w).ok());
  w.seq_len = 513;
  EXPECT_FALSE(ValidateWorkload(Preset("roberta-10b"), w).ok());
  w.seq_len = 0;
  EXPECT_THAT(ValidateWorkload(gpt3, w).message(), HasSubstr("seq_len must be positive"));
  w.seq_len = 1024;
  w.micro_batch = 0;
  EXPECT_THAT(ValidateWorkload(gpt3, w).message(), HasSubstr("micro_batch must be positive"));
}

}  // namespace
}  // namespace shardscope::sim

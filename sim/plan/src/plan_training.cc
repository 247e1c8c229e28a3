// The training: section (sequence length, batch, activation checkpointing, dtype and precision,
// the PyTorch version and model code) and the kernel choices it resolves to: what PyTorch and
// the framework launch for this job on this GPU (model.h KernelChoices).
#include <fmt/format.h>

#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "plan_parser.h"
#include "shardscope/sim/models/compute_model.h"
#include "shardscope/sim/presets/cuda_runtime.h"

namespace shardscope::sim::plan_internal {

Status PlanParser::ReadTraining(const Entry& entry, const GpuSpec& gpu, TrainingConfig* out,
                                bool* dtype_given, YAML::Mark* seq_len_mark,
                                YAML::Mark* dtype_mark, YAML::Mark* kernels_mark) const {
  SHARDSCOPE_ASSIGN_OR_RETURN(Fields fields,
                              ReadMapping(entry.value, MarkOf(entry), "training", kTrainingKeys));
  if (const Entry* e = fields.Find("seq_len")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadInt(*e, "training.seq_len", 1, kMaxSeqLen, &out->seq_len));
    *seq_len_mark = MarkOf(*e);
  }
  if (const Entry* e = fields.Find("micro_batch_size")) {
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadInt(*e, "training.micro_batch_size", 1, kMaxMicroBatch, &out->micro_batch_size));
  }
  if (const Entry* e = fields.Find("grad_accum_steps")) {
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadInt32(*e, "training.grad_accum_steps", 1, kMaxGradAccum, &out->grad_accum_steps));
  }
  if (const Entry* e = fields.Find("activation_checkpointing")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadEnum(*e, "training.activation_checkpointing", kCheckpointing,
                                        &out->activation_checkpointing));
  }
  if (const Entry* e = fields.Find("selective_ac_every")) {
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadInt32(*e, "training.selective_ac_every", 1, kMaxLayers, &out->selective_ac_every));
    // torchtitan reads selective_ac_option only in selective mode; here a value that would be
    // ignored is a mistake worth naming.
    if (out->activation_checkpointing != ActivationCheckpointing::kSelective) {
      return KeyError(*e, "training.selective_ac_every",
                      "no selective_ac_every unless activation_checkpointing is selective",
                      fmt::format("selective_ac_every with activation_checkpointing {}",
                                  NameOf(kCheckpointing, out->activation_checkpointing)));
    }
  }
  if (const Entry* e = fields.Find("max_grad_norm")) {
    // clip_grad_norm_(max_norm); 0 here means no clipping at all.
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadNumber(*e, "training.max_grad_norm", 0, false, kMaxGradNorm, &out->max_grad_norm));
  }
  if (const Entry* e = fields.Find("precision")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadEnum(*e, "training.precision", kPrecisions, &out->precision));
  }
  if (const Entry* e = fields.Find("pytorch_version")) {
    // The scalar's text as written: an unquoted 2.10 must not become the float 2.1.
    const std::string expected = "a PyTorch release as \"major.minor\" (e.g. \"2.5\"), from 1.8";
    if (!e->value.IsScalar()) return Error(*e, "training.pytorch_version", expected);
    const std::string text = e->value.Scalar();
    int32_t major = 0, minor = 0;
    const char* begin = text.data();
    const char* end = text.data() + text.size();
    auto [p1, ec1] = std::from_chars(begin, end, major);
    bool ok = ec1 == std::errc() && p1 < end && *p1 == '.';
    if (ok) {
      auto [p2, ec2] = std::from_chars(p1 + 1, end, minor);
      // An optional patch release: "2.4.1".
      int32_t patch = 0;
      ok = ec2 == std::errc() &&
           (p2 == end || (*p2 == '.' && std::from_chars(p2 + 1, end, patch).ptr == end && patch >= 0));
    }
    if (!ok || major < 1 || minor < 0 || major > kMaxPytorchMajor || minor > kMaxPytorchMinor ||
        (major == 1 && minor < 8)) {
      return Error(*e, "training.pytorch_version", expected);
    }
    out->pytorch_major = major;
    out->pytorch_minor = minor;
    *kernels_mark = MarkOf(*e);
  }
  if (const Entry* e = fields.Find("cuda_version")) {
    // The CUDA the PyTorch build runs on, "major.minor"; like pytorch_version, read as written.
    const std::string expected =
        "a CUDA release as \"major.minor\" (e.g. \"12.4\"), from 10.0 (PyTorch 1.8's oldest build is CUDA 10.1)";
    if (!e->value.IsScalar()) return Error(*e, "training.cuda_version", expected);
    const std::optional<ReleaseVersion> cuda = ParseReleaseVersion(e->value.Scalar());
    if (!cuda || cuda->major < kMinCudaMajor || cuda->major > kMaxCudaMajor || cuda->minor > kMaxCudaMinor) {
      return Error(*e, "training.cuda_version", expected);
    }
    out->cuda_major = cuda->major;
    out->cuda_minor = cuda->minor;
  }
  if (const Entry* e = fields.Find("init")) {
    SHARDSCOPE_ASSIGN_OR_RETURN(Fields init, ReadMapping(e->value, MarkOf(*e), "training.init", kInitKeys));
    if (const Entry* d = init.Find("device")) {
      InitDevice device = InitDevice::kCpu;
      SHARDSCOPE_RETURN_IF_ERROR(ReadEnum(*d, "training.init.device", kInitDevices, &device));
      out->init_device = device;
    }
  }
  if (const Entry* e = fields.Find("implementation")) {
    ModelImplementation implementation = ModelImplementation::kTorchtitan;
    SHARDSCOPE_RETURN_IF_ERROR(ReadEnum(*e, "training.implementation", kImplementations, &implementation));
    out->implementation = implementation;
  }
  if (const Entry* e = fields.Find("compile")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadBool(*e, "training.compile", &out->compile));
  }
  if (const Entry* e = fields.Find("attention")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadEnum(*e, "training.attention", kAttentionChoices, &out->attention));
    *kernels_mark = MarkOf(*e);
  }
  if (const Entry* e = fields.Find("rms_norm")) {
    RmsNormKernel kernel = RmsNormKernel::kFused;
    SHARDSCOPE_RETURN_IF_ERROR(ReadEnum(*e, "training.rms_norm", kRmsNormKernels, &kernel));
    out->rms_norm = kernel;
  }
  if (const Entry* e = fields.Find("dtype")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadEnum(*e, "training.dtype", kTrainingDTypes, &out->dtype));
    if (!DTypeSupported(gpu, out->dtype)) {
      return Error(*e, "training.dtype", ExpectedDType(gpu));
    }
    *dtype_given = true;
    *dtype_mark = MarkOf(*e);
  }
  return Status::Ok();
}

// What PyTorch and the framework code launch for this job (model.h KernelChoices).
Status PlanParser::ResolveKernelChoices(const YAML::Mark& mark, Plan* plan) const {
  TrainingConfig& t = plan->training;
  KernelChoices& k = t.kernels;
  const auto at_least = [&t](int32_t major, int32_t minor) {
    return t.pytorch_major > major || (t.pytorch_major == major && t.pytorch_minor >= minor);
  };
  const auto is = [&t](int32_t major, int32_t minor) { return t.pytorch_major == major && t.pytorch_minor == minor; };
  // The framework whose model code runs: torchtitan drives FSDP2; DeepSpeed, FSDP1 and DDP jobs
  // usually train transformers' models.
  k.implementation = t.implementation.value_or(plan->strategy == Strategy::kFsdp2 ? ModelImplementation::kTorchtitan
                                                                                : ModelImplementation::kHuggingFace);
  k.compile = t.compile;
  // The loss: transformers computes it inside the compiled forward. torchtitan left it out
  // through 2024 (train.py: "TODO: compiling loss function causes CUDA errors, turning off
  // for now") and compiles it from 2025 (components/loss.py build_cross_entropy_loss, later
  // compile.components); PyTorch 2.7 (April 2025) is taken as the boundary — an ESTIMATE of
  // the date, the framework's version is not a plan key.
  k.compile_loss = t.compile && (k.implementation != ModelImplementation::kTorchtitan || at_least(2, 7));
  // RMSNorm: transformers' LlamaRMSNorm is Python; torchtitan uses nn.RMSNorm, whose ATen op is
  // composite from PyTorch 2.4 (PR #121364) and dispatches to the fused CUDA kernel from 2.9
  // (PR #153666 merged after the 2.8 branch cut of 2025-06-24 and before 2.9's of 2025-09-08);
  // before 2.4 torchtitan's norms.py had its own Python RMSNorm.
  if (t.rms_norm) {
    k.rms_norm = *t.rms_norm;
  } else if (k.implementation == ModelImplementation::kHuggingFace || !at_least(2, 4)) {
    k.rms_norm = RmsNormKernel::kPython;
  } else {
    k.rms_norm = at_least(2, 9) ? RmsNormKernel::kFused : RmsNormKernel::kComposite;
  }
  // Attention. scaled_dot_product_attention exists from PyTorch 2.0; before it every framework
  // ran the unfused path. Its dispatch (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp):
  // flash needs sm80+ (FlashAttention-2 from 2.2), so Volta takes the memory-efficient kernel;
  // on Hopper cuDNN comes first in 2.5.0 (PyTorch 2.5 release blog), was deprioritized again
  // for 2.6 (PR #141274), and is preferred again once the bundled cuDNN passes the runtime gate
  // cudnn_version > 91500: the CUDA 12.8 wheels of 2.11 ship cuDNN 9.17.1 (RELEASE.md
  // compatibility matrix), 2.9's and 2.10's 9.10.2 (issue #165801, PR #171895).
  const GpuArch arch = plan->cluster.gpu.arch;
  k.eager_attention = false;
  switch (t.attention) {
    case AttentionChoice::kSdpa:
      if (!at_least(2, 0)) {
        k.eager_attention = true;
      } else if (arch == GpuArch::kVolta) {
        k.attention = traces::AttentionImpl::kMemEfficient;
      } else if (arch == GpuArch::kHopper && (is(2, 5) || at_least(2, 11))) {
        k.attention = traces::AttentionImpl::kCudnn;
      } else {
        k.attention = traces::AttentionImpl::kFlash2;
      }
      break;
    case AttentionChoice::kEager: k.eager_attention = true; break;
    case AttentionChoice::kFlash2: k.attention = traces::AttentionImpl::kFlash2; break;
    case AttentionChoice::kFlash3: k.attention = traces::AttentionImpl::kFlash3; break;
    case AttentionChoice::kCudnn: k.attention = traces::AttentionImpl::kCudnn; break;
    case AttentionChoice::kMemEfficient: k.attention = traces::AttentionImpl::kMemEfficient; break;
  }
  if (!k.eager_attention && !AttentionSupported(k.attention, arch)) {
    std::vector<std::string> supported;
    for (const auto& [name, choice] : kAttentionChoices) {
      if (choice == AttentionChoice::kSdpa || choice == AttentionChoice::kEager) continue;
      const auto impl = traces::ParseAttentionImpl(name);
      if (impl && AttentionSupported(*impl, arch)) supported.push_back(std::string(name));
    }
    return Error(mark, "training.attention",
                 fmt::format("an attention kernel with published measurements on {} ({}, sdpa or eager)",
                             plan->cluster.gpu.name, fmt::join(supported, ", ")),
                 Quote(traces::AttentionImplName(k.attention)));
  }
  // Grouped-query attention: the unfused path and torchtitan's model code until its
  // "GQA without kv repeats" change (pytorch/torchtitan PR #2259, early 2026: modelled from
  // PyTorch 2.11) materialize K and V per query head (repeat_kv); transformers' SDPA path
  // passes enable_gqa from PyTorch 2.5 (integrations/sdpa_attention.py use_gqa_in_sdpa).
  k.repeat_kv = k.eager_attention ||
                (k.implementation == ModelImplementation::kTorchtitan ? !at_least(2, 11) : !at_least(2, 5));
  // The unfused path materializes batch x heads x seq^2 scores: keep their byte counts in range.
  if (k.eager_attention) {
    const double scores = static_cast<double>(t.micro_batch_size) * plan->model.heads *
                          static_cast<double>(t.seq_len) * static_cast<double>(t.seq_len);
    if (scores > kMaxActivationElements) {
      return Error(mark, "training.attention",
                   "a fused kernel for this length (the unfused path's batch x heads x seq^2 scores exceed 2^50)",
                   "eager");
    }
  }
  return Status::Ok();
}

}  // namespace shardscope::sim::plan_internal

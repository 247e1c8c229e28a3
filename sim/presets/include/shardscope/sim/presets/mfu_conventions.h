// Model FLOPs and MFU the way each training framework counts them, so a predicted step can be
// compared with the figure a user's own logs print (docs/REPORT.md, "MFU by convention").
//
// The frameworks disagree on what a "model FLOP" is (embeddings in or out, causal attention
// halved or not, the LM head, biases) and on the peak they divide by, and the same run is
// reported anywhere from a few percent to ~10% apart. shardscope's own model FLOPs
// (TrainingFlopsPerToken) follow Megatron-LM's current formula.
#ifndef SHARDSCOPE_SIM_MFU_CONVENTIONS_H_
#define SHARDSCOPE_SIM_MFU_CONVENTIONS_H_

#include <array>
#include <cstdint>
#include <string_view>

#include "shardscope/sim/presets/hardware.h"
#include "shardscope/sim/presets/model.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::sim {

enum class MfuConvention : uint8_t {
  kTorchtitan,  // get_dense_model_nparams_and_flops + tools/utils.py get_peak_flops
  kMegatron,    // training.py num_floating_point_operations (causal-halved), datasheet peak
  kLlmFoundry,  // ComposerMPTCausalLM.flops_per_batch + Composer's GPU_AVAILABLE_FLOPS
  kDeepSpeed,   // flops profiler: 3 x the forward's linear and SDPA FLOPs, datasheet peak
};
inline constexpr std::array<MfuConvention, 4> kMfuConventions = {
    MfuConvention::kTorchtitan, MfuConvention::kMegatron, MfuConvention::kLlmFoundry, MfuConvention::kDeepSpeed};

// "torchtitan", "megatron", "llm_foundry", "deepspeed".
std::string_view MfuConventionName(MfuConvention convention);

// Training (forward + backward) FLOPs per token as that framework counts them; recomputation
// is never counted.
double ConventionFlopsPerToken(MfuConvention convention, const ModelSpec& model, int64_t seq_len);

// The peak FLOP/s that framework divides by for `gpu` training in `dtype`; 0 where it reports
// no MFU (Composer has no bf16 entry for V100).
double ConventionPeakFlops(MfuConvention convention, const GpuSpec& gpu, traces::DType dtype);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_MFU_CONVENTIONS_H_

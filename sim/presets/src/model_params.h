// The parameter tensors of each module of a model (model.cc), shared with the kernel
// decomposition (model_kernels.cc). Private to sim/.
#ifndef SHARDSCOPE_SIM_MODEL_PARAMS_H_
#define SHARDSCOPE_SIM_MODEL_PARAMS_H_

#include <cstdint>
#include <vector>

#include "shardscope/sim/presets/model.h"

namespace shardscope::sim {

// Token (+ position, token type) embeddings and, with embedding_norm, their LayerNorm.
std::vector<ParamTensor> EmbedParams(const ModelSpec& model);
// One transformer block: norms, wq/wk/wv/wo, the MLP (or the router and stacked experts).
std::vector<ParamTensor> LayerParams(const ModelSpec& model);
// The final norm, the LM-head transform and the output projection (unless tied).
std::vector<ParamTensor> HeadParams(const ModelSpec& model);
// One expert's MLP.
int64_t ExpertParams(const ModelSpec& model);
int64_t SumNumel(const std::vector<ParamTensor>& params);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_MODEL_PARAMS_H_

// Private to sim/presets: the autograd graph of one module (model_kernels.cc records each
// module's eager ops into a GraphBuilder; autograd_graph.cc generates their backward).
//
// GraphBuilder::Build walks the recorded ops in reverse, as the autograd engine does
// (torch/csrc/autograd/engine.cpp), turns each op's BackwardSteps into kernels, and adds the
// additions where a tensor's gradients from several uses meet
// (torch/csrc/autograd/input_buffer.cpp InputBuffer::add: in place into the first buffer when
// nothing else holds it, otherwise out of place).
#ifndef SHARDSCOPE_SIM_PRESETS_AUTOGRAD_GRAPH_H_
#define SHARDSCOPE_SIM_PRESETS_AUTOGRAD_GRAPH_H_

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardscope/sim/presets/model.h"

namespace shardscope::sim::kernels_internal {

inline traces::MemoryBoundDesc Mem(int64_t read, int64_t written) { return traces::MemoryBoundDesc{read, written}; }

// One backward kernel of an op. `grads_of` are op inputs whose gradient the kernel writes (a
// fresh tensor each); `aliases` receive the same gradient tensor as grads_of[0] (an addition's
// other operand). No compute: the gradient passes through unchanged (an addition, a view), no
// kernel. `temps_out` are intermediate tensors of the op's backward this kernel writes,
// `temps_in` those it reads.
struct BackwardStep {
  std::string suffix;
  std::optional<traces::ComputeDesc> compute;
  std::vector<int32_t> saved;      // forward tensors read
  std::vector<int32_t> grads_of;
  std::vector<int32_t> aliases;
  std::vector<int32_t> temps_out, temps_in;
  int64_t workspace = 0;
  bool reads_output_grads = true;
  bool weight_grad = false;        // writes parameter gradients (ModuleKernel::weight_grad)
};

class GraphBuilder {
 public:
  explicit GraphBuilder(std::string name) { m_.name = std::move(name); }

  void SetParams(std::vector<ParamTensor> params) { m_.params = std::move(params); }

  int32_t Tensor(std::string name, int64_t bytes, bool requires_grad = true, bool external = false) {
    m_.tensors.push_back({std::move(name), std::max<int64_t>(bytes, 0), external});
    requires_grad_.push_back(requires_grad);
    return static_cast<int32_t>(m_.tensors.size() - 1);
  }
  // A view of `base` (split, transpose): no allocation of its own.
  int32_t View(std::string name, int32_t base, int64_t bytes) {
    const int32_t v = Tensor(std::move(name), bytes);
    m_.tensors[static_cast<size_t>(v)].view_of = base;
    return v;
  }
  int32_t Input(int64_t bytes, bool requires_grad = true, bool external = false) {
    m_.input = Tensor("input", bytes, requires_grad, external);
    return m_.input;
  }

  // One eager op. `forward` empty: no kernel (the op matters only for its backward).
  void Op(std::string name, std::optional<traces::ComputeDesc> forward, std::vector<int32_t> inputs,
          std::vector<int32_t> outputs, std::vector<BackwardStep> backward,
          KernelDispatch dispatch = KernelDispatch::kPython, bool matmul = false, bool fused_attention = false,
          int64_t workspace = 0);

  // Generates the backward from the recorded ops; `output` is what the next module reads.
  ModuleKernels Build(int32_t output, bool output_grad_external = false) &&;

 private:
  struct RecordedOp {
    std::string name;
    std::vector<int32_t> inputs, outputs;
    std::vector<BackwardStep> backward;
  };

  void SetGrad(int32_t tensor, int32_t grad) {
    if (static_cast<size_t>(grad) >= holders_.size()) holders_.resize(static_cast<size_t>(grad) + 1, 0);
    if (static_cast<size_t>(tensor) >= grad_.size()) grad_.resize(static_cast<size_t>(tensor) + 1, -1);
    grad_[static_cast<size_t>(tensor)] = grad;
    ++holders_[static_cast<size_t>(grad)];
  }

  int32_t NewGrad(int32_t tensor, std::string_view suffix);
  // A gradient `g` of `tensor` arrives: the first is kept, later ones are added in
  // (InputBuffer::add).
  void Contribute(int32_t tensor, int32_t g);
  void Backward(const RecordedOp& op);

  ModuleKernels m_;
  std::vector<bool> requires_grad_;
  std::vector<bool> produced_;    // written by a recorded op's forward
  std::vector<RecordedOp> ops_;
  std::vector<int32_t> grad_;     // tensor -> its current gradient tensor (-1: none yet)
  std::vector<int32_t> holders_;  // gradient tensor -> how many tensors it is the gradient of
  int32_t parts_ = 0, sums_ = 0;
};

}  // namespace shardscope::sim::kernels_internal

#endif  // SHARDSCOPE_SIM_PRESETS_AUTOGRAD_GRAPH_H_

// The backward of a module's recorded ops (see autograd_graph.h): one kernel per backward
// step, gradients accumulated as the autograd engine's InputBuffer::add does.
#include "autograd_graph.h"

#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace shardscope::sim::kernels_internal {

// One eager op. `forward` empty: no kernel (the op matters only for its backward).
void GraphBuilder::Op(std::string name, std::optional<traces::ComputeDesc> forward,
                      std::vector<int32_t> inputs, std::vector<int32_t> outputs,
                      std::vector<BackwardStep> backward, KernelDispatch dispatch, bool matmul,
                      bool fused_attention, int64_t workspace) {
  produced_.resize(m_.tensors.size(), false);
  if (forward) {
    ModuleKernel k;
    k.name = name;
    k.compute = *forward;
    k.reads = inputs;
    // An output an earlier op already produced is written in place (the second grouped GEMM
    // of an expert layer writes its rows of the first one's buffer).
    for (int32_t o : outputs) (produced_[static_cast<size_t>(o)] ? k.reads : k.writes).push_back(o);
    k.workspace_bytes = workspace;
    k.dispatch = dispatch;
    k.matmul = matmul;
    k.fused_attention = fused_attention;
    m_.forward.push_back(std::move(k));
  }
  for (int32_t o : outputs) produced_[static_cast<size_t>(o)] = true;
  ops_.push_back({std::move(name), std::move(inputs), std::move(outputs), std::move(backward)});
}

// Generates the backward from the recorded ops; `output` is what the next module reads.
ModuleKernels GraphBuilder::Build(int32_t output, bool output_grad_external) && {
  m_.output = output;
  const int32_t seed = Tensor("d.output", m_.tensors[static_cast<size_t>(output)].bytes, false,
                              output_grad_external);
  m_.output_grad = seed;
  grad_.assign(m_.tensors.size(), -1);
  holders_.assign(m_.tensors.size(), 0);
  SetGrad(output, seed);
  for (auto op = ops_.rbegin(); op != ops_.rend(); ++op) Backward(*op);
  if (m_.input >= 0 && static_cast<size_t>(m_.input) < grad_.size()) m_.input_grad = grad_[static_cast<size_t>(m_.input)];
  return std::move(m_);
}

int32_t GraphBuilder::NewGrad(int32_t tensor, std::string_view suffix) {
  const ActivationTensor& t = m_.tensors[static_cast<size_t>(tensor)];
  const int32_t id = Tensor(fmt::format("d.{}{}", t.name, suffix), t.bytes, false);
  grad_.resize(m_.tensors.size(), -1);
  holders_.resize(m_.tensors.size(), 0);
  return id;
}

// A gradient `g` of `tensor` arrives: the first is kept, later ones are added in
// (InputBuffer::add).
void GraphBuilder::Contribute(int32_t tensor, int32_t g) {
  if (!requires_grad_[static_cast<size_t>(tensor)]) return;
  const int32_t old = grad_[static_cast<size_t>(tensor)];
  if (old < 0) {
    SetGrad(tensor, g);
    return;
  }
  const int64_t bytes = m_.tensors[static_cast<size_t>(tensor)].bytes;
  ModuleKernel add;
  add.name = fmt::format("{}.grad_accumulate", m_.tensors[static_cast<size_t>(tensor)].name);
  add.compute = Mem(2 * bytes, bytes);
  add.reads = {old, g};
  add.dispatch = KernelDispatch::kCpp;
  if (holders_[static_cast<size_t>(old)] == 1) {
    // In place: buffer[pos] = old_var.add_(var).
    m_.backward.push_back(std::move(add));
    return;
  }
  const int32_t sum = NewGrad(tensor, fmt::format(".sum{}", ++sums_));
  add.writes = {sum};
  m_.backward.push_back(std::move(add));
  --holders_[static_cast<size_t>(old)];
  grad_[static_cast<size_t>(tensor)] = -1;
  SetGrad(tensor, sum);
}

void GraphBuilder::Backward(const RecordedOp& op) {
  std::vector<int32_t> out_grads;
  for (int32_t o : op.outputs) {
    const int32_t g = grad_[static_cast<size_t>(o)];
    if (g >= 0) out_grads.push_back(g);
  }
  if (out_grads.empty()) return;  // nothing downstream needs a gradient through this op
  for (const BackwardStep& step : op.backward) {
    if (!step.compute) {
      for (int32_t i : step.grads_of) Contribute(i, out_grads.front());
      continue;
    }
    ModuleKernel k;
    k.name = op.name + step.suffix;
    k.compute = *step.compute;
    k.dispatch = KernelDispatch::kCpp;
    k.weight_grad = step.weight_grad;
    k.workspace_bytes = step.workspace;
    if (step.reads_output_grads) k.reads = out_grads;
    k.reads.insert(k.reads.end(), step.saved.begin(), step.saved.end());
    k.reads.insert(k.reads.end(), step.temps_in.begin(), step.temps_in.end());
    k.writes = step.temps_out;
    std::vector<std::pair<int32_t, int32_t>> arrived;
    for (int32_t i : step.grads_of) {
      if (!requires_grad_[static_cast<size_t>(i)]) continue;
      const int32_t g = NewGrad(i, grad_[static_cast<size_t>(i)] < 0 ? "" : fmt::format(".{}", ++parts_));
      k.writes.push_back(g);
      arrived.emplace_back(i, g);
    }
    m_.backward.push_back(std::move(k));
    for (const auto& [i, g] : arrived) Contribute(i, g);
    if (!arrived.empty()) {
      for (int32_t a : step.aliases) Contribute(a, arrived.front().second);
    }
  }
}

}  // namespace shardscope::sim::kernels_internal

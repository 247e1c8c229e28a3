// The activation liveness analysis of activation_plan.h.
#include "activation_plan.h"

#include <fmt/format.h>

#include <map>

namespace shardscope::sim {
namespace {

// One kernel of the step in issue order, with its tensors resolved to global names.
struct Slot {
  size_t module = 0;
  enum Phase : uint8_t { kForward, kRecompute, kBackward } phase = kForward;
  int32_t index = 0;
  std::vector<int32_t> reads, writes;  // global tensor ids
  int64_t workspace = 0;
};

struct Planner {
  Planner(const std::vector<ModuleKernels>& modules, const std::vector<ActivationMode>& modes)
      : modules_(modules), modes_(modes) {
    ids_.resize(modules.size());
    for (size_t m = 0; m < modules.size(); ++m) ids_[m].assign(modules[m].tensors.size(), -2);
  }

  // The global id of module m's tensor t (-1: external, not tracked).
  int32_t Global(size_t m, int32_t t) {
    const ModuleKernels& mod = modules_[m];
    while (mod.tensors[static_cast<size_t>(t)].view_of >= 0) t = mod.tensors[static_cast<size_t>(t)].view_of;
    int32_t& id = ids_[m][static_cast<size_t>(t)];
    if (id != -2) return id;
    if (mod.tensors[static_cast<size_t>(t)].external) {
      id = -1;
    } else if (t == mod.input && m > 0) {
      id = Global(m - 1, modules_[m - 1].output);
    } else if (t == mod.input) {
      id = -1;  // the first module's input: the token ids
    } else if (t == mod.output_grad && m + 1 < modules_.size() && modules_[m + 1].input_grad >= 0) {
      id = Global(m + 1, modules_[m + 1].input_grad);
    } else {
      id = static_cast<int32_t>(names_.size());
      names_.push_back(fmt::format("act.{}.{}", mod.name, mod.tensors[static_cast<size_t>(t)].name));
      bytes_.push_back(mod.tensors[static_cast<size_t>(t)].bytes);
    }
    return id;
  }

  void Add(size_t m, Slot::Phase phase, int32_t index, const ModuleKernel& k) {
    Slot s;
    s.module = m;
    s.phase = phase;
    s.index = index;
    for (int32_t t : k.reads) {
      const int32_t g = Global(m, t);
      if (g >= 0) s.reads.push_back(g);
    }
    for (int32_t t : k.writes) {
      const int32_t g = Global(m, t);
      if (g >= 0) s.writes.push_back(g);
    }
    s.workspace = k.workspace_bytes;
    slots_.push_back(std::move(s));
  }

  const std::vector<ModuleKernels>& modules_;
  const std::vector<ActivationMode>& modes_;
  std::vector<std::vector<int32_t>> ids_;
  std::vector<std::string> names_;
  std::vector<int64_t> bytes_;
  std::vector<Slot> slots_;
};

// The forward kernels torchtitan's op-level SAC keeps the outputs of (_apply_op_sac's
// _save_list and policy): fused attention always, matmuls when their count in the block
// (from 1) is odd.
std::vector<bool> SacSaved(const ModuleKernels& module) {
  std::vector<bool> saved(module.forward.size(), false);
  int32_t mm_count = 0;
  for (size_t k = 0; k < module.forward.size(); ++k) {
    const ModuleKernel& kernel = module.forward[k];
    if (kernel.fused_attention) saved[k] = true;
    if (kernel.matmul && ++mm_count % 2 == 1) saved[k] = true;
  }
  return saved;
}

}  // namespace

ActivationPlan ActivationPlan::Build(const std::vector<ModuleKernels>& modules, const std::vector<ActivationMode>& modes) {
  Planner p(modules, modes);
  // The step's kernels in issue order.
  for (size_t m = 0; m < modules.size(); ++m) {
    for (size_t k = 0; k < modules[m].forward.size(); ++k) {
      p.Add(m, Slot::kForward, static_cast<int32_t>(k), modules[m].forward[k]);
    }
  }
  for (size_t step = 0; step < modules.size(); ++step) {
    const size_t m = modules.size() - 1 - step;
    const ActivationMode mode = modes[m];
    if (mode != ActivationMode::kKeep) {
      const std::vector<bool> kept = mode == ActivationMode::kOpSelective ? SacSaved(modules[m])
                                                                          : std::vector<bool>(modules[m].forward.size());
      for (size_t k = 0; k < modules[m].forward.size(); ++k) {
        if (!kept[k]) p.Add(m, Slot::kRecompute, static_cast<int32_t>(k), modules[m].forward[k]);
      }
    }
    for (size_t k = 0; k < modules[m].backward.size(); ++k) {
      p.Add(m, Slot::kBackward, static_cast<int32_t>(k), modules[m].backward[k]);
    }
  }
  // Liveness per instance: a write starts one; its last read (or the write, if never read)
  // ends it. Without autograd (a checkpointed module's forward), nothing the backward reads
  // keeps a tensor alive: the backward reads the recompute's instance.
  const size_t n = p.names_.size();
  std::vector<int64_t> last_use(n, -1);    // slot of the current instance's last use
  std::vector<int64_t> started(n, -1);     // slot that wrote the current instance
  std::vector<std::vector<int32_t>> frees_after(p.slots_.size());
  const auto end_instance = [&](int32_t t) {
    if (started[static_cast<size_t>(t)] < 0) return;
    frees_after[static_cast<size_t>(last_use[static_cast<size_t>(t)])].push_back(t);
    started[static_cast<size_t>(t)] = -1;
  };
  std::vector<std::vector<int32_t>> allocs_before(p.slots_.size());
  for (size_t i = 0; i < p.slots_.size(); ++i) {
    const Slot& s = p.slots_[i];
    for (int32_t t : s.reads) {
      if (started[static_cast<size_t>(t)] < 0) {
        // Read before any write in the step (a seed tensor): allocated for its first reader.
        started[static_cast<size_t>(t)] = static_cast<int64_t>(i);
        allocs_before[i].push_back(t);
      }
      last_use[static_cast<size_t>(t)] = static_cast<int64_t>(i);
    }
    for (int32_t t : s.writes) {
      end_instance(t);  // a rewrite (the recompute) ends the previous instance
      started[static_cast<size_t>(t)] = static_cast<int64_t>(i);
      last_use[static_cast<size_t>(t)] = static_cast<int64_t>(i);
      allocs_before[i].push_back(t);
    }
  }
  for (size_t t = 0; t < n; ++t) end_instance(static_cast<int32_t>(t));

  ActivationPlan plan;
  plan.modules_.resize(modules.size());
  for (size_t m = 0; m < modules.size(); ++m) plan.modules_[m].mode = modes[m];
  for (size_t i = 0; i < p.slots_.size(); ++i) {
    const Slot& s = p.slots_[i];
    PlannedKernel k;
    k.index = s.index;
    for (int32_t t : allocs_before[i]) k.allocs.emplace_back(p.names_[static_cast<size_t>(t)], p.bytes_[static_cast<size_t>(t)]);
    for (int32_t t : frees_after[i]) k.frees.push_back(p.names_[static_cast<size_t>(t)]);
    if (s.workspace > 0) {
      const ModuleKernels& mod = modules[s.module];
      const std::string ws = fmt::format("act.{}.{}.workspace", mod.name,
                                         s.phase == Slot::kBackward ? mod.backward[static_cast<size_t>(s.index)].name
                                                                    : mod.forward[static_cast<size_t>(s.index)].name);
      k.allocs.emplace_back(ws, s.workspace);
      k.frees.push_back(ws);
    }
    ModuleActivationPlan& out = plan.modules_[s.module];
    (s.phase == Slot::kForward ? out.forward : s.phase == Slot::kRecompute ? out.recompute : out.backward)
        .push_back(std::move(k));
  }
  return plan;
}

}  // namespace shardscope::sim

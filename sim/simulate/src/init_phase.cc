// The init phase through the caching allocator (init_phase.h).
#include "shardscope/sim/simulate/init_phase.h"

#include <algorithm>
#include <map>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "shardscope/base/rank_ranges.h"
#include "shardscope/sim/models/caching_allocator.h"
#include "shardscope/sim/simulate/simulate.h"

namespace shardscope::sim {
namespace {

// MakeCapacityDeviceMemory counts usage in whole 2 MiB pages; NCCL's buffers, which the
// allocator does not see, take their share of the same capacity once created.
constexpr int64_t kDevicePageBytes = int64_t{2} << 20;

int64_t Pages(int64_t bytes) { return (bytes + kDevicePageBytes - 1) / kDevicePageBytes * kDevicePageBytes; }

class SharedDevice : public DeviceMemory {
 public:
  explicit SharedDevice(int64_t capacity) : capacity_(capacity), inner_(MakeCapacityDeviceMemory(capacity)) {}
  bool Allocate(int64_t bytes, uint64_t* address) override {
    if (used_ + Pages(bytes) + external_ > capacity_) return false;
    if (!inner_->Allocate(bytes, address)) return false;
    used_ += Pages(bytes);
    return true;
  }
  void Release(uint64_t address, int64_t bytes) override {
    inner_->Release(address, bytes);
    used_ -= Pages(bytes);
  }
  bool Map(int64_t bytes) override {
    if (used_ + Pages(bytes) + external_ > capacity_) return false;
    if (!inner_->Map(bytes)) return false;
    used_ += Pages(bytes);
    return true;
  }
  void Unmap(int64_t bytes) override {
    inner_->Unmap(bytes);
    used_ -= Pages(bytes);
  }
  int64_t Capacity() const override { return capacity_; }
  void TakeExternal(int64_t bytes) { external_ += bytes; }
  int64_t Free() const { return std::max<int64_t>(0, capacity_ - used_ - external_); }

 private:
  int64_t capacity_;
  int64_t used_ = 0;
  int64_t external_ = 0;
  std::unique_ptr<DeviceMemory> inner_;
};

int64_t TensorBytes(int64_t numel, const InitOp& op) {
  const int64_t elements = (numel + op.divide - 1) / op.divide * op.multiply;
  const int64_t bytes = elements * op.element_bytes;
  return op.cap_bytes > 0 ? std::min(bytes, op.cap_bytes) : bytes;
}

}  // namespace

InitPhaseResult SimulateInitPhase(const traces::Schedule& schedule, const SimulationSetup& setup, int32_t rank) {
  InitPhaseResult result;
  const InitProgram& program = setup.init;
  if (program.empty() || rank < 0 || rank >= schedule.world_size()) return result;
  result.simulated = true;
  result.framework = program.framework;
  auto others = setup.memory.reserved_by_others_per_rank.find(rank);
  const int64_t reserved_by_others = others != setup.memory.reserved_by_others_per_rank.end()
                                         ? others->second
                                         : setup.memory.reserved_by_others_bytes;
  result.capacity_bytes = std::max<int64_t>(
      0, setup.cluster.gpu.usable_bytes - setup.device_memory.cuda_context_bytes - reserved_by_others);

  SharedDevice device(result.capacity_bytes);
  // Init runs on the default stream with no cross-stream frees: events complete at once.
  CompletedStreamEvents events;
  CachingAllocator allocator(setup.memory.allocator, device, events);
  // Live tensors by (group, unit); unit -1 for a tensor over every unit.
  std::map<std::pair<std::string, int32_t>, std::vector<uint64_t>> live;
  const traces::Program& rank_program = schedule.ProgramOf(rank);
  const std::vector<int64_t> no_slots;
  const std::vector<int64_t>& slot_bytes =
      static_cast<size_t>(rank) < setup.device_memory.nccl_per_rank.size()
          ? setup.device_memory.nccl_per_rank[static_cast<size_t>(rank)].slot_bytes
          : no_slots;
  std::vector<bool> slot_created(rank_program.comm_slots.size(), false);

  const auto alloc = [&](int64_t bytes, const InitOp& op, std::vector<uint64_t>& into) -> bool {
    const MallocOutcome out = allocator.Malloc(bytes, 0);
    if (!out.ok) {
      result.oom = InitOom{op.what, out.requested_bytes, device.Free()};
      return false;
    }
    into.push_back(out.address);
    if (allocator.stats().reserved_bytes > result.peak_reserved_bytes) {
      result.peak_reserved_bytes = allocator.stats().reserved_bytes;
      result.peak_what = op.what;
    }
    return true;
  };
  // One op over `units` (every unit, or the one being wrapped); `unit_key` -1 for every unit.
  const auto run = [&](const InitOp& op, int32_t first, int32_t last, int32_t unit_key) -> bool {
    switch (op.kind) {
      case InitOpKind::kAllocEach:
        for (int32_t u = first; u < last; ++u) {
          for (int64_t numel : program.units[static_cast<size_t>(u)]) {
            if (!alloc(TensorBytes(numel, op), op, live[{op.group, unit_key < 0 ? u : unit_key}])) return false;
          }
        }
        return true;
      case InitOpKind::kAllocFlat: {
        int64_t numel = 0;
        for (int32_t u = first; u < last; ++u) {
          for (int64_t n : program.units[static_cast<size_t>(u)]) numel += n;
        }
        return alloc(TensorBytes(numel, op), op, live[{op.group, unit_key}]);
      }
      case InitOpKind::kFree:
        for (auto it = live.begin(); it != live.end();) {
          const bool match = it->first.first == op.group && (unit_key < 0 || it->first.second == unit_key);
          if (!match) {
            ++it;
            continue;
          }
          for (uint64_t address : it->second) allocator.Free(address);
          it = live.erase(it);
        }
        return true;
      case InitOpKind::kCollective: {
        // PyTorch creates the process group's NCCL communicator at its first collective
        // (ProcessGroupNCCL::getNCCLComm); its buffers stay (nccl_memory.h).
        for (size_t s = 0; s < rank_program.comm_slots.size(); ++s) {
          if (rank_program.comm_slots[s] != op.slot || slot_created[s]) continue;
          slot_created[s] = true;
          const int64_t bytes = s < slot_bytes.size() ? slot_bytes[s] : 0;
          if (bytes > device.Free()) {
            result.oom = InitOom{op.what, bytes, device.Free()};
            return false;
          }
          device.TakeExternal(bytes);
          result.nccl_bytes += bytes;
        }
        return true;
      }
    }
    return true;
  };

  const int32_t units = static_cast<int32_t>(program.units.size());
  for (const InitPhase& phase : program.phases) {
    if (phase.per_unit) {
      for (int32_t u = 0; u < units; ++u) {
        for (const InitOp& op : phase.ops) {
          if (!run(op, u, u + 1, u)) return result;
        }
      }
    } else {
      for (const InitOp& op : phase.ops) {
        if (!run(op, 0, units, -1)) return result;
      }
    }
  }
  return result;
}

traces::ReportMemoryPhases MemoryPhasesOf(const traces::Schedule& schedule, const SimulationSetup& setup,
                                          const SimulationResult& result) {
  std::vector<RankStepMemory> step;
  step.reserve(result.ranks.size());
  for (const RankStats& r : result.ranks) {
    step.push_back({r.memory.stats.reserved_bytes_peak, r.memory.oom.has_value() && !r.memory.oom->injected});
  }
  return MemoryPhasesOf(schedule, setup, step, /*simulate_init=*/true);
}

traces::ReportMemoryPhases MemoryPhasesOf(const traces::Schedule& schedule, const SimulationSetup& setup,
                                          const std::vector<RankStepMemory>& step, bool simulate_init) {
  traces::ReportMemoryPhases phases;
  const DeviceMemorySetup& d = setup.device_memory;
  phases.cuda_version = ReleaseVersionText(d.cuda);
  phases.lazy_loading = d.lazy_loading;
  phases.init_framework = setup.init.framework;
  // Class key: program, others' memory, NCCL buffers (the capacity follows from them).
  using Key = std::tuple<int32_t, int64_t, int64_t>;
  std::map<Key, size_t> class_of;
  std::vector<std::vector<int32_t>> members;
  for (int32_t rank = 0; rank < schedule.world_size(); ++rank) {
    auto others = setup.memory.reserved_by_others_per_rank.find(rank);
    const int64_t reserved_by_others = others != setup.memory.reserved_by_others_per_rank.end()
                                           ? others->second
                                           : setup.memory.reserved_by_others_bytes;
    const Key key{schedule.ranks[static_cast<size_t>(rank)].program, reserved_by_others, d.NcclBytes(rank)};
    auto [it, inserted] = class_of.emplace(key, members.size());
    if (inserted) {
      members.emplace_back();
      traces::ReportMemoryClass c;
      c.usable_bytes = setup.cluster.gpu.usable_bytes;
      c.cuda_context_bytes = d.cuda_context_bytes;
      c.nccl_bytes = d.NcclBytes(rank);
      c.nccl_communicators = static_cast<size_t>(rank) < d.nccl_per_rank.size()
                                 ? d.nccl_per_rank[static_cast<size_t>(rank)].communicators
                                 : 0;
      c.cublas_workspace_bytes = d.cublas_workspace_bytes * d.cublas_workspaces;
      c.cublas_in_allocator = d.cublas_in_allocator;
      c.reserved_by_others_bytes = reserved_by_others;
      c.allocator_capacity_bytes = AllocatorCapacity(setup, rank);
      const InitPhaseResult init = simulate_init ? SimulateInitPhase(schedule, setup, rank) : InitPhaseResult{};
      c.init_simulated = init.simulated;
      c.init_capacity_bytes = init.capacity_bytes;
      c.init_nccl_bytes = init.nccl_bytes;
      c.init_peak_reserved_bytes = init.peak_reserved_bytes;
      c.init_peak_at = std::string(InitWhatText(init.peak_what));
      if (init.oom) {
        c.init_oom = true;
        c.init_oom_at = std::string(InitWhatText(init.oom->what));
        c.init_oom_requested_bytes = init.oom->requested_bytes;
      }
      phases.classes.push_back(std::move(c));
    }
    members[it->second].push_back(rank);
    traces::ReportMemoryClass& c = phases.classes[it->second];
    if (static_cast<size_t>(rank) < step.size()) {
      const RankStepMemory& m = step[static_cast<size_t>(rank)];
      c.step_peak_reserved_bytes = std::max(c.step_peak_reserved_bytes, m.peak_reserved_bytes);
      c.step_oom = c.step_oom || m.oom;
    }
  }
  for (size_t i = 0; i < phases.classes.size(); ++i) {
    traces::ReportMemoryClass& c = phases.classes[i];
    c.ranks = CompressRanks(members[i]);
    c.headroom_bytes = c.allocator_capacity_bytes - c.step_peak_reserved_bytes;
  }
  return phases;
}

}  // namespace shardscope::sim

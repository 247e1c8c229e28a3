// The cost provider, allocator capacity and engine configuration of one simulation.
#include "shardscope/sim/simulate/simulate.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "shardscope/sim/simulate/cluster_links.h"

namespace shardscope::sim {

using traces::Schedule;


int64_t AllocatorCapacity(const SimulationSetup& setup, int32_t rank) {
  auto it = setup.memory.reserved_by_others_per_rank.find(rank);
  const int64_t others = it != setup.memory.reserved_by_others_per_rank.end() ? it->second
                                                                                : setup.memory.reserved_by_others_bytes;
  const DeviceMemorySetup& d = setup.device_memory;
  return std::max<int64_t>(0, setup.cluster.gpu.usable_bytes - d.cuda_context_bytes - d.NcclBytes(rank) -
                                  d.CublasOutsideBytes() - others);
}

EngineConfig EngineConfigFor(const SimulationSetup& setup, const Schedule& schedule) {
  const int32_t world_size = schedule.world_size();
  EngineConfig config;
  config.memory.enabled = true;
  config.memory.allocator = setup.memory.allocator;
  config.memory.device_alloc_ns = setup.host.cuda_malloc_ns;
  config.memory.device_free_ns = setup.host.cuda_free_ns;
  config.memory.record_history = true;
  // One entry when every rank has the same capacity, else one per rank.
  std::vector<int64_t> capacities(static_cast<size_t>(std::max(1, world_size)));
  for (size_t rank = 0; rank < capacities.size(); ++rank) capacities[rank] = AllocatorCapacity(setup, static_cast<int32_t>(rank));
  if (std::all_of(capacities.begin(), capacities.end(), [&](int64_t c) { return c == capacities.front(); })) {
    capacities.resize(1);
  }
  config.memory.capacity_bytes = std::move(capacities);
  if (setup.device_memory.cublas_in_allocator) {
    config.memory.gemm_workspace_bytes = setup.device_memory.cublas_workspace_bytes;
    config.memory.gemm_workspaces = setup.device_memory.cublas_workspaces;
  }
  config.launch_overhead_ns = setup.host.launch_overhead_ns;
  config.max_queued_per_stream = setup.host.max_queued_launches_per_stream;
  config.compute_slowdown = setup.contention.compute_slowdown;
  config.comm_slowdown = setup.contention.comm_slowdown;
  config.oom_catch_and_sync = setup.oom.policy == OomPolicy::kCatchAndSync;
  config.rank_slowdown = setup.rank_slowdown;
  ClusterLinks links = ClusterLinksFor(schedule, setup.cluster, NcclModelConfig::For(setup.cluster.nccl));
  config.links = std::move(links.links);
  config.link_topologies = std::move(links.topologies);
  config.reduce_symmetry = !setup.simulate_every_rank;
  return config;
}

StatusOr<std::unique_ptr<CostProvider>> MakeCostProvider(const Schedule& schedule, const SimulationSetup& setup) {
  SHARDSCOPE_RETURN_IF_ERROR(CheckNcclChoices(schedule, setup.cluster));
  if (setup.calibration) return MakeCalibratedCostProvider(schedule, setup.cluster, *setup.calibration);
  return std::unique_ptr<CostProvider>(std::make_unique<ClusterCostProvider>(schedule, setup.cluster));
}

void ApplyCalibration(const CalibrationProfile& profile, EngineConfig& config) {
  if (profile.launch_overhead_ns) config.launch_overhead_ns = std::llround(profile.launch_overhead_ns->value);
  if (profile.compute_slowdown) config.compute_slowdown = profile.compute_slowdown->value;
  if (profile.comm_slowdown) config.comm_slowdown = profile.comm_slowdown->value;
}

StatusOr<InjectedOom> InjectedOomAt(const traces::Schedule& schedule, int64_t rank, int64_t op_id) {
  if (rank < 0 || rank >= schedule.world_size()) {
    return Status::InvalidInput(fmt::format("rank outside the world of {} ranks", schedule.world_size()));
  }
  const traces::Program& program = schedule.ProgramOf(static_cast<int32_t>(rank));
  for (const traces::Op& op : program.ops) {
    if (op.id != op_id) continue;
    if (!std::holds_alternative<traces::AllocateOp>(op.payload)) {
      return Status::InvalidInput(
          fmt::format("op {} is a {}, not an allocate", op_id, traces::OpKindName(op.payload)));
    }
    return InjectedOom{static_cast<int32_t>(rank), op_id};
  }
  return Status::InvalidInput(fmt::format("rank {}'s program ('{}') has no op {}", rank, program.name, op_id));
}

bool ValidStraggler(int64_t rank, double factor, int32_t world) {
  return rank >= 0 && rank < world && factor >= 1.0 && factor <= kMaxRankSlowdownFactor;
}

}  // namespace shardscope::sim

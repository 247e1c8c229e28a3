// What a simulation asks about durations, and the costs it charges on the host: the
// interface the engine calls (CostProvider), the host and contention settings a plan or a
// calibration profile sets, and the default provider over a cluster's compute and NCCL
// models (ClusterCostProvider). The calibrated provider is in calibration.h.
#ifndef SHARDSCOPE_SIM_MODELS_COST_PROVIDER_H_
#define SHARDSCOPE_SIM_MODELS_COST_PROVIDER_H_

#include <cstdint>
#include <vector>

#include "shardscope/base/status.h"
#include "shardscope/sim/models/compute_model.h"
#include "shardscope/sim/models/nccl_model.h"
#include "shardscope/sim/presets/hardware.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::sim {

// What the engine asks about durations. Implementations must be deterministic.
class CostProvider {
 public:
  virtual ~CostProvider() = default;
  virtual int64_t KernelNs(const traces::ComputeDesc& desc) const = 0;
  virtual int64_t MemcpyNs(traces::MemcpyKind kind, int64_t bytes) const = 0;
  // `communicator` is an index into Schedule::communicators.
  virtual CollectiveCost Collective(traces::CollectiveType type, int64_t bytes,
                                    int32_t communicator) const = 0;
  // Communicators with equal keys cost the same for every collective type and size (the
  // engine's symmetry reduction runs one of them for all; engine/rank_classes.h). The default
  // keeps every communicator apart, which is always right.
  virtual int64_t CommunicatorCostKey(int32_t communicator) const { return communicator; }
};

// Host-side costs the engine charges (defaults and their sources in sim/plan/src/plan_defaults.cc).
struct HostConfig {
  int64_t launch_overhead_ns = 0;   // CPU time of one kernel / collective / memcpy launch
  int64_t hook_overhead_ns = 0;     // CPU time of one framework hook (pre/post forward ...)
  int64_t python_op_overhead_ns = 0;// Python + dispatcher time per framework op
  int64_t cpp_op_overhead_ns = 0;   // dispatcher time per ATen op issued from C++ (autograd)
  int32_t max_queued_launches_per_stream = 0;  // launches a stream queues before the host blocks
  int64_t cuda_malloc_ns = 0;       // host time of one cudaMalloc (a new allocator segment)
  int64_t cuda_free_ns = 0;         // host time of one cudaFree (releasing a cached segment)
};

// The largest straggler factor (EngineConfig::rank_slowdown, `--straggler`, the plan's
// divergence.slowdown, schedule metadata): a rank 1,000 times slower is already a stopped one
// (the plan's kMaxRankSlowdown, sim/plan/src/plan_schema.h).
inline constexpr double kMaxRankSlowdownFactor = 1000;

// How concurrent compute and communication kernels slow each other down on one GPU.
struct ContentionConfig {
  double compute_slowdown = 0;      // compute runs at 1/(1+x) while a collective runs
  double comm_slowdown = 0;         // collectives run at 1/(1+x) while compute runs
};

// Costs kernels with the roofline model and collectives with the NCCL model, using each
// communicator's shape on the cluster (topologies are computed once).
class ClusterCostProvider : public CostProvider {
 public:
  ClusterCostProvider(const traces::Schedule& schedule, const ClusterSpec& cluster);
  int64_t KernelNs(const traces::ComputeDesc& desc) const override;
  int64_t MemcpyNs(traces::MemcpyKind kind, int64_t bytes) const override;
  CollectiveCost Collective(traces::CollectiveType type, int64_t bytes, int32_t communicator) const override;
  // Communicators of the same shape on the cluster (CommTopology) cost the same.
  int64_t CommunicatorCostKey(int32_t communicator) const override;

 private:
  ComputeModel compute_;
  NcclModel nccl_;
  std::vector<CommTopology> topologies_;
  std::vector<int32_t> topology_key_;  // per communicator: the index of its distinct topology
};

// NCCL 2.23+ refuses a collective whose function the knobs (NCCL_ALGO, NCCL_PROTO,
// NCCL_NVLS_ENABLE, NCCL_PAT_ENABLE) leave without any algorithm it can run on the
// communicator ("no algorithm/protocol available", src/enqueue.cc): InvalidInput naming where
// the plan set NCCL_ALGO, the function and the communicator, for each collective type the
// schedule issues on each communicator. Ok for older releases, which fall back to Ring.
Status CheckNcclChoices(const traces::Schedule& schedule, const ClusterSpec& cluster);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_MODELS_COST_PROVIDER_H_

// ZeRO-3's lowering class (private to sim/lowering), declared here because it spans two
// files: lowering_zero3_coordinator.cc (the submodules, the fetch trace and
// PartitionedParameterCoordinator's fetch / release with its all-gathers) and lowering_zero3.cc
// (forward and backward slices, stage3.py's gradient reduction and partitioning, the step).
// Sources: deepspeed/runtime/zero/stage3.py (DeepSpeedZeroOptimizer_Stage3),
// partitioned_param_coordinator.py (PartitionedParameterCoordinator) and
// partition_parameters.py (all_gather_coalesced).
#ifndef SHARDSCOPE_SIM_LOWERING_ZERO3_H_
#define SHARDSCOPE_SIM_LOWERING_ZERO3_H_

#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "lowering_zero_internal.h"

namespace shardscope::sim {

// ---------------------------------------------------------------------------------------
// ZeRO-3.
//
// Submodules: DeepSpeed registers its hooks on every nn.Module (parameter_offload.py
// DeepSpeedZeRoOffload._register_hooks_recursively) and fetches a module's own parameters
// (iter_params with recurse=False). The decomposition gives parameter tensors, not modules:
// one submodule per distinct parameter-name prefix (attention_norm, attention.wq, ...,
// feed_forward.w2) stands for the leaf modules that hold parameters. Container modules (the
// block, attention, feed_forward) hold none, so their hooks fetch nothing; their hook time
// is not charged (estimate). A module's kernels are divided in order among its submodules
// (estimate: the decomposition does not say which kernel belongs to which leaf).

struct Zero3Submodule {
  std::string name;             // "layers.0.attention.wq"
  size_t module = 0;            // index into ctx.modules
  size_t first = 0, count = 0;  // its share of the module's submodules (for kernel slices)
  int64_t numel = 0;            // all its parameters (ds_numel)
  int64_t fetch_numel = 0;      // its non-persistent parameters
  int64_t fetch_partition = 0;  // sum of ceil(numel / world) over its non-persistent parameters
  int64_t fetch_params = 0;     // how many non-persistent parameters
  int64_t persistent_numel = 0;
  int64_t persistent_padded = 0;
  std::vector<int64_t> param_numels;
  std::vector<int64_t> fetch_param_numels;  // its non-persistent parameters, one by one
  std::vector<std::pair<std::string, int64_t>> persistent;  // name, numel
};

enum class ParamStatus : uint8_t { kNotAvailable, kInflight, kAvailable };

class Zero3Lowering {
 public:
  explicit Zero3Lowering(const LoweringContext& ctx) : ctx_(ctx), b_("zero3") {}
  traces::Program Lower();

 private:
  int64_t ElementBytes() const { return DTypeSize(ctx_.compute_dtype); }
  void BuildSubmodules();
  void BuildTrace();
  void ResetStep();
  void AllGatherParams(const std::vector<size_t>& subs);
  void LegacyAllGatherParam(size_t sub, size_t param);
  void LegacySynchronizeCommunication();
  void LegacyDebugNorms(size_t sub);
  // The autograd gradient of the submodule's `param`-th parameter.
  std::string GradTensor(size_t sub, size_t param) const { return fmt::format("grad.{}.p{}", subs_[sub].name, param); }
  std::string LegacyBuffer(size_t sub, size_t param) const {
    return fmt::format("unsharded.{}.p{}", subs_[sub].name, param);
  }
  void FetchSubModule(size_t sub);
  void ReleaseSubModule(size_t sub);
  void LegacyReleaseParams(size_t sub);
  void ReleaseAll();
  void ForwardSlice(size_t sub, bool recompute = false);
  void BackwardSlice(size_t sub);
  void GradHookReduceIfFull(int64_t numel, int32_t micro_batch);
  void ReduceIndependent(size_t sub, int32_t micro_batch);
  void ReduceAndPartitionIpgGrads(int32_t micro_batch);
  void LegacyReduceIndependent(size_t sub, int32_t micro_batch);
  void LegacyReduceIpgGrads(int32_t micro_batch);
  void LegacyPartitionPreviousGrads(int32_t micro_batch);
  void LegacyReduceEpilogue(int32_t micro_batch);
  void LegacyStepHostChecks(const std::vector<int64_t>& grad_partitions);
  void LegacyPlaceholder();

  const LoweringContext& ctx_;
  ProgramBuilder b_;
  traces::StreamIndex compute_ = 0, all_gather_ = 0, reduce_ = 0;
  traces::CommSlot dp_ = 0;
  // 2021 path: the engine's data-parallel group (kCommEngineDp), where stage3.py's
  // dp_process_group collectives run; dp_ is Init's group, WORLD.
  traces::CommSlot dp_engine_ = 0;
  std::vector<Zero3Submodule> subs_;
  std::vector<std::vector<size_t>> subs_of_module_;
  std::vector<size_t> trace_;  // submodule fetched at each step (forward, then backward)

  // PartitionedParameterCoordinator state.
  std::vector<ParamStatus> status_;
  std::vector<int64_t> handle_of_;          // the all-gather handle of an inflight submodule
  std::vector<bool> in_registry_;           // __inflight_param_registry holds it
  std::vector<int64_t> most_recent_step_;   // __most_recent_step_id_param_fetched_for
  std::deque<size_t> param_queue_;          // trace steps not yet popped (__param_queue)
  struct Handle {
    std::vector<size_t> subs;
    int64_t flat_bytes = 0;
    bool single = false;        // the len(params) == 1 branch: no flat buffer
    bool complete = false;
    size_t in_registry = 0;     // its submodules still in __inflight_param_registry
  };
  void PopFromRegistry(size_t sub);
  std::vector<Handle> handles_;
  int64_t n_available_ = 0;
  size_t step_id_ = 0;
  std::deque<int64_t> ongoing_fetch_events_;
  int64_t fetch_events_ = 0;
  int64_t stream_waits_ = 0;
  std::vector<size_t> legacy_inflight_;     // 2021 path: submodules gathered, not yet waited for

  // Gradient reduction state (stage3.py).
  int64_t elements_in_ipg_bucket_ = 0;
  int64_t padded_in_ipg_bucket_ = 0;
  int64_t params_in_ipg_bucket_ = 0;
  std::vector<std::string> grads_to_free_at_reduce_;
  std::deque<int64_t> param_reduce_events_;
  int64_t reduce_events_ = 0;
  int64_t grad_ready_events_ = 0;
  // 2021 path: the parameters (numels) of the IPG bucket being filled, and of the bucket
  // reduced last, whose partitioning lags one bucket behind.
  std::vector<int64_t> legacy_bucket_, legacy_previous_bucket_;
  int64_t partition_numel_ = 0;        // Σ ceil(numel / world): the rank's partition
  bool grad_partition_alive_ = false;  // grads_in_partition allocated (2021: lazily, per step)
};

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_LOWERING_ZERO3_H_

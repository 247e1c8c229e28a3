// Host-side costs and compute/communication contention: their defaults, each with its source,
// and the host: section that overrides the host costs (cluster.contention overrides the
// contention in plan_cluster.cc; cluster.calibration replaces both with fitted values).
#include <cmath>
#include <cstdint>
#include <string_view>

#include "plan_parser.h"
#include "shardscope/sim/plan/plan.h"

namespace shardscope::sim {
namespace {

// CPU time to enqueue one asynchronous kernel launch (cudaLaunchKernel, no synchronization).
// Source: ahrefs/ocannl issue #488 (2026), a standalone CUDA probe timing N no-op kernels
// enqueued asynchronously: 2.62-2.81 us per launch (RTX 5070 Ti, CUDA 13.3), median of 200
// repetitions. Consistent with the "~1-3 us on CUDA 12+ drivers" usually quoted for
// cudaLaunchKernel. NCCL collectives cost more to issue (group calls, proxy work); the
// engine charges this figure for every launch, so collective issue cost is a lower bound.
constexpr int64_t kDefaultLaunchOverheadNs = 2'700;

// Python interpreter + ATen dispatcher + autograd bookkeeping for one eager framework op,
// excluding the driver launch above. Source: pytorch/pytorch issue #41383 ("Large overhead
// (7 microseconds) for PyTorch operation", 2020): `y = 2*x` on a 1-element tensor with
// requires_grad=True costs ~7 us per op (5 us without autograd); the tensor work itself is
// negligible there, so it is all dispatch. ngimel's reply there puts about half of it in
// Python argument parsing.
constexpr int64_t kDefaultPythonOpOverheadNs = 7'000;

// Dispatcher time of one ATen op issued from C++ (the autograd engine's backward kernels, the
// ops inside a composite ATen op), excluding the driver launch. Source: the same issue #41383,
// ngimel: "Approx half of it is python parsing overhead (same operation called using c++ API
// would take about a microsecond)".
constexpr int64_t kDefaultCppOpOverheadNs = 1'000;

// CPU time of one framework hook (FSDP2 pre-forward / post-forward / pre-backward /
// post-backward, DDP's per-bucket work), excluding the ops the hook issues (those are charged
// as ops and launches). ESTIMATE, not a measurement: an FSDP2 hook runs roughly 10-20 Python
// function calls, a tree_flatten/unflatten of the module's args, a state-machine update and,
// in pre-forward, the apply() of a RegisterPostBackwardFunction autograd function (itself
// about one op, kDefaultPythonOpOverheadNs). At ~1 us per Python call plus one op that is
// ~20-30 us. Upper bound seen in the wild: pytorch/pytorch issue #173680 (2026) reports
// FSDP::pre_forward taking ~1 ms per module on a Xeon with torch 2.10, but that includes
// the copy-in and all-gather ops of many small parameters, which this model charges
// separately.
constexpr int64_t kDefaultHookOverheadNs = 25'000;

// Work items one CUDA stream queues before the next launch onto it blocks the host until the
// oldest retires. Measured, not documented by NVIDIA: launches of a ~190 us kernel return in
// 4-5 us until about 1,000 are queued on a stream, then each takes one kernel's duration;
// with three streams each queued about 1,000 (Stack Overflow question 53970187, and NVIDIA
// developer forum thread 68937, "CUDA stream are blocked when launch lots of kernels
// (>1000)", 2018). 1,024 is that observation rounded to the power of two queues use. 0 in a
// plan means unlimited.
constexpr int32_t kDefaultMaxQueuedLaunchesPerStream = 1024;

// Host time of cudaMalloc and cudaFree. Source: University of Virginia CUDA overhead study
// ("Memory Allocation Overhead", cs.virginia.edu/~mwb7w/cuda_support/
// memory_management_overhead.html): cudaMalloc costs a roughly constant ~50 us from 4 KiB to
// 512 KiB and more above. Measured on GPUs of that time; the allocator's segments are 2 MiB
// and up, so this is a lower bound until calibration measures it. cudaFree: the same figure,
// an ESTIMATE (its synchronization with the device is modelled separately).
constexpr int64_t kDefaultCudaMallocNs = 50'000;
constexpr int64_t kDefaultCudaFreeNs = 50'000;
constexpr int64_t kMaxQueuedLaunchesPerStream = int64_t{1} << 24;

// Compute slowdown while a collective runs on the same GPU. Source: Lee et al.,
// "Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep
// Learning: Performance and Power Implications", arXiv:2507.03114 (2025): overlapping
// computation with communication slows computation by 18.9% on average (40.0% max) versus
// the same computation without concurrent communication, measured on GPT and LLaMA training
// across 4x A100, H100, MI250 and MI210.
constexpr double kDefaultComputeSlowdown = 0.189;

// Collective slowdown while compute runs on the same GPU. ESTIMATE: no published per-
// collective measurement on NVIDIA GPUs was found (the papers above report the compute side
// or whole-step effects only). NCCL kernels occupy few SMs and are bound by link bandwidth,
// so they lose less than the GEMMs beside them; their main loss is HBM bandwidth shared with
// memory-bound kernels. 10% is chosen as a conservative value below the measured compute
// slowdown; replace it when a measurement exists.
constexpr double kDefaultCommSlowdown = 0.10;

}  // namespace

HostConfig DefaultHostConfig() {
  HostConfig host;
  host.launch_overhead_ns = kDefaultLaunchOverheadNs;
  host.hook_overhead_ns = kDefaultHookOverheadNs;
  host.python_op_overhead_ns = kDefaultPythonOpOverheadNs;
  host.cpp_op_overhead_ns = kDefaultCppOpOverheadNs;
  host.max_queued_launches_per_stream = kDefaultMaxQueuedLaunchesPerStream;
  host.cuda_malloc_ns = kDefaultCudaMallocNs;
  host.cuda_free_ns = kDefaultCudaFreeNs;
  return host;
}

ContentionConfig DefaultContentionConfig() {
  ContentionConfig contention;
  contention.compute_slowdown = kDefaultComputeSlowdown;
  contention.comm_slowdown = kDefaultCommSlowdown;
  return contention;
}

namespace plan_internal {

Status PlanParser::ReadHostField(const Fields& fields, std::string_view key,
                                 int64_t* out_ns) const {
  const Entry* e = fields.Find(key);
  if (e == nullptr) return Status::Ok();
  double us = 0;
  SHARDSCOPE_RETURN_IF_ERROR(
      ReadNumber(*e, JoinPath("host", key), 0, false, kMaxHostOverheadUs, &us));
  *out_ns = std::llround(us * kNsPerUs);
  return Status::Ok();
}

Status PlanParser::ReadHost(const Entry& entry, HostConfig* out) const {
  SHARDSCOPE_ASSIGN_OR_RETURN(Fields fields,
                              ReadMapping(entry.value, MarkOf(entry), "host", kHostKeys));
  SHARDSCOPE_RETURN_IF_ERROR(ReadHostField(fields, "launch_overhead_us", &out->launch_overhead_ns));
  SHARDSCOPE_RETURN_IF_ERROR(ReadHostField(fields, "hook_overhead_us", &out->hook_overhead_ns));
  SHARDSCOPE_RETURN_IF_ERROR(
      ReadHostField(fields, "python_op_overhead_us", &out->python_op_overhead_ns));
  SHARDSCOPE_RETURN_IF_ERROR(ReadHostField(fields, "cpp_op_overhead_us", &out->cpp_op_overhead_ns));
  SHARDSCOPE_RETURN_IF_ERROR(ReadHostField(fields, "cuda_malloc_us", &out->cuda_malloc_ns));
  SHARDSCOPE_RETURN_IF_ERROR(ReadHostField(fields, "cuda_free_us", &out->cuda_free_ns));
  if (const Entry* e = fields.Find("max_queued_launches_per_stream")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadInt32(*e, "host.max_queued_launches_per_stream", 0,
                                         kMaxQueuedLaunchesPerStream,
                                         &out->max_queued_launches_per_stream));
  }
  return Status::Ok();
}

}  // namespace plan_internal
}  // namespace shardscope::sim

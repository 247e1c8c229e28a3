// The device interface: what the runtime core (rank_executor.h, watchdog.h) needs from a
// backend to run one rank, and all a backend has to write. The host backend (host_backend.cc:
// streams as threads, events as host flags, MPI collectives) and the CUDA backend
// (cuda/cuda_backend.cc: CUDA streams and events, NCCL, cuBLASLt proxies) implement it as
// adapters; tests implement it with a fake that records every call (rank_executor_test.cc), so
// the core's control flow runs on a machine without a GPU.
//
// Calls come from the rank's host thread (everything issued in program order) except
// MakeCurrent / QueryEvent / AsyncError / AbortCollectives, which the watchdog thread makes. A
// device error is returned as a Status and becomes the rank's reported error, never "not
// finished"; the watchdog then ends the job at once instead of waiting out its timeout.
#ifndef SHARDSCOPE_RUNTIME_SRC_DEVICE_H_
#define SHARDSCOPE_RUNTIME_SRC_DEVICE_H_

#include <cstdint>
#include <memory>

#include "run_result.h"
#include "shardscope/base/status.h"
#include "shardscope/runtime/execution_plan.h"
#include "shardscope/sim/models/caching_allocator.h"

namespace shardscope::runtime {

// A device event the core owns (the CUDA backend's cudaEvent_t, the fake's counter). Destroyed
// by its owner; destructors never throw.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
};

class Device {
 public:
  virtual ~Device() = default;

  // ---- Memory beneath the rank's caching allocator (sim's policy over the device's memory)
  // and the stream-ordered events of its record_stream deferral.
  virtual sim::DeviceMemory& AllocatorMemory() = 0;
  virtual sim::StreamEvents& AllocatorEvents() = 0;
  // An error the memory or events beneath the allocator met during its last call (the
  // allocator's interfaces answer only yes / no: CUDA's cudaEventQuery or cudaMalloc failing
  // with anything but "not ready" / "out of memory"); cleared by the call. The core asks after
  // every allocate, free and record_stream, so the error stops the rank at that op.
  virtual Status TakeAllocatorError() { return Status::Ok(); }

  // ---- Stream work, enqueued on op.stream in program order (`index` into the plan's ops).
  virtual Status Kernel(const OpPlan& op, int32_t index, int32_t step) = 0;
  virtual Status Memcpy(const OpPlan& op, int32_t index, int32_t step) = 0;
  // `record`: the collective's Flight Recorder record when the core brackets it with events
  // (TracksCollectivesWithEvents), else -1 and the device logs it through the executor itself
  // (RankExecutor::IssueRecordLocked) when its communicator's lane takes it.
  virtual Status Collective(const OpPlan& op, int32_t index, int32_t step, int64_t record) = 0;
  virtual Status RecordEvent(const OpPlan& op, int32_t index, int32_t step) = 0;
  virtual Status StreamWaitEvent(const OpPlan& op, int32_t index, int32_t step) = 0;

  // ---- Host synchronizations: block the host thread. The executor has set the host state
  // for stream and event synchronizations; a device synchronization sets its own.
  virtual Status SynchronizeStream(const OpPlan& op) = 0;
  virtual Status SynchronizeDevice(const OpPlan& op) = 0;
  virtual Status SynchronizeEvent(const OpPlan& op) = 0;
  virtual void HostWork(int64_t duration_ns) = 0;

  // ---- Steps. EndStep returns the step's time when `timed` (a measured step the rank did
  // not stop in), else 0.
  virtual Status BeginStep(int32_t step, bool measured) = 0;
  virtual StatusOr<int64_t> EndStep(int32_t step, bool measured, bool timed) = 0;
  // Around each op's issue, outside the issue hooks (CUDA: an NVTX range).
  virtual void BeginOp(const OpPlan& /*op*/, int32_t /*index*/) {}
  virtual void EndOp() {}

  // ---- Collective progress by events (ProcessGroupNCCL's WorkNCCL start / end events, which
  // Flight Recorder reads for "started" / "completed"): when true, the core records an event
  // on the collective's stream before and after it and the watchdog polls them.
  virtual bool TracksCollectivesWithEvents() const { return false; }
  virtual StatusOr<std::unique_ptr<DeviceEvent>> CreateEvent() { return Status::Internal("no device events"); }
  virtual Status RecordOn(DeviceEvent& /*event*/, int32_t /*stream*/) { return Status::Internal("no device events"); }
  // True: complete; false: not yet; an error: the device failed (reported, not "not finished").
  virtual StatusOr<bool> QueryEvent(DeviceEvent& /*event*/) { return Status::Internal("no device events"); }
  // Binds the calling (watchdog) thread to the device before it queries events.
  virtual Status MakeCurrent() { return Status::Ok(); }
  // An error the device found on its own, which no call returned and no event shows (NCCL's
  // ncclCommGetAsyncError: a peer or the network failed while the kernels keep waiting).
  // Polled by the watchdog.
  virtual Status AsyncError() { return Status::Ok(); }
  // The watchdog is about to end the job: unblock collectives stuck on the device
  // (ncclCommAbort). Called from the watchdog thread.
  virtual void AbortCollectives() {}

  // Adds what only this device measures to the rank's result (CUDA: the device, cudaMemGetInfo
  // at the peak, the operand pool, CUDA-graph replay times).
  virtual void FillResult(RankResult& /*result*/) const {}
};

}  // namespace shardscope::runtime

#endif  // SHARDSCOPE_RUNTIME_SRC_DEVICE_H_

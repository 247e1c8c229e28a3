// The runtime core for one rank: walks the execution plan on the rank's host thread and
// issues each op to its Device (device.h) in program order, between the OpHooks; runs the
// schedule's allocations through sim's caching-allocator policy over the device's memory
// (the raise policy on an out-of-memory); keeps the Flight Recorder log of its collectives
// (per communicator: issued, started, completed, sequence numbers) and the host thread's
// state for the dump; and builds the rank's result. Both backends run their ranks with it.
//
//   RankExecutor executor(schedule, setup, plan, options, device);
//   SHARDSCOPE_RETURN_IF_ERROR(executor.RunSteps());   // the host thread
//   RankResult result = executor.Result();
//
// Threads: the host thread calls RunSteps / IssueOp; the watchdog (watchdog.h) calls the
// "watchdog side" methods; a device's own threads (the host backend's stream workers) take
// mutex() to read or change the shared state, the collective log included.
#ifndef SHARDSCOPE_RUNTIME_SRC_RANK_EXECUTOR_H_
#define SHARDSCOPE_RUNTIME_SRC_RANK_EXECUTOR_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "device.h"
#include "flight_recorder.h"
#include "host_timeline_slices.h"
#include "run_result.h"
#include "shardscope/runtime/execution_plan.h"
#include "shardscope/runtime/host_backend.h"
#include "shardscope/sim/models/caching_allocator.h"
#include "shardscope/sim/report/report.h"

namespace shardscope::runtime {

class RankExecutor {
 public:
  // The allocator's capacity is the device memory's (Device::AllocatorMemory().Capacity()).
  RankExecutor(const traces::Schedule& schedule, const sim::SimulationSetup& setup, const ExecutionPlan& plan,
               const RunOptions& options, Device& device);
  RankExecutor(const RankExecutor&) = delete;
  RankExecutor& operator=(const RankExecutor&) = delete;

  // ---- Host thread

  // Warm-up and measured steps: per step Device::BeginStep, every op (IssueOp) until the rank
  // stops, Device::EndStep (the measured step's time). Returns the first error of an op, a
  // hook, a step boundary or the device (an event query the watchdog made).
  Status RunSteps();
  // One op between Device::BeginOp/EndOp and the issue hooks, timed on the host timeline.
  // Errors carry "rank R op ID".
  Status IssueOp(int32_t index, int32_t step);
  // While capturing (a CUDA graph), host synchronizations, host work, record_stream and the
  // collectives' Flight Recorder events are skipped: none is legal or meaningful in a capture.
  void SetCapturing(bool capturing) { capturing_ = capturing; }
  // Restarts the clock of every timestamp (the host backend: after the job's start barrier).
  void ResetClock();
  void MarkProgress() { last_progress_ns_.store(Now()); }
  void SetHostState(std::string state);
  bool stopped() const { return stopped_; }  // out of memory: the host issues nothing more
  void SetFinished() { finished_.store(true); }

  // ---- State shared with the device's threads: take mutex() for the *Locked calls.
  std::mutex& mutex() { return mu_; }
  std::condition_variable& cv() { return cv_; }
  std::string& host_state_locked() { return host_state_; }
  // Logs a collective as issued on its communicator's lane; returns its record.
  int64_t IssueRecordLocked(int32_t index, const OpPlan& op, int64_t now);
  void MarkStartedLocked(int64_t record, int64_t now);
  void MarkCompletedLocked(int64_t record, int64_t now);
  int64_t LaneCompletedLocked(int32_t communicator) const { return lanes_[static_cast<size_t>(communicator)].completed; }
  const FlightRecord& RecordLocked(int64_t record) const { return records_[static_cast<size_t>(record)]; }

  // ---- Watchdog side (any thread)
  int64_t Now() const;
  int64_t last_progress_ns() const { return last_progress_ns_.load(); }
  bool finished() const { return finished_.load(); }
  // Advances the collectives bracketed by device events; a completion is progress. A failed
  // event query ends the collective's tracking and becomes the rank's error, as does an error
  // the device reports on its own (Device::AsyncError) or a failure to bind the device.
  void PollCollectives();
  bool HasPendingCollectives();
  // Per communicator: issued, started, completed (what a rank tells its peers).
  std::vector<int64_t> ProgressState();
  // Writes OUT/flight_recorder/rank_<r>.json; `peer_states` by global rank.
  void WriteDump(const std::string& reason, const std::map<int32_t, std::vector<int64_t>>& peer_states);
  Device& device() { return device_; }
  Status device_error();
  // The rank failed (a device error, or its host thread ended with an error): the watchdog
  // ends the job now rather than after its timeout, since the peers of a failed rank wait for
  // it in their next collective. Fail records the host thread's error (the first one counts).
  void Fail(const Status& status);
  bool failed() const { return failed_.load(); }

  // ---- After the run
  RankResult Result() const;
  int32_t rank() const { return plan_.rank; }
  const ExecutionPlan& plan() const { return plan_; }
  const std::vector<SliceRecord>& host_slices() const { return host_slices_; }
  const sim::CachingAllocator& allocator() const { return allocator_; }

 private:
  struct Lane {
    int64_t issued = 0, started = 0, completed = 0, collectives = 0, p2p = 0;
  };
  struct PendingCollective {
    int64_t record = 0;
    std::unique_ptr<DeviceEvent> start, end;
  };
  using Clock = std::chrono::steady_clock;

  Status Dispatch(const OpPlan& op, int32_t index, int32_t step);
  Status IssueCollective(const OpPlan& op, int32_t index, int32_t step);
  void Allocate(const OpPlan& op, int32_t step);
  // PyTorch's cuBLAS workspaces (CublasHandlePool.cpp setWorkspaceForHandle) from the allocator
  // at the first GEMM, as the simulator allocates them (engine.h MemoryConfig::gemm_workspaces).
  void AllocateGemmWorkspaces(const OpPlan& op, int32_t index);
  int64_t Capacity() const { return device_.AllocatorMemory().Capacity(); }
  void AfterAllocatorCall();
  void Oom(const OomRecord& oom);
  static size_t Idx(int32_t i) { return static_cast<size_t>(i); }

  const traces::Schedule& schedule_;
  const ExecutionPlan& plan_;
  const RunOptions& options_;
  Device& device_;
  Clock::time_point t0_ = Clock::now();
  sim::CachingAllocator allocator_;  // host thread only

  std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_:
  std::vector<Lane> lanes_;  // per schedule communicator
  std::vector<FlightRecord> records_;
  std::vector<PendingCollective> pending_;
  std::string host_state_ = "starting";
  Status device_error_ = Status::Ok();
  bool stopped_ = false;  // written under mu_ by the host thread, which reads it freely

  std::atomic<int64_t> last_progress_ns_{0};
  std::atomic<bool> finished_{false};
  std::atomic<bool> failed_{false};  // device_error_ is set
  bool capturing_ = false;

  // Host thread only:
  std::vector<uint64_t> tensor_address_;
  const int64_t gemm_workspace_bytes_;     // 0: none (PyTorch <= 1.12: cuBLAS's own)
  const int32_t gemm_workspaces_;
  bool gemm_workspaces_done_ = false;
  std::optional<OomRecord> oom_;
  int64_t reserved_peak_seen_ = -1, fragmentation_ = 0, host_busy_ns_ = 0;
  std::vector<int64_t> step_times_;
  std::vector<SliceRecord> host_slices_;
};

}  // namespace shardscope::runtime

#endif  // SHARDSCOPE_RUNTIME_SRC_RANK_EXECUTOR_H_

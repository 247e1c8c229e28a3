#include "rank_executor.h"

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <utility>
#include <variant>

#include <fmt/format.h>

#include "shardscope/base/file_io.h"

namespace shardscope::runtime {

RankExecutor::RankExecutor(const traces::Schedule& schedule, const sim::SimulationSetup& setup,
                           const ExecutionPlan& plan, const RunOptions& options, Device& device)
    : schedule_(schedule),
      plan_(plan),
      options_(options),
      device_(device),
      allocator_(setup.memory.allocator, device.AllocatorMemory(), device.AllocatorEvents()),
      lanes_(plan.communicators.size()),
      tensor_address_(static_cast<size_t>(plan.num_tensors), 0),
      gemm_workspace_bytes_(setup.device_memory.cublas_in_allocator ? setup.device_memory.cublas_workspace_bytes : 0),
      gemm_workspaces_(setup.device_memory.cublas_in_allocator ? setup.device_memory.cublas_workspaces : 0) {}

int64_t RankExecutor::Now() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0_).count();
}

void RankExecutor::ResetClock() {
  t0_ = Clock::now();
  last_progress_ns_ = 0;
}

void RankExecutor::SetHostState(std::string state) {
  std::lock_guard lock(mu_);
  host_state_ = std::move(state);
}

Status RankExecutor::device_error() {
  std::lock_guard lock(mu_);
  return device_error_;
}

void RankExecutor::Fail(const Status& status) {
  if (status.ok()) return;
  std::lock_guard lock(mu_);
  if (device_error_.ok()) device_error_ = status;
  failed_.store(true);
}

// ---- Host thread

Status RankExecutor::RunSteps() {
  const int32_t total = options_.warmup + options_.steps;
  for (int32_t step = 0; step < total && !stopped_; ++step) {
    const bool measured = step >= options_.warmup;
    SHARDSCOPE_RETURN_IF_ERROR(device_.BeginStep(step, measured));
    for (size_t i = 0; i < plan_.ops.size() && !stopped_; ++i) {
      SHARDSCOPE_RETURN_IF_ERROR(IssueOp(static_cast<int32_t>(i), step));
    }
    // The measurement ends when the device has drained (torch.cuda.synchronize() before
    // reading the timer): the device's EndStep waits for it.
    SHARDSCOPE_ASSIGN_OR_RETURN(const int64_t step_ns, device_.EndStep(step, measured, measured && !stopped_));
    SHARDSCOPE_RETURN_IF_ERROR(device_error());
    if (!stopped_ && measured) step_times_.push_back(step_ns);
  }
  return Status::Ok();
}

Status RankExecutor::IssueOp(int32_t index, int32_t step) {
  SHARDSCOPE_RETURN_IF_ERROR(device_error());
  const OpPlan& op = plan_.ops[Idx(index)];
  device_.BeginOp(op, index);
  if (options_.hooks.before_issue) options_.hooks.before_issue(op.op_id);
  const int64_t start = Now();
  const Status status = Dispatch(op, index, step);
  const int64_t end = Now();
  host_busy_ns_ += end - start;
  // The host-side timeline (host_timeline.h): when the host issued the op; when a stream ran
  // it is the device's to record (the host backend's stream threads, CUPTI under --profile).
  host_slices_.push_back(SliceRecord{0, index, start, end, step, -1});
  if (options_.hooks.after_issue) options_.hooks.after_issue(op.op_id);
  device_.EndOp();
  MarkProgress();
  return status.WithContext(fmt::format("rank {} op {}", plan_.rank, op.op_id));
}

Status RankExecutor::Dispatch(const OpPlan& op, int32_t index, int32_t step) {
  switch (op.op_class) {
    case OpClass::kKernel:
      if (!gemm_workspaces_done_) AllocateGemmWorkspaces(op, index);
      return device_.Kernel(op, index, step);
    case OpClass::kMemcpy: return device_.Memcpy(op, index, step);
    case OpClass::kCollective: return IssueCollective(op, index, step);
    case OpClass::kEventRecord: return device_.RecordEvent(op, index, step);
    case OpClass::kStreamWaitEvent: return device_.StreamWaitEvent(op, index, step);
    case OpClass::kStreamSynchronize:
      if (capturing_) return Status::Ok();
      SetHostState(fmt::format("cudaStreamSynchronize on stream '{}' (op {})", plan_.streams[Idx(op.stream)].name,
                               op.op_id));
      return device_.SynchronizeStream(op);
    case OpClass::kDeviceSynchronize:
      if (capturing_) return Status::Ok();
      return device_.SynchronizeDevice(op);
    case OpClass::kEventSynchronize:
      if (capturing_) return Status::Ok();
      SetHostState(fmt::format("cudaEventSynchronize on event '{}' (op {})", plan_.program->events[Idx(op.event)],
                               op.op_id));
      return device_.SynchronizeEvent(op);
    case OpClass::kHostWork:
      if (!capturing_) device_.HostWork(op.duration_ns);
      return Status::Ok();
    // The memory and events beneath the allocator answer it only yes / no; what failed
    // underneath (not an out-of-memory) is the device's to tell (Device::TakeAllocatorError).
    case OpClass::kAllocate:
      Allocate(op, step);
      return device_.TakeAllocatorError();
    case OpClass::kFree: {
      uint64_t& address = tensor_address_[Idx(op.tensor)];
      if (address != 0) {
        allocator_.Free(address);
        address = 0;
        AfterAllocatorCall();
      }
      return device_.TakeAllocatorError();
    }
    case OpClass::kRecordStream: {
      const uint64_t address = tensor_address_[Idx(op.tensor)];
      if (address != 0 && !capturing_) allocator_.RecordStream(address, op.stream);
      return device_.TakeAllocatorError();
    }
  }
  return Status::Ok();
}

// A device that tracks collectives by events gets, around each, an event recorded on its
// stream before (the stream reached it: "started") and after ("completed"), as
// ProcessGroupNCCL's WorkNCCL records ncclStartEvent_ / ncclEndEvent_
// (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, WorkNCCL::recordNCCLEvent users).
Status RankExecutor::IssueCollective(const OpPlan& op, int32_t index, int32_t step) {
  if (!device_.TracksCollectivesWithEvents() || capturing_) return device_.Collective(op, index, step, -1);
  SHARDSCOPE_ASSIGN_OR_RETURN(std::unique_ptr<DeviceEvent> start, device_.CreateEvent());
  SHARDSCOPE_ASSIGN_OR_RETURN(std::unique_ptr<DeviceEvent> end, device_.CreateEvent());
  SHARDSCOPE_RETURN_IF_ERROR(device_.RecordOn(*start, op.stream));
  int64_t record = 0;
  {
    std::lock_guard lock(mu_);
    record = IssueRecordLocked(index, op, Now());
  }
  SHARDSCOPE_RETURN_IF_ERROR(device_.Collective(op, index, step, record));
  SHARDSCOPE_RETURN_IF_ERROR(device_.RecordOn(*end, op.stream));
  std::lock_guard lock(mu_);
  pending_.push_back(PendingCollective{record, std::move(start), std::move(end)});
  return Status::Ok();
}

void RankExecutor::Allocate(const OpPlan& op, int32_t step) {
  const auto& inject = options_.inject_oom;
  if (inject && inject->rank == plan_.rank && inject->op_id == op.op_id && step == options_.warmup) {
    Oom(OomRecord{op.op_id, Now(), op.bytes, std::max<int64_t>(0, Capacity() - allocator_.stats().reserved_bytes), 0,
                  true});
    return;
  }
  uint64_t& address = tensor_address_[Idx(op.tensor)];
  // A tensor still live from the previous step (model and optimizer states) is not
  // allocated again: the same rule as the simulator's warm start (MemoryConfig::warm_start).
  if (address != 0) return;
  const sim::MallocOutcome out = allocator_.Malloc(op.bytes, op.stream);
  if (!out.ok) {
    Oom(OomRecord{op.op_id, Now(), out.requested_bytes, out.device_free_bytes, out.largest_free_block, false});
    return;
  }
  address = out.address;
  AfterAllocatorCall();
}

void RankExecutor::AllocateGemmWorkspaces(const OpPlan& op, int32_t index) {
  const auto* kernel = std::get_if<traces::KernelOp>(&plan_.program->ops[Idx(index)].payload);
  if (kernel == nullptr || !std::holds_alternative<traces::GemmDesc>(kernel->compute)) return;
  gemm_workspaces_done_ = true;
  for (int32_t i = 0; i < gemm_workspaces_; ++i) {
    const sim::MallocOutcome out = allocator_.Malloc(gemm_workspace_bytes_, op.stream);
    if (!out.ok) {
      Oom(OomRecord{op.op_id, Now(), out.requested_bytes, out.device_free_bytes, out.largest_free_block, false});
      return;
    }
    AfterAllocatorCall();  // never freed: the workspace lives with its handle
  }
}

void RankExecutor::AfterAllocatorCall() {
  const sim::MemoryStats& stats = allocator_.stats();
  if (stats.reserved_bytes > reserved_peak_seen_) {
    reserved_peak_seen_ = stats.reserved_bytes;
    fragmentation_ = stats.reserved_bytes - stats.allocated_bytes;
  }
}

// The raise policy: torch.OutOfMemoryError is not caught and ends the rank's training loop;
// the work already queued still runs; its peers wait in their next collective with it.
void RankExecutor::Oom(const OomRecord& oom) {
  oom_ = oom;
  std::cerr << fmt::format("shardscope run: rank {}: out of memory at op {}{} (requested {} bytes); the rank stops "
                           "(OOM policy raise)\n",
                           plan_.rank, oom.op_id, oom.injected ? " (injected)" : "", oom.requested);
  std::lock_guard lock(mu_);
  stopped_ = true;
  host_state_ = fmt::format("stopped: out of memory at op {}{}", oom.op_id, oom.injected ? " (injected)" : "");
}

// ---- The collective log (Flight Recorder's per-process-group counters,
// torch/csrc/distributed/c10d/FlightRecorder.hpp: collective_seq_id counts collectives,
// p2p_seq_id point-to-point ops, op_id both).

int64_t RankExecutor::IssueRecordLocked(int32_t index, const OpPlan& op, int64_t now) {
  Lane& lane = lanes_[Idx(op.communicator)];
  const auto& coll = std::get<traces::CollectiveOp>(plan_.program->ops[Idx(index)].payload);
  const bool p2p = coll.type == traces::CollectiveType::kSend || coll.type == traces::CollectiveType::kRecv;
  ++lane.issued;
  FlightRecord r;
  r.op_index = index;
  r.communicator = op.communicator;
  r.collective_seq = p2p ? lane.collectives : ++lane.collectives;
  r.p2p_seq = p2p ? ++lane.p2p : lane.p2p;
  r.op_seq = lane.issued;
  r.created_ns = now;
  records_.push_back(r);
  return static_cast<int64_t>(records_.size() - 1);
}

void RankExecutor::MarkStartedLocked(int64_t record, int64_t now) {
  FlightRecord& r = records_[static_cast<size_t>(record)];
  r.started_ns = now;
  ++lanes_[Idx(r.communicator)].started;
}

void RankExecutor::MarkCompletedLocked(int64_t record, int64_t now) {
  FlightRecord& r = records_[static_cast<size_t>(record)];
  r.completed_ns = now;
  ++lanes_[Idx(r.communicator)].completed;
}

// ---- Watchdog side

void RankExecutor::PollCollectives() {
  if (Status current = device_.MakeCurrent(); !current.ok()) {
    Fail(current.WithContext(fmt::format("rank {}: the watchdog cannot bind the device", plan_.rank)));
    return;
  }
  if (Status async = device_.AsyncError(); !async.ok()) Fail(async.WithContext(fmt::format("rank {}", plan_.rank)));
  std::lock_guard lock(mu_);
  for (auto it = pending_.begin(); it != pending_.end();) {
    const FlightRecord& r = records_[static_cast<size_t>(it->record)];
    StatusOr<bool> started = true;
    if (r.started_ns < 0) {
      started = device_.QueryEvent(*it->start);
      if (started.ok() && *started) MarkStartedLocked(it->record, Now());
    }
    StatusOr<bool> completed = false;
    if (started.ok() && r.started_ns >= 0) completed = device_.QueryEvent(*it->end);
    const Status failed = !started.ok() ? started.status() : completed.status();
    if (!failed.ok()) {
      // The device failed the collective (an asynchronous error): the rank reports it instead
      // of waiting for a completion that cannot come.
      const traces::Op& source = plan_.program->ops[Idx(r.op_index)];
      if (device_error_.ok()) device_error_ = failed.WithContext(fmt::format("rank {} op {}", plan_.rank, source.id));
      failed_.store(true);
      it = pending_.erase(it);
      continue;
    }
    if (*completed) {
      MarkCompletedLocked(it->record, Now());
      MarkProgress();
      it = pending_.erase(it);
      continue;
    }
    ++it;
  }
}

bool RankExecutor::HasPendingCollectives() {
  std::lock_guard lock(mu_);
  return !pending_.empty();
}

std::vector<int64_t> RankExecutor::ProgressState() {
  std::lock_guard lock(mu_);
  std::vector<int64_t> state;
  state.reserve(lanes_.size() * 3);
  for (const Lane& lane : lanes_) state.insert(state.end(), {lane.issued, lane.started, lane.completed});
  return state;
}

void RankExecutor::WriteDump(const std::string& reason, const std::map<int32_t, std::vector<int64_t>>& peer_states) {
  std::vector<FlightRecord> records;
  std::vector<FlightLane> lanes;
  FlightDumpContext context;
  {
    std::lock_guard lock(mu_);
    records = records_;
    for (size_t c = 0; c < lanes_.size(); ++c) {
      lanes.push_back(FlightLane{static_cast<int32_t>(c), lanes_[c].issued, lanes_[c].started, lanes_[c].completed});
    }
    context.host = host_state_;
  }
  context.rank = plan_.rank;
  context.reason = reason;
  context.timeout_s = options_.timeout_s;
  // Missing ranks: members of the blocked collective's communicator that had not started
  // that collective (their lane's started count is not past its position) when they sent
  // their progress; members that sent nothing are unresponsive.
  const int32_t blocked = BlockedRecord(records);
  if (blocked >= 0) {
    const FlightRecord& r = records[static_cast<size_t>(blocked)];
    const int64_t position = r.op_seq - 1;
    for (int32_t member : plan_.communicators[Idx(r.communicator)].ranks) {
      if (member == plan_.rank) continue;
      auto it = peer_states.find(member);
      if (it == peer_states.end() || it->second.size() < 3 * lanes.size()) {
        context.unresponsive_ranks.push_back(member);
      } else if (it->second[Idx(r.communicator) * 3 + 1] <= position) {
        context.missing_ranks.push_back(member);
      }
    }
  }
  const std::filesystem::path dir = std::filesystem::path(options_.out_dir) / "flight_recorder";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::filesystem::path path = dir / fmt::format("rank_{}.json", plan_.rank);
  const Status status =
      traces::WriteFileAtomically(path.string(), RuntimeFlightRecorderJson(schedule_, records, lanes, context));
  std::cerr << fmt::format("shardscope run: rank {}: {}\n", plan_.rank,
                           status.ok() ? "wrote " + path.string() : status.message());
}

// ---- After the run

RankResult RankExecutor::Result() const {
  RankResult r;
  const sim::MemoryStats& stats = allocator_.stats();
  r.finished = !stopped_;
  r.oom = oom_;
  r.capacity = Capacity();
  r.peak_allocated = stats.allocated_bytes_peak;
  r.peak_reserved = stats.reserved_bytes_peak;
  r.fragmentation = fragmentation_;
  r.retries = stats.num_alloc_retries;
  r.num_ooms = stats.num_ooms + (oom_ && oom_->injected ? 1 : 0);
  r.host_busy_ns = host_busy_ns_;
  r.device_allocs = stats.num_device_alloc;
  r.device_frees = stats.num_device_free;
  r.step_times = step_times_;
  device_.FillResult(r);
  return r;
}

}  // namespace shardscope::runtime

// The host backend (host_backend.h): one rank per process, streams as worker threads, MPI
// collectives on host buffers, the simulator's caching allocator over host memory, and a
// watchdog that dumps Flight-Recorder-style JSON and aborts the job on a hang.
//
// Threads of a rank: the host thread (the caller: walks the program), one worker per stream,
// and the watchdog. All rank state is guarded by one mutex and one condition variable (every
// change notifies all waiters): the state is small and the host backend is about semantics,
// not speed. MPI calls and busy-waits run without the mutex.
#include "shardscope/runtime/host_backend.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <mpi.h>
#include <nlohmann/json.hpp>

#include "flight_recorder.h"
#include "host_timeline.h"
#include "shardscope/runtime/execution_plan.h"
#include "shardscope/sim/models/caching_allocator.h"
#include "shardscope/sim/report/version.h"
#include "shardscope/traces/chrome_trace.h"
#include "shardscope/base/file_io.h"

namespace shardscope::runtime {

namespace {

using Clock = std::chrono::steady_clock;
using traces::CollectiveType;

Status MpiStatus(int rc, std::string_view call) {
  if (rc == MPI_SUCCESS) return Status::Ok();
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  return Status::Internal(fmt::format("{} failed: {}", call, std::string(text, static_cast<size_t>(length))));
}


// A kernel occupies its stream for its duration: spin rather than sleep, as a GPU kernel does
// not yield its stream (and sleeping granularity would swamp scaled microsecond durations).
void SpinFor(int64_t ns) {
  if (ns <= 0) return;
  const Clock::time_point end = Clock::now() + std::chrono::nanoseconds(ns);
  while (Clock::now() < end) {
  }
}

// ---- Reductions on 16-bit floats. MPI has no bf16/fp16 types; the buffers carry the
// schedule's dtype, so they are summed as that dtype (through float, round to nearest even).
float Bf16ToFloat(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}
void SumBf16(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = FloatToBf16(Bf16ToFloat(a[i]) + Bf16ToFloat(b[i]));
}
void SumFp16(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  auto* a = static_cast<const _Float16*>(in);
  auto* b = static_cast<_Float16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = static_cast<_Float16>(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}

struct MpiTypeAndOp {
  MPI_Datatype type = MPI_BYTE;
  MPI_Op sum = MPI_SUM;
};

// ---- Device memory for the allocator: the simulator's capacity accounting (so an OOM happens
// exactly where the simulator says), each segment backed by a real host mapping.
class HostDeviceMemory final : public sim::DeviceMemory {
 public:
  explicit HostDeviceMemory(int64_t capacity) : accounting_(sim::MakeCapacityDeviceMemory(capacity)) {}
  ~HostDeviceMemory() override {
    for (const auto& [address, mapping] : mappings_) munmap(mapping.first, mapping.second);
  }
  bool Allocate(int64_t bytes, uint64_t* address) override {
    if (!accounting_->Allocate(bytes, address)) return false;
    // MAP_NORESERVE: pages are committed when touched, so a large reserved segment costs
    // what is used (the host backend's kernels do not touch tensors).
    void* p = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      accounting_->Release(*address, bytes);
      return false;
    }
    mappings_[*address] = {p, static_cast<size_t>(bytes)};
    return true;
  }
  void Release(uint64_t address, int64_t bytes) override {
    if (auto it = mappings_.find(address); it != mappings_.end()) {
      munmap(it->second.first, it->second.second);
      mappings_.erase(it);
    }
    accounting_->Release(address, bytes);
  }
  // Expandable segments: accounted like the simulator; not backed by host pages.
  bool Map(int64_t bytes) override { return accounting_->Map(bytes); }
  void Unmap(int64_t bytes) override { accounting_->Unmap(bytes); }
  int64_t Capacity() const override { return accounting_->Capacity(); }

 private:
  std::unique_ptr<sim::DeviceMemory> accounting_;
  std::map<uint64_t, std::pair<void*, size_t>> mappings_;
};

// What a stream worker runs. Allocator events (record_stream deferral) have op_index -1.
struct WorkItem {
  OpClass op_class = OpClass::kKernel;
  int32_t op_index = -1;
  int32_t step = 0;
  int64_t serial = 0;   // event record: its serial; wait: the serial captured at issue (0: none)
  int64_t ticket = 0;   // collective: position in its communicator's lane (0-based)
  int64_t record = -1;  // collective: index into records_; allocator event: its token
};

struct OomRecord {
  int64_t op_id = 0, time_ns = 0, requested = 0, free_bytes = 0, largest_free = 0;
  bool injected = false;
};

// Fields of a rank's result as gathered to rank 0 (int64 each), then its step times.
enum ResultField : int {
  kFinished, kOom, kOomOpId, kOomInjected, kOomRequested, kOomFree, kOomLargest, kOomTime, kCapacity,
  kPeakAllocated, kPeakReserved, kFragmentation, kRetries, kNumOoms, kHostBusy, kHostBlocked,
  kDeviceAllocs, kDeviceFrees, kStepsDone, kResultFields
};

// Side-channel of the watchdog (its own duplicate of the world communicator).
constexpr int kStateTag = 1;   // a rank's progress per communicator; also "dump now"
constexpr int kDumpedTag = 2;  // a rank wrote its dump

class HostRank;

class HostStreamEvents final : public sim::StreamEvents {
 public:
  explicit HostStreamEvents(HostRank& rank) : rank_(rank) {}
  sim::EventToken Record(sim::AllocStream stream) override;
  bool Query(sim::EventToken event) override;
  void Synchronize(sim::EventToken event) override;

 private:
  HostRank& rank_;
};

class HostRank {
 public:
  HostRank(const traces::Schedule& schedule, const sim::SimulationSetup& setup, const ExecutionPlan& plan,
           const RunOptions& options, int64_t capacity, int32_t max_queued, int64_t launch_ns)
      : schedule_(schedule),
        setup_(setup),
        plan_(plan),
        options_(options),
        capacity_(capacity),
        max_queued_(max_queued),
        launch_ns_(launch_ns),
        memory_(capacity),
        events_(*this),
        allocator_(setup.memory.allocator, memory_, events_),
        streams_(plan.streams.size()),
        event_issued_(static_cast<size_t>(plan.num_events), 0),
        event_done_(static_cast<size_t>(plan.num_events)),
        lanes_(plan.communicators.size()),
        tensor_address_(static_cast<size_t>(plan.num_tensors), 0) {}

  ~HostRank() {
    for (MPI_Comm& c : comms_) {
      if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
    }
    for (MPI_Comm* c : {&watchdog_comm_, &results_comm_}) {
      if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
    }
    for (MPI_Op& op : {std::ref(bf16_sum_), std::ref(fp16_sum_)}) {
      if (op != MPI_OP_NULL) MPI_Op_free(&op);
    }
  }

  Status Setup() {
    SHARDSCOPE_RETURN_IF_ERROR(MpiStatus(MPI_Comm_dup(MPI_COMM_WORLD, &watchdog_comm_), "MPI_Comm_dup"));
    SHARDSCOPE_RETURN_IF_ERROR(MpiStatus(MPI_Comm_dup(MPI_COMM_WORLD, &results_comm_), "MPI_Comm_dup"));
    SHARDSCOPE_RETURN_IF_ERROR(MpiStatus(MPI_Op_create(&SumBf16, 1, &bf16_sum_), "MPI_Op_create"));
    SHARDSCOPE_RETURN_IF_ERROR(MpiStatus(MPI_Op_create(&SumFp16, 1, &fp16_sum_), "MPI_Op_create"));
    // A rank-local rejection must not leave the other ranks waiting in the splits below: every
    // rank learns whether any rank rejected its program.
    Status local = Status::Ok();
    std::error_code ec;
    std::filesystem::create_directories(options_.out_dir, ec);
    if (ec) local = Status::IoError(fmt::format("cannot create '{}': {}", options_.out_dir, ec.message()));
    for (const OpPlan& op : plan_.ops) {
      if (!local.ok()) break;
      if (op.op_class != OpClass::kCollective) continue;
      if (std::max(op.buffers.send_elements, op.buffers.recv_elements) > INT_MAX) {
        const auto& coll = std::get<traces::CollectiveOp>(OpOf(op).payload);
        local = Status::InvalidInput(fmt::format(
            "rank {} op {}: {} of {} bytes needs more than {} elements per MPI call; the host backend does not "
            "split collectives",
            plan_.rank, op.op_id, traces::CollectiveTypeName(coll.type), coll.bytes, INT_MAX));
        break;
      }
    }
    const int local_ok = local.ok() ? 1 : 0;
    int all_ok = 0;
    SHARDSCOPE_RETURN_IF_ERROR(
        MpiStatus(MPI_Allreduce(&local_ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD), "MPI_Allreduce"));
    if (!local.ok()) return local;
    if (all_ok == 0) return Status::InvalidInput("another rank rejected its program (its message says why)");
    // Every rank splits the world once per schedule communicator, in index order (the split
    // is collective over the world); non-members pass MPI_UNDEFINED and get MPI_COMM_NULL.
    comms_.assign(plan_.communicators.size(), MPI_COMM_NULL);
    send_buffers_.resize(plan_.communicators.size());
    recv_buffers_.resize(plan_.communicators.size());
    for (const CommunicatorPlan& c : plan_.communicators) {
      const int color = c.color == kNoColor ? MPI_UNDEFINED : c.color;
      SHARDSCOPE_RETURN_IF_ERROR(
          MpiStatus(MPI_Comm_split(MPI_COMM_WORLD, color, c.key, &comms_[static_cast<size_t>(c.index)]),
                    "MPI_Comm_split"));
      if (c.used) {
        send_buffers_[static_cast<size_t>(c.index)].assign(static_cast<size_t>(c.max_send_bytes), std::byte{0});
        recv_buffers_[static_cast<size_t>(c.index)].assign(static_cast<size_t>(c.max_recv_bytes), std::byte{0});
      }
    }
    SHARDSCOPE_RETURN_IF_ERROR(MpiStatus(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"));
    t0_ = Clock::now();
    last_progress_ns_ = 0;
    return Status::Ok();
  }

  // Runs the steps, then the exchange of results. Returns on a clean end; a hang ends in the
  // watchdog's MPI_Abort.
  StatusOr<RunResult> Run() {
    for (size_t s = 0; s < streams_.size(); ++s) {
      streams_[s].thread = std::thread([this, s] { StreamLoop(static_cast<int32_t>(s)); });
    }
    watchdog_ = std::thread([this] { WatchdogLoop(); });
    const int32_t total_steps = options_.warmup + options_.steps;
    for (int32_t step = 0; step < total_steps && !stopped_; ++step) {
      const int64_t start = Now();
      for (size_t i = 0; i < plan_.ops.size() && !stopped_; ++i) ExecuteHostOp(static_cast<int32_t>(i), step);
      // The measurement ends when the device has drained (torch.cuda.synchronize() before
      // reading the timer).
      SynchronizeDevice();
      if (!stopped_ && step >= options_.warmup) step_times_.push_back(Now() - start);
    }
    SynchronizeDevice();
    {
      std::lock_guard lock(mu_);
      host_state_ = stopped_ ? host_state_ : "finished its program; waiting for the other ranks";
      stop_streams_ = true;
    }
    cv_.notify_all();
    for (Stream& s : streams_) s.thread.join();
    StatusOr<RunResult> result = ExchangeResults();
    // No rank is hung once every rank passed this barrier; only then may watchdogs stop.
    MPI_Barrier(results_comm_);
    {
      std::lock_guard lock(mu_);
      watchdog_stop_ = true;
    }
    watchdog_.join();
    if (!result.ok()) return result;
    if (plan_.rank == 0) SHARDSCOPE_RETURN_IF_ERROR(WriteOutputs());
    return result;
  }

 private:
  friend class HostStreamEvents;

  struct Stream {
    std::deque<WorkItem> queue;  // the head stays until it has run
    std::thread thread;
    std::vector<SliceRecord> slices;
  };
  struct Lane {
    int64_t issued = 0, started = 0, completed = 0, collectives = 0, p2p = 0;
  };

  const traces::Op& OpOf(const OpPlan& op) const {
    return plan_.program->ops[static_cast<size_t>(&op - plan_.ops.data())];
  }
  int64_t Now() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0_).count();
  }
  int64_t Scaled(int64_t ns) const { return static_cast<int64_t>(static_cast<double>(ns) * options_.time_scale); }
  void MarkProgress() { last_progress_ns_.store(Now()); }

  // ---- Host thread

  void ExecuteHostOp(int32_t index, int32_t step) {
    const OpPlan& op = plan_.ops[static_cast<size_t>(index)];
    if (options_.hooks.before_issue) options_.hooks.before_issue(op.op_id);
    const int64_t start = Now();
    switch (op.op_class) {
      case OpClass::kKernel:
      case OpClass::kMemcpy:
      case OpClass::kCollective:
      case OpClass::kEventRecord:
      case OpClass::kStreamWaitEvent:
        Launch(op, index, step);
        break;
      case OpClass::kStreamSynchronize: {
        std::unique_lock lock(mu_);
        host_state_ = fmt::format("cudaStreamSynchronize on stream '{}' (op {})", plan_.streams[Idx(op.stream)].name,
                                  op.op_id);
        cv_.wait(lock, [&] { return streams_[Idx(op.stream)].queue.empty(); });
        break;
      }
      case OpClass::kDeviceSynchronize:
        SynchronizeDevice();
        break;
      case OpClass::kEventSynchronize: {
        std::unique_lock lock(mu_);
        host_state_ = fmt::format("cudaEventSynchronize on event '{}' (op {})",
                                  plan_.program->events[Idx(op.event)], op.op_id);
        const int64_t serial = event_issued_[Idx(op.event)];
        cv_.wait(lock, [&] { return EventDone(op.event, serial); });
        break;
      }
      case OpClass::kHostWork:
        SpinFor(Scaled(op.duration_ns));
        break;
      case OpClass::kAllocate:
        Allocate(op, step);
        break;
      case OpClass::kFree: {
        uint64_t& address = tensor_address_[Idx(op.tensor)];
        if (address != 0) {
          allocator_.Free(address);
          address = 0;
          AfterAllocatorCall();
        }
        break;
      }
      case OpClass::kRecordStream: {
        const uint64_t address = tensor_address_[Idx(op.tensor)];
        if (address != 0) allocator_.RecordStream(address, op.stream);
        break;
      }
    }
    const int64_t end = Now();
    host_busy_ns_ += end - start;
    host_slices_.push_back(SliceRecord{0, index, start, end, step, -1});
    MarkProgress();
    if (options_.hooks.after_issue) options_.hooks.after_issue(op.op_id);
  }

  static size_t Idx(int32_t i) { return static_cast<size_t>(i); }

  bool EventDone(int32_t event, int64_t serial) const {
    return serial == 0 || event_done_[Idx(event)][static_cast<size_t>(serial - 1)] != 0;
  }

  void Launch(const OpPlan& op, int32_t index, int32_t step) {
    const bool launch = op.op_class == OpClass::kKernel || op.op_class == OpClass::kMemcpy ||
                        op.op_class == OpClass::kCollective;
    if (launch) SpinFor(Scaled(launch_ns_));  // cudaLaunchKernel's host time
    std::unique_lock lock(mu_);
    Stream& stream = streams_[Idx(op.stream)];
    if (launch && max_queued_ > 0 && stream.queue.size() >= static_cast<size_t>(max_queued_)) {
      // The launch queue is full: cudaLaunchKernel blocks until the oldest item retires (the
      // simulator's EngineConfig::max_queued_per_stream).
      host_state_ = fmt::format("launch of op {} blocked: stream '{}' queue full", op.op_id,
                                plan_.streams[Idx(op.stream)].name);
      cv_.wait(lock, [&] { return stream.queue.size() < static_cast<size_t>(max_queued_); });
    }
    host_state_ = "running its program";
    WorkItem item{op.op_class, index, step, 0, 0, -1};
    if (op.op_class == OpClass::kEventRecord) {
      item.serial = ++event_issued_[Idx(op.event)];
      event_done_[Idx(op.event)].push_back(0);
    } else if (op.op_class == OpClass::kStreamWaitEvent) {
      // cudaStreamWaitEvent captures the event's most recent record at call time.
      item.serial = event_issued_[Idx(op.event)];
    } else if (op.op_class == OpClass::kCollective) {
      Lane& lane = lanes_[Idx(op.communicator)];
      item.ticket = lane.issued++;
      const auto& coll = std::get<traces::CollectiveOp>(plan_.program->ops[Idx(index)].payload);
      const bool p2p = coll.type == CollectiveType::kSend || coll.type == CollectiveType::kRecv;
      FlightRecord r;
      r.op_index = index;
      r.communicator = op.communicator;
      r.collective_seq = p2p ? lane.collectives : ++lane.collectives;
      r.p2p_seq = p2p ? ++lane.p2p : lane.p2p;
      r.op_seq = lane.issued;
      r.created_ns = Now();
      item.record = static_cast<int64_t>(records_.size());
      records_.push_back(r);
    }
    stream.queue.push_back(item);
    lock.unlock();
    cv_.notify_all();
  }

  void SynchronizeDevice() {
    std::unique_lock lock(mu_);
    if (!stopped_) host_state_ = "cudaDeviceSynchronize (waiting for every stream to drain)";
    cv_.wait(lock, [&] {
      return std::all_of(streams_.begin(), streams_.end(), [](const Stream& s) { return s.queue.empty(); });
    });
  }

  void Allocate(const OpPlan& op, int32_t step) {
    const bool measured_first_step = step == options_.warmup;
    if (options_.inject_oom && options_.inject_oom->rank == plan_.rank && options_.inject_oom->op_id == op.op_id &&
        measured_first_step) {
      const sim::MemoryStats& stats = allocator_.stats();
      Oom(OomRecord{op.op_id, Now(), op.bytes, std::max<int64_t>(0, capacity_ - stats.reserved_bytes), 0, true});
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

  void AfterAllocatorCall() {
    const sim::MemoryStats& stats = allocator_.stats();
    if (stats.reserved_bytes > reserved_peak_seen_) {
      reserved_peak_seen_ = stats.reserved_bytes;
      fragmentation_ = stats.reserved_bytes - stats.allocated_bytes;
    }
  }

  // The raise policy: torch.OutOfMemoryError is not caught and ends the rank's training loop;
  // the work already queued still runs; its peers wait in their next collective with it.
  void Oom(const OomRecord& oom) {
    oom_ = oom;
    std::cerr << fmt::format("shardscope run: rank {}: out of memory at op {}{} (requested {} bytes); the rank stops "
                             "(OOM policy raise)\n",
                             plan_.rank, oom.op_id, oom.injected ? " (injected)" : "", oom.requested);
    std::lock_guard lock(mu_);
    stopped_ = true;
    host_state_ = fmt::format("stopped: out of memory at op {}{}", oom.op_id, oom.injected ? " (injected)" : "");
  }

  // ---- Stream workers

  void StreamLoop(int32_t s) {
    Stream& stream = streams_[Idx(s)];
    std::unique_lock lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_streams_ || !stream.queue.empty(); });
      if (stream.queue.empty()) return;
      const WorkItem item = stream.queue.front();
      int64_t start = -1, seq = -1;
      switch (item.op_class) {
        case OpClass::kKernel:
        case OpClass::kMemcpy:
          start = Now();
          lock.unlock();
          SpinFor(Scaled(plan_.ops[Idx(item.op_index)].duration_ns));
          lock.lock();
          break;
        case OpClass::kEventRecord:
          event_done_[Idx(plan_.ops[Idx(item.op_index)].event)][static_cast<size_t>(item.serial - 1)] = 1;
          break;
        case OpClass::kStreamWaitEvent: {
          const int32_t event = plan_.ops[Idx(item.op_index)].event;
          cv_.wait(lock, [&] { return EventDone(event, item.serial); });
          break;
        }
        case OpClass::kRecordStream:  // an allocator event
          alloc_event_done_[static_cast<size_t>(item.record)] = 1;
          break;
        case OpClass::kCollective: {
          const OpPlan& op = plan_.ops[Idx(item.op_index)];
          Lane& lane = lanes_[Idx(op.communicator)];
          // NCCL runs a communicator's operations in the order they were enqueued, whatever
          // stream they are on (one proxy / kernel queue per communicator): wait for its turn.
          cv_.wait(lock, [&] { return lane.completed == item.ticket; });
          ++lane.started;
          start = Now();
          records_[static_cast<size_t>(item.record)].started_ns = start;
          seq = records_[static_cast<size_t>(item.record)].collective_seq;
          lock.unlock();
          cv_.notify_all();
          const Status status = RunCollective(op, item.op_index);
          lock.lock();
          if (!status.ok()) {
            // MPI's default handler (MPI_ERRORS_ARE_FATAL) aborts before this; if not, stop.
            std::cerr << fmt::format("shardscope run: rank {}: {}\n", plan_.rank, status.message());
            MPI_Abort(MPI_COMM_WORLD, 1);
          }
          ++lane.completed;
          records_[static_cast<size_t>(item.record)].completed_ns = Now();
          break;
        }
        default:
          break;
      }
      stream.queue.pop_front();
      if (start >= 0) stream.slices.push_back(SliceRecord{1 + s, item.op_index, start, Now(), item.step, seq});
      MarkProgress();
      lock.unlock();
      cv_.notify_all();
      lock.lock();
    }
  }

  MpiTypeAndOp TypeFor(traces::DType dtype) const {
    switch (dtype) {
      case traces::DType::kFloat32:
      case traces::DType::kTFloat32: return {MPI_FLOAT, MPI_SUM};
      case traces::DType::kFloat64: return {MPI_DOUBLE, MPI_SUM};
      case traces::DType::kInt32: return {MPI_INT32_T, MPI_SUM};
      case traces::DType::kInt64: return {MPI_INT64_T, MPI_SUM};
      case traces::DType::kInt8: return {MPI_INT8_T, MPI_SUM};
      case traces::DType::kBFloat16: return {MPI_UINT16_T, bf16_sum_};
      case traces::DType::kFloat16: return {MPI_UINT16_T, fp16_sum_};
      // fp8: MPI has no fp8 arithmetic and the values carry no meaning here; the bytes are
      // combined with MAX, which moves the same traffic (not the same numbers).
      case traces::DType::kFloat8E4M3:
      case traces::DType::kFloat8E5M2: return {MPI_UINT8_T, MPI_MAX};
    }
    return {MPI_BYTE, MPI_MAX};
  }

  Status RunCollective(const OpPlan& op, int32_t index) {
    const auto& coll = std::get<traces::CollectiveOp>(plan_.program->ops[Idx(index)].payload);
    MPI_Comm comm = comms_[Idx(op.communicator)];
    void* send = send_buffers_[Idx(op.communicator)].data();
    void* recv = recv_buffers_[Idx(op.communicator)].data();
    const MpiTypeAndOp t = TypeFor(coll.dtype);
    const int group = static_cast<int>(plan_.communicators[Idx(op.communicator)].ranks.size());
    const int send_count = static_cast<int>(op.buffers.send_elements);
    const int recv_count = static_cast<int>(op.buffers.recv_elements);
    switch (coll.type) {
      case CollectiveType::kAllGather:
        return MpiStatus(MPI_Allgather(send, send_count, t.type, recv, send_count, t.type, comm), "MPI_Allgather");
      case CollectiveType::kReduceScatter:
        return MpiStatus(MPI_Reduce_scatter_block(send, recv, recv_count, t.type, t.sum, comm),
                         "MPI_Reduce_scatter_block");
      case CollectiveType::kAllReduce:
        return MpiStatus(MPI_Allreduce(send, recv, send_count, t.type, t.sum, comm), "MPI_Allreduce");
      case CollectiveType::kBroadcast:
        return MpiStatus(MPI_Bcast(recv, recv_count, t.type, op.peer_comm_rank, comm), "MPI_Bcast");
      case CollectiveType::kReduce:
        return MpiStatus(MPI_Reduce(send, recv, send_count, t.type, t.sum, op.peer_comm_rank, comm), "MPI_Reduce");
      case CollectiveType::kAllToAll:
        return MpiStatus(
            MPI_Alltoall(send, send_count / group, t.type, recv, recv_count / group, t.type, comm), "MPI_Alltoall");
      case CollectiveType::kSend:
        return MpiStatus(MPI_Send(send, send_count, t.type, op.peer_comm_rank, 0, comm), "MPI_Send");
      case CollectiveType::kRecv:
        return MpiStatus(MPI_Recv(recv, recv_count, t.type, op.peer_comm_rank, 0, comm, MPI_STATUS_IGNORE),
                         "MPI_Recv");
    }
    return Status::Internal("unknown collective type");
  }

  // ---- Watchdog
  //
  // ProcessGroupNCCL's watchdog (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp
  // watchdogHandler) times out the oldest unfinished work after `timeout`; with
  // TORCH_NCCL_DUMP_ON_TIMEOUT the rank that times out writes its Flight Recorder dump and
  // signals the others, through the store, to dump theirs before the job is torn down. Here:
  // no op completed on this rank for --timeout seconds → send this rank's progress to every
  // peer on a side communicator (which is also the "dump now" signal), collect theirs for a
  // grace period (to name the missing ranks), write the dump, wait for the peers' "dumped"
  // notes, then MPI_Abort. A peer that receives the signal does the same but leaves the abort
  // to the first rank (and aborts itself if that never comes).

  std::vector<int64_t> ProgressState() {
    std::lock_guard lock(mu_);
    std::vector<int64_t> state;
    state.reserve(lanes_.size() * 3);
    for (const Lane& lane : lanes_) {
      state.push_back(lane.issued);
      state.push_back(lane.started);
      state.push_back(lane.completed);
    }
    return state;
  }

  void WatchdogLoop() {
    const auto poll = std::chrono::milliseconds(20);
    const auto timeout_ns = static_cast<int64_t>(options_.timeout_s * 1e9);
    // Long enough for peers whose own timers are a poll or two behind, short enough for CI.
    const int64_t grace_ns = std::clamp<int64_t>(timeout_ns / 2, 500'000'000, 5'000'000'000);
    const int world = plan_.world_size;
    bool dumping = false, written = false, initiator = false;
    int64_t dump_started = 0, written_at = 0;
    std::string reason;
    std::map<int32_t, std::vector<int64_t>> peer_states;
    std::set<int32_t> dumped_peers;
    std::vector<int64_t> my_state;
    std::vector<MPI_Request> requests;
    const int64_t kDumpedNote = 1;
    while (true) {
      {
        std::lock_guard lock(mu_);
        if (watchdog_stop_ && !dumping) break;
      }
      std::this_thread::sleep_for(poll);
      while (true) {
        int flag = 0;
        MPI_Status status;
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, watchdog_comm_, &flag, &status);
        if (!flag) break;
        int count = 0;
        MPI_Get_count(&status, MPI_INT64_T, &count);
        std::vector<int64_t> message(static_cast<size_t>(std::max(count, 1)));
        MPI_Recv(message.data(), count, MPI_INT64_T, status.MPI_SOURCE, status.MPI_TAG, watchdog_comm_,
                 MPI_STATUS_IGNORE);
        if (status.MPI_TAG == kStateTag) {
          peer_states[status.MPI_SOURCE] = std::move(message);
          if (!dumping) reason = fmt::format("dump requested by rank {} (its watchdog fired)", status.MPI_SOURCE);
        } else {
          dumped_peers.insert(status.MPI_SOURCE);
        }
      }
      const int64_t now = Now();
      const bool stalled = now - last_progress_ns_.load() > timeout_ns;
      if (!dumping && (stalled || !peer_states.empty())) {
        dumping = true;
        dump_started = now;
        if (peer_states.empty()) {
          initiator = true;
          reason = fmt::format("watchdog timeout: no operation completed on this rank for {:g} s", options_.timeout_s);
          std::cerr << fmt::format("shardscope run: rank {}: {}; dumping the flight recorder and aborting the job\n",
                                   plan_.rank, reason);
        }
        my_state = ProgressState();
        for (int peer = 0; peer < world; ++peer) {
          if (peer == plan_.rank) continue;
          requests.emplace_back();
          MPI_Isend(my_state.data(), static_cast<int>(my_state.size()), MPI_INT64_T, peer, kStateTag, watchdog_comm_,
                    &requests.back());
        }
      }
      if (dumping && !written &&
          (static_cast<int32_t>(peer_states.size()) == world - 1 || now - dump_started > grace_ns)) {
        WriteDump(reason, peer_states);
        written = true;
        written_at = Now();
        for (int peer = 0; peer < world; ++peer) {
          if (peer == plan_.rank) continue;
          requests.emplace_back();
          MPI_Isend(&kDumpedNote, 1, MPI_INT64_T, peer, kDumpedTag, watchdog_comm_, &requests.back());
        }
      }
      if (written) {
        const bool all_dumped = static_cast<int32_t>(dumped_peers.size()) == world - 1;
        if ((initiator && (all_dumped || now - written_at > grace_ns)) || now - written_at > 3 * grace_ns) {
          std::cerr << fmt::format("shardscope run: rank {}: aborting the job (hang)\n", plan_.rank);
          MPI_Abort(MPI_COMM_WORLD, 1);
        }
      }
    }
  }

  void WriteDump(const std::string& reason, const std::map<int32_t, std::vector<int64_t>>& peer_states) {
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
        if (it == peer_states.end() || it->second.size() < 3 * lanes_.size()) {
          context.unresponsive_ranks.push_back(member);
        } else if (it->second[Idx(r.communicator) * 3 + 1] <= position) {
          context.missing_ranks.push_back(member);
        }
      }
    }
    const std::filesystem::path dir = std::filesystem::path(options_.out_dir) / "flight_recorder";
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    const Status status = traces::WriteFileAtomically((dir / fmt::format("rank_{}.json", plan_.rank)).string(),
                                              RuntimeFlightRecorderJson(schedule_, records, lanes, context));
    if (!status.ok()) {
      std::cerr << fmt::format("shardscope run: rank {}: {}\n", plan_.rank, status.message());
    } else {
      std::cerr << fmt::format("shardscope run: rank {}: wrote {}\n", plan_.rank,
                               (dir / fmt::format("rank_{}.json", plan_.rank)).string());
    }
  }

  // ---- Results

  StatusOr<RunResult> ExchangeResults() {
    const int world = plan_.world_size;
    const auto steps = static_cast<size_t>(options_.steps);
    std::vector<int64_t> mine(kResultFields + steps, -1);
    const sim::MemoryStats& stats = allocator_.stats();
    mine[kFinished] = stopped_ ? 0 : 1;
    mine[kOom] = oom_ ? 1 : 0;
    if (oom_) {
      mine[kOomOpId] = oom_->op_id;
      mine[kOomInjected] = oom_->injected ? 1 : 0;
      mine[kOomRequested] = oom_->requested;
      mine[kOomFree] = oom_->free_bytes;
      mine[kOomLargest] = oom_->largest_free;
      mine[kOomTime] = oom_->time_ns;
    }
    mine[kCapacity] = capacity_;
    mine[kPeakAllocated] = stats.allocated_bytes_peak;
    mine[kPeakReserved] = stats.reserved_bytes_peak;
    mine[kFragmentation] = fragmentation_;
    mine[kRetries] = stats.num_alloc_retries;
    mine[kNumOoms] = stats.num_ooms + (oom_ && oom_->injected ? 1 : 0);
    mine[kHostBusy] = host_busy_ns_;
    mine[kHostBlocked] = 0;
    mine[kDeviceAllocs] = stats.num_device_alloc;
    mine[kDeviceFrees] = stats.num_device_free;
    mine[kStepsDone] = static_cast<int64_t>(step_times_.size());
    for (size_t i = 0; i < step_times_.size() && i < steps; ++i) mine[kResultFields + i] = step_times_[i];
    const int record_size = static_cast<int>(mine.size());
    if (plan_.rank == 0) all_results_.resize(mine.size() * static_cast<size_t>(world));
    SHARDSCOPE_RETURN_IF_ERROR(MpiStatus(MPI_Gather(mine.data(), record_size, MPI_INT64_T, all_results_.data(),
                                                    record_size, MPI_INT64_T, 0, results_comm_),
                                         "MPI_Gather"));
    // The timeline: every rank's slices to rank 0.
    std::vector<int64_t> flat;
    AppendFlattened(host_slices_, flat);
    for (const Stream& stream : streams_) AppendFlattened(stream.slices, flat);
    SHARDSCOPE_ASSIGN_OR_RETURN(timeline_, GatherTimelineSlices(results_comm_, std::move(flat)));
    RunResult result;
    if (plan_.rank != 0) {
      result.completed = !stopped_;
      return result;
    }
    result.completed = true;
    for (int r = 0; r < world; ++r) {
      const int64_t* rec = all_results_.data() + static_cast<size_t>(r) * mine.size();
      if (rec[kFinished] == 0) result.completed = false;
      if (rec[kOom] == 1) result.oom_ranks.push_back(r);
    }
    result.summary = SummaryText(mine.size());
    return result;
  }

  static int64_t Median(std::vector<int64_t> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[(v.size() - 1) / 2];
  }

  std::vector<int64_t> StepTimesOf(const int64_t* rec) const {
    std::vector<int64_t> times;
    for (int64_t i = 0; i < rec[kStepsDone] && i < options_.steps; ++i) times.push_back(rec[kResultFields + i]);
    return times;
  }

  std::string SummaryText(size_t record_size) const {
    std::string text;
    int64_t step = 0, peak_reserved = 0;
    for (int r = 0; r < plan_.world_size; ++r) {
      const int64_t* rec = all_results_.data() + static_cast<size_t>(r) * record_size;
      step = std::max(step, Median(StepTimesOf(rec)));
      peak_reserved = std::max(peak_reserved, rec[kPeakReserved]);
    }
    text += fmt::format("{}: ran {} rank(s) on the host backend (MPI + threads; execution semantics, not "
                        "performance), {} warm-up + {} measured step(s), time scale {:g}\n",
                        options_.source, plan_.world_size, options_.warmup, options_.steps, options_.time_scale);
    text += fmt::format("  step (median, slowest rank)  {:>12.3f} ms wall\n", static_cast<double>(step) * 1e-6);
    text += fmt::format("  peak reserved                {:>12} bytes (the simulator's allocator policy)\n",
                        peak_reserved);
    for (int r = 0; r < plan_.world_size; ++r) {
      const int64_t* rec = all_results_.data() + static_cast<size_t>(r) * record_size;
      if (rec[kOom] == 1) {
        text += fmt::format("  OOM: rank {} ran out of memory at op {}{}; it stopped (raise)\n", r, rec[kOomOpId],
                            rec[kOomInjected] ? " (injected)" : "");
      }
    }
    return text;
  }

  Status WriteOutputs() {
    const size_t record_size = kResultFields + static_cast<size_t>(options_.steps);
    const std::filesystem::path dir(options_.out_dir);
    SHARDSCOPE_RETURN_IF_ERROR(traces::WriteFileAtomically((dir / "report.json").string(), ReportJson(record_size)));
    return WriteHostTimeline((dir / "host_timeline.json").string(), schedule_, timeline_,
                             fmt::format("shardscope {} run --backend host", sim::Version()), "mpi");
  }

  std::string ReportJson(size_t record_size) const {
    // The keys of simulate's report (docs/REPORT.md) where they apply to a measured run.
    nlohmann::ordered_json j;
    j["shardscope_version"] = std::string(sim::Version());
    j["source"] = options_.source;
    j["strategy"] = schedule_.metadata.count("plan.strategy") ? schedule_.metadata.at("plan.strategy") : "";
    j["model"] = schedule_.metadata.count("plan.model") ? schedule_.metadata.at("plan.model") : "";
    j["world_size"] = plan_.world_size;
    j["cluster"] = {{"name", setup_.cluster.name},
                    {"gpu", setup_.cluster.gpu.name},
                    {"nodes", setup_.cluster.nodes},
                    {"gpus_per_node", setup_.cluster.gpus_per_node}};
    bool completed = true;
    int64_t step = 0, peak_reserved = 0, peak_allocated = 0, retries = 0, ooms = 0;
    int32_t peak_rank = 0;
    nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
    for (int r = 0; r < plan_.world_size; ++r) {
      const int64_t* rec = all_results_.data() + static_cast<size_t>(r) * record_size;
      const std::vector<int64_t> times = StepTimesOf(rec);
      const int64_t median = Median(times);
      completed = completed && rec[kFinished] == 1;
      step = std::max(step, median);
      if (rec[kPeakReserved] > peak_reserved) {
        peak_reserved = rec[kPeakReserved];
        peak_rank = r;
      }
      peak_allocated = std::max(peak_allocated, rec[kPeakAllocated]);
      retries += rec[kRetries];
      ooms += rec[kNumOoms];
      nlohmann::ordered_json rank;
      rank["rank"] = r;
      rank["step_time_ns"] = median;
      rank["step_times_ns"] = times;
      rank["host_busy_ns"] = rec[kHostBusy];
      rank["finished"] = rec[kFinished] == 1;
      rank["capacity_bytes"] = rec[kCapacity];
      rank["peak_allocated_bytes"] = rec[kPeakAllocated];
      rank["peak_reserved_bytes"] = rec[kPeakReserved];
      rank["fragmentation_bytes"] = rec[kFragmentation];
      rank["num_alloc_retries"] = rec[kRetries];
      rank["num_ooms"] = rec[kNumOoms];
      rank["num_device_alloc"] = rec[kDeviceAllocs];
      rank["num_device_free"] = rec[kDeviceFrees];
      if (rec[kOom] == 1) {
        rank["oom"] = {{"op_id", rec[kOomOpId]},         {"time_ns", rec[kOomTime]},
                       {"requested_bytes", rec[kOomRequested]}, {"free_bytes", rec[kOomFree]},
                       {"largest_free_block", rec[kOomLargest]}, {"injected", rec[kOomInjected] == 1}};
      } else {
        rank["oom"] = nullptr;
      }
      ranks.push_back(rank);
    }
    j["completed"] = completed;
    j["step_time_ns"] = step;
    j["memory"] = {{"peak_reserved_bytes", peak_reserved},
                   {"peak_reserved_rank", peak_rank},
                   {"peak_allocated_bytes", peak_allocated},
                   {"num_alloc_retries", retries},
                   {"num_ooms", ooms},
                   {"allocator_conf", setup_.memory.alloc_conf}};
    j["hang"] = false;  // a hang aborts the job: its evidence is in flight_recorder/
    j["runtime"] = {{"backend", "host"},
                    {"note", "execution semantics, not performance: streams are threads, collectives MPI on host "
                             "buffers, kernels busy-wait the predicted duration x time_scale"},
                    {"steps", options_.steps},
                    {"warmup", options_.warmup},
                    {"time_scale", options_.time_scale},
                    {"timeout_s", options_.timeout_s}};
    j["ranks"] = ranks;
    return j.dump(2) + "\n";
  }

  const traces::Schedule& schedule_;
  const sim::SimulationSetup& setup_;
  const ExecutionPlan& plan_;
  const RunOptions& options_;
  const int64_t capacity_;
  const int32_t max_queued_;
  const int64_t launch_ns_;
  Clock::time_point t0_;

  HostDeviceMemory memory_;
  HostStreamEvents events_;
  sim::CachingAllocator allocator_;  // host thread only

  std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_:
  std::vector<Stream> streams_;
  std::vector<int64_t> event_issued_;            // per event: records issued so far
  std::vector<std::vector<char>> event_done_;    // per event, per record serial - 1
  std::vector<char> alloc_event_done_;           // per allocator event token
  std::vector<Lane> lanes_;                      // per schedule communicator
  std::vector<FlightRecord> records_;
  std::string host_state_ = "starting";
  bool stopped_ = false;                         // out of memory: the host issues nothing more
  bool stop_streams_ = false;
  bool watchdog_stop_ = false;

  std::atomic<int64_t> last_progress_ns_{0};
  std::thread watchdog_;

  // Host thread only:
  std::vector<uint64_t> tensor_address_;
  std::optional<OomRecord> oom_;
  int64_t reserved_peak_seen_ = -1;
  int64_t fragmentation_ = 0;
  int64_t host_busy_ns_ = 0;
  std::vector<int64_t> step_times_;
  std::vector<SliceRecord> host_slices_;

  // Rank 0, after the exchange:
  std::vector<int64_t> all_results_;
  TimelineSlices timeline_;

  std::vector<MPI_Comm> comms_;
  MPI_Comm watchdog_comm_ = MPI_COMM_NULL;
  MPI_Comm results_comm_ = MPI_COMM_NULL;
  MPI_Op bf16_sum_ = MPI_OP_NULL;
  MPI_Op fp16_sum_ = MPI_OP_NULL;
  std::vector<std::vector<std::byte>> send_buffers_, recv_buffers_;
};

sim::EventToken HostStreamEvents::Record(sim::AllocStream stream) {
  std::unique_lock lock(rank_.mu_);
  const auto token = static_cast<sim::EventToken>(rank_.alloc_event_done_.size());
  rank_.alloc_event_done_.push_back(0);
  rank_.streams_[static_cast<size_t>(stream)].queue.push_back(WorkItem{OpClass::kRecordStream, -1, 0, 0, 0, token});
  lock.unlock();
  rank_.cv_.notify_all();
  return token;
}

bool HostStreamEvents::Query(sim::EventToken event) {
  std::lock_guard lock(rank_.mu_);
  return rank_.alloc_event_done_[static_cast<size_t>(event)] != 0;
}

void HostStreamEvents::Synchronize(sim::EventToken event) {
  std::unique_lock lock(rank_.mu_);
  rank_.cv_.wait(lock, [&] { return rank_.alloc_event_done_[static_cast<size_t>(event)] != 0; });
}

}  // namespace

StatusOr<std::unique_ptr<MpiSession>> MpiSession::Init() {
  int provided = 0;
  SHARDSCOPE_RETURN_IF_ERROR(MpiStatus(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided),
                                       "MPI_Init_thread"));
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::unique_ptr<MpiSession> session(new MpiSession(rank, size));
  if (provided < MPI_THREAD_MULTIPLE) {
    return Status::Internal(
        "the MPI library does not provide MPI_THREAD_MULTIPLE, which the host backend needs (stream threads call MPI "
        "concurrently); use an Open MPI built with thread support");
  }
  return session;
}

StatusOr<std::vector<std::string>> MpiSession::GatherToRankZero(const std::string& mine) const {
  if (mine.size() > static_cast<size_t>(INT_MAX)) return Status::Internal("a gathered string exceeds 2 GiB");
  const int size = static_cast<int>(mine.size());
  std::vector<int> sizes(static_cast<size_t>(world_size_), 0), displacements(static_cast<size_t>(world_size_), 0);
  SHARDSCOPE_RETURN_IF_ERROR(
      MpiStatus(MPI_Gather(&size, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Gather"));
  std::string all;
  if (rank_ == 0) {
    int64_t total = 0;
    for (size_t r = 0; r < sizes.size(); ++r) {
      displacements[r] = static_cast<int>(total);
      total += sizes[r];
    }
    if (total > INT_MAX) return Status::Internal("gathered strings exceed 2 GiB");
    all.resize(static_cast<size_t>(total));
  }
  SHARDSCOPE_RETURN_IF_ERROR(MpiStatus(MPI_Gatherv(mine.data(), size, MPI_CHAR, all.data(), sizes.data(),
                                                   displacements.data(), MPI_CHAR, 0, MPI_COMM_WORLD),
                                       "MPI_Gatherv"));
  std::vector<std::string> out;
  if (rank_ != 0) return out;
  for (size_t r = 0; r < sizes.size(); ++r) {
    out.push_back(all.substr(static_cast<size_t>(displacements[r]), static_cast<size_t>(sizes[r])));
  }
  return out;
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

StatusOr<RunResult> RunHostBackend(const MpiSession& mpi, const traces::Schedule& schedule,
                                   const sim::SimulationSetup& setup, const RunOptions& options) {
  if (options.steps < 1) return Status::InvalidInput(fmt::format("--steps: expected >= 1, got {}", options.steps));
  if (options.warmup < 0) return Status::InvalidInput(fmt::format("--warmup: expected >= 0, got {}", options.warmup));
  if (!(options.timeout_s > 0) || options.timeout_s > 1e6) {
    return Status::InvalidInput(fmt::format("--timeout: expected seconds in (0, 1e6], got {}", options.timeout_s));
  }
  if (!(options.time_scale >= 0) || options.time_scale > 1e3) {
    return Status::InvalidInput(fmt::format("--time-scale: expected a factor in [0, 1000], got {}", options.time_scale));
  }
  const sim::ClusterCostProvider costs(schedule, setup.cluster);
  SHARDSCOPE_ASSIGN_OR_RETURN(ExecutionPlan plan,
                              BuildExecutionPlan(schedule, mpi.rank(), mpi.world_size(), costs));
  const int64_t capacity = options.capacity_bytes >= 0 ? options.capacity_bytes : sim::AllocatorCapacity(setup, plan.rank);
  HostRank rank(schedule, setup, plan, options, capacity, setup.host.max_queued_launches_per_stream,
                setup.host.launch_overhead_ns);
  SHARDSCOPE_RETURN_IF_ERROR(rank.Setup());
  return rank.Run();
}

}  // namespace shardscope::runtime

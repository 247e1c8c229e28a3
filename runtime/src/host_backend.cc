// The host backend (host_backend.h): the device adapter of the runtime core (device.h) for a
// machine without a GPU. One rank per process, streams as worker threads, events as host-side
// flags, MPI collectives on host buffers, the simulator's caching allocator over host memory;
// the core (rank_executor.h) walks the program, the watchdog (watchdog.h) dumps and aborts.
//
// Threads of a rank: the host thread (the caller: runs the executor), one worker per stream,
// and the watchdog. All rank state is guarded by the executor's mutex and condition variable
// (every change notifies all waiters): the state is small and the host backend is about
// semantics, not speed. MPI calls and busy-waits run without the mutex.
#include "shardscope/runtime/host_backend.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <deque>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <thread>

#include <fmt/format.h>
#include <mpi.h>
#include <nlohmann/json.hpp>

#include "device.h"
#include "host_timeline.h"
#include "mpi_job.h"
#include "rank_executor.h"
#include "run_result.h"
#include "shardscope/base/file_io.h"
#include "shardscope/runtime/execution_plan.h"
#include "shardscope/sim/models/caching_allocator.h"
#include "shardscope/sim/report/version.h"
#include "watchdog.h"

namespace shardscope::runtime {

namespace {

using Clock = std::chrono::steady_clock;
using traces::CollectiveType;

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
// IEEE binary16 by hand (no _Float16: clang 14 has none on x86-64), rounding to nearest even
// as a hardware conversion does.
float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  uint32_t bits = 0;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13);  // inf, nan
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa != 0) {  // subnormal: normalize
    uint32_t e = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --e;
    }
    bits = sign | (e << 23) | ((mantissa & 0x3FFu) << 13);
  } else {
    bits = sign;
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
uint16_t FloatToFp16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const int32_t exponent = static_cast<int32_t>((bits >> 23) & 0xFFu);
  uint32_t mantissa = bits & 0x7FFFFFu;
  if (exponent == 0xFF) return static_cast<uint16_t>(sign | 0x7C00u | (mantissa != 0 ? 0x200u : 0u));
  const int32_t half_exponent = exponent - 112;
  if (half_exponent >= 0x1F) return static_cast<uint16_t>(sign | 0x7C00u);  // overflow: inf
  if (half_exponent <= 0) {  // subnormal or zero
    if (half_exponent < -10) return sign;
    mantissa |= 0x800000u;
    const auto shift = static_cast<uint32_t>(14 - half_exponent);
    uint32_t value = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (value & 1u))) ++value;
    return static_cast<uint16_t>(sign | value);
  }
  uint32_t value = (static_cast<uint32_t>(half_exponent) << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (value & 1u))) ++value;  // may carry into inf: correct
  return static_cast<uint16_t>(sign | value);
}
void SumFp16(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = FloatToFp16(Fp16ToFloat(a[i]) + Fp16ToFloat(b[i]));
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
  int64_t record = -1;  // collective: its Flight Recorder record; allocator event: its token
};

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

class HostRank final : public Device {
 public:
  HostRank(const traces::Schedule& schedule, const sim::SimulationSetup& setup, const ExecutionPlan& plan,
           const RunOptions& options, int64_t capacity, int32_t max_queued, int64_t launch_ns)
      : schedule_(schedule),
        setup_(setup),
        plan_(plan),
        options_(options),
        max_queued_(max_queued),
        launch_ns_(launch_ns),
        memory_(capacity),
        events_(*this),
        executor_(schedule, setup, plan, options, *this),
        mu_(executor_.mutex()),
        cv_(executor_.cv()),
        streams_(plan.streams.size()),
        event_issued_(static_cast<size_t>(plan.num_events), 0),
        event_done_(static_cast<size_t>(plan.num_events)) {}

  ~HostRank() override {
    for (MPI_Comm& c : comms_) {
      if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
    }
    for (MPI_Op& op : {std::ref(bf16_sum_), std::ref(fp16_sum_)}) {
      if (op != MPI_OP_NULL) MPI_Op_free(&op);
    }
  }

  Status Setup() {
    SHARDSCOPE_RETURN_IF_ERROR(watchdog_comm_.Init());
    SHARDSCOPE_RETURN_IF_ERROR(results_comm_.Init());
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
    SHARDSCOPE_RETURN_IF_ERROR(AgreeAcrossRanks(local, "rejected its program"));
    // Every rank splits the world once per schedule communicator, in index order (the split
    // is collective over the world); non-members pass MPI_UNDEFINED and get MPI_COMM_NULL.
    comms_.assign(plan_.communicators.size(), MPI_COMM_NULL);
    send_buffers_.resize(plan_.communicators.size());
    recv_buffers_.resize(plan_.communicators.size());
    for (const CommunicatorPlan& c : plan_.communicators) {
      const int color = c.color == kNoColor ? MPI_UNDEFINED : c.color;
      SHARDSCOPE_RETURN_IF_ERROR(
          MpiStatus(MPI_Comm_split(MPI_COMM_WORLD, color, c.key, &comms_[Idx(c.index)]), "MPI_Comm_split"));
      if (c.used) {
        send_buffers_[Idx(c.index)].assign(static_cast<size_t>(c.max_send_bytes), std::byte{0});
        recv_buffers_[Idx(c.index)].assign(static_cast<size_t>(c.max_recv_bytes), std::byte{0});
      }
    }
    SHARDSCOPE_RETURN_IF_ERROR(MpiStatus(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"));
    executor_.ResetClock();
    return Status::Ok();
  }

  // Runs the steps, then the exchange of results. Returns on a clean end; a hang ends in the
  // watchdog's MPI_Abort.
  StatusOr<RunResult> Run() {
    for (size_t s = 0; s < streams_.size(); ++s) {
      streams_[s].thread = std::thread([this, s] { StreamLoop(static_cast<int32_t>(s)); });
    }
    MpiPeerChannel peers(watchdog_comm_.get());
    WatchdogConfig config;
    config.timeout_s = options_.timeout_s;
    config.stalled_after_finish = true;
    config.log_prefix = fmt::format("shardscope run: rank {}: ", plan_.rank);
    config.end_job = [] { MPI_Abort(MPI_COMM_WORLD, 1); };
    Watchdog watchdog({&executor_}, &peers, std::move(config));
    watchdog.Start();
    // The host device's operations cannot fail (a failed MPI call aborts the job), so an error
    // here is a programming error: it is returned after the exchange, which the peers wait in.
    const Status steps = executor_.RunSteps();
    // Its peers would wait for it in their next collective: the watchdog ends the job now.
    executor_.Fail(steps);
    DrainStreams();
    {
      std::lock_guard lock(mu_);
      if (!executor_.stopped()) executor_.host_state_locked() = "finished its program; waiting for the other ranks";
      stop_streams_ = true;
    }
    cv_.notify_all();
    for (Stream& s : streams_) s.thread.join();
    // The timeline: the host thread's slices, then each stream's.
    LocalRankOutput mine{executor_.Result(), {}};
    AppendFlattened(executor_.host_slices(), mine.slices);
    for (const Stream& stream : streams_) AppendFlattened(stream.slices, mine.slices);
    StatusOr<ExchangedResults> exchanged = ExchangeResults(results_comm_.get(), {std::move(mine)}, options_.steps, 0);
    // No rank is hung once every rank passed this barrier; only then may watchdogs stop.
    MPI_Barrier(results_comm_.get());
    watchdog.Stop();
    SHARDSCOPE_RETURN_IF_ERROR(steps);
    if (!exchanged.ok()) return exchanged.status();
    if (plan_.rank != 0) {
      RunResult result;
      result.completed = !executor_.stopped();
      return result;
    }
    RunResult result = RunResultOf(exchanged->ranks);
    result.summary = SummaryText(exchanged->ranks);
    SHARDSCOPE_RETURN_IF_ERROR(WriteOutputs(*exchanged));
    return result;
  }

  // ---- Device

  sim::DeviceMemory& AllocatorMemory() override { return memory_; }
  sim::StreamEvents& AllocatorEvents() override { return events_; }
  Status Kernel(const OpPlan& op, int32_t index, int32_t step) override { return Launch(op, index, step); }
  Status Memcpy(const OpPlan& op, int32_t index, int32_t step) override { return Launch(op, index, step); }
  Status Collective(const OpPlan& op, int32_t index, int32_t step, int64_t /*record*/) override {
    return Launch(op, index, step);
  }
  Status RecordEvent(const OpPlan& op, int32_t index, int32_t step) override { return Launch(op, index, step); }
  Status StreamWaitEvent(const OpPlan& op, int32_t index, int32_t step) override { return Launch(op, index, step); }
  Status SynchronizeStream(const OpPlan& op) override {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return streams_[Idx(op.stream)].queue.empty(); });
    return Status::Ok();
  }
  Status SynchronizeDevice(const OpPlan& /*op*/) override {
    DrainStreams();
    return Status::Ok();
  }
  Status SynchronizeEvent(const OpPlan& op) override {
    std::unique_lock lock(mu_);
    const int64_t serial = event_issued_[Idx(op.event)];
    cv_.wait(lock, [&] { return EventDone(op.event, serial); });
    return Status::Ok();
  }
  void HostWork(int64_t duration_ns) override { SpinFor(Scaled(duration_ns)); }
  Status BeginStep(int32_t /*step*/, bool /*measured*/) override {
    step_start_ = executor_.Now();
    return Status::Ok();
  }
  StatusOr<int64_t> EndStep(int32_t /*step*/, bool /*measured*/, bool timed) override {
    DrainStreams();
    return timed ? executor_.Now() - step_start_ : 0;
  }

 private:
  friend class HostStreamEvents;

  struct Stream {
    std::deque<WorkItem> queue;  // the head stays until it has run
    std::thread thread;
    std::vector<SliceRecord> slices;
  };

  static size_t Idx(int32_t i) { return static_cast<size_t>(i); }
  const traces::Op& OpOf(const OpPlan& op) const {
    return plan_.program->ops[static_cast<size_t>(&op - plan_.ops.data())];
  }
  int64_t Now() const { return executor_.Now(); }
  int64_t Scaled(int64_t ns) const { return static_cast<int64_t>(static_cast<double>(ns) * options_.time_scale); }

  // ---- Host thread

  bool EventDone(int32_t event, int64_t serial) const {
    return serial == 0 || event_done_[Idx(event)][static_cast<size_t>(serial - 1)] != 0;
  }

  Status Launch(const OpPlan& op, int32_t index, int32_t step) {
    const bool launch = op.op_class == OpClass::kKernel || op.op_class == OpClass::kMemcpy ||
                        op.op_class == OpClass::kCollective;
    if (launch) SpinFor(Scaled(launch_ns_));  // cudaLaunchKernel's host time
    std::unique_lock lock(mu_);
    Stream& stream = streams_[Idx(op.stream)];
    if (launch && max_queued_ > 0 && stream.queue.size() >= static_cast<size_t>(max_queued_)) {
      // The launch queue is full: cudaLaunchKernel blocks until the oldest item retires (the
      // simulator's EngineConfig::max_queued_per_stream).
      executor_.host_state_locked() = fmt::format("launch of op {} blocked: stream '{}' queue full", op.op_id,
                                                  plan_.streams[Idx(op.stream)].name);
      cv_.wait(lock, [&] { return stream.queue.size() < static_cast<size_t>(max_queued_); });
    }
    executor_.host_state_locked() = "running its program";
    WorkItem item{op.op_class, index, step, 0, 0, -1};
    if (op.op_class == OpClass::kEventRecord) {
      item.serial = ++event_issued_[Idx(op.event)];
      event_done_[Idx(op.event)].push_back(0);
    } else if (op.op_class == OpClass::kStreamWaitEvent) {
      // cudaStreamWaitEvent captures the event's most recent record at call time.
      item.serial = event_issued_[Idx(op.event)];
    } else if (op.op_class == OpClass::kCollective) {
      // The communicator's lane takes it when the host enqueues it (its ticket: its position).
      item.record = executor_.IssueRecordLocked(index, op, Now());
      item.ticket = executor_.RecordLocked(item.record).op_seq - 1;
    }
    stream.queue.push_back(item);
    lock.unlock();
    cv_.notify_all();
    return Status::Ok();
  }

  void DrainStreams() {
    std::unique_lock lock(mu_);
    if (!executor_.stopped()) {
      executor_.host_state_locked() = "cudaDeviceSynchronize (waiting for every stream to drain)";
    }
    cv_.wait(lock, [&] {
      return std::all_of(streams_.begin(), streams_.end(), [](const Stream& s) { return s.queue.empty(); });
    });
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
          // NCCL runs a communicator's operations in the order they were enqueued, whatever
          // stream they are on (one proxy / kernel queue per communicator): wait for its turn.
          cv_.wait(lock, [&] { return executor_.LaneCompletedLocked(op.communicator) == item.ticket; });
          start = Now();
          executor_.MarkStartedLocked(item.record, start);
          seq = executor_.RecordLocked(item.record).collective_seq;
          lock.unlock();
          cv_.notify_all();
          const Status status = RunCollective(op, item.op_index);
          lock.lock();
          if (!status.ok()) {
            // MPI's default handler (MPI_ERRORS_ARE_FATAL) aborts before this; if not, stop.
            std::cerr << fmt::format("shardscope run: rank {}: {}\n", plan_.rank, status.message());
            MPI_Abort(MPI_COMM_WORLD, 1);
          }
          executor_.MarkCompletedLocked(item.record, Now());
          break;
        }
        default:
          break;
      }
      stream.queue.pop_front();
      if (start >= 0) stream.slices.push_back(SliceRecord{1 + s, item.op_index, start, Now(), item.step, seq});
      executor_.MarkProgress();
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
      case CollectiveType::kAllToAll: {
        // Per-peer counts (execution_plan.h AllToAllPeerElements), the same both ways and on
        // both sides of every pair; Setup checked that their sums fit an int.
        std::vector<int> counts(static_cast<size_t>(group), 0), displacements(static_cast<size_t>(group), 0);
        int offset = 0;
        for (size_t q = 0; q < counts.size() && q < op.peer_elements.size(); ++q) {
          counts[q] = static_cast<int>(op.peer_elements[q]);
          displacements[q] = offset;
          offset += counts[q];
        }
        return MpiStatus(MPI_Alltoallv(send, counts.data(), displacements.data(), t.type, recv, counts.data(),
                                       displacements.data(), t.type, comm),
                         "MPI_Alltoallv");
      }
      case CollectiveType::kSend:
        return MpiStatus(MPI_Send(send, send_count, t.type, op.peer_comm_rank, 0, comm), "MPI_Send");
      case CollectiveType::kRecv:
        return MpiStatus(MPI_Recv(recv, recv_count, t.type, op.peer_comm_rank, 0, comm, MPI_STATUS_IGNORE),
                         "MPI_Recv");
    }
    return Status::Internal("unknown collective type");
  }

  // ---- Results (rank 0)

  std::string SummaryText(const std::vector<RankResult>& ranks) const {
    std::string text;
    text += fmt::format("{}: ran {} rank(s) on the host backend (MPI + threads; execution semantics, not "
                        "performance), {} warm-up + {} measured step(s), time scale {:g}\n",
                        options_.source, plan_.world_size, options_.warmup, options_.steps, options_.time_scale);
    text += fmt::format("  step (median, slowest rank)  {:>12.3f} ms wall\n",
                        static_cast<double>(SlowestMedianStep(ranks)) * 1e-6);
    text += fmt::format("  peak reserved                {:>12} bytes (the simulator's allocator policy)\n",
                        LargestPeakReserved(ranks));
    return text + OomSummaryLines(ranks);
  }

  Status WriteOutputs(const ExchangedResults& exchanged) const {
    const nlohmann::ordered_json runtime = {
        {"backend", "host"},
        {"note", "execution semantics, not performance: streams are threads, collectives MPI on host "
                 "buffers, kernels busy-wait the predicted duration x time_scale"},
        {"steps", options_.steps},
        {"warmup", options_.warmup},
        {"time_scale", options_.time_scale},
        {"timeout_s", options_.timeout_s}};
    const std::filesystem::path dir(options_.out_dir);
    SHARDSCOPE_RETURN_IF_ERROR(traces::WriteFileAtomically(
        (dir / "report.json").string(),
        RunReportJson(schedule_, setup_, options_.source, exchanged.ranks, runtime, nullptr)));
    return WriteHostTimeline((dir / "host_timeline.json").string(), schedule_, exchanged.timeline,
                             fmt::format("shardscope {} run --backend host", sim::Version()), "mpi");
  }

  const traces::Schedule& schedule_;
  const sim::SimulationSetup& setup_;
  const ExecutionPlan& plan_;
  const RunOptions& options_;
  const int32_t max_queued_;
  const int64_t launch_ns_;

  // Declared before the executor, whose allocator uses them (destroyed after it).
  HostDeviceMemory memory_;
  HostStreamEvents events_;
  RankExecutor executor_;
  std::mutex& mu_;
  std::condition_variable& cv_;
  // Guarded by mu_:
  std::vector<Stream> streams_;
  std::vector<int64_t> event_issued_;            // per event: records issued so far
  std::vector<std::vector<char>> event_done_;    // per event, per record serial - 1
  std::vector<char> alloc_event_done_;           // per allocator event token
  bool stop_streams_ = false;

  int64_t step_start_ = 0;  // host thread only

  std::vector<MPI_Comm> comms_;
  MpiWorldDup watchdog_comm_, results_comm_;
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

StatusOr<bool> MpiSession::AllRanks(bool mine) const {
  const int local = mine ? 1 : 0;
  int all = 0;
  SHARDSCOPE_RETURN_IF_ERROR(
      MpiStatus(MPI_Allreduce(&local, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD), "MPI_Allreduce"));
  return all == 1;
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

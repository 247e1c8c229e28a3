// The engine's private declarations, shared by its source files (engine.h has the semantics):
// per-rank state (host thread, streams, events, communicator lanes, allocator), the events of
// the loop, and the Engine class. Where each part is implemented:
//   engine.cc          setup, the event loop (Run, PopNext) and the result
//   host_thread.cc     the host walking its program (launches, synchronizations, the
//                      allocate and free calls it makes)
//   streams.cc         FIFO streams and events; kernels and copies as activities
//   rendezvous.cc      collectives and send/recv pairs meeting their peers
//   allocator_hooks.cc the caching allocator's setup on the timeline (outcome logs, warm
//                      start, stream events), OOM injection and policy
//   hang_snapshot.cc   what an unfinished run leaves: BlockedRank, PendingRendezvous
// How fast running work goes is the resource models' business (sim/models/activity_set.h):
// the engine starts and finishes activities and never computes a rate.
//
// State per rank: the host thread (program counter, clock, what it waits for), one FIFO
// queue per stream, event records, per-communicator serialization counters. Activities
// (kernels, collectives, copies) carry their remaining work and rate; every rate change
// queues the activity's completion with a new version, and stale completions are skipped
// when popped.
//
// The host runs ahead without yielding until it reaches an op that observes device state
// (a synchronization); it yields until the global clock reaches its own clock, so every
// observation happens at the right simulated time.
#ifndef SHARDSCOPE_SIM_ENGINE_SRC_ENGINE_INTERNAL_H_
#define SHARDSCOPE_SIM_ENGINE_SRC_ENGINE_INTERNAL_H_

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "shardscope/sim/engine/engine.h"
#include "shardscope/sim/engine/rank_classes.h"
#include "shardscope/sim/models/activity_set.h"

// On a function whose only caller is in the same file: inline it there, as the compiler did
// when the engine was one file with internal linkage (the per-event and per-op paths; the
// 1,024-GPU benchmark in BENCHMARKS.md measures them).
#define SHARDSCOPE_ENGINE_HOT [[gnu::always_inline]] inline

namespace shardscope::sim::engine_internal {

using traces::CollectiveOp;
using traces::CollectiveType;
using traces::Op;
using traces::Program;

// A device work item waiting in a stream's FIFO.
// Every op is issued once per step, so the op index doubles as the launch's correlation id.
struct QueueItem {
  int32_t op_index = 0;
  // EventRecord: record index. StreamWaitEvent: captured record (-1: none).
  // Collective: per-(rank, communicator) serialization index.
  int32_t aux = 0;
  int64_t ready_ns = 0;        // when its launch returned on the host
  int64_t correlation() const { return op_index; }
};

struct StreamState {
  std::deque<QueueItem> queue;
  int32_t running_activity = -1;
  int64_t waiting_record = -1;    // head is a wait on this record
  bool at_rendezvous = false;     // head is a collective that arrived (waiting for peers) or runs
  bool waiting_turn = false;      // head is a collective behind an earlier op of its communicator
  int64_t arrived_ns = -1;        // when the head collective arrived (kept for hang reports
                                  // and straggler attribution)
  int64_t waiting_since = -1;     // when the head began waiting for its turn or an event
  int64_t wake_at = -1;           // a StreamWake is queued for this time
  bool Idle() const { return queue.empty() && running_activity < 0; }
};

// kStopped: the rank ran out of memory and issues nothing more.
enum class HostWait : uint8_t { kNone, kResumeScheduled, kStream, kDevice, kRecord, kQueueFull, kStopped, kDone };

struct HostState {
  int32_t pc = 0;
  int64_t clock = 0;
  HostWait wait = HostWait::kNone;
  int64_t wait_target = 0;        // stream index or record index
  int64_t wait_start = 0;
  int64_t launch_blocked_since = -1;  // the pending launch blocked on a full queue since
  int64_t pending_cost_ns = 0;        // host time still owed once a device wait ends
};

// Per (rank, communicator): NCCL serializes a communicator's work on each member.
struct CommLane {
  int64_t issued = 0;             // collectives + p2p issued by the host so far
  int64_t completed = 0;          // ... and completed on the device
};

struct AllocatorLog;

struct RankState {
  const Program* program = nullptr;
  // Per op of the program: the kernel's duration at full speed, -1 until first
  // asked. Shared by the ranks running the program (the cost provider is deterministic).
  std::vector<int64_t>* durations = nullptr;
  // The same for memcpy ops, kept apart: a duration in `durations` means "a kernel" to the
  // kernel hand-over (HandOverKernel), which must never run a copy as a compute kernel.
  std::vector<int64_t>* copy_durations = nullptr;
  bool has_checkpoint_ops = false;         // the program has checkpoint-phase ops
  int32_t rank = 0;                        // the rank (a class's representative when reduced)
  int32_t state = 0;                       // index into Engine::ranks_ (the rank when not reduced)
  int64_t weight = 1;                      // ranks it stands for (its class's size)
  HostState host;
  std::vector<StreamState> streams;
  std::vector<int64_t> event_last_record;  // per EventIndex: most recent record, -1 none
  std::vector<int64_t> record_done;        // per record: completion time, -1 pending
  std::vector<int32_t> lane_of_slot;       // CommSlot -> index into lanes
  std::vector<int32_t> comm_of_slot;       // CommSlot -> global communicator (its class's
                                           // representative when reduced)
  const std::vector<int32_t>* own_comm_of_slot = nullptr;  // the rank's own binding
  std::vector<CommLane> lanes;
  int64_t last_change_ns = 0;              // for integrating compute/comm/overlap time
  int32_t kernels_running = 0;             // compute activities on this GPU (as the models
  int32_t collectives_running = 0;         // count them; kept here for Integrate's sake)
  RankStats stats;
  bool want_trace = false;
  double slowdown = 1.0;                   // EngineConfig::rank_slowdown (1: full speed)
  int64_t inject_oom_op_id = -1;           // EngineConfig::inject_oom on this rank (-1: none)
  // catch_and_sync (EngineConfig::oom_catch_and_sync):
  bool oom_caught = false;                 // ran out of memory, skipped ahead to an oom_sync
  int32_t oom_pc = -1;                     // the op that ran out of memory
  int32_t oom_resume_pc = -1;              // the oom_sync collective it skipped ahead to
  bool halted = false;                     // issues nothing more (waiting for, or past, the
                                           // OOM agreement)
  // The caching allocator (memory simulation only).
  std::unique_ptr<DeviceMemory> device_memory;
  std::unique_ptr<StreamEvents> alloc_events;
  std::unique_ptr<CachingAllocator> allocator;
  std::vector<uint64_t> tensor_address;    // per TensorIndex: the live block, 0 = none
  std::vector<int32_t> live_tensors;       // TensorIndex of live tensors (record_history only)
  std::vector<int64_t> tensor_bytes;       // per TensorIndex: requested bytes (record_history only)
  std::vector<bool> preallocated;          // per TensorIndex: live since the warm-up step
  std::shared_ptr<const AllocatorLog> log; // shared outcomes instead of a live allocator
  size_t log_cursor = 0;
  bool alloc_needs_sync = false;           // the allocator waited for an event in this call
  int64_t reserved_peak_seen = -1;
  int64_t allocated_peak_seen = -1;
};

// The outcomes of one allocator run, shared by every rank with the same program and capacity.
struct AllocatorLog {
  struct Call {
    MallocOutcome outcome;  // mallocs only
    MemoryStats stats;      // after the call
  };
  std::vector<Call> calls;          // the measured step's mallocs and frees, in program order
  // (allocated, reserved) bytes after each call and after the warm-up: what every call of
  // every rank reads (AfterAllocatorCall), kept apart from the full stats for locality.
  std::vector<std::pair<int64_t, int64_t>> bytes;
  std::pair<int64_t, int64_t> warm_bytes{0, 0};
  std::vector<bool> preallocated;   // tensors live since the warm-up step
  // Per op of the program: the index of the call it makes in `calls`, -1 for none (a free of a
  // tensor that is not live, an allocation live since the warm-up, every other op). Ranks read
  // their outcomes through it and need no per-tensor state of their own.
  std::vector<int32_t> call_of_op;
  MemoryStats warm_stats;           // after the warm-up step (what a rank has before any call)
  int64_t warm_reserved_peak = -1;
  int64_t warm_fragmentation = 0;
  int64_t warm_allocated_at_peak = 0;
};

struct Participant {
  int32_t state = 0;     // index into Engine::ranks_
  int32_t stream = 0;
  int32_t op_index = 0;  // also the launch's correlation id
};

// The engine's side of a running activity (the ActivitySet holds its work and rate, under the
// same id): who runs it, and for a kernel the items queued behind it.
struct alignas(64) DeviceActivity {
  // What a kernel's completion reads comes first (kind, members, the look-ahead), in the first
  // three cache lines, which PopCompletion prefetches; the collective's record last.
  ActivityKind kind = ActivityKind::kCompute;
  int32_t ahead_begin = 0, ahead_end = 0;
  int64_t start_ns = 0;
  Participant one;                   // a kernel's or copy's stream and op (no allocation)
  std::vector<Participant> members;  // a collective's members (empty for a kernel or copy)
  // A kernel's activity: copies of the items queued behind it on its stream (ahead[0] is the
  // next), read from the queue in one go so that handing over to the next kernel
  // (HandOverKernel) need not reach into the queue's memory, cold by the time the kernel ends.
  // Items only join a queue at its back, so the copies stay true.
  static constexpr int kAhead = 4;
  std::array<QueueItem, kAhead> ahead;
  std::array<int64_t, kAhead> ahead_ns;  // a kernel's duration at full speed; -1: not a kernel
  CollectiveRun run;
};

// A collective being gathered on one communicator: every member must arrive.
struct Rendezvous {
  int64_t seq = 0;                   // the next collective sequence number of the communicator
  std::vector<Participant> arrived;
  const CollectiveOp* first = nullptr;
  int64_t max_bytes = 0;             // the largest member's bytes (all_to_all may differ)
  bool mismatch = false;
};

// Point-to-point pairs, keyed by (communicator, sender, receiver).
struct P2pKey {
  int32_t comm, src, dst;
  bool operator==(const P2pKey&) const = default;
};
struct P2pKeyHash {
  size_t operator()(const P2pKey& k) const {
    return (static_cast<size_t>(k.comm) * 1000003u + static_cast<size_t>(k.src)) * 1000033u +
           static_cast<size_t>(k.dst);
  }
};
struct P2pPending {
  bool has_send = false, has_recv = false;
  Participant send, recv;
  int64_t seq = 0;  // p2p ops completed between this pair (PyTorch numbers p2p apart)
};

struct CostKey {
  int32_t comm;
  CollectiveType type;
  int64_t bytes;
  auto operator<=>(const CostKey&) const = default;
};

struct HostResume { int32_t state; };
struct StreamWake { int32_t state; int32_t stream; };
struct ActivityDone { int32_t activity; uint32_t version; };
using EventPayload = std::variant<HostResume, StreamWake, ActivityDone>;

// An event due at the current instant, in push order (see Engine::Push).
struct NowEvent {
  uint64_t seq;
  EventPayload payload;
};

struct ScheduledEvent {
  int64_t time;
  uint64_t seq;
  EventPayload payload;
  bool operator>(const ScheduledEvent& other) const {
    return time != other.time ? time > other.time : seq > other.seq;
  }
};

inline uint64_t HashCombine(uint64_t h, uint64_t v) {
  // splitmix64-style mixing: cheap, and good enough to tell timelines apart.
  v += 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9ULL;
  v = (v ^ (v >> 27)) * 0x94d049bb133111ebULL;
  return h ^ (v ^ (v >> 31));
}

class Engine {
 public:
  Engine(const traces::Schedule& schedule, const CostProvider& costs, const EngineConfig& config,
         EngineObserver* observer)
      : schedule_(schedule), costs_(costs), config_(config), observer_(observer) {}

  StatusOr<SimulationResult> Run();

 private:
  // Events for the current instant go to a FIFO: every event already in the heap for this
  // instant was pushed earlier (smaller sequence number), and the FIFO keeps push order, so
  // (time, sequence) order is preserved while the heap sees fewer operations. Every event and
  // every activity completion draws its sequence number from next_seq_ (PopNext merges them).
  void Push(int64_t time, EventPayload payload) {
    if (time < now_ || time >= traces::kMaxSimulatedNs) [[unlikely]] {
      if (time >= traces::kMaxSimulatedNs) {
        // Out of scale: dropped, so the clock never passes the horizon (nor overflows); the run
        // drains and Run reports it.
        passed_horizon_ = true;
        return;
      }
      // A bug in a model: never let the clock run backwards.
      if (past_event_.empty()) past_event_ = fmt::format("event at {} ns pushed at {} ns", time, now_);
      time = now_;
    }
    if (time == now_) {
      now_events_.push_back(NowEvent{next_seq_++, payload});
    } else {
      events_.push(ScheduledEvent{time, next_seq_++, payload});
    }
  }
  bool PopNext(EventPayload& payload);
  // The next completion as an event. The engine's side of the activity is fetched at once: the
  // loop reads it right after the set's (two cache misses overlapped instead of in a row).
  EventPayload PopCompletion() {
    const Completion c = activities_->PopNext();
    if (static_cast<size_t>(c.id) < device_activities_.size()) {
      const char* line = reinterpret_cast<const char*>(&device_activities_[static_cast<size_t>(c.id)]);
      __builtin_prefetch(line);
      __builtin_prefetch(line + 64);
      __builtin_prefetch(line + 128);
    }
    return ActivityDone{c.id, c.version};
  }
  const Op& OpOf(const RankState& r, int32_t op_index) const {
    return r.program->ops[static_cast<size_t>(op_index)];
  }

  // The allocator's stream events: records queued on the rank's streams like cudaEventRecord.
  class AllocatorEvents : public StreamEvents {
   public:
    AllocatorEvents(Engine& engine, RankState* rank) : engine_(engine), rank_(rank) {}
    EventToken Record(AllocStream stream) override;
    bool Query(EventToken event) override;
    void Synchronize(EventToken event) override;

   private:
    Engine& engine_;
    RankState* rank_;
  };

  std::shared_ptr<const AllocatorLog> BuildAllocatorLog(const RankState& like);
  MemoryStats CurrentStats(const RankState& r) const;

  void RunHost(RankState& r);
  void InjectOom(RankState& r, const traces::AllocateOp& op, int64_t op_id, int64_t t);
  bool CatchOom(RankState& r, int64_t t);
  void AgreeOnOom(std::span<const Participant> members, const CollectiveRun& run);
  int64_t Slowed(const RankState& r, int64_t ns) const {
    if (r.slowdown == 1.0) return ns;
    // Held at the horizon (durations are, and factors are at most 100): the conversion stays defined.
    return std::llround(std::min(static_cast<double>(ns) * r.slowdown, static_cast<double>(traces::kMaxSimulatedNs)));
  }
  bool Allocate(RankState& r, int32_t pc, const traces::AllocateOp& op, int64_t op_id, int64_t t);
  // A shared log's next malloc neither fails nor waits for the device (no synchronization, no
  // cudaFree): its effect does not depend on when the device gets there, so the host need not
  // let the global clock catch up before making it.
  static bool LogOutcomeIsTimeless(const RankState& r, int32_t pc) {
    if (!r.log) return false;
    const int32_t call = r.log->call_of_op[static_cast<size_t>(pc)];
    if (call < 0) return true;  // no call: nothing happens
    const MallocOutcome& out = r.log->calls[static_cast<size_t>(call)].outcome;
    return out.ok && !out.synchronized && out.device_frees == 0;
  }
  void FreeTensor(RankState& r, int32_t pc, const traces::FreeOp& op, int64_t t);
  void AfterAllocatorCall(RankState& r, int64_t t);
  void CreateAllocator(RankState& r);
  void WarmAllocator(RankState& r);
  // MemoryConfig::gemm_workspaces on `stream`; false when the allocator ran out.
  bool AllocateGemmWorkspaces(RankState& r, int32_t stream);
  // A rank starting cold: the workspaces before its first op, on its first GEMM's stream.
  void AllocateGemmWorkspacesCold(RankState& r);
  void Enqueue(RankState& r, int32_t stream, QueueItem item) {
    StreamState& s = r.streams[static_cast<size_t>(stream)];
    const bool was_empty = s.queue.empty();
    s.queue.push_back(item);
    if (was_empty && s.running_activity < 0) ScheduleStreamWake(r, stream, item.ready_ns);
  }
  void ScheduleStreamWake(RankState& r, int32_t stream, int64_t time) {
    StreamState& s = r.streams[static_cast<size_t>(stream)];
    if (s.wake_at == time) return;
    s.wake_at = time;
    Push(time, StreamWake{r.state, stream});
  }
  void AdvanceStream(RankState& r, int32_t stream);
  void OnRecordDone(RankState& r, int64_t record);
  void OnStreamIdle(RankState& r, int32_t stream);
  void WakeNextOnLane(RankState& r, const CommLane* lane);
  void UnblockHost(RankState& r);
  void PopFront(RankState& r, int32_t stream);  // streams.cc
  void ArriveCollective(RankState& r, int32_t stream, const QueueItem& item, const CollectiveOp& op);
  void ArriveP2p(RankState& r, int32_t stream, const QueueItem& item, const CollectiveOp& op);
  void StartCollective(int32_t comm, std::vector<Participant> members, const CollectiveOp& op,
                       int64_t bytes, int64_t seq);
  void AttributeWaits(int32_t comm, const std::vector<Participant>& members);
  // The members of representative communicator `comm` that state `state` stands for.
  int64_t Multiplicity(int32_t comm, int32_t state) const;
  void StartCompute(RankState& r, int32_t stream, const QueueItem& item, int64_t work_ns,
                    ActivityKind kind);
  void FinishActivity(int32_t id);
  bool HandOverKernel(int32_t id);
  // A kernel op's duration at full speed (cached per program); -1 for other ops.
  int64_t KernelDuration(const RankState& r, int32_t op_index);

  DeviceActivity& DeviceActivityOf(ActivityId id) {
    if (static_cast<size_t>(id) >= device_activities_.size()) device_activities_.resize(activities_->capacity());
    return device_activities_[static_cast<size_t>(id)];
  }
  void Integrate(RankState& r);

  // Observation (below the class: inline, they run for every span).
  void EmitHost(RankState& r, int32_t op_index, HostSpanKind kind, int64_t start, int64_t end,
                int64_t correlation);
  void NoteStepEnd(RankState& r, int32_t op_index, int64_t end);
  void EmitDevice(RankState& r, const Participant& p, int64_t start, int64_t end,
                  const CollectiveRun* run);
  // The state a hang leaves (hang_snapshot.cc): runs once per unfinished rank, at the end.
  std::string DescribeOp(const RankState& r, const std::vector<int32_t>& comm_of_slot, int32_t op_index) const;
  BlockedRank DescribeBlocked(const RankState& r, int32_t rank, const std::vector<int32_t>& comm_of_slot) const;
  std::vector<PendingRendezvous> PendingRendezvouses() const;
  bool DescribeReducedHang(SimulationResult& result) const;

  const traces::Schedule& schedule_;
  const CostProvider& costs_;
  const EngineConfig& config_;
  EngineObserver* observer_;

  int64_t now_ = 0;
  uint64_t next_seq_ = 0;
  std::priority_queue<ScheduledEvent, std::vector<ScheduledEvent>, std::greater<>> events_;
  std::deque<NowEvent> now_events_;
  std::string past_event_;  // set when something scheduled an event in the past
  bool passed_horizon_ = false;  // an event was due at or past traces::kMaxSimulatedNs
  bool warming_ = false;    // replaying a rank's first step into its allocator
  bool building_log_ = false;
  bool log_used_events_ = false;
  std::map<const Program*, bool> has_checkpoint_;  // per program: any checkpoint-phase op
  struct LogSlot {
    bool built = false;
    std::shared_ptr<const AllocatorLog> log;
  };
  std::map<std::pair<int32_t, int64_t>, LogSlot> allocator_logs_;  // (program, capacity)
  // One state per rank, or per class of ranks with the symmetry reduction (rank_classes.h).
  std::vector<RankState> ranks_;
  RankClasses classes_;
  bool reduced_ = false;
  std::vector<int32_t> quorum_;  // per communicator: the arrivals that start its collective
  // Work running on the GPUs, rated by the resource models (activity_set.h), and the engine's
  // side of each, by the same id.
  std::optional<ActivitySet> activities_;
  std::vector<DeviceActivity> device_activities_;
  std::vector<int32_t> member_ranks_;  // scratch: a collective's member ranks
  std::vector<Rendezvous> rendezvous_;      // per communicator
  std::unordered_map<P2pKey, P2pPending, P2pKeyHash> p2p_;
  std::map<CostKey, CollectiveCost> cost_cache_;
  std::map<const Program*, std::vector<int64_t>> durations_;       // RankState::durations
  std::map<const Program*, std::vector<int64_t>> copy_durations_;  // RankState::copy_durations
  int64_t ops_executed_ = 0;
  int64_t events_processed_ = 0;
  std::optional<OomAgreement> oom_agreed_;
};

// ---- Observation

// The training step ends with its last op outside the checkpoint phase (a checkpoint's
// consolidation after the optimizer step is reported on its own).
inline void Engine::NoteStepEnd(RankState& r, int32_t op_index, int64_t end) {
  if (!r.has_checkpoint_ops) return;  // the step is the whole run (set when results are gathered)
  if (op_index < 0 || OpOf(r, op_index).tags.phase != traces::Phase::kCheckpoint) {
    r.stats.step_end_ns = std::max(r.stats.step_end_ns, end);
  }
}

inline void Engine::EmitHost(RankState& r, int32_t op_index, HostSpanKind kind, int64_t start, int64_t end,
                             int64_t correlation) {
  if (kind != HostSpanKind::kSynchronize) r.stats.host_busy_ns += end - start;
  NoteStepEnd(r, op_index, end);
  // A sum of per-span hashes: identical spans give the same hash in any emission order
  // (same-instant events of different ranks interleave differently).
  r.stats.timeline_hash += HashCombine(HashCombine(static_cast<uint64_t>(op_index) << 3 | static_cast<uint64_t>(kind),
                                                   static_cast<uint64_t>(start)),
                                       static_cast<uint64_t>(end));
  if (r.want_trace) observer_->OnHostSpan(HostSpan{r.rank, op_index, kind, start, end, correlation});
}

inline void Engine::EmitDevice(RankState& r, const Participant& p, int64_t start, int64_t end,
                               const CollectiveRun* run) {
  NoteStepEnd(r, p.op_index, end);
  r.stats.timeline_hash += HashCombine(
      HashCombine(static_cast<uint64_t>(p.op_index) << 8 | static_cast<uint64_t>(p.stream) | 0x80, static_cast<uint64_t>(start)),
      static_cast<uint64_t>(end));
  if (r.want_trace) {
    // Reduced, a collective runs on its class's representative communicator: the span names
    // the rank's own (a traced rank's communicators are their own class's, so they agree).
    CollectiveRun own;
    if (run != nullptr && reduced_) {
      const auto& coll = std::get<CollectiveOp>(OpOf(r, p.op_index).payload);
      const int32_t comm = (*r.own_comm_of_slot)[static_cast<size_t>(coll.comm)];
      if (comm != run->communicator) {
        own = *run;
        own.communicator = comm;
        run = &own;
      }
    }
    observer_->OnDeviceSpan(DeviceSpan{r.rank, p.stream, p.op_index, start, end, p.op_index, run});
  }
}

}  // namespace shardscope::sim::engine_internal

#endif  // SHARDSCOPE_SIM_ENGINE_SRC_ENGINE_INTERNAL_H_

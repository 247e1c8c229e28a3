// The discrete-event engine (see engine.h for the semantics).
//
// State per rank: the host thread (program counter, clock, what it waits for), one FIFO
// queue per stream, event records, per-communicator serialization counters, and the set
// of activities running on the GPU. Activities (kernels, collectives, copies) carry their
// remaining work and rate; every rate change re-queues the activity's completion with a
// new version, and stale completions are skipped when popped.
//
// The host runs ahead without yielding until it reaches an op that observes device state
// (a synchronization); it yields until the global clock reaches its own clock, so every
// observation happens at the right simulated time.
#include "shardscope/sim/engine/engine.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <map>
#include <queue>
#include <tuple>
#include <unordered_map>
#include <variant>

#include <fmt/format.h>

namespace shardscope::sim {
namespace {

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
  // Per op of the program: the kernel's or copy's duration at full speed, -1 until first
  // asked. Shared by the ranks running the program (the cost provider is deterministic).
  std::vector<int64_t>* durations = nullptr;
  bool has_checkpoint_ops = false;         // the program has checkpoint-phase ops
  int32_t rank = 0;
  HostState host;
  std::vector<StreamState> streams;
  std::vector<int64_t> event_last_record;  // per EventIndex: most recent record, -1 none
  std::vector<int64_t> record_done;        // per record: completion time, -1 pending
  std::vector<int32_t> lane_of_slot;       // CommSlot -> index into lanes
  std::vector<int32_t> comm_of_slot;       // CommSlot -> global communicator
  std::vector<CommLane> lanes;
  std::vector<int32_t> active_compute;     // running compute activities
  std::vector<int32_t> active_comm;        // running collective activities
  int64_t last_change_ns = 0;              // for integrating compute/comm/overlap time
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
  int32_t rank = 0;
  int32_t stream = 0;
  int32_t op_index = 0;  // also the launch's correlation id
};

enum class ActivityKind : uint8_t { kCompute, kComm, kCopy };

struct Activity {
  ActivityKind kind = ActivityKind::kCompute;
  bool live = false;
  uint32_t version = 0;
  double remaining = 0;         // ns of work at rate 1
  double rate = 1;
  int64_t last_update = 0;
  int64_t start_ns = 0;
  std::vector<Participant> members;  // one for compute / copy; every member for a collective
  int32_t members_computing = 0;     // collectives: members with compute running
  CollectiveRun run;
  // A kernel's activity: copies of the items queued behind it on its stream (ahead[0] is the
  // next), read from the queue in one go so that handing over to the next kernel
  // (HandOverKernel) need not reach into the queue's memory, cold by the time the kernel ends.
  // Items only join a queue at its back, so the copies stay true.
  static constexpr int kAhead = 4;
  std::array<QueueItem, kAhead> ahead;
  std::array<int64_t, kAhead> ahead_ns;  // a kernel's duration at full speed; -1: not a kernel
  int32_t ahead_begin = 0, ahead_end = 0;
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

struct HostResume { int32_t rank; };
struct StreamWake { int32_t rank; int32_t stream; };
struct ActivityDone { int32_t activity; uint32_t version; };
using EventPayload = std::variant<HostResume, StreamWake, ActivityDone>;

struct ScheduledEvent {
  int64_t time;
  uint64_t seq;
  EventPayload payload;
  bool operator>(const ScheduledEvent& other) const {
    return time != other.time ? time > other.time : seq > other.seq;
  }
};

uint64_t HashCombine(uint64_t h, uint64_t v) {
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
  // (time, sequence) order is preserved while the heap sees fewer operations.
  void Push(int64_t time, EventPayload payload) {
    if (time < now_) {  // a bug in a model: never let the clock run backwards
      if (past_event_.empty()) past_event_ = fmt::format("event at {} ns pushed at {} ns", time, now_);
      time = now_;
    }
    if (time == now_) {
      now_events_.push_back(payload);
    } else {
      events_.push(ScheduledEvent{time, next_seq_++, payload});
    }
  }
  bool PopNext(EventPayload& payload);
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
  void AgreeOnOom(const std::vector<Participant>& members, const CollectiveRun& run);
  int64_t Slowed(const RankState& r, int64_t ns) const {
    return r.slowdown == 1.0 ? ns : static_cast<int64_t>(std::llround(static_cast<double>(ns) * r.slowdown));
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
  void Enqueue(RankState& r, int32_t stream, QueueItem item);
  void ScheduleStreamWake(RankState& r, int32_t stream, int64_t time);
  void AdvanceStream(RankState& r, int32_t stream);
  void OnRecordDone(RankState& r, int64_t record);
  void OnStreamIdle(RankState& r, int32_t stream);
  void WakeNextOnLane(RankState& r, const CommLane* lane);
  void UnblockHost(RankState& r);
  void PopFront(RankState& r, int32_t stream);
  void ArriveCollective(RankState& r, int32_t stream, const QueueItem& item, const CollectiveOp& op);
  void ArriveP2p(RankState& r, int32_t stream, const QueueItem& item, const CollectiveOp& op);
  void StartCollective(int32_t comm, std::vector<Participant> members, const CollectiveOp& op,
                       int64_t bytes, int64_t seq);
  void AttributeWaits(const std::vector<Participant>& members);
  void StartCompute(RankState& r, int32_t stream, const QueueItem& item, int64_t work_ns,
                    ActivityKind kind);
  void FinishActivity(int32_t id);
  bool HandOverKernel(int32_t id);
  // A kernel op's duration at full speed (cached per program); -1 for other ops.
  int64_t KernelDuration(const RankState& r, int32_t op_index);

  int32_t NewActivity();
  void SetRate(int32_t id, double rate);
  void Integrate(RankState& r);
  double ComputeRate(const RankState& r) const;
  double CommRate(const Activity& a) const;
  void RefreshComputeRates(RankState& r);
  void OnComputeCountChanged(RankState& r, int32_t before);
  void OnCommCountChanged(RankState& r, int32_t before);

  void EmitHost(RankState& r, int32_t op_index, HostSpanKind kind, int64_t start, int64_t end,
                int64_t correlation);
  void NoteStepEnd(RankState& r, int32_t op_index, int64_t end);
  void EmitDevice(RankState& r, const Participant& p, int64_t start, int64_t end,
                  const CollectiveRun* run);
  std::string DescribeOp(const RankState& r, int32_t op_index) const;
  BlockedRank DescribeBlocked(const RankState& r) const;

  const traces::Schedule& schedule_;
  const CostProvider& costs_;
  const EngineConfig& config_;
  EngineObserver* observer_;

  int64_t now_ = 0;
  uint64_t next_seq_ = 0;
  std::priority_queue<ScheduledEvent, std::vector<ScheduledEvent>, std::greater<>> events_;
  std::deque<EventPayload> now_events_;
  std::string past_event_;  // set when something scheduled an event in the past
  bool warming_ = false;    // replaying a rank's first step into its allocator
  bool building_log_ = false;
  bool log_used_events_ = false;
  std::map<const Program*, bool> has_checkpoint_;  // per program: any checkpoint-phase op
  struct LogSlot {
    bool built = false;
    std::shared_ptr<const AllocatorLog> log;
  };
  std::map<std::pair<int32_t, int64_t>, LogSlot> allocator_logs_;  // (program, capacity)
  std::vector<RankState> ranks_;
  std::vector<Activity> activities_;
  std::vector<int32_t> free_activities_;
  std::vector<Rendezvous> rendezvous_;      // per communicator
  std::unordered_map<P2pKey, P2pPending, P2pKeyHash> p2p_;
  std::map<CostKey, CollectiveCost> cost_cache_;
  std::map<const Program*, std::vector<int64_t>> durations_;  // RankState::durations
  int64_t ops_executed_ = 0;
  int64_t events_processed_ = 0;
  std::optional<OomAgreement> oom_agreed_;
};

StatusOr<SimulationResult> Engine::Run() {
  const int32_t world = schedule_.world_size();
  for (const auto& [rank, factor] : config_.rank_slowdown) {
    if (rank < 0 || rank >= world) {
      return Status::InvalidInput(fmt::format("straggler rank {} is outside the world of {} ranks", rank, world));
    }
    if (!(factor >= 1.0) || !std::isfinite(factor)) {
      return Status::InvalidInput(fmt::format("straggler rank {}: slowdown factor {} must be >= 1", rank, factor));
    }
  }
  if (config_.inject_oom) {
    const InjectedOom& oom = *config_.inject_oom;
    if (oom.rank < 0 || oom.rank >= world) {
      return Status::InvalidInput(fmt::format("injected OOM: rank {} is outside the world of {} ranks", oom.rank, world));
    }
    const std::vector<Op>& ops = schedule_.ProgramOf(oom.rank).ops;
    if (std::none_of(ops.begin(), ops.end(), [&](const Op& op) {
          return op.id == oom.op_id && std::holds_alternative<traces::AllocateOp>(op.payload);
        })) {
      return Status::InvalidInput(
          fmt::format("injected OOM: rank {} has no allocate op with id {}", oom.rank, oom.op_id));
    }
  }
  ranks_.resize(static_cast<size_t>(world));
  rendezvous_.resize(schedule_.communicators.size());
  for (int32_t rank = 0; rank < world; ++rank) {
    RankState& r = ranks_[static_cast<size_t>(rank)];
    const traces::RankBinding& binding = schedule_.ranks[static_cast<size_t>(rank)];
    r.rank = rank;
    r.program = &schedule_.ProgramOf(rank);
    {
      auto [it, inserted] = durations_.try_emplace(r.program);
      if (inserted) it->second.assign(r.program->ops.size(), -1);
      r.durations = &it->second;
    }
    {
      auto [it, inserted] = has_checkpoint_.try_emplace(r.program, false);
      if (inserted) {
        it->second = std::any_of(r.program->ops.begin(), r.program->ops.end(),
                                 [](const Op& op) { return op.tags.phase == traces::Phase::kCheckpoint; });
      }
      r.has_checkpoint_ops = it->second;
    }
    r.streams.resize(r.program->streams.size());
    r.stats.streams.resize(r.program->streams.size());
    r.event_last_record.assign(r.program->events.size(), -1);
    r.comm_of_slot = binding.comm_binding;
    if (r.comm_of_slot.size() != r.program->comm_slots.size()) {
      return Status::Internal(fmt::format("rank {}: communicator slots are not bound", rank));
    }
    // Two slots bound to one communicator share its serialization lane.
    for (size_t slot = 0; slot < r.comm_of_slot.size(); ++slot) {
      int32_t lane = -1;
      for (size_t earlier = 0; earlier < slot; ++earlier) {
        if (r.comm_of_slot[earlier] == r.comm_of_slot[slot]) lane = r.lane_of_slot[earlier];
      }
      if (lane < 0) {
        lane = static_cast<int32_t>(r.lanes.size());
        r.lanes.emplace_back();
      }
      r.lane_of_slot.push_back(lane);
    }
    r.want_trace = observer_ != nullptr && observer_->WantsRank(rank);
    if (auto it = config_.rank_slowdown.find(rank); it != config_.rank_slowdown.end()) r.slowdown = it->second;
    // The injected rank may keep reading a shared allocator log: it stops at the injected op
    // before consuming that op's outcome, and every outcome before it is the same as its
    // class's (same program, same capacity, same calls in program order).
    if (config_.inject_oom && config_.inject_oom->rank == rank) r.inject_oom_op_id = config_.inject_oom->op_id;
    if (config_.memory.enabled) {
      const auto& capacities = config_.memory.capacity_bytes;
      if (capacities.empty()) return Status::Internal("memory simulation without capacities");
      const int64_t capacity = capacities[std::min(static_cast<size_t>(rank), capacities.size() - 1)];
      r.stats.memory.capacity_bytes = capacity;
      r.alloc_events = std::make_unique<AllocatorEvents>(*this, &r);
      const bool keep_details = config_.memory.record_history && r.want_trace;
      if (!keep_details) {
        // Ranks with the same program and capacity make the same allocator calls in the same
        // order; without cross-stream events the outcomes do not depend on time, so one
        // allocator run serves them all (BuildAllocatorLog checks that no event was used).
        auto& log = allocator_logs_[{binding.program, capacity}];
        if (!log.built) {
          log.built = true;
          log.log = BuildAllocatorLog(r);
        }
        r.log = log.log;
      }
      if (r.log) {
        r.reserved_peak_seen = r.log->warm_reserved_peak;
        r.stats.memory.fragmentation_bytes = r.log->warm_fragmentation;
        r.stats.memory.allocated_at_reserved_peak = r.log->warm_allocated_at_peak;
      } else {
        CreateAllocator(r);
        if (config_.memory.warm_start) WarmAllocator(r);
      }
    }
    Push(0, HostResume{rank});
    r.host.wait = HostWait::kResumeScheduled;
  }

  int64_t total_ops = 0;
  for (const RankState& r : ranks_) total_ops += static_cast<int64_t>(r.program->ops.size());
  constexpr int64_t kProgressEvery = int64_t{1} << 20;  // events between progress calls
  EventPayload payload;
  while (PopNext(payload)) {
    if (config_.progress && (events_processed_ & (kProgressEvery - 1)) == 0 && total_ops > 0) {
      config_.progress(static_cast<double>(ops_executed_) / static_cast<double>(total_ops));
    }
    ++events_processed_;
    if (const auto* resume = std::get_if<HostResume>(&payload)) {
      RankState& r = ranks_[static_cast<size_t>(resume->rank)];
      r.host.wait = HostWait::kNone;
      RunHost(r);
    } else if (const auto* wake = std::get_if<StreamWake>(&payload)) {
      RankState& r = ranks_[static_cast<size_t>(wake->rank)];
      StreamState& s = r.streams[static_cast<size_t>(wake->stream)];
      if (s.wake_at == now_) s.wake_at = -1;
      AdvanceStream(r, wake->stream);
    } else {
      const auto& done = std::get<ActivityDone>(payload);
      const Activity& a = activities_[static_cast<size_t>(done.activity)];
      if (a.live && a.version == done.version) FinishActivity(done.activity);
    }
  }

  if (!past_event_.empty()) return Status::Internal(past_event_);
  SimulationResult result;
  result.ops_executed = ops_executed_;
  result.events_processed = events_processed_;
  result.oom_agreed = oom_agreed_;
  result.ranks.reserve(ranks_.size());
  for (RankState& r : ranks_) {
    bool streams_idle = std::all_of(r.streams.begin(), r.streams.end(),
                                    [](const StreamState& s) { return s.Idle(); });
    r.stats.finished = r.host.wait == HostWait::kDone && streams_idle;
    if (r.log) r.stats.memory.stats = CurrentStats(r);
    if (r.allocator) {
      r.stats.memory.stats = r.allocator->stats();
      if (config_.memory.record_history && r.want_trace) {
        r.stats.memory.snapshot = r.allocator->Snapshot();
        r.stats.memory.history = r.allocator->history();
      }
    }
    if (!r.stats.finished && !r.stats.oom_handled) {
      result.hung = true;
      result.blocked.push_back(DescribeBlocked(r));
    }
    // Without checkpoint ops the step is the whole run (host time after the last span, an
    // out-of-memory stop, included).
    if (!r.has_checkpoint_ops) r.stats.step_end_ns = r.stats.end_ns;
    result.makespan_ns = std::max(result.makespan_ns, r.stats.end_ns);
    result.step_ns = std::max(result.step_ns, r.stats.step_end_ns);
    result.ranks.push_back(std::move(r.stats));
  }
  for (size_t rank = 0; rank < result.ranks.size(); ++rank) {
    const RankStats& stats = result.ranks[rank];
    if (stats.collective_wait_caused_ns < kStragglerMinWaitNs) continue;
    if (result.straggler && stats.collective_wait_caused_ns <= result.straggler->wait_caused_ns) continue;
    result.straggler = Straggler{static_cast<int32_t>(rank), stats.last_arrivals, stats.collectives,
                                 stats.collective_wait_caused_ns};
  }
  if (result.hung) {
    // Collectives some members reached: who arrived, with what (the hang report's input).
    for (size_t comm = 0; comm < rendezvous_.size(); ++comm) {
      const Rendezvous& rv = rendezvous_[comm];
      if (rv.arrived.empty()) continue;
      PendingRendezvous pending;
      pending.communicator = static_cast<int32_t>(comm);
      pending.seq = rv.seq + 1;
      pending.mismatch = rv.mismatch;
      for (const Participant& p : rv.arrived) {
        const auto& coll = std::get<CollectiveOp>(OpOf(ranks_[static_cast<size_t>(p.rank)], p.op_index).payload);
        pending.arrived.push_back({p.rank, p.stream, p.op_index, coll.type, coll.bytes, coll.dtype});
      }
      result.rendezvous.push_back(std::move(pending));
    }
  }
  return result;
}

// Heap events due now (pushed before this instant began) come first, then this instant's
// FIFO; only then does the clock advance.
bool Engine::PopNext(EventPayload& payload) {
  if (!events_.empty() && events_.top().time == now_) {
    payload = events_.top().payload;
    events_.pop();
    return true;
  }
  if (!now_events_.empty()) {
    payload = now_events_.front();
    now_events_.pop_front();
    return true;
  }
  if (events_.empty()) return false;
  now_ = events_.top().time;  // the heap never holds a time before now_: Push routes now_ to the FIFO
  payload = events_.top().payload;
  events_.pop();
  return true;
}

// ---- Host thread

void Engine::RunHost(RankState& r) {
  HostState& host = r.host;
  if (r.halted) {  // a resume queued before the rank stopped at an OOM agreement
    host.wait = HostWait::kStopped;
    return;
  }
  host.clock = std::max(host.clock, now_);
  const std::vector<Op>& ops = r.program->ops;
  while (static_cast<size_t>(host.pc) < ops.size()) {
    const int32_t pc = host.pc;
    const Op& op = ops[static_cast<size_t>(pc)];
    const int64_t t = host.clock;
    bool yielded = false;
    std::visit(
        [&](const auto& payload) {
          using T = std::decay_t<decltype(payload)>;
          if constexpr (std::is_same_v<T, traces::KernelOp> ||
                        std::is_same_v<T, traces::MemcpyOp> ||
                        std::is_same_v<T, traces::CollectiveOp>) {
            const StreamState& target = r.streams[static_cast<size_t>(payload.stream)];
            if (config_.max_queued_per_stream > 0 &&
                target.queue.size() >= static_cast<size_t>(config_.max_queued_per_stream)) {
              // The stream's launch queue is full: cudaLaunchKernel blocks until its oldest
              // item retires. The host reached the launch at t (possibly ahead of the global
              // clock); it launches at the later of t and the next retirement (PopFront), so
              // it waits for that retirement without checking again at t.
              host.wait = HostWait::kQueueFull;
              host.wait_target = payload.stream;
              if (host.launch_blocked_since < 0) host.launch_blocked_since = t;
              yielded = true;
              return;
            }
            const int64_t end = t + config_.launch_overhead_ns;
            QueueItem item{pc, 0, end};
            if constexpr (std::is_same_v<T, traces::CollectiveOp>) {
              CommLane& lane = r.lanes[static_cast<size_t>(r.lane_of_slot[static_cast<size_t>(payload.comm)])];
              item.aux = static_cast<int32_t>(lane.issued++);
            }
            const int64_t start = host.launch_blocked_since >= 0 ? host.launch_blocked_since : t;
            host.launch_blocked_since = -1;
            r.stats.host_blocked_ns += t - start;
            r.stats.host_busy_ns -= t - start;  // EmitHost counts the whole span as busy
            EmitHost(r, pc, HostSpanKind::kLaunch, start, end, item.correlation());
            host.clock = end;
            Enqueue(r, payload.stream, item);
            if constexpr (std::is_same_v<T, traces::CollectiveOp>) {
              if (r.oom_caught && payload.oom_sync) {
                // catch_and_sync: the rank that ran out of memory has issued its OOM flag and
                // waits for the others' verdict (Composer _train_batch: all_reduce MAX,
                // .item()); it issues nothing more.
                r.halted = true;
                host.wait = HostWait::kStopped;
                host.pc = r.oom_pc;  // the hang report names the op that ran out of memory
                r.stats.end_ns = std::max(r.stats.end_ns, end);
                yielded = true;
                return;
              }
            }
          } else if constexpr (std::is_same_v<T, traces::EventRecordOp>) {
            const auto record = static_cast<int32_t>(r.record_done.size());
            r.record_done.push_back(-1);
            r.event_last_record[static_cast<size_t>(payload.event)] = record;
            EmitHost(r, pc, HostSpanKind::kApiCall, t, t, -1);
            Enqueue(r, payload.stream, QueueItem{pc, record, t});
          } else if constexpr (std::is_same_v<T, traces::StreamWaitEventOp>) {
            const int64_t record = r.event_last_record[static_cast<size_t>(payload.event)];
            EmitHost(r, pc, HostSpanKind::kApiCall, t, t, -1);
            // CUDA: waiting on an event that was never recorded completes at once.
            if (record >= 0) Enqueue(r, payload.stream, QueueItem{pc, static_cast<int32_t>(record), t});
          } else if constexpr (std::is_same_v<T, traces::HostWorkOp>) {
            EmitHost(r, pc, HostSpanKind::kHostWork, t, t + payload.duration_ns, -1);
            host.clock = t + payload.duration_ns;
          } else if constexpr (std::is_same_v<T, traces::StreamSynchronizeOp> ||
                               std::is_same_v<T, traces::DeviceSynchronizeOp> ||
                               std::is_same_v<T, traces::EventSynchronizeOp>) {
            if (t > now_) {
              // Observing the device: let the global clock catch up with the host first.
              host.wait = HostWait::kResumeScheduled;
              Push(t, HostResume{r.rank});
              yielded = true;
              return;
            }
            bool satisfied = false;
            if constexpr (std::is_same_v<T, traces::StreamSynchronizeOp>) {
              satisfied = r.streams[static_cast<size_t>(payload.stream)].Idle();
              host.wait = HostWait::kStream;
              host.wait_target = payload.stream;
            } else if constexpr (std::is_same_v<T, traces::DeviceSynchronizeOp>) {
              satisfied = std::all_of(r.streams.begin(), r.streams.end(),
                                      [](const StreamState& s) { return s.Idle(); });
              host.wait = HostWait::kDevice;
            } else {
              const int64_t record = r.event_last_record[static_cast<size_t>(payload.event)];
              satisfied = record < 0 || r.record_done[static_cast<size_t>(record)] >= 0;
              host.wait = HostWait::kRecord;
              host.wait_target = record;
            }
            if (satisfied) {
              host.wait = HostWait::kNone;
              EmitHost(r, pc, HostSpanKind::kSynchronize, t, t, -1);
            } else {
              host.wait_start = t;
              yielded = true;
            }
          } else if constexpr (std::is_same_v<T, traces::AllocateOp>) {
            if (op.id == r.inject_oom_op_id) {  // before the memory checks: works without memory too
              InjectOom(r, payload, op.id, t);
              yielded = true;
              return;
            }
            if (!r.allocator && !r.log) return;
            // Live since the warm-up (a log rank's log knows: the op makes no call).
            if (!r.log && r.preallocated[static_cast<size_t>(payload.tensor)]) {
              r.preallocated[static_cast<size_t>(payload.tensor)] = false;
              return;
            }
            if (t > now_ && !LogOutcomeIsTimeless(r, pc)) {
              // The allocator looks at device progress (completed free events): decide at t.
              host.wait = HostWait::kResumeScheduled;
              Push(t, HostResume{r.rank});
              yielded = true;
              return;
            }
            yielded = !Allocate(r, pc, payload, op.id, t);
          } else if constexpr (std::is_same_v<T, traces::RecordStreamOp>) {
            // Programs with record_stream never share a precomputed log (BuildLog).
            if (r.allocator) {
              const uint64_t address = r.tensor_address[static_cast<size_t>(payload.tensor)];
              if (address != 0) r.allocator->RecordStream(address, payload.stream);
            }
          } else {
            static_assert(std::is_same_v<T, traces::FreeOp>);
            if (r.allocator || r.log) FreeTensor(r, pc, payload, t);
          }
        },
        op.payload);
    if (yielded) return;
    ++host.pc;
    ++ops_executed_;
  }
  host.wait = HostWait::kDone;
  r.stats.end_ns = std::max(r.stats.end_ns, host.clock);
}

void Engine::UnblockHost(RankState& r) {
  HostState& host = r.host;
  r.stats.host_blocked_ns += now_ - host.wait_start;
  r.stats.host_busy_ns += host.pending_cost_ns;  // e.g. the cudaFree calls after a retry's sync
  EmitHost(r, host.pc, HostSpanKind::kSynchronize, host.wait_start, now_ + host.pending_cost_ns, -1);
  ++host.pc;
  ++ops_executed_;
  host.clock = now_ + host.pending_cost_ns;
  host.pending_cost_ns = 0;
  host.wait = HostWait::kResumeScheduled;
  Push(now_, HostResume{r.rank});
}

// Retires a stream's head item; a host blocked on that stream's full queue may launch again.
void Engine::PopFront(RankState& r, int32_t stream) {
  r.streams[static_cast<size_t>(stream)].queue.pop_front();
  HostState& host = r.host;
  if (host.wait == HostWait::kQueueFull && host.wait_target == stream) {
    host.clock = std::max(now_, host.launch_blocked_since);
    host.wait = HostWait::kResumeScheduled;
    Push(host.clock, HostResume{r.rank});
    // The resume runs within this instant: bring the op it starts with into the cache now.
    __builtin_prefetch(&r.program->ops[static_cast<size_t>(host.pc)]);
  }
}

// ---- Memory

EventToken Engine::AllocatorEvents::Record(AllocStream stream) {
  RankState& r = *rank_;
  const auto record = static_cast<int32_t>(r.record_done.size());
  if (engine_.building_log_) engine_.log_used_events_ = true;  // outcomes would depend on time
  if (engine_.warming_ || engine_.building_log_) {  // no kernels run in these replays: complete
    r.record_done.push_back(0);
    return record;
  }
  r.record_done.push_back(-1);
  engine_.Enqueue(r, stream, QueueItem{-1, record, r.host.clock});
  return record;
}

bool Engine::AllocatorEvents::Query(EventToken event) {
  return rank_->record_done[static_cast<size_t>(event)] >= 0;
}

// The policy goes on as if the event had completed; the engine makes the host wait for the
// device before the malloc returns (see Allocate).
void Engine::AllocatorEvents::Synchronize(EventToken event) {
  if (rank_->record_done[static_cast<size_t>(event)] < 0) rank_->alloc_needs_sync = true;
}

// Runs one rank's allocator the way the timed run would (warm-up step, then the measured
// step's calls in program order) and records every outcome with the statistics after it.
// Returns null when the allocator recorded a stream event: then outcomes could depend on
// device progress, and every rank keeps a live allocator.
std::shared_ptr<const AllocatorLog> Engine::BuildAllocatorLog(const RankState& like) {
  // record_stream makes frees wait for device progress: no log can stand for the timed run.
  for (const Op& op : like.program->ops) {
    if (std::holds_alternative<traces::RecordStreamOp>(op.payload)) return nullptr;
  }
  RankState scratch;
  scratch.program = like.program;
  scratch.rank = like.rank;
  scratch.streams.resize(like.streams.size());
  scratch.stats.memory.capacity_bytes = like.stats.memory.capacity_bytes;
  scratch.alloc_events = std::make_unique<AllocatorEvents>(*this, &scratch);
  building_log_ = true;
  log_used_events_ = false;
  CreateAllocator(scratch);
  if (config_.memory.warm_start) WarmAllocator(scratch);
  auto log = std::make_shared<AllocatorLog>();
  log->preallocated = scratch.preallocated;
  log->warm_stats = scratch.allocator->stats();
  log->warm_bytes = {log->warm_stats.allocated_bytes, log->warm_stats.reserved_bytes};
  log->call_of_op.assign(scratch.program->ops.size(), -1);
  for (size_t index = 0; index < scratch.program->ops.size(); ++index) {
    const Op& op = scratch.program->ops[index];
    if (const auto* alloc = std::get_if<traces::AllocateOp>(&op.payload)) {
      if (scratch.preallocated[static_cast<size_t>(alloc->tensor)]) {
        scratch.preallocated[static_cast<size_t>(alloc->tensor)] = false;
        continue;
      }
      const MallocOutcome out = scratch.allocator->Malloc(alloc->bytes, alloc->stream);
      log->call_of_op[index] = static_cast<int32_t>(log->calls.size());
      log->calls.push_back({out, scratch.allocator->stats()});
      log->bytes.emplace_back(log->calls.back().stats.allocated_bytes, log->calls.back().stats.reserved_bytes);
      if (!out.ok) break;
      scratch.tensor_address[static_cast<size_t>(alloc->tensor)] = out.address;
    } else if (const auto* free_op = std::get_if<traces::FreeOp>(&op.payload)) {
      uint64_t& address = scratch.tensor_address[static_cast<size_t>(free_op->tensor)];
      if (address == 0) continue;
      scratch.allocator->Free(address);
      address = 0;
      log->call_of_op[index] = static_cast<int32_t>(log->calls.size());
      log->calls.push_back({MallocOutcome{}, scratch.allocator->stats()});
      log->bytes.emplace_back(log->calls.back().stats.allocated_bytes, log->calls.back().stats.reserved_bytes);
    }
  }
  building_log_ = false;
  if (log_used_events_) return nullptr;
  // The warm-up's peaks count (see MemoryConfig::warm_start): start from them.
  log->warm_reserved_peak = scratch.reserved_peak_seen;
  log->warm_fragmentation = scratch.stats.memory.fragmentation_bytes;
  log->warm_allocated_at_peak = scratch.stats.memory.allocated_at_reserved_peak;
  return log;
}

MemoryStats Engine::CurrentStats(const RankState& r) const {
  if (r.log) return r.log_cursor > 0 ? r.log->calls[r.log_cursor - 1].stats : r.log->warm_stats;
  return r.allocator->stats();
}

void Engine::CreateAllocator(RankState& r) {
  r.allocator.reset();
  r.device_memory = MakeCapacityDeviceMemory(r.stats.memory.capacity_bytes);
  r.allocator = std::make_unique<CachingAllocator>(config_.memory.allocator, *r.device_memory, *r.alloc_events);
  r.allocator->RecordHistory(config_.memory.record_history && r.want_trace);
  const size_t tensors = r.program->tensors.size();
  r.tensor_address.assign(tensors, 0);
  r.tensor_bytes.assign(tensors, 0);
  r.preallocated.assign(tensors, false);
  r.live_tensors.clear();
  r.reserved_peak_seen = -1;
  r.allocated_peak_seen = -1;
  r.stats.memory.live_at_allocated_peak.clear();
  r.stats.memory.fragmentation_bytes = 0;
  r.stats.memory.allocated_at_reserved_peak = 0;
  r.stats.memory.live_at_reserved_peak.clear();
  r.stats.memory.history_time_ns.clear();
}

// Replays the rank's allocations and frees once, at time 0 and without costs, so the
// simulated step starts from the steady-state cache (see MemoryConfig::warm_start).
void Engine::WarmAllocator(RankState& r) {
  warming_ = true;
  bool ran_out = false;
  for (const Op& op : r.program->ops) {
    if (const auto* alloc = std::get_if<traces::AllocateOp>(&op.payload)) {
      const MallocOutcome out = r.allocator->Malloc(alloc->bytes, alloc->stream);
      if (!out.ok) {
        ran_out = true;
        break;
      }
      r.tensor_address[static_cast<size_t>(alloc->tensor)] = out.address;
      if (config_.memory.record_history && r.want_trace) {
        r.tensor_bytes[static_cast<size_t>(alloc->tensor)] = alloc->bytes;
        r.live_tensors.push_back(alloc->tensor);
      }
      AfterAllocatorCall(r, 0);
    } else if (const auto* free_op = std::get_if<traces::FreeOp>(&op.payload)) {
      FreeTensor(r, -1, *free_op, 0);  // a live allocator: no log to index
    }
  }
  warming_ = false;
  if (ran_out) {
    CreateAllocator(r);
    return;
  }
  for (size_t tensor = 0; tensor < r.tensor_address.size(); ++tensor) {
    r.preallocated[tensor] = r.tensor_address[tensor] != 0;
  }
}

// EngineConfig::inject_oom: the same stop as a failed malloc in Allocate, without asking the
// allocator (whose state stays as it was before the call).
void Engine::InjectOom(RankState& r, const traces::AllocateOp& op, int64_t op_id, int64_t t) {
  OomInfo oom{op_id, t, op.bytes, 0, 0, true};
  if (r.allocator || r.log) {
    const MemoryStats stats = CurrentStats(r);
    oom.free_bytes = std::max<int64_t>(0, r.stats.memory.capacity_bytes - stats.reserved_bytes);
  }
  r.stats.memory.oom = oom;
  if (r.want_trace) observer_->OnMemoryEvent(r.rank, t, "oom", op.bytes);
  if (CatchOom(r, t)) return;
  r.host.wait = HostWait::kStopped;
  r.stats.end_ns = std::max(r.stats.end_ns, t);
}

// catch_and_sync: the out-of-memory error at the host's op is caught (Composer
// Trainer._train_batch `except RuntimeError` with _is_cuda_oom) and the rank goes on at its
// next OOM-flag agreement point, skipping the ops in between (the exception unwinds past
// them). Returns false when the policy is raise or no agreement point follows: the rank stops.
bool Engine::CatchOom(RankState& r, int64_t t) {
  if (!config_.oom_catch_and_sync) return false;
  const std::vector<Op>& ops = r.program->ops;
  for (size_t i = static_cast<size_t>(r.host.pc) + 1; i < ops.size(); ++i) {
    const auto* coll = std::get_if<CollectiveOp>(&ops[i].payload);
    if (coll == nullptr || !coll->oom_sync) continue;
    r.oom_caught = true;
    r.oom_pc = r.host.pc;
    r.oom_resume_pc = static_cast<int32_t>(i);
    r.host.pc = static_cast<int32_t>(i);
    r.host.clock = t;
    r.host.wait = HostWait::kResumeScheduled;
    Push(t, HostResume{r.rank});
    return true;
  }
  return false;
}

// catch_and_sync: an oom_sync collective completed with a member that had run out of memory:
// the flag's MAX is 1 on every member, each raises and the trainer retries the batch with a
// smaller micro-batch (Composer _create_sync_hook raises RuntimeError; _train_batch then
// calls _adjust_device_train_microbatch_size). Every member stops here cleanly.
void Engine::AgreeOnOom(const std::vector<Participant>& members, const CollectiveRun& run) {
  OomAgreement agreement;
  agreement.communicator = run.communicator;
  agreement.seq = run.seq + 1;
  agreement.time_ns = now_;
  for (const Participant& p : members) {
    RankState& r = ranks_[static_cast<size_t>(p.rank)];
    agreement.ranks.push_back(p.rank);
    if (r.oom_caught && p.op_index == r.oom_resume_pc) {
      agreement.oom_ranks.push_back(p.rank);
      if (agreement.op_id < 0) agreement.op_id = OpOf(r, p.op_index).id;
    }
    if (!r.halted) {
      r.halted = true;
      if (r.host.wait != HostWait::kDone) r.host.wait = HostWait::kStopped;
    }
    r.stats.oom_handled = true;
    r.stats.end_ns = std::max(r.stats.end_ns, now_);
  }
  std::sort(agreement.ranks.begin(), agreement.ranks.end());
  std::sort(agreement.oom_ranks.begin(), agreement.oom_ranks.end());
  if (!oom_agreed_) oom_agreed_ = std::move(agreement);
}

// Returns false when the host must stop here (blocked on the device, or out of memory).
bool Engine::Allocate(RankState& r, int32_t pc, const traces::AllocateOp& op, int64_t op_id, int64_t t) {
  HostState& host = r.host;
  r.alloc_needs_sync = false;
  MallocOutcome out;
  if (r.log) {
    const int32_t call = r.log->call_of_op[static_cast<size_t>(pc)];
    if (call < 0) return true;  // not in the log: nothing to allocate (cannot happen for a live log)
    out = r.log->calls[static_cast<size_t>(call)].outcome;
    r.log_cursor = static_cast<size_t>(call) + 1;
  } else {
    out = r.allocator->Malloc(op.bytes, op.stream);
  }
  if (!out.ok) {
    AfterAllocatorCall(r, t);
    r.stats.memory.oom = OomInfo{op_id, t, out.requested_bytes, out.device_free_bytes, out.largest_free_block};
    if (r.want_trace) observer_->OnMemoryEvent(r.rank, t, "oom", op.bytes);
    if (CatchOom(r, t)) return false;
    host.wait = HostWait::kStopped;
    r.stats.end_ns = std::max(r.stats.end_ns, t);
    return false;
  }
  // A log rank keeps no addresses: the log says which later frees make a call.
  if (!r.log) r.tensor_address[static_cast<size_t>(op.tensor)] = out.address;
  if (config_.memory.record_history && r.want_trace) {
    r.tensor_bytes[static_cast<size_t>(op.tensor)] = op.bytes;
    r.live_tensors.push_back(op.tensor);
  }
  if (r.want_trace) {
    if (out.retried) observer_->OnMemoryEvent(r.rank, t, "alloc_retry", op.bytes);
    if (out.device_allocs > 0) observer_->OnMemoryEvent(r.rank, t, "segment_alloc", out.block_bytes);
  }
  AfterAllocatorCall(r, t);
  const int64_t cost = out.device_allocs * config_.memory.device_alloc_ns +
                       out.device_frees * config_.memory.device_free_ns;
  const bool syncs = out.synchronized || out.device_frees > 0 || r.alloc_needs_sync;
  const bool idle = std::all_of(r.streams.begin(), r.streams.end(), [](const StreamState& s) { return s.Idle(); });
  if (syncs && !idle) {
    // cudaFree synchronizes the device, and the retry path first waits for every outstanding
    // free event: the host waits for the GPU to drain, then pays for the calls.
    host.wait = HostWait::kDevice;
    host.wait_start = t;
    host.pending_cost_ns = cost;
    return false;
  }
  if (cost > 0) EmitHost(r, pc, HostSpanKind::kApiCall, t, t + cost, -1);
  host.clock = t + cost;
  return true;
}

void Engine::FreeTensor(RankState& r, int32_t pc, const traces::FreeOp& op, int64_t t) {
  if (r.log) {
    const int32_t call = r.log->call_of_op[static_cast<size_t>(pc)];
    if (call < 0) return;  // the tensor is not live (a 0-byte allocation)
    r.log_cursor = static_cast<size_t>(call) + 1;
  } else {
    uint64_t& address = r.tensor_address[static_cast<size_t>(op.tensor)];
    if (address == 0) return;  // ValidateSchedule guarantees a live tensor
    r.allocator->Free(address);
    address = 0;
  }
  if (config_.memory.record_history && r.want_trace) {
    auto it = std::find(r.live_tensors.begin(), r.live_tensors.end(), op.tensor);
    if (it != r.live_tensors.end()) {
      *it = r.live_tensors.back();
      r.live_tensors.pop_back();
    }
  }
  AfterAllocatorCall(r, t);
}

// Peaks, fragmentation at the reserved peak, trace counters and history times.
void Engine::AfterAllocatorCall(RankState& r, int64_t t) {
  int64_t allocated = 0, reserved = 0;
  if (r.log) {
    std::tie(allocated, reserved) = r.log_cursor > 0 ? r.log->bytes[r.log_cursor - 1] : r.log->warm_bytes;
  } else {
    const MemoryStats& stats = r.allocator->stats();
    allocated = stats.allocated_bytes;
    reserved = stats.reserved_bytes;
  }
  if (reserved > r.reserved_peak_seen) {
    r.reserved_peak_seen = reserved;
    r.stats.memory.fragmentation_bytes = reserved - allocated;
    r.stats.memory.allocated_at_reserved_peak = allocated;
    if (config_.memory.record_history && r.want_trace) {
      // Reserved grows only through new segments, so this runs a bounded number of times.
      auto& live = r.stats.memory.live_at_reserved_peak;
      live.clear();
      for (int32_t tensor : r.live_tensors) live.emplace_back(tensor, r.tensor_bytes[static_cast<size_t>(tensor)]);
    }
  }
  if (allocated > r.allocated_peak_seen) {
    r.allocated_peak_seen = allocated;
    if (config_.memory.record_history && r.want_trace) {
      auto& live = r.stats.memory.live_at_allocated_peak;
      live.clear();
      for (int32_t tensor : r.live_tensors) live.emplace_back(tensor, r.tensor_bytes[static_cast<size_t>(tensor)]);
    }
  }
  if (r.want_trace) {
    if (!warming_) observer_->OnMemory(r.rank, t, allocated, reserved);
    if (r.allocator) r.stats.memory.history_time_ns.resize(r.allocator->history().size(), t);
  }
}

// ---- Streams

void Engine::Enqueue(RankState& r, int32_t stream, QueueItem item) {
  StreamState& s = r.streams[static_cast<size_t>(stream)];
  const bool was_empty = s.queue.empty();
  s.queue.push_back(item);
  if (was_empty && s.running_activity < 0) ScheduleStreamWake(r, stream, item.ready_ns);
}

void Engine::ScheduleStreamWake(RankState& r, int32_t stream, int64_t time) {
  StreamState& s = r.streams[static_cast<size_t>(stream)];
  if (s.wake_at == time) return;
  s.wake_at = time;
  Push(time, StreamWake{r.rank, stream});
}

void Engine::AdvanceStream(RankState& r, int32_t stream) {
  StreamState& s = r.streams[static_cast<size_t>(stream)];
  while (true) {
    if (s.running_activity >= 0 || s.at_rendezvous || s.waiting_turn || s.waiting_record >= 0) return;
    if (s.queue.empty()) {
      OnStreamIdle(r, stream);
      return;
    }
    const QueueItem item = s.queue.front();
    if (item.ready_ns > now_) {
      ScheduleStreamWake(r, stream, item.ready_ns);
      return;
    }
    if (item.op_index < 0) {  // an allocator event (record_stream deferral)
      PopFront(r, stream);
      r.record_done[static_cast<size_t>(item.aux)] = now_;
      OnRecordDone(r, item.aux);
      continue;
    }
    const Op& op = OpOf(r, item.op_index);
    if (const auto* kernel = std::get_if<traces::KernelOp>(&op.payload)) {
      int64_t& ns = (*r.durations)[static_cast<size_t>(item.op_index)];
      if (ns < 0) ns = costs_.KernelNs(kernel->compute);
      StartCompute(r, stream, item, Slowed(r, ns), ActivityKind::kCompute);
      return;
    }
    if (const auto* copy = std::get_if<traces::MemcpyOp>(&op.payload)) {
      int64_t& ns = (*r.durations)[static_cast<size_t>(item.op_index)];
      if (ns < 0) ns = costs_.MemcpyNs(copy->kind, copy->bytes);
      StartCompute(r, stream, item, Slowed(r, ns), ActivityKind::kCopy);
      return;
    }
    if (const auto* coll = std::get_if<traces::CollectiveOp>(&op.payload)) {
      CommLane& lane = r.lanes[static_cast<size_t>(r.lane_of_slot[static_cast<size_t>(coll->comm)])];
      if (lane.completed == item.aux) {
        s.at_rendezvous = true;
        s.arrived_ns = now_;
        if (coll->type == CollectiveType::kSend || coll->type == CollectiveType::kRecv) {
          ArriveP2p(r, stream, item, *coll);
        } else {
          ArriveCollective(r, stream, item, *coll);
        }
      } else {
        s.waiting_turn = true;  // an earlier op of this communicator has not finished
        s.waiting_since = now_;
      }
      return;
    }
    if (std::holds_alternative<traces::EventRecordOp>(op.payload)) {
      PopFront(r, stream);
      r.record_done[static_cast<size_t>(item.aux)] = now_;
      OnRecordDone(r, item.aux);
      continue;
    }
    if (std::holds_alternative<traces::StreamWaitEventOp>(op.payload)) {
      if (r.record_done[static_cast<size_t>(item.aux)] >= 0) {
        PopFront(r, stream);
        continue;
      }
      s.waiting_record = item.aux;
      s.waiting_since = now_;
      return;
    }
    // Nothing else is ever enqueued.
    PopFront(r, stream);
  }
}

void Engine::OnRecordDone(RankState& r, int64_t record) {
  for (size_t i = 0; i < r.streams.size(); ++i) {
    StreamState& other = r.streams[i];
    if (other.waiting_record == record) {
      other.waiting_record = -1;
      PopFront(r, static_cast<int32_t>(i));
      AdvanceStream(r, static_cast<int32_t>(i));
    }
  }
  if (r.host.wait == HostWait::kRecord && r.host.wait_target == record) UnblockHost(r);
}

void Engine::OnStreamIdle(RankState& r, int32_t stream) {
  HostState& host = r.host;
  if (host.wait == HostWait::kStream && host.wait_target == stream) {
    UnblockHost(r);
  } else if (host.wait == HostWait::kDevice &&
             std::all_of(r.streams.begin(), r.streams.end(),
                         [](const StreamState& s) { return s.Idle(); })) {
    UnblockHost(r);
  }
}

// ---- Collectives

// A lane finished an op: the stream whose head is the lane's next op may now arrive.
void Engine::WakeNextOnLane(RankState& r, const CommLane* lane) {
  for (size_t i = 0; i < r.streams.size(); ++i) {
    StreamState& s = r.streams[i];
    if (!s.waiting_turn) continue;
    const QueueItem& head = s.queue.front();
    const auto& coll = std::get<CollectiveOp>(OpOf(r, head.op_index).payload);
    if (&r.lanes[static_cast<size_t>(r.lane_of_slot[static_cast<size_t>(coll.comm)])] != lane) continue;
    if (head.aux != lane->completed) continue;
    s.waiting_turn = false;
    AdvanceStream(r, static_cast<int32_t>(i));
    return;
  }
}

void Engine::ArriveCollective(RankState& r, int32_t stream, const QueueItem& item,
                              const CollectiveOp& op) {
  const int32_t comm = r.comm_of_slot[static_cast<size_t>(op.comm)];
  Rendezvous& rv = rendezvous_[static_cast<size_t>(comm)];
  // all_to_all may move different amounts per rank (torch.distributed.all_to_all_single with
  // input/output split sizes; NCCL runs it as grouped ncclSend/ncclRecv, one pair per peer).
  // Flight Recorder's analyzer accepts that too: it checks an all_to_all only by the totals
  // over ranks (check_size_alltoall, torch/distributed/flight_recorder/components/utils.py).
  const bool sizes_may_differ = op.type == CollectiveType::kAllToAll;
  if (rv.arrived.empty()) {
    rv.first = &op;
    rv.max_bytes = op.bytes;
  } else if (op.type != rv.first->type || op.dtype != rv.first->dtype ||
             (op.bytes != rv.first->bytes && !sizes_may_differ)) {
    rv.mismatch = true;  // NCCL would hang or corrupt memory: never start it
  }
  rv.max_bytes = std::max(rv.max_bytes, op.bytes);
  rv.arrived.push_back(Participant{r.rank, stream, item.op_index});
  const auto& members = schedule_.communicators[static_cast<size_t>(comm)].ranks;
  if (rv.arrived.size() < members.size() || rv.mismatch) return;
  std::vector<Participant> participants = std::move(rv.arrived);
  rv.arrived.clear();
  const CollectiveOp& first = *rv.first;
  rv.first = nullptr;
  // Every member's grouped send/recv ends only when its slowest pair has: the instance is
  // costed with the largest member's bytes (equal to every member's outside all_to_all).
  StartCollective(comm, std::move(participants), first, rv.max_bytes, rv.seq++);
}

void Engine::ArriveP2p(RankState& r, int32_t stream, const QueueItem& item, const CollectiveOp& op) {
  const int32_t comm = r.comm_of_slot[static_cast<size_t>(op.comm)];
  const bool is_send = op.type == CollectiveType::kSend;
  P2pKey key{comm, is_send ? r.rank : op.peer, is_send ? op.peer : r.rank};
  P2pPending& pending = p2p_[key];
  Participant me{r.rank, stream, item.op_index};
  if (is_send) {
    pending.has_send = true;
    pending.send = me;
  } else {
    pending.has_recv = true;
    pending.recv = me;
  }
  if (!pending.has_send || !pending.has_recv) return;
  std::vector<Participant> members = {pending.send, pending.recv};
  const int32_t send_rank = pending.send.rank;
  const CollectiveOp& send_op = std::get<CollectiveOp>(
      OpOf(ranks_[static_cast<size_t>(send_rank)], pending.send.op_index).payload);
  const int64_t seq = pending.seq++;
  pending.has_send = pending.has_recv = false;
  StartCollective(comm, std::move(members), send_op, send_op.bytes, seq);
}

// The instance starts now, when its last member arrived: who was last, and for how long the
// others had waited (see RankStats::last_arrivals). O(members), no allocation.
void Engine::AttributeWaits(const std::vector<Participant>& members) {
  int32_t last_rank = -1;
  int32_t arrived_now = 0;
  int64_t waited_ns = 0;
  for (const Participant& p : members) {
    RankState& r = ranks_[static_cast<size_t>(p.rank)];
    ++r.stats.collectives;
    const int64_t arrived = r.streams[static_cast<size_t>(p.stream)].arrived_ns;
    if (arrived >= now_) {
      ++arrived_now;
      last_rank = p.rank;
    } else {
      waited_ns += now_ - arrived;
    }
  }
  if (arrived_now != 1) return;  // a tie: nobody was late
  RankStats& late = ranks_[static_cast<size_t>(last_rank)].stats;
  ++late.last_arrivals;
  late.collective_wait_caused_ns += waited_ns;
}

void Engine::StartCollective(int32_t comm, std::vector<Participant> members, const CollectiveOp& op,
                             int64_t bytes, int64_t seq) {
  AttributeWaits(members);
  const CostKey key{comm, op.type, bytes};
  auto cached = cost_cache_.find(key);
  if (cached == cost_cache_.end()) {
    cached = cost_cache_.emplace(key, costs_.Collective(op.type, bytes, comm)).first;
  }
  const int32_t id = NewActivity();
  Activity& a = activities_[static_cast<size_t>(id)];
  a.kind = ActivityKind::kComm;
  a.remaining = static_cast<double>(cached->second.duration_ns);
  a.start_ns = now_;
  a.last_update = now_;
  a.members = std::move(members);
  a.run = CollectiveRun{comm, seq, cached->second};
  a.members_computing = 0;
  for (const Participant& p : a.members) {
    RankState& r = ranks_[static_cast<size_t>(p.rank)];
    r.streams[static_cast<size_t>(p.stream)].running_activity = id;
    if (!r.active_compute.empty()) ++a.members_computing;
  }
  a.rate = 0;  // forces SetRate to queue the completion
  SetRate(id, CommRate(a));
  for (const Participant& p : activities_[static_cast<size_t>(id)].members) {
    RankState& r = ranks_[static_cast<size_t>(p.rank)];
    Integrate(r);
    const int32_t before = static_cast<int32_t>(r.active_comm.size());
    r.active_comm.push_back(id);
    OnCommCountChanged(r, before);
  }
}

// ---- Compute and copies

void Engine::StartCompute(RankState& r, int32_t stream, const QueueItem& item, int64_t work_ns,
                          ActivityKind kind) {
  const int32_t id = NewActivity();
  Activity& a = activities_[static_cast<size_t>(id)];
  a.kind = kind;
  a.ahead_begin = a.ahead_end = 0;
  a.remaining = static_cast<double>(work_ns);
  a.start_ns = now_;
  a.last_update = now_;
  a.members.assign(1, Participant{r.rank, stream, item.op_index});
  r.streams[static_cast<size_t>(stream)].running_activity = id;
  a.rate = 0;
  if (kind == ActivityKind::kCopy) {
    SetRate(id, 1.0);  // copy engines: no contention modelled
    return;
  }
  Integrate(r);
  const int32_t before = static_cast<int32_t>(r.active_compute.size());
  r.active_compute.push_back(id);
  OnComputeCountChanged(r, before);
  SetRate(id, ComputeRate(r));
}

void Engine::FinishActivity(int32_t id) {
  if (HandOverKernel(id)) return;
  Activity& a = activities_[static_cast<size_t>(id)];
  a.live = false;
  free_activities_.push_back(id);
  const std::vector<Participant> members = std::move(a.members);
  a.members.clear();
  const ActivityKind kind = a.kind;
  const int64_t start = a.start_ns;
  const CollectiveRun run = a.run;
  for (const Participant& p : members) {
    RankState& r = ranks_[static_cast<size_t>(p.rank)];
    if (kind == ActivityKind::kCompute) {
      Integrate(r);
      const int32_t before = static_cast<int32_t>(r.active_compute.size());
      r.active_compute.erase(std::find(r.active_compute.begin(), r.active_compute.end(), id));
      OnComputeCountChanged(r, before);
    } else if (kind == ActivityKind::kComm) {
      Integrate(r);
      const int32_t before = static_cast<int32_t>(r.active_comm.size());
      r.active_comm.erase(std::find(r.active_comm.begin(), r.active_comm.end(), id));
      OnCommCountChanged(r, before);
    }
  }
  for (const Participant& p : members) {
    RankState& r = ranks_[static_cast<size_t>(p.rank)];
    StreamState& s = r.streams[static_cast<size_t>(p.stream)];
    s.running_activity = -1;
    s.at_rendezvous = false;
    PopFront(r, p.stream);
    StreamStats& stats = r.stats.streams[static_cast<size_t>(p.stream)];
    stats.busy_ns += now_ - start;
    ++stats.ops;
    r.stats.end_ns = std::max(r.stats.end_ns, now_);
    EmitDevice(r, p, start, now_, kind == ActivityKind::kComm ? &run : nullptr);
  }
  if (kind == ActivityKind::kComm && config_.oom_catch_and_sync) {
    const RankState& first = ranks_[static_cast<size_t>(members.front().rank)];
    const bool sync_point = std::get<CollectiveOp>(OpOf(first, members.front().op_index).payload).oom_sync;
    // A member's flag is 1 only in the collective it skipped to after its OOM (the host
    // fills the flag before the launch; the host may run ahead of earlier agreements).
    if (sync_point && std::any_of(members.begin(), members.end(), [&](const Participant& p) {
          const RankState& r = ranks_[static_cast<size_t>(p.rank)];
          return r.oom_caught && p.op_index == r.oom_resume_pc;
        })) {
      AgreeOnOom(members, run);  // before the streams advance: no host resumes past it
    }
  }
  for (const Participant& p : members) {
    RankState& r = ranks_[static_cast<size_t>(p.rank)];
    if (kind == ActivityKind::kComm) {
      const auto& coll = std::get<CollectiveOp>(OpOf(r, p.op_index).payload);
      CommLane& lane = r.lanes[static_cast<size_t>(r.lane_of_slot[static_cast<size_t>(coll.comm)])];
      ++lane.completed;
      WakeNextOnLane(r, &lane);
    }
    AdvanceStream(r, p.stream);
  }
}

// A kernel ends and the next item of its stream is a kernel that is ready: the stream starts
// it at once, so the GPU's count of running compute kernels goes 1 -> 0 -> 1 within this
// instant, which changes no rate. The activity carries on as the next kernel: nothing is
// recounted, and no collective on the GPU is re-timed twice for nothing.
int64_t Engine::KernelDuration(const RankState& r, int32_t op_index) {
  int64_t& ns = (*r.durations)[static_cast<size_t>(op_index)];
  if (ns < 0) {
    const auto* kernel = std::get_if<traces::KernelOp>(&OpOf(r, op_index).payload);
    if (kernel == nullptr) return -1;
    ns = costs_.KernelNs(kernel->compute);
  }
  return ns;
}

bool Engine::HandOverKernel(int32_t id) {
  Activity& a = activities_[static_cast<size_t>(id)];
  if (a.kind != ActivityKind::kCompute || a.members.size() != 1) return false;
  const Participant p = a.members.front();
  RankState& r = ranks_[static_cast<size_t>(p.rank)];
  StreamState& s = r.streams[static_cast<size_t>(p.stream)];
  if (a.ahead_begin == a.ahead_end) {
    // Refill the look-ahead from the queue: the items behind the running one (queue[0]).
    a.ahead_begin = 0;
    a.ahead_end = static_cast<int32_t>(std::min<size_t>(Activity::kAhead, s.queue.size() - 1));
    for (int32_t i = 0; i < a.ahead_end; ++i) {
      const QueueItem& item = s.queue[static_cast<size_t>(i) + 1];
      a.ahead[static_cast<size_t>(i)] = item;
      a.ahead_ns[static_cast<size_t>(i)] = item.op_index >= 0 ? KernelDuration(r, item.op_index) : -1;
    }
    if (a.ahead_end == 0) return false;
  }
  const QueueItem next = a.ahead[static_cast<size_t>(a.ahead_begin)];
  const int64_t ns = a.ahead_ns[static_cast<size_t>(a.ahead_begin)];
  if (ns < 0 || next.ready_ns > now_) return false;
  // Retire the finished kernel as FinishActivity would.
  const int64_t start = a.start_ns;
  PopFront(r, p.stream);
  StreamStats& stats = r.stats.streams[static_cast<size_t>(p.stream)];
  stats.busy_ns += now_ - start;
  ++stats.ops;
  r.stats.end_ns = std::max(r.stats.end_ns, now_);
  EmitDevice(r, p, start, now_, nullptr);
  // Start the next one on the same activity, at the unchanged rate.
  a.members.front().op_index = next.op_index;
  ++a.ahead_begin;
  a.remaining = static_cast<double>(Slowed(r, ns));
  a.start_ns = now_;
  a.last_update = now_;
  ++a.version;
  const int64_t done = now_ + static_cast<int64_t>(std::ceil(a.remaining / a.rate - 1e-6));
  Push(std::max(done, now_), ActivityDone{id, a.version});
  return true;
}

int32_t Engine::NewActivity() {
  int32_t id;
  if (!free_activities_.empty()) {
    id = free_activities_.back();
    free_activities_.pop_back();
  } else {
    id = static_cast<int32_t>(activities_.size());
    activities_.emplace_back();
  }
  Activity& a = activities_[static_cast<size_t>(id)];
  a.live = true;
  ++a.version;
  return id;
}

void Engine::SetRate(int32_t id, double rate) {
  Activity& a = activities_[static_cast<size_t>(id)];
  if (a.rate == rate) return;
  a.remaining = std::max(0.0, a.remaining - static_cast<double>(now_ - a.last_update) * a.rate);
  a.last_update = now_;
  a.rate = rate;
  ++a.version;
  // The small epsilon keeps exact quotients (100 / 0.8) from rounding up by a nanosecond.
  const double left_ns = a.remaining / rate;
  const int64_t done = now_ + static_cast<int64_t>(std::ceil(left_ns - 1e-6));
  Push(std::max(done, now_), ActivityDone{id, a.version});
}

// Time with compute, with communication, and with both, per rank (HTA's overlap).
void Engine::Integrate(RankState& r) {
  const int64_t dt = now_ - r.last_change_ns;
  if (dt > 0) {
    const bool compute = !r.active_compute.empty();
    const bool comm = !r.active_comm.empty();
    if (compute) r.stats.compute_ns += dt;
    if (comm) r.stats.comm_ns += dt;
    if (compute && comm) r.stats.overlap_ns += dt;
  }
  r.last_change_ns = now_;
}

double Engine::ComputeRate(const RankState& r) const {
  double rate = 1.0;
  if (config_.compute_sharing == ComputeSharing::kFairShare && r.active_compute.size() > 1) {
    rate /= static_cast<double>(r.active_compute.size());
  }
  if (!r.active_comm.empty()) rate /= 1.0 + config_.compute_slowdown;
  return rate;
}

double Engine::CommRate(const Activity& a) const {
  return a.members_computing > 0 ? 1.0 / (1.0 + config_.comm_slowdown) : 1.0;
}

void Engine::RefreshComputeRates(RankState& r) {
  const double rate = ComputeRate(r);
  for (int32_t id : r.active_compute) SetRate(id, rate);
}

void Engine::OnComputeCountChanged(RankState& r, int32_t before) {
  const int32_t after = static_cast<int32_t>(r.active_compute.size());
  if (config_.compute_sharing == ComputeSharing::kFairShare) RefreshComputeRates(r);
  if ((before == 0) == (after == 0)) return;
  // The GPU went from idle to computing or back: its collectives change speed.
  for (int32_t id : r.active_comm) {
    Activity& a = activities_[static_cast<size_t>(id)];
    a.members_computing += after > 0 ? 1 : -1;
    SetRate(id, CommRate(a));
  }
}

void Engine::OnCommCountChanged(RankState& r, int32_t before) {
  const int32_t after = static_cast<int32_t>(r.active_comm.size());
  if ((before == 0) != (after == 0)) RefreshComputeRates(r);
}

// ---- Observation

// The training step ends with its last op outside the checkpoint phase (a checkpoint's
// consolidation after the optimizer step is reported on its own).
void Engine::NoteStepEnd(RankState& r, int32_t op_index, int64_t end) {
  if (!r.has_checkpoint_ops) return;  // the step is the whole run (set when results are gathered)
  if (op_index < 0 || OpOf(r, op_index).tags.phase != traces::Phase::kCheckpoint) {
    r.stats.step_end_ns = std::max(r.stats.step_end_ns, end);
  }
}

void Engine::EmitHost(RankState& r, int32_t op_index, HostSpanKind kind, int64_t start, int64_t end,
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

void Engine::EmitDevice(RankState& r, const Participant& p, int64_t start, int64_t end,
                        const CollectiveRun* run) {
  NoteStepEnd(r, p.op_index, end);
  r.stats.timeline_hash += HashCombine(
      HashCombine(static_cast<uint64_t>(p.op_index) << 8 | static_cast<uint64_t>(p.stream) | 0x80, static_cast<uint64_t>(start)),
      static_cast<uint64_t>(end));
  if (r.want_trace) {
    observer_->OnDeviceSpan(DeviceSpan{r.rank, p.stream, p.op_index, start, end, p.op_index, run});
  }
}

std::string Engine::DescribeOp(const RankState& r, int32_t op_index) const {
  const Op& op = OpOf(r, op_index);
  std::string text = fmt::format("op {} {}", op.id, traces::OpKindName(op.payload));
  if (op.name != traces::kNoName) text += fmt::format(" '{}'", r.program->NameOf(op.name));
  if (const auto* coll = std::get_if<CollectiveOp>(&op.payload)) {
    const int32_t comm = r.comm_of_slot[static_cast<size_t>(coll->comm)];
    text += fmt::format(" {} on '{}'", traces::CollectiveTypeName(coll->type),
                        schedule_.communicators[static_cast<size_t>(comm)].name);
  }
  return text;
}

// Runs once per unfinished rank when the run ends, never on the hot path.
BlockedRank Engine::DescribeBlocked(const RankState& r) const {
  BlockedRank blocked;
  blocked.rank = r.rank;
  const int32_t pc = r.host.pc;
  const bool at_op = static_cast<size_t>(pc) < r.program->ops.size();
  switch (r.host.wait) {
    case HostWait::kDone: blocked.host = "finished issuing"; break;
    case HostWait::kStream:
    case HostWait::kDevice:
    case HostWait::kRecord:
    case HostWait::kQueueFull:
      blocked.host = "blocked in " + DescribeOp(r, pc);
      break;
    case HostWait::kStopped:
      blocked.host = (r.oom_caught ? "caught out of memory in " : "stopped: out of memory in ") +
                     DescribeOp(r, pc) +
                     (r.oom_caught ? ", waiting in its OOM-flag all_reduce" : "");
      break;
    default: blocked.host = fmt::format("at op index {}", pc); break;
  }
  // Where a pending record sits: the queue item holding it (records execute in their queue).
  auto find_record = [&](int64_t record, int32_t& stream_out, int32_t& op_out) {
    for (size_t i = 0; i < r.streams.size(); ++i) {
      for (const QueueItem& item : r.streams[i].queue) {
        if (item.aux != record) continue;
        if (item.op_index >= 0 && !std::holds_alternative<traces::EventRecordOp>(OpOf(r, item.op_index).payload)) continue;
        stream_out = static_cast<int32_t>(i);
        op_out = item.op_index;
        return;
      }
    }
  };
  BlockedHost& host = blocked.host_state;
  host.since_ns = r.host.wait_start;
  if (at_op && r.host.wait != HostWait::kDone) {
    host.op_index = pc;
    host.op_id = OpOf(r, pc).id;
  }
  switch (r.host.wait) {
    case HostWait::kDone: host.reason = HostBlockReason::kFinished; host.since_ns = r.host.clock; break;
    case HostWait::kStream:
      host.reason = HostBlockReason::kStreamSynchronize;
      host.stream = static_cast<int32_t>(r.host.wait_target);
      break;
    case HostWait::kDevice: host.reason = HostBlockReason::kDeviceSynchronize; break;
    case HostWait::kRecord: {
      host.reason = HostBlockReason::kEventSynchronize;
      if (const auto* sync = std::get_if<traces::EventSynchronizeOp>(&OpOf(r, pc).payload)) host.event = sync->event;
      int32_t unused_op = -1;
      find_record(r.host.wait_target, host.record_stream, unused_op);
      break;
    }
    case HostWait::kQueueFull:
      host.reason = HostBlockReason::kLaunchQueueFull;
      host.stream = static_cast<int32_t>(r.host.wait_target);
      host.since_ns = r.host.launch_blocked_since;
      break;
    case HostWait::kStopped:
      host.reason = HostBlockReason::kOutOfMemory;
      host.since_ns = r.host.clock;
      if (r.oom_caught) {  // waits for its OOM-flag collective (see EngineConfig)
        host.oom_caught = true;
        host.oom_sync_op_index = r.oom_resume_pc;
        host.stream = std::get<CollectiveOp>(OpOf(r, r.oom_resume_pc).payload).stream;
      }
      break;
    default: host.reason = HostBlockReason::kOther; break;
  }

  // Every issued collective with its per-communicator numbers (Flight Recorder counts
  // collectives and p2p apart); the lane index tells which ones are unfinished.
  std::vector<CommLaneState> lanes(r.lanes.size());
  for (size_t slot = 0; slot < r.comm_of_slot.size(); ++slot) {
    lanes[static_cast<size_t>(r.lane_of_slot[slot])].communicator = r.comm_of_slot[slot];
  }
  for (size_t lane = 0; lane < r.lanes.size(); ++lane) {
    lanes[lane].issued = r.lanes[lane].issued;
    lanes[lane].completed = r.lanes[lane].completed;
  }
  std::unordered_map<int32_t, std::pair<int32_t, const QueueItem*>> queued;  // op index -> (stream, item)
  for (size_t i = 0; i < r.streams.size(); ++i) {
    for (const QueueItem& item : r.streams[i].queue) {
      if (item.op_index >= 0) queued[item.op_index] = {static_cast<int32_t>(i), &item};
    }
  }
  std::vector<int64_t> coll_count(r.lanes.size(), 0), p2p_count(r.lanes.size(), 0), lane_count(r.lanes.size(), 0);
  std::unordered_map<int32_t, PendingCollective> pending_at;  // op index -> pending collective
  // A rank that caught an OOM skipped the ops after it up to its oom_sync collective, which
  // it issued before it halted (its pc points back at the failing op then).
  const int32_t issued_end = r.oom_caught && r.halted ? r.oom_resume_pc + 1
                             : at_op                 ? pc
                                                     : static_cast<int32_t>(r.program->ops.size());
  for (int32_t index = 0; index < issued_end; ++index) {
    if (r.oom_caught && index > r.oom_pc && index < r.oom_resume_pc) continue;  // skipped
    const auto* coll = std::get_if<CollectiveOp>(&OpOf(r, index).payload);
    if (coll == nullptr) continue;
    const auto lane = static_cast<size_t>(r.lane_of_slot[static_cast<size_t>(coll->comm)]);
    const bool p2p = coll->type == CollectiveType::kSend || coll->type == CollectiveType::kRecv;
    (p2p ? p2p_count : coll_count)[lane]++;
    if (lane_count[lane]++ < r.lanes[lane].completed) continue;
    PendingCollective pending;
    pending.communicator = lanes[lane].communicator;
    pending.seq = coll_count[lane];
    pending.p2p_seq = p2p_count[lane];
    pending.type = coll->type;
    pending.bytes = coll->bytes;
    pending.dtype = coll->dtype;
    pending.peer = coll->peer;
    auto it = queued.find(index);
    if (it != queued.end()) {
      pending.enqueued_ns = it->second.second->ready_ns - config_.launch_overhead_ns;
      const StreamState& s = r.streams[static_cast<size_t>(it->second.first)];
      if (&s.queue.front() == it->second.second && s.at_rendezvous) pending.arrived_ns = s.arrived_ns;
    }
    pending_at[index] = pending;
    blocked.pending.emplace_back(index, pending);
  }
  blocked.lanes = lanes;

  for (size_t i = 0; i < r.streams.size(); ++i) {
    const StreamState& s = r.streams[i];
    if (s.queue.empty()) continue;
    BlockedStream state;
    state.stream = static_cast<int32_t>(i);
    state.queued = static_cast<int64_t>(s.queue.size());
    const QueueItem& head = s.queue.front();
    state.op_index = head.op_index;
    if (head.op_index < 0) {
      blocked.streams.push_back(fmt::format("stream '{}': an allocator event", r.program->streams[i].name));
      state.reason = StreamWaitReason::kAllocatorEvent;
      blocked.stream_states.push_back(state);
      continue;
    }
    state.op_id = OpOf(r, head.op_index).id;
    if (auto it = pending_at.find(head.op_index); it != pending_at.end()) state.collective = it->second;
    if (s.at_rendezvous) {
      state.reason = StreamWaitReason::kRendezvous;
      state.since_ns = s.arrived_ns;
    } else if (s.waiting_turn) {
      state.reason = StreamWaitReason::kCommunicatorTurn;
      state.since_ns = s.waiting_since;
      // The communicator's next op on this rank: the unfinished one with the lowest lane index.
      const auto& coll = std::get<CollectiveOp>(OpOf(r, head.op_index).payload);
      const int32_t lane = r.lane_of_slot[static_cast<size_t>(coll.comm)];
      for (const auto& [index, pending] : blocked.pending) {
        const auto& other = std::get<CollectiveOp>(OpOf(r, index).payload);
        if (r.lane_of_slot[static_cast<size_t>(other.comm)] != lane) continue;
        auto where = queued.find(index);
        if (where != queued.end()) {
          state.turn_stream = where->second.first;
          state.turn_op_index = index;
        }
        break;
      }
    } else if (s.waiting_record >= 0) {
      state.reason = StreamWaitReason::kEventRecord;
      state.since_ns = s.waiting_since;
      if (const auto* wait = std::get_if<traces::StreamWaitEventOp>(&OpOf(r, head.op_index).payload)) state.event = wait->event;
      find_record(s.waiting_record, state.record_stream, state.record_op_index);
    }
    std::string why = s.at_rendezvous    ? " (waiting for peers)"
                      : s.waiting_turn   ? " (waiting for an earlier op of its communicator)"
                      : s.waiting_record >= 0 ? " (waiting for an event)"
                                              : "";
    blocked.streams.push_back(fmt::format("stream '{}': {}{}", r.program->streams[i].name,
                                          DescribeOp(r, head.op_index), why));
    blocked.stream_states.push_back(std::move(state));
  }
  return blocked;
}

}  // namespace

StatusOr<SimulationResult> Simulate(const traces::Schedule& schedule, const CostProvider& costs,
                                    const EngineConfig& config, EngineObserver* observer) {
  Engine engine(schedule, costs, config, observer);
  return engine.Run();
}

}  // namespace shardscope::sim

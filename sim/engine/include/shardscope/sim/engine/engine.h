// The discrete-event engine: executes a schedule on simulated GPUs.
//
// Per rank it models the host thread, FIFO CUDA streams, events, and collectives with
// rendezvous. Time is int64 nanoseconds; events are ordered by (time, sequence number), so
// the same input gives the same output bit for bit.
//
// Semantics (../docs/ARCHITECTURE.md has the long form):
// - The host walks its program in order and runs ahead of the GPU: a launch (kernel,
//   collective, memcpy) costs `launch_overhead_ns` of host time and enqueues the work on its
//   stream, ready when the launch returns. The host blocks only on stream / device / event
//   synchronization.
// - A stream runs its items in FIFO order; streams of one GPU run concurrently. Compute
//   kernels running concurrently on one GPU share it fairly (each runs at 1/n speed): a
//   roofline-costed kernel is assumed to saturate the resource it is bound by.
// - An event wait blocks its stream until the record it captured (the most recent record
//   issued before the wait, in program order) has executed.
// - A collective starts on its members only when every member has reached it at the head
//   of its stream (rendezvous); collectives of one communicator are serialized on each
//   member whatever stream they are issued on (NCCL orders all work of a communicator).
//   Members must enter one instance with the same type, size and dtype, else it never starts
//   (a mismatch the hang report explains); all_to_all alone may carry different sizes per
//   rank (uneven splits), and runs as long as its largest member's.
// - Each collective instance records which member arrived last and how long the others
//   waited for it (RankStats::last_arrivals, SimulationResult::straggler).
// - Contention: while a collective runs on a GPU, compute kernels there run at
//   1/(1+compute_slowdown); a collective runs at 1/(1+comm_slowdown) while any member GPU
//   runs compute. Rates change mid-kernel; remaining work is carried over.
// - Links (EngineConfig::links): collectives of the communicators crossing one link share its
//   bandwidth, max-min fair, each demanding the traffic its algorithm puts there
//   (sim/models/link_traffic.h); with none configured every communicator has a link of its own.
//
// How fast running work goes is decided by the resource models (sim/models/resource_model.h,
// after SimGrid's Model / Action): GPU compute sharing, compute-communication contention and
// network links. Each activity knows its remaining work and rate; the model that runs it
// queues its completion, and the event loop advances to the earliest of the models'
// completions and its own events, without knowing which models exist. A rate change re-queues
// the activity and invalidates its old completion.
#ifndef SHARDSCOPE_SIM_ENGINE_H_
#define SHARDSCOPE_SIM_ENGINE_H_

#include <cstdint>
#include <cstddef>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <string>
#include <vector>

#include "shardscope/sim/models/caching_allocator.h"
#include "shardscope/sim/models/cost_provider.h"
#include "shardscope/sim/models/gpu_sharing_model.h"
#include "shardscope/sim/models/link_model.h"
#include "shardscope/sim/models/nccl_model.h"
#include "shardscope/traces/schedule.h"
#include "shardscope/base/status.h"

namespace shardscope::sim {

// The caching allocator on the timeline (one per rank). Allocations are decided when the
// host issues them, at the host's time; a malloc that had to free cached segments (the
// retry path) blocks the host like a device synchronize (cudaFree synchronizes the device);
// an out-of-memory stops the rank at that op, as an uncaught torch.OutOfMemoryError does.
struct MemoryConfig {
  bool enabled = false;
  AllocatorConfig allocator;
  std::vector<int64_t> capacity_bytes;  // per rank: device memory the allocator may use
  int64_t device_alloc_ns = 0;          // host time of one cudaMalloc
  int64_t device_free_ns = 0;           // host time of one cudaFree
  // Start from the allocator state after one step (steady state): the rank's allocations and
  // frees are replayed once, untimed, before the simulated step; tensors still live after it
  // (model and optimizer states) stay allocated, and the simulated step skips allocating
  // them again. Peaks, retries and OOMs of that first step count, as they do in
  // torch.cuda.max_memory_reserved(). A rank whose first step runs out of memory is simulated
  // cold instead, so the OOM happens on the timeline.
  bool warm_start = true;
  bool record_history = false;          // keep snapshots, histories and the live tensors at the
                                        // reserved peak (for the observer's ranks)
  // cuBLAS workspaces the caching allocator serves (PyTorch >= 1.13, CublasHandlePool.cpp
  // setWorkspaceForHandle: one per (handle, stream) at that handle's first GEMM on the stream):
  // `gemm_workspaces` blocks of `gemm_workspace_bytes` on the stream of the program's first
  // GEMM, allocated when the warm-up step reaches that GEMM (before the step when a rank starts
  // cold) and never freed. None for a program without GEMMs.
  int64_t gemm_workspace_bytes = 0;
  int32_t gemm_workspaces = 0;
};

// A fault injected into one run (`shardscope check`): the allocation op `op_id` of `rank`
// fails as an out-of-memory, whatever the allocator would have said. The rank stops there as
// on a real OOM (OomInfo::injected is set); its peers wait at their next collective with it.
struct InjectedOom {
  int32_t rank = 0;
  int64_t op_id = 0;   // an AllocateOp's Op::id in that rank's program
};

struct EngineConfig {
  int64_t launch_overhead_ns = 0;   // host time per kernel / collective / memcpy launch
  // Work items (launches, event records and waits) a stream holds before the next launch
  // onto it blocks the host until the oldest retires; 0 = unlimited. See HostConfig.
  int32_t max_queued_per_stream = 0;
  double compute_slowdown = 0;      // see the header comment
  double comm_slowdown = 0;
  ComputeSharing compute_sharing = ComputeSharing::kFairShare;  // gpu_sharing_model.h
  // Links shared by the collectives of the communicators that cross them (link_model.h;
  // sim/simulate's cluster_links.h builds them from the cluster); empty: each communicator on
  // its own unlimited link (no sharing). A bad link is kInvalidInput. `link_topologies`: each
  // communicator's shape on the cluster, which NVLink and NIC links need (link_traffic.h).
  std::vector<LinkSpec> links;
  std::vector<CommTopology> link_topologies;
  MemoryConfig memory;
  // The OOM policy (plan `oom.policy`). false = raise: an OOM stops the rank (an uncaught
  // torch.OutOfMemoryError), its peers wait at their next collective with it. true =
  // catch_and_sync, Composer's automicrobatching (composer/trainer/trainer.py
  // Trainer._train_batch catches the OOM and all-reduces an OOM flag): the rank skips ahead
  // to the next CollectiveOp::oom_sync in its program (the ops in between are not executed)
  // and issues it; its peers reach that agreement point in their own program order. When it
  // completes with a member that had run out of memory, every member stops there cleanly
  // (RankStats::oom_handled, SimulationResult::oom_agreed): all ranks retry with a smaller
  // micro-batch. A peer that issues another collective on that communicator first (a sync
  // point missing) mismatches the rendezvous: a hang. With no oom_sync collective after the
  // failing op the rank stops as under raise.
  bool oom_catch_and_sync = false;
  // Faults (both cost nothing when unset):
  std::optional<InjectedOom> inject_oom;
  // rank -> factor in [1, kMaxRankSlowdownFactor] (cost_provider.h): that rank's kernels and
  // memcpys take factor x their cost (a
  // straggler: thermal throttling, a slow host, a noisy neighbour). Collectives run at their
  // own speed; peers only wait for the straggler to arrive.
  std::map<int32_t, double> rank_slowdown;
  // Called now and then with the fraction of host ops retired so far (for progress bars).
  std::function<void(double)> progress;
  // Simulate one rank per class of ranks whose timelines are identical (rank_classes.h) and
  // give every rank its class's results. Exact: the results equal the full simulation's. A
  // run that hangs is described rank by rank from its classes (SymmetryReduction::
  // hang_described); one that agrees on an OOM, hangs at a mismatched rendezvous or hangs
  // under an observer is simulated again in full (its report names ranks, communicators and
  // arrival orders one by one). false: every rank is simulated (`--all-ranks`).
  bool reduce_symmetry = true;
  // false: a reduced run that hangs or agrees on an OOM keeps its reduced result instead of
  // being simulated again in full. Every RankStats is still exact (memory.oom and finished
  // included); `blocked` and `rendezvous` are set only where SymmetryReduction::hang_described.
  // For callers that only need the verdict (`tune`).
  bool rerun_hangs_in_full = true;
};

// What the host thread spent a span of time on.
enum class HostSpanKind : uint8_t { kLaunch, kApiCall, kSynchronize, kHostWork };

struct HostSpan {
  int32_t rank = 0;
  int32_t op_index = 0;       // into the rank's Program::ops
  HostSpanKind kind = HostSpanKind::kLaunch;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  int64_t correlation = -1;   // launch -> device span link (unique per rank)
};

// A collective as it ran.
struct CollectiveRun {
  int32_t communicator = 0;   // index into Schedule::communicators
  int64_t seq = 0;            // per-communicator sequence number, from 0
  CollectiveCost cost;        // at full speed (before contention)
};

struct DeviceSpan {
  int32_t rank = 0;
  int32_t stream = 0;
  int32_t op_index = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  int64_t correlation = -1;
  const CollectiveRun* collective = nullptr;  // set for collectives
};

// Receives spans as they complete (not sorted). Only ranks for which WantsRank() is true.
class EngineObserver {
 public:
  virtual ~EngineObserver() = default;
  virtual bool WantsRank(int32_t rank) const = 0;
  virtual void OnHostSpan(const HostSpan& span) = 0;
  virtual void OnDeviceSpan(const DeviceSpan& span) = 0;
  // Allocator state after an allocation or free issued at `ts_ns` (memory enabled only).
  virtual void OnMemory(int32_t /*rank*/, int64_t /*ts_ns*/, int64_t /*allocated*/, int64_t /*reserved*/) {}
  // A notable allocator event: "segment_alloc", "alloc_retry", "oom".
  virtual void OnMemoryEvent(int32_t /*rank*/, int64_t /*ts_ns*/, std::string_view /*what*/,
                             int64_t /*bytes*/) {}
  // The engine's clock left an instant (and the run ended): every call made while events of
  // that instant were processed has been made. Within an instant the calls of one rank's host
  // thread, and of each of its streams, come in their own order, but how the calls of different
  // ranks and streams interleave depends on the order same-time events were processed in, which
  // differs between the full and the reduced simulation (EngineConfig::reduce_symmetry): an
  // observer whose output must not depend on it orders each instant's calls by rank and lane.
  virtual void OnInstantDone() {}
};

// Where a rank ran out of memory.
struct OomInfo {
  int64_t op_id = 0;
  int64_t time_ns = 0;
  int64_t requested_bytes = 0;
  int64_t free_bytes = 0;            // device memory not held by the allocator
  int64_t largest_free_block = 0;    // the largest cached block
  bool injected = false;             // EngineConfig::inject_oom, not the allocator
};

struct RankMemory {
  MemoryStats stats;                 // torch.cuda.memory_stats() at the end of the run
  int64_t capacity_bytes = 0;
  int64_t fragmentation_bytes = 0;   // reserved - allocated when reserved peaked
  std::optional<OomInfo> oom;
  // At the moment reserved memory peaked: allocated bytes and the live tensors (TensorIndex
  // into the rank's program, requested bytes). Kept for ranks with record_history.
  int64_t allocated_at_reserved_peak = 0;
  std::vector<std::pair<int32_t, int64_t>> live_at_reserved_peak;
  // The same when allocated memory peaked: what the memory holds when it is fullest.
  std::vector<std::pair<int32_t, int64_t>> live_at_allocated_peak;
  // Kept for ranks with record_history (the trace's ranks):
  std::vector<SnapshotSegment> snapshot;
  std::vector<TraceEntry> history;
  std::vector<int64_t> history_time_ns;  // when each history entry happened
};

struct StreamStats {
  int64_t busy_ns = 0;        // sum of op durations on the stream (kernels, collectives, copies)
  int64_t ops = 0;
};

struct RankStats {
  int64_t end_ns = 0;                 // when the rank's last host op or device op finished
  int64_t step_end_ns = 0;            // the same, leaving out checkpoint-phase ops
  int64_t compute_ns = 0;             // time with >= 1 compute kernel running
  int64_t comm_ns = 0;                // time with >= 1 collective running
  int64_t overlap_ns = 0;             // time with both (HTA: comm ∩ compute)
  int64_t host_blocked_ns = 0;        // host waiting in synchronizations
  int64_t host_busy_ns = 0;           // launches, API calls and host work
  std::vector<StreamStats> streams;   // per StreamIndex
  uint64_t timeline_hash = 0;         // equal for ranks whose timelines are identical
  bool finished = false;
  // catch_and_sync: the rank stopped cleanly at an OOM-flag agreement that some member's
  // out-of-memory error triggered (its own, in memory.oom, or a peer's): not a hang.
  bool oom_handled = false;
  // Straggler attribution over the collectives (and send/recv pairs) that started: a member
  // arrives when the collective reaches its stream's head and its communicator's turn; the
  // instance starts when the last member arrives (t_last). A member that arrived last alone
  // made each other member i wait t_last - t_i; when several arrive last together nobody is
  // late and nothing is attributed.
  int64_t collectives = 0;                // instances this rank took part in
  int64_t last_arrivals = 0;              // ... at which it arrived last, alone
  int64_t collective_wait_caused_ns = 0;  // sum over those of its peers' waits for it
  RankMemory memory;                  // when memory is simulated
};

// Below this much waiting caused in total, no rank is named a straggler (ranks whose
// programs are identical but whose timing differs by rounding stay quiet).
inline constexpr int64_t kStragglerMinWaitNs = 1'000;

// The rank that made its peers wait the longest (RankStats::collective_wait_caused_ns; ties:
// the lowest rank), when that is at least kStragglerMinWaitNs.
struct Straggler {
  int32_t rank = -1;
  int64_t last_arrivals = 0;
  int64_t collectives = 0;            // instances it took part in
  int64_t wait_caused_ns = 0;
};

// catch_and_sync: the OOM-flag collective at which the ranks agreed that some rank ran out
// of memory (every member stopped when it completed).
struct OomAgreement {
  int32_t communicator = -1;          // index into Schedule::communicators
  int64_t seq = 0;                    // 1-based per-communicator sequence number
  int64_t op_id = -1;                 // the oom_sync collective's op id on the first OOM'd rank
  int64_t time_ns = 0;                // when it completed
  std::vector<int32_t> oom_ranks;     // members that had run out of memory
  std::vector<int32_t> ranks;         // every member
};

// Why the host thread of an unfinished rank stopped.
enum class HostBlockReason : uint8_t {
  kFinished,           // issued its whole program (its streams still have work)
  kStreamSynchronize,  // cudaStreamSynchronize on `stream`
  kDeviceSynchronize,  // cudaDeviceSynchronize (or an allocator retry / cudaFree)
  kEventSynchronize,   // cudaEventSynchronize on `event`
  kOutOfMemory,        // the allocator failed at `op_index`: the rank issues nothing more
  kLaunchQueueFull,    // a launch onto `stream` waits for its queue to drain
  kOther,
};

// Why a stream's head item cannot run.
enum class StreamWaitReason : uint8_t {
  kEventRecord,       // a wait on a record of `event` that has not executed (queued on
                      // `record_stream` at `record_op_index`)
  kCommunicatorTurn,  // a collective behind an earlier, unfinished op of its communicator
  kRendezvous,        // a collective that arrived and waits for the other members
  kAllocatorEvent,    // an allocator (record_stream) event
  kOther,
};

// A collective an unfinished rank has issued but not completed.
struct PendingCollective {
  int32_t communicator = -1;        // index into Schedule::communicators
  // Per (rank, communicator), 1-based, as Flight Recorder's collective_seq_id (p2p ops are
  // numbered apart, in p2p_seq, as its p2p_seq_id).
  int64_t seq = 0;
  int64_t p2p_seq = 0;
  traces::CollectiveType type = traces::CollectiveType::kAllReduce;
  int64_t bytes = 0;
  traces::DType dtype = traces::DType::kBFloat16;
  int32_t peer = -1;
  int64_t enqueued_ns = 0;          // when the host launched it
  int64_t arrived_ns = -1;          // when it reached its stream's head and its turn (-1: not yet)
};

struct BlockedStream {
  int32_t stream = 0;
  int32_t op_index = -1;            // the head item (-1: an allocator event)
  int64_t op_id = -1;
  int64_t queued = 0;               // items in the stream's queue
  StreamWaitReason reason = StreamWaitReason::kOther;
  int64_t since_ns = -1;            // when the head began to wait (-1: unknown, an allocator event)
  int32_t event = -1;               // kEventRecord
  int32_t record_stream = -1;       // kEventRecord: where the awaited record is queued
  int32_t record_op_index = -1;     //   (-1: an allocator event)
  std::optional<PendingCollective> collective;  // the head is a collective
  // kCommunicatorTurn: the stream holding the communicator's next op on this rank, and it.
  int32_t turn_stream = -1;
  int32_t turn_op_index = -1;
};

struct BlockedHost {
  HostBlockReason reason = HostBlockReason::kOther;
  int32_t op_index = -1;            // the op the host is blocked in (-1: finished)
  int64_t op_id = -1;
  int32_t stream = -1;              // kStreamSynchronize, kLaunchQueueFull, a caught OOM
  int32_t event = -1;               // kEventSynchronize
  int32_t record_stream = -1;       // kEventSynchronize: where the awaited record is queued
  int64_t since_ns = 0;
  // kOutOfMemory under catch_and_sync: the error was caught (op_index is the op that ran out
  // of memory) and the rank waits in its OOM-flag collective, the op `oom_sync_op_index` on
  // `stream` (Composer reads the flag back with .item(), a host synchronization).
  bool oom_caught = false;
  int32_t oom_sync_op_index = -1;
};

// A rank's serialization lane of one communicator: collectives (and p2p) issued and completed.
struct CommLaneState {
  int32_t communicator = -1;
  int64_t issued = 0;
  int64_t completed = 0;
};

// Why a rank could not finish.
struct BlockedRank {
  int32_t rank = 0;
  std::string host;                   // what the host is blocked on, or "finished"
  std::vector<std::string> streams;   // per stream with pending work: its head op
  // The same, structured (collected once, when the run ends unfinished):
  BlockedHost host_state;
  std::vector<BlockedStream> stream_states;   // streams with pending work
  std::vector<CommLaneState> lanes;           // every communicator of the rank
  std::vector<std::pair<int32_t, PendingCollective>> pending;  // (op_index, collective):
                                              // every issued, unfinished collective, in issue order
};

// A collective some members reached while others did not (or reached with a different type,
// size or dtype: then it never starts).
struct PendingRendezvous {
  int32_t communicator = -1;
  int64_t seq = 1;                    // 1-based per-communicator sequence number
  struct Arrival {
    int32_t rank = 0;
    int32_t stream = 0;
    int32_t op_index = 0;
    traces::CollectiveType type = traces::CollectiveType::kAllReduce;
    int64_t bytes = 0;
    traces::DType dtype = traces::DType::kBFloat16;
  };
  std::vector<Arrival> arrived;
  bool mismatch = false;
};

// Per-rank results, indexed by rank. Ranks of one class of the symmetry reduction share one
// RankStats (memory stays flat in the world size); read it as a vector.
class RankResults {
 public:
  RankResults() = default;
  // One entry per rank.
  explicit RankResults(std::vector<RankStats> per_rank) : stats_(std::move(per_rank)) {}
  // `per_class[class_of_rank[r]]` is rank r's.
  RankResults(std::vector<RankStats> per_class, std::vector<int32_t> class_of_rank)
      : stats_(std::move(per_class)), class_of_rank_(std::move(class_of_rank)) {}

  size_t size() const { return class_of_rank_.empty() ? stats_.size() : class_of_rank_.size(); }
  bool empty() const { return size() == 0; }
  const RankStats& operator[](size_t rank) const {
    return class_of_rank_.empty() ? stats_[rank] : stats_[static_cast<size_t>(class_of_rank_[rank])];
  }
  // The distinct entries (one per class, or one per rank).
  const std::vector<RankStats>& distinct() const { return stats_; }

  class const_iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = RankStats;
    using difference_type = std::ptrdiff_t;
    using pointer = const RankStats*;
    using reference = const RankStats&;
    const_iterator(const RankResults* results, size_t rank) : results_(results), rank_(rank) {}
    reference operator*() const { return (*results_)[rank_]; }
    pointer operator->() const { return &(*results_)[rank_]; }
    const_iterator& operator++() {
      ++rank_;
      return *this;
    }
    const_iterator operator++(int) {
      const_iterator before = *this;
      ++rank_;
      return before;
    }
    bool operator==(const const_iterator& other) const { return rank_ == other.rank_; }

   private:
    const RankResults* results_;
    size_t rank_;
  };
  const_iterator begin() const { return const_iterator(this, 0); }
  const_iterator end() const { return const_iterator(this, size()); }

 private:
  std::vector<RankStats> stats_;
  std::vector<int32_t> class_of_rank_;  // empty: one entry per rank
};

// How many ranks the engine simulated (EngineConfig::reduce_symmetry).
struct SymmetryReduction {
  int32_t simulated_ranks = 0;        // ranks simulated (one per class), or the world size
  bool reduced = false;               // fewer than the world size, the results expanded
  // Why the run was not reduced, when it was asked to be ("" when it was, or when every rank
  // differs): "rank 3 binds communicators 'a' and 'b' of one class", "the reduced run hung:
  // simulated again in full".
  std::string why_not;
  // A reduced run that hung: `blocked` and `rendezvous` describe every rank, expanded from its
  // class (false: they are empty, and Simulate runs it again in full unless told not to).
  bool hang_described = false;
};

struct SimulationResult {
  int64_t makespan_ns = 0;            // max over ranks of end_ns
  int64_t step_ns = 0;                // max over ranks of step_end_ns: the training step
                                      // without a checkpoint that follows it
  RankResults ranks;
  bool hung = false;
  std::vector<BlockedRank> blocked;   // non-empty when hung
  std::vector<PendingRendezvous> rendezvous;  // when hung: collectives partly arrived
  std::optional<OomAgreement> oom_agreed;     // catch_and_sync: the first OOM agreement
  std::optional<Straggler> straggler;         // see Straggler
  int64_t ops_executed = 0;           // host ops retired over all ranks
  int64_t events_processed = 0;       // by the engine (fewer when the run was reduced)
  SymmetryReduction symmetry;
};

// Runs the whole schedule. The schedule must have passed ValidateSchedule. `observer` may
// be null.
StatusOr<SimulationResult> Simulate(const traces::Schedule& schedule, const CostProvider& costs,
                                    const EngineConfig& config, EngineObserver* observer);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_ENGINE_H_

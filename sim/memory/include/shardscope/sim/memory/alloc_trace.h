// Allocation traces: a sequence of caching-allocator calls (alloc, free, record_stream,
// empty_cache) with the allocator configuration and device size they ran under, so that
// one sequence can be replayed both through our CachingAllocator model (ReplayAllocTrace)
// and through PyTorch's real allocator on a GPU (scripts/gpu/replay_alloc_trace.py), and
// the two sets of torch.cuda.memory_stats() compared. The format is in docs/ALLOC_TRACE.md:
//
//   {"version": 1, "description": "...", "alloc_conf": "expandable_segments:False",
//    "memory_fraction": 1.0, "device_memory_bytes": 2147483648, "streams": 2,
//    "ops": [{"op": "alloc", "id": 0, "bytes": 1048576, "stream": 0},
//            {"op": "record_stream", "id": 0, "stream": 1},
//            {"op": "free", "id": 0},
//            {"op": "empty_cache"}]}
//
// Typical use:
//   SHARDSCOPE_ASSIGN_OR_RETURN(AllocTrace trace, ReadAllocTraceFile(path));
//   SHARDSCOPE_ASSIGN_OR_RETURN(AllocReplayResult result, ReplayAllocTrace(trace));
//   std::cout << AllocReplayResultToJson(trace, result);
#ifndef SHARDSCOPE_SIM_ALLOC_TRACE_H_
#define SHARDSCOPE_SIM_ALLOC_TRACE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "shardscope/sim/models/caching_allocator.h"
#include "shardscope/traces/schedule.h"
#include "shardscope/base/status.h"

namespace shardscope::sim {

inline constexpr int kAllocTraceVersion = 1;

// Ids name allocations: each alloc introduces a new id (never reused in a trace), which
// later ops refer to. A zero-byte alloc allocates nothing (PyTorch's raw_alloc returns
// nullptr for 0 bytes), and so does an alloc that ran out of memory; frees and
// record_streams of such ids do nothing, in both replays.
struct AllocTraceAlloc {
  int64_t id = 0;
  int64_t bytes = 0;
  int32_t stream = 0;
  bool operator==(const AllocTraceAlloc&) const = default;
};
struct AllocTraceFree {
  int64_t id = 0;
  bool operator==(const AllocTraceFree&) const = default;
};
// torch.Tensor.record_stream: the allocation is also used on `stream`.
struct AllocTraceRecordStream {
  int64_t id = 0;
  int32_t stream = 0;
  bool operator==(const AllocTraceRecordStream&) const = default;
};
// torch.cuda.empty_cache().
struct AllocTraceEmptyCache {
  bool operator==(const AllocTraceEmptyCache&) const = default;
};

using AllocTraceOp = std::variant<AllocTraceAlloc, AllocTraceFree, AllocTraceRecordStream,
                                  AllocTraceEmptyCache>;

// The allocator's state before the first op, for a trace recorded mid-run (a memory
// snapshot's trace starts when recording began): segments with their blocks in address
// order. A block with an id (>= 0) is allocated, `bytes` being its requested size, and
// later ops may free it or record_stream it; a block without one (-1) is free and cached.
struct AllocTraceInitialBlock {
  int64_t size = 0;
  int64_t id = -1;
  int64_t bytes = 0;
  bool operator==(const AllocTraceInitialBlock&) const = default;
};
struct AllocTraceInitialSegment {
  uint64_t address = 0;
  int32_t stream = 0;
  bool small = false;  // the small pool's 2 MiB segments; otherwise the large pool
  std::vector<AllocTraceInitialBlock> blocks;
  bool operator==(const AllocTraceInitialSegment&) const = default;
};

struct AllocTrace {
  int version = kAllocTraceVersion;
  std::string description;
  std::string alloc_conf;          // PYTORCH_CUDA_ALLOC_CONF, parsed by AllocatorConfig::Parse
  double memory_fraction = 1.0;    // torch.cuda.set_per_process_memory_fraction, in (0, 1]
  // The device the trace runs on. The allocator may hold at most
  // floor(memory_fraction * device_memory_bytes) bytes of segments.
  int64_t device_memory_bytes = 0;
  int32_t streams = 1;             // stream indices are 0 .. streams-1
  std::vector<AllocTraceOp> ops;
  // Optional (model-only: a GPU cannot be put in a recorded state). With either, the model's
  // device hands out `segment_addresses` in order (the addresses cudaMalloc returned when
  // the trace was recorded; then its own) and counts bytes exactly against
  // device_memory_bytes (MakeRecordedDeviceMemory); the initial segments count as in use.
  std::vector<AllocTraceInitialSegment> initial_segments;
  std::vector<uint64_t> segment_addresses;
  bool operator==(const AllocTrace&) const = default;
};

// Parses and validates a trace. `source` names the text in messages (a path, or
// "<string>"). Messages name the op index and key: unknown keys, wrong types, negative sizes,
// streams outside [0, streams), ids allocated twice, frees of unknown or freed ids, a
// record_stream of an id not live, an alloc_conf that AllocatorConfig::Parse rejects.
StatusOr<AllocTrace> ParseAllocTrace(std::string_view json, const std::string& source);
StatusOr<AllocTrace> ReadAllocTraceFile(const std::string& path);

// The canonical JSON form (one op per line, so diffs of bundled traces stay readable).
// ParseAllocTrace(AllocTraceToJson(t)) == t for every valid trace.
std::string AllocTraceToJson(const AllocTrace& trace);

struct AllocReplayOom {
  int64_t op_index = 0;     // index into AllocTrace::ops
  MallocOutcome outcome;    // what the allocator reported (requested bytes, free bytes ...)
};

struct AllocReplayResult {
  MemoryStats stats;                          // after the last op
  std::vector<AllocReplayOom> ooms;           // in op order
  std::vector<int64_t> reserved_after_op;     // reserved_bytes after each op (ops.size())
  // With AllocReplayOptions::record_history: the allocator's actions (its device trace) and
  // the index of the op that caused each, and its segments after the last op.
  std::vector<TraceEntry> history;
  std::vector<int64_t> history_op;
  std::vector<SnapshotSegment> final_segments;
};

struct AllocReplayOptions {
  bool record_history = false;
};

// Replays the ops through CachingAllocator with AllocatorConfig::Parse(alloc_conf) and
// memory_fraction, on MakeCapacityDeviceMemory(device_memory_bytes). Every event the
// allocator records has already completed: a replay launches no kernels, and neither does
// the GPU script, so the real events are complete by the time they are queried too. An OOM
// is a result, not an error; errors are only a trace that ParseAllocTrace would reject.
// With initial_segments, the allocator starts from them (CachingAllocator::Restore).
StatusOr<AllocReplayResult> ReplayAllocTrace(const AllocTrace& trace, const AllocReplayOptions& options = {});

// The result as JSON, with torch.cuda.memory_stats() key names
// ({"trace": ..., "memory_stats": {"reserved_bytes.all.peak": ...}, "oom_ops": [...]}), the
// form scripts/gpu/replay_alloc_trace.py --compare reads. `source` names the trace file.
std::string AllocReplayResultToJson(const AllocTrace& trace, const AllocReplayResult& result,
                                    const std::string& source);

// The allocate/free ops of `rank`'s program, in program order, as a trace: each AllocateOp
// becomes an alloc with a fresh id on the op's stream index, each FreeOp frees the tensor's
// live id. Tensors never freed stay allocated at the end (as in the program). Default
// allocator configuration. `rank` must be in [0, schedule.world_size()) and the schedule
// valid (ValidateSchedule); otherwise the trace has no ops.
AllocTrace AllocTraceFromSchedule(const traces::Schedule& schedule, int32_t rank,
                                  int64_t device_memory_bytes);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_ALLOC_TRACE_H_

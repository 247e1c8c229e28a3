// Real memory snapshots (torch.cuda.memory._snapshot(), written by _dump_snapshot as a
// pickle) replayed through the CachingAllocator model, decision by decision.
//
// A snapshot holds the allocator's final state (`segments`, every block with its state) and
// the actions that led to it (`device_traces`: alloc, free_requested, free_completed,
// segment_alloc, segment_free, ...). Recording may have begun mid-run, so the state at the
// start of the trace is the final state with the trace undone (the walk memory_viz's
// "Allocator State History" makes backwards from the final state). The replay
//   1. rebuilds that initial state (SnapshotToAllocTrace),
//   2. turns the recorded calls (alloc, free_requested, empty_cache) into an allocation trace
//      with the recorded segment addresses, so the model's cudaMalloc returns what the driver
//      returned (ties between equal-size cached blocks are broken by address in PyTorch),
//   3. replays it with the allocator options from `allocator_settings`, and compares the
//      model's actions with the recorded ones one by one (ReplaySnapshot), then the final
//      segments.
// docs/ALLOC_TRACE.md describes the rules (how the state is rebuilt, how capacity is
// inferred, what is not modelled).
//
//   SHARDSCOPE_ASSIGN_OR_RETURN(auto doc, traces::ReadPickleFile(path));
//   SHARDSCOPE_ASSIGN_OR_RETURN(RecordedSnapshot snapshot, ReadMemorySnapshot(doc->root(), path));
//   SHARDSCOPE_ASSIGN_OR_RETURN(SnapshotReplay replay, ReplaySnapshot(snapshot, {}));
//   std::cout << SnapshotReplayText(snapshot, replay, path);
#ifndef SHARDSCOPE_ANALYSIS_MEMORY_SNAPSHOT_H_
#define SHARDSCOPE_ANALYSIS_MEMORY_SNAPSHOT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardscope/sim/memory/alloc_trace.h"
#include "shardscope/sim/models/caching_allocator.h"
#include "shardscope/base/pickle.h"
#include "shardscope/base/status.h"

namespace shardscope::sim {

// One entry of device_traces[device]. `stream` is the recorded cudaStream_t value.
struct RecordedAction {
  int64_t index = 0;  // position in device_traces[device]
  std::string action;
  uint64_t address = 0;     // addr; for "oom", 0 (the entry has device_free instead)
  int64_t size = 0;         // requested bytes for alloc/free_*, segment bytes, rounded bytes for oom
  int64_t stream = 0;
  int64_t device_free = 0;  // oom only: what cudaMemGetInfo reported free
};

struct RecordedBlock {
  uint64_t address = 0;
  int64_t size = 0;
  int64_t requested_size = 0;
  std::string state;  // active_allocated, active_pending_free, inactive
};

struct RecordedSegment {
  uint64_t address = 0;
  int64_t total_size = 0;
  int64_t stream = 0;
  std::string segment_type;  // small, large
  bool is_expandable = false;
  std::vector<RecordedBlock> blocks;
};

struct RecordedSnapshot {
  int32_t device = 0;                     // the device replayed
  std::vector<RecordedSegment> segments;  // that device's final segments, in file order
  std::vector<RecordedAction> trace;      // device_traces[device]
  // PYTORCH_CUDA_ALLOC_CONF equivalent of allocator_settings (max_split_size,
  // garbage_collection_threshold, expandable_segments, roundup_power2_divisions, and
  // max_non_split_rounding_mb from the recorded PYTORCH_CUDA_ALLOC_CONF string when it
  // parses); "" without allocator_settings (older PyTorch): the defaults.
  std::string alloc_conf;
  bool has_allocator_settings = false;
};

// Parses a snapshot pickle (traces::ParsePickle; PyTorch pickles C++ frames with unknown
// lines as SIZE_MAX, which the reader gives back as -1).
StatusOr<std::unique_ptr<traces::PickleDocument>> ParseMemorySnapshotPickle(std::string_view bytes,
                                                                            std::string_view source);
StatusOr<std::unique_ptr<traces::PickleDocument>> ReadMemorySnapshotPickleFile(const std::string& path);

// Reads a snapshot from its unpickled root. `device` < 0 picks the first device whose trace
// is not empty (device 0 when none is). Errors (kInvalidInput) name `source` and the key
// path ("segments[3].blocks[2].size: expected int, got str").
StatusOr<RecordedSnapshot> ReadMemorySnapshot(const traces::PickleObject& root, std::string_view source,
                                              int32_t device = -1);

struct SnapshotReplayOptions {
  // What cudaMalloc may hand the allocator in all (bytes); 0: inferred (InferredCapacity).
  int64_t device_memory_bytes = 0;
};

// The allocator state at the start of the trace and the recorded calls, as an allocation
// trace (initial_segments, segment_addresses, ops; streams renumbered in the order of their
// cudaStream_t values, which is the order PyTorch's block sets compare them in), plus how
// the capacity was chosen.
struct SnapshotAllocTrace {
  AllocTrace trace;
  std::vector<int64_t> streams;  // index -> recorded cudaStream_t value
  std::string capacity_source;   // "--device-memory-bytes", "oom at device_traces[0][12]", ...
  int64_t initial_reserved_bytes = 0;
  int64_t initial_allocated_blocks = 0;
  // Indices into `trace`'s device trace of segment_free bursts inside a malloc (the
  // release-and-retry path), counted as retries.
  std::vector<int64_t> retry_bursts;
  // Frees completed later than requested (record_stream: the block waited for other
  // streams) are replayed when they complete, since only then does the block return to the
  // pool: the recorded free_requested left out of the comparison (indices into the device
  // trace, ascending), and the free ops whose model free_requested is left out (indices
  // into trace.ops, ascending). A free_completed whose request preceded recording is one too.
  std::vector<int64_t> deferred_free_requests;
  std::vector<int64_t> deferred_free_ops;
};
StatusOr<SnapshotAllocTrace> SnapshotToAllocTrace(const RecordedSnapshot& snapshot,
                                                  const SnapshotReplayOptions& options);

struct SnapshotDivergence {
  int64_t index = 0;  // into device_traces[device]; the trace's length for the final state
  std::string what;   // in words
  std::optional<RecordedAction> recorded;  // the actions compared there (absent past an end)
  std::optional<TraceEntry> model;
};

struct RecordedModelCount {
  int64_t recorded = 0;
  int64_t model = 0;
};

struct SnapshotReplay {
  SnapshotAllocTrace converted;
  bool exact = false;
  int64_t actions = 0;  // recorded actions compared ("snapshot" markers left out)
  RecordedModelCount segment_allocs, segment_frees, alloc_retries, peak_reserved_bytes;
  std::optional<SnapshotDivergence> first_divergence;
  // Both action sequences, for context around a divergence; model streams are indices into
  // converted.streams.
  std::vector<RecordedAction> recorded;
  std::vector<TraceEntry> model;
};

StatusOr<SnapshotReplay> ReplaySnapshot(const RecordedSnapshot& snapshot, const SnapshotReplayOptions& options);

// {"verdict": "exact"|"diverges", "actions": n, "segment_allocs": {"recorded": n, "model": n},
//  "segment_frees": {...}, "alloc_retries": {...}, "peak_reserved_bytes": {...},
//  "first_divergence": null | {"index": i, "what": "...", "recorded": {...}|null, "model": {...}|null},
//  ...}: docs/ALLOC_TRACE.md.
std::string SnapshotReplayJson(const RecordedSnapshot& snapshot, const SnapshotReplay& replay,
                               const std::string& source);
// The verdict, the counts side by side, and the first divergence with a few actions around it.
std::string SnapshotReplayText(const RecordedSnapshot& snapshot, const SnapshotReplay& replay,
                               const std::string& source);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_ANALYSIS_MEMORY_SNAPSHOT_H_

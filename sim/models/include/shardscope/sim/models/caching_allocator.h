// PyTorch's CUDA caching allocator policy (c10/cuda/CUDACachingAllocator.cpp, current main),
// without CUDA: the same rounding, pools, per-stream best fit, splitting and merging,
// max_split_size, roundup_power2_divisions, garbage collection, expandable segments,
// record_stream deferral and the malloc fallback chain with its statistics.
//
// The policy knows no time. Device memory sits behind DeviceMemory (the simulator gives a
// capacity, the runtime cudaMalloc/cudaFree); stream-ordered events behind StreamEvents (the
// engine answers whether work issued on a stream has finished). Each call reports what it
// did (segments allocated and released, synchronizations), so a caller can charge time for
// it. Names of statistics follow torch.cuda.memory_stats().
#ifndef SHARDSCOPE_SIM_CACHING_ALLOCATOR_H_
#define SHARDSCOPE_SIM_CACHING_ALLOCATOR_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardscope/base/status.h"

namespace shardscope::sim {

inline constexpr int64_t kMiB = int64_t{1} << 20;

// PYTORCH_CUDA_ALLOC_CONF (c10/core/AllocatorConfig.h, CUDAAllocatorConfig).
struct AllocatorConfig {
  int64_t max_split_size = std::numeric_limits<int64_t>::max();  // max_split_size_mb; max = unlimited
  int64_t max_non_split_rounding = 20 * kMiB;                     // max_non_split_rounding_mb
  // roundup_power2_divisions: divisions for each power-of-two interval, indexed by
  // floor(log2(size)) - 20 clamped to [0, 15] (AllocatorConfig::roundup_power2_divisions):
  // index 0 covers every size below 2 MiB, 1: [2, 4) MiB, ..., 15: >= 32 GiB. Missing
  // entries, 0 and 1 mean plain 512 B rounding; empty = plain 512 B rounding everywhere.
  // Parse always fills 16 entries.
  std::vector<int64_t> roundup_power2_divisions;
  double garbage_collection_threshold = 0;  // 0 = off; needs memory_fraction < 1 to act
  bool expandable_segments = false;
  // torch.cuda.set_per_process_memory_fraction. PyTorch's `set_fraction` flag is modelled
  // as memory_fraction < 1: a fraction of exactly 1.0 counts as "never set" (the limit it
  // would impose equals the capacity anyway; only garbage collection would differ).
  // Not a PYTORCH_CUDA_ALLOC_CONF key: Parse leaves it at 1.
  double memory_fraction = 1.0;

  // Parses "max_split_size_mb:128,expandable_segments:True,...". Errors name the key.
  // Accepts every key PyTorch's native allocator accepts; backend must be "native" and
  // the keys that do not change the device policy (release_lock_on_cudamalloc, pinned_*)
  // are validated and ignored.
  static StatusOr<AllocatorConfig> Parse(std::string_view conf);
};

// Device memory beneath the allocator. Map/Unmap bytes count toward the same capacity as
// Allocate/Release (physical memory); the virtual ranges of expandable segments are
// reserved by the allocator itself, above 2^46, so they never collide with Allocate's.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // cudaMalloc: false when the device cannot provide `bytes`.
  virtual bool Allocate(int64_t bytes, uint64_t* address) = 0;
  // cudaFree.
  virtual void Release(uint64_t address, int64_t bytes) = 0;
  // Expandable segments: map / unmap physical pages into a reserved virtual range.
  virtual bool Map(int64_t bytes) = 0;
  virtual void Unmap(int64_t bytes) = 0;
  virtual int64_t Capacity() const = 0;
};

// A device of fixed capacity, with addresses handed out like cudaMalloc would (aligned,
// never overlapping). Used by the simulator. Addresses start at 4 GiB, are 2 MiB aligned
// (a GPU's large page; cudaMalloc guarantees 256 B at least) and come first-fit from the
// lowest free address, so released ranges are reused. Usage counts whole 2 MiB pages.
std::unique_ptr<DeviceMemory> MakeCapacityDeviceMemory(int64_t capacity_bytes);

// A device whose cudaMalloc returns recorded addresses: the i-th successful Allocate gets
// addresses[i], and once they run out, addresses above every recorded one (2 MiB aligned).
// It refuses an Allocate or Map that would take its usage past `capacity_bytes`, counting
// bytes exactly (no page rounding: a recorded segment's size is what the driver gave).
// `used_bytes` is what is already in use when it starts (segments handed to
// CachingAllocator::Restore). Used to replay a recorded trace (docs/ALLOC_TRACE.md).
std::unique_ptr<DeviceMemory> MakeRecordedDeviceMemory(int64_t capacity_bytes, int64_t used_bytes,
                                                       std::vector<uint64_t> addresses);

using AllocStream = int32_t;
using EventToken = int64_t;

// Stream-ordered events for record_stream: the allocator records one on every stream that
// used a block when the block is freed, and returns the block to its pool once all have
// completed (CUDACachingAllocator insert_events / process_events).
class StreamEvents {
 public:
  virtual ~StreamEvents() = default;
  virtual EventToken Record(AllocStream stream) = 0;
  virtual bool Query(EventToken event) = 0;
  // Blocks until the event has completed (synchronize_and_free_events on the retry path).
  virtual void Synchronize(EventToken event) = 0;
};

// Events that have completed when queried: for runs of the allocator with no kernels behind
// them (an allocation trace's replay, the initialization phase on one stream).
class CompletedStreamEvents final : public StreamEvents {
 public:
  EventToken Record(AllocStream /*stream*/) override { return next_++; }
  bool Query(EventToken /*event*/) override { return true; }
  void Synchronize(EventToken /*event*/) override {}

 private:
  EventToken next_ = 0;
};

// torch.cuda.memory_stats() ("all" pool aggregates) that the reports use.
struct MemoryStats {
  int64_t allocated_bytes = 0, allocated_bytes_peak = 0;
  int64_t reserved_bytes = 0, reserved_bytes_peak = 0;
  int64_t active_bytes = 0, active_bytes_peak = 0;
  int64_t inactive_split_bytes = 0, inactive_split_bytes_peak = 0;
  int64_t requested_bytes = 0, requested_bytes_peak = 0;
  int64_t segment = 0, segment_peak = 0;
  // Counts (torch.cuda.memory_stats() "allocation", "active", "inactive_split",
  // "oversize_allocations", "oversize_segments").
  int64_t allocation = 0, allocation_peak = 0;
  int64_t active = 0, active_peak = 0;
  int64_t inactive_split = 0, inactive_split_peak = 0;
  int64_t oversize_allocations = 0, oversize_allocations_peak = 0;
  int64_t oversize_segments = 0, oversize_segments_peak = 0;
  int64_t num_alloc_retries = 0;
  int64_t num_ooms = 0;
  int64_t num_sync_all_streams = 0;
  int64_t num_device_alloc = 0;
  int64_t num_device_free = 0;
};

// What one malloc did, so the caller can charge time for it.
struct MallocOutcome {
  bool ok = false;
  uint64_t address = 0;        // the block's address (valid when ok)
  int64_t block_bytes = 0;     // the block handed out (>= the request after rounding)
  // cudaMalloc calls, or map operations for expandable segments (one per contiguous
  // range mapped, as num_device_alloc counts them)
  int32_t device_allocs = 0;
  int32_t device_frees = 0;    // cudaFree calls (retry path, GC), or unmap operations
  // synchronize_and_free_events ran (the release-and-retry path): a device-wide wait.
  // Garbage collection does not wait for events (its cudaFrees are in device_frees).
  bool synchronized = false;
  bool retried = false;        // num_alloc_retries was incremented
  // When !ok (an OOM): what the error message of PyTorch would state.
  int64_t requested_bytes = 0;     // "Tried to allocate": the segment size (alloc_size)
  int64_t device_free_bytes = 0;   // capacity minus what this allocator reserves
  int64_t largest_free_block = 0;  // largest cached free block left (cacheInfo's scan)
};

// One line of the snapshot's device trace (torch.cuda.memory._snapshot()["device_traces"]).
struct TraceEntry {
  std::string action;  // alloc, free_requested, free_completed, segment_alloc, segment_free,
                       // segment_map, segment_unmap, oom
  uint64_t address = 0;
  int64_t size = 0;
  AllocStream stream = 0;
};

struct SnapshotBlock {
  uint64_t address = 0;
  int64_t size = 0;
  int64_t requested_size = 0;
  std::string state;  // active_allocated, active_pending_free, inactive
};

struct SnapshotSegment {
  uint64_t address = 0;
  int64_t total_size = 0;
  int64_t allocated_size = 0;
  int64_t active_size = 0;     // allocated or waiting for stream events
  int64_t requested_size = 0;  // requested bytes of the active blocks
  AllocStream stream = 0;
  std::string segment_type;  // small, large
  bool is_expandable = false;  // one mapped range of an expandable segment
  std::vector<SnapshotBlock> blocks;
};

class CachingAllocator {
 public:
  // `memory` and `events` must outlive the allocator.
  CachingAllocator(AllocatorConfig config, DeviceMemory& memory, StreamEvents& events);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // bytes == 0 succeeds with address 0 and changes nothing (PyTorch hands out a null
  // pointer without entering the allocator); bytes < 0 fails without counting an OOM.
  MallocOutcome Malloc(int64_t bytes, AllocStream stream);
  // Frees the block at `address`; deferred while streams recorded on it have pending work.
  // Unknown addresses (and 0) are ignored.
  void Free(uint64_t address);
  // torch.Tensor.record_stream: the block is also used on `stream`.
  void RecordStream(uint64_t address, AllocStream stream);
  // torch.cuda.empty_cache(): releases every unused cached segment. Returns cudaFree calls.
  int32_t EmptyCache();

  // Seeds a fresh allocator with existing segments, as a snapshot lists them: the state
  // at the start of a recorded trace. Each segment's blocks must tile it in address order;
  // "active_allocated" blocks become allocated (freeable by address), "inactive" ones free
  // and cached (adjacent free blocks are merged, as free_block keeps them). Statistics
  // count the segments and blocks as current and peak. DeviceMemory is not called: the
  // caller's device must already count these segments as in use (MakeRecordedDeviceMemory's
  // used_bytes). kInvalidInput names the segment and block for what is not modelled
  // (expandable segments, "active_pending_free" blocks) or not a valid layout (overlaps,
  // sizes that do not add up); an allocator that already holds segments is kInternal.
  Status Restore(const std::vector<SnapshotSegment>& segments);

  const MemoryStats& stats() const;
  std::vector<SnapshotSegment> Snapshot() const;
  // Actions since history was enabled, in order (only kept when enabled: it grows with the
  // run). Disabling clears it, as torch.cuda.memory._record_memory_history(None) does.
  void RecordHistory(bool enabled);
  const std::vector<TraceEntry>& history() const;

  // The request size after rounding (exposed for tests and the memory breakdown).
  int64_t RoundSize(int64_t bytes) const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_CACHING_ALLOCATOR_H_

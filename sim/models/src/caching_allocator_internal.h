// Private to sim/models: what the files of the caching allocator share (caching_allocator.cc,
// caching_allocator_release.cc, caching_allocator_expandable.cc, caching_allocator_restore.cc,
// allocator_config.cc, device_memory.cc). The allocator is one class, CachingAllocator::Impl,
// declared here and defined across those files by concern; every rule cites the function of
// c10/cuda/CUDACachingAllocator.cpp (DeviceCachingAllocator) or c10/core/AllocatorConfig.cpp
// it re-expresses, beside its definition. No PyTorch code is copied.
//
// Data structures. PyTorch keeps free blocks of each pool in a std::set ordered by
// (stream, size, address) and the unmapped tails of expandable segments in a set ordered
// by (stream, address). We keep the same two orders in Boost intrusive red-black trees
// whose hooks live inside the blocks, so the reuse path allocates nothing: blocks come
// from a free-list arena, the address -> active block map is open addressing. Iteration
// order, lower_bound and erase behave exactly like PyTorch's std::set.
//
// Invariants: a block is in exactly one of {pool.blocks (mapped, free, no pending events),
// pool.unmapped (expandable, not mapped), the active map (allocated), the event queues
// (freed, waiting on events)}; blocks of one segment form a doubly linked list by address;
// reserved_bytes equals PyTorch's total_allocated_memory.
#ifndef SHARDSCOPE_SIM_MODELS_CACHING_ALLOCATOR_INTERNAL_H_
#define SHARDSCOPE_SIM_MODELS_CACHING_ALLOCATOR_INTERNAL_H_

#include <boost/intrusive/set.hpp>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "shardscope/sim/models/caching_allocator.h"

namespace shardscope::sim {
namespace allocator_internal {

// Policy constants: c10/cuda/CUDACachingAllocator.cpp (top of file) and
// c10/core/AllocatorConfig.{h,cpp}.
inline constexpr int64_t kMinBlockSize = 512;         // every size rounds to a multiple of this
inline constexpr int64_t kSmallSize = 1 * kMiB;       // largest request served by the small pool
inline constexpr int64_t kSmallBuffer = 2 * kMiB;     // small-pool segment; small expandable page
inline constexpr int64_t kMinLargeAlloc = 10 * kMiB;  // requests below this get a kLargeBuffer
inline constexpr int64_t kLargeBuffer = 20 * kMiB;    // large segment; large expandable page
inline constexpr int64_t kRoundLarge = 2 * kMiB;      // larger segments round up to this
inline constexpr int kRoundUpPowerOfTwoIntervals = 16;  // AllocatorConfig.cpp: 1 MiB .. 64 GiB
inline constexpr int kRoundUpPowerOfTwoStartLog2 = 20;  // the first interval starts at 1 MiB
inline constexpr int64_t kMaxRegisterThreads = 128;     // CUDAAllocatorConfig pinned_max_register_threads
// "Unlimited" max_split_size (PyTorch: numeric_limits<size_t>::max()).
inline constexpr int64_t kUnlimited = std::numeric_limits<int64_t>::max();

// MakeCapacityDeviceMemory's address space: where cudaMalloc-like addresses start, their
// alignment, and how much virtual space they may spread over.
inline constexpr uint64_t kDeviceAddressBase = uint64_t{1} << 32;
inline constexpr int64_t kSegmentAlignment = 2 * kMiB;
inline constexpr int64_t kDeviceAddressSpan = int64_t{1} << 45;
// Expandable segments reserve their virtual ranges from here (cuMemAddressReserve),
// above anything MakeCapacityDeviceMemory hands out.
inline constexpr uint64_t kExpandableAddressBase = uint64_t{1} << 46;

inline int64_t RoundUp(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

namespace bi = boost::intrusive;

struct Pool;

// One expandable segment: a virtual range of `num_pages` pages of `page_size`
// (ExpandableSegment). Physical pages are accounted by DeviceMemory::Map/Unmap.
struct ExpandableSegment {
  uint64_t base = 0;
  int64_t page_size = 0;
  int64_t num_pages = 0;
  int64_t size() const { return page_size * num_pages; }
  // Index of the page holding `p` (segmentLeft) and of the first page at or after it
  // (segmentRight).
  int64_t PageLeft(uint64_t p) const { return static_cast<int64_t>(p - base) / page_size; }
  int64_t PageRight(uint64_t p) const {
    return (static_cast<int64_t>(p - base) + page_size - 1) / page_size;
  }
};

using Hook = bi::set_member_hook<bi::link_mode<bi::normal_link>>;

// Block: a range of a segment (CUDACachingAllocator Block).
struct Block {
  Hook hook;  // in pool.blocks or pool.unmapped, never both
  uint64_t ptr = 0;
  int64_t size = 0;
  int64_t requested_size = 0;
  AllocStream stream = 0;
  Pool* pool = nullptr;
  Block* prev = nullptr;
  Block* next = nullptr;
  ExpandableSegment* expandable = nullptr;
  int64_t gc_count_base = 0;
  int32_t event_count = 0;
  bool allocated = false;
  bool mapped = true;
  std::vector<AllocStream> stream_uses;  // record_stream streams, distinct
  Block* free_next = nullptr;            // arena free list

  bool is_split() const { return prev != nullptr || next != nullptr; }
};

// BlockComparatorSize: (stream, size, address). Streams compare as integers, as PyTorch
// compares cudaStream_t handles as integers.
struct SizeKey {
  AllocStream stream;
  int64_t size;
  uint64_t ptr;
};
struct SizeOrder {
  static bool Less(AllocStream sa, int64_t za, uint64_t pa, AllocStream sb, int64_t zb,
                   uint64_t pb) {
    if (sa != sb) return sa < sb;
    if (za != zb) return za < zb;
    return pa < pb;
  }
  bool operator()(const Block& a, const Block& b) const {
    return Less(a.stream, a.size, a.ptr, b.stream, b.size, b.ptr);
  }
  bool operator()(const SizeKey& a, const Block& b) const {
    return Less(a.stream, a.size, a.ptr, b.stream, b.size, b.ptr);
  }
  bool operator()(const Block& a, const SizeKey& b) const {
    return Less(a.stream, a.size, a.ptr, b.stream, b.size, b.ptr);
  }
};
// BlockComparatorAddress: (stream, address).
struct AddressKey {
  AllocStream stream;
  uint64_t ptr;
};
struct AddressOrder {
  static bool Less(AllocStream sa, uint64_t pa, AllocStream sb, uint64_t pb) {
    return sa != sb ? sa < sb : pa < pb;
  }
  bool operator()(const Block& a, const Block& b) const {
    return Less(a.stream, a.ptr, b.stream, b.ptr);
  }
  bool operator()(const AddressKey& a, const Block& b) const {
    return Less(a.stream, a.ptr, b.stream, b.ptr);
  }
  bool operator()(const Block& a, const AddressKey& b) const {
    return Less(a.stream, a.ptr, b.stream, b.ptr);
  }
};

using MemberHook = bi::member_hook<Block, Hook, &Block::hook>;
using SizeSet = bi::set<Block, MemberHook, bi::compare<SizeOrder>, bi::constant_time_size<false>>;
using AddressSet =
    bi::set<Block, MemberHook, bi::compare<AddressOrder>, bi::constant_time_size<false>>;

// BlockPool: the free blocks of one pool (small or large).
struct Pool {
  explicit Pool(bool small) : is_small(small) {}
  bool is_small;
  SizeSet blocks;
  AddressSet unmapped;
  int64_t get_free_blocks_call_count = 0;  // garbage collection's clock

  // insert_into_blocks: stamps the block's age for garbage collection.
  void Insert(Block* block) {
    block->gc_count_base = get_free_blocks_call_count;
    blocks.insert(*block);
  }
  void Erase(Block* block) { blocks.erase(blocks.iterator_to(*block)); }
};

// Blocks are recycled through a free list so that splitting and merging allocate nothing
// in steady state.
class BlockArena {
 public:
  Block* New() {
    if (free_ == nullptr) Grow();
    Block* block = free_;
    free_ = block->free_next;
    block->ptr = 0;
    block->size = 0;
    block->requested_size = 0;
    block->stream = 0;
    block->pool = nullptr;
    block->prev = nullptr;
    block->next = nullptr;
    block->expandable = nullptr;
    block->gc_count_base = 0;
    block->event_count = 0;
    block->allocated = false;
    block->mapped = true;
    block->stream_uses.clear();
    block->free_next = nullptr;
    return block;
  }
  void Delete(Block* block) {
    block->free_next = free_;
    free_ = block;
  }

 private:
  static constexpr size_t kChunk = 256;
  void Grow() {
    chunks_.push_back(std::make_unique<Block[]>(kChunk));
    Block* chunk = chunks_.back().get();
    for (size_t i = 0; i < kChunk; ++i) Delete(&chunk[kChunk - 1 - i]);
  }
  std::vector<std::unique_ptr<Block[]>> chunks_;
  Block* free_ = nullptr;
};

// Address -> allocated block: linear probing with backward-shift deletion (no tombstones,
// no allocation once grown). Address 0 marks an empty slot; no segment starts at 0.
class AddressMap {
 public:
  AddressMap() : slots_(kInitialSlots), mask_(kInitialSlots - 1) {}

  void Insert(uint64_t key, Block* value) {
    if ((size_ + 1) * 2 > slots_.size()) Grow();
    size_t i = Hash(key) & mask_;
    while (slots_[i].key != 0) i = (i + 1) & mask_;
    slots_[i] = {key, value};
    ++size_;
  }

  Block* Find(uint64_t key) const {
    if (key == 0) return nullptr;
    for (size_t i = Hash(key) & mask_; slots_[i].key != 0; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return slots_[i].value;
    }
    return nullptr;
  }

  // Removes `key` and returns its block, or nullptr.
  Block* Erase(uint64_t key) {
    if (key == 0) return nullptr;
    size_t i = Hash(key) & mask_;
    while (slots_[i].key != key) {
      if (slots_[i].key == 0) return nullptr;
      i = (i + 1) & mask_;
    }
    Block* value = slots_[i].value;
    slots_[i].key = 0;
    --size_;
    // Shift later members of the probe run back so lookups never stop early.
    for (size_t j = (i + 1) & mask_; slots_[j].key != 0; j = (j + 1) & mask_) {
      const size_t home = Hash(slots_[j].key) & mask_;
      const bool stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
      if (!stays) {
        slots_[i] = slots_[j];
        slots_[j].key = 0;
        i = j;
      }
    }
    return value;
  }

  template <typename Fn>
  void ForEach(Fn fn) const {
    for (const Slot& slot : slots_) {
      if (slot.key != 0) fn(slot.value);
    }
  }

 private:
  struct Slot {
    uint64_t key = 0;
    Block* value = nullptr;
  };
  static constexpr size_t kInitialSlots = 1024;
  static size_t Hash(uint64_t key) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;  // murmur3 finalizer
    key ^= key >> 33;
    return static_cast<size_t>(key);
  }
  void Grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.size() * 2, Slot{});
    mask_ = slots_.size() - 1;
    size_ = 0;
    for (const Slot& slot : old) {
      if (slot.key != 0) Insert(slot.key, slot.value);
    }
  }
  std::vector<Slot> slots_;
  size_t mask_;
  size_t size_ = 0;
};

inline void Increase(int64_t& current, int64_t& peak, int64_t amount) {
  current += amount;
  peak = std::max(peak, current);
}

// AllocParams.
struct Params {
  int64_t size = 0;  // rounded request
  AllocStream stream = 0;
  Pool* pool = nullptr;
  int64_t alloc_size = 0;  // segment size if a new one is needed
  Block* block = nullptr;
};

}  // namespace allocator_internal

class CachingAllocator::Impl {
 public:
  using Block = allocator_internal::Block;
  using Pool = allocator_internal::Pool;
  using Params = allocator_internal::Params;
  using ExpandableSegment = allocator_internal::ExpandableSegment;
  using BlockArena = allocator_internal::BlockArena;
  using AddressMap = allocator_internal::AddressMap;

  Impl(AllocatorConfig config, DeviceMemory& memory, StreamEvents& events);
  ~Impl();

  // caching_allocator.cc: rounding, malloc, free, record_stream.
  int64_t RoundSize(int64_t size) const;
  MallocOutcome Malloc(int64_t orig_size, AllocStream stream);
  void Free(uint64_t address);
  void RecordStream(uint64_t address, AllocStream stream);
  const MemoryStats& stats() const { return stats_; }

  // caching_allocator_release.cc.
  int32_t EmptyCache();

  // caching_allocator_restore.cc: seeding from a snapshot, the snapshot, the history.
  Status Restore(const std::vector<SnapshotSegment>& segments);
  std::vector<SnapshotSegment> Snapshot() const;
  void RecordHistory(bool enabled) {
    record_history_ = enabled;
    if (!enabled) history_.clear();  // recordHistory(false) clears the ring buffer
  }
  const std::vector<TraceEntry>& history() const { return history_; }

 private:
  int64_t reserved() const { return stats_.reserved_bytes; }

  // caching_allocator.cc: the malloc path and free_block.
  int64_t DivisionsFor(int64_t size) const;
  static int64_t NextPowerOfTwoDivision(int64_t size, int64_t divisions);
  static int64_t AllocationSize(int64_t size);
  bool ShouldSplit(const Block* block, int64_t size) const;
  // Size a block could grow to in place: itself plus the unmapped range after it
  // (get_free_block's expandable_size).
  static int64_t ExpandableSize(const Block& b) {
    return b.size + (b.next != nullptr && !b.next->mapped ? b.next->size : 0);
  }
  bool GetFreeBlock(Params& p);
  bool AllocBlock(Params& p, bool is_retry);
  Block* AllocFoundBlock(const Params& p, int64_t orig_size, bool split);
  void FreeBlock(Block* block);
  int64_t TryMergeBlocks(Block* dst, Block* src);
  void InsertEvents(Block* block);
  void ProcessEvents();
  void SynchronizeAndFreeEvents();
  int64_t LargestCachedBlock() const;

  // caching_allocator_release.cc: giving memory back (release_*, garbage collection).
  bool ReleaseAvailableCachedBlocks(const Params& p);
  // PyTorch would cudaFree any block found above; a split or expandable one cannot be
  // cudaFreed (it asserts), so we decline those instead of corrupting the segment.
  static bool Releasable(const Block* b) { return b->expandable == nullptr && !b->is_split(); }
  bool ReleaseCachedBlocks();
  void ReleaseBlocks(Pool& pool);
  void ReleaseBlock(Block* block);
  void ReleaseExpandableSegment(Block* block);
  void GarbageCollectCachedBlocks();

  // caching_allocator_expandable.cc: expandable segments.
  static bool Allocatable(const Block* b) {
    return b != nullptr && !b->allocated && b->event_count == 0 && b->stream_uses.empty();
  }
  Block* FindExpandableBlock(Params& p);
  bool MapBlock(Block* to_map, int64_t size);
  Block* TryAllocateExpandableBlock(Params& p);
  void UnmapBlock(Block* block);
  static void Splice(Block* block, Block* before, Block* after);

  void Trace(const char* action, uint64_t address, int64_t size, AllocStream stream) {
    if (!record_history_) return;
    TraceEntry entry;
    entry.action = action;
    entry.address = address;
    entry.size = size;
    entry.stream = stream;
    history_.push_back(std::move(entry));
  }

  AllocatorConfig config_;
  DeviceMemory& memory_;
  StreamEvents& events_;
  bool set_fraction_ = false;
  bool gc_enabled_ = false;
  int64_t allowed_memory_maximum_ = 0;

  BlockArena arena_;  // declared before the pools: destroyed after they unlink
  Pool large_{false};
  Pool small_{true};
  AddressMap active_;
  std::map<AllocStream, std::deque<std::pair<EventToken, Block*>>> cuda_events_;
  int64_t pending_events_ = 0;
  std::vector<std::unique_ptr<ExpandableSegment>> segments_;
  uint64_t next_virtual_address_ = allocator_internal::kExpandableAddressBase;
  std::vector<Block*> to_unmap_;  // scratch for ReleaseBlocks

  MemoryStats stats_;
  bool record_history_ = false;
  std::vector<TraceEntry> history_;
};

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_MODELS_CACHING_ALLOCATOR_INTERNAL_H_

// PyTorch's CUDA caching allocator policy without CUDA (see caching_allocator.h): rounding,
// the malloc path (best fit, splitting, the fallback chain) and free (merging, record_stream
// events). Giving memory back lives in caching_allocator_release.cc, expandable segments in
// caching_allocator_expandable.cc, Restore and Snapshot in caching_allocator_restore.cc; the
// data structures they share, and why they are what they are, in caching_allocator_internal.h.
//
// Every rule below is re-expressed from c10/cuda/CUDACachingAllocator.cpp
// (DeviceCachingAllocator); the comment beside each rule names the function it comes from.
// No PyTorch code is copied.
#include "shardscope/sim/models/caching_allocator.h"

#include <algorithm>
#include <bit>
#include <utility>

#include "caching_allocator_internal.h"

namespace shardscope::sim {

using allocator_internal::Block;
using allocator_internal::Increase;
using allocator_internal::kMinBlockSize;
using allocator_internal::kMinLargeAlloc;
using allocator_internal::kLargeBuffer;
using allocator_internal::kRoundLarge;
using allocator_internal::kRoundUpPowerOfTwoIntervals;
using allocator_internal::kRoundUpPowerOfTwoStartLog2;
using allocator_internal::kSmallBuffer;
using allocator_internal::kSmallSize;
using allocator_internal::Params;
using allocator_internal::Pool;
using allocator_internal::RoundUp;
using allocator_internal::SizeKey;
using allocator_internal::SizeOrder;

CachingAllocator::Impl::Impl(AllocatorConfig config, DeviceMemory& memory, StreamEvents& events)
    : config_(std::move(config)), memory_(memory), events_(events) {
  // setMemoryFraction: the limit is a fraction of the device's total memory.
  set_fraction_ = config_.memory_fraction < 1.0;
  allowed_memory_maximum_ = static_cast<int64_t>(
      std::max(0.0, config_.memory_fraction) * static_cast<double>(memory_.Capacity()));
  gc_enabled_ = set_fraction_ && config_.garbage_collection_threshold > 0.0;
}

CachingAllocator::Impl::~Impl() {
  // The arena owns the blocks; unlink them from the intrusive sets first. Device memory
  // is not returned (PyTorch never frees its cache at exit either).
  for (Pool* pool : {&small_, &large_}) {
    pool->blocks.clear();
    pool->unmapped.clear();
  }
}

// round_size (+ roundup_power2_next_division, AllocatorConfig::roundup_power2_divisions).
int64_t CachingAllocator::Impl::RoundSize(int64_t size) const {
  if (size < kMinBlockSize) return kMinBlockSize;
  const int64_t divisions = DivisionsFor(size);
  if (divisions > 1 && size > kMinBlockSize * divisions) {
    return NextPowerOfTwoDivision(size, divisions);
  }
  return RoundUp(size, kMinBlockSize);
}

MallocOutcome CachingAllocator::Impl::Malloc(int64_t orig_size, AllocStream stream) {
  MallocOutcome out;
  if (orig_size <= 0) {
    out.ok = orig_size == 0;
    return out;
  }
  const int64_t allocs_before = stats_.num_device_alloc;
  const int64_t frees_before = stats_.num_device_free;
  const int64_t syncs_before = stats_.num_sync_all_streams;
  const int64_t retries_before = stats_.num_alloc_retries;

  // malloc: first reclaim blocks whose cross-stream uses have completed.
  ProcessEvents();
  Params p;
  p.size = RoundSize(orig_size);
  p.stream = stream;
  p.pool = p.size <= kSmallSize ? &small_ : &large_;  // get_pool
  p.alloc_size = AllocationSize(p.size);

  // malloc's chain: cached block; (free-memory callbacks: none registered in a
  // simulation); garbage collection; new segment; release oversize cached blocks and
  // retry; release every cached block (after syncing events) and retry (a "retry").
  bool found = GetFreeBlock(p);
  if (!found) {
    if (gc_enabled_) GarbageCollectCachedBlocks();
    found = AllocBlock(p, /*is_retry=*/false) ||
            (ReleaseAvailableCachedBlocks(p) && AllocBlock(p, /*is_retry=*/false)) ||
            (ReleaseCachedBlocks() && AllocBlock(p, /*is_retry=*/true));
  }
  out.device_allocs = static_cast<int32_t>(stats_.num_device_alloc - allocs_before);
  out.device_frees = static_cast<int32_t>(stats_.num_device_free - frees_before);
  out.synchronized = stats_.num_sync_all_streams != syncs_before;
  out.retried = stats_.num_alloc_retries != retries_before;

  if (!found) {
    // malloc's OOM branch: trace (address field = free device bytes, size = rounded
    // request), count, and report what the message states.
    const int64_t device_free = std::max<int64_t>(0, memory_.Capacity() - reserved());
    Trace("oom", static_cast<uint64_t>(device_free), p.size, stream);
    stats_.num_ooms += 1;
    out.requested_bytes = p.alloc_size;
    out.device_free_bytes = device_free;
    out.largest_free_block = LargestCachedBlock();
    return out;
  }
  Block* block = AllocFoundBlock(p, orig_size, ShouldSplit(p.block, p.size));
  out.ok = true;
  out.address = block->ptr;
  out.block_bytes = block->size;
  return out;
}

// free.
void CachingAllocator::Impl::Free(uint64_t address) {
  Block* block = active_.Erase(address);
  if (block == nullptr) return;
  block->allocated = false;
  stats_.allocation -= 1;
  stats_.allocated_bytes -= block->size;
  Trace("free_requested", block->ptr, block->requested_size, block->stream);
  if (block->size >= config_.max_split_size) stats_.oversize_allocations -= 1;
  if (!block->stream_uses.empty()) {
    InsertEvents(block);  // deferred: returns to the pool once every event completes
  } else {
    FreeBlock(block);
  }
}

// recordStream: uses on the allocation stream need no synchronization.
void CachingAllocator::Impl::RecordStream(uint64_t address, AllocStream stream) {
  Block* block = active_.Find(address);
  if (block == nullptr || stream == block->stream) return;
  auto& uses = block->stream_uses;
  if (std::find(uses.begin(), uses.end(), stream) == uses.end()) uses.push_back(stream);
}

// AllocatorConfig::roundup_power2_divisions(size): the interval index is
// floor(log2(size)) - log2(1 MiB), clamped to the 16 intervals.
int64_t CachingAllocator::Impl::DivisionsFor(int64_t size) const {
  const auto& table = config_.roundup_power2_divisions;
  if (table.empty()) return 0;
  const int log_size = std::bit_width(static_cast<uint64_t>(size)) - 1;
  const int index = std::clamp(log_size - kRoundUpPowerOfTwoStartLog2, 0,
                               kRoundUpPowerOfTwoIntervals - 1);
  return static_cast<size_t>(index) < table.size() ? table[static_cast<size_t>(index)] : 0;
}

// roundup_power2_next_division: powers of two stay; otherwise the interval
// [2^k, 2^(k+1)) is cut into `divisions` equal steps and the size rounds up to the next
// step (a step of 0 bytes means the next power of two).
int64_t CachingAllocator::Impl::NextPowerOfTwoDivision(int64_t size, int64_t divisions) {
  const auto usize = static_cast<uint64_t>(size);
  if (std::has_single_bit(usize)) return size;
  const uint64_t floor = std::bit_floor(usize);
  const uint64_t step = floor >> (std::bit_width(static_cast<uint64_t>(divisions)) - 1);
  if (step == 0) return static_cast<int64_t>(floor << 1);
  const uint64_t rounded = usize & ~(step - 1);
  return static_cast<int64_t>(rounded == usize ? usize : rounded + step);
}

// get_allocation_size: small requests share a 2 MiB segment, requests below 10 MiB a
// 20 MiB one, larger ones get their size rounded up to 2 MiB.
int64_t CachingAllocator::Impl::AllocationSize(int64_t size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return RoundUp(size, kRoundLarge);
}

// should_split: small pool or expandable segments keep any remainder of >= 512 B; the
// large pool splits only requests below max_split_size, leaving more than 1 MiB.
bool CachingAllocator::Impl::ShouldSplit(const Block* block, int64_t size) const {
  const int64_t remaining = block->size - size;
  if (block->pool->is_small || config_.expandable_segments) {
    return remaining >= kMinBlockSize;
  }
  return size < config_.max_split_size && remaining > kSmallSize;
}

// get_free_block: best fit by (stream, size, address), then the max_split_size rules.
bool CachingAllocator::Impl::GetFreeBlock(Params& p) {
  Pool& pool = *p.pool;
  if (gc_enabled_) ++pool.get_free_blocks_call_count;  // block-reuse clock for GC
  auto it = pool.blocks.lower_bound(SizeKey{p.stream, p.size, 0}, SizeOrder());
  if (it == pool.blocks.end() || it->stream != p.stream) return false;
  if (it->expandable != nullptr) {
    // Among expandable blocks, prefer one that cannot grow more than a larger block
    // can: walk forward while the next block's grow-to size is smaller.
    auto next = std::next(it);
    while (it->expandable != nullptr && next != pool.blocks.end() &&
           next->stream == p.stream && ExpandableSize(*next) < ExpandableSize(*it)) {
      it = next++;
    }
  }
  // A request below max_split_size never takes an oversize block ...
  if (p.size < config_.max_split_size && it->size >= config_.max_split_size) return false;
  // ... and an oversize request takes one only if it wastes < max_non_split_rounding.
  if (p.size >= config_.max_split_size &&
      it->size - p.size >= config_.max_non_split_rounding) {
    return false;
  }
  p.block = &*it;
  pool.blocks.erase(it);
  return true;
}

// alloc_block: a new segment (cudaMalloc) or, with expandable segments, more mapped
// pages; refused up front when it would pass the memory-fraction limit.
bool CachingAllocator::Impl::AllocBlock(Params& p, bool is_retry) {
  if (is_retry) stats_.num_alloc_retries += 1;
  if (set_fraction_ && reserved() + p.alloc_size > allowed_memory_maximum_) return false;
  if (config_.expandable_segments) {
    p.block = TryAllocateExpandableBlock(p);
    return p.block != nullptr;
  }
  uint64_t address = 0;
  if (!memory_.Allocate(p.alloc_size, &address)) return false;
  Block* block = arena_.New();
  block->ptr = address;
  block->size = p.alloc_size;
  block->stream = p.stream;
  block->pool = p.pool;
  Increase(stats_.segment, stats_.segment_peak, 1);
  Increase(stats_.reserved_bytes, stats_.reserved_bytes_peak, p.alloc_size);
  if (p.alloc_size >= config_.max_split_size) {
    Increase(stats_.oversize_segments, stats_.oversize_segments_peak, 1);
  }
  stats_.num_device_alloc += 1;
  Trace("segment_alloc", address, p.alloc_size, p.stream);
  p.block = block;
  return true;
}

// alloc_found_block: split off the remainder if should_split said so, mark allocated,
// update statistics (inactive_split counts only non-expandable blocks).
Block* CachingAllocator::Impl::AllocFoundBlock(const Params& p, int64_t orig_size, bool split) {
  Block* block = p.block;
  Pool* pool = p.pool;
  const bool already_split = block->is_split();
  const bool expandable = block->expandable != nullptr;
  if (split) {
    Block* remaining = block;
    block = arena_.New();
    block->ptr = remaining->ptr;
    block->size = p.size;
    block->stream = p.stream;
    block->pool = pool;
    block->expandable = remaining->expandable;
    block->prev = remaining->prev;
    if (block->prev != nullptr) block->prev->next = block;
    block->next = remaining;
    remaining->prev = block;
    remaining->ptr += static_cast<uint64_t>(p.size);
    remaining->size -= p.size;
    pool->Insert(remaining);
    if (!expandable) {
      if (already_split) {
        stats_.inactive_split_bytes -= block->size;  // an inactive split shrinks
      } else {
        Increase(stats_.inactive_split_bytes, stats_.inactive_split_bytes_peak,
                 remaining->size);
        Increase(stats_.inactive_split, stats_.inactive_split_peak, 1);
      }
    }
  } else if (already_split && !expandable) {
    stats_.inactive_split_bytes -= block->size;
    stats_.inactive_split -= 1;
  }
  block->allocated = true;
  block->requested_size = orig_size;
  Trace("alloc", block->ptr, orig_size, block->stream);
  active_.Insert(block->ptr, block);
  Increase(stats_.allocation, stats_.allocation_peak, 1);
  Increase(stats_.allocated_bytes, stats_.allocated_bytes_peak, block->size);
  Increase(stats_.active, stats_.active_peak, 1);
  Increase(stats_.active_bytes, stats_.active_bytes_peak, block->size);
  Increase(stats_.requested_bytes, stats_.requested_bytes_peak, orig_size);
  if (block->size >= config_.max_split_size) {
    Increase(stats_.oversize_allocations, stats_.oversize_allocations_peak, 1);
  }
  return block;
}

// free_block: merge with free neighbours of the same segment, return to the pool.
void CachingAllocator::Impl::FreeBlock(Block* block) {
  Trace("free_completed", block->ptr, block->requested_size, block->stream);
  const int64_t original_size = block->size;
  const int64_t requested = block->requested_size;
  Pool& pool = *block->pool;
  int64_t net_split_blocks = 0;
  int64_t net_split_bytes = 0;
  Block* const candidates[2] = {block->prev, block->next};
  for (Block* candidate : candidates) {
    const int64_t subsumed = TryMergeBlocks(block, candidate);
    if (subsumed > 0) {
      net_split_blocks -= 1;
      net_split_bytes -= subsumed;
    }
  }
  pool.Insert(block);
  if (block->is_split()) {
    net_split_blocks += 1;
    net_split_bytes += block->size;
  }
  if (block->expandable == nullptr) {
    Increase(stats_.inactive_split, stats_.inactive_split_peak, net_split_blocks);
    Increase(stats_.inactive_split_bytes, stats_.inactive_split_bytes_peak, net_split_bytes);
  }
  stats_.active -= 1;
  stats_.active_bytes -= original_size;
  stats_.requested_bytes -= requested;
}

// try_merge_blocks: absorb `src` into `dst` when it is free, has no pending events and
// is mapped alike. Returns the bytes absorbed.
int64_t CachingAllocator::Impl::TryMergeBlocks(Block* dst, Block* src) {
  if (src == nullptr || src->allocated || src->event_count > 0 || !src->stream_uses.empty() ||
      dst->mapped != src->mapped) {
    return 0;
  }
  if (dst->prev == src) {
    dst->ptr = src->ptr;
    dst->prev = src->prev;
    if (dst->prev != nullptr) dst->prev->next = dst;
  } else {
    dst->next = src->next;
    if (dst->next != nullptr) dst->next->prev = dst;
  }
  const int64_t subsumed = src->size;
  dst->size += subsumed;
  Pool& pool = *src->pool;
  if (src->mapped) {
    pool.Erase(src);
  } else {
    pool.unmapped.erase(pool.unmapped.iterator_to(*src));
  }
  arena_.Delete(src);
  return subsumed;
}

// ---- record_stream events -------------------------------------------------------------

// ---- record_stream events -------------------------------------------------------------
// insert_events: one event per stream that used the block.
void CachingAllocator::Impl::InsertEvents(Block* block) {
  for (AllocStream stream : block->stream_uses) {
    const EventToken event = events_.Record(stream);
    block->event_count += 1;
    cuda_events_[stream].emplace_back(event, block);
    ++pending_events_;
  }
  block->stream_uses.clear();
}

// process_events: per stream, retire completed events in order, stopping at the first
// that has not completed; a block returns to its pool when its last event completes.
void CachingAllocator::Impl::ProcessEvents() {
  if (pending_events_ == 0) return;
  for (auto& [stream, queue] : cuda_events_) {
    while (!queue.empty()) {
      auto [event, block] = queue.front();
      if (!events_.Query(event)) break;
      queue.pop_front();
      --pending_events_;
      if (--block->event_count == 0) FreeBlock(block);
    }
  }
}

// synchronize_and_free_events: wait for every outstanding event.
void CachingAllocator::Impl::SynchronizeAndFreeEvents() {
  stats_.num_sync_all_streams += 1;
  for (auto& [stream, queue] : cuda_events_) {
    for (auto [event, block] : queue) {
      events_.Synchronize(event);
      if (--block->event_count == 0) FreeBlock(block);
    }
    queue.clear();
  }
  pending_events_ = 0;
}

// cacheInfo / cache_info_aux: the largest cached free block.
int64_t CachingAllocator::Impl::LargestCachedBlock() const {
  int64_t largest = 0;
  for (const Pool* pool : {&small_, &large_}) {
    for (const Block& b : pool->blocks) largest = std::max(largest, b.size);
  }
  return largest;
}

CachingAllocator::CachingAllocator(AllocatorConfig config, DeviceMemory& memory,
                                   StreamEvents& events)
    : impl_(std::make_unique<Impl>(std::move(config), memory, events)) {}
CachingAllocator::~CachingAllocator() = default;

MallocOutcome CachingAllocator::Malloc(int64_t bytes, AllocStream stream) {
  return impl_->Malloc(bytes, stream);
}
void CachingAllocator::Free(uint64_t address) { impl_->Free(address); }
void CachingAllocator::RecordStream(uint64_t address, AllocStream stream) {
  impl_->RecordStream(address, stream);
}
int32_t CachingAllocator::EmptyCache() { return impl_->EmptyCache(); }
Status CachingAllocator::Restore(const std::vector<SnapshotSegment>& segments) {
  return impl_->Restore(segments);
}
const MemoryStats& CachingAllocator::stats() const { return impl_->stats(); }
std::vector<SnapshotSegment> CachingAllocator::Snapshot() const { return impl_->Snapshot(); }
void CachingAllocator::RecordHistory(bool enabled) { impl_->RecordHistory(enabled); }
const std::vector<TraceEntry>& CachingAllocator::history() const { return impl_->history(); }
int64_t CachingAllocator::RoundSize(int64_t bytes) const { return impl_->RoundSize(bytes); }

}  // namespace shardscope::sim

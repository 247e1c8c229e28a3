// The caching allocator giving memory back to the device: emptyCache, the two release
// steps of malloc's fallback chain, and garbage collection (see caching_allocator_internal.h
// for the class). Each rule cites the function of c10/cuda/CUDACachingAllocator.cpp it
// re-expresses.
#include <algorithm>
#include <iterator>

#include "caching_allocator_internal.h"

namespace shardscope::sim {

using allocator_internal::Block;
using allocator_internal::Params;
using allocator_internal::Pool;
using allocator_internal::SizeKey;
using allocator_internal::SizeOrder;
using allocator_internal::SizeSet;
using allocator_internal::kUnlimited;

// emptyCache -> release_cached_blocks.
int32_t CachingAllocator::Impl::EmptyCache() {
  const int64_t frees_before = stats_.num_device_free;
  ReleaseCachedBlocks();
  return static_cast<int32_t>(stats_.num_device_free - frees_before);
}

// release_available_cached_blocks (only with max_split_size set): free the smallest
// single oversize block of this stream that covers the request, or else oversize blocks
// from the largest down until their total covers it.
bool CachingAllocator::Impl::ReleaseAvailableCachedBlocks(const Params& p) {
  if (config_.max_split_size == kUnlimited) return false;
  SizeSet& blocks = p.pool->blocks;
  const int64_t key_size = std::max(p.size, config_.max_split_size);
  auto it = blocks.lower_bound(SizeKey{p.stream, key_size, 0}, SizeOrder());
  if (it == blocks.end() || it->stream != p.stream) {
    if (it == blocks.begin()) return false;
    int64_t released = 0;
    --it;  // the largest block of the stream (if any precedes)
    while (released < key_size && it->size >= config_.max_split_size &&
           it->stream == p.stream) {
      Block* current = &*it;
      if (!Releasable(current)) break;
      released += current->size;
      if (it != blocks.begin()) {
        --it;
        ReleaseBlock(current);
      } else {
        ReleaseBlock(current);
        break;
      }
    }
    return released >= key_size;
  }
  if (!Releasable(&*it)) return false;
  ReleaseBlock(&*it);
  return true;
}

// release_cached_blocks: wait for every pending event, then free every whole cached
// segment and unmap every free page of expandable segments.
bool CachingAllocator::Impl::ReleaseCachedBlocks() {
  SynchronizeAndFreeEvents();
  ReleaseBlocks(large_);
  ReleaseBlocks(small_);
  return true;
}

// release_blocks.
void CachingAllocator::Impl::ReleaseBlocks(Pool& pool) {
  to_unmap_.clear();
  for (auto it = pool.blocks.begin(); it != pool.blocks.end();) {
    Block* block = &*it;
    ++it;
    if (block->expandable != nullptr) {
      to_unmap_.push_back(block);  // unmapping edits the set: do it after the walk
    } else if (!block->is_split()) {
      ReleaseBlock(block);
    }
  }
  for (Block* block : to_unmap_) {
    UnmapBlock(block);
    if (!block->is_split() && !block->mapped) ReleaseExpandableSegment(block);
  }
}

// release_block: cudaFree a whole cached segment.
void CachingAllocator::Impl::ReleaseBlock(Block* block) {
  stats_.num_device_free += 1;
  Trace("segment_free", block->ptr, block->size, block->stream);
  memory_.Release(block->ptr, block->size);
  stats_.segment -= 1;
  stats_.reserved_bytes -= block->size;
  if (block->size >= config_.max_split_size) stats_.oversize_segments -= 1;
  block->pool->Erase(block);
  arena_.Delete(block);
}

// release_expandable_segment: the whole virtual range is unmapped and free.
void CachingAllocator::Impl::ReleaseExpandableSegment(Block* block) {
  block->pool->unmapped.erase(block->pool->unmapped.iterator_to(*block));
  ExpandableSegment* segment = block->expandable;
  arena_.Delete(block);
  auto it = std::find_if(segments_.begin(), segments_.end(),
                         [&](const auto& s) { return s.get() == segment; });
  if (it != segments_.end()) segments_.erase(it);
}

// garbage_collect_cached_blocks: when reserved memory passes threshold x allowed
// maximum, free whole large cached segments not reused for longer than average, in
// rounds, until enough is reclaimed. No event synchronization.
void CachingAllocator::Impl::GarbageCollectCachedBlocks() {
  const auto gc_threshold = static_cast<int64_t>(config_.garbage_collection_threshold *
                                                 static_cast<double>(allowed_memory_maximum_));
  if (reserved() <= gc_threshold) return;
  const int64_t target = reserved() - gc_threshold;
  int64_t reclaimed = 0;
  auto age = [&](const Block& b) { return large_.get_free_blocks_call_count - b.gc_count_base; };
  int64_t total_age = 0;
  int64_t freeable = 0;
  for (const Block& b : large_.blocks) {
    if (!b.is_split() && b.expandable == nullptr) {
      total_age += age(b);
      ++freeable;
    }
  }
  if (freeable == 0) return;
  bool freed = true;
  while (reclaimed < target && freed && freeable > 0) {
    const double age_threshold = static_cast<double>(total_age) / static_cast<double>(freeable);
    freed = false;
    for (auto it = large_.blocks.begin(); it != large_.blocks.end();) {
      Block* block = &*it;
      ++it;
      if (!block->is_split() && block->expandable == nullptr &&
          static_cast<double>(age(*block)) >= age_threshold) {
        freed = true;
        reclaimed += block->size;
        total_age -= age(*block);
        --freeable;
        ReleaseBlock(block);
      }
    }
  }
}

}  // namespace shardscope::sim

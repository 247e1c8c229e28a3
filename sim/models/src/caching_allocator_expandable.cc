// Expandable segments of the caching allocator (PYTORCH_CUDA_ALLOC_CONF
// expandable_segments:True): one virtual range per (pool, stream) whose pages are mapped as
// requests need them and unmapped when released (see caching_allocator_internal.h for the
// class). Each rule cites the function of c10/cuda/CUDACachingAllocator.cpp it re-expresses.
#include <algorithm>
#include <memory>
#include <utility>

#include "caching_allocator_internal.h"

namespace shardscope::sim {

using allocator_internal::AddressKey;
using allocator_internal::AddressOrder;
using allocator_internal::Block;
using allocator_internal::ExpandableSegment;
using allocator_internal::Increase;
using allocator_internal::Params;
using allocator_internal::Pool;
using allocator_internal::RoundUp;
using allocator_internal::kLargeBuffer;
using allocator_internal::kSegmentAlignment;
using allocator_internal::kSmallBuffer;

// find_expandable_block: the lowest address, among this (pool, stream)'s segments,
// where free and unmapped blocks together hold `size`; else a new segment whose virtual
// range covers 9/8 of the device's memory in pages of 2 MiB (small) / 20 MiB (large).
Block* CachingAllocator::Impl::FindExpandableBlock(Params& p) {
  Pool& pool = *p.pool;
  for (auto it = pool.unmapped.lower_bound(AddressKey{p.stream, 0}, AddressOrder());
       it != pool.unmapped.end() && it->stream == p.stream; ++it) {
    Block* candidate = &*it;
    if (Allocatable(candidate->prev)) candidate = candidate->prev;
    int64_t bytes = 0;
    for (Block* b = candidate; bytes < p.size && Allocatable(b); b = b->next) bytes += b->size;
    if (bytes >= p.size) return candidate;
  }
  const int64_t page = pool.is_small ? kSmallBuffer : kLargeBuffer;
  const int64_t total = memory_.Capacity();
  auto segment = std::make_unique<ExpandableSegment>();
  segment->base = next_virtual_address_;
  segment->page_size = page;
  segment->num_pages = (total + total / 8 + page - 1) / page;
  next_virtual_address_ +=
      static_cast<uint64_t>(RoundUp(segment->size(), kSegmentAlignment));
  Block* candidate = arena_.New();
  candidate->ptr = segment->base;
  candidate->size = segment->size();
  candidate->stream = p.stream;
  candidate->pool = &pool;
  candidate->mapped = false;
  candidate->expandable = segment.get();
  segments_.push_back(std::move(segment));
  pool.unmapped.insert(*candidate);
  return candidate;
}

// map_block: map whole pages covering [ptr, ptr + size) of an unmapped block; the rest
// of it stays unmapped; merge with free mapped neighbours.
bool CachingAllocator::Impl::MapBlock(Block* to_map, int64_t size) {
  const ExpandableSegment& segment = *to_map->expandable;
  const int64_t begin = segment.PageLeft(to_map->ptr);
  const int64_t end = segment.PageRight(to_map->ptr + static_cast<uint64_t>(size));
  const int64_t mapped_size = (end - begin) * segment.page_size;
  if (mapped_size == 0 || !memory_.Map(mapped_size)) return false;
  const uint64_t mapped_ptr = to_map->ptr;
  Pool& pool = *to_map->pool;
  pool.unmapped.erase(pool.unmapped.iterator_to(*to_map));
  to_map->mapped = true;
  if (mapped_size < to_map->size) {
    Block* remaining = arena_.New();
    remaining->ptr = to_map->ptr + static_cast<uint64_t>(mapped_size);
    remaining->size = to_map->size - mapped_size;
    remaining->stream = to_map->stream;
    remaining->pool = &pool;
    remaining->mapped = false;
    remaining->expandable = to_map->expandable;
    Splice(remaining, to_map, to_map->next);
    pool.unmapped.insert(*remaining);
    to_map->size = mapped_size;
  }
  TryMergeBlocks(to_map, to_map->prev);
  TryMergeBlocks(to_map, to_map->next);
  pool.Insert(to_map);
  Increase(stats_.reserved_bytes, stats_.reserved_bytes_peak, mapped_size);
  stats_.num_device_alloc += 1;
  Trace("segment_map", mapped_ptr, mapped_size, to_map->stream);
  return true;
}

// try_allocate_expandable_block: map pages until the candidate holds the request.
Block* CachingAllocator::Impl::TryAllocateExpandableBlock(Params& p) {
  Block* candidate = FindExpandableBlock(p);
  if (!candidate->mapped && !MapBlock(candidate, std::min(candidate->size, p.size))) {
    return nullptr;
  }
  while (candidate->size < p.size) {
    // candidate is free and mapped, followed by an unmapped block: map into it, which
    // merges the candidate into that block.
    Block* next = candidate->next;
    if (!MapBlock(next, std::min(p.size - candidate->size, next->size))) return nullptr;
    candidate = next;
  }
  p.pool->Erase(candidate);
  return candidate;
}

// unmap_block: unmap the whole pages inside a free block; the partial pages at either
// end stay mapped as free blocks of their own.
void CachingAllocator::Impl::UnmapBlock(Block* block) {
  const ExpandableSegment& segment = *block->expandable;
  const int64_t begin = segment.PageRight(block->ptr);
  const int64_t end = segment.PageLeft(block->ptr + static_cast<uint64_t>(block->size));
  if (begin >= end) return;
  const uint64_t unmapped_ptr = segment.base + static_cast<uint64_t>(begin * segment.page_size);
  const int64_t unmapped_size = (end - begin) * segment.page_size;
  memory_.Unmap(unmapped_size);
  Pool& pool = *block->pool;
  pool.Erase(block);
  const auto before_size = static_cast<int64_t>(unmapped_ptr - block->ptr);
  if (before_size > 0) {
    Block* before = arena_.New();
    before->ptr = block->ptr;
    before->size = before_size;
    before->stream = block->stream;
    before->pool = &pool;
    before->expandable = block->expandable;
    Splice(before, block->prev, block);
    pool.Insert(before);
  }
  const int64_t after_size = block->size - (before_size + unmapped_size);
  if (after_size > 0) {
    Block* after = arena_.New();
    after->ptr = unmapped_ptr + static_cast<uint64_t>(unmapped_size);
    after->size = after_size;
    after->stream = block->stream;
    after->pool = &pool;
    after->expandable = block->expandable;
    Splice(after, block, block->next);
    pool.Insert(after);
  }
  block->ptr = unmapped_ptr;
  block->size = unmapped_size;
  block->mapped = false;
  TryMergeBlocks(block, block->prev);
  TryMergeBlocks(block, block->next);
  pool.unmapped.insert(*block);
  stats_.reserved_bytes -= unmapped_size;
  stats_.num_device_free += 1;
  Trace("segment_unmap", unmapped_ptr, unmapped_size, block->stream);
}

// Block::splice: link `block` between `before` and `after`.
void CachingAllocator::Impl::Splice(Block* block, Block* before, Block* after) {
  if (before != nullptr) before->next = block;
  block->prev = before;
  if (after != nullptr) after->prev = block;
  block->next = after;
}

}  // namespace shardscope::sim

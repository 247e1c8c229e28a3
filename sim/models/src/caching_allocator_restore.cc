// The caching allocator's state as a snapshot lists it: Restore seeds a fresh allocator
// from one (the state at the start of a recorded trace), Snapshot writes one
// (torch.cuda.memory_snapshot's segments and blocks). See caching_allocator_internal.h for
// the class.
#include <algorithm>
#include <set>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "caching_allocator_internal.h"

namespace shardscope::sim {

using allocator_internal::Block;
using allocator_internal::Increase;
using allocator_internal::Pool;
using allocator_internal::kUnlimited;

// Restore: the blocks of each segment are linked in address order like split blocks
// (Block::splice), allocated ones enter the active map, free runs are merged and
// inserted into their pool (insert_into_blocks), and the statistics are those
// alloc_block + alloc_found_block + free_block would have left.
Status CachingAllocator::Impl::Restore(const std::vector<SnapshotSegment>& segments) {
  if (stats_.segment != 0 || !segments_.empty()) {
    return Status::Internal("CachingAllocator::Restore: the allocator already holds segments");
  }
  // Validate everything first so that an error leaves the allocator untouched.
  std::vector<std::pair<uint64_t, size_t>> by_address;
  for (size_t i = 0; i < segments.size(); ++i) {
    const SnapshotSegment& seg = segments[i];
    auto error = [&](std::string_view what) {
      return Status::InvalidInput(fmt::format("initial state: segment {} (address {:#x}): {}", i, seg.address, what));
    };
    if (seg.is_expandable) return error("expandable segments are not modelled in an initial state");
    if (seg.segment_type != "small" && seg.segment_type != "large") {
      return error(fmt::format("segment_type must be small or large, got '{}'", seg.segment_type));
    }
    if (seg.address == 0) return error("address 0");
    if (seg.blocks.empty()) return error("no blocks");
    uint64_t next = seg.address;
    int64_t total = 0;
    for (size_t b = 0; b < seg.blocks.size(); ++b) {
      const SnapshotBlock& block = seg.blocks[b];
      if (block.size <= 0 || block.size > kUnlimited / 4 - total) {
        return error(fmt::format("block {}: size must be positive, got {}", b, block.size));
      }
      if (block.address != next) {
        return error(fmt::format("block {}: address {:#x}, expected {:#x} (blocks tile the segment in order)", b,
                                 block.address, next));
      }
      if (block.state != "active_allocated" && block.state != "inactive") {
        return error(fmt::format("block {}: state '{}' is not modelled in an initial state (expected "
                                 "active_allocated or inactive)", b, block.state));
      }
      if (block.requested_size < 0) return error(fmt::format("block {}: negative requested_size", b));
      next += static_cast<uint64_t>(block.size);
      total += block.size;
    }
    if (total != seg.total_size) {
      return error(fmt::format("blocks add up to {} bytes, total_size is {}", total, seg.total_size));
    }
    if (next < seg.address) return error("the segment wraps around the address space");
    by_address.emplace_back(seg.address, i);
  }
  std::sort(by_address.begin(), by_address.end());
  for (size_t k = 1; k < by_address.size(); ++k) {
    const SnapshotSegment& prev = segments[by_address[k - 1].second];
    if (prev.address + static_cast<uint64_t>(prev.total_size) > by_address[k].first) {
      return Status::InvalidInput(fmt::format("initial state: segments at {:#x} and {:#x} overlap", prev.address,
                                              by_address[k].first));
    }
  }

  for (const SnapshotSegment& seg : segments) {
    Pool* pool = seg.segment_type == "small" ? &small_ : &large_;
    Increase(stats_.segment, stats_.segment_peak, 1);
    Increase(stats_.reserved_bytes, stats_.reserved_bytes_peak, seg.total_size);
    if (seg.total_size >= config_.max_split_size) {
      Increase(stats_.oversize_segments, stats_.oversize_segments_peak, 1);
    }
    Block* prev = nullptr;
    std::vector<Block*> free_blocks;
    for (const SnapshotBlock& info : seg.blocks) {
      const bool allocated = info.state == "active_allocated";
      if (!allocated && prev != nullptr && !prev->allocated) {
        prev->size += info.size;  // adjacent free blocks are one block in PyTorch
        continue;
      }
      Block* block = arena_.New();
      block->ptr = info.address;
      block->size = info.size;
      block->stream = seg.stream;
      block->pool = pool;
      block->allocated = allocated;
      block->prev = prev;
      if (prev != nullptr) prev->next = block;
      prev = block;
      if (allocated) {
        block->requested_size = info.requested_size;
        active_.Insert(block->ptr, block);
        Increase(stats_.allocation, stats_.allocation_peak, 1);
        Increase(stats_.allocated_bytes, stats_.allocated_bytes_peak, block->size);
        Increase(stats_.active, stats_.active_peak, 1);
        Increase(stats_.active_bytes, stats_.active_bytes_peak, block->size);
        Increase(stats_.requested_bytes, stats_.requested_bytes_peak, block->requested_size);
        if (block->size >= config_.max_split_size) {
          Increase(stats_.oversize_allocations, stats_.oversize_allocations_peak, 1);
        }
      } else {
        free_blocks.push_back(block);
      }
    }
    for (Block* block : free_blocks) {
      pool->Insert(block);
      if (block->is_split()) {
        Increase(stats_.inactive_split, stats_.inactive_split_peak, 1);
        Increase(stats_.inactive_split_bytes, stats_.inactive_split_bytes_peak, block->size);
      }
    }
  }
  return Status::Ok();
}

// snapshot: one entry per segment (per contiguous mapped range of an expandable
// segment), sorted by address.
std::vector<SnapshotSegment> CachingAllocator::Impl::Snapshot() const {
  std::vector<const Block*> all;
  for (const Pool* pool : {&small_, &large_}) {
    for (const Block& b : pool->blocks) all.push_back(&b);
  }
  active_.ForEach([&](const Block* b) { all.push_back(b); });
  std::set<const Block*> pending;
  for (const auto& [stream, queue] : cuda_events_) {
    for (const auto& entry : queue) pending.insert(entry.second);
  }
  all.insert(all.end(), pending.begin(), pending.end());

  std::vector<SnapshotSegment> result;
  for (const Block* head : all) {
    if (head->prev != nullptr && head->prev->mapped) continue;
    SnapshotSegment segment;
    segment.address = head->ptr;
    segment.stream = head->stream;
    segment.segment_type = head->pool->is_small ? "small" : "large";
    segment.is_expandable = head->expandable != nullptr;
    for (const Block* b = head; b != nullptr && b->mapped; b = b->next) {
      SnapshotBlock info;
      info.address = b->ptr;
      info.size = b->size;
      info.requested_size = b->requested_size;
      const bool active = b->allocated || b->event_count > 0 || !b->stream_uses.empty();
      info.state = b->allocated ? "active_allocated"
                                : (active ? "active_pending_free" : "inactive");
      segment.total_size += b->size;
      if (b->allocated) segment.allocated_size += b->size;
      if (active) {
        segment.active_size += b->size;
        segment.requested_size += b->requested_size;
      }
      segment.blocks.push_back(std::move(info));
    }
    result.push_back(std::move(segment));
  }
  std::sort(result.begin(), result.end(),
            [](const SnapshotSegment& a, const SnapshotSegment& b) {
              return a.address < b.address;
            });
  return result;
}

}  // namespace shardscope::sim

#include "activity_buffer_pool.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace shardscope::profiler {

StatusOr<std::unique_ptr<ActivityBufferPool>> ActivityBufferPool::Create(const BufferPoolOptions& options) {
  if (options.buffer_bytes < kMinActivityBufferBytes || options.buffer_bytes > kMaxActivityBufferBytes ||
      options.buffer_bytes % kActivityBufferAlignment != 0) {
    return Status::InvalidInput(fmt::format(
        "activity buffer size: expected a multiple of {} bytes between {} and {}, got {}",
        kActivityBufferAlignment, kMinActivityBufferBytes, kMaxActivityBufferBytes, options.buffer_bytes));
  }
  if (options.buffer_count < 1) {
    return Status::InvalidInput(
        fmt::format("activity buffer count: expected at least 1, got {}", options.buffer_count));
  }
  if (options.buffer_bytes * options.buffer_count > kMaxActivityPoolBytes) {
    return Status::InvalidInput(fmt::format(
        "activity buffer pool: {} buffers of {} bytes exceed the {}-byte cap", options.buffer_count,
        options.buffer_bytes, kMaxActivityPoolBytes));
  }
  return std::unique_ptr<ActivityBufferPool>(
      new ActivityBufferPool(static_cast<size_t>(options.buffer_bytes), options.buffer_count));
}

ActivityBufferPool::ActivityBufferPool(size_t buffer_bytes, int32_t buffer_count)
    : buffer_bytes_(buffer_bytes),
      buffer_count_(buffer_count),
      // Value-initialized: zeroed (and so touched) now, not on the issuing thread later.
      storage_(new uint8_t[buffer_bytes * static_cast<size_t>(buffer_count)]()),
      handed_out_(static_cast<size_t>(buffer_count), false) {
  free_.reserve(static_cast<size_t>(buffer_count));
  // Pushed in reverse so the first Acquire returns the first buffer (deterministic tests).
  for (int32_t i = buffer_count - 1; i >= 0; --i) {
    free_.push_back(storage_.get() + static_cast<size_t>(i) * buffer_bytes_);
  }
}

int64_t ActivityBufferPool::IndexOf(const uint8_t* buffer) const {
  const uint8_t* base = storage_.get();
  const size_t total = buffer_bytes_ * static_cast<size_t>(buffer_count_);
  if (buffer < base || buffer >= base + total) return -1;
  const auto offset = static_cast<size_t>(buffer - base);
  if (offset % buffer_bytes_ != 0) return -1;
  return static_cast<int64_t>(offset / buffer_bytes_);
}

uint8_t* ActivityBufferPool::Acquire() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++counters_.requested;
  if (free_.empty()) {
    ++counters_.refused;
    return nullptr;
  }
  uint8_t* buffer = free_.back();
  free_.pop_back();
  handed_out_[static_cast<size_t>(IndexOf(buffer))] = true;
  ++counters_.in_use;
  if (counters_.in_use > counters_.high_water) counters_.high_water = counters_.in_use;
  return buffer;
}

bool ActivityBufferPool::Release(uint8_t* buffer, size_t used_bytes) {
  const int64_t index = IndexOf(buffer);
  if (index < 0) return false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!handed_out_[static_cast<size_t>(index)]) return false;
  }
  // Zeroed outside the lock: the buffer is ours alone until it is back on the free list.
  std::memset(buffer, 0, std::min(used_bytes, buffer_bytes_));
  std::lock_guard<std::mutex> lock(mutex_);
  handed_out_[static_cast<size_t>(index)] = false;
  free_.push_back(buffer);
  --counters_.in_use;
  return true;
}

BufferPoolCounters ActivityBufferPool::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_;
}

}  // namespace shardscope::profiler

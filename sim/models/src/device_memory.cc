// The devices beneath the caching allocator (see caching_allocator.h): one of fixed
// capacity with cudaMalloc-like addresses, and one replaying the addresses a recording's
// driver gave.
#include <algorithm>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "caching_allocator_internal.h"

namespace shardscope::sim {

using allocator_internal::kDeviceAddressBase;
using allocator_internal::kDeviceAddressSpan;
using allocator_internal::kSegmentAlignment;
using allocator_internal::RoundUp;

namespace {

class CapacityDeviceMemory final : public DeviceMemory {
 public:
  explicit CapacityDeviceMemory(int64_t capacity) : capacity_(std::max<int64_t>(capacity, 0)) {
    free_ranges_.emplace(kDeviceAddressBase, kDeviceAddressSpan);
  }

  bool Allocate(int64_t bytes, uint64_t* address) override {
    if (bytes <= 0) return false;
    const int64_t span = RoundUp(bytes, kSegmentAlignment);
    if (used_ + span > capacity_) return false;
    // First fit from the lowest address, like a fresh driver heap: freed ranges come back.
    for (auto it = free_ranges_.begin(); it != free_ranges_.end(); ++it) {
      if (it->second < span) continue;
      const uint64_t start = it->first;
      const int64_t left = it->second - span;
      free_ranges_.erase(it);
      if (left > 0) free_ranges_.emplace(start + static_cast<uint64_t>(span), left);
      used_ += span;
      *address = start;
      return true;
    }
    return false;
  }

  void Release(uint64_t address, int64_t bytes) override {
    if (bytes <= 0) return;
    int64_t span = RoundUp(bytes, kSegmentAlignment);
    used_ -= span;
    uint64_t start = address;
    // Coalesce with the free neighbours on both sides.
    auto next = free_ranges_.lower_bound(start);
    if (next != free_ranges_.end() && start + static_cast<uint64_t>(span) == next->first) {
      span += next->second;
      next = free_ranges_.erase(next);
    }
    if (next != free_ranges_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + static_cast<uint64_t>(prev->second) == start) {
        start = prev->first;
        span += prev->second;
        free_ranges_.erase(prev);
      }
    }
    free_ranges_.emplace(start, span);
  }

  bool Map(int64_t bytes) override {
    if (bytes <= 0 || used_ + bytes > capacity_) return false;
    used_ += bytes;
    return true;
  }

  void Unmap(int64_t bytes) override { used_ -= std::max<int64_t>(bytes, 0); }

  int64_t Capacity() const override { return capacity_; }

 private:
  int64_t capacity_;
  int64_t used_ = 0;
  std::map<uint64_t, int64_t> free_ranges_;  // start -> length, disjoint, coalesced
};

// cudaMalloc replayed from a recording: the driver's addresses, in the order it gave them.
class RecordedDeviceMemory final : public DeviceMemory {
 public:
  RecordedDeviceMemory(int64_t capacity, int64_t used, std::vector<uint64_t> addresses)
      : capacity_(std::max<int64_t>(capacity, 0)),
        used_(std::max<int64_t>(used, 0)),
        addresses_(std::move(addresses)) {
    uint64_t highest = kDeviceAddressBase;
    for (uint64_t a : addresses_) highest = std::max(highest, a);
    // Past the last recorded segment, whatever its size: a recorded segment is smaller than
    // the span a device could hold (kDeviceAddressSpan).
    const auto alignment = static_cast<uint64_t>(kSegmentAlignment);
    next_synthetic_ = (highest / alignment + 1) * alignment + static_cast<uint64_t>(kDeviceAddressSpan);
  }

  bool Allocate(int64_t bytes, uint64_t* address) override {
    if (bytes <= 0 || bytes > capacity_ - used_) return false;
    if (next_ < addresses_.size()) {
      *address = addresses_[next_++];
    } else {
      *address = next_synthetic_;
      next_synthetic_ += static_cast<uint64_t>(RoundUp(bytes, kSegmentAlignment));
    }
    used_ += bytes;
    return true;
  }
  void Release(uint64_t /*address*/, int64_t bytes) override { used_ -= std::max<int64_t>(bytes, 0); }
  bool Map(int64_t bytes) override {
    if (bytes <= 0 || bytes > capacity_ - used_) return false;
    used_ += bytes;
    return true;
  }
  void Unmap(int64_t bytes) override { used_ -= std::max<int64_t>(bytes, 0); }
  int64_t Capacity() const override { return capacity_; }

 private:
  int64_t capacity_;
  int64_t used_;
  std::vector<uint64_t> addresses_;
  size_t next_ = 0;
  uint64_t next_synthetic_ = 0;
};

}  // namespace

std::unique_ptr<DeviceMemory> MakeCapacityDeviceMemory(int64_t capacity_bytes) {
  return std::make_unique<CapacityDeviceMemory>(capacity_bytes);
}

std::unique_ptr<DeviceMemory> MakeRecordedDeviceMemory(int64_t capacity_bytes, int64_t used_bytes,
                                                       std::vector<uint64_t> addresses) {
  return std::make_unique<RecordedDeviceMemory>(capacity_bytes, used_bytes, std::move(addresses));
}

}  // namespace shardscope::sim

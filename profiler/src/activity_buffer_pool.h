// The pre-allocated, capped pool of activity buffers CUPTI fills (private).
//
// Why pre-allocated: CUPTI asks for a buffer from inside the API call that needs one (a
// kernel launch on the issuing thread); allocating there distorts exactly the launch being
// measured (kineto issue #1020). Every buffer is allocated, and zeroed, when the pool is
// created; Acquire/Release only move pointers.
// Why capped: when CUPTI has filled every buffer and none has been flushed back, Acquire
// returns nullptr and CUPTI drops records — counted by cuptiActivityGetNumDroppedRecords and
// reported, never silently lost (ActivitySourceStats::dropped_records).
//
// Buffers are handed out zeroed so CUPTI need not zero them on the issuing thread
// (CUPTI_ACTIVITY_ATTR_ZEROED_OUT_ACTIVITY_BUFFER = 1, cupti_activity.h: otherwise "a few
// stalls may appear in critical path because CUPTI will zero out the buffer in the main
// thread"); Release re-zeroes the bytes CUPTI used. Thread-safe: CUPTI requests and
// completes buffers on its own threads.
#ifndef SHARDSCOPE_PROFILER_SRC_ACTIVITY_BUFFER_POOL_H_
#define SHARDSCOPE_PROFILER_SRC_ACTIVITY_BUFFER_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "shardscope/profiler/activity.h"
#include "shardscope/base/status.h"

namespace shardscope::profiler {

// CUPTI requires activity buffers aligned to ACTIVITY_RECORD_ALIGNMENT (8 bytes,
// CUPTI samples' common helper); operator new[] aligns to at least 16.
inline constexpr int64_t kActivityBufferAlignment = 8;
// Bounds on BufferPoolOptions: CUPTI recommends 1 to 10 MB per buffer (Kineto,
// CuptiActivityApi.cpp); below 64 KiB a buffer holds too few kernel records (~200 B each)
// to be worth a callback. The total cap keeps a mistyped option from taking the host down.
inline constexpr int64_t kMinActivityBufferBytes = int64_t{64} << 10;
inline constexpr int64_t kMaxActivityBufferBytes = int64_t{64} << 20;
inline constexpr int64_t kMaxActivityPoolBytes = int64_t{4} << 30;

struct BufferPoolCounters {
  int64_t requested = 0;   // Acquire calls
  int64_t refused = 0;     // ... that found the pool empty
  int64_t in_use = 0;      // handed out, not yet released
  int64_t high_water = 0;  // most in use at once
  bool operator==(const BufferPoolCounters&) const = default;
};

class ActivityBufferPool {
 public:
  // Validates the options (naming the bad value) and allocates every buffer now.
  static StatusOr<std::unique_ptr<ActivityBufferPool>> Create(const BufferPoolOptions& options);

  ActivityBufferPool(const ActivityBufferPool&) = delete;
  ActivityBufferPool& operator=(const ActivityBufferPool&) = delete;

  // A zeroed buffer of buffer_bytes(), or nullptr when all are out (counted as refused).
  // Never allocates.
  uint8_t* Acquire();
  // Takes back a buffer from Acquire, zeroing its first `used_bytes`. Returns false (and
  // keeps nothing) for a pointer the pool does not own or already holds.
  bool Release(uint8_t* buffer, size_t used_bytes);

  size_t buffer_bytes() const { return buffer_bytes_; }
  int32_t buffer_count() const { return buffer_count_; }
  BufferPoolCounters counters() const;

 private:
  ActivityBufferPool(size_t buffer_bytes, int32_t buffer_count);
  // Index of the buffer starting at `buffer`, or -1.
  int64_t IndexOf(const uint8_t* buffer) const;

  const size_t buffer_bytes_;
  const int32_t buffer_count_;
  std::unique_ptr<uint8_t[]> storage_;
  mutable std::mutex mutex_;
  std::vector<uint8_t*> free_;      // LIFO: the most recently used buffer is warm in cache
  std::vector<bool> handed_out_;    // by index
  BufferPoolCounters counters_;
};

}  // namespace shardscope::profiler

#endif  // SHARDSCOPE_PROFILER_SRC_ACTIVITY_BUFFER_POOL_H_

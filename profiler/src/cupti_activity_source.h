// The CUPTI activity source (private): buffer protocol, drop accounting, flush and finalize
// order, over an injected CuptiApi — Kineto's structure (CuptiActivityProfiler takes a
// CuptiActivityApi&), so the tests drive the real source with a fake CUPTI and a machine
// without CUPTI never reaches a CUPTI call.
//
// The protocol (cupti_activity.h, cuptiActivityRegisterCallbacks):
//   - CUPTI calls RequestBuffer when it needs space, on whichever thread is recording; we hand
//     out a pre-allocated pool buffer or decline (nullptr): CUPTI then drops records and
//     counts them for cuptiActivityGetNumDroppedRecords.
//   - CUPTI calls CompleteBuffer with a full (or flushed) buffer; we queue it — no decoding,
//     no allocation (the queue is reserved for every pool buffer) — and read the drop count.
//   - Flush() (between steps) flushes CUPTI, decodes queued buffers into records, delivers
//     them to the sink and returns the buffers to the pool.
//   - Finalize(): forced flush, deliver, disable every kind, cuptiFinalize (PyTorch #144455:
//     without it a 10-20% slowdown stayed after profiling).
#ifndef SHARDSCOPE_PROFILER_SRC_CUPTI_ACTIVITY_SOURCE_H_
#define SHARDSCOPE_PROFILER_SRC_CUPTI_ACTIVITY_SOURCE_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "activity_buffer_pool.h"
#include "shardscope/profiler/activity.h"
#include "shardscope/base/status.h"

namespace shardscope::profiler {

// Called by the CUPTI backend from CUPTI's buffer callbacks.
class ActivityBufferCallbacks {
 public:
  virtual ~ActivityBufferCallbacks() = default;
  // A buffer for CUPTI to fill, or nullptr to decline; *size is set to its size (0 if none).
  virtual uint8_t* RequestBuffer(size_t* size) = 0;
  // CUPTI is done with `buffer`; its first valid_bytes hold records.
  virtual void CompleteBuffer(uint8_t* buffer, size_t valid_bytes) = 0;
};

// The CUPTI calls the source makes, one method per CUPTI entry point it needs.
class CuptiApi {
 public:
  virtual ~CuptiApi() = default;
  virtual Status EnableKind(ActivityKind kind) = 0;    // cuptiActivityEnable
  virtual Status DisableKind(ActivityKind kind) = 0;   // cuptiActivityDisable
  // cuptiActivityRegisterCallbacks, after telling CUPTI that buffers come zeroed.
  virtual Status RegisterCallbacks(ActivityBufferCallbacks* callbacks) = 0;
  virtual Status FlushAll(bool forced) = 0;            // cuptiActivityFlushAll(0 | FORCED)
  // Records dropped since the last call (cuptiActivityGetNumDroppedRecords resets its count).
  virtual int64_t TakeDroppedRecords() = 0;
  // Appends the records of one completed buffer (cuptiActivityGetNextRecord).
  virtual Status Decode(const uint8_t* buffer, size_t valid_bytes, std::vector<ActivityRecord>& out) = 0;
  virtual int64_t Timestamp() = 0;                     // cuptiGetTimestamp
  virtual void PushExternalId(uint64_t id) = 0;        // ...PushExternalCorrelationId(CUSTOM0)
  virtual void PopExternalId() = 0;                    // ...PopExternalCorrelationId(CUSTOM0)
  virtual Status Finalize() = 0;                       // cuptiFinalize
};

// How many times this process tried to dlopen libcupti (0 or 1: it is loaded once, whatever
// calls ProbeCuptiCapture, CreateCuptiActivitySource and CuptiStreamId make). Tests only.
int CuptiDlopenAttemptsForTesting();

class CuptiActivitySource final : public ActivitySource, private ActivityBufferCallbacks {
 public:
  CuptiActivitySource(std::unique_ptr<CuptiApi> api, std::unique_ptr<ActivityBufferPool> pool,
                      ActivitySink& sink);
  ~CuptiActivitySource() override;  // finalizes if the caller did not; never throws

  Status Enable(std::span<const ActivityKind> kinds) override;
  Status Flush() override;
  Status Finalize() override;
  int64_t Timestamp() const override { return api_->Timestamp(); }
  int64_t DroppedRecords() const override { return dropped_.load(std::memory_order_relaxed); }
  ActivitySourceStats Stats() const override;
  void PushOpId(int64_t op_id) override;
  void PopOpId() override;

 private:
  uint8_t* RequestBuffer(size_t* size) override;
  void CompleteBuffer(uint8_t* buffer, size_t valid_bytes) override;
  // Decodes and delivers every queued buffer, then returns it to the pool.
  Status DrainCompleted();

  struct CompletedBuffer {
    uint8_t* data = nullptr;
    size_t valid_bytes = 0;
  };

  std::unique_ptr<CuptiApi> api_;
  std::unique_ptr<ActivityBufferPool> pool_;
  ActivitySink& sink_;
  std::vector<ActivityKind> enabled_;
  bool finalized_ = false;
  std::atomic<int64_t> dropped_{0};

  mutable std::mutex completed_mutex_;
  std::vector<CompletedBuffer> completed_;  // capacity = pool size: pushing never allocates
  int64_t buffers_completed_ = 0;           // under completed_mutex_
  int64_t buffers_unknown_ = 0;             // completions of buffers not from the pool

  // Touched only by Flush/Finalize (the owning thread).
  std::vector<CompletedBuffer> draining_;
  std::vector<ActivityRecord> decoded_;
  std::array<int64_t, kNumActivityKinds> records_by_kind_ = {};
  int64_t flushes_ = 0;
};

}  // namespace shardscope::profiler

#endif  // SHARDSCOPE_PROFILER_SRC_CUPTI_ACTIVITY_SOURCE_H_

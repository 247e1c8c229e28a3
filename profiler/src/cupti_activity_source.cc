// The CUPTI activity source's protocol logic. No CUPTI call is made here: they go through
// CuptiApi (cupti_api.cc, compiled against CUPTI only when the toolkit was found).
#include "cupti_activity_source.h"

#include <fmt/format.h>

#include <algorithm>

namespace shardscope::profiler {

CuptiActivitySource::CuptiActivitySource(std::unique_ptr<CuptiApi> api,
                                         std::unique_ptr<ActivityBufferPool> pool, ActivitySink& sink)
    : api_(std::move(api)), pool_(std::move(pool)), sink_(sink) {
  completed_.reserve(static_cast<size_t>(pool_->buffer_count()));
  draining_.reserve(static_cast<size_t>(pool_->buffer_count()));
}

CuptiActivitySource::~CuptiActivitySource() {
  // Log-and-ignore is the only policy a destructor has; the caller who wants the status
  // calls Finalize() first.
  if (!finalized_ && !enabled_.empty()) {
    const Status status = Finalize();
    if (!status.ok()) fmt::print(stderr, "warning: CUPTI teardown: {}\n", status.message());
  }
}

Status CuptiActivitySource::Enable(std::span<const ActivityKind> kinds) {
  if (finalized_) return Status::Internal("CUPTI activity source: Enable after Finalize");
  if (enabled_.empty()) SHARDSCOPE_RETURN_IF_ERROR(api_->RegisterCallbacks(this));
  for (ActivityKind kind : kinds) {
    if (std::find(enabled_.begin(), enabled_.end(), kind) != enabled_.end()) continue;
    SHARDSCOPE_RETURN_IF_ERROR(
        api_->EnableKind(kind).WithContext(fmt::format("enabling CUPTI activity kind {}", ActivityKindName(kind))));
    enabled_.push_back(kind);
  }
  return Status::Ok();
}

uint8_t* CuptiActivitySource::RequestBuffer(size_t* size) {
  uint8_t* buffer = pool_->Acquire();
  *size = buffer != nullptr ? pool_->buffer_bytes() : 0;
  return buffer;
}

void CuptiActivitySource::CompleteBuffer(uint8_t* buffer, size_t valid_bytes) {
  // Read (and reset) CUPTI's drop count whenever a buffer comes back, as Kineto does in
  // bufferCompleted; Finalize reads it once more after the last flush.
  dropped_.fetch_add(api_->TakeDroppedRecords(), std::memory_order_relaxed);
  if (buffer == nullptr) return;
  std::lock_guard<std::mutex> lock(completed_mutex_);
  if (completed_.size() == completed_.capacity()) {
    // Only possible for a buffer that is not ours (each pool buffer completes once).
    ++buffers_unknown_;
    return;
  }
  completed_.push_back(CompletedBuffer{buffer, valid_bytes});
  ++buffers_completed_;
}

Status CuptiActivitySource::DrainCompleted() {
  {
    std::lock_guard<std::mutex> lock(completed_mutex_);
    draining_.swap(completed_);  // both keep their reserved capacity
  }
  Status first_error;
  for (const CompletedBuffer& buffer : draining_) {
    decoded_.clear();
    Status decoded = api_->Decode(buffer.data, buffer.valid_bytes, decoded_);
    if (!decoded.ok() && first_error.ok()) first_error = decoded;
    for (const ActivityRecord& record : decoded_) ++records_by_kind_[static_cast<size_t>(KindOf(record))];
    if (!decoded_.empty()) sink_.OnActivities(decoded_);
    if (!pool_->Release(buffer.data, buffer.valid_bytes) && first_error.ok()) {
      first_error = Status::Internal("CUPTI completed a buffer the activity pool did not hand out");
    }
  }
  draining_.clear();
  return first_error;
}

Status CuptiActivitySource::Flush() {
  if (finalized_) return Status::Ok();
  ++flushes_;
  // Not forced: CUPTI returns only buffers it has finished with (cuptiActivityFlushAll(0)).
  SHARDSCOPE_RETURN_IF_ERROR(api_->FlushAll(/*forced=*/false));
  return DrainCompleted();
}

Status CuptiActivitySource::Finalize() {
  if (finalized_) return Status::Ok();
  finalized_ = true;
  ++flushes_;
  Status first_error = api_->FlushAll(/*forced=*/true);
  Status drained = DrainCompleted();
  if (first_error.ok()) first_error = drained;
  dropped_.fetch_add(api_->TakeDroppedRecords(), std::memory_order_relaxed);
  for (ActivityKind kind : enabled_) {
    Status disabled = api_->DisableKind(kind);
    if (first_error.ok()) first_error = disabled;
  }
  if (!enabled_.empty()) {
    Status finalized = api_->Finalize();
    if (first_error.ok()) first_error = finalized;
  }
  return first_error;
}

ActivitySourceStats CuptiActivitySource::Stats() const {
  ActivitySourceStats stats;
  stats.records_by_kind = records_by_kind_;
  stats.dropped_records = DroppedRecords();
  const BufferPoolCounters counters = pool_->counters();
  stats.buffers_requested = counters.requested;
  stats.buffers_refused = counters.refused;
  stats.buffer_high_water = counters.high_water;
  {
    std::lock_guard<std::mutex> lock(completed_mutex_);
    stats.buffers_completed = buffers_completed_;
  }
  stats.flushes = flushes_;
  return stats;
}

void CuptiActivitySource::PushOpId(int64_t op_id) { api_->PushExternalId(static_cast<uint64_t>(op_id)); }

void CuptiActivitySource::PopOpId() { api_->PopExternalId(); }

OpIssueCallbacks MakeOpIssueCallbacks(ActivitySource& source) {
  OpIssueCallbacks callbacks;
  callbacks.before_issue = [&source](int64_t op_id) { source.PushOpId(op_id); };
  callbacks.after_issue = [&source](int64_t) { source.PopOpId(); };
  return callbacks;
}

}  // namespace shardscope::profiler

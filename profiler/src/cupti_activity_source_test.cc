// The CUPTI source's protocol (pool, drops, flush, finalize) driven by a fake CUPTI, and the
// real probe, which on a machine without a driver or device must report "unavailable".
#include "cupti_activity_source.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>

#include "activity_buffer_pool.h"

namespace shardscope::profiler {
namespace {

// Behaves as CUPTI does towards its client (cupti_activity.h): asks for a buffer when it
// needs space, drops (and counts) the record when none is given, hands full buffers back
// at once and the partially filled one only on a forced flush. A record is stored as an
// 8-byte index into `table`.
class FakeCuptiApi final : public CuptiApi {
 public:
  struct Log {
    std::vector<std::string> calls;
    std::vector<int64_t> external_ids;  // the stack
  };
  explicit FakeCuptiApi(Log& log) : log_(log) {}

  Status EnableKind(ActivityKind kind) override {
    log_.calls.push_back(fmt::format("enable {}", ActivityKindName(kind)));
    return Status::Ok();
  }
  Status DisableKind(ActivityKind kind) override {
    log_.calls.push_back(fmt::format("disable {}", ActivityKindName(kind)));
    return Status::Ok();
  }
  Status RegisterCallbacks(ActivityBufferCallbacks* callbacks) override {
    log_.calls.push_back("register");
    callbacks_ = callbacks;
    return Status::Ok();
  }
  Status FlushAll(bool forced) override {
    log_.calls.push_back(forced ? "flush forced" : "flush");
    if (forced && current_ != nullptr) CompleteCurrent();
    return Status::Ok();
  }
  int64_t TakeDroppedRecords() override { return std::exchange(dropped_, 0); }
  Status Decode(const uint8_t* buffer, size_t valid_bytes, std::vector<ActivityRecord>& out) override {
    for (size_t offset = 0; offset + sizeof(uint64_t) <= valid_bytes; offset += sizeof(uint64_t)) {
      uint64_t index = 0;
      std::memcpy(&index, buffer + offset, sizeof(index));
      out.push_back(table[index]);
    }
    return Status::Ok();
  }
  int64_t Timestamp() override { return 123; }
  void PushExternalId(uint64_t id) override { log_.external_ids.push_back(static_cast<int64_t>(id)); }
  void PopExternalId() override { log_.external_ids.pop_back(); }
  Status Finalize() override {
    log_.calls.push_back("finalize");
    return Status::Ok();
  }

  // CUPTI recording one activity.
  void Emit(const ActivityRecord& record) {
    if (current_ == nullptr) {
      current_ = callbacks_->RequestBuffer(&size_);
      used_ = 0;
      if (current_ == nullptr) {
        ++dropped_;
        return;
      }
    }
    const uint64_t index = table.size();
    table.push_back(record);
    std::memcpy(current_ + used_, &index, sizeof(index));
    used_ += sizeof(index);
    if (used_ + sizeof(index) > size_) CompleteCurrent();
  }

  std::vector<ActivityRecord> table;

 private:
  void CompleteCurrent() {
    callbacks_->CompleteBuffer(current_, used_);
    current_ = nullptr;
  }
  Log& log_;
  ActivityBufferCallbacks* callbacks_ = nullptr;
  uint8_t* current_ = nullptr;
  size_t size_ = 0;
  size_t used_ = 0;
  int64_t dropped_ = 0;
};

class CountingSink final : public ActivitySink {
 public:
  void OnActivities(std::span<const ActivityRecord> batch) override {
    records += static_cast<int64_t>(batch.size());
    ++batches;
  }
  int64_t records = 0;
  int64_t batches = 0;
};

constexpr int64_t kBufferBytes = kMinActivityBufferBytes;  // 65,536 bytes = 8,192 fake records
constexpr int64_t kRecordsPerBuffer = kBufferBytes / 8;

struct Fixture {
  FakeCuptiApi::Log log;
  FakeCuptiApi* fake = nullptr;
  CountingSink sink;
  std::unique_ptr<CuptiActivitySource> source;

  explicit Fixture(int32_t buffers) {
    auto api = std::make_unique<FakeCuptiApi>(log);
    fake = api.get();
    auto pool = ActivityBufferPool::Create(BufferPoolOptions{kBufferBytes, buffers});
    EXPECT_TRUE(pool.ok());
    source = std::make_unique<CuptiActivitySource>(std::move(api), std::move(pool).value(), sink);
  }
  void Emit(int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      KernelRecord kernel;
      kernel.start_ns = i;
      kernel.end_ns = i + 1;
      fake->Emit(kernel);
    }
  }
};

TEST(CuptiActivitySourceTest, EnablesExactlyTheDefaultKindsAndNeverKernel) {
  Fixture f(2);
  ASSERT_TRUE(f.source->Enable(kDefaultActivityKinds).ok());
  const std::vector<std::string> expected = {"register",
                                             "enable concurrent_kernel",
                                             "enable memcpy",
                                             "enable memset",
                                             "enable synchronization",
                                             "enable runtime",
                                             "enable driver",
                                             "enable external_correlation",
                                             "enable overhead"};
  EXPECT_EQ(f.log.calls, expected);
}

TEST(CuptiActivitySourceTest, AFullPoolCountsDroppedRecordsInsteadOfLosingThem) {
  Fixture f(2);
  ASSERT_TRUE(f.source->Enable(kDefaultActivityKinds).ok());
  // Three buffers' worth with no Flush: two buffers fill and wait for the flush, the third
  // request finds the pool empty, and CUPTI drops that buffer's worth of records.
  f.Emit(3 * kRecordsPerBuffer);
  ASSERT_TRUE(f.source->Finalize().ok());
  EXPECT_EQ(f.sink.records, 2 * kRecordsPerBuffer);
  EXPECT_EQ(f.source->DroppedRecords(), kRecordsPerBuffer);
  const ActivitySourceStats stats = f.source->Stats();
  EXPECT_EQ(stats.records_by_kind[static_cast<size_t>(ActivityKind::kConcurrentKernel)], 2 * kRecordsPerBuffer);
  EXPECT_EQ(stats.dropped_records, kRecordsPerBuffer);
  EXPECT_EQ(stats.buffers_completed, 2);
  EXPECT_EQ(stats.buffer_high_water, 2);
  // The fake asks again for every record it cannot place: 2 granted + 8,192 refused.
  EXPECT_EQ(stats.buffers_refused, kRecordsPerBuffer);
  EXPECT_EQ(stats.buffers_requested, 2 + kRecordsPerBuffer);
  // Nothing silently lost: delivered + dropped = emitted.
  EXPECT_EQ(f.sink.records + f.source->DroppedRecords(), 3 * kRecordsPerBuffer);
}

TEST(CuptiActivitySourceTest, FlushingBetweenStepsRecyclesBuffers) {
  Fixture f(2);
  ASSERT_TRUE(f.source->Enable(kDefaultActivityKinds).ok());
  for (int step = 0; step < 3; ++step) {
    f.Emit(2 * kRecordsPerBuffer);  // fills the whole pool
    ASSERT_TRUE(f.source->Flush().ok());
  }
  f.Emit(100);  // a partial buffer: only the forced flush returns it
  EXPECT_EQ(f.sink.records, 6 * kRecordsPerBuffer);
  ASSERT_TRUE(f.source->Finalize().ok());
  EXPECT_EQ(f.sink.records, 6 * kRecordsPerBuffer + 100);
  EXPECT_EQ(f.source->DroppedRecords(), 0);
  EXPECT_EQ(f.source->Stats().buffers_refused, 0);
  EXPECT_EQ(f.source->Stats().flushes, 4);
}

TEST(CuptiActivitySourceTest, FinalizeFlushesForcedThenDisablesThenDetachesOnce) {
  Fixture f(2);
  const std::array<ActivityKind, 2> kinds = {ActivityKind::kConcurrentKernel, ActivityKind::kRuntime};
  ASSERT_TRUE(f.source->Enable(kinds).ok());
  f.log.calls.clear();
  ASSERT_TRUE(f.source->Finalize().ok());
  ASSERT_TRUE(f.source->Finalize().ok());  // idempotent
  const std::vector<std::string> expected = {"flush forced", "disable concurrent_kernel", "disable runtime",
                                             "finalize"};
  EXPECT_EQ(f.log.calls, expected);
}

TEST(CuptiActivitySourceTest, OpIssueCallbacksPushAndPopTheOpId) {
  Fixture f(1);
  const OpIssueCallbacks hooks = MakeOpIssueCallbacks(*f.source);
  hooks.before_issue(41);
  EXPECT_EQ(f.log.external_ids, std::vector<int64_t>{41});
  hooks.before_issue(42);  // nested
  EXPECT_EQ(f.log.external_ids, (std::vector<int64_t>{41, 42}));
  hooks.after_issue(42);
  hooks.after_issue(41);
  EXPECT_TRUE(f.log.external_ids.empty());
}

TEST(ActivityBufferPoolTest, RejectsBadOptions) {
  EXPECT_EQ(ActivityBufferPool::Create({1000, 4}).status().message(),
            "activity buffer size: expected a multiple of 8 bytes between 65536 and 67108864, got 1000");
  EXPECT_EQ(ActivityBufferPool::Create({kBufferBytes, 0}).status().message(),
            "activity buffer count: expected at least 1, got 0");
  EXPECT_FALSE(ActivityBufferPool::Create({int64_t{64} << 20, 65}).ok());  // 4,160 MiB > 4 GiB
}

TEST(ActivityBufferPoolTest, HandsOutZeroedBuffersUpToItsCapAndTakesBackOnlyItsOwn) {
  auto pool = ActivityBufferPool::Create({kBufferBytes, 2});
  ASSERT_TRUE(pool.ok());
  uint8_t* a = (*pool)->Acquire();
  uint8_t* b = (*pool)->Acquire();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ((*pool)->Acquire(), nullptr);
  std::memset(a, 0xAB, 100);
  EXPECT_TRUE((*pool)->Release(a, 100));
  EXPECT_FALSE((*pool)->Release(a, 100));      // already back
  uint8_t foreign[8] = {};
  EXPECT_FALSE((*pool)->Release(foreign, 8));  // not ours
  EXPECT_FALSE((*pool)->Release(b + 8, 8));    // not a buffer start
  uint8_t* again = (*pool)->Acquire();
  EXPECT_EQ(again, a);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(again[i], 0) << i;
  const BufferPoolCounters expected{.requested = 4, .refused = 1, .in_use = 2, .high_water = 2};
  EXPECT_EQ((*pool)->counters(), expected);
}

TEST(CuptiProbeTest, ReportsUnavailableWithoutADeviceAndTheCallerFallsBack) {
  const Status probe = ProbeCuptiCapture();
  if (probe.ok()) GTEST_SKIP() << "a GPU and libcupti are present: capture is available here";
  // No driver, no device, or built without CUDA: each says why, never aborts.
  EXPECT_EQ(probe.message().rfind("CUPTI capture unavailable: ", 0), 0u) << probe.message();
  CountingSink sink;
  auto source = CreateCuptiActivitySource(sink, BufferPoolOptions{});
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.status().message(), probe.message());
  const std::string warning = FallbackWarning(probe);
  EXPECT_EQ(warning.rfind("warning: --profile: CUPTI capture unavailable: ", 0), 0u) << warning;
  EXPECT_NE(warning.find("writing the host-side timeline only"), std::string::npos);
}

TEST(ActivityNamesTest, ApiVersionSuffixIsStripped) {
  EXPECT_EQ(StripApiVersionSuffix("cudaLaunchKernel_v7000"), "cudaLaunchKernel");
  EXPECT_EQ(StripApiVersionSuffix("cuLaunchKernelEx"), "cuLaunchKernelEx");
  EXPECT_EQ(StripApiVersionSuffix("cuMemcpy_v2x"), "cuMemcpy_v2x");
  EXPECT_EQ(StripApiVersionSuffix("name_v"), "name_v");
}

}  // namespace
}  // namespace shardscope::profiler

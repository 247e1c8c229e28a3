// The runtime core's control flow as the CUDA backend drives it, on a fake device that
// records every call (as profiler/src/cupti_activity_source_test.cc fakes CUPTI): the order
// of stream work, events and collectives, the events around each collective, the watchdog
// firing on a collective that never completes, and errors from the device (a failed event
// query, a failed collective) coming back as the rank's error. Expected orders are written
// out by hand from the tiny program below.
#include "rank_executor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "plan_test_util.h"
#include "watchdog.h"

namespace shardscope::runtime {
namespace {

using traces::CollectiveType;
using traces::DType;

using test_util::FakeCosts;
using test_util::MakeOp;

traces::CollectiveOp Coll(CollectiveType type, int64_t bytes) { return test_util::Coll(type, 0, bytes, DType::kBFloat16); }

// One rank: allocate, all_gather on the comm stream, record an event there, make the compute
// stream wait for it, a GEMM, a reduce_scatter, free, device synchronize.
traces::Schedule TinySchedule() {
  traces::Schedule s;
  s.communicators = {{"world", {0}}};
  traces::Program p;
  p.name = "tiny";
  p.streams = {{"compute", 0}, {"comm", -1}};
  p.events = {"ag_done"};
  p.tensors = {"buf"};
  p.comm_slots = {"world"};
  p.ops.push_back(MakeOp(10, traces::AllocateOp{0, 3000, 0}));
  p.ops.push_back(MakeOp(11, Coll(CollectiveType::kAllGather, 4096)));
  p.ops.push_back(MakeOp(12, traces::EventRecordOp{0, 1}));
  p.ops.push_back(MakeOp(13, traces::StreamWaitEventOp{0, 0}));
  p.ops.push_back(MakeOp(14, traces::KernelOp{0, traces::GemmDesc{64, 64, 64, 1, DType::kBFloat16}}));
  p.ops.push_back(MakeOp(15, Coll(CollectiveType::kReduceScatter, 4096)));
  p.ops.push_back(MakeOp(16, traces::FreeOp{0}));
  p.ops.push_back(MakeOp(17, traces::DeviceSynchronizeOp{}));
  s.programs = {p};
  s.ranks = {{0, {}}};
  EXPECT_TRUE(s.ResolveBindings().ok());
  return s;
}

class FakeEvent final : public DeviceEvent {
 public:
  explicit FakeEvent(int32_t event_id) : id(event_id) {}
  int32_t id;
};

class NoStreamEvents final : public sim::StreamEvents {
 public:
  sim::EventToken Record(sim::AllocStream) override { return 0; }
  bool Query(sim::EventToken) override { return true; }
  void Synchronize(sim::EventToken) override {}
};

// Records every call as a line; event queries answer through `query` (by event id, in
// creation order), collectives and device synchronizations can fail on demand.
class FakeDevice final : public Device {
 public:
  sim::DeviceMemory& AllocatorMemory() override { return *memory_; }
  sim::StreamEvents& AllocatorEvents() override { return events_; }
  Status Kernel(const OpPlan& op, int32_t, int32_t) override { return Log(fmt::format("kernel {} s{}", op.op_id, op.stream)); }
  Status Memcpy(const OpPlan& op, int32_t, int32_t) override { return Log(fmt::format("memcpy {} s{}", op.op_id, op.stream)); }
  Status Collective(const OpPlan& op, int32_t, int32_t, int64_t record) override {
    SHARDSCOPE_RETURN_IF_ERROR(Log(fmt::format("collective {} s{} record {}", op.op_id, op.stream, record)));
    if (fail_collective == op.op_id) return Status::Internal("ncclAllGather failed: unhandled cuda error");
    return Status::Ok();
  }
  Status RecordEvent(const OpPlan& op, int32_t, int32_t) override {
    return Log(fmt::format("event_record {} e{} s{}", op.op_id, op.event, op.stream));
  }
  Status StreamWaitEvent(const OpPlan& op, int32_t, int32_t) override {
    return Log(fmt::format("stream_wait {} s{} e{}", op.op_id, op.stream, op.event));
  }
  Status SynchronizeStream(const OpPlan& op) override { return Log(fmt::format("sync_stream {}", op.op_id)); }
  Status SynchronizeDevice(const OpPlan& op) override {
    if (on_device_sync) on_device_sync();
    return Log(fmt::format("sync_device {}", op.op_id));
  }
  Status SynchronizeEvent(const OpPlan& op) override { return Log(fmt::format("sync_event {}", op.op_id)); }
  void HostWork(int64_t ns) override { (void)Log(fmt::format("host_work {}", ns)); }
  Status BeginStep(int32_t step, bool measured) override {
    return Log(fmt::format("begin_step {}{}", step, measured ? " measured" : ""));
  }
  StatusOr<int64_t> EndStep(int32_t step, bool, bool timed) override {
    SHARDSCOPE_RETURN_IF_ERROR(Log(fmt::format("end_step {}{}", step, timed ? " timed" : "")));
    return int64_t{1000 + step};
  }
  bool TracksCollectivesWithEvents() const override { return true; }
  StatusOr<std::unique_ptr<DeviceEvent>> CreateEvent() override {
    SHARDSCOPE_RETURN_IF_ERROR(Log(fmt::format("create_event e{}", next_event_)));
    return std::unique_ptr<DeviceEvent>(std::make_unique<FakeEvent>(next_event_++));
  }
  Status RecordOn(DeviceEvent& event, int32_t stream) override {
    return Log(fmt::format("record_on e{} s{}", static_cast<FakeEvent&>(event).id, stream));
  }
  StatusOr<bool> QueryEvent(DeviceEvent& event) override {
    return query ? query(static_cast<FakeEvent&>(event).id) : StatusOr<bool>(true);
  }
  Status MakeCurrent() override { return make_current_fails ? Status::Internal("cudaSetDevice failed: boom") : Status::Ok(); }
  Status AsyncError() override {
    std::lock_guard lock(async_mu);
    return async_error;
  }
  void SetAsyncError(Status status) {
    std::lock_guard lock(async_mu);
    async_error = std::move(status);
  }
  Status TakeAllocatorError() override { return std::exchange(allocator_error, Status::Ok()); }
  void AbortCollectives() override { aborted = true; }

  std::vector<std::string> log;
  std::function<StatusOr<bool>(int32_t)> query;
  std::function<void()> on_device_sync;
  int64_t fail_collective = -1;
  std::atomic<bool> aborted{false};
  std::atomic<bool> make_current_fails{false};
  std::mutex async_mu;
  Status async_error = Status::Ok();    // under async_mu
  Status allocator_error = Status::Ok();  // returned (once) after the next allocator call

 private:
  Status Log(std::string line) {
    log.push_back(std::move(line));
    return Status::Ok();
  }
  std::unique_ptr<sim::DeviceMemory> memory_ = sim::MakeCapacityDeviceMemory(int64_t{1} << 30);
  NoStreamEvents events_;
  int32_t next_event_ = 0;
};

struct Harness {
  traces::Schedule schedule = TinySchedule();
  sim::SimulationSetup setup;
  FakeCosts costs;
  ExecutionPlan plan;
  RunOptions options;
  FakeDevice device;
  std::unique_ptr<RankExecutor> executor;

  explicit Harness(int32_t warmup = 0, int32_t steps = 1) {
    StatusOr<ExecutionPlan> p = BuildExecutionPlan(schedule, 0, 1, costs);
    EXPECT_TRUE(p.ok()) << p.status().message();
    plan = std::move(*p);
    options.warmup = warmup;
    options.steps = steps;
    options.out_dir = (std::filesystem::temp_directory_path() /
                       fmt::format("shardscope_rank_executor_test_{}", ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                          .string();
    executor = std::make_unique<RankExecutor>(schedule, setup, plan, options, device);
  }
};

// By hand from TinySchedule: the allocation and the free reach no device call (the allocator
// is the core's); each collective is bracketed by two new events on its stream (e0/e1 for op
// 11, e2/e3 for op 15), the record between them carrying its Flight Recorder record.
const std::vector<std::string> kOneStep = {
    "begin_step 0 measured",
    "create_event e0", "create_event e1", "record_on e0 s1", "collective 11 s1 record 0", "record_on e1 s1",
    "event_record 12 e0 s1",
    "stream_wait 13 s0 e0",
    "kernel 14 s0",
    "create_event e2", "create_event e3", "record_on e2 s1", "collective 15 s1 record 1", "record_on e3 s1",
    "sync_device 17",
    "end_step 0 timed",
};

TEST(RankExecutorTest, IssuesStreamWorkEventsAndCollectivesInProgramOrder) {
  Harness h;
  ASSERT_TRUE(h.executor->RunSteps().ok());
  EXPECT_EQ(h.device.log, kOneStep);
  const RankResult r = h.executor->Result();
  EXPECT_TRUE(r.finished);
  EXPECT_EQ(r.step_times, std::vector<int64_t>{1000});
  EXPECT_EQ(r.capacity, int64_t{1} << 30);
}

TEST(RankExecutorTest, WarmUpStepsAreNotTimedAndHooksSeeEveryOpInOrder) {
  Harness h(/*warmup=*/1, /*steps=*/1);
  std::vector<int64_t> before, after;
  h.options.hooks.before_issue = [&](int64_t id) { before.push_back(id); };
  h.options.hooks.after_issue = [&](int64_t id) { after.push_back(id); };
  ASSERT_TRUE(h.executor->RunSteps().ok());
  const std::vector<int64_t> ids = {10, 11, 12, 13, 14, 15, 16, 17, 10, 11, 12, 13, 14, 15, 16, 17};
  EXPECT_EQ(before, ids);
  EXPECT_EQ(after, ids);
  EXPECT_EQ(h.device.log.front(), "begin_step 0");
  EXPECT_NE(std::find(h.device.log.begin(), h.device.log.end(), "end_step 0"), h.device.log.end());
  EXPECT_EQ(h.device.log.back(), "end_step 1 timed");
  EXPECT_EQ(h.executor->Result().step_times, std::vector<int64_t>{1001});
}

TEST(RankExecutorTest, CollectivesAdvanceOnlyWhenTheirEventsComplete) {
  Harness h;
  // e1 (op 11's end) completes; e2 (op 15's start) does, e3 (its end) never does.
  h.device.query = [](int32_t id) -> StatusOr<bool> { return id != 3; };
  ASSERT_TRUE(h.executor->RunSteps().ok());
  // Per communicator: issued, started, completed.
  EXPECT_EQ(h.executor->ProgressState(), (std::vector<int64_t>{2, 0, 0}));
  h.executor->PollCollectives();
  EXPECT_EQ(h.executor->ProgressState(), (std::vector<int64_t>{2, 2, 1}));
  EXPECT_TRUE(h.executor->HasPendingCollectives());
  h.executor->PollCollectives();
  EXPECT_EQ(h.executor->ProgressState(), (std::vector<int64_t>{2, 2, 1}));
}

TEST(RankExecutorTest, AFailedEventQueryBecomesTheRanksError) {
  Harness h;
  h.device.query = [](int32_t id) -> StatusOr<bool> {
    if (id == 3) return Status::Internal("cudaEventQuery failed: an illegal memory access was encountered");
    return true;
  };
  // The watchdog polls while the host thread waits in the device synchronization.
  h.device.on_device_sync = [&] { h.executor->PollCollectives(); };
  const Status status = h.executor->RunSteps();
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.message(), "rank 0 op 15: cudaEventQuery failed: an illegal memory access was encountered");
  EXPECT_FALSE(h.executor->HasPendingCollectives());  // not left waiting as "not finished"
  // Op 11 started and completed, op 15 started (e2) and failed (e3).
  EXPECT_EQ(h.executor->ProgressState(), (std::vector<int64_t>{2, 2, 1}));
}

TEST(RankExecutorTest, AFailedCollectiveStopsTheRankWithItsOpId) {
  Harness h;
  h.device.fail_collective = 11;
  const Status status = h.executor->RunSteps();
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.message(), "rank 0 op 11: ncclAllGather failed: unhandled cuda error");
  // Nothing after the failed call: not its end event, not the next op.
  const std::vector<std::string> expected = {"begin_step 0 measured", "create_event e0", "create_event e1",
                                             "record_on e0 s1", "collective 11 s1 record 0"};
  EXPECT_EQ(h.device.log, expected);
}

TEST(RankExecutorTest, ACaptureSkipsSynchronizationsAndCollectiveEvents) {
  Harness h;
  h.executor->SetCapturing(true);
  for (int32_t i = 1; i < 8; ++i) ASSERT_TRUE(h.executor->IssueOp(i, 0).ok());
  const std::vector<std::string> expected = {"collective 11 s1 record -1", "event_record 12 e0 s1",
                                             "stream_wait 13 s0 e0", "kernel 14 s0",
                                             "collective 15 s1 record -1"};
  EXPECT_EQ(h.device.log, expected);
  EXPECT_EQ(h.executor->ProgressState(), (std::vector<int64_t>{0, 0, 0}));
}

TEST(RankExecutorTest, AnInjectedOomStopsTheRankAtThatAllocation) {
  Harness h;
  h.options.inject_oom = sim::InjectedOom{0, 10};
  ASSERT_TRUE(h.executor->RunSteps().ok());
  EXPECT_TRUE(h.executor->stopped());
  EXPECT_EQ(h.device.log, (std::vector<std::string>{"begin_step 0 measured", "end_step 0"}));
  const RankResult r = h.executor->Result();
  EXPECT_FALSE(r.finished);
  ASSERT_TRUE(r.oom.has_value());
  EXPECT_TRUE(r.oom->injected);
  EXPECT_EQ(r.oom->op_id, 10);
  EXPECT_EQ(r.oom->requested, 3000);
  EXPECT_EQ(r.num_ooms, 1);
  EXPECT_TRUE(r.step_times.empty());
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

TEST(WatchdogTest, FiresOnACollectiveThatNeverCompletesDumpsAndEndsTheJob) {
  Harness h;
  h.options.timeout_s = 0.05;
  std::filesystem::remove_all(h.options.out_dir);
  h.device.query = [](int32_t id) -> StatusOr<bool> { return id != 3; };  // op 15 never ends
  ASSERT_TRUE(h.executor->RunSteps().ok());
  h.executor->SetFinished();
  std::atomic<bool> ended{false};
  WatchdogConfig config;
  config.timeout_s = h.options.timeout_s;
  config.stalled_after_finish = false;  // the CUDA backend's rule
  config.end_job = [&] { ended = true; };
  Watchdog watchdog({h.executor.get()}, nullptr, config);
  watchdog.Start();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!ended && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  watchdog.Stop();
  ASSERT_TRUE(ended);
  EXPECT_TRUE(h.device.aborted);  // ncclCommAbort before the end of the job
  const nlohmann::json dump = ReadJson(h.options.out_dir + "/flight_recorder/rank_0.json");
  // All_gather #1 completed; reduce_scatter #2 started (its start event completed) and is
  // where the rank is blocked.
  ASSERT_EQ(dump["entries"].size(), 2u);
  EXPECT_EQ(dump["entries"][0]["state"], "completed");
  EXPECT_EQ(dump["entries"][1]["state"], "started");
  EXPECT_EQ(dump["pg_status"]["0"]["last_completed_collective"], 1);
  EXPECT_EQ(dump["shardscope"]["blocked_collective"]["schedule_op_id"], 15);
  EXPECT_EQ(dump["shardscope"]["blocked_collective"]["collective_seq_id"], 2);
  EXPECT_NE(dump["shardscope"]["reason"].get<std::string>().find("watchdog timeout"), std::string::npos);
  std::filesystem::remove_all(h.options.out_dir);
}

TEST(WatchdogTest, StaysQuietWhileEveryCollectiveCompletes) {
  Harness h;
  h.options.timeout_s = 0.05;
  ASSERT_TRUE(h.executor->RunSteps().ok());
  h.executor->SetFinished();
  std::atomic<bool> ended{false};
  WatchdogConfig config;
  config.timeout_s = h.options.timeout_s;
  config.stalled_after_finish = false;
  config.end_job = [&] { ended = true; };
  Watchdog watchdog({h.executor.get()}, nullptr, config);
  watchdog.Start();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // six timeouts
  watchdog.Stop();
  EXPECT_FALSE(ended);
  EXPECT_FALSE(h.device.aborted);
  EXPECT_FALSE(h.executor->HasPendingCollectives());
}

TEST(RankExecutorTest, AnErrorBeneathTheAllocatorStopsTheRankAtThatOp) {
  // A cudaEventQuery or cudaMalloc failing with anything but "not ready" / "out of memory"
  // under the allocator (CudaStreamEvents, OperandDeviceMemory) is the rank's error at the
  // allocator call that met it: op 10, the allocate. Nothing after it is issued.
  Harness h;
  h.device.allocator_error = Status::Internal("cudaEventQuery (record_stream) failed: an illegal memory access");
  const Status status = h.executor->RunSteps();
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.message(), "rank 0 op 10: cudaEventQuery (record_stream) failed: an illegal memory access");
  EXPECT_EQ(h.device.log, (std::vector<std::string>{"begin_step 0 measured"}));
  EXPECT_FALSE(h.executor->stopped());  // an error, not an out-of-memory
}

TEST(RankExecutorTest, AnAsyncDeviceErrorFailsTheRankAtItsNextOp) {
  // NCCL's asynchronous error (a peer or the network failed) reaches no call: the watchdog's
  // poll (PollCollectives, while the host thread sits in op 11's all_gather here) records it,
  // and the host thread stops at the next op it would issue (op 12).
  Harness h;
  bool polled = false;
  h.device.on_device_sync = nullptr;
  h.device.SetAsyncError(Status::Internal("NCCL asynchronous error (ncclCommGetAsyncError) failed: remote process "
                                          "exited or there was a network error"));
  h.options.hooks.after_issue = [&](int64_t id) {
    if (id == 11 && !polled) {
      polled = true;
      h.executor->PollCollectives();
    }
  };
  const Status status = h.executor->RunSteps();
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("rank 0: NCCL asynchronous error"), std::string::npos) << status.message();
  EXPECT_TRUE(h.executor->failed());
  // Op 11 was issued; op 12 (the event record) never reached the device.
  EXPECT_EQ(h.device.log.back(), "record_on e1 s1");
}

TEST(RankExecutorTest, AWatchdogThatCannotBindTheDeviceFailsTheRank) {
  // Before: a failed cudaSetDevice on the watchdog thread skipped the poll silently, and the
  // collectives stayed "not finished" until the timeout.
  Harness h;
  ASSERT_TRUE(h.executor->RunSteps().ok());
  h.device.make_current_fails = true;
  h.executor->PollCollectives();
  EXPECT_TRUE(h.executor->failed());
  EXPECT_EQ(h.executor->device_error().message(),
            "rank 0: the watchdog cannot bind the device: cudaSetDevice failed: boom");
}

// The watchdog ends the job on a rank's error in about one poll (20 ms) plus the dump, not
// after its timeout: with a 300 s timeout, anything under 20 s is the error path.
void ExpectJobEndsOnFailure(Harness& h, const std::function<void()>& fail, const std::string& reason_part) {
  h.options.timeout_s = 300;
  std::filesystem::remove_all(h.options.out_dir);
  ASSERT_TRUE(h.executor->RunSteps().ok());
  std::atomic<bool> ended{false};
  WatchdogConfig config;
  config.timeout_s = h.options.timeout_s;
  config.stalled_after_finish = false;
  config.end_job = [&] { ended = true; };
  Watchdog watchdog({h.executor.get()}, nullptr, config);
  const auto start = std::chrono::steady_clock::now();
  watchdog.Start();
  fail();
  const auto deadline = start + std::chrono::seconds(20);
  while (!ended && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  watchdog.Stop();
  ASSERT_TRUE(ended) << "the watchdog waited for its timeout";
  EXPECT_TRUE(h.device.aborted);  // ncclCommAbort before the end
  const nlohmann::json dump = ReadJson(h.options.out_dir + "/flight_recorder/rank_0.json");
  const std::string reason = dump["shardscope"]["reason"].get<std::string>();
  EXPECT_NE(reason.find(reason_part), std::string::npos) << reason;
  std::filesystem::remove_all(h.options.out_dir);
}

TEST(WatchdogTest, AnNcclAsyncErrorEndsTheJobWithoutWaitingForTheTimeout) {
  Harness h;
  h.device.query = [](int32_t id) -> StatusOr<bool> { return id != 3; };  // op 15 never ends
  ExpectJobEndsOnFailure(
      h, [&] { h.device.SetAsyncError(Status::Internal("ncclRemoteError: remote process exited")); },
      "the rank failed: rank 0: ncclRemoteError: remote process exited");
}

TEST(WatchdogTest, ARankWhoseHostThreadFailedEndsTheJob) {
  Harness h;
  ExpectJobEndsOnFailure(
      h, [&] { h.executor->Fail(Status::Internal("rank 0 op 14: cublasLtMatmul failed: CUBLAS_STATUS_EXECUTION_FAILED")); },
      "the rank failed: rank 0 op 14: cublasLtMatmul failed");
}

}  // namespace
}  // namespace shardscope::runtime

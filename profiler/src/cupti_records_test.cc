// CUPTI's activity records read in the layout of the libcupti that is loaded (cupti_records.h):
// records built by hand in CUDA 12's struct versions (what a CUDA 12 libcupti writes) decode to
// the same fields as CUDA 13's, an overhead record of the version without a correlationId is
// not read past its end (each record is allocated at its exact size, so ASan would see an
// overread), a library older than CUDA 12.0 is refused, and libcupti is opened once per
// process. Builds with CUPTI's headers only; without them this file holds no test.
#if defined(SHARDSCOPE_HAVE_CUPTI)

#include "cupti_records.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "cupti_activity_source.h"

namespace shardscope::profiler {
namespace {

// A record of type T at its exact size, zeroed.
template <typename T>
std::unique_ptr<T> Record(CUpti_ActivityKind kind) {
  auto r = std::make_unique<T>();
  std::memset(r.get(), 0, sizeof(T));
  r->kind = kind;
  return r;
}

const std::string& Name(bool driver, uint32_t cbid) {
  static std::string name;
  name = (driver ? "driver " : "runtime ") + std::to_string(cbid);
  return name;
}

CuptiRecordLayout Layout(uint32_t version) {
  StatusOr<CuptiRecordLayout> layout = CuptiRecordLayoutFor(version);
  EXPECT_TRUE(layout.ok()) << layout.status().message();
  return *layout;
}

TEST(CuptiRecordLayoutTest, CudaTwelveAndThirteenAreReadOlderAreRefused) {
  const StatusOr<CuptiRecordLayout> old = CuptiRecordLayoutFor(18);  // CUDA 11.8
  ASSERT_FALSE(old.ok());
  EXPECT_NE(old.status().message().find("older than CUDA 12.0"), std::string::npos);
  EXPECT_FALSE(Layout(19).overhead_has_correlation);     // 12.0
  EXPECT_FALSE(Layout(23).overhead_has_correlation);     // 12.5
  EXPECT_TRUE(Layout(24).overhead_has_correlation);      // 12.6
  EXPECT_TRUE(Layout(28).overhead_has_correlation);      // 12.9 update 1
  EXPECT_TRUE(Layout(130001).overhead_has_correlation);  // 13.0 update 1
}

TEST(CuptiRecordDecodeTest, ACudaTwelveKernelRecordReadsAsACudaThirteenOne) {
  for (const bool cuda12 : {true, false}) {
    std::vector<ActivityRecord> out;
    auto fill = [](auto& k) {
      k.start = 1000;
      k.end = 2500;
      k.deviceId = 3;
      k.contextId = 4;
      k.streamId = 17;
      k.correlationId = 99;
      k.name = "_Z6kernelv";
      k.gridX = 8;
      k.gridY = 2;
      k.gridZ = 1;
      k.blockX = 256;
      k.blockY = 1;
      k.blockZ = 1;
      k.registersPerThread = 32;
      k.staticSharedMemory = 1024;
      k.dynamicSharedMemory = 2048;
    };
    if (cuda12) {
      auto k = Record<CUpti_ActivityKernel9>(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
      fill(*k);
      DecodeCuptiRecord(reinterpret_cast<const CUpti_Activity*>(k.get()), Layout(24), Name, out);
    } else {
      auto k = Record<CUpti_ActivityKernel10>(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
      fill(*k);
      DecodeCuptiRecord(reinterpret_cast<const CUpti_Activity*>(k.get()), Layout(130001), Name, out);
    }
    ASSERT_EQ(out.size(), 1u);
    const KernelRecord& r = std::get<KernelRecord>(out[0]);
    EXPECT_EQ(r.start_ns, 1000);
    EXPECT_EQ(r.end_ns, 2500);
    EXPECT_EQ(r.device, 3u);
    EXPECT_EQ(r.context, 4u);
    EXPECT_EQ(r.stream, 17u);
    EXPECT_EQ(r.correlation, 99u);
    EXPECT_EQ(r.name, "_Z6kernelv");
    EXPECT_EQ(r.grid, (std::array<int32_t, 3>{8, 2, 1}));
    EXPECT_EQ(r.block, (std::array<int32_t, 3>{256, 1, 1}));
    EXPECT_EQ(r.registers_per_thread, 32);
    EXPECT_EQ(r.static_shared_memory, 1024);
    EXPECT_EQ(r.dynamic_shared_memory, 2048);
  }
}

TEST(CuptiRecordDecodeTest, CudaTwelveCopyAndSynchronizationRecords) {
  std::vector<ActivityRecord> out;
  auto m = Record<CUpti_ActivityMemcpy5>(CUPTI_ACTIVITY_KIND_MEMCPY);
  m->copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_DTOH;
  m->srcKind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE;
  m->dstKind = CUPTI_ACTIVITY_MEMORY_KIND_PINNED;
  m->bytes = 4096;
  m->start = 10;
  m->end = 20;
  m->streamId = 5;
  m->correlationId = 7;
  DecodeCuptiRecord(reinterpret_cast<const CUpti_Activity*>(m.get()), Layout(21), Name, out);
  auto s = Record<CUpti_ActivitySynchronization>(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION);
  s->type = CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE;
  s->start = 30;
  s->end = 40;
  s->streamId = 5;
  s->cudaEventId = CUPTI_SYNCHRONIZATION_INVALID_VALUE;
  s->correlationId = 8;
  DecodeCuptiRecord(reinterpret_cast<const CUpti_Activity*>(s.get()), Layout(21), Name, out);
  ASSERT_EQ(out.size(), 2u);
  const MemcpyRecord& copy = std::get<MemcpyRecord>(out[0]);
  EXPECT_EQ(copy.direction, MemcpyDirection::kDeviceToHost);
  EXPECT_EQ(copy.src_memory, MemoryKind::kDevice);
  EXPECT_EQ(copy.dst_memory, MemoryKind::kPinned);
  EXPECT_EQ(copy.bytes, 4096);
  EXPECT_EQ(copy.stream, 5u);
  EXPECT_EQ(copy.correlation, 7u);
  const SynchronizationRecord& sync = std::get<SynchronizationRecord>(out[1]);
  EXPECT_EQ(sync.type, SyncType::kStreamSynchronize);
  EXPECT_EQ(sync.stream, std::optional<uint32_t>(5));
  EXPECT_FALSE(sync.event.has_value());
  EXPECT_EQ(sync.correlation, 8u);
}

TEST(CuptiRecordDecodeTest, AnOverheadRecordWithoutCorrelationIsNotReadPastItsEnd) {
  std::vector<ActivityRecord> out;
  auto before = Record<CUpti_ActivityOverhead>(CUPTI_ACTIVITY_KIND_OVERHEAD);  // CUDA 12.0-12.5
  before->overheadKind = CUPTI_ACTIVITY_OVERHEAD_CUPTI_BUFFER_FLUSH;
  before->start = 5;
  before->end = 9;
  DecodeCuptiRecord(reinterpret_cast<const CUpti_Activity*>(before.get()), Layout(21), Name, out);
  auto after = Record<CUpti_ActivityOverhead3>(CUPTI_ACTIVITY_KIND_OVERHEAD);  // 12.6 and newer
  after->overheadKind = CUPTI_ACTIVITY_OVERHEAD_CUPTI_INSTRUMENTATION;
  after->start = 11;
  after->end = 12;
  after->correlationId = 77;
  DecodeCuptiRecord(reinterpret_cast<const CUpti_Activity*>(after.get()), Layout(130001), Name, out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(std::get<OverheadRecord>(out[0]), (OverheadRecord{"CUPTI Buffer Flush", 5, 9, 0}));
  EXPECT_EQ(std::get<OverheadRecord>(out[1]), (OverheadRecord{"CUPTI Instrumentation", 11, 12, 77}));
}

TEST(CuptiLoadingTest, LibcuptiIsOpenedAtMostOncePerProcess) {
  // CuptiStreamId loads libcupti itself (once per stream before); the probe and the source
  // need the driver first. However often they are asked, one dlopen attempt at most.
  for (int i = 0; i < 3; ++i) {
    (void)CuptiStreamId(nullptr);
    (void)ProbeCuptiCapture();
  }
  EXPECT_EQ(CuptiDlopenAttemptsForTesting(), 1);
}

}  // namespace
}  // namespace shardscope::profiler

#endif  // SHARDSCOPE_HAVE_CUPTI

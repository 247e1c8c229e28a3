// The CUDA backend's rank (CudaRank) on a fake CUDA stack: a CudaApi table (cuda_api.h) whose
// entries record every call and answer as a driver would, so the backend's control flow runs
// on a machine without a GPU, a driver or the libraries. What each test checks is what a GPU
// would only show as a hang, a leak or a wrong number: the order of setup against step 0, no
// cudaMalloc / cudaFree inside a step, the capacity from cudaMemGetInfo, record_stream events
// recycled, errors reported as what they are, cuBLASLt plans built at setup, the per-peer
// all_to_all counts both sides of a pair agree on. Expected logs are derived by hand from the
// small programs below. Plumbing alone (the allocator's peaks) is not checked here.
#include "cuda/cuda_rank.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cuda/cuda_api.h"
#include "plan_test_util.h"

namespace shardscope::runtime::cuda {
namespace {

using test_util::FakeCosts;
using test_util::MakeOp;
using traces::CollectiveType;
using traces::DType;

constexpr int64_t kMiB = int64_t{1} << 20;

// ---- The fake CUDA stack. Plain functions (the table holds function pointers), so its state
// is one object the tests reset.
struct FakeState {
  std::vector<std::string> log;
  uintptr_t next_handle = 0x1000;
  std::map<uintptr_t, int64_t> device_buffers;  // cudaMalloc'ed, live
  int64_t events_live = 0, streams_live = 0;
  int64_t heuristic_calls = 0;
  size_t free_bytes = 64 * kMiB * 1024;  // cudaMemGetInfo
  size_t total_bytes = 80 * kMiB * 1024;
  cudaError_t malloc_error = cudaSuccess;     // every cudaMalloc fails with it
  int64_t malloc_limit = -1;                  // a cudaMalloc above it: out of memory (-1: none)
  cudaError_t event_query = cudaSuccess;      // every cudaEventQuery answers it
  ncclResult_t async_error = ncclSuccess;     // ncclCommGetAsyncError's state
};
FakeState* g_fake = nullptr;

template <typename T>
T NewHandle() {
  g_fake->next_handle += 0x100;
  return reinterpret_cast<T>(g_fake->next_handle);
}
void Log(std::string line) { g_fake->log.push_back(std::move(line)); }
uintptr_t Id(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// cudart
cudaError_t GetDeviceCount(int* n) { *n = 1; return cudaSuccess; }
const char* GetErrorString(cudaError_t e) {
  switch (e) {
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    default: return "fake cuda error";
  }
}
cudaError_t GetLastError() { return cudaSuccess; }
cudaError_t SetDevice(int) { return cudaSuccess; }
cudaError_t GetDeviceProperties(cudaDeviceProp* prop, int) {
  *prop = cudaDeviceProp{};
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 132;
  std::strcpy(prop->name, "Fake H100");
  return cudaSuccess;
}
cudaError_t StreamPriorityRange(int* least, int* greatest) {
  *least = 0;
  *greatest = -5;
  return cudaSuccess;
}
cudaError_t DeviceSynchronize() { Log("cudaDeviceSynchronize"); return cudaSuccess; }
cudaError_t MemGetInfo(size_t* free_bytes, size_t* total) {
  Log("cudaMemGetInfo");
  *free_bytes = g_fake->free_bytes;
  *total = g_fake->total_bytes;
  return cudaSuccess;
}
cudaError_t StreamCreate(cudaStream_t* s, unsigned int flags, int priority) {
  *s = NewHandle<cudaStream_t>();
  ++g_fake->streams_live;
  Log(fmt::format("cudaStreamCreateWithPriority {:#x} flags {} priority {}", Id(*s), flags, priority));
  return cudaSuccess;
}
cudaError_t StreamDestroy(cudaStream_t) { --g_fake->streams_live; return cudaSuccess; }
cudaError_t StreamSynchronize(cudaStream_t s) {
  Log(fmt::format("cudaStreamSynchronize {:#x}", Id(s)));
  return cudaSuccess;
}
cudaError_t StreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) { return cudaSuccess; }
cudaError_t EventCreate(cudaEvent_t* e, unsigned int) {
  *e = NewHandle<cudaEvent_t>();
  ++g_fake->events_live;
  Log("cudaEventCreateWithFlags");
  return cudaSuccess;
}
cudaError_t EventDestroy(cudaEvent_t) { --g_fake->events_live; return cudaSuccess; }
cudaError_t EventRecord(cudaEvent_t e, cudaStream_t s) {
  Log(fmt::format("cudaEventRecord {:#x} on {:#x}", Id(e), Id(s)));
  return cudaSuccess;
}
cudaError_t EventQuery(cudaEvent_t) { return g_fake->event_query; }
cudaError_t EventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t EventElapsed(float* ms, cudaEvent_t, cudaEvent_t) { *ms = 1.0f; return cudaSuccess; }
cudaError_t Malloc(void** p, size_t bytes) {
  Log(fmt::format("cudaMalloc {}", bytes));
  if (g_fake->malloc_error != cudaSuccess) return g_fake->malloc_error;  // sticky, as a device error is
  if (g_fake->malloc_limit >= 0 && static_cast<int64_t>(bytes) > g_fake->malloc_limit) return cudaErrorMemoryAllocation;
  *p = NewHandle<void*>();
  g_fake->device_buffers[Id(*p)] = static_cast<int64_t>(bytes);
  return cudaSuccess;
}
cudaError_t Free(void* p) {
  Log("cudaFree");
  g_fake->device_buffers.erase(Id(p));
  return cudaSuccess;
}
cudaError_t MallocHost(void** p, size_t) { *p = NewHandle<void*>(); return cudaSuccess; }
cudaError_t FreeHost(void*) { return cudaSuccess; }
cudaError_t MemsetAsync(void* p, int, size_t bytes, cudaStream_t s) {
  Log(fmt::format("cudaMemsetAsync {} on {:#x}", bytes, Id(s)));
  (void)p;
  return cudaSuccess;
}
cudaError_t MemcpyAsync(void*, const void*, size_t bytes, cudaMemcpyKind, cudaStream_t s) {
  Log(fmt::format("cudaMemcpyAsync {} on {:#x}", bytes, Id(s)));
  return cudaSuccess;
}
cudaError_t BeginCapture(cudaStream_t, cudaStreamCaptureMode) { return cudaErrorNotSupported; }
cudaError_t EndCapture(cudaStream_t, cudaGraph_t*) { return cudaErrorNotSupported; }
cudaError_t GraphInstantiate(cudaGraphExec_t*, cudaGraph_t, unsigned long long) { return cudaErrorNotSupported; }
cudaError_t GraphLaunch(cudaGraphExec_t, cudaStream_t) { return cudaErrorNotSupported; }
cudaError_t GraphDestroy(cudaGraph_t) { return cudaSuccess; }
cudaError_t GraphExecDestroy(cudaGraphExec_t) { return cudaSuccess; }
cudaError_t LibraryLoadData(cudaLibrary_t* lib, const void*, cudaJitOption*, void**, unsigned int, cudaLibraryOption*,
                            void**, unsigned int) {
  *lib = NewHandle<cudaLibrary_t>();
  return cudaSuccess;
}
cudaError_t LibraryGetKernel(cudaKernel_t* k, cudaLibrary_t, const char* name) {
  *k = NewHandle<cudaKernel_t>();
  Log(fmt::format("cudaLibraryGetKernel {}", name));
  return cudaSuccess;
}
cudaError_t LibraryUnload(cudaLibrary_t) { return cudaSuccess; }
cudaError_t LaunchKernel(const void*, dim3 grid, dim3 block, void**, size_t, cudaStream_t s) {
  Log(fmt::format("cudaLaunchKernel {}x{} on {:#x}", grid.x, block.x, Id(s)));
  return cudaSuccess;
}

// cuBLASLt
cublasStatus_t LtCreate(cublasLtHandle_t* h) { *h = NewHandle<cublasLtHandle_t>(); return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t LtDestroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }
const char* LtStatusString(cublasStatus_t) { return "fake cublas status"; }
cublasStatus_t DescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t, cudaDataType_t) {
  *d = NewHandle<cublasLtMatmulDesc_t>();
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t DescDestroy(cublasLtMatmulDesc_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t DescSet(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, const void*, size_t) {
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t LayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType, uint64_t, uint64_t, int64_t) {
  *l = NewHandle<cublasLtMatrixLayout_t>();
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t LayoutDestroy(cublasLtMatrixLayout_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t LayoutSet(cublasLtMatrixLayout_t, cublasLtMatrixLayoutAttribute_t, const void*, size_t) {
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t PrefCreate(cublasLtMatmulPreference_t* p) {
  *p = NewHandle<cublasLtMatmulPreference_t>();
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t PrefDestroy(cublasLtMatmulPreference_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t PrefSet(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t, const void*, size_t) {
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t Heuristic(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                         cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int requested,
                         cublasLtMatmulHeuristicResult_t* results, int* found) {
  Log("cublasLtMatmulAlgoGetHeuristic");
  ++g_fake->heuristic_calls;
  if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
  results[0] = cublasLtMatmulHeuristicResult_t{};
  results[0].state = CUBLAS_STATUS_SUCCESS;
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t Matmul(cublasLtHandle_t, cublasLtMatmulDesc_t, const void*, const void*, cublasLtMatrixLayout_t,
                      const void*, cublasLtMatrixLayout_t, const void*, const void*, cublasLtMatrixLayout_t, void*,
                      cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t*, void*, size_t, cudaStream_t s) {
  Log(fmt::format("cublasLtMatmul on {:#x}", Id(s)));
  return CUBLAS_STATUS_SUCCESS;
}

// NCCL
const char* NcclErrorString(ncclResult_t r) {
  return r == ncclRemoteError ? "remote process exited or there was a network error" : "fake nccl error";
}
ncclResult_t NcclUniqueId(ncclUniqueId*) { return ncclSuccess; }
ncclResult_t NcclInitRank(ncclComm_t*, int, ncclUniqueId, int) { return ncclSuccess; }
ncclResult_t NcclInitAll(ncclComm_t*, int, const int*) { return ncclSuccess; }
ncclResult_t NcclSplit(ncclComm_t, int, int, ncclComm_t* out, ncclConfig_t*) {
  *out = NewHandle<ncclComm_t>();
  return ncclSuccess;
}
ncclResult_t NcclDestroy(ncclComm_t) { return ncclSuccess; }
ncclResult_t NcclAbort(ncclComm_t) { Log("ncclCommAbort"); return ncclSuccess; }
ncclResult_t NcclAsyncError(ncclComm_t, ncclResult_t* state) {
  *state = g_fake->async_error;
  return ncclSuccess;
}
ncclResult_t NcclGroupStart() { Log("ncclGroupStart"); return ncclSuccess; }
ncclResult_t NcclGroupEnd() { Log("ncclGroupEnd"); return ncclSuccess; }
ncclResult_t NcclAllGather(const void*, void*, size_t count, ncclDataType_t, ncclComm_t, cudaStream_t s) {
  Log(fmt::format("ncclAllGather {} on {:#x}", count, Id(s)));
  return ncclSuccess;
}
ncclResult_t NcclReduceScatter(const void*, void*, size_t count, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                               cudaStream_t) {
  Log(fmt::format("ncclReduceScatter {}", count));
  return ncclSuccess;
}
ncclResult_t NcclAllReduce(const void*, void*, size_t count, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) {
  Log(fmt::format("ncclAllReduce {}", count));
  return ncclSuccess;
}
ncclResult_t NcclBroadcast(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) {
  return ncclSuccess;
}
ncclResult_t NcclReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t) {
  return ncclSuccess;
}
ncclResult_t NcclSend(const void*, size_t count, ncclDataType_t, int peer, ncclComm_t, cudaStream_t) {
  Log(fmt::format("ncclSend {} to {}", count, peer));
  return ncclSuccess;
}
ncclResult_t NcclRecv(void*, size_t count, ncclDataType_t, int peer, ncclComm_t, cudaStream_t) {
  Log(fmt::format("ncclRecv {} from {}", count, peer));
  return ncclSuccess;
}

CudaApi FakeApi() {
  CudaApi a;
  a.cudaGetDeviceCount = GetDeviceCount;
  a.cudaGetErrorString = GetErrorString;
  a.cudaGetLastError = GetLastError;
  a.cudaSetDevice = SetDevice;
  a.cudaGetDeviceProperties = GetDeviceProperties;
  a.cudaDeviceGetStreamPriorityRange = StreamPriorityRange;
  a.cudaDeviceSynchronize = DeviceSynchronize;
  a.cudaMemGetInfo = MemGetInfo;
  a.cudaStreamCreateWithPriority = StreamCreate;
  a.cudaStreamDestroy = StreamDestroy;
  a.cudaStreamSynchronize = StreamSynchronize;
  a.cudaStreamWaitEvent = StreamWaitEvent;
  a.cudaEventCreateWithFlags = EventCreate;
  a.cudaEventDestroy = EventDestroy;
  a.cudaEventRecord = EventRecord;
  a.cudaEventQuery = EventQuery;
  a.cudaEventSynchronize = EventSynchronize;
  a.cudaEventElapsedTime = EventElapsed;
  a.cudaFree = Free;
  a.cudaFreeHost = FreeHost;
  a.cudaMemsetAsync = MemsetAsync;
  a.cudaMemcpyAsync = MemcpyAsync;
  a.cudaStreamBeginCapture = BeginCapture;
  a.cudaStreamEndCapture = EndCapture;
  a.cudaGraphLaunch = GraphLaunch;
  a.cudaGraphDestroy = GraphDestroy;
  a.cudaGraphExecDestroy = GraphExecDestroy;
  a.cudaLibraryLoadData = LibraryLoadData;
  a.cudaLibraryGetKernel = LibraryGetKernel;
  a.cudaLibraryUnload = LibraryUnload;
  a.cudaMalloc = Malloc;
  a.cudaMallocHost = MallocHost;
  a.cudaGraphInstantiate = GraphInstantiate;
  a.cudaLaunchKernel = LaunchKernel;
  a.cublasLtCreate = LtCreate;
  a.cublasLtDestroy = LtDestroy;
  a.cublasLtGetStatusString = LtStatusString;
  a.cublasLtMatmulDescCreate = DescCreate;
  a.cublasLtMatmulDescDestroy = DescDestroy;
  a.cublasLtMatmulDescSetAttribute = DescSet;
  a.cublasLtMatrixLayoutCreate = LayoutCreate;
  a.cublasLtMatrixLayoutDestroy = LayoutDestroy;
  a.cublasLtMatrixLayoutSetAttribute = LayoutSet;
  a.cublasLtMatmulPreferenceCreate = PrefCreate;
  a.cublasLtMatmulPreferenceDestroy = PrefDestroy;
  a.cublasLtMatmulPreferenceSetAttribute = PrefSet;
  a.cublasLtMatmulAlgoGetHeuristic = Heuristic;
  a.cublasLtMatmul = Matmul;
  a.ncclGetErrorString = NcclErrorString;
  a.ncclGetUniqueId = NcclUniqueId;
  a.ncclCommInitRank = NcclInitRank;
  a.ncclCommInitAll = NcclInitAll;
  a.ncclCommSplit = NcclSplit;
  a.ncclCommDestroy = NcclDestroy;
  a.ncclCommAbort = NcclAbort;
  a.ncclCommGetAsyncError = NcclAsyncError;
  a.ncclGroupStart = NcclGroupStart;
  a.ncclGroupEnd = NcclGroupEnd;
  a.ncclAllGather = NcclAllGather;
  a.ncclReduceScatter = NcclReduceScatter;
  a.ncclAllReduce = NcclAllReduce;
  a.ncclBroadcast = NcclBroadcast;
  a.ncclReduce = NcclReduce;
  a.ncclSend = NcclSend;
  a.ncclRecv = NcclRecv;
  return a;
}

// Every entry of the table is filled: a member the fake forgot would be a null call.
bool AllEntriesSet(const CudaApi& api) {
  bool all = true;
#define SHARDSCOPE_CHECK_ENTRY(fn) all = all && api.fn != nullptr;
#define SHARDSCOPE_CHECK_TYPED_ENTRY(fn, type) all = all && api.fn != nullptr;
  SHARDSCOPE_CUDART_ENTRIES(SHARDSCOPE_CHECK_ENTRY)
  SHARDSCOPE_CUDART_TYPED_ENTRIES(SHARDSCOPE_CHECK_TYPED_ENTRY)
  SHARDSCOPE_CUBLASLT_ENTRIES(SHARDSCOPE_CHECK_ENTRY)
  SHARDSCOPE_NCCL_ENTRIES(SHARDSCOPE_CHECK_ENTRY)
#undef SHARDSCOPE_CHECK_ENTRY
#undef SHARDSCOPE_CHECK_TYPED_ENTRY
  return all;
}

// One rank, streams "compute" (0) and "comm" (1), in a world of one. Per step, by op id:
//   10 allocate A 40 MiB        11 GEMM 512^3 bf16         12 all_gather 4 KiB on comm
//   13 record e0 on comm        14 compute waits for e0    15 A.record_stream(comm)
//   16 free A                   17 allocate B 50 MiB       18 attention fwd (1 x 4 heads, 256, 64)
//   19 memory-bound 1 MiB r/w   20 spin 1 us on comm       21 D2H copy 4 KiB
//   22 free B                   23 device synchronize
// With a 64 MiB capacity the first step's B (50 MiB) does not fit beside A's cached 40 MiB
// segment: the allocator releases it and retries (a segment released inside the step).
traces::Schedule OneRankSchedule() {
  traces::Schedule s;
  s.communicators = {{"world", {0}}};
  traces::Program p;
  p.name = "one";
  p.streams = {{"compute", 0}, {"comm", -1}};
  p.events = {"e0"};
  p.tensors = {"A", "B"};
  p.comm_slots = {"world"};
  p.ops.push_back(MakeOp(10, traces::AllocateOp{0, 40 * kMiB, 0}));
  p.ops.push_back(MakeOp(11, traces::KernelOp{0, traces::GemmDesc{512, 512, 512, 1, DType::kBFloat16}}));
  p.ops.push_back(MakeOp(12, test_util::Coll(CollectiveType::kAllGather, 0, 4096, DType::kBFloat16)));
  p.ops.push_back(MakeOp(13, traces::EventRecordOp{0, 1}));
  p.ops.push_back(MakeOp(14, traces::StreamWaitEventOp{0, 0}));
  p.ops.push_back(MakeOp(15, traces::RecordStreamOp{0, 1}));
  p.ops.push_back(MakeOp(16, traces::FreeOp{0}));
  p.ops.push_back(MakeOp(17, traces::AllocateOp{1, 50 * kMiB, 0}));
  traces::AttentionDesc attention;
  attention.batch = 1;
  attention.heads = 4;
  attention.kv_heads = 4;
  attention.seq_q = attention.seq_kv = 256;
  attention.head_dim = 64;
  p.ops.push_back(MakeOp(18, traces::KernelOp{0, attention}));
  p.ops.push_back(MakeOp(19, traces::KernelOp{0, traces::MemoryBoundDesc{kMiB, kMiB}}));
  p.ops.push_back(MakeOp(20, traces::KernelOp{1, traces::FixedDurationDesc{1000}}));
  p.ops.push_back(MakeOp(21, traces::MemcpyOp{traces::MemcpyKind::kDeviceToHost, 0, 4096}));
  p.ops.push_back(MakeOp(22, traces::FreeOp{1}));
  p.ops.push_back(MakeOp(23, traces::DeviceSynchronizeOp{}));
  s.programs = {p};
  s.ranks = {{0, {}}};
  EXPECT_TRUE(s.ResolveBindings().ok());
  return s;
}

class CudaRankTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_fake = &fake_;
    api_ = FakeApi();
    ASSERT_TRUE(AllEntriesSet(api_));
    SetCudaForTesting(&api_);
    options_.common.warmup = 1;
    options_.common.steps = 2;
    options_.common.out_dir = ::testing::TempDir() + "/cuda_rank_test";
    // Step boundaries in the log, from the hooks the CUDA backend calls around each step.
    options_.common.hooks.before_step = [](int32_t step, bool) {
      Log(fmt::format("== step {}", step));
      return Status::Ok();
    };
    options_.common.hooks.after_step = [](int32_t step, bool) {
      Log(fmt::format("== end {}", step));
      return Status::Ok();
    };
  }
  void TearDown() override {
    rank_.reset();
    SetCudaForTesting(nullptr);
    g_fake = nullptr;
  }

  // Setup, NCCL (a world communicator and one split per schedule communicator), the
  // schedule's capacity: what Job::Run does before Run().
  CudaRank& Start(const traces::Schedule& schedule, int32_t rank = 0, int64_t planned = 64 * kMiB) {
    schedule_ = schedule;
    StatusOr<ExecutionPlan> plan = BuildExecutionPlan(schedule_, rank, schedule_.world_size(), costs_);
    EXPECT_TRUE(plan.ok()) << plan.status().message();
    rank_ = std::make_unique<CudaRank>(schedule_, setup_, std::move(*plan), options_, 0, planned);
    const Status setup = rank_->SetupLocal();
    EXPECT_TRUE(setup.ok()) << setup.message();
    rank_->SetWorld(NewHandle<ncclComm_t>());
    std::vector<ncclComm_t> comms;
    for (const CommunicatorPlan& c : rank_->plan().communicators) {
      ncclComm_t out = nullptr;
      EXPECT_TRUE(rank_->Split(c, &out).ok());
      comms.push_back(out);
    }
    rank_->AdoptComms(std::move(comms));
    const Status capacity = rank_->SetScheduleCapacity();
    EXPECT_TRUE(capacity.ok()) << capacity.message();
    return *rank_;
  }
  // Index of the first log line equal to `line` at or after `from`, or -1.
  int64_t Find(const std::string& line, size_t from = 0) const {
    for (size_t i = from; i < fake_.log.size(); ++i) {
      if (fake_.log[i] == line) return static_cast<int64_t>(i);
    }
    return -1;
  }
  int64_t Count(std::string_view prefix, size_t from, size_t to) const {
    int64_t n = 0;
    for (size_t i = from; i < to && i < fake_.log.size(); ++i) n += fake_.log[i].rfind(prefix, 0) == 0 ? 1 : 0;
    return n;
  }

  FakeState fake_;
  CudaApi api_;
  traces::Schedule schedule_;
  sim::SimulationSetup setup_;
  FakeCosts costs_;
  CudaRunOptions options_;
  std::unique_ptr<CudaRank> rank_;
};

TEST_F(CudaRankTest, OperandsAreZeroedOnTheirStreamsAndSetupCompletesBeforeStepZero) {
  CudaRank& rank = Start(OneRankSchedule());
  rank.Run();
  ASSERT_TRUE(rank.error().ok()) << rank.error().message();
  // The two streams, in schedule order ("compute" at the default priority 0, "comm" at -1).
  std::vector<std::string> streams;
  for (const std::string& line : fake_.log) {
    if (line.rfind("cudaStreamCreateWithPriority", 0) == 0) streams.push_back(line.substr(29, line.find(' ', 29) - 29));
  }
  ASSERT_EQ(streams.size(), 2u);
  const int64_t step0 = Find("== step 0");
  ASSERT_GE(step0, 0);
  // Every operand fill is queued on one of the schedule's streams (never the legacy stream,
  // which does not order with them), and all come before step 0 ...
  int64_t last_memset = -1;
  for (size_t i = 0; i < fake_.log.size(); ++i) {
    const std::string& line = fake_.log[i];
    if (line.rfind("cudaMemsetAsync", 0) != 0) continue;
    last_memset = static_cast<int64_t>(i);
    const std::string on = line.substr(line.find(" on ") + 4);
    EXPECT_TRUE(on == streams[0] || on == streams[1]) << line;
  }
  ASSERT_GE(last_memset, 0);
  EXPECT_LT(last_memset, step0);
  // ... followed by a device synchronization before step 0 starts.
  const int64_t sync = Find("cudaDeviceSynchronize", static_cast<size_t>(last_memset));
  EXPECT_GE(sync, 0);
  EXPECT_LT(sync, step0);
}

TEST_F(CudaRankTest, NoCudaMallocOrFreeInsideAStepWhileTheAllocatorStillReleases) {
  CudaRank& rank = Start(OneRankSchedule());
  rank.Run();
  ASSERT_TRUE(rank.error().ok()) << rank.error().message();
  const RankResult result = rank.executor().Result();
  // The plan does make the allocator release a segment (step 0's retry for B), so the
  // check below is not vacuous.
  EXPECT_GE(result.device_frees, 1);
  EXPECT_EQ(result.retries, 1);
  for (int32_t step = 0; step < 3; ++step) {
    const int64_t begin = Find(fmt::format("== step {}", step));
    const int64_t end = Find(fmt::format("== end {}", step));
    ASSERT_GE(begin, 0);
    ASSERT_GT(end, begin);
    EXPECT_EQ(Count("cudaMalloc", static_cast<size_t>(begin), static_cast<size_t>(end)), 0) << "step " << step;
    EXPECT_EQ(Count("cudaFree", static_cast<size_t>(begin), static_cast<size_t>(end)), 0) << "step " << step;
  }
  // Step 0's release synchronized the device as cudaFree would have: op 23's and the step's
  // end synchronization, plus one for the release.
  const int64_t begin0 = Find("== step 0"), end0 = Find("== end 0");
  EXPECT_EQ(Count("cudaDeviceSynchronize", static_cast<size_t>(begin0), static_cast<size_t>(end0)), 3);
  const int64_t begin1 = Find("== step 1"), end1 = Find("== end 1");
  EXPECT_EQ(Count("cudaDeviceSynchronize", static_cast<size_t>(begin1), static_cast<size_t>(end1)), 2);
}

TEST_F(CudaRankTest, TheCapacityIsWhatCudaMemGetInfoLeavesWhenLessThanPlanned) {
  // Planned 64 MiB, but only 48 MiB free once NCCL and the operands hold theirs: the
  // allocator's capacity is 48 MiB, so B (50 MiB) is the policy's out-of-memory in the warm-up
  // step, not a failed cudaMalloc (none is made for the schedule's tensors in a step).
  fake_.free_bytes = 48 * kMiB;
  CudaRank& rank = Start(OneRankSchedule());
  ASSERT_GE(Find("cudaMemGetInfo"), 0);
  const size_t after_setup = fake_.log.size();
  rank.Run();
  EXPECT_EQ(Count("cudaMalloc", after_setup, fake_.log.size()), 0);
  ASSERT_TRUE(rank.error().ok()) << rank.error().message();
  const RankResult result = rank.executor().Result();
  EXPECT_EQ(result.capacity, 48 * kMiB);
  EXPECT_EQ(result.planned_capacity, 64 * kMiB);
  EXPECT_EQ(result.meminfo_free_after_setup, 48 * kMiB);
  EXPECT_EQ(result.device_backing, 0);  // stopped in the warm-up: never reached a measured step
  ASSERT_TRUE(result.oom.has_value());
  EXPECT_EQ(result.oom->op_id, 17);
  EXPECT_FALSE(result.finished);
}

TEST_F(CudaRankTest, ThePlannedCapacityWinsWhenMoreIsFree) {
  fake_.free_bytes = 1024 * kMiB;
  CudaRank& rank = Start(OneRankSchedule());
  rank.Run();
  EXPECT_EQ(rank.executor().Result().capacity, 64 * kMiB);
  EXPECT_EQ(rank.executor().Result().planned_capacity, 64 * kMiB);
}

TEST_F(CudaRankTest, TheMeasuredStepsRunWithTheAllocatorsMemoryHeldOnTheDevice) {
  // After the warm-up step the allocator holds B's 50 MiB segment (A's 40 MiB one was released
  // for it): one cudaMalloc of 50 MiB between the warm-up's end and step 1, none after.
  CudaRank& rank = Start(OneRankSchedule());
  rank.Run();
  ASSERT_TRUE(rank.error().ok()) << rank.error().message();
  const int64_t end0 = Find("== end 0"), step1 = Find("== step 1");
  ASSERT_GE(end0, 0);
  EXPECT_EQ(fake_.log[static_cast<size_t>(end0) + 1], fmt::format("cudaMalloc {}", 50 * kMiB));
  EXPECT_EQ(end0 + 2, step1);
  EXPECT_EQ(Count("cudaMalloc", static_cast<size_t>(step1), fake_.log.size()), 0);
  const RankResult result = rank.executor().Result();
  EXPECT_EQ(result.device_backing, 50 * kMiB);
  EXPECT_EQ(result.capacity, 64 * kMiB);
}

TEST_F(CudaRankTest, ABackingTheDeviceRefusesShrinksUntilItIsGranted) {
  // The device grants at most 45 MiB in one cudaMalloc: 50 MiB is refused, 50 - 2 = 48 MiB
  // too, 48 - 4 = 44 MiB granted (the backoff doubles).
  fake_.malloc_limit = 45 * kMiB;
  CudaRank& rank = Start(OneRankSchedule());
  rank.Run();
  ASSERT_TRUE(rank.error().ok()) << rank.error().message();
  const auto end0 = static_cast<size_t>(Find("== end 0"));
  EXPECT_EQ(fake_.log[end0 + 1], fmt::format("cudaMalloc {}", 50 * kMiB));
  EXPECT_EQ(fake_.log[end0 + 2], fmt::format("cudaMalloc {}", 48 * kMiB));
  EXPECT_EQ(fake_.log[end0 + 3], fmt::format("cudaMalloc {}", 44 * kMiB));
  EXPECT_EQ(rank.executor().Result().device_backing, 44 * kMiB);
}

TEST_F(CudaRankTest, RecordStreamEventsAreRecycledNotCreatedEveryStep) {
  // One record_stream per step, its event complete by the next allocation: with recycling the
  // rank holds one event for it however many steps run; before, one more per step.
  options_.common.steps = 6;
  CudaRank& rank = Start(OneRankSchedule());
  rank.Run();
  ASSERT_TRUE(rank.error().ok()) << rank.error().message();
  EXPECT_EQ(rank.allocator_events().events_created(), 1);
  EXPECT_EQ(rank.allocator_events().events_outstanding(), 0u);
  rank_.reset();
  EXPECT_EQ(fake_.events_live, 0);  // and every event destroyed with the rank
  EXPECT_EQ(fake_.streams_live, 0);
  EXPECT_TRUE(fake_.device_buffers.empty());
}

TEST_F(CudaRankTest, AFailedRecordStreamEventQueryIsTheRanksErrorNotACompletion) {
  // Before: Query treated any error as "complete", and the block was reused while the
  // device had failed. Now the error stops the rank at the allocator call that met it: op 17,
  // B's allocation, which asks about A's deferred free.
  fake_.event_query = cudaErrorIllegalAddress;
  CudaRank& rank = Start(OneRankSchedule());
  rank.Run();
  ASSERT_FALSE(rank.error().ok());
  EXPECT_NE(rank.error().message().find("rank 0 op 17: cudaEventQuery (record_stream) failed: an illegal memory "
                                        "access was encountered"),
            std::string::npos)
      << rank.error().message();
  EXPECT_TRUE(rank.executor().failed());  // the watchdog ends the job on it
}

TEST_F(CudaRankTest, ACudaMallocErrorOtherThanOutOfMemoryIsReportedAsItIs) {
  schedule_ = OneRankSchedule();
  StatusOr<ExecutionPlan> plan = BuildExecutionPlan(schedule_, 0, 1, costs_);
  ASSERT_TRUE(plan.ok());
  fake_.malloc_error = cudaErrorInvalidValue;  // the first operand buffer
  CudaRank rank(schedule_, setup_, std::move(*plan), options_, 0, 64 * kMiB);
  const Status status = rank.SetupLocal();
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("cudaMalloc("), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("failed: invalid argument"), std::string::npos) << status.message();
  EXPECT_EQ(status.message().find("out of memory"), std::string::npos) << status.message();
}

TEST_F(CudaRankTest, AnOperandOutOfMemoryIsAnInputErrorSayingSo) {
  schedule_ = OneRankSchedule();
  StatusOr<ExecutionPlan> plan = BuildExecutionPlan(schedule_, 0, 1, costs_);
  ASSERT_TRUE(plan.ok());
  fake_.malloc_error = cudaErrorMemoryAllocation;
  CudaRank rank(schedule_, setup_, std::move(*plan), options_, 0, 64 * kMiB);
  const Status status = rank.SetupLocal();
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), StatusCode::kInvalidInput);
  EXPECT_NE(status.message().find("cudaMalloc: out of memory"), std::string::npos) << status.message();
}

TEST_F(CudaRankTest, NcclsAsynchronousErrorIsTheRanksError) {
  CudaRank& rank = Start(OneRankSchedule());
  EXPECT_TRUE(rank.AsyncError().ok());
  fake_.async_error = ncclRemoteError;
  const Status status = rank.AsyncError();
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("remote process exited or there was a network error"), std::string::npos)
      << status.message();
  // The watchdog's poll turns it into the rank's failure (rank_executor_test.cc: the job ends).
  rank.executor().PollCollectives();
  EXPECT_TRUE(rank.executor().failed());
}

TEST_F(CudaRankTest, CublasLtPlansAreBuiltAtSetupNeverInAStep) {
  CudaRank& rank = Start(OneRankSchedule());
  const int64_t at_setup = fake_.heuristic_calls;
  // The GEMM (512^3) and the attention's two shapes (QK^T and PV, heads x batch = 4 in one
  // chunk): three distinct problems, one heuristic query each.
  EXPECT_EQ(at_setup, 3);
  rank.Run();
  ASSERT_TRUE(rank.error().ok()) << rank.error().message();
  EXPECT_EQ(fake_.heuristic_calls, at_setup);
  // Per step: the GEMM once, QK^T and PV once each (forward).
  const int64_t begin = Find("== step 1"), end = Find("== end 1");
  EXPECT_EQ(Count("cublasLtMatmul on", static_cast<size_t>(begin), static_cast<size_t>(end)), 3);
}

TEST_F(CudaRankTest, AWarmUpStepIsRequired) {
  options_.common.warmup = 0;
  schedule_ = OneRankSchedule();
  StatusOr<ExecutionPlan> plan = BuildExecutionPlan(schedule_, 0, 1, costs_);
  ASSERT_TRUE(plan.ok());
  CudaRank rank(schedule_, setup_, std::move(*plan), options_, 0, 64 * kMiB);
  const Status status = rank.SetupLocal();
  EXPECT_EQ(status.code(), StatusCode::kInvalidInput);
  EXPECT_NE(status.message().find("--warmup 0 with --backend cuda"), std::string::npos) << status.message();
  EXPECT_TRUE(fake_.log.empty());  // refused before any CUDA call
}

// Two ranks with different all_to_all sizes (512 and 2048 bf16 elements): the per-peer
// counts of execution_plan.h, max(S_a, S_b) / 2, reach NCCL: each rank sends 1024 elements to
// the other and receives 1024 from it, so the grouped ncclSend / ncclRecv of the two sides
// match (before: 256 from rank 0, 1024 from rank 1: NCCL hangs).
TEST_F(CudaRankTest, AnUnevenAllToAllSendsWhatThePeerReceives) {
  traces::Schedule s;
  s.communicators = {{"world", {0, 1}}};
  for (int32_t r = 0; r < 2; ++r) {
    traces::Program p;
    p.name = fmt::format("rank{}", r);
    p.streams = {{"compute", 0}, {"comm", -1}};
    p.comm_slots = {"world"};
    p.ops.push_back(MakeOp(1, test_util::Coll(CollectiveType::kAllToAll, 0, r == 0 ? 1024 : 4096, DType::kBFloat16)));
    s.programs.push_back(p);
    s.ranks.push_back({r, {}});
  }
  ASSERT_TRUE(s.ResolveBindings().ok());
  std::vector<std::vector<std::string>> sent(2);
  for (int32_t r = 0; r < 2; ++r) {
    fake_.log.clear();
    CudaRank& rank = Start(s, r);
    const size_t from = fake_.log.size();
    rank.Run();
    ASSERT_TRUE(rank.error().ok()) << rank.error().message();
    const int64_t begin = Find("== step 1", from), end = Find("== end 1", from);
    for (int64_t i = begin; i < end; ++i) {
      const std::string& line = fake_.log[static_cast<size_t>(i)];
      if (line.rfind("nccl", 0) == 0) sent[static_cast<size_t>(r)].push_back(line);
    }
    rank_.reset();
  }
  EXPECT_EQ(sent[0], (std::vector<std::string>{"ncclGroupStart", "ncclSend 256 to 0", "ncclRecv 256 from 0",
                                               "ncclSend 1024 to 1", "ncclRecv 1024 from 1", "ncclGroupEnd"}));
  EXPECT_EQ(sent[1], (std::vector<std::string>{"ncclGroupStart", "ncclSend 1024 to 0", "ncclRecv 1024 from 0",
                                               "ncclSend 1024 to 1", "ncclRecv 1024 from 1", "ncclGroupEnd"}));
}

TEST(CudaApiTest, AMissingLibraryIsAnInputErrorNamingIt) {
  const StatusOr<void*> opened = OpenCudaLibrary("libshardscope_no_such_library.so.7", "NCCL, for the collectives");
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(opened.status().message().find("libshardscope_no_such_library.so.7 (NCCL, for the collectives)"),
            std::string::npos)
      << opened.status().message();
  EXPECT_NE(opened.status().message().find("LD_LIBRARY_PATH"), std::string::npos);
}

TEST(CudaApiTest, TheSonamesAreTheHeadersMajorVersions) {
  const CudaLibraryNames names = CudaLibrarySonames();
  EXPECT_EQ(std::string(names.cudart), fmt::format("libcudart.so.{}", CUDART_VERSION / 1000));
  EXPECT_EQ(std::string(names.cublaslt), fmt::format("libcublasLt.so.{}", CUBLAS_VER_MAJOR));
  EXPECT_EQ(std::string(names.nccl), "libnccl.so.2");
}

}  // namespace
}  // namespace shardscope::runtime::cuda

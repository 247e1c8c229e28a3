// The CUDA backend (cuda_backend.h): real streams, events, NCCL communicators and proxy
// kernels; the simulator's caching-allocator policy over cudaMalloc; the host backend's
// watchdog, Flight Recorder dump and report keys.
//
// Structure. A Job owns the ranks this process drives (one under mpirun, all of them in a
// single process over local GPUs) and a watchdog thread; a CudaRank owns one rank's device
// state (streams, events, allocators, cuBLASLt plans, NCCL communicators) and walks its
// program on its own host thread. Setup is two phases so that no rank waits in a collective
// for a rank that already failed: local state first (every rank), an agreement that all
// succeeded, then NCCL (collective).
//
// What the CPU cannot check is marked "GPU:" in comments: this file was compiled, not run, on
// the machine that wrote it (no driver); scripts/gpu/validate_runtime.sh runs it.
#include "shardscope/runtime/cuda_backend.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <mpi.h>
#include <nccl.h>
#include <nlohmann/json.hpp>
#include <nvtx3/nvToolsExt.h>

#include "cuda/cuda_check.h"
#include "cuda/cuda_internal.h"
#include "cuda/proxy_kernels.h"
#include "cuda/proxy_math.h"
#include "flight_recorder.h"
#include "host_timeline.h"
#include "shardscope/runtime/execution_plan.h"
#include "shardscope/sim/models/caching_allocator.h"
#include "shardscope/sim/report/version.h"
#include "shardscope/base/file_io.h"

namespace shardscope::runtime {

namespace cuda {
namespace {

using Clock = std::chrono::steady_clock;
using traces::CollectiveType;

size_t Idx(int32_t i) { return static_cast<size_t>(i); }

Status MpiStatus(int rc, std::string_view call) {
  if (rc == MPI_SUCCESS) return Status::Ok();
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  return Status::Internal(fmt::format("{} failed: {}", call, std::string(text, static_cast<size_t>(length))));
}


// ---- Owning handles (CCCL's habit): move-only, destroyed once; destructors never throw and
// log a failed destroy instead (SHARDSCOPE_CUDA_LOG_IF_ERROR). The raw handle is the
// non-owning view (cudaStream_t is already one).
template <typename Handle, void (*Destroy)(Handle)>
class Owned {
 public:
  Owned() = default;
  explicit Owned(Handle h) : h_(h) {}
  ~Owned() { reset(); }
  Owned(Owned&& o) noexcept : h_(std::exchange(o.h_, Handle{})) {}
  Owned& operator=(Owned&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, Handle{});
    }
    return *this;
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  Handle get() const { return h_; }
  Handle release() { return std::exchange(h_, Handle{}); }
  void reset() {
    if (h_) Destroy(std::exchange(h_, Handle{}));
  }

 private:
  Handle h_{};
};

void DestroyStream(cudaStream_t s) { SHARDSCOPE_CUDA_LOG_IF_ERROR(cudaStreamDestroy(s)); }
void DestroyEvent(cudaEvent_t e) { SHARDSCOPE_CUDA_LOG_IF_ERROR(cudaEventDestroy(e)); }
void DestroyGraphExec(cudaGraphExec_t g) { SHARDSCOPE_CUDA_LOG_IF_ERROR(cudaGraphExecDestroy(g)); }
void DestroyGraph(cudaGraph_t g) { SHARDSCOPE_CUDA_LOG_IF_ERROR(cudaGraphDestroy(g)); }
void DestroyLt(cublasLtHandle_t h) { SHARDSCOPE_CUDA_LOG_IF_ERROR(cublasLtDestroy(h)); }
void DestroyMatmulDesc(cublasLtMatmulDesc_t d) { SHARDSCOPE_CUDA_LOG_IF_ERROR(cublasLtMatmulDescDestroy(d)); }
void DestroyLayout(cublasLtMatrixLayout_t l) { SHARDSCOPE_CUDA_LOG_IF_ERROR(cublasLtMatrixLayoutDestroy(l)); }
void DestroyPreference(cublasLtMatmulPreference_t p) {
  SHARDSCOPE_CUDA_LOG_IF_ERROR(cublasLtMatmulPreferenceDestroy(p));
}
void DestroyHostBuffer(void* p) { SHARDSCOPE_CUDA_LOG_IF_ERROR(cudaFreeHost(p)); }
using OwnedStream = Owned<cudaStream_t, &DestroyStream>;
using OwnedEvent = Owned<cudaEvent_t, &DestroyEvent>;
using OwnedGraph = Owned<cudaGraph_t, &DestroyGraph>;
using OwnedGraphExec = Owned<cudaGraphExec_t, &DestroyGraphExec>;
using OwnedLt = Owned<cublasLtHandle_t, &DestroyLt>;
using OwnedMatmulDesc = Owned<cublasLtMatmulDesc_t, &DestroyMatmulDesc>;
using OwnedLayout = Owned<cublasLtMatrixLayout_t, &DestroyLayout>;
using OwnedPreference = Owned<cublasLtMatmulPreference_t, &DestroyPreference>;
using OwnedHostBuffer = Owned<void*, &DestroyHostBuffer>;

StatusOr<OwnedEvent> MakeEvent(bool timing) {
  cudaEvent_t e = nullptr;
  // Timing costs a timestamp write per record: only the step-time events ask for it.
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  return OwnedEvent(e);
}

// An NCCL communicator. Destroyed with ncclCommDestroy after a clean run; after a watchdog
// timeout ncclCommAbort (which also unblocks kernels stuck in it) and no destroy.
class NcclComm {
 public:
  NcclComm() = default;
  explicit NcclComm(ncclComm_t c) : comm_(c) {}
  ~NcclComm() {
    if (comm_ != nullptr && !aborted_.load()) SHARDSCOPE_CUDA_LOG_IF_ERROR(ncclCommDestroy(comm_));
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ncclComm_t get() const { return comm_; }
  // Callable from the watchdog thread while the host thread is inside an NCCL call (NCCL
  // docs, ncclCommAbort: "frees resources ... and aborts any uncompleted operations").
  void Abort() {
    if (comm_ != nullptr && !aborted_.exchange(true)) SHARDSCOPE_CUDA_LOG_IF_ERROR(ncclCommAbort(comm_));
  }

 private:
  ncclComm_t comm_ = nullptr;
  std::atomic<bool> aborted_{false};
};

// ---- Type maps (proxy_math's names -> the libraries' enums)

cudaDataType_t CudaType(LtDataType t) {
  switch (t) {
    case LtDataType::kF32: return CUDA_R_32F;
    case LtDataType::kBF16: return CUDA_R_16BF;
    case LtDataType::kF16: return CUDA_R_16F;
    case LtDataType::kF8E4M3: return CUDA_R_8F_E4M3;
    case LtDataType::kF8E5M2: return CUDA_R_8F_E5M2;
    case LtDataType::kF64: return CUDA_R_64F;
    case LtDataType::kI8: return CUDA_R_8I;
    case LtDataType::kI32: return CUDA_R_32I;
  }
  return CUDA_R_32F;
}

cublasComputeType_t CublasCompute(LtComputeType t) {
  switch (t) {
    case LtComputeType::k32F: return CUBLAS_COMPUTE_32F;
    case LtComputeType::k32FFastTF32: return CUBLAS_COMPUTE_32F_FAST_TF32;
    case LtComputeType::k64F: return CUBLAS_COMPUTE_64F;
    case LtComputeType::k32I: return CUBLAS_COMPUTE_32I;
  }
  return CUBLAS_COMPUTE_32F;
}

// NCCL's type and reduction for a schedule dtype. fp8: the host backend's rule (MAX on bytes:
// the same traffic, not the same numbers), which also works where NCCL has no fp8 sum.
struct NcclTypeAndOp {
  ncclDataType_t type = ncclUint8;
  ncclRedOp_t op = ncclSum;
};
NcclTypeAndOp NcclTypeFor(traces::DType dtype) {
  switch (dtype) {
    case traces::DType::kFloat32:
    case traces::DType::kTFloat32: return {ncclFloat32, ncclSum};
    case traces::DType::kFloat64: return {ncclFloat64, ncclSum};
    case traces::DType::kBFloat16: return {ncclBfloat16, ncclSum};
    case traces::DType::kFloat16: return {ncclFloat16, ncclSum};
    case traces::DType::kInt8: return {ncclInt8, ncclSum};
    case traces::DType::kInt32: return {ncclInt32, ncclSum};
    case traces::DType::kInt64: return {ncclInt64, ncclSum};
    case traces::DType::kFloat8E4M3:
    case traces::DType::kFloat8E5M2: return {ncclUint8, ncclMax};
  }
  return {ncclUint8, ncclMax};
}

// ---- Device memory beneath the allocators: the simulator's capacity accounting (its
// addresses too, so the policy's address-ordered choices, and hence the peaks, are the
// simulator's), each segment a real cudaMalloc. PointerOf turns a block address back into
// device memory (segments of expandable mode have no pointer: the schedule allocator's
// tensors are never touched by kernels, so only the operand allocator, never expandable,
// asks for pointers).
class CudaDeviceMemory final : public sim::DeviceMemory {
 public:
  explicit CudaDeviceMemory(int64_t capacity) : accounting_(sim::MakeCapacityDeviceMemory(capacity)) {}
  ~CudaDeviceMemory() override {
    for (auto& [address, segment] : segments_) SHARDSCOPE_CUDA_LOG_IF_ERROR(cudaFree(segment.first));
    for (auto& [bytes, pointer] : mapped_) SHARDSCOPE_CUDA_LOG_IF_ERROR(cudaFree(pointer));
  }
  bool Allocate(int64_t bytes, uint64_t* address) override {
    if (!accounting_->Allocate(bytes, address)) return false;
    void* p = nullptr;
    if (cudaMalloc(&p, static_cast<size_t>(bytes)) != cudaSuccess) {
      (void)cudaGetLastError();  // cudaErrorMemoryAllocation is not sticky; clear it
      accounting_->Release(*address, bytes);
      return false;
    }
    segments_[*address] = {p, bytes};
    return true;
  }
  void Release(uint64_t address, int64_t bytes) override {
    if (auto it = segments_.find(address); it != segments_.end()) {
      SHARDSCOPE_CUDA_LOG_IF_ERROR(cudaFree(it->second.first));
      segments_.erase(it);
    }
    accounting_->Release(address, bytes);
  }
  // Expandable segments: physical memory of the mapped size, really allocated.
  bool Map(int64_t bytes) override {
    if (!accounting_->Map(bytes)) return false;
    void* p = nullptr;
    if (cudaMalloc(&p, static_cast<size_t>(bytes)) != cudaSuccess) {
      (void)cudaGetLastError();
      accounting_->Unmap(bytes);
      return false;
    }
    mapped_.emplace(bytes, p);
    return true;
  }
  void Unmap(int64_t bytes) override {
    if (auto it = mapped_.find(bytes); it != mapped_.end()) {
      SHARDSCOPE_CUDA_LOG_IF_ERROR(cudaFree(it->second));
      mapped_.erase(it);
    }
    accounting_->Unmap(bytes);
  }
  int64_t Capacity() const override { return accounting_->Capacity(); }

  void* PointerOf(uint64_t address) const {
    auto it = segments_.upper_bound(address);
    if (it == segments_.begin()) return nullptr;
    --it;
    const uint64_t offset = address - it->first;
    if (offset >= static_cast<uint64_t>(it->second.second)) return nullptr;
    return static_cast<char*>(it->second.first) + offset;
  }

 private:
  std::unique_ptr<sim::DeviceMemory> accounting_;
  std::map<uint64_t, std::pair<void*, int64_t>> segments_;
  std::multimap<int64_t, void*> mapped_;
};

// record_stream's stream-ordered events, as real CUDA events on the rank's streams.
class CudaStreamEvents final : public sim::StreamEvents {
 public:
  explicit CudaStreamEvents(const std::vector<OwnedStream>& streams) : streams_(streams) {}
  sim::EventToken Record(sim::AllocStream stream) override {
    StatusOr<OwnedEvent> e = MakeEvent(false);
    if (!e.ok()) {
      std::cerr << fmt::format("shardscope run: {}\n", e.status().message());
      events_.emplace_back();
    } else {
      SHARDSCOPE_CUDA_LOG_IF_ERROR(cudaEventRecord(e->get(), streams_[Idx(stream)].get()));
      events_.push_back(std::move(*e));
    }
    return static_cast<sim::EventToken>(events_.size() - 1);
  }
  bool Query(sim::EventToken token) override {
    const OwnedEvent& e = events_[static_cast<size_t>(token)];
    return e.get() == nullptr || cudaEventQuery(e.get()) != cudaErrorNotReady;
  }
  void Synchronize(sim::EventToken token) override {
    const OwnedEvent& e = events_[static_cast<size_t>(token)];
    if (e.get() != nullptr) SHARDSCOPE_CUDA_LOG_IF_ERROR(cudaEventSynchronize(e.get()));
  }

 private:
  const std::vector<OwnedStream>& streams_;
  std::vector<OwnedEvent> events_;
};

// ---- cuBLASLt plans, cached per problem.
struct LtPlan {
  OwnedMatmulDesc desc;
  OwnedLayout a, b, c;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
};

std::string ProblemKey(const LtProblem& p) {
  return fmt::format("{}x{}x{}x{} t{}{} ld{},{},{} {} {} {} {}", p.m, p.n, p.k, p.batch, p.transpose_a, p.transpose_b,
                     p.lda, p.ldb, p.ldc, LtDataTypeName(p.a_type), LtDataTypeName(p.b_type),
                     LtDataTypeName(p.c_type), LtComputeTypeName(p.compute));
}

Status MakeLayout(LtDataType type, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride,
                  OwnedLayout* out) {
  cublasLtMatrixLayout_t layout = nullptr;
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&layout, CudaType(type), static_cast<uint64_t>(rows),
                                                             static_cast<uint64_t>(cols), ld));
  *out = OwnedLayout(layout);
  if (batch > 1) {
    const auto count = static_cast<int32_t>(batch);
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(
        cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(
        cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
  return Status::Ok();
}

// Builds the descriptors and asks the heuristic for up to `max_results` algorithms, best first.
Status BuildLtPlan(cublasLtHandle_t handle, const LtProblem& p, size_t workspace, int32_t max_results,
                   LtPlan* plan, std::vector<cublasLtMatmulHeuristicResult_t>* results) {
  cublasLtMatmulDesc_t desc = nullptr;
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&desc, CublasCompute(p.compute), CudaType(p.scale_type)));
  plan->desc = OwnedMatmulDesc(desc);
  const cublasOperation_t ta = p.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = p.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  SHARDSCOPE_RETURN_IF_ERROR(MakeLayout(p.a_type, p.transpose_a ? p.k : p.m, p.transpose_a ? p.m : p.k, p.lda, p.batch,
                                        p.stride_a, &plan->a));
  SHARDSCOPE_RETURN_IF_ERROR(MakeLayout(p.b_type, p.transpose_b ? p.n : p.k, p.transpose_b ? p.k : p.n, p.ldb, p.batch,
                                        p.stride_b, &plan->b));
  SHARDSCOPE_RETURN_IF_ERROR(MakeLayout(p.c_type, p.m, p.n, p.ldc, p.batch, p.stride_c, &plan->c));
  cublasLtMatmulPreference_t pref_raw = nullptr;
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref_raw));
  OwnedPreference pref(pref_raw);
  const uint64_t ws = workspace;
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(
      cublasLtMatmulPreferenceSetAttribute(pref_raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  results->assign(static_cast<size_t>(std::max(1, max_results)), cublasLtMatmulHeuristicResult_t{});
  int found = 0;
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(cublasLtMatmulAlgoGetHeuristic(handle, desc, plan->a.get(), plan->b.get(),
                                                                 plan->c.get(), plan->c.get(), pref_raw,
                                                                 static_cast<int>(results->size()), results->data(),
                                                                 &found));
  if (found <= 0) {
    return Status::Internal(fmt::format("cuBLASLt has no algorithm for the GEMM {} (workspace {} bytes)", ProblemKey(p),
                                        workspace));
  }
  results->resize(static_cast<size_t>(found));
  plan->algo = (*results)[0].algo;
  plan->workspace = workspace;
  return Status::Ok();
}

// alpha = 1, beta = 0 in the scale type.
struct Scalars {
  alignas(8) unsigned char one[8] = {};
  alignas(8) unsigned char zero[8] = {};
  explicit Scalars(LtDataType scale) {
    if (scale == LtDataType::kF64) {
      const double v = 1.0;
      std::memcpy(one, &v, sizeof v);
    } else if (scale == LtDataType::kI32) {
      const int32_t v = 1;
      std::memcpy(one, &v, sizeof v);
    } else {
      const float v = 1.0f;
      std::memcpy(one, &v, sizeof v);
    }
  }
};

Status RunLt(cublasLtHandle_t handle, const LtPlan& plan, const cublasLtMatmulAlgo_t& algo, const LtProblem& p,
             const void* a, const void* b, void* c, void* workspace, cudaStream_t stream) {
  const Scalars s(p.scale_type);
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(cublasLtMatmul(handle, plan.desc.get(), s.one, a, plan.a.get(), b, plan.b.get(),
                                                 s.zero, c, plan.c.get(), c, plan.c.get(), &algo, workspace,
                                                 plan.workspace, stream));
  return Status::Ok();
}

// ---- Host busy-wait and its calibration.
void SpinHostFor(int64_t ns) {
  if (ns <= 0) return;
  const Clock::time_point end = Clock::now() + std::chrono::nanoseconds(ns);
  while (Clock::now() < end) {
  }
}

// Requested durations for both calibrations: short ones dominate schedules (launch-sized host
// work, microsecond spin kernels); estimate, chosen to bracket 1 us to 200 us.
constexpr int64_t kCalibrationPointsNs[] = {1'000, 10'000, 50'000, 200'000};
constexpr int kCalibrationRepeats = 3;

SpinCalibration CalibrateHostSpin() {
  std::vector<std::pair<int64_t, int64_t>> samples;
  for (int r = 0; r < kCalibrationRepeats; ++r) {
    for (int64_t ns : kCalibrationPointsNs) {
      const Clock::time_point t0 = Clock::now();
      SpinHostFor(ns);
      samples.emplace_back(ns, std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
    }
  }
  return FitSpinCalibration(samples);
}

// ---- A rank's results as gathered to rank 0 (int64 each), then its step times, then its
// CUDA-graph replay times.
enum ResultField : int {
  kFinished, kOom, kOomOpId, kOomInjected, kOomRequested, kOomFree, kOomLargest, kOomTime, kCapacity,
  kPeakAllocated, kPeakReserved, kFragmentation, kRetries, kNumOoms, kHostBusy, kDeviceAllocs, kDeviceFrees,
  kOperandReserved, kMemInfoFreeAtPeak, kMemInfoTotal, kDevice, kStepsDone, kGraphStepsDone, kResultFields
};

struct OomRecord {
  int64_t op_id = 0, time_ns = 0, requested = 0, free_bytes = 0, largest_free = 0;
  bool injected = false;
};

// One collective as the host issued it, with the events that tell the watchdog when its
// stream reached it and when it finished (ProcessGroupNCCL's WorkNCCL ncclStartEvent_ /
// ncclEndEvent_, which Flight Recorder reads for "started" / "completed").
struct PendingCollective {
  size_t record = 0;
  OwnedEvent start, end;
};

struct Lane {
  int64_t issued = 0, started = 0, completed = 0, collectives = 0, p2p = 0;
};

class CudaRank {
 public:
  CudaRank(const traces::Schedule& schedule, const sim::SimulationSetup& setup, ExecutionPlan plan,
           const CudaRunOptions& options, int32_t device, int64_t capacity)
      : schedule_(schedule),
        setup_(setup),
        plan_(std::move(plan)),
        options_(options),
        device_(device),
        capacity_(capacity),
        memory_(capacity),
        events_(streams_),
        allocator_(setup.memory.allocator, memory_, events_),
        operand_memory_(std::numeric_limits<int64_t>::max() / 4),
        operand_events_(streams_),
        operand_allocator_(OperandConfig(setup.memory.allocator), operand_memory_, operand_events_),
        lanes_(plan_.communicators.size()),
        tensor_address_(static_cast<size_t>(plan_.num_tensors), 0) {}

  int32_t rank() const { return plan_.rank; }
  int32_t device() const { return device_; }
  const ExecutionPlan& plan() const { return plan_; }

  // Phase 1: everything that needs no other rank.
  Status SetupLocal() {
    if (plan_.streams.empty()) {
      return Status::InvalidInput(fmt::format("rank {}'s program declares no stream", plan_.rank));
    }
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    cudaDeviceProp prop{};
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device_));
    cc_ = ComputeCapability{prop.major, prop.minor};
    sm_count_ = prop.multiProcessorCount;
    device_name_ = prop.name;
    PriorityRange range;
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&range.least, &range.greatest));
    std::vector<int32_t> priorities;
    for (const StreamPlan& s : plan_.streams) priorities.push_back(s.priority);
    stream_priorities_ = MapStreamPriorities(priorities, range);
    for (int32_t priority : stream_priorities_) {
      cudaStream_t s = nullptr;
      // Non-blocking: the schedule's streams never synchronize with the legacy default stream
      // implicitly (PyTorch's side streams are created this way too).
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority));
      streams_.emplace_back(s);
    }
    for (int32_t e = 0; e < plan_.num_events; ++e) {
      SHARDSCOPE_ASSIGN_OR_RETURN(OwnedEvent ev, MakeEvent(false));
      events_by_index_.push_back(std::move(ev));
    }
    for (size_t s = 0; s < streams_.size(); ++s) {
      SHARDSCOPE_ASSIGN_OR_RETURN(OwnedEvent ev, MakeEvent(false));
      join_events_.push_back(std::move(ev));
    }
    if (options_.common.hooks.streams_created) {
      std::vector<void*> handles;
      for (const auto& stream : streams_) handles.push_back(static_cast<void*>(stream.get()));
      SHARDSCOPE_RETURN_IF_ERROR(options_.common.hooks.streams_created(plan_.rank, handles));
    }
    SHARDSCOPE_ASSIGN_OR_RETURN(step_start_, MakeEvent(true));
    SHARDSCOPE_ASSIGN_OR_RETURN(step_end_, MakeEvent(true));
    cublasLtHandle_t lt = nullptr;
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(cublasLtCreate(&lt));
    lt_ = OwnedLt(lt);
    SHARDSCOPE_RETURN_IF_ERROR(AllocateOperands());
    host_spin_ = CalibrateHostSpin();
    SHARDSCOPE_RETURN_IF_ERROR(CalibrateKernelSpin());
    return Status::Ok();
  }

  void SetWorld(ncclComm_t c) { world_ = std::make_unique<NcclComm>(c); }
  // Phase 2, collective over the world: one ncclCommSplit per schedule communicator in index
  // order (non-members pass NCCL_SPLIT_NOCOLOR and get no communicator). Called inside a
  // group by the Job when one thread splits for several ranks.
  Status Split(const CommunicatorPlan& c, ncclComm_t* out) {
    const int color = c.color == kNoColor ? NCCL_SPLIT_NOCOLOR : c.color;
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(ncclCommSplit(world_->get(), color, c.key, out, nullptr));
    return Status::Ok();
  }
  void AdoptComms(std::vector<ncclComm_t> comms) {
    comms_.clear();
    for (ncclComm_t c : comms) comms_.push_back(std::make_unique<NcclComm>(c));
  }

  // Runs warm-up and measured steps, then (cuda_graph) the capture and replays.
  void Run() {
    MarkProgress();
    const Status status = RunSteps();
    if (!status.ok()) {
      std::cerr << fmt::format("shardscope run: rank {}: {}\n", plan_.rank, status.message());
      error_ = status;
      stopped_ = true;
    }
    finished_.store(true);
    SetHostState(stopped_ ? "stopped" : "finished its program; waiting for the other ranks");
  }

  Status error() const { return error_; }

  std::vector<int64_t> ResultRecord() const {
    const auto steps = static_cast<size_t>(options_.common.steps);
    const auto replays = static_cast<size_t>(options_.cuda_graph ? options_.graph_replays : 0);
    std::vector<int64_t> mine(kResultFields + steps + replays, -1);
    const sim::MemoryStats& stats = allocator_.stats();
    mine[kFinished] = stopped_ ? 0 : 1;
    mine[kOom] = oom_ ? 1 : 0;
    if (oom_) {
      mine[kOomOpId] = oom_->op_id;
      mine[kOomInjected] = oom_->injected ? 1 : 0;
      mine[kOomRequested] = oom_->requested;
      mine[kOomFree] = oom_->free_bytes;
      mine[kOomLargest] = oom_->largest_free;
      mine[kOomTime] = oom_->time_ns;
    }
    mine[kCapacity] = capacity_;
    mine[kPeakAllocated] = stats.allocated_bytes_peak;
    mine[kPeakReserved] = stats.reserved_bytes_peak;
    mine[kFragmentation] = fragmentation_;
    mine[kRetries] = stats.num_alloc_retries;
    mine[kNumOoms] = stats.num_ooms + (oom_ && oom_->injected ? 1 : 0);
    mine[kHostBusy] = host_busy_ns_;
    mine[kDeviceAllocs] = stats.num_device_alloc;
    mine[kDeviceFrees] = stats.num_device_free;
    mine[kOperandReserved] = operand_allocator_.stats().reserved_bytes_peak;
    mine[kMemInfoFreeAtPeak] = meminfo_free_at_peak_;
    mine[kMemInfoTotal] = meminfo_total_;
    mine[kDevice] = device_;
    mine[kStepsDone] = static_cast<int64_t>(step_times_.size());
    mine[kGraphStepsDone] = static_cast<int64_t>(graph_times_.size());
    for (size_t i = 0; i < step_times_.size() && i < steps; ++i) mine[kResultFields + i] = step_times_[i];
    for (size_t i = 0; i < graph_times_.size() && i < replays; ++i) mine[kResultFields + steps + i] = graph_times_[i];
    return mine;
  }

  const std::vector<std::string>& notes() const { return notes_; }
  const std::vector<SliceRecord>& host_slices() const { return host_slices_; }
  const std::string& device_name() const { return device_name_; }

  // ---- Watchdog side (another thread)

  int64_t Now() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0_).count();
  }
  int64_t last_progress_ns() const { return last_progress_ns_.load(); }
  bool finished() const { return finished_.load(); }

  // Polls the start/end events of pending collectives (GPU: cudaEventQuery from the watchdog
  // thread, on this rank's device) and advances the lanes; a completion is progress.
  void PollCollectives() {
    if (cudaSetDevice(device_) != cudaSuccess) return;
    std::lock_guard lock(mu_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      FlightRecord& r = records_[it->record];
      if (r.started_ns < 0 && cudaEventQuery(it->start.get()) == cudaSuccess) {
        r.started_ns = Now();
        ++lanes_[Idx(r.communicator)].started;
      }
      if (r.started_ns >= 0 && cudaEventQuery(it->end.get()) == cudaSuccess) {
        r.completed_ns = Now();
        ++lanes_[Idx(r.communicator)].completed;
        MarkProgress();
        it = pending_.erase(it);
        continue;
      }
      ++it;
    }
  }
  bool HasPendingCollectives() {
    std::lock_guard lock(mu_);
    return !pending_.empty();
  }

  std::vector<int64_t> ProgressState() {
    std::lock_guard lock(mu_);
    std::vector<int64_t> state;
    for (const Lane& lane : lanes_) state.insert(state.end(), {lane.issued, lane.started, lane.completed});
    return state;
  }

  void WriteDump(const std::string& reason, const std::map<int32_t, std::vector<int64_t>>& peer_states) {
    std::vector<FlightRecord> records;
    std::vector<FlightLane> lanes;
    FlightDumpContext context;
    {
      std::lock_guard lock(mu_);
      records = records_;
      for (size_t c = 0; c < lanes_.size(); ++c) {
        lanes.push_back(FlightLane{static_cast<int32_t>(c), lanes_[c].issued, lanes_[c].started, lanes_[c].completed});
      }
      context.host = host_state_;
    }
    context.rank = plan_.rank;
    context.reason = reason;
    context.timeout_s = options_.common.timeout_s;
    const int32_t blocked = BlockedRecord(records);
    if (blocked >= 0) {
      const FlightRecord& r = records[static_cast<size_t>(blocked)];
      const int64_t position = r.op_seq - 1;
      for (int32_t member : plan_.communicators[Idx(r.communicator)].ranks) {
        if (member == plan_.rank) continue;
        auto it = peer_states.find(member);
        if (it == peer_states.end() || it->second.size() < 3 * lanes.size()) {
          context.unresponsive_ranks.push_back(member);
        } else if (it->second[Idx(r.communicator) * 3 + 1] <= position) {
          context.missing_ranks.push_back(member);
        }
      }
    }
    const std::filesystem::path dir = std::filesystem::path(options_.common.out_dir) / "flight_recorder";
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    const std::filesystem::path path = dir / fmt::format("rank_{}.json", plan_.rank);
    const Status status = traces::WriteFileAtomically(path.string(), RuntimeFlightRecorderJson(schedule_, records, lanes, context));
    std::cerr << fmt::format("shardscope run: rank {}: {}\n", plan_.rank,
                             status.ok() ? "wrote " + path.string() : status.message());
  }

  void AbortComms() {
    for (auto& c : comms_) {
      if (c) c->Abort();
    }
    if (world_) world_->Abort();
  }

 private:
  static sim::AllocatorConfig OperandConfig(sim::AllocatorConfig config) {
    config.expandable_segments = false;  // operand blocks need device pointers
    config.garbage_collection_threshold = 0;
    config.memory_fraction = 1.0;
    return config;
  }

  void MarkProgress() { last_progress_ns_.store(Now()); }
  void SetHostState(std::string s) {
    std::lock_guard lock(mu_);
    host_state_ = std::move(s);
  }
  cudaStream_t StreamOf(int32_t s) const { return streams_[Idx(s)].get(); }

  // Operand buffers through the operand allocator (the same policy, its own pool: the
  // schedule's allocator sees exactly the schedule's calls, so its peaks are the
  // simulator's), zero-filled so no NaN or denormal slows a GEMM.
  StatusOr<void*> OperandBuffer(int64_t bytes, int32_t stream) {
    if (bytes <= 0) return static_cast<void*>(nullptr);
    const sim::MallocOutcome out = operand_allocator_.Malloc(bytes, stream);
    if (!out.ok) {
      return Status::Internal(fmt::format("rank {}: cannot allocate {} bytes of proxy operands on device {}",
                                          plan_.rank, bytes, device_));
    }
    void* p = operand_memory_.PointerOf(out.address);
    if (p == nullptr) return Status::Internal("operand block outside its segment");
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaMemset(p, 0, static_cast<size_t>(bytes)));
    return p;
  }

  Status AllocateOperands() {
    const std::vector<StreamOperands> sizes = OperandBytes(*plan_.program, cc_);
    operands_.resize(sizes.size());
    int64_t host_bytes = 0;
    for (size_t s = 0; s < sizes.size(); ++s) {
      const auto stream = static_cast<int32_t>(s);
      Operands& o = operands_[s];
      SHARDSCOPE_ASSIGN_OR_RETURN(o.a, OperandBuffer(sizes[s].a_bytes, stream));
      SHARDSCOPE_ASSIGN_OR_RETURN(o.b, OperandBuffer(sizes[s].b_bytes, stream));
      SHARDSCOPE_ASSIGN_OR_RETURN(o.c, OperandBuffer(sizes[s].c_bytes, stream));
      SHARDSCOPE_ASSIGN_OR_RETURN(o.src, OperandBuffer(sizes[s].src_bytes, stream));
      SHARDSCOPE_ASSIGN_OR_RETURN(o.dst, OperandBuffer(sizes[s].dst_bytes, stream));
      SHARDSCOPE_ASSIGN_OR_RETURN(o.workspace, OperandBuffer(sizes[s].workspace_bytes, stream));
      o.workspace_bytes = sizes[s].workspace_bytes;
      host_bytes = std::max({host_bytes, sizes[s].src_bytes, sizes[s].dst_bytes});
    }
    // Collective buffers: one send/recv pair per communicator, sized for its largest
    // collective (execution_plan.h); NCCL serializes a communicator's collectives.
    send_.assign(plan_.communicators.size(), nullptr);
    recv_.assign(plan_.communicators.size(), nullptr);
    for (const CommunicatorPlan& c : plan_.communicators) {
      if (!c.used) continue;
      SHARDSCOPE_ASSIGN_OR_RETURN(send_[Idx(c.index)], OperandBuffer(c.max_send_bytes, 0));
      SHARDSCOPE_ASSIGN_OR_RETURN(recv_[Idx(c.index)], OperandBuffer(c.max_recv_bytes, 0));
    }
    // H2D / D2H copies go through pinned host memory (pageable copies are not asynchronous:
    // CUDA Runtime API, "API synchronization behavior").
    if (host_bytes > 0) {
      void* p = nullptr;
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaMallocHost(&p, static_cast<size_t>(host_bytes)));
      pinned_ = OwnedHostBuffer(p);
    }
    return Status::Ok();
  }

  Status CalibrateKernelSpin() {
    cudaStream_t s = StreamOf(0);
    SHARDSCOPE_ASSIGN_OR_RETURN(OwnedEvent a, MakeEvent(true));
    SHARDSCOPE_ASSIGN_OR_RETURN(OwnedEvent b, MakeEvent(true));
    std::vector<std::pair<int64_t, int64_t>> samples;
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(LaunchSpin(0, s));  // module load, first launch
    for (int r = 0; r < kCalibrationRepeats; ++r) {
      for (int64_t ns : kCalibrationPointsNs) {
        SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaEventRecord(a.get(), s));
        SHARDSCOPE_CUDA_RETURN_IF_ERROR(LaunchSpin(ns, s));
        SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaEventRecord(b.get(), s));
        SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(b.get()));
        float ms = 0;
        SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, a.get(), b.get()));
        samples.emplace_back(ns, static_cast<int64_t>(static_cast<double>(ms) * 1e6));
      }
    }
    kernel_spin_ = FitSpinCalibration(samples);
    return Status::Ok();
  }

  StatusOr<LtPlan*> PlanFor(const LtProblem& p, size_t workspace) {
    const std::string key = ProblemKey(p) + fmt::format(" ws{}", workspace);
    auto it = lt_plans_.find(key);
    if (it != lt_plans_.end()) return it->second.get();
    auto plan = std::make_unique<LtPlan>();
    std::vector<cublasLtMatmulHeuristicResult_t> results;
    SHARDSCOPE_RETURN_IF_ERROR(BuildLtPlan(lt_.get(), p, workspace, 1, plan.get(), &results));
    if (!p.note.empty()) notes_.push_back(p.note);
    return lt_plans_.emplace(key, std::move(plan)).first->second.get();
  }

  Status Gemm(const LtProblem& p, int32_t stream) {
    const Operands& o = operands_[Idx(stream)];
    SHARDSCOPE_ASSIGN_OR_RETURN(LtPlan * plan, PlanFor(p, static_cast<size_t>(o.workspace_bytes)));
    return RunLt(lt_.get(), *plan, plan->algo, p, o.a, o.b, o.c, o.workspace, StreamOf(stream));
  }

  Status MemoryPass(int64_t read, int64_t written, int32_t stream) {
    const Operands& o = operands_[Idx(stream)];
    const CopyGeometry g = MemoryBoundGeometry(read, written, sm_count_);
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(
        LaunchMemoryBound(g.read_vectors, g.write_vectors, g.blocks, g.threads_per_block, o.src, o.dst, StreamOf(stream)));
    return Status::Ok();
  }

  Status Kernel(const traces::KernelOp& k) {
    if (const auto* g = std::get_if<traces::GemmDesc>(&k.compute)) return Gemm(GemmProblem(*g, cc_), k.stream);
    if (const auto* a = std::get_if<traces::AttentionDesc>(&k.compute)) {
      const AttentionProxy proxy = AttentionProblem(*a, cc_);
      for (int64_t done = 0; done < proxy.total_batch; done += proxy.batch_chunk) {
        const int64_t chunk = std::min(proxy.batch_chunk, proxy.total_batch - done);
        LtProblem qk = proxy.qk, pv = proxy.pv;
        qk.batch = chunk;
        pv.batch = chunk;
        for (int32_t i = 0; i < proxy.qk_repeats; ++i) SHARDSCOPE_RETURN_IF_ERROR(Gemm(qk, k.stream));
        for (int32_t i = 0; i < proxy.pv_repeats; ++i) SHARDSCOPE_RETURN_IF_ERROR(Gemm(pv, k.stream));
      }
      return MemoryPass(proxy.memory_read_bytes, proxy.memory_write_bytes, k.stream);
    }
    if (const auto* m = std::get_if<traces::MemoryBoundDesc>(&k.compute)) {
      return MemoryPass(m->bytes_read, m->bytes_written, k.stream);
    }
    const auto& fixed = std::get<traces::FixedDurationDesc>(k.compute);
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(LaunchSpin(SpinRequestFor(kernel_spin_, fixed.duration_ns), StreamOf(k.stream)));
    return Status::Ok();
  }

  Status Memcpy(const traces::MemcpyOp& m) {
    const Operands& o = operands_[Idx(m.stream)];
    const auto bytes = static_cast<size_t>(m.bytes);
    if (bytes == 0) return Status::Ok();
    switch (m.kind) {
      case traces::MemcpyKind::kHostToDevice:
        SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(o.dst, pinned_.get(), bytes, cudaMemcpyHostToDevice, StreamOf(m.stream)));
        break;
      case traces::MemcpyKind::kDeviceToHost:
        SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pinned_.get(), o.src, bytes, cudaMemcpyDeviceToHost, StreamOf(m.stream)));
        break;
      case traces::MemcpyKind::kDeviceToDevice:
        SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(o.dst, o.src, bytes, cudaMemcpyDeviceToDevice, StreamOf(m.stream)));
        break;
    }
    return Status::Ok();
  }

  Status Collective(const OpPlan& op, int32_t index) {
    const auto& coll = std::get<traces::CollectiveOp>(plan_.program->ops[Idx(index)].payload);
    ncclComm_t comm = comms_[Idx(op.communicator)] ? comms_[Idx(op.communicator)]->get() : nullptr;
    if (comm == nullptr) return Status::Internal(fmt::format("op {}: no NCCL communicator", op.op_id));
    cudaStream_t stream = StreamOf(op.stream);
    void* send = send_[Idx(op.communicator)];
    void* recv = recv_[Idx(op.communicator)];
    const NcclTypeAndOp t = NcclTypeFor(coll.dtype);
    const auto send_count = static_cast<size_t>(op.buffers.send_elements);
    const auto recv_count = static_cast<size_t>(op.buffers.recv_elements);
    PendingCollective pending;
    if (!capturing_) {
      SHARDSCOPE_ASSIGN_OR_RETURN(pending.start, MakeEvent(false));
      SHARDSCOPE_ASSIGN_OR_RETURN(pending.end, MakeEvent(false));
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaEventRecord(pending.start.get(), stream));
      std::lock_guard lock(mu_);
      Lane& lane = lanes_[Idx(op.communicator)];
      const bool p2p = coll.type == CollectiveType::kSend || coll.type == CollectiveType::kRecv;
      ++lane.issued;
      FlightRecord r;
      r.op_index = index;
      r.communicator = op.communicator;
      r.collective_seq = p2p ? lane.collectives : ++lane.collectives;
      r.p2p_seq = p2p ? ++lane.p2p : lane.p2p;
      r.op_seq = lane.issued;
      r.created_ns = Now();
      pending.record = records_.size();
      records_.push_back(r);
    }
    // NCCL orders a communicator's operations as they are enqueued, whatever stream they are
    // on (one kernel queue per communicator), so the host backend's per-communicator ticket
    // is NCCL's own behaviour here and needs no code.
    switch (coll.type) {
      case CollectiveType::kAllGather:
        SHARDSCOPE_CUDA_RETURN_IF_ERROR(ncclAllGather(send, recv, send_count, t.type, comm, stream));
        break;
      case CollectiveType::kReduceScatter:
        SHARDSCOPE_CUDA_RETURN_IF_ERROR(ncclReduceScatter(send, recv, recv_count, t.type, t.op, comm, stream));
        break;
      case CollectiveType::kAllReduce:
        SHARDSCOPE_CUDA_RETURN_IF_ERROR(ncclAllReduce(send, recv, send_count, t.type, t.op, comm, stream));
        break;
      case CollectiveType::kBroadcast:
        SHARDSCOPE_CUDA_RETURN_IF_ERROR(ncclBroadcast(send, recv, recv_count, t.type, op.peer_comm_rank, comm, stream));
        break;
      case CollectiveType::kReduce:
        SHARDSCOPE_CUDA_RETURN_IF_ERROR(ncclReduce(send, recv, send_count, t.type, t.op, op.peer_comm_rank, comm, stream));
        break;
      case CollectiveType::kAllToAll: {
        // ProcessGroupNCCL::alltoall_base: a group of one send and one receive per peer.
        const auto group = plan_.communicators[Idx(op.communicator)].ranks.size();
        const size_t part = send_count / std::max<size_t>(1, group);
        const size_t part_bytes = part * static_cast<size_t>(op.buffers.element_bytes);
        SHARDSCOPE_CUDA_RETURN_IF_ERROR(ncclGroupStart());
        for (size_t peer = 0; peer < group; ++peer) {
          SHARDSCOPE_CUDA_RETURN_IF_ERROR(ncclSend(static_cast<char*>(send) + peer * part_bytes, part, t.type,
                                                   static_cast<int>(peer), comm, stream));
          SHARDSCOPE_CUDA_RETURN_IF_ERROR(ncclRecv(static_cast<char*>(recv) + peer * part_bytes, part, t.type,
                                                   static_cast<int>(peer), comm, stream));
        }
        SHARDSCOPE_CUDA_RETURN_IF_ERROR(ncclGroupEnd());
        break;
      }
      case CollectiveType::kSend:
        SHARDSCOPE_CUDA_RETURN_IF_ERROR(ncclSend(send, send_count, t.type, op.peer_comm_rank, comm, stream));
        break;
      case CollectiveType::kRecv:
        SHARDSCOPE_CUDA_RETURN_IF_ERROR(ncclRecv(recv, recv_count, t.type, op.peer_comm_rank, comm, stream));
        break;
    }
    if (!capturing_) {
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaEventRecord(pending.end.get(), stream));
      std::lock_guard lock(mu_);
      pending_.push_back(std::move(pending));
    }
    return Status::Ok();
  }

  void AfterAllocatorCall() {
    const sim::MemoryStats& stats = allocator_.stats();
    if (stats.reserved_bytes > reserved_peak_seen_) {
      reserved_peak_seen_ = stats.reserved_bytes;
      fragmentation_ = stats.reserved_bytes - stats.allocated_bytes;
      size_t free_bytes = 0, total_bytes = 0;
      if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
        meminfo_free_at_peak_ = static_cast<int64_t>(free_bytes);
        meminfo_total_ = static_cast<int64_t>(total_bytes);
      }
    }
  }

  void Oom(const OomRecord& oom) {
    oom_ = oom;
    std::cerr << fmt::format("shardscope run: rank {}: out of memory at op {}{} (requested {} bytes); the rank stops "
                             "(OOM policy raise)\n",
                             plan_.rank, oom.op_id, oom.injected ? " (injected)" : "", oom.requested);
    stopped_ = true;
    SetHostState(fmt::format("stopped: out of memory at op {}{}", oom.op_id, oom.injected ? " (injected)" : ""));
  }

  void Allocate(const OpPlan& op, int32_t step) {
    const auto& inject = options_.common.inject_oom;
    if (inject && inject->rank == plan_.rank && inject->op_id == op.op_id && step == options_.common.warmup) {
      Oom(OomRecord{op.op_id, Now(), op.bytes,
                    std::max<int64_t>(0, capacity_ - allocator_.stats().reserved_bytes), 0, true});
      return;
    }
    uint64_t& address = tensor_address_[Idx(op.tensor)];
    if (address != 0) return;  // live from the previous step: the simulator's warm-start rule
    const sim::MallocOutcome out = allocator_.Malloc(op.bytes, op.stream);
    if (!out.ok) {
      Oom(OomRecord{op.op_id, Now(), out.requested_bytes, out.device_free_bytes, out.largest_free_block, false});
      return;
    }
    address = out.address;
    AfterAllocatorCall();
  }

  // One op. Synchronizations are skipped while capturing (illegal in a capture; the replay
  // is one launch followed by one synchronization).
  Status Issue(int32_t index, int32_t step) {
    const OpPlan& op = plan_.ops[Idx(index)];
    const traces::Op& source = plan_.program->ops[Idx(index)];
    switch (op.op_class) {
      case OpClass::kKernel: return Kernel(std::get<traces::KernelOp>(source.payload));
      case OpClass::kMemcpy: return Memcpy(std::get<traces::MemcpyOp>(source.payload));
      case OpClass::kCollective: return Collective(op, index);
      case OpClass::kEventRecord:
        SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaEventRecord(events_by_index_[Idx(op.event)].get(), StreamOf(op.stream)));
        return Status::Ok();
      case OpClass::kStreamWaitEvent:
        // cudaStreamWaitEvent captures the event's most recent record at call time; an event
        // never recorded is complete (the wait is a no-op), as the schedule's semantics say.
        SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(StreamOf(op.stream), events_by_index_[Idx(op.event)].get(), 0));
        return Status::Ok();
      case OpClass::kStreamSynchronize:
        if (capturing_) return Status::Ok();
        SetHostState(fmt::format("cudaStreamSynchronize on stream '{}' (op {})", plan_.streams[Idx(op.stream)].name, op.op_id));
        SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(StreamOf(op.stream)));
        return Status::Ok();
      case OpClass::kDeviceSynchronize:
        if (capturing_) return Status::Ok();
        SetHostState(fmt::format("cudaDeviceSynchronize (op {})", op.op_id));
        SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
        return Status::Ok();
      case OpClass::kEventSynchronize:
        if (capturing_) return Status::Ok();
        SetHostState(fmt::format("cudaEventSynchronize on event '{}' (op {})", plan_.program->events[Idx(op.event)], op.op_id));
        SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(events_by_index_[Idx(op.event)].get()));
        return Status::Ok();
      case OpClass::kHostWork:
        if (!capturing_) SpinHostFor(SpinRequestFor(host_spin_, op.duration_ns));
        return Status::Ok();
      case OpClass::kAllocate:
        Allocate(op, step);
        return Status::Ok();
      case OpClass::kFree: {
        uint64_t& address = tensor_address_[Idx(op.tensor)];
        if (address != 0) {
          allocator_.Free(address);
          address = 0;
          AfterAllocatorCall();
        }
        return Status::Ok();
      }
      case OpClass::kRecordStream: {
        const uint64_t address = tensor_address_[Idx(op.tensor)];
        if (address != 0 && !capturing_) allocator_.RecordStream(address, op.stream);
        return Status::Ok();
      }
    }
    return Status::Ok();
  }

  Status IssueWithMarkers(int32_t index, int32_t step) {
    const OpPlan& op = plan_.ops[Idx(index)];
    // NVTX: one range per op, its op id as the payload (and the message, for tools that show
    // only names); nvtx3 is header-only and costs nothing without a tool attached.
    nvtxEventAttributes_t attributes{};
    attributes.version = NVTX_VERSION;
    attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    attributes.payloadType = NVTX_PAYLOAD_TYPE_INT64;
    attributes.payload.llValue = op.op_id;
    attributes.messageType = NVTX_MESSAGE_TYPE_ASCII;
    const std::string_view name = plan_.program->NameOf(plan_.program->ops[Idx(index)].name);
    const std::string message = fmt::format("op {} {}", op.op_id, name);
    attributes.message.ascii = message.c_str();
    nvtxRangePushEx(&attributes);
    if (options_.common.hooks.before_issue) options_.common.hooks.before_issue(op.op_id);
    const int64_t start = Now();
    const Status status = Issue(index, step);
    const int64_t end = Now();
    host_busy_ns_ += end - start;
    // The host-side timeline (host_timeline.h): when the host issued the op, not when the
    // device ran it (that is the CUPTI capture's, `run --profile`).
    host_slices_.push_back(SliceRecord{0, index, start, end, step, -1});
    if (options_.common.hooks.after_issue) options_.common.hooks.after_issue(op.op_id);
    nvtxRangePop();
    MarkProgress();
    if (!status.ok()) return status.WithContext(fmt::format("rank {} op {}", plan_.rank, op.op_id));
    return status;
  }

  // The step's end on the device: every stream joins stream 0, then the end event.
  Status JoinStreams() {
    for (size_t s = 1; s < streams_.size(); ++s) {
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaEventRecord(join_events_[s].get(), streams_[s].get()));
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(StreamOf(0), join_events_[s].get(), 0));
    }
    return Status::Ok();
  }
  // Inside a capture, every other stream forks from stream 0 (joins the capture).
  Status ForkStreams() {
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaEventRecord(join_events_[0].get(), StreamOf(0)));
    for (size_t s = 1; s < streams_.size(); ++s) {
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(streams_[s].get(), join_events_[0].get(), 0));
    }
    return Status::Ok();
  }

  StatusOr<int64_t> ElapsedNs() {
    float ms = 0;
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, step_start_.get(), step_end_.get()));
    return static_cast<int64_t>(static_cast<double>(ms) * 1e6);
  }

  Status RunSteps() {
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    SetHostState("running its program");
    const int32_t total = options_.common.warmup + options_.common.steps;
    for (int32_t step = 0; step < total && !stopped_; ++step) {
      // The previous step ended with a device synchronization: every stream is idle, so an
      // event on stream 0 marks the start of the whole device's step.
      const bool measured = step >= options_.common.warmup;
      if (options_.common.hooks.before_step) {
        SHARDSCOPE_RETURN_IF_ERROR(options_.common.hooks.before_step(step, measured));
      }
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaEventRecord(step_start_.get(), StreamOf(0)));
      for (size_t i = 0; i < plan_.ops.size() && !stopped_; ++i) {
        SHARDSCOPE_RETURN_IF_ERROR(IssueWithMarkers(static_cast<int32_t>(i), step));
      }
      SHARDSCOPE_RETURN_IF_ERROR(JoinStreams());
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaEventRecord(step_end_.get(), StreamOf(0)));
      SetHostState("cudaDeviceSynchronize (end of step)");
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
      if (options_.common.hooks.after_step) {
        SHARDSCOPE_RETURN_IF_ERROR(options_.common.hooks.after_step(step, measured));
      }
      SetHostState("running its program");
      if (!stopped_ && step >= options_.common.warmup) {
        SHARDSCOPE_ASSIGN_OR_RETURN(int64_t ns, ElapsedNs());
        step_times_.push_back(ns);
      }
    }
    if (options_.cuda_graph && !stopped_) SHARDSCOPE_RETURN_IF_ERROR(CaptureAndReplay());
    return Status::Ok();
  }

  // One step captured on stream 0 (relaxed mode: the allocator's host-side calls may still
  // cudaMalloc; with a warm allocator they hit its cache), then replayed. GPU: NCCL kernels are
  // capturable since NCCL 2.9 (NCCL docs, "Using NCCL with CUDA Graphs").
  Status CaptureAndReplay() {
    const int32_t step = options_.common.warmup + options_.common.steps;
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(StreamOf(0), cudaStreamCaptureModeRelaxed));
    capturing_ = true;
    Status status = ForkStreams();
    for (size_t i = 0; i < plan_.ops.size() && status.ok() && !stopped_; ++i) {
      status = IssueWithMarkers(static_cast<int32_t>(i), step);
    }
    if (status.ok()) status = JoinStreams();
    cudaGraph_t graph_raw = nullptr;
    const cudaError_t end = cudaStreamEndCapture(StreamOf(0), &graph_raw);
    capturing_ = false;
    OwnedGraph graph(graph_raw);
    SHARDSCOPE_RETURN_IF_ERROR(status);
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(end);
    cudaGraphExec_t exec_raw = nullptr;
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec_raw, graph.get(), 0));
    OwnedGraphExec exec(exec_raw);
    for (int32_t r = 0; r < options_.graph_replays; ++r) {
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaEventRecord(step_start_.get(), StreamOf(0)));
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec.get(), StreamOf(0)));
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaEventRecord(step_end_.get(), StreamOf(0)));
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
      SHARDSCOPE_ASSIGN_OR_RETURN(int64_t ns, ElapsedNs());
      graph_times_.push_back(ns);
      MarkProgress();
    }
    return Status::Ok();
  }

  struct Operands {
    void *a = nullptr, *b = nullptr, *c = nullptr, *src = nullptr, *dst = nullptr, *workspace = nullptr;
    int64_t workspace_bytes = 0;
  };

  const traces::Schedule& schedule_;
  const sim::SimulationSetup& setup_;
  const ExecutionPlan plan_;
  const CudaRunOptions& options_;
  const int32_t device_;
  const int64_t capacity_;
  const Clock::time_point t0_ = Clock::now();  // the job start for this rank (dump times)

  // Declared before the allocators that use them (destroyed after).
  std::vector<OwnedStream> streams_;
  CudaDeviceMemory memory_;
  CudaStreamEvents events_;
  sim::CachingAllocator allocator_;  // the schedule's allocations: host thread only
  CudaDeviceMemory operand_memory_;
  CudaStreamEvents operand_events_;
  sim::CachingAllocator operand_allocator_;  // proxy operands and collective buffers

  ComputeCapability cc_;
  int32_t sm_count_ = 1;
  std::string device_name_;
  std::vector<int32_t> stream_priorities_;
  std::vector<OwnedEvent> events_by_index_, join_events_;
  OwnedEvent step_start_, step_end_;
  OwnedLt lt_;
  std::map<std::string, std::unique_ptr<LtPlan>> lt_plans_;
  std::vector<Operands> operands_;
  std::vector<void*> send_, recv_;
  OwnedHostBuffer pinned_;
  SpinCalibration host_spin_, kernel_spin_;
  std::unique_ptr<NcclComm> world_;
  std::vector<std::unique_ptr<NcclComm>> comms_;  // per schedule communicator (null: not a member)
  bool capturing_ = false;

  // Shared with the watchdog, under mu_:
  std::mutex mu_;
  std::vector<Lane> lanes_;
  std::vector<FlightRecord> records_;
  std::vector<PendingCollective> pending_;
  std::string host_state_ = "starting";
  std::atomic<int64_t> last_progress_ns_{0};
  std::atomic<bool> finished_{false};

  // Host thread only:
  std::vector<uint64_t> tensor_address_;
  std::optional<OomRecord> oom_;
  bool stopped_ = false;
  Status error_ = Status::Ok();
  int64_t reserved_peak_seen_ = -1, fragmentation_ = 0, host_busy_ns_ = 0;
  int64_t meminfo_free_at_peak_ = -1, meminfo_total_ = -1;
  std::vector<int64_t> step_times_, graph_times_;
  std::vector<std::string> notes_;
  std::vector<SliceRecord> host_slices_;
};

// Side channel of the watchdog (MPI mode), as the host backend's.
constexpr int kStateTag = 1;
constexpr int kDumpedTag = 2;

// The ranks of this process, their watchdog, and the exchange of results.
class Job {
 public:
  Job(const MpiSession& mpi, const traces::Schedule& schedule, const sim::SimulationSetup& setup,
      const CudaRunOptions& options)
      : mpi_(mpi), schedule_(schedule), setup_(setup), options_(options) {}

  ~Job() {
    for (MPI_Comm* c : {&watchdog_comm_, &results_comm_}) {
      if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
    }
  }

  StatusOr<RunResult> Run(int32_t device_count) {
    SHARDSCOPE_RETURN_IF_ERROR(MpiStatus(MPI_Comm_dup(MPI_COMM_WORLD, &watchdog_comm_), "MPI_Comm_dup"));
    SHARDSCOPE_RETURN_IF_ERROR(MpiStatus(MPI_Comm_dup(MPI_COMM_WORLD, &results_comm_), "MPI_Comm_dup"));
    SHARDSCOPE_ASSIGN_OR_RETURN(const int32_t local_rank, LocalRank());
    // Phase 1 (local). Every rank of the job reaches the agreement below, so a local failure
    // (no device for this local rank, a bad program, cudaMalloc failing) cannot leave a peer
    // waiting in NCCL initialization.
    Status local = Status::Ok();
    DeviceAssignment assignment;
    if (StatusOr<DeviceAssignment> a =
            AssignDevices(schedule_.world_size(), mpi_.world_size(), local_rank, device_count);
        a.ok()) {
      assignment = std::move(*a);
    } else {
      local = a.status();
    }
    threaded_ = assignment.one_process_drives_all;
    const sim::ClusterCostProvider costs(schedule_, setup_.cluster);
    std::error_code ec;
    if (local.ok()) std::filesystem::create_directories(options_.common.out_dir, ec);
    if (ec) local = Status::IoError(fmt::format("cannot create '{}': {}", options_.common.out_dir, ec.message()));
    for (size_t i = 0; i < assignment.devices.size() && local.ok(); ++i) {
      const int32_t rank = threaded_ ? static_cast<int32_t>(i) : mpi_.rank();
      StatusOr<ExecutionPlan> plan = BuildExecutionPlan(schedule_, rank, schedule_.world_size(), costs);
      if (!plan.ok()) {
        local = plan.status();
        break;
      }
      const int64_t capacity = options_.common.capacity_bytes >= 0 ? options_.common.capacity_bytes
                                                                   : sim::AllocatorCapacity(setup_, rank);
      ranks_.push_back(std::make_unique<CudaRank>(schedule_, setup_, std::move(*plan), options_,
                                                  assignment.devices[i], capacity));
      local = ranks_.back()->SetupLocal();
    }
    const int local_ok = local.ok() ? 1 : 0;
    int all_ok = 0;
    SHARDSCOPE_RETURN_IF_ERROR(
        MpiStatus(MPI_Allreduce(&local_ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD), "MPI_Allreduce"));
    if (!local.ok()) return local;
    if (all_ok == 0) return Status::InvalidInput("another rank failed its setup (its message says why)");
    // Phase 2: NCCL, already under the watchdog (an initialization that never completes, a
    // peer that died in it, is a hang like any other).
    watchdog_ = std::thread([this] { WatchdogLoop(); });
    if (Status nccl = InitNccl(); !nccl.ok()) {
      watchdog_stop_.store(true);
      watchdog_.join();
      return nccl;
    }
    // Run.
    if (threaded_) {
      std::vector<std::thread> threads;
      for (auto& r : ranks_) threads.emplace_back([&r] { r->Run(); });
      for (std::thread& t : threads) t.join();
    } else {
      ranks_[0]->Run();
    }
    StatusOr<RunResult> result = ExchangeResults();
    MPI_Barrier(results_comm_);
    watchdog_stop_.store(true);
    watchdog_.join();
    for (auto& r : ranks_) {
      if (!r->error().ok()) return r->error();
    }
    return result;
  }

 private:
  StatusOr<int32_t> LocalRank() {
    if (std::optional<int32_t> env = LocalRankFromEnvironment([](const char* n) -> const char* { return std::getenv(n); })) {
      return *env;
    }
    // No launcher variable: the rank within the processes sharing this node's memory.
    MPI_Comm node = MPI_COMM_NULL;
    SHARDSCOPE_RETURN_IF_ERROR(MpiStatus(
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, mpi_.rank(), MPI_INFO_NULL, &node),
        "MPI_Comm_split_type"));
    int local = 0;
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    return local;
  }

  Status InitNccl() {
    const int32_t world = schedule_.world_size();
    if (threaded_) {
      std::vector<ncclComm_t> comms(static_cast<size_t>(world), nullptr);
      std::vector<int> devices;
      for (auto& r : ranks_) devices.push_back(r->device());
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(ncclCommInitAll(comms.data(), world, devices.data()));
      for (size_t i = 0; i < ranks_.size(); ++i) ranks_[i]->SetWorld(comms[i]);
    } else {
      // The world communicator from a unique id rank 0 creates and MPI broadcasts (NCCL docs,
      // "Creating a communicator with options" / the MPI example).
      ncclUniqueId id{};
      if (mpi_.rank() == 0) SHARDSCOPE_CUDA_RETURN_IF_ERROR(ncclGetUniqueId(&id));
      SHARDSCOPE_RETURN_IF_ERROR(
          MpiStatus(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast(ncclUniqueId)"));
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaSetDevice(ranks_[0]->device()));
      ncclComm_t c = nullptr;
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(ncclCommInitRank(&c, world, id, mpi_.rank()));
      ranks_[0]->SetWorld(c);
    }
    // One split per schedule communicator, in index order, every rank (collective over the
    // world); several ranks of one thread split inside a group (NCCL docs, ncclCommSplit).
    std::vector<std::vector<ncclComm_t>> split(ranks_.size(),
                                               std::vector<ncclComm_t>(schedule_.communicators.size(), nullptr));
    for (size_t c = 0; c < schedule_.communicators.size(); ++c) {
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(ncclGroupStart());
      Status status = Status::Ok();
      for (size_t r = 0; r < ranks_.size() && status.ok(); ++r) {
        status = ranks_[r]->Split(ranks_[r]->plan().communicators[c], &split[r][c]);
      }
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(ncclGroupEnd());
      SHARDSCOPE_RETURN_IF_ERROR(status);
    }
    for (size_t r = 0; r < ranks_.size(); ++r) ranks_[r]->AdoptComms(split[r]);
    return Status::Ok();
  }

  // ---- Watchdog: the host backend's protocol (host_backend.cc WatchdogLoop, after
  // ProcessGroupNCCL's watchdog with TORCH_NCCL_DUMP_ON_TIMEOUT), with progress read from the
  // collectives' CUDA events, and every NCCL communicator aborted before MPI_Abort.
  void WatchdogLoop() {
    const auto poll = std::chrono::milliseconds(20);
    const auto timeout_ns = static_cast<int64_t>(options_.common.timeout_s * 1e9);
    const int64_t grace_ns = std::clamp<int64_t>(timeout_ns / 2, 500'000'000, 5'000'000'000);
    const int world = mpi_.world_size();
    bool dumping = false, written = false, initiator = false;
    int64_t dump_started = 0, written_at = 0;
    std::string reason;
    std::map<int32_t, std::vector<int64_t>> peer_states;
    std::set<int32_t> dumped_peers;
    std::vector<int64_t> my_state;
    std::vector<MPI_Request> requests;
    const int64_t kDumpedNote = 1;
    const Clock::time_point t0 = Clock::now();
    auto now_ns = [&] { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count(); };
    while (!(watchdog_stop_.load() && !dumping)) {
      std::this_thread::sleep_for(poll);
      for (auto& r : ranks_) r->PollCollectives();
      while (!threaded_) {
        int flag = 0;
        MPI_Status status;
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, watchdog_comm_, &flag, &status);
        if (!flag) break;
        int count = 0;
        MPI_Get_count(&status, MPI_INT64_T, &count);
        std::vector<int64_t> message(static_cast<size_t>(std::max(count, 1)));
        MPI_Recv(message.data(), count, MPI_INT64_T, status.MPI_SOURCE, status.MPI_TAG, watchdog_comm_,
                 MPI_STATUS_IGNORE);
        if (status.MPI_TAG == kStateTag) {
          peer_states[status.MPI_SOURCE] = std::move(message);
          if (!dumping) reason = fmt::format("dump requested by rank {} (its watchdog fired)", status.MPI_SOURCE);
        } else {
          dumped_peers.insert(status.MPI_SOURCE);
        }
      }
      // Stalled: a rank that has not finished made no progress (host op issued, collective
      // completed) for the timeout.
      bool stalled = false;
      for (auto& r : ranks_) {
        if (!r->finished() && r->Now() - r->last_progress_ns() > timeout_ns) stalled = true;
        if (r->finished() && r->HasPendingCollectives() && r->Now() - r->last_progress_ns() > timeout_ns) stalled = true;
      }
      if (!dumping && (stalled || !peer_states.empty())) {
        dumping = true;
        dump_started = now_ns();
        if (peer_states.empty()) {
          initiator = true;
          reason = fmt::format("watchdog timeout: no operation completed on this rank for {:g} s",
                               options_.common.timeout_s);
          std::cerr << fmt::format("shardscope run: {}; dumping the flight recorder and aborting the job\n", reason);
        }
        if (!threaded_) {
          my_state = ranks_[0]->ProgressState();
          for (int peer = 0; peer < world; ++peer) {
            if (peer == mpi_.rank()) continue;
            requests.emplace_back();
            MPI_Isend(my_state.data(), static_cast<int>(my_state.size()), MPI_INT64_T, peer, kStateTag,
                      watchdog_comm_, &requests.back());
          }
        }
      }
      const int64_t now = now_ns();
      if (dumping && !written &&
          (threaded_ || static_cast<int32_t>(peer_states.size()) == world - 1 || now - dump_started > grace_ns)) {
        if (threaded_) {
          std::map<int32_t, std::vector<int64_t>> local_states;
          for (auto& r : ranks_) local_states[r->rank()] = r->ProgressState();
          for (auto& r : ranks_) r->WriteDump(reason, local_states);
        } else {
          ranks_[0]->WriteDump(reason, peer_states);
        }
        written = true;
        written_at = now_ns();
        for (int peer = 0; peer < world && !threaded_; ++peer) {
          if (peer == mpi_.rank()) continue;
          requests.emplace_back();
          MPI_Isend(&kDumpedNote, 1, MPI_INT64_T, peer, kDumpedTag, watchdog_comm_, &requests.back());
        }
      }
      if (written) {
        const bool all_dumped = threaded_ || static_cast<int32_t>(dumped_peers.size()) == world - 1;
        if ((initiator && (all_dumped || now - written_at > grace_ns)) || now - written_at > 3 * grace_ns) {
          // NCCL kernels of a hung collective spin forever; abort them before tearing down.
          for (auto& r : ranks_) r->AbortComms();
          std::cerr << "shardscope run: aborted every NCCL communicator; aborting the job (hang)\n";
          MPI_Abort(MPI_COMM_WORLD, 1);
        }
      }
    }
  }

  // ---- Results: every rank's record to rank 0 (MPI_Gather, or directly when one process
  // runs them all), then rank 0 writes report.json.
  StatusOr<RunResult> ExchangeResults() {
    const int32_t world = schedule_.world_size();
    std::vector<int64_t> all;
    size_t record_size = 0;
    if (threaded_) {
      for (auto& r : ranks_) {
        const std::vector<int64_t> rec = r->ResultRecord();
        record_size = rec.size();
        all.insert(all.end(), rec.begin(), rec.end());
      }
    } else {
      const std::vector<int64_t> mine = ranks_[0]->ResultRecord();
      record_size = mine.size();
      if (mpi_.rank() == 0) all.resize(record_size * static_cast<size_t>(world));
      SHARDSCOPE_RETURN_IF_ERROR(MpiStatus(MPI_Gather(mine.data(), static_cast<int>(record_size), MPI_INT64_T,
                                                      all.data(), static_cast<int>(record_size), MPI_INT64_T, 0,
                                                      results_comm_),
                                           "MPI_Gather"));
    }
    // The host-side timeline, as the host backend gathers it (host_timeline.h).
    TimelineSlices timeline;
    if (threaded_) {
      for (auto& r : ranks_) {
        const size_t before = timeline.values.size();
        AppendFlattened(r->host_slices(), timeline.values);
        timeline.counts.push_back(static_cast<int>(timeline.values.size() - before));
      }
    } else {
      std::vector<int64_t> flat;
      AppendFlattened(ranks_[0]->host_slices(), flat);
      SHARDSCOPE_ASSIGN_OR_RETURN(timeline, GatherTimelineSlices(results_comm_, std::move(flat)));
    }
    RunResult result;
    if (mpi_.rank() != 0) {
      result.completed = ranks_[0]->ResultRecord()[kFinished] == 1;
      return result;
    }
    result.completed = true;
    for (int32_t r = 0; r < world; ++r) {
      const int64_t* rec = all.data() + static_cast<size_t>(r) * record_size;
      if (rec[kFinished] == 0) result.completed = false;
      if (rec[kOom] == 1) result.oom_ranks.push_back(r);
    }
    all_ = std::move(all);
    record_size_ = record_size;
    result.summary = SummaryText();
    const std::filesystem::path dir(options_.common.out_dir);
    SHARDSCOPE_RETURN_IF_ERROR(traces::WriteFileAtomically((dir / "report.json").string(), ReportJson()));
    SHARDSCOPE_RETURN_IF_ERROR(WriteHostTimeline((dir / "host_timeline.json").string(), schedule_, timeline,
                                                 fmt::format("shardscope {} run --backend cuda", sim::Version()),
                                                 "nccl"));
    return result;
  }

  const int64_t* RecordOf(int32_t r) const { return all_.data() + static_cast<size_t>(r) * record_size_; }
  std::vector<int64_t> StepTimesOf(const int64_t* rec) const {
    std::vector<int64_t> t;
    for (int64_t i = 0; i < rec[kStepsDone] && i < options_.common.steps; ++i) t.push_back(rec[kResultFields + i]);
    return t;
  }
  std::vector<int64_t> GraphTimesOf(const int64_t* rec) const {
    std::vector<int64_t> t;
    const int64_t base = kResultFields + options_.common.steps;
    for (int64_t i = 0; i < rec[kGraphStepsDone] && i < options_.graph_replays; ++i) t.push_back(rec[base + i]);
    return t;
  }
  static int64_t Median(std::vector<int64_t> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[(v.size() - 1) / 2];
  }

  std::string SummaryText() const {
    int64_t step = 0, graph = 0, peak = 0;
    for (int32_t r = 0; r < schedule_.world_size(); ++r) {
      step = std::max(step, Median(StepTimesOf(RecordOf(r))));
      graph = std::max(graph, Median(GraphTimesOf(RecordOf(r))));
      peak = std::max(peak, RecordOf(r)[kPeakReserved]);
    }
    std::string text = fmt::format("{}: ran {} rank(s) on the CUDA backend ({}), {} warm-up + {} measured step(s)\n",
                                   options_.common.source, schedule_.world_size(), ranks_[0]->device_name(),
                                   options_.common.warmup, options_.common.steps);
    text += fmt::format("  step (median, slowest rank)  {:>12.3f} ms (CUDA events)\n", static_cast<double>(step) * 1e-6);
    if (options_.cuda_graph) {
      text += fmt::format("  CUDA graph replay            {:>12.3f} ms (eager / graph = {:.3f})\n",
                          static_cast<double>(graph) * 1e-6,
                          graph > 0 ? static_cast<double>(step) / static_cast<double>(graph) : 0.0);
    }
    text += fmt::format("  peak reserved                {:>12} bytes (the simulator's allocator policy over cudaMalloc)\n",
                        peak);
    for (int32_t r = 0; r < schedule_.world_size(); ++r) {
      if (RecordOf(r)[kOom] == 1) {
        text += fmt::format("  OOM: rank {} ran out of memory at op {}{}; it stopped (raise)\n", r,
                            RecordOf(r)[kOomOpId], RecordOf(r)[kOomInjected] ? " (injected)" : "");
      }
    }
    return text;
  }

  std::string ReportJson() const {
    nlohmann::ordered_json j;
    j["shardscope_version"] = std::string(sim::Version());
    j["source"] = options_.common.source;
    j["strategy"] = schedule_.metadata.count("plan.strategy") ? schedule_.metadata.at("plan.strategy") : "";
    j["model"] = schedule_.metadata.count("plan.model") ? schedule_.metadata.at("plan.model") : "";
    j["world_size"] = schedule_.world_size();
    j["cluster"] = {{"name", setup_.cluster.name},
                    {"gpu", setup_.cluster.gpu.name},
                    {"nodes", setup_.cluster.nodes},
                    {"gpus_per_node", setup_.cluster.gpus_per_node}};
    bool completed = true;
    int64_t step = 0, peak_reserved = 0, peak_allocated = 0, retries = 0, ooms = 0;
    int32_t peak_rank = 0;
    nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
    for (int32_t r = 0; r < schedule_.world_size(); ++r) {
      const int64_t* rec = RecordOf(r);
      const std::vector<int64_t> times = StepTimesOf(rec);
      completed = completed && rec[kFinished] == 1;
      step = std::max(step, Median(times));
      if (rec[kPeakReserved] > peak_reserved) {
        peak_reserved = rec[kPeakReserved];
        peak_rank = r;
      }
      peak_allocated = std::max(peak_allocated, rec[kPeakAllocated]);
      retries += rec[kRetries];
      ooms += rec[kNumOoms];
      nlohmann::ordered_json rank;
      rank["rank"] = r;
      rank["step_time_ns"] = Median(times);
      rank["step_times_ns"] = times;
      rank["host_busy_ns"] = rec[kHostBusy];
      rank["finished"] = rec[kFinished] == 1;
      rank["capacity_bytes"] = rec[kCapacity];
      rank["peak_allocated_bytes"] = rec[kPeakAllocated];
      rank["peak_reserved_bytes"] = rec[kPeakReserved];
      rank["fragmentation_bytes"] = rec[kFragmentation];
      rank["num_alloc_retries"] = rec[kRetries];
      rank["num_ooms"] = rec[kNumOoms];
      rank["num_device_alloc"] = rec[kDeviceAllocs];
      rank["num_device_free"] = rec[kDeviceFrees];
      if (rec[kOom] == 1) {
        rank["oom"] = {{"op_id", rec[kOomOpId]},          {"time_ns", rec[kOomTime]},
                       {"requested_bytes", rec[kOomRequested]}, {"free_bytes", rec[kOomFree]},
                       {"largest_free_block", rec[kOomLargest]}, {"injected", rec[kOomInjected] == 1}};
      } else {
        rank["oom"] = nullptr;
      }
      // CUDA-only: the device, what cudaMemGetInfo said when the allocator's reserved bytes
      // peaked (the real device's view, CUDA context and proxy operands included), the proxy
      // operands' own pool, and the CUDA-graph replays.
      rank["device"] = rec[kDevice];
      rank["mem_get_info_at_peak"] = {{"free_bytes", rec[kMemInfoFreeAtPeak]}, {"total_bytes", rec[kMemInfoTotal]}};
      rank["operand_reserved_bytes"] = rec[kOperandReserved];
      if (options_.cuda_graph) rank["graph_step_times_ns"] = GraphTimesOf(rec);
      ranks.push_back(rank);
    }
    j["completed"] = completed;
    j["step_time_ns"] = step;
    j["memory"] = {{"peak_reserved_bytes", peak_reserved},
                   {"peak_reserved_rank", peak_rank},
                   {"peak_allocated_bytes", peak_allocated},
                   {"num_alloc_retries", retries},
                   {"num_ooms", ooms},
                   {"allocator_conf", setup_.memory.alloc_conf}};
    j["hang"] = false;  // a hang aborts the job: its evidence is in flight_recorder/
    std::set<std::string> notes;
    for (const auto& r : ranks_) notes.insert(r->notes().begin(), r->notes().end());
    j["runtime"] = {{"backend", "cuda"},
                    {"device_name", ranks_[0]->device_name()},
                    {"processes", threaded_ ? "one process, one host thread per GPU" : "one process per GPU (MPI)"},
                    {"note", "kernels are proxies of the schedule's shapes (cuBLASLt GEMMs, attention as two batched "
                             "GEMMs and a memory pass, 16-byte stream kernels, %globaltimer spins); step times from "
                             "CUDA events"},
                    {"proxy_substitutions", std::vector<std::string>(notes.begin(), notes.end())},
                    {"steps", options_.common.steps},
                    {"warmup", options_.common.warmup},
                    {"cuda_graph", options_.cuda_graph},
                    {"timeout_s", options_.common.timeout_s}};
    j["ranks"] = ranks;
    return j.dump(2) + "\n";
  }

  const MpiSession& mpi_;
  const traces::Schedule& schedule_;
  const sim::SimulationSetup& setup_;
  const CudaRunOptions& options_;
  bool threaded_ = false;
  std::vector<std::unique_ptr<CudaRank>> ranks_;
  std::thread watchdog_;
  std::atomic<bool> watchdog_stop_{false};
  MPI_Comm watchdog_comm_ = MPI_COMM_NULL;
  MPI_Comm results_comm_ = MPI_COMM_NULL;
  std::vector<int64_t> all_;
  size_t record_size_ = 0;
};

}  // namespace

// ---- GEMM benchmark for the GPU tests (cuda_internal.h).
StatusOr<GemmBenchmark> BenchmarkGemm(const traces::GemmDesc& gemm, int32_t iterations, int32_t max_algorithms) {
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaSetDevice(0));
  cudaDeviceProp prop{};
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  const ComputeCapability cc{prop.major, prop.minor};
  const LtProblem p = GemmProblem(gemm, cc);
  const auto workspace = static_cast<size_t>(CublasWorkspaceBytes(cc));
  cublasLtHandle_t lt_raw = nullptr;
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(cublasLtCreate(&lt_raw));
  OwnedLt lt(lt_raw);
  LtPlan plan;
  std::vector<cublasLtMatmulHeuristicResult_t> results;
  SHARDSCOPE_RETURN_IF_ERROR(BuildLtPlan(lt.get(), p, workspace, max_algorithms, &plan, &results));
  // Plain cudaMalloc here: a benchmark of one shape, outside any schedule.
  CudaDeviceMemory memory(int64_t{1} << 50);
  void* buffers[4] = {};
  const int64_t sizes[4] = {p.a_bytes(), p.b_bytes(), p.c_bytes(), static_cast<int64_t>(workspace)};
  for (int i = 0; i < 4; ++i) {
    uint64_t address = 0;
    if (!memory.Allocate(std::max<int64_t>(sizes[i], 512), &address)) return Status::Internal("cudaMalloc failed");
    buffers[i] = memory.PointerOf(address);
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaMemset(buffers[i], 0, static_cast<size_t>(std::max<int64_t>(sizes[i], 512))));
  }
  cudaStream_t stream_raw = nullptr;
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_raw, cudaStreamNonBlocking));
  OwnedStream stream(stream_raw);
  SHARDSCOPE_ASSIGN_OR_RETURN(OwnedEvent a, MakeEvent(true));
  SHARDSCOPE_ASSIGN_OR_RETURN(OwnedEvent b, MakeEvent(true));
  auto time_algo = [&](const cublasLtMatmulAlgo_t& algo) -> StatusOr<double> {
    for (int i = 0; i < 3; ++i) {
      SHARDSCOPE_RETURN_IF_ERROR(RunLt(lt.get(), plan, algo, p, buffers[0], buffers[1], buffers[2], buffers[3], stream.get()));
    }
    std::vector<int64_t> times;
    for (int32_t i = 0; i < iterations; ++i) {
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaEventRecord(a.get(), stream.get()));
      SHARDSCOPE_RETURN_IF_ERROR(RunLt(lt.get(), plan, algo, p, buffers[0], buffers[1], buffers[2], buffers[3], stream.get()));
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaEventRecord(b.get(), stream.get()));
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(b.get()));
      float ms = 0;
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, a.get(), b.get()));
      times.push_back(static_cast<int64_t>(static_cast<double>(ms) * 1e6));
    }
    std::sort(times.begin(), times.end());
    return static_cast<double>(times[(times.size() - 1) / 2]);
  };
  GemmBenchmark bench;
  bench.flops = p.flops();
  SHARDSCOPE_ASSIGN_OR_RETURN(bench.proxy_ns, time_algo(plan.algo));
  bench.best_ns = bench.proxy_ns;
  for (const cublasLtMatmulHeuristicResult_t& r : results) {
    if (r.state != CUBLAS_STATUS_SUCCESS || r.workspaceSize > workspace) continue;
    StatusOr<double> t = time_algo(r.algo);
    if (!t.ok()) continue;  // an algorithm the heuristic listed but that does not run: skip it
    ++bench.algorithms;
    bench.best_ns = std::min(bench.best_ns, *t);
  }
  return bench;
}

}  // namespace cuda

bool CudaBackendBuilt() { return true; }

StatusOr<int32_t> CudaDeviceCount() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return Status::InvalidInput(cuda::NoDeviceMessage(cudaGetErrorString(e)));
  }
  if (count <= 0) return Status::InvalidInput(cuda::NoDeviceMessage("cudaGetDeviceCount found 0 devices"));
  return static_cast<int32_t>(count);
}

StatusOr<RunResult> RunCudaBackend(const MpiSession& mpi, const traces::Schedule& schedule,
                                   const sim::SimulationSetup& setup, const CudaRunOptions& options) {
  if (options.common.steps < 1) {
    return Status::InvalidInput(fmt::format("--steps: expected >= 1, got {}", options.common.steps));
  }
  if (options.common.warmup < 0) {
    return Status::InvalidInput(fmt::format("--warmup: expected >= 0, got {}", options.common.warmup));
  }
  if (!(options.common.timeout_s > 0) || options.common.timeout_s > 1e6) {
    return Status::InvalidInput(fmt::format("--timeout: expected seconds in (0, 1e6], got {}", options.common.timeout_s));
  }
  if (options.cuda_graph && options.graph_replays < 1) {
    return Status::InvalidInput(fmt::format("graph replays: expected >= 1, got {}", options.graph_replays));
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(const int32_t devices, CudaDeviceCount());
  cuda::Job job(mpi, schedule, setup, options);
  return job.Run(devices);
}

}  // namespace shardscope::runtime

// The CUDA backend's resources (CUDA builds only): owning handles of CUDA, cuBLASLt and NCCL
// objects (CCCL's habit), and the device memory and stream events beneath sim's caching
// allocator. Shared by the rank adapter (cuda_rank.h), the job (cuda_backend.cc) and the GEMM
// benchmark of the GPU tests (cublaslt_plan.cc).
#ifndef SHARDSCOPE_RUNTIME_CUDA_CUDA_RESOURCES_H_
#define SHARDSCOPE_RUNTIME_CUDA_CUDA_RESOURCES_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include "cuda/cuda_check.h"
#include "shardscope/sim/models/caching_allocator.h"

namespace shardscope::runtime::cuda {

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

inline void DestroyStream(cudaStream_t s) { SHARDSCOPE_CUDA_LOG_IF_ERROR(Cuda().cudaStreamDestroy(s)); }
inline void DestroyEvent(cudaEvent_t e) { SHARDSCOPE_CUDA_LOG_IF_ERROR(Cuda().cudaEventDestroy(e)); }
inline void DestroyGraphExec(cudaGraphExec_t g) { SHARDSCOPE_CUDA_LOG_IF_ERROR(Cuda().cudaGraphExecDestroy(g)); }
inline void DestroyGraph(cudaGraph_t g) { SHARDSCOPE_CUDA_LOG_IF_ERROR(Cuda().cudaGraphDestroy(g)); }
inline void DestroyLt(cublasLtHandle_t h) { SHARDSCOPE_CUDA_LOG_IF_ERROR(Cuda().cublasLtDestroy(h)); }
inline void DestroyMatmulDesc(cublasLtMatmulDesc_t d) {
  SHARDSCOPE_CUDA_LOG_IF_ERROR(Cuda().cublasLtMatmulDescDestroy(d));
}
inline void DestroyLayout(cublasLtMatrixLayout_t l) {
  SHARDSCOPE_CUDA_LOG_IF_ERROR(Cuda().cublasLtMatrixLayoutDestroy(l));
}
inline void DestroyPreference(cublasLtMatmulPreference_t p) {
  SHARDSCOPE_CUDA_LOG_IF_ERROR(Cuda().cublasLtMatmulPreferenceDestroy(p));
}
inline void DestroyHostBuffer(void* p) { SHARDSCOPE_CUDA_LOG_IF_ERROR(Cuda().cudaFreeHost(p)); }
inline void DestroyDeviceBuffer(void* p) { SHARDSCOPE_CUDA_LOG_IF_ERROR(Cuda().cudaFree(p)); }
using OwnedStream = Owned<cudaStream_t, &DestroyStream>;
using OwnedEvent = Owned<cudaEvent_t, &DestroyEvent>;
using OwnedGraph = Owned<cudaGraph_t, &DestroyGraph>;
using OwnedGraphExec = Owned<cudaGraphExec_t, &DestroyGraphExec>;
using OwnedLt = Owned<cublasLtHandle_t, &DestroyLt>;
using OwnedMatmulDesc = Owned<cublasLtMatmulDesc_t, &DestroyMatmulDesc>;
using OwnedLayout = Owned<cublasLtMatrixLayout_t, &DestroyLayout>;
using OwnedPreference = Owned<cublasLtMatmulPreference_t, &DestroyPreference>;
using OwnedHostBuffer = Owned<void*, &DestroyHostBuffer>;
using OwnedDeviceBuffer = Owned<void*, &DestroyDeviceBuffer>;

inline StatusOr<OwnedEvent> MakeEvent(bool timing) {
  cudaEvent_t e = nullptr;
  // Timing costs a timestamp write per record: only the step-time events ask for it.
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(
      Cuda().cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  return OwnedEvent(e);
}

// An NCCL communicator. Destroyed with ncclCommDestroy after a clean run; after a watchdog
// timeout ncclCommAbort (which also unblocks kernels stuck in it) and no destroy.
class NcclComm {
 public:
  NcclComm() = default;
  explicit NcclComm(ncclComm_t c) : comm_(c) {}
  ~NcclComm() {
    if (comm_ != nullptr && !aborted_.load()) SHARDSCOPE_CUDA_LOG_IF_ERROR(Cuda().ncclCommDestroy(comm_));
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ncclComm_t get() const { return comm_; }
  // Callable from the watchdog thread while the host thread is inside an NCCL call (NCCL
  // docs, ncclCommAbort: "frees resources ... and aborts any uncompleted operations").
  void Abort() {
    if (comm_ != nullptr && !aborted_.exchange(true)) SHARDSCOPE_CUDA_LOG_IF_ERROR(Cuda().ncclCommAbort(comm_));
  }
  // An error NCCL found on its own threads (a peer or the network failed: ncclRemoteError,
  // ncclSystemError, ...), which no call returns and no CUDA event shows: the kernels of
  // the stuck collective keep spinning. ProcessGroupNCCL's watchdog polls it
  // (torch/csrc/distributed/c10d/NCCLUtils.cpp, NCCLComm::checkForNcclError); so does ours.
  // Watchdog thread only; Ok after an abort.
  Status AsyncError() const {
    if (comm_ == nullptr || aborted_.load()) return Status::Ok();
    ncclResult_t state = ncclSuccess;
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().ncclCommGetAsyncError(comm_, &state));
    if (state == ncclSuccess || state == ncclInProgress) return Status::Ok();
    return CallStatus(state, "NCCL asynchronous error (ncclCommGetAsyncError)", __FILE__, __LINE__);
  }

 private:
  ncclComm_t comm_ = nullptr;
  std::atomic<bool> aborted_{false};
};

// ---- Device memory beneath the allocators. Both keep the simulator's capacity accounting
// (sim::MakeCapacityDeviceMemory: its addresses too, so the policy's address-ordered choices,
// and hence the peaks, are the simulator's).

// The proxy operands' memory: each segment a real cudaMalloc, all of them before the first
// step (AllocateOperands), so none is made while NCCL kernels run. PointerOf turns a block
// address back into device memory. A cudaMalloc that fails for lack of memory is the
// allocator's out-of-memory (false); any other failure is kept as the error it is
// (TakeError), never reported as an out-of-memory.
class OperandDeviceMemory final : public sim::DeviceMemory {
 public:
  explicit OperandDeviceMemory(int64_t capacity) : accounting_(sim::MakeCapacityDeviceMemory(capacity)) {}
  ~OperandDeviceMemory() override {
    for (auto& [address, segment] : segments_) SHARDSCOPE_CUDA_LOG_IF_ERROR(Cuda().cudaFree(segment.first));
  }
  bool Allocate(int64_t bytes, uint64_t* address) override {
    if (!accounting_->Allocate(bytes, address)) return false;
    void* p = nullptr;
    if (const cudaError_t e = Cuda().cudaMalloc(&p, static_cast<size_t>(bytes)); e != cudaSuccess) {
      // cudaErrorMemoryAllocation is not sticky; clear it (CUDA Runtime API, cudaGetLastError).
      (void)Cuda().cudaGetLastError();
      if (e != cudaErrorMemoryAllocation && error_.ok()) {
        error_ = CallStatus(e, fmt::format("cudaMalloc({} bytes)", bytes), __FILE__, __LINE__);
      }
      accounting_->Release(*address, bytes);
      return false;
    }
    segments_[*address] = {p, bytes};
    return true;
  }
  void Release(uint64_t address, int64_t bytes) override {
    if (auto it = segments_.find(address); it != segments_.end()) {
      SHARDSCOPE_CUDA_LOG_IF_ERROR(Cuda().cudaFree(it->second.first));
      segments_.erase(it);
    }
    accounting_->Release(address, bytes);
  }
  // The operand allocator never uses expandable segments (CudaRank::OperandConfig).
  bool Map(int64_t /*bytes*/) override { return false; }
  void Unmap(int64_t /*bytes*/) override {}
  int64_t Capacity() const override { return accounting_->Capacity(); }

  void* PointerOf(uint64_t address) const {
    auto it = segments_.upper_bound(address);
    if (it == segments_.begin()) return nullptr;
    --it;
    const uint64_t offset = address - it->first;
    if (offset >= static_cast<uint64_t>(it->second.second)) return nullptr;
    return static_cast<char*>(it->second.first) + offset;
  }
  // The first cudaMalloc failure that was not an out-of-memory; cleared by the call.
  Status TakeError() { return std::exchange(error_, Status::Ok()); }

 private:
  std::unique_ptr<sim::DeviceMemory> accounting_;
  std::map<uint64_t, std::pair<void*, int64_t>> segments_;
  Status error_ = Status::Ok();
};

// The schedule's memory: no cudaMalloc or cudaFree inside a step. cudaFree synchronizes the
// device, and a cudaMalloc or cudaFree while NCCL kernels of several communicators are in
// flight can deadlock (NCCL user guide, "Using multiple NCCL communicators concurrently";
// TensorFlow/XLA's barrier after ncclCommInitRank in nccl_utils.cc for the cudaMalloc case). The
// policy's segments are accounting only (the simulator's capacity accounting and addresses):
// the schedule's tensors are never touched by a kernel (the proxies have their own operands),
// so they need no pointer. Two steps give them their weight on the device:
//   - SetCapacity, after setup: the capacity is min(planned, what cudaMemGetInfo says is free
//     once the CUDA context, the proxy operands, the cuBLASLt workspaces and NCCL's
//     communicators hold theirs), so a plan near capacity meets the policy's out-of-memory,
//     not a failed cudaMalloc;
//   - Back, between the warm-up and the first measured step: one cudaMalloc of what the
//     allocator then holds, so the measured steps run with the job's memory taken on the
//     device. Not before: the warm-up step is where NCCL connects its point-to-point peers and
//     allocates their buffers (all_to_all, send/recv), which a reservation of everything free
//     would starve.
// What a real cudaFree costs the host is kept: releasing a segment (the allocator's
// free-and-retry path, garbage collection, an expandable unmap) synchronizes the device, as
// CUDACachingAllocator's release_cached_blocks does (synchronize_and_free_events, then cudaFree,
// c10/cuda/CUDACachingAllocator.cpp), except inside a CUDA-graph capture.
class ScheduleDeviceMemory final : public sim::DeviceMemory {
 public:
  // `planned`: the simulator's capacity (or --device-memory-gb); what Capacity() says until
  // SetCapacity, so a memory fraction applies to it as the simulator applies it.
  explicit ScheduleDeviceMemory(int64_t planned) : planned_(planned) {}

  // The capacity becomes min(planned, free_bytes); kInvalidInput when that leaves nothing.
  Status SetCapacity(int64_t free_bytes) {
    const int64_t capacity = std::min(planned_, free_bytes);
    if (capacity <= 0) {
      return Status::InvalidInput(fmt::format(
          "no device memory is left for the schedule's tensors once the CUDA context, proxy operands and NCCL "
          "hold theirs ({} bytes free)",
          free_bytes));
    }
    accounting_ = sim::MakeCapacityDeviceMemory(capacity);
    return Status::Ok();
  }

  // Holds `bytes` on the device with one cudaMalloc, or the largest part the device grants
  // (a cudaMalloc of all that cudaMemGetInfo calls free can fail: on "out of memory" the
  // request shrinks by 2 MiB, then 4, 8, ...). Returns the bytes held; fails with the CUDA
  // error when a cudaMalloc fails otherwise.
  StatusOr<int64_t> Back(int64_t bytes) {
    void* p = nullptr;
    int64_t size = bytes;
    for (int64_t step = kBackingBackoff; size > 0; size -= step, step *= 2) {
      const cudaError_t e = Cuda().cudaMalloc(&p, static_cast<size_t>(size));
      if (e == cudaSuccess) break;
      (void)Cuda().cudaGetLastError();  // an out-of-memory is not sticky
      p = nullptr;
      if (e != cudaErrorMemoryAllocation) {
        return CallStatus(e, fmt::format("cudaMalloc({} bytes) holding the schedule's memory", size), __FILE__,
                          __LINE__);
      }
    }
    backing_ = OwnedDeviceBuffer(p);
    backed_ = p != nullptr ? size : 0;
    return backed_;
  }
  int64_t planned() const { return planned_; }
  int64_t backed() const { return backed_; }

  bool Allocate(int64_t bytes, uint64_t* address) override {
    return accounting_ != nullptr && accounting_->Allocate(bytes, address);
  }
  void Release(uint64_t address, int64_t bytes) override {
    if (accounting_ != nullptr) accounting_->Release(address, bytes);
    SynchronizeAsCudaFree();
  }
  bool Map(int64_t bytes) override { return accounting_ != nullptr && accounting_->Map(bytes); }
  void Unmap(int64_t bytes) override {
    if (accounting_ != nullptr) accounting_->Unmap(bytes);
    SynchronizeAsCudaFree();
  }
  int64_t Capacity() const override { return accounting_ != nullptr ? accounting_->Capacity() : planned_; }

  void SetCapturing(bool capturing) { capturing_ = capturing; }
  Status TakeError() { return std::exchange(error_, Status::Ok()); }

 private:
  void SynchronizeAsCudaFree() {
    if (capturing_) return;  // a device synchronization would invalidate the capture
    if (const cudaError_t e = Cuda().cudaDeviceSynchronize(); e != cudaSuccess && error_.ok()) {
      error_ = CallStatus(e, "cudaDeviceSynchronize (a segment released)", __FILE__, __LINE__);
    }
  }

  // The first shrink of a refused backing: the allocator's page (2 MiB, a GPU's large page:
  // sim/models/src/device_memory.cc rounds segments to it), doubled at each refusal so it
  // takes at most ~log2(bytes / 2 MiB) attempts.
  static constexpr int64_t kBackingBackoff = int64_t{2} << 20;

  const int64_t planned_;
  std::unique_ptr<sim::DeviceMemory> accounting_;
  OwnedDeviceBuffer backing_;
  int64_t backed_ = 0;
  bool capturing_ = false;
  Status error_ = Status::Ok();
};

// record_stream's stream-ordered events, as CUDA events on the rank's streams. An event is
// recycled once it has been seen complete (the allocator never asks about a token again after
// it answered true), so a run holds at most as many events as it ever had outstanding at once
// instead of one per record_stream. A failed record, query or synchronize is an error of the
// rank (TakeError), never a completion: the block it guards stays reserved until then.
class CudaStreamEvents final : public sim::StreamEvents {
 public:
  explicit CudaStreamEvents(const std::vector<OwnedStream>& streams) : streams_(streams) {}
  sim::EventToken Record(sim::AllocStream stream) override {
    const sim::EventToken token = next_token_++;
    OwnedEvent event;
    if (!free_.empty()) {
      event = std::move(free_.back());
      free_.pop_back();
    } else {
      StatusOr<OwnedEvent> created = MakeEvent(false);
      if (!created.ok()) {
        Fail(created.status());
        return token;  // nothing recorded: nothing to wait for (the error ends the rank)
      }
      event = std::move(*created);
      ++events_created_;
    }
    if (const cudaError_t e = Cuda().cudaEventRecord(event.get(), streams_[static_cast<size_t>(stream)].get());
        e != cudaSuccess) {
      Fail(CallStatus(e, "cudaEventRecord (record_stream)", __FILE__, __LINE__));
      free_.push_back(std::move(event));
      return token;
    }
    pending_.emplace(token, std::move(event));
    return token;
  }
  bool Query(sim::EventToken token) override {
    auto it = pending_.find(token);
    if (it == pending_.end()) return true;
    const cudaError_t e = Cuda().cudaEventQuery(it->second.get());
    if (e == cudaSuccess) {
      Recycle(it);
      return true;
    }
    if (e != cudaErrorNotReady) Fail(CallStatus(e, "cudaEventQuery (record_stream)", __FILE__, __LINE__));
    return false;
  }
  void Synchronize(sim::EventToken token) override {
    auto it = pending_.find(token);
    if (it == pending_.end()) return;
    if (const cudaError_t e = Cuda().cudaEventSynchronize(it->second.get()); e != cudaSuccess) {
      Fail(CallStatus(e, "cudaEventSynchronize (record_stream)", __FILE__, __LINE__));
      return;
    }
    Recycle(it);
  }
  Status TakeError() { return std::exchange(error_, Status::Ok()); }
  int64_t events_created() const { return events_created_; }
  size_t events_outstanding() const { return pending_.size(); }

 private:
  void Recycle(std::map<sim::EventToken, OwnedEvent>::iterator it) {
    free_.push_back(std::move(it->second));
    pending_.erase(it);
  }
  void Fail(Status status) {
    if (error_.ok()) error_ = std::move(status);
  }

  const std::vector<OwnedStream>& streams_;
  std::map<sim::EventToken, OwnedEvent> pending_;  // recorded, not yet seen complete
  std::vector<OwnedEvent> free_;                   // seen complete: recorded again next
  sim::EventToken next_token_ = 0;
  int64_t events_created_ = 0;
  Status error_ = Status::Ok();
};

}  // namespace shardscope::runtime::cuda

#endif  // SHARDSCOPE_RUNTIME_CUDA_CUDA_RESOURCES_H_

// The CUDA backend's resources (CUDA builds only): owning handles of CUDA, cuBLASLt and NCCL
// objects (CCCL's habit), and the device memory and stream events beneath sim's caching
// allocator. Shared by the rank adapter (cuda_rank.h), the job (cuda_backend.cc) and the GEMM
// benchmark of the GPU tests (cublaslt_plan.cc).
#ifndef SHARDSCOPE_RUNTIME_CUDA_CUDA_RESOURCES_H_
#define SHARDSCOPE_RUNTIME_CUDA_CUDA_RESOURCES_H_

#include <atomic>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include <cublasLt.h>
#include <cuda_runtime.h>
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

inline void DestroyStream(cudaStream_t s) { SHARDSCOPE_CUDA_LOG_IF_ERROR(cudaStreamDestroy(s)); }
inline void DestroyEvent(cudaEvent_t e) { SHARDSCOPE_CUDA_LOG_IF_ERROR(cudaEventDestroy(e)); }
inline void DestroyGraphExec(cudaGraphExec_t g) { SHARDSCOPE_CUDA_LOG_IF_ERROR(cudaGraphExecDestroy(g)); }
inline void DestroyGraph(cudaGraph_t g) { SHARDSCOPE_CUDA_LOG_IF_ERROR(cudaGraphDestroy(g)); }
inline void DestroyLt(cublasLtHandle_t h) { SHARDSCOPE_CUDA_LOG_IF_ERROR(cublasLtDestroy(h)); }
inline void DestroyMatmulDesc(cublasLtMatmulDesc_t d) { SHARDSCOPE_CUDA_LOG_IF_ERROR(cublasLtMatmulDescDestroy(d)); }
inline void DestroyLayout(cublasLtMatrixLayout_t l) { SHARDSCOPE_CUDA_LOG_IF_ERROR(cublasLtMatrixLayoutDestroy(l)); }
inline void DestroyPreference(cublasLtMatmulPreference_t p) {
  SHARDSCOPE_CUDA_LOG_IF_ERROR(cublasLtMatmulPreferenceDestroy(p));
}
inline void DestroyHostBuffer(void* p) { SHARDSCOPE_CUDA_LOG_IF_ERROR(cudaFreeHost(p)); }
using OwnedStream = Owned<cudaStream_t, &DestroyStream>;
using OwnedEvent = Owned<cudaEvent_t, &DestroyEvent>;
using OwnedGraph = Owned<cudaGraph_t, &DestroyGraph>;
using OwnedGraphExec = Owned<cudaGraphExec_t, &DestroyGraphExec>;
using OwnedLt = Owned<cublasLtHandle_t, &DestroyLt>;
using OwnedMatmulDesc = Owned<cublasLtMatmulDesc_t, &DestroyMatmulDesc>;
using OwnedLayout = Owned<cublasLtMatrixLayout_t, &DestroyLayout>;
using OwnedPreference = Owned<cublasLtMatmulPreference_t, &DestroyPreference>;
using OwnedHostBuffer = Owned<void*, &DestroyHostBuffer>;

inline StatusOr<OwnedEvent> MakeEvent(bool timing) {
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
      SHARDSCOPE_CUDA_LOG_IF_ERROR(cudaEventRecord(e->get(), streams_[static_cast<size_t>(stream)].get()));
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

}  // namespace shardscope::runtime::cuda

#endif  // SHARDSCOPE_RUNTIME_CUDA_CUDA_RESOURCES_H_

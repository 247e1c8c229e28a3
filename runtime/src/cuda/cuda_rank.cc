// The CUDA backend's rank adapter (cuda_rank.h). What the CPU cannot check is marked "GPU:":
// this file was compiled, not run, on the machine that wrote it (no driver);
// scripts/gpu/validate_runtime.sh runs it.
#include "cuda/cuda_rank.h"

#include <algorithm>
#include <chrono>
#include <iostream>
#include <limits>
#include <utility>

#include <fmt/format.h>
#include <nvtx3/nvToolsExt.h>

#include "cuda/proxy_kernels.h"

namespace shardscope::runtime::cuda {

namespace {

using Clock = std::chrono::steady_clock;
using traces::CollectiveType;

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

// A device event the core owns: a CUDA event without timing.
class CudaEvent final : public DeviceEvent {
 public:
  explicit CudaEvent(OwnedEvent event) : event_(std::move(event)) {}
  cudaEvent_t get() const { return event_.get(); }

 private:
  OwnedEvent event_;
};

}  // namespace

CudaRank::CudaRank(const traces::Schedule& schedule, const sim::SimulationSetup& setup, ExecutionPlan plan,
                   const CudaRunOptions& options, int32_t device, int64_t planned_capacity)
    : plan_(std::move(plan)),
      options_(options),
      device_(device),
      memory_(planned_capacity),
      events_(streams_),
      operand_memory_(std::numeric_limits<int64_t>::max() / 4),
      operand_events_(streams_),
      operand_allocator_(OperandConfig(setup.memory.allocator), operand_memory_, operand_events_),
      executor_(schedule, setup, plan_, options.common, *this) {}

// ---- Setup

// Phase 1: everything that needs no other rank.
Status CudaRank::SetupLocal() {
  // The first steps of a run load modules and connect peers (CUDA's lazy loading, NCCL's
  // runtime connection): a run without a warm-up step would time them.
  SHARDSCOPE_RETURN_IF_ERROR(CheckCudaRunOptions(options_));
  if (plan_.streams.empty()) {
    return Status::InvalidInput(fmt::format("rank {}'s program declares no stream", plan_.rank));
  }
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaSetDevice(device_));
  cudaDeviceProp prop{};
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaGetDeviceProperties(&prop, device_));
  cc_ = ComputeCapability{prop.major, prop.minor};
  sm_count_ = prop.multiProcessorCount;
  device_name_ = prop.name;
  PriorityRange range;
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaDeviceGetStreamPriorityRange(&range.least, &range.greatest));
  std::vector<int32_t> priorities;
  for (const StreamPlan& s : plan_.streams) priorities.push_back(s.priority);
  stream_priorities_ = MapStreamPriorities(priorities, range);
  for (int32_t priority : stream_priorities_) {
    cudaStream_t s = nullptr;
    // Non-blocking: the schedule's streams never synchronize with the legacy default stream
    // implicitly (PyTorch's side streams are created this way too).
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority));
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
  SHARDSCOPE_ASSIGN_OR_RETURN(kernels_, ProxyKernels::Load());
  cublasLtHandle_t lt = nullptr;
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cublasLtCreate(&lt));
  lt_ = OwnedLt(lt);
  SHARDSCOPE_RETURN_IF_ERROR(AllocateOperands());
  SHARDSCOPE_RETURN_IF_ERROR(PreparePlans());
  host_spin_ = CalibrateHostSpin();
  SHARDSCOPE_RETURN_IF_ERROR(CalibrateKernelSpin());
  // The operands were zeroed on the schedule's streams, which are non-blocking (no implicit
  // order with anything else): step 0 starts only once every setup operation has completed.
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaDeviceSynchronize());
  return Status::Ok();
}

// Phase 3: what is free once the CUDA context, the proxy operands and cuBLASLt workspaces
// (phase 1) and NCCL's communicators with their buffers (phase 2; NCCL_RUNTIME_CONNECT=0, see
// cuda_backend.cc) hold theirs is the most the schedule's allocator may reserve: with more, a
// plan near capacity would fail in cudaMalloc before the policy ever saw an out-of-memory.
Status CudaRank::SetScheduleCapacity() {
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaSetDevice(device_));
  size_t free_bytes = 0, total_bytes = 0;
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaMemGetInfo(&free_bytes, &total_bytes));
  meminfo_free_after_setup_ = static_cast<int64_t>(free_bytes);
  meminfo_total_ = static_cast<int64_t>(total_bytes);
  return memory_.SetCapacity(meminfo_free_after_setup_).WithContext(fmt::format("rank {}", plan_.rank));
}

// Phase 2, collective over the world: one ncclCommSplit per schedule communicator in index
// order (non-members pass NCCL_SPLIT_NOCOLOR and get no communicator). Called inside a
// group by the Job when one thread splits for several ranks.
Status CudaRank::Split(const CommunicatorPlan& c, ncclComm_t* out) {
  const int color = c.color == kNoColor ? NCCL_SPLIT_NOCOLOR : c.color;
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().ncclCommSplit(world_->get(), color, c.key, out, nullptr));
  return Status::Ok();
}

void CudaRank::AdoptComms(std::vector<ncclComm_t> comms) {
  comms_.clear();
  for (ncclComm_t c : comms) comms_.push_back(std::make_unique<NcclComm>(c));
}

sim::AllocatorConfig CudaRank::OperandConfig(sim::AllocatorConfig config) {
  config.expandable_segments = false;  // operand blocks need device pointers
  config.garbage_collection_threshold = 0;
  config.memory_fraction = 1.0;
  return config;
}

// Operand buffers through the operand allocator (the same policy, its own pool: the
// schedule's allocator sees exactly the schedule's calls, so its peaks are the
// simulator's), zero-filled so no NaN or denormal slows a GEMM. The fill is queued on the
// stream that uses the buffer (the legacy stream would not order it with the schedule's
// non-blocking streams); SetupLocal synchronizes before step 0.
StatusOr<void*> CudaRank::OperandBuffer(int64_t bytes, int32_t stream) {
  if (bytes <= 0) return static_cast<void*>(nullptr);
  const sim::MallocOutcome out = operand_allocator_.Malloc(bytes, stream);
  // A cudaMalloc that failed with anything but "out of memory" is reported as such, even when
  // the allocator's retry then got the memory.
  SHARDSCOPE_RETURN_IF_ERROR(operand_memory_.TakeError().WithContext(
      fmt::format("rank {}: proxy operands on device {}", plan_.rank, device_)));
  if (!out.ok) {
    return Status::InvalidInput(fmt::format(
        "rank {}: the proxy operands need {} more bytes than device {} has free (cudaMalloc: out of memory)",
        plan_.rank, bytes, device_));
  }
  void* p = operand_memory_.PointerOf(out.address);
  if (p == nullptr) return Status::Internal("operand block outside its segment");
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaMemsetAsync(p, 0, static_cast<size_t>(bytes), StreamOf(stream)));
  return p;
}

Status CudaRank::AllocateOperands() {
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
    SHARDSCOPE_ASSIGN_OR_RETURN(send_[static_cast<size_t>(c.index)], OperandBuffer(c.max_send_bytes, 0));
    SHARDSCOPE_ASSIGN_OR_RETURN(recv_[static_cast<size_t>(c.index)], OperandBuffer(c.max_recv_bytes, 0));
  }
  // H2D / D2H copies go through pinned host memory (pageable copies are not asynchronous:
  // CUDA Runtime API, "API synchronization behavior").
  if (host_bytes > 0) {
    void* p = nullptr;
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaMallocHost(&p, static_cast<size_t>(host_bytes)));
    pinned_ = OwnedHostBuffer(p);
  }
  return Status::Ok();
}

Status CudaRank::CalibrateKernelSpin() {
  cudaStream_t s = StreamOf(0);
  SHARDSCOPE_ASSIGN_OR_RETURN(OwnedEvent a, MakeEvent(true));
  SHARDSCOPE_ASSIGN_OR_RETURN(OwnedEvent b, MakeEvent(true));
  std::vector<std::pair<int64_t, int64_t>> samples;
  SHARDSCOPE_RETURN_IF_ERROR(kernels_.LaunchSpin(0, s));  // module load, first launch
  for (int r = 0; r < kCalibrationRepeats; ++r) {
    for (int64_t ns : kCalibrationPointsNs) {
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaEventRecord(a.get(), s));
      SHARDSCOPE_RETURN_IF_ERROR(kernels_.LaunchSpin(ns, s));
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaEventRecord(b.get(), s));
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaEventSynchronize(b.get()));
      float ms = 0;
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaEventElapsedTime(&ms, a.get(), b.get()));
      samples.emplace_back(ns, static_cast<int64_t>(static_cast<double>(ms) * 1e6));
    }
  }
  kernel_spin_ = FitSpinCalibration(samples);
  return Status::Ok();
}

// Every cuBLASLt plan the program needs, built at setup: the heuristic query
// (cublasLtMatmulAlgoGetHeuristic) allocates and takes host time, none of which belongs in a
// measured step. Walks the shapes RunKernel launches: per GEMM its problem; per attention its
// two GEMM shapes at the chunk size and, when heads x batch does not divide, the last chunk's.
Status CudaRank::PreparePlans() {
  for (const traces::Op& op : plan_.program->ops) {
    const auto* k = std::get_if<traces::KernelOp>(&op.payload);
    if (k == nullptr) continue;
    const auto workspace = static_cast<size_t>(operands_[static_cast<size_t>(k->stream)].workspace_bytes);
    if (const auto* g = std::get_if<traces::GemmDesc>(&k->compute)) {
      SHARDSCOPE_RETURN_IF_ERROR(PlanFor(GemmProblem(*g, cc_), workspace).status());
    } else if (const auto* a = std::get_if<traces::AttentionDesc>(&k->compute)) {
      const AttentionProxy proxy = AttentionProblem(*a, cc_);
      for (const int64_t chunk : {proxy.batch_chunk, proxy.total_batch % std::max<int64_t>(1, proxy.batch_chunk)}) {
        if (chunk <= 0) continue;
        LtProblem qk = proxy.qk, pv = proxy.pv;
        qk.batch = chunk;
        pv.batch = chunk;
        SHARDSCOPE_RETURN_IF_ERROR(PlanFor(qk, workspace).status());
        SHARDSCOPE_RETURN_IF_ERROR(PlanFor(pv, workspace).status());
      }
    }
  }
  plans_frozen_ = true;
  return Status::Ok();
}

StatusOr<LtPlan*> CudaRank::PlanFor(const LtProblem& p, size_t workspace) {
  const std::string key = ProblemKey(p) + fmt::format(" ws{}", workspace);
  auto it = lt_plans_.find(key);
  if (it != lt_plans_.end()) return it->second.get();
  if (plans_frozen_) {
    return Status::Internal(fmt::format("no cuBLASLt plan was prepared for the GEMM {} (PreparePlans missed a shape)",
                                        ProblemKey(p)));
  }
  auto plan = std::make_unique<LtPlan>();
  std::vector<cublasLtMatmulHeuristicResult_t> results;
  SHARDSCOPE_RETURN_IF_ERROR(BuildLtPlan(lt_.get(), p, workspace, 1, plan.get(), &results));
  if (!p.note.empty()) notes_.push_back(p.note);
  return lt_plans_.emplace(key, std::move(plan)).first->second.get();
}

Status CudaRank::Gemm(const LtProblem& p, int32_t stream) {
  const Operands& o = operands_[static_cast<size_t>(stream)];
  SHARDSCOPE_ASSIGN_OR_RETURN(LtPlan * plan, PlanFor(p, static_cast<size_t>(o.workspace_bytes)));
  return RunLt(lt_.get(), *plan, plan->algo, p, o.a, o.b, o.c, o.workspace, StreamOf(stream));
}

Status CudaRank::MemoryPass(int64_t read, int64_t written, int32_t stream) {
  const Operands& o = operands_[static_cast<size_t>(stream)];
  const CopyGeometry g = MemoryBoundGeometry(read, written, sm_count_);
  return kernels_.LaunchMemoryBound(g.read_vectors, g.write_vectors, g.blocks, g.threads_per_block, o.src, o.dst,
                                    StreamOf(stream));
}

Status CudaRank::RunKernel(const traces::KernelOp& k) {
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
  return kernels_.LaunchSpin(SpinRequestFor(kernel_spin_, fixed.duration_ns), StreamOf(k.stream));
}

Status CudaRank::RunMemcpy(const traces::MemcpyOp& m) {
  const Operands& o = operands_[static_cast<size_t>(m.stream)];
  const auto bytes = static_cast<size_t>(m.bytes);
  if (bytes == 0) return Status::Ok();
  switch (m.kind) {
    case traces::MemcpyKind::kHostToDevice:
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(
          Cuda().cudaMemcpyAsync(o.dst, pinned_.get(), bytes, cudaMemcpyHostToDevice, StreamOf(m.stream)));
      break;
    case traces::MemcpyKind::kDeviceToHost:
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(
          Cuda().cudaMemcpyAsync(pinned_.get(), o.src, bytes, cudaMemcpyDeviceToHost, StreamOf(m.stream)));
      break;
    case traces::MemcpyKind::kDeviceToDevice:
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(
          Cuda().cudaMemcpyAsync(o.dst, o.src, bytes, cudaMemcpyDeviceToDevice, StreamOf(m.stream)));
      break;
  }
  return Status::Ok();
}

Status CudaRank::Collective(const OpPlan& op, int32_t index, int32_t /*step*/, int64_t /*record*/) {
  const auto& coll = std::get<traces::CollectiveOp>(plan_.program->ops[static_cast<size_t>(index)].payload);
  ncclComm_t comm =
      comms_[static_cast<size_t>(op.communicator)] ? comms_[static_cast<size_t>(op.communicator)]->get() : nullptr;
  if (comm == nullptr) return Status::Internal(fmt::format("op {}: no NCCL communicator", op.op_id));
  cudaStream_t stream = StreamOf(op.stream);
  void* send = send_[static_cast<size_t>(op.communicator)];
  void* recv = recv_[static_cast<size_t>(op.communicator)];
  const NcclTypeAndOp t = NcclTypeFor(coll.dtype);
  const auto send_count = static_cast<size_t>(op.buffers.send_elements);
  const auto recv_count = static_cast<size_t>(op.buffers.recv_elements);
  // The Flight Recorder record and the start / end events around this call are the core's
  // (RankExecutor::IssueCollective), outside a capture.
  // NCCL orders a communicator's operations as they are enqueued, whatever stream they are
  // on (one kernel queue per communicator), so the host backend's per-communicator ticket
  // is NCCL's own behaviour here and needs no code.
  switch (coll.type) {
    case CollectiveType::kAllGather:
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().ncclAllGather(send, recv, send_count, t.type, comm, stream));
      break;
    case CollectiveType::kReduceScatter:
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().ncclReduceScatter(send, recv, recv_count, t.type, t.op, comm, stream));
      break;
    case CollectiveType::kAllReduce:
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().ncclAllReduce(send, recv, send_count, t.type, t.op, comm, stream));
      break;
    case CollectiveType::kBroadcast:
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(
          Cuda().ncclBroadcast(send, recv, recv_count, t.type, op.peer_comm_rank, comm, stream));
      break;
    case CollectiveType::kReduce:
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(
          Cuda().ncclReduce(send, recv, send_count, t.type, t.op, op.peer_comm_rank, comm, stream));
      break;
    case CollectiveType::kAllToAll: {
      // ProcessGroupNCCL::alltoall_base: a group of one send and one receive per peer, with
      // the per-peer counts both sides of each pair agree on (execution_plan.h
      // AllToAllPeerElements), packed in peer order in the send and receive buffers.
      const auto element = static_cast<size_t>(op.buffers.element_bytes);
      size_t offset = 0;
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().ncclGroupStart());
      Status status = Status::Ok();
      for (size_t peer = 0; peer < op.peer_elements.size() && status.ok(); ++peer) {
        const auto count = static_cast<size_t>(op.peer_elements[peer]);
        status = CallStatus(Cuda().ncclSend(static_cast<char*>(send) + offset * element, count, t.type,
                                            static_cast<int>(peer), comm, stream),
                            "ncclSend", __FILE__, __LINE__);
        if (status.ok()) {
          status = CallStatus(Cuda().ncclRecv(static_cast<char*>(recv) + offset * element, count, t.type,
                                              static_cast<int>(peer), comm, stream),
                              "ncclRecv", __FILE__, __LINE__);
        }
        offset += count;
      }
      // The group is always closed, even after a failed call inside it.
      const Status end = CallStatus(Cuda().ncclGroupEnd(), "ncclGroupEnd", __FILE__, __LINE__);
      SHARDSCOPE_RETURN_IF_ERROR(status);
      SHARDSCOPE_RETURN_IF_ERROR(end);
      break;
    }
    case CollectiveType::kSend:
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().ncclSend(send, send_count, t.type, op.peer_comm_rank, comm, stream));
      break;
    case CollectiveType::kRecv:
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().ncclRecv(recv, recv_count, t.type, op.peer_comm_rank, comm, stream));
      break;
  }
  return Status::Ok();
}

// The step's end on the device: every stream joins stream 0, then the end event.
Status CudaRank::JoinStreams() {
  for (size_t s = 1; s < streams_.size(); ++s) {
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaEventRecord(join_events_[s].get(), streams_[s].get()));
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaStreamWaitEvent(StreamOf(0), join_events_[s].get(), 0));
  }
  return Status::Ok();
}

// Inside a capture, every other stream forks from stream 0 (joins the capture).
Status CudaRank::ForkStreams() {
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaEventRecord(join_events_[0].get(), StreamOf(0)));
  for (size_t s = 1; s < streams_.size(); ++s) {
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaStreamWaitEvent(streams_[s].get(), join_events_[0].get(), 0));
  }
  return Status::Ok();
}

StatusOr<int64_t> CudaRank::ElapsedNs() {
  float ms = 0;
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaEventElapsedTime(&ms, step_start_.get(), step_end_.get()));
  return static_cast<int64_t>(static_cast<double>(ms) * 1e6);
}

// One step captured on stream 0 (relaxed mode; the allocator's calls are accounting only and a
// segment released meanwhile skips its device synchronization), then replayed. GPU: NCCL
// kernels are capturable since NCCL 2.9 (NCCL docs, "Using NCCL with CUDA Graphs").
Status CudaRank::CaptureAndReplay() {
  const int32_t step = options_.common.warmup + options_.common.steps;
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaStreamBeginCapture(StreamOf(0), cudaStreamCaptureModeRelaxed));
  executor_.SetCapturing(true);
  memory_.SetCapturing(true);
  Status status = ForkStreams();
  for (size_t i = 0; i < plan_.ops.size() && status.ok() && !executor_.stopped(); ++i) {
    status = executor_.IssueOp(static_cast<int32_t>(i), step);
  }
  if (status.ok()) status = JoinStreams();
  cudaGraph_t graph_raw = nullptr;
  const cudaError_t end = Cuda().cudaStreamEndCapture(StreamOf(0), &graph_raw);
  executor_.SetCapturing(false);
  memory_.SetCapturing(false);
  OwnedGraph graph(graph_raw);
  SHARDSCOPE_RETURN_IF_ERROR(status);
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(end);
  cudaGraphExec_t exec_raw = nullptr;
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaGraphInstantiate(&exec_raw, graph.get(), 0));
  OwnedGraphExec exec(exec_raw);
  for (int32_t r = 0; r < options_.graph_replays; ++r) {
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaEventRecord(step_start_.get(), StreamOf(0)));
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaGraphLaunch(exec.get(), StreamOf(0)));
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaEventRecord(step_end_.get(), StreamOf(0)));
    SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaDeviceSynchronize());
    SHARDSCOPE_ASSIGN_OR_RETURN(int64_t ns, ElapsedNs());
    graph_times_.push_back(ns);
    executor_.MarkProgress();
  }
  return Status::Ok();
}

// ---- The host thread

void CudaRank::Run() {
  executor_.MarkProgress();
  const Status status = RunSteps();
  if (!status.ok()) {
    std::cerr << fmt::format("shardscope run: rank {}: {}\n", plan_.rank, status.message());
    error_ = status;
    // Its peers would wait for it in their next collective: the watchdog ends the job now.
    executor_.Fail(status);
  }
  executor_.SetFinished();
  executor_.SetHostState(executor_.stopped() || !error_.ok() ? "stopped"
                                                             : "finished its program; waiting for the other ranks");
}

Status CudaRank::RunSteps() {
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaSetDevice(device_));
  executor_.SetHostState("running its program");
  SHARDSCOPE_RETURN_IF_ERROR(executor_.RunSteps());
  if (options_.cuda_graph && !executor_.stopped()) SHARDSCOPE_RETURN_IF_ERROR(CaptureAndReplay());
  return Status::Ok();
}

// ---- Device: steps. The previous step ended with a device synchronization: every stream is
// idle, so an event on stream 0 marks the start of the whole device's step.

Status CudaRank::BeginStep(int32_t step, bool measured) {
  if (measured && step == options_.common.warmup) {
    // Between the warm-up (NCCL connected its peers, kernels loaded) and the measured steps:
    // the device holds what the allocator holds (cuda_resources.h ScheduleDeviceMemory::Back).
    SHARDSCOPE_ASSIGN_OR_RETURN(const int64_t backed, memory_.Back(executor_.allocator().stats().reserved_bytes));
    (void)backed;
  }
  if (options_.common.hooks.before_step) SHARDSCOPE_RETURN_IF_ERROR(options_.common.hooks.before_step(step, measured));
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaEventRecord(step_start_.get(), StreamOf(0)));
  return Status::Ok();
}

StatusOr<int64_t> CudaRank::EndStep(int32_t step, bool measured, bool timed) {
  SHARDSCOPE_RETURN_IF_ERROR(JoinStreams());
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaEventRecord(step_end_.get(), StreamOf(0)));
  executor_.SetHostState("cudaDeviceSynchronize (end of step)");
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaDeviceSynchronize());
  if (options_.common.hooks.after_step) SHARDSCOPE_RETURN_IF_ERROR(options_.common.hooks.after_step(step, measured));
  executor_.SetHostState("running its program");
  if (!timed) return int64_t{0};
  return ElapsedNs();
}

// NVTX: one range per op, its op id as the payload (and the message, for tools that show only
// names); nvtx3 is header-only and costs nothing without a tool attached.
void CudaRank::BeginOp(const OpPlan& op, int32_t index) {
  nvtxEventAttributes_t attributes{};
  attributes.version = NVTX_VERSION;
  attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attributes.payloadType = NVTX_PAYLOAD_TYPE_INT64;
  attributes.payload.llValue = op.op_id;
  attributes.messageType = NVTX_MESSAGE_TYPE_ASCII;
  const std::string_view name = plan_.program->NameOf(plan_.program->ops[static_cast<size_t>(index)].name);
  nvtx_message_ = fmt::format("op {} {}", op.op_id, name);
  attributes.message.ascii = nvtx_message_.c_str();
  nvtxRangePushEx(&attributes);
}

void CudaRank::EndOp() { nvtxRangePop(); }

// ---- Device: ops

Status CudaRank::Kernel(const OpPlan& /*op*/, int32_t index, int32_t /*step*/) {
  return RunKernel(std::get<traces::KernelOp>(plan_.program->ops[static_cast<size_t>(index)].payload));
}

Status CudaRank::Memcpy(const OpPlan& /*op*/, int32_t index, int32_t /*step*/) {
  return RunMemcpy(std::get<traces::MemcpyOp>(plan_.program->ops[static_cast<size_t>(index)].payload));
}

Status CudaRank::RecordEvent(const OpPlan& op, int32_t /*index*/, int32_t /*step*/) {
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(
      Cuda().cudaEventRecord(events_by_index_[static_cast<size_t>(op.event)].get(), StreamOf(op.stream)));
  return Status::Ok();
}

// cudaStreamWaitEvent captures the event's most recent record at call time; an event never
// recorded is complete (the wait is a no-op), as the schedule's semantics say.
Status CudaRank::StreamWaitEvent(const OpPlan& op, int32_t /*index*/, int32_t /*step*/) {
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(
      Cuda().cudaStreamWaitEvent(StreamOf(op.stream), events_by_index_[static_cast<size_t>(op.event)].get(), 0));
  return Status::Ok();
}

Status CudaRank::SynchronizeStream(const OpPlan& op) {
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaStreamSynchronize(StreamOf(op.stream)));
  return Status::Ok();
}

Status CudaRank::SynchronizeDevice(const OpPlan& op) {
  executor_.SetHostState(fmt::format("cudaDeviceSynchronize (op {})", op.op_id));
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaDeviceSynchronize());
  return Status::Ok();
}

Status CudaRank::SynchronizeEvent(const OpPlan& op) {
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaEventSynchronize(events_by_index_[static_cast<size_t>(op.event)].get()));
  return Status::Ok();
}

void CudaRank::HostWork(int64_t duration_ns) { SpinHostFor(SpinRequestFor(host_spin_, duration_ns)); }

Status CudaRank::TakeAllocatorError() {
  SHARDSCOPE_RETURN_IF_ERROR(events_.TakeError());
  return memory_.TakeError();
}

// ---- Device: collective progress (GPU: cudaEventQuery from the watchdog thread, on this
// rank's device).

StatusOr<std::unique_ptr<DeviceEvent>> CudaRank::CreateEvent() {
  SHARDSCOPE_ASSIGN_OR_RETURN(OwnedEvent event, MakeEvent(false));
  return std::unique_ptr<DeviceEvent>(std::make_unique<CudaEvent>(std::move(event)));
}

Status CudaRank::RecordOn(DeviceEvent& event, int32_t stream) {
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaEventRecord(static_cast<CudaEvent&>(event).get(), StreamOf(stream)));
  return Status::Ok();
}

StatusOr<bool> CudaRank::QueryEvent(DeviceEvent& event) {
  const cudaError_t result = Cuda().cudaEventQuery(static_cast<CudaEvent&>(event).get());
  if (result == cudaSuccess) return true;
  if (result == cudaErrorNotReady) return false;
  return CallStatus(result, "cudaEventQuery", __FILE__, __LINE__);
}

Status CudaRank::MakeCurrent() {
  SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaSetDevice(device_));
  return Status::Ok();
}

// NCCL's asynchronous errors on any of the rank's communicators (NcclComm::AsyncError).
Status CudaRank::AsyncError() {
  for (const auto& c : comms_) {
    if (c) SHARDSCOPE_RETURN_IF_ERROR(c->AsyncError());
  }
  return world_ ? world_->AsyncError() : Status::Ok();
}

void CudaRank::AbortCollectives() {
  for (auto& c : comms_) {
    if (c) c->Abort();
  }
  if (world_) world_->Abort();
}

void CudaRank::FillResult(RankResult& result) const {
  if (!error_.ok()) result.finished = false;
  result.device = device_;
  result.operand_reserved = operand_allocator_.stats().reserved_bytes_peak;
  result.meminfo_free_after_setup = meminfo_free_after_setup_;
  result.meminfo_total = meminfo_total_;
  result.planned_capacity = memory_.planned();
  result.device_backing = memory_.backed();
  result.graph_times = graph_times_;
}

}  // namespace shardscope::runtime::cuda

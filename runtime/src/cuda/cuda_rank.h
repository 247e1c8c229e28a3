// One rank of the CUDA backend: the device adapter (device.h) over CUDA streams and events,
// NCCL and the proxy kernels, around the runtime core's RankExecutor, which walks the
// program. Owns the rank's device state (streams with the schedule's priorities, events,
// the schedule's and the operands' allocators, cuBLASLt plans, NCCL communicators). CUDA
// builds only. What the CPU cannot check is marked "GPU:" in comments.
#ifndef SHARDSCOPE_RUNTIME_CUDA_CUDA_RANK_H_
#define SHARDSCOPE_RUNTIME_CUDA_CUDA_RANK_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "cuda/cublaslt_plan.h"
#include "cuda/cuda_resources.h"
#include "cuda/proxy_kernels.h"
#include "cuda/proxy_math.h"
#include "device.h"
#include "rank_executor.h"
#include "shardscope/runtime/cuda_backend.h"
#include "shardscope/runtime/execution_plan.h"

namespace shardscope::runtime::cuda {

class CudaRank final : public Device {
 public:
  // `planned_capacity`: the simulator's capacity (or --device-memory-gb); the capacity the
  // rank runs with is decided after setup (SetScheduleCapacity).
  CudaRank(const traces::Schedule& schedule, const sim::SimulationSetup& setup, ExecutionPlan plan,
           const CudaRunOptions& options, int32_t device, int64_t planned_capacity);

  int32_t rank() const { return plan_.rank; }
  int32_t device() const { return device_; }
  const ExecutionPlan& plan() const { return plan_; }
  RankExecutor& executor() { return executor_; }
  const CudaStreamEvents& allocator_events() const { return events_; }

  // Phase 1: everything that needs no other rank: streams and events, the proxy kernels, the
  // cuBLASLt handle and every GEMM plan of the program (no heuristic query inside a step),
  // the proxy operands zero-filled on the streams that use them, the spin calibrations; ends
  // with a device synchronization, so nothing of the setup is in flight at step 0.
  Status SetupLocal();
  void SetWorld(ncclComm_t c) { world_ = std::make_unique<NcclComm>(c); }
  // Phase 2, collective over the world: one ncclCommSplit per schedule communicator in index
  // order (non-members pass NCCL_SPLIT_NOCOLOR and get no communicator). Called inside a
  // group by the job when one thread splits for several ranks.
  Status Split(const CommunicatorPlan& c, ncclComm_t* out);
  void AdoptComms(std::vector<ncclComm_t> comms);
  // Phase 3, after NCCL: the schedule's capacity becomes min(planned, cudaMemGetInfo's free
  // bytes) (cuda_resources.h ScheduleDeviceMemory; held on the device from the first
  // measured step, BeginStep).
  Status SetScheduleCapacity();

  // Runs warm-up and measured steps, then (cuda_graph) the capture and replays. An error stops
  // the rank (error()).
  void Run();
  Status error() const { return error_; }
  const std::vector<std::string>& notes() const { return notes_; }
  const std::string& device_name() const { return device_name_; }

  // ---- Device
  sim::DeviceMemory& AllocatorMemory() override { return memory_; }
  sim::StreamEvents& AllocatorEvents() override { return events_; }
  Status TakeAllocatorError() override;
  Status Kernel(const OpPlan& op, int32_t index, int32_t step) override;
  Status Memcpy(const OpPlan& op, int32_t index, int32_t step) override;
  Status Collective(const OpPlan& op, int32_t index, int32_t step, int64_t record) override;
  Status RecordEvent(const OpPlan& op, int32_t index, int32_t step) override;
  Status StreamWaitEvent(const OpPlan& op, int32_t index, int32_t step) override;
  Status SynchronizeStream(const OpPlan& op) override;
  Status SynchronizeDevice(const OpPlan& op) override;
  Status SynchronizeEvent(const OpPlan& op) override;
  void HostWork(int64_t duration_ns) override;
  Status BeginStep(int32_t step, bool measured) override;
  StatusOr<int64_t> EndStep(int32_t step, bool measured, bool timed) override;
  void BeginOp(const OpPlan& op, int32_t index) override;
  void EndOp() override;
  bool TracksCollectivesWithEvents() const override { return true; }
  StatusOr<std::unique_ptr<DeviceEvent>> CreateEvent() override;
  Status RecordOn(DeviceEvent& event, int32_t stream) override;
  StatusOr<bool> QueryEvent(DeviceEvent& event) override;
  Status MakeCurrent() override;
  Status AsyncError() override;
  void AbortCollectives() override;
  void FillResult(RankResult& result) const override;

 private:
  struct Operands {
    void *a = nullptr, *b = nullptr, *c = nullptr, *src = nullptr, *dst = nullptr, *workspace = nullptr;
    int64_t workspace_bytes = 0;
  };

  static sim::AllocatorConfig OperandConfig(sim::AllocatorConfig config);
  cudaStream_t StreamOf(int32_t s) const { return streams_[static_cast<size_t>(s)].get(); }
  StatusOr<void*> OperandBuffer(int64_t bytes, int32_t stream);
  Status AllocateOperands();
  Status CalibrateKernelSpin();
  Status PreparePlans();
  StatusOr<LtPlan*> PlanFor(const LtProblem& p, size_t workspace);
  Status Gemm(const LtProblem& p, int32_t stream);
  Status MemoryPass(int64_t read, int64_t written, int32_t stream);
  Status RunKernel(const traces::KernelOp& k);
  Status RunMemcpy(const traces::MemcpyOp& m);
  Status JoinStreams();
  Status ForkStreams();
  StatusOr<int64_t> ElapsedNs();
  Status RunSteps();
  Status CaptureAndReplay();

  const ExecutionPlan plan_;
  const CudaRunOptions& options_;
  const int32_t device_;

  // Declared before the allocators that use them (destroyed after).
  std::vector<OwnedStream> streams_;
  ScheduleDeviceMemory memory_;
  CudaStreamEvents events_;
  OperandDeviceMemory operand_memory_;
  CudaStreamEvents operand_events_;
  sim::CachingAllocator operand_allocator_;  // proxy operands and collective buffers
  RankExecutor executor_;                    // owns the schedule's allocator (over memory_)

  ComputeCapability cc_;
  int32_t sm_count_ = 1;
  std::string device_name_;
  std::vector<int32_t> stream_priorities_;
  std::vector<OwnedEvent> events_by_index_, join_events_;
  OwnedEvent step_start_, step_end_;
  ProxyKernels kernels_;
  OwnedLt lt_;
  std::map<std::string, std::unique_ptr<LtPlan>> lt_plans_;
  bool plans_frozen_ = false;  // after PreparePlans: a missing plan is a bug, not a query
  std::vector<Operands> operands_;
  std::vector<void*> send_, recv_;
  OwnedHostBuffer pinned_;
  SpinCalibration host_spin_, kernel_spin_;
  std::unique_ptr<NcclComm> world_;
  std::vector<std::unique_ptr<NcclComm>> comms_;  // per schedule communicator (null: not a member)

  // Host thread only:
  Status error_ = Status::Ok();
  int64_t meminfo_free_after_setup_ = -1, meminfo_total_ = -1;
  std::vector<int64_t> graph_times_;
  std::vector<std::string> notes_;
  std::string nvtx_message_;
};

}  // namespace shardscope::runtime::cuda

#endif  // SHARDSCOPE_RUNTIME_CUDA_CUDA_RANK_H_

// ProgramBuilder: appends ops to a Program with names instead of indices, so a lowering
// reads like the framework code it follows. Private to sim/.
#ifndef SHARDSCOPE_SIM_PROGRAM_BUILDER_H_
#define SHARDSCOPE_SIM_PROGRAM_BUILDER_H_

#include <string>
#include <string_view>
#include <unordered_map>

#include "shardscope/traces/schedule.h"

namespace shardscope::sim {

class ProgramBuilder {
 public:
  explicit ProgramBuilder(std::string name) { program_.name = std::move(name); }

  traces::StreamIndex Stream(const std::string& name, int32_t priority);
  traces::EventIndex Event(const std::string& name) { return Index(events_, program_.events, name); }
  traces::CommSlot Comm(const std::string& name) { return Index(comms_, program_.comm_slots, name); }

  // Tags applied to every op appended until changed.
  void SetModule(std::string_view module) { tags_.module = Name(module); }
  void SetPhase(traces::Phase phase) { tags_.phase = phase; }
  void SetMicroBatch(int32_t micro_batch) { tags_.micro_batch = micro_batch; }

  void Kernel(traces::StreamIndex stream, std::string_view name, traces::ComputeDesc compute) {
    Append(name, traces::KernelOp{stream, compute});
  }
  void MemoryKernel(traces::StreamIndex stream, std::string_view name, int64_t read, int64_t written) {
    Kernel(stream, name, traces::MemoryBoundDesc{read, written});
  }
  // `root`: the root's global rank for broadcast / reduce, the peer for send / recv.
  void Collective(traces::StreamIndex stream, std::string_view name, traces::CollectiveType type,
                  traces::CommSlot comm, int64_t bytes, traces::DType dtype, int32_t root = -1);
  // An all_reduce that is an OOM-flag agreement point (CollectiveOp::oom_sync).
  void OomSyncAllReduce(traces::StreamIndex stream, std::string_view name, traces::CommSlot comm, int64_t bytes,
                        traces::DType dtype);
  void Memcpy(traces::StreamIndex stream, std::string_view name, traces::MemcpyKind kind, int64_t bytes) {
    Append(name, traces::MemcpyOp{kind, stream, bytes});
  }
  // Host-blocking synchronizations (cudaStreamSynchronize, cudaDeviceSynchronize,
  // cudaEventSynchronize).
  void StreamSync(std::string_view name, traces::StreamIndex stream) {
    Append(name, traces::StreamSynchronizeOp{stream});
  }
  void DeviceSync(std::string_view name) { Append(name, traces::DeviceSynchronizeOp{}); }
  void EventSync(std::string_view name, traces::EventIndex event) {
    Append(name, traces::EventSynchronizeOp{event});
  }
  void Record(traces::EventIndex event, traces::StreamIndex stream) {
    Append({}, traces::EventRecordOp{event, stream});
  }
  void Wait(traces::StreamIndex stream, traces::EventIndex event) {
    Append({}, traces::StreamWaitEventOp{stream, event});
  }
  void HostWork(std::string_view name, int64_t ns) {
    if (ns > 0) Append(name, traces::HostWorkOp{ns});
  }
  void Allocate(const std::string& tensor, int64_t bytes, traces::StreamIndex stream) {
    Append({}, traces::AllocateOp{Index(tensors_, program_.tensors, tensor), bytes, stream});
  }
  void Free(const std::string& tensor) {
    Append({}, traces::FreeOp{Index(tensors_, program_.tensors, tensor)});
  }
  // tensor.record_stream(stream): its block stays reserved until `stream` has done the work
  // queued before the free.
  void RecordStream(const std::string& tensor, traces::StreamIndex stream) {
    Append({}, traces::RecordStreamOp{Index(tensors_, program_.tensors, tensor), stream});
  }

  traces::Program Finish() { return std::move(program_); }

 private:
  void Append(std::string_view name, traces::OpPayload payload);
  traces::NameIndex Name(std::string_view name);
  static int32_t Index(std::unordered_map<std::string, int32_t>& map, std::vector<std::string>& table,
                       const std::string& name);

  traces::Program program_;
  traces::OpTags tags_;
  std::unordered_map<std::string, int32_t> streams_, events_, comms_, tensors_, names_;
};

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_PROGRAM_BUILDER_H_

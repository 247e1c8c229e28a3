#include "shardscope/runtime/execution_plan.h"

#include <algorithm>
#include <type_traits>
#include <variant>

#include <fmt/format.h>

namespace shardscope::runtime {

using traces::CollectiveType;

CollectiveBuffers BuffersFor(const traces::CollectiveOp& op, int32_t group_size) {
  return traces::CountsOf(op, group_size);
}

namespace {

int32_t PositionIn(const std::vector<int32_t>& ranks, int32_t rank) {
  auto it = std::find(ranks.begin(), ranks.end(), rank);
  return it == ranks.end() ? -1 : static_cast<int32_t>(it - ranks.begin());
}

}  // namespace

StatusOr<ExecutionPlan> BuildExecutionPlan(const traces::Schedule& schedule, int32_t rank, int32_t world_size,
                                           const sim::CostProvider& costs) {
  if (world_size != schedule.world_size()) {
    return Status::InvalidInput(fmt::format(
        "schedule has {} ranks, the job has {}: launch it with mpirun -np {}", schedule.world_size(), world_size,
        schedule.world_size()));
  }
  if (rank < 0 || rank >= world_size) {
    return Status::InvalidInput(fmt::format("rank {} is outside the world of {} ranks", rank, world_size));
  }
  SHARDSCOPE_RETURN_IF_ERROR(traces::ValidateSchedule(schedule));

  ExecutionPlan plan;
  plan.rank = rank;
  plan.world_size = world_size;
  const traces::Program& program = schedule.ProgramOf(rank);
  plan.program = &program;
  for (const traces::StreamDecl& s : program.streams) plan.streams.push_back(StreamPlan{s.name, s.priority});
  plan.num_events = static_cast<int32_t>(program.events.size());
  plan.num_tensors = static_cast<int32_t>(program.tensors.size());

  for (size_t c = 0; c < schedule.communicators.size(); ++c) {
    const traces::Communicator& comm = schedule.communicators[c];
    CommunicatorPlan cp;
    cp.index = static_cast<int32_t>(c);
    cp.name = comm.name;
    cp.ranks = comm.ranks;
    const int32_t position = PositionIn(comm.ranks, rank);
    if (position >= 0) {
      cp.color = cp.index;
      cp.key = position;
    }
    plan.communicators.push_back(std::move(cp));
  }

  plan.ops.reserve(program.ops.size());
  for (const traces::Op& op : program.ops) {
    OpPlan p;
    p.op_id = op.id;
    std::visit(
        [&](const auto& payload) {
          using T = std::decay_t<decltype(payload)>;
          if constexpr (std::is_same_v<T, traces::KernelOp>) {
            p.op_class = OpClass::kKernel;
            p.stream = payload.stream;
            p.duration_ns = costs.KernelNs(payload.compute);
          } else if constexpr (std::is_same_v<T, traces::MemcpyOp>) {
            p.op_class = OpClass::kMemcpy;
            p.stream = payload.stream;
            p.bytes = payload.bytes;
            p.duration_ns = costs.MemcpyNs(payload.kind, payload.bytes);
          } else if constexpr (std::is_same_v<T, traces::CollectiveOp>) {
            p.op_class = OpClass::kCollective;
            p.stream = payload.stream;
            p.communicator = schedule.CommunicatorOf(rank, payload.comm);
            CommunicatorPlan& cp = plan.communicators[static_cast<size_t>(p.communicator)];
            cp.used = true;
            if (payload.peer >= 0) p.peer_comm_rank = PositionIn(cp.ranks, payload.peer);
            p.buffers = BuffersFor(payload, static_cast<int32_t>(cp.ranks.size()));
            p.bytes = payload.bytes;
            cp.max_send_bytes = std::max(cp.max_send_bytes, p.buffers.send_bytes());
            cp.max_recv_bytes = std::max(cp.max_recv_bytes, p.buffers.recv_bytes());
          } else if constexpr (std::is_same_v<T, traces::EventRecordOp>) {
            p.op_class = OpClass::kEventRecord;
            p.stream = payload.stream;
            p.event = payload.event;
          } else if constexpr (std::is_same_v<T, traces::StreamWaitEventOp>) {
            p.op_class = OpClass::kStreamWaitEvent;
            p.stream = payload.stream;
            p.event = payload.event;
          } else if constexpr (std::is_same_v<T, traces::StreamSynchronizeOp>) {
            p.op_class = OpClass::kStreamSynchronize;
            p.stream = payload.stream;
          } else if constexpr (std::is_same_v<T, traces::DeviceSynchronizeOp>) {
            p.op_class = OpClass::kDeviceSynchronize;
          } else if constexpr (std::is_same_v<T, traces::EventSynchronizeOp>) {
            p.op_class = OpClass::kEventSynchronize;
            p.event = payload.event;
          } else if constexpr (std::is_same_v<T, traces::HostWorkOp>) {
            p.op_class = OpClass::kHostWork;
            p.duration_ns = payload.duration_ns;
          } else if constexpr (std::is_same_v<T, traces::AllocateOp>) {
            p.op_class = OpClass::kAllocate;
            p.stream = payload.stream;
            p.tensor = payload.tensor;
            p.bytes = payload.bytes;
          } else if constexpr (std::is_same_v<T, traces::FreeOp>) {
            p.op_class = OpClass::kFree;
            p.tensor = payload.tensor;
          } else {
            static_assert(std::is_same_v<T, traces::RecordStreamOp>);
            p.op_class = OpClass::kRecordStream;
            p.stream = payload.stream;
            p.tensor = payload.tensor;
          }
        },
        op.payload);
    plan.ops.push_back(p);
  }
  return plan;
}

}  // namespace shardscope::runtime

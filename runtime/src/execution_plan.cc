#include "shardscope/runtime/execution_plan.h"

#include <algorithm>
#include <map>
#include <type_traits>
#include <utility>
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

bool IsP2p(traces::CollectiveType type) { return type == CollectiveType::kSend || type == CollectiveType::kRecv; }

// Per collective (not send / recv) that `rank` issues on schedule communicator `comm`, in
// program order: the op (the k-th entry is what the rank brings to the communicator's k-th
// collective, collective_seq_id k+1).
std::vector<const traces::CollectiveOp*> CollectivesOn(const traces::Schedule& schedule, int32_t rank, int32_t comm) {
  std::vector<const traces::CollectiveOp*> ops;
  for (const traces::Op& op : schedule.ProgramOf(rank).ops) {
    const auto* c = std::get_if<traces::CollectiveOp>(&op.payload);
    if (c == nullptr || IsP2p(c->type) || schedule.CommunicatorOf(rank, c->comm) != comm) continue;
    ops.push_back(c);
  }
  return ops;
}

// Fills OpPlan::peer_elements of every all_to_all of the plan from the sizes its peers bring
// to the same collective (AllToAllPeerElements), and the buffers from their sum.
void ResolveAllToAlls(const traces::Schedule& schedule, ExecutionPlan& plan) {
  std::vector<int64_t> ordinal(plan.communicators.size(), 0);
  // (communicator, member position) -> that member's collectives on it, found once.
  std::map<std::pair<int32_t, size_t>, std::vector<const traces::CollectiveOp*>> collectives_of;
  for (size_t i = 0; i < plan.ops.size(); ++i) {
    OpPlan& p = plan.ops[i];
    if (p.op_class != OpClass::kCollective) continue;
    const auto& coll = std::get<traces::CollectiveOp>(plan.program->ops[i].payload);
    if (IsP2p(coll.type)) continue;
    const int64_t k = ordinal[static_cast<size_t>(p.communicator)]++;
    if (coll.type != CollectiveType::kAllToAll) continue;
    CommunicatorPlan& cp = plan.communicators[static_cast<size_t>(p.communicator)];
    std::vector<int64_t> sizes(cp.ranks.size(), -1);
    for (size_t q = 0; q < cp.ranks.size(); ++q) {
      auto [it, inserted] = collectives_of.try_emplace({p.communicator, q});
      if (inserted) it->second = CollectivesOn(schedule, cp.ranks[q], p.communicator);
      if (k >= static_cast<int64_t>(it->second.size())) continue;  // the member never gets there
      const traces::CollectiveOp& peer = *it->second[static_cast<size_t>(k)];
      // Another kind or dtype at the same position: a mismatch the schedule hangs on.
      if (peer.type == CollectiveType::kAllToAll && peer.dtype == coll.dtype) {
        sizes[q] = peer.bytes / traces::DTypeSize(coll.dtype);
      }
    }
    p.peer_elements = AllToAllPeerElements(p.buffers.elements, sizes);
    int64_t total = 0;
    for (int64_t e : p.peer_elements) total += e;
    p.buffers.send_elements = total;
    p.buffers.recv_elements = total;
    cp.max_send_bytes = std::max(cp.max_send_bytes, p.buffers.send_bytes());
    cp.max_recv_bytes = std::max(cp.max_recv_bytes, p.buffers.recv_bytes());
  }
}

}  // namespace

std::vector<int64_t> AllToAllPeerElements(int64_t own_elements, const std::vector<int64_t>& sizes_elements) {
  const auto n = static_cast<int64_t>(std::max<size_t>(1, sizes_elements.size()));
  std::vector<int64_t> out;
  out.reserve(sizes_elements.size());
  for (int64_t peer : sizes_elements) out.push_back(std::max(own_elements, peer) / n);
  return out;
}

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
  ResolveAllToAlls(schedule, plan);
  return plan;
}

}  // namespace shardscope::runtime

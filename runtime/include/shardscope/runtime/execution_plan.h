// The execution plan: one rank's program of a schedule, resolved into what a backend needs
// to run it, with no backend in sight (no MPI, no CUDA): streams with priorities, event
// slots, the communicators to create (for every schedule communicator, on every rank, the
// split color and key, since MPI_Comm_split and ncclCommSplit are collective over the
// parent), the buffer each collective reads and writes, each allocation's bytes, and the
// duration the simulator predicts for each kernel and copy.
//
//   SHARDSCOPE_ASSIGN_OR_RETURN(ExecutionPlan plan,
//                               BuildExecutionPlan(schedule, rank, world_size, costs));
//   for (const OpPlan& op : plan.ops) ...   // one entry per op of the rank's program
//
// The plan is built the same way by every backend, so the host backend (MPI, threads) and a
// CUDA backend agree on communicator creation order and buffer sizes.
#ifndef SHARDSCOPE_RUNTIME_EXECUTION_PLAN_H_
#define SHARDSCOPE_RUNTIME_EXECUTION_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "shardscope/sim/engine/engine.h"
#include "shardscope/traces/collective_counts.h"
#include "shardscope/traces/schedule.h"
#include "shardscope/base/status.h"

namespace shardscope::runtime {

// MPI_UNDEFINED / NCCL_SPLIT_NOCOLOR: the rank is not in the group and gets no communicator.
inline constexpr int32_t kNoColor = -1;

struct StreamPlan {
  std::string name;
  int32_t priority = 0;  // CUDA convention: lower = higher priority
};

// One schedule communicator as every rank creates it. Creation is collective over the world,
// so every rank creates every communicator, in index order (the order of
// Schedule::communicators), and ranks outside it pass kNoColor.
struct CommunicatorPlan {
  int32_t index = 0;                // into Schedule::communicators
  std::string name;
  std::vector<int32_t> ranks;       // global ranks in NCCL rank order
  // MPI_Comm_split(world, color, key): color = index for members (distinct per communicator,
  // so two communicators with the same members still get separate handles), kNoColor
  // otherwise; key = the rank's position in `ranks`, so communicator rank = NCCL rank.
  int32_t color = kNoColor;
  int32_t key = 0;
  bool used = false;                // the rank's program issues collectives on it
  // The largest send and receive buffers any collective of this rank needs on it: the
  // communicator serializes its collectives, so one pair of buffers serves all of them.
  int64_t max_send_bytes = 0;
  int64_t max_recv_bytes = 0;
};

enum class OpClass : uint8_t {
  kKernel,        // busy for duration_ns (scaled)
  kMemcpy,        // busy for duration_ns (scaled)
  kCollective,
  kEventRecord,
  kStreamWaitEvent,
  kStreamSynchronize,
  kDeviceSynchronize,
  kEventSynchronize,
  kHostWork,      // the host is busy for duration_ns (scaled)
  kAllocate,
  kFree,
  kRecordStream,
};

// What one rank's collective moves, in elements of its dtype: the buffers of
// traces::CollectiveCounts (send_elements / recv_elements / element_bytes, floored when the
// size does not divide evenly; collective_counts.h states the rule).
using CollectiveBuffers = traces::CollectiveCounts;

struct OpPlan {
  OpClass op_class = OpClass::kKernel;
  int64_t op_id = 0;
  int32_t stream = -1;              // the stream it runs on (-1: host-only ops)
  int32_t event = -1;               // records, waits, event synchronize
  int32_t tensor = -1;              // allocate, free, record_stream
  int64_t bytes = 0;                // allocate: requested bytes; memcpy: bytes copied
  int64_t duration_ns = 0;          // kernels and copies: the simulator's prediction at full
                                    // speed; host work: its duration
  // Collectives:
  int32_t communicator = -1;        // into Schedule::communicators
  int32_t peer_comm_rank = -1;      // send/recv peer or broadcast/reduce root, as a rank of
                                    // the communicator (NCCL takes communicator ranks)
  CollectiveBuffers buffers;
  // all_to_all only: the elements exchanged with each member of the communicator (by
  // communicator rank), sent to it and received from it alike (AllToAllPeerElements);
  // buffers.send_elements and recv_elements are their sum.
  std::vector<int64_t> peer_elements;
};

struct ExecutionPlan {
  int32_t rank = 0;
  int32_t world_size = 0;
  const traces::Program* program = nullptr;  // owned by the schedule, which must outlive the plan
  std::vector<StreamPlan> streams;           // StreamIndex -> stream
  int32_t num_events = 0;
  int32_t num_tensors = 0;
  std::vector<CommunicatorPlan> communicators;  // every schedule communicator, index order
  std::vector<OpPlan> ops;                   // one per op of the program, same order
};

// Resolves `rank`'s program. Fails (kInvalidInput) when the job's world size differs from the
// schedule's ("schedule has 8 ranks, the job has 4"), when `rank` is outside the world, or
// when the schedule does not validate. `costs` predicts kernel and copy durations.
StatusOr<ExecutionPlan> BuildExecutionPlan(const traces::Schedule& schedule, int32_t rank, int32_t world_size,
                                           const sim::CostProvider& costs);

// Buffer sizes of one collective on a communicator of `group_size` ranks (see CollectiveBuffers).
CollectiveBuffers BuffersFor(const traces::CollectiveOp& op, int32_t group_size);

// An all_to_all whose members carry different sizes (torch.distributed.all_to_all_single with
// split sizes, MoE routing imbalance: CollectiveOp::bytes is per rank, the simulator's
// rendezvous accepts it) runs as one send and one receive per peer (ProcessGroupNCCL's
// alltoall_base; MPI_Alltoallv), and the two sides of every pair must agree on the count or
// NCCL hangs and MPI truncates. The schedule gives each rank one size S, the larger of what it
// sends and receives (sim/lowering: RoutedBytes), not the matrix, so the runtime derives a
// symmetric one: ranks a and b exchange max(S_a, S_b) / n elements each way (n members,
// floored). Both sides compute the same number from the same two sizes; every rank moves at
// least its own S rounded down to n parts, and the most loaded rank moves exactly its S both
// ways, the bytes the simulator costs the instance with. Equal sizes give S / n per peer, the
// even split. `sizes_elements[q]`: member q's S in elements (-1: unknown, e.g. its matching
// collective is not an all_to_all: the schedule hangs there and this rank's own size is used).
std::vector<int64_t> AllToAllPeerElements(int64_t own_elements, const std::vector<int64_t>& sizes_elements);

}  // namespace shardscope::runtime

#endif  // SHARDSCOPE_RUNTIME_EXECUTION_PLAN_H_

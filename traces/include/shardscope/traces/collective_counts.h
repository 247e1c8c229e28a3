// Element counts of a collective, from CollectiveOp::bytes: the one rule every reader of a
// schedule uses to turn a collective's size into what NCCL is called with (the runtime's
// buffers) and what PyTorch reports (the trace's "In msg nelems" / "Out msg nelems", the
// Flight Recorder's input_sizes / output_sizes).
//
//   const CollectiveCounts c = CountsOf(coll.type, coll.dtype, coll.bytes, group_size);
//   ncclAllGather(send, recv, c.send_elements, ...);      // the runtime
//   info.in_nelems = c.in_elements;                        // traces, the profiler, sim
//
// CollectiveOp::bytes is nccl-tests' size S: the gathered output of an all_gather, the input
// of a reduce_scatter, the buffer of an all_reduce / broadcast / reduce, what one rank sends
// in an all_to_all (n equal parts) and what a send / recv moves.
#ifndef SHARDSCOPE_TRACES_COLLECTIVE_COUNTS_H_
#define SHARDSCOPE_TRACES_COLLECTIVE_COUNTS_H_

#include <cstdint>

#include "shardscope/traces/schedule.h"

namespace shardscope::traces {

struct CollectiveCounts {
  int64_t element_bytes = 0;  // DTypeSize(dtype)
  int64_t elements = 0;       // S / element_bytes, floored
  // The buffers a rank passes to NCCL (or MPI): all_gather sends S/n and receives n times
  // that; reduce_scatter sends n times S/n and receives S/n; all_reduce, broadcast and reduce
  // use S both ways; all_to_all sends and receives S rounded down to n equal parts; send only
  // sends S, recv only receives S. Floored when S does not divide evenly (FSDP pads its flat
  // buffers to a multiple of the world size: torch/distributed/fsdp/_fully_shard/
  // _fsdp_param_group.py, so lowered schedules divide evenly; a hand-written one may not).
  int64_t send_elements = 0;
  int64_t recv_elements = 0;
  // What PyTorch reports for this rank's input and output tensors (record_param_comms in
  // torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, and Flight Recorder's input_sizes /
  // output_sizes): all_gather in S/n, out S (not rounded to n parts); reduce_scatter in S,
  // out S/n; every other kind S both ways (send and recv included).
  int64_t in_elements = 0;
  int64_t out_elements = 0;
  int64_t send_bytes() const { return send_elements * element_bytes; }
  int64_t recv_bytes() const { return recv_elements * element_bytes; }
};

// `group_size`: ranks of the communicator (values below 1 count as 1).
CollectiveCounts CountsOf(CollectiveType type, DType dtype, int64_t bytes, int32_t group_size);
inline CollectiveCounts CountsOf(const CollectiveOp& op, int32_t group_size) {
  return CountsOf(op.type, op.dtype, op.bytes, group_size);
}

}  // namespace shardscope::traces

#endif  // SHARDSCOPE_TRACES_COLLECTIVE_COUNTS_H_

// The JSON form of a Schedule (schedule.h): files users write by hand, and what
// `shardscope schedule` writes for `simulate` (and the runtime) to read.
//
// Everything is referred to by name (streams, events, tensors, communicator slots,
// programs, communicators); the reader resolves names to indices, then calls
// Schedule::ResolveBindings() and ValidateSchedule(). A complete example:
//
//   {
//     "version": 1,
//     "metadata": {"cluster.preset": "h100-dgx", "plan": "fsdp.yaml"},
//     "communicators": [{"name": "dp", "ranks": [0, 1]}],
//     "programs": [{
//       "name": "main",
//       "streams": [{"name": "compute", "priority": 0}, {"name": "ag", "priority": -1}],
//       "events": ["ag0"],
//       "tensors": ["params0"],
//       "comm_slots": ["dp"],
//       "ops": [
//         {"id": 0, "op": "allocate", "tensor": "params0", "bytes": 8388608, "stream": "ag"},
//         {"id": 1, "op": "collective", "type": "all_gather", "comm": "dp", "stream": "ag",
//          "bytes": 8388608, "dtype": "bf16", "module": "layers.0", "phase": "forward"},
//         {"id": 2, "op": "event_record", "event": "ag0", "stream": "ag"},
//         {"id": 3, "op": "stream_wait_event", "stream": "compute", "event": "ag0"},
//         {"id": 4, "op": "kernel", "name": "gemm qkv", "stream": "compute",
//          "gemm": {"m": 4096, "n": 3072, "k": 1024, "batch": 1, "dtype": "bf16"},
//          "module": "layers.0", "phase": "forward", "micro_batch": 0},
//         {"id": 5, "op": "free", "tensor": "params0"},
//         {"id": 6, "op": "device_synchronize"}
//       ]
//     }],
//     "ranks": [{"rank": 0, "program": "main"},
//               {"rank": 1, "program": "main", "bind": {"dp": "dp"}}]
//   }
//
// Keys (every other key is an error; comments // and /* */ are allowed):
//   top level      version (1, required), metadata {string: string}, communicators,
//                  programs (required), ranks (required)
//   communicator   name, ranks (global ranks in NCCL rank order)
//   program        name, streams (required, >= 1; the first is the default stream),
//                  events, tensors, comm_slots (lists of names), ops, names (optional:
//                  the initial Program::names table; written only when the table is not
//                  what reading the ops would rebuild)
//   stream         name, priority (default 0; lower = higher priority, as in CUDA)
//   rank           rank (must equal its position: ranks are listed 0..N-1), program (name),
//                  bind {slot: communicator} (slots left out bind to the communicator of
//                  the slot's name)
//   every op       id (int64, unique in its program), op (kind), name, module (strings),
//                  phase ("forward", "backward", "optimizer", "checkpoint"), micro_batch
//   kernel         stream + exactly one of:
//                    gemm {m, n, k, batch = 1, dtype = "bf16"}
//                    attention {batch, heads, kv_heads = heads, seq_q, seq_kv = seq_q,
//                               head_dim, causal = true, backward = false, dtype = "bf16"}
//                    memory {bytes_read = 0, bytes_written = 0}
//                    fixed {duration_ns}
//   collective     type (all_gather, reduce_scatter, all_reduce, broadcast, reduce,
//                  all_to_all, send, recv), comm (slot), stream, bytes, dtype = "bf16",
//                  peer (send/recv only: global rank), root (broadcast/reduce only)
//   memcpy         kind (h2d, d2h, d2d), stream, bytes
//   event_record   event, stream           stream_wait_event   stream, event
//   stream_synchronize  stream             event_synchronize   event
//   device_synchronize  (nothing)          host_work           duration_ns
//   allocate       tensor, bytes, stream   free                tensor
// dtype names: fp32, tf32, bf16, fp16, fp8_e4m3, fp8_e5m2, int8, int32, int64, fp64 (and
// the aliases ParseDType accepts). Integers must be JSON integers (1.0 is rejected).
//
// Limits (schedule.h; an error names the JSON path, the limit and the value):
//   bytes (collective, memcpy, allocate), bytes_read, bytes_written   0 .. 2^50 (1 PiB)
//   duration_ns (host_work, fixed)                                    0 .. 3.6e12 (one hour)
//   a program's host_work + fixed durations in all                    2^58 ns
//   ops in one program                                                2^28
//   gemm m, n, k, batch; attention batch, heads, kv_heads, seq_q,
//     seq_kv, head_dim                                                1 .. 2^24
//   elements of one operand (gemm batch*m*k, batch*k*n, batch*m*n;
//     attention batch*heads*seq_q*head_dim, batch*kv_heads*seq_kv*head_dim)  2^48
// and a simulated run stops with an error at 2^60 ns (36 years) of simulated time.
// Metadata figures (sim/lowering/src/schedule_metadata.cc) are bounded too: FLOP rates
// 1e11 .. 1e18 (0 for a tensor-core rate the GPU lacks; bf16 and fp16 not both 0),
// bandwidths 1e8 .. 1e14 B/s (0 only where it means something: no NVLink, one node, one GPU
// per node, copy rate not measured), memory sizes 0 .. 2^50, host costs 0 .. 1e9 ns,
// contention slowdowns 0 .. 100, straggler factors (0, 1000], nodes and GPUs per node
// 1 .. 2^20.
//
// Errors name the source, the JSON path and the op id where there is one, e.g.
//   plan.json: /programs/0/ops/12/stream (op id 12): expected a stream name declared in
//   /programs/0/streams, got "comms"
// and syntax errors the line and column ("plan.json:3:17: invalid JSON: ...").
//
// Reading streams the ops: each op object is parsed on its own and converted, so memory
// stays close to the size of the resulting Schedule even for schedules of many megabytes.
// ScheduleToJson writes keys in a fixed order, one op per line, and reading its output
// gives an equal Schedule (operator==) for any schedule that passes ValidateSchedule and
// holds valid UTF-8 (invalid bytes are written as U+FFFD). One corner is not kept: an op
// referring to the second copy of a string repeated in Program::names comes back referring
// to the first.
#ifndef SHARDSCOPE_TRACES_SCHEDULE_JSON_H_
#define SHARDSCOPE_TRACES_SCHEDULE_JSON_H_

#include <string>
#include <string_view>

#include "shardscope/traces/schedule.h"
#include "shardscope/base/status.h"

namespace shardscope::traces {

// Parses and validates a schedule. `source` names the input in error messages.
StatusOr<Schedule> ParseScheduleJson(std::string_view text, const std::string& source);

// Reads, parses and validates a schedule file (streamed from disk).
StatusOr<Schedule> ReadScheduleFile(const std::string& path);

// Serializes deterministically (same schedule, same bytes).
std::string ScheduleToJson(const Schedule& schedule);

// Writes ScheduleToJson(schedule) to `path + ".tmp.<pid>"`, then renames it onto `path`,
// so `path` never holds a half-written schedule.
Status WriteScheduleFile(const Schedule& schedule, const std::string& path);

}  // namespace shardscope::traces

#endif  // SHARDSCOPE_TRACES_SCHEDULE_JSON_H_

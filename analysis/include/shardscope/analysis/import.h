// Import of PyTorch-profiler (Kineto) traces: one Chrome-JSON file per rank, as written by
// torch.profiler's export_chrome_trace() or tensorboard_trace_handler (`*.pt.trace.json`),
// merged into one measured Timeline in shardscope's conventions, so that the diff and the
// calibration read an imported run exactly like a simulated one.
//
//   SHARDSCOPE_ASSIGN_OR_RETURN(ImportedTrace run, ImportPytorchTraces({"r0.json", "r1.json"}));
//   run.timeline  // pid = rank, tid 0 = host thread, tid 1 + k = k-th CUDA stream
//
// What becomes of a Kineto file (docs/IMPORT.md has the long form and the sources):
// - Rank: distributedInfo.rank when distributedInfo says world_size > 1 (HTA needs it per
//   file); else the "Rank" arg of a collective on the default process group (Kineto derives
//   distributedInfo from it the same way, output_json.cpp addOnDemandDistMetadata); else the
//   file's position in the argument list, with a warning. Two files with one rank: an error.
// - Tracks. Kineto writes GPU activity on pid = device, tid = CUDA stream id, and host
//   activity on pid = OS process id, tid = OS thread id. A pid that carries any kernel,
//   gpu_memcpy, gpu_memset or gpu_user_annotation event is a device; each (device, stream)
//   becomes tid 1 + k in ascending (device, stream) order, named "stream k (CUDA stream S,
//   device D)". The host thread (tid 0) is the thread holding the ProfilerStep#N
//   annotations (torch.profiler.profile.step() records them on the caller's thread), else
//   the one with the most cpu_op events; every other host thread (the autograd engine's
//   backward thread, data loader threads) follows the streams, tid 1 + streams + j, in
//   ascending OS thread id, named "host thread (tid T)". Events on string pids (Kineto's
//   "Spans" / "Traces" tracks, "Record Window End") are dropped and counted.
// - Collectives: kernels with Kineto's NCCL args (output_json.cpp copies "Collective name",
//   "In msg nelems", "Out msg nelems", "Group size", "dtype", "Process Group Name",
//   "Process Group Description", "Process Group Ranks" from the launching
//   record_param_comms op) keep their CollectiveInfo; "Seq" and "Rank" live only on that
//   cpu_op (torch/csrc/profiler/util.cpp saveNcclMeta) and are joined through the shared
//   "External id". A kernel named nccl* without those args (HTA's test, older PyTorch)
//   still becomes a collective, named from the kernel name when it says (AllGather, ...).
//   The collective name is normalized to shardscope's names (all_gather, reduce_scatter,
//   all_reduce, broadcast, reduce, all_to_all, send, recv); PyTorch's original
//   ("_allgather_base", ...) stays in the arg "torch collective". CollectiveInfo::rank is the
//   global rank (PyTorch's "Rank" is the rank in the group, kept as "group rank"). Seq is
//   PyTorch's: 1-based per process group (ProcessGroupNCCL passes
//   getSequenceNumberForGroup() + 1).
// - Correlation ids, "External id" and ac2g / fwdbwd flows are kept (flow ids become
//   (rank << 32) | id so ranks cannot collide); ProfilerStep#N annotations stay on the host
//   thread and are listed in ImportedTrace::steps.
// - Time: Kineto writes ts relative to baseTimeNanoseconds (output_json.cpp
//   transToRelativeTime), in microseconds with three decimals. Each event's absolute time
//   is baseTimeNanoseconds + ts (older files without the key have absolute ts). All ranks
//   are put on one axis whose origin is the earliest kept event of any rank; TraceInfo::
//   base_time_ns records that origin. Host clocks are trusted as they are: ranks on other
//   nodes are off by their clock skew (NTP/PTP), which is not estimated.
// - Compressed files (`*.pt.trace.json.gz`, recognised by the gzip magic 1f 8b) are read as
//   they decompress (ReadChromeTraceFile); schemaVersion 1 files (2021: "Kernel",
//   "Runtime", "Operator" categories, "external id") read like current ones.
// - Collective kernels without a Seq anywhere (older PyTorch; NCCL args but no
//   record_param_comms in the trace) are numbered 1, 2, ... per rank and process group in
//   start order, marked with the arg "Seq from": "order", and a warning says so.
#ifndef SHARDSCOPE_ANALYSIS_IMPORT_H_
#define SHARDSCOPE_ANALYSIS_IMPORT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "shardscope/base/status.h"
#include "shardscope/traces/timeline.h"

namespace shardscope::traces {

// One imported file.
struct ImportedRank {
  int32_t rank = 0;
  std::string source;             // the file (or the name given with the timeline)
  bool rank_from_file_order = false;
  int32_t streams = 0;            // CUDA streams seen (tids 1 .. streams)
  int32_t host_threads = 0;       // host threads seen (tid 0 and those after the streams)
  int64_t kernels = 0;            // kernel slices, collectives included
  int64_t collectives = 0;        // kernel slices with CollectiveInfo
  int64_t dropped_events = 0;     // events on Kineto's string pids ("Spans", "Traces", "")
  int64_t base_time_ns = 0;       // the file's baseTimeNanoseconds
  int64_t shift_ns = 0;           // added to the file's ts to put it on the common axis
};

// A ProfilerStep#N annotation.
struct ImportedStep {
  int32_t rank = 0;
  int64_t step = 0;               // N
  int64_t start_ns = 0;
  int64_t end_ns = 0;
};

struct ImportedTrace {
  Timeline timeline;
  std::vector<ImportedRank> ranks;          // ascending rank
  std::vector<ImportedStep> steps;          // by (rank, start)
  std::vector<std::string> warnings;        // each names its file
};

// Reads every file (streaming, see ReadChromeTraceFile) and merges them. Errors name the
// file: unreadable, corrupt gzip data, not a trace, rank out of range or repeated.
StatusOr<ImportedTrace> ImportPytorchTraces(const std::vector<std::string>& paths);

// The same over timelines already parsed (source name, timeline), in argument order.
StatusOr<ImportedTrace> ImportPytorchTimelines(std::vector<std::pair<std::string, Timeline>> sources);

// The summary `shardscope import` prints: per rank its streams, kernels and collectives,
// then per process group its size, ranks and collective counts by type, then the steps.
std::string ImportSummaryText(const ImportedTrace& trace);

// Writes the merged timeline as `out_dir`/trace.json, replacing the folder's previous one only
// when written whole (base/output_dir.h; other files in the folder are left alone), as
// `shardscope import -o` does. Returns the path written.
StatusOr<std::string> WriteImportedTrace(const ImportedTrace& trace, const std::string& out_dir);

// PyTorch's c10d collective name ("_allgather_base", "allreduce",
// "reduce_scatter_tensor_coalesced", ...) or an NCCL kernel name ("ncclDevKernel_AllGather_
// RING_LL", "ncclKernel_AllReduce_RING_LL_Sum_float") -> shardscope's collective name
// ("all_gather", ...); "" when it names none.
std::string NormalizeCollectiveName(std::string_view name);

}  // namespace shardscope::traces

#endif  // SHARDSCOPE_ANALYSIS_IMPORT_H_

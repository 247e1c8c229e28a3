// The host-side timeline (host_timeline.h), shared by the host and CUDA backends.
#include "host_timeline.h"

#include <climits>
#include <variant>

#include <fmt/format.h>

#include "mpi_status.h"
#include "shardscope/runtime/execution_plan.h"
#include "shardscope/traces/chrome_trace.h"

namespace shardscope::runtime {
namespace {

size_t Idx(int64_t i) { return static_cast<size_t>(i); }

// Host slices in Kineto's categories: launches are CUDA runtime calls, synchronizations
// cuda_sync, host work and allocator calls CPU ops.
traces::Category HostCategory(const traces::OpPayload& payload) {
  if (std::holds_alternative<traces::KernelOp>(payload) || std::holds_alternative<traces::CollectiveOp>(payload) ||
      std::holds_alternative<traces::MemcpyOp>(payload) || std::holds_alternative<traces::EventRecordOp>(payload) ||
      std::holds_alternative<traces::StreamWaitEventOp>(payload)) {
    return traces::Category::kCudaRuntime;
  }
  if (std::holds_alternative<traces::StreamSynchronizeOp>(payload) ||
      std::holds_alternative<traces::DeviceSynchronizeOp>(payload) ||
      std::holds_alternative<traces::EventSynchronizeOp>(payload)) {
    return traces::Category::kCudaSync;
  }
  return traces::Category::kCpuOp;
}

}  // namespace

void AppendFlattened(const std::vector<SliceRecord>& slices, std::vector<int64_t>& flat) {
  for (const SliceRecord& s : slices) flat.insert(flat.end(), {s.tid, s.op_index, s.start_ns, s.end_ns, s.step, s.seq});
}

StatusOr<TimelineSlices> GatherTimelineSlices(MPI_Comm comm, std::vector<int64_t> flat) {
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  constexpr size_t kMaxTimelineValues = size_t{1} << 28;  // stays within MPI's int counts
  if (flat.size() > kMaxTimelineValues) flat.resize(kMaxTimelineValues - kMaxTimelineValues % kSliceFields);
  const int count = static_cast<int>(flat.size());
  TimelineSlices out;
  out.counts.assign(static_cast<size_t>(world), 0);
  std::vector<int> displacements(static_cast<size_t>(world), 0);
  SHARDSCOPE_RETURN_IF_ERROR(MpiStatus(MPI_Gather(&count, 1, MPI_INT, out.counts.data(), 1, MPI_INT, 0, comm),
                                     "MPI_Gather"));
  if (rank == 0) {
    int64_t total = 0;
    for (size_t r = 0; r < out.counts.size(); ++r) {
      displacements[r] = static_cast<int>(total);
      total += out.counts[r];
    }
    if (total > INT_MAX) return Status::Internal("host timeline too large to gather");
    out.values.resize(static_cast<size_t>(total));
  }
  SHARDSCOPE_RETURN_IF_ERROR(MpiStatus(MPI_Gatherv(flat.data(), count, MPI_INT64_T, out.values.data(),
                                                 out.counts.data(), displacements.data(), MPI_INT64_T, 0, comm),
                                     "MPI_Gatherv"));
  return out;
}

Status WriteHostTimeline(const std::string& path, const traces::Schedule& schedule, const TimelineSlices& slices,
                         const std::string& producer, const std::string& backend) {
  traces::TraceInfo info;
  info.backend = backend;
  info.world_size = schedule.world_size();
  info.producer = producer;
  SHARDSCOPE_ASSIGN_OR_RETURN(auto writer, traces::ChromeTraceWriter::Open(path, info));
  size_t offset = 0;
  for (size_t rank = 0; rank < slices.counts.size(); ++rank) {
    const auto r = static_cast<int32_t>(rank);
    const traces::Program& program = schedule.ProgramOf(r);
    writer->OnProcess(traces::ProcessInfo{r, fmt::format("rank {}", r), r});
    writer->OnThread(traces::ThreadInfo{r, 0, "host thread", 0});
    for (size_t s = 0; s < program.streams.size(); ++s) {
      const auto tid = static_cast<int32_t>(1 + s);
      writer->OnThread(traces::ThreadInfo{r, tid, fmt::format("stream {} {}", s, program.streams[s].name), tid});
    }
    const size_t end = offset + static_cast<size_t>(slices.counts[rank]);
    for (size_t i = offset; i + kSliceFields <= end; i += kSliceFields) {
      const int64_t* f = slices.values.data() + i;
      const traces::Op& op = program.ops[Idx(f[1])];
      traces::Slice slice;
      slice.pid = r;
      slice.tid = static_cast<int32_t>(f[0]);
      slice.ts_ns = f[2];
      slice.dur_ns = f[3] - f[2];
      slice.op_id = op.id;
      const std::string_view name = program.NameOf(op.name);
      slice.name = name.empty() ? std::string(traces::OpKindName(op.payload)) : std::string(name);
      const bool host = slice.tid == 0;
      if (host) {
        slice.category = HostCategory(op.payload);
        if (const auto* alloc = std::get_if<traces::AllocateOp>(&op.payload); alloc && name.empty()) {
          slice.name = "allocate " + program.tensors[Idx(alloc->tensor)];
        } else if (const auto* free_op = std::get_if<traces::FreeOp>(&op.payload); free_op && name.empty()) {
          slice.name = "free " + program.tensors[Idx(free_op->tensor)];
        }
      } else if (std::holds_alternative<traces::MemcpyOp>(op.payload)) {
        slice.category = traces::Category::kGpuMemcpy;
      } else {
        slice.category = traces::Category::kKernel;
      }
      if (const auto* coll = std::get_if<traces::CollectiveOp>(&op.payload); coll && !host) {
        const int32_t c = schedule.CommunicatorOf(r, coll->comm);
        const traces::Communicator& comm = schedule.communicators[Idx(c)];
        const CollectiveBuffers b = BuffersFor(*coll, static_cast<int32_t>(comm.ranks.size()));
        traces::CollectiveInfo info_c;
        info_c.collective_name = std::string(traces::CollectiveTypeName(coll->type));
        info_c.process_group = comm.name;
        info_c.dtype = std::string(traces::DTypeName(coll->dtype));
        info_c.in_nelems = b.send_elements;
        info_c.out_nelems = b.recv_elements;
        info_c.group_size = static_cast<int32_t>(comm.ranks.size());
        info_c.seq = f[5];
        info_c.rank = r;
        slice.collective = info_c;
      }
      slice.args.push_back({"step", f[4]});
      writer->OnSlice(slice);
    }
    offset = end;
  }
  return writer->Finish();
}

}  // namespace shardscope::runtime

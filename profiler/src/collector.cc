#include "shardscope/profiler/collector.h"

#include "shardscope/traces/collective_counts.h"

#include <cxxabi.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <tuple>
#include <unordered_map>

namespace shardscope::profiler {
namespace {

using traces::Arg;
using traces::Category;
using traces::Slice;

// Flow ids unique across ranks, as sim's TraceRecorder and traces' import build them
// (CUPTI correlation ids are 32-bit).
constexpr int kFlowRankShift = 32;


// Where a collective op sits in its communicator's order within one step.
struct CollectiveSlot {
  int32_t communicator = -1;
  int64_t index_in_step = 0;  // 0-based among the same key's ops in program order
  int64_t per_step = 1;       // how many ops share the key in one step
};

struct OpEntry {
  const traces::Op* op = nullptr;
  std::optional<CollectiveSlot> collective;
};

// Op id -> op and, for collectives, the per-step sequence position the simulator's engine
// gives them (sim/engine/src/engine.cc: Rendezvous::seq per communicator; P2pPending::seq per
// (communicator, sender, receiver)).
std::unordered_map<int64_t, OpEntry> IndexProgram(const traces::Schedule& schedule, int32_t rank) {
  const traces::Program& program = schedule.ProgramOf(rank);
  std::unordered_map<int64_t, OpEntry> ops;
  std::map<std::tuple<int32_t, int32_t, int32_t>, int64_t> counts;  // (comm, sender, receiver); -1s: collective
  std::vector<std::pair<int64_t, std::tuple<int32_t, int32_t, int32_t>>> keys;
  for (const traces::Op& op : program.ops) {
    OpEntry entry{&op, std::nullopt};
    if (const auto* coll = std::get_if<traces::CollectiveOp>(&op.payload)) {
      const int32_t comm = schedule.CommunicatorOf(rank, coll->comm);
      std::tuple<int32_t, int32_t, int32_t> key{comm, -1, -1};
      if (coll->type == traces::CollectiveType::kSend) key = {comm, rank, coll->peer};
      if (coll->type == traces::CollectiveType::kRecv) key = {comm, coll->peer, rank};
      entry.collective = CollectiveSlot{comm, counts[key]++, 0};
      keys.emplace_back(op.id, key);
    }
    ops.emplace(op.id, entry);
  }
  for (const auto& [op_id, key] : keys) ops[op_id].collective->per_step = counts[key];
  return ops;
}

void AddTags(const traces::Program& program, const traces::Op& op, Slice& slice) {
  if (op.name != traces::kNoName) slice.args.push_back({"op", std::string(program.NameOf(op.name))});
  if (op.tags.module != traces::kNoName) slice.args.push_back({"module", std::string(program.NameOf(op.tags.module))});
  if (op.tags.phase != traces::Phase::kNone) {
    slice.args.push_back({"phase", std::string(traces::PhaseName(op.tags.phase))});
  }
  if (op.tags.micro_batch >= 0) slice.args.push_back({"micro-batch", int64_t{op.tags.micro_batch}});
}

traces::CollectiveInfo CollectiveInfoOf(const traces::Schedule& schedule, const traces::CollectiveOp& coll,
                                        const CollectiveSlot& slot, int64_t step, int32_t rank) {
  const traces::Communicator& comm = schedule.communicators[static_cast<size_t>(slot.communicator)];
  traces::CollectiveInfo info;
  info.collective_name = std::string(traces::CollectiveTypeName(coll.type));
  info.process_group = comm.name;
  info.dtype = std::string(traces::TorchScalarTypeName(coll.dtype));
  info.group_size = static_cast<int32_t>(comm.ranks.size());
  info.seq = step * slot.per_step + slot.index_in_step;
  info.rank = rank;
  // Element counts of this rank's input and output buffers, as PyTorch reports them and
  // TraceRecorder writes them (traces/collective_counts.h).
  const traces::CollectiveCounts counts = traces::CountsOf(coll, info.group_size);
  info.in_nelems = counts.in_elements;
  info.out_nelems = counts.out_elements;
  return info;
}

std::string Triple(const std::array<int32_t, 3>& v) { return fmt::format("[{}, {}, {}]", v[0], v[1], v[2]); }

bool IsDevice(Category category) {
  return category == Category::kKernel || category == Category::kGpuMemcpy || category == Category::kGpuMemset;
}

}  // namespace

std::string DemangleKernelName(const std::string& name) {
  if (name.rfind("_Z", 0) != 0) return name;
  int status = 0;
  char* demangled = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
  std::string result = status == 0 && demangled != nullptr ? std::string(demangled) : name;
  std::free(demangled);
  return result;
}

StatusOr<std::unique_ptr<ActivityCollector>> ActivityCollector::Create(const traces::Schedule& schedule,
                                                                       CollectorOptions options) {
  if (options.rank < 0 || options.rank >= schedule.world_size()) {
    return Status::InvalidInput(fmt::format("activity collector: rank {} is not in the schedule's {} ranks",
                                            options.rank, schedule.world_size()));
  }
  const traces::Program& program = schedule.ProgramOf(options.rank);
  for (const auto& [cuda_stream, index] : options.stream_map) {
    if (index < 0 || static_cast<size_t>(index) >= program.streams.size()) {
      return Status::InvalidInput(fmt::format(
          "activity collector: CUDA stream {} maps to stream index {}, but program \"{}\" has {} streams",
          cuda_stream, index, program.name, program.streams.size()));
    }
  }
  return std::unique_ptr<ActivityCollector>(new ActivityCollector(schedule, std::move(options)));
}

ActivityCollector::ActivityCollector(const traces::Schedule& schedule, CollectorOptions options)
    : schedule_(schedule), options_(std::move(options)) {}

void ActivityCollector::OnActivities(std::span<const ActivityRecord> batch) {
  records_.insert(records_.end(), batch.begin(), batch.end());
}

CollectorReport ActivityCollector::WriteTimeline(traces::TimelineSink& sink) const {
  CollectorReport report;
  report.dropped_records = dropped_records_;
  const int32_t rank = options_.rank;
  const traces::Program& program = schedule_.ProgramOf(rank);
  const auto ops = IndexProgram(schedule_, rank);
  const auto stream_tid = [](int32_t stream_index) { return stream_index + 1; };

  // Correlation id -> op id (CUSTOM0 external ids only: the other kinds are not ours).
  std::map<uint32_t, int64_t> op_of_correlation;
  for (const ActivityRecord& record : records_) {
    ++report.records_by_kind[static_cast<size_t>(KindOf(record))];
    const auto* ext = std::get_if<ExternalCorrelationRecord>(&record);
    if (ext == nullptr || ext->kind != ExternalKind::kCustom0) continue;
    const auto op_id = static_cast<int64_t>(ext->external_id);
    auto [it, inserted] = op_of_correlation.emplace(ext->correlation, op_id);
    if (!inserted && it->second != op_id) {
      ++report.conflicting_correlations;
      it->second = std::min(it->second, op_id);
    }
  }

  // The host thread: given, or the OS thread that made the most op-matched API calls.
  std::map<uint32_t, int64_t> matched_calls_by_thread;
  std::set<uint32_t> api_threads;
  for (const ActivityRecord& record : records_) {
    const auto* api = std::get_if<ApiRecord>(&record);
    if (api == nullptr) continue;
    api_threads.insert(api->thread_id);
    if (op_of_correlation.count(api->correlation) != 0) ++matched_calls_by_thread[api->thread_id];
  }
  std::optional<uint32_t> host_thread = options_.host_thread_id;
  if (!host_thread) {
    int64_t best = -1;
    for (const auto& [thread, calls] : matched_calls_by_thread) {
      if (calls > best) {  // ties: the smallest thread id (the map is ordered)
        best = calls;
        host_thread = thread;
      }
    }
  }

  // Further tracks after the schedule's streams, in a fixed order.
  std::set<uint32_t> unmapped_streams;
  bool has_overhead = false;
  for (const ActivityRecord& record : records_) {
    std::optional<uint32_t> stream;
    if (const auto* k = std::get_if<KernelRecord>(&record)) stream = k->stream;
    if (const auto* m = std::get_if<MemcpyRecord>(&record)) stream = m->stream;
    if (const auto* m = std::get_if<MemsetRecord>(&record)) stream = m->stream;
    if (const auto* s = std::get_if<SynchronizationRecord>(&record)) stream = s->stream;
    if (stream && options_.stream_map.count(*stream) == 0) unmapped_streams.insert(*stream);
    if (std::holds_alternative<OverheadRecord>(record)) has_overhead = true;
  }
  int32_t next_tid = static_cast<int32_t>(program.streams.size()) + 1;
  std::map<uint32_t, int32_t> unmapped_stream_tid;
  std::map<uint32_t, int32_t> thread_tid;
  for (uint32_t stream : unmapped_streams) unmapped_stream_tid[stream] = next_tid++;
  for (uint32_t thread : api_threads) {
    if (thread != host_thread) thread_tid[thread] = next_tid++;
  }
  const int32_t overhead_tid = has_overhead ? next_tid++ : -1;

  sink.OnProcess(traces::ProcessInfo{rank, fmt::format("rank {}", rank), rank});
  sink.OnThread(traces::ThreadInfo{rank, 0, "host thread", 0});
  for (size_t s = 0; s < program.streams.size(); ++s) {
    const int32_t tid = stream_tid(static_cast<int32_t>(s));
    sink.OnThread(traces::ThreadInfo{rank, tid, fmt::format("stream {} {}", s, program.streams[s].name), tid});
  }
  for (const auto& [stream, tid] : unmapped_stream_tid) {
    sink.OnThread(traces::ThreadInfo{rank, tid, fmt::format("cuda stream {} (not in the schedule)", stream), tid});
  }
  for (const auto& [thread, tid] : thread_tid) {
    sink.OnThread(traces::ThreadInfo{rank, tid, fmt::format("thread {}", thread), tid});
  }
  if (overhead_tid >= 0) sink.OnThread(traces::ThreadInfo{rank, overhead_tid, "CUPTI overhead", overhead_tid});

  // The track of a CUDA stream; sets the "stream" args.
  const auto place_on_stream = [&](uint32_t cuda_stream, Slice& slice) {
    auto it = options_.stream_map.find(cuda_stream);
    if (it != options_.stream_map.end()) {
      slice.tid = stream_tid(it->second);
      slice.args.push_back({"stream", int64_t{it->second}});
    } else {
      slice.tid = unmapped_stream_tid.at(cuda_stream);
    }
    slice.args.push_back({"cuda stream", int64_t{cuda_stream}});
    return it != options_.stream_map.end();
  };
  // Resolves the op of a correlation id; marks the slice when there is none.
  const auto attach_op = [&](uint32_t correlation, Slice& slice) -> const OpEntry* {
    slice.correlation = correlation;
    auto it = op_of_correlation.find(correlation);
    if (it == op_of_correlation.end()) {
      slice.args.push_back({"unmatched", std::string("no external correlation id")});
      return nullptr;
    }
    auto op = ops.find(it->second);
    if (op == ops.end()) {
      ++report.unknown_op_ids;
      slice.args.push_back(
          {"unmatched", fmt::format("external id {} is not an op of program \"{}\"", it->second, program.name)});
      return nullptr;
    }
    slice.op_id = it->second;
    AddTags(program, *op->second.op, slice);
    return &op->second;
  };
  const auto timed = [&](int64_t start_ns, int64_t end_ns, Slice& slice) {
    slice.pid = rank;
    slice.ts_ns = options_.clock.Map(start_ns);
    slice.dur_ns = std::max<int64_t>(0, options_.clock.Map(end_ns) - slice.ts_ns);
  };

  std::vector<Slice> slices;
  slices.reserve(records_.size());
  std::map<uint32_t, std::pair<int32_t, int64_t>> launch_of_correlation;  // -> (tid, ts)
  for (const ActivityRecord& record : records_) {
    Slice slice;
    if (const auto* k = std::get_if<KernelRecord>(&record)) {
      timed(k->start_ns, k->end_ns, slice);
      slice.name = DemangleKernelName(k->name);
      slice.category = Category::kKernel;
      slice.args.push_back({"device", int64_t{k->device}});
      slice.args.push_back({"context", int64_t{k->context}});
      if (!place_on_stream(k->stream, slice)) ++report.unmapped_stream_records;
      slice.args.push_back({"grid", Triple(k->grid)});
      slice.args.push_back({"block", Triple(k->block)});
      slice.args.push_back({"registers per thread", int64_t{k->registers_per_thread}});
      slice.args.push_back({"shared memory", int64_t{k->static_shared_memory} + k->dynamic_shared_memory});
      if (attach_op(k->correlation, slice) == nullptr) ++report.unmatched_device_records;
    } else if (const auto* m = std::get_if<MemcpyRecord>(&record)) {
      timed(m->start_ns, m->end_ns, slice);
      slice.name = fmt::format("Memcpy {} ({} -> {})", MemcpyDirectionName(m->direction),
                               MemoryKindName(m->src_memory), MemoryKindName(m->dst_memory));
      slice.category = Category::kGpuMemcpy;
      slice.args.push_back({"device", int64_t{m->device}});
      slice.args.push_back({"context", int64_t{m->context}});
      if (!place_on_stream(m->stream, slice)) ++report.unmapped_stream_records;
      slice.args.push_back({"bytes", m->bytes});
      // bytes per ns = GB/s (Kineto's "memory bandwidth (GB/s)").
      if (slice.dur_ns > 0) {
        slice.args.push_back({"memory bandwidth (GB/s)", static_cast<double>(m->bytes) / static_cast<double>(slice.dur_ns)});
      }
      if (attach_op(m->correlation, slice) == nullptr) ++report.unmatched_device_records;
    } else if (const auto* s = std::get_if<MemsetRecord>(&record)) {
      timed(s->start_ns, s->end_ns, slice);
      slice.name = fmt::format("Memset ({})", MemoryKindName(s->memory));
      slice.category = Category::kGpuMemset;
      slice.args.push_back({"device", int64_t{s->device}});
      slice.args.push_back({"context", int64_t{s->context}});
      if (!place_on_stream(s->stream, slice)) ++report.unmapped_stream_records;
      slice.args.push_back({"bytes", s->bytes});
      if (slice.dur_ns > 0) {
        slice.args.push_back({"memory bandwidth (GB/s)", static_cast<double>(s->bytes) / static_cast<double>(slice.dur_ns)});
      }
      if (attach_op(s->correlation, slice) == nullptr) ++report.unmatched_device_records;
    } else if (const auto* y = std::get_if<SynchronizationRecord>(&record)) {
      timed(y->start_ns, y->end_ns, slice);
      slice.name = std::string(SyncTypeName(y->type));
      slice.category = Category::kCudaSync;
      if (y->stream) {
        place_on_stream(*y->stream, slice);
      } else {
        slice.tid = 0;  // a context-wide wait: the host thread is what waits
      }
      if (y->event) slice.args.push_back({"cuda event", int64_t{*y->event}});
      attach_op(y->correlation, slice);
    } else if (const auto* a = std::get_if<ApiRecord>(&record)) {
      timed(a->start_ns, a->end_ns, slice);
      slice.name = a->name;
      slice.category = a->domain == ApiDomain::kDriver ? Category::kCudaDriver : Category::kCudaRuntime;
      slice.tid = a->thread_id == host_thread ? 0 : thread_tid.at(a->thread_id);
      slice.args.push_back({"cbid", int64_t{a->cbid}});
      if (attach_op(a->correlation, slice) == nullptr) ++report.unmatched_api_records;
      // A runtime call wins over a driver call of the same correlation (there should be one).
      auto [it, inserted] = launch_of_correlation.emplace(a->correlation, std::pair{slice.tid, slice.ts_ns});
      if (!inserted && a->domain == ApiDomain::kRuntime) it->second = {slice.tid, slice.ts_ns};
    } else if (const auto* o = std::get_if<OverheadRecord>(&record)) {
      timed(o->start_ns, o->end_ns, slice);
      slice.name = o->kind;
      slice.category = Category::kOther;
      slice.raw_category = "overhead";
      slice.tid = overhead_tid;
    } else {
      continue;  // external correlation records are links, not events
    }
    slices.push_back(std::move(slice));
  }

  // Deterministic order whatever the delivery order: by track, then time.
  std::sort(slices.begin(), slices.end(), [](const Slice& a, const Slice& b) {
    return std::tie(a.tid, a.ts_ns, b.dur_ns, a.correlation, a.name) <
           std::tie(b.tid, b.ts_ns, a.dur_ns, b.correlation, b.name);
  });

  // The step of each device slice of an op: its rank, in time, among the op's device slices
  // of the same category and name (an op issues one kernel or copy per step). Kernels of
  // collective ops get their CollectiveInfo with that step's Seq.
  std::map<std::tuple<int64_t, Category, std::string>, std::vector<size_t>> occurrences;
  for (size_t i = 0; i < slices.size(); ++i) {
    if (slices[i].op_id >= 0 && IsDevice(slices[i].category)) {
      occurrences[{slices[i].op_id, slices[i].category, slices[i].name}].push_back(i);
    }
  }
  for (auto& [key, indices] : occurrences) {
    std::sort(indices.begin(), indices.end(), [&](size_t a, size_t b) {
      return std::tie(slices[a].ts_ns, slices[a].correlation) < std::tie(slices[b].ts_ns, slices[b].correlation);
    });
    const OpEntry& entry = ops.at(std::get<0>(key));
    for (size_t n = 0; n < indices.size(); ++n) {
      Slice& slice = slices[indices[n]];
      const int64_t step = options_.first_step + static_cast<int64_t>(n);
      slice.args.push_back({"step", step});
      const auto* coll = std::get_if<traces::CollectiveOp>(&entry.op->payload);
      if (coll != nullptr && slice.category == Category::kKernel) {
        slice.collective = CollectiveInfoOf(schedule_, *coll, *entry.collective, step, rank);
        slice.args.push_back({"bytes", coll->bytes});
      }
    }
  }

  // Launch -> device flows; one per correlation (a graph launch's later kernels get none).
  std::vector<traces::Flow> flows;
  std::set<uint32_t> flowed;
  std::vector<size_t> device_order;
  for (size_t i = 0; i < slices.size(); ++i) {
    if (IsDevice(slices[i].category)) device_order.push_back(i);
  }
  std::sort(device_order.begin(), device_order.end(), [&](size_t a, size_t b) {
    return std::tie(slices[a].ts_ns, slices[a].tid) < std::tie(slices[b].ts_ns, slices[b].tid);
  });
  for (size_t i : device_order) {
    const Slice& slice = slices[i];
    const auto correlation = static_cast<uint32_t>(slice.correlation);
    auto launch = launch_of_correlation.find(correlation);
    if (launch == launch_of_correlation.end() || !flowed.insert(correlation).second) continue;
    traces::Flow flow;
    flow.id = (static_cast<int64_t>(rank) << kFlowRankShift) | int64_t{correlation};
    flow.from_pid = rank;
    flow.from_tid = launch->second.first;
    flow.from_ts_ns = launch->second.second;
    flow.to_pid = rank;
    flow.to_tid = slice.tid;
    flow.to_ts_ns = slice.ts_ns;
    flows.push_back(flow);
  }
  std::sort(flows.begin(), flows.end(), [](const traces::Flow& a, const traces::Flow& b) { return a.id < b.id; });
  report.flows = static_cast<int64_t>(flows.size());

  for (const Slice& slice : slices) sink.OnSlice(slice);
  for (const traces::Flow& flow : flows) sink.OnFlow(flow);
  return report;
}

}  // namespace shardscope::profiler

// Simulation setup from schedule metadata, the cluster cost provider, the trace recorder,
// report.json and the printed summary.
#include "shardscope/sim/report/report.h"

#include "shardscope/sim/models/calibration.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "report_nccl.h"
#include "shardscope/sim/hangs/hang.h"
#include "shardscope/traces/collective_counts.h"
#include "shardscope/traces/report_header.h"
#include "shardscope/sim/presets/mfu_conventions.h"
#include "shardscope/sim/report/version.h"
#include "shardscope/base/pickle.h"

namespace shardscope::sim {
namespace {

using traces::Schedule;

std::string_view CollectiveKernelName(traces::CollectiveType type) {
  switch (type) {
    case traces::CollectiveType::kAllGather: return "AllGather";
    case traces::CollectiveType::kReduceScatter: return "ReduceScatter";
    case traces::CollectiveType::kAllReduce: return "AllReduce";
    case traces::CollectiveType::kBroadcast: return "Broadcast";
    case traces::CollectiveType::kReduce: return "Reduce";
    case traces::CollectiveType::kAllToAll: return "SendRecv";  // NCCL runs all-to-all as p2p
    case traces::CollectiveType::kSend: return "SendRecv";
    case traces::CollectiveType::kRecv: return "SendRecv";
  }
  return "Unknown";
}

}  // namespace

// ---- Trace

TraceRecorder::TraceRecorder(const Schedule& schedule, std::vector<int32_t> ranks, traces::TimelineSink& sink)
    : schedule_(schedule), wanted_(static_cast<size_t>(schedule.world_size()), false), sink_(sink) {
  for (int32_t rank : ranks) {
    if (rank < 0 || rank >= schedule.world_size() || wanted_[static_cast<size_t>(rank)]) continue;
    wanted_[static_cast<size_t>(rank)] = true;
    sink_.OnProcess(traces::ProcessInfo{rank, fmt::format("rank {}", rank), rank});
    sink_.OnThread(traces::ThreadInfo{rank, 0, "host thread", 0});
    const traces::Program& program = schedule.ProgramOf(rank);
    for (size_t s = 0; s < program.streams.size(); ++s) {
      sink_.OnThread(traces::ThreadInfo{rank, static_cast<int32_t>(s + 1),
                                        fmt::format("stream {} {}", s, program.streams[s].name),
                                        static_cast<int32_t>(s + 1)});
    }
  }
}

bool TraceRecorder::WantsRank(int32_t rank) const {
  return rank >= 0 && static_cast<size_t>(rank) < wanted_.size() && wanted_[static_cast<size_t>(rank)];
}

namespace {

int64_t FlowId(int32_t rank, int64_t correlation) { return (static_cast<int64_t>(rank) << 32) | correlation; }

void AddTags(const traces::Program& program, const traces::Op& op, traces::Slice& slice) {
  if (op.tags.module != traces::kNoName) {
    slice.args.push_back({"module", std::string(program.NameOf(op.tags.module))});
  }
  if (op.tags.phase != traces::Phase::kNone) {
    slice.args.push_back({"phase", std::string(traces::PhaseName(op.tags.phase))});
  }
  if (op.tags.micro_batch >= 0) slice.args.push_back({"micro-batch", int64_t{op.tags.micro_batch}});
}

}  // namespace

void TraceRecorder::WriteHostSpan(const HostSpan& span) {
  const traces::Program& program = schedule_.ProgramOf(span.rank);
  const traces::Op& op = program.ops[static_cast<size_t>(span.op_index)];
  traces::Slice slice;
  slice.pid = span.rank;
  slice.tid = 0;
  slice.ts_ns = span.start_ns;
  slice.dur_ns = span.end_ns - span.start_ns;
  slice.op_id = op.id;
  slice.correlation = span.correlation;
  slice.category = traces::Category::kCudaRuntime;
  std::visit(
      [&](const auto& p) {
        using T = std::decay_t<decltype(p)>;
        if constexpr (std::is_same_v<T, traces::KernelOp> || std::is_same_v<T, traces::CollectiveOp>) {
          slice.name = "cudaLaunchKernel";
        } else if constexpr (std::is_same_v<T, traces::MemcpyOp>) {
          slice.name = "cudaMemcpyAsync";
        } else if constexpr (std::is_same_v<T, traces::EventRecordOp>) {
          slice.name = "cudaEventRecord";
        } else if constexpr (std::is_same_v<T, traces::StreamWaitEventOp>) {
          slice.name = "cudaStreamWaitEvent";
        } else if constexpr (std::is_same_v<T, traces::StreamSynchronizeOp>) {
          slice.name = "cudaStreamSynchronize";
        } else if constexpr (std::is_same_v<T, traces::DeviceSynchronizeOp>) {
          slice.name = "cudaDeviceSynchronize";
        } else if constexpr (std::is_same_v<T, traces::EventSynchronizeOp>) {
          slice.name = "cudaEventSynchronize";
        } else {
          slice.category = traces::Category::kCpuOp;
          slice.name = op.name != traces::kNoName ? std::string(program.NameOf(op.name)) : "host work";
        }
      },
      op.payload);
  if (span.kind == HostSpanKind::kLaunch && op.name != traces::kNoName) {
    slice.args.push_back({"kernel", std::string(program.NameOf(op.name))});
  }
  AddTags(program, op, slice);
  sink_.OnSlice(slice);
  // The launch -> kernel flow is written when the device span arrives; remember its start.
  if (span.correlation >= 0) launch_starts_[FlowId(span.rank, span.correlation)] = span.start_ns;
}

void TraceRecorder::WriteDeviceSpan(const DeviceSpan& span) {
  const traces::Program& program = schedule_.ProgramOf(span.rank);
  const traces::Op& op = program.ops[static_cast<size_t>(span.op_index)];
  traces::Slice slice;
  slice.pid = span.rank;
  slice.tid = span.stream + 1;
  slice.ts_ns = span.start_ns;
  slice.dur_ns = span.end_ns - span.start_ns;
  slice.op_id = op.id;
  slice.correlation = span.correlation;
  slice.category = traces::Category::kKernel;
  slice.args.push_back({"stream", int64_t{span.stream}});
  if (const auto* coll = std::get_if<traces::CollectiveOp>(&op.payload)) {
    const CollectiveRun& run = *span.collective;
    const auto& comm = schedule_.communicators[static_cast<size_t>(run.communicator)];
    slice.name = fmt::format("ncclDevKernel_{}_{}_{}", CollectiveKernelName(coll->type),
                             NcclAlgorithmName(run.cost.algorithm), NcclProtocolName(run.cost.protocol));
    traces::CollectiveInfo info;
    info.collective_name = std::string(traces::CollectiveTypeName(coll->type));
    info.process_group = comm.name;
    info.dtype = std::string(traces::TorchScalarTypeName(coll->dtype));
    info.group_size = static_cast<int32_t>(comm.ranks.size());
    info.seq = run.seq;
    info.rank = span.rank;
    // PyTorch reports element counts of this rank's input and output buffers.
    const traces::CollectiveCounts counts = traces::CountsOf(*coll, info.group_size);
    info.in_nelems = counts.in_elements;
    info.out_nelems = counts.out_elements;
    slice.collective = info;
    slice.args.push_back({"algorithm", std::string(NcclAlgorithmName(run.cost.algorithm))});
    slice.args.push_back({"protocol", std::string(NcclProtocolName(run.cost.protocol))});
    slice.args.push_back({"channels", int64_t{run.cost.channels}});
    slice.args.push_back({"bytes", coll->bytes});
    if (op.name != traces::kNoName) slice.args.push_back({"op", std::string(program.NameOf(op.name))});
  } else if (const auto* copy = std::get_if<traces::MemcpyOp>(&op.payload)) {
    static constexpr const char* kCopyNames[] = {"Memcpy HtoD (Pinned -> Device)",
                                                 "Memcpy DtoH (Device -> Pinned)",
                                                 "Memcpy DtoD (Device -> Device)"};
    slice.name = kCopyNames[static_cast<int>(copy->kind)];
    slice.category = traces::Category::kGpuMemcpy;
    slice.args.push_back({"bytes", copy->bytes});
  } else {
    slice.name = op.name != traces::kNoName ? std::string(program.NameOf(op.name)) : "kernel";
    const auto& kernel = std::get<traces::KernelOp>(op.payload);
    const double flops = KernelFlops(kernel.compute);
    if (flops > 0) slice.args.push_back({"flops", flops});
    const double bytes = KernelBytes(kernel.compute);
    if (bytes > 0) slice.args.push_back({"bytes", bytes});
  }
  AddTags(program, op, slice);
  sink_.OnSlice(slice);
  if (span.correlation >= 0) {
    traces::Flow flow;
    flow.id = FlowId(span.rank, span.correlation);
    auto it = launch_starts_.find(flow.id);
    flow.from_pid = span.rank;
    flow.from_tid = 0;
    flow.from_ts_ns = it != launch_starts_.end() ? it->second : span.start_ns;
    if (it != launch_starts_.end()) launch_starts_.erase(it);
    flow.to_pid = span.rank;
    flow.to_tid = slice.tid;
    flow.to_ts_ns = span.start_ns;
    sink_.OnFlow(flow);
  }
}

void TraceRecorder::WriteMemory(const MemorySample& memory) {
  const int32_t rank = memory.rank;
  const int64_t ts_ns = memory.ts_ns, allocated = memory.allocated, reserved = memory.reserved;
  traces::CounterSample sample;
  sample.pid = rank;
  sample.ts_ns = ts_ns;
  sample.name = "memory (bytes)";
  sample.values = {{"allocated", static_cast<double>(allocated)}, {"reserved", static_cast<double>(reserved)}};
  sink_.OnCounter(sample);
}

void TraceRecorder::WriteMemoryEvent(const MemoryEvent& event) {
  const int32_t rank = event.rank;
  const int64_t ts_ns = event.ts_ns, bytes = event.bytes;
  const std::string_view what = event.what;
  traces::Instant instant;
  instant.pid = rank;
  instant.tid = 0;
  instant.ts_ns = ts_ns;
  instant.name = std::string(what);
  instant.category = "memory";
  instant.scope = what == "oom" ? 'p' : 't';
  instant.args.push_back({"bytes", bytes});
  sink_.OnInstant(instant);
}

void TraceRecorder::OnHostSpan(const HostSpan& span) { instant_.push_back(Call{span.rank, 0, span, {}}); }

void TraceRecorder::OnDeviceSpan(const DeviceSpan& span) {
  Call call{span.rank, span.stream + 1, span, {}};
  if (span.collective != nullptr) call.collective = *span.collective;
  instant_.push_back(std::move(call));
}

void TraceRecorder::OnMemory(int32_t rank, int64_t ts_ns, int64_t allocated, int64_t reserved) {
  instant_.push_back(Call{rank, 0, MemorySample{rank, ts_ns, allocated, reserved}, {}});
}

void TraceRecorder::OnMemoryEvent(int32_t rank, int64_t ts_ns, std::string_view what, int64_t bytes) {
  instant_.push_back(Call{rank, 0, MemoryEvent{rank, ts_ns, what, bytes}, {}});
}

void TraceRecorder::OnInstantDone() {
  // Each lane's calls keep their order (a stable sort); lanes and ranks take a fixed one.
  std::stable_sort(instant_.begin(), instant_.end(),
                   [](const Call& a, const Call& b) { return a.rank != b.rank ? a.rank < b.rank : a.lane < b.lane; });
  for (Call& call : instant_) {
    if (auto* host = std::get_if<HostSpan>(&call.what)) {
      WriteHostSpan(*host);
    } else if (auto* device = std::get_if<DeviceSpan>(&call.what)) {
      if (device->collective != nullptr) device->collective = &call.collective;
      WriteDeviceSpan(*device);
    } else if (auto* memory = std::get_if<MemorySample>(&call.what)) {
      WriteMemory(*memory);
    } else {
      WriteMemoryEvent(std::get<MemoryEvent>(call.what));
    }
  }
  instant_.clear();
}

std::vector<int32_t> DefaultTraceRanks(const SimulationResult& result, int32_t gpus_per_node) {
  std::vector<int32_t> ranks;
  std::set<uint64_t> shown;
  const int32_t world = static_cast<int32_t>(result.ranks.size());
  for (int32_t rank = 0; rank < std::min(world, gpus_per_node); ++rank) {
    ranks.push_back(rank);
    shown.insert(result.ranks[static_cast<size_t>(rank)].timeline_hash);
  }
  for (int32_t rank = gpus_per_node; rank < world; ++rank) {
    if (shown.insert(result.ranks[static_cast<size_t>(rank)].timeline_hash).second) ranks.push_back(rank);
  }
  return ranks;
}

// ---- Report

namespace {

struct Figures {
  double step_s = 0;
  double tokens_per_second_per_gpu = 0;
  double tflops_per_gpu = 0;
  double mfu = 0;
  double mean_compute_ns = 0, mean_comm_ns = 0, mean_overlap_ns = 0;
  std::map<std::string, double> stream_busy_fraction;  // by stream name, mean over ranks
};

Figures ComputeFigures(const Schedule& schedule, const SimulationSetup& setup, const SimulationResult& result) {
  Figures f;
  // The training step; a checkpoint consolidated after it is timed on its own.
  f.step_s = static_cast<double>(result.step_ns > 0 ? result.step_ns : result.makespan_ns) * 1e-9;
  const double n = static_cast<double>(std::max<size_t>(1, result.ranks.size()));
  std::map<std::string, double> busy;
  for (size_t rank = 0; rank < result.ranks.size(); ++rank) {
    const RankStats& r = result.ranks[rank];
    f.mean_compute_ns += static_cast<double>(r.compute_ns) / n;
    f.mean_comm_ns += static_cast<double>(r.comm_ns) / n;
    f.mean_overlap_ns += static_cast<double>(r.overlap_ns) / n;
    const traces::Program& program = schedule.ProgramOf(static_cast<int32_t>(rank));
    for (size_t s = 0; s < r.streams.size(); ++s) busy[program.streams[s].name] += static_cast<double>(r.streams[s].busy_ns);
  }
  for (const auto& [name, ns] : busy) {
    f.stream_busy_fraction[name] = result.makespan_ns > 0 ? ns / n / static_cast<double>(result.makespan_ns) : 0;
  }
  // A step that did not complete (a rank ran out of memory, a hang) has no throughput.
  if (f.step_s > 0 && !result.hung && !result.oom_agreed) {
    f.tokens_per_second_per_gpu = static_cast<double>(setup.tokens_per_rank_step) / f.step_s;
    f.tflops_per_gpu = setup.model_flops_per_rank_step / f.step_s * 1e-12;
    const double peak = PeakFlops(setup.cluster.gpu, traces::ParseDType(
        schedule.metadata.count("training.dtype") ? schedule.metadata.at("training.dtype") : "bf16")
        .value_or(traces::DType::kBFloat16));
    if (peak > 0) f.mfu = setup.model_flops_per_rank_step / f.step_s / peak;
  }
  return f;
}

double Ratio(double a, double b) { return b > 0 ? a / b : 0; }

// "1.84 s", "12.5 ms", "300.0 us": three significant-ish figures in the largest unit that fits.
std::string DurationText(int64_t ns) {
  const auto value = static_cast<double>(ns);
  if (ns >= 1'000'000'000) return fmt::format("{:.2f} s", value * 1e-9);
  if (ns >= 1'000'000) return fmt::format("{:.1f} ms", value * 1e-6);
  return fmt::format("{:.1f} us", value * 1e-3);
}

nlohmann::ordered_json OomJson(const std::optional<OomInfo>& oom) {
  if (!oom) return nullptr;
  return {{"op_id", oom->op_id},
          {"time_ns", oom->time_ns},
          {"requested_bytes", oom->requested_bytes},
          {"free_bytes", oom->free_bytes},
          {"largest_free_block", oom->largest_free_block},
          {"injected", oom->injected}};
}

}  // namespace

bool InitRunsOutOfMemory(const traces::ReportMemoryPhases& phases) {
  return std::any_of(phases.classes.begin(), phases.classes.end(),
                     [](const traces::ReportMemoryClass& c) { return c.init_oom; });
}

// A job that runs out of memory before its first step has no throughput.
Figures WithoutThroughput(Figures f) {
  f.tokens_per_second_per_gpu = 0;
  f.tflops_per_gpu = 0;
  f.mfu = 0;
  return f;
}

std::string ReportJson(const Schedule& schedule, const SimulationSetup& setup, const SimulationResult& result,
                       const DivergenceCost* divergence) {
  const traces::ReportMemoryPhases phases = MemoryPhasesOf(schedule, setup, result);
  const bool init_oom = InitRunsOutOfMemory(phases);
  const Figures f = init_oom ? WithoutThroughput(ComputeFigures(schedule, setup, result))
                             : ComputeFigures(schedule, setup, result);
  nlohmann::ordered_json j;
  traces::WriteReportHeader(traces::ReportHeaderOf(schedule, std::string(Version()), setup.label,
                                                    {setup.cluster.name, setup.cluster.gpu.name, setup.cluster.nodes,
                                                     setup.cluster.gpus_per_node}),
                            j);
  // null: the default cost models; else the profile `shardscope calibrate` fitted, and how
  // many of its buckets can replace a default (the others fall back to the models).
  j["calibration"] = nullptr;
  if (setup.calibration) {
    const CalibrationProfile& p = *setup.calibration;
    j["calibration"] = {{"profile", setup.calibration_path},
                        {"gpu", p.gpu},
                        {"gemm_buckets", p.gemm.size()},
                        {"attention_buckets", p.attention.size()},
                        {"collective_buckets", p.collectives.size()},
                        {"memory_bandwidth", p.memory_bandwidth.has_value()},
                        {"launch_overhead", p.launch_overhead_ns.has_value()},
                        {"contention", p.compute_slowdown.has_value() || p.comm_slowdown.has_value()}};
  }
  // The NCCL modelled and what its tuning picks for rank 0's collectives (docs/REPORT.md).
  j["nccl"] = NcclReportJson(schedule, setup);
  // false: the throughput figures below are 0 (a hang, or an OOM the ranks agreed on)
  j["completed"] = !result.hung && !result.oom_agreed && !init_oom;
  j["step_time_ns"] = result.step_ns > 0 ? result.step_ns : result.makespan_ns;
  j["checkpoint_time_ns"] = result.step_ns > 0 ? result.makespan_ns - result.step_ns : 0;
  j["tokens_per_second_per_gpu"] = f.tokens_per_second_per_gpu;
  j["tflops_per_gpu"] = f.tflops_per_gpu;
  j["mfu"] = f.mfu;
  // The same step as each framework's own log would score it (docs/REPORT.md): model FLOPs
  // per token under its convention, the peak it divides by, and the MFU (null where that
  // framework reports none, or the step did not complete).
  nlohmann::ordered_json conventions = nlohmann::ordered_json::object();
  for (const SimulationSetup::ConventionFigures& c : setup.mfu_conventions) {
    const double flops_per_s = c.flops_per_token * f.tokens_per_second_per_gpu;
    conventions[c.name] = {{"flops_per_token", c.flops_per_token},
                           {"tflops_per_gpu", flops_per_s * 1e-12},
                           {"peak_flops", c.peak_flops},
                           {"mfu", c.peak_flops > 0 && flops_per_s > 0 ? nlohmann::ordered_json(flops_per_s / c.peak_flops)
                                                                       : nlohmann::ordered_json(nullptr)}};
  }
  j["mfu_by_convention"] = std::move(conventions);
  j["compute_ns"] = static_cast<int64_t>(std::llround(f.mean_compute_ns));
  j["comm_ns"] = static_cast<int64_t>(std::llround(f.mean_comm_ns));
  j["exposed_comm_ns"] = static_cast<int64_t>(std::llround(f.mean_comm_ns - f.mean_overlap_ns));
  j["overlap_ratio"] = Ratio(f.mean_overlap_ns, f.mean_comm_ns);
  j["stream_busy_fraction"] = f.stream_busy_fraction;
  traces::ReportMemory memory;
  for (size_t rank = 0; rank < result.ranks.size(); ++rank) {
    const RankMemory& m = result.ranks[rank].memory;
    memory.AddRank(static_cast<int32_t>(rank), m.stats.reserved_bytes_peak, m.stats.allocated_bytes_peak,
                   m.stats.num_alloc_retries, m.stats.num_ooms);
  }
  traces::WriteReportMemory(memory, setup.memory.alloc_conf, j);
  traces::WriteReportMemoryPhases(phases, j);
  // The rank the others waited for most in collectives (null: none caused 1 us in total).
  if (result.straggler) {
    const Straggler& st = *result.straggler;
    j["straggler"] = {{"rank", st.rank},
                      {"last_arrivals", st.last_arrivals},
                      {"share_of_collectives", Ratio(static_cast<double>(st.last_arrivals), static_cast<double>(st.collectives))},
                      {"wait_caused_ns", st.wait_caused_ns}};
  } else {
    j["straggler"] = nullptr;
  }
  // The divergence's sources and what they cost against every rank alike (cost null when
  // either run does not complete).
  if (divergence != nullptr) {
    const bool both = divergence->uniform_completed && !result.hung && !result.oom_agreed;
    j["divergence"] = {{"sources", divergence->sources},
                       {"uniform_step_time_ns", divergence->uniform_completed
                                                    ? nlohmann::ordered_json(divergence->uniform_step_ns)
                                                    : nlohmann::ordered_json(nullptr)},
                       {"cost_ns", both ? nlohmann::ordered_json(result.step_ns - divergence->uniform_step_ns)
                                        : nlohmann::ordered_json(nullptr)}};
  } else {
    j["divergence"] = nullptr;
  }
  j["hang"] = result.hung;
  // oom.policy catch_and_sync: where the ranks agreed on an OOM (present only then).
  if (result.oom_agreed) {
    const OomAgreement& a = *result.oom_agreed;
    j["oom_agreed"] = {{"outcome", "OOM caught and agreed: retry with a smaller micro-batch"},
                       {"communicator", schedule.communicators[static_cast<size_t>(a.communicator)].name},
                       {"seq", a.seq},
                       {"op_id", a.op_id},
                       {"time_ns", a.time_ns},
                       {"oom_ranks", a.oom_ranks},
                       {"ranks", a.ranks}};
  }
  nlohmann::ordered_json blocked = nlohmann::ordered_json::array();
  for (const BlockedRank& b : result.blocked) {
    blocked.push_back({{"rank", b.rank}, {"host", b.host}, {"streams", b.streams}});
  }
  j["blocked"] = blocked;
  // The hang explained: wait-for graph, root causes, watchdog (docs/REPORT.md); only present
  // when the step does not complete (the reports of completed steps keep their layout).
  if (result.hung) j["hang_report"] = nlohmann::ordered_json::parse(HangReportJson(schedule, AnalyzeHang(schedule, result)));
  // Host ops over every rank. (The engine's event count is not here: it depends on how the run
  // was simulated, one rank per class of identical ranks or every rank, and the report does not.)
  j["simulator"] = {{"ops_executed", result.ops_executed}};
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  for (size_t rank = 0; rank < result.ranks.size(); ++rank) {
    const RankStats& r = result.ranks[rank];
    const traces::Program& program = schedule.ProgramOf(static_cast<int32_t>(rank));
    nlohmann::ordered_json streams = nlohmann::ordered_json::object();
    for (size_t s = 0; s < r.streams.size(); ++s) streams[program.streams[s].name] = r.streams[s].busy_ns;
    ranks.push_back({{"rank", rank},
                     {"step_time_ns", r.end_ns},
                     {"compute_ns", r.compute_ns},
                     {"comm_ns", r.comm_ns},
                     {"overlap_ns", r.overlap_ns},
                     {"exposed_comm_ns", r.comm_ns - r.overlap_ns},
                     {"overlap_ratio", Ratio(static_cast<double>(r.overlap_ns), static_cast<double>(r.comm_ns))},
                     {"host_busy_ns", r.host_busy_ns},
                     {"host_blocked_ns", r.host_blocked_ns},
                     {"stream_busy_ns", streams},
                     {"finished", r.finished},
                     {"collectives", r.collectives},
                     {"last_arrivals", r.last_arrivals},
                     {"collective_wait_caused_ns", r.collective_wait_caused_ns},
                     {"capacity_bytes", r.memory.capacity_bytes},
                     {"peak_allocated_bytes", r.memory.stats.allocated_bytes_peak},
                     {"peak_reserved_bytes", r.memory.stats.reserved_bytes_peak},
                     {"fragmentation_bytes", r.memory.fragmentation_bytes},
                     {"num_alloc_retries", r.memory.stats.num_alloc_retries},
                     {"num_ooms", r.memory.stats.num_ooms},
                     {"oom", OomJson(r.memory.oom)}});
    // oom.policy catch_and_sync only (reports of other runs keep their layout).
    if (r.oom_handled) ranks.back()["oom_handled"] = true;
  }
  j["ranks"] = ranks;
  return j.dump(2) + "\n";
}

std::string MemorySnapshotJson(const RankMemory& memory, int32_t rank) {
  nlohmann::ordered_json segments = nlohmann::ordered_json::array();
  for (const SnapshotSegment& seg : memory.snapshot) {
    nlohmann::ordered_json blocks = nlohmann::ordered_json::array();
    uint64_t address = seg.address;
    int64_t active = 0, requested = 0;
    for (const SnapshotBlock& block : seg.blocks) {
      blocks.push_back({{"address", address}, {"size", block.size}, {"requested_size", block.requested_size},
                        {"state", block.state}});
      address += static_cast<uint64_t>(block.size);
      if (block.state != "inactive") active += block.size;
      requested += block.requested_size;
    }
    segments.push_back({{"device", rank},
                        {"address", seg.address},
                        {"total_size", seg.total_size},
                        {"allocated_size", seg.allocated_size},
                        {"active_size", active},
                        {"requested_size", requested},
                        {"stream", seg.stream},
                        {"segment_type", seg.segment_type},
                        {"blocks", blocks}});
  }
  nlohmann::ordered_json trace = nlohmann::ordered_json::array();
  for (size_t i = 0; i < memory.history.size(); ++i) {
    const TraceEntry& e = memory.history[i];
    const int64_t ns = i < memory.history_time_ns.size() ? memory.history_time_ns[i] : 0;
    trace.push_back({{"action", e.action}, {"addr", e.address}, {"size", e.size}, {"stream", e.stream},
                     {"time_us", ns / 1000}});
  }
  nlohmann::ordered_json j;
  j["segments"] = segments;
  j["device_traces"] = nlohmann::ordered_json::array({trace});
  return j.dump() + "\n";
}

std::string MemorySnapshotPickle(const RankMemory& memory) {
  using traces::PickleValue;
  // memory_viz (torch/utils/viz/MemoryViz.js) reads the keys torch.cuda.memory._snapshot()
  // writes (torch/csrc/cuda/memory_snapshot.cpp): it matches segments to device_traces by
  // `device` (the index into device_traces, so one rank per file is device 0), takes a
  // block's `frames` to mean the current format (requested_size then read as is), and shows
  // an oom's `device_free`.
  auto frames = [] { return PickleValue::List(); };
  auto u64 = [](uint64_t v) { return PickleValue::Int(static_cast<int64_t>(v)); };
  PickleValue segments = PickleValue::List();
  for (const SnapshotSegment& seg : memory.snapshot) {
    PickleValue blocks = PickleValue::List();
    uint64_t address = seg.address;
    int64_t active = 0, requested = 0;
    for (const SnapshotBlock& block : seg.blocks) {
      PickleValue b = PickleValue::Dict();
      b.Add("address", u64(address))
          .Add("size", PickleValue::Int(block.size))
          .Add("requested_size", PickleValue::Int(block.requested_size))
          .Add("state", PickleValue::String(block.state))
          .Add("frames", frames());
      blocks.Append(std::move(b));
      address += static_cast<uint64_t>(block.size);
      if (block.state != "inactive") {
        active += block.size;
        requested += block.requested_size;
      }
    }
    PickleValue s = PickleValue::Dict();
    s.Add("device", PickleValue::Int(0))
        .Add("address", u64(seg.address))
        .Add("total_size", PickleValue::Int(seg.total_size))
        .Add("allocated_size", PickleValue::Int(seg.allocated_size))
        .Add("active_size", PickleValue::Int(active))
        .Add("requested_size", PickleValue::Int(requested))
        .Add("stream", PickleValue::Int(seg.stream))
        .Add("segment_type", PickleValue::String(seg.segment_type))
        .Add("segment_pool_id", PickleValue::Tuple({PickleValue::Int(0), PickleValue::Int(0)}))
        .Add("is_expandable", PickleValue::Bool(seg.is_expandable))
        .Add("frames", frames())
        .Add("blocks", std::move(blocks));
    segments.Append(std::move(s));
  }
  PickleValue trace = PickleValue::List();
  for (size_t i = 0; i < memory.history.size(); ++i) {
    const TraceEntry& e = memory.history[i];
    const int64_t ns = i < memory.history_time_ns.size() ? memory.history_time_ns[i] : 0;
    PickleValue entry = PickleValue::Dict();
    entry.Add("action", PickleValue::String(e.action))
        .Add(e.action == "oom" ? "device_free" : "addr", u64(e.address))
        .Add("size", PickleValue::Int(e.size))
        .Add("stream", PickleValue::Int(e.stream))
        .Add("time_us", PickleValue::Int(ns / 1000))
        .Add("frames", frames());
    trace.Append(std::move(entry));
  }
  PickleValue root = PickleValue::Dict();
  root.Add("segments", std::move(segments)).Add("device_traces", PickleValue::List({std::move(trace)}));
  return traces::WritePickle(root);
}

std::string SummaryText(const Schedule& schedule, const SimulationSetup& setup, const SimulationResult& result) {
  const traces::ReportMemoryPhases phases = MemoryPhasesOf(schedule, setup, result);
  const bool init_oom = InitRunsOutOfMemory(phases);
  const Figures f = ComputeFigures(schedule, setup, result);
  std::string out;
  out += fmt::format("{}: {} ranks on {} x {} ({})\n", setup.label, schedule.world_size(), setup.cluster.nodes,
                     setup.cluster.name, setup.cluster.gpu.name);
  if (setup.calibration) {
    const CalibrationProfile& p = *setup.calibration;
    out += fmt::format("  costs calibrated by {}: {} GEMM, {} attention, {} collective bucket(s){}{}{}; "
                       "the rest from the default models\n",
                       setup.calibration_path, p.gemm.size(), p.attention.size(), p.collectives.size(),
                       p.memory_bandwidth ? ", memory bandwidth" : "", p.launch_overhead_ns ? ", launch cost" : "",
                       p.compute_slowdown || p.comm_slowdown ? ", contention" : "");
  }
  if (init_oom) {
    out += "  the job runs out of memory before its first step (init phase, below)\n";
  } else if (result.hung) {
    out += fmt::format("  the step does not complete ({} rank(s) stuck: out of memory or a hang, below)\n",
                       result.blocked.size());
  } else if (result.oom_agreed) {
    const OomAgreement& a = *result.oom_agreed;
    out += fmt::format("  OOM caught and agreed: retry with a smaller micro-batch (rank(s) {} ran out of memory; "
                       "{} rank(s) stopped cleanly at all_reduce #{} on '{}' (op {}) at {:.3f} ms)\n",
                       CompressRanks(a.oom_ranks), a.ranks.size(), a.seq,
                       schedule.communicators[static_cast<size_t>(a.communicator)].name, a.op_id,
                       static_cast<double>(a.time_ns) * 1e-6);
  } else {
    out += fmt::format("  step time            {:>12.3f} ms\n", f.step_s * 1e3);
    if (result.step_ns > 0 && result.makespan_ns > result.step_ns) {
      out += fmt::format("  checkpoint           {:>12.3f} ms   (optimizer state consolidated on rank 0 after the step)\n",
                         static_cast<double>(result.makespan_ns - result.step_ns) * 1e-6);
    }
  }
  if (setup.tokens_per_rank_step > 0 && !result.hung && !result.oom_agreed && !init_oom) {
    out += fmt::format("  tokens/s per GPU     {:>12.1f}\n", f.tokens_per_second_per_gpu);
    out += fmt::format("  model TFLOP/s per GPU{:>12.1f}   MFU {:.1f}%\n", f.tflops_per_gpu, 100 * f.mfu);
    std::string by_convention;
    for (const SimulationSetup::ConventionFigures& c : setup.mfu_conventions) {
      if (c.peak_flops <= 0) continue;
      by_convention += fmt::format("  {} {:.1f}%", c.name,
                                   100 * c.flops_per_token * f.tokens_per_second_per_gpu / c.peak_flops);
    }
    if (!by_convention.empty()) out += "  MFU as logged by:" + by_convention + "\n";
  }
  out += fmt::format("  compute busy         {:>12.3f} ms\n", f.mean_compute_ns * 1e-6);
  out += fmt::format("  communication        {:>12.3f} ms   overlapped {:.1f}%   exposed {:.3f} ms\n",
                     f.mean_comm_ns * 1e-6, 100 * Ratio(f.mean_overlap_ns, f.mean_comm_ns),
                     (f.mean_comm_ns - f.mean_overlap_ns) * 1e-6);
  if (result.straggler) {
    const Straggler& st = *result.straggler;
    out += fmt::format("  straggler: rank {} arrived last at {} of {} collectives; peers waited {} for it\n", st.rank,
                       st.last_arrivals, st.collectives, DurationText(st.wait_caused_ns));
  }
  out += "  stream busy:";
  for (const auto& [name, fraction] : f.stream_busy_fraction) out += fmt::format("  {} {:.1f}%", name, 100 * fraction);
  out += "\n";
  {
    int64_t peak_reserved = 0, peak_allocated = 0, capacity = 0, retries = 0;
    int32_t peak_rank = 0;
    std::vector<std::string> ooms;
    for (size_t rank = 0; rank < result.ranks.size(); ++rank) {
      const RankMemory& m = result.ranks[rank].memory;
      if (m.stats.reserved_bytes_peak > peak_reserved) {
        peak_reserved = m.stats.reserved_bytes_peak;
        peak_rank = static_cast<int32_t>(rank);
        capacity = m.capacity_bytes;
      }
      peak_allocated = std::max(peak_allocated, m.stats.allocated_bytes_peak);
      retries += m.stats.num_alloc_retries;
      if (m.oom) ooms.push_back(fmt::format("rank {} at op {} ({:.2f} GiB requested){}", rank, m.oom->op_id,
                                            static_cast<double>(m.oom->requested_bytes) / (1 << 30),
                                            m.oom->injected ? ", injected by the fault sweep" : ""));
    }
    constexpr double kGiB = 1 << 30;
    out += fmt::format("  peak memory          {:>12.2f} GiB reserved (rank {}), {:.2f} GiB allocated, "
                       "{:.2f} GiB available\n",
                       static_cast<double>(peak_reserved) / kGiB, peak_rank,
                       static_cast<double>(peak_allocated) / kGiB, static_cast<double>(capacity) / kGiB);
    if (retries > 0) out += fmt::format("  alloc retries        {:>12}  (cudaFree + device sync: the allocator is thrashing)\n", retries);
    for (size_t i = 0; i < std::min<size_t>(ooms.size(), 8); ++i) out += "  OUT OF MEMORY: " + ooms[i] + "\n";
    if (ooms.size() > 8) out += fmt::format("  ... and {} more ranks out of memory\n", ooms.size() - 8);
  }
  out += MemoryPhasesText(phases);
  if (result.hung) {
    const HangReport hang = AnalyzeHang(schedule, result);
    out += fmt::format("  HANG: {} rank(s) cannot finish\n", result.blocked.size());
    for (const std::string& line : hang.explanation) out += fmt::format("  WHY: {}\n", line);
    if (hang.watchdog_fires_at_ns >= 0) {
      out += fmt::format("  WATCHDOG: a NCCL watchdog ({} ms timeout) would fire at {:.3f} s on rank {} ({})\n",
                         hang.watchdog_timeout_ns / 1'000'000, static_cast<double>(hang.watchdog_fires_at_ns) * 1e-9,
                         hang.watchdog_rank, hang.watchdog_collective);
    }
    for (size_t i = 0; i < std::min<size_t>(result.blocked.size(), 8); ++i) {
      const BlockedRank& b = result.blocked[i];
      out += fmt::format("    rank {}: host {}\n", b.rank, b.host);
      for (const std::string& s : b.streams) out += fmt::format("      {}\n", s);
    }
  }
  return out;
}

std::array<int64_t, 8> CollectiveBytesPerStep(const Schedule& schedule, int32_t rank) {
  std::array<int64_t, 8> bytes{};
  for (const traces::Op& op : schedule.ProgramOf(rank).ops) {
    if (const auto* coll = std::get_if<traces::CollectiveOp>(&op.payload)) {
      bytes[static_cast<size_t>(coll->type)] += coll->bytes;
    }
  }
  return bytes;
}

namespace {

struct CompareRow {
  std::string name;
  std::string unit;
  std::optional<double> a, b;  // absent: not meaningful (a step that did not complete)
  int precision = 2;
};

struct RunFigures {
  Figures f;
  bool completed = false;
  int64_t peak_reserved = 0, peak_allocated = 0, retries = 0, ooms = 0;
  std::array<int64_t, 8> collective_bytes{};
  double checkpoint_ms = 0;
};

RunFigures FiguresOf(const ComparedRun& run) {
  RunFigures out;
  out.f = ComputeFigures(*run.schedule, *run.setup, *run.result);
  out.completed = !run.result->hung;
  if (run.result->step_ns > 0) out.checkpoint_ms = static_cast<double>(run.result->makespan_ns - run.result->step_ns) * 1e-6;
  for (const RankStats& r : run.result->ranks) {
    out.peak_reserved = std::max(out.peak_reserved, r.memory.stats.reserved_bytes_peak);
    out.peak_allocated = std::max(out.peak_allocated, r.memory.stats.allocated_bytes_peak);
    out.retries += r.memory.stats.num_alloc_retries;
    out.ooms += r.memory.oom ? 1 : 0;
  }
  out.collective_bytes = CollectiveBytesPerStep(*run.schedule, 0);
  return out;
}

}  // namespace

std::string CompareText(const ComparedRun& a, const ComparedRun& b) {
  const RunFigures fa = FiguresOf(a), fb = FiguresOf(b);
  constexpr double kGiB = 1 << 30;
  const auto when = [](bool ok, double v) { return ok ? std::optional<double>(v) : std::nullopt; };
  std::vector<CompareRow> rows = {
      {"step time", "ms", when(fa.completed, fa.f.step_s * 1e3), when(fb.completed, fb.f.step_s * 1e3), 3},
      {"checkpoint after the step", "ms", when(fa.completed, fa.checkpoint_ms), when(fb.completed, fb.checkpoint_ms), 3},
      {"tokens/s per GPU", "", when(fa.completed, fa.f.tokens_per_second_per_gpu),
       when(fb.completed, fb.f.tokens_per_second_per_gpu), 1},
      {"model TFLOP/s per GPU", "", when(fa.completed, fa.f.tflops_per_gpu), when(fb.completed, fb.f.tflops_per_gpu), 1},
      {"MFU", "%", when(fa.completed, 100 * fa.f.mfu), when(fb.completed, 100 * fb.f.mfu), 1},
      {"compute busy", "ms", fa.f.mean_compute_ns * 1e-6, fb.f.mean_compute_ns * 1e-6, 3},
      {"communication", "ms", fa.f.mean_comm_ns * 1e-6, fb.f.mean_comm_ns * 1e-6, 3},
      {"exposed communication", "ms", (fa.f.mean_comm_ns - fa.f.mean_overlap_ns) * 1e-6,
       (fb.f.mean_comm_ns - fb.f.mean_overlap_ns) * 1e-6, 3},
  };
  for (size_t t = 0; t < fa.collective_bytes.size(); ++t) {
    if (fa.collective_bytes[t] == 0 && fb.collective_bytes[t] == 0) continue;
    rows.push_back({fmt::format("{} per step, rank 0", CollectiveTypeName(static_cast<traces::CollectiveType>(t))),
                    "GiB", static_cast<double>(fa.collective_bytes[t]) / kGiB,
                    static_cast<double>(fb.collective_bytes[t]) / kGiB, 3});
  }
  rows.push_back({"peak reserved (max rank)", "GiB", static_cast<double>(fa.peak_reserved) / kGiB,
                  static_cast<double>(fb.peak_reserved) / kGiB, 2});
  rows.push_back({"peak allocated (max rank)", "GiB", static_cast<double>(fa.peak_allocated) / kGiB,
                  static_cast<double>(fb.peak_allocated) / kGiB, 2});
  rows.push_back({"alloc retries", "", static_cast<double>(fa.retries), static_cast<double>(fb.retries), 0});
  rows.push_back({"ranks out of memory", "", static_cast<double>(fa.ooms), static_cast<double>(fb.ooms), 0});

  std::string out;
  out += fmt::format("A: {}\nB: {}\n\n", a.label, b.label);
  out += fmt::format("  {:<38} {:>14} {:>14} {:>14} {:>9}\n", "", "A", "B", "B - A", "B / A");
  const auto cell = [](const std::optional<double>& v, int precision) {
    return v ? fmt::format("{:.{}f}", *v, precision) : std::string("-");
  };
  for (const CompareRow& row : rows) {
    std::string delta = "-", ratio = "-";
    if (row.a && row.b) {
      delta = fmt::format("{:+.{}f}", *row.b - *row.a, row.precision);
      // A ratio to a figure that rounds to zero at the row's precision says nothing.
      if (std::abs(*row.a) >= std::pow(10.0, -row.precision)) ratio = fmt::format("{:.3f}", *row.b / *row.a);
    }
    const std::string name = row.unit.empty() ? row.name : fmt::format("{} ({})", row.name, row.unit);
    out += fmt::format("  {:<38} {:>14} {:>14} {:>14} {:>9}\n", name, cell(row.a, row.precision),
                       cell(row.b, row.precision), delta, ratio);
  }
  if (!fa.completed) out += "  A does not complete the step (out of memory or a hang)\n";
  if (!fb.completed) out += "  B does not complete the step (out of memory or a hang)\n";
  return out;
}

}  // namespace shardscope::sim

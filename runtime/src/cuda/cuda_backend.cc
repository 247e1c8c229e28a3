// The CUDA backend (cuda_backend.h): the job of this process over the runtime core.
//
// Structure. A Job owns the ranks this process drives (one under mpirun, all of them in a
// single process over local GPUs), each a CudaRank (cuda_rank.h: the device adapter, which
// walks its program through the core's RankExecutor on its own host thread), and the core's
// watchdog, exchange of results and report. Setup is phased so that no rank waits in a
// collective for a rank that already failed: local state first (every rank), an agreement that
// all succeeded, then NCCL (collective), then each rank's capacity (what is free once NCCL
// holds its buffers), agreed again.
//
// The CUDA runtime, cuBLASLt and NCCL are opened here, on first use (cuda_api.h LoadCuda),
// never linked.
//
// What the CPU cannot check is marked "GPU:" in comments: this file was compiled, not run, on
// the machine that wrote it (no driver); scripts/gpu/validate_runtime.sh runs it.
#include "shardscope/runtime/cuda_backend.h"

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <mpi.h>
#include <nccl.h>
#include <nlohmann/json.hpp>

#include "cuda/cuda_check.h"
#include "cuda/cuda_rank.h"
#include "cuda/proxy_math.h"
#include "host_timeline.h"
#include "mpi_job.h"
#include "run_result.h"
#include "shardscope/base/file_io.h"
#include "shardscope/runtime/execution_plan.h"
#include "shardscope/sim/report/version.h"
#include "watchdog.h"

namespace shardscope::runtime {

namespace cuda {
namespace {

// The ranks of this process, their watchdog, and the exchange of results.
class Job {
 public:
  Job(const MpiSession& mpi, const traces::Schedule& schedule, const sim::SimulationSetup& setup,
      const CudaRunOptions& options)
      : mpi_(mpi), schedule_(schedule), setup_(setup), options_(options) {}

  StatusOr<RunResult> Run(int32_t device_count) {
    SHARDSCOPE_RETURN_IF_ERROR(watchdog_comm_.Init());
    SHARDSCOPE_RETURN_IF_ERROR(results_comm_.Init());
    SHARDSCOPE_ASSIGN_OR_RETURN(const int32_t local_rank, LocalRank());
    // Phase 1 (local). Every rank of the job reaches the agreement below, so a local failure
    // (no device for this local rank, a bad program, cudaMalloc failing) cannot leave a peer
    // waiting in NCCL initialization.
    Status local = Status::Ok();
    DeviceAssignment assignment;
    if (StatusOr<DeviceAssignment> a =
            AssignDevices(schedule_.world_size(), mpi_.world_size(), local_rank, device_count);
        a.ok()) {
      assignment = std::move(*a);
    } else {
      local = a.status();
    }
    threaded_ = assignment.one_process_drives_all;
    const sim::ClusterCostProvider costs(schedule_, setup_.cluster);
    std::error_code ec;
    if (local.ok()) std::filesystem::create_directories(options_.common.out_dir, ec);
    if (ec) local = Status::IoError(fmt::format("cannot create '{}': {}", options_.common.out_dir, ec.message()));
    for (size_t i = 0; i < assignment.devices.size() && local.ok(); ++i) {
      const int32_t rank = threaded_ ? static_cast<int32_t>(i) : mpi_.rank();
      StatusOr<ExecutionPlan> plan = BuildExecutionPlan(schedule_, rank, schedule_.world_size(), costs);
      if (!plan.ok()) {
        local = plan.status();
        break;
      }
      // The planned capacity; what the rank gets is decided once NCCL holds its buffers.
      const int64_t capacity = options_.common.capacity_bytes >= 0 ? options_.common.capacity_bytes
                                                                   : sim::AllocatorCapacity(setup_, rank);
      ranks_.push_back(std::make_unique<CudaRank>(schedule_, setup_, std::move(*plan), options_,
                                                  assignment.devices[i], capacity));
      local = ranks_.back()->SetupLocal();
    }
    SHARDSCOPE_RETURN_IF_ERROR(AgreeAcrossRanks(local, "failed its setup"));
    // Phase 2: NCCL, already under the watchdog (an initialization that never completes, a
    // peer that died in it, is a hang like any other). The core's watchdog, with progress read
    // from the collectives' CUDA events and every NCCL communicator aborted before MPI_Abort.
    std::vector<RankExecutor*> executors;
    for (auto& r : ranks_) executors.push_back(&r->executor());
    std::optional<MpiPeerChannel> peers;
    if (!threaded_) peers.emplace(watchdog_comm_.get());
    WatchdogConfig config;
    config.timeout_s = options_.common.timeout_s;
    config.stalled_after_finish = false;
    config.log_prefix = "shardscope run: ";
    config.abort_note = "aborted every NCCL communicator; ";
    config.end_job = [] { MPI_Abort(MPI_COMM_WORLD, 1); };
    Watchdog watchdog(std::move(executors), peers ? &*peers : nullptr, std::move(config));
    watchdog.Start();
    if (Status nccl = InitNccl(); !nccl.ok()) {
      watchdog.Stop();
      return nccl;
    }
    // Phase 3 (local, agreed): the schedule's capacity, from what cudaMemGetInfo leaves free.
    Status capacity = Status::Ok();
    for (auto& r : ranks_) {
      if (capacity.ok()) capacity = r->SetScheduleCapacity();
    }
    if (Status agreed = AgreeAcrossRanks(capacity, "has no device memory left for the schedule"); !agreed.ok()) {
      watchdog.Stop();
      return agreed;
    }
    // Run.
    if (threaded_) {
      std::vector<std::thread> threads;
      for (auto& r : ranks_) threads.emplace_back([&r] { r->Run(); });
      for (std::thread& t : threads) t.join();
    } else {
      ranks_[0]->Run();
    }
    StatusOr<RunResult> result = ExchangeAndReport();
    MPI_Barrier(results_comm_.get());
    watchdog.Stop();
    for (auto& r : ranks_) {
      if (!r->error().ok()) return r->error();
    }
    return result;
  }

 private:
  StatusOr<int32_t> LocalRank() {
    if (std::optional<int32_t> env =
            LocalRankFromEnvironment([](const char* n) -> const char* { return std::getenv(n); })) {
      return *env;
    }
    // No launcher variable: the rank within the processes sharing this node's memory.
    MPI_Comm node = MPI_COMM_NULL;
    SHARDSCOPE_RETURN_IF_ERROR(MpiStatus(
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, mpi_.rank(), MPI_INFO_NULL, &node),
        "MPI_Comm_split_type"));
    int local = 0;
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    return local;
  }

  Status InitNccl() {
    // NCCL connects peers at communicator creation rather than in a communicator's first
    // collective (NCCL_RUNTIME_CONNECT, NCCL >= 2.22, default 1: "dynamically connect peers
    // during runtime"), so its buffers exist when phase 3 reads cudaMemGetInfo and no step
    // pays for connection setup. A value the user set wins. TensorRT-LLM does the same for its
    // memory estimate (cpp/tensorrt_llm/plugins/ncclPlugin/sendPlugin.cpp, SendPlugin::initialize).
    setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
    const int32_t world = schedule_.world_size();
    if (threaded_) {
      std::vector<ncclComm_t> comms(static_cast<size_t>(world), nullptr);
      std::vector<int> devices;
      for (auto& r : ranks_) devices.push_back(r->device());
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().ncclCommInitAll(comms.data(), world, devices.data()));
      for (size_t i = 0; i < ranks_.size(); ++i) ranks_[i]->SetWorld(comms[i]);
    } else {
      // The world communicator from a unique id rank 0 creates and MPI broadcasts (NCCL docs,
      // "Creating a communicator with options" / the MPI example).
      ncclUniqueId id{};
      if (mpi_.rank() == 0) SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().ncclGetUniqueId(&id));
      SHARDSCOPE_RETURN_IF_ERROR(
          MpiStatus(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast(ncclUniqueId)"));
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().cudaSetDevice(ranks_[0]->device()));
      ncclComm_t c = nullptr;
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().ncclCommInitRank(&c, world, id, mpi_.rank()));
      ranks_[0]->SetWorld(c);
    }
    // One split per schedule communicator, in index order, every rank (collective over the
    // world); several ranks of one thread split inside a group (NCCL docs, ncclCommSplit).
    std::vector<std::vector<ncclComm_t>> split(ranks_.size(),
                                               std::vector<ncclComm_t>(schedule_.communicators.size(), nullptr));
    for (size_t c = 0; c < schedule_.communicators.size(); ++c) {
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().ncclGroupStart());
      Status status = Status::Ok();
      for (size_t r = 0; r < ranks_.size() && status.ok(); ++r) {
        status = ranks_[r]->Split(ranks_[r]->plan().communicators[c], &split[r][c]);
      }
      SHARDSCOPE_CUDA_RETURN_IF_ERROR(Cuda().ncclGroupEnd());
      SHARDSCOPE_RETURN_IF_ERROR(status);
    }
    for (size_t r = 0; r < ranks_.size(); ++r) ranks_[r]->AdoptComms(split[r]);
    return Status::Ok();
  }

  // ---- Results: every rank's record and host-side timeline to rank 0 (host_timeline.h),
  // then rank 0 writes report.json and host_timeline.json.
  StatusOr<RunResult> ExchangeAndReport() {
    std::vector<LocalRankOutput> local;
    for (auto& r : ranks_) {
      LocalRankOutput out{r->executor().Result(), {}};
      AppendFlattened(r->executor().host_slices(), out.slices);
      local.push_back(std::move(out));
    }
    const int32_t replays = options_.cuda_graph ? options_.graph_replays : 0;
    SHARDSCOPE_ASSIGN_OR_RETURN(
        ExchangedResults exchanged,
        ExchangeResults(threaded_ ? MPI_COMM_NULL : results_comm_.get(), std::move(local), options_.common.steps,
                        replays));
    if (mpi_.rank() != 0) {
      RunResult result;
      result.completed = exchanged.ranks[0].finished;
      return result;
    }
    RunResult result = RunResultOf(exchanged.ranks);
    result.summary = SummaryText(exchanged.ranks);
    const std::filesystem::path dir(options_.common.out_dir);
    SHARDSCOPE_RETURN_IF_ERROR(
        traces::WriteFileAtomically((dir / "report.json").string(), ReportJson(exchanged.ranks)));
    SHARDSCOPE_RETURN_IF_ERROR(WriteHostTimeline((dir / "host_timeline.json").string(), schedule_, exchanged.timeline,
                                                 fmt::format("shardscope {} run --backend cuda", sim::Version()),
                                                 "nccl"));
    return result;
  }

  std::string SummaryText(const std::vector<RankResult>& ranks) const {
    const int64_t step = SlowestMedianStep(ranks), graph = SlowestMedianGraphStep(ranks);
    std::string text = fmt::format("{}: ran {} rank(s) on the CUDA backend ({}), {} warm-up + {} measured step(s)\n",
                                   options_.common.source, schedule_.world_size(), ranks_[0]->device_name(),
                                   options_.common.warmup, options_.common.steps);
    text +=
        fmt::format("  step (median, slowest rank)  {:>12.3f} ms (CUDA events)\n", static_cast<double>(step) * 1e-6);
    if (options_.cuda_graph) {
      text += fmt::format("  CUDA graph replay            {:>12.3f} ms (eager / graph = {:.3f})\n",
                          static_cast<double>(graph) * 1e-6,
                          graph > 0 ? static_cast<double>(step) / static_cast<double>(graph) : 0.0);
    }
    text += fmt::format("  peak reserved                {:>12} bytes (the simulator's allocator policy)\n",
                        LargestPeakReserved(ranks));
    for (const RankResult& r : ranks) {
      if (r.planned_capacity > r.capacity) {
        text += fmt::format("  rank {}: capacity {} bytes, not the simulator's {}: cudaMemGetInfo left {} free once "
                            "the CUDA context, proxy operands and NCCL held theirs\n",
                            &r - ranks.data(), r.capacity, r.planned_capacity, r.meminfo_free_after_setup);
      }
    }
    return text + OomSummaryLines(ranks);
  }

  std::string ReportJson(const std::vector<RankResult>& ranks) const {
    std::set<std::string> notes;
    for (const auto& r : ranks_) notes.insert(r->notes().begin(), r->notes().end());
    const nlohmann::ordered_json runtime = {
        {"backend", "cuda"},
        {"device_name", ranks_[0]->device_name()},
        {"processes", threaded_ ? "one process, one host thread per GPU" : "one process per GPU (MPI)"},
        {"note", "kernels are proxies of the schedule's shapes (cuBLASLt GEMMs, attention as two batched "
                 "GEMMs and a memory pass, 16-byte stream kernels, %globaltimer spins); step times from "
                 "CUDA events"},
        {"proxy_substitutions", std::vector<std::string>(notes.begin(), notes.end())},
        {"steps", options_.common.steps},
        {"warmup", options_.common.warmup},
        {"cuda_graph", options_.cuda_graph},
        {"timeout_s", options_.common.timeout_s}};
    // CUDA-only, per rank: the device, what cudaMemGetInfo said once setup was done (CUDA
    // context, proxy operands, NCCL's buffers held; the schedule's capacity is the smaller of
    // its free bytes and the simulator's capacity_planned_bytes), the proxy operands' own
    // pool, and the CUDA-graph replays.
    auto extras = [this](const RankResult& r, nlohmann::ordered_json& rank) {
      rank["device"] = r.device;
      rank["capacity_planned_bytes"] = r.planned_capacity;
      rank["device_backing_bytes"] = r.device_backing;
      rank["mem_get_info_after_setup"] = {{"free_bytes", r.meminfo_free_after_setup},
                                          {"total_bytes", r.meminfo_total}};
      rank["operand_reserved_bytes"] = r.operand_reserved;
      if (options_.cuda_graph) rank["graph_step_times_ns"] = r.graph_times;
    };
    return RunReportJson(schedule_, setup_, options_.common.source, ranks, runtime, extras);
  }

  const MpiSession& mpi_;
  const traces::Schedule& schedule_;
  const sim::SimulationSetup& setup_;
  const CudaRunOptions& options_;
  bool threaded_ = false;
  MpiWorldDup watchdog_comm_, results_comm_;
  std::vector<std::unique_ptr<CudaRank>> ranks_;
};

}  // namespace
}  // namespace cuda

bool CudaBackendBuilt() { return true; }

StatusOr<int32_t> CudaDeviceCount() {
  SHARDSCOPE_RETURN_IF_ERROR(cuda::LoadCuda());
  using cuda::Cuda;
  int count = 0;
  const cudaError_t e = Cuda().cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)Cuda().cudaGetLastError();
    return Status::InvalidInput(cuda::NoDeviceMessage(Cuda().cudaGetErrorString(e)));
  }
  if (count <= 0) return Status::InvalidInput(cuda::NoDeviceMessage("cudaGetDeviceCount found 0 devices"));
  return static_cast<int32_t>(count);
}

StatusOr<RunResult> RunCudaBackend(const MpiSession& mpi, const traces::Schedule& schedule,
                                   const sim::SimulationSetup& setup, const CudaRunOptions& options) {
  SHARDSCOPE_RETURN_IF_ERROR(CheckCudaRunOptions(options));
  SHARDSCOPE_ASSIGN_OR_RETURN(const int32_t devices, CudaDeviceCount());
  cuda::Job job(mpi, schedule, setup, options);
  return job.Run(devices);
}

}  // namespace shardscope::runtime

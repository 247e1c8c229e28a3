// `shardscope run PLAN|SCHEDULE -o DIR`: executes the schedule, one process per rank under
// mpirun. The host backend (runtime/host_backend.h) runs it without a GPU: execution semantics
// (streams, events, collectives on real buffers, the allocator policy, hangs), not performance.
// The CUDA backend (runtime/cuda_backend.h) runs it on GPUs: CUDA streams, NCCL, proxy kernels.
// MPI is initialized only here, after the arguments parsed; without mpirun the job is one rank
// (MPI's singleton init), or, with --backend cuda, one process driving every local GPU.
#include <cmath>
#include <iostream>
#include <memory>
#include <string>
#include <variant>

#include <fmt/format.h>

#include "commands.h"
#include "inputs.h"
#include "shardscope/runtime/cuda_backend.h"
#include "shardscope/runtime/host_backend.h"

namespace shardscope::cli {

StatusOr<std::optional<sim::InjectedOom>> ParseInjectedOom(const std::string& spec, const traces::Schedule& schedule) {
  if (spec.empty()) return std::optional<sim::InjectedOom>();
  const auto bad = [&](std::string_view why) {
    return Status::InvalidInput(fmt::format("--inject-oom: expected RANK:OP_ID, the id of an allocate op in that "
                                            "rank's program (shardscope schedule --listing --rank RANK shows them), "
                                            "got '{}': {}",
                                            spec, why));
  };
  const size_t colon = spec.find(':');
  if (colon == std::string::npos) return bad("no ':'");
  int64_t rank = -1, op_id = -1;
  try {
    size_t used = 0;
    const std::string rank_text = spec.substr(0, colon), op_text = spec.substr(colon + 1);
    rank = std::stoll(rank_text, &used);
    if (used != rank_text.size()) return bad("RANK is not an integer");
    op_id = std::stoll(op_text, &used);
    if (used != op_text.size()) return bad("OP_ID is not an integer");
  } catch (const std::exception&) {
    return bad("not integers");
  }
  if (rank < 0 || rank >= schedule.world_size()) {
    return bad(fmt::format("rank outside the world of {} ranks", schedule.world_size()));
  }
  const traces::Program& program = schedule.ProgramOf(static_cast<int32_t>(rank));
  for (const traces::Op& op : program.ops) {
    if (op.id != op_id) continue;
    if (!std::holds_alternative<traces::AllocateOp>(op.payload)) {
      return bad(fmt::format("op {} is a {}, not an allocate", op_id, traces::OpKindName(op.payload)));
    }
    return std::optional<sim::InjectedOom>(sim::InjectedOom{static_cast<int32_t>(rank), op_id});
  }
  return bad(fmt::format("rank {}'s program ('{}') has no op {}", rank, program.name, op_id));
}

namespace {

struct RunCommandOptions {
  std::string input;
  std::string out_dir = "shardscope-run";
  std::string backend = "host";
  int32_t steps = 2;
  int32_t warmup = 1;
  double timeout_s = 300;
  double time_scale = 0.001;
  std::string inject_oom;
  double device_memory_gb = 0;  // 0: the schedule's GPU
  bool cuda_graph = false;
  bool quiet = false;
};

Status RunRun(const RunCommandOptions& options) {
  if (options.backend != "host" && options.backend != "cuda") {
    return Status::InvalidInput(fmt::format("--backend: expected 'host' or 'cuda', got '{}'", options.backend));
  }
  const bool cuda = options.backend == "cuda";
  if (options.cuda_graph && !cuda) return Status::InvalidInput("--cuda-graph needs --backend cuda");
  if (cuda) {
    // Before anything is read or written: a machine without a driver or a device (or a build
    // without the backend) fails here with "no CUDA device: <cuda error>" and writes nothing.
    SHARDSCOPE_RETURN_IF_ERROR(runtime::CudaDeviceCount().status());
  }
  constexpr double kBytesPerGiB = double(int64_t{1} << 30);
  if (!(options.device_memory_gb >= 0) || options.device_memory_gb * kBytesPerGiB > 9.0e18) {
    return Status::InvalidInput(
        fmt::format("--device-memory-gb: expected a non-negative number of GiB, got {}", options.device_memory_gb));
  }
  // Every rank loads and checks the input the same way, so bad input fails on all of them
  // before any collective.
  SHARDSCOPE_ASSIGN_OR_RETURN(LoadedInput loaded, LoadInput(options.input));
  runtime::RunOptions run;
  run.source = options.input;
  run.out_dir = options.out_dir;
  run.steps = options.steps;
  run.warmup = options.warmup;
  run.timeout_s = options.timeout_s;
  run.time_scale = options.time_scale;
  run.quiet = options.quiet;
  if (options.device_memory_gb > 0) run.capacity_bytes = std::llround(options.device_memory_gb * kBytesPerGiB);
  SHARDSCOPE_ASSIGN_OR_RETURN(run.inject_oom, ParseInjectedOom(options.inject_oom, loaded.schedule));

  SHARDSCOPE_ASSIGN_OR_RETURN(std::unique_ptr<runtime::MpiSession> mpi, runtime::MpiSession::Init());
  if (mpi->rank() == 0 && !options.quiet) {
    std::cerr << fmt::format("shardscope: running {} on {} process(es), {} backend\n", options.input,
                             mpi->world_size(), options.backend);
  }
  runtime::RunResult result;
  if (cuda) {
    runtime::CudaRunOptions cuda_run;
    cuda_run.common = run;
    cuda_run.cuda_graph = options.cuda_graph;
    SHARDSCOPE_ASSIGN_OR_RETURN(result, runtime::RunCudaBackend(*mpi, loaded.schedule, loaded.setup, cuda_run));
  } else {
    SHARDSCOPE_ASSIGN_OR_RETURN(result, runtime::RunHostBackend(*mpi, loaded.schedule, loaded.setup, run));
  }
  if (mpi->rank() == 0) {
    std::cout << result.summary;
    std::cout << (cuda ? fmt::format("  wrote {}/report.json\n", options.out_dir)
                       : fmt::format("  wrote {0}/report.json and {0}/host_timeline.json\n", options.out_dir));
  }
  if (!result.oom_ranks.empty() || !result.completed) {
    return Status::Internal(mpi->rank() == 0 ? "the run did not complete: a rank ran out of memory"
                                             : "the run did not complete");
  }
  return Status::Ok();
}

}  // namespace

CommandRunner AddRunCommand(CLI::App& app) {
  auto options = std::make_shared<RunCommandOptions>();
  CLI::App* cmd = app.add_subcommand(
      "run",
      "Execute a plan or schedule, one process per rank under mpirun (mpirun -np N shardscope run ...). "
      "--backend host runs it without a GPU: streams as threads, MPI collectives on host buffers, the simulator's "
      "allocator policy, kernels busy-waiting their predicted time x --time-scale. It checks execution semantics "
      "(ordering, collectives, memory, hangs), not performance. --backend cuda runs it on GPUs with proxy kernels of "
      "the schedule's shapes and NCCL. Writes DIR/report.json (and, host backend, DIR/host_timeline.json); a hang "
      "writes DIR/flight_recorder/rank_<r>.json and aborts the job");
  cmd->add_option("input", options->input, "Plan YAML or schedule JSON")->required()->check(CLI::ExistingFile);
  cmd->add_option("-o,--output", options->out_dir, "Output directory")->capture_default_str();
  cmd->add_option("--backend", options->backend,
                  "host (MPI + threads, no GPU) or cuda (CUDA streams, NCCL, proxy kernels; one process per GPU "
                  "under mpirun, or one process over every local GPU)")
      ->capture_default_str();
  cmd->add_flag("--cuda-graph", options->cuda_graph,
                "--backend cuda: also capture one step in a CUDA graph and replay it (eager vs replay step times)");
  cmd->add_option("--steps", options->steps, "Measured steps")->capture_default_str();
  cmd->add_option("--warmup", options->warmup, "Steps run before the measured ones")->capture_default_str();
  cmd->add_option("--timeout", options->timeout_s,
                  "Watchdog: seconds without any op completing on a rank before it dumps its flight recorder and "
                  "aborts the job")
      ->capture_default_str();
  cmd->add_option("--time-scale", options->time_scale,
                  "Kernels, copies and host work busy-wait the simulator's predicted duration x this")
      ->capture_default_str();
  cmd->add_option("--inject-oom", options->inject_oom,
                  "RANK:OP_ID: that allocate op fails as an out-of-memory in the first measured step; the rank stops "
                  "(OOM policy raise), as in `shardscope simulate --inject-oom`");
  cmd->add_option("--device-memory-gb", options->device_memory_gb,
                  "Allocator capacity per rank in GiB (default: the schedule's GPU memory minus the CUDA context)");
  cmd->add_flag("-q,--quiet", options->quiet, "No progress messages on stderr");
  return [cmd, options]() -> std::optional<Status> {
    if (!*cmd) return std::nullopt;
    return RunRun(*options);
  };
}

}  // namespace shardscope::cli

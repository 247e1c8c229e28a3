// The host backend: executes a schedule with one process per rank under mpirun, without a GPU.
//
// It reproduces the schedule's execution semantics, not its performance: each CUDA stream is
// a worker thread with a FIFO queue, events are host-side completion flags (a wait waits for
// the most recent record enqueued before it, as cudaStreamWaitEvent does), host
// synchronizations block the host thread, collectives are MPI collectives on real host
// buffers of the schedule's size and dtype (one MPI communicator per schedule communicator,
// serialized per communicator in issue order as NCCL does), allocations go through the
// simulator's caching-allocator policy over host memory (so an out-of-memory happens where the
// simulator says it does), and kernels and copies busy-wait for the simulator's predicted
// duration times a time scale. A watchdog dumps a Flight-Recorder-style JSON per rank and
// aborts the job when no op completes for a timeout: a hang never hangs the job forever.
//
//   SHARDSCOPE_ASSIGN_OR_RETURN(auto mpi, MpiSession::Init());
//   SHARDSCOPE_ASSIGN_OR_RETURN(RunResult r, RunHostBackend(*mpi, schedule, setup, options));
//
// docs/RUNTIME.md has the long form. MPI stays out of this header.
#ifndef SHARDSCOPE_RUNTIME_HOST_BACKEND_H_
#define SHARDSCOPE_RUNTIME_HOST_BACKEND_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardscope/runtime/op_hooks.h"
#include "shardscope/sim/engine/engine.h"
#include "shardscope/sim/report/report.h"
#include "shardscope/traces/schedule.h"
#include "shardscope/base/status.h"

namespace shardscope::runtime {

// MPI for the lifetime of the object: MPI_Init_thread(MPI_THREAD_MULTIPLE) (stream threads
// call MPI concurrently on different communicators) and MPI_Finalize in the destructor.
// Launched without mpirun, MPI starts as a singleton: world size 1. One per process.
class MpiSession {
 public:
  static StatusOr<std::unique_ptr<MpiSession>> Init();
  ~MpiSession();  // MPI_Finalize; never throws
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int32_t rank() const { return rank_; }
  int32_t world_size() const { return world_size_; }
  // Collective over MPI_COMM_WORLD: rank 0 receives every rank's string, in rank order;
  // other ranks get an empty vector.
  StatusOr<std::vector<std::string>> GatherToRankZero(const std::string& mine) const;
  // Collective over MPI_COMM_WORLD: true on every rank when `mine` is true on every rank (an
  // MPI_Allreduce MIN), so a decision one rank cannot carry out is no rank's alone.
  StatusOr<bool> AllRanks(bool mine) const;

 private:
  MpiSession(int32_t rank, int32_t world_size) : rank_(rank), world_size_(world_size) {}
  int32_t rank_ = 0;
  int32_t world_size_ = 1;
};

struct RunOptions {
  std::string source;           // the input file, for the report
  std::string out_dir;          // report.json, host_timeline.json, flight_recorder/
  int32_t steps = 2;            // measured steps
  int32_t warmup = 1;           // steps run before them (the allocator warms up)
  double timeout_s = 300;       // watchdog: no op completed on this rank for this long
  double time_scale = 0.001;    // kernels / copies / host work busy-wait predicted ns x this
  // The fault of `shardscope check` / `simulate --inject-oom`: that allocate op fails as an
  // out-of-memory on that rank in the first measured step. The rank stops (the raise policy).
  std::optional<sim::InjectedOom> inject_oom;
  int64_t capacity_bytes = -1;  // the allocator's device capacity; -1: the schedule's
  bool quiet = false;           // no progress lines on stderr
  OpHooks hooks;                // called around every op's issue (both backends)
};

// What rank 0 learns at the end of a run that did not hang (a hang aborts the job instead).
struct RunResult {
  bool completed = false;       // every rank ran every step
  std::vector<int32_t> oom_ranks;
  std::string summary;          // rank 0: the lines `shardscope run` prints; empty elsewhere
};

// Runs this process's rank. Every rank must call it with the same schedule and options.
// Errors detected before any collective (bad world size, bad options) are returned the same
// on every rank. Rank 0 writes DIR/report.json and DIR/host_timeline.json; a watchdog timeout
// writes DIR/flight_recorder/rank_<r>.json on every rank that can and ends the job with
// MPI_Abort (exit code non-zero), without returning.
StatusOr<RunResult> RunHostBackend(const MpiSession& mpi, const traces::Schedule& schedule,
                                   const sim::SimulationSetup& setup, const RunOptions& options);

}  // namespace shardscope::runtime

#endif  // SHARDSCOPE_RUNTIME_HOST_BACKEND_H_

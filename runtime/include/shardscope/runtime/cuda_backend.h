// The CUDA backend: executes a schedule on GPUs with real CUDA streams and events, NCCL
// collectives and proxy kernels of the schedule's shapes, its memory going through the
// simulator's caching-allocator policy over cudaMalloc.
//
// One process per GPU under mpirun (the local rank picks the device), or, without mpirun, one
// process driving every local GPU (one host thread per rank, communicators from
// ncclCommInitAll). Each rank's host thread issues its program eagerly in program order
// (or, with cuda_graph, captures one step into a CUDA graph and replays it), every op inside
// an NVTX range whose payload is its op id and between the OpHooks of the run options. GEMMs
// run through cuBLASLt (the heuristic's best algorithm, cached per shape), attention as its
// two batched GEMMs plus a memory pass, memory-bound kernels as a 16-byte-vector stream
// kernel, fixed durations as a %globaltimer spin kernel, host work as a calibrated busy-wait.
// The watchdog is the host backend's (Flight Recorder dump, then ncclCommAbort of every
// communicator, then MPI_Abort). docs/RUNTIME.md has the long form.
//
//   SHARDSCOPE_ASSIGN_OR_RETURN(int devices, CudaDeviceCount());   // "no CUDA device: ..."
//   SHARDSCOPE_ASSIGN_OR_RETURN(auto mpi, MpiSession::Init());
//   SHARDSCOPE_ASSIGN_OR_RETURN(RunResult r, RunCudaBackend(*mpi, schedule, setup, options));
//
// No CUDA, NCCL or MPI type appears here: a build without CUDA (SHARDSCOPE_HAVE_CUDA off) has
// the same declarations, and every call fails with kInvalidInput ("this build has no CUDA backend").
#ifndef SHARDSCOPE_RUNTIME_CUDA_BACKEND_H_
#define SHARDSCOPE_RUNTIME_CUDA_BACKEND_H_

#include <cstdint>

#include "shardscope/runtime/host_backend.h"
#include "shardscope/sim/report/report.h"
#include "shardscope/traces/schedule.h"
#include "shardscope/base/status.h"

namespace shardscope::runtime {

struct CudaRunOptions {
  RunOptions common;         // time_scale is ignored: kernels take their real time
  bool cuda_graph = false;   // also capture one step in a CUDA graph and replay it (report:
                             // runtime.graph_step_times_ns, eager vs replay)
  int32_t graph_replays = 3; // replays measured with cuda_graph
};

// True when this build has the CUDA backend (SHARDSCOPE_HAVE_CUDA).
bool CudaBackendBuilt();

// The options' own errors (kInvalidInput), checked before anything touches a device, in every
// build: steps >= 1; at least one warm-up step (the first step on a GPU loads the kernels'
// modules lazily (CUDA_MODULE_LOADING=LAZY, the default since CUDA 12.2), NCCL connects its
// point-to-point peers and cuBLASLt loads its kernels: a measured first step would time all
// that, so `--warmup 0` is refused); a timeout in (0, 1e6] s; graph replays >= 1 with
// cuda_graph.
Status CheckCudaRunOptions(const CudaRunOptions& options);

// The number of CUDA devices this process sees. Opens the CUDA runtime, cuBLASLt and NCCL
// first (never linked: the binary runs without them); fails with kInvalidInput naming the
// library a machine lacks, "no CUDA device: <cudaGetErrorString>" when cudaGetDeviceCount
// fails (no driver, no device) or finds none; in a build without CUDA, "this build has no
// CUDA backend". Never crashes.
StatusOr<int32_t> CudaDeviceCount();

// Runs the job's ranks of this process (one under mpirun; all of them in a single process
// driving every local GPU). Every rank must call it with the same schedule and options.
// Rank 0 writes DIR/report.json (the host backend's keys, plus per rank the CUDA-event step
// times and cudaMemGetInfo at the allocator's peak); a watchdog timeout dumps
// DIR/flight_recorder/rank_<r>.json, aborts every NCCL communicator and ends the job with
// MPI_Abort, without returning.
StatusOr<RunResult> RunCudaBackend(const MpiSession& mpi, const traces::Schedule& schedule,
                                   const sim::SimulationSetup& setup, const CudaRunOptions& options);

}  // namespace shardscope::runtime

#endif  // SHARDSCOPE_RUNTIME_CUDA_BACKEND_H_

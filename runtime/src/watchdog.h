// The runtime's watchdog, written once for both backends: ProcessGroupNCCL's watchdog
// (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp watchdogHandler) times out the oldest
// unfinished work after `timeout`; with TORCH_NCCL_DUMP_ON_TIMEOUT the rank that times out
// writes its Flight Recorder dump and signals the others, through the store, to dump theirs
// before the job is torn down. Here: no op completed on a rank of this process for the
// timeout -> send its progress to every peer process (which is also the "dump now" signal),
// collect theirs for a grace period (to name the missing ranks), write the dumps, wait for the
// peers' "dumped" notes, abort the device's collectives, then end the job. A process that
// receives the signal does the same but leaves the end to the first one (and ends the job
// itself if that never comes). When every rank of the job is in this process (the CUDA
// backend over local GPUs, tests) there are no peers to wait for.
//
// A rank that failed (RankExecutor::failed: a device error such as a failed event query or
// NCCL's asynchronous error, or its host thread ending with an error) starts the same
// sequence at once, its error as the reason, instead of leaving its peers waiting in their
// next collective until the timeout (ProcessGroupNCCL's TORCH_NCCL_ASYNC_ERROR_HANDLING:
// the watchdog aborts the communicators and tears the process down on an NCCL error).
//
//   Watchdog watchdog({&executor}, &mpi_channel, config);   // or nullptr: no peer process
//   watchdog.Start();  ...  watchdog.Stop();                 // Stop: only once no rank can hang
#ifndef SHARDSCOPE_RUNTIME_SRC_WATCHDOG_H_
#define SHARDSCOPE_RUNTIME_SRC_WATCHDOG_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "rank_executor.h"

namespace shardscope::runtime {

// The side channel between processes of the job (an MPI communicator of its own:
// mpi_channel.h). Non-blocking; called from the watchdog thread only.
class PeerChannel {
 public:
  struct Message {
    int32_t source = 0;
    bool dumped = false;          // a "dumped" note, else a progress state (a "dump now" signal)
    std::vector<int64_t> state;
  };
  virtual ~PeerChannel() = default;
  virtual int32_t rank() const = 0;
  virtual int32_t world_size() const = 0;
  virtual void SendStateToAll(const std::vector<int64_t>& state) = 0;
  virtual void SendDumpedToAll() = 0;
  virtual std::vector<Message> Receive() = 0;  // every message waiting, in arrival order
};

struct WatchdogConfig {
  double timeout_s = 300;
  // The host backend counts a rank that finished its program (waiting for its peers in the
  // exchange of results) as stalled like any other; the CUDA backend only while collectives
  // it issued are still pending on the device.
  bool stalled_after_finish = true;
  std::string log_prefix = "shardscope run: ";  // "shardscope run: rank 3: " for one rank per process
  std::string abort_note;                       // before "aborting the job (hang)"
  // Ends the job (MPI_Abort). Does not return in a real run; a test's returns and the
  // watchdog then stops.
  std::function<void()> end_job;
};

class Watchdog {
 public:
  Watchdog(std::vector<RankExecutor*> ranks, PeerChannel* peers, WatchdogConfig config)
      : ranks_(std::move(ranks)), peers_(peers), config_(std::move(config)) {}
  ~Watchdog() { Stop(); }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void Start();
  // Waits for the thread; a watchdog that is dumping goes on until it ends the job.
  void Stop();

 private:
  void Loop();
  bool Stalled(int64_t timeout_ns) const;
  // The first failed rank's error as a dump reason, or "" when none failed.
  std::string FailureReason();

  std::vector<RankExecutor*> ranks_;
  PeerChannel* peers_;
  WatchdogConfig config_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace shardscope::runtime

#endif  // SHARDSCOPE_RUNTIME_SRC_WATCHDOG_H_

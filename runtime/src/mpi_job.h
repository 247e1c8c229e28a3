// What both backends do with MPI around the runtime core: MPI results as Status, the
// watchdog's side channel between processes (its own duplicate of MPI_COMM_WORLD), and the
// exchange of results: every rank's result record and host-timeline slices to rank 0 (over
// MPI, or by concatenation when this process runs every rank).
#ifndef SHARDSCOPE_RUNTIME_SRC_MPI_JOB_H_
#define SHARDSCOPE_RUNTIME_SRC_MPI_JOB_H_

#include <mpi.h>

#include <cstdint>
#include <deque>
#include <string_view>
#include <vector>

#include "host_timeline.h"
#include "mpi_status.h"
#include "run_result.h"
#include "shardscope/base/status.h"
#include "watchdog.h"

namespace shardscope::runtime {

// A communicator for one purpose: MPI_Comm_dup(MPI_COMM_WORLD) on Init, freed on destruction.
class MpiWorldDup {
 public:
  MpiWorldDup() = default;
  ~MpiWorldDup();
  MpiWorldDup(const MpiWorldDup&) = delete;
  MpiWorldDup& operator=(const MpiWorldDup&) = delete;
  Status Init();
  MPI_Comm get() const { return comm_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

// The watchdog's side channel over `comm` (a duplicate of the world: its messages never mix
// with the run's). Tag 1 carries a rank's progress per communicator (also "dump now"), tag 2
// "I wrote my dump".
class MpiPeerChannel final : public PeerChannel {
 public:
  explicit MpiPeerChannel(MPI_Comm comm);
  int32_t rank() const override { return rank_; }
  int32_t world_size() const override { return world_; }
  void SendStateToAll(const std::vector<int64_t>& state) override;
  void SendDumpedToAll() override;
  std::vector<Message> Receive() override;

 private:
  MPI_Comm comm_;
  int32_t rank_ = 0, world_ = 1;
  std::deque<std::vector<int64_t>> sent_;  // buffers of pending sends (never freed before MPI_Abort)
  std::vector<MPI_Request> requests_;
};

// Every process learns whether all of them succeeded (MPI_Allreduce MIN of a flag over
// MPI_COMM_WORLD), so no process goes on into a collective that a failed peer will never
// reach. Returns `local` when it failed (its own message), kInvalidInput "another rank
// <what_failed> (its message says why)" when only a peer failed, Ok when all succeeded.
Status AgreeAcrossRanks(const Status& local, std::string_view what_failed);

struct LocalRankOutput {
  RankResult result;
  std::vector<int64_t> slices;  // flattened SliceRecords (host_timeline_slices.h)
};

struct ExchangedResults {
  std::vector<RankResult> ranks;  // rank 0 of the job: every rank, in rank order; else this process's
  TimelineSlices timeline;        // rank 0 of the job: every rank's slices
};

// Collective over `comm` when it is not MPI_COMM_NULL (one local rank per process); with
// MPI_COMM_NULL `local` holds every rank of the job, in rank order.
StatusOr<ExchangedResults> ExchangeResults(MPI_Comm comm, std::vector<LocalRankOutput> local, int32_t steps,
                                           int32_t replays);

}  // namespace shardscope::runtime

#endif  // SHARDSCOPE_RUNTIME_SRC_MPI_JOB_H_

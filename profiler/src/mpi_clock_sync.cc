// SyncClockToRankZeroOverMpi: the MPI transport of MeasureClockOffset (clock_alignment.h).
#include <fmt/format.h>

#include "shardscope/profiler/clock_alignment.h"

#if defined(SHARDSCOPE_HAVE_MPI)
#include <mpi.h>
#endif

namespace shardscope::profiler {

#if !defined(SHARDSCOPE_HAVE_MPI)

StatusOr<ClockOffsetEstimate> SyncClockToRankZeroOverMpi(int32_t, const std::function<int64_t()>&) {
  return Status::Internal("clock sync over MPI: shardscope was built without MPI");
}

#else

namespace {

constexpr int kPingTag = 1;
constexpr int kReplyTag = 2;

Status MpiCheck(int result, const char* call) {
  if (result == MPI_SUCCESS) return Status::Ok();
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(result, text, &length);
  return Status::Internal(fmt::format("{} failed: {} at {}", call, std::string(text, static_cast<size_t>(length)),
                                      __FILE__));
}

}  // namespace

StatusOr<ClockOffsetEstimate> SyncClockToRankZeroOverMpi(int32_t rounds, const std::function<int64_t()>& now_ns) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return Status::Internal("clock sync over MPI: MPI is not initialized");
  if (rounds < 1) return Status::InvalidInput(fmt::format("clock sync: expected at least 1 round, got {}", rounds));
  // A private communicator: the exchange cannot match any other message of the job.
  MPI_Comm comm = MPI_COMM_NULL;
  SHARDSCOPE_RETURN_IF_ERROR(MpiCheck(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup"));
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  StatusOr<ClockOffsetEstimate> result = ClockOffsetEstimate{0, 0, -1};
  if (rank == 0) {
    // Peers in rank order, each for all its rounds: one peer's exchange never queues behind
    // another's, so its round trips measure the network, not rank 0's backlog.
    for (int peer = 1; peer < size && result.ok(); ++peer) {
      for (int32_t round = 0; round < rounds; ++round) {
        char ping = 0;
        Status received = MpiCheck(MPI_Recv(&ping, 1, MPI_CHAR, peer, kPingTag, comm, MPI_STATUS_IGNORE), "MPI_Recv");
        if (!received.ok()) {
          result = received;
          break;
        }
        const int64_t t1 = now_ns();
        Status sent = MpiCheck(MPI_Send(&t1, 1, MPI_INT64_T, peer, kReplyTag, comm), "MPI_Send");
        if (!sent.ok()) {
          result = sent;
          break;
        }
      }
    }
  } else {
    ClockSyncTransport transport;
    transport.now_ns = now_ns;
    transport.ping_reference = [comm]() -> StatusOr<int64_t> {
      char ping = 0;
      SHARDSCOPE_RETURN_IF_ERROR(MpiCheck(MPI_Send(&ping, 1, MPI_CHAR, 0, kPingTag, comm), "MPI_Send"));
      int64_t t1 = 0;
      SHARDSCOPE_RETURN_IF_ERROR(
          MpiCheck(MPI_Recv(&t1, 1, MPI_INT64_T, 0, kReplyTag, comm, MPI_STATUS_IGNORE), "MPI_Recv"));
      return t1;
    };
    result = MeasureClockOffset(transport, rounds);
  }
  MPI_Comm_free(&comm);
  return result;
}

#endif  // SHARDSCOPE_HAVE_MPI

}  // namespace shardscope::profiler

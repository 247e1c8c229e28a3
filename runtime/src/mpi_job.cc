#include "mpi_job.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

namespace shardscope::runtime {

MpiWorldDup::~MpiWorldDup() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

Status MpiWorldDup::Init() { return MpiStatus(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup"); }

Status AgreeAcrossRanks(const Status& local, std::string_view what_failed) {
  const int local_ok = local.ok() ? 1 : 0;
  int all_ok = 0;
  SHARDSCOPE_RETURN_IF_ERROR(
      MpiStatus(MPI_Allreduce(&local_ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD), "MPI_Allreduce"));
  if (!local.ok()) return local;
  // Aborted: this rank did nothing wrong; the CLI prints only the failing rank's message.
  if (all_ok == 0) return Status::Aborted(fmt::format("another rank {} (its message says why)", what_failed));
  return Status::Ok();
}

namespace {
constexpr int kStateTag = 1;   // a rank's progress per communicator; also "dump now"
constexpr int kDumpedTag = 2;  // a rank wrote its dump
}  // namespace

MpiPeerChannel::MpiPeerChannel(MPI_Comm comm) : comm_(comm) {
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  rank_ = rank;
  world_ = world;
}

void MpiPeerChannel::SendStateToAll(const std::vector<int64_t>& state) {
  const std::vector<int64_t>& buffer = sent_.emplace_back(state);
  for (int peer = 0; peer < world_; ++peer) {
    if (peer == rank_) continue;
    requests_.emplace_back();
    MPI_Isend(buffer.data(), static_cast<int>(buffer.size()), MPI_INT64_T, peer, kStateTag, comm_, &requests_.back());
  }
}

void MpiPeerChannel::SendDumpedToAll() {
  const std::vector<int64_t>& note = sent_.emplace_back(1, 1);
  for (int peer = 0; peer < world_; ++peer) {
    if (peer == rank_) continue;
    requests_.emplace_back();
    MPI_Isend(note.data(), 1, MPI_INT64_T, peer, kDumpedTag, comm_, &requests_.back());
  }
}

std::vector<PeerChannel::Message> MpiPeerChannel::Receive() {
  std::vector<Message> out;
  while (true) {
    int flag = 0;
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, &status);
    if (!flag) break;
    int count = 0;
    MPI_Get_count(&status, MPI_INT64_T, &count);
    std::vector<int64_t> message(static_cast<size_t>(std::max(count, 1)));
    MPI_Recv(message.data(), count, MPI_INT64_T, status.MPI_SOURCE, status.MPI_TAG, comm_, MPI_STATUS_IGNORE);
    out.push_back(Message{status.MPI_SOURCE, status.MPI_TAG != kStateTag, std::move(message)});
  }
  return out;
}

StatusOr<ExchangedResults> ExchangeResults(MPI_Comm comm, std::vector<LocalRankOutput> local, int32_t steps,
                                           int32_t replays) {
  ExchangedResults out;
  if (comm == MPI_COMM_NULL) {
    for (LocalRankOutput& r : local) {
      out.ranks.push_back(std::move(r.result));
      const size_t before = out.timeline.values.size();
      out.timeline.values.insert(out.timeline.values.end(), r.slices.begin(), r.slices.end());
      out.timeline.counts.push_back(static_cast<int>(out.timeline.values.size() - before));
    }
    return out;
  }
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  const std::vector<int64_t> mine = EncodeResult(local[0].result, steps, replays);
  const int record_size = static_cast<int>(mine.size());
  std::vector<int64_t> all;
  if (rank == 0) all.resize(mine.size() * static_cast<size_t>(world));
  SHARDSCOPE_RETURN_IF_ERROR(MpiStatus(
      MPI_Gather(mine.data(), record_size, MPI_INT64_T, all.data(), record_size, MPI_INT64_T, 0, comm), "MPI_Gather"));
  SHARDSCOPE_ASSIGN_OR_RETURN(out.timeline, GatherTimelineSlices(comm, std::move(local[0].slices)));
  if (rank != 0) {
    out.ranks.push_back(std::move(local[0].result));
    return out;
  }
  for (int r = 0; r < world; ++r) {
    out.ranks.push_back(DecodeResult(all.data() + static_cast<size_t>(r) * mine.size(), steps, replays));
  }
  return out;
}

}  // namespace shardscope::runtime

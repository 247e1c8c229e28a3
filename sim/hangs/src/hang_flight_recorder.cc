// Per-rank dumps in PyTorch Flight Recorder's layout (torch/csrc/distributed/c10d/
// FlightRecorder.hpp): the collective recorder that keeps each traced collective's times
// while the engine runs, and the dump writer.
#include <algorithm>
#include <map>
#include <set>
#include <variant>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "hang_internal.h"
#include "shardscope/traces/flight_recorder_dump.h"

namespace shardscope::sim {

using hang_internal::IsP2p;
using traces::CollectiveOp;
using traces::CollectiveType;

std::vector<int32_t> FlightRecorderRanks(const SimulationResult& result, size_t limit) {
  std::vector<int32_t> ranks;
  for (const BlockedRank& b : result.blocked) {
    if (ranks.size() >= limit) break;
    ranks.push_back(b.rank);
  }
  return ranks;
}

CollectiveRecorder::CollectiveRecorder(const traces::Schedule& schedule, std::vector<int32_t> ranks)
    : schedule_(schedule), wanted_(static_cast<size_t>(schedule.world_size()), false) {
  for (int32_t r : ranks) {
    if (r >= 0 && r < schedule.world_size()) wanted_[static_cast<size_t>(r)] = true;
  }
}

bool CollectiveRecorder::WantsRank(int32_t rank) const { return wanted_[static_cast<size_t>(rank)]; }

void CollectiveRecorder::OnHostSpan(const HostSpan& span) {
  if (span.kind != HostSpanKind::kLaunch) return;
  const traces::Op& op = schedule_.ProgramOf(span.rank).ops[static_cast<size_t>(span.op_index)];
  if (!std::holds_alternative<CollectiveOp>(op.payload)) return;
  times_[span.rank][span.op_index].created_ns = span.start_ns;
}

void CollectiveRecorder::OnDeviceSpan(const DeviceSpan& span) {
  if (span.collective == nullptr) return;
  Times& t = times_[span.rank][span.op_index];
  t.started_ns = span.start_ns;
  t.completed_ns = span.end_ns;
}

const std::map<int32_t, CollectiveRecorder::Times>& CollectiveRecorder::TimesOf(int32_t rank) const {
  static const std::map<int32_t, Times> kNone;
  auto it = times_.find(rank);
  return it == times_.end() ? kNone : it->second;
}

std::string FlightRecorderJson(const traces::Schedule& schedule, const SimulationResult& result, int32_t rank,
                               const CollectiveRecorder* recorder, const HangOptions& options) {
  const traces::Program& program = schedule.ProgramOf(rank);
  const BlockedRank* blocked = nullptr;
  for (const BlockedRank& b : result.blocked) {
    if (b.rank == rank) blocked = &b;
  }
  std::map<int32_t, const PendingCollective*> pending;
  if (blocked) {
    for (const auto& [index, p] : blocked->pending) pending[index] = &p;
  }
  // Ops the host issued: all of them, unless it is blocked at (or stopped before) an op. A rank
  // that caught an out-of-memory error skipped the ops after it up to its OOM-flag collective,
  // which it issued.
  int32_t issued_end = static_cast<int32_t>(program.ops.size());
  int32_t skipped_begin = -1, skipped_end = -1;  // [begin, end): not issued
  if (blocked && blocked->host_state.reason != HostBlockReason::kFinished && blocked->host_state.op_index >= 0) {
    issued_end = blocked->host_state.op_index;
    if (blocked->host_state.oom_caught && blocked->host_state.oom_sync_op_index >= 0) {
      skipped_begin = blocked->host_state.op_index;
      skipped_end = blocked->host_state.oom_sync_op_index;
      issued_end = blocked->host_state.oom_sync_op_index + 1;
    }
  }
  const double timeout_ms = static_cast<double>(options.watchdog_timeout_ns) / 1e6;
  std::map<int32_t, traces::FlightRecorderLane> lanes;
  std::map<int32_t, int64_t> collective_count, p2p_count;
  std::vector<traces::FlightRecorderEntry> entries;
  for (int32_t index = 0; index < issued_end; ++index) {
    if (index >= skipped_begin && index < skipped_end) continue;
    const traces::Op& op = program.ops[static_cast<size_t>(index)];
    const auto* coll = std::get_if<CollectiveOp>(&op.payload);
    if (coll == nullptr) continue;
    const int32_t comm = schedule.CommunicatorOf(rank, coll->comm);
    traces::FlightRecorderLane& lane = lanes[comm];
    lane.communicator = comm;
    const bool p2p = IsP2p(coll->type);
    traces::FlightRecorderEntry entry;
    entry.op_index = index;
    entry.communicator = comm;
    entry.op_seq = ++lane.issued;
    // collective_seq_id / p2p_seq_id: how many of each kind the communicator has seen so far.
    ++(p2p ? p2p_count[comm] : collective_count[comm]);
    entry.collective_seq = collective_count[comm];
    entry.p2p_seq = p2p_count[comm];
    auto found = pending.find(index);
    CollectiveRecorder::Times times;
    if (recorder) {
      const auto& all = recorder->TimesOf(rank);
      if (auto t = all.find(index); t != all.end()) times = t->second;
    }
    entry.created_ns = times.created_ns;
    if (found == pending.end()) {
      entry.state = traces::FlightRecorderState::kCompleted;
      ++lane.started;
      ++lane.completed;
      entry.started_ns = times.started_ns;
      entry.completed_ns = times.completed_ns;
    } else {
      const PendingCollective& p = *found->second;
      entry.created_ns = p.enqueued_ns;
      if (p.arrived_ns >= 0) {
        // NCCL's kernel runs once its stream reaches it, spinning for the peers: "started".
        entry.state = traces::FlightRecorderState::kStarted;
        entry.started_ns = p.arrived_ns;
        ++lane.started;
      }
    }
    entries.push_back(entry);
  }
  std::vector<traces::FlightRecorderLane> lane_list;
  for (const auto& [comm, lane] : lanes) lane_list.push_back(lane);
  nlohmann::ordered_json j;
  traces::WriteFlightRecorderDump(schedule, rank, entries, lane_list,
                                  {options.flight_recorder_entries, static_cast<int64_t>(timeout_ms)}, j);
  return j.dump(2) + "\n";
}

}  // namespace shardscope::sim
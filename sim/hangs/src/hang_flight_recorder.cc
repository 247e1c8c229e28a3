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
#include "shardscope/traces/collective_counts.h"

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
  struct PgCount {
    int64_t coll = 0, p2p = 0, ops = 0, started = 0, completed = 0;
  };
  std::map<int32_t, PgCount> counts;
  nlohmann::ordered_json entries = nlohmann::ordered_json::array();
  int64_t record_id = 0;
  for (int32_t index = 0; index < issued_end; ++index) {
    if (index >= skipped_begin && index < skipped_end) continue;
    const traces::Op& op = program.ops[static_cast<size_t>(index)];
    const auto* coll = std::get_if<CollectiveOp>(&op.payload);
    if (coll == nullptr) continue;
    const int32_t comm = schedule.CommunicatorOf(rank, coll->comm);
    const traces::Communicator& communicator = schedule.communicators[static_cast<size_t>(comm)];
    PgCount& count = counts[comm];
    const bool p2p = IsP2p(coll->type);
    (p2p ? count.p2p : count.coll)++;
    ++count.ops;
    // Element counts from CollectiveOp::bytes (nccl-tests' size: the gathered output of an
    // all_gather, the input of a reduce_scatter, the buffer otherwise).
    const traces::CollectiveCounts sizes = traces::CountsOf(*coll, static_cast<int32_t>(communicator.ranks.size()));
    const int64_t in = sizes.in_elements, out = sizes.out_elements;
    auto found = pending.find(index);
    const bool done = found == pending.end();
    CollectiveRecorder::Times times;
    if (recorder) {
      const auto& all = recorder->TimesOf(rank);
      if (auto t = all.find(index); t != all.end()) times = t->second;
    }
    std::string state = "completed";
    nlohmann::ordered_json started = nullptr, completed = nullptr, duration = nullptr;
    int64_t created = times.created_ns;
    if (done) {
      ++count.started;
      ++count.completed;
      if (times.started_ns >= 0) started = times.started_ns;
      if (times.completed_ns >= 0) {
        completed = times.completed_ns;
        duration = static_cast<double>(times.completed_ns - times.started_ns) / 1e6;
      }
    } else {
      const PendingCollective& p = *found->second;
      created = p.enqueued_ns;
      if (p.arrived_ns >= 0) {
        // NCCL's kernel runs once its stream reaches it, spinning for the peers: "started".
        state = "started";
        started = p.arrived_ns;
        ++count.started;
      } else {
        state = "scheduled";
      }
    }
    const std::string dtype(traces::TorchScalarTypeName(coll->dtype));
    nlohmann::ordered_json entry;
    entry["record_id"] = record_id++;
    entry["pg_id"] = comm;
    entry["process_group"] = {std::to_string(comm), communicator.name};
    entry["collective_seq_id"] = count.coll;
    entry["p2p_seq_id"] = count.p2p;
    entry["op_id"] = count.ops;
    // ProcessGroupNCCL::send / recv name p2p work "nccl:send 2->3" / "nccl:recv 3<-2" with
    // ranks in the process group.
    std::string profiling_name = fmt::format("nccl:{}", traces::CollectiveTypeName(coll->type));
    if (p2p) {
      const auto group_rank = [&](int32_t global) {
        auto it = std::find(communicator.ranks.begin(), communicator.ranks.end(), global);
        return it == communicator.ranks.end() ? global : static_cast<int32_t>(it - communicator.ranks.begin());
      };
      profiling_name += fmt::format(" {}{}{}", group_rank(rank), coll->type == CollectiveType::kSend ? "->" : "<-",
                                    group_rank(coll->peer));
    }
    entry["profiling_name"] = profiling_name;
    entry["time_created_ns"] = created >= 0 ? nlohmann::ordered_json(created) : nlohmann::ordered_json(nullptr);
    entry["input_sizes"] = {{in}};
    entry["input_dtypes"] = {dtype};
    entry["output_sizes"] = {{out}};
    entry["output_dtypes"] = {dtype};
    entry["state"] = state;
    entry["time_discovered_started_ns"] = started;
    entry["time_discovered_completed_ns"] = completed;
    entry["duration_ms"] = duration;
    entry["retired"] = done;
    entry["timeout_ms"] = static_cast<int64_t>(timeout_ms);
    entry["is_p2p"] = p2p;
    entry["frames"] = nlohmann::ordered_json::array();
    entries.push_back(entry);
  }
  // The ring buffer keeps the last N entries.
  const auto keep = static_cast<size_t>(std::max(0, options.flight_recorder_entries));
  if (entries.size() > keep) entries.erase(entries.begin(), entries.end() - static_cast<std::ptrdiff_t>(keep));
  nlohmann::ordered_json pg_config = nlohmann::ordered_json::object(), pg_status = nlohmann::ordered_json::object();
  const auto& binding = schedule.ranks[static_cast<size_t>(rank)].comm_binding;
  std::set<int32_t> comms(binding.begin(), binding.end());
  for (int32_t comm : comms) {
    const traces::Communicator& communicator = schedule.communicators[static_cast<size_t>(comm)];
    std::string ranks = "[";
    for (size_t i = 0; i < communicator.ranks.size(); ++i) ranks += (i ? ", " : "") + std::to_string(communicator.ranks[i]);
    ranks += "]";
    pg_config[std::to_string(comm)] = {{"name", std::to_string(comm)}, {"desc", communicator.name}, {"ranks", ranks}};
    const PgCount c = counts.count(comm) ? counts.at(comm) : PgCount{};
    pg_status[std::to_string(comm)] = {{"last_enqueued_collective", c.ops},
                                       {"last_started_collective", c.started},
                                       {"last_completed_collective", c.completed}};
  }
  nlohmann::ordered_json j;
  // FlightRecorder.hpp: version_val "2.10" at the time of writing.
  j["version"] = "2.10";
  j["pg_config"] = pg_config;
  j["pg_status"] = pg_status;
  j["entries"] = entries;
  return j.dump(2) + "\n";
}

}  // namespace shardscope::sim
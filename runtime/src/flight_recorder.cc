#include "flight_recorder.h"

#include <algorithm>
#include <map>
#include <set>
#include <variant>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "shardscope/traces/collective_counts.h"

namespace shardscope::runtime {

using traces::CollectiveType;


int32_t BlockedRecord(const std::vector<FlightRecord>& records) {
  for (size_t i = 0; i < records.size(); ++i) {
    if (records[i].completed_ns < 0) return static_cast<int32_t>(i);
  }
  return -1;
}

namespace {

nlohmann::ordered_json TimeOrNull(int64_t ns) {
  return ns >= 0 ? nlohmann::ordered_json(ns) : nlohmann::ordered_json(nullptr);
}

bool IsP2p(CollectiveType type) { return type == CollectiveType::kSend || type == CollectiveType::kRecv; }

}  // namespace

std::string RuntimeFlightRecorderJson(const traces::Schedule& schedule, const std::vector<FlightRecord>& records,
                                      const std::vector<FlightLane>& lanes, const FlightDumpContext& context) {
  const traces::Program& program = schedule.ProgramOf(context.rank);
  const auto timeout_ms = static_cast<int64_t>(context.timeout_s * 1e3);
  const size_t limit = static_cast<size_t>(std::max(0, context.entries_limit));
  const size_t first = records.size() > limit ? records.size() - limit : 0;
  nlohmann::ordered_json entries = nlohmann::ordered_json::array();
  for (size_t i = first; i < records.size(); ++i) {
    const FlightRecord& r = records[i];
    const auto& coll = std::get<traces::CollectiveOp>(program.ops[static_cast<size_t>(r.op_index)].payload);
    const traces::Communicator& comm = schedule.communicators[static_cast<size_t>(r.communicator)];
    // Element counts as sim/hangs/src/hang.cc writes them (CollectiveOp::bytes is nccl-tests' size).
    const traces::CollectiveCounts counts = traces::CountsOf(coll, static_cast<int32_t>(comm.ranks.size()));
    const int64_t in = counts.in_elements, out = counts.out_elements;
    const bool completed = r.completed_ns >= 0;
    // FlightRecorder.hpp Entry states: "scheduled" (enqueued), "started" (the kernel runs:
    // NCCL's kernel spins for its peers once its stream reaches it), "completed".
    const std::string state = completed ? "completed" : (r.started_ns >= 0 ? "started" : "scheduled");
    const std::string dtype(traces::TorchScalarTypeName(coll.dtype));
    nlohmann::ordered_json e;
    e["record_id"] = static_cast<int64_t>(i);
    e["pg_id"] = r.communicator;
    e["process_group"] = {std::to_string(r.communicator), comm.name};
    e["collective_seq_id"] = r.collective_seq;
    e["p2p_seq_id"] = r.p2p_seq;
    e["op_id"] = r.op_seq;
    // ProcessGroupNCCL::send / recv name p2p work "nccl:send 2->3" / "nccl:recv 3<-2" with
    // ranks in the process group, as sim/hangs/src/hang.cc writes them.
    std::string profiling_name = fmt::format("nccl:{}", traces::CollectiveTypeName(coll.type));
    if (IsP2p(coll.type)) {
      const auto group_rank = [&](int32_t global) {
        auto it = std::find(comm.ranks.begin(), comm.ranks.end(), global);
        return it == comm.ranks.end() ? global : static_cast<int32_t>(it - comm.ranks.begin());
      };
      profiling_name += fmt::format(" {}{}{}", group_rank(context.rank),
                                    coll.type == CollectiveType::kSend ? "->" : "<-", group_rank(coll.peer));
    }
    e["profiling_name"] = profiling_name;
    e["time_created_ns"] = TimeOrNull(r.created_ns);
    e["input_sizes"] = {{in}};
    e["input_dtypes"] = {dtype};
    e["output_sizes"] = {{out}};
    e["output_dtypes"] = {dtype};
    e["state"] = state;
    e["time_discovered_started_ns"] = TimeOrNull(r.started_ns);
    e["time_discovered_completed_ns"] = TimeOrNull(r.completed_ns);
    e["duration_ms"] = completed && r.started_ns >= 0
                           ? nlohmann::ordered_json(static_cast<double>(r.completed_ns - r.started_ns) / 1e6)
                           : nlohmann::ordered_json(nullptr);
    e["retired"] = completed;
    e["timeout_ms"] = timeout_ms;
    e["is_p2p"] = IsP2p(coll.type);
    e["frames"] = nlohmann::ordered_json::array();
    entries.push_back(std::move(e));
  }
  nlohmann::ordered_json pg_config = nlohmann::ordered_json::object();
  nlohmann::ordered_json pg_status = nlohmann::ordered_json::object();
  std::map<int32_t, FlightLane> by_comm;
  for (const FlightLane& lane : lanes) by_comm[lane.communicator] = lane;
  const auto& binding = schedule.ranks[static_cast<size_t>(context.rank)].comm_binding;
  const std::set<int32_t> comms(binding.begin(), binding.end());
  for (int32_t c : comms) {
    const traces::Communicator& comm = schedule.communicators[static_cast<size_t>(c)];
    std::string ranks = "[";
    for (size_t i = 0; i < comm.ranks.size(); ++i) ranks += (i ? ", " : "") + std::to_string(comm.ranks[i]);
    ranks += "]";
    pg_config[std::to_string(c)] = {{"name", std::to_string(c)}, {"desc", comm.name}, {"ranks", ranks}};
    const FlightLane lane = by_comm.count(c) ? by_comm.at(c) : FlightLane{c, 0, 0, 0};
    pg_status[std::to_string(c)] = {{"last_enqueued_collective", lane.issued},
                                    {"last_started_collective", lane.started},
                                    {"last_completed_collective", lane.completed}};
  }
  nlohmann::ordered_json j;
  j["version"] = "2.10";  // FlightRecorder.hpp version_val, as sim/hangs/src/hang.cc writes it
  j["pg_config"] = pg_config;
  j["pg_status"] = pg_status;
  j["entries"] = entries;
  nlohmann::ordered_json ours;
  ours["rank"] = context.rank;
  ours["reason"] = context.reason;
  ours["host"] = context.host;
  ours["timeout_s"] = context.timeout_s;
  const int32_t blocked = BlockedRecord(records);
  if (blocked >= 0) {
    const FlightRecord& r = records[static_cast<size_t>(blocked)];
    const traces::Op& op = program.ops[static_cast<size_t>(r.op_index)];
    const auto& coll = std::get<traces::CollectiveOp>(op.payload);
    ours["blocked_collective"] = {
        {"pg_id", r.communicator},
        {"process_group", schedule.communicators[static_cast<size_t>(r.communicator)].name},
        {"collective_seq_id", r.collective_seq},
        {"p2p_seq_id", r.p2p_seq},
        {"profiling_name", fmt::format("nccl:{}", traces::CollectiveTypeName(coll.type))},
        {"state", r.started_ns >= 0 ? "started" : "scheduled"},
        {"schedule_op_id", op.id}};
  } else {
    ours["blocked_collective"] = nullptr;
  }
  ours["missing_ranks"] = context.missing_ranks;
  ours["unresponsive_ranks"] = context.unresponsive_ranks;
  j["shardscope"] = ours;
  return j.dump(2) + "\n";
}

}  // namespace shardscope::runtime

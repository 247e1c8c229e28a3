#include "flight_recorder.h"

#include <variant>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "shardscope/traces/flight_recorder_dump.h"

namespace shardscope::runtime {

int32_t BlockedRecord(const std::vector<FlightRecord>& records) {
  for (size_t i = 0; i < records.size(); ++i) {
    if (records[i].completed_ns < 0) return static_cast<int32_t>(i);
  }
  return -1;
}

std::string RuntimeFlightRecorderJson(const traces::Schedule& schedule, const std::vector<FlightRecord>& records,
                                      const std::vector<FlightLane>& lanes, const FlightDumpContext& context) {
  const traces::Program& program = schedule.ProgramOf(context.rank);
  std::vector<traces::FlightRecorderEntry> entries;
  entries.reserve(records.size());
  for (const FlightRecord& r : records) {
    traces::FlightRecorderEntry e;
    e.op_index = r.op_index;
    e.communicator = r.communicator;
    e.collective_seq = r.collective_seq;
    e.p2p_seq = r.p2p_seq;
    e.op_seq = r.op_seq;
    e.created_ns = r.created_ns;
    e.started_ns = r.started_ns;
    e.completed_ns = r.completed_ns;
    e.state = r.completed_ns >= 0  ? traces::FlightRecorderState::kCompleted
              : r.started_ns >= 0 ? traces::FlightRecorderState::kStarted
                                  : traces::FlightRecorderState::kScheduled;
    entries.push_back(e);
  }
  nlohmann::ordered_json j;
  traces::WriteFlightRecorderDump(schedule, context.rank, entries, lanes,
                                  {context.entries_limit, static_cast<int64_t>(context.timeout_s * 1e3)}, j);
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

// Writing a Flight Recorder dump in the layout of PyTorch's JSON dump
// (torch/csrc/distributed/c10d/FlightRecorderDetail.hpp dump_json, TORCH_NCCL_DEBUG_INFO_PICKLE=0):
// the one writer behind `simulate`'s dumps (sim/hangs, entries derived from a simulated step)
// and `run`'s (runtime/, entries the rank recorded), so both read back alike in
// `shardscope flight-recorder` and in PyTorch's fr_trace. Reading dumps is flight_recorder.h.
//
//   nlohmann::ordered_json j;
//   traces::WriteFlightRecorderDump(schedule, rank, entries, lanes, {2000, timeout_ms}, j);
//   j["shardscope"] = ...;   // the runtime's own section, after PyTorch's keys
//
// The JSON type is a template parameter so traces' public headers do not depend on
// nlohmann's (as report_header.h); any ordered JSON object with operator[], array(),
// object() and initializer lists works.
#ifndef SHARDSCOPE_TRACES_FLIGHT_RECORDER_DUMP_H_
#define SHARDSCOPE_TRACES_FLIGHT_RECORDER_DUMP_H_

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "shardscope/traces/collective_counts.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::traces {

// FlightRecorder.hpp Entry states: "scheduled" (enqueued), "started" (the kernel runs: NCCL's
// kernel spins for its peers once its stream reaches it), "completed".
enum class FlightRecorderState : uint8_t { kScheduled, kStarted, kCompleted };

// One collective or p2p op as the host issued it; times are -1 when unknown (written null).
struct FlightRecorderEntry {
  int32_t op_index = 0;       // into the rank's Program::ops (a CollectiveOp)
  int32_t communicator = 0;   // into Schedule::communicators
  // Per (rank, communicator), 1-based: collective_seq_id (p2p ops count in p2p_seq_id
  // instead) and op_id (both).
  int64_t collective_seq = 0;
  int64_t p2p_seq = 0;
  int64_t op_seq = 0;
  int64_t created_ns = -1;
  int64_t started_ns = -1;
  int64_t completed_ns = -1;
  FlightRecorderState state = FlightRecorderState::kScheduled;
};

// Per communicator the rank is bound to: ops issued, started and completed (pg_status).
struct FlightRecorderLane {
  int32_t communicator = 0;
  int64_t issued = 0;
  int64_t started = 0;
  int64_t completed = 0;
};

struct FlightRecorderDumpOptions {
  // The ring buffer (TORCH_NCCL_TRACE_BUFFER_SIZE / TORCH_FR_BUFFER_SIZE): only the last
  // `entries_limit` entries are written; record_id stays the entry's index among all.
  int32_t entries_limit = 2000;
  int64_t timeout_ms = 0;     // the watchdog timeout every entry carries
};

inline std::string_view FlightRecorderStateName(FlightRecorderState state) {
  switch (state) {
    case FlightRecorderState::kScheduled: return "scheduled";
    case FlightRecorderState::kStarted: return "started";
    case FlightRecorderState::kCompleted: return "completed";
  }
  return "scheduled";
}

// ProcessGroupNCCL's profiling name: "nccl:all_gather", and for p2p work "nccl:send 2->3" /
// "nccl:recv 3<-2" with ranks in the process group.
inline std::string FlightRecorderProfilingName(const CollectiveOp& coll, const Communicator& comm, int32_t rank) {
  std::string name = fmt::format("nccl:{}", CollectiveTypeName(coll.type));
  if (coll.type == CollectiveType::kSend || coll.type == CollectiveType::kRecv) {
    const auto group_rank = [&](int32_t global) {
      auto it = std::find(comm.ranks.begin(), comm.ranks.end(), global);
      return it == comm.ranks.end() ? global : static_cast<int32_t>(it - comm.ranks.begin());
    };
    name += fmt::format(" {}{}{}", group_rank(rank), coll.type == CollectiveType::kSend ? "->" : "<-",
                        group_rank(coll.peer));
  }
  return name;
}

// Writes version, pg_config, pg_status and entries into `j`, in that order.
template <typename Json>
void WriteFlightRecorderDump(const Schedule& schedule, int32_t rank, const std::vector<FlightRecorderEntry>& all,
                             const std::vector<FlightRecorderLane>& lanes, const FlightRecorderDumpOptions& options,
                             Json& j) {
  const auto time_or_null = [](int64_t ns) { return ns >= 0 ? Json(ns) : Json(nullptr); };
  const Program& program = schedule.ProgramOf(rank);
  const size_t limit = static_cast<size_t>(std::max(0, options.entries_limit));
  const size_t first = all.size() > limit ? all.size() - limit : 0;
  Json entries = Json::array();
  for (size_t i = first; i < all.size(); ++i) {
    const FlightRecorderEntry& r = all[i];
    const auto& coll = std::get<CollectiveOp>(program.ops[static_cast<size_t>(r.op_index)].payload);
    const Communicator& comm = schedule.communicators[static_cast<size_t>(r.communicator)];
    const CollectiveCounts counts = CountsOf(coll, static_cast<int32_t>(comm.ranks.size()));
    const std::string dtype(TorchScalarTypeName(coll.dtype));
    const bool retired = r.state == FlightRecorderState::kCompleted;
    Json e;
    e["record_id"] = static_cast<int64_t>(i);
    e["pg_id"] = r.communicator;
    e["process_group"] = {std::to_string(r.communicator), comm.name};
    e["collective_seq_id"] = r.collective_seq;
    e["p2p_seq_id"] = r.p2p_seq;
    e["op_id"] = r.op_seq;
    e["profiling_name"] = FlightRecorderProfilingName(coll, comm, rank);
    e["time_created_ns"] = time_or_null(r.created_ns);
    e["input_sizes"] = {{counts.in_elements}};
    e["input_dtypes"] = {dtype};
    e["output_sizes"] = {{counts.out_elements}};
    e["output_dtypes"] = {dtype};
    e["state"] = std::string(FlightRecorderStateName(r.state));
    e["time_discovered_started_ns"] = time_or_null(r.started_ns);
    e["time_discovered_completed_ns"] = time_or_null(r.completed_ns);
    e["duration_ms"] = retired && r.started_ns >= 0 && r.completed_ns >= 0
                           ? Json(static_cast<double>(r.completed_ns - r.started_ns) / 1e6)
                           : Json(nullptr);
    e["retired"] = retired;
    e["timeout_ms"] = options.timeout_ms;
    e["is_p2p"] = coll.type == CollectiveType::kSend || coll.type == CollectiveType::kRecv;
    e["frames"] = Json::array();
    entries.push_back(std::move(e));
  }
  Json pg_config = Json::object();
  Json pg_status = Json::object();
  const auto& binding = schedule.ranks[static_cast<size_t>(rank)].comm_binding;
  const std::set<int32_t> comms(binding.begin(), binding.end());
  for (int32_t c : comms) {
    const Communicator& comm = schedule.communicators[static_cast<size_t>(c)];
    std::string ranks = "[";
    for (size_t i = 0; i < comm.ranks.size(); ++i) ranks += (i ? ", " : "") + std::to_string(comm.ranks[i]);
    ranks += "]";
    pg_config[std::to_string(c)] = {{"name", std::to_string(c)}, {"desc", comm.name}, {"ranks", ranks}};
    FlightRecorderLane lane{c, 0, 0, 0};
    for (const FlightRecorderLane& l : lanes) {
      if (l.communicator == c) lane = l;
    }
    pg_status[std::to_string(c)] = {{"last_enqueued_collective", lane.issued},
                                    {"last_started_collective", lane.started},
                                    {"last_completed_collective", lane.completed}};
  }
  // FlightRecorder.hpp: version_val "2.10" at the time of writing.
  j["version"] = "2.10";
  j["pg_config"] = pg_config;
  j["pg_status"] = pg_status;
  j["entries"] = entries;
}

}  // namespace shardscope::traces

#endif  // SHARDSCOPE_TRACES_FLIGHT_RECORDER_DUMP_H_

// The runtime's Flight Recorder dump: what one rank knows about its collectives when the
// watchdog fires, in the layout of PyTorch's Flight Recorder JSON dump
// (torch/csrc/distributed/c10d/FlightRecorderDetail.hpp dump_json, TORCH_NCCL_DEBUG_INFO_PICKLE=0)
// written by the writer the simulator's dumps use too (traces/flight_recorder_dump.h), plus a
// "shardscope" section with the reason, the blocked collective and the missing ranks.
//
// sim derives its entries from a SimulationResult (one simulated step, in program order); the
// runtime has measured entries over several steps, recorded here. No MPI here: unit-tested on
// its own.
#ifndef SHARDSCOPE_RUNTIME_FLIGHT_RECORDER_H_
#define SHARDSCOPE_RUNTIME_FLIGHT_RECORDER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "shardscope/traces/flight_recorder_dump.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::runtime {

// One collective as the host issued it.
struct FlightRecord {
  int32_t op_index = 0;            // into the rank's Program::ops
  int32_t communicator = 0;        // into Schedule::communicators
  // Per (rank, communicator), 1-based, as Flight Recorder's collective_seq_id (p2p ops count
  // in p2p_seq_id instead) and op_id (both).
  int64_t collective_seq = 0;
  int64_t p2p_seq = 0;
  int64_t op_seq = 0;
  int64_t created_ns = -1;         // the host enqueued it
  int64_t started_ns = -1;         // its stream reached it and it was its communicator's turn
  int64_t completed_ns = -1;
};

// Per communicator of the rank: collectives (and p2p) issued, started and completed.
using FlightLane = traces::FlightRecorderLane;

struct FlightDumpContext {
  int32_t rank = 0;
  std::string reason;              // "watchdog timeout ...", "dump requested by rank 2", ...
  std::string host;                // what the host thread was doing
  double timeout_s = 0;
  // The ring buffer (TORCH_NCCL_TRACE_BUFFER_SIZE / TORCH_FR_BUFFER_SIZE): 2000, as simulate's
  // dumps (sim/hang.h HangOptions::flight_recorder_entries has the source).
  int32_t entries_limit = 2000;
  // Ranks of the blocked collective's communicator that had not started it, as far as this
  // rank learned from its peers' progress, and peers that never answered.
  std::vector<int32_t> missing_ranks;
  std::vector<int32_t> unresponsive_ranks;
};

// `records`: every collective issued, oldest first (the last `entries_limit` are written).
// `lanes`: one per communicator the rank is bound to.
std::string RuntimeFlightRecorderJson(const traces::Schedule& schedule, const std::vector<FlightRecord>& records,
                                      const std::vector<FlightLane>& lanes, const FlightDumpContext& context);

// The first record not completed (the collective the rank is blocked in), or -1.
int32_t BlockedRecord(const std::vector<FlightRecord>& records);


}  // namespace shardscope::runtime

#endif  // SHARDSCOPE_RUNTIME_FLIGHT_RECORDER_H_

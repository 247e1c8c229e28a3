// NCCL Flight Recorder dumps: the format and its reader (PyTorch's pickle and JSON forms, and
// the JSON that `shardscope simulate` and `shardscope run` write). The cross-rank hang
// analysis behind `shardscope flight-recorder DIR` is in
// shardscope/analysis/flight_recorder_analysis.h.
//
//   SHARDSCOPE_ASSIGN_OR_RETURN(std::vector<FlightRecorderDump> dumps, ReadFlightRecorderDir(dir, {}));
//
// A dump (ProcessGroupNCCL's ring buffer of the last N collectives of one rank, written by
// torch/csrc/distributed/c10d/FlightRecorder.cpp dump / dump_json) is a dict: `version`,
// `pg_config` (PG name -> {name, desc, ranks as "[0, 1]"}), `pg_status` (pg_id ->
// last_enqueued/started/completed_collective), `entries` (record_id, pg_id, process_group
// (name, desc), collective_seq_id, p2p_seq_id, op_id, profiling_name "nccl:all_to_all",
// time_created_ns, input/output sizes and dtypes, state scheduled / started / completed,
// is_p2p, ...). Known variants are accepted (see flight_recorder.cc); anything else is
// kInvalidInput naming the file and the key path ("entries[3].input_sizes[0][1]").
#ifndef SHARDSCOPE_TRACES_FLIGHT_RECORDER_H_
#define SHARDSCOPE_TRACES_FLIGHT_RECORDER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardscope/base/status.h"

namespace shardscope::traces {

// One collective or p2p op as the rank's Flight Recorder holds it.
struct FrEntry {
  int64_t record_id = 0;
  int64_t pg_id = 0;                 // ProcessGroupNCCL::uid_ (not the PG's name)
  std::string pg_name;               // process_group[0]: PyTorch's PG name ("74")
  std::string pg_desc;               // process_group[1]: "EXPERT_MODEL_PARALLEL_GROUP"
  int64_t collective_seq_id = 0;
  int64_t p2p_seq_id = 0;
  int64_t op_id = 0;
  std::string profiling_name;        // "nccl:all_to_all", "nccl:send 0->1"
  int64_t time_created_ns = -1;      // -1: null
  std::vector<std::vector<int64_t>> input_sizes, output_sizes;
  std::vector<std::string> input_dtypes, output_dtypes;
  std::string state;                 // "scheduled", "started", "completed"
  int64_t time_discovered_started_ns = -1;
  int64_t time_discovered_completed_ns = -1;
  bool retired = false;
  bool is_p2p = false;
  int64_t timeout_ms = -1;
};

struct FrGroupConfig {
  std::string name;                  // the pg_config key
  std::string desc;
  std::vector<int32_t> ranks;        // global ranks, as listed
};

struct FrPgStatus {
  int64_t last_enqueued = -1;
  int64_t last_started = -1;
  int64_t last_completed = -1;
};

// One rank's dump.
struct FlightRecorderDump {
  std::string source;                // the file
  int32_t rank = -1;
  std::string version;               // "2.9"; "" when the dump has none
  std::vector<FrGroupConfig> pg_config;           // in the file's order
  std::map<std::string, FrPgStatus> pg_status;    // by pg_status key
  std::vector<FrEntry> entries;                   // oldest first, as dumped
};

// Parses one dump (pickle when the bytes start with PROTO, JSON when they start with '{').
// `rank_from_name` is the rank the file name gives (-1: none); the dump's own `rank` key (or
// `shardscope.rank`, which `shardscope run` writes) wins and must agree when both exist.
StatusOr<FlightRecorderDump> ParseFlightRecorderDump(std::string_view bytes, std::string_view source,
                                                     int32_t rank_from_name);

struct FlightRecorderDirOptions {
  // Only files named <prefix><rank>[.json|.pkl|.pickle]; empty: inferred (see
  // ReadFlightRecorderDir).
  std::string prefix;
};

// Reads every dump in `dir` (not recursive). A dump file is named <prefix><rank digits>, with
// an optional .json / .pkl / .pickle extension, as PyTorch's loader expects
// (torch/distributed/flight_recorder/components/loader.py read_dump: the rank is the name's
// trailing digits after the common prefix). Without options.prefix, the prefix is the one all
// such names share; when several occur, the known dump names win (PyTorch's
// TORCH_NCCL_DEBUG_INFO_TEMP_FILE default "nccl_trace_rank_", "_dump_", simulate's
// "flight_recorder_rank", run's "rank_"), else it is an error asking for --prefix. A folder
// without dumps that holds a flight_recorder/ folder (run's output) is read from there.
// Every selected file must parse as a dump; two dumps of one rank are an error.
StatusOr<std::vector<FlightRecorderDump>> ReadFlightRecorderDir(const std::string& dir,
                                                                const FlightRecorderDirOptions& options);

}  // namespace shardscope::traces

#endif  // SHARDSCOPE_TRACES_FLIGHT_RECORDER_H_

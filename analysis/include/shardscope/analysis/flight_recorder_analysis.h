// Cross-rank hang analysis of NCCL Flight Recorder dumps (the dumps' format and reader are in
// shardscope/traces/flight_recorder.h), behind `shardscope flight-recorder DIR`.
//
//   SHARDSCOPE_ASSIGN_OR_RETURN(std::vector<FlightRecorderDump> dumps, ReadFlightRecorderDir(dir, {}));
//   FlightRecorderAnalysis analysis = AnalyzeFlightRecorder(dumps);
//   std::cout << FlightRecorderText(analysis);      // one line per hang, then details
//
// The analysis follows PyTorch's analyzer
// (torch/distributed/flight_recorder/components/builder.py build_collectives and utils.py):
// per process group (its name and member ranks), entries are matched across ranks by
// collective_seq_id (p2p by p2p_seq_id on two-rank groups); a member rank without an entry
// at that sequence number is missing when its own buffer proves it never got there, and is
// told apart from a rank whose dump is absent or whose buffer no longer holds that far back;
// the entries found are compared with Op.match's rules (type, sizes, dtypes, state). The
// first sequence number of a group with missing ranks or a mismatch is that group's hang.
#ifndef SHARDSCOPE_ANALYSIS_FLIGHT_RECORDER_ANALYSIS_H_
#define SHARDSCOPE_ANALYSIS_FLIGHT_RECORDER_ANALYSIS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shardscope/traces/flight_recorder.h"

namespace shardscope::traces {

// How a member rank of a process group stands at the hung sequence number.
enum class FrRankStatus {
  kEntered,       // its dump holds an entry at that sequence number
  kNeverEntered,  // its dump proves it never got there (missing)
  kNoDump,        // no dump from this rank
  kNotInBuffer,   // its buffer no longer reaches back that far, or holds nothing to decide by
};

struct FrRankState {
  int32_t rank = 0;
  FrRankStatus status = FrRankStatus::kEntered;
  // kEntered: its entry at the sequence number; kNeverEntered: its last entry of the group
  // (nullopt when its buffer holds none).
  std::optional<FrEntry> entry;
  std::optional<FrEntry> last_entry;  // the rank's newest entry of any group, for context
  // kNeverEntered with no entry of the group left: its pg_status last_enqueued_collective.
  int64_t last_enqueued = -1;
};

struct FrMismatch {
  std::string kind;   // Flight Recorder's MatchState name: COLLECTIVE_TYPE_MISMATCH,
                      // SIZE_OR_SYNTAX_MISMATCH, COLLECTIVE_DTYPE_MISMATCH,
                      // COLLECTIVE_STATE_MISMATCH
  std::string text;   // what differs, with the ranks on each side
  std::vector<int32_t> ranks;  // the odd ones out
};

struct FrHang {
  std::string pg_name;
  std::string pg_desc;
  std::vector<int32_t> group_ranks;
  bool p2p = false;                   // matched by p2p_seq_id
  int64_t seq = 0;
  std::string collective;             // the profiling name on the lowest rank that entered
  std::vector<std::vector<int64_t>> input_sizes, output_sizes;  // on that rank
  std::string dtype;                  // its input dtypes, joined by ","
  std::vector<int32_t> waiting_ranks;   // entered
  std::vector<int32_t> missing_ranks;   // never entered
  std::vector<int32_t> no_dump_ranks;
  std::vector<int32_t> not_in_buffer_ranks;
  std::optional<FrMismatch> mismatch;
  int64_t waiting_since_ns = -1;      // the earliest time_created_ns among the waiting ranks
  // The oldest collective of the group not completed on some dumped rank, by pg_status
  // (last_completed_collective + 1), when it is older than every rank's buffer: the stuck
  // collective itself is then no longer in the dumps and `seq` is only the first disagreement
  // they still show. -1 otherwise.
  int64_t oldest_incomplete_seq = -1;
  std::vector<FrRankState> rank_states;  // every member, by rank
  std::string description;            // one line, in the words of simulate's hang explanation
};

struct FlightRecorderAnalysis {
  std::vector<int32_t> dumped_ranks;
  std::string version;                 // of the first dump
  int64_t groups = 0;                  // process groups examined
  // Longest-waiting first: by waiting_since_ns (unknown last), then group name and seq.
  std::vector<FrHang> hangs;
};

FlightRecorderAnalysis AnalyzeFlightRecorder(const std::vector<FlightRecorderDump>& dumps);

// "4027x5120" for [[4027, 5120]]; several tensors joined by ", ".
std::string FrSizesText(const std::vector<std::vector<int64_t>>& sizes);

// The command's outputs: text (one line per hang, then details) and JSON
// ({"dumps", "ranks", "version", "process_groups", "hangs": [...]}; see docs/FLIGHT_RECORDER.md).
std::string FlightRecorderText(const FlightRecorderAnalysis& analysis);
std::string FlightRecorderJsonReport(const FlightRecorderAnalysis& analysis);

}  // namespace shardscope::traces

#endif  // SHARDSCOPE_ANALYSIS_FLIGHT_RECORDER_ANALYSIS_H_

// Predicted-vs-measured timeline diff (`shardscope diff PREDICTED MEASURED -o DIR`).
//
// Two timelines of the same step (one predicted by sim/, one measured by the runtime or the
// PyTorch profiler) are matched slice by slice, measured with Holistic Trace Analysis's
// metrics, walked along their critical paths, and compared:
//
//   SHARDSCOPE_ASSIGN_OR_RETURN(DiffSide predicted, LoadDiffSide("out/plan"));
//   SHARDSCOPE_ASSIGN_OR_RETURN(DiffSide measured, LoadDiffSide("profile/"));
//   SHARDSCOPE_ASSIGN_OR_RETURN(DiffResult diff, Diff(predicted, measured, DiffOptions{}));
//   SHARDSCOPE_RETURN_IF_ERROR(WriteDiffOutputs(predicted, measured, diff, "diff-out", {}));
//
// Matching (diff_match.cc), in two passes; every slice ends matched or listed as unmatched:
//   1. By op id: slices with op_id >= 0 on both sides pair on (rank, host|device, op id,
//      occurrence in time order). Our own traces (simulate, run --profile) always carry them.
//   2. By name, for what is left: per rank, host tracks pair with host tracks and device
//      tracks with device tracks by the names they share; each pair of tracks is aligned in
//      time order. Collectives that are the same collective on both sides are anchors: the
//      same process group, known by its member ranks since the two sides name groups
//      differently, and the same position k among the rank's collectives of that group (Seq
//      counts from 0 in our traces, from 1 in PyTorch's). They are kept in order by a longest
//      increasing subsequence; between anchors an O((n+m)·D) Myers alignment on normalized
//      names (NormalizeKernelName) matches the rest.
//      A stretch whose alignment would need more than kMaxAlignmentEdits edits is split in
//      proportional halves (an approximation that bounds the work on unrelated traces).
//
// Metrics per rank and side (diff_metrics.cc) follow HTA's definitions; the critical path
// per side (diff_critical_path.cc) is a Boost.Graph longest path; errors, classes and the
// attribution of the step-time difference are in diff.cc; outputs in diff_report.cc.
// docs/DIFF.md describes the rules, report.json's schema and the limits.
//
// Memory: the events are flat vectors indexed by int32; names are interned once per
// distinct raw name, never copied per event. Deterministic: same inputs, same outputs.
#ifndef SHARDSCOPE_ANALYSIS_DIFF_H_
#define SHARDSCOPE_ANALYSIS_DIFF_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "shardscope/analysis/hta_metrics.h"
#include "shardscope/base/status.h"
#include "shardscope/traces/timeline.h"

namespace shardscope::traces {

// One side of a diff: the trace files as read, and the rank each file's events belong to.
struct DiffSide {
  std::string source;                    // what the user named (a file or a directory)
  std::vector<std::string> file_names;   // one per file, for messages and the report
  std::vector<Timeline> files;
  // kPidIsRank: the file holds several ranks, pid = rank (shardscope's own layout, said by
  // a producer starting with "shardscope"); otherwise every event of the file belongs to
  // this rank (PyTorch-profiler traces: distributedInfo.rank).
  static constexpr int32_t kPidIsRank = -1;
  std::vector<int32_t> file_rank;
  // From the report.json beside a `shardscope run` trace.json ("runtime"), when there is one:
  // the host backend's --time-scale (kernels busy-waited predicted x scale) and the warm-up
  // steps run before the measured ones. -1 / 0: not known.
  double time_scale = -1;
  int32_t warmup_steps = -1;
  // Set by SelectDiffStep: the step this side was cut to (-1: the whole trace) and how it
  // was chosen; warnings about the side (time scale).
  int64_t selected_step = -1;
  std::string step_note;
  std::vector<std::string> warnings;
};

// One step of one rank: its number and the time window it spans.
struct TraceStepSpan {
  int32_t rank = 0;
  int64_t step = 0;
  int64_t begin_ns = 0;
  int64_t end_ns = 0;
};

// The steps a side holds, by (step, rank). Our own traces (`run --profile`) carry the step in
// each slice's "step" arg: a rank's step spans its slices of that step. PyTorch-profiler traces
// mark steps with ProfilerStep#N annotations (torch/profiler/profiler.py profile.step): the
// annotation's span. Empty when the side marks no step (a `simulate` trace: one step).
std::vector<TraceStepSpan> FindTraceSteps(const DiffSide& side);

// Cuts a side to one step: per rank, the slices of step `step` (by their "step" arg; else
// those starting inside the rank's step window, and device slices launched from a kept host
// slice through their correlation id). Instants, counters and flows inside the kept windows
// stay. Fails (kInvalidInput) when the side has no such step.
StatusOr<DiffSide> CutToStep(const DiffSide& side, int64_t step);

// The diff compares one step with one step, never a multi-step trace with a predicted step
// (docs/DIFF.md, "Steps"). When `measured` holds several steps it is cut to step
// `requested` (>= 0), else to its median measured step: of the steps after the warm-up
// (report.json's runtime.warmup when known; all steps otherwise), the one whose duration
// (its slowest rank's window) is the median, the lower one for an even count, the earlier
// step on a tie. `predicted` is cut to the same step when it holds steps (to its median when
// it lacks that one). Each side's step_note says what was done; a measured run that used a
// --time-scale other than 1 gets a warning (its kernels busy-waited a scaled prediction).
Status SelectDiffStep(DiffSide& predicted, DiffSide& measured, int64_t requested);

// Reads a trace file (plain or gzip-compressed), or a directory holding trace.json, or a
// directory of per-rank *.json / *.json.gz files (rank from each file's distributedInfo.rank; two files with the same rank are an
// error). Errors are kInvalidInput and name the file.
StatusOr<DiffSide> LoadDiffSide(const std::string& path);

// Several traces as one side (`shardscope analyze TRACE...`): each path as LoadDiffSide reads
// it. A PyTorch-profiler file that does not say its rank (no distributedInfo, or world_size
// 1) takes its position in `paths` as its rank, with a warning; two files of one rank are an
// error. One path is LoadDiffSide.
StatusOr<DiffSide> LoadTraceFiles(const std::vector<std::string>& paths, std::vector<std::string>* warnings);

// A side made of one in-memory timeline (tests, benchmarks), with LoadDiffSide's rank rule.
DiffSide DiffSideFromTimeline(Timeline timeline, std::string source);

struct DiffOptions {
  int32_t top_n = 20;    // ops listed (and marked in the merged trace) by contribution
  int32_t rank = -1;     // only this rank (-1: all)
  // report.json lists every critical-path step (hundreds of thousands on a large trace)
  // instead of the top_n steps holding the most time.
  bool full_report = false;
  // Holistic Trace Analysis's metrics per rank (hta_metrics.h; the same code as `shardscope
  // analyze`). Its rank is this rank.
  HtaOptions hta;
};

// What an op is, for per-class error statistics. Rules in ClassifySlice (diff_metrics.cc)
// and docs/DIFF.md.
enum class OpClass : uint8_t {
  kGemm,
  kAttention,
  kMemoryBound,     // other compute kernels (elementwise, norms, reductions, copies)
  kMemcpy,          // gpu_memcpy / gpu_memset
  kAllGather,
  kReduceScatter,
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllToAll,
  kSendRecv,
  kOtherCollective,
  kHostOp,          // host-thread slices: launches, API calls, CPU ops
  kHostGap,         // time between host slices (the wait part of a host op)
  kAllocatorStall,  // cudaMalloc / cudaFree / allocator retries on the host
  kDeviceWait,      // a device slice waiting for its launch or an event before it starts
};
inline constexpr int kOpClassCount = static_cast<int>(OpClass::kDeviceWait) + 1;
std::string_view OpClassName(OpClass op_class);
bool IsCollectiveClass(OpClass op_class);

// The name used for alignment. Lowercased; "void " dropped; template arguments <...> and
// parameter lists (...) dropped; hexadecimal hashes (a run of >= 16 hex digits holding a
// digit) and then every remaining run of decimal digits become '#'; whitespace squeezed.
// Collectives are named by their type instead ("nccl:all_gather"), so a predicted
// "ncclDevKernel_AllGather_Ring_LL" meets a measured "ncclDevKernel_AllGather_RING_SIMPLE".
std::string NormalizeKernelName(std::string_view name);

// A track: one host thread or one device stream of one rank, on one side.
struct DiffTrack {
  int32_t rank = 0;
  int32_t file = 0;     // index into DiffSide::files
  int32_t pid = 0;      // as in the file
  int32_t tid = 0;
  bool device = false;
  std::string name;     // the file's thread_name, or "host thread <tid>" / "stream <tid>"
};

// A slice as the diff sees it (user annotations are not events; they only mark steps).
struct DiffEvent {
  int64_t ts_ns = 0;
  int64_t dur_ns = 0;
  int64_t op_id = -1;
  int64_t correlation = -1;
  int64_t seq = -1;          // collective sequence number, -1 when none
  int32_t rank = 0;
  int32_t track = 0;         // index into SideAnalysis::tracks
  uint32_t file = 0;         // DiffSide::files[file].slices[slice]
  uint32_t slice = 0;
  int32_t name_id = -1;      // DiffResult::names
  int32_t process_group = -1;  // DiffResult::process_groups, -1 when none
  int32_t parent = -1;       // enclosing host slice on the same track, -1 at top level
  OpClass op_class = OpClass::kHostOp;
  bool device = false;
  bool synchronizes = false;  // a host call that blocks on the device (name holds "Synchronize")
  int64_t end_ns() const { return ts_ns + dur_ns; }
};

// Metrics of one rank: its step, the busy time of each stream, and Holistic Trace Analysis's
// metrics (hta_metrics.h; the same implementation as `shardscope analyze`).
struct StreamBusy {
  int32_t track = 0;
  int64_t busy_ns = 0;
};
struct RankMetrics {
  int32_t rank = 0;
  int64_t step_start_ns = 0;
  int64_t step_ns = 0;              // per step: span / steps
  int32_t steps = 1;
  bool from_profiler_steps = false; // ProfilerStep# annotations (else the device span)
  std::vector<StreamBusy> streams;  // per device track, in track order
  HtaRankMetrics hta;               // temporal breakdown, overlap, idle time per stream
  int64_t exposed_comm_ns() const { return hta.comm_ns - hta.overlap_ns; }
};

// One op on a critical path, in path order: the time the path spends waiting before it
// (reaching its start) and inside it (reaching its end).
struct CriticalPathStep {
  int32_t event = 0;
  int64_t wait_ns = 0;
  int64_t dur_ns = 0;
};
struct CriticalPath {
  int64_t start_ns = 0;    // earliest event start of the side (the graph's origin)
  int64_t length_ns = 0;   // = latest event end - start_ns
  std::vector<CriticalPathStep> steps;
};

struct SideAnalysis {
  std::vector<DiffTrack> tracks;
  std::vector<DiffEvent> events;   // sorted by (rank, track, ts, longer first)
  std::vector<int32_t> match;      // per event: the matched event on the other side, or -1
  std::vector<RankMetrics> ranks;  // by rank, ascending
  CriticalPath critical_path;
  std::vector<int64_t> on_path_ns; // per event: wait + duration spent on the critical path
  int64_t step_ns = 0;             // the slowest rank's step
};

struct OpError {
  int32_t predicted = -1;          // event index on the predicted side (-1: unmatched)
  int32_t measured = -1;
  OpClass op_class = OpClass::kHostOp;
  int64_t duration_error_ns = 0;   // measured - predicted duration
  int64_t start_shift_ns = 0;      // measured - predicted start, each from its rank's step start
  // Measured - predicted time of the op on the critical paths, all ranks' instances of it
  // together (the paths may run through different ranks). The contributions of all ops add
  // up to the difference of the critical paths.
  int64_t contribution_ns = 0;
};

struct ClassStats {
  OpClass op_class = OpClass::kHostOp;
  int64_t count = 0;               // matched pairs (host gap: matched host ops with a gap)
  int64_t median_error_ns = 0;     // of the signed errors
  int64_t p90_abs_error_ns = 0;    // 90th percentile of |error|
  int64_t total_error_ns = 0;
  int64_t contribution_ns = 0;     // to the critical-path (step) difference
};

// |measured - predicted| / predicted duration over matched device ops (kernels, copies,
// collectives) whose predicted duration is positive: the per-op accuracy figure a
// calibration is judged by (median and nearest-rank 90th percentile).
struct RelativeErrors {
  int64_t count = 0;
  double median = 0;
  double p90 = 0;
};

// Where the two critical paths part: the steps are compared in order through the matching.
struct Divergence {
  bool diverged = false;
  int64_t index = 0;               // first differing step
  int32_t last_common_predicted = -1;  // event before it, on the predicted side (-1: none)
  int32_t predicted = -1;          // the paths' events at `index` (-1 past a path's end)
  int32_t measured = -1;
};

struct DiffResult {
  SideAnalysis predicted;
  SideAnalysis measured;
  std::vector<std::string> names;           // normalized names, by name_id
  std::vector<std::string> process_groups;  // by DiffEvent::process_group
  int64_t matched_by_op_id = 0;
  int64_t matched_by_anchor = 0;
  int64_t matched_by_name = 0;
  std::vector<ClassStats> classes;          // classes that occur, in OpClass order
  RelativeErrors device_relative;           // per matched device op
  std::vector<OpError> errors;              // every matched pair, by predicted event
  std::vector<OpError> top;                 // the top-N ops by |contribution|, one pair each
  Divergence divergence;
  int64_t matched() const { return matched_by_op_id + matched_by_anchor + matched_by_name; }
};

// Matches, measures and compares. Fails (kInvalidInput) only when a side's dependencies
// form a cycle (inconsistent collective order between ranks).
StatusOr<DiffResult> Diff(const DiffSide& predicted, const DiffSide& measured, const DiffOptions& options);

// report.md: headline, per-class table, top-N, critical-path divergence, unmatched counts.
std::string DiffReportMarkdown(const DiffSide& predicted, const DiffSide& measured, const DiffResult& diff,
                               const DiffOptions& options);
// report.json (schema "shardscope.diff/2" in docs/DIFF.md).
std::string DiffReportJson(const DiffSide& predicted, const DiffSide& measured, const DiffResult& diff,
                           const DiffOptions& options);
// The merged Perfetto trace: per rank a "rank R predicted" (pid 2R) and "rank R measured"
// (pid 2R+1) process, each side shifted so that it starts at 0; flows link matched ops;
// instants mark the top-N ops.
Status WriteDiffTrace(const DiffSide& predicted, const DiffSide& measured, const DiffResult& diff,
                      const std::string& path);
// DIR/trace.json, DIR/report.md, DIR/report.json (each written to a temporary file and
// renamed). Creates DIR.
Status WriteDiffOutputs(const DiffSide& predicted, const DiffSide& measured, const DiffResult& diff,
                        const std::string& dir, const DiffOptions& options);

}  // namespace shardscope::traces

#endif  // SHARDSCOPE_ANALYSIS_DIFF_H_

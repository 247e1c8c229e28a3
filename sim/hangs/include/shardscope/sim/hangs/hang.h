// Explaining a simulation that cannot finish, the way one reads a hung job: a wait-for graph
// over the blocked state the engine reports (ranks' hosts and streams, events, communicator
// rendezvous), its cycles and root causes (the minimal blocking set: the components of the
// graph that wait for nothing outside themselves), a short explanation, the time a NCCL
// watchdog would fire, and per-rank dumps in PyTorch Flight Recorder's layout.
#ifndef SHARDSCOPE_SIM_HANG_H_
#define SHARDSCOPE_SIM_HANG_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "shardscope/base/rank_ranges.h"
#include "shardscope/sim/engine/engine.h"
#include "shardscope/traces/schedule.h"
#include "shardscope/traces/timeline.h"

namespace shardscope::sim {

using ::shardscope::CompressRanks;  // base/rank_ranges.h; callers name it sim::CompressRanks

struct HangOptions {
  // kProcessGroupNCCLDefaultTimeout = 10 * 60 * 1000 ms
  // (torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp), the `timeout=` default of
  // init_process_group for NCCL.
  int64_t watchdog_timeout_ns = int64_t{600'000} * 1'000'000;
  // Entries per Flight Recorder dump: the last N collectives of the rank. PyTorch sizes its
  // ring buffer with TORCH_NCCL_TRACE_BUFFER_SIZE (newer name TORCH_FR_BUFFER_SIZE); 2000 is
  // the value PyTorch's Flight Recorder tutorial recommends and gives as the default
  // (pytorch/tutorials prototype_source/flight_recorder_tutorial.rst). A buffer that small
  // enough to lose the stuck collective (20 did, on bucketed DDP) hides the very entry
  // `shardscope flight-recorder` needs.
  int32_t flight_recorder_entries = 2000;
};

enum class WaitVertexKind : uint8_t { kHost, kStream, kEvent, kRendezvous };

struct WaitVertex {
  WaitVertexKind kind = WaitVertexKind::kHost;
  int32_t rank = -1;           // host, stream, event
  int32_t stream = -1;         // stream
  int32_t event = -1;          // event
  int32_t communicator = -1;   // rendezvous
  int64_t seq = 0;             // rendezvous: 1-based per-communicator sequence number
  std::string label;           // "rank 3 host", "rank 3 stream 'comm'", "all_gather #17 on 'dp'"
};

struct WaitEdge {
  size_t from = 0, to = 0;     // "from waits for to"
};

enum class RootCauseKind : uint8_t {
  kOutOfMemory,    // a rank stopped on an OOM; the others wait for it
  kNeverIssued,    // a rank finished (or stopped) without issuing a collective its peers entered
  kMismatch,       // members entered one sequence number with different types / sizes / dtypes
  kCycle,          // a cycle of waits (e.g. two communicators entered in opposite orders)
  kOther,
};

struct RootCause {
  RootCauseKind kind = RootCauseKind::kOther;
  std::vector<int32_t> ranks;          // the ranks at the root (the OOM rank, the mismatched ranks, ...)
  int32_t communicator = -1;           // the collective involved, where one is
  int64_t seq = 0;
  std::vector<size_t> vertices;        // the component (a cycle: in cycle order)
  std::vector<int32_t> waiting_ranks;  // blocked ranks that wait for this cause (transitively)
  std::string text;                    // the explanation line
};

// A send or recv that one side posted while its peer has not reached the matching op. NCCL
// pairs point-to-point operations per communicator, so the side that posted waits in it.
struct HalfArrivedP2p {
  int32_t rank = -1;                   // the side that posted and waits
  int32_t peer = -1;                   // the side that has not reached the matching op
  int32_t communicator = -1;
  traces::CollectiveType type = traces::CollectiveType::kSend;  // what `rank` posted
  int64_t p2p_seq = 0;                 // Flight Recorder's p2p_seq_id of the op on `rank`
  int64_t bytes = 0;
  int64_t arrived_ns = -1;             // when it reached the head of its stream
  // "rank 2 is in send to rank 3 on 'pp' (p2p_seq_id 1); rank 3 never posted the matching
  // recv (it finished its program)"
  std::string text;
};

struct HangReport {
  std::vector<int32_t> blocked_ranks;
  std::vector<HalfArrivedP2p> p2p;           // half-arrived send/recv pairs, by rank and stream
  std::vector<WaitVertex> vertices;
  std::vector<WaitEdge> edges;
  std::vector<std::vector<size_t>> cycles;   // strongly connected components with a cycle
  std::vector<RootCause> causes;             // the minimal blocking set
  std::vector<std::string> explanation;      // one line per cause
  // The NCCL watchdog: the oldest unfinished collective (over all ranks) times out first.
  int64_t watchdog_timeout_ns = 0;
  int64_t watchdog_fires_at_ns = -1;         // -1: no collective pending anywhere
  int32_t watchdog_rank = -1;
  int32_t watchdog_communicator = -1;
  int64_t watchdog_seq = 0;
  std::string watchdog_collective;           // "all_gather #17 on 'dp'"
};

// Builds the report from a hung result. Deterministic.
HangReport AnalyzeHang(const traces::Schedule& schedule, const SimulationResult& result,
                       const HangOptions& options = {});


// report.json's "hang_report" section (JSON text).
std::string HangReportJson(const traces::Schedule& schedule, const HangReport& report);

// The ranks that get a Flight Recorder dump: the blocked ranks, at most `limit`.
std::vector<int32_t> FlightRecorderRanks(const SimulationResult& result, size_t limit);

// Records, for chosen ranks, every collective's launch and device span: what a Flight
// Recorder would have seen. Attach it to a (second, deterministic) run after a hang.
class CollectiveRecorder : public EngineObserver {
 public:
  CollectiveRecorder(const traces::Schedule& schedule, std::vector<int32_t> ranks);
  bool WantsRank(int32_t rank) const override;
  void OnHostSpan(const HostSpan& span) override;
  void OnDeviceSpan(const DeviceSpan& span) override;

  struct Times {
    int64_t created_ns = -1;    // host launch
    int64_t started_ns = -1;    // device start (every member arrived)
    int64_t completed_ns = -1;
  };
  // Per rank, per op index of a collective.
  const std::map<int32_t, Times>& TimesOf(int32_t rank) const;

 private:
  const traces::Schedule& schedule_;
  std::vector<bool> wanted_;
  std::map<int32_t, std::map<int32_t, Times>> times_;
};

// Draws a hang on a trace, for the ranks in `traced_ranks` (those the trace shows):
// - a "hang" slice on every track (host thread, tid 0, or stream, tid 1 + stream) of the
//   wait-for graph: from when it began waiting to past the end of the run, named after what
//   it waits in ("hang: stream 's0': op 3 all_gather on 'dp' (waiting for peers)"); a rank
//   that finished its program but is waited for gets one on its host thread from its end;
// - a "hang" flow along each edge of the wait-for graph between those tracks, rendezvous and
//   event vertices collapsed into the tracks they lead to, so Perfetto draws who waits for
//   whom. A flow runs from its track's slice, 1 ns after the wait began, to the waited-for
//   track's slice, 1 ns after that one began waiting, or at the flow's start if later.
// Slices rather than instants: Perfetto binds JSON flow events only to a slice open on the
// track (trace_processor's FlowTracker), and an instant is a 0-length slice closed at once;
// the 1 ns keeps a flow off a slice that ends where the wait begins. A flow end that sorts
// before its start is dropped ("flow_end_without_start"), hence the clamp.
void WriteHangTrace(const traces::Schedule& schedule, const SimulationResult& result, const HangReport& report,
                    const std::vector<int32_t>& traced_ranks, traces::TimelineSink& sink);

// One rank's dump in the layout of PyTorch's Flight Recorder JSON dump (torch/csrc/distributed/
// c10d/FlightRecorder.hpp / FlightRecorderDetail.hpp dump_json; TORCH_NCCL_DEBUG_INFO_PICKLE=0
// picks JSON over the default pickle): version, pg_config, pg_status and the last
// `flight_recorder_entries` collective entries with simulated times (ns from the step start).
// `recorder` may be null: completed collectives then carry no times.
std::string FlightRecorderJson(const traces::Schedule& schedule, const SimulationResult& result, int32_t rank,
                               const CollectiveRecorder* recorder, const HangOptions& options = {});

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_HANG_H_

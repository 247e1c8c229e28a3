// The timeline model: what happened (or is predicted to happen) on each rank's host thread
// and CUDA streams. Predicted timelines come from sim/, measured ones from runtime/ and
// profiler/, imported ones from PyTorch-profiler traces; the diff compares two of them.
//
// Tracks follow the PyTorch-profiler (Kineto) conventions: pid = rank, tid = host thread or
// stream. Producers write into a TimelineSink, so a writer can stream events to disk with
// memory independent of trace size; Timeline is the in-memory sink used by readers and the
// diff. Timestamps and durations are int64 nanoseconds.
#ifndef SHARDSCOPE_TRACES_TIMELINE_H_
#define SHARDSCOPE_TRACES_TIMELINE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace shardscope::traces {

// Kineto's event categories ("cat" in Chrome JSON).
enum class Category : uint8_t {
  kKernel,            // "kernel"
  kGpuMemcpy,         // "gpu_memcpy"
  kGpuMemset,         // "gpu_memset"
  kCudaRuntime,       // "cuda_runtime"
  kCudaDriver,        // "cuda_driver"
  kCudaSync,          // "cuda_sync"
  kCpuOp,             // "cpu_op"
  kUserAnnotation,    // "user_annotation"
  kGpuUserAnnotation, // "gpu_user_annotation"
  kOther,             // anything else ("cat" kept in Slice::raw_category)
};
std::string_view CategoryName(Category category);
Category ParseCategory(std::string_view name);  // unknown -> kOther

struct Arg {
  std::string key;
  std::variant<int64_t, double, std::string> value;
  bool operator==(const Arg&) const = default;
};

// NCCL-style arguments of a collective kernel (PyTorch profiler's names in comments).
struct CollectiveInfo {
  std::string collective_name;   // "Collective name": all_gather, reduce_scatter, ...
  std::string process_group;     // "Process Group Name"
  std::string dtype;             // "dtype"
  int64_t in_nelems = 0;         // "In msg nelems"
  int64_t out_nelems = 0;        // "Out msg nelems"
  int32_t group_size = 0;        // "Group size"
  int64_t seq = -1;              // "Seq": per-communicator sequence number
  int32_t rank = -1;             // "Rank" (global)
  bool operator==(const CollectiveInfo&) const = default;
};

struct ProcessInfo {
  int32_t pid = 0;
  std::string name;     // "rank 3"
  int32_t sort_index = 0;
  bool operator==(const ProcessInfo&) const = default;
};

struct ThreadInfo {
  int32_t pid = 0;
  int32_t tid = 0;
  std::string name;     // "host thread", "stream 1 compute"
  int32_t sort_index = 0;
  bool operator==(const ThreadInfo&) const = default;
};

struct Slice {
  int32_t pid = 0;
  int32_t tid = 0;
  int64_t ts_ns = 0;
  int64_t dur_ns = 0;
  std::string name;
  Category category = Category::kOther;
  std::string raw_category;            // set only when category == kOther
  int64_t op_id = -1;                  // the schedule op that caused it ("op id"); -1: none
  int64_t correlation = -1;            // "correlation": links a launch to its kernel
  std::optional<CollectiveInfo> collective;
  std::vector<Arg> args;               // any further args, kept in order
  bool operator==(const Slice&) const = default;
};

struct Instant {
  int32_t pid = 0;
  int32_t tid = 0;
  int64_t ts_ns = 0;
  std::string name;
  std::string category;
  char scope = 't';                    // 't' thread, 'p' process, 'g' global
  std::vector<Arg> args;
  bool operator==(const Instant&) const = default;
};

// One sample of a counter track; every value becomes its own track "<name> <key>".
struct CounterSample {
  int32_t pid = 0;
  int64_t ts_ns = 0;
  std::string name;
  std::vector<std::pair<std::string, double>> values;
  bool operator==(const CounterSample&) const = default;
};

// A flow arrow from a point inside one slice to the start of another.
struct Flow {
  int64_t id = 0;
  std::string name = "ac2g";
  std::string category = "ac2g";
  int32_t from_pid = 0, from_tid = 0;
  int64_t from_ts_ns = 0;
  int32_t to_pid = 0, to_tid = 0;
  int64_t to_ts_ns = 0;
  bool operator==(const Flow&) const = default;
};

// Trace-wide information (Kineto's top-level keys).
struct TraceInfo {
  std::string backend = "nccl";        // distributedInfo.backend
  int32_t rank = 0;                    // distributedInfo.rank
  int32_t world_size = 1;              // distributedInfo.world_size
  int64_t base_time_ns = 0;            // baseTimeNanoseconds
  std::string producer = "shardscope"; // who wrote it ("shardscope simulate", "torch", ...)
  std::vector<Arg> extra;              // further top-level keys
  bool operator==(const TraceInfo&) const = default;
};

// Receives timeline events in any order. Implementations must not assume sorting.
class TimelineSink {
 public:
  virtual ~TimelineSink() = default;
  virtual void OnProcess(const ProcessInfo& process) = 0;
  virtual void OnThread(const ThreadInfo& thread) = 0;
  virtual void OnSlice(const Slice& slice) = 0;
  virtual void OnInstant(const Instant& instant) = 0;
  virtual void OnCounter(const CounterSample& sample) = 0;
  virtual void OnFlow(const Flow& flow) = 0;
};

// The whole timeline in memory.
class Timeline : public TimelineSink {
 public:
  TraceInfo info;
  std::vector<ProcessInfo> processes;
  std::vector<ThreadInfo> threads;
  std::vector<Slice> slices;
  std::vector<Instant> instants;
  std::vector<CounterSample> counters;
  std::vector<Flow> flows;

  void OnProcess(const ProcessInfo& process) override { processes.push_back(process); }
  void OnThread(const ThreadInfo& thread) override { threads.push_back(thread); }
  void OnSlice(const Slice& slice) override { slices.push_back(slice); }
  void OnInstant(const Instant& instant) override { instants.push_back(instant); }
  void OnCounter(const CounterSample& sample) override { counters.push_back(sample); }
  void OnFlow(const Flow& flow) override { flows.push_back(flow); }

  // Replays everything into another sink (metadata first, then events in stored order).
  void ReplayInto(TimelineSink& sink) const;
};

}  // namespace shardscope::traces

#endif  // SHARDSCOPE_TRACES_TIMELINE_H_

// `shardscope alloc-replay --snapshot FILE.pickle`: replays a real memory snapshot
// (torch.cuda.memory._dump_snapshot) through the caching-allocator model and compares every
// decision with the recorded one (sim/memory_snapshot.h, docs/ALLOC_TRACE.md).
//
// Exit codes (through main): 0 when the model reproduces the trace exactly, 1 when it
// diverges (the report is printed first), 2 when the file cannot be read as a snapshot.
#include <iostream>
#include <string>

#include <fmt/format.h>

#include "commands.h"
#include "shardscope/analysis/memory_snapshot.h"
#include "shardscope/base/pickle.h"

namespace shardscope::cli {

Status RunAllocReplaySnapshot(const std::string& path, bool json, int64_t device_memory_bytes) {
  if (device_memory_bytes < 0) {
    return Status::InvalidInput(
        fmt::format("--device-memory-bytes: expected a positive number of bytes, got {}", device_memory_bytes));
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(std::unique_ptr<traces::PickleDocument> doc, sim::ReadMemorySnapshotPickleFile(path));
  SHARDSCOPE_ASSIGN_OR_RETURN(sim::RecordedSnapshot snapshot, sim::ReadMemorySnapshot(doc->root(), path));
  sim::SnapshotReplayOptions options;
  options.device_memory_bytes = device_memory_bytes;
  StatusOr<sim::SnapshotReplay> replay = sim::ReplaySnapshot(snapshot, options);
  if (!replay.ok()) {
    // The library names the trace entry or segment; say which file it is in.
    if (replay.status().code() != StatusCode::kInvalidInput) return replay.status();
    return Status::InvalidInput(fmt::format("{}: {}", path, replay.status().message()));
  }
  std::cout << (json ? sim::SnapshotReplayJson(snapshot, *replay, path) : sim::SnapshotReplayText(snapshot, *replay, path));
  if (replay->exact) return Status::Ok();
  // main() maps every error but bad input to exit code 1, which "diverges" must return.
  return Status::Internal(fmt::format("the model diverges from the recorded allocator at device_traces[{}][{}]",
                                      snapshot.device, replay->first_divergence->index));
}

}  // namespace shardscope::cli

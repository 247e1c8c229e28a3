// Memory snapshot replay (see memory_snapshot.h, docs/ALLOC_TRACE.md): the start state and
// the replay. Reading the pickle is memory_snapshot_read.cc, the reports
// memory_snapshot_report.cc.
//
// Rebuilding the start state. Undoing the trace from the final segments, last action first
// (as MemoryViz.js simulate_memory walks back from the snapshot): an alloc removes its block
// from the allocated set, a free_completed/free_requested puts it back, a segment_alloc
// removes its segment, a segment_free puts it back. What the trace does not say is the size
// of a block allocated before recording began and freed during it (free actions carry the
// requested size). It follows from the allocator's rules: the block is the request rounded
// (round_size), plus, in the large pool, the gap up to the next block when that gap is
// <= 1 MiB, because should_split leaves a large block whole when the remainder would be
// <= kSmallSize, and every large-pool block (free or not) is larger than that (requests
// above 1 MiB, remainders above 1 MiB, merges only grow) so such a gap cannot be a block of
// its own. Free space is one block per gap, as free_block merges neighbours.
#include "shardscope/analysis/memory_snapshot.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "memory_snapshot_internal.h"

namespace shardscope::sim {
namespace snapshot_internal {

std::string Where(int32_t device, int64_t index) { return fmt::format("device_traces[{}][{}]", device, index); }

std::string Describe(const std::string& action, uint64_t address, int64_t size, int64_t stream) {
  if (action == "oom") return fmt::format("oom ({} B, stream {})", size, stream);
  return fmt::format("{} {:#x} ({} B, stream {})", action, address, size, stream);
}

int32_t StreamIndex(const std::vector<int64_t>& streams, int64_t stream) {
  auto it = std::lower_bound(streams.begin(), streams.end(), stream);
  return static_cast<int32_t>(it - streams.begin());
}

}  // namespace snapshot_internal

namespace {

using snapshot_internal::Describe;
using snapshot_internal::kMaxStreams;
using snapshot_internal::kSmallBuffer;
using snapshot_internal::kSmallSize;
using snapshot_internal::kUnlimitedCapacity;
using snapshot_internal::StreamIndex;
using snapshot_internal::Where;

}  // namespace

StatusOr<SnapshotAllocTrace> SnapshotToAllocTrace(const RecordedSnapshot& snapshot,
                                                  const SnapshotReplayOptions& options) {
  const int32_t device = snapshot.device;
  if (options.device_memory_bytes < 0 || options.device_memory_bytes > kUnlimitedCapacity) {
    return Status::InvalidInput(fmt::format("device memory: expected a positive number of bytes up to {}, got {}",
                                            kUnlimitedCapacity, options.device_memory_bytes));
  }
  // Every size below 2^56 and reserved bytes below that too (checked as they are summed),
  // so that no sum here or in the model can overflow.
  for (const RecordedAction& a : snapshot.trace) {
    if (a.size > kUnlimitedCapacity || a.device_free > kUnlimitedCapacity) {
      return Status::InvalidInput(fmt::format("{}: {} B is more than any device holds ({} B)", Where(device, a.index),
                                              std::max(a.size, a.device_free), kUnlimitedCapacity));
    }
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(AllocatorConfig config, AllocatorConfig::Parse(snapshot.alloc_conf));
  if (config.expandable_segments) {
    return Status::InvalidInput("allocator_settings: expandable_segments is on; replaying expandable segments "
                                "(segment_map/segment_unmap) is not modelled");
  }
  SnapshotAllocTrace out;

  // Streams, renumbered in the order of their values.
  std::vector<int64_t>& streams = out.streams;
  for (const RecordedSegment& seg : snapshot.segments) streams.push_back(seg.stream);
  for (const RecordedAction& a : snapshot.trace) streams.push_back(a.stream);
  std::sort(streams.begin(), streams.end());
  streams.erase(std::unique(streams.begin(), streams.end()), streams.end());
  if (streams.empty()) streams.push_back(0);
  if (streams.size() > kMaxStreams) {
    return Status::InvalidInput(fmt::format("the snapshot uses {} streams; at most {} are replayed", streams.size(),
                                            kMaxStreams));
  }

  // round_size as the recorded allocator applied it.
  std::unique_ptr<DeviceMemory> scratch_memory = MakeCapacityDeviceMemory(0);
  CompletedStreamEvents scratch_events;
  CachingAllocator rounding(config, *scratch_memory, scratch_events);

  struct Segment {
    int64_t size = 0;
    int64_t stream = 0;
    bool small = false;
  };
  struct Live {
    int64_t size = 0;  // 0: not known yet (allocated before recording, freed during it)
    int64_t requested = 0;
  };
  std::map<uint64_t, Segment> segments;
  std::map<uint64_t, Live> live;
  for (size_t s = 0; s < snapshot.segments.size(); ++s) {
    const RecordedSegment& seg = snapshot.segments[s];
    if (seg.is_expandable) {
      return Status::InvalidInput(fmt::format("segments[{}]: an expandable segment; replaying expandable "
                                              "segments is not modelled", s));
    }
    if (seg.segment_type != "small" && seg.segment_type != "large") {
      return Status::InvalidInput(fmt::format("segments[{}].segment_type: expected 'small' or 'large', got '{}'", s,
                                              seg.segment_type));
    }
    if (seg.total_size <= 0 || seg.total_size > kUnlimitedCapacity || seg.address == 0) {
      return Status::InvalidInput(fmt::format("segments[{}]: expected a positive address and size, got {:#x}, {} B", s,
                                              seg.address, seg.total_size));
    }
    if (!segments.emplace(seg.address, Segment{seg.total_size, seg.stream, seg.segment_type == "small"}).second) {
      return Status::InvalidInput(fmt::format("segments[{}]: a second segment at {:#x}", s, seg.address));
    }
    for (size_t b = 0; b < seg.blocks.size(); ++b) {
      const RecordedBlock& block = seg.blocks[b];
      if (block.state == "inactive") continue;
      if (block.size <= 0) {
        return Status::InvalidInput(fmt::format("segments[{}].blocks[{}]: an allocated block of {} bytes", s, b,
                                                block.size));
      }
      // A block still waiting for its streams (active_pending_free) was allocated at the
      // start too, as far as the trace goes.
      if (!live.emplace(block.address, Live{block.size, block.requested_size}).second) {
        return Status::InvalidInput(fmt::format("segments[{}].blocks[{}]: a second block at {:#x}", s, b,
                                                block.address));
      }
    }
  }

  // Undo the trace, last action first.
  for (auto it = snapshot.trace.rbegin(); it != snapshot.trace.rend(); ++it) {
    const RecordedAction& a = *it;
    auto inconsistent = [&](std::string_view what) {
      return Status::InvalidInput(fmt::format("{}: {}: {} (the trace does not lead to the final segments)",
                                              Where(device, a.index), Describe(a.action, a.address, a.size, a.stream),
                                              what));
    };
    if (a.action == "alloc") {
      auto found = live.find(a.address);
      if (found == live.end()) return inconsistent("no later free and not allocated in the final segments");
      live.erase(found);
    } else if (a.action == "free_completed") {
      if (!live.emplace(a.address, Live{0, a.size}).second) {
        return inconsistent("freed again later without an alloc in between");
      }
    } else if (a.action == "free_requested") {
      if (live.count(a.address) == 0) return inconsistent("never completed and not pending in the final segments");
    } else if (a.action == "segment_alloc") {
      auto found = segments.find(a.address);
      if (found == segments.end()) return inconsistent("no later segment_free and not in the final segments");
      if (found->second.size != a.size) {
        return inconsistent(fmt::format("the segment there has {} B later", found->second.size));
      }
      segments.erase(found);
    } else if (a.action == "segment_free") {
      // Small-pool segments are exactly kSmallBuffer; large-pool ones are >= 10 MiB
      // (get_allocation_size), so the size tells the pool.
      if (!segments.emplace(a.address, Segment{a.size, a.stream, a.size == kSmallBuffer}).second) {
        return inconsistent("the segment is freed twice");
      }
      if (a.size <= 0 || a.size > kUnlimitedCapacity) return inconsistent("expected a positive size");
    } else if (a.action == "segment_map" || a.action == "segment_unmap") {
      return Status::InvalidInput(fmt::format("{}: {}: expandable segments are not modelled in a snapshot replay",
                                              Where(device, a.index), a.action));
    } else if (a.action != "oom" && a.action != "snapshot") {
      return Status::InvalidInput(fmt::format("{}.action: unknown action '{}' (expected alloc, free_requested, "
                                              "free_completed, segment_alloc, segment_free, oom or snapshot)",
                                              Where(device, a.index), a.action));
    }
  }

  // Every block allocated at the start lies in a segment that existed then.
  for (const auto& [address, block] : live) {
    auto seg = segments.upper_bound(address);
    if (seg == segments.begin() || address >= std::prev(seg)->first + static_cast<uint64_t>(std::prev(seg)->second.size)) {
      return Status::InvalidInput(fmt::format("the block at {:#x} ({} B requested), allocated when the trace begins, "
                                              "lies in no segment that existed then", address, block.requested));
    }
  }

  // The initial segments, blocks in address order.
  AllocTrace& trace = out.trace;
  int64_t next_id = 0;
  std::map<uint64_t, int64_t> live_id;  // allocated block address -> id
  for (const auto& [address, seg] : segments) {
    AllocTraceInitialSegment initial;
    initial.address = address;
    initial.stream = StreamIndex(streams, seg.stream);
    initial.small = seg.small;
    const uint64_t end = address + static_cast<uint64_t>(seg.size);
    uint64_t cursor = address;
    for (auto it = live.lower_bound(address); it != live.end() && it->first < end; ++it) {
      const uint64_t block_address = it->first;
      const auto next = std::next(it);
      const uint64_t boundary = next != live.end() && next->first < end ? next->first : end;
      int64_t size = it->second.size;
      if (size == 0) {
        size = rounding.RoundSize(std::max<int64_t>(it->second.requested, 1));
        const int64_t gap = static_cast<int64_t>(boundary - block_address) - size;
        if (gap < 0) {
          return Status::InvalidInput(fmt::format("the block at {:#x} ({} B requested, {} B rounded), allocated when "
                                                  "the trace begins, does not fit before {:#x}", block_address,
                                                  it->second.requested, size, boundary));
        }
        // should_split: a large-pool block keeps a remainder of <= 1 MiB, and an oversize
        // one (>= max_split_size) is never split.
        if (!seg.small && gap > 0 && (gap <= kSmallSize || size >= config.max_split_size)) size += gap;
      }
      if (block_address < cursor || size > static_cast<int64_t>(boundary - block_address)) {
        return Status::InvalidInput(fmt::format("the block at {:#x} ({} B) overlaps its neighbour in the segment at "
                                                "{:#x}", block_address, size, address));
      }
      if (block_address > cursor) initial.blocks.push_back({static_cast<int64_t>(block_address - cursor), -1, 0});
      initial.blocks.push_back({size, next_id, it->second.requested});
      live_id[block_address] = next_id++;
      cursor = block_address + static_cast<uint64_t>(size);
    }
    if (cursor < end) initial.blocks.push_back({static_cast<int64_t>(end - cursor), -1, 0});
    out.initial_reserved_bytes += seg.size;
    if (out.initial_reserved_bytes > kUnlimitedCapacity) {
      return Status::InvalidInput(fmt::format("the segments when the trace begins hold more than {} B",
                                              kUnlimitedCapacity));
    }
    trace.initial_segments.push_back(std::move(initial));
  }
  out.initial_allocated_blocks = static_cast<int64_t>(live_id.size());

  // The calls, and what bounds the device. Bursts of segment_free: inside a malloc (the
  // release-and-retry path of malloc: release_cached_blocks, then alloc_block again,
  // whose segment_alloc and the alloc follow; or an oom follows) or empty_cache.
  auto next_action = [&](size_t i) {
    while (i < snapshot.trace.size() && snapshot.trace[i].action == "snapshot") ++i;
    return i;
  };
  int64_t reserved = out.initial_reserved_bytes;
  std::optional<int64_t> bound;
  std::string bound_source;
  auto consider = [&](int64_t value, std::string source) {
    if (!bound || value < *bound) {
      bound = value;
      bound_source = std::move(source);
    }
  };
  std::string previous;
  std::map<uint64_t, int64_t> pending;  // address -> id: free requested, not yet completed
  for (size_t i = 0; i < snapshot.trace.size(); ++i) {
    const RecordedAction& a = snapshot.trace[i];
    const int32_t stream = StreamIndex(streams, a.stream);
    if (a.action == "alloc") {
      trace.ops.push_back(AllocTraceAlloc{next_id, a.size, stream});
      live_id[a.address] = next_id++;
    } else if (a.action == "free_requested") {
      auto it = live_id.find(a.address);
      if (it == live_id.end()) {  // the reverse walk rules this out
        previous = a.action;
        continue;
      }
      const size_t next = next_action(i + 1);
      const bool completes_now = next < snapshot.trace.size() && snapshot.trace[next].action == "free_completed" &&
                                 snapshot.trace[next].address == a.address;
      if (completes_now) {
        trace.ops.push_back(AllocTraceFree{it->second});
      } else {
        // free: stream_uses not empty -> insert_events; the block returns to the pool in
        // process_events (or synchronize_and_free_events) once they complete.
        pending[a.address] = it->second;
        out.deferred_free_requests.push_back(a.index);
      }
      live_id.erase(it);
    } else if (a.action == "free_completed") {
      // The completion of a deferred free, or of one requested before recording began.
      auto it = pending.find(a.address);
      if (it != pending.end()) {
        out.deferred_free_ops.push_back(static_cast<int64_t>(trace.ops.size()));
        trace.ops.push_back(AllocTraceFree{it->second});
        pending.erase(it);
      } else if (auto held = live_id.find(a.address); held != live_id.end()) {
        out.deferred_free_ops.push_back(static_cast<int64_t>(trace.ops.size()));
        trace.ops.push_back(AllocTraceFree{held->second});
        live_id.erase(held);
      }
    } else if (a.action == "segment_alloc") {
      trace.segment_addresses.push_back(a.address);
      reserved += a.size;
      if (reserved > kUnlimitedCapacity) {
        return Status::InvalidInput(fmt::format("{}: the segments hold more than {} B", Where(device, a.index),
                                                kUnlimitedCapacity));
      }
    } else if (a.action == "segment_free") {
      if (previous != "segment_free") {
        size_t j = i;
        while (j < snapshot.trace.size() &&
               (snapshot.trace[j].action == "segment_free" || snapshot.trace[j].action == "snapshot")) {
          ++j;
        }
        const bool then_segment = j < snapshot.trace.size() && snapshot.trace[j].action == "segment_alloc";
        const size_t after = then_segment ? next_action(j + 1) : j;
        if (then_segment && after < snapshot.trace.size() && snapshot.trace[after].action == "alloc") {
          // cudaMalloc failed at `reserved` + the segment, then succeeded after the release.
          out.retry_bursts.push_back(a.index);
          consider(reserved + snapshot.trace[j].size - 1, fmt::format("retry at {}", Where(device, a.index)));
        } else if (!(j < snapshot.trace.size() && snapshot.trace[j].action == "oom")) {
          trace.ops.push_back(AllocTraceEmptyCache{});
        }
      }
      reserved -= a.size;
    } else if (a.action == "oom") {
      // malloc's OOM branch: the rounded request, after the release; cudaMemGetInfo's free
      // bytes give the device's capacity for this allocator.
      trace.ops.push_back(AllocTraceAlloc{next_id++, a.size, stream});
      consider(reserved + a.device_free, fmt::format("oom at {}", Where(device, a.index)));
    }
    if (a.action != "snapshot") previous = a.action;
  }

  if (options.device_memory_bytes > 0) {
    trace.device_memory_bytes = options.device_memory_bytes;
    out.capacity_source = "--device-memory-bytes";
  } else if (bound) {
    trace.device_memory_bytes = std::max<int64_t>(*bound, 1);
    out.capacity_source = bound_source;
  } else {
    trace.device_memory_bytes = kUnlimitedCapacity;
    out.capacity_source = "unlimited: no cudaMalloc failed in the trace";
  }
  if (trace.device_memory_bytes < out.initial_reserved_bytes) {
    return Status::InvalidInput(fmt::format("device memory {} B ({}) is less than the {} B the segments hold when the "
                                            "trace begins", trace.device_memory_bytes, out.capacity_source,
                                            out.initial_reserved_bytes));
  }
  trace.alloc_conf = snapshot.alloc_conf;
  trace.streams = static_cast<int32_t>(streams.size());
  trace.description = fmt::format("memory snapshot, device {}: {} actions replayed from the state when recording began",
                                  device, snapshot.trace.size());
  return out;
}

namespace {

bool SameAction(const RecordedAction& r, const TraceEntry& m, const std::vector<int64_t>& streams) {
  return r.action == m.action && r.size == m.size && StreamIndex(streams, r.stream) == m.stream &&
         (r.action == "oom" || r.address == m.address);
}

std::string DivergenceText(const RecordedAction& r, const TraceEntry& m, const std::vector<int64_t>& streams) {
  const int32_t r_stream = StreamIndex(streams, r.stream);
  if (r.action == m.action && r.action == "alloc" && r.size == m.size && r.address != m.address) {
    return fmt::format("block chosen for an alloc of {} B: recorded {:#x}, model {:#x}", r.size, r.address, m.address);
  }
  return fmt::format("recorded {}, model {}", Describe(r.action, r.address, r.size, r_stream),
                     Describe(m.action, m.address, m.size, m.stream));
}

// The final segments, recorded and modelled, compared in address order.
std::optional<std::string> FinalStateDifference(const RecordedSnapshot& snapshot,
                                                const std::vector<SnapshotSegment>& model,
                                                const std::vector<int64_t>& streams) {
  std::vector<const RecordedSegment*> recorded;
  for (const RecordedSegment& seg : snapshot.segments) recorded.push_back(&seg);
  std::sort(recorded.begin(), recorded.end(), [](const auto* a, const auto* b) { return a->address < b->address; });
  if (recorded.size() != model.size()) {
    return fmt::format("final state: {} segments recorded, {} in the model", recorded.size(), model.size());
  }
  for (size_t s = 0; s < model.size(); ++s) {
    const RecordedSegment& r = *recorded[s];
    const SnapshotSegment& m = model[s];
    if (r.address != m.address || r.total_size != m.total_size || StreamIndex(streams, r.stream) != m.stream ||
        r.segment_type != m.segment_type) {
      return fmt::format("final state: segment {:#x} ({} B, {}) recorded, {:#x} ({} B, {}) in the model", r.address,
                         r.total_size, r.segment_type, m.address, m.total_size, m.segment_type);
    }
    if (r.blocks.size() != m.blocks.size()) {
      return fmt::format("final state: segment {:#x} has {} blocks recorded, {} in the model", r.address,
                         r.blocks.size(), m.blocks.size());
    }
    for (size_t b = 0; b < r.blocks.size(); ++b) {
      const RecordedBlock& rb = r.blocks[b];
      const SnapshotBlock& mb = m.blocks[b];
      // A block whose free still waits for other streams is allocated in the model (its free
      // is replayed when it completes).
      const std::string state = rb.state == "active_pending_free" ? "active_allocated" : rb.state;
      const bool requested_differs = state == "active_allocated" && rb.requested_size != mb.requested_size;
      if (rb.address != mb.address || rb.size != mb.size || state != mb.state || requested_differs) {
        return fmt::format("final state: block {:#x} ({} B, {}) recorded, {:#x} ({} B, {}) in the model", rb.address,
                           rb.size, rb.state, mb.address, mb.size, mb.state);
      }
    }
  }
  return std::nullopt;
}

}  // namespace

StatusOr<SnapshotReplay> ReplaySnapshot(const RecordedSnapshot& snapshot, const SnapshotReplayOptions& options) {
  SnapshotReplay replay;
  SHARDSCOPE_ASSIGN_OR_RETURN(replay.converted, SnapshotToAllocTrace(snapshot, options));
  const std::vector<int64_t>& streams = replay.converted.streams;
  AllocReplayOptions replay_options;
  replay_options.record_history = true;
  SHARDSCOPE_ASSIGN_OR_RETURN(AllocReplayResult result, ReplayAllocTrace(replay.converted.trace, replay_options));

  int64_t reserved = replay.converted.initial_reserved_bytes;
  replay.peak_reserved_bytes.recorded = reserved;
  int64_t ooms = 0;
  const std::vector<int64_t>& deferred_requests = replay.converted.deferred_free_requests;
  const std::vector<int64_t>& deferred_ops = replay.converted.deferred_free_ops;
  for (const RecordedAction& a : snapshot.trace) {
    if (a.action == "snapshot") continue;
    ++replay.actions;
    // A deferred free is compared where it completes (SnapshotAllocTrace).
    if (!std::binary_search(deferred_requests.begin(), deferred_requests.end(), a.index)) replay.recorded.push_back(a);
    if (a.action == "segment_alloc") {
      ++replay.segment_allocs.recorded;
      reserved += a.size;
    } else if (a.action == "segment_free") {
      ++replay.segment_frees.recorded;
      reserved -= a.size;
    } else if (a.action == "oom") {
      ++ooms;
    }
    replay.peak_reserved_bytes.recorded = std::max(replay.peak_reserved_bytes.recorded, reserved);
  }
  // Every oom went through the release-and-retry path first (num_alloc_retries counts it).
  replay.alloc_retries.recorded = static_cast<int64_t>(replay.converted.retry_bursts.size()) + ooms;
  for (size_t k = 0; k < result.history.size(); ++k) {
    TraceEntry& e = result.history[k];
    const int64_t op = k < result.history_op.size() ? result.history_op[k] : -1;
    if (e.action == "free_requested" && std::binary_search(deferred_ops.begin(), deferred_ops.end(), op)) continue;
    replay.model.push_back(std::move(e));
  }
  for (const TraceEntry& e : replay.model) {
    if (e.action == "segment_alloc") ++replay.segment_allocs.model;
    if (e.action == "segment_free") ++replay.segment_frees.model;
  }
  replay.alloc_retries.model = result.stats.num_alloc_retries;
  replay.peak_reserved_bytes.model = result.stats.reserved_bytes_peak;

  const int64_t trace_end = static_cast<int64_t>(snapshot.trace.size());
  const size_t n = std::max(replay.recorded.size(), replay.model.size());
  for (size_t k = 0; k < n && !replay.first_divergence; ++k) {
    const bool has_recorded = k < replay.recorded.size();
    const bool has_model = k < replay.model.size();
    if (has_recorded && has_model && SameAction(replay.recorded[k], replay.model[k], streams)) continue;
    SnapshotDivergence d;
    if (has_recorded) d.recorded = replay.recorded[k];
    if (has_model) d.model = replay.model[k];
    d.index = has_recorded ? replay.recorded[k].index : trace_end;
    if (has_recorded && has_model) {
      d.what = DivergenceText(replay.recorded[k], replay.model[k], streams);
    } else if (has_recorded) {
      const RecordedAction& r = replay.recorded[k];
      d.what = fmt::format("recorded {}, the model did nothing more",
                           Describe(r.action, r.address, r.size, StreamIndex(streams, r.stream)));
    } else {
      const TraceEntry& m = replay.model[k];
      d.what = fmt::format("the recorded trace ends, the model went on: {}",
                           Describe(m.action, m.address, m.size, m.stream));
    }
    replay.first_divergence = std::move(d);
  }
  if (!replay.first_divergence) {
    if (std::optional<std::string> what = FinalStateDifference(snapshot, result.final_segments, streams)) {
      replay.first_divergence = SnapshotDivergence{trace_end, *what, std::nullopt, std::nullopt};
    }
  }
  replay.exact = !replay.first_divergence;
  return replay;
}

}  // namespace shardscope::sim

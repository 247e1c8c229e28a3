// The host thread: walks its rank's program in order, launching work onto streams (each launch
// costs launch_overhead_ns of host time and may block on a full launch queue), recording and
// waiting on events, and blocking in synchronizations until the device state it observes is
// reached. It also makes the allocator calls of its allocate and free ops (at the host's time).
#include "engine_internal.h"

namespace shardscope::sim::engine_internal {

void Engine::RunHost(RankState& r) {
  HostState& host = r.host;
  if (r.halted) {  // a resume queued before the rank stopped at an OOM agreement
    host.wait = HostWait::kStopped;
    return;
  }
  host.clock = std::max(host.clock, now_);
  const std::vector<Op>& ops = r.program->ops;
  while (static_cast<size_t>(host.pc) < ops.size()) {
    const int32_t pc = host.pc;
    const Op& op = ops[static_cast<size_t>(pc)];
    const int64_t t = host.clock;
    bool yielded = false;
    std::visit(
        [&](const auto& payload) {
          using T = std::decay_t<decltype(payload)>;
          if constexpr (std::is_same_v<T, traces::KernelOp> ||
                        std::is_same_v<T, traces::MemcpyOp> ||
                        std::is_same_v<T, traces::CollectiveOp>) {
            const StreamState& target = r.streams[static_cast<size_t>(payload.stream)];
            if (config_.max_queued_per_stream > 0 &&
                target.queue.size() >= static_cast<size_t>(config_.max_queued_per_stream)) {
              // The stream's launch queue is full: cudaLaunchKernel blocks until its oldest
              // item retires. The host reached the launch at t (possibly ahead of the global
              // clock); it launches at the later of t and the next retirement (PopFront), so
              // it waits for that retirement without checking again at t.
              host.wait = HostWait::kQueueFull;
              host.wait_target = payload.stream;
              if (host.launch_blocked_since < 0) host.launch_blocked_since = t;
              yielded = true;
              return;
            }
            const int64_t end = t + config_.launch_overhead_ns;
            QueueItem item{pc, 0, end};
            if constexpr (std::is_same_v<T, traces::CollectiveOp>) {
              CommLane& lane = r.lanes[static_cast<size_t>(r.lane_of_slot[static_cast<size_t>(payload.comm)])];
              item.aux = static_cast<int32_t>(lane.issued++);
            }
            const int64_t start = host.launch_blocked_since >= 0 ? host.launch_blocked_since : t;
            host.launch_blocked_since = -1;
            r.stats.host_blocked_ns += t - start;
            r.stats.host_busy_ns -= t - start;  // EmitHost counts the whole span as busy
            EmitHost(r, pc, HostSpanKind::kLaunch, start, end, item.correlation());
            host.clock = end;
            Enqueue(r, payload.stream, item);
            if constexpr (std::is_same_v<T, traces::CollectiveOp>) {
              if (r.oom_caught && payload.oom_sync) {
                // catch_and_sync: the rank that ran out of memory has issued its OOM flag and
                // waits for the others' verdict (Composer _train_batch: all_reduce MAX,
                // .item()); it issues nothing more.
                r.halted = true;
                host.wait = HostWait::kStopped;
                host.pc = r.oom_pc;  // the hang report names the op that ran out of memory
                r.stats.end_ns = std::max(r.stats.end_ns, end);
                yielded = true;
                return;
              }
            }
          } else if constexpr (std::is_same_v<T, traces::EventRecordOp>) {
            const auto record = static_cast<int32_t>(r.record_done.size());
            r.record_done.push_back(-1);
            r.event_last_record[static_cast<size_t>(payload.event)] = record;
            EmitHost(r, pc, HostSpanKind::kApiCall, t, t, -1);
            Enqueue(r, payload.stream, QueueItem{pc, record, t});
          } else if constexpr (std::is_same_v<T, traces::StreamWaitEventOp>) {
            const int64_t record = r.event_last_record[static_cast<size_t>(payload.event)];
            EmitHost(r, pc, HostSpanKind::kApiCall, t, t, -1);
            // CUDA: waiting on an event that was never recorded completes at once.
            if (record >= 0) Enqueue(r, payload.stream, QueueItem{pc, static_cast<int32_t>(record), t});
          } else if constexpr (std::is_same_v<T, traces::HostWorkOp>) {
            EmitHost(r, pc, HostSpanKind::kHostWork, t, t + payload.duration_ns, -1);
            host.clock = t + payload.duration_ns;
          } else if constexpr (std::is_same_v<T, traces::StreamSynchronizeOp> ||
                               std::is_same_v<T, traces::DeviceSynchronizeOp> ||
                               std::is_same_v<T, traces::EventSynchronizeOp>) {
            if (t > now_) {
              // Observing the device: let the global clock catch up with the host first.
              host.wait = HostWait::kResumeScheduled;
              Push(t, HostResume{r.state});
              yielded = true;
              return;
            }
            bool satisfied = false;
            if constexpr (std::is_same_v<T, traces::StreamSynchronizeOp>) {
              satisfied = r.streams[static_cast<size_t>(payload.stream)].Idle();
              host.wait = HostWait::kStream;
              host.wait_target = payload.stream;
            } else if constexpr (std::is_same_v<T, traces::DeviceSynchronizeOp>) {
              satisfied = std::all_of(r.streams.begin(), r.streams.end(),
                                      [](const StreamState& s) { return s.Idle(); });
              host.wait = HostWait::kDevice;
            } else {
              const int64_t record = r.event_last_record[static_cast<size_t>(payload.event)];
              satisfied = record < 0 || r.record_done[static_cast<size_t>(record)] >= 0;
              host.wait = HostWait::kRecord;
              host.wait_target = record;
            }
            if (satisfied) {
              host.wait = HostWait::kNone;
              EmitHost(r, pc, HostSpanKind::kSynchronize, t, t, -1);
            } else {
              host.wait_start = t;
              yielded = true;
            }
          } else if constexpr (std::is_same_v<T, traces::AllocateOp>) {
            if (op.id == r.inject_oom_op_id) {  // before the memory checks: works without memory too
              InjectOom(r, payload, op.id, t);
              yielded = true;
              return;
            }
            if (!r.allocator && !r.log) return;
            // Live since the warm-up (a log rank's log knows: the op makes no call).
            if (!r.log && r.preallocated[static_cast<size_t>(payload.tensor)]) {
              r.preallocated[static_cast<size_t>(payload.tensor)] = false;
              return;
            }
            if (t > now_ && !LogOutcomeIsTimeless(r, pc)) {
              // The allocator looks at device progress (completed free events): decide at t.
              host.wait = HostWait::kResumeScheduled;
              Push(t, HostResume{r.state});
              yielded = true;
              return;
            }
            yielded = !Allocate(r, pc, payload, op.id, t);
          } else if constexpr (std::is_same_v<T, traces::RecordStreamOp>) {
            // Programs with record_stream never share a precomputed log (BuildLog).
            if (r.allocator) {
              const uint64_t address = r.tensor_address[static_cast<size_t>(payload.tensor)];
              if (address != 0) r.allocator->RecordStream(address, payload.stream);
            }
          } else {
            static_assert(std::is_same_v<T, traces::FreeOp>);
            if (r.allocator || r.log) FreeTensor(r, pc, payload, t);
          }
        },
        op.payload);
    if (yielded) return;
    ++host.pc;
    ops_executed_ += r.weight;
  }
  host.wait = HostWait::kDone;
  r.stats.end_ns = std::max(r.stats.end_ns, host.clock);
}

void Engine::UnblockHost(RankState& r) {
  HostState& host = r.host;
  r.stats.host_blocked_ns += now_ - host.wait_start;
  r.stats.host_busy_ns += host.pending_cost_ns;  // e.g. the cudaFree calls after a retry's sync
  EmitHost(r, host.pc, HostSpanKind::kSynchronize, host.wait_start, now_ + host.pending_cost_ns, -1);
  ++host.pc;
  ops_executed_ += r.weight;
  host.clock = now_ + host.pending_cost_ns;
  host.pending_cost_ns = 0;
  host.wait = HostWait::kResumeScheduled;
  Push(now_, HostResume{r.state});
}

// ---- Allocations and frees, as the host issues them (the allocator itself: allocator_hooks.cc)

// Returns false when the host must stop here (blocked on the device, or out of memory).
SHARDSCOPE_ENGINE_HOT bool Engine::Allocate(RankState& r, int32_t pc, const traces::AllocateOp& op, int64_t op_id, int64_t t) {
  HostState& host = r.host;
  r.alloc_needs_sync = false;
  MallocOutcome out;
  if (r.log) {
    const int32_t call = r.log->call_of_op[static_cast<size_t>(pc)];
    if (call < 0) return true;  // not in the log: nothing to allocate (cannot happen for a live log)
    out = r.log->calls[static_cast<size_t>(call)].outcome;
    r.log_cursor = static_cast<size_t>(call) + 1;
  } else {
    out = r.allocator->Malloc(op.bytes, op.stream);
  }
  if (!out.ok) {
    AfterAllocatorCall(r, t);
    r.stats.memory.oom = OomInfo{op_id, t, out.requested_bytes, out.device_free_bytes, out.largest_free_block};
    if (r.want_trace) observer_->OnMemoryEvent(r.rank, t, "oom", op.bytes);
    if (CatchOom(r, t)) return false;
    host.wait = HostWait::kStopped;
    r.stats.end_ns = std::max(r.stats.end_ns, t);
    return false;
  }
  // A log rank keeps no addresses: the log says which later frees make a call.
  if (!r.log) r.tensor_address[static_cast<size_t>(op.tensor)] = out.address;
  if (config_.memory.record_history && r.want_trace) {
    r.tensor_bytes[static_cast<size_t>(op.tensor)] = op.bytes;
    r.live_tensors.push_back(op.tensor);
  }
  if (r.want_trace) {
    if (out.retried) observer_->OnMemoryEvent(r.rank, t, "alloc_retry", op.bytes);
    if (out.device_allocs > 0) observer_->OnMemoryEvent(r.rank, t, "segment_alloc", out.block_bytes);
  }
  AfterAllocatorCall(r, t);
  const int64_t cost = out.device_allocs * config_.memory.device_alloc_ns +
                       out.device_frees * config_.memory.device_free_ns;
  const bool syncs = out.synchronized || out.device_frees > 0 || r.alloc_needs_sync;
  const bool idle = std::all_of(r.streams.begin(), r.streams.end(), [](const StreamState& s) { return s.Idle(); });
  if (syncs && !idle) {
    // cudaFree synchronizes the device, and the retry path first waits for every outstanding
    // free event: the host waits for the GPU to drain, then pays for the calls.
    host.wait = HostWait::kDevice;
    host.wait_start = t;
    host.pending_cost_ns = cost;
    return false;
  }
  if (cost > 0) EmitHost(r, pc, HostSpanKind::kApiCall, t, t + cost, -1);
  host.clock = t + cost;
  return true;
}

void Engine::FreeTensor(RankState& r, int32_t pc, const traces::FreeOp& op, int64_t t) {
  if (r.log) {
    const int32_t call = r.log->call_of_op[static_cast<size_t>(pc)];
    if (call < 0) return;  // the tensor is not live (a 0-byte allocation)
    r.log_cursor = static_cast<size_t>(call) + 1;
  } else {
    uint64_t& address = r.tensor_address[static_cast<size_t>(op.tensor)];
    if (address == 0) return;  // ValidateSchedule guarantees a live tensor
    r.allocator->Free(address);
    address = 0;
  }
  if (config_.memory.record_history && r.want_trace) {
    auto it = std::find(r.live_tensors.begin(), r.live_tensors.end(), op.tensor);
    if (it != r.live_tensors.end()) {
      *it = r.live_tensors.back();
      r.live_tensors.pop_back();
    }
  }
  AfterAllocatorCall(r, t);
}

// Peaks, fragmentation at the reserved peak, trace counters and history times.
void Engine::AfterAllocatorCall(RankState& r, int64_t t) {
  int64_t allocated = 0, reserved = 0;
  if (r.log) {
    std::tie(allocated, reserved) = r.log_cursor > 0 ? r.log->bytes[r.log_cursor - 1] : r.log->warm_bytes;
  } else {
    const MemoryStats& stats = r.allocator->stats();
    allocated = stats.allocated_bytes;
    reserved = stats.reserved_bytes;
  }
  if (reserved > r.reserved_peak_seen) {
    r.reserved_peak_seen = reserved;
    r.stats.memory.fragmentation_bytes = reserved - allocated;
    r.stats.memory.allocated_at_reserved_peak = allocated;
    if (config_.memory.record_history && r.want_trace) {
      // Reserved grows only through new segments, so this runs a bounded number of times.
      auto& live = r.stats.memory.live_at_reserved_peak;
      live.clear();
      for (int32_t tensor : r.live_tensors) live.emplace_back(tensor, r.tensor_bytes[static_cast<size_t>(tensor)]);
    }
  }
  if (allocated > r.allocated_peak_seen) {
    r.allocated_peak_seen = allocated;
    if (config_.memory.record_history && r.want_trace) {
      auto& live = r.stats.memory.live_at_allocated_peak;
      live.clear();
      for (int32_t tensor : r.live_tensors) live.emplace_back(tensor, r.tensor_bytes[static_cast<size_t>(tensor)]);
    }
  }
  if (r.want_trace) {
    if (!warming_) observer_->OnMemory(r.rank, t, allocated, reserved);
    if (r.allocator) r.stats.memory.history_time_ns.resize(r.allocator->history().size(), t);
  }
}

}  // namespace shardscope::sim::engine_internal

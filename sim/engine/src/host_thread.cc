// The host thread: walks its rank's program in order, launching work onto streams (each launch
// costs launch_overhead_ns of host time and may block on a full launch queue), recording and
// waiting on events, and blocking in synchronizations until the device state it observes is
// reached. Allocations and frees go to allocator_hooks.cc.
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
              Push(t, HostResume{r.rank});
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
              Push(t, HostResume{r.rank});
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
    ++ops_executed_;
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
  ++ops_executed_;
  host.clock = now_ + host.pending_cost_ns;
  host.pending_cost_ns = 0;
  host.wait = HostWait::kResumeScheduled;
  Push(now_, HostResume{r.rank});
}

}  // namespace shardscope::sim::engine_internal

// The caching allocator on the timeline (MemoryConfig), its setup: a shared log of outcomes
// for ranks with the same program and capacity, a live allocator otherwise; the allocator's
// stream events; warm start; and out-of-memory: injection (EngineConfig::inject_oom) and the
// catch_and_sync policy (CatchOom, AgreeOnOom). The calls the host makes (Allocate,
// FreeTensor) are in host_thread.cc, beside the loop that makes them once per op.
#include "engine_internal.h"

namespace shardscope::sim::engine_internal {

EventToken Engine::AllocatorEvents::Record(AllocStream stream) {
  RankState& r = *rank_;
  const auto record = static_cast<int32_t>(r.record_done.size());
  if (engine_.building_log_) engine_.log_used_events_ = true;  // outcomes would depend on time
  if (engine_.warming_ || engine_.building_log_) {  // no kernels run in these replays: complete
    r.record_done.push_back(0);
    return record;
  }
  r.record_done.push_back(-1);
  engine_.Enqueue(r, stream, QueueItem{-1, record, r.host.clock});
  return record;
}

bool Engine::AllocatorEvents::Query(EventToken event) {
  return rank_->record_done[static_cast<size_t>(event)] >= 0;
}

// The policy goes on as if the event had completed; the engine makes the host wait for the
// device before the malloc returns (see Allocate).
void Engine::AllocatorEvents::Synchronize(EventToken event) {
  if (rank_->record_done[static_cast<size_t>(event)] < 0) rank_->alloc_needs_sync = true;
}

// Runs one rank's allocator the way the timed run would (warm-up step, then the measured
// step's calls in program order) and records every outcome with the statistics after it.
// Returns null when the allocator recorded a stream event: then outcomes could depend on
// device progress, and every rank keeps a live allocator.
std::shared_ptr<const AllocatorLog> Engine::BuildAllocatorLog(const RankState& like) {
  // record_stream makes frees wait for device progress: no log can stand for the timed run.
  for (const Op& op : like.program->ops) {
    if (std::holds_alternative<traces::RecordStreamOp>(op.payload)) return nullptr;
  }
  RankState scratch;
  scratch.program = like.program;
  scratch.rank = like.rank;
  scratch.state = like.state;
  scratch.streams.resize(like.streams.size());
  scratch.stats.memory.capacity_bytes = like.stats.memory.capacity_bytes;
  scratch.alloc_events = std::make_unique<AllocatorEvents>(*this, &scratch);
  building_log_ = true;
  log_used_events_ = false;
  CreateAllocator(scratch);
  if (config_.memory.warm_start) {
    WarmAllocator(scratch);
  } else {
    AllocateGemmWorkspacesCold(scratch);
  }
  auto log = std::make_shared<AllocatorLog>();
  log->preallocated = scratch.preallocated;
  log->warm_stats = scratch.allocator->stats();
  log->warm_bytes = {log->warm_stats.allocated_bytes, log->warm_stats.reserved_bytes};
  log->call_of_op.assign(scratch.program->ops.size(), -1);
  for (size_t index = 0; index < scratch.program->ops.size(); ++index) {
    const Op& op = scratch.program->ops[index];
    if (const auto* alloc = std::get_if<traces::AllocateOp>(&op.payload)) {
      if (scratch.preallocated[static_cast<size_t>(alloc->tensor)]) {
        scratch.preallocated[static_cast<size_t>(alloc->tensor)] = false;
        continue;
      }
      const MallocOutcome out = scratch.allocator->Malloc(alloc->bytes, alloc->stream);
      log->call_of_op[index] = static_cast<int32_t>(log->calls.size());
      log->calls.push_back({out, scratch.allocator->stats()});
      log->bytes.emplace_back(log->calls.back().stats.allocated_bytes, log->calls.back().stats.reserved_bytes);
      if (!out.ok) break;
      scratch.tensor_address[static_cast<size_t>(alloc->tensor)] = out.address;
    } else if (const auto* free_op = std::get_if<traces::FreeOp>(&op.payload)) {
      uint64_t& address = scratch.tensor_address[static_cast<size_t>(free_op->tensor)];
      if (address == 0) continue;
      scratch.allocator->Free(address);
      address = 0;
      log->call_of_op[index] = static_cast<int32_t>(log->calls.size());
      log->calls.push_back({MallocOutcome{}, scratch.allocator->stats()});
      log->bytes.emplace_back(log->calls.back().stats.allocated_bytes, log->calls.back().stats.reserved_bytes);
    }
  }
  building_log_ = false;
  if (log_used_events_) return nullptr;
  // The warm-up's peaks count (see MemoryConfig::warm_start): start from them.
  log->warm_reserved_peak = scratch.reserved_peak_seen;
  log->warm_fragmentation = scratch.stats.memory.fragmentation_bytes;
  log->warm_allocated_at_peak = scratch.stats.memory.allocated_at_reserved_peak;
  return log;
}

MemoryStats Engine::CurrentStats(const RankState& r) const {
  if (r.log) return r.log_cursor > 0 ? r.log->calls[r.log_cursor - 1].stats : r.log->warm_stats;
  return r.allocator->stats();
}

void Engine::CreateAllocator(RankState& r) {
  r.allocator.reset();
  r.device_memory = MakeCapacityDeviceMemory(r.stats.memory.capacity_bytes);
  r.allocator = std::make_unique<CachingAllocator>(config_.memory.allocator, *r.device_memory, *r.alloc_events);
  r.allocator->RecordHistory(config_.memory.record_history && r.want_trace);
  const size_t tensors = r.program->tensors.size();
  r.tensor_address.assign(tensors, 0);
  r.tensor_bytes.assign(tensors, 0);
  r.preallocated.assign(tensors, false);
  r.live_tensors.clear();
  r.reserved_peak_seen = -1;
  r.allocated_peak_seen = -1;
  r.stats.memory.live_at_allocated_peak.clear();
  r.stats.memory.fragmentation_bytes = 0;
  r.stats.memory.allocated_at_reserved_peak = 0;
  r.stats.memory.live_at_reserved_peak.clear();
  r.stats.memory.history_time_ns.clear();
}

// Replays the rank's allocations and frees once, at time 0 and without costs, so the
// simulated step starts from the steady-state cache (see MemoryConfig::warm_start).
void Engine::WarmAllocator(RankState& r) {
  warming_ = true;
  bool ran_out = false;
  bool workspaces_done = config_.memory.gemm_workspaces <= 0;
  for (const Op& op : r.program->ops) {
    if (!workspaces_done) {
      // The first GEMM: cuBLAS's workspaces come from the allocator right before it launches.
      const auto* kernel = std::get_if<traces::KernelOp>(&op.payload);
      if (kernel != nullptr && std::holds_alternative<traces::GemmDesc>(kernel->compute)) {
        workspaces_done = true;
        if (!AllocateGemmWorkspaces(r, kernel->stream)) {
          ran_out = true;
          break;
        }
      }
    }
    if (const auto* alloc = std::get_if<traces::AllocateOp>(&op.payload)) {
      const MallocOutcome out = r.allocator->Malloc(alloc->bytes, alloc->stream);
      if (!out.ok) {
        ran_out = true;
        break;
      }
      r.tensor_address[static_cast<size_t>(alloc->tensor)] = out.address;
      if (config_.memory.record_history && r.want_trace) {
        r.tensor_bytes[static_cast<size_t>(alloc->tensor)] = alloc->bytes;
        r.live_tensors.push_back(alloc->tensor);
      }
      AfterAllocatorCall(r, 0);
    } else if (const auto* free_op = std::get_if<traces::FreeOp>(&op.payload)) {
      FreeTensor(r, -1, *free_op, 0);  // a live allocator: no log to index
    }
  }
  warming_ = false;
  if (ran_out) {
    CreateAllocator(r);
    AllocateGemmWorkspacesCold(r);
    return;
  }
  for (size_t tensor = 0; tensor < r.tensor_address.size(); ++tensor) {
    r.preallocated[tensor] = r.tensor_address[tensor] != 0;
  }
}

bool Engine::AllocateGemmWorkspaces(RankState& r, int32_t stream) {
  for (int32_t i = 0; i < config_.memory.gemm_workspaces; ++i) {
    if (!r.allocator->Malloc(config_.memory.gemm_workspace_bytes, stream).ok) return false;
    AfterAllocatorCall(r, 0);
  }
  return true;
}

void Engine::AllocateGemmWorkspacesCold(RankState& r) {
  if (config_.memory.gemm_workspaces <= 0) return;
  for (const Op& op : r.program->ops) {
    const auto* kernel = std::get_if<traces::KernelOp>(&op.payload);
    if (kernel == nullptr || !std::holds_alternative<traces::GemmDesc>(kernel->compute)) continue;
    // Before the step: an OOM here shows as the step's first allocation failing (the
    // workspaces' blocks are then missing and that allocation sees the full capacity less them).
    const bool was_warming = warming_;
    warming_ = true;
    AllocateGemmWorkspaces(r, kernel->stream);
    warming_ = was_warming;
    return;
  }
}

// EngineConfig::inject_oom: the same stop as a failed malloc in Allocate, without asking the
// allocator (whose state stays as it was before the call).
void Engine::InjectOom(RankState& r, const traces::AllocateOp& op, int64_t op_id, int64_t t) {
  OomInfo oom{op_id, t, op.bytes, 0, 0, true};
  if (r.allocator || r.log) {
    const MemoryStats stats = CurrentStats(r);
    oom.free_bytes = std::max<int64_t>(0, r.stats.memory.capacity_bytes - stats.reserved_bytes);
  }
  r.stats.memory.oom = oom;
  if (r.want_trace) observer_->OnMemoryEvent(r.rank, t, "oom", op.bytes);
  if (CatchOom(r, t)) return;
  r.host.wait = HostWait::kStopped;
  r.stats.end_ns = std::max(r.stats.end_ns, t);
}

// catch_and_sync: the out-of-memory error at the host's op is caught (Composer
// Trainer._train_batch `except RuntimeError` with _is_cuda_oom) and the rank goes on at its
// next OOM-flag agreement point, skipping the ops in between (the exception unwinds past
// them). Returns false when the policy is raise or no agreement point follows: the rank stops.
bool Engine::CatchOom(RankState& r, int64_t t) {
  if (!config_.oom_catch_and_sync) return false;
  const std::vector<Op>& ops = r.program->ops;
  for (size_t i = static_cast<size_t>(r.host.pc) + 1; i < ops.size(); ++i) {
    const auto* coll = std::get_if<CollectiveOp>(&ops[i].payload);
    if (coll == nullptr || !coll->oom_sync) continue;
    r.oom_caught = true;
    r.oom_pc = r.host.pc;
    r.oom_resume_pc = static_cast<int32_t>(i);
    r.host.pc = static_cast<int32_t>(i);
    r.host.clock = t;
    r.host.wait = HostWait::kResumeScheduled;
    Push(t, HostResume{r.state});
    return true;
  }
  return false;
}

// catch_and_sync: an oom_sync collective completed with a member that had run out of memory:
// the flag's MAX is 1 on every member, each raises and the trainer retries the batch with a
// smaller micro-batch (Composer _create_sync_hook raises RuntimeError; _train_batch then
// calls _adjust_device_train_microbatch_size). Every member stops here cleanly.
void Engine::AgreeOnOom(std::span<const Participant> members, const CollectiveRun& run) {
  OomAgreement agreement;
  agreement.communicator = run.communicator;
  agreement.seq = run.seq + 1;
  agreement.time_ns = now_;
  for (const Participant& p : members) {
    RankState& r = ranks_[static_cast<size_t>(p.state)];
    agreement.ranks.push_back(r.rank);
    if (r.oom_caught && p.op_index == r.oom_resume_pc) {
      agreement.oom_ranks.push_back(r.rank);
      if (agreement.op_id < 0) agreement.op_id = OpOf(r, p.op_index).id;
    }
    if (!r.halted) {
      r.halted = true;
      if (r.host.wait != HostWait::kDone) r.host.wait = HostWait::kStopped;
    }
    r.stats.oom_handled = true;
    r.stats.end_ns = std::max(r.stats.end_ns, now_);
  }
  std::sort(agreement.ranks.begin(), agreement.ranks.end());
  std::sort(agreement.oom_ranks.begin(), agreement.oom_ranks.end());
  if (!oom_agreed_) oom_agreed_ = std::move(agreement);
}

}  // namespace shardscope::sim::engine_internal

// ZeRO-3's parameter side (lowering_zero3.h): the submodules and their fetch trace, and
// PartitionedParameterCoordinator (deepspeed/runtime/zero/partitioned_param_coordinator.py)
// fetching, prefetching and releasing them with partition_parameters.py's all-gathers.
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lowering_zero3.h"

namespace shardscope::sim {

void Zero3Lowering::BuildSubmodules() {
  const int64_t world = ctx_.world_size;
  const int64_t threshold = ctx_.plan.zero.stage3_param_persistence_threshold;
  subs_of_module_.resize(ctx_.modules.size());
  for (size_t m = 0; m < ctx_.modules.size(); ++m) {
    const ModuleKernels& module = ctx_.modules[m];
    for (const LeafModule& leaf : LeafModulesOf(module)) {
      subs_of_module_[m].push_back(subs_.size());
      Zero3Submodule& sub = subs_.emplace_back();
      sub.name = leaf.name;
      sub.module = m;
      for (size_t index : leaf.params) {
        const ParamTensor& p = module.params[index];
        sub.numel += p.numel;
        sub.param_numels.push_back(p.numel);
        // partition_parameters.py _convert_to_deepspeed_param: ds_persist when
        // ds_numel <= param_persistence_threshold (stage3_param_persistence_threshold; the
        // model_persistence_threshold budget is unlimited by default): kept whole on every
        // rank between steps and never released by the coordinator (__params_to_release).
        if (p.numel <= threshold) {
          sub.persistent_numel += p.numel;
          sub.persistent_padded += RoundUp(p.numel, world);
          sub.persistent.emplace_back(module.name + "." + p.name, p.numel);
        } else {
          ++sub.fetch_params;
          sub.fetch_numel += p.numel;
          sub.fetch_param_numels.push_back(p.numel);
          // partition_parameters.py _partition_param: each rank holds ceil(numel / world).
          sub.fetch_partition += CeilDiv(p.numel, world);
        }
      }
    }
    for (size_t i = 0; i < subs_of_module_[m].size(); ++i) {
      subs_[subs_of_module_[m][i]].first = i;
      subs_[subs_of_module_[m][i]].count = subs_of_module_[m].size();
    }
  }
}

// The trace (PartitionedParameterCoordinator.record_module, complete after the first step):
// the submodules in fetch order — forward order, then in backward the reverse order; a
// checkpointed block's recompute fetches its submodules in forward order again first.
void Zero3Lowering::BuildTrace() {
  for (size_t m = 0; m < ctx_.modules.size(); ++m) {
    for (size_t s : subs_of_module_[m]) trace_.push_back(s);
  }
  for (size_t step = 0; step < ctx_.modules.size(); ++step) {
    const size_t m = ctx_.modules.size() - 1 - step;
    if (Checkpointed(ctx_, ctx_.modules[m])) {
      for (size_t s : subs_of_module_[m]) trace_.push_back(s);
    }
    for (auto it = subs_of_module_[m].rbegin(); it != subs_of_module_[m].rend(); ++it) trace_.push_back(*it);
  }
}

// PartitionedParameterCoordinator.reset_step: the step counter and the prefetch queue
// (every parameter of the trace in order) start again each forward+backward.
void Zero3Lowering::ResetStep() {
  step_id_ = 0;
  param_queue_.clear();
  for (size_t t = 0; t < trace_.size(); ++t) param_queue_.push_back(t);
  std::fill(most_recent_step_.begin(), most_recent_step_.end(), -1);
}

// __all_gather_params -> partition_parameters.py all_gather_coalesced, on the all-gather
// stream. __n_available_params counts ds_numel.
// - len(params) == 1 ("an opportunity to avoid some intermediate memory allocations"): one
//   buffer of ceil(ds_numel / world) x world elements, all_gather_into_tensor straight from
//   ds_tensor into it, the parameter a view of it (AllGatherHandle: wait() only waits).
// - several parameters (_all_gather_dtype): one flat buffer of partition_sz x world, the
//   local partitions copied in (torch.cat(..., out=partitions[rank])), one
//   all_gather_into_tensor; AllGatherCoalescedHandle keeps the per-rank views (partitions)
//   of the flat buffer, and its wait() copies each parameter out (torch.cat).
void Zero3Lowering::AllGatherParams(const std::vector<size_t>& candidates) {
  if (ctx_.plan.zero.legacy_per_parameter_path) {
    for (size_t s : candidates) {
      if (status_[s] != ParamStatus::kNotAvailable || subs_[s].fetch_numel == 0) continue;
      for (size_t p = 0; p < subs_[s].fetch_param_numels.size(); ++p) LegacyAllGatherParam(s, p);
      status_[s] = ParamStatus::kInflight;
      legacy_inflight_.push_back(s);
      n_available_ += subs_[s].fetch_numel;
    }
    return;
  }
  std::vector<size_t> subs;
  int64_t partition = 0, params = 0;
  for (size_t s : candidates) {
    if (status_[s] != ParamStatus::kNotAvailable || subs_[s].fetch_numel == 0) continue;
    subs.push_back(s);
    partition += subs_[s].fetch_partition;
    params += subs_[s].fetch_params;
  }
  if (subs.empty()) return;
  const int64_t es = ElementBytes();
  const int64_t id = static_cast<int64_t>(handles_.size());
  Handle handle{subs, partition * ctx_.world_size * es, params == 1, false, subs.size()};
  if (handle.single) {
    const std::string unsharded = "unsharded." + subs_[subs.front()].name;
    b_.Allocate(unsharded, handle.flat_bytes, all_gather_);
    b_.Collective(all_gather_, "ZeRO::all_gather_coalesced", CollectiveType::kAllGather, dp_, handle.flat_bytes,
                  ctx_.compute_dtype);
  } else {
    const std::string flat = fmt::format("all_gather_output.h{}", id);
    b_.Allocate(flat, handle.flat_bytes, all_gather_);
    b_.MemoryKernel(all_gather_, "ZeRO::all_gather_coalesced.copy_in", partition * es, partition * es);
    b_.Collective(all_gather_, "ZeRO::all_gather_coalesced", CollectiveType::kAllGather, dp_, handle.flat_bytes,
                  ctx_.compute_dtype);
  }
  for (size_t s : subs) {
    status_[s] = ParamStatus::kInflight;
    handle_of_[s] = id;
    in_registry_[s] = true;
    n_available_ += subs_[s].fetch_numel;
  }
  handles_.push_back(std::move(handle));
}

// __inflight_param_registry.pop(param): the handle (and, for a coalesced one, its
// partitions — views of the flat buffer) lives while any of its parameters is still in the
// registry; the flat buffer is freed when the last one leaves.
void Zero3Lowering::PopFromRegistry(size_t s) {
  if (!in_registry_[s]) return;
  in_registry_[s] = false;
  Handle& handle = handles_[static_cast<size_t>(handle_of_[s])];
  if (--handle.in_registry == 0 && !handle.single) b_.Free(fmt::format("all_gather_output.h{}", handle_of_[s]));
}

// The 2021 ZeRO-3 (DeepSpeed before the coordinator rewrite of PR #1453; partition_parameters.py
// _all_gather / _allgather_param at microsoft/DeepSpeed c4ec23fc) gathers one parameter at a
// time on the all-gather stream: flat_tensor = torch.zeros(aligned size); torch.cuda.synchronize();
// world_size partitions as flat_tensor.narrow(...); the local shard copied into its partition;
// torch.distributed.all_gather(partitions, ...), which in ProcessGroupNCCL flattens the output
// list into a new buffer, runs ncclAllGather into it and copies each of the world_size chunks
// back into its partition (one copy kernel per rank, from C++). Host time per parameter,
// measured with DeepSpeed 0.3.16 and PyTorch 1.8.0 on 8 x A100 (DeepSpeed issue #1069, zarzen,
// 2021-06-21: "The pre_launch typically takes 130us, the launch takes 250us about, and there
// is a torch.cuda.synchronize() sync point"): what the other host costs of this model already
// charge at that world size is taken out, the rest is the calls' own Python bookkeeping; the
// world-size-dependent parts (narrow views, copy-outs) scale with the group.
constexpr int64_t kLegacyPreLaunchNs = 130'000;
constexpr int64_t kLegacyLaunchNs = 250'000;
constexpr int64_t kLegacyMeasuredWorld = 8;

void Zero3Lowering::LegacyAllGatherParam(size_t s, size_t p) {
  const HostConfig& host = ctx_.plan.host;
  const int64_t es = ElementBytes();
  const int64_t world = ctx_.world_size;
  const int64_t part = CeilDiv(subs_[s].fetch_param_numels[p], world);
  const int64_t aligned = part * world;
  const int64_t py = host.python_op_overhead_ns, cpp = host.cpp_op_overhead_ns, launch = host.launch_overhead_ns;
  // At the measured world size: zeros and copy_ (Python op + launch each), the narrow views.
  const int64_t pre_modelled = 2 * (py + launch) + kLegacyMeasuredWorld * py;
  // The all_gather call (a Python op + the NCCL launch) and the copy-outs (C++ op + launch).
  const int64_t launch_modelled = (py + launch) + kLegacyMeasuredWorld * (cpp + launch);
  const std::string buffer = LegacyBuffer(s, p);
  b_.HostWork("ZeRO::legacy.allgather_param.pre_launch", std::max<int64_t>(0, kLegacyPreLaunchNs - pre_modelled));
  b_.HostWork("python op", py);
  b_.Allocate(buffer, aligned * es, all_gather_);
  b_.MemoryKernel(all_gather_, "ZeRO::legacy.allgather_param.zeros", 0, aligned * es);
  b_.DeviceSync("ZeRO::legacy.allgather_param.synchronize");
  b_.HostWork("ZeRO::legacy.allgather_param.narrow", world * py);
  b_.HostWork("python op", py);
  b_.MemoryKernel(all_gather_, "ZeRO::legacy.allgather_param.copy_partition", part * es, part * es);
  b_.HostWork("ZeRO::legacy.allgather_param.launch", std::max<int64_t>(0, kLegacyLaunchNs - launch_modelled));
  b_.HostWork("python op", py);
  const std::string flat = buffer + ".flat";
  b_.Allocate(flat, aligned * es, all_gather_);
  b_.Collective(all_gather_, "ZeRO::all_gather", CollectiveType::kAllGather, dp_, aligned * es, ctx_.compute_dtype);
  for (int64_t r = 0; r < world; ++r) {
    b_.HostWork("aten op", cpp);
    b_.MemoryKernel(all_gather_, "ZeRO::legacy.allgather_param.copy_out", part * es, part * es);
  }
  b_.Free(flat);
}

// 2021 stage3.py _synchronize_communication: handle.wait() for every in-flight gather (the
// current stream waits on the all-gather stream), then, with the blocking switches,
// comm_stream.synchronize() and torch.cuda.synchronize().
void Zero3Lowering::LegacySynchronizeCommunication() {
  const ZeroConfig& zero = ctx_.plan.zero;
  for (size_t h : legacy_inflight_) {
    for (size_t p = 0; p < subs_[h].fetch_param_numels.size(); ++p) b_.HostWork("aten op", ctx_.plan.host.cpp_op_overhead_ns);
    status_[h] = ParamStatus::kAvailable;
  }
  legacy_inflight_.clear();
  const std::string waited = fmt::format("all_gather_stream.{}", stream_waits_++);
  b_.Record(b_.Event(waited), all_gather_);
  b_.Wait(compute_, b_.Event(waited));
  if (zero.legacy_stream_sync_in_fetch_release) {
    b_.StreamSync("ZeRO::legacy.all_gather_stream.synchronize", all_gather_);
    b_.DeviceSync("ZeRO::legacy.fetch.synchronize");
  }
}

// 2021 fetch_sub_module: for each parameter of the submodule, print_rank_0(f"... norm=
// {param.norm()}", force=False): the f-string is built (a norm kernel, and .item() to format
// it: a device-to-host copy and a stream synchronize) even though nothing prints. PR #1188
// ("Removing the norm computation in debug printing") removed it.
void Zero3Lowering::LegacyDebugNorms(size_t s) {
  const int64_t es = ElementBytes();
  for (int64_t numel : subs_[s].param_numels) {
    b_.HostWork("python op", ctx_.plan.host.python_op_overhead_ns);
    b_.MemoryKernel(compute_, "ZeRO::legacy.debug_norm", numel * es, kFp32Bytes);
    b_.HostWork("python op", ctx_.plan.host.python_op_overhead_ns);
    b_.Memcpy(compute_, "ZeRO::legacy.debug_norm.item", traces::MemcpyKind::kDeviceToHost, kFp32Bytes);
    b_.StreamSync("ZeRO::legacy.debug_norm.item.synchronize", compute_);
  }
}

// PartitionedParameterCoordinator.fetch_sub_module.
void Zero3Lowering::FetchSubModule(size_t s) {
  const ZeroConfig& zero = ctx_.plan.zero;
  const int64_t es = ElementBytes();
  const size_t step = step_id_;
  // 1. kick off the all-gather of the submodule's own parameters.
  if (status_[s] == ParamStatus::kNotAvailable) AllGatherParams({s});
  if (zero.legacy_per_parameter_path) {
    // 2021: wait for every gather in flight (its own and earlier prefetches).
    if (!legacy_inflight_.empty()) LegacySynchronizeCommunication();
    if (zero.legacy_debug_norm_sync) LegacyDebugNorms(s);
  }
  // 2. wait for them. With more than __max_ongoing_fetch_events (2) recorded fetch events,
  // the host synchronizes the oldest (completed ones are dropped first with query(); an
  // event synchronize on a completed event returns at once, so always synchronizing the
  // oldest is the same). handle.wait(): the flat buffer is copied out into each parameter
  // (torch.cat per parameter, record_stream on the consumer) and freed; an event is recorded
  // on the all-gather stream.
  if (in_registry_[s]) {
    if (ongoing_fetch_events_.size() > 2) {
      b_.EventSync("ZeRO::fetch_event.synchronize",
                   b_.Event(fmt::format("fetch_event.{}", ongoing_fetch_events_.front())));
      ongoing_fetch_events_.pop_front();
    }
    Handle& handle = handles_[static_cast<size_t>(handle_of_[s])];
    if (!handle.complete) {
      for (size_t h : handle.subs) {
        const std::string unsharded = "unsharded." + subs_[h].name;
        if (!handle.single) {
          b_.Allocate(unsharded, subs_[h].fetch_numel * es, all_gather_);
          b_.MemoryKernel(all_gather_, "ZeRO::all_gather_coalesced.wait.cat", subs_[h].fetch_numel * es,
                          subs_[h].fetch_numel * es);
        }
        // free_param at release: param.data.record_stream(current_stream()).
        b_.RecordStream(unsharded, compute_);
        status_[h] = ParamStatus::kAvailable;
      }
      handle.complete = true;
    }
    PopFromRegistry(s);
    const int64_t event = fetch_events_++;
    b_.Record(b_.Event(fmt::format("fetch_event.{}", event)), all_gather_);
    ongoing_fetch_events_.push_back(event);
    if (zero.legacy_stream_sync_in_fetch_release) {
      // 2021 behaviour (stage3.py _synchronize_communication at microsoft/DeepSpeed 70adb32a:
      // comm_stream.synchronize(); torch.cuda.synchronize()), here on the current coordinator.
      b_.StreamSync("ZeRO::legacy.all_gather_stream.synchronize", all_gather_);
      b_.DeviceSync("ZeRO::legacy.fetch.synchronize");
    }
  }
  // current_stream().wait_stream(allgather_stream).
  const std::string waited = fmt::format("all_gather_stream.{}", stream_waits_++);
  b_.Record(b_.Event(waited), all_gather_);
  b_.Wait(compute_, b_.Event(waited));
  if (zero.legacy_debug_norm_sync && !zero.legacy_per_parameter_path) LegacyDebugNorms(s);
  // 3. prefetch from the trace: first pop the current submodule's own entry (when it was not
  // already fetched for this step), then pop entries while the numel to prefetch stays below
  // min(max_live_parameters - available, prefetch_bucket_size); a NOT_AVAILABLE submodule
  // is prefetched, an available one only has its most recent use advanced (so its release
  // keeps it). All prefetched parameters go in one all_gather_coalesced.
  if (most_recent_step_[s] < static_cast<int64_t>(step)) {
    while (!param_queue_.empty() && param_queue_.front() <= step) {
      const size_t t = param_queue_.front();
      param_queue_.pop_front();
      most_recent_step_[trace_[t]] = std::max(most_recent_step_[trace_[t]], static_cast<int64_t>(t));
      if (t == step) break;
    }
  }
  // 2021 behaviour (DeepSpeed issue #1069, jfc4050 2021-05-27: "a pre sub module hook is
  // executing before the pre module hook ... this causes the rest of the step ids in the
  // forward pass to be off by 1, which was causing the prefetches to be skipped"; fixed by PR
  // #1170): get_params_to_prefetch compares the submodule with the trace at the step id,
  // misses ("Tracing failed. Prefetching is disabled") and returns nothing.
  if (zero.stage3_prefetch_bucket_size > 0 && !zero.legacy_prefetch_off_by_one) {
    const int64_t max_to_prefetch =
        std::min(zero.stage3_max_live_parameters - n_available_, zero.stage3_prefetch_bucket_size);
    std::vector<size_t> to_prefetch;
    int64_t numel_prefetching = 0;
    while (!param_queue_.empty() && numel_prefetching < max_to_prefetch) {
      const size_t t = param_queue_.front();
      param_queue_.pop_front();
      const size_t p = trace_[t];
      const bool do_prefetch = status_[p] == ParamStatus::kNotAvailable && subs_[p].fetch_numel > 0 &&
                               std::find(to_prefetch.begin(), to_prefetch.end(), p) == to_prefetch.end();
      most_recent_step_[p] = std::max(most_recent_step_[p], static_cast<int64_t>(t));
      if (do_prefetch) {
        to_prefetch.push_back(p);
        numel_prefetching += subs_[p].fetch_numel;
      }
    }
    AllGatherParams(to_prefetch);
  }
  ++step_id_;
}

// PartitionedParameterCoordinator.release_sub_module -> __params_to_release: not persistent,
// not already fetched for a later step by a prefetch that skipped it, and not used again
// within stage3_max_reuse_distance elements of the trace from the current step
// (params_traversed counts ds_numel of every submodule passed).
void Zero3Lowering::ReleaseSubModule(size_t s) {
  const ZeroConfig& zero = ctx_.plan.zero;
  if (zero.legacy_stream_sync_in_fetch_release && !zero.legacy_per_parameter_path) {
    // 2021 behaviour: the post-submodule deallocation blocked the host on
    // cudaStreamSynchronize until the submodule's kernels had finished with the parameters
    // (DeepSpeed issue #1069, 2021-05-20: moving that deallocation onto its own stream,
    // non-blocking, removed "the big cudaStreamSynchronize" and took the forward from 839 to
    // 622 ms). The host cannot run ahead of the GPU: every next fetch is issued only after
    // the current submodule's compute has drained.
    b_.StreamSync("ZeRO::legacy.release.synchronize", compute_);
  }
  if (status_[s] != ParamStatus::kAvailable || subs_[s].fetch_numel == 0) return;
  // With the off-by-one trace, get_reuse_distance_in_numel misses too ("Tracing failed.
  // Cannot tell if the sub_module ... is reused") and answers a distance beyond any limit.
  if (!zero.legacy_prefetch_off_by_one) {
    if (most_recent_step_[s] > static_cast<int64_t>(step_id_)) return;
    int64_t traversed = 0;
    for (size_t t = step_id_; t < trace_.size(); ++t) {
      if (traversed >= zero.stage3_max_reuse_distance) break;
      if (trace_[t] == s) return;
      traversed += subs_[trace_[t]].numel;
    }
  }
  // __release_param -> param.partition(): the gathered data is freed.
  if (zero.legacy_per_parameter_path) {
    LegacyReleaseParams(s);
  } else {
    b_.Free("unsharded." + subs_[s].name);
  }
  status_[s] = ParamStatus::kNotAvailable;
  n_available_ -= subs_[s].fetch_numel;
}

// 2021 partition_parameters.py _partition_param, per released parameter: the gathered
// tensor is dropped and param.data replaced by torch.ones(1).half().to(param.device) — a
// pageable host-to-device copy, which PyTorch's copy_ follows with cudaStreamSynchronize on
// the current stream. That is the per-parameter "big cudaStreamSynchronize" of DeepSpeed
// issue #1069: the host waits for the submodule's kernels before the next fetch is issued.
void Zero3Lowering::LegacyReleaseParams(size_t s) {
  for (size_t p = 0; p < subs_[s].fetch_param_numels.size(); ++p) {
    b_.Free(LegacyBuffer(s, p));
    if (ctx_.plan.zero.legacy_stream_sync_in_fetch_release) LegacyPlaceholder();
  }
}

void Zero3Lowering::LegacyPlaceholder() {
  b_.HostWork("python op", ctx_.plan.host.python_op_overhead_ns);
  b_.Memcpy(compute_, "ZeRO::legacy.partition.placeholder", traces::MemcpyKind::kHostToDevice, ElementBytes());
  b_.StreamSync("ZeRO::legacy.release.synchronize", compute_);
}

// The end of a forward+backward: whatever is still gathered goes back to its partition
// (release_and_reset_all waits for in-flight gathers first).
void Zero3Lowering::ReleaseAll() {
  if (ctx_.plan.zero.legacy_per_parameter_path) {
    // stage3.py backward -> _partition_all_parameters: every parameter still available,
    // persistent ones included, goes through param.partition() (its placeholder copy).
    if (!legacy_inflight_.empty()) LegacySynchronizeCommunication();
    for (size_t s = 0; s < subs_.size(); ++s) {
      if (status_[s] == ParamStatus::kAvailable && subs_[s].fetch_numel > 0) {
        LegacyReleaseParams(s);
        status_[s] = ParamStatus::kNotAvailable;
      }
      if (ctx_.plan.zero.legacy_stream_sync_in_fetch_release) {
        for (size_t p = 0; p < subs_[s].persistent.size(); ++p) LegacyPlaceholder();
      }
    }
    n_available_ = 0;
    return;
  }
  for (size_t s = 0; s < subs_.size(); ++s) {
    if (status_[s] == ParamStatus::kInflight) {
      Handle& handle = handles_[static_cast<size_t>(handle_of_[s])];
      if (!handle.complete) {
        // Estimate: gathered and dropped without the wait's copies (nothing is in flight at
        // the end of a backward with a complete trace).
        for (size_t h : handle.subs) status_[h] = ParamStatus::kNotAvailable;
        if (handle.single) b_.Free("unsharded." + subs_[handle.subs.front()].name);
        handle.complete = true;
      }
    }
    PopFromRegistry(s);
    if (status_[s] == ParamStatus::kAvailable && subs_[s].fetch_numel > 0) {
      b_.Free("unsharded." + subs_[s].name);
    }
    if (subs_[s].fetch_numel > 0) status_[s] = ParamStatus::kNotAvailable;
  }
  n_available_ = 0;
}
}  // namespace shardscope::sim

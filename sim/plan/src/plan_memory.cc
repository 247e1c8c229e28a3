// What decides memory and out-of-memory behaviour: the allocator: section (PYTORCH_CUDA_ALLOC_CONF,
// the memory fraction, memory other processes hold) and the oom: section (raise, or Composer's
// catch_and_sync).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "plan_parser.h"
#include "shardscope/sim/models/caching_allocator.h"
#include "shardscope/sim/presets/cuda_runtime.h"

namespace shardscope::sim::plan_internal {

Status PlanParser::ReadAllocator(const Entry& entry, int32_t world_size, MemoryPlan* out) const {
  SHARDSCOPE_ASSIGN_OR_RETURN(Fields fields,
                              ReadMapping(entry.value, MarkOf(entry), "allocator", kAllocatorKeys));
  if (const Entry* e = fields.Find("conf")) {
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadString(*e, "allocator.conf", "a PYTORCH_CUDA_ALLOC_CONF string", &out->alloc_conf));
    StatusOr<AllocatorConfig> parsed = AllocatorConfig::Parse(out->alloc_conf);
    if (!parsed.ok()) {
      return Error(MarkOf(*e), "allocator.conf", "a valid PYTORCH_CUDA_ALLOC_CONF",
                   fmt::format("{} ({})", Quote(out->alloc_conf), parsed.status().message()));
    }
    out->allocator = *parsed;
  }
  if (const Entry* e = fields.Find("memory_fraction")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadNumber(*e, "allocator.memory_fraction", 0, true, 1.0,
                                          &out->allocator.memory_fraction));
  }
  auto gib = [](double gb) { return static_cast<int64_t>(std::llround(gb * (1 << 30))); };
  if (const Entry* e = fields.Find("memory_reserved_by_others_gb")) {
    double gb = 0;
    SHARDSCOPE_RETURN_IF_ERROR(ReadNumber(*e, "allocator.memory_reserved_by_others_gb", 0, false,
                                          kMaxReservedByOthersGb, &gb));
    out->reserved_by_others_bytes = gib(gb);
  }
  if (const Entry* e = fields.Find("memory_reserved_by_others_gb_per_rank")) {
    const std::string path = "allocator.memory_reserved_by_others_gb_per_rank";
    if (!e->value.IsMap()) return Error(*e, path, "a mapping of rank: GiB");
    for (const auto& pair : e->value) {
      const Entry rank_entry{pair.first.Scalar(), pair.first, pair.first};
      int64_t rank = 0;
      SHARDSCOPE_RETURN_IF_ERROR(ReadInt(rank_entry, path + " (rank)", 0, world_size - 1, &rank));
      const Entry value_entry{rank_entry.key, pair.first, pair.second};
      double gb = 0;
      SHARDSCOPE_RETURN_IF_ERROR(
          ReadNumber(value_entry, JoinPath(path, rank_entry.key), 0, false, kMaxReservedByOthersGb, &gb));
      out->reserved_by_others_per_rank[static_cast<int32_t>(rank)] = gib(gb);
    }
  }
  return Status::Ok();
}

Status PlanParser::CheckDeviceCapacity(const Entry& cluster, const Entry* allocator, const Plan& plan) const {
  const GpuSpec& gpu = plan.cluster.gpu;
  // The rank with the least left: a per-rank figure replaces the global one for its rank
  // (sim/simulate AllocatorCapacity), so the worst is the largest figure that applies.
  int64_t others = 0;
  int32_t worst_rank = -1;  // -1: the global figure
  const auto& per_rank = plan.memory.reserved_by_others_per_rank;
  if (static_cast<int64_t>(per_rank.size()) < plan.cluster.world_size()) {
    others = plan.memory.reserved_by_others_bytes;
  }
  for (const auto& [rank, bytes] : per_rank) {
    if (bytes > others) {
      others = bytes;
      worst_rank = rank;
    }
  }
  // The simulator's capacity (sim/simulate AllocatorCapacity): usable memory less the CUDA
  // context of the plan's CUDA release and other processes' memory. NCCL's buffers depend on
  // the communicators the lowering makes, so they are left to the simulation: this check is
  // an upper bound of what the allocator gets. Each term is below 2^51 (the plan's limits),
  // so nothing overflows.
  const PytorchVersion pytorch{plan.training.pytorch_major, plan.training.pytorch_minor};
  const CudaVersion cuda{plan.training.cuda_major, plan.training.cuda_minor};
  const int64_t context = CudaContextBytes(gpu.arch, cuda, LazyModuleLoading(pytorch, cuda));
  const int64_t left = gpu.usable_bytes - context - others;
  if (left > 0) return Status::Ok();
  const auto gib = [](int64_t bytes) { return static_cast<double>(bytes) / kBytesPerMemoryGb; };
  const std::string held =
      others > 0 ? fmt::format(" less {:.3f} GiB held by other processes{}", gib(others),
                               worst_rank >= 0 ? fmt::format(" on rank {}", worst_rank) : std::string())
                 : std::string();
  const std::string got =
      fmt::format("{:.3f} GiB of GPU memory less {:.3f} GiB of CUDA context (CUDA {}.{}){} = {:.3f} GiB",
                  gib(gpu.usable_bytes), gib(context), cuda.major, cuda.minor, held, gib(left));
  const std::string expected = "memory left for the caching allocator on every rank";
  if (others > 0 && allocator != nullptr) {
    SHARDSCOPE_ASSIGN_OR_RETURN(Fields fields, ReadMapping(allocator->value, MarkOf(*allocator), "allocator", kAllocatorKeys));
    const std::string key = worst_rank >= 0 ? "memory_reserved_by_others_gb_per_rank" : "memory_reserved_by_others_gb";
    if (const Entry* e = fields.Find(key)) {
      return Error(MarkOf(*e), "allocator." + key, fmt::format("{} (with cluster.gpu_memory_gb)", expected), got);
    }
  }
  if (cluster.value.IsMap()) {
    for (const auto& pair : cluster.value) {
      if (pair.first.IsScalar() && pair.first.Scalar() == "gpu_memory_gb") {
        return Error(pair.second.Mark(), "cluster.gpu_memory_gb", expected, got);
      }
    }
  }
  return Error(MarkOf(cluster), "cluster", expected, got);
}

Status PlanParser::ReadOom(const Entry& entry, const Plan& plan, OomConfig* out) const {
  SHARDSCOPE_ASSIGN_OR_RETURN(Fields fields,
                              ReadMapping(entry.value, MarkOf(entry), "oom", kOomKeys));
  if (const Entry* e = fields.Find("policy")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadEnum(*e, "oom.policy", kOomPolicies, &out->policy));
    // catch_and_sync is Composer's automicrobatching (composer/trainer/trainer.py
    // Trainer._train_batch), modelled on torch FSDP1: its sync hooks patch
    // torch.distributed.fsdp._flat_param.FlatParamHandle.unshard
    // (composer/trainer/_patch_pytorch.py patch_unshard_for_automicrobatching).
    if (out->policy == OomPolicy::kCatchAndSync &&
        (plan.strategy != Strategy::kFsdp1 ||
         plan.fsdp1.implementation != Fsdp1Implementation::kTorch)) {
      return KeyError(*e, "oom.policy",
                      "catch_and_sync only with strategy fsdp1 and implementation torch "
                      "(Composer's automicrobatching with its FSDP1 sync hooks; other "
                      "strategies keep policy raise)",
                      plan.strategy != Strategy::kFsdp1
                          ? fmt::format("strategy {}", StrategyName(plan.strategy))
                          : std::string("implementation fairscale"));
    }
  }
  if (const Entry* e = fields.Find("sync_hooks")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadBool(*e, "oom.sync_hooks", &out->sync_hooks));
    if (out->sync_hooks && out->policy != OomPolicy::kCatchAndSync) {
      return KeyError(*e, "oom.sync_hooks",
                      "sync_hooks only with policy catch_and_sync (the hooks all-reduce the "
                      "OOM flag that catch_and_sync raises)",
                      "policy raise");
    }
  }
  return Status::Ok();
}

}  // namespace shardscope::sim::plan_internal

// The "memory.*" metadata (device_memory_metadata.h): what the plan's CUDA stack takes from each
// GPU outside the step's tensors, with the figures of presets/cuda_runtime.h.
#include "device_memory_metadata.h"

#include <charconv>

#include <fmt/format.h>

#include "shardscope/sim/models/nccl_model.h"
#include "shardscope/sim/presets/cuda_runtime.h"

namespace shardscope::sim::lowering_internal {
namespace {

// Bounds on hand-written values: far above any real GPU.
constexpr int64_t kMaxBytes = int64_t{1} << 50;
constexpr int64_t kMaxWorkspaces = 1 << 10;
constexpr int64_t kMaxChannels = 1 << 10;

std::string Flag(bool value) { return value ? "1" : "0"; }

Status ReadInt(const std::map<std::string, std::string>& m, const std::string& label, const std::string& key,
               int64_t max, int64_t& out) {
  auto it = m.find(key);
  if (it == m.end()) return Status::Ok();
  const std::string& text = it->second;
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0 || value > max) {
    return Status::InvalidInput(
        fmt::format("{}: /metadata/{}: expected an integer 0..{}, got \"{}\"", label, key, max, text));
  }
  out = value;
  return Status::Ok();
}

}  // namespace

void WriteDeviceMemoryMetadata(const Plan& plan, std::map<std::string, std::string>& m) {
  const PytorchVersion pytorch{plan.training.pytorch_major, plan.training.pytorch_minor};
  const CudaVersion cuda{plan.training.cuda_major, plan.training.cuda_minor};
  const GpuArch arch = plan.cluster.gpu.arch;
  const bool lazy = LazyModuleLoading(pytorch, cuda);
  m["memory.cuda_version"] = ReleaseVersionText(cuda);
  m["memory.cuda_lazy_loading"] = Flag(lazy);
  m["memory.cuda_context_bytes"] = std::to_string(CudaContextBytes(arch, cuda, lazy));
  const CublasWorkspace workspace = CublasWorkspaceOf(arch, pytorch);
  m["memory.cublas_workspace_bytes"] = std::to_string(workspace.bytes);
  // Every lowering launches its GEMMs on one stream ("compute"): one workspace per handle.
  m["memory.cublas_workspaces"] = std::to_string(kCublasHandlesPerTrainingStep);
  m["memory.cublas_workspace_in_allocator"] = Flag(workspace.through_caching_allocator);
  // NCCL's buffers: channels per communicator as the job's NCCL gives them (0: NcclChannelsFor
  // each communicator, with the algorithms its tuning runs), NCCL_BUFFSIZE from cluster.nccl, and
  // whether the release connects every channel at init.
  m["memory.nccl_channels"] = std::to_string(0);
  m["memory.nccl_per_communicator"] = Flag(true);
  m["memory.nccl_buffsize"] = std::to_string(plan.cluster.nccl.buffsize);
  m["memory.nccl_connect_at_init"] = Flag(NcclConnectsAtInit(plan.cluster.nccl.version));
}

Status ReadDeviceMemoryMetadata(const traces::Schedule& schedule, const std::string& label, SimulationSetup& setup) {
  const std::map<std::string, std::string>& m = schedule.metadata;
  DeviceMemorySetup& d = setup.device_memory;
  if (auto it = m.find("memory.cuda_version"); it != m.end()) {
    const std::optional<ReleaseVersion> cuda = ParseReleaseVersion(it->second);
    if (!cuda) {
      return Status::InvalidInput(
          fmt::format("{}: /metadata/memory.cuda_version: expected \"major.minor\", got \"{}\"", label, it->second));
    }
    d.cuda = *cuda;
  }
  int64_t value = 0;
  SHARDSCOPE_RETURN_IF_ERROR(ReadInt(m, label, "memory.cuda_lazy_loading", 1, value));
  d.lazy_loading = value != 0;
  // A schedule written before these keys: its single context figure (CUDA context + NCCL).
  SHARDSCOPE_RETURN_IF_ERROR(ReadInt(m, label, "gpu.cuda_context_bytes", kMaxBytes, d.cuda_context_bytes));
  SHARDSCOPE_RETURN_IF_ERROR(ReadInt(m, label, "memory.cuda_context_bytes", kMaxBytes, d.cuda_context_bytes));
  SHARDSCOPE_RETURN_IF_ERROR(ReadInt(m, label, "memory.cublas_workspace_bytes", kMaxBytes, d.cublas_workspace_bytes));
  value = d.cublas_workspaces;
  SHARDSCOPE_RETURN_IF_ERROR(ReadInt(m, label, "memory.cublas_workspaces", kMaxWorkspaces, value));
  d.cublas_workspaces = static_cast<int32_t>(value);
  value = d.cublas_in_allocator ? 1 : 0;
  SHARDSCOPE_RETURN_IF_ERROR(ReadInt(m, label, "memory.cublas_workspace_in_allocator", 1, value));
  d.cublas_in_allocator = value != 0;
  value = 0;
  SHARDSCOPE_RETURN_IF_ERROR(ReadInt(m, label, "memory.nccl_channels", kMaxChannels, value));
  d.nccl.channels = static_cast<int32_t>(value);
  SHARDSCOPE_RETURN_IF_ERROR(ReadInt(m, label, "memory.nccl_buffsize", kMaxBytes, d.nccl.buffsize));
  value = 0;
  SHARDSCOPE_RETURN_IF_ERROR(ReadInt(m, label, "memory.nccl_connect_at_init", 1, value));
  d.nccl.connect_at_init = value != 0;
  value = 0;
  SHARDSCOPE_RETURN_IF_ERROR(ReadInt(m, label, "memory.nccl_per_communicator", 1, value));
  if (value != 0) {
    const NcclModel model(NcclModelConfig::For(setup.cluster.nccl));
    d.nccl_per_rank = NcclMemoryPerRank(schedule, setup.cluster, d.nccl, &model);
  } else if (d.nccl.channels > 0) {
    d.nccl_per_rank = NcclMemoryPerRank(schedule, setup.cluster, d.nccl);
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(setup.init, ReadInitProgram(m, label));
  return Status::Ok();
}

}  // namespace shardscope::sim::lowering_internal

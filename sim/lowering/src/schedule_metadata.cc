// The plan context a schedule carries in Schedule::metadata, written by the lowering and read
// back by every simulation of the schedule (so a schedule JSON simulates without its plan).
#include "shardscope/sim/lowering/schedule_metadata.h"

#include <charconv>
#include <initializer_list>
#include <string_view>
#include <tuple>
#include <utility>
#include <cmath>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "nccl_metadata.h"
#include "device_memory_metadata.h"
#include "shardscope/sim/models/calibration.h"
#include "shardscope/sim/presets/mfu_conventions.h"

namespace shardscope::sim {
namespace {

using traces::Schedule;

// Bounds on a hand-written schedule's measured GPU figures: far above any real GPU, so the
// GEMM model's integer tile arithmetic cannot overflow.
constexpr int64_t kMaxKernelFloorNs = 1'000'000'000;  // 1 s
constexpr int64_t kMaxMeasuredDim = int64_t{1} << 24;
// Bounds on the other figures a schedule's metadata may give (the limits of schedule_json.h's
// metadata table). Each range holds every preset and every figure a plan can produce (the
// plan's own limits, sim/plan/src/plan_schema.h), and keeps durations inside the simulator's
// horizon with traces' byte limits:
// - FLOP rates from 0.1 TFLOP/s (a 2010 GPU's fp32) to 10^18 (a thousand B200s);
constexpr double kMinFlops = 1e11;
constexpr double kMaxFlops = 1e18;
// - bandwidths from 0.1 GB/s (below 1 Gb/s Ethernet's 125 MB/s, the slowest link a GPU job
//   could cross) to 100 TB/s (the plan's kMaxBandwidthGbps; HBM3e is 8 TB/s);
constexpr double kMinBandwidth = 1e8;
constexpr double kMaxBandwidth = 1e14;
// - memory sizes up to traces::kMaxOpBytes (1 PiB; the plan's gpu_memory_gb limit is 100 TB);
// - host costs up to one second each (the plan's kMaxHostOverheadUs);
constexpr int64_t kMaxHostCostNs = 1'000'000'000;
// - contention slowdowns up to 100 (the plan's kMaxSlowdown); SMs and NICs up to 2^16.
constexpr double kMaxContentionSlowdown = 100;
constexpr int64_t kMaxSmOrNicCount = int64_t{1} << 16;
// - nodes and GPUs per node up to 2^20 (the plan's kMaxWorldSize).
constexpr int32_t kMaxClusterGpus = int32_t{1} << 20;

std::string Num(double value) { return fmt::format("{:.17g}", value); }

// "1" / "0". A std::string, not a literal: assigning a `cond ? "1" : "0"` char pointer into a
// map entry trips g++ 12's -Wrestrict false positive (GCC bug 105329) once inlined here.
std::string Flag(bool value) { return value ? "1" : "0"; }

// Typed access to string metadata with errors that name the key.
class MetadataReader {
 public:
  MetadataReader(const std::map<std::string, std::string>& metadata, const std::string& label)
      : metadata_(metadata), label_(label) {}

  bool Has(const std::string& key) const { return metadata_.count(key) > 0; }

  Status Int(const std::string& key, int64_t& out) const {
    auto it = metadata_.find(key);
    if (it == metadata_.end()) return Status::Ok();
    const std::string& text = it->second;
    int64_t value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size()) {
      return Error(key, "an integer", text);
    }
    out = value;
    return Status::Ok();
  }
  Status Int32(const std::string& key, int32_t& out) const {
    int64_t value = out;
    SHARDSCOPE_RETURN_IF_ERROR(Int(key, value));
    if (value < INT32_MIN || value > INT32_MAX) return Error(key, "a 32-bit integer", std::to_string(value));
    out = static_cast<int32_t>(value);
    return Status::Ok();
  }
  Status Double(const std::string& key, double& out) const {
    auto it = metadata_.find(key);
    if (it == metadata_.end()) return Status::Ok();
    const std::string& text = it->second;
    char* end = nullptr;
    const double value = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(value)) {
      return Error(key, "a finite number", text);
    }
    out = value;
    return Status::Ok();
  }
  // `value` (read from `key`, or the preset's) in [min, max]; 0 is accepted too when
  // `zero_means` says what it means ("not supported", "the HBM bandwidth", ...).
  Status InRange(const std::string& key, double value, double min, double max, std::string_view zero_means = {}) const {
    if ((value >= min && value <= max) || (!zero_means.empty() && value == 0)) return Status::Ok();
    return Error(key,
                 zero_means.empty() ? fmt::format("a number in [{:g}, {:g}]", min, max)
                                    : fmt::format("a number in [{:g}, {:g}], or 0 ({})", min, max, zero_means),
                 Text(key, value));
  }
  std::string String(const std::string& key, const std::string& fallback) const {
    auto it = metadata_.find(key);
    return it == metadata_.end() ? fallback : it->second;
  }

 private:
  // The key's text when the metadata has it, else the value it came from (a preset's).
  std::string Text(const std::string& key, double value) const {
    auto it = metadata_.find(key);
    return it != metadata_.end() ? it->second : fmt::format("{:g} (from the preset)", value);
  }
  Status Error(const std::string& key, const std::string& expected, const std::string& got) const {
    return Status::InvalidInput(
        fmt::format("{}: /metadata/{}: expected {}, got \"{}\"", label_, key, expected, got));
  }
  const std::map<std::string, std::string>& metadata_;
  const std::string& label_;
};



}  // namespace

void WritePlanMetadata(const Plan& plan, std::map<std::string, std::string>& m) {
  const ClusterSpec& c = plan.cluster;
  const GpuSpec& g = c.gpu;
  m["plan.source"] = plan.source;
  m["plan.strategy"] = std::string(StrategyName(plan.strategy));
  m["plan.model"] = plan.model.name;
  m["cluster.name"] = c.name;
  m["cluster.nodes"] = std::to_string(c.nodes);
  m["cluster.gpus_per_node"] = std::to_string(c.gpus_per_node);
  m["cluster.fabric"] = std::to_string(static_cast<int>(c.fabric));
  m["cluster.intra_node_bandwidth"] = Num(c.intra_node_bandwidth);
  m["cluster.inter_node_bandwidth"] = Num(c.inter_node_bandwidth);
  m["cluster.nics_per_node"] = std::to_string(c.nics_per_node);
  m["cluster.cpu_vendor"] = std::to_string(static_cast<int>(c.cpu_vendor));
  m["cluster.gpu_direct_rdma"] = Flag(c.gpu_direct_rdma);
  WriteNcclMetadata(c, m);
  // Only when not the default (links shared): schedules of plans without the key stay as they were.
  if (!c.link_sharing) m["cluster.link_sharing"] = Flag(false);
  m["gpu.name"] = g.name;
  m["gpu.arch"] = std::to_string(static_cast<int>(g.arch));
  m["gpu.sm_count"] = std::to_string(g.sm_count);
  m["gpu.peak_flops_bf16"] = Num(g.peak_flops_bf16);
  m["gpu.peak_flops_fp16"] = Num(g.peak_flops_fp16);
  m["gpu.peak_flops_tf32"] = Num(g.peak_flops_tf32);
  m["gpu.peak_flops_fp32"] = Num(g.peak_flops_fp32);
  m["gpu.peak_flops_fp8"] = Num(g.peak_flops_fp8);
  m["gpu.hbm_bytes"] = std::to_string(g.hbm_bytes);
  m["gpu.hbm_bandwidth"] = Num(g.hbm_bandwidth);
  m["gpu.nvlink_bandwidth"] = Num(g.nvlink_bandwidth);
  m["gpu.pcie_bandwidth"] = Num(g.pcie_bandwidth);
  m["gpu.usable_bytes"] = std::to_string(g.usable_bytes);
  m["gpu.measured.matmul_flops_16bit"] = Num(g.measured.matmul_flops_16bit);
  m["gpu.measured.matmul_m"] = std::to_string(g.measured.matmul_m);
  m["gpu.measured.matmul_n"] = std::to_string(g.measured.matmul_n);
  m["gpu.measured.matmul_k"] = std::to_string(g.measured.matmul_k);
  m["gpu.measured.matmul_flops_fp32"] = Num(g.measured.matmul_flops_fp32);
  m["gpu.measured.copy_bandwidth"] = Num(g.measured.copy_bandwidth);
  m["gpu.measured.kernel_floor_ns"] = std::to_string(g.measured.kernel_floor_ns);
  m["contention.compute_slowdown"] = Num(plan.contention.compute_slowdown);
  m["contention.comm_slowdown"] = Num(plan.contention.comm_slowdown);
  m["host.launch_overhead_ns"] = std::to_string(plan.host.launch_overhead_ns);
  m["host.hook_overhead_ns"] = std::to_string(plan.host.hook_overhead_ns);
  m["host.python_op_overhead_ns"] = std::to_string(plan.host.python_op_overhead_ns);
  m["host.cpp_op_overhead_ns"] = std::to_string(plan.host.cpp_op_overhead_ns);
  m["host.max_queued_launches_per_stream"] = std::to_string(plan.host.max_queued_launches_per_stream);
  m["host.cuda_malloc_ns"] = std::to_string(plan.host.cuda_malloc_ns);
  m["host.cuda_free_ns"] = std::to_string(plan.host.cuda_free_ns);
  m["training.dtype"] = std::string(traces::DTypeName(plan.training.dtype));
  // What the plan resolved to (plan_training.cc ResolveKernelChoices): informational, not read back.
  const KernelChoices& k = plan.training.kernels;
  m["training.precision"] = std::string(PrecisionName(plan.training.precision));
  m["training.pytorch_version"] = fmt::format("{}.{}", plan.training.pytorch_major, plan.training.pytorch_minor);
  m["training.kernels.implementation"] = std::string(ModelImplementationName(k.implementation));
  m["training.kernels.rms_norm"] = std::string(RmsNormKernelName(k.rms_norm));
  m["training.kernels.attention"] = k.eager_attention ? "eager" : std::string(traces::AttentionImplName(k.attention));
  m["training.kernels.repeat_kv"] = Flag(k.repeat_kv);
  m["training.kernels.compile"] = Flag(k.compile);
  m["training.kernels.compile_loss"] = Flag(k.compile_loss);
  m["allocator.conf"] = plan.memory.alloc_conf;
  m["allocator.memory_fraction"] = Num(plan.memory.allocator.memory_fraction);
  m["allocator.reserved_by_others_bytes"] = std::to_string(plan.memory.reserved_by_others_bytes);
  for (const auto& [rank, bytes] : plan.memory.reserved_by_others_per_rank) {
    m[fmt::format("allocator.reserved_by_others_bytes.{}", rank)] = std::to_string(bytes);
  }
  if (!plan.calibration.empty()) m["cluster.calibration"] = plan.calibration;
  // divergence.slowdown: a straggler's factor, read back into EngineConfig::rank_slowdown.
  for (const auto& [rank, factor] : plan.divergence.slowdown) {
    m[fmt::format("divergence.slowdown.{}", rank)] = Num(factor);
  }
  // Only when not the default: schedules of plans without an oom section stay as they were.
  if (plan.oom.policy == OomPolicy::kCatchAndSync) {
    m["oom.policy"] = std::string("catch_and_sync");
    m["oom.sync_hooks"] = Flag(plan.oom.sync_hooks);
  }
  lowering_internal::WriteDeviceMemoryMetadata(plan, m);
}

StatusOr<SimulationSetup> SetupFromSchedule(const Schedule& schedule, const std::string& label) {
  SimulationSetup setup;
  setup.label = label;
  MetadataReader md(schedule.metadata, label);
  // Either a preset ("cluster.preset" + "cluster.nodes", handy in hand-written schedules) or
  // every figure as LowerPlan writes them; explicit figures override the preset's.
  if (md.Has("cluster.preset")) {
    int32_t nodes = 1;
    SHARDSCOPE_RETURN_IF_ERROR(md.Int32("cluster.nodes", nodes));
    SHARDSCOPE_ASSIGN_OR_RETURN(setup.cluster, FindClusterPreset(md.String("cluster.preset", ""), nodes));
  } else if (!md.Has("gpu.hbm_bandwidth")) {
    return Status::InvalidInput(fmt::format(
        "{}: /metadata: the schedule names no cluster; add \"cluster.preset\" (one of {}) and "
        "\"cluster.nodes\"",
        label, fmt::join(ClusterPresetNames(), ", ")));
  }
  ClusterSpec& c = setup.cluster;
  GpuSpec& g = c.gpu;
  int32_t fabric = static_cast<int32_t>(c.fabric), arch = static_cast<int32_t>(g.arch);
  c.name = md.String("cluster.name", c.name);
  SHARDSCOPE_RETURN_IF_ERROR(md.Int32("cluster.nodes", c.nodes));
  SHARDSCOPE_RETURN_IF_ERROR(md.Int32("cluster.gpus_per_node", c.gpus_per_node));
  SHARDSCOPE_RETURN_IF_ERROR(md.Int32("cluster.fabric", fabric));
  SHARDSCOPE_RETURN_IF_ERROR(md.Double("cluster.intra_node_bandwidth", c.intra_node_bandwidth));
  SHARDSCOPE_RETURN_IF_ERROR(md.Double("cluster.inter_node_bandwidth", c.inter_node_bandwidth));
  SHARDSCOPE_RETURN_IF_ERROR(md.Int32("cluster.nics_per_node", c.nics_per_node));
  int32_t cpu_vendor = static_cast<int32_t>(c.cpu_vendor), rdma = c.gpu_direct_rdma ? 1 : 0;
  SHARDSCOPE_RETURN_IF_ERROR(md.Int32("cluster.cpu_vendor", cpu_vendor));
  SHARDSCOPE_RETURN_IF_ERROR(md.Int32("cluster.gpu_direct_rdma", rdma));
  if (cpu_vendor < 0 || cpu_vendor > static_cast<int32_t>(CpuVendor::kAmd) || (rdma != 0 && rdma != 1)) {
    return Status::InvalidInput(fmt::format(
        "{}: /metadata: cluster.cpu_vendor must be 0 (Intel) or 1 (AMD) and cluster.gpu_direct_rdma 0 or 1", label));
  }
  c.cpu_vendor = static_cast<CpuVendor>(cpu_vendor);
  c.gpu_direct_rdma = rdma == 1;
  SHARDSCOPE_RETURN_IF_ERROR(ReadNcclMetadata(schedule.metadata, label, &c));
  int32_t link_sharing = c.link_sharing ? 1 : 0;
  SHARDSCOPE_RETURN_IF_ERROR(md.Int32("cluster.link_sharing", link_sharing));
  if (link_sharing != 0 && link_sharing != 1) {
    return Status::InvalidInput(fmt::format(
        "{}: /metadata/cluster.link_sharing: expected 0 (every communicator on links of its own) or 1 (shared), got {}",
        label, link_sharing));
  }
  c.link_sharing = link_sharing == 1;
  g.name = md.String("gpu.name", g.name);
  SHARDSCOPE_RETURN_IF_ERROR(md.Int32("gpu.arch", arch));
  SHARDSCOPE_RETURN_IF_ERROR(md.Int32("gpu.sm_count", g.sm_count));
  SHARDSCOPE_RETURN_IF_ERROR(md.Double("gpu.peak_flops_bf16", g.peak_flops_bf16));
  SHARDSCOPE_RETURN_IF_ERROR(md.Double("gpu.peak_flops_fp16", g.peak_flops_fp16));
  SHARDSCOPE_RETURN_IF_ERROR(md.Double("gpu.peak_flops_tf32", g.peak_flops_tf32));
  SHARDSCOPE_RETURN_IF_ERROR(md.Double("gpu.peak_flops_fp32", g.peak_flops_fp32));
  SHARDSCOPE_RETURN_IF_ERROR(md.Double("gpu.peak_flops_fp8", g.peak_flops_fp8));
  SHARDSCOPE_RETURN_IF_ERROR(md.Int("gpu.hbm_bytes", g.hbm_bytes));
  SHARDSCOPE_RETURN_IF_ERROR(md.Double("gpu.hbm_bandwidth", g.hbm_bandwidth));
  SHARDSCOPE_RETURN_IF_ERROR(md.Double("gpu.nvlink_bandwidth", g.nvlink_bandwidth));
  SHARDSCOPE_RETURN_IF_ERROR(md.Double("gpu.pcie_bandwidth", g.pcie_bandwidth));
  // What CUDA reports; a schedule that gives only the datasheet capacity (or was written before
  // this key) has that much usable.
  if (md.Has("gpu.hbm_bytes") && !md.Has("gpu.usable_bytes")) g.usable_bytes = g.hbm_bytes;
  SHARDSCOPE_RETURN_IF_ERROR(md.Int("gpu.usable_bytes", g.usable_bytes));
  if (g.usable_bytes < 0 || g.hbm_bytes < 0) {
    return Status::InvalidInput(fmt::format("{}: /metadata: gpu.hbm_bytes and gpu.usable_bytes must be >= 0", label));
  }
  GpuMeasuredFigures& measured = g.measured;
  SHARDSCOPE_RETURN_IF_ERROR(md.Double("gpu.measured.matmul_flops_16bit", measured.matmul_flops_16bit));
  SHARDSCOPE_RETURN_IF_ERROR(md.Int("gpu.measured.matmul_m", measured.matmul_m));
  SHARDSCOPE_RETURN_IF_ERROR(md.Int("gpu.measured.matmul_n", measured.matmul_n));
  SHARDSCOPE_RETURN_IF_ERROR(md.Int("gpu.measured.matmul_k", measured.matmul_k));
  SHARDSCOPE_RETURN_IF_ERROR(md.Double("gpu.measured.matmul_flops_fp32", measured.matmul_flops_fp32));
  SHARDSCOPE_RETURN_IF_ERROR(md.Double("gpu.measured.copy_bandwidth", measured.copy_bandwidth));
  SHARDSCOPE_RETURN_IF_ERROR(md.Int("gpu.measured.kernel_floor_ns", measured.kernel_floor_ns));
  if (measured.matmul_flops_16bit < 0 || measured.matmul_flops_fp32 < 0 || measured.copy_bandwidth < 0 ||
      measured.kernel_floor_ns < 0 || measured.kernel_floor_ns > kMaxKernelFloorNs || measured.matmul_m < 0 ||
      measured.matmul_n < 0 || measured.matmul_k < 0 || measured.matmul_m > kMaxMeasuredDim ||
      measured.matmul_n > kMaxMeasuredDim || measured.matmul_k > kMaxMeasuredDim) {
    return Status::InvalidInput(fmt::format(
        "{}: /metadata/gpu.measured.*: figures must be >= 0 (a kernel floor at most {} ns, GEMM dimensions at most "
        "{})",
        label, kMaxKernelFloorNs, kMaxMeasuredDim));
  }
  if (fabric < 0 || fabric > static_cast<int32_t>(IntraNodeFabric::kPcie)) {
    return Status::InvalidInput(fmt::format("{}: /metadata/cluster.fabric: expected 0..2, got {}", label, fabric));
  }
  if (arch < 0 || arch > static_cast<int32_t>(GpuArch::kHopper)) {
    return Status::InvalidInput(fmt::format("{}: /metadata/gpu.arch: expected 0..2, got {}", label, arch));
  }
  c.fabric = static_cast<IntraNodeFabric>(fabric);
  g.arch = static_cast<GpuArch>(arch);
  // Every figure the models divide by or multiply with, in range: 0 only where it means
  // something (a tensor-core rate the GPU lacks, a link it lacks, a copy rate not measured).
  constexpr std::string_view kNotSupported = "not supported: such GEMMs run on the CUDA cores at the fp32 rate";
  const auto bytes_key = [&](const std::string& key, double value) {
    return md.InRange(key, value, 0, static_cast<double>(traces::kMaxOpBytes));
  };
  for (const auto& [key, value, zero_means] : std::initializer_list<std::tuple<const char*, double, std::string_view>>{
           {"gpu.peak_flops_bf16", g.peak_flops_bf16, kNotSupported},
           {"gpu.peak_flops_fp16", g.peak_flops_fp16, kNotSupported},
           {"gpu.peak_flops_tf32", g.peak_flops_tf32, kNotSupported},
           {"gpu.peak_flops_fp8", g.peak_flops_fp8, kNotSupported},
           {"gpu.peak_flops_fp32", g.peak_flops_fp32, {}},
           {"gpu.measured.matmul_flops_16bit", measured.matmul_flops_16bit, "not measured: the peak"},
           {"gpu.measured.matmul_flops_fp32", measured.matmul_flops_fp32, "not measured: the peak"}}) {
    SHARDSCOPE_RETURN_IF_ERROR(md.InRange(key, value, kMinFlops, kMaxFlops, zero_means));
  }
  if (g.peak_flops_bf16 == 0 && g.peak_flops_fp16 == 0) {
    return Status::InvalidInput(fmt::format(
        "{}: /metadata: gpu.peak_flops_bf16 and gpu.peak_flops_fp16 are both 0: a GPU without 16-bit tensor cores "
        "is not modelled (give the datasheet's dense figures)",
        label));
  }
  for (const auto& [key, value, zero_means] : std::initializer_list<std::tuple<const char*, double, std::string_view>>{
           {"gpu.hbm_bandwidth", g.hbm_bandwidth, {}},
           {"gpu.nvlink_bandwidth", g.nvlink_bandwidth, "no NVLink"},
           {"gpu.pcie_bandwidth", g.pcie_bandwidth, "host copies take no time"},
           {"gpu.measured.copy_bandwidth", measured.copy_bandwidth, "not measured: the HBM bandwidth"},
           {"cluster.intra_node_bandwidth", c.intra_node_bandwidth, c.gpus_per_node == 1 ? "one GPU per node" : ""},
           {"cluster.inter_node_bandwidth", c.inter_node_bandwidth, c.nodes == 1 ? "one node" : ""}}) {
    SHARDSCOPE_RETURN_IF_ERROR(md.InRange(key, value, kMinBandwidth, kMaxBandwidth, zero_means));
  }
  SHARDSCOPE_RETURN_IF_ERROR(bytes_key("gpu.hbm_bytes", static_cast<double>(g.hbm_bytes)));
  SHARDSCOPE_RETURN_IF_ERROR(bytes_key("gpu.usable_bytes", static_cast<double>(g.usable_bytes)));
  SHARDSCOPE_RETURN_IF_ERROR(md.InRange("gpu.sm_count", g.sm_count, 1, static_cast<double>(kMaxSmOrNicCount)));
  SHARDSCOPE_RETURN_IF_ERROR(md.InRange("cluster.nics_per_node", c.nics_per_node, 0, static_cast<double>(kMaxSmOrNicCount)));
  if (c.nodes < 1 || c.gpus_per_node < 1 || c.nodes > kMaxClusterGpus || c.gpus_per_node > kMaxClusterGpus ||
      g.hbm_bandwidth <= 0) {
    return Status::InvalidInput(fmt::format(
        "{}: /metadata: cluster needs nodes and gpus_per_node in [1, {}] and gpu.hbm_bandwidth > 0", label,
        kMaxClusterGpus));
  }
  if (static_cast<int64_t>(c.nodes) * c.gpus_per_node < schedule.world_size()) {
    return Status::InvalidInput(fmt::format(
        "{}: the schedule has {} ranks but the cluster ({} x {} GPUs) has only {}", label,
        schedule.world_size(), c.nodes, c.gpus_per_node, static_cast<int64_t>(c.nodes) * c.gpus_per_node));
  }

  setup.contention = DefaultContentionConfig();
  SHARDSCOPE_RETURN_IF_ERROR(md.Double("contention.compute_slowdown", setup.contention.compute_slowdown));
  SHARDSCOPE_RETURN_IF_ERROR(md.Double("contention.comm_slowdown", setup.contention.comm_slowdown));
  setup.host = DefaultHostConfig();
  SHARDSCOPE_RETURN_IF_ERROR(md.Int("host.launch_overhead_ns", setup.host.launch_overhead_ns));
  SHARDSCOPE_RETURN_IF_ERROR(md.Int("host.hook_overhead_ns", setup.host.hook_overhead_ns));
  SHARDSCOPE_RETURN_IF_ERROR(md.Int("host.python_op_overhead_ns", setup.host.python_op_overhead_ns));
  SHARDSCOPE_RETURN_IF_ERROR(md.Int("host.cpp_op_overhead_ns", setup.host.cpp_op_overhead_ns));
  SHARDSCOPE_RETURN_IF_ERROR(
      md.Int32("host.max_queued_launches_per_stream", setup.host.max_queued_launches_per_stream));
  SHARDSCOPE_RETURN_IF_ERROR(md.Int("host.cuda_malloc_ns", setup.host.cuda_malloc_ns));
  SHARDSCOPE_RETURN_IF_ERROR(md.Int("host.cuda_free_ns", setup.host.cuda_free_ns));
  SHARDSCOPE_RETURN_IF_ERROR(
      md.InRange("contention.compute_slowdown", setup.contention.compute_slowdown, 0, kMaxContentionSlowdown));
  SHARDSCOPE_RETURN_IF_ERROR(
      md.InRange("contention.comm_slowdown", setup.contention.comm_slowdown, 0, kMaxContentionSlowdown));
  for (const auto& [key, value] : std::initializer_list<std::pair<const char*, int64_t>>{
           {"host.launch_overhead_ns", setup.host.launch_overhead_ns},
           {"host.hook_overhead_ns", setup.host.hook_overhead_ns},
           {"host.python_op_overhead_ns", setup.host.python_op_overhead_ns},
           {"host.cpp_op_overhead_ns", setup.host.cpp_op_overhead_ns},
           {"host.cuda_malloc_ns", setup.host.cuda_malloc_ns},
           {"host.cuda_free_ns", setup.host.cuda_free_ns}}) {
    SHARDSCOPE_RETURN_IF_ERROR(md.InRange(key, static_cast<double>(value), 0, static_cast<double>(kMaxHostCostNs)));
  }
  SHARDSCOPE_RETURN_IF_ERROR(md.InRange("host.max_queued_launches_per_stream",
                                        setup.host.max_queued_launches_per_stream, 0, double(int64_t{1} << 24)));
  setup.memory.alloc_conf = md.String("allocator.conf", "");
  StatusOr<AllocatorConfig> allocator = AllocatorConfig::Parse(setup.memory.alloc_conf);
  if (!allocator.ok()) {
    return Status::InvalidInput(fmt::format("{}: /metadata/allocator.conf: {}", label, allocator.status().message()));
  }
  setup.memory.allocator = *allocator;
  SHARDSCOPE_RETURN_IF_ERROR(md.Double("allocator.memory_fraction", setup.memory.allocator.memory_fraction));
  SHARDSCOPE_RETURN_IF_ERROR(md.Int("allocator.reserved_by_others_bytes", setup.memory.reserved_by_others_bytes));
  if (!(setup.memory.allocator.memory_fraction > 0 && setup.memory.allocator.memory_fraction <= 1)) {
    return Status::InvalidInput(fmt::format("{}: /metadata: allocator.memory_fraction must be in (0, 1]", label));
  }
  SHARDSCOPE_RETURN_IF_ERROR(
      bytes_key("allocator.reserved_by_others_bytes", static_cast<double>(setup.memory.reserved_by_others_bytes)));
  for (int32_t rank = 0; rank < schedule.world_size(); ++rank) {
    const std::string key = fmt::format("allocator.reserved_by_others_bytes.{}", rank);
    if (!md.Has(key)) continue;
    int64_t bytes = 0;
    SHARDSCOPE_RETURN_IF_ERROR(md.Int(key, bytes));
    SHARDSCOPE_RETURN_IF_ERROR(bytes_key(key, static_cast<double>(bytes)));
    setup.memory.reserved_by_others_per_rank[rank] = bytes;
  }
  for (int32_t rank = 0; rank < schedule.world_size(); ++rank) {
    const std::string key = fmt::format("divergence.slowdown.{}", rank);
    if (!md.Has(key)) continue;
    double factor = 0;
    SHARDSCOPE_RETURN_IF_ERROR(md.Double(key, factor));
    if (!(factor > 0 && factor <= kMaxRankSlowdownFactor)) {
      return Status::InvalidInput(fmt::format("{}: /metadata/{}: a slowdown factor must be in (0, {}]", label, key,
                                              kMaxRankSlowdownFactor));
    }
    setup.rank_slowdown[rank] = factor;
  }
  if (md.Has("cluster.calibration")) {
    const std::string path = md.String("cluster.calibration", "");
    StatusOr<CalibrationProfile> profile = ReadCalibrationProfile(path);
    if (!profile.ok()) {
      return Status::InvalidInput(
          fmt::format("{}: /metadata/cluster.calibration: {}", label, profile.status().message()));
    }
    setup.calibration = std::make_shared<const CalibrationProfile>(std::move(profile).value());
    setup.calibration_path = path;
  }
  if (md.Has("oom.policy")) {
    const std::string policy = md.String("oom.policy", "raise");
    if (policy == "catch_and_sync") {
      setup.oom.policy = OomPolicy::kCatchAndSync;
    } else if (policy != "raise") {
      return Status::InvalidInput(fmt::format(
          "{}: /metadata/oom.policy: expected \"raise\" or \"catch_and_sync\", got \"{}\"", label, policy));
    }
  }
  if (md.Has("oom.sync_hooks")) {
    int64_t hooks = 0;
    SHARDSCOPE_RETURN_IF_ERROR(md.Int("oom.sync_hooks", hooks));
    setup.oom.sync_hooks = hooks != 0;
  }
  SHARDSCOPE_RETURN_IF_ERROR(md.Double("model.flops_per_rank_step", setup.model_flops_per_rank_step));
  SHARDSCOPE_RETURN_IF_ERROR(md.Int("model.tokens_per_rank_step", setup.tokens_per_rank_step));
  for (MfuConvention convention : kMfuConventions) {
    const std::string key = fmt::format("mfu.{}.", MfuConventionName(convention));
    if (!md.Has(key + "flops_per_token")) continue;
    SimulationSetup::ConventionFigures figures{std::string(MfuConventionName(convention)), 0, 0};
    SHARDSCOPE_RETURN_IF_ERROR(md.Double(key + "flops_per_token", figures.flops_per_token));
    SHARDSCOPE_RETURN_IF_ERROR(md.Double(key + "peak_flops", figures.peak_flops));
    setup.mfu_conventions.push_back(std::move(figures));
  }
  SHARDSCOPE_RETURN_IF_ERROR(lowering_internal::ReadDeviceMemoryMetadata(schedule, label, setup));
  return setup;
}

}  // namespace shardscope::sim

// GPU and cluster presets. Every figure is a named constant with its source; the presets are
// assembled from them so a row of the tables below reads like the datasheet it came from.
#include "shardscope/sim/presets/hardware.h"

#include <array>
#include <cmath>

#include <fmt/format.h>

namespace shardscope::sim {
namespace {

// ---- Units ------------------------------------------------------------------------------------

constexpr double kTera = 1e12;
constexpr double kGiga = 1e9;
constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;
constexpr double kBitsPerByte = 8;

// NVIDIA datasheets quote Hopper tensor-core rates "with sparsity" (2:4 structured sparsity
// doubles the rate); the dense rate is half. H100 datasheet footnote: "* With sparsity".
constexpr double kSparsitySpeedup = 2;

// NVLink datasheet figures are bidirectional totals ("900 GB/s"); one direction is half.
constexpr double kDirectionsPerLink = 2;

// PCIe x16 theoretical bandwidth per direction: rate (GT/s) x 16 lanes x 128b/130b encoding
// / 8 bits. PCI-SIG PCIe 3.0 / 4.0 / 5.0 base specifications (8 / 16 / 32 GT/s, 128b/130b).
constexpr double kPcieLanes = 16;
constexpr double kPcie128b130bEfficiency = 128.0 / 130.0;
constexpr double kPcieGen3GigaTransfers = 8;
constexpr double kPcieGen4GigaTransfers = 16;
constexpr double kPcieGen5GigaTransfers = 32;
constexpr double PcieX16Bandwidth(double giga_transfers) {
  return giga_transfers * kGiga * kPcieLanes * kPcie128b130bEfficiency / kBitsPerByte;
}

// ---- Usable capacity ---------------------------------------------------------------------------
// What CUDA reports as the device's total memory (cudaMemGetInfo / cuDeviceTotalMem, PyTorch's
// get_device_properties().total_memory), from posted outputs on each exact GPU model. It is less
// than the datasheet capacity by what the driver reserves, which varies a little with the
// driver release (the driver of each posting is named).
// Tesla V100-SXM2-32GB: "Total amount of global memory: 31.749 GiB" (CUDA.jl gpuinfo, NVIDIA
// driver 510.47.03): pc2/GPUInspector.jl docs/src/devices/v100_sxm2.md.
constexpr double kV100Sxm2_32GbUsableGiB = 31.749;
// NVIDIA A100-SXM4-40GB: deviceQuery "40339 MBytes (42298834944 bytes)" (driver 535, CUDA 12.2
// driver / 11.4 runtime): bottlerocket-os/bottlerocket PR #3873.
constexpr int64_t kA100Sxm4_40GbUsableBytes = 42'298'834'944;
// NVIDIA A100-SXM4-80GB: deviceQuery "81158 MBytes (85100068864 bytes)" (CUDA 12.5 driver / 12.4
// runtime): thamada/nvidia-smi nvsim/A100SXMx4_deviceQuery.py.
constexpr int64_t kA100Sxm4_80GbUsableBytes = 85'100'068'864;
// NVIDIA H100 80GB HBM3 (SXM5): deviceQuery "81106 MBytes (85045477376 bytes)" (CUDA 12.7 driver /
// 12.4 runtime): thamada/nvidia-smi nvsim/H100SXMx8_deviceQuery.py. (Posted PyTorch headers on
// other hosts print total_memory=81082MB to 81090MB: the driver's share varies by release.)
constexpr int64_t kH100Sxm5_80GbUsableBytes = 85'045'477'376;
// NVIDIA H200 (141 GB HBM3e): `_CudaDeviceProperties(name='NVIDIA H200', ... total_memory=143156MB)`
// (PyTorch prints MiB, truncated), posted in a vLLM example's notes (src/llm/vllm/vlm/skywork_r1v.py).
// One posting: ESTIMATE within the driver's spread.
constexpr int64_t kH200Sxm_141GbUsableMiB = 143'156;

// ---- GPU presets ------------------------------------------------------------------------------
// HBM capacities are binary: the "80GB" of an H100 is 80 GiB of DRAM (nvidia-smi reports
// 81920 MiB on A100-80GB); we read the datasheet's "GB" of capacity as GiB.

// NVIDIA Tesla V100 datasheet (SXM2): 125 TFLOP/s tensor (fp16), 15.7 TFLOP/s fp32,
// 32 GB HBM2 at 900 GB/s, NVLink 300 GB/s (bidirectional); no bf16/tf32/fp8 tensor cores.
// 80 SMs: NVIDIA Tesla V100 GPU architecture whitepaper ("Tesla V100 ... 80 SMs").
// PCIe Gen3 x16.
GpuSpec V100Sxm2_32Gb() {
  GpuSpec g;
  g.name = "v100-sxm2-32gb";
  g.arch = GpuArch::kVolta;
  g.sm_count = 80;
  g.peak_flops_fp16 = 125 * kTera;
  g.peak_flops_fp32 = 15.7 * kTera;
  g.hbm_bytes = 32 * kGiB;
  g.usable_bytes = std::llround(kV100Sxm2_32GbUsableGiB * static_cast<double>(kGiB));
  g.hbm_bandwidth = 900 * kGiga;
  g.nvlink_bandwidth = 300 * kGiga / kDirectionsPerLink;
  g.pcie_bandwidth = PcieX16Bandwidth(kPcieGen3GigaTransfers);
  // Measured (single kernels):
  // - fp16 GEMM 97.36 TFLOP/s at 8192^3 and fp32 GEMM 14.51 TFLOP/s (torch.mm, wall clock):
  //   zzc0721/torch-performance-test-data issue #140, "Tesla V100-SXM2-16GB". That board has the
  //   32 GB board's GV100 die, 80 SMs, clocks and 300 W limit; only the HBM capacity differs, which a
  //   compute-bound GEMM does not touch. ESTIMATE for the 32 GB board on that ground.
  // - copy 740.02 GiB/s = 794.6 GB/s read + write (CUDA memcpy, 1.4 GiB) on a Tesla
  //   V100-SXM2-32GB: pc2/GPUInspector.jl docs/src/devices/v100_sxm2.md.
  // - kernel floor: no V100 measurement found; 2 us ESTIMATE (the A100's measured 1.8 us, rounded
  //   up for the older driver path).
  g.measured.matmul_flops_16bit = 97.36 * kTera;
  g.measured.matmul_m = g.measured.matmul_n = g.measured.matmul_k = 8192;
  g.measured.matmul_flops_fp32 = 14.51 * kTera;
  g.measured.copy_bandwidth = 740.02 * kGiB;
  g.measured.kernel_floor_ns = 2000;
  return g;
}

// NVIDIA A100 Tensor Core GPU datasheet (SXM, dense): bf16/fp16 312, tf32 156, fp32 19.5
// TFLOP/s; NVLink 600 GB/s (bidirectional); PCIe Gen4. 108 SMs: NVIDIA A100 Tensor Core GPU
// architecture whitepaper. The two memory options differ only in capacity and bandwidth.
GpuSpec A100Sxm4Base() {
  GpuSpec g;
  g.arch = GpuArch::kAmpere;
  g.sm_count = 108;
  g.peak_flops_bf16 = 312 * kTera;
  g.peak_flops_fp16 = 312 * kTera;
  g.peak_flops_tf32 = 156 * kTera;
  g.peak_flops_fp32 = 19.5 * kTera;
  g.nvlink_bandwidth = 600 * kGiga / kDirectionsPerLink;
  g.pcie_bandwidth = PcieX16Bandwidth(kPcieGen4GigaTransfers);
  // Measured on an A100-SXM4-80GB (the 40 GB board has the same GA108 die, 108 SMs, 1410 MHz boost
  // and 400 W limit, so its GEMM rate and kernel floor are taken as the same: ESTIMATE there):
  // - fp16 GEMM 253.7 TFLOP/s at 8192^3, cuBLASLt, random inputs, 10,000 warm-up and 1,000 timed
  //   iterations (sustained clocks): Azure/AI-benchmarking-guide Azure_Results/ND_A100_v4_results.md
  //   (superbench cublaslt_gemm). The A100's bf16 and fp16 tensor rates are equal (datasheet).
  //   Corroborated by Horace He (thonking.ai, "Strangely, Matrix Multiplications ... Run Faster
  //   When Given Predictable Data": cuBLAS 8192^3 with randn inputs 257-258 TFLOP/s) and by the
  //   best-shape MAMF 271.2 (stas00/ml-engineering compute/accelerator/README.md, mean of only 100
  //   iterations). Zero-valued inputs reach ~295: the data moves the power draw, so the sustained
  //   random-input figure is the one training sees.
  // - fp32 GEMM 19.18 TFLOP/s (torch.mm): zzc0721/torch-performance-test-data database.md.
  // - back-to-back empty kernels 1.806 us per kernel (eager):
  //   openfabric-systems/simllm examples/a100_hardware_envelope_v1/RESULTS.md.
  g.measured.matmul_flops_16bit = 253.7 * kTera;
  g.measured.matmul_m = g.measured.matmul_n = g.measured.matmul_k = 8192;
  g.measured.matmul_flops_fp32 = 19.18 * kTera;
  g.measured.kernel_floor_ns = 1806;
  return g;
}

// A100 datasheet: 40GB HBM2 at 1,555 GB/s.
GpuSpec A100Sxm4_40Gb() {
  GpuSpec g = A100Sxm4Base();
  g.name = "a100-sxm4-40gb";
  g.hbm_bytes = 40 * kGiB;
  g.usable_bytes = kA100Sxm4_40GbUsableBytes;
  g.hbm_bandwidth = 1555 * kGiga;
  // Copy 1220.7 GiB/s = 1310.7 GB/s read + write (CUDA memcpy) on an A100-SXM4-40GB (DGX A100):
  // pc2/GPUInspector.jl docs/src/devices/a100_sxm2.md.
  g.measured.copy_bandwidth = 1220.7 * kGiB;
  return g;
}

// A100 datasheet: 80GB HBM2e at 2,039 GB/s.
GpuSpec A100Sxm4_80Gb() {
  GpuSpec g = A100Sxm4Base();
  g.name = "a100-sxm4-80gb";
  g.hbm_bytes = 80 * kGiB;
  g.usable_bytes = kA100Sxm4_80GbUsableBytes;
  g.hbm_bandwidth = 2039 * kGiga;
  // Copy 1672.4 GB/s read + write at 4 GiB, clocks logged: openfabric-systems/simllm
  // examples/a100_hardware_envelope_v1/RESULTS.md (BabelStream Copy on Azure ND A100 v4: 1.61 TB/s).
  g.measured.copy_bandwidth = 1672.4 * kGiga;
  return g;
}

// NVIDIA H100 Tensor Core GPU datasheet (SXM), rates "with sparsity" halved: bf16/fp16 1,979,
// tf32 989, fp8 3,958; fp32 67 TFLOP/s (dense as printed); NVLink 900 GB/s; PCIe Gen5
// ("128GB/s" bidirectional). 132 SMs: NVIDIA H100 Tensor Core GPU architecture whitepaper
// (H100 SXM5). H100 and H200 share the compute figures and differ in memory.
GpuSpec HopperSxmBase() {
  GpuSpec g;
  g.arch = GpuArch::kHopper;
  g.sm_count = 132;
  g.peak_flops_bf16 = 1979 * kTera / kSparsitySpeedup;
  g.peak_flops_fp16 = 1979 * kTera / kSparsitySpeedup;
  g.peak_flops_tf32 = 989 * kTera / kSparsitySpeedup;
  g.peak_flops_fp32 = 67 * kTera;
  g.peak_flops_fp8 = 3958 * kTera / kSparsitySpeedup;
  g.nvlink_bandwidth = 900 * kGiga / kDirectionsPerLink;
  g.pcie_bandwidth = PcieX16Bandwidth(kPcieGen5GigaTransfers);
  // No Hopper kernel-floor measurement found: 2 us ESTIMATE (as V100).
  g.measured.kernel_floor_ns = 2000;
  return g;
}

// H100 datasheet (SXM): 80GB HBM3 at 3.35 TB/s.
GpuSpec H100Sxm5_80Gb() {
  GpuSpec g = HopperSxmBase();
  g.name = "h100-sxm5-80gb";
  g.hbm_bytes = 80 * kGiB;
  g.usable_bytes = kH100Sxm5_80GbUsableBytes;
  g.hbm_bandwidth = 3350 * kGiga;
  // Measured on H100 SXM5 80GB:
  // - bf16 GEMM 794.5 TFLOP/s at 2048 x 2048 x 13312 (MAMF, torch 2.7.0+cu126, mean of 100 timed
  //   iterations): stas00/ml-engineering compute/accelerator/README.md. torch.mm at 8192^2 on
  //   "NVIDIA H100 80GB HBM3": 797.5 (zzc0721/torch-performance-test-data issue #79). Both are
  //   short runs on a cold GPU (about 21 ms of matmul): a burst rate. No sustained (power-limited)
  //   H100 measurement was found; on the H200, the same die at the same 700 W, sustained runs
  //   hold 0.86-0.89 of the burst rate (see H200Sxm_141Gb), so this figure likely overstates a
  //   training step's GEMMs (docs/FIDELITY.md, known gaps).
  // - fp32 GEMM 51.88 TFLOP/s: the same issue #79.
  // - BabelStream Copy 2.90 TB/s (read + write): Azure/AI-benchmarking-guide, ND H100 v5 results.
  g.measured.matmul_flops_16bit = 794.5 * kTera;
  g.measured.matmul_m = 2048;
  g.measured.matmul_n = 2048;
  g.measured.matmul_k = 13312;
  g.measured.matmul_flops_fp32 = 51.88 * kTera;
  g.measured.copy_bandwidth = 2.90 * kTera;
  return g;
}

// NVIDIA H200 Tensor Core GPU datasheet (SXM): 141GB HBM3e at 4.8 TB/s; compute as H100 SXM.
GpuSpec H200Sxm_141Gb() {
  GpuSpec g = HopperSxmBase();
  g.name = "h200-sxm-141gb";
  g.hbm_bytes = 141 * kGiB;
  g.usable_bytes = kH200Sxm_141GbUsableMiB * kMiB;
  g.hbm_bandwidth = 4800 * kGiga;
  // Measured on H200:
  // - bf16 GEMM 722 TFLOP/s at 3072 x 2816 x 8192, sustained: mamf-finder's MSMF (the rate a
  //   shape holds over a 4 s window once the clock has settled at the power limit: "681W
  //   1612MHz"; the same shape bursts at 842 on a cold GPU), stas00/ml-engineering
  //   compute/accelerator/benchmarks/README.md, "Reading the output". A training step runs at
  //   the power limit, so the sustained figure is the one that applies; the README's automatic
  //   search sustains 743-755 at its best shapes. (Short torch.mm runs give 790.29:
  //   zzc0721/torch-performance-test-data database.md.)
  // - fp32 GEMM 51.34 TFLOP/s (torch.mm, short runs): the same zzc0721 database, "NVIDIA H200".
  // - BabelStream Copy 4.01 TB/s (read + write), H200 141GB SXM: Azure/AI-benchmarking-guide
  //   Azure_Results/ND_H200_v5_results.md.
  g.measured.matmul_flops_16bit = 722 * kTera;
  g.measured.matmul_m = 3072;
  g.measured.matmul_n = 2816;
  g.measured.matmul_k = 8192;
  g.measured.matmul_flops_fp32 = 51.34 * kTera;
  g.measured.copy_bandwidth = 4.01 * kTera;
  return g;
}

using GpuFactory = GpuSpec (*)();
constexpr std::array<GpuFactory, 5> kGpuPresets = {
    V100Sxm2_32Gb, A100Sxm4_40Gb, A100Sxm4_80Gb, H100Sxm5_80Gb, H200Sxm_141Gb,
};

// ---- Cluster presets --------------------------------------------------------------------------

// Network line rates in Gb/s (1e9 bits/s).
constexpr double kInfinibandHdrGbits = 200;   // HDR InfiniBand port (NVIDIA ConnectX-6)
constexpr double kInfinibandNdrGbits = 400;   // NDR InfiniBand port (NVIDIA ConnectX-7)

// Per-direction bandwidth a ring sees inside a DGX-1 / p3dn V100 node: all six NVLinks.
// NVIDIA DGX-1 with Tesla V100 system architecture whitepaper: the hybrid cube-mesh "can also
// be thought of as three interwoven rings of single NVLink connections"; each undirected
// ring carries two directed rings (one per direction), so six rings together use every link
// of every GPU in both directions: 6 x 25 GB/s = 150 GB/s = the V100's per-direction NVLink
// total. (NCCL's search finds these rings; its own per-link figure is in nccl_model.cc.)
// A single pair of GPUs is joined by only one or two links: see nccl_model.cc (p2p).

ClusterSpec MakeCluster(std::string name, GpuSpec gpu, IntraNodeFabric fabric,
                        double inter_node_bandwidth_per_gpu, int32_t nics, CpuVendor cpu,
                        bool gpu_direct_rdma, int32_t nodes) {
  ClusterSpec c;
  c.name = std::move(name);
  c.gpus_per_node = 8;
  c.nodes = nodes;
  c.fabric = fabric;
  // Intra-node: per GPU per direction = the GPU's NVLink bandwidth (NVSwitch gives every
  // GPU its full NVLink bandwidth to the switch; the V100 mesh: see above).
  c.intra_node_bandwidth = gpu.nvlink_bandwidth;
  c.inter_node_bandwidth = inter_node_bandwidth_per_gpu;
  c.nics_per_node = nics;
  c.cpu_vendor = cpu;
  c.gpu_direct_rdma = gpu_direct_rdma;
  c.gpu = std::move(gpu);
  return c;
}

// NVIDIA DGX A100 datasheet / user guide: 8x A100 80GB (the 640GB system), 6 NVSwitches,
// 8x single-port ConnectX-6 200 Gb/s HDR InfiniBand for the compute fabric (one per GPU:
// 25 GB/s per GPU), 2x AMD EPYC 7742. NICs sit on the GPUs' PCIe switches (GPUDirect RDMA).
ClusterSpec DgxA100(int32_t nodes) {
  return MakeCluster("dgx-a100", A100Sxm4_80Gb(), IntraNodeFabric::kNvSwitch,
                     kInfinibandHdrGbits * kGiga / kBitsPerByte, /*nics=*/8, CpuVendor::kAmd,
                     /*gpu_direct_rdma=*/true, nodes);
}

// NVIDIA DGX H100 datasheet / user guide: 8x H100 SXM5, 4 NVSwitches, 8x ConnectX-7 400 Gb/s
// NDR for the compute fabric (one per GPU: 50 GB/s per GPU), 2x Intel Xeon Platinum 8480C.
ClusterSpec DgxH100(int32_t nodes) {
  return MakeCluster("dgx-h100", H100Sxm5_80Gb(), IntraNodeFabric::kNvSwitch,
                     kInfinibandNdrGbits * kGiga / kBitsPerByte, /*nics=*/8, CpuVendor::kIntel,
                     /*gpu_direct_rdma=*/true, nodes);
}

// AWS EC2 p3dn.24xlarge (instance-type page): 8x V100 32GB with NVLink (DGX-1-style hybrid
// cube mesh), 100 Gbps networking (one ENA/EFA interface), Intel Xeon Platinum 8175M
// (Skylake). 100 Gb/s = 12.5 GB/s per node, shared by 8 GPUs: 1.5625 GB/s each. EFA on p3dn
// has no GPUDirect RDMA (AWS lists GPUDirect RDMA for p4d and later), so NCCL's net path goes
// through the CPU.
constexpr double kP3dnNodeGbits = 100;
ClusterSpec AwsP3dn(int32_t nodes) {
  constexpr int32_t kGpus = 8;
  return MakeCluster("aws-p3dn", V100Sxm2_32Gb(), IntraNodeFabric::kNvLinkHybridCubeMesh,
                     kP3dnNodeGbits * kGiga / kBitsPerByte / kGpus, /*nics=*/1,
                     CpuVendor::kIntel, /*gpu_direct_rdma=*/false, nodes);
}

// AWS EC2 p4d.24xlarge (instance-type page): 8x A100 40GB, NVSwitch (600 GB/s), 400 Gbps
// EFA (4x 100 Gbps interfaces) with GPUDirect RDMA, Intel Xeon Platinum 8275CL (Cascade
// Lake). 400 Gb/s = 50 GB/s per node, 6.25 GB/s per GPU.
constexpr double kP4dNodeGbits = 400;
ClusterSpec AwsP4d(int32_t nodes) {
  constexpr int32_t kGpus = 8;
  return MakeCluster("aws-p4d", A100Sxm4_40Gb(), IntraNodeFabric::kNvSwitch,
                     kP4dNodeGbits * kGiga / kBitsPerByte / kGpus, /*nics=*/4,
                     CpuVendor::kIntel, /*gpu_direct_rdma=*/true, nodes);
}

struct ClusterPreset {
  std::string_view name;
  ClusterSpec (*make)(int32_t nodes);
};
constexpr std::array<ClusterPreset, 4> kClusterPresets = {{
    {"dgx-a100", DgxA100},
    {"dgx-h100", DgxH100},
    {"aws-p3dn", AwsP3dn},
    {"aws-p4d", AwsP4d},
}};

std::string JoinNames(const std::vector<std::string>& names) {
  return fmt::format("{}", fmt::join(names, ", "));
}

}  // namespace

std::string_view GpuArchName(GpuArch arch) {
  switch (arch) {
    case GpuArch::kVolta: return "volta";
    case GpuArch::kAmpere: return "ampere";
    case GpuArch::kHopper: return "hopper";
  }
  return "unknown";
}

std::string_view IntraNodeFabricName(IntraNodeFabric fabric) {
  switch (fabric) {
    case IntraNodeFabric::kNvSwitch: return "nvswitch";
    case IntraNodeFabric::kNvLinkHybridCubeMesh: return "nvlink-hybrid-cube-mesh";
    case IntraNodeFabric::kPcie: return "pcie";
  }
  return "unknown";
}

double PeakFlops(const GpuSpec& gpu, traces::DType dtype) {
  using traces::DType;
  switch (dtype) {
    case DType::kFloat32: return gpu.peak_flops_fp32;
    case DType::kTFloat32: return gpu.peak_flops_tf32;
    case DType::kBFloat16: return gpu.peak_flops_bf16;
    case DType::kFloat16: return gpu.peak_flops_fp16;
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2: return gpu.peak_flops_fp8;
    case DType::kInt8:
    case DType::kInt32:
    case DType::kInt64:
    case DType::kFloat64: return 0;  // no GEMM rate modelled
  }
  return 0;
}

StatusOr<GpuSpec> FindGpuPreset(std::string_view name) {
  for (GpuFactory make : kGpuPresets) {
    GpuSpec gpu = make();
    if (gpu.name == name) return gpu;
  }
  return Status::InvalidInput(fmt::format("unknown GPU preset '{}' (expected one of: {})", name,
                                          JoinNames(GpuPresetNames())));
}

std::vector<std::string> GpuPresetNames() {
  std::vector<std::string> names;
  for (GpuFactory make : kGpuPresets) names.push_back(make().name);
  return names;
}

StatusOr<ClusterSpec> FindClusterPreset(std::string_view name, int32_t nodes) {
  for (const ClusterPreset& preset : kClusterPresets) {
    if (preset.name != name) continue;
    if (nodes < 1) {
      return Status::InvalidInput(fmt::format(
          "cluster preset '{}': nodes must be >= 1, got {}", name, nodes));
    }
    return preset.make(nodes);
  }
  return Status::InvalidInput(fmt::format("unknown cluster preset '{}' (expected one of: {})",
                                          name, JoinNames(ClusterPresetNames())));
}

std::vector<std::string> ClusterPresetNames() {
  std::vector<std::string> names;
  for (const ClusterPreset& preset : kClusterPresets) names.emplace_back(preset.name);
  return names;
}

}  // namespace shardscope::sim

// GPU and cluster presets: the hardware figures every cost model reads.
//
// Figures come from vendor datasheets (see the table in hardware.cc, one source per row).
// Bandwidths are bytes per second, memory sizes bytes, throughputs FLOP/s (dense, no
// sparsity). A plan names a preset and may override any field (sim/plan.h).
#ifndef SHARDSCOPE_SIM_HARDWARE_H_
#define SHARDSCOPE_SIM_HARDWARE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "shardscope/traces/schedule.h"
#include "shardscope/base/status.h"
#include "shardscope/sim/presets/nccl_env.h"

namespace shardscope::sim {

enum class GpuArch : uint8_t { kVolta, kAmpere, kHopper };
std::string_view GpuArchName(GpuArch arch);

// What the GPU achieves, as opposed to its datasheet: single-kernel measurements taken on that
// GPU, each cited beside its preset in hardware.cc. The compute model (compute_model.h) reads
// them; a field left 0 falls back as its comment says.
struct GpuMeasuredFigures {
  // Sustained dense bf16/fp16 tensor-core GEMM throughput (FLOP/s, random inputs), and the
  // shape (m, n, k) it was measured on: the GEMM model normalizes its per-SM rate so that this
  // very shape takes the measured time.
  double matmul_flops_16bit = 0;
  int64_t matmul_m = 0, matmul_n = 0, matmul_k = 0;
  // CUDA-core fp32 GEMM throughput; 0 = the datasheet fp32 peak x the 16-bit GEMM's fraction of
  // its datasheet peak (an estimate).
  double matmul_flops_fp32 = 0;
  // Device-to-device copy bandwidth, bytes read + written per second: what elementwise and
  // reduction kernels stream at. 0 = the datasheet HBM bandwidth.
  double copy_bandwidth = 0;
  // Back-to-back period of an empty kernel on one stream (launch-to-retire on the device):
  // the fixed cost every kernel pays.
  int64_t kernel_floor_ns = 0;
};

struct GpuSpec {
  std::string name;                        // preset name, e.g. "h100-sxm5-80gb"
  GpuArch arch = GpuArch::kHopper;
  int32_t sm_count = 0;
  double peak_flops_bf16 = 0;              // 0 = not supported by the tensor cores
  double peak_flops_fp16 = 0;
  double peak_flops_tf32 = 0;
  double peak_flops_fp32 = 0;              // non-tensor-core fp32
  double peak_flops_fp8 = 0;
  int64_t hbm_bytes = 0;                   // datasheet capacity ("80GB" read as GiB)
  // The device memory CUDA reports (cudaMemGetInfo's total, torch.cuda.get_device_properties()
  // .total_memory): the datasheet capacity less what the driver keeps (ECC, page tables, the
  // reserved region nvidia-smi -q shows). What a process's CUDA context and allocator share.
  int64_t usable_bytes = 0;
  double hbm_bandwidth = 0;                // bytes/s
  double nvlink_bandwidth = 0;             // bytes/s per direction per GPU
  double pcie_bandwidth = 0;               // bytes/s per direction (H2D / D2H copies)
  GpuMeasuredFigures measured;
};

// Peak dense FLOP/s for GEMMs in `dtype` (fp32 GEMMs use the fp32 rate; tf32 the tf32 rate;
// both fp8 formats the fp8 rate). 0 when the GPU has no tensor-core support for the dtype
// (e.g. bf16 or fp8 on V100) and for dtypes no GEMM rate is modelled for (integers, fp64).
double PeakFlops(const GpuSpec& gpu, traces::DType dtype);

// How GPUs inside one node talk to each other.
enum class IntraNodeFabric : uint8_t { kNvSwitch, kNvLinkHybridCubeMesh, kPcie };
std::string_view IntraNodeFabricName(IntraNodeFabric fabric);  // "nvswitch", ...

// The host CPU vendor: NCCL's tuning picks some multi-node figures by it (tuning.cc llMaxBws
// rows, getNetOverhead).
enum class CpuVendor : uint8_t { kIntel, kAmd };

// A rail-optimized leaf/spine fabric (plan key cluster.network): NIC k of every node goes to
// rail k's leaf switch of its group of `nodes_per_leaf` nodes, and leaves meet at spines.
// Traffic between nodes of one group crosses one switch, between groups three (leaf, spine,
// leaf). nodes_per_leaf 0: no tiers (NCCL's own network latency only). See nccl_model.h.
struct NetworkTiers {
  int32_t nodes_per_leaf = 0;
  int64_t switch_latency_ns = 0;  // one switch's port-to-port latency
};

struct ClusterSpec {
  std::string name;                        // preset name, e.g. "dgx-h100"
  GpuSpec gpu;
  int32_t gpus_per_node = 8;
  int32_t nodes = 1;
  IntraNodeFabric fabric = IntraNodeFabric::kNvSwitch;
  double intra_node_bandwidth = 0;         // bytes/s per GPU per direction (NVLink)
  double inter_node_bandwidth = 0;         // bytes/s per GPU per direction (network share)
  int32_t nics_per_node = 0;
  CpuVendor cpu_vendor = CpuVendor::kIntel;
  // The NICs are reachable from the GPUs through a PCIe switch (GPUDirect RDMA). NCCL
  // enables LL128 across nodes only then (tuning.cc: typeInter <= PATH_PXB).
  bool gpu_direct_rdma = true;
  NcclEnv nccl;                            // the job's NCCL release and knobs (cluster.nccl)
  NetworkTiers network;                    // cluster.network
  // Collectives of different communicators that run at once share the GPUs' NVLink ports and
  // NICs (sim/simulate/cluster_links.h); false gives every communicator links of its own, as if
  // it ran alone (plan `cluster.link_sharing`).
  bool link_sharing = true;

  int32_t world_size() const { return gpus_per_node * nodes; }
  int32_t NodeOf(int32_t rank) const { return rank / gpus_per_node; }
};

// InvalidInput naming the valid presets when `name` is none of them.
StatusOr<GpuSpec> FindGpuPreset(std::string_view name);
std::vector<std::string> GpuPresetNames();

// A cluster preset with `nodes` nodes. InvalidInput on an unknown name (listing the valid
// ones) or on nodes < 1.
StatusOr<ClusterSpec> FindClusterPreset(std::string_view name, int32_t nodes);
std::vector<std::string> ClusterPresetNames();

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_HARDWARE_H_

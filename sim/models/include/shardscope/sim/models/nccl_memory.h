// Device memory NCCL allocates for a communicator: the per-channel connection buffers of the
// algorithms it connects (ring, tree, NVLS) and of point-to-point peers. The memory is
// cudaMalloc'd (or cuMem-mapped) by NCCL, outside PyTorch's caching allocator, and stays until
// the communicator is destroyed. Constants are NCCL's defaults, named in nccl_memory.cc with the
// NCCL source each comes from.
//
//   NcclMemoryOptions options;
//   options.channels = NcclModelConfig::Default().channels[arch];
//   const NcclCommMemory m = NcclCommunicatorMemory(TopologyOf(cluster, ranks), options);
//   m.total();  // bytes on each member GPU
//
// A schedule's communicators per rank: NcclMemoryPerRank.
#ifndef SHARDSCOPE_SIM_MODELS_NCCL_MEMORY_H_
#define SHARDSCOPE_SIM_MODELS_NCCL_MEMORY_H_

#include <cstdint>
#include <vector>

#include "shardscope/sim/models/nccl_model.h"
#include "shardscope/sim/presets/hardware.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::sim {

// NCCL's default per-connection buffer of each protocol (src/init.cc computeBuffSizes:
// DEFAULT_LL_BUFFSIZE, DEFAULT_LL128_BUFFSIZE, DEFAULT_BUFFSIZE; env NCCL_LL_BUFFSIZE,
// NCCL_LL128_BUFFSIZE, NCCL_BUFFSIZE), from the constants of src/include/device.h.
inline constexpr int64_t kNcclSteps = 8;                // NCCL_STEPS
inline constexpr int64_t kNcclLlLinesPerThread = 8;     // NCCL_LL_LINES_PER_THREAD
inline constexpr int64_t kNcclLlMaxThreads = 512;       // NCCL_LL_MAX_NTHREADS
inline constexpr int64_t kNcclLlFifoLineBytes = 16;     // sizeof(union ncclLLFifoLine)
inline constexpr int64_t kNcclLl128ElemsPerThread = 120;  // NCCL_LL128_ELEMS_PER_THREAD
inline constexpr int64_t kNcclLl128MaxThreads = 640;    // NCCL_LL128_MAX_NTHREADS
inline constexpr int64_t kNcclLl128ElemBytes = 8;       // sizeof(uint64_t)
// 8 x 512 x 8 x 16 = 524,288 B.
inline constexpr int64_t kNcclDefaultLlBuffSize =
    kNcclLlLinesPerThread * kNcclLlMaxThreads * kNcclSteps * kNcclLlFifoLineBytes;
// 120 x 640 x 8 x 8 = 4,915,200 B.
inline constexpr int64_t kNcclDefaultLl128BuffSize =
    kNcclLl128ElemsPerThread * kNcclLl128MaxThreads * kNcclSteps * kNcclLl128ElemBytes;
// DEFAULT_BUFFSIZE ("4MiB") is kNcclDefaultBuffsize of presets/nccl_env.h, where cluster.nccl reads
// NCCL_BUFFSIZE.

struct NcclMemoryOptions {
  // Ring / tree channels of the communicator. NcclMemoryPerRank with a model (below) sets it per
  // communicator from NcclChannelsFor; 0 there means exactly that.
  int32_t channels = 0;
  int64_t buffsize = kNcclDefaultBuffsize;         // NCCL_BUFFSIZE (the Simple protocol)
  int64_t ll_buffsize = kNcclDefaultLlBuffSize;
  int64_t ll128_buffsize = kNcclDefaultLl128BuffSize;
  // NCCL before 2.22 connects the ring and tree of every channel when the communicator is
  // created; from 2.22 (NCCL_RUNTIME_CONNECT=1) only the algorithms a collective runs.
  bool connect_at_init = false;
  bool ring = false;                               // with runtime connect: ring ran
  bool tree = false;                               // with runtime connect: tree ran
  int32_t p2p_peers = 0;                           // send / recv / all_to_all peers
  // NVLS (Hopper NVSwitch multicast): off unless the caller knows NCCL runs it.
  bool nvls = false;
  int32_t nvls_channels = 16;                      // NCCL_NVLS_NCHANNELS (NCCL's default 16)
};

// Bytes NCCL holds on one member GPU for the communicator, by what they serve.
struct NcclCommMemory {
  int64_t ring = 0;
  int64_t tree = 0;
  int64_t p2p = 0;
  int64_t nvls = 0;
  int64_t total() const { return ring + tree + p2p + nvls; }
};

// One member's NCCL memory for a communicator of `topology`. Members of a multi-node ring
// differ by where the ring crosses nodes; this is their average (an ESTIMATE, nccl_memory.cc).
// A 1-rank communicator holds none.
NcclCommMemory NcclCommunicatorMemory(const CommTopology& topology, const NcclMemoryOptions& options);

// What each rank's NCCL communicators hold: every communicator the rank is bound to and issues
// at least one collective on (PyTorch creates a process group's NCCL communicator at its first
// collective: ProcessGroupNCCL::getNCCLComm), with the algorithms its collectives need. `base`
// gives channels, buffer sizes and connect_at_init; ring / tree / p2p_peers are filled per
// communicator from the program's collectives. With `model` (the job's NCCL release and knobs),
// each communicator's channels are NCCL's (NcclChannelsFor) when base.channels is 0, and the
// algorithms connected at runtime are the ones NCCL's tuning picks for the collectives issued
// (NcclModel::Estimate per type and size): ring, tree, NVLS (NVLS-Tree connects NVLS and the
// tree); without it, ring for every collective and a tree for all-reduce across nodes (ESTIMATE).
struct RankNcclMemory {
  int64_t bytes = 0;
  int32_t communicators = 0;
  std::vector<int64_t> slot_bytes;  // per communicator slot of the rank's program (0: unused)
};
std::vector<RankNcclMemory> NcclMemoryPerRank(const traces::Schedule& schedule, const ClusterSpec& cluster,
                                              const NcclMemoryOptions& base, const NcclModel* model = nullptr);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_MODELS_NCCL_MEMORY_H_

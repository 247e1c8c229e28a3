// NCCL's device memory per communicator (nccl_memory.h). The buffer sizes are NCCL's defaults
// (nccl_memory.h); the layout of a connection's memory and which connections a channel makes
// come from NCCL's transports, cited per constant below (NVIDIA/nccl src/transport/p2p.cc,
// net.cc, nvls.cc, src/init.cc).
#include "shardscope/sim/models/nccl_memory.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <variant>

namespace shardscope::sim {
namespace {

// ---- Layout of one connection --------------------------------------------------------------------
// A connection's control block: struct ncclSendMem / ncclRecvMem (src/include/comm.h) are
// unions padded to MEM_ALIGN (4096 B) in front of the buffers.
constexpr int64_t kConnHeaderBytes = 4096;
// p2pSendSetup / p2pRecvSetup round every intra-node allocation up to CUDA_IPC_MIN (2 MiB: the
// granularity of a CUDA IPC handle): ALIGN_SIZE(sendSize, CUDA_IPC_MIN).
constexpr int64_t kCudaIpcMinBytes = int64_t{2} << 20;
// Intra-node (P2P transport), src/transport/p2p.cc: the receiving end holds the LL and LL128
// buffers and the Simple buffer, except with P2P read, where the Simple buffer sits after the
// sender's ncclSendMem ("For P2P Read the SIMPLE buffer is tagged on the end of the ncclSendMem
// structure"). p2pUseRead / ncclTopoCheckP2p enable read between Ampere-or-newer GPUs joined by
// NVLink.
bool UsesP2pRead(const CommTopology& t) {
  return t.arch != GpuArch::kVolta && t.fabric != IntraNodeFabric::kPcie;
}

int64_t AlignUp(int64_t bytes, int64_t alignment) { return (bytes + alignment - 1) / alignment * alignment; }

// One send end and one receive end between GPUs of a node.
int64_t P2pConnectionPair(const CommTopology& t, const NcclMemoryOptions& o) {
  const bool read = UsesP2pRead(t);
  const int64_t send = AlignUp(kConnHeaderBytes + (read ? o.buffsize : 0), kCudaIpcMinBytes);
  const int64_t recv =
      AlignUp(kConnHeaderBytes + o.ll_buffsize + o.ll128_buffsize + (read ? 0 : o.buffsize), kCudaIpcMinBytes);
  return send + recv;
}

// Across nodes (NET transport), src/transport/net.cc: with GPUDirect RDMA the receiving end
// keeps all three protocols' buffers in device memory (recvProxyConnect:
// NCCL_NET_MAP_ADD_POINTER(map, 0, resources->useGdr, buffSizes[p], ...)) and the sending end
// LL128 and Simple (sendProxyConnect: `p != NCCL_PROTO_LL && resources->useGdr`); without it
// every buffer is in host memory. The exact sizes, no 2 MiB rounding: ESTIMATE of the
// allocation granularity.
int64_t NetConnectionPair(const CommTopology& t, const NcclMemoryOptions& o) {
  if (!t.gpu_direct_rdma) return 0;
  const int64_t recv = o.ll_buffsize + o.ll128_buffsize + o.buffsize;
  const int64_t send = o.ll128_buffsize + o.buffsize;
  return send + recv;
}

// One channel of a ring: every member sends to its next and receives from its previous. In a
// multi-node ring each node has one rank receiving from the network and one sending to it per
// channel; the average member holds (rpn - 1)/rpn of a P2P pair and 1/rpn of a NET pair
// (ESTIMATE: the ranks at a node's boundary hold more, the others less).
int64_t RingChannel(const CommTopology& t, const NcclMemoryOptions& o) {
  const int64_t p2p = P2pConnectionPair(t, o);
  if (t.nnodes <= 1) return p2p;
  const int64_t rpn = std::max<int64_t>(1, t.ranks_per_node);
  return (p2p * (rpn - 1) + NetConnectionPair(t, o)) / rpn;
}

// One channel of a tree: the intra-node chain runs in ring order (up = previous, down = next;
// src/graph/connect.cc ncclTopoPreset treeIntra), so the ring's receive-from-previous and
// send-to-next connections are reused (ncclTransportP2pConnect skips connected peers) and the
// tree adds the reverse pair; node heads add network links to their tree parent and children.
// Taken as one more ring channel's worth (ESTIMATE for the heads).
int64_t TreeChannel(const CommTopology& t, const NcclMemoryOptions& o) { return RingChannel(t, o); }

// ---- Point-to-point (send / recv, all_to_all) ------------------------------------------------------
// p2p operations use their own connections (connIndex 1) per peer, on
// NCCL_NCHANNELS_PER_NET_PEER (default 2) channels, with Simple buffers of NCCL_STEPS chunks of
// NCCL_P2P_NVL_CHUNKSIZE (512 KiB, intra-node) or NCCL_P2P_NET_CHUNKSIZE (128 KiB) (src/init.cc
// NCCL_PARAM P2pNvlChunkSize / P2pNetChunkSize). ESTIMATE: the per-peer layout as a P2P pair
// with that Simple buffer and an LL buffer, rounded to CUDA_IPC_MIN.
constexpr int64_t kP2pChannelsPerPeer = 2;
constexpr int64_t kP2pNvlChunkBytes = int64_t{512} << 10;
constexpr int64_t kP2pNetChunkBytes = int64_t{128} << 10;

int64_t P2pPeer(const CommTopology& t, const NcclMemoryOptions& o) {
  const int64_t chunk = t.nnodes > 1 ? kP2pNetChunkBytes : kP2pNvlChunkBytes;
  const int64_t simple = chunk * kNcclSteps;
  const int64_t pair = AlignUp(kConnHeaderBytes, kCudaIpcMinBytes) +
                       AlignUp(kConnHeaderBytes + o.ll_buffsize + simple, kCudaIpcMinBytes);
  return kP2pChannelsPerPeer * pair;
}

// ---- NVLS ----------------------------------------------------------------------------------------
// src/transport/nvls.cc ncclNvlsBufferSetup: buffSize = nvlsChunkSize x NCCL_STEPS,
// nvlsPerRankSize = nChannels x 2 x buffSize, nvlsTotalSize = nvlsPerRankSize x nHeads, with
// NCCL_NVLS_NCHANNELS 16 and NCCL_NVLS_CHUNKSIZE 128 KiB. nHeads taken as the node's ranks
// (ESTIMATE: the heads of a single-node NVLS graph).
constexpr int64_t kNvlsChunkBytes = int64_t{128} << 10;
constexpr int64_t kNvlsSendRecvCopies = 2;  // the reduce (UC -> MC) and broadcast (MC -> UC) halves

int64_t Nvls(const CommTopology& t, const NcclMemoryOptions& o) {
  return int64_t{std::max<int32_t>(0, o.nvls_channels)} * kNvlsSendRecvCopies * kNvlsChunkBytes * kNcclSteps * std::max<int64_t>(1, t.ranks_per_node);
}

}  // namespace

NcclCommMemory NcclCommunicatorMemory(const CommTopology& topology, const NcclMemoryOptions& options) {
  NcclCommMemory m;
  if (topology.nranks <= 1) return m;
  const int64_t channels = std::max<int32_t>(0, options.channels);
  const bool ring = options.connect_at_init || options.ring;
  const bool tree = options.connect_at_init || options.tree;
  if (ring) m.ring = channels * RingChannel(topology, options);
  if (tree) m.tree = channels * TreeChannel(topology, options);
  m.p2p = std::max<int32_t>(0, options.p2p_peers) * P2pPeer(topology, options);
  if (options.nvls) m.nvls = Nvls(topology, options);
  return m;
}

namespace {

// What one program does on one communicator slot.
struct SlotUse {
  bool used = false;
  bool ring = false;        // a collective NCCL runs on rings (every type but send / recv / all_to_all)
  bool all_reduce = false;  // may run on a tree
  bool all_to_all = false;
  std::set<int32_t> peers;  // send / recv peers (global ranks)
  std::set<std::pair<traces::CollectiveType, int64_t>> tuned;  // (type, bytes) NCCL's tuning picks for
};

std::vector<SlotUse> SlotUses(const traces::Program& program) {
  std::vector<SlotUse> uses(program.comm_slots.size());
  for (const traces::Op& op : program.ops) {
    const auto* coll = std::get_if<traces::CollectiveOp>(&op.payload);
    if (coll == nullptr || coll->comm < 0 || static_cast<size_t>(coll->comm) >= uses.size()) continue;
    SlotUse& use = uses[static_cast<size_t>(coll->comm)];
    use.used = true;
    switch (coll->type) {
      case traces::CollectiveType::kSend:
      case traces::CollectiveType::kRecv: use.peers.insert(coll->peer); break;
      case traces::CollectiveType::kAllToAll: use.all_to_all = true; break;
      case traces::CollectiveType::kAllReduce: use.all_reduce = true; use.ring = true; break;
      default: use.ring = true; break;
    }
    if (coll->type != traces::CollectiveType::kSend && coll->type != traces::CollectiveType::kRecv &&
        coll->type != traces::CollectiveType::kAllToAll) {
      use.tuned.emplace(coll->type, coll->bytes);
    }
  }
  return uses;
}

// With the job's NCCL model: the channels NCCL gives the communicator, and the algorithms its
// tuning runs for the collectives issued on it (what NCCL_RUNTIME_CONNECT connects).
void ConnectAsNcclRuns(const NcclModel& model, const CommTopology& topology, const SlotUse& use,
                       NcclMemoryOptions& options) {
  const NcclChannels channels = NcclChannelsFor(model.config(), topology);
  if (options.channels == 0) options.channels = channels.ring_tree;
  if (channels.nvls > 0) options.nvls_channels = channels.nvls;
  options.ring = false;
  options.tree = false;
  // Before NCCL 2.22 NVLS's buffers are set up with the communicator where NVLS can run
  // (initTransportsRank: ncclNvlsSetup), as the ring and tree channels are.
  options.nvls = options.connect_at_init && channels.nvls > 0;
  for (const auto& [type, bytes] : use.tuned) {
    switch (model.Estimate(type, bytes, topology).algorithm) {
      case NcclAlgorithm::kTree: options.tree = true; break;
      case NcclAlgorithm::kNvls: options.nvls = true; break;
      case NcclAlgorithm::kNvlsTree: options.nvls = options.tree = true; break;
      default: options.ring = true; break;  // Ring, PAT (ring-like peers), CollNet (not modelled)
    }
  }
}

}  // namespace

std::vector<RankNcclMemory> NcclMemoryPerRank(const traces::Schedule& schedule, const ClusterSpec& cluster,
                                              const NcclMemoryOptions& base, const NcclModel* model) {
  std::vector<std::vector<SlotUse>> uses;
  uses.reserve(schedule.programs.size());
  for (const traces::Program& program : schedule.programs) uses.push_back(SlotUses(program));
  std::map<int32_t, CommTopology> topologies;  // by communicator index, built on first use
  std::vector<RankNcclMemory> out(static_cast<size_t>(schedule.world_size()));
  for (int32_t rank = 0; rank < schedule.world_size(); ++rank) {
    const traces::RankBinding& binding = schedule.ranks[static_cast<size_t>(rank)];
    const std::vector<SlotUse>& program_uses = uses[static_cast<size_t>(binding.program)];
    RankNcclMemory& m = out[static_cast<size_t>(rank)];
    m.slot_bytes.assign(binding.comm_binding.size(), 0);
    for (size_t slot = 0; slot < binding.comm_binding.size() && slot < program_uses.size(); ++slot) {
      const SlotUse& use = program_uses[slot];
      if (!use.used) continue;
      const int32_t comm = binding.comm_binding[slot];
      auto it = topologies.find(comm);
      if (it == topologies.end()) {
        it = topologies.emplace(comm, TopologyOf(cluster, schedule.communicators[static_cast<size_t>(comm)].ranks)).first;
      }
      const CommTopology& topology = it->second;
      NcclMemoryOptions options = base;
      if (model != nullptr) {
        ConnectAsNcclRuns(*model, topology, use, options);
      } else {
        options.ring = use.ring;
        // Without the job's NCCL model: Tree for all-reduce across nodes, Ring within one
        // (ESTIMATE: a tree is connected only when the communicator spans nodes).
        options.tree = use.all_reduce && topology.nnodes > 1;
      }
      options.p2p_peers = use.all_to_all ? topology.nranks - 1 : static_cast<int32_t>(use.peers.size());
      if (topology.nranks <= 1) continue;  // a 1-rank communicator connects nothing
      const int64_t bytes = NcclCommunicatorMemory(topology, options).total();
      m.slot_bytes[slot] = bytes;
      m.bytes += bytes;
      ++m.communicators;
    }
  }
  return out;
}

}  // namespace shardscope::sim

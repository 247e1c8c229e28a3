// NCCL's own tuning model (src/graph/tuning.cc), reimplemented release by release: for a
// collective of a given size on a communicator of a given shape, the time of every enabled
// (algorithm, protocol) pair is latency + bytes / bandwidth, and NCCL picks the cheapest.
//
// Modelled: Ring and Tree x LL / LL128 / Simple; NVLS (NVLink SHARP, one Hopper NVSwitch
// node) and NVLS-Tree (NVLS inside nodes, a tree across them) from 2.17 / 2.18; PAT for
// all_gather and reduce_scatter at one GPU per node from 2.23. The tables of each release
// range (NcclTuningTables, nccl_tables.cc) come with the NCCL file and commit they were read
// from; nccl_model.cc documents the formulas and what replaces NCCL's topology search.
// The job's release and knobs come from the cluster (ClusterSpec::nccl, presets/nccl_env.h):
// NCCL_ALGO / NCCL_PROTO (with each release's scope rules), NCCL_NVLS_ENABLE,
// NCCL_PAT_ENABLE, NCCL_MIN/MAX_NCHANNELS, NCCL_NVLS_NCHANNELS.
//
// Not modelled: CollNet (IB SHARP; a plan asking for it is refused), Blackwell and MNNVL,
// aggregation of several operations (latCount = 1), the tuner plugins. all_to_all and
// send / recv are not tuned by NCCL; they are costed as concurrent point-to-point messages
// (see NcclModel::Estimate).
//
// A rail-optimized leaf/spine fabric (ClusterSpec::network) adds a physical term on top of
// NCCL's estimate: NCCL picks by its own model, which has one NET hop latency whatever the
// fabric, and the collective then pays the extra switch hops of the algorithm it runs.
#ifndef SHARDSCOPE_SIM_NCCL_MODEL_H_
#define SHARDSCOPE_SIM_NCCL_MODEL_H_

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "shardscope/sim/presets/hardware.h"
#include "shardscope/sim/presets/nccl_env.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::sim {

inline constexpr int kNumGpuArchs = 3;          // GpuArch values
inline constexpr int kNumCpuVendors = 2;        // CpuVendor values
inline constexpr int kNumIntraNodeFabrics = 3;  // IntraNodeFabric values
// NCCL's node-count classes for its per-channel tables: 1 node, 2 nodes, more (tuning.cc
// index2 = nNodes <= 2 ? nNodes-1 : 2).
inline constexpr int kNumNodeClasses = 3;
// treeCorrectionFactor covers log2(bytes / 64) in [0, 23) (22 before 2.8).
inline constexpr int kNumTreeCorrectionSizes = 23;
// hwLat rows: NCCL_HW_NVLINK, NCCL_HW_PCI, NCCL_HW_NET.
inline constexpr int kNumNcclHwKinds = 3;

// The NCCL function a collective type is (nullopt-like false for p2p and all_to_all).
bool NcclFunctionOf(traces::CollectiveType type, NcclFunction* function);

// The shape of one communicator on the cluster.
struct CommTopology {
  int32_t nranks = 1;
  int32_t nnodes = 1;                 // distinct nodes among the members
  int32_t ranks_per_node = 1;         // max members on one node
  GpuArch arch = GpuArch::kHopper;
  IntraNodeFabric fabric = IntraNodeFabric::kNvSwitch;
  double intra_node_bandwidth = 0;    // bytes/s per GPU per direction
  double inter_node_bandwidth = 0;    // bytes/s per GPU per direction
  CpuVendor cpu_vendor = CpuVendor::kIntel;  // picks NCCL's multi-node LL cap / net overhead
  bool gpu_direct_rdma = true;        // LL128 across nodes needs it
  double hbm_bandwidth = 0;           // bytes/s: a 1-rank collective is a local copy
  // cluster.network: the leaf groups the members' nodes span (1 without tiers) and one
  // switch's latency.
  int32_t leaf_groups = 1;
  int64_t switch_latency_ns = 0;
  bool operator==(const CommTopology&) const = default;  // every field: what NCCL's costs read
};

// Builds the topology of a communicator made of `ranks` on `cluster`.
CommTopology TopologyOf(const ClusterSpec& cluster, const std::vector<int32_t>& ranks);

struct CollectiveCost {
  // False when NCCL has no such (algorithm, protocol) pair for the collective (e.g. Tree for
  // all_gather) or disables it on this topology (LL128 over PCIe, NVLS off Hopper);
  // duration_ns is then INT64_MAX.
  bool available = true;
  int64_t duration_ns = 0;
  NcclAlgorithm algorithm = NcclAlgorithm::kRing;
  NcclProtocol protocol = NcclProtocol::kSimple;
  int32_t channels = 0;       // execution channels (NCCL's "Channel xx/NN", NVLS channels)
  double latency_us = 0;      // the latency term of the chosen pair
  double algo_bandwidth = 0;  // bytes/s: the bandwidth term's divisor of the chosen pair
  int64_t fabric_ns = 0;      // cluster.network's extra switch hops, included in duration_ns
};

// How NCCL_ALGO's list applies in a release (tuning.cc of each range).
enum class NcclAlgoScope : uint8_t {
  kAllReduceOnly,       // 2.7-2.8: "Only disable algo for Allreduce since others only have one"
  kRingAlwaysElsewhere, // 2.12-2.17: "Never disable ring for non-allreduce operations"
  kRingBackup,          // 2.18-2.22: every function; Ring comes back when nothing is left
  kStrict,              // 2.23+: per function; nothing left makes NCCL refuse the call
};

// How a release models NVLS and NVLS-Tree bandwidth and latency.
enum class NcclNvlsModel : uint8_t {
  kNone,       // before 2.17
  kRingGraph,  // 2.17: the ring graph's bandwidth x .75, latency = baseLat
  kMinIntraInter,  // 2.18-2.26: min(bwIntra, bwInter) of the NVLS graph x 5/6
  kEfficiency,     // 2.27+: bwIntra x nvlsEfficiency x (nCh-1)/nCh (x2 for all_reduce)
};

// The tables and formula variants of one range of NCCL releases, [first, next range's first).
struct NcclTuningTables {
  std::string_view name;    // "2.20": the release the tables were read from, short
  NcclVersion first;        // first release of the range
  std::string_view source;  // NCCL file and commit read, and the range's assumptions
  // baseLat [algorithm][protocol], microseconds.
  double base_latency_us[kNumNcclAlgorithms][kNumNcclProtocols] = {};
  // hwLat [NVLINK, PCI, NET][algorithm][protocol], microseconds.
  double hw_latency_us[kNumNcclHwKinds][kNumNcclAlgorithms][kNumNcclProtocols] = {};
  // llMaxBws [row][node class], GB/s: row is the GPU arch on one node (0 Volta, 1 Ampere,
  // 2 Hopper) and the CPU across nodes (0 Intel, 1 AMD). 0: no cap (2.7).
  double ll_max_bw_gbps[3][kNumNodeClasses] = {};
  // 2.8 indexed the single-node row by "compCap80" (1 for Ampere, 0 otherwise).
  bool ll_max_row_by_sm80 = false;
  // Per-channel caps [arch][node class], GB/s.
  double per_channel_max_ring_ll128_gbps[kNumGpuArchs][kNumNodeClasses] = {};
  double per_channel_max_tree_ll128_gbps[kNumGpuArchs][kNumNodeClasses] = {};
  double per_channel_max_tree_gbps[kNumGpuArchs][kNumNodeClasses] = {};
  double per_channel_max_nvls_tree_gbps[kNumGpuArchs][kNumNodeClasses] = {};  // 2.27+ (0: none)
  // 2.7-2.8: the LL128 per-channel cap by function (ll128MaxBwPerCh[coll]); 0 when the
  // per-arch tables above apply.
  double ll128_max_bw_by_function_gbps[kNumNcclFunctions] = {};
  double tree_ll128_cap_scale = 1;  // 2.7: the Tree/LL128 cap x 7/9
  // 2.7: absolute Tree caps [nNodes > 2][Ampere and LL128] instead of per-channel ones.
  double tree_max_bw_gbps[2][2] = {};
  double arch_bus_bw_cap_gbps[kNumGpuArchs] = {};  // 2.7-2.17 "busBw = min(busBw, 235/370)"; 0: none
  // "Various model refinements".
  double ring_ll_factor = 0;            // Ring/LL for all_reduce, reduce or several nodes
  double ring_ll_factor_one_node_other = 0;  // Ring/LL for the others on one node
  double ring_ll128_factor = 0;
  double ring_ll128_factor_one_ppn = 0;  // ppn < 2
  double tree_bw_factor = 0;
  double tree_ll_factor = 0;
  double tree_ll128_factor_single_node = 0;
  double tree_ll128_factor_multi_node = 0;
  double tree_bus_to_algo_ratio = 0;
  double multi_node_ll_intra_latency_factor = 1;  // 2.7-2.17: LL intraLat x 1.8 across nodes
  bool all_reduce_inter_steps_2n = false;  // nInterSteps = 2 nNodes (2.17-2.20) vs 2 (nNodes-1)
  bool net_overhead_floor = false;         // getNetOverhead (2.19+)
  bool ppn1_tree_net_latency = false;      // "With ppn=1 ... use the Tree network latency" (2.23+)
  // ncclTopoGetAlgoTime's ring plateau: latency x factor (arch below `plateau_arch` gets the
  // other one) once bytes / (channels x ranks) >= 64 (2.19+), or bytes >= ranks / 16 x 64 KiB.
  bool plateau_per_channel_rank = false;
  GpuArch plateau_arch = GpuArch::kAmpere;
  double plateau_factor_below = 0;
  double plateau_factor = 0;
  double tree_correction_factor[kNumNcclProtocols][kNumTreeCorrectionSizes] = {};
  int32_t tree_correction_sizes = kNumTreeCorrectionSizes;
  bool ll128_on_hopper = false;  // 2.7-2.8 enable LL128 by default on sm70 / sm80 only
  // NVLS.
  NcclNvlsModel nvls = NcclNvlsModel::kNone;
  bool has_nvls_tree = false;
  int32_t nvls_min_local_ranks = 0;  // NVLS needs more than this many GPUs of the node (2.17: 1, then 2)
  bool nvls_ratio_for_gather = false;  // 2.18-2.22: x 5/6 for all_gather / reduce_scatter too
  double nvls_algo_ratio = 0;          // kRingGraph .75, kMinIntraInter 5/6
  double nvls_efficiency_hopper = 0;   // kEfficiency
  // PAT (2.23+): bandwidth x factor; latency base + log2(nodes) x interLat / divisor + ranks x per-rank.
  bool has_pat = false;
  double pat_bw_factor = 0;
  double pat_base_latency_us = 0;
  double pat_inter_latency_divisor = 0;
  double pat_per_rank_latency_us = 0;
  NcclAlgoScope algo_scope = NcclAlgoScope::kStrict;
  int32_t max_channels = 0;  // MAXCHANNELS
};

// Every range modelled, oldest first, and the one a release falls in (the newest range for
// releases after it; the oldest for those before 2.7, which a plan cannot ask for).
std::span<const NcclTuningTables> AllNcclTuningTables();
const NcclTuningTables& NcclTuningTablesFor(NcclVersion version);

struct NcclModelConfig {
  NcclTuningTables tables;
  NcclEnv env;

  // ---- What replaces NCCL's topology search (see nccl_model.cc).
  int32_t ring_graph_channels[kNumGpuArchs] = {};      // search channels of the ring / tree graph
  double nvlink_usable_fraction[kNumGpuArchs] = {};    // NCCL's per-link NVLink bw / line rate
  int32_t nvls_default_channels = 0;                   // NCCL_NVLS_NCHANNELS's default
  // The speed arrays NCCL's search walks on Hopper (search.cc sm90SpeedArrayIntra / Inter).
  std::vector<double> sm90_speeds_intra_gbps;
  std::vector<double> sm90_speeds_inter_gbps;

  // ---- Multi-node ring latency floor per step (getNetOverhead), microseconds, by CPU
  // vendor; Simple pays it net_overhead_simple_factor times.
  double net_overhead_us[kNumCpuVendors] = {};
  double net_overhead_simple_factor = 0;

  // ---- Point-to-point (send / recv, all_to_all).
  int64_t p2p_ll_threshold_bytes = 0;            // LL at or below, Simple above
  // Share of a GPU's NVLink bandwidth one peer can reach, by fabric.
  double p2p_pair_nvlink_fraction[kNumIntraNodeFabrics] = {};

  // The model of `env`'s release with its knobs.
  static NcclModelConfig For(const NcclEnv& env);
  // For(NcclEnv{}): the release PyTorch's default version bundles, no knobs.
  static NcclModelConfig Default();
};

// The channels NCCL runs a communicator's collectives on (what its buffers are sized by).
struct NcclChannels {
  int32_t ring_tree = 0;  // comm->nChannels: 2 x the ring graph's, then NCCL_MIN/MAX_NCHANNELS
  int32_t nvls = 0;       // NVLS channels when NVLS or NVLS-Tree can run, else 0
  int32_t search = 0;     // the ring / tree graph's search channels (the per-channel caps')
};
NcclChannels NcclChannelsFor(const NcclModelConfig& config, const CommTopology& topology);

class NcclModel {
 public:
  explicit NcclModel(NcclModelConfig config);
  // Cheapest enabled (algorithm, protocol) for the collective, NCCL-style, plus the fabric's
  // extra hops. `bytes` is nccl-tests' size S (see CollectiveOp). send / recv and
  // single-rank communicators are handled too (a 1-rank collective is a local copy); bytes
  // <= 0 costs 0. all_to_all and send / recv are concurrent point-to-point messages,
  // reported as Ring with the protocol NCCL's p2p path uses (LL up to p2p_ll_threshold_bytes
  // per peer, Simple above). When the knobs leave nothing NCCL can run, Ring (the older
  // releases' fallback; see CheckNcclChoices in cost_provider.h for the newer ones' error).
  CollectiveCost Estimate(traces::CollectiveType type, int64_t bytes,
                          const CommTopology& topology) const;
  // The cost of one specific pair, knobs ignored (for tests and for reports); available =
  // false when NCCL has no such pair for the collective on this topology.
  CollectiveCost EstimateWith(traces::CollectiveType type, int64_t bytes,
                              const CommTopology& topology, NcclAlgorithm algorithm,
                              NcclProtocol protocol) const;
  // Whether the knobs (NCCL_ALGO, NCCL_PROTO, NVLS / PAT enables) leave the pair enabled.
  bool Enabled(NcclFunction function, NcclAlgorithm algorithm, NcclProtocol protocol) const;
  // Whether any pair NCCL can run for `type` on `topology` is enabled (false: Estimate
  // falls back to Ring).
  bool AnyEnabled(traces::CollectiveType type, const CommTopology& topology) const;
  const NcclModelConfig& config() const { return config_; }

 private:
  // The cheapest pair the knobs enable, or (honour_knobs false) the cheapest Ring pair.
  CollectiveCost Cheapest(traces::CollectiveType type, int64_t bytes, const CommTopology& topology,
                          bool honour_knobs) const;
  NcclModelConfig config_;
};

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_NCCL_MODEL_H_

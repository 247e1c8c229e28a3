// NCCL's tuning tables, one range of releases at a time, as src/graph/tuning.cc of the release
// named gives them (baseLat, hwLat, llMaxBws, the per-channel caps, the "model refinements",
// treeCorrectionFactor, the ring plateau) and the variants of its formulas (NcclTuningTables in
// nccl_model.h says what each field is; nccl_model.cc applies them).
//
// Which stored version of tuning.cc each range was read from (NVIDIA/nccl, the commit's
// makefiles/version.mk naming the release):
//   2.7   commit 01afd20 (2.7.5)   used for 2.7.x (PyTorch 1.8's 2.7.8)
//   2.8   commit 920dbe5 (2.8.3)   used for 2.8-2.11 (PyTorch 1.9's 2.9.8, 1.10-1.12's 2.10.3)
//   2.12  commit 5d3ab08 (2.17.1)  without NVLS, used for 2.12-2.16 (PyTorch 1.13 / 2.0's 2.14.3)
//   2.17  commit 5d3ab08 (2.17.1)  NVLS on one node
//   2.20  commit b647562 (2.20.3)  used for 2.18-2.22 (PyTorch 2.1-2.6: 2.18.1 ... 2.21.5)
//   2.24  commit 6aae379 (2.24.3)  used for 2.23-2.26 (PyTorch 2.7's 2.26.2)
//   2.28  v2.28.7-1 (ncclTunerConstantsDefaults and ncclTopoTuneModel, read through a public
//         annotated copy of that file)  used from 2.27 (PyTorch 2.8-2.12: 2.27.3 ... 2.29.3)
// The ranges' boundaries between the stored versions are ASSUMPTIONS: the index holds no
// tuning.cc of 2.9-2.16, 2.18, 2.21-2.23, 2.25-2.27 or 2.29; each range starts at the release
// whose notes introduce the feature the next stored version shows (NVLS 2.17.1, NVLSTree
// 2.18.1, PAT 2.23.4) or, for 2.27, at the tuner constants table that the 2.28 file reads from.
// The 2.25/2.26 file (Blackwell rows, PAT's SM60 check, NVLS all_gather bandwidth min(bwIntra x
// (ppn-1)/ppn, bwInter x 0.9)) differs from 2.24.3 in nothing Volta, Ampere or Hopper reach on
// the paths modelled here except that NVLS all_gather variant, which never wins on one H100 node
// in either form (ring all_gather algBw 423.8 GB/s against 320 / 280 GB/s).
#include <array>

#include "shardscope/sim/models/nccl_model.h"

namespace shardscope::sim {
namespace {

constexpr int kTree = static_cast<int>(NcclAlgorithm::kTree);
constexpr int kRing = static_cast<int>(NcclAlgorithm::kRing);
constexpr int kNvls = static_cast<int>(NcclAlgorithm::kNvls);
constexpr int kNvlsTree = static_cast<int>(NcclAlgorithm::kNvlsTree);
constexpr int kPat = static_cast<int>(NcclAlgorithm::kPat);
constexpr int kNvlink = 0, kPci = 1, kNet = 2;  // NCCL_HW_NVLINK, NCCL_HW_PCI, NCCL_HW_NET
constexpr int kVolta = 0, kAmpere = 1, kHopper = 2;

using Row = std::array<double, kNumNcclProtocols>;       // LL, LL128, Simple
using ClassRow = std::array<double, kNumNodeClasses>;    // N1, N2, N4+

void Set(double (&table)[kNumNcclAlgorithms][kNumNcclProtocols], int algorithm, Row row) {
  for (int p = 0; p < kNumNcclProtocols; ++p) table[algorithm][p] = row[static_cast<size_t>(p)];
}
void Set(double (&table)[kNumGpuArchs][kNumNodeClasses], int arch, ClassRow row) {
  for (int n = 0; n < kNumNodeClasses; ++n) table[arch][n] = row[static_cast<size_t>(n)];
}
void SetLl(double (&table)[3][kNumNodeClasses], int row, ClassRow values) {
  for (int n = 0; n < kNumNodeClasses; ++n) table[row][n] = values[static_cast<size_t>(n)];
}
// treeCorrectionFactor rows LL, LL128, Simple (a 22-column table is padded with a 0 never read).
void SetCorrection(NcclTuningTables& t, std::array<double, kNumTreeCorrectionSizes> ll,
                   std::array<double, kNumTreeCorrectionSizes> ll128,
                   std::array<double, kNumTreeCorrectionSizes> simple) {
  for (int i = 0; i < kNumTreeCorrectionSizes; ++i) {
    t.tree_correction_factor[0][i] = ll[static_cast<size_t>(i)];
    t.tree_correction_factor[1][i] = ll128[static_cast<size_t>(i)];
    t.tree_correction_factor[2][i] = simple[static_cast<size_t>(i)];
  }
}

// treeCorrectionFactor "Powers of two, 64 B to 256MB" of 2.17.1 onwards (2.28.7 adds a 24th
// column for NVLSTree on Blackwell only).
void SetCurrentCorrection(NcclTuningTables& t) {
  SetCorrection(t,
                {1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0},
                {1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0},
                {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9});
}

// The refinements every range shares (tuning.cc "Various model refinements"): Tree x .92
// (.9 in 2.7), Tree/LL x 1/3.8, Tree/LL128 on one node x 7/9, Tree algBw = busBw x .5.
void SetCommonRefinements(NcclTuningTables& t) {
  t.tree_bw_factor = 0.92;
  t.tree_ll_factor = 1.0 / 3.8;
  t.tree_ll128_factor_single_node = 7.0 / 9.0;
  t.tree_bus_to_algo_ratio = 0.5;
  t.max_channels = 32;  // src/include/device.h "#define MAXCHANNELS 32"
}

// ---- 2.7.5 (commit 01afd20) --------------------------------------------------------------------
NcclTuningTables Nccl27() {
  NcclTuningTables t;
  t.name = "2.7";
  t.first = {2, 7, 0};
  t.source = "NVIDIA/nccl src/graph/tuning.cc @01afd20 (2.7.5)";
  SetCommonRefinements(t);
  // baseLat: Tree { 4.4, 4.4, 0 }, Ring { 3.6, 10.0, 8.4 } (CollNet's row is not used).
  Set(t.base_latency_us, kTree, {4.4, 4.4, 0});
  Set(t.base_latency_us, kRing, {3.6, 10.0, 8.4});
  // hwLat: "Tree/Simple is the latency a 256kB chunk".
  Set(t.hw_latency_us[kNvlink], kTree, {.52, 1.2, 28});
  Set(t.hw_latency_us[kNvlink], kRing, {.47, 1.9, 3.4});
  Set(t.hw_latency_us[kPci], kTree, {1.0, 1.9, 28});
  Set(t.hw_latency_us[kPci], kRing, {1.0, 2.5, 5.7});
  Set(t.hw_latency_us[kNet], kTree, {5.0, 8.5, 50});
  Set(t.hw_latency_us[kNet], kRing, {2.7, 4.0, 9.6});
  // No llMaxBws yet; ll128MaxBwPerCh by function (Broadcast, Reduce, AllGather, ReduceScatter,
  // AllReduce), and the Tree/LL128 cap x 7/9.
  t.ll128_max_bw_by_function_gbps[0] = 18.8;
  t.ll128_max_bw_by_function_gbps[1] = 12.0;
  t.ll128_max_bw_by_function_gbps[2] = 18.3;
  t.ll128_max_bw_by_function_gbps[3] = 15.2;
  t.ll128_max_bw_by_function_gbps[4] = 16.7;
  t.tree_ll128_cap_scale = 7.0 / 9.0;
  // maxTreeBw = nNodes > 2 ? (compCap80 && LL128 ? 105 : 80) : (compCap80 && LL128 ? 130 : 110).
  t.tree_max_bw_gbps[0][0] = 110;
  t.tree_max_bw_gbps[0][1] = 130;
  t.tree_max_bw_gbps[1][0] = 80;
  t.tree_max_bw_gbps[1][1] = 105;
  t.arch_bus_bw_cap_gbps[kAmpere] = 235;  // "if (compCap80) busBw = std::min(busBw, 235.0f)"
  t.ring_ll_factor = 1.0 / 4.0;           // nNodes > 1 || AllReduce || Reduce
  t.ring_ll_factor_one_node_other = 1.0 / 3.0;
  t.ring_ll128_factor = 0.92;
  t.ring_ll128_factor_one_ppn = 0.7;
  t.tree_bw_factor = 0.9;
  t.tree_ll128_factor_multi_node = 0.915;
  t.multi_node_ll_intra_latency_factor = 1.8;
  // "info->nBytes >= info->comm->nRanks/16.0*65536) lat *= 1.9".
  t.plateau_factor_below = 1.9;
  t.plateau_factor = 1.9;
  // "Powers of two, 64 B to 128MB": 22 columns.
  t.tree_correction_sizes = 22;
  SetCorrection(t,
                {1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 0},
                {1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .5, .6, .6, .7, .7, .8, .9, .9, 1.0, 0},
                {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .5, .5, .6, .6, .7, .8, .9, 0});
  t.algo_scope = NcclAlgoScope::kAllReduceOnly;
  return t;
}

// ---- 2.8.3 (commit 920dbe5) --------------------------------------------------------------------
NcclTuningTables Nccl28() {
  NcclTuningTables t = Nccl27();
  t.name = "2.8";
  t.first = {2, 8, 0};
  t.source = "NVIDIA/nccl src/graph/tuning.cc @920dbe5 (2.8.3); ASSUMPTION: unchanged through 2.11";
  // hwLat: the NET Tree/Simple row becomes 28 and the NVLink Tree/LL128 1.25.
  Set(t.hw_latency_us[kNvlink], kTree, {.52, 1.25, 28});
  Set(t.hw_latency_us[kNet], kTree, {5.0, 8.5, 28});
  t.ll128_max_bw_by_function_gbps[4] = 16.9;
  t.tree_ll128_cap_scale = 1;
  // llMaxBws[2][3]: { Volta-N1/Intel-N2/Intel-N4 }, { Ampere-N1/AMD-N2/AMD-N4 }; one node
  // indexes it by compCap80, so a Hopper reads the Volta row.
  SetLl(t.ll_max_bw_gbps, 0, {39.0, 39.0, 20.4});
  SetLl(t.ll_max_bw_gbps, 1, {87.7, 22.5, 19.0});
  SetLl(t.ll_max_bw_gbps, 2, {39.0, 39.0, 20.4});
  t.ll_max_row_by_sm80 = true;
  // perChMaxTreeBws[compCap80][N1/N2/N4]: Volta {26.5, 18.5, 10.0}, Ampere {24.0, 22.5, 16.0}.
  t.tree_max_bw_gbps[0][0] = t.tree_max_bw_gbps[0][1] = t.tree_max_bw_gbps[1][0] = t.tree_max_bw_gbps[1][1] = 0;
  Set(t.per_channel_max_tree_gbps, kVolta, {26.5, 18.5, 10.0});
  Set(t.per_channel_max_tree_gbps, kAmpere, {24.0, 22.5, 16.0});
  Set(t.per_channel_max_tree_gbps, kHopper, {26.5, 18.5, 10.0});
  t.tree_bw_factor = 0.92;
  t.tree_correction_sizes = 23;
  SetCorrection(t,
                {1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0},
                {1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .5, .6, .6, .7, .7, .8, .9, .9, .92, .92},
                {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9});
  return t;
}

// ---- 2.17.1 (commit 5d3ab08) -------------------------------------------------------------------
NcclTuningTables Nccl217() {
  NcclTuningTables t = Nccl28();
  t.name = "2.17";
  t.first = {2, 17, 0};
  t.source = "NVIDIA/nccl src/graph/tuning.cc @5d3ab08 (2.17.1)";
  // baseLat: NVLS { 0, 0, 40.0 }; hwLat NET Ring/Simple 9.6, NVLS rows 0.
  Set(t.base_latency_us, kNvls, {0, 0, 40.0});
  // llMaxBws[3][3] gains a Hopper-N1 row {87.7, 22.5, 19.0}; indexed by compCapIndex.
  SetLl(t.ll_max_bw_gbps, 2, {87.7, 22.5, 19.0});
  t.ll_max_row_by_sm80 = false;
  // ll128MaxBwPerCh[compCapIndex] = { 20.0, 20.0, 36.7 } for Ring and Tree alike.
  for (int n = 0; n < kNumNcclFunctions; ++n) t.ll128_max_bw_by_function_gbps[n] = 0;
  Set(t.per_channel_max_ring_ll128_gbps, kVolta, {20.0, 20.0, 20.0});
  Set(t.per_channel_max_ring_ll128_gbps, kAmpere, {20.0, 20.0, 20.0});
  Set(t.per_channel_max_ring_ll128_gbps, kHopper, {36.7, 36.7, 36.7});
  Set(t.per_channel_max_tree_ll128_gbps, kVolta, {20.0, 20.0, 20.0});
  Set(t.per_channel_max_tree_ll128_gbps, kAmpere, {20.0, 20.0, 20.0});
  Set(t.per_channel_max_tree_ll128_gbps, kHopper, {36.7, 36.7, 36.7});
  // perChMaxTreeBws: Volta {26.5, 18.5, 10.0}, Ampere {24.0, 23.6, 17.8}, Hopper {38.7, 41.4, 33.0}.
  Set(t.per_channel_max_tree_gbps, kAmpere, {24.0, 23.6, 17.8});
  Set(t.per_channel_max_tree_gbps, kHopper, {38.7, 41.4, 33.0});
  t.arch_bus_bw_cap_gbps[kHopper] = 370;  // "if (compCapIndex == HOPPER_COMPCAP_IDX) busBw = std::min(busBw, 370.0f)"
  t.tree_ll128_factor_multi_node = 120.0 / 128.0;
  t.all_reduce_inter_steps_2n = true;     // "nInterSteps = ... (nNodes > 1 ? 2*nNodes :0)"
  // "lat *= info->comm->minCompCap < 90 ? 1.9 : 1.5".
  t.plateau_arch = GpuArch::kHopper;
  t.plateau_factor_below = 1.9;
  t.plateau_factor = 1.5;
  SetCurrentCorrection(t);
  t.ll128_on_hopper = true;
  // NVLS: the ring graph ("we only need the NVSwitch speed for NVLS"), algBw ratio .75,
  // latency baseLat; ncclNvlsSetup: one node, localRanks > 1.
  t.nvls = NcclNvlsModel::kRingGraph;
  t.nvls_algo_ratio = 0.75;
  t.nvls_min_local_ranks = 1;
  t.nvls_ratio_for_gather = true;
  t.algo_scope = NcclAlgoScope::kRingAlwaysElsewhere;
  return t;
}

// 2.12-2.16: 2.17.1's tables without NVLS (ASSUMPTION: the Hopper rows are 2.12's Hopper
// support; no tuning.cc of 2.12-2.16 is in the index).
NcclTuningTables Nccl212() {
  NcclTuningTables t = Nccl217();
  t.name = "2.12";
  t.first = {2, 12, 0};
  t.source = "NVIDIA/nccl src/graph/tuning.cc @5d3ab08 (2.17.1) without NVLS; ASSUMPTION for 2.12-2.16";
  Set(t.base_latency_us, kNvls, {0, 0, 0});
  t.nvls = NcclNvlsModel::kNone;
  t.nvls_algo_ratio = 0;
  t.nvls_min_local_ranks = 0;
  t.nvls_ratio_for_gather = false;
  return t;
}

// ---- 2.20.3 (commit b647562), for 2.18-2.22 -----------------------------------------------------
NcclTuningTables Nccl220() {
  NcclTuningTables t = Nccl217();
  t.name = "2.20";
  t.first = {2, 18, 0};
  t.source =
      "NVIDIA/nccl src/graph/tuning.cc @b647562 (2.20.3); ASSUMPTION for 2.18 (NVLSTree's first release) "
      "through 2.22";
  // baseLat: Tree { 6.8, 14.0, 0 }, Ring { 6.6, 14.0, 8.4 }, NVLS / NVLS Tree 0.
  Set(t.base_latency_us, kTree, {6.8, 14.0, 0});
  Set(t.base_latency_us, kRing, {6.6, 14.0, 8.4});
  Set(t.base_latency_us, kNvls, {0, 0, 0});
  // hwLat.
  Set(t.hw_latency_us[kNvlink], kTree, {.6, 1.25, 28});
  Set(t.hw_latency_us[kNvlink], kRing, {.6, 1.9, 3.4});
  Set(t.hw_latency_us[kNvlink], kNvls, {0, 0, 23});
  Set(t.hw_latency_us[kNvlink], kNvlsTree, {0, 0, 23});
  Set(t.hw_latency_us[kPci], kTree, {1.0, 1.9, 28});
  Set(t.hw_latency_us[kPci], kRing, {1.0, 2.5, 5.7});
  Set(t.hw_latency_us[kNet], kTree, {5.0, 8.5, 28});
  Set(t.hw_latency_us[kNet], kRing, {2.7, 4.0, 14.0});
  Set(t.hw_latency_us[kNet], kNvls, {0, 0, 18});
  Set(t.hw_latency_us[kNet], kNvlsTree, {0, 0, 14});
  // perChMaxTreeLL128Bws Hopper {36.7, 36.7, 29.0}; perChMaxTreeBws Hopper {38.7, 41.4, 36.0}.
  Set(t.per_channel_max_tree_ll128_gbps, kHopper, {36.7, 36.7, 29.0});
  Set(t.per_channel_max_tree_gbps, kHopper, {38.7, 41.4, 36.0});
  t.arch_bus_bw_cap_gbps[kAmpere] = 0;
  t.arch_bus_bw_cap_gbps[kHopper] = 0;
  t.multi_node_ll_intra_latency_factor = 1;
  t.net_overhead_floor = true;
  // "nBytes/(comm->nChannels*comm->nRanks) >= 64 ... lat *= minCompCap < 80 ? 1.9 : 1.4".
  t.plateau_per_channel_rank = true;
  t.plateau_arch = GpuArch::kAmpere;
  t.plateau_factor_below = 1.9;
  t.plateau_factor = 1.4;
  // NVLS: bw = min(bwIntra, bwInter) of the NVLS graph (NVLSTree: bwInter / 2 beyond two
  // nodes), ratio 5/6 for every function; latency hwLat NVLink (+ NET across nodes).
  // ncclNvlsInit: more than two GPUs ("gpuCount <= 2" returns).
  t.nvls = NcclNvlsModel::kMinIntraInter;
  t.has_nvls_tree = true;
  t.nvls_algo_ratio = 5.0 / 6.0;
  t.nvls_min_local_ranks = 2;
  t.nvls_ratio_for_gather = true;
  t.algo_scope = NcclAlgoScope::kRingBackup;
  return t;
}

// ---- 2.24.3 (commit 6aae379), for 2.23-2.26 -----------------------------------------------------
NcclTuningTables Nccl224() {
  NcclTuningTables t = Nccl220();
  t.name = "2.24";
  t.first = {2, 23, 0};
  t.source =
      "NVIDIA/nccl src/graph/tuning.cc @6aae379 (2.24.3); ASSUMPTION for 2.23 (PAT's first release) "
      "through 2.26";
  Set(t.base_latency_us, kTree, {6.8, 14.0, 8.4});
  Set(t.hw_latency_us[kNvlink], kTree, {.6, 1.25, 4.0});
  Set(t.hw_latency_us[kNvlink], kNvls, {0, 0, 25});
  Set(t.hw_latency_us[kNvlink], kNvlsTree, {0, 0, 25});
  Set(t.hw_latency_us[kPci], kTree, {1.0, 1.9, 4.0});
  Set(t.hw_latency_us[kNet], kTree, {5.0, 8.5, 14});
  // llMaxBws Hopper-N1 row {141.0, 45.0, 35.0}.
  SetLl(t.ll_max_bw_gbps, 2, {141.0, 45.0, 35.0});
  // "busBw = std::min(llMaxBw, busBw * .5)"; Ring/LL128 x .92 whatever the ppn.
  t.ring_ll_factor = 0.5;
  t.ring_ll_factor_one_node_other = 0.5;
  t.ring_ll128_factor_one_ppn = 0.92;
  t.all_reduce_inter_steps_2n = false;  // "2*(nNodes-1)"
  t.ppn1_tree_net_latency = true;
  // NVLS all_gather / reduce_scatter: no bus-to-algorithm conversion ("if (!(a != NCCL_ALGO_RING
  // && (coll == ncclFuncAllGather || coll == ncclFuncReduceScatter)))").
  t.nvls_ratio_for_gather = false;
  // PAT: "busBw *= .75"; latency "8 // Base time + log2i(nNodes) * (interLat/3.5) + nRanks * 2.8";
  // ncclPatEnable: NCCL_PAT_ENABLE 2 means one GPU per node only.
  t.has_pat = true;
  t.pat_bw_factor = 0.75;
  t.pat_base_latency_us = 8;
  t.pat_inter_latency_divisor = 3.5;
  t.pat_per_rank_latency_us = 2.8;
  t.algo_scope = NcclAlgoScope::kStrict;
  return t;
}

// ---- 2.28.7 (ncclTunerConstantsDefaults), from 2.27 ----------------------------------------------
NcclTuningTables Nccl228() {
  NcclTuningTables t = Nccl224();
  t.name = "2.28";
  t.first = {2, 27, 0};
  t.source =
      "NVIDIA/nccl src/graph/tuning.cc v2.28.7-1 (ncclTunerConstantsDefaults, nvlsEfficiency, "
      "ncclTopoTuneModel); ASSUMPTION for 2.27 and for releases after 2.28";
  // baseLatencies PAT { 8.0, 8.0, 8.0 }; hwLatencies NET NVLSTree 20.9, PAT NVLink / PCI 4.0,
  // NET 14.
  Set(t.base_latency_us, kPat, {8.0, 8.0, 8.0});
  Set(t.hw_latency_us[kNvlink], kPat, {0, 0, 4.0});
  Set(t.hw_latency_us[kPci], kPat, {0, 0, 4.0});
  Set(t.hw_latency_us[kNet], kNvlsTree, {0, 0, 20.9});
  Set(t.hw_latency_us[kNet], kPat, {0, 0, 14});
  // perChMaxNVLSTreeBws: Volta {26.5, 18.5, 10.0}, Ampere {24.0, 23.6, 17.8}, Hopper {0.0, 57.7, 45.5}.
  Set(t.per_channel_max_nvls_tree_gbps, kVolta, {26.5, 18.5, 10.0});
  Set(t.per_channel_max_nvls_tree_gbps, kAmpere, {24.0, 23.6, 17.8});
  Set(t.per_channel_max_nvls_tree_gbps, kHopper, {0.0, 57.7, 45.5});
  // nvlsEfficiency[NCCL_NUM_COMPCAPS] = { 0.0f Volta, 0.0f Ampere, 0.85f Hopper, 0.74f Blackwell }.
  t.nvls = NcclNvlsModel::kEfficiency;
  t.nvls_algo_ratio = 0;
  t.nvls_efficiency_hopper = 0.85;
  return t;
}

const std::array<NcclTuningTables, 7>& Tables() {
  static const std::array<NcclTuningTables, 7> tables = {Nccl27(), Nccl28(), Nccl212(), Nccl217(),
                                                         Nccl220(), Nccl224(), Nccl228()};
  return tables;
}

}  // namespace

std::span<const NcclTuningTables> AllNcclTuningTables() { return Tables(); }

const NcclTuningTables& NcclTuningTablesFor(NcclVersion version) {
  const auto& tables = Tables();
  const NcclTuningTables* found = &tables.front();
  for (const NcclTuningTables& t : tables) {
    if (version >= t.first) found = &t;
  }
  return *found;
}

}  // namespace shardscope::sim

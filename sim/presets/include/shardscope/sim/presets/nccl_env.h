// The NCCL a job runs: its release and the environment variables that change NCCL's choices
// (plan key cluster.nccl, docs/PLAN.md). A cluster carries one (ClusterSpec::nccl); the NCCL
// cost model (sim/models/nccl_model.h) reads it to pick the tuning tables of that release and
// to honour the knobs; NCCL's buffer memory reads NCCL_BUFFSIZE and the channel counts from
// here and from NcclChannelsFor (nccl_model.h).
//
// The names are NCCL's: algorithm and protocol indices in NCCL's order (src/include/device.h
// NCCL_ALGO_* / NCCL_PROTO_*), the functions NCCL tunes in ncclFunc_t order, the spellings of
// ncclAlgoStr / ncclProtoStr / ncclFuncStr (src/enqueue.cc, later src/init.cc).
#ifndef SHARDSCOPE_SIM_PRESETS_NCCL_ENV_H_
#define SHARDSCOPE_SIM_PRESETS_NCCL_ENV_H_

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "shardscope/base/status.h"

namespace shardscope::sim {

enum class NcclAlgorithm : uint8_t { kTree, kRing, kCollNetDirect, kCollNetChain, kNvls, kNvlsTree, kPat };
enum class NcclProtocol : uint8_t { kLL, kLL128, kSimple };
// The collective functions NCCL's tuning covers (point-to-point is not tuned).
enum class NcclFunction : uint8_t { kBroadcast, kReduce, kAllGather, kReduceScatter, kAllReduce };
inline constexpr int kNumNcclAlgorithms = 7;
inline constexpr int kNumNcclProtocols = 3;
inline constexpr int kNumNcclFunctions = 5;

std::string_view NcclAlgorithmName(NcclAlgorithm algorithm);  // "Tree", "Ring", ..., "NVLS", "NVLSTree", "PAT"
std::string_view NcclProtocolName(NcclProtocol protocol);     // "LL", "LL128", "Simple"
std::string_view NcclFunctionName(NcclFunction function);     // "Broadcast", ..., "AllReduce"

// A release, major.minor.patch. Ordered as NCCL_VERSION_CODE orders them.
struct NcclVersion {
  int32_t major = 0;
  int32_t minor = 0;
  int32_t patch = 0;
  std::string ToString() const;  // "2.21.5"
  auto operator<=>(const NcclVersion&) const = default;
};

// "2.21.5" or "2.21" (patch 0); nothing when the text is not a release of NCCL 2.
std::optional<NcclVersion> ParseNcclVersion(std::string_view text);

// The oldest release whose tuning tables are modelled (src/graph/tuning.cc of 2.7.5).
inline constexpr NcclVersion kOldestModelledNccl{2, 7, 0};

// The NCCL that PyTorch's CUDA wheels of release major.minor bundle (pins and their sources in
// nccl_env.cc). Releases after the last pin listed get the last pin's NCCL.
NcclVersion NcclForPytorch(int32_t pytorch_major, int32_t pytorch_minor);

// Which algorithms (or protocols) each function may use: bit i of bits[f] is algorithm (or
// protocol) i for function f. What NCCL_ALGO / NCCL_PROTO leave enabled.
struct NcclEnableMask {
  uint8_t bits[kNumNcclFunctions] = {0x7f, 0x7f, 0x7f, 0x7f, 0x7f};
  bool Has(NcclFunction f, int index) const {
    return (bits[static_cast<int>(f)] >> index & 1) != 0;
  }
  auto operator<=>(const NcclEnableMask&) const = default;
};

// NCCL_BUFFSIZE's default: src/init.cc "#define DEFAULT_BUFFSIZE (1 << 22) /* 4MiB */" (every
// release modelled; NCCL_PARAM(BuffSize, "BUFFSIZE", -2) falls back to it).
inline constexpr int64_t kNcclDefaultBuffsize = int64_t{1} << 22;

// NCCL_NVLS_ENABLE / NCCL_PAT_ENABLE: 0 off, 1 on, 2 NCCL decides (the default of both:
// src/transport/nvls.cc NCCL_PARAM(NvlsEnable, "NVLS_ENABLE", 2) from 2.19 (1 in 2.17, which
// also means "where supported"); src/graph/tuning.cc NCCL_PARAM(PatEnable, "PAT_ENABLE", 2)).
inline constexpr int32_t kNcclAuto = 2;

struct NcclEnv {
  NcclVersion version{2, 28, 9};  // NcclForPytorch(2, 11): the default training.pytorch_version's
  std::string version_source;     // how it was chosen, for the report ("cluster.nccl.version", ...)
  std::string algo;               // NCCL_ALGO as written ("" = unset: every algorithm)
  std::string proto;              // NCCL_PROTO as written ("" = unset)
  NcclEnableMask algo_enabled;    // NCCL_ALGO parsed for `version`
  NcclEnableMask proto_enabled;   // NCCL_PROTO parsed
  int32_t nvls_enable = kNcclAuto;
  int32_t pat_enable = kNcclAuto;
  int32_t collnet_enable = 0;     // NCCL_COLLNET_ENABLE: CollNet (IB SHARP) is not modelled; 0 only
  int32_t min_nchannels = 0;      // NCCL_MIN_NCHANNELS (0: unset)
  int32_t max_nchannels = 0;      // NCCL_MAX_NCHANNELS (0: unset)
  int32_t nvls_nchannels = 0;     // NCCL_NVLS_NCHANNELS (0: NCCL's default)
  int64_t buffsize = kNcclDefaultBuffsize;  // NCCL_BUFFSIZE, bytes (stored for the memory model)
  // Where the plan gave NCCL_ALGO ("plan.yaml:12:7"), for errors found once communicators are
  // known (CheckNcclChoices, cost_provider.h); empty when not from a plan.
  std::string algo_where;
};

// NCCL_ALGO / NCCL_PROTO in NCCL's list syntax for `version`: "Ring,Tree" enables those,
// "^LL128" everything but those (case-insensitive, comma-separated), and from NCCL 2.23 also
// the per-function form "ring,tree;allreduce:nvls,ring" (entries separated by ';', all but
// the first prefixed by a function name; src/graph/tuning.cc parseList). A name NCCL `version`
// does not know, or the per-function form before 2.23, is an error: InvalidInput whose message
// says what was expected (the caller adds file, line and key).
StatusOr<NcclEnableMask> ParseNcclAlgoList(std::string_view text, NcclVersion version);
StatusOr<NcclEnableMask> ParseNcclProtoList(std::string_view text, NcclVersion version);

// Whether `version` accepts the per-function form of NCCL_ALGO / NCCL_PROTO (see above).
bool NcclHasPerFunctionLists(NcclVersion version);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_PRESETS_NCCL_ENV_H_

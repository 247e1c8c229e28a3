// NCCL releases, the NCCL each PyTorch release bundles, and NCCL_ALGO / NCCL_PROTO parsing.
#include "shardscope/sim/presets/nccl_env.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <string>
#include <system_error>
#include <vector>

namespace shardscope::sim {
namespace {

// ---- The NCCL in PyTorch's wheels ---------------------------------------------------------------
// PyTorch 1.x built NCCL from the third_party/nccl submodule into its CUDA wheels; from 2.0 the
// Linux CUDA wheels depend on NVIDIA's nvidia-nccl-cu1x package at the version pinned in
// .github/scripts/generate_binary_build_matrix.py (PYTORCH_EXTRA_INSTALL_REQUIREMENTS), later in
// .ci/docker/ci_commit_pins/nccl*.txt. One row per PyTorch release, with where its pin is stated.
struct PytorchPin {
  int32_t pytorch_major;
  int32_t pytorch_minor;
  NcclVersion nccl;
};
constexpr std::array<PytorchPin, 19> kPytorchPins = {{
    // pytorch/pytorch PR #45251 "Bump up NCCL to 2.7.8" (2020-09-24): the submodule of 1.8.
    {1, 8, {2, 7, 8}},
    // pytorch/pytorch issue #58470 "include NCCL 2.9.8 on pytorch 1.9" (2.9.6 had a topology
    // regression) and PR #58667 "[third-party] Update nccl to 2.9.8" (2021-05-20).
    {1, 9, {2, 9, 8}},
    // PR #62276 "Update nccl to v2.10.3-1" (2021-07-27); NVIDIA/nccl issue #1068 shows PyTorch
    // 1.10.0 logging "NCCL version 2.10.3+cuda11.1". 1.11 and 1.12: no later bump was found
    // before 1.13's (ASSUMPTION).
    {1, 10, {2, 10, 3}},
    {1, 11, {2, 10, 3}},
    {1, 12, {2, 10, 3}},
    // generate_binary_build_matrix.py at v2.0.0: nvidia-nccl-cu11==2.14.3; 1.13's CUDA 11.7
    // wheels carry the same release (ASSUMPTION: 1.13 is the first release with the pip
    // dependency scheme and the same pin).
    {1, 13, {2, 14, 3}},
    {2, 0, {2, 14, 3}},
    // pytorch/pytorch issue #112285: "if PyTorch is installed from PyPI, it is shipped with
    // NCCL-2.18.1" (2.1.0+cu121 reports (2, 18, 1)).
    {2, 1, {2, 18, 1}},
    // pytorch/builder PR #1668 "update NCCL to 2.19.3" (2024-01-08, for issue #116977);
    // NVIDIA/nccl issue #1212: PyTorch 2.2.1 reports 2.19.3.
    {2, 2, {2, 19, 3}},
    // PR #121635 "Update NCCL submodule to v2.20.5" (2024-03-11); the next bump (PR #133593,
    // 2.22.3, 2024-08-15) came after 2.4.
    {2, 3, {2, 20, 5}},
    {2, 4, {2, 20, 5}},
    // generate_binary_build_matrix.py at v2.5.0 pins nvidia-nccl-cu12==2.21.5; PR #146073
    // (2025-01-30, after 2.6's release) replaces "NCCL_VERSION=v2.21.5-1" with 2.25.1.
    {2, 5, {2, 21, 5}},
    {2, 6, {2, 21, 5}},
    // generate_binary_build_matrix.py at v2.7.0: nvidia-nccl-cu12==2.26.2.
    {2, 7, {2, 26, 2}},
    // pytorch/pytorch issue #155052 "Update nccl 2.27.3 in pytorch nightly" (versions: 2.8.0).
    {2, 8, {2, 27, 3}},
    // generate_binary_build_matrix.py at v2.9.0: nvidia-nccl-cu12==2.27.5.
    {2, 9, {2, 27, 5}},
    // PR #190386 "[RELEASE.md] Add NCCL version to compatibility matrix for releases 2.10-2.12"
    // (from each release branch's ci_commit_pins): 2.10 CUDA 12.6/12.8 -> 2.27.5; 2.11 ->
    // 2.28.9; 2.12 CUDA 12.6 -> 2.29.3.
    {2, 10, {2, 27, 5}},
    {2, 11, {2, 28, 9}},
    {2, 12, {2, 29, 3}},
}};

// ---- Names NCCL accepts in NCCL_ALGO / NCCL_PROTO, by release --------------------------------
// ncclAlgoStr: { "Tree", "Ring", "CollNet" } in 2.7.5 and 2.8.3; CollNet split into
// "CollNetDirect" and "CollNetChain" and "NVLS" added in 2.17.1 (src/enqueue.cc of 2.17.1),
// "NVLSTree" in 2.18 (release notes 2.18.1: "NVLink SHARP + Tree (NVLSTREE)"), "PAT" in 2.23
// (release notes 2.23.4). Between 2.12 and 2.16 both CollNet spellings are accepted
// (ASSUMPTION: the split's release was not pinned down; CollNet is never run, see nccl_model.h).
struct AlgoName {
  std::string_view name;
  NcclAlgorithm algorithm;
  NcclVersion first;  // the first release that knows the name
  NcclVersion last;   // the last one (inclusive)
};
constexpr NcclVersion kForever{2, 999, 999};
constexpr std::array<AlgoName, 8> kAlgoNames = {{
    {"Tree", NcclAlgorithm::kTree, {2, 0, 0}, kForever},
    {"Ring", NcclAlgorithm::kRing, {2, 0, 0}, kForever},
    {"CollNet", NcclAlgorithm::kCollNetDirect, {2, 0, 0}, {2, 16, 999}},
    {"CollNetDirect", NcclAlgorithm::kCollNetDirect, {2, 12, 0}, kForever},
    {"CollNetChain", NcclAlgorithm::kCollNetChain, {2, 12, 0}, kForever},
    {"NVLS", NcclAlgorithm::kNvls, {2, 17, 0}, kForever},
    {"NVLSTree", NcclAlgorithm::kNvlsTree, {2, 18, 0}, kForever},
    {"PAT", NcclAlgorithm::kPat, {2, 23, 0}, kForever},
}};
constexpr std::array<std::string_view, kNumNcclProtocols> kProtoNames = {"LL", "LL128", "Simple"};
constexpr std::array<std::string_view, kNumNcclFunctions> kFunctionNames = {
    "Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce"};

// The per-function form ("allreduce:tree,ring;...") is in src/graph/tuning.cc parseList of
// 2.24.3 and not in 2.20.3's; 2.23 is taken as its first release (ASSUMPTION: the one in
// between that also reworked the function's enable matrix for PAT).
constexpr NcclVersion kFirstPerFunctionLists{2, 23, 0};

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  }
  return true;
}

// Splits on `sep`, dropping empty pieces (strtok_r semantics, as NCCL splits).
std::vector<std::string_view> Split(std::string_view text, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(sep, start);
    if (end == std::string_view::npos) end = text.size();
    if (end > start) out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

std::string Join(const std::vector<std::string_view>& names) {
  std::string out;
  for (std::string_view name : names) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

// The index (algorithm or protocol) a name stands for in `version`, or -1.
using NameLookup = int (*)(std::string_view token, NcclVersion version);
int AlgoIndex(std::string_view token, NcclVersion version) {
  for (const AlgoName& n : kAlgoNames) {
    if (EqualsIgnoreCase(token, n.name) && version >= n.first && version <= n.last) {
      return static_cast<int>(n.algorithm);
    }
  }
  return -1;
}
int ProtoIndex(std::string_view token, NcclVersion) {
  for (size_t p = 0; p < kProtoNames.size(); ++p) {
    if (EqualsIgnoreCase(token, kProtoNames[p])) return static_cast<int>(p);
  }
  return -1;
}
std::string AlgoNamesOf(NcclVersion version) {
  std::vector<std::string_view> names;
  for (const AlgoName& n : kAlgoNames) {
    if (version >= n.first && version <= n.last) names.push_back(n.name);
  }
  return Join(names);
}
std::string ProtoNamesOf(NcclVersion) {
  return Join(std::vector<std::string_view>(kProtoNames.begin(), kProtoNames.end()));
}

// One list ("[^]a,b,c") applied to the functions selected by `prefix` (all when empty).
Status ApplyList(std::string_view list, std::string_view prefix, NcclVersion version, NameLookup lookup,
                 const std::string& known, std::string_view what, NcclEnableMask* mask) {
  bool set = true;
  if (!list.empty() && list.front() == '^') {
    set = false;
    list.remove_prefix(1);
  }
  uint8_t bits = set ? 0 : 0x7f;
  const std::vector<std::string_view> tokens = Split(list, ',');
  if (tokens.empty()) {
    return Status::InvalidInput(fmt::format("a comma-separated list of {} ({})", what, known));
  }
  for (std::string_view token : tokens) {
    const int index = lookup(token, version);
    if (index < 0) {
      return Status::InvalidInput(fmt::format("{} NCCL {} knows ({}); \"{}\" is not one", what,
                                              version.ToString(), known, token));
    }
    const uint8_t bit = static_cast<uint8_t>(1u << index);
    bits = set ? static_cast<uint8_t>(bits | bit) : static_cast<uint8_t>(bits & ~bit);
  }
  bool found = prefix.empty();
  for (int f = 0; f < kNumNcclFunctions; ++f) {
    if (!prefix.empty() && !EqualsIgnoreCase(prefix, kFunctionNames[f])) continue;
    found = true;
    mask->bits[f] = bits;
  }
  if (!found) {
    return Status::InvalidInput(fmt::format("a function name before ':' ({}); \"{}\" is not one",
                                            Join(std::vector<std::string_view>(kFunctionNames.begin(),
                                                                               kFunctionNames.end())),
                                            prefix));
  }
  return Status::Ok();
}

StatusOr<NcclEnableMask> ParseList(std::string_view text, NcclVersion version, NameLookup lookup,
                                   const std::string& known, std::string_view what) {
  NcclEnableMask mask;
  const bool per_function = NcclHasPerFunctionLists(version);
  if (!per_function && text.find_first_of(";:") != std::string_view::npos) {
    return Status::InvalidInput(fmt::format(
        "a single list of {} ({}); the per-function form \"func:list;...\" exists from NCCL {}, not in {}",
        what, known, kFirstPerFunctionLists.ToString(), version.ToString()));
  }
  const std::vector<std::string_view> entries = per_function ? Split(text, ';') : std::vector<std::string_view>{text};
  if (entries.empty()) {
    return Status::InvalidInput(fmt::format("a comma-separated list of {} ({})", what, known));
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    std::string_view entry = entries[i];
    std::string_view prefix;
    const size_t colon = entry.find(':');
    if (colon != std::string_view::npos) {
      prefix = entry.substr(0, colon);
      entry = entry.substr(colon + 1);
    } else if (i > 0) {
      // NCCL: "All entries except the first must have a prefix".
      return Status::InvalidInput(fmt::format(
          "\"function:list\" for every entry after the first (NCCL {} requires it)", version.ToString()));
    }
    SHARDSCOPE_RETURN_IF_ERROR(ApplyList(entry, prefix, version, lookup, known, what, &mask));
  }
  return mask;
}

}  // namespace

std::string_view NcclAlgorithmName(NcclAlgorithm algorithm) {
  switch (algorithm) {
    case NcclAlgorithm::kTree: return "Tree";
    case NcclAlgorithm::kRing: return "Ring";
    case NcclAlgorithm::kCollNetDirect: return "CollNetDirect";
    case NcclAlgorithm::kCollNetChain: return "CollNetChain";
    case NcclAlgorithm::kNvls: return "NVLS";
    case NcclAlgorithm::kNvlsTree: return "NVLSTree";
    case NcclAlgorithm::kPat: return "PAT";
  }
  return "unknown";
}

std::string_view NcclProtocolName(NcclProtocol protocol) {
  const auto p = static_cast<size_t>(protocol);
  return p < kProtoNames.size() ? kProtoNames[p] : "unknown";
}

std::string_view NcclFunctionName(NcclFunction function) {
  const auto f = static_cast<size_t>(function);
  return f < kFunctionNames.size() ? kFunctionNames[f] : "unknown";
}

std::string NcclVersion::ToString() const { return fmt::format("{}.{}.{}", major, minor, patch); }

std::optional<NcclVersion> ParseNcclVersion(std::string_view text) {
  NcclVersion v;
  const char* p = text.data();
  const char* end = text.data() + text.size();
  auto read = [&](int32_t* out) {
    auto [next, ec] = std::from_chars(p, end, *out);
    if (ec != std::errc() || next == p || *out < 0) return false;
    p = next;
    return true;
  };
  if (!read(&v.major) || p == end || *p != '.') return std::nullopt;
  ++p;
  if (!read(&v.minor)) return std::nullopt;
  if (p != end) {
    if (*p != '.') return std::nullopt;
    ++p;
    if (!read(&v.patch) || p != end) return std::nullopt;
  }
  // NCCL 2 is the only major release; minor and patch stay two digits in NCCL_VERSION_CODE.
  if (v.major != 2 || v.minor > 99 || v.patch > 99) return std::nullopt;
  return v;
}

NcclVersion NcclForPytorch(int32_t pytorch_major, int32_t pytorch_minor) {
  NcclVersion nccl = kPytorchPins.front().nccl;
  for (const PytorchPin& pin : kPytorchPins) {
    if (pin.pytorch_major < pytorch_major ||
        (pin.pytorch_major == pytorch_major && pin.pytorch_minor <= pytorch_minor)) {
      nccl = pin.nccl;
    }
  }
  return nccl;
}

bool NcclHasPerFunctionLists(NcclVersion version) { return version >= kFirstPerFunctionLists; }

StatusOr<NcclEnableMask> ParseNcclAlgoList(std::string_view text, NcclVersion version) {
  return ParseList(text, version, AlgoIndex, AlgoNamesOf(version), "algorithms");
}

StatusOr<NcclEnableMask> ParseNcclProtoList(std::string_view text, NcclVersion version) {
  return ParseList(text, version, ProtoIndex, ProtoNamesOf(version), "protocols");
}

}  // namespace shardscope::sim

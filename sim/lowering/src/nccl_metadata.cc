// cluster.nccl and cluster.network in a schedule's metadata (nccl_metadata.h).
#include "nccl_metadata.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdint>
#include <optional>
#include <system_error>

namespace shardscope::sim {
namespace {

constexpr std::string_view kAlgo = "nccl.NCCL_ALGO";
constexpr std::string_view kProto = "nccl.NCCL_PROTO";

struct IntKey {
  std::string_view key;
  int64_t min, max;
};

std::optional<int64_t> ParseInt(const std::string& text) {
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

}  // namespace

void WriteNcclMetadata(const ClusterSpec& cluster, std::map<std::string, std::string>& m) {
  const NcclEnv& env = cluster.nccl;
  const NcclEnv defaults;
  m["nccl.version"] = env.version.ToString();
  if (!env.version_source.empty()) m["nccl.version_source"] = env.version_source;
  if (!env.algo.empty()) m[std::string(kAlgo)] = env.algo;
  if (!env.proto.empty()) m[std::string(kProto)] = env.proto;
  if (!env.algo_where.empty()) m["nccl.algo_where"] = env.algo_where;
  // Only what differs from NCCL's defaults, so plans without knobs keep their schedules short.
  if (env.nvls_enable != defaults.nvls_enable) m["nccl.NCCL_NVLS_ENABLE"] = std::to_string(env.nvls_enable);
  if (env.pat_enable != defaults.pat_enable) m["nccl.NCCL_PAT_ENABLE"] = std::to_string(env.pat_enable);
  if (env.min_nchannels != 0) m["nccl.NCCL_MIN_NCHANNELS"] = std::to_string(env.min_nchannels);
  if (env.max_nchannels != 0) m["nccl.NCCL_MAX_NCHANNELS"] = std::to_string(env.max_nchannels);
  if (env.nvls_nchannels != 0) m["nccl.NCCL_NVLS_NCHANNELS"] = std::to_string(env.nvls_nchannels);
  if (env.buffsize != defaults.buffsize) m["nccl.NCCL_BUFFSIZE"] = std::to_string(env.buffsize);
  if (cluster.network.nodes_per_leaf > 0) {
    m["network.nodes_per_leaf"] = std::to_string(cluster.network.nodes_per_leaf);
    m["network.switch_latency_ns"] = std::to_string(cluster.network.switch_latency_ns);
  }
}

Status ReadNcclMetadata(const std::map<std::string, std::string>& m, const std::string& label, ClusterSpec* cluster) {
  NcclEnv env;
  const auto error = [&label](std::string_view key, std::string_view expected, const std::string& got) {
    return Status::InvalidInput(fmt::format("{}: /metadata/{}: expected {}, got \"{}\"", label, key, expected, got));
  };
  if (auto it = m.find("nccl.version"); it != m.end()) {
    const std::optional<NcclVersion> v = ParseNcclVersion(it->second);
    if (!v || *v < kOldestModelledNccl) return error("nccl.version", "an NCCL release 2.minor.patch from 2.7", it->second);
    env.version = *v;
    env.version_source = "nccl.version";
  } else if (auto pt = m.find("training.pytorch_version"); pt != m.end()) {
    // Schedules written before nccl.version existed: the NCCL of their PyTorch release.
    int32_t major = 0, minor = 0;
    const std::string& text = pt->second;
    const auto [p1, ec1] = std::from_chars(text.data(), text.data() + text.size(), major);
    if (ec1 == std::errc() && p1 < text.data() + text.size() && *p1 == '.' &&
        std::from_chars(p1 + 1, text.data() + text.size(), minor).ec == std::errc()) {
      env.version = NcclForPytorch(major, minor);
      env.version_source = fmt::format("PyTorch {}.{}'s wheels (training.pytorch_version)", major, minor);
    }
  }
  if (auto it = m.find("nccl.version_source"); it != m.end()) env.version_source = it->second;
  if (auto it = m.find("nccl.algo_where"); it != m.end()) env.algo_where = it->second;
  for (const auto& [key, text, mask, algo] :
       {std::tuple{kAlgo, &env.algo, &env.algo_enabled, true}, std::tuple{kProto, &env.proto, &env.proto_enabled, false}}) {
    auto it = m.find(std::string(key));
    if (it == m.end()) continue;
    StatusOr<NcclEnableMask> parsed = algo ? ParseNcclAlgoList(it->second, env.version)
                                           : ParseNcclProtoList(it->second, env.version);
    if (!parsed.ok()) return error(key, parsed.status().message(), it->second);
    *text = it->second;
    *mask = *parsed;
  }
  constexpr int64_t kMaxChannels = 1024;
  const IntKey ints[] = {{"nccl.NCCL_NVLS_ENABLE", 0, kNcclAuto},     {"nccl.NCCL_PAT_ENABLE", 0, kNcclAuto},
                         {"nccl.NCCL_MIN_NCHANNELS", 1, kMaxChannels}, {"nccl.NCCL_MAX_NCHANNELS", 1, kMaxChannels},
                         {"nccl.NCCL_NVLS_NCHANNELS", 1, kMaxChannels}, {"nccl.NCCL_BUFFSIZE", 1, int64_t{1} << 40},
                         {"network.nodes_per_leaf", 1, int64_t{1} << 20}, {"network.switch_latency_ns", 0, 1'000'000}};
  int64_t values[std::size(ints)] = {env.nvls_enable, env.pat_enable, 0, 0, 0, env.buffsize, 0, 0};
  for (size_t i = 0; i < std::size(ints); ++i) {
    auto it = m.find(std::string(ints[i].key));
    if (it == m.end()) continue;
    const std::optional<int64_t> v = ParseInt(it->second);
    if (!v || *v < ints[i].min || *v > ints[i].max) {
      return error(ints[i].key, fmt::format("an integer in [{}, {}]", ints[i].min, ints[i].max), it->second);
    }
    values[i] = *v;
  }
  env.nvls_enable = static_cast<int32_t>(values[0]);
  env.pat_enable = static_cast<int32_t>(values[1]);
  env.min_nchannels = static_cast<int32_t>(values[2]);
  env.max_nchannels = static_cast<int32_t>(values[3]);
  env.nvls_nchannels = static_cast<int32_t>(values[4]);
  env.buffsize = values[5];
  cluster->nccl = std::move(env);
  cluster->network = NetworkTiers{static_cast<int32_t>(values[6]), values[7]};
  if ((cluster->network.nodes_per_leaf > 0) != (m.count("network.switch_latency_ns") > 0)) {
    return Status::InvalidInput(fmt::format(
        "{}: /metadata/network.*: network.nodes_per_leaf and network.switch_latency_ns go together", label));
  }
  return Status::Ok();
}

}  // namespace shardscope::sim

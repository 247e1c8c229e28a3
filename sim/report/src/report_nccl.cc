// report.json's "nccl" section (report_nccl.h).
#include "report_nccl.h"

#include <map>
#include <tuple>
#include <variant>

#include "shardscope/sim/models/nccl_model.h"

namespace shardscope::sim {
namespace {

nlohmann::ordered_json OrNull(int64_t value) {
  return value > 0 ? nlohmann::ordered_json(value) : nlohmann::ordered_json(nullptr);
}
nlohmann::ordered_json OrNull(const std::string& text) {
  return text.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(text);
}

}  // namespace

nlohmann::ordered_json NcclReportJson(const traces::Schedule& schedule, const SimulationSetup& setup) {
  const ClusterSpec& cluster = setup.cluster;
  const NcclEnv& env = cluster.nccl;
  const NcclModel model(NcclModelConfig::For(env));
  const NcclTuningTables& tables = model.config().tables;
  nlohmann::ordered_json j;
  j["version"] = env.version.ToString();
  j["version_source"] = OrNull(env.version_source);
  j["tuning_tables"] = {{"release", tables.name}, {"source", tables.source}};
  j["env"] = {{"NCCL_ALGO", OrNull(env.algo)},
              {"NCCL_PROTO", OrNull(env.proto)},
              {"NCCL_NVLS_ENABLE", env.nvls_enable},
              {"NCCL_PAT_ENABLE", env.pat_enable},
              {"NCCL_MIN_NCHANNELS", OrNull(env.min_nchannels)},
              {"NCCL_MAX_NCHANNELS", OrNull(env.max_nchannels)},
              {"NCCL_NVLS_NCHANNELS", OrNull(env.nvls_nchannels)},
              {"NCCL_BUFFSIZE", env.buffsize}};
  j["network"] = nullptr;
  if (cluster.network.nodes_per_leaf > 0) {
    j["network"] = {{"nodes_per_leaf", cluster.network.nodes_per_leaf},
                    {"switch_latency_ns", cluster.network.switch_latency_ns}};
  }
  // Rank 0's collectives, grouped by what NCCL's model makes of them (at full speed, before
  // contention and calibration; the trace's kernel slices carry the same names).
  nlohmann::ordered_json collectives = nlohmann::ordered_json::array();
  if (schedule.world_size() > 0) {
    const traces::Program& program = schedule.ProgramOf(0);
    const traces::RankBinding& binding = schedule.ranks.front();
    using Key = std::tuple<int32_t, traces::CollectiveType, NcclAlgorithm, NcclProtocol, int32_t>;
    struct Sum {
      int64_t count = 0, bytes = 0, time_ns = 0;
    };
    std::map<Key, Sum> groups;
    std::map<int32_t, CommTopology> topologies;
    for (const traces::Op& op : program.ops) {
      const auto* coll = std::get_if<traces::CollectiveOp>(&op.payload);
      if (coll == nullptr || coll->comm < 0 || static_cast<size_t>(coll->comm) >= binding.comm_binding.size()) continue;
      const int32_t comm = binding.comm_binding[static_cast<size_t>(coll->comm)];
      if (comm < 0 || static_cast<size_t>(comm) >= schedule.communicators.size()) continue;
      auto it = topologies.find(comm);
      if (it == topologies.end()) {
        it = topologies.emplace(comm, TopologyOf(cluster, schedule.communicators[static_cast<size_t>(comm)].ranks)).first;
      }
      const CollectiveCost cost = model.Estimate(coll->type, coll->bytes, it->second);
      Sum& sum = groups[Key{comm, coll->type, cost.algorithm, cost.protocol, cost.channels}];
      ++sum.count;
      sum.bytes += coll->bytes;
      sum.time_ns += cost.duration_ns;
    }
    for (const auto& [key, sum] : groups) {
      const auto& [comm, type, algorithm, protocol, channels] = key;
      const CommTopology& t = topologies.at(comm);
      collectives.push_back({{"communicator", schedule.communicators[static_cast<size_t>(comm)].name},
                             {"ranks", t.nranks},
                             {"nodes", t.nnodes},
                             {"type", traces::CollectiveTypeName(type)},
                             {"algorithm", NcclAlgorithmName(algorithm)},
                             {"protocol", NcclProtocolName(protocol)},
                             {"channels", channels},
                             {"count", sum.count},
                             {"bytes", sum.bytes},
                             {"time_ns", sum.time_ns}});
    }
  }
  j["collectives_of_rank_0"] = std::move(collectives);
  return j;
}

}  // namespace shardscope::sim

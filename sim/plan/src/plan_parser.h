// The plan parser that the section files share: PlanParser, the Entry / Fields views of a
// YAML mapping, and the helpers that build messages. Private to sim/plan/.
//
// The parser walks only the keys the schema defines (plan_schema.h), so its depth is bounded
// by the schema whatever the input nests. Every mapping is checked for unknown and duplicate
// keys before any value is read; every scalar is parsed with std::from_chars rather than
// yaml-cpp's as<T>(), so each failure becomes a Status naming the key and the accepted range
// (as<T>() throws a BadConversion that knows neither) and ".inf" / ".nan", which as<double>()
// turns into values, are refused. Quoted scalars are strings, never numbers or booleans. No
// yaml-cpp exception leaves the parser: ParsePlan (plan.cc) catches them all.
//
// One file per part of the plan: plan.cc walks the document (the order in which sections are
// read, the checks across sections); plan_parser.cc reads mappings and scalars for every
// section; plan_<section>.cc reads one section (sim/plan/README.md lists them).
#ifndef SHARDSCOPE_SIM_PLAN_PARSER_H_
#define SHARDSCOPE_SIM_PLAN_PARSER_H_

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "plan_schema.h"
#include "plan_sources.h"  // hf_config, deepspeed_config, torchtitan job_config
#include "shardscope/base/status.h"
#include "shardscope/sim/plan/plan.h"

namespace shardscope::sim::plan_internal {

// ---------------------------------------------------------------------------------------------
// Helpers for messages (plan_parser.cc, templates here).
// ---------------------------------------------------------------------------------------------

std::string JoinPath(std::string_view parent, std::string_view key);

template <typename Range>
std::string JoinNames(const Range& names) {
  std::string out;
  for (const auto& name : names) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

template <typename Enum, size_t N>
std::string EnumNames(const std::array<EnumName<Enum>, N>& table) {
  std::vector<std::string_view> names;
  for (const auto& entry : table) names.push_back(entry.name);
  return JoinNames(names);
}

// A scalar as it appears in a message: quoted, at most 40 characters, control bytes escaped
// (a fuzzed or binary file must not put raw bytes into a terminal).
std::string Quote(std::string_view text);

// yaml-cpp tags a quoted scalar "!" (non-specific) and a plain one "?".
bool IsQuoted(const YAML::Node& node);

// What a node is, for the "got ..." half of a message.
std::string Describe(const YAML::Node& node);

// A YAML 1.2 core-schema boolean, or nothing when the node is something else.
std::optional<bool> AsBool(const YAML::Node& node);

// HYBRID_SHARD or _HYBRID_SHARD_ZERO2: FSDP1 sharding inside a node, replication across nodes.
bool IsHybrid(Fsdp1ShardingStrategy strategy);

template <typename Enum, size_t N>
std::string_view NameOf(const std::array<EnumName<Enum>, N>& table, Enum value) {
  for (const auto& entry : table) {
    if (entry.value == value) return entry.name;
  }
  return "?";
}

// Whether the GPU's tensor cores (or fp32 units) run GEMMs in `dtype`. Hopper runs fp8 even
// where a GPU preset leaves the fp8 rate blank.
bool DTypeSupported(const GpuSpec& gpu, traces::DType dtype);

// The "expected" half of a message about a dtype: the training dtypes the GPU supports.
std::string ExpectedDType(const GpuSpec& gpu);

// ---------------------------------------------------------------------------------------------
// The parser.
// ---------------------------------------------------------------------------------------------

// One key: value pair of a mapping. The key's mark locates errors about null values, whose
// own mark yaml-cpp sets to wherever the next token starts.
struct Entry {
  std::string key;
  YAML::Node key_node;
  YAML::Node value;
};

// The checked keys of one mapping.
struct Fields {
  YAML::Mark mark;
  std::vector<Entry> entries;

  const Entry* Find(std::string_view key) const {
    for (const Entry& entry : entries) {
      if (entry.key == key) return &entry;
    }
    return nullptr;
  }
};

// Parses one plan text. Keeps the source name for messages; holds no other state.
class PlanParser {
 public:
  explicit PlanParser(const std::string& source) : source_(source) {}

  StatusOr<Plan> Parse(std::string_view text);

 private:
  // "<file>:<line>:<column>" (1-based) for a node, falling back to 1:1 for nodes without one.
  std::string Where(const YAML::Mark& mark) const {
    if (mark.is_null() || mark.line < 0 || mark.column < 0) return fmt::format("{}:1:1", source_);
    return fmt::format("{}:{}:{}", source_, mark.line + 1, mark.column + 1);
  }
  YAML::Mark MarkOf(const Entry& entry) const {
    return entry.value.IsNull() ? entry.key_node.Mark() : entry.value.Mark();
  }
  Status Error(const YAML::Mark& mark, std::string_view path, std::string_view expected,
               std::string_view got) const {
    // A value merged in from a framework config file has no mark in the plan: the error
    // points at the file, line and key it came from.
    if (mark.is_null()) {
      if (const std::string* origin = OriginOf(path)) {
        return Status::InvalidInput(
            fmt::format("{}: {}: expected {}, got {}", *origin, path, expected, got));
      }
    }
    return Status::InvalidInput(
        fmt::format("{}: {}: expected {}, got {}", Where(mark), path, expected, got));
  }
  Status Error(const Entry& entry, std::string_view path, std::string_view expected) const {
    return Error(MarkOf(entry), path, expected, Describe(entry.value));
  }

  // ---- mappings and scalars, for every section (plan_parser.cc; enum templates below) ----
  StatusOr<Fields> ReadMapping(const YAML::Node& node, const YAML::Mark& mark,
                               std::string_view path, KeyList allowed) const;
  // ReadMapping, or no fields when the section is absent (`entry` null).
  StatusOr<Fields> SectionFields(const Entry* entry, std::string_view path,
                                 KeyList allowed) const;
  // An error about a key that does not apply in this combination: located at the key.
  Status KeyError(const Entry& entry, std::string_view path, std::string_view expected,
                  std::string_view got) const;
  Status Require(const Fields& fields, std::string_view parent, std::string_view key,
                 std::string_view expected) const;

  Status ReadInt(const Entry& entry, std::string_view path, int64_t min, int64_t max,
                 int64_t* out) const;
  Status ReadInt32(const Entry& entry, std::string_view path, int64_t min, int64_t max,
                   int32_t* out) const;
  // A finite number in (min, max] (exclusive_min) or [min, max].
  Status ReadNumber(const Entry& entry, std::string_view path, double min, bool exclusive_min,
                    double max, double* out) const;
  Status ReadBool(const Entry& entry, std::string_view path, bool* out) const;
  Status ReadString(const Entry& entry, std::string_view path, std::string_view expected,
                    std::string* out) const;
  template <typename Enum, size_t N>
  Status ReadEnum(const Entry& entry, std::string_view path,
                  const std::array<EnumName<Enum>, N>& table, Enum* out) const;

  // ReadEnum that also accepts null (Python's None), reported through `is_null`.
  template <typename Enum, size_t N>
  Status ReadEnumOrNull(const Entry& entry, std::string_view path,
                        const std::array<EnumName<Enum>, N>& table, Enum* out,
                        bool* is_null) const;

  // ---- the sections, each in its plan_<section>.cc; strategy: in plan.cc ----
  Status ReadStrategy(const Entry& entry, Strategy* out) const;
  Status ReadModel(const Entry& entry, ModelSpec* out) const;
  Status ReadModelFields(const Fields& fields, ModelSpec* model, bool* modified) const;
  Status ReadCluster(const Entry& entry, ClusterSpec* cluster, ContentionConfig* contention) const;
  // cluster.network: the leaf/spine tiers.
  Status ReadNetwork(const Entry& entry, NetworkTiers* out) const;
  // cluster.nccl, read after training: the release (the plan's, or the one PyTorch's wheels of
  // training.pytorch_version bundle) decides which NCCL_ALGO / NCCL_PROTO names exist.
  // `cluster` may be null or a preset name (then only the default is resolved).
  Status ResolveNccl(const Entry* cluster, Plan* plan) const;
  // cluster.calibration: the profile path, resolved and read (its GPU must be the cluster's);
  // the fitted launch cost and contention factors go into `plan`.
  Status ReadCalibration(const Entry& entry, Plan* plan) const;
  // Also says whether the dtype was given, and where seq_len is (for later checks).
  Status ReadTraining(const Entry& entry, const GpuSpec& gpu, TrainingConfig* out,
                      bool* dtype_given, YAML::Mark* seq_len_mark, YAML::Mark* dtype_mark,
                      YAML::Mark* kernels_mark) const;
  // training.kernels from the PyTorch version, the framework code, the GPU and the knobs.
  Status ResolveKernelChoices(const YAML::Mark& mark, Plan* plan) const;
  // training.cuda_version's default and the init setup's checks across sections (plan_init.cc),
  // after the strategy sections. `strategy_section` is the strategy's own section, if given.
  Status ResolveInit(const Entry* training, const Entry* strategy_section, Plan* plan) const;
  // Strategy sections read after model, cluster and training: their checks need the world
  // size, the layer and expert counts and the training dtype from `plan`.
  // `entry` null: the section is absent and only the defaults are resolved.
  Status ReadFsdp2(const Entry* entry, const Plan& plan, Fsdp2Config* out) const;
  Status ReadFsdp1(const Entry* entry, const Plan& plan, Fsdp1Config* out) const;
  Status ReadZero(const Entry* entry, const Plan& plan, ZeroConfig* out) const;
  Status ReadDdp(const Entry& entry, DdpConfig* out) const;
  Status ReadMoe(const Entry& entry, const Plan& plan, MoeConfig* out) const;
  Status ReadCheckpoint(const Entry& entry, const Plan& plan, CheckpointConfig* out) const;

  // MixedPrecisionPolicy / MixedPrecision: the resolved param and reduce dtypes (`entry` may
  // be null: the defaults).
  Status ReadMixedPrecision(const Entry* entry, std::string_view path, const Plan& plan,
                            traces::DType* param_dtype, traces::DType* reduce_dtype) const;
  // {replicate, shard}, either may be omitted; replicate x shard must be the world size.
  Status ReadMesh(const Entry& entry, std::string_view path, int32_t world_size,
                  DataParallelMesh* out) const;
  // A count of units ahead, or a mapping unit -> [units] (FSDP2 explicit prefetch).
  Status ReadPrefetch(const Entry& entry, std::string_view path, std::string_view method,
                      const Fsdp2Config& wrap, int32_t layers, int32_t* count,
                      std::map<std::string, std::vector<std::string>>* units) const;
  Status CheckUnitName(const YAML::Node& node, std::string_view path, std::string_view method,
                       const Fsdp2Config& wrap, int32_t layers) const;
  // A whole number of elements: an integer, or a float such as 5e8 with no fractional part
  // (DeepSpeed configs write sizes that way; pydantic turns them into ints).
  Status ReadElementCount(const Entry& entry, std::string_view path, int64_t min,
                          int64_t* out) const;
  Status ReadHost(const Entry& entry, HostConfig* out) const;
  Status ReadHostField(const Fields& fields, std::string_view key, int64_t* out_ns) const;
  Status ReadAllocator(const Entry& entry, int32_t world_size, MemoryPlan* out) const;
  Status ReadOom(const Entry& entry, const Plan& plan, OomConfig* out) const;
  // Refuses a plan whose GPU leaves the allocator nothing on some rank (memory less the CUDA
  // context and what other processes hold), naming the keys: it could only run out of memory
  // at its first allocation. `allocator` may be null (no allocator section).
  // The top-level expect: section (plan_expect.cc): checked, not kept.
  Status ReadExpect(const Entry& entry, int32_t world_size) const;
  Status CheckDeviceCapacity(const Entry& cluster, const Entry* allocator, const Plan& plan) const;

  // ---- the document (plan.cc) and its divergence (plan_divergence.cc) ----
  // The plan of an already loaded YAML document (Parse minus the text checks).
  StatusOr<Plan> ParseRoot(const YAML::Node& root, const std::string& text) const;
  // divergence: slowdowns, and the variants (seq_len, moe_load, overrides) each re-read from
  // `text` with the variant's keys merged in, so every check of a plan applies to them too.
  Status ReadDivergence(const Entry& entry, const std::string& text, Plan* plan) const;
  // A mapping rank -> number in (min, max]; ranks below the world size.
  Status ReadRankNumbers(const Entry& entry, std::string_view path, int32_t world_size, double min,
                         double max, std::vector<std::pair<int32_t, Entry>>* out) const;

  // ---- framework config files (read by plan_sources.h, merged in plan_sources_merge.cc) ----
  // What the config files leave for later: values that need the model or the world size.
  struct PendingSources {
    bool deepspeed = false;
    DeepSpeedSettings deepspeed_settings;
    std::vector<PlanSetting> auto_sizes;  // zero.* "auto": HF fills them from model.hidden
    std::string deepspeed_file;
    bool torchtitan = false;
    TorchtitanSettings torchtitan_settings;
    int64_t sliding_window = 0;  // hf_config: seq_len must stay within it
    std::string sliding_window_origin;
  };
  // Reads the files the plan names (model.hf_config, zero.deepspeed_config,
  // torchtitan.job_config) and merges their settings into `root`, before anything is read.
  StatusOr<PendingSources> ReadSources(YAML::Node root) const;
  // After the model and the cluster are read: the DeepSpeed batch and "auto" sizes, the
  // torchtitan gradient accumulation.
  Status ApplyPendingSources(const PendingSources& pending, YAML::Node root,
                             const Plan& plan) const;
  // Sets `setting` in `root`. Where the plan already has the key: the plan wins (`plan_wins`,
  // hf_config's rule) or a different value is an error naming both places.
  Status MergeSetting(YAML::Node root, const PlanSetting& setting, bool plan_wins) const;
  // A config file's text, its path resolved against the plan's folder.
  StatusOr<std::string> ReadSourceFile(const Entry& entry, std::string_view path,
                                       std::string_view what, std::string* resolved) const;
  // The origin of a merged value at `path` (or the section holding it, or a value in it).
  const std::string* OriginOf(std::string_view path) const;

  const std::string& source_;
  // Plan key path -> "file:line:column (key)" of the values merged from config files.
  mutable std::map<std::string, std::string, std::less<>> origins_;
};

template <typename Enum, size_t N>
Status PlanParser::ReadEnum(const Entry& entry, std::string_view path,
                            const std::array<EnumName<Enum>, N>& table, Enum* out) const {
  if (entry.value.IsScalar()) {
    for (const auto& candidate : table) {
      if (candidate.name == entry.value.Scalar()) {
        *out = candidate.value;
        return Status::Ok();
      }
    }
  }
  return Error(entry, path, fmt::format("one of {}", EnumNames(table)));
}

template <typename Enum, size_t N>
Status PlanParser::ReadEnumOrNull(const Entry& entry, std::string_view path,
                                  const std::array<EnumName<Enum>, N>& table, Enum* out,
                                  bool* is_null) const {
  *is_null = entry.value.IsNull();
  if (*is_null) return Status::Ok();
  if (entry.value.IsScalar()) {
    for (const auto& candidate : table) {
      if (candidate.name == entry.value.Scalar()) {
        *out = candidate.value;
        return Status::Ok();
      }
    }
  }
  return Error(entry, path, fmt::format("one of {} or null", EnumNames(table)));
}

}  // namespace shardscope::sim::plan_internal

#endif  // SHARDSCOPE_SIM_PLAN_PARSER_H_

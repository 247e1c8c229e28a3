// The candidates of a search: the knobs each one sets (in a fixed order) and the plan text it
// is, the input plan's YAML with those keys changed.
#ifndef SHARDSCOPE_SIM_TUNE_SRC_TUNE_CANDIDATES_H_
#define SHARDSCOPE_SIM_TUNE_SRC_TUNE_CANDIDATES_H_

#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "shardscope/base/status.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/sim/tune/tune.h"

namespace shardscope::sim::tune_internal {

// The search as the input plan sets it up: its YAML, the parsed plan, and what stays fixed.
struct SearchBase {
  std::string path;
  YAML::Node yaml;              // the plan file as written
  Plan plan;                    // as loaded
  int32_t gpus = 0;
  int32_t nodes = 0, gpus_per_node = 0;  // the cluster for `gpus`
  int64_t global_batch = 0;     // sequences per step
  int64_t per_rank_batch = 0;   // sequences per rank per step
};

// Reads the plan and checks what the search needs of it: InvalidInput naming the file or the
// option (a plan whose strategy or batch comes from a DeepSpeed or torchtitan config, a GPU
// count the nodes cannot hold, a global batch the GPUs cannot split).
StatusOr<SearchBase> LoadSearchBase(const std::string& path, const TuneOptions& options);
// The same for a plan's text (`path` names it in messages and anchors its relative paths).
StatusOr<SearchBase> SearchBaseOf(std::string_view text, const std::string& path, const TuneOptions& options);

// Every candidate's knobs, in the order the search enumerates them (strategy, mesh, reshard,
// prefetch, buckets, micro-batch, checkpointing, compile; the plan's own setting where a knob
// is not searched).
std::vector<TuneKnobs> EnumerateKnobs(const SearchBase& base, const TuneSpace& space, int64_t max_micro_batch);

// The plan text of one candidate (no comments: yaml-cpp keeps none).
std::string CandidateYaml(const SearchBase& base, const TuneKnobs& knobs);

// "fsdp2 1x1024 · reshard · prefetch 0/1 · 1 block/unit · mbs 1x1 · ac full · eager" and the
// family ("fsdp2", "fsdp2 HSDP 4x256", "fsdp1 HYBRID_SHARD", "zero3", "ddp").
std::string KnobsLabel(const TuneKnobs& knobs, int32_t gpus);
std::string KnobsFamily(const TuneKnobs& knobs, int32_t gpus);

}  // namespace shardscope::sim::tune_internal

#endif  // SHARDSCOPE_SIM_TUNE_SRC_TUNE_CANDIDATES_H_

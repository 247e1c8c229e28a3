// The plan file: what a user's training job does, in YAML.
//
//   model: llama3-8b                      # a preset, or a mapping of dimensions
//   cluster: {preset: dgx-a100, nodes: 8} # optional overrides of any hardware figure
//   strategy: fsdp2                       # fsdp2 | ddp (more strategies in later issues)
//   training: {seq_len: 8192, micro_batch_size: 1, grad_accum_steps: 1,
//              activation_checkpointing: none, dtype: bf16}
//   fsdp2: {reshard_after_forward: true}  # one section per strategy, framework knob names
//   ddp: {bucket_cap_mb: 25}
//   host: {launch_overhead_us: ..., hook_overhead_us: ...}
//
// Unknown keys, wrong types and impossible values are errors naming the file, line, key and
// what was expected.
#ifndef SHARDSCOPE_SIM_PLAN_H_
#define SHARDSCOPE_SIM_PLAN_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "shardscope/sim/caching_allocator.h"
#include "shardscope/sim/hardware.h"
#include "shardscope/sim/model.h"
#include "shardscope/traces/schedule.h"
#include "shardscope/traces/status.h"

namespace shardscope::sim {

enum class Strategy : uint8_t { kFsdp2, kDdp };
std::string_view StrategyName(Strategy strategy);  // "fsdp2", "ddp"

enum class ActivationCheckpointing : uint8_t { kNone, kFull };

struct TrainingConfig {
  int64_t seq_len = 2048;
  int64_t micro_batch_size = 1;
  int32_t grad_accum_steps = 1;
  ActivationCheckpointing activation_checkpointing = ActivationCheckpointing::kNone;
  traces::DType dtype = traces::DType::kBFloat16;
};

// torch.distributed.fsdp.fully_shard knobs (the names fully_shard uses).
struct Fsdp2Config {
  bool reshard_after_forward = true;
};

// torch.nn.parallel.DistributedDataParallel knobs.
struct DdpConfig {
  double bucket_cap_mb = 25;        // kDefaultBucketBytesCap (torch/nn/parallel/distributed.py)
  double first_bucket_mb = 1;       // dist._DEFAULT_FIRST_BUCKET_BYTES
};

// Host-side costs the engine charges (defaults and their sources in plan.cc).
struct HostConfig {
  int64_t launch_overhead_ns = 0;   // CPU time of one kernel / collective / memcpy launch
  int64_t hook_overhead_ns = 0;     // CPU time of one framework hook (pre/post forward ...)
  int64_t python_op_overhead_ns = 0;// Python + dispatcher time per framework op
  int32_t max_queued_launches_per_stream = 0;  // launches a stream queues before the host blocks
  int64_t cuda_malloc_ns = 0;       // host time of one cudaMalloc (a new allocator segment)
  int64_t cuda_free_ns = 0;         // host time of one cudaFree (releasing a cached segment)
};

// How concurrent compute and communication kernels slow each other down on one GPU.
struct ContentionConfig {
  double compute_slowdown = 0;      // compute runs at 1/(1+x) while a collective runs
  double comm_slowdown = 0;         // collectives run at 1/(1+x) while compute runs
};

// The CUDA caching allocator the job runs with, and what else holds device memory.
//   allocator: {conf: "expandable_segments:True", memory_fraction: 1.0,
//               memory_reserved_by_others_gb: 0.5,
//               memory_reserved_by_others_gb_per_rank: {3: 12.0}}
struct MemoryPlan {
  std::string alloc_conf;                 // PYTORCH_CUDA_ALLOC_CONF
  AllocatorConfig allocator;              // parsed from alloc_conf, plus memory_fraction
  int64_t reserved_by_others_bytes = 0;   // device memory other processes hold, every rank
  std::map<int32_t, int64_t> reserved_by_others_per_rank;  // overrides for some ranks
};

struct Plan {
  std::string source;               // file the plan came from (for messages)
  ModelSpec model;
  ClusterSpec cluster;
  ContentionConfig contention;
  Strategy strategy = Strategy::kFsdp2;
  TrainingConfig training;
  Fsdp2Config fsdp2;
  DdpConfig ddp;
  HostConfig host;
  MemoryPlan memory;
};

// Defaults with their sources (also used when a schedule JSON carries no host section).
HostConfig DefaultHostConfig();
ContentionConfig DefaultContentionConfig();

StatusOr<Plan> LoadPlanFile(const std::string& path);
// `source` names the text in messages (a path, or "<string>").
StatusOr<Plan> ParsePlan(std::string_view yaml_text, const std::string& source);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_PLAN_H_

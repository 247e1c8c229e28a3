// `shardscope tune`: the fastest plan for a cluster that fits, never retries an allocation and
// passes the check, found by simulating the candidates a search space spans.
//
// The candidates are the input plan with its strategy and knobs changed (strategy and its
// section, HSDP meshes, resharding, prefetch, bucket sizes, micro-batch size with gradient
// accumulation at the plan's global batch, activation checkpointing, torch.compile), each a
// plan text that `simulate` reads as it is. Before a candidate is simulated it is held to two
// closed-form bounds (tune_bounds.h): the memory every rank must hold at the end of the forward
// pass (model states as the strategy partitions them, plus the activations autograd saves at
// the least) against the GPU's usable capacity, and its FLOPs at the GPU's datasheet peak
// against the candidates already simulated (a candidate that cannot be among the `top` fastest
// nor on the Pareto front is not simulated). A candidate is kept when its simulation completes
// with no rank out of memory (the init phase included), no allocator retry on any rank, and
// the check's memory fault (another process holding `held_bytes` on one rank's GPU) leaves it
// safe.
//
// Deterministic: candidates are simulated in batches of kTuneBatch in order of their time
// bound, and a batch's pruning reads only the batches before it, so the result is the same on
// any number of threads and processes.
//
//   TuneOptions options;
//   options.gpus = 1024;
//   SHARDSCOPE_ASSIGN_OR_RETURN(TuneResult result, Tune("plan.yaml", options));
//   std::cout << TuneText(result, options);
#ifndef SHARDSCOPE_SIM_TUNE_TUNE_H_
#define SHARDSCOPE_SIM_TUNE_TUNE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "shardscope/base/status.h"

namespace shardscope::sim {

// The knobs a search may change (`--search`, comma-separated names).
struct TuneSpace {
  bool strategy = true;      // "strategy": fsdp2, fsdp1, zero1, zero2, zero3, ddp
  bool mesh = true;          // "mesh": HSDP shard groups of 1, 2, 4, ... nodes (fsdp2 mesh, fsdp1 HYBRID_SHARD)
  bool reshard = true;       // "reshard": fsdp2 reshard_after_forward, fsdp1 FULL_SHARD / SHARD_GRAD_OP
  bool prefetch = true;      // "prefetch": fsdp2 forward/backward prefetch, fsdp1 backward_prefetch
  bool buckets = true;       // "buckets": ddp bucket_cap_mb, ZeRO bucket sizes, fsdp2 blocks_per_unit
  bool micro_batch = true;   // "micro_batch": micro_batch_size x grad_accum_steps at the global batch
  bool checkpointing = true; // "ac": none, selective_op, selective every 2nd block, full
  bool compile = true;       // "compile": torch.compile off and on
};
// "strategy,mesh,ac" (or "all"); InvalidInput naming the unknown name and the known ones.
StatusOr<TuneSpace> ParseTuneSpace(const std::string& text);

// What a candidate is, in the plan's terms.
struct TuneKnobs {
  std::string strategy;                 // "fsdp2", ...
  int32_t replicate = 1;                // HSDP replicas (1: full shard)
  bool reshard = true;                  // fsdp2 reshard_after_forward / fsdp1 FULL_SHARD
  std::string fsdp1_sharding;           // fsdp1: the ShardingStrategy name
  int32_t forward_prefetch = 0;         // fsdp2 units, fsdp1 0/1
  int32_t backward_prefetch = 1;        // fsdp2 units; fsdp1 0 = BACKWARD_PRE, 1 = BACKWARD_POST
  double bucket = 0;                    // ddp MB, ZeRO elements, fsdp2 blocks_per_unit (0: the plan's)
  int64_t micro_batch_size = 1;
  int32_t grad_accum_steps = 1;
  std::string checkpointing;            // "none", "selective_op", "selective", "full"
  bool compile = false;
};

enum class TuneVerdict : uint8_t {
  kKept,       // simulated: completes, fits, no retries, passes the check
  kOutOfMemory,// simulated: some rank runs out of memory (in the step or the init phase)
  kRetries,    // simulated: fits only by freeing the allocator's cache and retrying
  kHangs,      // simulated: the step does not complete
  kCheck,      // simulated: fits, but the check's memory fault makes it hang
  kBound,      // not simulated: its memory bound exceeds the GPU
  kDominated,  // not simulated: its time bound puts it behind the top and off the Pareto front
  kInvalid,    // the loader refuses the combination (its message says why)
  kBudget,     // not simulated: the budget ran out first
};
std::string_view TuneVerdictName(TuneVerdict verdict);  // "kept", "out_of_memory", ...

struct TuneCandidate {
  int32_t index = 0;                    // in enumeration order
  TuneKnobs knobs;
  std::string label;                    // "fsdp2 · shard 1024 · reshard · prefetch 0/1 · mbs 1x1 · ac full"
  std::string family;                   // "fsdp2", "fsdp2 HSDP 4x256", "fsdp1 HYBRID_SHARD", "zero3", ...
  std::string plan_yaml;                // the candidate as a plan `simulate` reads
  int64_t memory_bound_bytes = 0;       // closed-form lower bounds (tune_bounds.h)
  int64_t time_bound_ns = 0;
  TuneVerdict verdict = TuneVerdict::kBudget;
  std::string why;                      // for every verdict but kKept: the reason in a line
  // Simulated:
  int64_t step_ns = 0;
  double tokens_per_second_per_gpu = 0;
  double mfu = 0;                       // under the framework's convention (`mfu_convention`)
  std::string mfu_convention;           // "torchtitan" (fsdp2), "llm_foundry" (fsdp1), "deepspeed" (ZeRO), "megatron" (ddp)
  int64_t peak_reserved_bytes = 0;      // max over ranks
  int64_t capacity_bytes = 0;           // the allocator's, min over ranks
  int64_t exposed_comm_ns = 0;          // mean over ranks
  int32_t simulated_ranks = 0;          // ranks the engine ran (one per class of identical ranks)
};

// A collective over the processes of `mpirun -np K shardscope tune`: every process passes its
// text and gets every process's, in process order. Absent: one process.
struct TuneProcesses {
  int32_t rank = 0;
  int32_t size = 1;
  std::function<StatusOr<std::vector<std::string>>(const std::string& mine)> all_gather;
};

// Candidates simulated between two pruning decisions (and split over processes).
inline constexpr int kTuneBatch = 32;

struct TuneOptions {
  int32_t gpus = 0;                     // the world to plan for (required)
  int64_t global_batch = 0;             // sequences per step; 0: the plan's (micro x accum x its world)
  TuneSpace space;
  int64_t max_simulations = 0;          // `--budget N`: at most N simulated; 0: no limit
  double max_seconds = 0;               // `--budget 60s`: no batch starts after this; 0: no limit
  int threads = 0;                      // 0: one per hardware thread
  int top = 10;                         // rows of the ranking (and the pruning's horizon)
  int64_t held_bytes = int64_t{1} << 30;// the check's memory fault (0: no check)
  int64_t max_micro_batch = 64;         // largest micro-batch size tried
  TuneProcesses processes;
  // Called after each batch with the candidates settled so far and the total (progress bars).
  std::function<void(size_t settled, size_t total)> progress;
};

struct TuneResult {
  std::string plan_path;
  int32_t gpus = 0;
  int64_t global_batch = 0;
  std::vector<TuneCandidate> candidates;  // every candidate, in enumeration order
  std::vector<int32_t> ranking;           // kept candidates, fastest first (ties: less memory, index)
  std::vector<int32_t> pareto;            // kept, not beaten on both step time and peak reserved; fastest first
  int64_t simulated = 0;
  bool budget_ran_out = false;
  double seconds = 0;                     // wall time of the search (not in ranking.json)
};

StatusOr<TuneResult> Tune(const std::string& plan_path, const TuneOptions& options);

// The ranked table, the Pareto front and why each rejected family was rejected.
std::string TuneText(const TuneResult& result, const TuneOptions& options);
// ranking.json: the search, every candidate's knobs, bounds, verdict and figures (docs/TUNE.md).
std::string TuneRankingJson(const TuneResult& result);
// best.yaml for a folder `out_dir`: the fastest kept candidate with a header saying what it is
// and paths the plan names (hf_config, calibration) made relative to `out_dir`. Empty when
// nothing was kept.
std::string TuneBestPlanYaml(const TuneResult& result, const std::string& out_dir);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_TUNE_TUNE_H_

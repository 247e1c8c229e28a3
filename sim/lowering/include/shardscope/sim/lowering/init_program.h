// The device allocations of a job before its first step: how each framework brings the model
// onto the GPU (the whole model materialized, or only shards) and builds its optimizer states.
// A short program of allocations, frees and collectives over the model's parameter tensors,
// one phase after another, some repeated per wrapped unit. The lowering builds it from the plan
// (InitProgramOf) and writes it into the schedule's metadata; the simulation runs it through the
// caching allocator before the step (simulate/init_phase.h).
#ifndef SHARDSCOPE_SIM_LOWERING_INIT_PROGRAM_H_
#define SHARDSCOPE_SIM_LOWERING_INIT_PROGRAM_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "shardscope/base/status.h"
#include "shardscope/sim/plan/plan.h"

namespace shardscope::sim {

enum class InitOpKind : uint8_t {
  kAllocEach,   // one tensor per parameter of the scope
  kAllocFlat,   // one tensor for all parameters of the scope
  kFree,        // free the scope's tensors of `group`
  kCollective,  // the first collective on `slot`: its NCCL communicator (and buffers) exist from here
};

// What an op does in the framework, for reports: its text names the framework call.
enum class InitWhat : uint8_t {
  kModelToGpu,        // the whole model moved to the GPU in its build dtype
  kModelBuiltOnGpu,   // the model built on the GPU
  kModelHalf,         // module.half() / .bfloat16() on the GPU
  kBroadcast,         // rank 0's parameters broadcast
  kBroadcastBucket,   // DDP's coalesced broadcast bucket
  kUnitToGpu,         // one wrapped unit moved to (or materialized on) the GPU
  kFlatten,           // FSDP1 flattens a unit's parameters
  kShard,             // FSDP shards them
  kShardMaterialized, // FSDP2's sharded parameters materialized (model.to_empty)
  kZeroInitParam,     // deepspeed.zero.Init builds a module's parameters on the GPU
  kPartition,         // ZeRO-3 partitions each parameter
  kFlatPartitions,    // ZeRO flattens its partitions into contiguous buffers
  kFlatParams,        // ZeRO-1/2 flattens the 16-bit parameters (via the CPU)
  kFp32Master,        // ZeRO's fp32 master partition
  kGradPartition,     // ZeRO's fp32 gradient partition for the optimizer's first step
  kOptimizerStates,   // Adam's exp_avg and exp_avg_sq
  kRelease,           // frees (no allocation)
};
std::string_view InitWhatText(InitWhat what);  // "deepspeed.initialize: module.half(), module.to(device)"
std::string_view InitWhatName(InitWhat what);  // the metadata token, "model_half"

struct InitOp {
  InitOpKind kind = InitOpKind::kAllocEach;
  std::string group;           // the tensors' name; per-unit ops keep one group per unit
  int32_t element_bytes = 4;
  // Bytes of a tensor of n elements: ceil(n / divide) x multiply x element_bytes, at most
  // cap_bytes when cap_bytes > 0 (a bucket). divide = W, multiply = 1: a shard or partition;
  // divide = multiply = W: the padded full size.
  int32_t divide = 1;
  int32_t multiply = 1;
  int64_t cap_bytes = 0;
  std::string slot;            // kCollective: the communicator slot (lowering's names)
  InitWhat what = InitWhat::kRelease;
};

struct InitPhase {
  bool per_unit = false;       // run the ops once per unit, in unit order; else once for all
  std::vector<InitOp> ops;
};

// Units are the modules the framework wraps (embed, layers.i, head), each a list of parameter
// element counts.
struct InitProgram {
  std::string framework;                      // "DeepSpeed ZeRO-3", ...
  std::vector<std::vector<int64_t>> units;
  std::vector<InitPhase> phases;
  bool empty() const { return phases.empty(); }
};

// The init program of `plan` (framework sources cited in init_program.cc).
InitProgram InitProgramOf(const Plan& plan);

// Metadata keys "init.framework", "init.units" (run-length: "30*n1,n2;1*n3"), "init.phases",
// "init.phase.<i>" ("unit:" or "all:" then ops "kind group bytes divide multiply cap slot what",
// ';'-separated). Nothing is written for an empty program.
void WriteInitProgram(const InitProgram& program, std::map<std::string, std::string>& metadata);
// An empty program when the metadata has none; InvalidInput naming the key on a malformed one.
StatusOr<InitProgram> ReadInitProgram(const std::map<std::string, std::string>& metadata, const std::string& label);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_LOWERING_INIT_PROGRAM_H_

// The init program of each framework (init_program.h): the allocations its constructors and
// deepspeed.initialize make before the first step, from the framework sources cited per phase,
// and its metadata form.
#include "shardscope/sim/lowering/init_program.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lowering_internal.h"

namespace shardscope::sim {
namespace {

constexpr int32_t kFp32Bytes = 4;
// DistributedDataParallel._sync_module_states -> _sync_params_and_buffers ->
// dist._broadcast_coalesced(..., broadcast_bucket_size=int(250 * 1024 * 1024), ...)
// (torch/nn/parallel/distributed.py _DEFAULT_BROADCAST... the 250 MiB bucket): the flattened
// bucket is a device tensor for the duration of the broadcast.
constexpr int64_t kDdpBroadcastBucketBytes = int64_t{250} << 20;

struct WhatRow {
  InitWhat what;
  std::string_view name;
  std::string_view text;
};
constexpr std::array<WhatRow, 17> kWhat = {{
    {InitWhat::kModelToGpu, "model_to_gpu", "the whole model moved to the GPU (model.to(device))"},
    {InitWhat::kModelBuiltOnGpu, "model_built_on_gpu", "the whole model built on the GPU (training.init.device: cuda)"},
    {InitWhat::kModelHalf, "model_half",
     "deepspeed.initialize: module.half() / .bfloat16(), module.to(device) (engine._configure_distributed_model)"},
    {InitWhat::kBroadcast, "broadcast", "rank 0's parameters broadcast (the first NCCL collective)"},
    {InitWhat::kBroadcastBucket, "broadcast_bucket", "DDP's 250 MiB coalesced broadcast bucket (_sync_module_states)"},
    {InitWhat::kUnitToGpu, "unit_to_gpu", "one wrapped unit's parameters on the GPU before flattening"},
    {InitWhat::kFlatten, "flatten", "FSDP flattens the unit's parameters (FlatParamHandle.flatten_tensors)"},
    {InitWhat::kShard, "shard", "FSDP keeps the rank's shard (FlatParamHandle.shard / FSDPParam)"},
    {InitWhat::kShardMaterialized, "shard_materialized",
     "sharded parameters materialized on the GPU (fully_shard on the meta device, model.to_empty)"},
    {InitWhat::kZeroInitParam, "zero_init_param",
     "deepspeed.zero.Init builds a module's parameters on the GPU, broadcasts and partitions them"},
    {InitWhat::kPartition, "partition", "ZeRO-3 partitions each parameter (Init(module=...), param.partition())"},
    {InitWhat::kFlatPartitions, "flat_partitions",
     "ZeRO-3 copies the partitions into contiguous buffers (_create_fp16_partitions_with_defragmentation)"},
    {InitWhat::kFlatParams, "flat_params",
     "ZeRO-1/2 flattens the 16-bit parameters, moved to the CPU first (stage_1_and_2.py __init__)"},
    {InitWhat::kFp32Master, "fp32_master", "ZeRO's fp32 master partition (.clone().float())"},
    {InitWhat::kGradPartition, "grad_partition",
     "ZeRO's zero fp32 gradient partition for the optimizer's first step (initialize_optimizer_states)"},
    {InitWhat::kOptimizerStates, "optimizer_states", "Adam's exp_avg and exp_avg_sq (initialize_optimizer_states)"},
    {InitWhat::kRelease, "release", "tensors freed"},
}};

InitOp AllocEach(std::string group, int32_t bytes, int32_t divide, InitWhat what) {
  return {InitOpKind::kAllocEach, std::move(group), bytes, divide, 1, 0, "", what};
}
InitOp AllocFlat(std::string group, int32_t bytes, int32_t divide, int32_t multiply, InitWhat what) {
  return {InitOpKind::kAllocFlat, std::move(group), bytes, divide, multiply, 0, "", what};
}
InitOp Free(std::string group) { return {InitOpKind::kFree, std::move(group), 0, 1, 1, 0, "", InitWhat::kRelease}; }
InitOp Collective(std::string slot) { return {InitOpKind::kCollective, "", 0, 1, 1, 0, std::move(slot), InitWhat::kBroadcast}; }

int32_t DtypeBytes(traces::DType dtype) { return static_cast<int32_t>(traces::DTypeSize(dtype)); }

// DistributedDataParallel: the user moves the module to its device (DDP requires it:
// "device_ids ... module must be on a single device"), DDP.__init__ broadcasts rank 0's state
// (_sync_module_states) through a 250 MiB coalesced bucket. The reducer's gradient buckets are
// the step's (lowering_ddp.cc).
void Ddp(const Plan& plan, InitProgram& p) {
  const int32_t bytes = plan.training.precision == Precision::kPureBf16 ? 2 : kFp32Bytes;
  const InitWhat where = InitDeviceOf(plan) == InitDevice::kCuda ? InitWhat::kModelBuiltOnGpu : InitWhat::kModelToGpu;
  InitOp bucket = AllocFlat("broadcast_bucket", bytes, 1, 1, InitWhat::kBroadcastBucket);
  bucket.cap_bytes = kDdpBroadcastBucketBytes;
  p.framework = "DistributedDataParallel";
  p.phases.push_back({false, {AllocEach("module", bytes, 1, where), Collective(kCommWorld), bucket,
                              Free("broadcast_bucket")}});
}

// torch FSDP1 (torch/distributed/fsdp/_init_utils.py): units are wrapped children first, each
// FullyShardedDataParallel.__init__ moving its unit to device_id (_move_module_to_device),
// broadcasting it with sync_module_states (_sync_module_params_and_buffers), flattening
// (FlatParamHandle: flatten_tensors copies the parameters into one FlatParameter, the originals
// become views) and sharding (FlatParamHandle.shard: the rank's chunk cloned, the flat storage
// freed). Without device_id a CPU module is flattened and sharded on the CPU and only the shard
// reaches the GPU (the warning in _move_module_to_device; ESTIMATE of where the move happens).
void Fsdp1(const Plan& plan, InitProgram& p) {
  const Fsdp1Config& f = plan.fsdp1;
  const DataParallelMesh mesh = MeshOf(plan);
  const bool hybrid = f.sharding_strategy == Fsdp1ShardingStrategy::kHybridShard ||
                      f.sharding_strategy == Fsdp1ShardingStrategy::kHybridShardZero2;
  const int32_t w = f.sharding_strategy == Fsdp1ShardingStrategy::kNoShard ? 1
                    : hybrid                                             ? mesh.shard
                                                                         : plan.cluster.world_size();
  const std::string slot = hybrid ? kCommShard : kCommWorld;
  const InitDevice device = InitDeviceOf(plan);
  p.framework = f.implementation == Fsdp1Implementation::kFairscale ? "fairscale FSDP" : "FSDP1";
  if (device == InitDevice::kCpu && !f.device_id) {
    p.phases.push_back({true, {AllocFlat("shard", kFp32Bytes, w, 1, InitWhat::kShard)}});
    return;
  }
  std::vector<InitOp> unit;
  if (device == InitDevice::kCuda) {
    p.phases.push_back({false, {AllocEach("module", kFp32Bytes, 1, InitWhat::kModelBuiltOnGpu)}});
  } else {
    unit.push_back(AllocEach("module", kFp32Bytes, 1, InitWhat::kUnitToGpu));
  }
  if (f.sync_module_states) unit.push_back(Collective(slot));
  unit.push_back(AllocFlat("flat", kFp32Bytes, 1, 1, InitWhat::kFlatten));
  unit.push_back(Free("module"));
  unit.push_back(AllocFlat("shard", kFp32Bytes, w, 1, InitWhat::kShard));
  unit.push_back(Free("flat"));
  p.phases.push_back({true, std::move(unit)});
}

// FSDP2 (torch/distributed/fsdp/_fully_shard/_fsdp_param.py FSDPParam._init_sharded_param): each
// parameter is chunked on dim 0 and the rank's chunk becomes the sharded DTensor's local tensor.
// torchtitan builds on the meta device and calls model.to_empty(device) after fully_shard, so
// only shards are ever allocated; a module on the CPU is moved to the mesh's device unit by unit
// (fully_shard's _move_states_to_device) and sharded there; one on the GPU is sharded in place.
void Fsdp2(const Plan& plan, InitProgram& p) {
  const int32_t bytes = plan.training.precision == Precision::kPureBf16 ? 2 : kFp32Bytes;
  const int32_t w = MeshOf(plan).shard;
  p.framework = "FSDP2 (fully_shard)";
  switch (InitDeviceOf(plan)) {
    case InitDevice::kMeta:
      p.phases.push_back({true, {AllocEach("shard", bytes, w, InitWhat::kShardMaterialized)}});
      return;
    case InitDevice::kCpu:
      p.phases.push_back({true, {AllocEach("module", bytes, 1, InitWhat::kUnitToGpu),
                                 AllocEach("shard", bytes, w, InitWhat::kShard), Free("module")}});
      return;
    case InitDevice::kCuda:
      p.phases.push_back({false, {AllocEach("module", bytes, 1, InitWhat::kModelBuiltOnGpu)}});
      p.phases.push_back({true, {AllocEach("shard", bytes, w, InitWhat::kShard), Free("module")}});
      return;
  }
}

// DeepSpeed (deepspeed/runtime/engine.py DeepSpeedEngine.__init__):
// _configure_distributed_model casts the module to the 16-bit dtype (module.half() /
// .bfloat16()) and moves it to the GPU (module.to(self.device)), then _broadcast_model
// broadcasts rank 0's parameters over the data-parallel group; the ZeRO optimizer follows.
// With zero.Init (stage 3) each module's parameters are built on the GPU, broadcast from rank 0
// and partitioned as the module is constructed (partition_parameters.py
// Init._post_init_method), one unit at a time here.
void DeepSpeed(const Plan& plan, InitProgram& p) {
  const int32_t w = plan.cluster.world_size();
  const int32_t low = DtypeBytes(plan.training.dtype);  // fp16 / bf16, or fp32 training
  const bool stage3 = plan.strategy == Strategy::kZero3;
  p.framework = stage3 ? "DeepSpeed ZeRO-3" : plan.strategy == Strategy::kZero2 ? "DeepSpeed ZeRO-2" : "DeepSpeed ZeRO-1";
  if (stage3 && plan.zero.zero_init) {
    p.framework += " with zero.Init";
    p.phases.push_back({true, {AllocEach("module16", low, 1, InitWhat::kZeroInitParam), Collective(kCommWorld),
                               AllocEach("partition", low, w, InitWhat::kPartition), Free("module16")}});
  } else {
    if (InitDeviceOf(plan) == InitDevice::kCuda && low != kFp32Bytes) {
      // Built in fp32 on the GPU; module.half() converts parameter by parameter (a new tensor
      // each, the fp32 one freed): per unit here.
      p.phases.push_back({false, {AllocEach("module32", kFp32Bytes, 1, InitWhat::kModelBuiltOnGpu)}});
      p.phases.push_back({true, {AllocEach("module16", low, 1, InitWhat::kModelHalf), Free("module32")}});
    } else {
      p.phases.push_back({false, {AllocEach("module16", low, 1,
                                            InitDeviceOf(plan) == InitDevice::kCuda ? InitWhat::kModelBuiltOnGpu
                                                                                    : InitWhat::kModelHalf)}});
    }
    p.phases.push_back({false, {Collective(kCommWorld)}});
    if (stage3) {
      // stage3.py DeepSpeedZeroOptimizer_Stage3.__init__ -> DeepSpeedZeRoOffload ->
      // _convert_to_zero_parameters / Init(module=module): param.partition() per parameter keeps
      // ceil(numel / W) elements and frees the full tensor.
      p.phases.push_back({true, {AllocEach("partition", low, w, InitWhat::kPartition), Free("module16")}});
    }
  }
  if (stage3) {
    // _create_fp16_partitions_with_defragmentation: the partitions copied into one flat buffer
    // per group, the per-parameter partitions freed.
    p.phases.push_back({false, {AllocFlat("flat16", low, w, 1, InitWhat::kFlatPartitions), Free("partition")}});
  } else {
    // stage_1_and_2.py DeepSpeedZeroOptimizer.__init__: "move all the parameters to cpu to free up
    // GPU space for creating flat buffer", flatten_dense_tensors_aligned (padded to a multiple
    // of the world size) moved back to the GPU; the parameters become views into it.
    p.phases.push_back({false, {Free("module16"), AllocFlat("flat16", low, w, w, InitWhat::kFlatParams)}});
  }
  // The fp32 master partition (single_partition_of_fp32_groups / fp32_partitioned_groups_flat:
  // .clone().float()), then initialize_optimizer_states: a zero fp32 gradient partition, one
  // optimizer step creating exp_avg and exp_avg_sq, the gradient freed.
  p.phases.push_back({false,
                      {AllocFlat("fp32_master", kFp32Bytes, w, 1, InitWhat::kFp32Master),
                       AllocFlat("fp32_grad", kFp32Bytes, w, 1, InitWhat::kGradPartition),
                       AllocFlat("exp_avg", kFp32Bytes, w, 1, InitWhat::kOptimizerStates),
                       AllocFlat("exp_avg_sq", kFp32Bytes, w, 1, InitWhat::kOptimizerStates), Free("fp32_grad")}});
}

std::string_view KindName(InitOpKind kind) {
  switch (kind) {
    case InitOpKind::kAllocEach: return "alloc_each";
    case InitOpKind::kAllocFlat: return "alloc_flat";
    case InitOpKind::kFree: return "free";
    case InitOpKind::kCollective: return "collective";
  }
  return "free";
}

// "30*n1,n2;1*n3": consecutive equal units run-length encoded.
std::string EncodeUnits(const std::vector<std::vector<int64_t>>& units) {
  std::string out;
  for (size_t i = 0; i < units.size();) {
    size_t j = i;
    while (j < units.size() && units[j] == units[i]) ++j;
    if (!out.empty()) out += ';';
    out += fmt::format("{}*{}", j - i, fmt::join(units[i], ","));
    i = j;
  }
  return out;
}

std::vector<std::string> Split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(text);
  while (std::getline(in, part, separator)) parts.push_back(part);
  return parts;
}

bool ParseInt(const std::string& text, int64_t* out) {
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, *out);
  return ec == std::errc() && p == end;
}

}  // namespace

std::string_view InitWhatText(InitWhat what) {
  for (const WhatRow& row : kWhat) {
    if (row.what == what) return row.text;
  }
  return "tensors freed";
}

std::string_view InitWhatName(InitWhat what) {
  for (const WhatRow& row : kWhat) {
    if (row.what == what) return row.name;
  }
  return "release";
}

InitProgram InitProgramOf(const Plan& plan) {
  InitProgram p;
  for (const ModuleParams& module : ModelParameters(plan.model)) {
    std::vector<int64_t> numels;
    numels.reserve(module.params.size());
    for (const ParamTensor& param : module.params) numels.push_back(param.numel);
    p.units.push_back(std::move(numels));
  }
  switch (plan.strategy) {
    case Strategy::kDdp: Ddp(plan, p); break;
    case Strategy::kFsdp1: Fsdp1(plan, p); break;
    case Strategy::kFsdp2: Fsdp2(plan, p); break;
    case Strategy::kZero1:
    case Strategy::kZero2:
    case Strategy::kZero3: DeepSpeed(plan, p); break;
  }
  return p;
}

void WriteInitProgram(const InitProgram& program, std::map<std::string, std::string>& m) {
  if (program.empty()) return;
  m["init.framework"] = program.framework;
  m["init.units"] = EncodeUnits(program.units);
  m["init.phases"] = std::to_string(program.phases.size());
  for (size_t i = 0; i < program.phases.size(); ++i) {
    std::vector<std::string> ops;
    for (const InitOp& op : program.phases[i].ops) {
      ops.push_back(fmt::format("{} {} {} {} {} {} {} {}", KindName(op.kind), op.group.empty() ? "-" : op.group,
                                op.element_bytes, op.divide, op.multiply, op.cap_bytes,
                                op.slot.empty() ? "-" : op.slot, InitWhatName(op.what)));
    }
    m[fmt::format("init.phase.{}", i)] =
        fmt::format("{}:{}", program.phases[i].per_unit ? "unit" : "all", fmt::join(ops, ";"));
  }
}

StatusOr<InitProgram> ReadInitProgram(const std::map<std::string, std::string>& m, const std::string& label) {
  InitProgram program;
  auto it = m.find("init.phases");
  if (it == m.end()) return program;
  const auto bad = [&](const std::string& key, std::string_view expected) {
    return Status::InvalidInput(fmt::format("{}: /metadata/{}: expected {}", label, key, expected));
  };
  int64_t phases = 0;
  constexpr int64_t kMaxPhases = 64;
  if (!ParseInt(it->second, &phases) || phases < 0 || phases > kMaxPhases) {
    return bad("init.phases", fmt::format("a phase count 0..{}", kMaxPhases));
  }
  if (auto f = m.find("init.framework"); f != m.end()) program.framework = f->second;
  // Units: "count*n1,n2;count*...".
  constexpr int64_t kMaxUnits = int64_t{1} << 20;
  const std::string units_expected = "units as count*numel,numel;... with counts and element counts >= 1";
  auto u = m.find("init.units");
  if (u == m.end()) return bad("init.units", units_expected);
  for (const std::string& run : Split(u->second, ';')) {
    const size_t star = run.find('*');
    int64_t count = 0;
    if (star == std::string::npos || !ParseInt(run.substr(0, star), &count) || count < 1 ||
        static_cast<int64_t>(program.units.size()) + count > kMaxUnits) {
      return bad("init.units", units_expected);
    }
    std::vector<int64_t> numels;
    for (const std::string& n : Split(run.substr(star + 1), ',')) {
      int64_t numel = 0;
      if (!ParseInt(n, &numel) || numel < 1 || numel > (int64_t{1} << 50)) return bad("init.units", units_expected);
      numels.push_back(numel);
    }
    for (int64_t c = 0; c < count; ++c) program.units.push_back(numels);
  }
  for (int64_t i = 0; i < phases; ++i) {
    const std::string key = fmt::format("init.phase.{}", i);
    const std::string expected = "'unit:' or 'all:' then ops 'kind group bytes divide multiply cap slot what'";
    auto p = m.find(key);
    if (p == m.end()) return bad(key, expected);
    const size_t colon = p->second.find(':');
    if (colon == std::string::npos) return bad(key, expected);
    InitPhase phase;
    const std::string scope = p->second.substr(0, colon);
    if (scope != "unit" && scope != "all") return bad(key, expected);
    phase.per_unit = scope == "unit";
    for (const std::string& text : Split(p->second.substr(colon + 1), ';')) {
      std::istringstream in(text);
      std::string kind, group, slot, what;
      int64_t bytes = 0, divide = 0, multiply = 0, cap = 0;
      if (!(in >> kind >> group >> bytes >> divide >> multiply >> cap >> slot >> what) || bytes < 0 || bytes > 8 ||
          divide < 1 || divide > (int64_t{1} << 24) || multiply < 1 || multiply > (int64_t{1} << 24) || cap < 0) {
        return bad(key, expected);
      }
      InitOp op;
      bool known_kind = false;
      for (InitOpKind k : {InitOpKind::kAllocEach, InitOpKind::kAllocFlat, InitOpKind::kFree, InitOpKind::kCollective}) {
        if (KindName(k) == kind) {
          op.kind = k;
          known_kind = true;
        }
      }
      bool known_what = false;
      for (const WhatRow& row : kWhat) {
        if (row.name == what) {
          op.what = row.what;
          known_what = true;
        }
      }
      if (!known_kind || !known_what) return bad(key, expected);
      op.group = group == "-" ? "" : group;
      op.slot = slot == "-" ? "" : slot;
      op.element_bytes = static_cast<int32_t>(bytes);
      op.divide = static_cast<int32_t>(divide);
      op.multiply = static_cast<int32_t>(multiply);
      op.cap_bytes = cap;
      phase.ops.push_back(std::move(op));
    }
    program.phases.push_back(std::move(phase));
  }
  return program;
}

}  // namespace shardscope::sim

// The schedule: for every rank, the ordered program of its host thread.
//
// This is the representation every part of shardscope consumes: sim/ lowers a plan into
// it and simulates it, runtime/ executes it, and the diff matches measured kernels back to
// its ops by id. It has a JSON form (schedule_json.h) that users can write by hand.
//
// Ranks that run the same program share one Program (data-parallel ranks usually do), so a
// 1,024-rank schedule holds a handful of programs rather than 1,024 copies. A program names
// the communicators it uses through slots ("dp", "shard", ...); each rank binds every slot
// to one of the schedule's communicators. Unbound slots resolve to the communicator of the
// same name.
//
// Indices (stream, event, tensor, communicator slot, name, module) are positions in the
// owning Program's tables; Op::id is the stable identity that appears in traces.
#ifndef SHARDSCOPE_TRACES_SCHEDULE_H_
#define SHARDSCOPE_TRACES_SCHEDULE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "shardscope/base/status.h"

namespace shardscope::traces {

inline constexpr int kScheduleVersion = 1;

// ---- Limits on a schedule's numbers. ValidateSchedule enforces them on every schedule (a
// lowered plan's as much as a hand-written JSON's; the JSON reader checks them first, naming
// the JSON path); schedule_json.h's schema lists them. Each is far above any real training job,
// and together they keep every sum and product the simulator and the runtime form inside
// int64_t (the worst cases are worked out beside each limit).
//
// The longest run a schedule may have, in simulated time: 2^60 ns (36 years). The simulator
// clamps any one modelled duration to it and stops with an error when an event passes it, so
// a time plus a duration never overflows int64_t (2^60 + 2^60 < 2^63).
inline constexpr int64_t kMaxSimulatedNs = int64_t{1} << 60;
// Bytes of one allocate, memcpy, collective, or memory-bound kernel read / write: 1 PiB,
// over 5,000 times the memory of the largest GPU (B200: 192 GB) and of any one NCCL call.
// A byte count times an element size (<= 8), or the sum of a kernel's read and written bytes,
// stays below 2^54.
inline constexpr int64_t kMaxOpBytes = int64_t{1} << 50;
// Nanoseconds of one host_work op or fixed-duration kernel: one hour (a training step's
// longest host work, a checkpoint save, takes minutes).
inline constexpr int64_t kMaxOpDurationNs = int64_t{3'600'000'000'000};
// The sum of one program's host_work and fixed-kernel durations: 2^58 ns (9 years), so a
// host clock that adds them all to any time below the simulator's horizon (2^60 ns) stays
// below 2^61.
inline constexpr int64_t kMaxProgramDurationNs = int64_t{1} << 58;
// Ops in one program: 2^28 (268 million; a 1,024-GPU Llama-70B step has ~40,000 per rank).
// Times the host's per-op costs (each <= 1 s, the plan's and the metadata's limit) the host
// time of a whole program stays below 2^58 ns.
inline constexpr int64_t kMaxOpsPerProgram = int64_t{1} << 28;
// One shape field (GEMM m, n, k, batch; attention batch, heads, kv_heads, seq_q, seq_kv,
// head_dim): 2^24, the plan's own limit on hidden sizes, FFN widths and sequence lengths.
inline constexpr int64_t kMaxShapeDim = int64_t{1} << 24;
// Elements of one operand of a kernel (GEMM A = batch x m x k, B = batch x k x n, C = batch x
// m x n; attention Q and O = batch x heads x seq_q x head_dim, K and V = batch x kv_heads x
// seq_kv x head_dim): 2^48 (a 512 TB bf16 tensor). The GEMM model's output tiles, the
// runtime's operand bytes (elements x <= 8 bytes) and every two-factor product stay below
// 2^51; products of more factors are formed in double.
inline constexpr int64_t kMaxOperandElements = int64_t{1} << 48;

enum class DType : uint8_t { kFloat32, kTFloat32, kBFloat16, kFloat16, kFloat8E4M3, kFloat8E5M2, kInt8, kInt32, kInt64, kFloat64 };
// Bytes per element (tf32 is stored as fp32: 4).
int64_t DTypeSize(DType dtype);
// "fp32", "tf32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "int8", "int32", "int64", "fp64".
std::string_view DTypeName(DType dtype);
std::optional<DType> ParseDType(std::string_view name);  // also accepts "float32", "bfloat16", ...
// The c10::ScalarType name PyTorch writes for it (profiler "dtype" args, Flight Recorder
// input_dtypes): "Float" (fp32 and tf32), "BFloat16", "Half", "Float8_e4m3fn", ...
std::string_view TorchScalarTypeName(DType dtype);

// ---- Compute descriptors: what a kernel does, so the simulator can cost it and the
// runtime can reproduce it with a proxy kernel of the same shape.

// C[batch][m][n] = A[batch][m][k] x B[batch][k][n]; 2*m*n*k*batch FLOPs.
struct GemmDesc {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  DType dtype = DType::kBFloat16;
  bool operator==(const GemmDesc&) const = default;
};

// The fused attention kernel family that runs (what PyTorch's scaled_dot_product_attention
// dispatches to, or a library called directly). The unfused "math" path is not one kernel: a
// schedule spells it out as GEMMs and memory-bound kernels.
enum class AttentionImpl : uint8_t {
  kFlash2,        // FlashAttention-2 (PyTorch's FLASH_ATTENTION backend since 2.2; sm80+)
  kFlash3,        // FlashAttention-3 (Hopper only)
  kCudnn,         // cuDNN fused flash attention (PyTorch's CUDNN_ATTENTION backend)
  kMemEfficient,  // xFormers' CUTLASS kernel (PyTorch's EFFICIENT_ATTENTION backend; sm50+)
};
std::string_view AttentionImplName(AttentionImpl impl);  // "flash2", "flash3", "cudnn", "mem_efficient"
std::optional<AttentionImpl> ParseAttentionImpl(std::string_view name);

// Scaled dot-product attention (flash-attention style: no materialized score matrix).
// kv_heads < heads is grouped-query attention. backward = the gradient kernel.
struct AttentionDesc {
  int64_t batch = 0, heads = 0, kv_heads = 0, seq_q = 0, seq_kv = 0, head_dim = 0;
  bool causal = true;
  bool backward = false;
  DType dtype = DType::kBFloat16;
  AttentionImpl impl = AttentionImpl::kFlash2;
  bool operator==(const AttentionDesc&) const = default;
};

// Elementwise / reduction / copy kernels: cost is bytes moved through HBM.
struct MemoryBoundDesc {
  int64_t bytes_read = 0, bytes_written = 0;
  bool operator==(const MemoryBoundDesc&) const = default;
};

// A kernel whose duration is known (measured, or a spin kernel).
struct FixedDurationDesc {
  int64_t duration_ns = 0;
  bool operator==(const FixedDurationDesc&) const = default;
};

using ComputeDesc = std::variant<GemmDesc, AttentionDesc, MemoryBoundDesc, FixedDurationDesc>;

// Why a GEMM's or attention's operands are too large (kMaxOperandElements), e.g. "gemm operand
// A (batch x m x k) has 1152921504606846976 elements, more than the limit of 281474976710656",
// or "" when they are within it. Shape fields must already be in [1, kMaxShapeDim]; the
// products are formed without overflow.
std::string ComputeLimitViolation(const GemmDesc& gemm);
std::string ComputeLimitViolation(const AttentionDesc& attention);

// ---- Ops

enum class CollectiveType : uint8_t { kAllGather, kReduceScatter, kAllReduce, kBroadcast, kReduce, kAllToAll, kSend, kRecv };
std::string_view CollectiveTypeName(CollectiveType type);  // "all_gather", ...
std::optional<CollectiveType> ParseCollectiveType(std::string_view name);

enum class MemcpyKind : uint8_t { kHostToDevice, kDeviceToHost, kDeviceToDevice };
std::string_view MemcpyKindName(MemcpyKind kind);  // "h2d", "d2h", "d2d"
std::optional<MemcpyKind> ParseMemcpyKind(std::string_view name);

enum class Phase : uint8_t { kNone, kForward, kBackward, kOptimizer, kCheckpoint };
std::string_view PhaseName(Phase phase);  // "", "forward", "backward", "optimizer", "checkpoint"
std::optional<Phase> ParsePhase(std::string_view name);

using StreamIndex = int32_t;
using EventIndex = int32_t;
using TensorIndex = int32_t;
using CommSlot = int32_t;
using NameIndex = int32_t;  // into Program::names
inline constexpr NameIndex kNoName = -1;

// Launch a kernel on a stream.
struct KernelOp {
  StreamIndex stream = 0;
  ComputeDesc compute;
  bool operator==(const KernelOp&) const = default;
};

// A collective (or point-to-point) NCCL call on a stream.
// `bytes` follows nccl-tests' size S: the full buffer for all_reduce / broadcast / reduce,
// the gathered output for all_gather, the input for reduce_scatter, what one rank sends for
// all_to_all, the message for send / recv.
struct CollectiveOp {
  CollectiveType type = CollectiveType::kAllReduce;
  CommSlot comm = 0;
  StreamIndex stream = 0;
  int64_t bytes = 0;
  DType dtype = DType::kBFloat16;
  int32_t peer = -1;  // send / recv: the peer's global rank; broadcast / reduce: the root
  // This collective is an OOM-flag agreement point (Composer's automicrobatching sync:
  // composer/trainer/trainer.py _create_sync_hook): a rank that caught an out-of-memory error
  // skips ahead to its next such collective, and every member stops once it completes. JSON
  // "oom_sync": true (written only when set).
  bool oom_sync = false;
  bool operator==(const CollectiveOp&) const = default;
};

struct MemcpyOp {
  MemcpyKind kind = MemcpyKind::kDeviceToDevice;
  StreamIndex stream = 0;
  int64_t bytes = 0;
  bool operator==(const MemcpyOp&) const = default;
};

// cudaEventRecord(event, stream).
struct EventRecordOp {
  EventIndex event = 0;
  StreamIndex stream = 0;
  bool operator==(const EventRecordOp&) const = default;
};

// cudaStreamWaitEvent(stream, event): waits for the most recent record of `event` issued
// before this op in program order (CUDA captures the record at call time).
struct StreamWaitEventOp {
  StreamIndex stream = 0;
  EventIndex event = 0;
  bool operator==(const StreamWaitEventOp&) const = default;
};

// The host blocks until the stream has drained.
struct StreamSynchronizeOp {
  StreamIndex stream = 0;
  bool operator==(const StreamSynchronizeOp&) const = default;
};

// The host blocks until every stream of its device has drained.
struct DeviceSynchronizeOp {
  bool operator==(const DeviceSynchronizeOp&) const = default;
};

// The host blocks until the most recent record of the event has completed.
struct EventSynchronizeOp {
  EventIndex event = 0;
  bool operator==(const EventSynchronizeOp&) const = default;
};

// CPU time on the host thread (Python, hooks, optimizer bookkeeping).
struct HostWorkOp {
  int64_t duration_ns = 0;
  bool operator==(const HostWorkOp&) const = default;
};

// The caching allocator sees allocations on the host timeline; the block is associated
// with `stream` (PyTorch's per-stream pools).
struct AllocateOp {
  TensorIndex tensor = 0;
  int64_t bytes = 0;
  StreamIndex stream = 0;
  bool operator==(const AllocateOp&) const = default;
};

// Frees the tensor's block; stream-ordered on the stream it was allocated on.
struct FreeOp {
  TensorIndex tensor = 0;
  bool operator==(const FreeOp&) const = default;
};

// torch.Tensor.record_stream(stream): the live tensor is also used on `stream`, so when it is
// freed the caching allocator keeps its block until the work `stream` had queued by the
// free has completed (CUDACachingAllocator recordStream / insert_events).
struct RecordStreamOp {
  TensorIndex tensor = 0;
  StreamIndex stream = 0;
  bool operator==(const RecordStreamOp&) const = default;
};

using OpPayload = std::variant<KernelOp, CollectiveOp, MemcpyOp, EventRecordOp, StreamWaitEventOp,
                               StreamSynchronizeOp, DeviceSynchronizeOp, EventSynchronizeOp,
                               HostWorkOp, AllocateOp, FreeOp, RecordStreamOp>;

// The JSON "op" field of each payload alternative: "kernel", "collective", "memcpy",
// "event_record", "stream_wait_event", "stream_synchronize", "device_synchronize",
// "event_synchronize", "host_work", "allocate", "free", "record_stream".
std::string_view OpKindName(const OpPayload& payload);

struct OpTags {
  NameIndex module = kNoName;  // e.g. "layers.3" (into Program::names)
  Phase phase = Phase::kNone;
  int32_t micro_batch = -1;    // -1: not tagged
  bool operator==(const OpTags&) const = default;
};

struct Op {
  int64_t id = 0;              // stable; unique within its program
  NameIndex name = kNoName;    // display name, e.g. "gemm qkv" (into Program::names)
  OpTags tags;
  OpPayload payload;
  bool operator==(const Op&) const = default;
};

struct StreamDecl {
  std::string name;
  int32_t priority = 0;  // CUDA convention: lower number = higher priority
  bool operator==(const StreamDecl&) const = default;
};

struct Program {
  std::string name;
  std::vector<StreamDecl> streams;          // StreamIndex -> stream; index 0 is the default
  std::vector<std::string> events;          // EventIndex -> name
  std::vector<std::string> tensors;         // TensorIndex -> name
  std::vector<std::string> comm_slots;      // CommSlot -> slot name
  std::vector<std::string> names;           // NameIndex -> op names and module names
  std::vector<Op> ops;

  // Interns `s` into `names` (linear in the number of names; lowering keeps a map).
  NameIndex InternName(std::string_view s);
  std::string_view NameOf(NameIndex index) const {
    return index < 0 ? std::string_view() : std::string_view(names[static_cast<size_t>(index)]);
  }
  bool operator==(const Program&) const = default;
};

struct Communicator {
  std::string name;
  std::vector<int32_t> ranks;  // global ranks, in NCCL rank order
  bool operator==(const Communicator&) const = default;
};

struct RankBinding {
  int32_t program = 0;                   // index into Schedule::programs
  std::vector<int32_t> comm_binding;     // CommSlot -> index into Schedule::communicators
  bool operator==(const RankBinding&) const = default;
};

struct Schedule {
  int version = kScheduleVersion;
  std::vector<Communicator> communicators;
  std::vector<Program> programs;
  std::vector<RankBinding> ranks;        // index = global rank; size = world size
  // Free-form context carried with the schedule, e.g. "cluster.preset", "cluster.nodes",
  // "host.launch_overhead_ns", "plan". sim/ reads the keys it knows.
  std::map<std::string, std::string> metadata;

  int32_t world_size() const { return static_cast<int32_t>(ranks.size()); }
  const Program& ProgramOf(int32_t rank) const {
    return programs[static_cast<size_t>(ranks[static_cast<size_t>(rank)].program)];
  }
  // The global communicator index a rank's slot refers to.
  int32_t CommunicatorOf(int32_t rank, CommSlot slot) const {
    return ranks[static_cast<size_t>(rank)].comm_binding[static_cast<size_t>(slot)];
  }
  // Fills comm_binding of every rank for slots left unbound, by name. Fails if a slot
  // names no communicator.
  Status ResolveBindings();
  // Field-by-field equality (the JSON round trip is exact under it).
  bool operator==(const Schedule&) const = default;
};

// Checks what the simulator and runtime rely on, naming the rank, op id and reason:
// unknown stream/event/tensor/communicator indices, waits on events never recorded before
// in program order, negative sizes or durations, collectives on a communicator that does
// not contain the rank, send/recv peers outside the communicator, frees of tensors not
// allocated (or already freed), duplicate op ids, communicator ranks out of range, and the
// limits above.
Status ValidateSchedule(const Schedule& schedule);

}  // namespace shardscope::traces

#endif  // SHARDSCOPE_TRACES_SCHEDULE_H_

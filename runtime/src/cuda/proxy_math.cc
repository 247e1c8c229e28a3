#include "cuda/proxy_math.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>
#include <type_traits>
#include <variant>

#include <fmt/format.h>

namespace shardscope::runtime::cuda {

namespace {

using traces::DType;

constexpr int64_t kMiB = int64_t{1} << 20;
// Tensor cores want dimensions in multiples of 8 for 16-bit types and 16 for fp8 (cuBLAS
// documentation, "Tensor Core Usage").
constexpr int64_t kTensorCoreAlign16Bit = 8;
constexpr int64_t kFp8Align = 16;
// The caching allocator's rounding (c10/cuda/CUDACachingAllocator.cpp kMinBlockSize).
constexpr int64_t kOperandRounding = 512;
// A causal mask computes about half of the scores (sim/models/src/compute_model.cc kCausalFraction).
constexpr int64_t kCausalDivisor = 2;
// FlashAttention-2 backward: 5 matmuls, 2 of S's shape and 3 of O's (see the header).
constexpr int32_t kBackwardQkGemms = 2;
constexpr int32_t kBackwardPvGemms = 3;

int64_t RoundUp(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

struct Types {
  LtDataType a, b, c;
  LtComputeType compute;
  LtDataType scale;
  bool tn;  // cuBLASLt requires the TN layout
  int64_t align;
};

Types TypesFor(DType dtype, ComputeCapability cc, std::string* note) {
  switch (dtype) {
    case DType::kFloat32: return {LtDataType::kF32, LtDataType::kF32, LtDataType::kF32, LtComputeType::k32F, LtDataType::kF32, false, 1};
    case DType::kTFloat32:
      return {LtDataType::kF32, LtDataType::kF32, LtDataType::kF32, LtComputeType::k32FFastTF32, LtDataType::kF32, false, 1};
    case DType::kBFloat16:
      return {LtDataType::kBF16, LtDataType::kBF16, LtDataType::kBF16, LtComputeType::k32F, LtDataType::kF32, false, 1};
    case DType::kFloat16:
      return {LtDataType::kF16, LtDataType::kF16, LtDataType::kF16, LtComputeType::k32F, LtDataType::kF32, false, 1};
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2: {
      if (!cc.AtLeast(8, 9)) {
        *note = fmt::format("{} GEMM on compute capability {}.{} (fp8 needs 8.9+): run as bf16",
                            traces::DTypeName(dtype), cc.major, cc.minor);
        return TypesFor(DType::kBFloat16, cc, note);
      }
      const LtDataType a = dtype == DType::kFloat8E4M3 ? LtDataType::kF8E4M3 : LtDataType::kF8E5M2;
      if (dtype == DType::kFloat8E5M2) *note = "fp8_e5m2 GEMM: run as e5m2 x e4m3 (e5m2 x e5m2 is not a cuBLASLt type combination)";
      return {a, LtDataType::kF8E4M3, LtDataType::kBF16, LtComputeType::k32F, LtDataType::kF32, true, kFp8Align};
    }
    case DType::kFloat64: return {LtDataType::kF64, LtDataType::kF64, LtDataType::kF64, LtComputeType::k64F, LtDataType::kF64, false, 1};
    case DType::kInt8:
      // Integer GEMMs take int8 in the TN layout with dimensions in multiples of 4 (cuBLASLt
      // docs, cublasLtMatmul "IMMA" notes); the scale type of CUBLAS_COMPUTE_32I is int32.
      return {LtDataType::kI8, LtDataType::kI8, LtDataType::kI32, LtComputeType::k32I, LtDataType::kI32, true, 4};
    case DType::kInt32:
    case DType::kInt64:
      *note = fmt::format("{} is not a GEMM type: run as fp32 (same FLOPs)", traces::DTypeName(dtype));
      return TypesFor(DType::kFloat32, cc, note);
  }
  return TypesFor(DType::kFloat32, cc, note);
}

}  // namespace

std::string_view LtDataTypeName(LtDataType t) {
  switch (t) {
    case LtDataType::kF32: return "CUDA_R_32F";
    case LtDataType::kBF16: return "CUDA_R_16BF";
    case LtDataType::kF16: return "CUDA_R_16F";
    case LtDataType::kF8E4M3: return "CUDA_R_8F_E4M3";
    case LtDataType::kF8E5M2: return "CUDA_R_8F_E5M2";
    case LtDataType::kF64: return "CUDA_R_64F";
    case LtDataType::kI8: return "CUDA_R_8I";
    case LtDataType::kI32: return "CUDA_R_32I";
  }
  return "?";
}

std::string_view LtComputeTypeName(LtComputeType t) {
  switch (t) {
    case LtComputeType::k32F: return "CUBLAS_COMPUTE_32F";
    case LtComputeType::k32FFastTF32: return "CUBLAS_COMPUTE_32F_FAST_TF32";
    case LtComputeType::k64F: return "CUBLAS_COMPUTE_64F";
    case LtComputeType::k32I: return "CUBLAS_COMPUTE_32I";
  }
  return "?";
}

int64_t LtDataTypeSize(LtDataType t) {
  switch (t) {
    case LtDataType::kF32:
    case LtDataType::kI32: return 4;
    case LtDataType::kBF16:
    case LtDataType::kF16: return 2;
    case LtDataType::kF8E4M3:
    case LtDataType::kF8E5M2:
    case LtDataType::kI8: return 1;
    case LtDataType::kF64: return 8;
  }
  return 4;
}

int64_t LtProblem::a_bytes() const { return stride_a * batch * LtDataTypeSize(a_type); }
int64_t LtProblem::b_bytes() const { return stride_b * batch * LtDataTypeSize(b_type); }
int64_t LtProblem::c_bytes() const { return stride_c * batch * LtDataTypeSize(c_type); }

// ---- Streams

std::vector<int32_t> MapStreamPriorities(const std::vector<int32_t>& schedule_priorities, PriorityRange range) {
  // Levels from the lowest priority (largest number) up.
  const std::set<int32_t, std::greater<>> levels(schedule_priorities.begin(), schedule_priorities.end());
  std::vector<int32_t> mapped;
  mapped.reserve(schedule_priorities.size());
  for (int32_t p : schedule_priorities) {
    const auto steps_above_lowest = static_cast<int32_t>(std::distance(levels.begin(), levels.find(p)));
    mapped.push_back(std::max(range.greatest, range.least - steps_above_lowest));
  }
  return mapped;
}

// ---- GEMMs

LtProblem GemmProblem(const traces::GemmDesc& gemm, ComputeCapability cc) {
  LtProblem p;
  const Types t = TypesFor(gemm.dtype, cc, &p.note);
  int64_t m = gemm.m, n = gemm.n, k = gemm.k;
  if (t.align > 1 && (m % t.align || n % t.align || k % t.align)) {
    m = RoundUp(m, t.align);
    n = RoundUp(n, t.align);
    k = RoundUp(k, t.align);
    p.note += fmt::format("{}dimensions rounded up to multiples of {} for {}", p.note.empty() ? "" : "; ", t.align,
                          LtDataTypeName(t.a));
  }
  // Row-major C[m][n] = A[m][k] B[k][n] is column-major C^T (n x m) = B^T A^T.
  p.m = n;
  p.n = m;
  p.k = k;
  p.batch = std::max<int64_t>(1, gemm.batch);
  p.a_type = t.a;
  p.b_type = t.b;
  p.c_type = t.c;
  p.d_type = t.c;
  p.compute = t.compute;
  p.scale_type = t.scale;
  if (t.tn) {
    // op(A') = A'^T with A' stored k x m' (column-major, ld k); B' stored k x n' (ld k).
    p.transpose_a = true;
    p.transpose_b = false;
    p.lda = k;
    p.ldb = k;
  } else {
    // A' = B as stored (n x k column-major, ld n); B' = A (k x m column-major, ld k).
    p.lda = p.m;
    p.ldb = k;
  }
  p.ldc = p.m;
  p.stride_a = p.m * k;
  p.stride_b = k * p.n;
  p.stride_c = p.m * p.n;
  return p;
}

double AttentionProxy::flops() const {
  return (qk.flops() / static_cast<double>(qk.batch) * qk_repeats + pv.flops() / static_cast<double>(pv.batch) * pv_repeats) *
         static_cast<double>(total_batch);
}

AttentionProxy AttentionProblem(const traces::AttentionDesc& a, ComputeCapability cc) {
  AttentionProxy proxy;
  proxy.total_batch = std::max<int64_t>(1, a.batch * a.heads);
  int64_t kv = a.seq_kv;
  if (a.causal) {
    const int64_t half = a.seq_kv / kCausalDivisor;
    kv = half >= kTensorCoreAlign16Bit ? half / kTensorCoreAlign16Bit * kTensorCoreAlign16Bit : std::max<int64_t>(1, half);
  }
  const traces::GemmDesc qk{a.seq_q, kv, a.head_dim, 1, a.dtype};
  const traces::GemmDesc pv{a.seq_q, a.head_dim, kv, 1, a.dtype};
  const LtProblem qk_one = GemmProblem(qk, cc);
  const int64_t score_bytes_per_head = std::max<int64_t>(1, qk_one.c_bytes());
  proxy.batch_chunk = std::clamp<int64_t>(kMaxScoreBufferBytes / score_bytes_per_head, 1, proxy.total_batch);
  proxy.qk = GemmProblem(traces::GemmDesc{qk.m, qk.n, qk.k, proxy.batch_chunk, a.dtype}, cc);
  proxy.pv = GemmProblem(traces::GemmDesc{pv.m, pv.n, pv.k, proxy.batch_chunk, a.dtype}, cc);
  if (a.causal) {
    proxy.qk.note += fmt::format("{}causal: seq_kv {} computed as {} (half the scores)", proxy.qk.note.empty() ? "" : "; ",
                                 a.seq_kv, kv);
  }
  if (a.backward) {
    proxy.qk_repeats = kBackwardQkGemms;
    proxy.pv_repeats = kBackwardPvGemms;
  }
  const int64_t element = traces::DTypeSize(a.dtype);
  const int64_t kv_heads = a.kv_heads > 0 ? a.kv_heads : a.heads;
  const int64_t q_bytes = a.batch * a.heads * a.seq_q * a.head_dim * element;
  const int64_t kv_bytes = a.batch * kv_heads * a.seq_kv * a.head_dim * element;
  if (a.backward) {
    proxy.memory_read_bytes = 3 * q_bytes + 2 * kv_bytes;   // Q, O, dO; K, V
    proxy.memory_write_bytes = q_bytes + 2 * kv_bytes;      // dQ; dK, dV
  } else {
    proxy.memory_read_bytes = q_bytes + 2 * kv_bytes;       // Q; K, V
    proxy.memory_write_bytes = q_bytes;                     // O
  }
  return proxy;
}

// ---- Memory-bound

CopyGeometry MemoryBoundGeometry(int64_t bytes_read, int64_t bytes_written, int32_t sm_count) {
  CopyGeometry g;
  g.read_vectors = (std::max<int64_t>(0, bytes_read) + kVectorBytes - 1) / kVectorBytes;
  g.write_vectors = (std::max<int64_t>(0, bytes_written) + kVectorBytes - 1) / kVectorBytes;
  const int64_t vectors = std::max(g.read_vectors, g.write_vectors);
  if (vectors == 0) return g;
  const int64_t needed = (vectors + g.threads_per_block - 1) / g.threads_per_block;
  const int64_t cap = int64_t{std::max(1, sm_count)} * kCopyBlocksPerSm;
  g.blocks = static_cast<int32_t>(std::min(needed, cap));
  return g;
}

// ---- Spin calibration

SpinCalibration FitSpinCalibration(const std::vector<std::pair<int64_t, int64_t>>& samples) {
  const auto n = static_cast<double>(samples.size());
  if (samples.size() < 2) return {};
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [x, y] : samples) {
    sx += static_cast<double>(x);
    sy += static_cast<double>(y);
    sxx += static_cast<double>(x) * static_cast<double>(x);
    sxy += static_cast<double>(x) * static_cast<double>(y);
  }
  const double denominator = n * sxx - sx * sx;
  if (std::abs(denominator) < 1e-9) return {};  // one distinct requested duration
  SpinCalibration c;
  c.slope = (n * sxy - sx * sy) / denominator;
  if (!(c.slope > 0)) return {};
  c.offset_ns = (sy - c.slope * sx) / n;
  return c;
}

int64_t SpinRequestFor(const SpinCalibration& c, int64_t target_ns) {
  if (target_ns <= 0) return 0;
  const double request = (static_cast<double>(target_ns) - c.offset_ns) / c.slope;
  return request <= 0 ? 0 : std::llround(request);
}

// ---- Buffers

int64_t CublasWorkspaceBytes(ComputeCapability cc) {
  constexpr int64_t kHopperWorkspace = 32 * kMiB;
  constexpr int64_t kPreHopperWorkspace = 4 * kMiB;
  return cc.major >= 9 ? kHopperWorkspace : kPreHopperWorkspace;
}

std::vector<StreamOperands> OperandBytes(const traces::Program& program, ComputeCapability cc) {
  std::vector<StreamOperands> streams(program.streams.size());
  auto gemm = [&](StreamOperands& s, const LtProblem& p) {
    s.a_bytes = std::max(s.a_bytes, p.a_bytes());
    s.b_bytes = std::max(s.b_bytes, p.b_bytes());
    s.c_bytes = std::max(s.c_bytes, p.c_bytes());
    s.workspace_bytes = CublasWorkspaceBytes(cc);
  };
  auto copy = [](StreamOperands& s, int64_t read, int64_t written) {
    s.src_bytes = std::max(s.src_bytes, read);
    s.dst_bytes = std::max(s.dst_bytes, written);
  };
  for (const traces::Op& op : program.ops) {
    if (const auto* kernel = std::get_if<traces::KernelOp>(&op.payload)) {
      StreamOperands& s = streams[static_cast<size_t>(kernel->stream)];
      std::visit(
          [&](const auto& d) {
            using T = std::decay_t<decltype(d)>;
            if constexpr (std::is_same_v<T, traces::GemmDesc>) {
              gemm(s, GemmProblem(d, cc));
            } else if constexpr (std::is_same_v<T, traces::AttentionDesc>) {
              const AttentionProxy a = AttentionProblem(d, cc);
              gemm(s, a.qk);
              gemm(s, a.pv);
              copy(s, a.memory_read_bytes, a.memory_write_bytes);
            } else if constexpr (std::is_same_v<T, traces::MemoryBoundDesc>) {
              copy(s, d.bytes_read, d.bytes_written);
            }
          },
          kernel->compute);
    } else if (const auto* memcpy_op = std::get_if<traces::MemcpyOp>(&op.payload)) {
      // D2D copies read and write device buffers; H2D writes one and D2H reads one (the host
      // side is pinned memory outside the device allocator).
      StreamOperands& s = streams[static_cast<size_t>(memcpy_op->stream)];
      const bool reads_device = memcpy_op->kind != traces::MemcpyKind::kHostToDevice;
      const bool writes_device = memcpy_op->kind != traces::MemcpyKind::kDeviceToHost;
      copy(s, reads_device ? memcpy_op->bytes : 0, writes_device ? memcpy_op->bytes : 0);
    }
  }
  for (StreamOperands& s : streams) {
    for (int64_t* b : {&s.a_bytes, &s.b_bytes, &s.c_bytes, &s.src_bytes, &s.dst_bytes}) {
      *b = RoundUp(*b, kOperandRounding);
    }
    // A read-only memory pass still needs a (never written) destination for its kernel.
    if (s.src_bytes > 0) s.dst_bytes = std::max(s.dst_bytes, kOperandRounding);
  }
  return streams;
}

// ---- Devices

std::optional<int32_t> LocalRankFromEnvironment(const char* (*getenv_fn)(const char*)) {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    const char* value = getenv_fn(name);
    if (value == nullptr || *value == '\0') continue;
    char* end = nullptr;
    const long parsed = std::strtol(value, &end, 10);
    if (*end != '\0' || parsed < 0 || parsed > std::numeric_limits<int32_t>::max()) continue;
    return static_cast<int32_t>(parsed);
  }
  return std::nullopt;
}

StatusOr<DeviceAssignment> AssignDevices(int32_t schedule_world, int32_t mpi_world, int32_t local_rank,
                                         int32_t local_devices) {
  DeviceAssignment a;
  if (mpi_world == schedule_world) {
    if (local_rank < 0 || local_rank >= local_devices) {
      return Status::InvalidInput(fmt::format(
          "this process has local rank {} but its node shows {} CUDA device(s): start at most {} process(es) per "
          "node (one per GPU), e.g. mpirun -np {} --map-by ppr:{}:node",
          local_rank, local_devices, local_devices, schedule_world, std::max(1, local_devices)));
    }
    a.devices.push_back(local_rank);
    return a;
  }
  if (mpi_world == 1 && schedule_world > 1) {
    if (local_devices >= schedule_world) {
      a.one_process_drives_all = true;
      for (int32_t d = 0; d < schedule_world; ++d) a.devices.push_back(d);
      return a;
    }
    return Status::InvalidInput(fmt::format(
        "schedule has {} ranks, the job has 1 process and this node {} CUDA device(s): launch it with mpirun -np {} "
        "(one process per GPU), or run it on a node with {} GPUs",
        schedule_world, local_devices, schedule_world, schedule_world));
  }
  return Status::InvalidInput(fmt::format("schedule has {} ranks, the job has {}: launch it with mpirun -np {}",
                                          schedule_world, mpi_world, schedule_world));
}

std::string NoDeviceMessage(std::string_view cuda_error) { return fmt::format("no CUDA device: {}", cuda_error); }

}  // namespace shardscope::runtime::cuda

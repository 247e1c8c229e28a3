// Names of the schedule's enums, name interning and communicator binding.
#include "shardscope/traces/schedule.h"

#include <array>
#include <initializer_list>
#include <optional>
#include <string>

#include <fmt/format.h>

namespace shardscope::traces {
namespace {

struct DTypeEntry {
  DType dtype;
  std::string_view name;
  std::string_view alias;
  int64_t size;
};
constexpr std::array<DTypeEntry, 10> kDTypes = {{
    {DType::kFloat32, "fp32", "float32", 4},
    {DType::kTFloat32, "tf32", "tfloat32", 4},
    {DType::kBFloat16, "bf16", "bfloat16", 2},
    {DType::kFloat16, "fp16", "float16", 2},
    {DType::kFloat8E4M3, "fp8_e4m3", "float8_e4m3fn", 1},
    {DType::kFloat8E5M2, "fp8_e5m2", "float8_e5m2", 1},
    {DType::kInt8, "int8", "int8", 1},
    {DType::kInt32, "int32", "int32", 4},
    {DType::kInt64, "int64", "int64", 8},
    {DType::kFloat64, "fp64", "float64", 8},
}};

constexpr std::array<std::string_view, 8> kCollectiveNames = {
    "all_gather", "reduce_scatter", "all_reduce", "broadcast", "reduce", "all_to_all", "send", "recv"};
constexpr std::array<std::string_view, 3> kMemcpyNames = {"h2d", "d2h", "d2d"};
constexpr std::array<std::string_view, 5> kPhaseNames = {"", "forward", "backward", "optimizer", "checkpoint"};
constexpr std::array<std::string_view, 12> kOpKindNames = {
    "kernel", "collective", "memcpy", "event_record", "stream_wait_event", "stream_synchronize",
    "device_synchronize", "event_synchronize", "host_work", "allocate", "free",
    "record_stream"};
static_assert(kOpKindNames.size() == std::variant_size_v<OpPayload>);

template <typename Enum, size_t N>
std::optional<Enum> ParseByName(const std::array<std::string_view, N>& names, std::string_view name) {
  for (size_t i = 0; i < N; ++i) {
    if (names[i] == name) return static_cast<Enum>(i);
  }
  return std::nullopt;
}

}  // namespace

int64_t DTypeSize(DType dtype) { return kDTypes[static_cast<size_t>(dtype)].size; }
std::string_view DTypeName(DType dtype) { return kDTypes[static_cast<size_t>(dtype)].name; }
std::optional<DType> ParseDType(std::string_view name) {
  for (const DTypeEntry& entry : kDTypes) {
    if (entry.name == name || entry.alias == name) return entry.dtype;
  }
  return std::nullopt;
}

namespace {
constexpr std::string_view kAttentionImplNames[] = {"flash2", "flash3", "cudnn", "mem_efficient"};
}  // namespace

std::string_view AttentionImplName(AttentionImpl impl) {
  return kAttentionImplNames[static_cast<size_t>(impl)];
}

namespace {

// The product of shape fields, or nullopt past kMaxOperandElements. Checked by division before
// each multiplication, so nothing overflows whatever the factors.
std::optional<int64_t> BoundedProduct(std::initializer_list<int64_t> factors) {
  int64_t product = 1;
  for (int64_t f : factors) {
    if (f <= 0) return int64_t{0};  // non-positive shapes are ValidateSchedule's error
    if (product > kMaxOperandElements / f) return std::nullopt;
    product *= f;
  }
  return product;
}

std::string OperandError(std::string_view kernel, std::string_view operand, std::string_view factors,
                         std::initializer_list<int64_t> values) {
  if (BoundedProduct(values)) return "";
  long double product = 1;
  for (int64_t v : values) product *= static_cast<long double>(v);
  return fmt::format("{} operand {} ({}) has {:.4g} elements, more than the limit of {} (2^48)", kernel, operand,
                     factors, static_cast<double>(product), kMaxOperandElements);
}

}  // namespace

std::string ComputeLimitViolation(const GemmDesc& g) {
  for (std::string error : {OperandError("gemm", "A", "batch x m x k", {g.batch, g.m, g.k}),
                            OperandError("gemm", "B", "batch x k x n", {g.batch, g.k, g.n}),
                            OperandError("gemm", "C", "batch x m x n", {g.batch, g.m, g.n})}) {
    if (!error.empty()) return error;
  }
  return "";
}

std::string ComputeLimitViolation(const AttentionDesc& a) {
  for (std::string error :
       {OperandError("attention", "Q", "batch x heads x seq_q x head_dim", {a.batch, a.heads, a.seq_q, a.head_dim}),
        OperandError("attention", "K", "batch x kv_heads x seq_kv x head_dim",
                     {a.batch, a.kv_heads, a.seq_kv, a.head_dim})}) {
    if (!error.empty()) return error;
  }
  return "";
}

std::optional<AttentionImpl> ParseAttentionImpl(std::string_view name) {
  for (size_t i = 0; i < std::size(kAttentionImplNames); ++i) {
    if (kAttentionImplNames[i] == name) return static_cast<AttentionImpl>(i);
  }
  return std::nullopt;
}

std::string_view TorchScalarTypeName(DType dtype) {
  // c10/core/ScalarType.h: the names of ScalarType's members.
  switch (dtype) {
    case DType::kFloat32:
    case DType::kTFloat32: return "Float";  // tf32 is a math mode on float32 tensors
    case DType::kBFloat16: return "BFloat16";
    case DType::kFloat16: return "Half";
    case DType::kFloat8E4M3: return "Float8_e4m3fn";
    case DType::kFloat8E5M2: return "Float8_e5m2";
    case DType::kInt8: return "Char";
    case DType::kInt32: return "Int";
    case DType::kInt64: return "Long";
    case DType::kFloat64: return "Double";
  }
  return "Float";
}

std::string_view CollectiveTypeName(CollectiveType type) {
  return kCollectiveNames[static_cast<size_t>(type)];
}
std::optional<CollectiveType> ParseCollectiveType(std::string_view name) {
  return ParseByName<CollectiveType>(kCollectiveNames, name);
}
std::string_view MemcpyKindName(MemcpyKind kind) { return kMemcpyNames[static_cast<size_t>(kind)]; }
std::optional<MemcpyKind> ParseMemcpyKind(std::string_view name) {
  return ParseByName<MemcpyKind>(kMemcpyNames, name);
}
std::string_view PhaseName(Phase phase) { return kPhaseNames[static_cast<size_t>(phase)]; }
std::optional<Phase> ParsePhase(std::string_view name) {
  return ParseByName<Phase>(kPhaseNames, name);
}
std::string_view OpKindName(const OpPayload& payload) { return kOpKindNames[payload.index()]; }

NameIndex Program::InternName(std::string_view s) {
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == s) return static_cast<NameIndex>(i);
  }
  names.emplace_back(s);
  return static_cast<NameIndex>(names.size() - 1);
}

Status Schedule::ResolveBindings() {
  for (size_t rank = 0; rank < ranks.size(); ++rank) {
    RankBinding& binding = ranks[rank];
    if (binding.program < 0 || static_cast<size_t>(binding.program) >= programs.size()) {
      return Status::InvalidInput(fmt::format("rank {}: program index {} out of range (have {})",
                                              rank, binding.program, programs.size()));
    }
    const Program& program = programs[static_cast<size_t>(binding.program)];
    if (binding.comm_binding.size() > program.comm_slots.size()) {
      return Status::InvalidInput(fmt::format(
          "rank {}: binds {} communicator slots but program '{}' declares {}", rank,
          binding.comm_binding.size(), program.name, program.comm_slots.size()));
    }
    binding.comm_binding.resize(program.comm_slots.size(), -1);
    for (size_t slot = 0; slot < program.comm_slots.size(); ++slot) {
      if (binding.comm_binding[slot] >= 0) continue;
      for (size_t c = 0; c < communicators.size(); ++c) {
        if (communicators[c].name == program.comm_slots[slot]) {
          binding.comm_binding[slot] = static_cast<int32_t>(c);
          break;
        }
      }
      if (binding.comm_binding[slot] < 0) {
        return Status::InvalidInput(fmt::format(
            "rank {}: communicator slot '{}' of program '{}' is bound to no communicator "
            "(declare a communicator of that name or bind the slot)",
            rank, program.comm_slots[slot], program.name));
      }
    }
  }
  return Status::Ok();
}

}  // namespace shardscope::traces

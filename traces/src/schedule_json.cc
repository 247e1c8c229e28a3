// Reading and writing the JSON form of a Schedule (schema in schedule_json.h).
//
// Reading happens in three steps:
//  1. ScheduleSax (nlohmann SAX) builds a DOM of the document except the elements of
//     /programs/<p>/ops: each op is built alone, converted into a PendingOp (types, keys
//     and enums checked; references still names) and dropped. Ops are the bulk of a
//     schedule, so memory stays close to the size of the result.
//  2. ScheduleReader walks the small DOM, builds the name tables, and resolves the
//     PendingOps' names into indices. Resolution waits for the whole program because JSON
//     objects are unordered: "ops" may come before "streams".
//  3. ResolveBindings() and ValidateSchedule().
#include "json_text.h"
#include "shardscope/traces/schedule_json.h"

#include "shardscope/base/file_io.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace shardscope::traces {
namespace {

using Json = nlohmann::json;

// Real schedules nest six levels deep; the cap bounds the parser's stack on hostile input.
constexpr size_t kMaxDepth = 64;
constexpr size_t kMaxQuotedChars = 64;
constexpr size_t kFileBufferBytes = size_t{1} << 20;
constexpr int64_t kInt32Min = std::numeric_limits<int32_t>::min();
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// The JSON "op" names, in OpPayload order, taken from OpKindName so there is one source.
template <size_t... I>
std::array<std::string_view, sizeof...(I)> MakeOpKindNames(std::index_sequence<I...>) {
  return {OpKindName(OpPayload(std::in_place_index<I>))...};
}
const std::array<std::string_view, std::variant_size_v<OpPayload>>& OpKindNames() {
  static const auto names =
      MakeOpKindNames(std::make_index_sequence<std::variant_size_v<OpPayload>>());
  return names;
}

std::string Quote(std::string_view s) {
  const bool cut = s.size() > kMaxQuotedChars;
  std::string quoted = Json(std::string(s.substr(0, kMaxQuotedChars)))
                           .dump(-1, ' ', false, Json::error_handler_t::replace);
  if (cut) quoted.insert(quoted.size() - 1, "...");
  return quoted;
}

std::string Describe(const Json& value) {
  switch (value.type()) {
    case Json::value_t::object:
      return "an object";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::string:
      return Quote(value.get_ref<const std::string&>());
    default:
      return value.dump();
  }
}

// JSON Pointer segment (RFC 6901): "~" -> "~0", "/" -> "~1".
std::string PointerSegment(std::string_view key) {
  std::string out;
  for (char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

// The same for a file, read again a block at a time (only on errors).
std::string LineColumnInFile(const std::string& path, size_t offset) {
  std::ifstream file(path, std::ios::binary);
  std::vector<char> block(kFileBufferBytes);
  size_t line = 1, column = 1;
  while (offset > 0 && file) {
    file.read(block.data(), static_cast<std::streamsize>(std::min(offset, block.size())));
    const auto got = static_cast<size_t>(file.gcount());
    if (got == 0) break;
    for (size_t i = 0; i < got; ++i) {
      column = block[i] == '\n' ? 1 : column + 1;
      if (block[i] == '\n') ++line;
    }
    offset -= got;
  }
  return fmt::format("{}:{}", line, column);
}

// A JSON path: `base`, or `base` + "/" + `key`, turned into a string only on errors.
struct PathRef {
  PathRef(const std::string& base_path, std::string_view child = {})  // NOLINT: implicit
      : base(base_path), key(child) {}
  std::string str() const { return key.empty() ? base : base + "/" + PointerSegment(key); }
  const std::string& base;
  std::string_view key;
};

// An op whose references are still names.
struct PendingOp {
  Op op;
  std::string stream;  // for ops that have a stream
  std::string ref;     // event, tensor or comm slot name, by kind
  std::optional<std::string> name, module;
};

// ---------------------------------------------------------------------------------------
// Step 2: typed access to the DOM with errors that name source, path and op id.

class ScheduleReader {
 public:
  explicit ScheduleReader(const std::string& source) : source_(source) {}

  Status Fail(const std::string& path, std::string_view message) const {
    return Status::InvalidInput(fmt::format("{}: {}{}: {}", source_, path.empty() ? "/" : path,
                                            op_id_ ? fmt::format(" (op id {})", *op_id_) : "",
                                            message));
  }

  StatusOr<PendingOp> ParseOp(const Json& json, const std::string& path);
  StatusOr<Schedule> ParseDocument(const Json& root, std::vector<std::vector<PendingOp>>& pending);

 private:
  const Json* Find(const Json& object, std::string_view key) const {
    auto it = object.find(key);
    return it == object.end() ? nullptr : &*it;
  }

  Status CheckObject(const Json& value, const std::string& path) const {
    if (!value.is_object())
      return Fail(path, fmt::format("expected an object, got {}", Describe(value)));
    return Status::Ok();
  }
  Status CheckArray(const Json& value, const std::string& path) const {
    if (!value.is_array())
      return Fail(path, fmt::format("expected an array, got {}", Describe(value)));
    return Status::Ok();
  }

  Status CheckKeys(const Json& object, const std::string& path, std::string_view what,
                   const std::vector<std::string_view>& allowed) const {
    for (const auto& [key, value] : object.items()) {
      if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
        return Fail(path + "/" + PointerSegment(key),
                    fmt::format("unknown key {} in {} (expected: {})", Quote(key), what,
                                JoinKeys(allowed)));
      }
    }
    return Status::Ok();
  }

  StatusOr<const Json*> Require(const Json& object, const std::string& path,
                                std::string_view key) const {
    const Json* value = Find(object, key);
    if (value == nullptr) return Fail(path, fmt::format("missing required key \"{}\"", key));
    return value;
  }

  // Paths are only built when an error needs them: reading a big schedule checks millions
  // of fields.
  StatusOr<int64_t> Int(const Json& value, const PathRef& path, int64_t min = kInt64Min,
                        int64_t max = kInt64Max) const {
    const auto out_of_range = [&] {
      return Fail(path.str(), fmt::format("expected an integer in [{}, {}], got {}", min, max,
                                          Describe(value)));
    };
    if (value.is_number_unsigned()) {
      const auto number = value.get<uint64_t>();
      if (number > static_cast<uint64_t>(max)) return out_of_range();
      return static_cast<int64_t>(number);
    }
    if (value.is_number_integer()) {
      const auto number = value.get<int64_t>();
      if (number < min || number > max) return out_of_range();
      return number;
    }
    return Fail(path.str(), fmt::format("expected an integer, got {}", Describe(value)));
  }
  StatusOr<int64_t> IntField(const Json& object, const std::string& path, std::string_view key,
                             int64_t min = kInt64Min, int64_t max = kInt64Max) const {
    SHARDSCOPE_ASSIGN_OR_RETURN(const Json* value, Require(object, path, key));
    return Int(*value, PathRef{path, key}, min, max);
  }
  StatusOr<int64_t> IntFieldOr(const Json& object, const std::string& path, std::string_view key,
                               int64_t fallback, int64_t min = kInt64Min,
                               int64_t max = kInt64Max) const {
    const Json* value = Find(object, key);
    if (value == nullptr) return fallback;
    return Int(*value, PathRef{path, key}, min, max);
  }

  StatusOr<std::string> String(const Json& value, const PathRef& path) const {
    if (!value.is_string()) {
      return Fail(path.str(), fmt::format("expected a string, got {}", Describe(value)));
    }
    return value.get<std::string>();
  }
  StatusOr<std::string> StringField(const Json& object, const std::string& path,
                                    std::string_view key) const {
    SHARDSCOPE_ASSIGN_OR_RETURN(const Json* value, Require(object, path, key));
    return String(*value, PathRef{path, key});
  }
  // A declared name: non-empty, since it is what other parts refer to.
  StatusOr<std::string> Name(const Json& value, const PathRef& path) const {
    SHARDSCOPE_ASSIGN_OR_RETURN(std::string name, String(value, path));
    if (name.empty()) return Fail(path.str(), "expected a non-empty name");
    return name;
  }

  StatusOr<bool> BoolFieldOr(const Json& object, const std::string& path, std::string_view key,
                             bool fallback) const {
    const Json* value = Find(object, key);
    if (value == nullptr) return fallback;
    if (!value->is_boolean()) {
      return Fail(path + "/" + std::string(key),
                  fmt::format("expected true or false, got {}", Describe(*value)));
    }
    return value->get<bool>();
  }

  StatusOr<DType> DTypeFieldOr(const Json& object, const std::string& path) const {
    const Json* value = Find(object, "dtype");
    if (value == nullptr) return DType::kBFloat16;
    SHARDSCOPE_ASSIGN_OR_RETURN(std::string name, String(*value, PathRef{path, "dtype"}));
    std::optional<DType> dtype = ParseDType(name);
    if (!dtype) {
      return Fail(path + "/dtype", fmt::format("unknown dtype {} (expected fp32, tf32, bf16, fp16, "
                                               "fp8_e4m3, fp8_e5m2, int8, int32, int64 or fp64)",
                                               Quote(name)));
    }
    return *dtype;
  }

  // A list of unique declared names; fills `index` with name -> position.
  Status NameList(const Json* value, const std::string& path, std::string_view what,
                  std::vector<std::string>& names,
                  std::unordered_map<std::string, int32_t>& index) const {
    if (value == nullptr) return Status::Ok();
    SHARDSCOPE_RETURN_IF_ERROR(CheckArray(*value, path));
    for (size_t i = 0; i < value->size(); ++i) {
      const std::string element_path = fmt::format("{}/{}", path, i);
      SHARDSCOPE_ASSIGN_OR_RETURN(std::string name, Name((*value)[i], element_path));
      if (!index.emplace(name, static_cast<int32_t>(i)).second) {
        return Fail(element_path, fmt::format("{} {} declared twice", what, Quote(name)));
      }
      names.push_back(std::move(name));
    }
    return Status::Ok();
  }

  StatusOr<ComputeDesc> ParseCompute(const Json& op, const std::string& path) const;
  Status ParseCollective(const Json& op, const std::string& path, PendingOp& pending) const;
  Status ParseProgram(const Json& json, const std::string& path, std::vector<PendingOp>& pending,
                      Program& program);

  const std::string& source_;
  std::optional<int64_t> op_id_;  // set while an op is being read, for messages
};

StatusOr<ComputeDesc> ScheduleReader::ParseCompute(const Json& op, const std::string& path) const {
  static constexpr std::array<std::string_view, 4> kKinds = {"gemm", "attention", "memory",
                                                             "fixed"};
  std::vector<std::string_view> present;
  for (std::string_view kind : kKinds) {
    if (Find(op, kind) != nullptr) present.push_back(kind);
  }
  if (present.size() != 1) {
    return Fail(path, fmt::format("a kernel op needs exactly one of gemm, attention, memory, "
                                  "fixed; got {}",
                                  present.empty() ? "none" : JoinKeys(present)));
  }
  const std::string desc_path = path + "/" + std::string(present[0]);
  const Json& desc = *Find(op, present[0]);
  SHARDSCOPE_RETURN_IF_ERROR(CheckObject(desc, desc_path));
  if (present[0] == "gemm") {
    SHARDSCOPE_RETURN_IF_ERROR(
        CheckKeys(desc, desc_path, "gemm", {"m", "n", "k", "batch", "dtype"}));
    GemmDesc gemm;
    SHARDSCOPE_ASSIGN_OR_RETURN(gemm.m, IntField(desc, desc_path, "m"));
    SHARDSCOPE_ASSIGN_OR_RETURN(gemm.n, IntField(desc, desc_path, "n"));
    SHARDSCOPE_ASSIGN_OR_RETURN(gemm.k, IntField(desc, desc_path, "k"));
    SHARDSCOPE_ASSIGN_OR_RETURN(gemm.batch, IntFieldOr(desc, desc_path, "batch", 1));
    SHARDSCOPE_ASSIGN_OR_RETURN(gemm.dtype, DTypeFieldOr(desc, desc_path));
    return ComputeDesc(gemm);
  }
  if (present[0] == "attention") {
    SHARDSCOPE_RETURN_IF_ERROR(CheckKeys(desc, desc_path, "attention",
                                         {"batch", "heads", "kv_heads", "seq_q", "seq_kv",
                                          "head_dim", "causal", "backward", "dtype", "impl"}));
    AttentionDesc attention;
    SHARDSCOPE_ASSIGN_OR_RETURN(attention.batch, IntField(desc, desc_path, "batch"));
    SHARDSCOPE_ASSIGN_OR_RETURN(attention.heads, IntField(desc, desc_path, "heads"));
    SHARDSCOPE_ASSIGN_OR_RETURN(attention.kv_heads,
                                IntFieldOr(desc, desc_path, "kv_heads", attention.heads));
    SHARDSCOPE_ASSIGN_OR_RETURN(attention.seq_q, IntField(desc, desc_path, "seq_q"));
    SHARDSCOPE_ASSIGN_OR_RETURN(attention.seq_kv,
                                IntFieldOr(desc, desc_path, "seq_kv", attention.seq_q));
    SHARDSCOPE_ASSIGN_OR_RETURN(attention.head_dim, IntField(desc, desc_path, "head_dim"));
    SHARDSCOPE_ASSIGN_OR_RETURN(attention.causal, BoolFieldOr(desc, desc_path, "causal", true));
    SHARDSCOPE_ASSIGN_OR_RETURN(attention.backward,
                                BoolFieldOr(desc, desc_path, "backward", false));
    SHARDSCOPE_ASSIGN_OR_RETURN(attention.dtype, DTypeFieldOr(desc, desc_path));
    if (const Json* impl = Find(desc, "impl")) {
      const std::optional<AttentionImpl> parsed =
          impl->is_string() ? ParseAttentionImpl(impl->get<std::string>()) : std::nullopt;
      if (!parsed) {
        return Fail(desc_path + "/impl",
                    "expected one of \"flash2\", \"flash3\", \"cudnn\", \"mem_efficient\"");
      }
      attention.impl = *parsed;
    }
    return ComputeDesc(attention);
  }
  if (present[0] == "memory") {
    SHARDSCOPE_RETURN_IF_ERROR(
        CheckKeys(desc, desc_path, "memory", {"bytes_read", "bytes_written"}));
    MemoryBoundDesc memory;
    SHARDSCOPE_ASSIGN_OR_RETURN(memory.bytes_read, IntFieldOr(desc, desc_path, "bytes_read", 0));
    SHARDSCOPE_ASSIGN_OR_RETURN(memory.bytes_written,
                                IntFieldOr(desc, desc_path, "bytes_written", 0));
    return ComputeDesc(memory);
  }
  SHARDSCOPE_RETURN_IF_ERROR(CheckKeys(desc, desc_path, "fixed", {"duration_ns"}));
  FixedDurationDesc fixed;
  SHARDSCOPE_ASSIGN_OR_RETURN(fixed.duration_ns, IntField(desc, desc_path, "duration_ns"));
  return ComputeDesc(fixed);
}

Status ScheduleReader::ParseCollective(const Json& op, const std::string& path,
                                       PendingOp& pending) const {
  CollectiveOp collective;
  SHARDSCOPE_ASSIGN_OR_RETURN(std::string type, StringField(op, path, "type"));
  std::optional<CollectiveType> parsed = ParseCollectiveType(type);
  if (!parsed) {
    return Fail(path + "/type", fmt::format("unknown collective type {} (expected all_gather, "
                                            "reduce_scatter, all_reduce, broadcast, reduce, "
                                            "all_to_all, send or recv)",
                                            Quote(type)));
  }
  collective.type = *parsed;
  SHARDSCOPE_ASSIGN_OR_RETURN(pending.ref, StringField(op, path, "comm"));
  SHARDSCOPE_ASSIGN_OR_RETURN(collective.bytes, IntField(op, path, "bytes"));
  SHARDSCOPE_ASSIGN_OR_RETURN(collective.dtype, DTypeFieldOr(op, path));
  const bool p2p =
      collective.type == CollectiveType::kSend || collective.type == CollectiveType::kRecv;
  const bool rooted =
      collective.type == CollectiveType::kBroadcast || collective.type == CollectiveType::kReduce;
  const std::string_view own_key = p2p ? "peer" : "root";
  for (std::string_view key : {"peer", "root"}) {
    if (Find(op, key) != nullptr && (!(p2p || rooted) || key != own_key)) {
      return Fail(path + "/" + std::string(key),
                  fmt::format("a {} collective takes no \"{}\" (peer: send/recv; root: "
                              "broadcast/reduce)",
                              type, key));
    }
  }
  if (p2p || rooted) {
    SHARDSCOPE_ASSIGN_OR_RETURN(const int64_t peer,
                                IntField(op, path, own_key, kInt32Min, kInt32Max));
    collective.peer = static_cast<int32_t>(peer);
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(collective.oom_sync, BoolFieldOr(op, path, "oom_sync", false));
  pending.op.payload = collective;
  return Status::Ok();
}

StatusOr<PendingOp> ScheduleReader::ParseOp(const Json& json, const std::string& path) {
  op_id_.reset();
  SHARDSCOPE_RETURN_IF_ERROR(CheckObject(json, path));
  PendingOp pending;
  Op& op = pending.op;
  SHARDSCOPE_ASSIGN_OR_RETURN(op.id, IntField(json, path, "id"));
  op_id_ = op.id;
  SHARDSCOPE_ASSIGN_OR_RETURN(std::string kind_name, StringField(json, path, "op"));
  const auto& kinds = OpKindNames();
  const auto kind_it = std::find(kinds.begin(), kinds.end(), kind_name);
  if (kind_it == kinds.end()) {
    return Fail(path + "/op", fmt::format("unknown op kind {} (expected: {})", Quote(kind_name),
                                          JoinKeys({kinds.begin(), kinds.end()})));
  }
  const auto kind = static_cast<size_t>(kind_it - kinds.begin());

  std::vector<std::string_view> allowed = {"id", "op", "name", "module", "phase", "micro_batch"};
  const auto allow = [&allowed](std::initializer_list<std::string_view> keys) {
    allowed.insert(allowed.end(), keys.begin(), keys.end());
  };
  // OpPayload alternatives, in order.
  switch (kind) {
    case 0:
      allow({"stream", "gemm", "attention", "memory", "fixed"});
      break;
    case 1:
      allow({"type", "comm", "stream", "bytes", "dtype", "peer", "root", "oom_sync"});
      break;
    case 2:
      allow({"kind", "stream", "bytes"});
      break;
    case 3:
      allow({"event", "stream"});
      break;
    case 4:
      allow({"stream", "event"});
      break;
    case 5:
      allow({"stream"});
      break;
    case 6:
      break;
    case 7:
      allow({"event"});
      break;
    case 8:
      allow({"duration_ns"});
      break;
    case 9:
      allow({"tensor", "bytes", "stream"});
      break;
    case 11:
      allow({"tensor", "stream"});
      break;
    case 10:
      allow({"tensor"});
      break;
    default:
      return Status::Internal(fmt::format("op kind {} has no JSON keys", kind_name));
  }
  SHARDSCOPE_RETURN_IF_ERROR(CheckKeys(json, path, fmt::format("a {} op", kind_name), allowed));

  if (const Json* name = Find(json, "name")) {
    SHARDSCOPE_ASSIGN_OR_RETURN(pending.name, String(*name, PathRef{path, "name"}));
  }
  if (const Json* module = Find(json, "module")) {
    SHARDSCOPE_ASSIGN_OR_RETURN(pending.module, String(*module, PathRef{path, "module"}));
  }
  if (const Json* phase = Find(json, "phase")) {
    SHARDSCOPE_ASSIGN_OR_RETURN(std::string phase_name, String(*phase, PathRef{path, "phase"}));
    std::optional<Phase> parsed = ParsePhase(phase_name);
    if (!parsed) {
      return Fail(path + "/phase", fmt::format("unknown phase {} (expected forward, backward, "
                                               "optimizer or checkpoint)",
                                               Quote(phase_name)));
    }
    op.tags.phase = *parsed;
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(const int64_t micro_batch,
                              IntFieldOr(json, path, "micro_batch", -1, kInt32Min, kInt32Max));
  op.tags.micro_batch = static_cast<int32_t>(micro_batch);

  // Every kind that has a stream requires it.
  if (std::find(allowed.begin(), allowed.end(), "stream") != allowed.end()) {
    SHARDSCOPE_ASSIGN_OR_RETURN(pending.stream, StringField(json, path, "stream"));
  }
  switch (kind) {
    case 0: {
      KernelOp kernel;
      SHARDSCOPE_ASSIGN_OR_RETURN(kernel.compute, ParseCompute(json, path));
      op.payload = kernel;
      break;
    }
    case 1: {
      SHARDSCOPE_RETURN_IF_ERROR(ParseCollective(json, path, pending));
      break;
    }
    case 2: {
      MemcpyOp copy;
      SHARDSCOPE_ASSIGN_OR_RETURN(std::string copy_kind, StringField(json, path, "kind"));
      std::optional<MemcpyKind> parsed = ParseMemcpyKind(copy_kind);
      if (!parsed) {
        return Fail(path + "/kind", fmt::format("unknown memcpy kind {} (expected h2d, d2h or d2d)",
                                                Quote(copy_kind)));
      }
      copy.kind = *parsed;
      SHARDSCOPE_ASSIGN_OR_RETURN(copy.bytes, IntField(json, path, "bytes"));
      op.payload = copy;
      break;
    }
    case 3: {
      SHARDSCOPE_ASSIGN_OR_RETURN(pending.ref, StringField(json, path, "event"));
      op.payload = EventRecordOp{};
      break;
    }
    case 4: {
      SHARDSCOPE_ASSIGN_OR_RETURN(pending.ref, StringField(json, path, "event"));
      op.payload = StreamWaitEventOp{};
      break;
    }
    case 5:
      op.payload = StreamSynchronizeOp{};
      break;
    case 6:
      op.payload = DeviceSynchronizeOp{};
      break;
    case 7: {
      SHARDSCOPE_ASSIGN_OR_RETURN(pending.ref, StringField(json, path, "event"));
      op.payload = EventSynchronizeOp{};
      break;
    }
    case 8: {
      HostWorkOp host;
      SHARDSCOPE_ASSIGN_OR_RETURN(host.duration_ns, IntField(json, path, "duration_ns"));
      op.payload = host;
      break;
    }
    case 9: {
      AllocateOp allocate;
      SHARDSCOPE_ASSIGN_OR_RETURN(pending.ref, StringField(json, path, "tensor"));
      SHARDSCOPE_ASSIGN_OR_RETURN(allocate.bytes, IntField(json, path, "bytes"));
      op.payload = allocate;
      break;
    }
    case 10: {
      SHARDSCOPE_ASSIGN_OR_RETURN(pending.ref, StringField(json, path, "tensor"));
      op.payload = FreeOp{};
      break;
    }
    case 11: {
      SHARDSCOPE_ASSIGN_OR_RETURN(pending.ref, StringField(json, path, "tensor"));
      op.payload = RecordStreamOp{};
      break;
    }
    default:
      break;
  }
  op_id_.reset();
  return pending;
}

Status ScheduleReader::ParseProgram(const Json& json, const std::string& path,
                                    std::vector<PendingOp>& pending, Program& program) {
  SHARDSCOPE_RETURN_IF_ERROR(CheckObject(json, path));
  SHARDSCOPE_RETURN_IF_ERROR(
      CheckKeys(json, path, "a program",
                {"name", "streams", "events", "tensors", "comm_slots", "names", "ops"}));
  SHARDSCOPE_ASSIGN_OR_RETURN(const Json* name, Require(json, path, "name"));
  SHARDSCOPE_ASSIGN_OR_RETURN(program.name, Name(*name, path + "/name"));

  const std::string streams_path = path + "/streams";
  SHARDSCOPE_ASSIGN_OR_RETURN(const Json* streams, Require(json, path, "streams"));
  SHARDSCOPE_RETURN_IF_ERROR(CheckArray(*streams, streams_path));
  if (streams->empty()) return Fail(streams_path, "expected at least one stream");
  std::unordered_map<std::string, int32_t> stream_index;
  for (size_t i = 0; i < streams->size(); ++i) {
    const std::string stream_path = fmt::format("{}/{}", streams_path, i);
    const Json& stream_json = (*streams)[i];
    SHARDSCOPE_RETURN_IF_ERROR(CheckObject(stream_json, stream_path));
    SHARDSCOPE_RETURN_IF_ERROR(
        CheckKeys(stream_json, stream_path, "a stream", {"name", "priority"}));
    StreamDecl stream;
    SHARDSCOPE_ASSIGN_OR_RETURN(const Json* stream_name, Require(stream_json, stream_path, "name"));
    SHARDSCOPE_ASSIGN_OR_RETURN(stream.name, Name(*stream_name, stream_path + "/name"));
    SHARDSCOPE_ASSIGN_OR_RETURN(
        const int64_t priority,
        IntFieldOr(stream_json, stream_path, "priority", 0, kInt32Min, kInt32Max));
    stream.priority = static_cast<int32_t>(priority);
    if (!stream_index.emplace(stream.name, static_cast<int32_t>(i)).second) {
      return Fail(stream_path + "/name",
                  fmt::format("stream {} declared twice", Quote(stream.name)));
    }
    program.streams.push_back(std::move(stream));
  }
  std::unordered_map<std::string, int32_t> event_index, tensor_index, slot_index;
  SHARDSCOPE_RETURN_IF_ERROR(
      NameList(Find(json, "events"), path + "/events", "event", program.events, event_index));
  SHARDSCOPE_RETURN_IF_ERROR(
      NameList(Find(json, "tensors"), path + "/tensors", "tensor", program.tensors, tensor_index));
  SHARDSCOPE_RETURN_IF_ERROR(NameList(Find(json, "comm_slots"), path + "/comm_slots",
                                      "communicator slot", program.comm_slots, slot_index));

  // Op and module names are interned; "names" (if given) fixes the table's start.
  std::unordered_map<std::string, NameIndex> name_index;
  if (const Json* names = Find(json, "names")) {
    SHARDSCOPE_RETURN_IF_ERROR(CheckArray(*names, path + "/names"));
    for (size_t i = 0; i < names->size(); ++i) {
      SHARDSCOPE_ASSIGN_OR_RETURN(std::string entry,
                                  String((*names)[i], fmt::format("{}/names/{}", path, i)));
      name_index.emplace(entry, static_cast<NameIndex>(i));  // first occurrence wins
      program.names.push_back(std::move(entry));
    }
  }
  const auto intern = [&](std::string& s) {
    auto [it, inserted] = name_index.try_emplace(s, static_cast<NameIndex>(program.names.size()));
    if (inserted) program.names.push_back(std::move(s));
    return it->second;
  };

  if (const Json* ops = Find(json, "ops"))
    SHARDSCOPE_RETURN_IF_ERROR(CheckArray(*ops, path + "/ops"));
  program.ops.reserve(pending.size());
  for (size_t i = 0; i < pending.size(); ++i) {
    PendingOp& p = pending[i];
    Op& op = p.op;
    op_id_ = op.id;
    const auto resolve = [&](const std::unordered_map<std::string, int32_t>& index,
                             const std::string& wanted, std::string_view key, std::string_view what,
                             std::string_view table) -> StatusOr<int32_t> {
      auto it = index.find(wanted);
      if (it == index.end()) {
        return Fail(fmt::format("{}/ops/{}/{}", path, i, key),
                    fmt::format("expected {} name declared in {}/{}, got {}", what, path, table,
                                Quote(wanted)));
      }
      return it->second;
    };
    const auto stream = [&]() {
      return resolve(stream_index, p.stream, "stream", "a stream", "streams");
    };
    const auto event = [&](std::string_view key) {
      return resolve(event_index, p.ref, key, "an event", "events");
    };
    const auto tensor = [&]() {
      return resolve(tensor_index, p.ref, "tensor", "a tensor", "tensors");
    };
    if (auto* kernel = std::get_if<KernelOp>(&op.payload)) {
      SHARDSCOPE_ASSIGN_OR_RETURN(kernel->stream, stream());
    } else if (auto* collective = std::get_if<CollectiveOp>(&op.payload)) {
      SHARDSCOPE_ASSIGN_OR_RETURN(collective->stream, stream());
      SHARDSCOPE_ASSIGN_OR_RETURN(collective->comm, resolve(slot_index, p.ref, "comm",
                                                            "a communicator slot", "comm_slots"));
    } else if (auto* copy = std::get_if<MemcpyOp>(&op.payload)) {
      SHARDSCOPE_ASSIGN_OR_RETURN(copy->stream, stream());
    } else if (auto* record = std::get_if<EventRecordOp>(&op.payload)) {
      SHARDSCOPE_ASSIGN_OR_RETURN(record->event, event("event"));
      SHARDSCOPE_ASSIGN_OR_RETURN(record->stream, stream());
    } else if (auto* wait = std::get_if<StreamWaitEventOp>(&op.payload)) {
      SHARDSCOPE_ASSIGN_OR_RETURN(wait->stream, stream());
      SHARDSCOPE_ASSIGN_OR_RETURN(wait->event, event("event"));
    } else if (auto* sync = std::get_if<StreamSynchronizeOp>(&op.payload)) {
      SHARDSCOPE_ASSIGN_OR_RETURN(sync->stream, stream());
    } else if (auto* event_sync = std::get_if<EventSynchronizeOp>(&op.payload)) {
      SHARDSCOPE_ASSIGN_OR_RETURN(event_sync->event, event("event"));
    } else if (auto* allocate = std::get_if<AllocateOp>(&op.payload)) {
      SHARDSCOPE_ASSIGN_OR_RETURN(allocate->tensor, tensor());
      SHARDSCOPE_ASSIGN_OR_RETURN(allocate->stream, stream());
    } else if (auto* release = std::get_if<FreeOp>(&op.payload)) {
      SHARDSCOPE_ASSIGN_OR_RETURN(release->tensor, tensor());
    } else if (auto* record_stream = std::get_if<RecordStreamOp>(&op.payload)) {
      SHARDSCOPE_ASSIGN_OR_RETURN(record_stream->tensor, tensor());
      SHARDSCOPE_ASSIGN_OR_RETURN(record_stream->stream, stream());
    }
    if (p.name) op.name = intern(*p.name);
    if (p.module) op.tags.module = intern(*p.module);
    program.ops.push_back(std::move(op));
  }
  op_id_.reset();
  pending.clear();
  pending.shrink_to_fit();
  return Status::Ok();
}

StatusOr<Schedule> ScheduleReader::ParseDocument(const Json& root,
                                                 std::vector<std::vector<PendingOp>>& pending) {
  SHARDSCOPE_RETURN_IF_ERROR(CheckObject(root, ""));
  SHARDSCOPE_RETURN_IF_ERROR(CheckKeys(
      root, "", "the schedule", {"version", "metadata", "communicators", "programs", "ranks"}));
  Schedule schedule;
  SHARDSCOPE_ASSIGN_OR_RETURN(const int64_t version, IntField(root, "", "version"));
  if (version != kScheduleVersion) {
    return Fail("/version", fmt::format("unsupported schedule version {} (this build reads "
                                        "version {})",
                                        version, kScheduleVersion));
  }
  schedule.version = static_cast<int>(version);

  if (const Json* metadata = Find(root, "metadata")) {
    SHARDSCOPE_RETURN_IF_ERROR(CheckObject(*metadata, "/metadata"));
    for (const auto& [key, value] : metadata->items()) {
      SHARDSCOPE_ASSIGN_OR_RETURN(schedule.metadata[key],
                                  String(value, "/metadata/" + PointerSegment(key)));
    }
  }

  std::unordered_map<std::string, int32_t> communicator_index;
  if (const Json* communicators = Find(root, "communicators")) {
    SHARDSCOPE_RETURN_IF_ERROR(CheckArray(*communicators, "/communicators"));
    for (size_t c = 0; c < communicators->size(); ++c) {
      const std::string path = fmt::format("/communicators/{}", c);
      const Json& json = (*communicators)[c];
      SHARDSCOPE_RETURN_IF_ERROR(CheckObject(json, path));
      SHARDSCOPE_RETURN_IF_ERROR(CheckKeys(json, path, "a communicator", {"name", "ranks"}));
      Communicator communicator;
      SHARDSCOPE_ASSIGN_OR_RETURN(const Json* name, Require(json, path, "name"));
      SHARDSCOPE_ASSIGN_OR_RETURN(communicator.name, Name(*name, path + "/name"));
      if (!communicator_index.emplace(communicator.name, static_cast<int32_t>(c)).second) {
        return Fail(path + "/name",
                    fmt::format("communicator {} declared twice", Quote(communicator.name)));
      }
      SHARDSCOPE_ASSIGN_OR_RETURN(const Json* ranks, Require(json, path, "ranks"));
      SHARDSCOPE_RETURN_IF_ERROR(CheckArray(*ranks, path + "/ranks"));
      communicator.ranks.reserve(ranks->size());
      for (size_t i = 0; i < ranks->size(); ++i) {
        SHARDSCOPE_ASSIGN_OR_RETURN(
            const int64_t rank,
            Int((*ranks)[i], fmt::format("{}/ranks/{}", path, i), 0, kInt32Max));
        communicator.ranks.push_back(static_cast<int32_t>(rank));
      }
      schedule.communicators.push_back(std::move(communicator));
    }
  }

  std::unordered_map<std::string, int32_t> program_index;
  SHARDSCOPE_ASSIGN_OR_RETURN(const Json* programs, Require(root, "", "programs"));
  SHARDSCOPE_RETURN_IF_ERROR(CheckArray(*programs, "/programs"));
  pending.resize(std::max(pending.size(), programs->size()));
  schedule.programs.resize(programs->size());
  for (size_t p = 0; p < programs->size(); ++p) {
    const std::string path = fmt::format("/programs/{}", p);
    SHARDSCOPE_RETURN_IF_ERROR(
        ParseProgram((*programs)[p], path, pending[p], schedule.programs[p]));
    if (!program_index.emplace(schedule.programs[p].name, static_cast<int32_t>(p)).second) {
      return Fail(path + "/name",
                  fmt::format("program {} declared twice", Quote(schedule.programs[p].name)));
    }
  }

  SHARDSCOPE_ASSIGN_OR_RETURN(const Json* ranks, Require(root, "", "ranks"));
  SHARDSCOPE_RETURN_IF_ERROR(CheckArray(*ranks, "/ranks"));
  schedule.ranks.reserve(ranks->size());
  for (size_t r = 0; r < ranks->size(); ++r) {
    const std::string path = fmt::format("/ranks/{}", r);
    const Json& json = (*ranks)[r];
    SHARDSCOPE_RETURN_IF_ERROR(CheckObject(json, path));
    SHARDSCOPE_RETURN_IF_ERROR(CheckKeys(json, path, "a rank", {"rank", "program", "bind"}));
    SHARDSCOPE_ASSIGN_OR_RETURN(const int64_t rank, IntField(json, path, "rank"));
    if (rank != static_cast<int64_t>(r)) {
      return Fail(path + "/rank", fmt::format("expected {} (ranks are listed 0..N-1 in order), "
                                              "got {}",
                                              r, rank));
    }
    SHARDSCOPE_ASSIGN_OR_RETURN(const std::string program_name, StringField(json, path, "program"));
    auto program_it = program_index.find(program_name);
    if (program_it == program_index.end()) {
      return Fail(path + "/program", fmt::format("expected a program name declared in /programs, "
                                                 "got {}",
                                                 Quote(program_name)));
    }
    RankBinding binding;
    binding.program = program_it->second;
    const Program& program = schedule.programs[static_cast<size_t>(binding.program)];
    binding.comm_binding.assign(program.comm_slots.size(), -1);
    if (const Json* bind = Find(json, "bind")) {
      SHARDSCOPE_RETURN_IF_ERROR(CheckObject(*bind, path + "/bind"));
      for (const auto& [slot_name, comm_json] : bind->items()) {
        const std::string slot_path = path + "/bind/" + PointerSegment(slot_name);
        auto slot = std::find(program.comm_slots.begin(), program.comm_slots.end(), slot_name);
        if (slot == program.comm_slots.end()) {
          return Fail(
              slot_path,
              fmt::format("program {} declares no communicator slot {} "
                          "(slots: {})",
                          Quote(program.name), Quote(slot_name),
                          JoinKeys({program.comm_slots.begin(), program.comm_slots.end()})));
        }
        SHARDSCOPE_ASSIGN_OR_RETURN(const std::string comm_name, String(comm_json, slot_path));
        auto comm = communicator_index.find(comm_name);
        if (comm == communicator_index.end()) {
          return Fail(slot_path, fmt::format("expected a communicator name declared in "
                                             "/communicators, got {}",
                                             Quote(comm_name)));
        }
        binding.comm_binding[static_cast<size_t>(slot - program.comm_slots.begin())] = comm->second;
      }
    }
    schedule.ranks.push_back(std::move(binding));
  }
  return schedule;
}

// ---------------------------------------------------------------------------------------
// Step 1: the SAX handler.

// Builds a JSON value from SAX events. Pointers on the stack stay valid: a container only
// grows while it is the innermost open one.
class DomBuilder {
 public:
  void Reset() {
    root_ = Json();
    stack_.clear();
  }
  // Returns false if `key` repeats a key of the enclosing object.
  bool Add(Json value, const std::string& key, bool container) {
    Json* slot = nullptr;
    if (stack_.empty()) {
      root_ = std::move(value);
      slot = &root_;
    } else if (Json& parent = *stack_.back(); parent.is_array()) {
      parent.push_back(std::move(value));
      slot = &parent.back();
    } else {
      auto [it, inserted] = parent.emplace(key, std::move(value));
      if (!inserted) return false;
      slot = &*it;
    }
    if (container) stack_.push_back(slot);
    return true;
  }
  void End() { stack_.pop_back(); }
  Json& root() { return root_; }

 private:
  Json root_;
  std::vector<Json*> stack_;
};

class ScheduleSax final : public nlohmann::json_sax<Json> {
 public:
  explicit ScheduleSax(ScheduleReader& reader) : reader_(reader) {}

  Json& document() { return document_.root(); }
  std::vector<std::vector<PendingOp>>& pending() { return pending_; }
  const std::optional<Status>& semantic_error() const { return semantic_error_; }
  std::optional<size_t> syntax_error_offset() const { return syntax_error_offset_; }
  const std::string& syntax_error_text() const { return syntax_error_text_; }

  bool null() override { return Value(Json(nullptr), Kind::kScalar); }
  bool boolean(bool value) override { return Value(Json(value), Kind::kScalar); }
  bool number_integer(number_integer_t value) override { return Value(Json(value), Kind::kScalar); }
  bool number_unsigned(number_unsigned_t value) override {
    return Value(Json(value), Kind::kScalar);
  }
  bool number_float(number_float_t value, const string_t& /*text*/) override {
    return Value(Json(value), Kind::kScalar);
  }
  bool string(string_t& value) override { return Value(Json(std::move(value)), Kind::kScalar); }
  bool binary(binary_t& /*value*/) override {
    return Fail(reader_.Fail(CurrentPath(), "unexpected binary value"));
  }
  bool key(string_t& value) override {
    key_ = std::move(value);
    return true;
  }
  bool start_object(std::size_t /*elements*/) override {
    return Value(Json::object(), Kind::kObject);
  }
  bool start_array(std::size_t /*elements*/) override { return Value(Json::array(), Kind::kArray); }
  bool end_object() override { return End(); }
  bool end_array() override { return End(); }

  bool parse_error(std::size_t position, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& error) override {
    syntax_error_offset_ = position > 0 ? position - 1 : 0;
    syntax_error_text_ = JsonErrorText(error);
    return false;
  }

 private:
  enum class Kind : uint8_t { kScalar, kObject, kArray };
  struct Frame {
    bool is_array = false;
    std::string segment;  // this container's key or index in its parent
    size_t next_index = 0;
  };

  bool Fail(Status status) {
    semantic_error_ = std::move(status);
    return false;
  }

  // The segment of the value that starts now (consumes an array index).
  std::string NextSegment() {
    if (frames_.empty()) return "";
    Frame& top = frames_.back();
    return top.is_array ? std::to_string(top.next_index++) : PointerSegment(key_);
  }
  std::string PathOf(const std::string& segment) const {
    std::string path;
    for (size_t i = 1; i < frames_.size(); ++i) path += "/" + frames_[i].segment;
    if (!frames_.empty()) path += "/" + segment;
    return path;
  }
  std::string CurrentPath() const {
    if (frames_.empty()) return "";
    const Frame& top = frames_.back();
    return PathOf(top.is_array ? std::to_string(top.next_index) : PointerSegment(key_));
  }

  // /programs/<p>/ops: [root object, programs array, program object, ops array].
  bool AtOpsArray() const {
    return frames_.size() == 4 && !frames_[0].is_array && frames_[1].is_array &&
           frames_[1].segment == "programs" && !frames_[2].is_array && frames_[3].is_array &&
           frames_[3].segment == "ops";
  }

  bool Value(Json value, Kind kind) {
    const bool container = kind != Kind::kScalar;
    const bool starts_op = op_depth_ == 0 && AtOpsArray();
    std::string segment = NextSegment();
    if (starts_op) {
      op_.Reset();
      op_program_ = frames_[1].next_index - 1;
      op_index_ = frames_[3].next_index - 1;
    }
    const bool in_op = starts_op || op_depth_ > 0;
    if (!(in_op ? op_ : document_).Add(std::move(value), key_, container)) {
      return Fail(reader_.Fail(PathOf(segment), fmt::format("duplicate key {}", Quote(key_))));
    }
    if (container) {
      if (frames_.size() >= kMaxDepth) {
        return Fail(
            reader_.Fail(PathOf(segment), fmt::format("nested deeper than {} levels", kMaxDepth)));
      }
      frames_.push_back(Frame{kind == Kind::kArray, std::move(segment), 0});
      if (in_op) ++op_depth_;
      return true;
    }
    return starts_op ? FinishOp() : true;
  }

  bool End() {
    frames_.pop_back();
    if (op_depth_ > 0) {
      op_.End();
      return --op_depth_ == 0 ? FinishOp() : true;
    }
    document_.End();
    return true;
  }

  bool FinishOp() {
    const std::string path = fmt::format("/programs/{}/ops/{}", op_program_, op_index_);
    StatusOr<PendingOp> op = reader_.ParseOp(op_.root(), path);
    if (!op.ok()) return Fail(op.status());
    if (pending_.size() <= op_program_) pending_.resize(op_program_ + 1);
    pending_[op_program_].push_back(std::move(op).value());
    op_.Reset();
    return true;
  }

  ScheduleReader& reader_;
  DomBuilder document_;
  DomBuilder op_;
  std::vector<Frame> frames_;
  std::string key_;
  size_t op_depth_ = 0;  // open containers of the op being built
  size_t op_program_ = 0, op_index_ = 0;
  std::vector<std::vector<PendingOp>> pending_;
  std::optional<Status> semantic_error_;
  std::optional<size_t> syntax_error_offset_;
  std::string syntax_error_text_;
};

template <typename Parse, typename LineColumnFn>
StatusOr<Schedule> RunScheduleSax(const std::string& source, Parse parse,
                                  LineColumnFn line_column) {
  ScheduleReader reader(source);
  ScheduleSax sax(reader);
  StatusOr<Schedule> schedule =
      Status::Internal(fmt::format("{}: schedule parser stopped without an error", source));
  try {
    if (parse(sax)) {
      schedule = reader.ParseDocument(sax.document(), sax.pending());
    } else if (sax.semantic_error()) {
      return *sax.semantic_error();
    } else if (sax.syntax_error_offset()) {
      return Status::InvalidInput(fmt::format("{}:{}: invalid JSON: {}", source,
                                              line_column(*sax.syntax_error_offset()),
                                              sax.syntax_error_text()));
    }
  } catch (const std::exception& e) {
    // Only allocation failures or a library bug can get here.
    return Status::InvalidInput(fmt::format("{}: cannot read schedule: {}", source, e.what()));
  }
  if (!schedule.ok()) return schedule;
  SHARDSCOPE_RETURN_IF_ERROR(schedule->ResolveBindings().WithContext(source));
  SHARDSCOPE_RETURN_IF_ERROR(ValidateSchedule(*schedule).WithContext(source));
  return schedule;
}

// ---------------------------------------------------------------------------------------
// Writing.

class ScheduleWriter {
 public:
  std::string Write(const Schedule& schedule) {
    out_ = "{\n";
    fmt::format_to(Out(), "  \"version\": {},\n  \"metadata\": {{", schedule.version);
    bool first = true;
    for (const auto& [key, value] : schedule.metadata) {
      out_ += first ? "" : ", ";
      first = false;
      String(key);
      out_ += ": ";
      String(value);
    }
    out_ += "},\n  \"communicators\": [";
    for (size_t c = 0; c < schedule.communicators.size(); ++c) {
      const Communicator& comm = schedule.communicators[c];
      out_ += c == 0 ? "\n    {\"name\": " : ",\n    {\"name\": ";
      String(comm.name);
      out_ += ", \"ranks\": [";
      for (size_t i = 0; i < comm.ranks.size(); ++i) {
        fmt::format_to(Out(), "{}{}", i == 0 ? "" : ", ", comm.ranks[i]);
      }
      out_ += "]}";
    }
    out_ += schedule.communicators.empty() ? "],\n" : "\n  ],\n";
    out_ += "  \"programs\": [";
    for (size_t p = 0; p < schedule.programs.size(); ++p) {
      out_ += p == 0 ? "\n" : ",\n";
      WriteProgram(schedule.programs[p]);
    }
    out_ += schedule.programs.empty() ? "],\n" : "\n  ],\n";
    out_ += "  \"ranks\": [";
    for (size_t r = 0; r < schedule.ranks.size(); ++r) {
      out_ += r == 0 ? "\n" : ",\n";
      WriteRank(schedule, static_cast<int32_t>(r));
    }
    out_ += schedule.ranks.empty() ? "]\n}\n" : "\n  ]\n}\n";
    return std::move(out_);
  }

 private:
  std::back_insert_iterator<std::string> Out() { return std::back_inserter(out_); }

  void String(std::string_view s) {
    // Most names need no escaping; the rest goes through nlohmann's serializer, which
    // escapes and replaces invalid UTF-8 with U+FFFD.
    const bool plain = std::all_of(
        s.begin(), s.end(), [](char c) { return c >= 0x20 && c < 0x7f && c != '"' && c != '\\'; });
    if (plain) {
      out_ += '"';
      out_ += s;
      out_ += '"';
      return;
    }
    out_ += Json(std::string(s)).dump(-1, ' ', false, Json::error_handler_t::replace);
  }
  void Key(std::string_view key) {
    out_ += ", ";
    String(key);
    out_ += ": ";
  }
  void IntField(std::string_view key, int64_t value) {
    Key(key);
    fmt::format_to(Out(), "{}", value);
  }
  void StringField(std::string_view key, std::string_view value) {
    Key(key);
    String(value);
  }
  // A reference by name; an out-of-range index is written as the bare number, which the
  // reader rejects, so an invalid schedule never round-trips silently.
  template <typename Table, typename NameOf>
  void RefField(std::string_view key, const Table& table, int32_t index, NameOf name_of) {
    Key(key);
    if (index >= 0 && static_cast<size_t>(index) < table.size()) {
      String(name_of(table[static_cast<size_t>(index)]));
    } else {
      fmt::format_to(Out(), "{}", index);
    }
  }
  void Names(std::string_view key, const std::vector<std::string>& names) {
    out_ += ",\n      ";
    String(key);
    out_ += ": [";
    for (size_t i = 0; i < names.size(); ++i) {
      if (i > 0) out_ += ", ";
      String(names[i]);
    }
    out_ += ']';
  }

  // Whether reading the ops back would rebuild `program.names` exactly.
  static bool NamesAreCanonical(const Program& program) {
    std::unordered_map<std::string_view, NameIndex> seen;
    size_t next = 0;
    const auto check = [&](NameIndex index) {
      if (index == kNoName) return true;
      if (index < 0 || static_cast<size_t>(index) >= program.names.size()) return false;
      auto [it, inserted] =
          seen.try_emplace(program.names[static_cast<size_t>(index)], static_cast<NameIndex>(next));
      if (inserted) ++next;
      return it->second == index;
    };
    for (const Op& op : program.ops) {
      if (!check(op.name) || !check(op.tags.module)) return false;
    }
    return next == program.names.size();
  }

  void WriteProgram(const Program& program) {
    out_ += "    {\n      \"name\": ";
    String(program.name);
    out_ += ",\n      \"streams\": [";
    for (size_t s = 0; s < program.streams.size(); ++s) {
      out_ += s == 0 ? "{\"name\": " : ", {\"name\": ";
      String(program.streams[s].name);
      fmt::format_to(Out(), ", \"priority\": {}}}", program.streams[s].priority);
    }
    out_ += ']';
    Names("events", program.events);
    Names("tensors", program.tensors);
    Names("comm_slots", program.comm_slots);
    if (!NamesAreCanonical(program)) Names("names", program.names);
    out_ += ",\n      \"ops\": [";
    for (size_t i = 0; i < program.ops.size(); ++i) {
      out_ += i == 0 ? "\n        " : ",\n        ";
      WriteOp(program, program.ops[i]);
    }
    out_ += program.ops.empty() ? "]\n    }" : "\n      ]\n    }";
  }

  void WriteOp(const Program& program, const Op& op) {
    fmt::format_to(Out(), "{{\"id\": {}", op.id);
    StringField("op", OpKindName(op.payload));
    const auto name_ref = [&](std::string_view key, NameIndex index) {
      if (index != kNoName)
        RefField(key, program.names, index,
                 [](const std::string& s) -> std::string_view { return s; });
    };
    name_ref("name", op.name);
    const auto stream = [&](StreamIndex index) {
      RefField("stream", program.streams, index,
               [](const StreamDecl& s) -> std::string_view { return s.name; });
    };
    const auto named = [](const std::string& s) -> std::string_view { return s; };
    if (const auto* kernel = std::get_if<KernelOp>(&op.payload)) {
      stream(kernel->stream);
      WriteCompute(kernel->compute);
    } else if (const auto* collective = std::get_if<CollectiveOp>(&op.payload)) {
      StringField("type", CollectiveTypeName(collective->type));
      RefField("comm", program.comm_slots, collective->comm, named);
      stream(collective->stream);
      IntField("bytes", collective->bytes);
      StringField("dtype", DTypeName(collective->dtype));
      const bool rooted = collective->type == CollectiveType::kBroadcast ||
                          collective->type == CollectiveType::kReduce;
      const bool p2p =
          collective->type == CollectiveType::kSend || collective->type == CollectiveType::kRecv;
      // A peer on another type is invalid; writing it lets the reader say so.
      if (rooted) {
        IntField("root", collective->peer);
      } else if (p2p || collective->peer != -1) {
        IntField("peer", collective->peer);
      }
      if (collective->oom_sync) {  // absent when false: older schedules stay byte-identical
        Key("oom_sync");
        out_ += "true";
      }
    } else if (const auto* copy = std::get_if<MemcpyOp>(&op.payload)) {
      StringField("kind", MemcpyKindName(copy->kind));
      stream(copy->stream);
      IntField("bytes", copy->bytes);
    } else if (const auto* record = std::get_if<EventRecordOp>(&op.payload)) {
      RefField("event", program.events, record->event, named);
      stream(record->stream);
    } else if (const auto* wait = std::get_if<StreamWaitEventOp>(&op.payload)) {
      stream(wait->stream);
      RefField("event", program.events, wait->event, named);
    } else if (const auto* sync = std::get_if<StreamSynchronizeOp>(&op.payload)) {
      stream(sync->stream);
    } else if (const auto* event_sync = std::get_if<EventSynchronizeOp>(&op.payload)) {
      RefField("event", program.events, event_sync->event, named);
    } else if (const auto* host = std::get_if<HostWorkOp>(&op.payload)) {
      IntField("duration_ns", host->duration_ns);
    } else if (const auto* allocate = std::get_if<AllocateOp>(&op.payload)) {
      RefField("tensor", program.tensors, allocate->tensor, named);
      IntField("bytes", allocate->bytes);
      stream(allocate->stream);
    } else if (const auto* release = std::get_if<FreeOp>(&op.payload)) {
      RefField("tensor", program.tensors, release->tensor, named);
    } else if (const auto* record_stream = std::get_if<RecordStreamOp>(&op.payload)) {
      RefField("tensor", program.tensors, record_stream->tensor, named);
      stream(record_stream->stream);
    }
    name_ref("module", op.tags.module);
    if (op.tags.phase != Phase::kNone) StringField("phase", PhaseName(op.tags.phase));
    if (op.tags.micro_batch != -1) IntField("micro_batch", op.tags.micro_batch);
    out_ += '}';
  }

  void WriteCompute(const ComputeDesc& compute) {
    if (const auto* gemm = std::get_if<GemmDesc>(&compute)) {
      fmt::format_to(
          Out(),
          ", \"gemm\": {{\"m\": {}, \"n\": {}, \"k\": {}, \"batch\": {}, \"dtype\": \"{}\"}}",
          gemm->m, gemm->n, gemm->k, gemm->batch, DTypeName(gemm->dtype));
    } else if (const auto* attention = std::get_if<AttentionDesc>(&compute)) {
      fmt::format_to(Out(),
                     ", \"attention\": {{\"batch\": {}, \"heads\": {}, \"kv_heads\": {}, "
                     "\"seq_q\": {}, \"seq_kv\": {}, \"head_dim\": {}, \"causal\": {}, "
                     "\"backward\": {}, \"dtype\": \"{}\"{}}}",
                     attention->batch, attention->heads, attention->kv_heads, attention->seq_q,
                     attention->seq_kv, attention->head_dim, attention->causal, attention->backward,
                     DTypeName(attention->dtype),
                     attention->impl == AttentionImpl::kFlash2
                         ? std::string()
                         : fmt::format(", \"impl\": \"{}\"", AttentionImplName(attention->impl)));
    } else if (const auto* memory = std::get_if<MemoryBoundDesc>(&compute)) {
      fmt::format_to(Out(), ", \"memory\": {{\"bytes_read\": {}, \"bytes_written\": {}}}",
                     memory->bytes_read, memory->bytes_written);
    } else if (const auto* fixed = std::get_if<FixedDurationDesc>(&compute)) {
      fmt::format_to(Out(), ", \"fixed\": {{\"duration_ns\": {}}}", fixed->duration_ns);
    }
  }

  void WriteRank(const Schedule& schedule, int32_t rank) {
    const RankBinding& binding = schedule.ranks[static_cast<size_t>(rank)];
    fmt::format_to(Out(), "    {{\"rank\": {}", rank);
    RefField("program", schedule.programs, binding.program,
             [](const Program& p) -> std::string_view { return p.name; });
    if (binding.program >= 0 && static_cast<size_t>(binding.program) < schedule.programs.size()) {
      const Program& program = schedule.programs[static_cast<size_t>(binding.program)];
      bool first = true;
      const size_t slots = std::min(program.comm_slots.size(), binding.comm_binding.size());
      for (size_t s = 0; s < slots; ++s) {
        const int32_t c = binding.comm_binding[s];
        if (c < 0 || static_cast<size_t>(c) >= schedule.communicators.size()) continue;
        const std::string& comm = schedule.communicators[static_cast<size_t>(c)].name;
        // Slots bound to the communicator of their own name need no entry.
        if (comm == program.comm_slots[s]) continue;
        out_ += first ? ", \"bind\": {" : ", ";
        first = false;
        String(program.comm_slots[s]);
        out_ += ": ";
        String(comm);
      }
      if (!first) out_ += '}';
    }
    out_ += '}';
  }

  std::string out_;
};

}  // namespace

StatusOr<Schedule> ParseScheduleJson(std::string_view text, const std::string& source) {
  return RunScheduleSax(
      source,
      [&](ScheduleSax& sax) {
        return Json::sax_parse(text.data(), text.data() + text.size(), &sax,
                               nlohmann::json::input_format_t::json, /*strict=*/true,
                               /*ignore_comments=*/true);
      },
      [&](size_t offset) { return LineColumn(text, offset); });
}

StatusOr<Schedule> ReadScheduleFile(const std::string& path) {
  std::vector<char> buffer(kFileBufferBytes);
  std::ifstream file;
  file.rdbuf()->pubsetbuf(buffer.data(), static_cast<std::streamsize>(buffer.size()));
  file.open(path, std::ios::binary);
  if (!file.is_open()) {
    return Status::IoError(fmt::format("cannot open '{}': {}", path, std::strerror(errno)));
  }
  return RunScheduleSax(
      path,
      [&](ScheduleSax& sax) {
        return Json::sax_parse(file, &sax, nlohmann::json::input_format_t::json,
                               /*strict=*/true, /*ignore_comments=*/true);
      },
      [&](size_t offset) { return LineColumnInFile(path, offset); });
}

std::string ScheduleToJson(const Schedule& schedule) { return ScheduleWriter().Write(schedule); }

Status WriteScheduleFile(const Schedule& schedule, const std::string& path) {
  return WriteFileAtomically(path, ScheduleToJson(schedule));
}

}  // namespace shardscope::traces

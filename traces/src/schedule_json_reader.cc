// Step 2 of reading a schedule's JSON (see schedule_json_internal.h): the parsers of
// ScheduleReader, from one op to the whole document, with errors that name the source, the
// JSON path and the op id.
#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "schedule_json_internal.h"

namespace shardscope::traces::schedule_json_internal {
namespace {

template <size_t... I>
std::array<std::string_view, sizeof...(I)> MakeOpKindNames(std::index_sequence<I...>) {
  return {OpKindName(OpPayload(std::in_place_index<I>))...};
}

}  // namespace

const std::array<std::string_view, std::variant_size_v<OpPayload>>& OpKindNames() {
  static const auto names =
      MakeOpKindNames(std::make_index_sequence<std::variant_size_v<OpPayload>>());
  return names;
}

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
    SHARDSCOPE_ASSIGN_OR_RETURN(gemm.m, IntField(desc, desc_path, "m", 1, kMaxShapeDim));
    SHARDSCOPE_ASSIGN_OR_RETURN(gemm.n, IntField(desc, desc_path, "n", 1, kMaxShapeDim));
    SHARDSCOPE_ASSIGN_OR_RETURN(gemm.k, IntField(desc, desc_path, "k", 1, kMaxShapeDim));
    SHARDSCOPE_ASSIGN_OR_RETURN(gemm.batch, IntFieldOr(desc, desc_path, "batch", 1, 1, kMaxShapeDim));
    SHARDSCOPE_ASSIGN_OR_RETURN(gemm.dtype, DTypeFieldOr(desc, desc_path));
    if (std::string reason = ComputeLimitViolation(gemm); !reason.empty()) return Fail(desc_path, reason);
    return ComputeDesc(gemm);
  }
  if (present[0] == "attention") {
    SHARDSCOPE_RETURN_IF_ERROR(CheckKeys(desc, desc_path, "attention",
                                         {"batch", "heads", "kv_heads", "seq_q", "seq_kv",
                                          "head_dim", "causal", "backward", "dtype", "impl"}));
    AttentionDesc attention;
    SHARDSCOPE_ASSIGN_OR_RETURN(attention.batch, IntField(desc, desc_path, "batch", 1, kMaxShapeDim));
    SHARDSCOPE_ASSIGN_OR_RETURN(attention.heads, IntField(desc, desc_path, "heads", 1, kMaxShapeDim));
    SHARDSCOPE_ASSIGN_OR_RETURN(attention.kv_heads,
                                IntFieldOr(desc, desc_path, "kv_heads", attention.heads, 1, kMaxShapeDim));
    SHARDSCOPE_ASSIGN_OR_RETURN(attention.seq_q, IntField(desc, desc_path, "seq_q", 1, kMaxShapeDim));
    SHARDSCOPE_ASSIGN_OR_RETURN(attention.seq_kv,
                                IntFieldOr(desc, desc_path, "seq_kv", attention.seq_q, 1, kMaxShapeDim));
    SHARDSCOPE_ASSIGN_OR_RETURN(attention.head_dim, IntField(desc, desc_path, "head_dim", 1, kMaxShapeDim));
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
    if (std::string reason = ComputeLimitViolation(attention); !reason.empty()) return Fail(desc_path, reason);
    return ComputeDesc(attention);
  }
  if (present[0] == "memory") {
    SHARDSCOPE_RETURN_IF_ERROR(
        CheckKeys(desc, desc_path, "memory", {"bytes_read", "bytes_written"}));
    MemoryBoundDesc memory;
    SHARDSCOPE_ASSIGN_OR_RETURN(memory.bytes_read, IntFieldOr(desc, desc_path, "bytes_read", 0, 0, kMaxOpBytes));
    SHARDSCOPE_ASSIGN_OR_RETURN(memory.bytes_written,
                                IntFieldOr(desc, desc_path, "bytes_written", 0, 0, kMaxOpBytes));
    return ComputeDesc(memory);
  }
  SHARDSCOPE_RETURN_IF_ERROR(CheckKeys(desc, desc_path, "fixed", {"duration_ns"}));
  FixedDurationDesc fixed;
  SHARDSCOPE_ASSIGN_OR_RETURN(fixed.duration_ns, IntField(desc, desc_path, "duration_ns", 0, kMaxOpDurationNs));
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
  SHARDSCOPE_ASSIGN_OR_RETURN(collective.bytes, IntField(op, path, "bytes", 0, kMaxOpBytes));
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
      SHARDSCOPE_ASSIGN_OR_RETURN(copy.bytes, IntField(json, path, "bytes", 0, kMaxOpBytes));
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
      SHARDSCOPE_ASSIGN_OR_RETURN(host.duration_ns, IntField(json, path, "duration_ns", 0, kMaxOpDurationNs));
      op.payload = host;
      break;
    }
    case 9: {
      AllocateOp allocate;
      SHARDSCOPE_ASSIGN_OR_RETURN(pending.ref, StringField(json, path, "tensor"));
      SHARDSCOPE_ASSIGN_OR_RETURN(allocate.bytes, IntField(json, path, "bytes", 0, kMaxOpBytes));
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

}  // namespace shardscope::traces::schedule_json_internal

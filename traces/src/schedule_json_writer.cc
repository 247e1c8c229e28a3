// Writing the JSON form of a Schedule (schema in schedule_json.h): ScheduleToJson and
// WriteScheduleFile. The reader is schedule_json_sax.cc and schedule_json_reader.cc.
#include "shardscope/traces/schedule_json.h"

#include <algorithm>
#include <iterator>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "shardscope/base/file_io.h"

namespace shardscope::traces {
namespace {

using Json = nlohmann::json;

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

std::string ScheduleToJson(const Schedule& schedule) { return ScheduleWriter().Write(schedule); }

Status WriteScheduleFile(const Schedule& schedule, const std::string& path) {
  return WriteFileAtomically(path, ScheduleToJson(schedule));
}

}  // namespace shardscope::traces
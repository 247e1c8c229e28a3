// ValidateSchedule: the invariants the simulator and the runtime rely on.
//
// Work is split so that a schedule with many ranks sharing few programs stays near-linear
// in ops + ranks:
//  1. communicators: members in [0, world_size), no duplicates (sorted copies are kept
//     for membership queries);
//  2. every program once: everything that does not depend on the rank (indices, sizes,
//     event order, allocation liveness, duplicate ids), and a summary of what does: the
//     slots its collectives use, the (slot, peer) pairs of send/recv/broadcast/reduce and
//     the send/recv peers;
//  3. every rank: its binding, membership of the rank in each used communicator and
//     "not my own peer" (a few lookups per rank); peers-in-communicator once per distinct
//     (program, binding) pair.
// Messages: "rank R, op id N (kind): reason" (R is the first rank running the program) or
// "communicator 'dp': reason".
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "shardscope/traces/schedule.h"

namespace shardscope::traces {
namespace {

// What the rank-dependent checks need from one program.
struct ProgramSummary {
  // For each comm slot, the index of the first collective op using it (nullopt: unused).
  std::vector<std::optional<size_t>> first_use_of_slot;
  // Distinct (slot, peer) pairs whose peer must belong to the slot's communicator, with
  // the first op that names them.
  std::map<std::pair<CommSlot, int32_t>, size_t> peers;
  // send/recv peers (a rank may not be its own peer), with the first op naming each.
  std::unordered_map<int32_t, size_t> p2p_peers;
};

bool NeedsPeer(CollectiveType type) {
  return type == CollectiveType::kSend || type == CollectiveType::kRecv ||
         type == CollectiveType::kBroadcast || type == CollectiveType::kReduce;
}
bool IsPointToPoint(CollectiveType type) {
  return type == CollectiveType::kSend || type == CollectiveType::kRecv;
}

class Validator {
 public:
  explicit Validator(const Schedule& schedule) : schedule_(schedule) {}

  Status Run() {
    if (schedule_.version != kScheduleVersion) {
      return Status::InvalidInput(fmt::format("schedule version {} is not supported (expected {})",
                                              schedule_.version, kScheduleVersion));
    }
    if (schedule_.ranks.empty()) return Status::InvalidInput("schedule has no ranks");
    SHARDSCOPE_RETURN_IF_ERROR(CheckCommunicators());
    SHARDSCOPE_RETURN_IF_ERROR(CheckRankPrograms());
    summaries_.resize(schedule_.programs.size());
    for (size_t p = 0; p < schedule_.programs.size(); ++p) {
      SHARDSCOPE_RETURN_IF_ERROR(CheckProgram(p));
    }
    for (size_t rank = 0; rank < schedule_.ranks.size(); ++rank) {
      SHARDSCOPE_RETURN_IF_ERROR(CheckRank(static_cast<int32_t>(rank)));
    }
    return Status::Ok();
  }

 private:
  Status CheckCommunicators() {
    const int32_t world = schedule_.world_size();
    std::unordered_map<std::string_view, size_t> by_name;
    sorted_members_.resize(schedule_.communicators.size());
    for (size_t c = 0; c < schedule_.communicators.size(); ++c) {
      const Communicator& comm = schedule_.communicators[c];
      if (comm.name.empty()) {
        return Status::InvalidInput(fmt::format("communicator {}: empty name", c));
      }
      // Slots bind by name, so two communicators of one name would be ambiguous.
      if (auto [it, inserted] = by_name.emplace(comm.name, c); !inserted) {
        return Status::InvalidInput(fmt::format(
            "communicator '{}': name used by communicators {} and {}", comm.name, it->second, c));
      }
      if (comm.ranks.empty()) {
        return Status::InvalidInput(fmt::format("communicator '{}': has no ranks", comm.name));
      }
      for (int32_t rank : comm.ranks) {
        if (rank < 0 || rank >= world) {
          return Status::InvalidInput(fmt::format(
              "communicator '{}': rank {} is outside the world [0, {})", comm.name, rank, world));
        }
      }
      std::vector<int32_t>& sorted = sorted_members_[c];
      sorted = comm.ranks;
      std::sort(sorted.begin(), sorted.end());
      if (auto dup = std::adjacent_find(sorted.begin(), sorted.end()); dup != sorted.end()) {
        return Status::InvalidInput(
            fmt::format("communicator '{}': rank {} listed twice", comm.name, *dup));
      }
    }
    return Status::Ok();
  }

  // Program indices first: op errors are attributed to the first rank running the program.
  Status CheckRankPrograms() {
    first_rank_of_program_.assign(schedule_.programs.size(), -1);
    for (size_t rank = 0; rank < schedule_.ranks.size(); ++rank) {
      const int32_t program = schedule_.ranks[rank].program;
      if (program < 0 || static_cast<size_t>(program) >= schedule_.programs.size()) {
        return Status::InvalidInput(fmt::format("rank {}: program index {} out of range (have {})",
                                                rank, program, schedule_.programs.size()));
      }
      int32_t& first = first_rank_of_program_[static_cast<size_t>(program)];
      if (first < 0) first = static_cast<int32_t>(rank);
    }
    return Status::Ok();
  }

  std::string ProgramContext(size_t p) const {
    const int32_t rank = first_rank_of_program_[p];
    return rank >= 0 ? fmt::format("rank {}", rank)
                     : fmt::format("program '{}'", schedule_.programs[p].name);
  }

  Status OpError(size_t p, const Op& op, std::string_view reason) const {
    return Status::InvalidInput(fmt::format("{}, op id {} ({}): {}", ProgramContext(p), op.id,
                                            OpKindName(op.payload), reason));
  }

  static Status CheckUniqueNames(const std::string& context, std::string_view what,
                                 const std::vector<std::string>& names) {
    std::unordered_set<std::string_view> seen;
    for (const std::string& name : names) {
      if (!seen.insert(name).second) {
        return Status::InvalidInput(
            fmt::format("{}: {} name \"{}\" declared twice", context, what, name));
      }
    }
    return Status::Ok();
  }

  Status CheckProgram(size_t p) {
    const Program& program = schedule_.programs[p];
    const std::string context = fmt::format("{} (program '{}')", ProgramContext(p), program.name);
    if (program.streams.empty()) {
      return Status::InvalidInput(
          fmt::format("{}: declares no streams (needs at least one)", context));
    }
    std::vector<std::string> stream_names;
    stream_names.reserve(program.streams.size());
    for (const StreamDecl& stream : program.streams) stream_names.push_back(stream.name);
    SHARDSCOPE_RETURN_IF_ERROR(CheckUniqueNames(context, "stream", stream_names));
    SHARDSCOPE_RETURN_IF_ERROR(CheckUniqueNames(context, "event", program.events));
    SHARDSCOPE_RETURN_IF_ERROR(CheckUniqueNames(context, "tensor", program.tensors));
    SHARDSCOPE_RETURN_IF_ERROR(CheckUniqueNames(context, "communicator slot", program.comm_slots));

    ProgramSummary& summary = summaries_[p];
    summary.first_use_of_slot.assign(program.comm_slots.size(), std::nullopt);
    std::vector<bool> recorded(program.events.size(), false);
    // Per tensor: the op that allocated it while live, or the op that last freed it.
    std::vector<std::optional<int64_t>> live_since(program.tensors.size());
    std::vector<std::optional<int64_t>> freed_by(program.tensors.size());
    if (program.ops.size() > static_cast<size_t>(kMaxOpsPerProgram)) {
      return Status::InvalidInput(
          fmt::format("{}: {} ops, more than the limit of {}", context, program.ops.size(), kMaxOpsPerProgram));
    }
    int64_t declared_ns = 0;  // host_work and fixed-kernel durations so far
    std::unordered_map<int64_t, size_t> ids;
    ids.reserve(program.ops.size());

    for (size_t i = 0; i < program.ops.size(); ++i) {
      const Op& op = program.ops[i];
      const auto fail = [&](std::string_view reason) { return OpError(p, op, reason); };
      if (auto [it, inserted] = ids.emplace(op.id, i); !inserted) {
        return fail(fmt::format("duplicate op id (ops #{} and #{} of program '{}')", it->second, i,
                                program.name));
      }
      const auto check_name = [&](NameIndex index, std::string_view what) -> Status {
        if (index < kNoName || (index >= 0 && static_cast<size_t>(index) >= program.names.size())) {
          return fail(fmt::format("{} index {} out of range (program has {} names)", what, index,
                                  program.names.size()));
        }
        return Status::Ok();
      };
      SHARDSCOPE_RETURN_IF_ERROR(check_name(op.name, "name"));
      SHARDSCOPE_RETURN_IF_ERROR(check_name(op.tags.module, "module"));
      if (op.tags.micro_batch < -1) {
        return fail(
            fmt::format("micro_batch {} is negative (-1 means untagged)", op.tags.micro_batch));
      }
      const auto check_stream = [&](StreamIndex s) -> Status {
        if (s < 0 || static_cast<size_t>(s) >= program.streams.size()) {
          return fail(fmt::format("stream index {} out of range (program has {} streams)", s,
                                  program.streams.size()));
        }
        return Status::Ok();
      };
      const auto check_event = [&](EventIndex e) -> Status {
        if (e < 0 || static_cast<size_t>(e) >= program.events.size()) {
          return fail(fmt::format("event index {} out of range (program has {} events)", e,
                                  program.events.size()));
        }
        return Status::Ok();
      };
      const auto check_recorded = [&](EventIndex e) -> Status {
        SHARDSCOPE_RETURN_IF_ERROR(check_event(e));
        if (!recorded[static_cast<size_t>(e)]) {
          return fail(fmt::format("event '{}' is not recorded by any earlier op",
                                  program.events[static_cast<size_t>(e)]));
        }
        return Status::Ok();
      };
      const auto check_tensor = [&](TensorIndex t) -> Status {
        if (t < 0 || static_cast<size_t>(t) >= program.tensors.size()) {
          return fail(fmt::format("tensor index {} out of range (program has {} tensors)", t,
                                  program.tensors.size()));
        }
        return Status::Ok();
      };
      // Non-negative and at most `max` (a limit of schedule.h).
      const auto check_non_negative = [&](int64_t value, std::string_view what, int64_t max) -> Status {
        if (value < 0) return fail(fmt::format("{} is negative ({})", what, value));
        if (value > max) return fail(fmt::format("{} {} is above the limit of {}", what, value, max));
        return Status::Ok();
      };
      const auto check_bytes = [&](int64_t value, std::string_view what) {
        return check_non_negative(value, what, kMaxOpBytes);
      };
      // Declared durations: each at most an hour, their sum over the program bounded too.
      const auto check_duration = [&](int64_t value) -> Status {
        SHARDSCOPE_RETURN_IF_ERROR(check_non_negative(value, "duration_ns", kMaxOpDurationNs));
        if (declared_ns > kMaxProgramDurationNs - value) {
          return fail(fmt::format("the program's host_work and fixed-kernel durations add up to more than {} ns "
                                  "(the limit)",
                                  kMaxProgramDurationNs));
        }
        declared_ns += value;
        return Status::Ok();
      };
      const auto check_positive = [&](int64_t value, std::string_view what) -> Status {
        if (value <= 0) return fail(fmt::format("{} must be positive, got {}", what, value));
        if (value > kMaxShapeDim) {
          return fail(fmt::format("{} {} is above the limit of {}", what, value, kMaxShapeDim));
        }
        return Status::Ok();
      };

      if (const auto* kernel = std::get_if<KernelOp>(&op.payload)) {
        SHARDSCOPE_RETURN_IF_ERROR(check_stream(kernel->stream));
        if (const auto* gemm = std::get_if<GemmDesc>(&kernel->compute)) {
          SHARDSCOPE_RETURN_IF_ERROR(check_positive(gemm->m, "gemm m"));
          SHARDSCOPE_RETURN_IF_ERROR(check_positive(gemm->n, "gemm n"));
          SHARDSCOPE_RETURN_IF_ERROR(check_positive(gemm->k, "gemm k"));
          SHARDSCOPE_RETURN_IF_ERROR(check_positive(gemm->batch, "gemm batch"));
          if (std::string reason = ComputeLimitViolation(*gemm); !reason.empty()) return fail(reason);
        } else if (const auto* attention = std::get_if<AttentionDesc>(&kernel->compute)) {
          SHARDSCOPE_RETURN_IF_ERROR(check_positive(attention->batch, "attention batch"));
          SHARDSCOPE_RETURN_IF_ERROR(check_positive(attention->heads, "attention heads"));
          SHARDSCOPE_RETURN_IF_ERROR(check_positive(attention->kv_heads, "attention kv_heads"));
          SHARDSCOPE_RETURN_IF_ERROR(check_positive(attention->seq_q, "attention seq_q"));
          SHARDSCOPE_RETURN_IF_ERROR(check_positive(attention->seq_kv, "attention seq_kv"));
          SHARDSCOPE_RETURN_IF_ERROR(check_positive(attention->head_dim, "attention head_dim"));
          // Grouped-query attention shares each KV head among heads / kv_heads query heads.
          if (attention->heads % attention->kv_heads != 0) {
            return fail(fmt::format("attention kv_heads {} does not divide heads {}",
                                    attention->kv_heads, attention->heads));
          }
          if (std::string reason = ComputeLimitViolation(*attention); !reason.empty()) return fail(reason);
        } else if (const auto* memory = std::get_if<MemoryBoundDesc>(&kernel->compute)) {
          SHARDSCOPE_RETURN_IF_ERROR(check_bytes(memory->bytes_read, "bytes_read"));
          SHARDSCOPE_RETURN_IF_ERROR(check_bytes(memory->bytes_written, "bytes_written"));
        } else if (const auto* fixed = std::get_if<FixedDurationDesc>(&kernel->compute)) {
          SHARDSCOPE_RETURN_IF_ERROR(check_duration(fixed->duration_ns));
        }
      } else if (const auto* collective = std::get_if<CollectiveOp>(&op.payload)) {
        if (collective->comm < 0 ||
            static_cast<size_t>(collective->comm) >= program.comm_slots.size()) {
          return fail(fmt::format("communicator slot {} out of range (program has {} slots)",
                                  collective->comm, program.comm_slots.size()));
        }
        SHARDSCOPE_RETURN_IF_ERROR(check_stream(collective->stream));
        SHARDSCOPE_RETURN_IF_ERROR(check_bytes(collective->bytes, "bytes"));
        // An OOM-flag agreement needs every member of the communicator: a send / recv pair
        // cannot be one.
        if (collective->oom_sync && IsPointToPoint(collective->type)) {
          return fail(fmt::format("a {} cannot be an oom_sync point (agreement needs every "
                                  "member of the communicator)",
                                  CollectiveTypeName(collective->type)));
        }
        auto& first_use = summary.first_use_of_slot[static_cast<size_t>(collective->comm)];
        if (!first_use) first_use = i;
        if (NeedsPeer(collective->type)) {
          if (collective->peer < 0) {
            return fail(fmt::format("needs a {} rank, got {}",
                                    IsPointToPoint(collective->type) ? "peer" : "root",
                                    collective->peer));
          }
          summary.peers.try_emplace({collective->comm, collective->peer}, i);
          if (IsPointToPoint(collective->type)) summary.p2p_peers.try_emplace(collective->peer, i);
        } else if (collective->peer != -1) {
          // Kept strict so that the JSON form (which has no peer for these) is exact.
          return fail(
              fmt::format("peer {} given, but only send, recv, broadcast and reduce "
                          "take a peer or root (use -1)",
                          collective->peer));
        }
      } else if (const auto* copy = std::get_if<MemcpyOp>(&op.payload)) {
        SHARDSCOPE_RETURN_IF_ERROR(check_stream(copy->stream));
        SHARDSCOPE_RETURN_IF_ERROR(check_bytes(copy->bytes, "bytes"));
      } else if (const auto* record = std::get_if<EventRecordOp>(&op.payload)) {
        SHARDSCOPE_RETURN_IF_ERROR(check_event(record->event));
        SHARDSCOPE_RETURN_IF_ERROR(check_stream(record->stream));
        recorded[static_cast<size_t>(record->event)] = true;
      } else if (const auto* wait = std::get_if<StreamWaitEventOp>(&op.payload)) {
        SHARDSCOPE_RETURN_IF_ERROR(check_stream(wait->stream));
        SHARDSCOPE_RETURN_IF_ERROR(check_recorded(wait->event));
      } else if (const auto* sync = std::get_if<StreamSynchronizeOp>(&op.payload)) {
        SHARDSCOPE_RETURN_IF_ERROR(check_stream(sync->stream));
      } else if (const auto* event_sync = std::get_if<EventSynchronizeOp>(&op.payload)) {
        SHARDSCOPE_RETURN_IF_ERROR(check_recorded(event_sync->event));
      } else if (const auto* host = std::get_if<HostWorkOp>(&op.payload)) {
        SHARDSCOPE_RETURN_IF_ERROR(check_duration(host->duration_ns));
      } else if (const auto* allocate = std::get_if<AllocateOp>(&op.payload)) {
        SHARDSCOPE_RETURN_IF_ERROR(check_tensor(allocate->tensor));
        SHARDSCOPE_RETURN_IF_ERROR(check_stream(allocate->stream));
        SHARDSCOPE_RETURN_IF_ERROR(check_bytes(allocate->bytes, "bytes"));
        const auto t = static_cast<size_t>(allocate->tensor);
        if (live_since[t]) {
          return fail(fmt::format("tensor '{}' is already allocated (by op id {})",
                                  program.tensors[t], *live_since[t]));
        }
        live_since[t] = op.id;
      } else if (const auto* release = std::get_if<FreeOp>(&op.payload)) {
        SHARDSCOPE_RETURN_IF_ERROR(check_tensor(release->tensor));
        const auto t = static_cast<size_t>(release->tensor);
        if (!live_since[t]) {
          return fail(freed_by[t] ? fmt::format("tensor '{}' is not allocated (already freed by "
                                                "op id {})",
                                                program.tensors[t], *freed_by[t])
                                  : fmt::format("tensor '{}' is not allocated (no earlier "
                                                "allocate)",
                                                program.tensors[t]));
        }
        live_since[t].reset();
        freed_by[t] = op.id;
      } else if (const auto* record_stream = std::get_if<RecordStreamOp>(&op.payload)) {
        SHARDSCOPE_RETURN_IF_ERROR(check_tensor(record_stream->tensor));
        SHARDSCOPE_RETURN_IF_ERROR(check_stream(record_stream->stream));
        const auto t = static_cast<size_t>(record_stream->tensor);
        if (!live_since[t]) {
          return fail(fmt::format("record_stream on tensor '{}', which is not allocated",
                                  program.tensors[t]));
        }
      }
      // DeviceSynchronizeOp: nothing to check.
    }
    return Status::Ok();
  }

  bool Contains(int32_t communicator, int32_t rank) const {
    const std::vector<int32_t>& members = sorted_members_[static_cast<size_t>(communicator)];
    return std::binary_search(members.begin(), members.end(), rank);
  }

  Status CheckRank(int32_t rank) {
    const RankBinding& binding = schedule_.ranks[static_cast<size_t>(rank)];
    const auto p = static_cast<size_t>(binding.program);
    const Program& program = schedule_.programs[p];
    if (binding.comm_binding.size() != program.comm_slots.size()) {
      return Status::InvalidInput(fmt::format(
          "rank {}: binds {} communicator slots but program '{}' declares {} (bindings are "
          "resolved by Schedule::ResolveBindings)",
          rank, binding.comm_binding.size(), program.name, program.comm_slots.size()));
    }
    for (size_t slot = 0; slot < binding.comm_binding.size(); ++slot) {
      const int32_t c = binding.comm_binding[slot];
      if (c < 0 || static_cast<size_t>(c) >= schedule_.communicators.size()) {
        return Status::InvalidInput(fmt::format(
            "rank {}: communicator slot '{}' bound to communicator index {}, out of range "
            "(have {})",
            rank, program.comm_slots[slot], c, schedule_.communicators.size()));
      }
    }
    const ProgramSummary& summary = summaries_[p];
    const auto op_error = [&](size_t op_index, std::string_view reason) {
      const Op& op = program.ops[op_index];
      return Status::InvalidInput(
          fmt::format("rank {}, op id {} ({}): {}", rank, op.id, OpKindName(op.payload), reason));
    };
    const auto comm_of = [&](CommSlot slot) {
      return binding.comm_binding[static_cast<size_t>(slot)];
    };
    for (size_t slot = 0; slot < summary.first_use_of_slot.size(); ++slot) {
      const std::optional<size_t>& first_use = summary.first_use_of_slot[slot];
      const int32_t c = comm_of(static_cast<CommSlot>(slot));
      if (first_use && !Contains(c, rank)) {
        return op_error(*first_use,
                        fmt::format("communicator '{}' (slot '{}') does not contain rank {}",
                                    schedule_.communicators[static_cast<size_t>(c)].name,
                                    program.comm_slots[slot], rank));
      }
    }
    if (auto it = summary.p2p_peers.find(rank); it != summary.p2p_peers.end()) {
      return op_error(it->second, fmt::format("peer {} is the rank itself", rank));
    }
    // Whether a peer belongs to a communicator depends only on the binding.
    if (!summary.peers.empty() &&
        checked_bindings_.emplace(binding.program, binding.comm_binding).second) {
      for (const auto& [slot_and_peer, op_index] : summary.peers) {
        const auto [slot, peer] = slot_and_peer;
        const int32_t c = comm_of(slot);
        if (!Contains(c, peer)) {
          const auto* collective = std::get_if<CollectiveOp>(&program.ops[op_index].payload);
          return op_error(
              op_index,
              fmt::format(
                  "{} {} is not in communicator '{}'",
                  collective != nullptr && IsPointToPoint(collective->type) ? "peer" : "root", peer,
                  schedule_.communicators[static_cast<size_t>(c)].name));
        }
      }
    }
    return Status::Ok();
  }

  const Schedule& schedule_;
  std::vector<std::vector<int32_t>> sorted_members_;  // per communicator
  std::vector<int32_t> first_rank_of_program_;
  std::vector<ProgramSummary> summaries_;
  std::set<std::pair<int32_t, std::vector<int32_t>>> checked_bindings_;
};

}  // namespace

Status ValidateSchedule(const Schedule& schedule) { return Validator(schedule).Run(); }

}  // namespace shardscope::traces

#include "shardscope/traces/listing.h"

#include <fmt/format.h>

namespace shardscope::traces {
namespace {

// Exact bytes (goldens must catch a one-byte change) with a readable size beside them.
std::string Bytes(int64_t bytes) {
  constexpr double kKiB = 1024.0;
  const auto b = static_cast<double>(bytes);
  if (bytes < 1024) return fmt::format("{} B", bytes);
  if (b < kKiB * kKiB) return fmt::format("{} B ({:.1f} KiB)", bytes, b / kKiB);
  if (b < kKiB * kKiB * kKiB) return fmt::format("{} B ({:.2f} MiB)", bytes, b / (kKiB * kKiB));
  return fmt::format("{} B ({:.3f} GiB)", bytes, b / (kKiB * kKiB * kKiB));
}

std::string Compute(const ComputeDesc& compute) {
  if (const auto* gemm = std::get_if<GemmDesc>(&compute)) {
    return fmt::format("gemm m={} n={} k={}{} {}", gemm->m, gemm->n, gemm->k,
                       gemm->batch != 1 ? fmt::format(" batch={}", gemm->batch) : "", DTypeName(gemm->dtype));
  }
  if (const auto* attn = std::get_if<AttentionDesc>(&compute)) {
    return fmt::format("attention{} b={} heads={}/{} s={}x{} d={}{} {}{}", attn->backward ? " backward" : "",
                       attn->batch, attn->heads, attn->kv_heads, attn->seq_q, attn->seq_kv, attn->head_dim,
                       attn->causal ? " causal" : "", DTypeName(attn->dtype),
                       attn->impl == AttentionImpl::kFlash2 ? std::string()
                                                            : fmt::format(" {}", AttentionImplName(attn->impl)));
  }
  if (const auto* mem = std::get_if<MemoryBoundDesc>(&compute)) {
    return fmt::format("memory read {} write {}", Bytes(mem->bytes_read), Bytes(mem->bytes_written));
  }
  return fmt::format("fixed {} ns", std::get<FixedDurationDesc>(compute).duration_ns);
}

}  // namespace

std::string ScheduleListing(const Schedule& schedule, int32_t rank) {
  const Program& p = schedule.ProgramOf(rank);
  std::string out;
  out += fmt::format("rank {} of {}: program '{}', {} ops\n", rank, schedule.world_size(), p.name, p.ops.size());
  out += "streams:";
  for (size_t s = 0; s < p.streams.size(); ++s) {
    out += fmt::format(" {}{}", p.streams[s].name,
                       p.streams[s].priority != 0 ? fmt::format(" (priority {})", p.streams[s].priority) : "");
    if (s + 1 < p.streams.size()) out += ",";
  }
  out += "\ncommunicators:";
  for (size_t slot = 0; slot < p.comm_slots.size(); ++slot) {
    const Communicator& comm =
        schedule.communicators[static_cast<size_t>(schedule.CommunicatorOf(rank, static_cast<CommSlot>(slot)))];
    out += fmt::format(" {} = {} ({} ranks){}", p.comm_slots[slot], comm.name, comm.ranks.size(),
                       slot + 1 < p.comm_slots.size() ? "," : "");
  }
  out += "\n\n";
  out += fmt::format("{:>6}  {:<9} {:>2}  {:<12} {:<20} {}\n", "id", "phase", "mb", "module", "stream", "op");
  const auto stream_name = [&](StreamIndex s) -> const std::string& { return p.streams[static_cast<size_t>(s)].name; };
  for (const Op& op : p.ops) {
    std::string stream;
    std::string what;
    const std::string_view name = p.NameOf(op.name);
    std::visit(
        [&](const auto& payload) {
          using T = std::decay_t<decltype(payload)>;
          if constexpr (std::is_same_v<T, KernelOp>) {
            stream = stream_name(payload.stream);
            what = fmt::format("kernel {}: {}", name, Compute(payload.compute));
          } else if constexpr (std::is_same_v<T, CollectiveOp>) {
            stream = stream_name(payload.stream);
            const bool rooted = payload.type == CollectiveType::kBroadcast || payload.type == CollectiveType::kReduce;
            const bool p2p = payload.type == CollectiveType::kSend || payload.type == CollectiveType::kRecv;
            what = fmt::format("{} {} on {}: {} {}{}", CollectiveTypeName(payload.type), name,
                               p.comm_slots[static_cast<size_t>(payload.comm)], Bytes(payload.bytes),
                               DTypeName(payload.dtype),
                               rooted ? fmt::format(" root {}", payload.peer)
                                      : (p2p ? fmt::format(" peer {}", payload.peer) : ""));
          } else if constexpr (std::is_same_v<T, MemcpyOp>) {
            stream = stream_name(payload.stream);
            what = fmt::format("memcpy {} {}: {}", MemcpyKindName(payload.kind), name, Bytes(payload.bytes));
          } else if constexpr (std::is_same_v<T, EventRecordOp>) {
            stream = stream_name(payload.stream);
            what = fmt::format("record {}", p.events[static_cast<size_t>(payload.event)]);
          } else if constexpr (std::is_same_v<T, StreamWaitEventOp>) {
            stream = stream_name(payload.stream);
            what = fmt::format("wait {}", p.events[static_cast<size_t>(payload.event)]);
          } else if constexpr (std::is_same_v<T, StreamSynchronizeOp>) {
            stream = "(host)";
            what = fmt::format("HOST BLOCKS on stream {}{}", stream_name(payload.stream),
                               name.empty() ? "" : fmt::format(" ({})", name));
          } else if constexpr (std::is_same_v<T, DeviceSynchronizeOp>) {
            stream = "(host)";
            what = fmt::format("HOST BLOCKS on the device{}", name.empty() ? "" : fmt::format(" ({})", name));
          } else if constexpr (std::is_same_v<T, EventSynchronizeOp>) {
            stream = "(host)";
            what = fmt::format("HOST BLOCKS on event {}{}", p.events[static_cast<size_t>(payload.event)],
                               name.empty() ? "" : fmt::format(" ({})", name));
          } else if constexpr (std::is_same_v<T, HostWorkOp>) {
            stream = "(host)";
            what = fmt::format("host {} {:.1f} us", name, static_cast<double>(payload.duration_ns) / 1e3);
          } else if constexpr (std::is_same_v<T, AllocateOp>) {
            stream = stream_name(payload.stream);
            what = fmt::format("alloc {} {}", p.tensors[static_cast<size_t>(payload.tensor)], Bytes(payload.bytes));
          } else if constexpr (std::is_same_v<T, FreeOp>) {
            stream = "";
            what = fmt::format("free {}", p.tensors[static_cast<size_t>(payload.tensor)]);
          } else {
            static_assert(std::is_same_v<T, RecordStreamOp>);
            stream = stream_name(payload.stream);
            what = fmt::format("record_stream {}", p.tensors[static_cast<size_t>(payload.tensor)]);
          }
        },
        op.payload);
    out += fmt::format("{:>6}  {:<9} {:>2}  {:<12} {:<20} {}\n", op.id, PhaseName(op.tags.phase),
                       op.tags.micro_batch >= 0 ? std::to_string(op.tags.micro_batch) : "", p.NameOf(op.tags.module),
                       stream, what);
  }
  return out;
}

}  // namespace shardscope::traces

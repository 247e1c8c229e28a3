// The tables and JSON of `shardscope memory` and `shardscope fit` (moved from
// cli/memory_commands.cc; the CLI prints them, the Python module returns them).
#include "shardscope/sim/memory/memory_text.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace shardscope::sim {
namespace {

constexpr double kBytesPerGiB = double(int64_t{1} << 30);

double GiB(int64_t bytes) { return static_cast<double>(bytes) / kBytesPerGiB; }

// GiB for a sentence: one decimal on real GPUs ("71.2 of 78.0 GiB"), two on toy capacities.
std::string GiBText(int64_t bytes, int64_t scale_bytes) {
  return GiB(scale_bytes) >= 10 ? fmt::format("{:.1f}", GiB(bytes)) : fmt::format("{:.2f}", GiB(bytes));
}

double Percent(int64_t part, int64_t whole) {
  return whole > 0 ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}

// The category names as a table shows them ("optimizer states").
std::string CategoryLabel(MemoryCategory category) {
  std::string label(MemoryCategoryName(category));
  for (char& c : label) c = c == '_' ? ' ' : c;
  return label;
}

std::string OomText(const OomInfo& oom) {
  return fmt::format("at op {}: tried to allocate {:.2f} GiB, {:.2f} GiB free, largest free block {:.2f} GiB",
                     oom.op_id, GiB(oom.requested_bytes), GiB(oom.free_bytes), GiB(oom.largest_free_block));
}

nlohmann::json BreakdownJson(const MemoryBreakdown& b) {
  nlohmann::json categories = nlohmann::json::object();
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    categories[std::string(MemoryCategoryName(static_cast<MemoryCategory>(c)))] =
        b.bytes_by_category[static_cast<size_t>(c)];
  }
  nlohmann::json oom = nullptr;
  if (b.oom) {
    oom = {{"op_id", b.oom->op_id},
           {"time_ns", b.oom->time_ns},
           {"requested_bytes", b.oom->requested_bytes},
           {"free_bytes", b.oom->free_bytes},
           {"largest_free_block", b.oom->largest_free_block}};
  }
  nlohmann::json init = nullptr;
  if (b.init.simulated) {
    init = {{"framework", b.init.framework},
            {"capacity_bytes", b.init.capacity_bytes},
            {"nccl_buffer_bytes", b.init.nccl_bytes},
            {"peak_reserved_bytes", b.init.peak_reserved_bytes},
            {"peak_at", std::string(InitWhatText(b.init.peak_what))},
            {"oom_at", b.init.oom ? nlohmann::json(std::string(InitWhatText(b.init.oom->what))) : nlohmann::json()},
            {"oom_requested_bytes", b.init.oom ? nlohmann::json(b.init.oom->requested_bytes) : nlohmann::json()}};
  }
  return {{"rank", b.rank},
          {"capacity_bytes", b.capacity_bytes},
          {"peak_reserved_bytes", b.peak_reserved_bytes},
          {"peak_allocated_bytes", b.peak_allocated_bytes},
          {"allocated_at_reserved_peak", b.allocated_at_reserved_peak},
          {"bytes_by_category", categories},
          {"allocator_overhead_bytes", b.allocator_overhead_bytes},
          {"headroom_bytes", b.headroom_bytes},
          {"num_alloc_retries", b.num_alloc_retries},
          {"num_ooms", b.num_ooms},
          {"oom", oom},
          {"usable_bytes", b.usable_bytes},
          {"cuda_context_bytes", b.cuda_context_bytes},
          {"nccl_buffer_bytes", b.nccl_bytes},
          {"cublas_workspace_bytes", b.cublas_workspace_bytes},
          {"cublas_workspace_in_allocator", b.cublas_in_allocator},
          {"reserved_by_others_bytes", b.reserved_by_others_bytes},
          {"init", init}};
}

std::string CandidatesTable(const FitResult& fit) {
  std::string out = fmt::format("{:>11}  {:<4}  {:<4}  {:>17}  {:>7}  {:>9}  {:>11}  {:>12}  {}\n", "micro-batch",
                                "AC", "fits", "peak reserved GiB", "retries", "OOM ranks", "step time", "tokens/s/GPU",
                                "note");
  for (size_t i = 0; i < fit.candidates.size(); ++i) {
    const FitCandidate& c = fit.candidates[i];
    const std::string step = c.step_time_ns > 0 ? fmt::format("{:.1f} ms", static_cast<double>(c.step_time_ns) / 1e6) : "-";
    const std::string tokens = c.tokens_per_second_per_gpu > 0 ? fmt::format("{:.0f}", c.tokens_per_second_per_gpu) : "-";
    std::string row = fmt::format("{:>11}  {:<4}  {:<4}  {:>17.2f}  {:>7}  {:>9}  {:>11}  {:>12}  {}", c.micro_batch_size,
                       ActivationCheckpointingName(c.ac), c.fits ? "yes" : "no", GiB(c.peak_reserved_bytes),
                       c.num_alloc_retries, c.oom_ranks, step, tokens, fit.best == i ? "<- best" : c.note);
    row.erase(row.find_last_not_of(' ') + 1);
    out += row + "\n";
  }
  return out;
}

}  // namespace

std::string MemoryBreakdownText(const MemoryBreakdown& b) {
  const int64_t cap = b.capacity_bytes;
  std::string out = fmt::format("rank {}: peak reserved {:.2f} of {:.2f} GiB ({:.1f}%)\n", b.rank,
                                GiB(b.peak_reserved_bytes), GiB(cap), Percent(b.peak_reserved_bytes, cap));
  out += fmt::format("  {:<24} {:>10} {:>14}\n", "at the allocated peak", "GiB", "% of capacity");
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    const int64_t bytes = b.bytes_by_category[static_cast<size_t>(c)];
    out += fmt::format("  {:<24} {:>10.3f} {:>13.1f}%\n", CategoryLabel(static_cast<MemoryCategory>(c)),
                       GiB(bytes), Percent(bytes, cap));
  }
  out += fmt::format("  {:<24} {:>10.3f} {:>13.1f}%   rounding, fragmentation, cached free blocks\n",
                     "allocator overhead", GiB(b.allocator_overhead_bytes), Percent(b.allocator_overhead_bytes, cap));
  out += fmt::format("  {:-<50}\n", "");
  out += fmt::format("  {:<24} {:>10.3f} {:>13.1f}%\n", "peak reserved", GiB(b.peak_reserved_bytes),
                     Percent(b.peak_reserved_bytes, cap));
  out += fmt::format("  {:<24} {:>10.3f} {:>13.1f}%\n", "headroom", GiB(b.headroom_bytes), Percent(b.headroom_bytes, cap));
  out += fmt::format("  {:<24} {:>10.3f} {:>13.1f}%\n", "peak allocated", GiB(b.peak_allocated_bytes),
                     Percent(b.peak_allocated_bytes, cap));
  out += fmt::format("  {:<24} {:>10.3f}\n", "capacity", GiB(cap));
  out += fmt::format("  {:<24} {:>10}\n", "alloc retries", b.num_alloc_retries);
  out += fmt::format("  {:<24} {}\n", "OOM", b.oom ? OomText(*b.oom) : std::string("none"));
  // Where the capacity comes from: what CUDA reports less what the CUDA stack holds outside
  // the allocator (lowering/schedule_metadata.h DeviceMemorySetup).
  out += fmt::format("  {:<24} {:>10}\n", "the GPU", "GiB");
  out += fmt::format("  {:<24} {:>10.3f}   cudaMemGetInfo total\n", "usable", GiB(b.usable_bytes));
  out += fmt::format("  {:<24} {:>10.3f}\n", "- CUDA context", GiB(b.cuda_context_bytes));
  out += fmt::format("  {:<24} {:>10.3f}   communicator buffers, outside the allocator\n", "- NCCL", GiB(b.nccl_bytes));
  if (b.cublas_in_allocator) {
    out += fmt::format("  {:<24} {:>10.3f}   inside the allocator (part of peak reserved)\n", "  cuBLAS workspaces",
                       GiB(b.cublas_workspace_bytes));
  } else {
    out += fmt::format("  {:<24} {:>10.3f}   cudaMalloc'd by cuBLAS, outside the allocator\n", "- cuBLAS workspaces",
                       GiB(b.cublas_workspace_bytes));
  }
  if (b.reserved_by_others_bytes > 0) {
    out += fmt::format("  {:<24} {:>10.3f}\n", "- other processes", GiB(b.reserved_by_others_bytes));
  }
  out += fmt::format("  {:<24} {:>10.3f}\n", "= capacity", GiB(cap));
  if (b.init.simulated) {
    out += fmt::format("  {:<24} {:>10.3f}   {} ({}), {}\n", "init phase peak", GiB(b.init.peak_reserved_bytes),
                       b.init.framework, InitWhatText(b.init.peak_what),
                       b.init.oom ? fmt::format("OUT OF MEMORY at: {} ({:.2f} GiB requested)",
                                                InitWhatText(b.init.oom->what), GiB(b.init.oom->requested_bytes))
                                  : std::string("fits"));
  }
  return out;
}

std::string MemoryBreakdownsJson(const std::string& input, int32_t world_size,
                                 const std::vector<MemoryBreakdown>& breakdowns) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const MemoryBreakdown& b : breakdowns) ranks.push_back(BreakdownJson(b));
  nlohmann::json out = {{"input", input}, {"world_size", world_size}, {"ranks", ranks}};
  return out.dump(2) + "\n";
}

std::string FitReportText(const std::string& plan_label, const FitResult& fit) {
  std::string out = fmt::format("{}: searching {} (allocator capacity {} GiB per GPU)\n", plan_label,
                                FitDimensionName(fit.dimension), GiBText(fit.capacity_bytes, fit.capacity_bytes));
  out += CandidatesTable(fit) + "\n";
  if (!fit.best) return out + "nothing fits: " + fit.reason + "\n";
  const FitCandidate& best = fit.candidates[*fit.best];
  if (fit.dimension == FitDimension::kMicroBatchSize) {
    out += fmt::format("largest micro_batch_size that fits: {} (peak {} of {} GiB, {} retries)\n",
                       best.micro_batch_size, GiBText(best.peak_reserved_bytes, fit.capacity_bytes),
                       GiBText(fit.capacity_bytes, fit.capacity_bytes), best.num_alloc_retries);
  } else {
    out += fmt::format(
        "fastest activation_checkpointing that fits: {} (peak {} of {} GiB, step {:.1f} ms, {:.0f} tokens/s per "
        "GPU)\n",
        ActivationCheckpointingName(best.ac), GiBText(best.peak_reserved_bytes, fit.capacity_bytes),
        GiBText(fit.capacity_bytes, fit.capacity_bytes), static_cast<double>(best.step_time_ns) / 1e6,
        best.tokens_per_second_per_gpu);
  }
  return out;
}

}  // namespace shardscope::sim

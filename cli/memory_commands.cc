// `shardscope memory`: what fills each chosen rank's device memory when it is fullest, and
// what the allocator reserves beyond that.
// `shardscope fit`: the largest micro-batch (or the activation checkpointing) that fits.
//
// Both print tables for a terminal on stdout; progress goes to stderr. Library errors come
// back as Status values and main() turns them into exit codes (2 for bad input).
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "inputs.h"
#include "progress.h"
#include "work_limits.h"
#include "shardscope/sim/lowering/lowering.h"
#include "shardscope/sim/memory/memory_report.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/sim/report/report.h"
#include "shardscope/traces/schedule_json.h"

namespace shardscope::cli {
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
std::string CategoryLabel(sim::MemoryCategory category) {
  std::string label(sim::MemoryCategoryName(category));
  for (char& c : label) c = c == '_' ? ' ' : c;
  return label;
}

// ---- memory

struct MemoryOptions {
  std::string input;
  std::string ranks;  // empty: the default ranks
  bool json = false;
  bool quiet = false;
  bool force = false;
};

std::string OomText(const sim::OomInfo& oom) {
  return fmt::format("at op {}: tried to allocate {:.2f} GiB, {:.2f} GiB free, largest free block {:.2f} GiB",
                     oom.op_id, GiB(oom.requested_bytes), GiB(oom.free_bytes), GiB(oom.largest_free_block));
}

std::string BreakdownText(const sim::MemoryBreakdown& b) {
  const int64_t cap = b.capacity_bytes;
  std::string out = fmt::format("rank {}: peak reserved {:.2f} of {:.2f} GiB ({:.1f}%)\n", b.rank,
                                GiB(b.peak_reserved_bytes), GiB(cap), Percent(b.peak_reserved_bytes, cap));
  out += fmt::format("  {:<24} {:>10} {:>14}\n", "at the allocated peak", "GiB", "% of capacity");
  for (int c = 0; c < sim::kNumMemoryCategories; ++c) {
    const int64_t bytes = b.bytes_by_category[static_cast<size_t>(c)];
    out += fmt::format("  {:<24} {:>10.3f} {:>13.1f}%\n", CategoryLabel(static_cast<sim::MemoryCategory>(c)),
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
                       b.init.framework, sim::InitWhatText(b.init.peak_what),
                       b.init.oom ? fmt::format("OUT OF MEMORY at: {} ({:.2f} GiB requested)",
                                                sim::InitWhatText(b.init.oom->what), GiB(b.init.oom->requested_bytes))
                                  : std::string("fits"));
  }
  return out;
}

nlohmann::json BreakdownJson(const sim::MemoryBreakdown& b) {
  nlohmann::json categories = nlohmann::json::object();
  for (int c = 0; c < sim::kNumMemoryCategories; ++c) {
    categories[std::string(sim::MemoryCategoryName(static_cast<sim::MemoryCategory>(c)))] =
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
            {"peak_at", std::string(sim::InitWhatText(b.init.peak_what))},
            {"oom_at", b.init.oom ? nlohmann::json(std::string(sim::InitWhatText(b.init.oom->what))) : nlohmann::json()},
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

Status RunMemory(const MemoryOptions& options) {
  SHARDSCOPE_ASSIGN_OR_RETURN(LoadedInput loaded,
                              LoadInput(options.input, LoadOptions::With(options.force, options.quiet)));
  Progress::Note(options.quiet, fmt::format("simulating the memory of {} ({} ranks)", options.input,
                                            loaded.schedule.world_size()));
  const traces::Schedule& schedule = loaded.schedule;
  const sim::SimulationSetup& setup = loaded.setup;
  std::vector<sim::MemoryBreakdown> breakdowns;
  if (options.ranks.empty()) {
    SHARDSCOPE_ASSIGN_OR_RETURN(breakdowns, sim::SimulateMemoryDefaultRanks(schedule, setup));
  } else {
    SHARDSCOPE_ASSIGN_OR_RETURN(std::vector<int32_t> ranks, ParseRankList(options.ranks, schedule.world_size(), "--ranks"));
    SHARDSCOPE_ASSIGN_OR_RETURN(breakdowns, sim::SimulateMemory(schedule, setup, ranks));
  }
  if (options.json) {
    nlohmann::json ranks = nlohmann::json::array();
    for (const sim::MemoryBreakdown& b : breakdowns) ranks.push_back(BreakdownJson(b));
    nlohmann::json out = {{"input", options.input}, {"world_size", schedule.world_size()}, {"ranks", ranks}};
    std::cout << out.dump(2) << "\n";
    return Status::Ok();
  }
  std::cout << fmt::format("{}: {} ranks\n", options.input, schedule.world_size());
  for (const sim::MemoryBreakdown& b : breakdowns) std::cout << "\n" << BreakdownText(b);
  return Status::Ok();
}

// ---- fit

struct FitOptions {
  std::string plan;
  std::string search;
  int64_t max_micro_batch = 256;
  bool quiet = false;
  bool force = false;
};

std::string CandidateLabel(const sim::FitCandidate& c) {
  return fmt::format("micro_batch_size {}, activation_checkpointing {}", c.micro_batch_size,
                     sim::ActivationCheckpointingName(c.ac));
}

std::string Verdict(const sim::FitCandidate& c) {
  return c.fits ? fmt::format("fits (peak {:.2f} GiB)", GiB(c.peak_reserved_bytes)) : "does not fit: " + c.note;
}

// Each candidate as it is decided (progress.h: in place on a terminal, sparse lines in a log,
// nothing with -q).
sim::FitProgress MakeProgress(Progress& progress) {
  return [&progress](int done, int total, const sim::FitCandidate& c) {
    progress.Update(total > 0 ? static_cast<double>(done) / total : 0,
                    fmt::format("{}/~{}: {}: {}", done, total, CandidateLabel(c), Verdict(c)));
  };
}

std::string CandidatesTable(const sim::FitResult& fit) {
  std::string out = fmt::format("{:>11}  {:<4}  {:<4}  {:>17}  {:>7}  {:>9}  {:>11}  {:>12}  {}\n", "micro-batch",
                                "AC", "fits", "peak reserved GiB", "retries", "OOM ranks", "step time", "tokens/s/GPU",
                                "note");
  for (size_t i = 0; i < fit.candidates.size(); ++i) {
    const sim::FitCandidate& c = fit.candidates[i];
    const std::string step = c.step_time_ns > 0 ? fmt::format("{:.1f} ms", static_cast<double>(c.step_time_ns) / 1e6) : "-";
    const std::string tokens = c.tokens_per_second_per_gpu > 0 ? fmt::format("{:.0f}", c.tokens_per_second_per_gpu) : "-";
    std::string row = fmt::format("{:>11}  {:<4}  {:<4}  {:>17.2f}  {:>7}  {:>9}  {:>11}  {:>12}  {}", c.micro_batch_size,
                       sim::ActivationCheckpointingName(c.ac), c.fits ? "yes" : "no", GiB(c.peak_reserved_bytes),
                       c.num_alloc_retries, c.oom_ranks, step, tokens, fit.best == i ? "<- best" : c.note);
    row.erase(row.find_last_not_of(' ') + 1);
    out += row + "\n";
  }
  return out;
}

Status RunFit(const FitOptions& options) {
  const std::optional<sim::FitDimension> dimension = sim::ParseFitDimension(options.search);
  if (!dimension) {
    return Status::InvalidInput(fmt::format(
        "--search: expected micro_batch_size or activation_checkpointing, got '{}'", options.search));
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(sim::Plan plan, sim::LoadPlanFile(options.plan));
  // Every candidate lowers the plan: too big a one is refused before the first.
  SHARDSCOPE_ASSIGN_OR_RETURN(WorkEstimate work, EstimatePlanWork(plan));
  SHARDSCOPE_RETURN_IF_ERROR(CheckWork(work, options.plan, options.force, options.quiet));
  Progress progress(fmt::format("fit: searching {}", options.search), options.quiet);
  SHARDSCOPE_ASSIGN_OR_RETURN(sim::FitResult fit,
                              sim::FitSearch(plan, *dimension, options.max_micro_batch, MakeProgress(progress)));
  progress.Done();

  std::cout << fmt::format("{}: searching {} (allocator capacity {} GiB per GPU)\n", options.plan,
                           sim::FitDimensionName(*dimension), GiBText(fit.capacity_bytes, fit.capacity_bytes));
  std::cout << CandidatesTable(fit) << "\n";
  if (!fit.best) {
    std::cout << "nothing fits: " << fit.reason << "\n";
    // main() maps every error but bad input to exit code 1, which is what "nothing fits"
    // must return; the message repeats the reason on stderr.
    return Status::Internal("nothing fits: " + fit.reason);
  }
  const sim::FitCandidate& best = fit.candidates[*fit.best];
  if (*dimension == sim::FitDimension::kMicroBatchSize) {
    std::cout << fmt::format("largest micro_batch_size that fits: {} (peak {} of {} GiB, {} retries)\n",
                             best.micro_batch_size, GiBText(best.peak_reserved_bytes, fit.capacity_bytes),
                             GiBText(fit.capacity_bytes, fit.capacity_bytes),
                             best.num_alloc_retries);
  } else {
    std::cout << fmt::format(
        "fastest activation_checkpointing that fits: {} (peak {} of {} GiB, step {:.1f} ms, {:.0f} tokens/s per GPU)\n",
        sim::ActivationCheckpointingName(best.ac), GiBText(best.peak_reserved_bytes, fit.capacity_bytes),
        GiBText(fit.capacity_bytes, fit.capacity_bytes),
        static_cast<double>(best.step_time_ns) / 1e6, best.tokens_per_second_per_gpu);
  }
  return Status::Ok();
}

}  // namespace

CommandRunner AddMemoryCommand(CLI::App& app) {
  auto options = std::make_shared<MemoryOptions>();
  CLI::App* cmd = app.add_subcommand(
      "memory", "Break down each rank's device memory at its peak (caching allocator simulated)");
  cmd->add_option("input", options->input, "Plan YAML or schedule JSON")->required()->check(CLI::ExistingFile);
  cmd->add_option("--ranks", options->ranks,
                  "Ranks to show, like '0,5' or '0-3' (default: rank 0 and the rank with the highest peak)");
  cmd->add_flag("--json", options->json, "Print the breakdowns as JSON");
  cmd->add_flag("-q,--quiet", options->quiet, "No progress messages or warnings on stderr");
  cmd->add_flag("--force", options->force, "Go on past the size limit (a schedule over 8 GiB in memory)");
  return [cmd, options]() -> std::optional<Status> {
    if (!*cmd) return std::nullopt;
    return RunMemory(*options);
  };
}

CommandRunner AddFitCommand(CLI::App& app) {
  auto options = std::make_shared<FitOptions>();
  CLI::App* cmd = app.add_subcommand(
      "fit", "Find the largest micro-batch (or the activation checkpointing) that fits in GPU memory");
  cmd->add_option("plan", options->plan, "Plan YAML")->required()->check(CLI::ExistingFile);
  cmd->add_option("--search", options->search, "What to search: micro_batch_size or activation_checkpointing")
      ->required();
  cmd->add_option("--max", options->max_micro_batch, "Largest micro-batch size to try")->capture_default_str();
  cmd->add_flag("-q,--quiet", options->quiet, "No progress messages or warnings on stderr");
  cmd->add_flag("--force", options->force, "Go on past the size limit (a schedule over 8 GiB in memory)");
  return [cmd, options]() -> std::optional<Status> {
    if (!*cmd) return std::nullopt;
    return RunFit(*options);
  };
}

}  // namespace shardscope::cli

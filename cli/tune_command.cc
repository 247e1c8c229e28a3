// `shardscope tune PLAN --gpus N`: the fastest plan that fits, never retries an allocation and
// passes the check (sim/tune/tune.h). Prints the ranked table, the Pareto front and why each
// rejected family was rejected; -o DIR writes DIR/best.yaml and DIR/ranking.json. Under
// `mpirun -np K` the candidates are split over the processes and rank 0 prints and writes.
// Exit 0 when a plan was kept, 1 when none was, 2 on bad input.
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "commands.h"
#include "launcher.h"
#include "progress.h"
#include "shardscope/base/file_io.h"
#include "shardscope/base/output_dir.h"
#include "shardscope/runtime/process_group.h"
#include "shardscope/sim/tune/tune.h"

namespace shardscope::cli {
namespace {

struct TuneCommandOptions {
  std::string plan;
  int32_t gpus = 0;
  int64_t global_batch = 0;
  std::string search = "all";
  std::string budget;
  int top = 10;
  int threads = 0;
  double held_gib = 1.0;
  int64_t max_micro_batch = 64;
  std::string out_dir;
  bool quiet = false;
};

// "200" (simulations) or a duration: "90s", "2m", "1h".
Status ParseBudget(const std::string& text, sim::TuneOptions& options) {
  if (text.empty()) return Status::Ok();
  const auto bad = [&] {
    return Status::InvalidInput(fmt::format(
        "--budget: expected a number of simulations (200) or a duration (90s, 2m, 1h), got '{}'", text));
  };
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    return bad();
  }
  if (!(value > 0) || !std::isfinite(value)) return bad();
  const std::string unit = text.substr(used);
  if (unit.empty()) {
    if (value != std::floor(value) || value > 1e9) return bad();
    options.max_simulations = static_cast<int64_t>(value);
  } else if (unit == "s") {
    options.max_seconds = value;
  } else if (unit == "m") {
    options.max_seconds = value * 60;
  } else if (unit == "h") {
    options.max_seconds = value * 3600;
  } else {
    return bad();
  }
  return Status::Ok();
}

Status RunTune(const TuneCommandOptions& command) {
  sim::TuneOptions options;
  options.gpus = command.gpus;
  options.global_batch = command.global_batch;
  SHARDSCOPE_ASSIGN_OR_RETURN(options.space, sim::ParseTuneSpace(command.search));
  SHARDSCOPE_RETURN_IF_ERROR(ParseBudget(command.budget, options));
  options.top = command.top;
  if (command.threads < 0) return Status::InvalidInput(fmt::format("--threads: expected >= 0, got {}", command.threads));
  options.threads = command.threads;
  if (!(command.held_gib >= 0) || command.held_gib > 1e6) {
    return Status::InvalidInput(fmt::format("--held-gib: expected a number of GiB >= 0, got {}", command.held_gib));
  }
  options.held_bytes = static_cast<int64_t>(std::llround(command.held_gib * static_cast<double>(int64_t{1} << 30)));
  if (command.max_micro_batch < 1 || command.max_micro_batch > 1 << 20) {
    return Status::InvalidInput(fmt::format("--max-micro-batch: expected 1 to {}, got {}", 1 << 20, command.max_micro_batch));
  }
  options.max_micro_batch = command.max_micro_batch;

  // Under a launcher the candidates are split over its processes.
  std::unique_ptr<runtime::ProcessGroup> group;
  const std::optional<LauncherRank> launcher =
      LauncherRankFromEnvironment([](const char* name) -> const char* { return std::getenv(name); });
  if (launcher && launcher->size > 1) {
    SHARDSCOPE_ASSIGN_OR_RETURN(group, runtime::ProcessGroup::Join());
    options.processes.rank = group->rank();
    options.processes.size = group->size();
    options.processes.all_gather = [&group](const std::string& mine) { return group->AllGather(mine); };
  }
  const bool lead = options.processes.rank == 0;
  const bool quiet = command.quiet || !lead;
  std::optional<Progress> progress;
  if (!quiet) {
    progress.emplace(fmt::format("tuning {} for {} GPUs", command.plan, command.gpus), false);
    options.progress = [&progress](size_t settled, size_t total) {
      progress->Update(total > 0 ? static_cast<double>(settled) / static_cast<double>(total) : 1.0,
                       fmt::format("{}/{} candidates", settled, total));
    };
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(sim::TuneResult result, sim::Tune(command.plan, options));
  progress.reset();
  if (!lead) return result.ranking.empty() ? Status::Internal("tune: no candidate was kept") : Status::Ok();
  std::cout << sim::TuneText(result, options);
  if (!command.out_dir.empty()) {
    SHARDSCOPE_ASSIGN_OR_RETURN(std::unique_ptr<OutputDir> out,
                                OutputDir::Create(command.out_dir, OutputSpec{{"best.yaml", "ranking.json"}, "ranking.json"}));
    const std::string best = sim::TuneBestPlanYaml(result, command.out_dir);
    if (!best.empty()) SHARDSCOPE_RETURN_IF_ERROR(traces::WriteFileAtomically(out->StagingPath("best.yaml"), best));
    SHARDSCOPE_RETURN_IF_ERROR(traces::WriteFileAtomically(out->StagingPath("ranking.json"), sim::TuneRankingJson(result)));
    SHARDSCOPE_RETURN_IF_ERROR(out->Commit());
    std::cout << fmt::format("  wrote {}{}\n", best.empty() ? "" : out->FinalPath("best.yaml") + " and ",
                             out->FinalPath("ranking.json"));
  }
  if (!quiet) Progress::Note(false, fmt::format("tune took {:.1f} s", result.seconds));
  if (result.ranking.empty()) return Status::Internal("tune: no candidate was kept (the families above say why)");
  return Status::Ok();
}

}  // namespace

CommandRunner AddTuneCommand(CLI::App& app) {
  auto options = std::make_shared<TuneCommandOptions>();
  CLI::App* cmd = app.add_subcommand(
      "tune",
      "Search strategies and knobs for the fastest plan that fits, never retries an allocation and passes the "
      "check, on N GPUs. Exit 0: a plan was kept, 1: none, 2: bad input");
  cmd->add_option("plan", options->plan, "Plan YAML: the model, cluster and training to plan for")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--gpus", options->gpus, "GPUs to plan for (a multiple of the cluster's GPUs per node)")->required();
  cmd->add_option("--global-batch", options->global_batch,
                  "Sequences per step, held fixed (default: the plan's micro_batch_size x grad_accum_steps x GPUs)");
  cmd->add_option("--search", options->search,
                  "Knobs to search, comma-separated: strategy, mesh, reshard, prefetch, buckets, micro_batch, ac, "
                  "compile (or all); the others keep the plan's values")
      ->capture_default_str();
  cmd->add_option("--budget", options->budget,
                  "At most this many simulations (200), or no new batch after this long (90s, 2m, 1h); default: none");
  cmd->add_option("--top", options->top, "Rows of the ranking (and the time bound's horizon)")->capture_default_str();
  cmd->add_option("--threads", options->threads, "Candidates simulated in parallel (0: one per hardware thread)")
      ->capture_default_str();
  cmd->add_option("--held-gib", options->held_gib,
                  "The check's memory fault: GiB another process holds on rank 0's GPU (0: no check)")
      ->capture_default_str();
  cmd->add_option("--max-micro-batch", options->max_micro_batch, "Largest micro-batch size tried")->capture_default_str();
  cmd->add_option("-o,--output", options->out_dir, "Write DIR/best.yaml (a plan simulate reads) and DIR/ranking.json");
  cmd->add_flag("-q,--quiet", options->quiet, "No progress on stderr");
  return [cmd, options]() -> std::optional<Status> {
    if (!*cmd) return std::nullopt;
    return RunTune(*options);
  };
}

}  // namespace shardscope::cli

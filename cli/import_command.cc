// `shardscope import TRACE... -o DIR`: PyTorch-profiler traces (one per rank) into one measured
// timeline in shardscope's layout (DIR/trace.json: pid = rank, tid 0 = host thread, tid 1 + k =
// CUDA stream k), and a summary of what was found. docs/IMPORT.md has the mapping.
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "commands.h"
#include "progress.h"
#include "shardscope/traces/chrome_trace.h"
#include "shardscope/analysis/import.h"

namespace shardscope::cli {
namespace {

struct ImportOptions {
  std::vector<std::string> traces;
  std::string out_dir = "imported";
  bool quiet = false;
};

Status RunImport(const ImportOptions& options) {
  Progress::Note(options.quiet, fmt::format("reading {} trace(s)", options.traces.size()));
  SHARDSCOPE_ASSIGN_OR_RETURN(traces::ImportedTrace imported, traces::ImportPytorchTraces(options.traces));
  // trace.json replaces the folder's previous one only when written whole (base/output_dir.h).
  SHARDSCOPE_ASSIGN_OR_RETURN(const std::string path, traces::WriteImportedTrace(imported, options.out_dir));
  std::cout << traces::ImportSummaryText(imported);
  std::cout << fmt::format("wrote {}\n", path);
  return Status::Ok();
}

}  // namespace

CommandRunner AddImportCommand(CLI::App& app) {
  auto options = std::make_shared<ImportOptions>();
  CLI::App* cmd = app.add_subcommand(
      "import", "Merge PyTorch-profiler traces (one *.pt.trace.json per rank) into DIR/trace.json (pid = rank)");
  cmd->add_option("traces", options->traces, "Kineto Chrome-JSON traces, one per rank (plain or gzip-compressed .json.gz)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("-o,--output", options->out_dir, "Output directory")->capture_default_str();
  cmd->add_flag("-q,--quiet", options->quiet, "No progress messages on stderr");
  return [cmd, options]() -> std::optional<Status> {
    if (!*cmd) return std::nullopt;
    return RunImport(*options);
  };
}

}  // namespace shardscope::cli

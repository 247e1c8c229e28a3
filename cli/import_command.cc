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
#include "shardscope/traces/chrome_trace.h"
#include "shardscope/analysis/import.h"

namespace shardscope::cli {
namespace {

struct ImportOptions {
  std::vector<std::string> traces;
  std::string out_dir = "imported";
};

Status RunImport(const ImportOptions& options) {
  SHARDSCOPE_ASSIGN_OR_RETURN(traces::ImportedTrace imported, traces::ImportPytorchTraces(options.traces));
  std::error_code error;
  std::filesystem::create_directories(options.out_dir, error);
  if (error) return Status::IoError(fmt::format("cannot create directory '{}': {}", options.out_dir, error.message()));
  const std::string path = (std::filesystem::path(options.out_dir) / "trace.json").string();
  // The writer streams into a temporary file and renames it onto `path` when it succeeds.
  SHARDSCOPE_RETURN_IF_ERROR(traces::WriteChromeTrace(imported.timeline, path));
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
  return [cmd, options]() -> std::optional<Status> {
    if (!*cmd) return std::nullopt;
    return RunImport(*options);
  };
}

}  // namespace shardscope::cli

// `shardscope run PLAN|SCHEDULE -o DIR`: executes the schedule, one process per rank under
// mpirun. The host backend (runtime/host_backend.h) runs it without a GPU: execution semantics
// (streams, events, collectives on real buffers, the allocator policy, hangs), not performance.
// The CUDA backend (runtime/cuda_backend.h) runs it on GPUs: CUDA streams, NCCL, proxy kernels.
// MPI is initialized only here, after the arguments parsed; without mpirun the job is one rank
// (MPI's singleton init), or, with --backend cuda, one process driving every local GPU.
//
// --profile: the host backend's measured timeline is its host timeline (DIR/trace.json, a copy
// of DIR/host_timeline.json); the CUDA backend captures CUPTI activity records per rank
// (CuptiProfile below, docs/PROFILER.md "Wiring run --profile"), or warns and falls back to
// the host timeline where CUPTI cannot run (runtime::DecideProfileMode).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "launcher.h"
#include "inputs.h"
#include "shardscope/profiler/activity.h"
#include "shardscope/profiler/capture_json.h"
#include "shardscope/profiler/clock_alignment.h"
#include "shardscope/profiler/collector.h"
#include "shardscope/runtime/cuda_backend.h"
#include "shardscope/runtime/host_backend.h"
#include "shardscope/runtime/profile_mode.h"
#include "shardscope/sim/simulate/simulate.h"
#include "shardscope/traces/chrome_trace.h"
#include "shardscope/base/file_io.h"

namespace shardscope::cli {

StatusOr<std::optional<sim::InjectedOom>> ParseInjectedOom(const std::string& spec, const traces::Schedule& schedule) {
  if (spec.empty()) return std::optional<sim::InjectedOom>();
  const auto bad = [&](std::string_view why) {
    return Status::InvalidInput(fmt::format("--inject-oom: expected RANK:OP_ID, the id of an allocate op in that "
                                            "rank's program (shardscope schedule --listing --rank RANK shows them), "
                                            "got '{}': {}",
                                            spec, why));
  };
  const size_t colon = spec.find(':');
  if (colon == std::string::npos) return bad("no ':'");
  int64_t rank = -1, op_id = -1;
  try {
    size_t used = 0;
    const std::string rank_text = spec.substr(0, colon), op_text = spec.substr(colon + 1);
    rank = std::stoll(rank_text, &used);
    if (used != rank_text.size()) return bad("RANK is not an integer");
    op_id = std::stoll(op_text, &used);
    if (used != op_text.size()) return bad("OP_ID is not an integer");
  } catch (const std::exception&) {
    return bad("not integers");
  }
  StatusOr<sim::InjectedOom> at = sim::InjectedOomAt(schedule, rank, op_id);
  if (!at.ok()) return bad(at.status().message());
  return std::optional<sim::InjectedOom>(*at);
}

namespace {

StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IoError(fmt::format("{}: cannot open", path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Adds `profile` to DIR/report.json (written by the backend on rank 0).
Status AddProfileToReport(const std::string& out_dir, const nlohmann::ordered_json& profile) {
  const std::string path = (std::filesystem::path(out_dir) / "report.json").string();
  SHARDSCOPE_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path));
  nlohmann::ordered_json report = nlohmann::ordered_json::parse(text, nullptr, false);
  if (report.is_discarded()) return Status::Internal(fmt::format("{}: not JSON", path));
  report["profile"] = profile;
  return traces::WriteFileAtomically(path, report.dump(2) + "\n");
}

// Rank 0: the measured timeline is the host timeline (host backend, or CUPTI unavailable).
Status WriteHostTimelineAsTrace(const std::string& out_dir, std::string_view note) {
  const std::filesystem::path dir(out_dir);
  SHARDSCOPE_ASSIGN_OR_RETURN(std::string timeline, ReadWholeFile((dir / "host_timeline.json").string()));
  SHARDSCOPE_RETURN_IF_ERROR(traces::WriteFileAtomically((dir / "trace.json").string(), timeline));
  nlohmann::ordered_json profile;
  profile["source"] = "host_timeline";
  profile["note"] = note;
  return AddProfileToReport(out_dir, profile);
}

// The clock CUPTI timestamps are mapped onto: this process's steady clock (ns), shifted onto
// rank 0's by the measured offset.
int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// One rank's CUPTI capture (docs/PROFILER.md, "Wiring run --profile"). CUPTI is started
// (the source created, its kinds enabled: CUPTI initializes there) before the run, on every
// rank, and the ranks agree on the outcome before any of them runs (RunRun): a rank cannot
// find out alone, in a step, that it cannot capture. Records of the setup and warm-up steps
// are flushed and dropped (the capture is the sink that gates them); the collector takes the
// measured steps' records, flushed after each step, and CUPTI is finalized after the last.
// A failure once the run is under way (a flush, a stream id) stops this rank's capture with a
// warning and never the rank: its peers would wait for it in NCCL. Its part is then empty and
// rank 0 writes the host timeline instead. The op hooks push op ids only while it captures
// (the --cuda-graph replay after it is not recorded). Every hook runs on the rank's host thread.
class CuptiProfile final : public profiler::ActivitySink {
 public:
  CuptiProfile(const traces::Schedule& schedule, int32_t rank, int32_t warmup, int32_t steps,
               int64_t offset_to_rank_zero_ns)
      : schedule_(schedule), rank_(rank), warmup_(warmup), steps_(steps), offset_ns_(offset_to_rank_zero_ns) {}

  // Creates the source and enables its kinds. Fails as CUPTI does (no driver, no libcupti,
  // insufficient privileges, another profiler attached).
  Status Start() {
    StatusOr<std::unique_ptr<profiler::ActivitySource>> source = profiler::CreateCuptiActivitySource(*this, {});
    if (!source.ok()) return source.status();
    source_ = std::move(*source);
    if (Status enabled = source_->Enable(profiler::kDefaultActivityKinds); !enabled.ok()) {
      (void)source_->Finalize();
      source_.reset();
      return enabled;
    }
    return Status::Ok();
  }
  // Another rank could not start: this one stops too (no timeline of some ranks only).
  void Abandon() {
    if (source_) (void)source_->Finalize();
    source_.reset();
  }

  runtime::OpHooks Hooks() {
    runtime::OpHooks hooks;
    hooks.streams_created = [this](int32_t rank, const std::vector<void*>& streams) -> Status {
      rank_ = rank;
      for (size_t s = 0; s < streams.size() && !broken_; ++s) {
        StatusOr<uint32_t> id = profiler::CuptiStreamId(streams[s]);
        if (!id.ok()) {
          Stop(id.status());
          break;
        }
        stream_map_[*id] = static_cast<int32_t>(s);
      }
      return Status::Ok();
    };
    hooks.before_step = [this](int32_t step, bool measured) -> Status {
      if (!broken_ && measured && !capturing_ && step == warmup_) BeginCapture();
      return Status::Ok();
    };
    hooks.after_step = [this](int32_t step, bool measured) -> Status {
      if (broken_ || !source_) return Status::Ok();
      // The device is synchronized (the step ended with cudaDeviceSynchronize): every record
      // of the step is complete, so the flush delivers all of them (and, before the measured
      // steps, drops them).
      if (Status flushed = source_->Flush(); !flushed.ok()) {
        Stop(flushed);
        return Status::Ok();
      }
      if (!measured || !capturing_) return Status::Ok();
      Sample();
      if (step == warmup_ + steps_ - 1) {
        // Finalize's forced flush still delivers to the collector; nothing is issued meanwhile.
        Sample();
        const Status finalized = source_->Finalize();
        capturing_ = false;
        if (!finalized.ok()) Stop(finalized);
      }
      return Status::Ok();
    };
    hooks.before_issue = [this](int64_t op_id) {
      if (capturing_) issue_.before_issue(op_id);
    };
    hooks.after_issue = [this](int64_t op_id) {
      if (capturing_) issue_.after_issue(op_id);
    };
    return hooks;
  }

  // The gate: only the measured steps' records reach the collector.
  void OnActivities(std::span<const profiler::ActivityRecord> batch) override {
    if (capturing_ && collector_) collector_->OnActivities(batch);
  }

  // This rank's capture and source stats, as JSON for the gather to rank 0; also kept as
  // DIR/cupti/rank_<r>.json. Clock samples are on rank 0's host clock (offset applied). Empty
  // when this rank has no complete capture.
  StatusOr<std::string> Finish(const std::string& out_dir) {
    if (capturing_) {  // the run stopped early (OOM)
      const Status finalized = source_->Finalize();
      capturing_ = false;
      if (!finalized.ok()) Stop(finalized);
    }
    if (!source_ || !collector_ || broken_) return std::string();
    profiler::ActivityCapture capture;
    capture.rank = rank_;
    capture.dropped_records = source_->DroppedRecords();
    capture.stream_map = stream_map_;
    capture.clock_samples = samples_;
    capture.records = collector_->records();
    const std::filesystem::path dir = std::filesystem::path(out_dir) / "cupti";
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return Status::IoError(fmt::format("cannot create '{}': {}", dir.string(), ec.message()));
    SHARDSCOPE_RETURN_IF_ERROR(
        profiler::WriteActivityCaptureFile(capture, (dir / fmt::format("rank_{}.json", rank_)).string()));
    const profiler::ActivitySourceStats stats = source_->Stats();
    nlohmann::ordered_json out;
    out["capture"] = nlohmann::ordered_json::parse(profiler::ActivityCaptureToJson(capture));
    nlohmann::ordered_json by_kind;
    for (size_t k = 0; k < stats.records_by_kind.size(); ++k) {
      by_kind[std::string(profiler::ActivityKindName(static_cast<profiler::ActivityKind>(k)))] =
          stats.records_by_kind[k];
    }
    // The source's counts include the setup's and warm-up steps' records, flushed and dropped.
    out["source_stats"] = {{"records_by_kind", by_kind},
                           {"dropped_records", stats.dropped_records},
                           {"buffers_requested", stats.buffers_requested},
                           {"buffers_refused", stats.buffers_refused},
                           {"buffers_completed", stats.buffers_completed},
                           {"buffer_high_water", stats.buffer_high_water},
                           {"flushes", stats.flushes}};
    return out.dump();
  }

 private:
  void BeginCapture() {
    profiler::CollectorOptions options;
    options.rank = rank_;
    options.stream_map = stream_map_;
    options.first_step = warmup_;
    StatusOr<std::unique_ptr<profiler::ActivityCollector>> collector =
        profiler::ActivityCollector::Create(schedule_, options);
    if (!collector.ok()) {
      Stop(collector.status());
      return;
    }
    collector_ = std::move(*collector);
    issue_ = profiler::MakeOpIssueCallbacks(*source_);
    Sample();
    capturing_ = true;
  }
  // This rank captures no more; the run goes on.
  void Stop(const Status& why) {
    if (broken_) return;
    broken_ = true;
    capturing_ = false;
    std::cerr << fmt::format("shardscope run: rank {}: {}\n", rank_,
                             profiler::FallbackWarning(why.WithContext("CUPTI capture stopped")));
    if (source_) (void)source_->Finalize();
  }
  void Sample() { samples_.push_back({source_->Timestamp(), SteadyNowNs() + offset_ns_}); }

  const traces::Schedule& schedule_;
  int32_t rank_;
  const int32_t warmup_, steps_;
  const int64_t offset_ns_;
  std::map<uint32_t, int32_t> stream_map_;
  std::unique_ptr<profiler::ActivityCollector> collector_;
  std::unique_ptr<profiler::ActivitySource> source_;
  profiler::OpIssueCallbacks issue_;
  std::vector<profiler::ClockSample> samples_;
  bool capturing_ = false;
  bool broken_ = false;
};

nlohmann::ordered_json CollectorReportJson(const profiler::CollectorReport& report) {
  nlohmann::ordered_json by_kind;
  for (size_t k = 0; k < report.records_by_kind.size(); ++k) {
    by_kind[std::string(profiler::ActivityKindName(static_cast<profiler::ActivityKind>(k)))] =
        report.records_by_kind[k];
  }
  return {{"records_by_kind", by_kind},
          {"unmatched_device_records", report.unmatched_device_records},
          {"unmatched_api_records", report.unmatched_api_records},
          {"unknown_op_ids", report.unknown_op_ids},
          {"unmapped_stream_records", report.unmapped_stream_records},
          {"conflicting_correlations", report.conflicting_correlations},
          {"flows", report.flows},
          {"dropped_records", report.dropped_records}};
}

// Rank 0: every rank's capture -> DIR/trace.json (one timeline, rank 0's clock) and the
// report's "profile". `parts` holds each rank's CuptiProfile::Finish text ("" : no capture).
Status WriteCuptiTrace(const traces::Schedule& schedule, const std::string& out_dir,
                       const std::vector<std::string>& parts) {
  traces::TraceInfo info;
  info.backend = "nccl";
  info.world_size = schedule.world_size();
  info.producer = "shardscope run --backend cuda --profile (CUPTI)";
  const std::string path = (std::filesystem::path(out_dir) / "trace.json").string();
  SHARDSCOPE_ASSIGN_OR_RETURN(auto writer, traces::ChromeTraceWriter::Open(path, info));
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  for (size_t r = 0; r < parts.size(); ++r) {
    const nlohmann::ordered_json part = nlohmann::ordered_json::parse(parts[r]);
    const std::string source = fmt::format("rank {}'s capture", r);
    SHARDSCOPE_ASSIGN_OR_RETURN(profiler::ActivityCapture capture,
                                profiler::ParseActivityCaptureJson(part.at("capture").dump(), source));
    profiler::CollectorOptions options;
    options.rank = capture.rank;
    options.stream_map = capture.stream_map;
    SHARDSCOPE_ASSIGN_OR_RETURN(options.clock, profiler::FitClockMap(capture.clock_samples));
    // Seq continues from the warm-up steps run before the capture started.
    options.first_step = part.value("first_step", int64_t{0});
    SHARDSCOPE_ASSIGN_OR_RETURN(auto collector, profiler::ActivityCollector::Create(schedule, options));
    collector->OnActivities(capture.records);
    collector->SetDroppedRecords(capture.dropped_records);
    const profiler::CollectorReport report = collector->WriteTimeline(*writer);
    ranks.push_back({{"rank", capture.rank},
                     {"clock", {{"rate", options.clock.rate}, {"anchor_source_ns", options.clock.source_anchor_ns},
                                {"anchor_target_ns", options.clock.target_anchor_ns}}},
                     {"collector", CollectorReportJson(report)},
                     {"source", part.at("source_stats")}});
  }
  SHARDSCOPE_RETURN_IF_ERROR(writer->Finish());
  nlohmann::ordered_json profile;
  profile["source"] = "cupti";
  profile["note"] = "device records captured with CUPTI, mapped onto rank 0's host clock";
  profile["ranks"] = ranks;
  return AddProfileToReport(out_dir, profile);
}

struct RunCommandOptions {
  std::string input;
  std::string out_dir = "shardscope-run";
  std::string backend = "host";
  int32_t steps = 2;
  int32_t warmup = 1;
  double timeout_s = 300;
  double time_scale = 0.001;
  std::string inject_oom;
  double device_memory_gb = 0;  // 0: the schedule's GPU
  bool cuda_graph = false;
  bool profile = false;
  bool quiet = false;
  bool force = false;
};

Status RunRun(const RunCommandOptions& options) {
  if (options.backend != "host" && options.backend != "cuda") {
    return Status::InvalidInput(fmt::format("--backend: expected 'host' or 'cuda', got '{}'", options.backend));
  }
  const bool cuda = options.backend == "cuda";
  if (options.cuda_graph && !cuda) return Status::InvalidInput("--cuda-graph needs --backend cuda");
  if (cuda) {
    // Before anything is read or written: the options' own errors (--warmup 0 ...), then a
    // machine without the CUDA libraries, a driver or a device (or a build without the
    // backend) fails here ("needs libnccl.so.2 ...", "no CUDA device: <cuda error>") and
    // writes nothing.
    runtime::CudaRunOptions checked;
    checked.common.steps = options.steps;
    checked.common.warmup = options.warmup;
    checked.common.timeout_s = options.timeout_s;
    checked.cuda_graph = options.cuda_graph;
    SHARDSCOPE_RETURN_IF_ERROR(runtime::CheckCudaRunOptions(checked));
    SHARDSCOPE_RETURN_IF_ERROR(runtime::CudaDeviceCount().status());
  }
  constexpr double kBytesPerGiB = double(int64_t{1} << 30);
  if (!(options.device_memory_gb >= 0) || options.device_memory_gb * kBytesPerGiB > 9.0e18) {
    return Status::InvalidInput(
        fmt::format("--device-memory-gb: expected a non-negative number of GiB, got {}", options.device_memory_gb));
  }
  // Every rank loads and checks the input the same way, so bad input fails on all of them
  // before any collective.
  SHARDSCOPE_ASSIGN_OR_RETURN(LoadedInput loaded,
                              LoadInput(options.input, LoadOptionsWith(options.force, options.quiet)));
  runtime::RunOptions run;
  run.source = options.input;
  run.out_dir = options.out_dir;
  run.steps = options.steps;
  run.warmup = options.warmup;
  run.timeout_s = options.timeout_s;
  run.time_scale = options.time_scale;
  run.quiet = options.quiet;
  if (options.device_memory_gb > 0) run.capacity_bytes = std::llround(options.device_memory_gb * kBytesPerGiB);
  SHARDSCOPE_ASSIGN_OR_RETURN(run.inject_oom, ParseInjectedOom(options.inject_oom, loaded.schedule));

  SHARDSCOPE_ASSIGN_OR_RETURN(std::unique_ptr<runtime::MpiSession> mpi, runtime::MpiSession::Init());
  // From here a rank may fail alone: its errors are its own (launcher.h).
  MarkRanksDiverged();
  if (mpi->rank() == 0 && !options.quiet) {
    std::cerr << fmt::format("shardscope: running {} on {} process(es), {} backend\n", options.input,
                             mpi->world_size(), options.backend);
  }
  // One rank per process unless one process drives every GPU (MPI singleton, world > 1).
  const int32_t ranks_here = mpi->world_size() == 1 ? loaded.schedule.world_size() : 1;
  runtime::ProfileDecision profile = runtime::DecideProfileMode(options.profile, cuda, ranks_here, Status::Ok());
  std::unique_ptr<CuptiProfile> cupti;
  if (options.profile && cuda) {
    // Every rank takes part (a rank whose probe failed too), at a quiet point before the run
    // (clock_alignment.h recommends 16 rounds).
    SHARDSCOPE_ASSIGN_OR_RETURN(profiler::ClockOffsetEstimate offset,
                                profiler::SyncClockToRankZeroOverMpi(16, SteadyNowNs));
    // CUPTI is started here, before the run, and the ranks agree on the outcome: capture runs
    // on every rank or on none.
    Status started = Status::Ok();
    if (ranks_here == 1) {
      cupti = std::make_unique<CuptiProfile>(loaded.schedule, mpi->rank(), options.warmup, options.steps,
                                             offset.offset_ns);
      started = cupti->Start();
    }
    SHARDSCOPE_ASSIGN_OR_RETURN(const bool all_started, mpi->AllRanks(started.ok()));
    if (started.ok() && !all_started) {
      started = Status::IoError("CUPTI capture unavailable: it could not start on another rank (that rank's warning "
                                "says why)");
    }
    profile = runtime::DecideProfileMode(options.profile, cuda, ranks_here, started);
    if (profile.mode == runtime::ProfileMode::kCupti) {
      run.hooks = cupti->Hooks();
    } else {
      if (cupti) cupti->Abandon();
      cupti.reset();
      std::cerr << fmt::format("shardscope run: rank {}: {}\n", mpi->rank(), profiler::FallbackWarning(profile.reason));
    }
  }
  runtime::RunResult result;
  if (cuda) {
    runtime::CudaRunOptions cuda_run;
    cuda_run.common = run;
    cuda_run.cuda_graph = options.cuda_graph;
    SHARDSCOPE_ASSIGN_OR_RETURN(result, runtime::RunCudaBackend(*mpi, loaded.schedule, loaded.setup, cuda_run));
  } else {
    SHARDSCOPE_ASSIGN_OR_RETURN(result, runtime::RunHostBackend(*mpi, loaded.schedule, loaded.setup, run));
  }
  if (options.profile) {
    std::vector<std::string> parts;
    if (cuda) {
      std::string mine;
      if (cupti) {
        SHARDSCOPE_ASSIGN_OR_RETURN(mine, cupti->Finish(options.out_dir));
        if (!mine.empty()) {
          nlohmann::ordered_json part = nlohmann::ordered_json::parse(mine);
          part["first_step"] = options.warmup;
          mine = part.dump();
        }
      }
      SHARDSCOPE_ASSIGN_OR_RETURN(parts, mpi->GatherToRankZero(mine));
    }
    if (mpi->rank() == 0) {
      const bool all_captured =
          cuda && !parts.empty() && std::all_of(parts.begin(), parts.end(), [](const std::string& p) { return !p.empty(); });
      if (all_captured) {
        SHARDSCOPE_RETURN_IF_ERROR(WriteCuptiTrace(loaded.schedule, options.out_dir, parts));
      } else {
        const std::string note =
            cuda ? "CUPTI capture did not run on every rank (see the warnings): the measured timeline is the host "
                   "timeline, when the host issued each op"
                 : "host backend: the measured timeline is the host timeline (streams are threads; no CUPTI)";
        SHARDSCOPE_RETURN_IF_ERROR(WriteHostTimelineAsTrace(options.out_dir, note));
        if (!options.quiet) std::cerr << fmt::format("shardscope run: --profile: {}\n", note);
      }
    }
  }
  if (mpi->rank() == 0) {
    std::cout << result.summary;
    std::cout << fmt::format("  wrote {0}/report.json and {0}/host_timeline.json{1}\n", options.out_dir,
                             options.profile ? fmt::format(" and {}/trace.json", options.out_dir) : "");
  }
  if (!result.oom_ranks.empty() || !result.completed) {
    return Status::Internal(mpi->rank() == 0 ? "the run did not complete: a rank ran out of memory"
                                             : "the run did not complete");
  }
  return Status::Ok();
}

}  // namespace

CommandRunner AddRunCommand(CLI::App& app) {
  auto options = std::make_shared<RunCommandOptions>();
  CLI::App* cmd = app.add_subcommand(
      "run",
      "Execute a plan or schedule, one process per rank under mpirun (mpirun -np N shardscope run ...). "
      "--backend host runs it without a GPU: streams as threads, MPI collectives on host buffers, the simulator's "
      "allocator policy, kernels busy-waiting their predicted time x --time-scale. It checks execution semantics "
      "(ordering, collectives, memory, hangs), not performance. --backend cuda runs it on GPUs with proxy kernels of "
      "the schedule's shapes and NCCL (libcudart, libcublasLt and libnccl are opened then, not needed by anything else). Writes DIR/report.json and DIR/host_timeline.json (when the host issued each "
      "op); a hang "
      "writes DIR/flight_recorder/rank_<r>.json and aborts the job");
  cmd->add_option("input", options->input, "Plan YAML or schedule JSON")->required()->check(CLI::ExistingFile);
  cmd->add_option("-o,--output", options->out_dir, "Output directory")->capture_default_str();
  cmd->add_option("--backend", options->backend,
                  "host (MPI + threads, no GPU) or cuda (CUDA streams, NCCL, proxy kernels; one process per GPU "
                  "under mpirun, or one process over every local GPU)")
      ->capture_default_str();
  cmd->add_flag("--cuda-graph", options->cuda_graph,
                "--backend cuda: also capture one step in a CUDA graph and replay it (eager vs replay step times)");
  cmd->add_flag("--profile", options->profile,
                "Also write the measured timeline DIR/trace.json (`shardscope diff PREDICTED DIR` reads it). "
                "--backend cuda: CUPTI device records per rank (kernels, copies, syncs, API calls tagged with op "
                "ids) of the measured steps, raw captures in DIR/cupti/rank_<r>.json, counts in report.json "
                "\"profile\"; CUPTI starts before the run on every rank or on none: where it cannot it warns and "
                "writes the host timeline instead. --backend host: the host timeline "
                "(no CUPTI)");
  cmd->add_option("--steps", options->steps, "Measured steps")->capture_default_str();
  cmd->add_option("--warmup", options->warmup,
                  "Steps run before the measured ones (--backend cuda: at least 1; the first step on a GPU loads "
                  "kernels and connects NCCL peers)")
      ->capture_default_str();
  cmd->add_option("--timeout", options->timeout_s,
                  "Watchdog: seconds without any op completing on a rank before it dumps its flight recorder and "
                  "aborts the job")
      ->capture_default_str();
  cmd->add_option("--time-scale", options->time_scale,
                  "Kernels, copies and host work busy-wait the simulator's predicted duration x this")
      ->capture_default_str();
  cmd->add_option("--inject-oom", options->inject_oom,
                  "RANK:OP_ID: that allocate op fails as an out-of-memory in the first measured step; the rank stops "
                  "(OOM policy raise), as in `shardscope simulate --inject-oom`");
  cmd->add_option("--device-memory-gb", options->device_memory_gb,
                  "Allocator capacity per rank in GiB (default: the schedule's GPU memory minus the CUDA context)");
  cmd->add_flag("-q,--quiet", options->quiet, "No progress messages on stderr");
  cmd->add_flag("--force", options->force, "Go on past the size limit (a schedule over 8 GiB in memory)");
  return [cmd, options]() -> std::optional<Status> {
    if (!*cmd) return std::nullopt;
    return RunRun(*options);
  };
}

}  // namespace shardscope::cli

// `shardscope check` as a library call: the plan run once as it is (it must complete), then
// the fault sweep (fault_sweep.h) in parallel threads, the table, and what the known OOM
// mitigation costs. The CLI prints the text; the Python module returns it with the results.
// (Moved from cli/check_command.cc RunCheck and MitigationLine.)
#ifndef SHARDSCOPE_SIM_HANGS_CHECK_H_
#define SHARDSCOPE_SIM_HANGS_CHECK_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "shardscope/base/status.h"
#include "shardscope/sim/hangs/fault_sweep.h"
#include "shardscope/sim/lowering/load_input.h"

namespace shardscope::sim {

// The sweep's settings, as `shardscope check`'s options give them (messages name the flags).
struct CheckSettings {
  std::vector<int32_t> oom_ranks;          // --ranks; empty: the first rank of each program
  std::map<int32_t, double> stragglers;    // --straggler; empty: the first OOM rank at 2x
  double watchdog_minutes = 10;            // --watchdog-minutes
  double seq_len_factor = FaultSweepOptions{}.seq_len_factor;  // --seq-len-factor
  double moe_load = FaultSweepOptions{}.moe_load;              // --moe-load
  double held_gib = static_cast<double>(FaultSweepOptions{}.held_bytes) / static_cast<double>(int64_t{1} << 30);
  int threads = 0;                         // --threads; 0: one per hardware thread
};

// InvalidInput naming the flag when a setting is out of range.
Status ValidateCheckSettings(const CheckSettings& settings);

enum class CheckVerdict : uint8_t {
  kSafe,           // every fault is safe
  kHangs,          // some fault hangs
  kBaselineHangs,  // the plan does not complete without faults (no sweep)
  kBaselineOom,    // the plan runs out of memory without faults (no sweep)
};

struct CheckRun {
  CheckVerdict verdict = CheckVerdict::kSafe;
  int64_t baseline_step_ns = 0;
  std::vector<FaultCaseResult> results;      // in case order
  std::vector<std::string> baseline_why;     // kBaselineHangs: AnalyzeHang's explanation
  // Unless kSafe: the one-line error the CLI exits 1 with ("2 of 9 injected fault(s) hang").
  std::string failure;
};

// How a caller follows the check's two long phases, the baseline run and then the sweep: each
// begins with a title ("the baseline run (8 ranks)", "12 fault case(s)"), reports its fraction
// done (the sweep with a detail per finished case: "3/12: oom rank 0 at layers.3: hang",
// called under the sweep's lock), and ends before the text that follows it is printed. Any
// member may be empty; without `update` the runs report nothing.
struct CheckProgress {
  std::function<void(const std::string& what)> begin;
  std::function<void(double fraction, const std::string& detail)> update;
  std::function<void()> end;
};

// Runs the check of `input` (named `label` in the text). `print` receives the text
// `shardscope check` prints, piece by piece as it is known.
StatusOr<CheckRun> RunCheck(const LoadedInput& input, const std::string& label, const CheckSettings& settings,
                            const std::function<void(const std::string&)>& print, const CheckProgress& progress);

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_HANGS_CHECK_H_

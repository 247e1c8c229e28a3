// Progress of long work on stderr, for every command: one line redrawn in place when stderr
// is a terminal (at most ten times a second), and otherwise (logs, CI) a plain line at each
// tenth of the work and at most one every ten seconds, so a 149-second `check` is never
// silent and a log is not flooded. Nothing at all with -q. stdout (the command's result) is
// never touched, so outputs stay byte-identical with and without progress. Under a launcher
// (mpirun) only the job's rank 0 reports.
#ifndef SHARDSCOPE_CLI_PROGRESS_H_
#define SHARDSCOPE_CLI_PROGRESS_H_

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

namespace shardscope::cli {

class Progress {
 public:
  // `what`: the work, as in "simulating 1024 ranks". Quiet: nothing is printed.
  Progress(std::string what, bool quiet);
  ~Progress();  // Done()
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // The fraction done (0..1) and an optional detail ("case 12/40: oom rank 0 layers.3").
  // Thread-safe: the fault sweep reports from its workers.
  void Update(double fraction, std::string_view detail = {});
  // Clears the line on a terminal; prints nothing else.
  void Done();

  // A one-off line ("shardscope: loading x"), unless quiet.
  static void Note(bool quiet, std::string_view line);

 private:
  using Clock = std::chrono::steady_clock;
  std::string what_;
  bool quiet_;
  bool tty_;
  std::mutex mutex_;
  Clock::time_point last_print_{};
  int last_tenth_ = -1;
  bool drawn_ = false;
};

}  // namespace shardscope::cli

#endif  // SHARDSCOPE_CLI_PROGRESS_H_

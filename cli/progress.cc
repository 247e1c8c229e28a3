#include "progress.h"

#include "launcher.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <iostream>

#include <fmt/format.h>

namespace shardscope::cli {
namespace {

// A terminal redraw at most this often: faster is invisible and costs the work time.
constexpr auto kTerminalInterval = std::chrono::milliseconds(100);
// In a log: a line per tenth of the work, and not more often than this.
constexpr auto kLogInterval = std::chrono::seconds(10);
constexpr int kLogSteps = 10;

}  // namespace

namespace {

// Under a launcher only the job's rank 0 reports progress (launcher.h): N ranks' lines would
// interleave.
bool QuietHere(bool quiet) {
  static const bool other_rank = [] {
    const std::optional<LauncherRank> launcher = LauncherRankFromEnvironment([](const char* name) -> const char* {
      return std::getenv(name);
    });
    return launcher && launcher->rank != 0;
  }();
  return quiet || other_rank;
}

}  // namespace

Progress::Progress(std::string what, bool quiet)
    : what_(std::move(what)), quiet_(QuietHere(quiet)), tty_(!quiet_ && ::isatty(STDERR_FILENO) != 0) {
  if (!quiet_ && !tty_) std::cerr << fmt::format("shardscope: {} ...\n", what_) << std::flush;
  last_print_ = Clock::now();
}

Progress::~Progress() { Done(); }

void Progress::Update(double fraction, std::string_view detail) {
  if (quiet_) return;
  const double clamped = std::clamp(std::isfinite(fraction) ? fraction : 0.0, 0.0, 1.0);
  std::lock_guard<std::mutex> lock(mutex_);
  const Clock::time_point now = Clock::now();
  if (tty_) {
    if (drawn_ && now - last_print_ < kTerminalInterval && clamped < 1.0) return;
    std::cerr << fmt::format("\r\033[Kshardscope: {} {:5.1f}%{}{}", what_, 100 * clamped, detail.empty() ? "" : "  ",
                             detail)
              << std::flush;
    drawn_ = true;
    last_print_ = now;
    return;
  }
  const int tenth = static_cast<int>(clamped * kLogSteps);
  if (tenth <= last_tenth_ || (now - last_print_ < kLogInterval && tenth < kLogSteps)) return;
  last_tenth_ = tenth;
  last_print_ = now;
  std::cerr << fmt::format("shardscope: {}: {:.0f}%{}{}\n", what_, 100 * clamped, detail.empty() ? "" : " ", detail)
            << std::flush;
}

void Progress::Done() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (tty_ && drawn_) std::cerr << "\r\033[K" << std::flush;
  drawn_ = false;
}

void Progress::Note(bool quiet, std::string_view line) {
  if (!QuietHere(quiet)) std::cerr << "shardscope: " << line << "\n" << std::flush;
}

}  // namespace shardscope::cli

#include "watchdog.h"

#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <set>

#include <fmt/format.h>

namespace shardscope::runtime {

void Watchdog::Start() { thread_ = std::thread([this] { Loop(); }); }

void Watchdog::Stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

bool Watchdog::Stalled(int64_t timeout_ns) const {
  for (RankExecutor* r : ranks_) {
    if (r->Now() - r->last_progress_ns() <= timeout_ns) continue;
    if (config_.stalled_after_finish || !r->finished() || r->HasPendingCollectives()) return true;
  }
  return false;
}

std::string Watchdog::FailureReason() {
  for (RankExecutor* r : ranks_) {
    if (r->failed()) return fmt::format("the rank failed: {}", r->device_error().message());
  }
  return "";
}

void Watchdog::Loop() {
  using Clock = std::chrono::steady_clock;
  const auto poll = std::chrono::milliseconds(20);
  const auto timeout_ns = static_cast<int64_t>(config_.timeout_s * 1e9);
  // Long enough for peers whose own timers are a poll or two behind, short enough for CI.
  const int64_t grace_ns = std::clamp<int64_t>(timeout_ns / 2, 500'000'000, 5'000'000'000);
  const int32_t world = peers_ != nullptr ? peers_->world_size() : 1;
  bool dumping = false, written = false, initiator = false, on_error = false;
  int64_t dump_started = 0, written_at = 0;
  std::string reason;
  std::map<int32_t, std::vector<int64_t>> peer_states;
  std::set<int32_t> dumped_peers;
  const Clock::time_point t0 = Clock::now();
  auto now_ns = [&] { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count(); };
  while (!(stop_.load() && !dumping)) {
    std::this_thread::sleep_for(poll);
    for (RankExecutor* r : ranks_) r->PollCollectives();
    if (peers_ != nullptr) {
      for (PeerChannel::Message& m : peers_->Receive()) {
        if (m.dumped) {
          dumped_peers.insert(m.source);
          continue;
        }
        peer_states[m.source] = std::move(m.state);
        if (!dumping) reason = fmt::format("dump requested by rank {} (its watchdog fired)", m.source);
      }
    }
    const std::string failure = dumping ? "" : FailureReason();
    if (!dumping && (!failure.empty() || Stalled(timeout_ns) || !peer_states.empty())) {
      dumping = true;
      dump_started = now_ns();
      on_error = !failure.empty();
      if (peer_states.empty()) {
        initiator = true;
        reason = !failure.empty() ? failure
                                  : fmt::format("watchdog timeout: no operation completed on this rank for {:g} s",
                                                config_.timeout_s);
        std::cerr << fmt::format("{}{}; dumping the flight recorder and aborting the job\n", config_.log_prefix,
                                 reason);
      }
      if (peers_ != nullptr) peers_->SendStateToAll(ranks_[0]->ProgressState());
    }
    const int64_t now = now_ns();
    if (dumping && !written &&
        (peers_ == nullptr || static_cast<int32_t>(peer_states.size()) == world - 1 || now - dump_started > grace_ns)) {
      if (peers_ == nullptr) {
        // Every rank is here: each learns the others' progress directly.
        std::map<int32_t, std::vector<int64_t>> local_states;
        for (RankExecutor* r : ranks_) local_states[r->rank()] = r->ProgressState();
        for (RankExecutor* r : ranks_) r->WriteDump(reason, local_states);
      } else {
        ranks_[0]->WriteDump(reason, peer_states);
        peers_->SendDumpedToAll();
      }
      written = true;
      written_at = now_ns();
    }
    if (written) {
      const bool all_dumped = peers_ == nullptr || static_cast<int32_t>(dumped_peers.size()) == world - 1;
      if ((initiator && (all_dumped || now - written_at > grace_ns)) || now - written_at > 3 * grace_ns) {
        // NCCL kernels of a hung collective spin forever; abort them before tearing down.
        for (RankExecutor* r : ranks_) r->device().AbortCollectives();
        std::cerr << fmt::format("{}{}aborting the job ({})\n", config_.log_prefix, config_.abort_note,
                                 on_error ? "error" : "hang");
        if (config_.end_job) config_.end_job();
        return;
      }
    }
  }
}

}  // namespace shardscope::runtime

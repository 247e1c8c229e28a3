// What the engine's tests share beyond sim/testing/engine_test_support.h: an observer that
// records every span, and a memory-simulation config. Test-only.
#ifndef SHARDSCOPE_SIM_ENGINE_SRC_ENGINE_TEST_UTIL_H_
#define SHARDSCOPE_SIM_ENGINE_SRC_ENGINE_TEST_UTIL_H_

#include <map>
#include <utility>

#include "engine_test_support.h"
#include "shardscope/sim/engine/engine.h"

namespace shardscope::sim::test_support {

// Records every span, keyed by (rank, op id).
class Recorder : public EngineObserver {
 public:
  explicit Recorder(const traces::Schedule& schedule) : schedule_(schedule) {}
  bool WantsRank(int32_t) const override { return true; }
  void OnHostSpan(const HostSpan& span) override {
    host[{span.rank, IdOf(span.rank, span.op_index)}] = {span.start_ns, span.end_ns};
  }
  void OnDeviceSpan(const DeviceSpan& span) override {
    device[{span.rank, IdOf(span.rank, span.op_index)}] = {span.start_ns, span.end_ns};
    if (span.collective != nullptr) seq[{span.rank, IdOf(span.rank, span.op_index)}] = span.collective->seq;
  }
  using Key = std::pair<int32_t, int64_t>;
  std::map<Key, std::pair<int64_t, int64_t>> host, device;
  std::map<Key, int64_t> seq;

 private:
  int64_t IdOf(int32_t rank, int32_t index) const {
    return schedule_.ProgramOf(rank).ops[static_cast<size_t>(index)].id;
  }
  const traces::Schedule& schedule_;
};

inline EngineConfig WithMemory(int64_t capacity, bool warm) {
  EngineConfig config = Launch10();
  config.memory.enabled = true;
  config.memory.capacity_bytes = {capacity};
  config.memory.device_alloc_ns = 1000;
  config.memory.device_free_ns = 500;
  config.memory.warm_start = warm;
  return config;
}

// Every rank runs rank 0's program (ranks of one class share it, as the lowerings make them).
inline void ShareRankZerosProgram(ScheduleBuilder& b) {
  for (size_t r = 1; r < b.schedule.ranks.size(); ++r) b.schedule.ranks[r].program = 0;
}

// What the engine's test files use: `using namespace test_support::engine_tests;`.
namespace engine_tests {
using namespace traces;
using Builder = ScheduleBuilder;
using test_support::FakeCosts;
using test_support::Launch10;
using test_support::Recorder;
using test_support::ShareRankZerosProgram;
using test_support::WithMemory;
}  // namespace engine_tests

}  // namespace shardscope::sim::test_support

#endif  // SHARDSCOPE_SIM_ENGINE_SRC_ENGINE_TEST_UTIL_H_

// What the engine-level tests share: a cost provider with hand-computable costs and a builder
// of small per-rank schedules. Test-only (included by sim/*/src/*_test.cc); inline so it stays
// out of the library.
#ifndef SHARDSCOPE_SIM_ENGINE_TEST_SUPPORT_H_
#define SHARDSCOPE_SIM_ENGINE_TEST_SUPPORT_H_

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "shardscope/sim/engine/engine.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::sim::test_support {

// Fixed kernels cost their duration; collectives cost `bytes` ns; copies cost bytes ns.
class FakeCosts : public CostProvider {
 public:
  int64_t KernelNs(const traces::ComputeDesc& desc) const override {
    return std::get<traces::FixedDurationDesc>(desc).duration_ns;
  }
  int64_t MemcpyNs(traces::MemcpyKind, int64_t bytes) const override { return bytes; }
  CollectiveCost Collective(traces::CollectiveType, int64_t bytes, int32_t) const override {
    CollectiveCost cost;
    cost.duration_ns = bytes;
    return cost;
  }
};

// One program per rank with streams s0, s1, events e0, e1, tensors a, b, c, and the given
// communicators, each spanning every rank and bound to the slot of the same name.
class ScheduleBuilder {
 public:
  explicit ScheduleBuilder(int world, std::vector<std::string> comms = {"world"}) {
    for (const std::string& name : comms) {
      traces::Communicator c{name, {}};
      for (int r = 0; r < world; ++r) c.ranks.push_back(r);
      schedule.communicators.push_back(c);
    }
    for (int r = 0; r < world; ++r) {
      traces::Program p;
      p.name = "rank" + std::to_string(r);
      p.streams = {{"s0", 0}, {"s1", 0}};
      p.events = {"e0", "e1"};
      p.tensors = {"a", "b", "c"};
      p.comm_slots = comms;
      schedule.programs.push_back(p);
      schedule.ranks.push_back({r, {}});
    }
  }
  ScheduleBuilder& Add(int rank, traces::OpPayload payload) {
    traces::Program& p = schedule.programs[static_cast<size_t>(rank)];
    traces::Op op;
    op.id = static_cast<int64_t>(p.ops.size());
    op.payload = payload;
    p.ops.push_back(op);
    return *this;
  }
  ScheduleBuilder& Kernel(int rank, int stream, int64_t ns) {
    return Add(rank, traces::KernelOp{stream, traces::FixedDurationDesc{ns}});
  }
  // A collective on communicator slot `slot` costing `bytes` ns.
  ScheduleBuilder& CollOn(int rank, int slot, int stream, int64_t bytes,
                          traces::CollectiveType type = traces::CollectiveType::kAllReduce) {
    traces::CollectiveOp c;
    c.type = type;
    c.comm = slot;
    c.stream = stream;
    c.bytes = bytes;
    return Add(rank, c);
  }
  // A send to (or recv from) global rank `peer` on communicator slot `slot`, costing `bytes` ns.
  ScheduleBuilder& P2p(int rank, traces::CollectiveType type, int peer, int64_t bytes, int slot = 0, int stream = 0) {
    traces::CollectiveOp c;
    c.type = type;
    c.comm = slot;
    c.stream = stream;
    c.bytes = bytes;
    c.peer = peer;
    return Add(rank, c);
  }
  // The same on the first communicator.
  ScheduleBuilder& Coll(int rank, int stream, int64_t bytes,
                        traces::CollectiveType type = traces::CollectiveType::kAllReduce) {
    return CollOn(rank, 0, stream, bytes, type);
  }
  SimulationResult Run(const EngineConfig& config, EngineObserver* observer = nullptr) {
    EXPECT_TRUE(schedule.ResolveBindings().ok());
    FakeCosts costs;
    StatusOr<SimulationResult> result = Simulate(schedule, costs, config, observer);
    EXPECT_TRUE(result.ok()) << result.status().message();
    return *result;
  }
  traces::Schedule schedule;
};

// Every launch costs the host 10 ns.
inline EngineConfig Launch10() {
  EngineConfig config;
  config.launch_overhead_ns = 10;
  return config;
}

}  // namespace shardscope::sim::test_support

#endif  // SHARDSCOPE_SIM_ENGINE_TEST_SUPPORT_H_

// Caching-allocator speed: allocator operations per second on one core.
//   build/bin/shardscope_bench --benchmark_filter=Allocator
// AllocatorSteadyState: a warm cache of mixed small and large blocks on two streams; each
// iteration frees one live block and allocates the same size on the same stream again, so
// every malloc is served from the cache (split and merged blocks included).
// items_per_second counts a malloc and a free as two operations.
// AllocatorGrowingFragmentation: the growing 12 MiB / 30 MiB sequence of the unit tests,
// under the default policy (a new segment every step) and with expandable segments;
// reports the peak reserved bytes it ends with.
#include <benchmark/benchmark.h>

#include <array>
#include <cstdint>
#include <vector>

#include "shardscope/sim/models/caching_allocator.h"

namespace shardscope::sim {
namespace {

// Request sizes: small-pool tensors (biases, norms), mid-size ones sharing 20 MiB segments,
// and large ones with segments of their own.
constexpr std::array<int64_t, 16> kSizes = {
    4096,       64 * 1024,      300 * 1000, 1 << 20,        // small pool
    3 << 20,    5 * 1000 * 1000, 7 << 20,   9 * 1000 * 1000,  // 20 MiB segments, split
    12 << 20,   16 << 20,       33 << 20,  50 * 1000 * 1000, // own segments
    2048,       768 * 1024,     2 << 20,   24 << 20};
constexpr int kLive = 256;  // live blocks in the working set

void BM_AllocatorSteadyState(benchmark::State& state) {
  auto memory = MakeCapacityDeviceMemory(int64_t{80} << 30);
  CompletedStreamEvents events;
  CachingAllocator allocator(AllocatorConfig{}, *memory, events);
  struct Live {
    uint64_t address;
    int64_t bytes;
    AllocStream stream;
  };
  std::vector<Live> live(kLive);
  for (int i = 0; i < kLive; ++i) {
    const int64_t bytes = kSizes[static_cast<size_t>(i) % kSizes.size()];
    const AllocStream stream = (i / 3) % 2;  // two streams, not in lockstep with sizes
    live[static_cast<size_t>(i)] = {allocator.Malloc(bytes, stream).address, bytes, stream};
  }
  const int64_t segments_before = allocator.stats().num_device_alloc;
  size_t next = 0;
  for (auto _ : state) {
    Live& slot = live[next];
    allocator.Free(slot.address);
    const MallocOutcome out = allocator.Malloc(slot.bytes, slot.stream);
    slot.address = out.address;
    benchmark::DoNotOptimize(out);
    next = (next * 7 + 13) % kLive;  // visit slots in a scrambled order
  }
  state.SetItemsProcessed(state.iterations() * 2);
  state.counters["new_segments"] =
      static_cast<double>(allocator.stats().num_device_alloc - segments_before);
  state.counters["reserved_MiB"] =
      static_cast<double>(allocator.stats().reserved_bytes) / static_cast<double>(kMiB);
}
BENCHMARK(BM_AllocatorSteadyState);

void BM_AllocatorGrowingFragmentation(benchmark::State& state) {
  const bool expandable = state.range(0) != 0;
  const int steps = static_cast<int>(state.range(1));
  int64_t peak = 0;
  for (auto _ : state) {
    auto memory = MakeCapacityDeviceMemory(int64_t{80} << 30);
    CompletedStreamEvents events;
    AllocatorConfig config;
    config.expandable_segments = expandable;
    CachingAllocator allocator(config, *memory, events);
    for (int k = 0; k < steps; ++k) {
      const uint64_t x = allocator.Malloc((12 + 2 * int64_t{k}) * kMiB, 0).address;
      const uint64_t y = allocator.Malloc((30 + 2 * int64_t{k}) * kMiB, 0).address;
      allocator.Free(x);
      allocator.Free(y);
    }
    peak = allocator.stats().reserved_bytes_peak;
    benchmark::DoNotOptimize(peak);
  }
  state.SetItemsProcessed(state.iterations() * steps * 4);
  state.counters["peak_reserved_MiB"] = static_cast<double>(peak) / static_cast<double>(kMiB);
}
BENCHMARK(BM_AllocatorGrowingFragmentation)
    ->ArgNames({"expandable", "steps"})
    ->Args({0, 100})
    ->Args({1, 100});

}  // namespace
}  // namespace shardscope::sim

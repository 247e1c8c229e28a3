// libFuzzer target for the framework config readers a plan may name (sim/plan/src/plan_sources.h):
// the Hugging Face config.json, DeepSpeed JSON and torchtitan TOML readers must turn any bytes
// into settings or a Status, never crash, hang or throw. The first byte picks the reader
// (byte % 3: 0 Hugging Face, 1 DeepSpeed, 2 torchtitan); the rest is the file.
//
//   fuzz/plan_sources_fuzz fuzz/corpus/plan_sources -max_total_time=60
// Seeds start with '0' (0x30 % 3 = 0), '1' or '2'.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "plan_sources.h"

namespace {

template <typename T>
void Check(const shardscope::StatusOr<T>& result) {
  // Every error must say what went wrong.
  if (!result.ok() && result.status().message().empty()) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
      Check(shardscope::sim::ReadHfConfig(text, "config.json"));
      break;
    case 1:
      Check(shardscope::sim::ReadDeepSpeedConfig(text, "ds_config.json"));
      break;
    default:
      Check(shardscope::sim::ReadTorchtitanConfig(text, "job.toml"));
      break;
  }
  return 0;
}

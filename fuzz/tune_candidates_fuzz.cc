// libFuzzer target for tune's candidates (sim/tune/src/tune_candidates.h): any plan the loader
// accepts becomes candidate plans by editing its YAML, and each candidate text must be YAML the
// loader reads (or refuses with a message), never a crash or an uncaught exception; the
// `--search` parser takes any bytes. The input is a plan; its first line is also tried as a
// `--search` list.
//
//   fuzz/tune_candidates_fuzz fuzz/corpus/tune -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "shardscope/sim/plan/plan.h"
#include "shardscope/sim/tune/tune.h"
#include "tune_candidates.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::string first_line = text.substr(0, text.find('\n'));
  const auto space = shardscope::sim::ParseTuneSpace(first_line);
  if (!space.ok() && space.status().message().empty()) __builtin_trap();
  shardscope::sim::TuneOptions options;
  options.gpus = 16;
  auto base = shardscope::sim::tune_internal::SearchBaseOf(text, "fuzz.yaml", options);
  if (!base.ok()) {
    if (base.status().message().empty()) __builtin_trap();
    return 0;
  }
  const auto knobs = shardscope::sim::tune_internal::EnumerateKnobs(*base, shardscope::sim::TuneSpace{}, 4);
  // A handful spread over the list: every strategy's section is edited.
  for (size_t i = 0; i < knobs.size(); i += 1 + knobs.size() / 12) {
    const std::string yaml = shardscope::sim::tune_internal::CandidateYaml(*base, knobs[i]);
    const auto plan = shardscope::sim::ParsePlan(yaml, "candidate.yaml");
    if (!plan.ok() && plan.status().message().empty()) __builtin_trap();
    (void)shardscope::sim::tune_internal::KnobsLabel(knobs[i], options.gpus);
  }
  return 0;
}

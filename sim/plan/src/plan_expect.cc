// The top-level `expect:` section: what the plan's author says a simulation of it shows, for
// tests to check against report.json (tests/cli/examples_test.sh; docs/PLAN.md). The loader
// checks its keys and values so a misspelt expectation fails loudly, and keeps nothing: a
// simulation never reads it.
//
//   expect: {outcome: hangs, cause: mismatch}
//   expect: {outcome: out_of_memory, oom_ranks: [3]}
#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "plan_parser.h"

namespace shardscope::sim::plan_internal {

Status PlanParser::ReadExpect(const Entry& entry, int32_t world_size) const {
  SHARDSCOPE_ASSIGN_OR_RETURN(Fields fields, ReadMapping(entry.value, MarkOf(entry), "expect", kExpectKeys));
  const auto one_of = [&](const Entry& e, std::string_view path, KeyList names) -> Status {
    if (e.value.IsScalar() && std::find(names.begin(), names.end(), e.value.Scalar()) != names.end()) {
      return Status::Ok();
    }
    std::string list;
    for (std::string_view name : names) list += fmt::format("{}{}", list.empty() ? "" : ", ", name);
    return Error(e, path, fmt::format("one of {}", list));
  };
  SHARDSCOPE_RETURN_IF_ERROR(Require(fields, "expect", "outcome", "the outcome the simulation shows"));
  const Entry& outcome = *fields.Find("outcome");
  SHARDSCOPE_RETURN_IF_ERROR(one_of(outcome, "expect.outcome", kExpectOutcomes));
  if (const Entry* e = fields.Find("cause")) {
    if (outcome.value.Scalar() != "hangs") {
      return KeyError(*e, "expect.cause", "cause only with outcome hangs (the hang report's root cause)",
                      fmt::format("outcome {}", outcome.value.Scalar()));
    }
    SHARDSCOPE_RETURN_IF_ERROR(one_of(*e, "expect.cause", kExpectCauses));
  }
  if (const Entry* e = fields.Find("oom_ranks")) {
    if (!e->value.IsSequence() || e->value.size() == 0) return Error(*e, "expect.oom_ranks", "a list of ranks");
    for (size_t i = 0; i < e->value.size(); ++i) {
      const Entry rank{fmt::format("{}", i), e->key_node, e->value[i]};
      int64_t value = 0;
      SHARDSCOPE_RETURN_IF_ERROR(ReadInt(rank, fmt::format("expect.oom_ranks[{}]", i), 0, world_size - 1, &value));
    }
  }
  return Status::Ok();
}

}  // namespace shardscope::sim::plan_internal

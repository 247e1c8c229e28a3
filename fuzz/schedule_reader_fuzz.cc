// Fuzzes ParseScheduleJson (SAX parsing, name resolution, ResolveBindings, validation):
// any input must give a Schedule or an InvalidInput status, never a crash, hang or
// unbounded allocation. Accepted schedules must also survive a write/read round trip.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "shardscope/traces/schedule_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardscope::traces;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  shardscope::StatusOr<Schedule> schedule = ParseScheduleJson(text, "fuzz");
  if (!schedule.ok()) {
    if (schedule.status().code() != shardscope::StatusCode::kInvalidInput) std::abort();
    return 0;
  }
  // What the reader accepts, the writer must reproduce exactly.
  shardscope::StatusOr<Schedule> again = ParseScheduleJson(ScheduleToJson(*schedule), "fuzz-again");
  if (!again.ok() || !(*again == *schedule)) std::abort();
  return 0;
}

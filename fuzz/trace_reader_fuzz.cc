// Fuzzes ParseChromeTrace (streaming SAX reader): any input must give a Timeline or an
// InvalidInput status, never a crash, hang or unbounded allocation.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "shardscope/traces/chrome_trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardscope::traces;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  shardscope::StatusOr<Timeline> timeline = ParseChromeTrace(text, "fuzz");
  if (!timeline.ok() && timeline.status().code() != shardscope::StatusCode::kInvalidInput) {
    std::abort();
  }
  return 0;
}

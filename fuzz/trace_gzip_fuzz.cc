// Fuzzes the gzip path of the trace reader (ParseChromeTraceBytes: GzipInputBuffer feeding
// the streaming SAX reader). The first byte picks what the rest is:
//   even: a gzip stream after its two magic bytes (header, deflate data and trailer mutate);
//   odd:  trace text, gzip-compressed here, so JSON mutations reach the reader through zlib.
// Any input must give a Timeline or an InvalidInput status, never a crash, hang or unbounded
// allocation (decompression stops at a 1 MiB limit here).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>

#include "shardscope/base/gzip_stream.h"
#include "shardscope/traces/chrome_trace.h"

namespace {

constexpr int64_t kFuzzDecompressedLimit = int64_t{1} << 20;

// Fast rather than small: the fuzzer compresses every odd input.
std::string Gzip(std::string_view text) {
  shardscope::StatusOr<std::string> gz = shardscope::traces::trace_internal::GzipCompress(text, Z_BEST_SPEED);
  if (!gz.ok()) std::abort();
  return std::move(gz).value();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardscope::traces;
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::string bytes = (data[0] & 1) == 0 ? std::string("\x1f\x8b", 2) + std::string(rest) : Gzip(rest);
  shardscope::StatusOr<Timeline> timeline = ParseChromeTraceBytes(bytes, "fuzz", kFuzzDecompressedLimit);
  if (!timeline.ok() && timeline.status().code() != shardscope::StatusCode::kInvalidInput) std::abort();
  return 0;
}

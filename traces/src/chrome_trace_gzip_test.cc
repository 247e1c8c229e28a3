// The gzip path of the Chrome-trace reader (ParseChromeTraceBytes over GzipInputBuffer):
// errors in the decompressed text name the source and the position in that text.
#include <zlib.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "shardscope/traces/chrome_trace.h"

namespace shardscope::traces {
namespace {

using ::testing::HasSubstr;

std::string Gzip(const std::string& text) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, Z_BEST_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, static_cast<uLong>(text.size())) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = static_cast<uInt>(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

TEST(GzipStreamTest, ParsedTraceErrorsNameTheSource) {
  const StatusOr<Timeline> ok = ParseChromeTraceBytes(Gzip(R"({"traceEvents": [
    {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1.5, "dur": 2}]})"),
                                                      "t.json.gz");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  ASSERT_EQ(ok->slices.size(), 1u);
  EXPECT_EQ(ok->slices[0].ts_ns, 1500);
  const StatusOr<Timeline> syntax = ParseChromeTraceBytes(Gzip("{\"traceEvents\": [\n  {,}]}"), "bad.json.gz");
  ASSERT_FALSE(syntax.ok());
  EXPECT_EQ(syntax.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(syntax.status().message(), HasSubstr("bad.json.gz:2:"));
  EXPECT_THAT(syntax.status().message(), HasSubstr("of the decompressed text"));
}

}  // namespace
}  // namespace shardscope::traces

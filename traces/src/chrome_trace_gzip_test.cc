// The gzip path of the Chrome-trace reader (ParseChromeTraceBytes over GzipInputBuffer):
// errors in the decompressed text name the source and the position in that text.
#include "shardscope/base/gzip_stream.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "shardscope/traces/chrome_trace.h"

namespace shardscope::traces {
namespace {

using ::testing::HasSubstr;

// `text` as a gzip file (`gzip -9`).
std::string Gzip(const std::string& text) { return trace_internal::GzipCompress(text).value(); }

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

// Tests of GzipInputBuffer (gzip_stream.h): data compressed here with zlib's gzip wrapper
// must come back byte for byte; bad data must stop with an error, never loop or grow.
#include "shardscope/base/gzip_stream.h"

#include <zlib.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>
#include <string>

namespace shardscope::traces::trace_internal {
namespace {

using ::testing::HasSubstr;

// The trace readers' limit (kMaxDecompressedTraceBytes in shardscope/traces/chrome_trace.h,
// 64 GiB); base/ does not see traces/, and any limit far above the test data will do.
constexpr int64_t kMaxDecompressedTraceBytes = int64_t{64} << 30;

// `text` as a gzip file (`gzip -9`).
std::string Gzip(const std::string& text) { return GzipCompress(text).value(); }

// Everything the buffer gives, and its error.
std::pair<std::string, std::optional<std::string>> Inflate(const std::string& compressed, int64_t limit) {
  std::istringstream in(compressed);
  GzipInputBuffer gzip(in, limit);
  std::ostringstream out;
  std::istream text(&gzip);
  out << text.rdbuf();
  return {out.str(), gzip.error()};
}

// A megabyte of varied text: more than one of the buffer's blocks, in and out.
std::string BigText() {
  std::string text;
  for (int i = 0; text.size() < (1u << 20); ++i) text += std::to_string(i * 7919 % 100003) + (i % 13 == 0 ? "\n" : ",");
  return text;
}

TEST(GzipStreamTest, MagicIsTheFirstTwoBytes) {
  EXPECT_TRUE(IsGzip(std::string("\x1f\x8b\x08", 3)));
  EXPECT_FALSE(IsGzip("{\"traceEvents\": []}"));
  EXPECT_FALSE(IsGzip(std::string("\x1f", 1)));
  EXPECT_FALSE(IsGzip(""));
}

TEST(GzipStreamTest, RoundTripsAcrossBlocks) {
  const std::string text = BigText();
  const auto [out, error] = Inflate(Gzip(text), kMaxDecompressedTraceBytes);
  EXPECT_FALSE(error.has_value()) << *error;
  EXPECT_EQ(out, text);
}

TEST(GzipStreamTest, ConcatenatedMembersReadAsOne) {
  const auto [out, error] = Inflate(Gzip("first half, ") + Gzip("second half"), kMaxDecompressedTraceBytes);
  EXPECT_FALSE(error.has_value());
  EXPECT_EQ(out, "first half, second half");
}

TEST(GzipStreamTest, StopsAtTheLimit) {
  const std::string text = BigText();
  const auto [out, error] = Inflate(Gzip(text), 1000);
  ASSERT_TRUE(error.has_value());
  EXPECT_THAT(*error, HasSubstr("decompresses to more than 1000 bytes"));
  EXPECT_LT(out.size(), text.size());
}

TEST(GzipStreamTest, TruncatedAndCorruptDataAreErrors) {
  const std::string whole = Gzip(BigText());
  const auto truncated = Inflate(whole.substr(0, whole.size() - 100), kMaxDecompressedTraceBytes);
  ASSERT_TRUE(truncated.second.has_value());
  EXPECT_THAT(*truncated.second, HasSubstr("truncated gzip data"));
  // The trailer's CRC-32 no longer matches (RFC 1952, section 2.3.1).
  std::string bad_crc = whole;
  bad_crc[bad_crc.size() - 6] = static_cast<char>(bad_crc[bad_crc.size() - 6] ^ 0x01);
  const auto crc = Inflate(bad_crc, kMaxDecompressedTraceBytes);
  ASSERT_TRUE(crc.second.has_value());
  EXPECT_THAT(*crc.second, HasSubstr("corrupt gzip data"));
  // Garbage after a complete member.
  const auto trailing = Inflate(Gzip("{}") + "garbage", kMaxDecompressedTraceBytes);
  ASSERT_TRUE(trailing.second.has_value());
  EXPECT_THAT(*trailing.second, HasSubstr("corrupt gzip data"));
}

}  // namespace
}  // namespace shardscope::traces::trace_internal

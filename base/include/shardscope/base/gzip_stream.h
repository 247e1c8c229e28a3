// Streaming gzip decompression (RFC 1952) for the trace readers: PyTorch's profiler writes
// `*.pt.trace.json.gz` (tensorboard_trace_handler(use_gzip=True)) and HTA's and Kineto's
// sample traces are gzip files. A GzipInputBuffer is a std::streambuf that inflates a
// compressed std::istream a block at a time, so a trace is parsed as it decompresses and
// never held whole in memory. It stops with an error, instead of growing without bound, when
// the data decompresses to more than a limit (a "zip bomb" or a file far larger than any
// trace), and on corrupt or truncated data; the caller checks error() after reading.
//
//   std::ifstream file(path, std::ios::binary);
//   GzipInputBuffer gzip(file, kMaxDecompressedTraceBytes);  // chrome_trace.h
//   std::istream in(&gzip);
//   ... read `in` to its end ...
//   if (gzip.error()) -> "corrupt gzip data: <what zlib said>"
//
// Concatenated members (what `cat a.gz b.gz` makes, and gzip -d accepts) are read one after
// another. Kept in the namespace of the trace readers that use it (traces::trace_internal):
// base/ moved folders, not names (base/README.md).
#ifndef SHARDSCOPE_BASE_GZIP_STREAM_H_
#define SHARDSCOPE_BASE_GZIP_STREAM_H_

#include <zlib.h>

#include <cstdint>
#include <istream>
#include <optional>
#include <streambuf>
#include <string>
#include <string_view>
#include <vector>

#include "shardscope/base/status.h"

namespace shardscope::traces::trace_internal {

// True when `head` starts with the gzip member header's magic (RFC 1952, section 2.3.1:
// ID1 = 0x1f, ID2 = 0x8b). Detection is by content, never by file name.
bool IsGzip(std::string_view head);

// One gzip member holding `text` (zlib's deflate with the gzip wrapper, at zlib's `level`:
// Z_BEST_COMPRESSION is what `gzip -9` writes). zlib fails here only when it cannot allocate.
StatusOr<std::string> GzipCompress(std::string_view text, int level = Z_BEST_COMPRESSION);

class GzipInputBuffer final : public std::streambuf {
 public:
  // `compressed` must outlive the buffer. `max_output_bytes` bounds the decompressed size.
  GzipInputBuffer(std::istream& compressed, int64_t max_output_bytes);
  ~GzipInputBuffer() override;  // releases zlib's state; never throws

  GzipInputBuffer(const GzipInputBuffer&) = delete;
  GzipInputBuffer& operator=(const GzipInputBuffer&) = delete;

  // Why decompression stopped before the end of the data (corrupt, truncated, over the
  // limit, unreadable); nullopt while it has not.
  const std::optional<std::string>& error() const { return error_; }
  int64_t output_bytes() const { return output_bytes_; }

 protected:
  int_type underflow() override;

 private:
  std::istream& in_;
  const int64_t max_output_bytes_;
  z_stream stream_{};
  bool initialized_ = false;
  bool finished_ = false;
  bool at_member_end_ = false;  // the last inflate() ended a member and no byte followed yet
  std::vector<char> in_block_;
  std::vector<char> out_block_;
  int64_t output_bytes_ = 0;
  std::optional<std::string> error_;
};

}  // namespace shardscope::traces::trace_internal

#endif  // SHARDSCOPE_BASE_GZIP_STREAM_H_

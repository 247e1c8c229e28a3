// GzipInputBuffer: zlib's inflate() in gzip mode, a block at a time (see gzip_stream.h).
#include "shardscope/base/gzip_stream.h"

#include <fmt/format.h>

namespace shardscope::traces::trace_internal {
namespace {

// gzip member header magic (RFC 1952, section 2.3.1).
constexpr unsigned char kGzipId1 = 0x1f;
constexpr unsigned char kGzipId2 = 0x8b;
// zlib's windowBits: 15 (the largest window, what gzip writes) + 16 selects the gzip
// wrapper only (zlib.h, inflateInit2).
constexpr int kGzipWindowBits = 15 + 16;
constexpr size_t kBlockBytes = size_t{1} << 18;

}  // namespace

bool IsGzip(std::string_view head) {
  return head.size() >= 2 && static_cast<unsigned char>(head[0]) == kGzipId1 &&
         static_cast<unsigned char>(head[1]) == kGzipId2;
}

GzipInputBuffer::GzipInputBuffer(std::istream& compressed, int64_t max_output_bytes)
    : in_(compressed), max_output_bytes_(max_output_bytes), in_block_(kBlockBytes), out_block_(kBlockBytes) {
  if (inflateInit2(&stream_, kGzipWindowBits) != Z_OK) {
    error_ = "zlib could not start (out of memory)";
    finished_ = true;
    return;
  }
  initialized_ = true;
}

GzipInputBuffer::~GzipInputBuffer() {
  if (initialized_) inflateEnd(&stream_);
}

GzipInputBuffer::int_type GzipInputBuffer::underflow() {
  if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
  while (!finished_) {
    if (stream_.avail_in == 0) {
      in_.read(in_block_.data(), static_cast<std::streamsize>(in_block_.size()));
      const auto got = static_cast<size_t>(in_.gcount());
      if (got == 0) {
        finished_ = true;
        if (in_.bad()) {
          error_ = "read error";
        } else if (!at_member_end_) {
          error_ = fmt::format("truncated gzip data (the file ends inside a compressed member, after {} "
                               "decompressed bytes)",
                               output_bytes_);
        }
        break;
      }
      stream_.next_in = reinterpret_cast<Bytef*>(in_block_.data());
      stream_.avail_in = static_cast<uInt>(got);
    }
    if (at_member_end_) {
      // Another member follows (concatenated gzip files).
      at_member_end_ = false;
      if (inflateReset(&stream_) != Z_OK) {
        error_ = "zlib could not restart for the next member";
        finished_ = true;
        break;
      }
    }
    stream_.next_out = reinterpret_cast<Bytef*>(out_block_.data());
    stream_.avail_out = static_cast<uInt>(out_block_.size());
    const int rc = inflate(&stream_, Z_NO_FLUSH);
    const auto produced = static_cast<int64_t>(out_block_.size() - stream_.avail_out);
    if (rc == Z_STREAM_END) {
      at_member_end_ = true;
    } else if (rc == Z_BUF_ERROR && stream_.avail_in == 0) {
      // Needs more input: read the next block.
    } else if (rc != Z_OK) {
      error_ = fmt::format("corrupt gzip data after {} decompressed bytes: {}", output_bytes_ + produced,
                           stream_.msg != nullptr ? stream_.msg : fmt::format("zlib error {}", rc));
      finished_ = true;
      break;
    }
    output_bytes_ += produced;
    if (output_bytes_ > max_output_bytes_) {
      error_ = fmt::format("decompresses to more than {} bytes (the limit for a trace); refusing to go on",
                           max_output_bytes_);
      finished_ = true;
      break;
    }
    if (produced > 0) {
      setg(out_block_.data(), out_block_.data(), out_block_.data() + produced);
      return traits_type::to_int_type(*gptr());
    }
  }
  return traits_type::eof();
}

StatusOr<std::string> GzipCompress(std::string_view text, int level) {
  z_stream z{};
  // windowBits 15 + 16: the gzip wrapper (zlib.h, deflateInit2).
  if (deflateInit2(&z, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    return Status::Internal("gzip: deflateInit2 failed");
  }
  std::string out(deflateBound(&z, static_cast<uLong>(text.size())) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = static_cast<uInt>(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  if (rc != Z_STREAM_END) return Status::Internal(fmt::format("gzip: deflate returned {}", rc));
  return out;
}

}  // namespace shardscope::traces::trace_internal

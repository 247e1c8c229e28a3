// PYTORCH_CUDA_ALLOC_CONF parsing: AllocatorConfig::Parse (see caching_allocator.h),
// re-expressed from c10/core/AllocatorConfig.cpp (parseArgs and its helpers); the comment
// beside each rule names the function it comes from. No PyTorch code is copied.
#include <charconv>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "caching_allocator_internal.h"

namespace shardscope::sim {
namespace {

using allocator_internal::kLargeBuffer;
using allocator_internal::kMaxRegisterThreads;
using allocator_internal::kRoundUpPowerOfTwoIntervals;
using allocator_internal::kUnlimited;

// Tokens: keys and values, and each of , : [ ] on its own; whitespace dropped
// (ConfigTokenizer / lexArgs).
std::vector<std::string> Tokenize(std::string_view conf) {
  std::vector<std::string> tokens;
  std::string buffer;
  for (char ch : conf) {
    if (ch == ',' || ch == ':' || ch == '[' || ch == ']') {
      if (!buffer.empty()) tokens.push_back(std::move(buffer));
      buffer.clear();
      tokens.emplace_back(1, ch);
    } else if (ch != ' ' && ch != '\t' && ch != '\n' && ch != '\r') {
      buffer += ch;
    }
  }
  if (!buffer.empty()) tokens.push_back(std::move(buffer));
  return tokens;
}

Status ConfError(std::string_view key, std::string_view what) {
  return Status::InvalidInput(fmt::format("PYTORCH_CUDA_ALLOC_CONF: {}: {}", key, what));
}

class ConfParser {
 public:
  explicit ConfParser(std::vector<std::string> tokens) : tokens_(std::move(tokens)) {}

  bool AtEnd() const { return i_ >= tokens_.size(); }
  const std::string& Current() const { return tokens_[i_]; }
  void Advance() { ++i_; }

  // Expects `token` next (consumeToken).
  Status Expect(std::string_view key, std::string_view token) {
    if (AtEnd() || tokens_[i_] != token) {
      return ConfError(key, fmt::format("expected '{}', got {}", token, Describe()));
    }
    ++i_;
    return Status::Ok();
  }

  // The value token after "key:".
  StatusOr<std::string> Value(std::string_view key, std::string_view expected) {
    SHARDSCOPE_RETURN_IF_ERROR(Expect(key, ":"));
    if (AtEnd() || IsPunctuation(tokens_[i_])) {
      return ConfError(key, fmt::format("expected {}, got {}", expected, Describe()));
    }
    return tokens_[i_++];
  }

  std::string Describe() const {
    return AtEnd() ? std::string("the end of the string") : fmt::format("'{}'", tokens_[i_]);
  }

  static bool IsPunctuation(const std::string& t) {
    return t == "," || t == ":" || t == "[" || t == "]";
  }

 private:
  std::vector<std::string> tokens_;
  size_t i_ = 0;
};

StatusOr<int64_t> ParseInteger(std::string_view key, const std::string& text,
                               std::string_view expected) {
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0) {
    return ConfError(key, fmt::format("expected {}, got '{}'", expected, text));
  }
  return value;
}

StatusOr<bool> ParseBool(std::string_view key, const std::string& text) {
  if (text == "True") return true;
  if (text == "False") return false;
  return ConfError(key, fmt::format("expected True or False, got '{}'", text));
}

// max_split_size_mb / max_non_split_rounding_mb: whole MiB, at least kLargeBuffer / 1 MiB
// (parseMaxSplitSize, parseMaxNonSplitRoundingSize), clamped so the bytes fit.
StatusOr<int64_t> ParseMiBAtLeastLargeBuffer(ConfParser& parser, std::string_view key) {
  constexpr std::string_view kExpected = "an integer number of MiB >= 20";
  SHARDSCOPE_ASSIGN_OR_RETURN(std::string text, parser.Value(key, kExpected));
  SHARDSCOPE_ASSIGN_OR_RETURN(int64_t mib, ParseInteger(key, text, kExpected));
  if (mib < kLargeBuffer / kMiB) {
    return ConfError(key, fmt::format("too small: must be >= {} (MiB), got {}",
                                      kLargeBuffer / kMiB, mib));
  }
  mib = std::min(mib, (kUnlimited - 1) / kMiB);
  return mib * kMiB;
}

bool IsPowerOfTwo(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// roundup_power2_divisions: a single power of two for every interval, or a list
// "[64:8,256:4,>:1]" of <interval in MiB (a power of two)>:<divisions (0 or a power of
// two)> (parseRoundUpPower2Divisions). The first entry also fills every lower interval; ">"
// fills from the last named interval (inclusive: PyTorch overwrites it) to the end.
Status ParseRoundupDivisions(ConfParser& parser, std::vector<int64_t>& divisions) {
  constexpr std::string_view kKey = "roundup_power2_divisions";
  divisions.assign(kRoundUpPowerOfTwoIntervals, 0);
  SHARDSCOPE_RETURN_IF_ERROR(parser.Expect(kKey, ":"));
  if (parser.AtEnd()) {
    return ConfError(kKey, "expected a power of two or a list [<MiB>:<divisions>,...], got "
                           "the end of the string");
  }
  if (parser.Current() != "[") {
    const std::string text = parser.Current();
    SHARDSCOPE_ASSIGN_OR_RETURN(int64_t value,
                                ParseInteger(kKey, text, "a power of two (divisions)"));
    if (!IsPowerOfTwo(value)) {
      return ConfError(kKey, fmt::format("divisions must be a power of two, got {}", value));
    }
    divisions.assign(kRoundUpPowerOfTwoIntervals, value);
    parser.Advance();
    return Status::Ok();
  }
  parser.Advance();  // '['
  bool first_value = true;
  size_t last_index = 0;
  while (!parser.AtEnd() && parser.Current() != "]") {
    const std::string interval = parser.Current();
    parser.Advance();
    SHARDSCOPE_ASSIGN_OR_RETURN(std::string text,
                                parser.Value(kKey, "a number of divisions"));
    SHARDSCOPE_ASSIGN_OR_RETURN(int64_t value,
                                ParseInteger(kKey, text, "a number of divisions"));
    if (value != 0 && !IsPowerOfTwo(value)) {
      return ConfError(kKey, fmt::format("divisions for '{}' must be 0 or a power of two, "
                                         "got {}", interval, value));
    }
    if (interval == ">") {
      std::fill(divisions.begin() + static_cast<std::ptrdiff_t>(last_index),
                divisions.end(), value);
    } else {
      SHARDSCOPE_ASSIGN_OR_RETURN(
          int64_t mib, ParseInteger(kKey, interval, "an interval in MiB (a power of two) or '>'"));
      if (!IsPowerOfTwo(mib)) {
        return ConfError(kKey, fmt::format("interval must be a power of two (MiB), got {}",
                                           mib));
      }
      size_t index = static_cast<size_t>(std::bit_width(static_cast<uint64_t>(mib)) - 1);
      index = std::min(index, static_cast<size_t>(kRoundUpPowerOfTwoIntervals - 1));
      if (first_value) {
        std::fill(divisions.begin(), divisions.begin() + static_cast<std::ptrdiff_t>(index),
                  value);
        first_value = false;
      }
      divisions[index] = value;
      last_index = index;
    }
    if (!parser.AtEnd() && parser.Current() == ",") {
      parser.Advance();
    } else if (parser.AtEnd() || parser.Current() != "]") {
      return ConfError(kKey, fmt::format("expected ',' or ']', got {}", parser.Describe()));
    }
  }
  if (parser.AtEnd()) return ConfError(kKey, "expected ']', got the end of the string");
  parser.Advance();  // ']'
  return Status::Ok();
}

}  // namespace

StatusOr<AllocatorConfig> AllocatorConfig::Parse(std::string_view conf) {
  AllocatorConfig config;
  ConfParser parser(Tokenize(conf));
  while (!parser.AtEnd()) {
    const std::string key = parser.Current();
    parser.Advance();
    if (key == "max_split_size_mb") {
      SHARDSCOPE_ASSIGN_OR_RETURN(config.max_split_size, ParseMiBAtLeastLargeBuffer(parser, key));
    } else if (key == "max_non_split_rounding_mb") {
      SHARDSCOPE_ASSIGN_OR_RETURN(config.max_non_split_rounding,
                                  ParseMiBAtLeastLargeBuffer(parser, key));
    } else if (key == "garbage_collection_threshold") {
      // parseGarbageCollectionThreshold: a fraction strictly inside (0, 1).
      constexpr std::string_view kExpected = "a number in (0.0, 1.0)";
      SHARDSCOPE_ASSIGN_OR_RETURN(std::string text, parser.Value(key, kExpected));
      double value = 0;
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (ec != std::errc() || end != text.data() + text.size() || !(value > 0.0) ||
          !(value < 1.0)) {
        return ConfError(key, fmt::format("expected {}, got '{}'", kExpected, text));
      }
      config.garbage_collection_threshold = value;
    } else if (key == "roundup_power2_divisions") {
      SHARDSCOPE_RETURN_IF_ERROR(ParseRoundupDivisions(parser, config.roundup_power2_divisions));
    } else if (key == "expandable_segments") {
      SHARDSCOPE_ASSIGN_OR_RETURN(std::string text, parser.Value(key, "True or False"));
      SHARDSCOPE_ASSIGN_OR_RETURN(config.expandable_segments, ParseBool(key, text));
    } else if (key == "backend") {
      // parseAllocatorConfig: "native" or "cudaMallocAsync"; only the native policy is
      // modelled here.
      SHARDSCOPE_ASSIGN_OR_RETURN(std::string text, parser.Value(key, "native"));
      if (text != "native") {
        return ConfError(key, fmt::format("expected native (cudaMallocAsync is not "
                                          "modelled), got '{}'", text));
      }
    } else if (key == "release_lock_on_cudamalloc" || key == "pinned_use_cuda_host_register" ||
               key == "pinned_use_background_threads") {
      // Threading and host-allocator switches: no effect on device memory.
      SHARDSCOPE_ASSIGN_OR_RETURN(std::string text, parser.Value(key, "True or False"));
      SHARDSCOPE_ASSIGN_OR_RETURN(bool ignored, ParseBool(key, text));
      (void)ignored;
    } else if (key == "pinned_num_register_threads") {
      constexpr std::string_view kExpected = "a power of two <= 128";
      SHARDSCOPE_ASSIGN_OR_RETURN(std::string text, parser.Value(key, kExpected));
      SHARDSCOPE_ASSIGN_OR_RETURN(int64_t threads, ParseInteger(key, text, kExpected));
      if (!IsPowerOfTwo(threads) || threads > kMaxRegisterThreads) {
        return ConfError(key, fmt::format("expected {}, got {}", kExpected, threads));
      }
    } else {
      return ConfError(key, "unrecognized option (expected one of max_split_size_mb, "
                            "max_non_split_rounding_mb, garbage_collection_threshold, "
                            "roundup_power2_divisions, expandable_segments, backend, "
                            "release_lock_on_cudamalloc, pinned_use_cuda_host_register, "
                            "pinned_num_register_threads, pinned_use_background_threads)");
    }
    // Entries are separated by ',' (a trailing one is accepted, as in parseArgs).
    if (!parser.AtEnd()) SHARDSCOPE_RETURN_IF_ERROR(parser.Expect(key, ","));
  }
  return config;
}

}  // namespace shardscope::sim

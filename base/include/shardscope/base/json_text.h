// Text helpers every JSON reader of the project shares (schedule, Chrome trace, Flight
// Recorder, allocation traces, framework config files): where a byte offset is, how deep a
// text nests before a recursive parser sees it, and a key list for "expected one of" messages.
#ifndef SHARDSCOPE_BASE_JSON_TEXT_H_
#define SHARDSCOPE_BASE_JSON_TEXT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace shardscope::traces {

struct TextPosition {
  int64_t line = 1;    // 1-based
  int64_t column = 1;  // 1-based, in bytes
};

// The position of the byte at `offset` of `text` (clamped to its end).
TextPosition PositionOf(std::string_view text, size_t offset);
// The same as "line:column".
std::string LineColumn(std::string_view text, size_t offset);

// The deepest nesting of [ and { outside strings; stops counting once past `limit`, so a
// caller can refuse hostile depth before nlohmann or yaml-cpp recurse into it.
int JsonNestingDepth(std::string_view text, int limit);

// "a, b, c".
std::string JoinKeys(const std::vector<std::string_view>& keys);

}  // namespace shardscope::traces

#endif  // SHARDSCOPE_BASE_JSON_TEXT_H_

#include "shardscope/base/json_text.h"

#include <algorithm>

#include <fmt/format.h>

namespace shardscope::traces {

TextPosition PositionOf(std::string_view text, size_t offset) {
  offset = std::min(offset, text.size());
  const std::string_view before = text.substr(0, offset);
  TextPosition p;
  p.line = 1 + static_cast<int64_t>(std::count(before.begin(), before.end(), '\n'));
  const size_t line_start = before.rfind('\n');
  p.column = static_cast<int64_t>(offset - (line_start == std::string_view::npos ? 0 : line_start + 1)) + 1;
  return p;
}

std::string LineColumn(std::string_view text, size_t offset) {
  const TextPosition p = PositionOf(text, offset);
  return fmt::format("{}:{}", p.line, p.column);
}

int JsonNestingDepth(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size() && deepest <= limit; ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

std::string JoinKeys(const std::vector<std::string_view>& keys) {
  std::string out;
  for (std::string_view key : keys) {
    if (!out.empty()) out += ", ";
    out += key;
  }
  return out;
}

}  // namespace shardscope::traces

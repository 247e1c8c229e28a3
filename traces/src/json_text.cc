#include "json_text.h"

#include <algorithm>

#include <fmt/format.h>

namespace shardscope::traces {

std::string LineColumn(std::string_view text, size_t offset) {
  offset = std::min(offset, text.size());
  const std::string_view before = text.substr(0, offset);
  const size_t line = 1 + static_cast<size_t>(std::count(before.begin(), before.end(), '\n'));
  const size_t line_start = before.rfind('\n');
  const size_t column = offset - (line_start == std::string_view::npos ? 0 : line_start + 1) + 1;
  return fmt::format("{}:{}", line, column);
}

std::string JsonErrorText(const nlohmann::detail::exception& error) {
  std::string_view what = error.what();
  if (const size_t bracket = what.find("] "); bracket != std::string_view::npos) {
    what.remove_prefix(bracket + 2);
  }
  if (what.starts_with("parse error")) {
    if (const size_t colon = what.find(": "); colon != std::string_view::npos) {
      what.remove_prefix(colon + 2);
    }
  }
  return std::string(what);
}

}  // namespace shardscope::traces

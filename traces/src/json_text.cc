#include "json_text.h"

namespace shardscope::traces {

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

// Helpers shared by the JSON readers (schedule_json.cc, chrome_trace_reader.cc): where an
// error is, and what nlohmann's message says without its own prefix. Private to traces/.
#ifndef SHARDSCOPE_TRACES_JSON_TEXT_H_
#define SHARDSCOPE_TRACES_JSON_TEXT_H_

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace shardscope::traces {

// The byte at `offset` of `text` as "line:column", both 1-based.
std::string LineColumn(std::string_view text, size_t offset);

// The part of nlohmann's message worth showing: without "[json.exception...]" and its own
// position (callers print theirs from the byte offset).
std::string JsonErrorText(const nlohmann::detail::exception& error);

}  // namespace shardscope::traces

#endif  // SHARDSCOPE_TRACES_JSON_TEXT_H_

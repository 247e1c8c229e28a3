// nlohmann's error text for the JSON readers of traces/ (schedule_json.cc,
// chrome_trace_reader.cc, flight_recorder.cc); the shared position helpers are public
// (shardscope/base/json_text.h). Private to traces/.
#ifndef SHARDSCOPE_TRACES_SRC_JSON_TEXT_H_
#define SHARDSCOPE_TRACES_SRC_JSON_TEXT_H_

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "shardscope/base/json_text.h"

namespace shardscope::traces {

// The part of nlohmann's message worth showing: without "[json.exception...]" and its own
// position (callers print theirs from the byte offset).
std::string JsonErrorText(const nlohmann::detail::exception& error);

}  // namespace shardscope::traces

#endif  // SHARDSCOPE_TRACES_SRC_JSON_TEXT_H_

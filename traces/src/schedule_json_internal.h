// Private to traces/: what the reader of the JSON form of a Schedule shares between its
// two files (schema in schedule_json.h). Reading happens in three steps:
//  1. ScheduleSax (nlohmann SAX, schedule_json_sax.cc) builds a DOM of the document except
//     the elements of /programs/<p>/ops: each op is built alone, converted into a PendingOp
//     (types, keys and enums checked; references still names) and dropped. Ops are the bulk
//     of a schedule, so memory stays close to the size of the result.
//  2. ScheduleReader (declared here, its parsers in schedule_json_reader.cc) walks the small
//     DOM, builds the name tables, and resolves the PendingOps' names into indices.
//     Resolution waits for the whole program because JSON objects are unordered: "ops" may
//     come before "streams".
//  3. ResolveBindings() and ValidateSchedule().
// The writer (schedule_json_writer.cc) shares nothing with them.
#ifndef SHARDSCOPE_TRACES_SRC_SCHEDULE_JSON_INTERNAL_H_
#define SHARDSCOPE_TRACES_SRC_SCHEDULE_JSON_INTERNAL_H_

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "json_text.h"
#include "shardscope/base/status.h"
#include "shardscope/traces/schedule.h"

namespace shardscope::traces::schedule_json_internal {

using Json = nlohmann::json;

// Real schedules nest six levels deep; the cap bounds the parser's stack on hostile input.
inline constexpr size_t kMaxDepth = 64;
inline constexpr size_t kMaxQuotedChars = 64;
inline constexpr int64_t kInt32Min = std::numeric_limits<int32_t>::min();
inline constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
inline constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
inline constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// The JSON "op" names, in OpPayload order, taken from OpKindName so there is one source.
const std::array<std::string_view, std::variant_size_v<OpPayload>>& OpKindNames();

// A string for an error message, JSON-quoted and cut after kMaxQuotedChars characters.
inline std::string Quote(std::string_view s) {
  const bool cut = s.size() > kMaxQuotedChars;
  std::string quoted = Json(std::string(s.substr(0, kMaxQuotedChars)))
                           .dump(-1, ' ', false, Json::error_handler_t::replace);
  if (cut) quoted.insert(quoted.size() - 1, "...");
  return quoted;
}

inline std::string Describe(const Json& value) {
  switch (value.type()) {
    case Json::value_t::object:
      return "an object";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::string:
      return Quote(value.get_ref<const std::string&>());
    default:
      return value.dump();
  }
}

// JSON Pointer segment (RFC 6901): "~" -> "~0", "/" -> "~1".
inline std::string PointerSegment(std::string_view key) {
  std::string out;
  for (char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

// A JSON path: `base`, or `base` + "/" + `key`, turned into a string only on errors.
struct PathRef {
  PathRef(const std::string& base_path, std::string_view child = {})  // NOLINT: implicit
      : base(base_path), key(child) {}
  std::string str() const { return key.empty() ? base : base + "/" + PointerSegment(key); }
  const std::string& base;
  std::string_view key;
};

// An op whose references are still names.
struct PendingOp {
  Op op;
  std::string stream;  // for ops that have a stream
  std::string ref;     // event, tensor or comm slot name, by kind
  std::optional<std::string> name, module;
};

// ---------------------------------------------------------------------------------------
// Step 2: typed access to the DOM with errors that name source, path and op id.

class ScheduleReader {
 public:
  explicit ScheduleReader(const std::string& source) : source_(source) {}

  Status Fail(const std::string& path, std::string_view message) const {
    return Status::InvalidInput(fmt::format("{}: {}{}: {}", source_, path.empty() ? "/" : path,
                                            op_id_ ? fmt::format(" (op id {})", *op_id_) : "",
                                            message));
  }

  StatusOr<PendingOp> ParseOp(const Json& json, const std::string& path);
  StatusOr<Schedule> ParseDocument(const Json& root, std::vector<std::vector<PendingOp>>& pending);

 private:
  const Json* Find(const Json& object, std::string_view key) const {
    auto it = object.find(key);
    return it == object.end() ? nullptr : &*it;
  }

  Status CheckObject(const Json& value, const std::string& path) const {
    if (!value.is_object())
      return Fail(path, fmt::format("expected an object, got {}", Describe(value)));
    return Status::Ok();
  }
  Status CheckArray(const Json& value, const std::string& path) const {
    if (!value.is_array())
      return Fail(path, fmt::format("expected an array, got {}", Describe(value)));
    return Status::Ok();
  }

  Status CheckKeys(const Json& object, const std::string& path, std::string_view what,
                   const std::vector<std::string_view>& allowed) const {
    for (const auto& [key, value] : object.items()) {
      if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
        return Fail(path + "/" + PointerSegment(key),
                    fmt::format("unknown key {} in {} (expected: {})", Quote(key), what,
                                JoinKeys(allowed)));
      }
    }
    return Status::Ok();
  }

  StatusOr<const Json*> Require(const Json& object, const std::string& path,
                                std::string_view key) const {
    const Json* value = Find(object, key);
    if (value == nullptr) return Fail(path, fmt::format("missing required key \"{}\"", key));
    return value;
  }

  // Paths are only built when an error needs them: reading a big schedule checks millions
  // of fields.
  StatusOr<int64_t> Int(const Json& value, const PathRef& path, int64_t min = kInt64Min,
                        int64_t max = kInt64Max) const {
    const auto out_of_range = [&] {
      return Fail(path.str(), fmt::format("expected an integer in [{}, {}], got {}", min, max,
                                          Describe(value)));
    };
    if (value.is_number_unsigned()) {
      const auto number = value.get<uint64_t>();
      if (number > static_cast<uint64_t>(max)) return out_of_range();
      return static_cast<int64_t>(number);
    }
    if (value.is_number_integer()) {
      const auto number = value.get<int64_t>();
      if (number < min || number > max) return out_of_range();
      return number;
    }
    return Fail(path.str(), fmt::format("expected an integer, got {}", Describe(value)));
  }
  StatusOr<int64_t> IntField(const Json& object, const std::string& path, std::string_view key,
                             int64_t min = kInt64Min, int64_t max = kInt64Max) const {
    SHARDSCOPE_ASSIGN_OR_RETURN(const Json* value, Require(object, path, key));
    return Int(*value, PathRef{path, key}, min, max);
  }
  StatusOr<int64_t> IntFieldOr(const Json& object, const std::string& path, std::string_view key,
                               int64_t fallback, int64_t min = kInt64Min,
                               int64_t max = kInt64Max) const {
    const Json* value = Find(object, key);
    if (value == nullptr) return fallback;
    return Int(*value, PathRef{path, key}, min, max);
  }

  StatusOr<std::string> String(const Json& value, const PathRef& path) const {
    if (!value.is_string()) {
      return Fail(path.str(), fmt::format("expected a string, got {}", Describe(value)));
    }
    return value.get<std::string>();
  }
  StatusOr<std::string> StringField(const Json& object, const std::string& path,
                                    std::string_view key) const {
    SHARDSCOPE_ASSIGN_OR_RETURN(const Json* value, Require(object, path, key));
    return String(*value, PathRef{path, key});
  }
  // A declared name: non-empty, since it is what other parts refer to.
  StatusOr<std::string> Name(const Json& value, const PathRef& path) const {
    SHARDSCOPE_ASSIGN_OR_RETURN(std::string name, String(value, path));
    if (name.empty()) return Fail(path.str(), "expected a non-empty name");
    return name;
  }

  StatusOr<bool> BoolFieldOr(const Json& object, const std::string& path, std::string_view key,
                             bool fallback) const {
    const Json* value = Find(object, key);
    if (value == nullptr) return fallback;
    if (!value->is_boolean()) {
      return Fail(path + "/" + std::string(key),
                  fmt::format("expected true or false, got {}", Describe(*value)));
    }
    return value->get<bool>();
  }

  StatusOr<DType> DTypeFieldOr(const Json& object, const std::string& path) const {
    const Json* value = Find(object, "dtype");
    if (value == nullptr) return DType::kBFloat16;
    SHARDSCOPE_ASSIGN_OR_RETURN(std::string name, String(*value, PathRef{path, "dtype"}));
    std::optional<DType> dtype = ParseDType(name);
    if (!dtype) {
      return Fail(path + "/dtype", fmt::format("unknown dtype {} (expected fp32, tf32, bf16, fp16, "
                                               "fp8_e4m3, fp8_e5m2, int8, int32, int64 or fp64)",
                                               Quote(name)));
    }
    return *dtype;
  }

  // A list of unique declared names; fills `index` with name -> position.
  Status NameList(const Json* value, const std::string& path, std::string_view what,
                  std::vector<std::string>& names,
                  std::unordered_map<std::string, int32_t>& index) const {
    if (value == nullptr) return Status::Ok();
    SHARDSCOPE_RETURN_IF_ERROR(CheckArray(*value, path));
    for (size_t i = 0; i < value->size(); ++i) {
      const std::string element_path = fmt::format("{}/{}", path, i);
      SHARDSCOPE_ASSIGN_OR_RETURN(std::string name, Name((*value)[i], element_path));
      if (!index.emplace(name, static_cast<int32_t>(i)).second) {
        return Fail(element_path, fmt::format("{} {} declared twice", what, Quote(name)));
      }
      names.push_back(std::move(name));
    }
    return Status::Ok();
  }

  StatusOr<ComputeDesc> ParseCompute(const Json& op, const std::string& path) const;
  Status ParseCollective(const Json& op, const std::string& path, PendingOp& pending) const;
  Status ParseProgram(const Json& json, const std::string& path, std::vector<PendingOp>& pending,
                      Program& program);

  const std::string& source_;
  std::optional<int64_t> op_id_;  // set while an op is being read, for messages
};

}  // namespace shardscope::traces::schedule_json_internal

#endif  // SHARDSCOPE_TRACES_SRC_SCHEDULE_JSON_INTERNAL_H_

// Strict JSON for the config readers (plan_sources.h): a Hugging Face config.json and a
// DeepSpeed config are read through yaml-cpp, which knows the line and column of every key
// (JSON is YAML 1.2's flow syntax; nlohmann-json 3.11 reports no positions). What YAML accepts
// and JSON does not — a bare word, a second document, a root that is not an object, a key
// written twice — is refused, so a file the framework's json.load rejects is rejected here too.
// Private to sim/plan/.
#ifndef SHARDSCOPE_SIM_CONFIG_JSON_H_
#define SHARDSCOPE_SIM_CONFIG_JSON_H_

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "shardscope/base/json_text.h"
#include "shardscope/base/status.h"

namespace shardscope::sim {

// One "key": value member of a JSON object.
struct JsonMember {
  std::string key;
  std::string path;  // dotted from the root: "zero_optimization.stage"
  YAML::Node key_node;
  YAML::Node value;
};

// Reads one JSON file's values; every error names the file, line, column and key path. Holds
// the source name only. No yaml-cpp exception leaves it.
class JsonReader {
 public:
  explicit JsonReader(const std::string& source) : source_(source) {}

  // The root object of `text`.
  StatusOr<YAML::Node> Load(std::string_view text) const;
  // The members of the object `value` (its own path `path`, "" for the root), each key once.
  StatusOr<std::vector<JsonMember>> Members(const YAML::Node& value, const YAML::Mark& mark,
                                            std::string_view path) const;
  StatusOr<std::vector<JsonMember>> Members(const JsonMember& object) const {
    return Members(object.value, object.key_node.Mark(), object.path);
  }

  // "file:line:column" of a mark (1-based), and "file:line:column (path)" of a member: the
  // origin a PlanSetting carries.
  std::string Where(const YAML::Mark& mark) const;
  std::string Origin(const JsonMember& member) const;

  Status Error(const YAML::Mark& mark, std::string_view path, std::string_view expected,
               std::string_view got) const;
  // An error about a member's value, located at its key.
  Status Error(const JsonMember& member, std::string_view expected) const;
  // A key the reader does not know: lists the keys it accepts.
  Status UnknownKey(const JsonMember& member, std::string_view accepted) const;
  // A key the plan cannot model (named, with the reason).
  Status Unsupported(const JsonMember& member, std::string_view why) const;

  // Typed values. Integers accept an integral float (5e8) as DeepSpeed's pydantic int does.
  static bool IsAuto(const YAML::Node& value);  // the string "auto"
  static bool IsNull(const YAML::Node& value);
  StatusOr<bool> Bool(const JsonMember& member) const;
  StatusOr<int64_t> Int(const JsonMember& member, int64_t min, int64_t max) const;
  StatusOr<double> Number(const JsonMember& member, double min, double max) const;
  StatusOr<std::string> String(const JsonMember& member) const;
  // The value as JSON writes it, for messages: 'text', 12, true, null, an object, an array.
  static std::string Describe(const YAML::Node& value);

 private:
  const std::string& source_;
};

using traces::JoinKeys;  // "a, b, c" (shardscope/base/json_text.h)

}  // namespace shardscope::sim

#endif  // SHARDSCOPE_SIM_CONFIG_JSON_H_

// Strict JSON through yaml-cpp for the config readers, and reading the config files a plan
// names.
#include "config_json.h"

#include <fmt/format.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <system_error>

#include "plan_sources.h"

namespace shardscope::sim {
namespace {

bool IsJsonSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Whether `text` is one JSON object and nothing else after it: the braces of the first
// top-level value balance (outside strings) before the end, and only whitespace follows.
// yaml-cpp would read "{...} {...}" as two documents and return the first without a word.
bool OneObject(std::string_view text, size_t* end_offset) {
  size_t i = 0;
  while (i < text.size() && IsJsonSpace(text[i])) ++i;
  if (i == text.size() || text[i] != '{') {
    *end_offset = i;
    return false;
  }
  int64_t depth = 0;
  bool in_string = false;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') in_string = true;
    if (c == '{' || c == '[') ++depth;
    if (c == '}' || c == ']') --depth;
    if (depth == 0) break;
  }
  if (i >= text.size()) {
    *end_offset = text.size();
    return true;  // unbalanced: yaml-cpp names the syntax error
  }
  for (size_t j = i + 1; j < text.size(); ++j) {
    if (!IsJsonSpace(text[j])) {
      *end_offset = j;
      return false;
    }
  }
  return true;
}


bool IsQuoted(const YAML::Node& value) { return value.IsScalar() && value.Tag() == "!"; }

// A plain scalar JSON allows: a number (checked by the typed reads), true, false or null.
bool IsJsonNumberText(std::string_view text) {
  if (text.empty()) return false;
  size_t i = 0;
  if (text[i] == '-') ++i;
  if (i == text.size() || !(text[i] >= '0' && text[i] <= '9')) return false;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-')) {
      return false;
    }
  }
  return true;
}

}  // namespace


std::string JsonReader::Where(const YAML::Mark& mark) const {
  if (mark.is_null() || mark.line < 0 || mark.column < 0) return fmt::format("{}:1:1", source_);
  return fmt::format("{}:{}:{}", source_, mark.line + 1, mark.column + 1);
}

std::string JsonReader::Origin(const JsonMember& member) const {
  return fmt::format("{} ({})", Where(member.key_node.Mark()), member.path);
}

Status JsonReader::Error(const YAML::Mark& mark, std::string_view path, std::string_view expected,
                         std::string_view got) const {
  return Status::InvalidInput(fmt::format("{}: {}: expected {}, got {}", Where(mark),
                                          path.empty() ? "(top level)" : path, expected, got));
}

Status JsonReader::Error(const JsonMember& member, std::string_view expected) const {
  return Error(member.key_node.Mark(), member.path, expected, Describe(member.value));
}

Status JsonReader::UnknownKey(const JsonMember& member, std::string_view accepted) const {
  return Error(member.key_node.Mark(), member.path, fmt::format("one of the keys {}", accepted),
               fmt::format("unknown key '{}'", member.key));
}

Status JsonReader::Unsupported(const JsonMember& member, std::string_view why) const {
  return Status::InvalidInput(fmt::format("{}: {}: unsupported: {} (got {})",
                                          Where(member.key_node.Mark()), member.path, why,
                                          Describe(member.value)));
}

StatusOr<YAML::Node> JsonReader::Load(std::string_view text) const {
  size_t end = 0;
  if (!OneObject(text, &end)) {
    const auto [line, column] = traces::PositionOf(text, end);
    return Status::InvalidInput(fmt::format(
        "{}:{}:{}: (top level): expected one JSON object {{...}} and nothing after it, got {}",
        source_, line, column, end >= text.size() ? "nothing" : "more text"));
  }
  try {
    YAML::Node root = YAML::Load(std::string(text));
    if (!root.IsMap()) {
      return Error(root.Mark(), "", "a JSON object", Describe(root));
    }
    return root;
  } catch (const YAML::Exception& e) {
    const int line = e.mark.is_null() ? 1 : e.mark.line + 1;
    const int column = e.mark.is_null() ? 1 : e.mark.column + 1;
    return Status::InvalidInput(
        fmt::format("{}:{}:{}: invalid JSON: {}", source_, line, column, e.msg));
  } catch (const std::exception& e) {
    return Status::Internal(fmt::format("{}: reading the JSON failed: {}", source_, e.what()));
  }
}

StatusOr<std::vector<JsonMember>> JsonReader::Members(const YAML::Node& value,
                                                      const YAML::Mark& mark,
                                                      std::string_view path) const {
  if (!value.IsMap()) return Error(mark, path, "a JSON object", Describe(value));
  std::vector<JsonMember> members;
  for (const auto& pair : value) {
    const YAML::Node key = pair.first;
    if (!IsQuoted(key)) {
      return Error(key.Mark(), path, "a key in double quotes (JSON)", Describe(key));
    }
    JsonMember member{key.Scalar(),
                      path.empty() ? key.Scalar() : fmt::format("{}.{}", path, key.Scalar()),
                      key, pair.second};
    for (const JsonMember& earlier : members) {
      if (earlier.key == member.key) {
        return Error(key.Mark(), member.path, "each key once",
                     fmt::format("a duplicate (first at line {})", earlier.key_node.Mark().line + 1));
      }
    }
    // A bare word is YAML, not JSON.
    if (member.value.IsScalar() && !IsQuoted(member.value)) {
      const std::string& text = member.value.Scalar();
      if (text != "true" && text != "false" && !IsJsonNumberText(text)) {
        return Error(member, "a JSON value (a string in double quotes, a number, true, false, "
                             "null, an object or an array)");
      }
    }
    members.push_back(std::move(member));
  }
  return members;
}

bool JsonReader::IsAuto(const YAML::Node& value) {
  return IsQuoted(value) && value.Scalar() == "auto";
}

bool JsonReader::IsNull(const YAML::Node& value) { return value.IsNull(); }

std::string JsonReader::Describe(const YAML::Node& value) {
  if (value.IsNull()) return "null";
  if (value.IsMap()) return "an object";
  if (value.IsSequence()) return "an array";
  if (value.IsScalar()) {
    std::string text = value.Scalar();
    if (text.size() > 60) text = text.substr(0, 57) + "...";
    return IsQuoted(value) ? fmt::format("'{}'", text) : text;
  }
  return "nothing";
}

StatusOr<bool> JsonReader::Bool(const JsonMember& member) const {
  if (member.value.IsScalar() && !IsQuoted(member.value)) {
    if (member.value.Scalar() == "true") return true;
    if (member.value.Scalar() == "false") return false;
  }
  return Error(member, "true or false");
}

StatusOr<int64_t> JsonReader::Int(const JsonMember& member, int64_t min, int64_t max) const {
  const std::string expected = fmt::format("an integer from {} to {}", min, max);
  if (!member.value.IsScalar() || IsQuoted(member.value)) return Error(member, expected);
  const std::string& text = member.value.Scalar();
  int64_t integer = 0;
  const auto [iend, iec] = std::from_chars(text.data(), text.data() + text.size(), integer);
  if (iec == std::errc() && iend == text.data() + text.size()) {
    if (integer < min || integer > max) return Error(member, expected);
    return integer;
  }
  double value = 0;
  const auto [dend, dec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (dec != std::errc() || dend != text.data() + text.size() || !std::isfinite(value) ||
      std::floor(value) != value || value < static_cast<double>(min) ||
      value > static_cast<double>(max)) {
    return Error(member, expected);
  }
  return static_cast<int64_t>(value);
}

StatusOr<double> JsonReader::Number(const JsonMember& member, double min, double max) const {
  const std::string expected = fmt::format("a number from {} to {}", min, max);
  if (!member.value.IsScalar() || IsQuoted(member.value)) return Error(member, expected);
  const std::string& text = member.value.Scalar();
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value) ||
      value < min || value > max) {
    return Error(member, expected);
  }
  return value;
}

StatusOr<std::string> JsonReader::String(const JsonMember& member) const {
  if (!IsQuoted(member.value)) return Error(member, "a string");
  return member.value.Scalar();
}

StatusOr<std::string> ReadConfigFile(const std::string& path) {
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status)) {
    return Status::IoError(fmt::format("cannot read '{}': no such file", path));
  }
  if (!std::filesystem::is_regular_file(status)) {
    return Status::InvalidInput(fmt::format("cannot read '{}': not a regular file", path));
  }
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    return Status::IoError(fmt::format("cannot read '{}': {}", path, std::strerror(errno)));
  }
  std::string text;
  char buffer[65536];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file)) > 0) {
    text.append(buffer, n);
    if (static_cast<int64_t>(text.size()) > kMaxConfigFileBytes) {
      std::fclose(file);
      return Status::InvalidInput(fmt::format("cannot read '{}': larger than {} bytes", path,
                                              kMaxConfigFileBytes));
    }
  }
  const bool failed = std::ferror(file) != 0;
  const int read_errno = errno;
  std::fclose(file);
  if (failed) {
    return Status::IoError(fmt::format("cannot read '{}': {}", path, std::strerror(read_errno)));
  }
  return text;
}

}  // namespace shardscope::sim

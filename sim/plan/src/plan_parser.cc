// The readers every plan section uses: a mapping with its keys checked, and integers, numbers,
// booleans and strings with their ranges; and the helpers that build messages (plan_parser.h).
#include "plan_parser.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace shardscope::sim::plan_internal {
namespace {

std::string ExpectedInt(int64_t min, int64_t max) {
  if (min == 1) return fmt::format("a positive integer <= {}", max);
  if (min == 0) return fmt::format("a non-negative integer <= {}", max);
  return fmt::format("an integer in [{}, {}]", min, max);
}

}  // namespace

std::string JoinPath(std::string_view parent, std::string_view key) {
  if (parent.empty()) return std::string(key);
  return fmt::format("{}.{}", parent, key);
}

std::string Quote(std::string_view text) {
  constexpr size_t kMaxShown = 40;
  std::string out = "'";
  for (size_t i = 0; i < text.size() && i < kMaxShown; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  if (text.size() > kMaxShown) out += "...";
  out += "'";
  return out;
}

bool IsQuoted(const YAML::Node& node) { return node.IsScalar() && node.Tag() == "!"; }

std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
      return "nothing";
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Scalar:
      return IsQuoted(node) ? fmt::format("the string {}", Quote(node.Scalar()))
                            : Quote(node.Scalar());
    case YAML::NodeType::Sequence:
      return "a sequence";
    case YAML::NodeType::Map:
      return "a mapping";
  }
  return "an unknown YAML node";
}

std::optional<bool> AsBool(const YAML::Node& node) {
  if (!node.IsScalar() || IsQuoted(node)) return std::nullopt;
  const std::string& text = node.Scalar();
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  return std::nullopt;
}

bool IsHybrid(Fsdp1ShardingStrategy strategy) {
  return strategy == Fsdp1ShardingStrategy::kHybridShard ||
         strategy == Fsdp1ShardingStrategy::kHybridShardZero2;
}

bool DTypeSupported(const GpuSpec& gpu, traces::DType dtype) {
  return PeakFlops(gpu, dtype) > 0 ||
         (dtype == traces::DType::kFloat8E4M3 && gpu.arch == GpuArch::kHopper);
}

std::string ExpectedDType(const GpuSpec& gpu) {
  std::vector<std::string_view> supported;
  for (const auto& candidate : kTrainingDTypes) {
    if (DTypeSupported(gpu, candidate.value)) supported.push_back(candidate.name);
  }
  return fmt::format("a dtype the GPU {} supports ({})", gpu.name, JoinNames(supported));
}

StatusOr<Fields> PlanParser::ReadMapping(const YAML::Node& node, const YAML::Mark& mark,
                                         std::string_view path, KeyList allowed) const {
  const std::string shown_path = path.empty() ? std::string("(top level)") : std::string(path);
  if (!node.IsMap()) {
    return Error(mark, shown_path, fmt::format("a mapping with keys {}", JoinNames(allowed)),
                 Describe(node));
  }
  Fields fields;
  fields.mark = mark;
  // Copies, not references: yaml-cpp's iterator yields a temporary pair, and a reference
  // into it dangles after the statement.
  for (const auto& pair : node) {
    const YAML::Node key = pair.first;
    if (!key.IsScalar()) {
      return Error(key.Mark(), shown_path,
                   fmt::format("a plain key (one of {})", JoinNames(allowed)), Describe(key));
    }
    const std::string& name = key.Scalar();
    bool known = false;
    for (std::string_view allowed_key : allowed) known = known || allowed_key == name;
    if (!known) {
      return Error(key.Mark(), JoinPath(path, name),
                   fmt::format("one of the keys {}", JoinNames(allowed)),
                   fmt::format("unknown key {}", Quote(name)));
    }
    if (const Entry* first = fields.Find(name); first != nullptr) {
      return Error(key.Mark(), JoinPath(path, name), "each key at most once",
                   fmt::format("a duplicate (first at line {})", first->key_node.Mark().line + 1));
    }
    fields.entries.push_back(Entry{name, key, pair.second});
  }
  return fields;
}

Status PlanParser::Require(const Fields& fields, std::string_view parent, std::string_view key,
                           std::string_view expected) const {
  if (fields.Find(key) != nullptr) return Status::Ok();
  return Error(fields.mark, JoinPath(parent, key), expected, "nothing (the key is missing)");
}

Status PlanParser::ReadInt(const Entry& entry, std::string_view path, int64_t min, int64_t max,
                           int64_t* out) const {
  const std::string expected = ExpectedInt(min, max);
  if (!entry.value.IsScalar() || IsQuoted(entry.value)) return Error(entry, path, expected);
  std::string_view text = entry.value.Scalar();
  if (text.size() > 1 && text[0] == '+' && text[1] >= '0' && text[1] <= '9') text.remove_prefix(1);
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec == std::errc() && end == text.data() + text.size()) {
    if (value < min || value > max) return Error(entry, path, expected);
    *out = value;
    return Status::Ok();
  }
  // Name the common mistake: a float where an integer belongs.
  double as_double = 0;
  const auto [dend, dec] = std::from_chars(text.data(), text.data() + text.size(), as_double);
  if (ec != std::errc::result_out_of_range && dec == std::errc() &&
      dend == text.data() + text.size()) {
    return Error(MarkOf(entry), path, expected,
                 fmt::format("{} (not an integer)", Describe(entry.value)));
  }
  return Error(entry, path, expected);
}

Status PlanParser::ReadInt32(const Entry& entry, std::string_view path, int64_t min, int64_t max,
                             int32_t* out) const {
  int64_t value = 0;
  SHARDSCOPE_RETURN_IF_ERROR(ReadInt(entry, path, min, max, &value));
  *out = static_cast<int32_t>(value);  // every int32 field's max is below 2^31
  return Status::Ok();
}

Status PlanParser::ReadNumber(const Entry& entry, std::string_view path, double min,
                              bool exclusive_min, double max, double* out) const {
  const std::string expected =
      fmt::format("a number {} {} and <= {}", exclusive_min ? ">" : ">=", min, max);
  if (!entry.value.IsScalar() || IsQuoted(entry.value)) return Error(entry, path, expected);
  std::string_view text = entry.value.Scalar();
  if (text.size() > 1 && text[0] == '+' && text[1] >= '0' && text[1] <= '9') text.remove_prefix(1);
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  // from_chars accepts "inf" and "nan"; a plan value must be finite.
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value) ||
      value < min || (exclusive_min && value == min) || value > max) {
    return Error(entry, path, expected);
  }
  *out = value;
  return Status::Ok();
}

Status PlanParser::ReadBool(const Entry& entry, std::string_view path, bool* out) const {
  // YAML 1.2 core schema booleans only: yes/no/on/off are strings there, so they are refused
  // rather than guessed.
  if (std::optional<bool> value = AsBool(entry.value)) {
    *out = *value;
    return Status::Ok();
  }
  return Error(entry, path, "true or false");
}

Status PlanParser::ReadString(const Entry& entry, std::string_view path, std::string_view expected,
                              std::string* out) const {
  if (!entry.value.IsScalar() || entry.value.Scalar().empty()) {
    return Error(entry, path, expected);
  }
  *out = entry.value.Scalar();
  return Status::Ok();
}

StatusOr<Fields> PlanParser::SectionFields(const Entry* entry, std::string_view path,
                                           KeyList allowed) const {
  if (entry == nullptr) return Fields{};
  return ReadMapping(entry->value, MarkOf(*entry), path, allowed);
}

Status PlanParser::KeyError(const Entry& entry, std::string_view path, std::string_view expected,
                            std::string_view got) const {
  return Error(entry.key_node.Mark(), path, expected, got);
}

}  // namespace shardscope::sim::plan_internal

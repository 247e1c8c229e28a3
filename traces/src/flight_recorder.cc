// The Flight Recorder dump reader: one code path over two document models (the pickle tree
// and nlohmann JSON), so that PyTorch's pickle dump, its JSON dump and our simulated and
// runtime dumps are read by the same rules.
//
// Layout: torch/csrc/distributed/c10d/FlightRecorder.cpp (FlightRecorder::dump builds the
// pickle dict, dump_json the JSON; keys from FlightRecorder.hpp: version_key, pg_config_key,
// pg_status_key, entries_key, record_id_key, pg_id_key, pg_name_key, collective_seq_id_key,
// p2p_seq_id_key, op_id_key, profiling_name_key, time_created_key, input_sizes_key, ...).
// Variants accepted, by what PyTorch wrote over the versions and in its two forms:
//   - dump_json: `pg_status` values as decimal strings, discovery times 0 when unknown (null
//     in the pickle), no `entries` key when the buffer is empty;
//   - `collective_seq_id` absent, `seq_id` present (versions before 2.3 had one sequence id);
//   - `p2p_seq_id`, `op_id`, `is_p2p`, the dtypes, `timeout_ms`, `retired`, the discovered
//     times, `pg_status`, `version` absent (older versions); is_p2p then follows the name
//     ("nccl:send ..." / "nccl:recv ...");
//   - `pg_config` ranks as the string "[0, 1]" (what PyTorch writes) or a list of ints;
//   - `process_group` a tuple (pickle) or a list (JSON) of (name, desc);
//   - the rank in the dump (`rank`, or `shardscope.rank` from `shardscope run`) or only in
//     the file name.
// Everything else malformed is an error naming the file and the key path.
#include "shardscope/traces/flight_recorder.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "json_text.h"
#include "shardscope/base/pickle.h"

namespace shardscope::traces {
namespace {

// Nesting deeper than this in a JSON dump is rejected before nlohmann parses it (a dump nests
// four levels; the bound keeps a hostile file from exhausting the stack).
constexpr int kMaxJsonDepth = 64;

// A read-only view of one value in either document model.
class PickleNode {
 public:
  explicit PickleNode(const PickleObject* o) : o_(o) {}
  bool IsNull() const { return o_->kind == PickleObject::Kind::kNone; }
  bool IsDict() const { return o_->kind == PickleObject::Kind::kDict; }
  bool IsList() const { return o_->kind == PickleObject::Kind::kList || o_->kind == PickleObject::Kind::kTuple; }
  bool IsString() const { return o_->kind == PickleObject::Kind::kString; }
  bool IsInt() const { return o_->kind == PickleObject::Kind::kInt; }
  bool IsBool() const { return o_->kind == PickleObject::Kind::kBool; }
  std::string KindName() const { return std::string(o_->KindName()); }
  int64_t Int() const { return o_->int_value; }
  bool Bool() const { return o_->bool_value; }
  const std::string& Str() const { return o_->string_value; }
  size_t Size() const { return o_->items.size(); }
  PickleNode At(size_t i) const { return PickleNode(o_->items[i]); }
  std::optional<PickleNode> Find(std::string_view key) const {
    const PickleObject* v = o_->Find(key);
    return v ? std::optional<PickleNode>(PickleNode(v)) : std::nullopt;
  }
  // Dict entries with their keys as text (str keys; int keys as decimal).
  std::vector<std::pair<std::string, PickleNode>> Items() const {
    std::vector<std::pair<std::string, PickleNode>> out;
    for (const auto& [k, v] : o_->entries) {
      if (k->kind == PickleObject::Kind::kString) {
        out.emplace_back(k->string_value, PickleNode(v));
      } else if (k->kind == PickleObject::Kind::kInt) {
        out.emplace_back(std::to_string(k->int_value), PickleNode(v));
      }
    }
    return out;
  }

 private:
  const PickleObject* o_;
};

class JsonNode {
 public:
  explicit JsonNode(const nlohmann::json* j) : j_(j) {}
  bool IsNull() const { return j_->is_null(); }
  bool IsDict() const { return j_->is_object(); }
  bool IsList() const { return j_->is_array(); }
  bool IsString() const { return j_->is_string(); }
  bool IsInt() const {
    return j_->is_number_integer() &&
           (!j_->is_number_unsigned() ||
            j_->get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
  }
  bool IsBool() const { return j_->is_boolean(); }
  std::string KindName() const { return j_->type_name(); }
  int64_t Int() const { return j_->get<int64_t>(); }
  bool Bool() const { return j_->get<bool>(); }
  const std::string& Str() const { return j_->get_ref<const std::string&>(); }
  size_t Size() const { return j_->size(); }
  JsonNode At(size_t i) const { return JsonNode(&(*j_)[i]); }
  std::optional<JsonNode> Find(std::string_view key) const {
    if (!j_->is_object()) return std::nullopt;
    auto it = j_->find(key);
    return it == j_->end() ? std::nullopt : std::optional<JsonNode>(JsonNode(&*it));
  }
  std::vector<std::pair<std::string, JsonNode>> Items() const {
    std::vector<std::pair<std::string, JsonNode>> out;
    for (auto it = j_->begin(); it != j_->end(); ++it) out.emplace_back(it.key(), JsonNode(&it.value()));
    return out;
  }

 private:
  const nlohmann::json* j_;
};

template <typename Node>
class DumpReader {
 public:
  explicit DumpReader(std::string_view source) : source_(source) {}

  Status Error(const std::string& path, const std::string& what) const {
    return Status::InvalidInput(fmt::format("{}: {}: {}", source_, path, what));
  }

  Status Expect(const Node& n, bool ok, const std::string& path, std::string_view expected) const {
    if (ok) return Status::Ok();
    return Error(path, fmt::format("expected {}, got {}", expected, n.KindName()));
  }

  StatusOr<int64_t> Int(const Node& n, const std::string& path) const {
    SHARDSCOPE_RETURN_IF_ERROR(Expect(n, n.IsInt(), path, "an integer"));
    return n.Int();
  }
  // An int, or -1 for None / null.
  StatusOr<int64_t> IntOrNull(const Node& n, const std::string& path) const {
    if (n.IsNull()) return int64_t{-1};
    return Int(n, path);
  }
  // An int or its decimal text: dump_json writes pg_status values with std::to_string
  // (FlightRecorder.cpp getPgStatusJson) where the pickle has ints.
  StatusOr<int64_t> IntOrDecimal(const Node& n, const std::string& path) const {
    if (!n.IsString()) return IntOrNull(n, path);
    const std::string& text = n.Str();
    int64_t value = 0;
    auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) {
      return Error(path, fmt::format("expected an integer, got \"{}\"", text));
    }
    return value;
  }
  // A discovery time: null in the pickle, 0 in dump_json (FlightRecorder.cpp), both "not
  // discovered" (-1 here).
  StatusOr<int64_t> TimeOrUnset(const Node& n, const std::string& path) const {
    SHARDSCOPE_ASSIGN_OR_RETURN(int64_t t, IntOrNull(n, path));
    return t == 0 ? int64_t{-1} : t;
  }
  StatusOr<std::string> Str(const Node& n, const std::string& path) const {
    SHARDSCOPE_RETURN_IF_ERROR(Expect(n, n.IsString(), path, "a string"));
    return n.Str();
  }
  StatusOr<bool> Bool(const Node& n, const std::string& path) const {
    SHARDSCOPE_RETURN_IF_ERROR(Expect(n, n.IsBool(), path, "a bool"));
    return n.Bool();
  }

  StatusOr<std::vector<std::vector<int64_t>>> Sizes(const Node& n, const std::string& path) const {
    SHARDSCOPE_RETURN_IF_ERROR(Expect(n, n.IsList(), path, "a list of shapes"));
    std::vector<std::vector<int64_t>> out;
    for (size_t i = 0; i < n.Size(); ++i) {
      const Node shape = n.At(i);
      const std::string at = fmt::format("{}[{}]", path, i);
      SHARDSCOPE_RETURN_IF_ERROR(Expect(shape, shape.IsList(), at, "a shape (list of integers)"));
      std::vector<int64_t> dims;
      for (size_t k = 0; k < shape.Size(); ++k) {
        SHARDSCOPE_ASSIGN_OR_RETURN(int64_t d, Int(shape.At(k), fmt::format("{}[{}]", at, k)));
        if (d < 0) return Error(fmt::format("{}[{}]", at, k), fmt::format("negative dimension {}", d));
        dims.push_back(d);
      }
      out.push_back(std::move(dims));
    }
    return out;
  }

  StatusOr<std::vector<std::string>> Strings(const Node& n, const std::string& path) const {
    SHARDSCOPE_RETURN_IF_ERROR(Expect(n, n.IsList(), path, "a list of strings"));
    std::vector<std::string> out;
    for (size_t i = 0; i < n.Size(); ++i) {
      SHARDSCOPE_ASSIGN_OR_RETURN(std::string s, Str(n.At(i), fmt::format("{}[{}]", path, i)));
      out.push_back(std::move(s));
    }
    return out;
  }

  // "[0, 1, 2]" (what PyTorch writes: str(ranks)) or a list of ints.
  StatusOr<std::vector<int32_t>> Ranks(const Node& n, const std::string& path) const {
    std::vector<int32_t> out;
    auto add = [&](int64_t r) -> Status {
      if (r < 0 || r > std::numeric_limits<int32_t>::max()) {
        return Error(path, fmt::format("rank {} is out of range", r));
      }
      out.push_back(static_cast<int32_t>(r));
      return Status::Ok();
    };
    if (n.IsList()) {
      for (size_t i = 0; i < n.Size(); ++i) {
        SHARDSCOPE_ASSIGN_OR_RETURN(int64_t r, Int(n.At(i), fmt::format("{}[{}]", path, i)));
        SHARDSCOPE_RETURN_IF_ERROR(add(r));
      }
      return out;
    }
    SHARDSCOPE_ASSIGN_OR_RETURN(std::string text, Str(n, path));
    std::string_view rest = text;
    auto trim = [](std::string_view s) {
      while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
      while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
      return s;
    };
    rest = trim(rest);
    if (rest.size() < 2 || rest.front() != '[' || rest.back() != ']') {
      return Error(path, fmt::format("expected a rank list such as \"[0, 1]\", got \"{}\"", text));
    }
    rest = trim(rest.substr(1, rest.size() - 2));
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      const std::string_view item = trim(rest.substr(0, comma));
      int64_t r = 0;
      auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), r);
      if (item.empty() || ec != std::errc() || ptr != item.data() + item.size()) {
        return Error(path, fmt::format("expected a rank list such as \"[0, 1]\", got \"{}\"", text));
      }
      SHARDSCOPE_RETURN_IF_ERROR(add(r));
      if (comma == std::string_view::npos) break;
      rest = trim(rest.substr(comma + 1));
      if (rest.empty()) return Error(path, fmt::format("trailing comma in \"{}\"", text));
    }
    return out;
  }

  StatusOr<FrEntry> Entry(const Node& n, const std::string& path) const {
    SHARDSCOPE_RETURN_IF_ERROR(Expect(n, n.IsDict(), path, "a dict (one entry)"));
    FrEntry e;
    auto need = [&](std::string_view key) -> StatusOr<Node> {
      auto v = n.Find(key);
      if (!v) return Error(path, fmt::format("missing key '{}'", key));
      return *v;
    };
    auto key = [&](std::string_view k) { return fmt::format("{}.{}", path, k); };
    {
      SHARDSCOPE_ASSIGN_OR_RETURN(Node v, need("record_id"));
      SHARDSCOPE_ASSIGN_OR_RETURN(e.record_id, Int(v, key("record_id")));
    }
    if (auto v = n.Find("pg_id")) {
      SHARDSCOPE_ASSIGN_OR_RETURN(e.pg_id, IntOrNull(*v, key("pg_id")));
    }
    {
      SHARDSCOPE_ASSIGN_OR_RETURN(Node v, need("process_group"));
      const std::string at = key("process_group");
      if (!v.IsList() || v.Size() != 2) {
        return Error(at, fmt::format("expected a (name, desc) pair, got a {} of {} item(s)", v.KindName(),
                                     v.IsList() ? v.Size() : 1));
      }
      SHARDSCOPE_ASSIGN_OR_RETURN(e.pg_name, Str(v.At(0), at + "[0]"));
      SHARDSCOPE_ASSIGN_OR_RETURN(e.pg_desc, Str(v.At(1), at + "[1]"));
    }
    if (auto v = n.Find("collective_seq_id")) {
      SHARDSCOPE_ASSIGN_OR_RETURN(e.collective_seq_id, Int(*v, key("collective_seq_id")));
    } else if (auto old = n.Find("seq_id")) {
      SHARDSCOPE_ASSIGN_OR_RETURN(e.collective_seq_id, Int(*old, key("seq_id")));
    } else {
      return Error(path, "missing key 'collective_seq_id' (or 'seq_id' of older versions)");
    }
    if (auto v = n.Find("p2p_seq_id")) {
      SHARDSCOPE_ASSIGN_OR_RETURN(e.p2p_seq_id, Int(*v, key("p2p_seq_id")));
    }
    if (auto v = n.Find("op_id")) {
      SHARDSCOPE_ASSIGN_OR_RETURN(e.op_id, Int(*v, key("op_id")));
    }
    {
      SHARDSCOPE_ASSIGN_OR_RETURN(Node v, need("profiling_name"));
      SHARDSCOPE_ASSIGN_OR_RETURN(e.profiling_name, Str(v, key("profiling_name")));
    }
    if (auto v = n.Find("time_created_ns")) {
      SHARDSCOPE_ASSIGN_OR_RETURN(e.time_created_ns, IntOrNull(*v, key("time_created_ns")));
    }
    {
      SHARDSCOPE_ASSIGN_OR_RETURN(Node v, need("input_sizes"));
      SHARDSCOPE_ASSIGN_OR_RETURN(e.input_sizes, Sizes(v, key("input_sizes")));
    }
    {
      SHARDSCOPE_ASSIGN_OR_RETURN(Node v, need("output_sizes"));
      SHARDSCOPE_ASSIGN_OR_RETURN(e.output_sizes, Sizes(v, key("output_sizes")));
    }
    if (auto v = n.Find("input_dtypes")) {
      SHARDSCOPE_ASSIGN_OR_RETURN(e.input_dtypes, Strings(*v, key("input_dtypes")));
    }
    if (auto v = n.Find("output_dtypes")) {
      SHARDSCOPE_ASSIGN_OR_RETURN(e.output_dtypes, Strings(*v, key("output_dtypes")));
    }
    {
      SHARDSCOPE_ASSIGN_OR_RETURN(Node v, need("state"));
      SHARDSCOPE_ASSIGN_OR_RETURN(e.state, Str(v, key("state")));
      if (e.state != "scheduled" && e.state != "started" && e.state != "completed") {
        return Error(key("state"), fmt::format("expected scheduled, started or completed, got \"{}\"", e.state));
      }
    }
    if (auto v = n.Find("time_discovered_started_ns")) {
      SHARDSCOPE_ASSIGN_OR_RETURN(e.time_discovered_started_ns, TimeOrUnset(*v, key("time_discovered_started_ns")));
    }
    if (auto v = n.Find("time_discovered_completed_ns")) {
      SHARDSCOPE_ASSIGN_OR_RETURN(e.time_discovered_completed_ns,
                                  TimeOrUnset(*v, key("time_discovered_completed_ns")));
    }
    if (auto v = n.Find("retired")) {
      SHARDSCOPE_ASSIGN_OR_RETURN(e.retired, Bool(*v, key("retired")));
    }
    if (auto v = n.Find("timeout_ms")) {
      SHARDSCOPE_ASSIGN_OR_RETURN(e.timeout_ms, IntOrNull(*v, key("timeout_ms")));
    }
    if (auto v = n.Find("is_p2p")) {
      SHARDSCOPE_ASSIGN_OR_RETURN(e.is_p2p, Bool(*v, key("is_p2p")));
    } else {
      e.is_p2p = e.profiling_name.rfind("nccl:send", 0) == 0 || e.profiling_name.rfind("nccl:recv", 0) == 0;
    }
    return e;
  }

  StatusOr<FlightRecorderDump> Dump(const Node& root, int32_t rank_from_name) const {
    FlightRecorderDump dump;
    dump.source = std::string(source_);
    SHARDSCOPE_RETURN_IF_ERROR(Expect(root, root.IsDict(), "top level", "a dict with 'entries'"));
    if (auto v = root.Find("version")) {
      SHARDSCOPE_ASSIGN_OR_RETURN(dump.version, Str(*v, "version"));
    }
    int64_t own_rank = -1;
    if (auto v = root.Find("rank")) {
      SHARDSCOPE_ASSIGN_OR_RETURN(own_rank, Int(*v, "rank"));
    } else if (auto ours = root.Find("shardscope")) {
      if (auto r = ours->Find("rank")) {
        SHARDSCOPE_ASSIGN_OR_RETURN(own_rank, Int(*r, "shardscope.rank"));
      }
    }
    if (own_rank > std::numeric_limits<int32_t>::max() || own_rank < -1) {
      return Error("rank", fmt::format("rank {} is out of range", own_rank));
    }
    if (own_rank >= 0 && rank_from_name >= 0 && own_rank != rank_from_name) {
      return Error("rank", fmt::format("the dump says rank {} but its file name says rank {}", own_rank,
                                       rank_from_name));
    }
    dump.rank = own_rank >= 0 ? static_cast<int32_t>(own_rank) : rank_from_name;
    if (dump.rank < 0) {
      return Status::InvalidInput(fmt::format(
          "{}: no rank: the dump has no 'rank' key and its file name does not end in the rank", source_));
    }
    if (auto v = root.Find("pg_config")) {
      SHARDSCOPE_RETURN_IF_ERROR(Expect(*v, v->IsDict(), "pg_config", "a dict (PG name -> config)"));
      for (const auto& [name, config] : v->Items()) {
        const std::string at = fmt::format("pg_config[\"{}\"]", name);
        SHARDSCOPE_RETURN_IF_ERROR(Expect(config, config.IsDict(), at, "a dict with 'desc' and 'ranks'"));
        FrGroupConfig group;
        group.name = name;
        if (auto d = config.Find("desc")) {
          SHARDSCOPE_ASSIGN_OR_RETURN(group.desc, Str(*d, at + ".desc"));
        }
        auto ranks = config.Find("ranks");
        if (!ranks) return Error(at, "missing key 'ranks'");
        SHARDSCOPE_ASSIGN_OR_RETURN(group.ranks, Ranks(*ranks, at + ".ranks"));
        dump.pg_config.push_back(std::move(group));
      }
    }
    if (auto v = root.Find("pg_status")) {
      SHARDSCOPE_RETURN_IF_ERROR(Expect(*v, v->IsDict(), "pg_status", "a dict (pg id -> status)"));
      for (const auto& [id, status] : v->Items()) {
        const std::string at = fmt::format("pg_status[\"{}\"]", id);
        SHARDSCOPE_RETURN_IF_ERROR(Expect(status, status.IsDict(), at, "a dict"));
        FrPgStatus s;
        if (auto x = status.Find("last_enqueued_collective")) {
          SHARDSCOPE_ASSIGN_OR_RETURN(s.last_enqueued, IntOrDecimal(*x, at + ".last_enqueued_collective"));
        }
        if (auto x = status.Find("last_started_collective")) {
          SHARDSCOPE_ASSIGN_OR_RETURN(s.last_started, IntOrDecimal(*x, at + ".last_started_collective"));
        }
        if (auto x = status.Find("last_completed_collective")) {
          SHARDSCOPE_ASSIGN_OR_RETURN(s.last_completed, IntOrDecimal(*x, at + ".last_completed_collective"));
        }
        dump.pg_status[id] = s;
      }
    }
    auto entries = root.Find("entries");
    if (!entries) {
      // dump_json leaves `entries` out when the buffer is empty (FlightRecorder.cpp: "if
      // (!entries.empty())"); a dict with neither is not a dump.
      if (root.Find("version") && root.Find("pg_config")) return dump;
      return Status::InvalidInput(fmt::format(
          "{}: not a Flight Recorder dump: the top-level dict has no 'entries' (nor 'version' and 'pg_config')",
          source_));
    }
    SHARDSCOPE_RETURN_IF_ERROR(Expect(*entries, entries->IsList(), "entries", "a list"));
    for (size_t i = 0; i < entries->Size(); ++i) {
      SHARDSCOPE_ASSIGN_OR_RETURN(FrEntry e, Entry(entries->At(i), fmt::format("entries[{}]", i)));
      dump.entries.push_back(std::move(e));
    }
    return dump;
  }

 private:
  std::string_view source_;
};

// The rank digits at the end of a file name (after dropping .json / .pkl / .pickle), and the
// prefix before them; nullopt when the name does not end in digits.
struct DumpName {
  std::string prefix;
  int32_t rank = -1;
};

std::optional<DumpName> SplitDumpName(std::string name) {
  for (const char* ext : {".json", ".pkl", ".pickle"}) {
    const std::string_view e(ext);
    if (name.size() > e.size() && name.compare(name.size() - e.size(), e.size(), e) == 0) {
      name.resize(name.size() - e.size());
      break;
    }
  }
  size_t digits = name.size();
  while (digits > 0 && std::isdigit(static_cast<unsigned char>(name[digits - 1]))) --digits;
  if (digits == name.size() || name.size() - digits > 9) return std::nullopt;
  DumpName out;
  out.prefix = name.substr(0, digits);
  out.rank = std::stoi(name.substr(digits));
  return out;
}

bool IsKnownPrefix(const std::string& prefix) {
  // PyTorch: TORCH_NCCL_DEBUG_INFO_TEMP_FILE's default "/tmp/nccl_trace_rank_" (ProcessGroupNCCL
  // getCvarString), NVIDIA's test fixtures "_dump_"; shardscope simulate
  // "flight_recorder_rank", shardscope run "rank_" (in DIR/flight_recorder/).
  return prefix == "nccl_trace_rank_" || prefix == "_dump_" || prefix == "flight_recorder_rank" ||
         prefix == "rank_";
}

StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file.is_open()) return Status::IoError(fmt::format("cannot open '{}'", path));
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) return Status::IoError(fmt::format("reading '{}' failed", path));
  return text.str();
}

}  // namespace

StatusOr<FlightRecorderDump> ParseFlightRecorderDump(std::string_view bytes, std::string_view source,
                                                     int32_t rank_from_name) {
  size_t first = 0;
  while (first < bytes.size() && std::isspace(static_cast<unsigned char>(bytes[first]))) ++first;
  if (first < bytes.size() && bytes[first] == '{') {
    if (JsonNestingDepth(bytes, kMaxJsonDepth) > kMaxJsonDepth) {
      return Status::InvalidInput(
          fmt::format("{}: JSON nested deeper than {} levels: not a Flight Recorder dump", source, kMaxJsonDepth));
    }
    nlohmann::json json;
    try {
      json = nlohmann::json::parse(bytes.begin(), bytes.end());
    } catch (const nlohmann::json::parse_error& e) {
      return Status::InvalidInput(fmt::format("{}:{}: not valid JSON: {}", source, LineColumn(bytes, e.byte),
                                              JsonErrorText(e)));
    } catch (const nlohmann::json::exception& e) {
      // out_of_range: a number too large for a double ("1e9999").
      return Status::InvalidInput(fmt::format("{}: not valid JSON: {}", source, JsonErrorText(e)));
    }
    return DumpReader<JsonNode>(source).Dump(JsonNode(&json), rank_from_name);
  }
  if (bytes.empty() || static_cast<uint8_t>(bytes[0]) != 0x80) {
    return Status::InvalidInput(fmt::format(
        "{}: neither a pickle (PyTorch's default dump) nor a JSON dump: it starts with neither the "
        "pickle PROTO byte 0x80 nor '{{'",
        source));
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(std::unique_ptr<PickleDocument> doc, ParsePickle(bytes, source));
  return DumpReader<PickleNode>(source).Dump(PickleNode(&doc->root()), rank_from_name);
}

StatusOr<std::vector<FlightRecorderDump>> ReadFlightRecorderDir(const std::string& dir,
                                                                const FlightRecorderDirOptions& options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return Status::InvalidInput(fmt::format("'{}' is not a folder of Flight Recorder dumps", dir));
  }
  struct Candidate {
    std::string path;
    DumpName name;
  };
  auto list = [&](const fs::path& folder) {
    std::vector<Candidate> out;
    std::error_code list_ec;
    for (const fs::directory_entry& entry : fs::directory_iterator(folder, list_ec)) {
      std::error_code type_ec;
      if (!entry.is_regular_file(type_ec)) continue;
      auto name = SplitDumpName(entry.path().filename().string());
      if (name) out.push_back({entry.path().string(), *name});
    }
    std::sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) { return a.path < b.path; });
    return out;
  };
  std::vector<Candidate> candidates = list(dir);
  if (options.prefix.empty() && candidates.empty() && fs::is_directory(fs::path(dir) / "flight_recorder", ec)) {
    candidates = list(fs::path(dir) / "flight_recorder");
  }
  std::set<std::string> prefixes;
  for (const Candidate& c : candidates) prefixes.insert(c.name.prefix);
  std::string prefix = options.prefix;
  if (prefix.empty()) {
    if (prefixes.size() == 1) {
      prefix = *prefixes.begin();
    } else {
      std::vector<std::string> known;
      for (const std::string& p : prefixes) {
        if (IsKnownPrefix(p)) known.push_back(p);
      }
      if (known.size() == 1) {
        prefix = known.front();
      } else if (!prefixes.empty()) {
        std::string all;
        for (const std::string& p : prefixes) all += (all.empty() ? "'" : ", '") + p + "'";
        return Status::InvalidInput(fmt::format(
            "{}: files named <prefix><rank> with several prefixes ({}): say which with --prefix", dir, all));
      }
    }
  }
  std::vector<FlightRecorderDump> dumps;
  std::map<int32_t, std::string> seen;
  for (const Candidate& c : candidates) {
    if (c.name.prefix != prefix) continue;
    SHARDSCOPE_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(c.path));
    SHARDSCOPE_ASSIGN_OR_RETURN(FlightRecorderDump dump, ParseFlightRecorderDump(bytes, c.path, c.name.rank));
    auto [it, inserted] = seen.emplace(dump.rank, c.path);
    if (!inserted) {
      return Status::InvalidInput(
          fmt::format("{}: a second dump of rank {} (the first is {})", c.path, dump.rank, it->second));
    }
    dumps.push_back(std::move(dump));
  }
  if (dumps.empty()) {
    return Status::InvalidInput(fmt::format(
        "{}: no Flight Recorder dumps: expected files named <prefix><rank> such as nccl_trace_rank_0 "
        "(PyTorch's TORCH_NCCL_DEBUG_INFO_TEMP_FILE), _dump_0 or flight_recorder_rank0.json{}",
        dir, options.prefix.empty() ? "" : fmt::format(" with the prefix '{}'", options.prefix)));
  }
  std::sort(dumps.begin(), dumps.end(),
            [](const FlightRecorderDump& a, const FlightRecorderDump& b) { return a.rank < b.rank; });
  return dumps;
}

}  // namespace shardscope::traces

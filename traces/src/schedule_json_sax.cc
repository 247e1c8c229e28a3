// Reading the JSON form of a Schedule: ParseScheduleJson and ReadScheduleFile, and step 1,
// the SAX handler that hands each op to ScheduleReader as soon as it is complete (the steps
// are described in schedule_json_internal.h).
#include "shardscope/traces/schedule_json.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "json_text.h"
#include "schedule_json_internal.h"

namespace shardscope::traces {
namespace {

using schedule_json_internal::Json;
using schedule_json_internal::kMaxDepth;
using schedule_json_internal::PendingOp;
using schedule_json_internal::PointerSegment;
using schedule_json_internal::Quote;
using schedule_json_internal::ScheduleReader;

// Files are read through a buffer of this size.
constexpr size_t kFileBufferBytes = size_t{1} << 20;

// The same for a file, read again a block at a time (only on errors).
std::string LineColumnInFile(const std::string& path, size_t offset) {
  std::ifstream file(path, std::ios::binary);
  std::vector<char> block(kFileBufferBytes);
  size_t line = 1, column = 1;
  while (offset > 0 && file) {
    file.read(block.data(), static_cast<std::streamsize>(std::min(offset, block.size())));
    const auto got = static_cast<size_t>(file.gcount());
    if (got == 0) break;
    for (size_t i = 0; i < got; ++i) {
      column = block[i] == '\n' ? 1 : column + 1;
      if (block[i] == '\n') ++line;
    }
    offset -= got;
  }
  return fmt::format("{}:{}", line, column);
}

// Builds a JSON value from SAX events. Pointers on the stack stay valid: a container only
// grows while it is the innermost open one.
class DomBuilder {
 public:
  void Reset() {
    root_ = Json();
    stack_.clear();
  }
  // Returns false if `key` repeats a key of the enclosing object.
  bool Add(Json value, const std::string& key, bool container) {
    Json* slot = nullptr;
    if (stack_.empty()) {
      root_ = std::move(value);
      slot = &root_;
    } else if (Json& parent = *stack_.back(); parent.is_array()) {
      parent.push_back(std::move(value));
      slot = &parent.back();
    } else {
      auto [it, inserted] = parent.emplace(key, std::move(value));
      if (!inserted) return false;
      slot = &*it;
    }
    if (container) stack_.push_back(slot);
    return true;
  }
  void End() { stack_.pop_back(); }
  Json& root() { return root_; }

 private:
  Json root_;
  std::vector<Json*> stack_;
};

class ScheduleSax final : public nlohmann::json_sax<Json> {
 public:
  explicit ScheduleSax(ScheduleReader& reader) : reader_(reader) {}

  Json& document() { return document_.root(); }
  std::vector<std::vector<PendingOp>>& pending() { return pending_; }
  const std::optional<Status>& semantic_error() const { return semantic_error_; }
  std::optional<size_t> syntax_error_offset() const { return syntax_error_offset_; }
  const std::string& syntax_error_text() const { return syntax_error_text_; }

  bool null() override { return Value(Json(nullptr), Kind::kScalar); }
  bool boolean(bool value) override { return Value(Json(value), Kind::kScalar); }
  bool number_integer(number_integer_t value) override { return Value(Json(value), Kind::kScalar); }
  bool number_unsigned(number_unsigned_t value) override {
    return Value(Json(value), Kind::kScalar);
  }
  bool number_float(number_float_t value, const string_t& /*text*/) override {
    return Value(Json(value), Kind::kScalar);
  }
  bool string(string_t& value) override { return Value(Json(std::move(value)), Kind::kScalar); }
  bool binary(binary_t& /*value*/) override {
    return Fail(reader_.Fail(CurrentPath(), "unexpected binary value"));
  }
  bool key(string_t& value) override {
    key_ = std::move(value);
    return true;
  }
  bool start_object(std::size_t /*elements*/) override {
    return Value(Json::object(), Kind::kObject);
  }
  bool start_array(std::size_t /*elements*/) override { return Value(Json::array(), Kind::kArray); }
  bool end_object() override { return End(); }
  bool end_array() override { return End(); }

  bool parse_error(std::size_t position, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& error) override {
    syntax_error_offset_ = position > 0 ? position - 1 : 0;
    syntax_error_text_ = JsonErrorText(error);
    return false;
  }

 private:
  enum class Kind : uint8_t { kScalar, kObject, kArray };
  struct Frame {
    bool is_array = false;
    std::string segment;  // this container's key or index in its parent
    size_t next_index = 0;
  };

  bool Fail(Status status) {
    semantic_error_ = std::move(status);
    return false;
  }

  // The segment of the value that starts now (consumes an array index).
  std::string NextSegment() {
    if (frames_.empty()) return "";
    Frame& top = frames_.back();
    return top.is_array ? std::to_string(top.next_index++) : PointerSegment(key_);
  }
  std::string PathOf(const std::string& segment) const {
    std::string path;
    for (size_t i = 1; i < frames_.size(); ++i) path += "/" + frames_[i].segment;
    if (!frames_.empty()) path += "/" + segment;
    return path;
  }
  std::string CurrentPath() const {
    if (frames_.empty()) return "";
    const Frame& top = frames_.back();
    return PathOf(top.is_array ? std::to_string(top.next_index) : PointerSegment(key_));
  }

  // /programs/<p>/ops: [root object, programs array, program object, ops array].
  bool AtOpsArray() const {
    return frames_.size() == 4 && !frames_[0].is_array && frames_[1].is_array &&
           frames_[1].segment == "programs" && !frames_[2].is_array && frames_[3].is_array &&
           frames_[3].segment == "ops";
  }

  bool Value(Json value, Kind kind) {
    const bool container = kind != Kind::kScalar;
    const bool starts_op = op_depth_ == 0 && AtOpsArray();
    std::string segment = NextSegment();
    if (starts_op) {
      op_.Reset();
      op_program_ = frames_[1].next_index - 1;
      op_index_ = frames_[3].next_index - 1;
    }
    const bool in_op = starts_op || op_depth_ > 0;
    if (!(in_op ? op_ : document_).Add(std::move(value), key_, container)) {
      return Fail(reader_.Fail(PathOf(segment), fmt::format("duplicate key {}", Quote(key_))));
    }
    if (container) {
      if (frames_.size() >= kMaxDepth) {
        return Fail(
            reader_.Fail(PathOf(segment), fmt::format("nested deeper than {} levels", kMaxDepth)));
      }
      frames_.push_back(Frame{kind == Kind::kArray, std::move(segment), 0});
      if (in_op) ++op_depth_;
      return true;
    }
    return starts_op ? FinishOp() : true;
  }

  bool End() {
    frames_.pop_back();
    if (op_depth_ > 0) {
      op_.End();
      return --op_depth_ == 0 ? FinishOp() : true;
    }
    document_.End();
    return true;
  }

  bool FinishOp() {
    const std::string path = fmt::format("/programs/{}/ops/{}", op_program_, op_index_);
    StatusOr<PendingOp> op = reader_.ParseOp(op_.root(), path);
    if (!op.ok()) return Fail(op.status());
    if (pending_.size() <= op_program_) pending_.resize(op_program_ + 1);
    // Refused while streaming, before the ops of a huge file are all in memory.
    if (pending_[op_program_].size() >= static_cast<size_t>(kMaxOpsPerProgram)) {
      return Fail(reader_.Fail(fmt::format("/programs/{}/ops", op_program_),
                               fmt::format("more than {} ops in one program (the limit)", kMaxOpsPerProgram)));
    }
    pending_[op_program_].push_back(std::move(op).value());
    op_.Reset();
    return true;
  }

  ScheduleReader& reader_;
  DomBuilder document_;
  DomBuilder op_;
  std::vector<Frame> frames_;
  std::string key_;
  size_t op_depth_ = 0;  // open containers of the op being built
  size_t op_program_ = 0, op_index_ = 0;
  std::vector<std::vector<PendingOp>> pending_;
  std::optional<Status> semantic_error_;
  std::optional<size_t> syntax_error_offset_;
  std::string syntax_error_text_;
};

template <typename Parse, typename LineColumnFn>
StatusOr<Schedule> RunScheduleSax(const std::string& source, Parse parse,
                                  LineColumnFn line_column) {
  ScheduleReader reader(source);
  ScheduleSax sax(reader);
  StatusOr<Schedule> schedule =
      Status::Internal(fmt::format("{}: schedule parser stopped without an error", source));
  try {
    if (parse(sax)) {
      schedule = reader.ParseDocument(sax.document(), sax.pending());
    } else if (sax.semantic_error()) {
      return *sax.semantic_error();
    } else if (sax.syntax_error_offset()) {
      return Status::InvalidInput(fmt::format("{}:{}: invalid JSON: {}", source,
                                              line_column(*sax.syntax_error_offset()),
                                              sax.syntax_error_text()));
    }
  } catch (const std::exception& e) {
    // Only allocation failures or a library bug can get here.
    return Status::InvalidInput(fmt::format("{}: cannot read schedule: {}", source, e.what()));
  }
  if (!schedule.ok()) return schedule;
  SHARDSCOPE_RETURN_IF_ERROR(schedule->ResolveBindings().WithContext(source));
  SHARDSCOPE_RETURN_IF_ERROR(ValidateSchedule(*schedule).WithContext(source));
  return schedule;
}

}  // namespace

StatusOr<Schedule> ParseScheduleJson(std::string_view text, const std::string& source) {
  return RunScheduleSax(
      source,
      [&](ScheduleSax& sax) {
        return Json::sax_parse(text.data(), text.data() + text.size(), &sax,
                               nlohmann::json::input_format_t::json, /*strict=*/true,
                               /*ignore_comments=*/true);
      },
      [&](size_t offset) { return LineColumn(text, offset); });
}

StatusOr<Schedule> ReadScheduleFile(const std::string& path) {
  std::vector<char> buffer(kFileBufferBytes);
  std::ifstream file;
  file.rdbuf()->pubsetbuf(buffer.data(), static_cast<std::streamsize>(buffer.size()));
  file.open(path, std::ios::binary);
  if (!file.is_open()) {
    return Status::IoError(fmt::format("cannot open '{}': {}", path, std::strerror(errno)));
  }
  return RunScheduleSax(
      path,
      [&](ScheduleSax& sax) {
        return Json::sax_parse(file, &sax, nlohmann::json::input_format_t::json,
                               /*strict=*/true, /*ignore_comments=*/true);
      },
      [&](size_t offset) { return LineColumnInFile(path, offset); });
}

}  // namespace shardscope::traces

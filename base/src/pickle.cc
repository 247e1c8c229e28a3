// The pickle reader: a restricted pickle virtual machine (the writer is pickle_writer.cc).
//
// Opcode semantics follow CPython's Lib/pickle.py (_Unpickler.load_*) and the opcode table in
// Lib/pickletools.py; the comments beside each case name the opcode.
#include "shardscope/base/pickle.h"

#include <bit>
#include <charconv>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <unordered_map>

#include <fmt/format.h>

#include "pickle_opcodes.h"

namespace shardscope::traces {

const PickleObject* PickleObject::Find(std::string_view key) const {
  if (kind != Kind::kDict) return nullptr;
  for (const auto& [k, v] : entries) {
    if (k->kind == Kind::kString && k->string_value == key) return v;
  }
  return nullptr;
}

std::string_view PickleObject::KindName() const {
  switch (kind) {
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kBytes: return "bytes";
    case Kind::kList: return "list";
    case Kind::kTuple: return "tuple";
    case Kind::kDict: return "dict";
  }
  return "?";
}

namespace {

using enum pickle_internal::Opcode;  // the opcode names, as Lib/pickle.py spells them

// The names of opcodes the reader rejects, for the error message.
std::string_view UnsupportedOpcodeName(uint8_t op) {
  switch (op) {
    case kPersId: return "PERSID";
    case kBinPersId: return "BINPERSID";
    case kReduce: return "REDUCE";
    case kString: return "STRING";
    case kUnicode: return "UNICODE";
    case kBuild: return "BUILD";
    case kGlobal: return "GLOBAL";
    case kInst: return "INST";
    case kObj: return "OBJ";
    case kNewObj: return "NEWOBJ";
    case kExt1: return "EXT1";
    case kExt2: return "EXT2";
    case kExt4: return "EXT4";
    case kEmptySet: return "EMPTY_SET";
    case kAddItems: return "ADDITEMS";
    case kFrozenSet: return "FROZENSET";
    case kNewObjEx: return "NEWOBJ_EX";
    case kStackGlobal: return "STACK_GLOBAL";
    case kByteArray8: return "BYTEARRAY8";
    case kNextBuffer: return "NEXT_BUFFER";
    case kReadOnlyBuffer: return "READONLY_BUFFER";
    default: return "";
  }
}

// True when `text` is well-formed UTF-8 (no overlong forms, no surrogates, <= U+10FFFF).
// Python's pickle decodes with "surrogatepass"; we stay strict because our JSON writers need
// valid UTF-8.
bool IsValidUtf8(std::string_view text) {
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    const auto c = static_cast<uint8_t>(text[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int length = 0;
    uint32_t min = 0;
    uint32_t cp = 0;
    if ((c & 0xE0) == 0xC0) {
      length = 2, min = 0x80, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      length = 3, min = 0x800, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      length = 4, min = 0x10000, cp = c & 0x07;
    } else {
      return false;
    }
    if (n - i < static_cast<size_t>(length)) return false;
    for (int k = 1; k < length; ++k) {
      const auto cc = static_cast<uint8_t>(text[i + static_cast<size_t>(k)]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += static_cast<size_t>(length);
  }
  return true;
}

}  // namespace

// One pass over the bytes; the stack and memo hold (object, arena index) pairs so that the
// depth of each object (kept beside the arena) is found without a pointer lookup.
class PickleParser {
  // Dicts up to this size deduplicate keys by a linear scan; larger ones get an index.
  static constexpr size_t kIndexedDictSize = 32;

 public:
  PickleParser(std::string_view bytes, std::string_view source)
      : bytes_(bytes), source_(source), doc_(std::make_unique<PickleDocument>()) {}

  StatusOr<std::unique_ptr<PickleDocument>> Run() {
    while (true) {
      if (pos_ >= bytes_.size()) {
        return Error(pos_, "the pickle ends without STOP (truncated file?)");
      }
      op_offset_ = pos_;
      const auto op = static_cast<uint8_t>(bytes_[pos_++]);
      if (op == kStop) {
        if (!marks_.empty()) return Error(op_offset_, "STOP with an unclosed MARK");
        if (stack_.size() != 1) {
          return Error(op_offset_, fmt::format("STOP with {} objects on the stack, expected 1",
                                               stack_.size()));
        }
        doc_->root_ = stack_.back().object;
        // Bytes after STOP are ignored, as pickle.loads ignores them.
        return std::move(doc_);
      }
      SHARDSCOPE_RETURN_IF_ERROR(Step(op));
    }
  }

 private:
  struct Ref {
    PickleObject* object = nullptr;
    int64_t id = 0;  // arena index, for depth_
  };

  Status Error(size_t offset, std::string what) const {
    return Status::InvalidInput(fmt::format("{}: byte {}: {}", source_, offset, what));
  }

  // Reads n raw bytes.
  StatusOr<std::string_view> Take(uint64_t n, std::string_view what) {
    if (n > bytes_.size() - pos_) {
      return Error(op_offset_, fmt::format("{} needs {} bytes, {} left (truncated file?)", what,
                                           n, bytes_.size() - pos_));
    }
    std::string_view out = bytes_.substr(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return out;
  }

  StatusOr<uint64_t> TakeUnsigned(int width, std::string_view what) {
    SHARDSCOPE_ASSIGN_OR_RETURN(std::string_view raw, Take(static_cast<uint64_t>(width), what));
    uint64_t value = 0;
    for (int i = width - 1; i >= 0; --i) {
      value = (value << 8) | static_cast<uint8_t>(raw[static_cast<size_t>(i)]);
    }
    return value;
  }

  // A text argument ending in '\n' (protocol 0 opcodes).
  StatusOr<std::string_view> TakeLine(std::string_view what) {
    const size_t end = bytes_.find('\n', pos_);
    if (end == std::string_view::npos) {
      return Error(op_offset_, fmt::format("{} has no terminating newline", what));
    }
    std::string_view line = bytes_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return line;
  }

  StatusOr<Ref> New(PickleObject::Kind kind) {
    if (static_cast<int64_t>(doc_->arena_.size()) >= kMaxPickleObjects) {
      return Error(op_offset_, fmt::format("more than {} objects", kMaxPickleObjects));
    }
    PickleObject& object = doc_->arena_.emplace_back();
    object.kind = kind;
    depth_.push_back(1);
    return Ref{&object, static_cast<int64_t>(doc_->arena_.size()) - 1};
  }

  Status Push(PickleObject::Kind kind) {
    SHARDSCOPE_ASSIGN_OR_RETURN(Ref ref, New(kind));
    stack_.push_back(ref);
    return Status::Ok();
  }

  StatusOr<Ref> PushScalar(PickleObject::Kind kind) {
    SHARDSCOPE_ASSIGN_OR_RETURN(Ref ref, New(kind));
    stack_.push_back(ref);
    return ref;
  }

  Status PushInt(int64_t value) {
    SHARDSCOPE_ASSIGN_OR_RETURN(Ref ref, PushScalar(PickleObject::Kind::kInt));
    ref.object->int_value = value;
    return Status::Ok();
  }

  Status PushString(std::string_view text, bool is_bytes, std::string_view opname) {
    if (!is_bytes && !IsValidUtf8(text)) {
      return Error(op_offset_, fmt::format("{} holds invalid UTF-8", opname));
    }
    SHARDSCOPE_ASSIGN_OR_RETURN(
        Ref ref, PushScalar(is_bytes ? PickleObject::Kind::kBytes : PickleObject::Kind::kString));
    ref.object->string_value.assign(text);
    return Status::Ok();
  }

  // The first stack index above the innermost MARK (popping that mark).
  StatusOr<size_t> PopMark(std::string_view opname) {
    if (marks_.empty()) return Error(op_offset_, fmt::format("{} without a MARK", opname));
    const size_t base = marks_.back();
    marks_.pop_back();
    return base;
  }

  // Records that `container` now holds `child`.
  Status Contain(const Ref& container, const Ref& child) {
    const int64_t child_depth = depth_[static_cast<size_t>(child.id)];
    int64_t& depth = depth_[static_cast<size_t>(container.id)];
    if (child_depth + 1 > depth) depth = child_depth + 1;
    if (depth > kMaxPickleDepth) {
      return Error(op_offset_, fmt::format("objects nested deeper than {} levels", kMaxPickleDepth));
    }
    return Status::Ok();
  }

  Status Require(size_t count, std::string_view opname) const {
    if (stack_.size() < count + (marks_.empty() ? 0 : marks_.back())) {
      return Error(op_offset_, fmt::format("{} needs {} object{} on the stack", opname, count,
                                           count == 1 ? "" : "s"));
    }
    return Status::Ok();
  }

  // Appends stack_[begin, end) to the list at `target`.
  Status AppendRange(const Ref& target, size_t begin, size_t end, std::string_view opname) {
    if (target.object->kind != PickleObject::Kind::kList) {
      return Error(op_offset_, fmt::format("{} on a {}, expected a list", opname,
                                           target.object->KindName()));
    }
    for (size_t i = begin; i < end; ++i) {
      SHARDSCOPE_RETURN_IF_ERROR(Contain(target, stack_[i]));
      target.object->items.push_back(stack_[i].object);
    }
    stack_.resize(begin);
    return Status::Ok();
  }

  // The key under which a dict deduplicates `key`, or "" for kinds it does not compare.
  static std::string DedupKey(const PickleObject& key) {
    if (key.kind == PickleObject::Kind::kString) {
      std::string out(1, 's');
      out.append(key.string_value);
      return out;
    }
    if (key.kind == PickleObject::Kind::kInt || key.kind == PickleObject::Kind::kBool) {
      // Python: True == 1 and hash(True) == hash(1), so they are the same key.
      const int64_t v = key.kind == PickleObject::Kind::kBool ? key.bool_value : key.int_value;
      std::string out(1, 'i');
      out.append(std::to_string(v));
      return out;
    }
    return "";
  }

  // Sets dict[key] = value with Python's semantics for a repeated str or int key.
  Status SetItem(const Ref& dict, const Ref& key, const Ref& value, std::string_view opname) {
    if (dict.object->kind != PickleObject::Kind::kDict) {
      return Error(op_offset_, fmt::format("{} on a {}, expected a dict", opname,
                                           dict.object->KindName()));
    }
    SHARDSCOPE_RETURN_IF_ERROR(Contain(dict, key));
    SHARDSCOPE_RETURN_IF_ERROR(Contain(dict, value));
    auto& entries = dict.object->entries;
    const std::string_view kind_ok = DedupKind(*key.object);
    if (!kind_ok.empty()) {
      if (entries.size() < kIndexedDictSize && dict_index_.count(dict.id) == 0) {
        // Small dicts (every dict in PyTorch's files): a linear scan, no allocation.
        for (auto& entry : entries) {
          if (SameKey(*entry.first, *key.object)) {
            entry.second = value.object;
            return Status::Ok();
          }
        }
      } else {
        // An index per large dict, so that a fuzzed dict of a million keys stays linear.
        auto& index = dict_index_[dict.id];
        if (index.empty()) {
          for (size_t i = 0; i < entries.size(); ++i) {
            const std::string k = DedupKey(*entries[i].first);
            if (!k.empty()) index.emplace(k, i);
          }
        }
        auto [it, inserted] = index.emplace(DedupKey(*key.object), entries.size());
        if (!inserted) {
          entries[it->second].second = value.object;
          return Status::Ok();
        }
      }
    }
    entries.emplace_back(key.object, value.object);
    return Status::Ok();
  }

  // Non-empty for the key kinds a dict deduplicates (str, int, bool).
  static std::string_view DedupKind(const PickleObject& key) {
    switch (key.kind) {
      case PickleObject::Kind::kString: return "s";
      case PickleObject::Kind::kInt:
      case PickleObject::Kind::kBool: return "i";
      default: return "";
    }
  }

  static bool SameKey(const PickleObject& a, const PickleObject& b) {
    using Kind = PickleObject::Kind;
    if (a.kind == Kind::kString || b.kind == Kind::kString) {
      return a.kind == b.kind && a.string_value == b.string_value;
    }
    const auto number = [](const PickleObject& o) -> std::optional<int64_t> {
      if (o.kind == Kind::kInt) return o.int_value;
      if (o.kind == Kind::kBool) return o.bool_value ? 1 : 0;
      return std::nullopt;
    };
    const auto x = number(a), y = number(b);
    return x && y && *x == *y;
  }

  // The memo: indices are dense in what picklers write (0, 1, 2, ...), so a vector holds them;
  // an index far beyond the puts seen so far (a hostile LONG_BINPUT 4000000000) goes to a
  // hash map instead of growing the vector.
  Ref* MemoSlot(uint64_t index) {
    if (index < memo_dense_.size()) {
      return memo_dense_[index].object != nullptr ? &memo_dense_[index] : nullptr;
    }
    auto it = memo_sparse_.find(index);
    return it == memo_sparse_.end() ? nullptr : &it->second;
  }

  Status Memo(uint64_t index) {
    if (stack_.empty() || (!marks_.empty() && stack_.size() == marks_.back())) {
      return Error(op_offset_, "a memo put with nothing on the stack");
    }
    if (Ref* slot = MemoSlot(index)) {
      *slot = stack_.back();
      return Status::Ok();
    }
    ++memo_count_;
    if (index < memo_dense_.size() || index < 4 * memo_count_ + 1024) {
      if (index >= memo_dense_.size()) memo_dense_.resize(index + 1);
      memo_dense_[index] = stack_.back();
      memo_sparse_.erase(index);
    } else {
      memo_sparse_[index] = stack_.back();
    }
    return Status::Ok();
  }

  Status Get(uint64_t index) {
    const Ref* slot = MemoSlot(index);
    if (slot == nullptr) return Error(op_offset_, fmt::format("memo index {} was never stored", index));
    stack_.push_back(*slot);
    return Status::Ok();
  }

  StatusOr<uint64_t> ParseDecimalIndex(std::string_view line, std::string_view opname) {
    uint64_t value = 0;
    auto [ptr, ec] = std::from_chars(line.data(), line.data() + line.size(), value);
    if (ec != std::errc() || ptr != line.data() + line.size()) {
      return Error(op_offset_, fmt::format("{} argument '{}' is not a memo index", opname, line));
    }
    return value;
  }

  // LONG1 / LONG4: little-endian two's complement (pickle.decode_long). A 9-byte encoding
  // whose sign byte is 0 holds a value in [2^63, 2^64): a C++ uint64_t that PyTorch handed to
  // Python (a snapshot frame's unknown line is size_t(-1) = 2^64 - 1). It is read modulo 2^64,
  // which gives back the C++ bits (-1); anything wider is an error.
  Status PushLong(std::string_view raw, std::string_view opname) {
    const bool unsigned_64 = raw.size() == 9 && raw[8] == 0;
    if (raw.size() > 8 && !unsigned_64) {
      return Error(op_offset_, fmt::format("{} integer of {} bytes does not fit 64 bits", opname,
                                           raw.size()));
    }
    if (unsigned_64) raw = raw.substr(0, 8);
    uint64_t value = 0;
    for (size_t i = raw.size(); i > 0; --i) value = (value << 8) | static_cast<uint8_t>(raw[i - 1]);
    if (!unsigned_64 && !raw.empty() && raw.size() < 8 && (static_cast<uint8_t>(raw.back()) & 0x80) != 0) {
      value |= ~uint64_t{0} << (8 * raw.size());  // sign-extend
    }
    return PushInt(static_cast<int64_t>(value));
  }

  Status PushTuple(size_t begin) {
    SHARDSCOPE_ASSIGN_OR_RETURN(Ref tuple, New(PickleObject::Kind::kTuple));
    for (size_t i = begin; i < stack_.size(); ++i) {
      SHARDSCOPE_RETURN_IF_ERROR(Contain(tuple, stack_[i]));
      tuple.object->items.push_back(stack_[i].object);
    }
    stack_.resize(begin);
    stack_.push_back(tuple);
    return Status::Ok();
  }

  Status Step(uint8_t op) {
    using Kind = PickleObject::Kind;
    switch (op) {
      case kProto: {  // PROTO: 1-byte protocol number
        SHARDSCOPE_ASSIGN_OR_RETURN(uint64_t protocol, TakeUnsigned(1, "PROTO"));
        if (protocol > 5) {
          return Error(op_offset_, fmt::format("pickle protocol {} is not supported (0-5)",
                                               protocol));
        }
        return Status::Ok();
      }
      case kFrame: {  // FRAME: 8-byte length of the frame that follows; read in place
        SHARDSCOPE_ASSIGN_OR_RETURN(uint64_t length, TakeUnsigned(8, "FRAME"));
        if (length > bytes_.size() - pos_) {
          return Error(op_offset_, fmt::format("FRAME of {} bytes but {} left (truncated file?)",
                                               length, bytes_.size() - pos_));
        }
        return Status::Ok();
      }
      case kMark:
        marks_.push_back(stack_.size());
        return Status::Ok();
      case kPop:
        if (!marks_.empty() && stack_.size() == marks_.back()) {
          marks_.pop_back();  // Lib/pickle.py load_pop: POP on an empty frame pops the mark
          return Status::Ok();
        }
        SHARDSCOPE_RETURN_IF_ERROR(Require(1, "POP"));
        stack_.pop_back();
        return Status::Ok();
      case kPopMark: {
        SHARDSCOPE_ASSIGN_OR_RETURN(size_t base, PopMark("POP_MARK"));
        stack_.resize(base);
        return Status::Ok();
      }
      case kDup:
        SHARDSCOPE_RETURN_IF_ERROR(Require(1, "DUP"));
        stack_.push_back(stack_.back());
        return Status::Ok();
      case kNone:
        return Push(Kind::kNone);
      case kNewTrue:
      case kNewFalse: {
        SHARDSCOPE_ASSIGN_OR_RETURN(Ref ref, PushScalar(Kind::kBool));
        ref.object->bool_value = op == kNewTrue;
        return Status::Ok();
      }
      case kBinInt: {  // 4-byte signed little-endian
        SHARDSCOPE_ASSIGN_OR_RETURN(uint64_t raw, TakeUnsigned(4, "BININT"));
        return PushInt(static_cast<int32_t>(static_cast<uint32_t>(raw)));
      }
      case kBinInt1: {
        SHARDSCOPE_ASSIGN_OR_RETURN(uint64_t raw, TakeUnsigned(1, "BININT1"));
        return PushInt(static_cast<int64_t>(raw));
      }
      case kBinInt2: {
        SHARDSCOPE_ASSIGN_OR_RETURN(uint64_t raw, TakeUnsigned(2, "BININT2"));
        return PushInt(static_cast<int64_t>(raw));
      }
      case kLong1: {
        SHARDSCOPE_ASSIGN_OR_RETURN(uint64_t n, TakeUnsigned(1, "LONG1"));
        SHARDSCOPE_ASSIGN_OR_RETURN(std::string_view raw, Take(n, "LONG1"));
        return PushLong(raw, "LONG1");
      }
      case kLong4: {
        SHARDSCOPE_ASSIGN_OR_RETURN(uint64_t n, TakeUnsigned(4, "LONG4"));
        if (n & 0x80000000u) return Error(op_offset_, "LONG4 with a negative byte count");
        SHARDSCOPE_ASSIGN_OR_RETURN(std::string_view raw, Take(n, "LONG4"));
        return PushLong(raw, "LONG4");
      }
      case kInt:     // INT: decimal text; "01" and "00" are True and False (protocol 0)
      case kLong: {  // LONG: decimal text with an optional trailing 'L'
        SHARDSCOPE_ASSIGN_OR_RETURN(std::string_view line, TakeLine(op == kInt ? "INT" : "LONG"));
        if (op == kInt && (line == "01" || line == "00")) {
          SHARDSCOPE_ASSIGN_OR_RETURN(Ref ref, PushScalar(Kind::kBool));
          ref.object->bool_value = line == "01";
          return Status::Ok();
        }
        std::string_view digits = line;
        if (op == kLong && !digits.empty() && digits.back() == 'L') digits.remove_suffix(1);
        if (!digits.empty() && digits.front() == '+') digits.remove_prefix(1);
        int64_t value = 0;
        auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
        if (ec == std::errc::result_out_of_range) {
          return Error(op_offset_, fmt::format("integer {} does not fit 64 bits", line));
        }
        if (ec != std::errc() || ptr != digits.data() + digits.size() || digits.empty()) {
          return Error(op_offset_, fmt::format("'{}' is not an integer", line));
        }
        return PushInt(value);
      }
      case kBinFloat: {  // 8-byte big-endian IEEE double
        SHARDSCOPE_ASSIGN_OR_RETURN(std::string_view raw, Take(8, "BINFLOAT"));
        uint64_t bits = 0;
        for (char c : raw) bits = (bits << 8) | static_cast<uint8_t>(c);
        SHARDSCOPE_ASSIGN_OR_RETURN(Ref ref, PushScalar(Kind::kFloat));
        ref.object->float_value = std::bit_cast<double>(bits);
        return Status::Ok();
      }
      case kFloat: {  // FLOAT: repr() text
        SHARDSCOPE_ASSIGN_OR_RETURN(std::string_view line, TakeLine("FLOAT"));
        double value = 0;
        auto [ptr, ec] = std::from_chars(line.data(), line.data() + line.size(), value);
        if (ec != std::errc() || ptr != line.data() + line.size() || line.empty()) {
          return Error(op_offset_, fmt::format("'{}' is not a float", line));
        }
        SHARDSCOPE_ASSIGN_OR_RETURN(Ref ref, PushScalar(Kind::kFloat));
        ref.object->float_value = value;
        return Status::Ok();
      }
      case kShortBinUnicode:
      case kShortBinString:
      case kShortBinBytes: {
        const std::string_view name = op == kShortBinUnicode  ? "SHORT_BINUNICODE"
                                      : op == kShortBinString ? "SHORT_BINSTRING"
                                                              : "SHORT_BINBYTES";
        SHARDSCOPE_ASSIGN_OR_RETURN(uint64_t n, TakeUnsigned(1, name));
        SHARDSCOPE_ASSIGN_OR_RETURN(std::string_view raw, Take(n, name));
        return PushString(raw, op == kShortBinBytes, name);
      }
      case kBinUnicode:
      case kBinString:
      case kBinBytes: {
        const std::string_view name = op == kBinUnicode  ? "BINUNICODE"
                                      : op == kBinString ? "BINSTRING"
                                                         : "BINBYTES";
        SHARDSCOPE_ASSIGN_OR_RETURN(uint64_t n, TakeUnsigned(4, name));
        if (op == kBinString && (n & 0x80000000u)) {
          return Error(op_offset_, "BINSTRING with a negative length");
        }
        SHARDSCOPE_ASSIGN_OR_RETURN(std::string_view raw, Take(n, name));
        return PushString(raw, op == kBinBytes, name);
      }
      case kBinUnicode8:
      case kBinBytes8: {
        const std::string_view name = op == kBinUnicode8 ? "BINUNICODE8" : "BINBYTES8";
        SHARDSCOPE_ASSIGN_OR_RETURN(uint64_t n, TakeUnsigned(8, name));
        SHARDSCOPE_ASSIGN_OR_RETURN(std::string_view raw, Take(n, name));
        return PushString(raw, op == kBinBytes8, name);
      }
      case kEmptyDict:
        return Push(Kind::kDict);
      case kEmptyList:
        return Push(Kind::kList);
      case kEmptyTuple:
        return Push(Kind::kTuple);
      case kDict: {  // DICT: MARK k v k v ... DICT
        SHARDSCOPE_ASSIGN_OR_RETURN(size_t base, PopMark("DICT"));
        if ((stack_.size() - base) % 2 != 0) {
          return Error(op_offset_, "DICT with an odd number of objects after MARK");
        }
        SHARDSCOPE_ASSIGN_OR_RETURN(Ref dict, New(Kind::kDict));
        for (size_t i = base; i < stack_.size(); i += 2) {
          SHARDSCOPE_RETURN_IF_ERROR(SetItem(dict, stack_[i], stack_[i + 1], "DICT"));
        }
        stack_.resize(base);
        stack_.push_back(dict);
        return Status::Ok();
      }
      case kList: {  // LIST: MARK items... LIST
        SHARDSCOPE_ASSIGN_OR_RETURN(size_t base, PopMark("LIST"));
        SHARDSCOPE_ASSIGN_OR_RETURN(Ref list, New(Kind::kList));
        SHARDSCOPE_RETURN_IF_ERROR(AppendRange(list, base, stack_.size(), "LIST"));
        stack_.push_back(list);
        return Status::Ok();
      }
      case kTuple: {
        SHARDSCOPE_ASSIGN_OR_RETURN(size_t base, PopMark("TUPLE"));
        return PushTuple(base);
      }
      case kTuple1:
      case kTuple2:
      case kTuple3: {
        const size_t n = static_cast<size_t>(op - kTuple1) + 1;
        const std::string_view name = op == kTuple1 ? "TUPLE1" : op == kTuple2 ? "TUPLE2" : "TUPLE3";
        SHARDSCOPE_RETURN_IF_ERROR(Require(n, name));
        return PushTuple(stack_.size() - n);
      }
      case kAppend: {  // list value APPEND
        SHARDSCOPE_RETURN_IF_ERROR(Require(2, "APPEND"));
        const Ref list = stack_[stack_.size() - 2];
        return AppendRange(list, stack_.size() - 1, stack_.size(), "APPEND");
      }
      case kAppends: {  // list MARK items... APPENDS
        SHARDSCOPE_ASSIGN_OR_RETURN(size_t base, PopMark("APPENDS"));
        if (base == 0 || (!marks_.empty() && base <= marks_.back())) {
          return Error(op_offset_, "APPENDS with no list below its MARK");
        }
        const Ref list = stack_[base - 1];
        return AppendRange(list, base, stack_.size(), "APPENDS");
      }
      case kSetItem: {  // dict key value SETITEM
        SHARDSCOPE_RETURN_IF_ERROR(Require(3, "SETITEM"));
        const size_t n = stack_.size();
        SHARDSCOPE_RETURN_IF_ERROR(SetItem(stack_[n - 3], stack_[n - 2], stack_[n - 1], "SETITEM"));
        stack_.resize(n - 2);
        return Status::Ok();
      }
      case kSetItems: {  // dict MARK k v k v ... SETITEMS
        SHARDSCOPE_ASSIGN_OR_RETURN(size_t base, PopMark("SETITEMS"));
        if (base == 0 || (!marks_.empty() && base <= marks_.back())) {
          return Error(op_offset_, "SETITEMS with no dict below its MARK");
        }
        if ((stack_.size() - base) % 2 != 0) {
          return Error(op_offset_, "SETITEMS with an odd number of objects after MARK");
        }
        const Ref dict = stack_[base - 1];
        for (size_t i = base; i < stack_.size(); i += 2) {
          SHARDSCOPE_RETURN_IF_ERROR(SetItem(dict, stack_[i], stack_[i + 1], "SETITEMS"));
        }
        stack_.resize(base);
        return Status::Ok();
      }
      case kBinPut: {
        SHARDSCOPE_ASSIGN_OR_RETURN(uint64_t index, TakeUnsigned(1, "BINPUT"));
        return Memo(index);
      }
      case kLongBinPut: {
        SHARDSCOPE_ASSIGN_OR_RETURN(uint64_t index, TakeUnsigned(4, "LONG_BINPUT"));
        return Memo(index);
      }
      case kMemoize:  // MEMOIZE: the next index is the memo's size (Lib/pickle.py load_memoize)
        return Memo(memo_count_);
      case kPut: {
        SHARDSCOPE_ASSIGN_OR_RETURN(std::string_view line, TakeLine("PUT"));
        SHARDSCOPE_ASSIGN_OR_RETURN(uint64_t index, ParseDecimalIndex(line, "PUT"));
        return Memo(index);
      }
      case kBinGet: {
        SHARDSCOPE_ASSIGN_OR_RETURN(uint64_t index, TakeUnsigned(1, "BINGET"));
        return Get(index);
      }
      case kLongBinGet: {
        SHARDSCOPE_ASSIGN_OR_RETURN(uint64_t index, TakeUnsigned(4, "LONG_BINGET"));
        return Get(index);
      }
      case kGet: {
        SHARDSCOPE_ASSIGN_OR_RETURN(std::string_view line, TakeLine("GET"));
        SHARDSCOPE_ASSIGN_OR_RETURN(uint64_t index, ParseDecimalIndex(line, "GET"));
        return Get(index);
      }
      default:
        break;
    }
    const std::string_view name = UnsupportedOpcodeName(op);
    if (!name.empty()) {
      return Error(op_offset_, fmt::format("opcode {} (0x{:02x}) is not supported: only plain "
                                           "objects (None, bool, int, float, str, bytes, list, "
                                           "tuple, dict) are read",
                                           name, op));
    }
    return Error(op_offset_, fmt::format("0x{:02x} is not a pickle opcode", op));
  }

  std::string_view bytes_;
  std::string_view source_;
  std::unique_ptr<PickleDocument> doc_;
  size_t pos_ = 0;
  size_t op_offset_ = 0;
  std::vector<Ref> stack_;
  std::vector<size_t> marks_;                 // stack sizes at each open MARK
  std::vector<int64_t> depth_;                // per arena index: levels of nesting, 1 for a leaf
  std::vector<Ref> memo_dense_;               // index -> object (object nullptr: unset)
  std::unordered_map<uint64_t, Ref> memo_sparse_;  // far indices (lookups only, never iterated)
  uint64_t memo_count_ = 0;                   // distinct indices stored (MEMOIZE's next index)
  std::unordered_map<int64_t, std::unordered_map<std::string, size_t>> dict_index_;
};

StatusOr<std::unique_ptr<PickleDocument>> ParsePickle(std::string_view bytes,
                                                      std::string_view source) {
  PickleParser parser(bytes, source);
  return parser.Run();
}

StatusOr<std::unique_ptr<PickleDocument>> ReadPickleFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file.is_open()) return Status::IoError(fmt::format("cannot open '{}'", path));
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) return Status::IoError(fmt::format("reading '{}' failed", path));
  return ParsePickle(text.str(), path);
}

}  // namespace shardscope::traces

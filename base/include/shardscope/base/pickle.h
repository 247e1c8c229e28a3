// Python pickles of plain objects: a reader and a writer, for the files PyTorch writes with
// pickle.dump (NCCL Flight Recorder dumps, torch.cuda.memory._dump_snapshot snapshots).
//
// Reading:
//
//   SHARDSCOPE_ASSIGN_OR_RETURN(std::unique_ptr<PickleDocument> doc, ReadPickleFile(path));
//   const PickleObject* entries = doc->root().Find("entries");   // nullptr when absent
//   if (entries != nullptr && entries->kind == PickleObject::Kind::kList) ...
//
// The reader is a pickle virtual machine restricted to plain objects: None, bool, int (must fit
// int64; a LONG1/LONG4 value in [2^63, 2^64), a C++ uint64_t such as a snapshot frame's unknown
// line SIZE_MAX, is read modulo 2^64, i.e. as the C++ bits: SIZE_MAX -> -1), float, str, bytes,
// list, tuple and dict, protocols 0-5. Supported opcodes:
//   framing  PROTO (protocol <= 5), FRAME (length checked, contents read in place), STOP
//   stack    MARK, POP, POP_MARK, DUP
//   scalars  NONE, NEWTRUE, NEWFALSE, BININT, BININT1, BININT2, LONG1, LONG4, INT, LONG,
//            BINFLOAT, FLOAT
//   strings  BINUNICODE, SHORT_BINUNICODE, BINUNICODE8 (UTF-8, validated), BINSTRING,
//            SHORT_BINSTRING (protocol 0-1 byte strings, read as str), BINBYTES,
//            SHORT_BINBYTES, BINBYTES8
//   containers EMPTY_DICT, DICT, SETITEM, SETITEMS, EMPTY_LIST, LIST, APPEND, APPENDS,
//            EMPTY_TUPLE, TUPLE, TUPLE1, TUPLE2, TUPLE3
//   memo     PUT, BINPUT, LONG_BINPUT, MEMOIZE, GET, BINGET, LONG_BINGET
// Everything else (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, NEWOBJ, PERSID, sets, buffers, ...)
// is rejected with an error naming the opcode and its byte offset: such a pickle would make
// Python import and call code, which a trace reader never needs.
//
// Objects live in an arena owned by the PickleDocument and refer to each other by pointer. A
// memoized object fetched again (BINGET) is the same object, never a copy: a memory snapshot
// shares one frame dict among hundreds of thousands of blocks. A pickle may therefore describe
// a cyclic graph (a list that contains itself); it is accepted, as Python accepts it, and
// cannot leak, but a consumer that walks the tree generically must bound its own walk (the
// consumers in this project look up known keys and never recurse on data).
//
// Limits, each an error rather than a crash: kMaxPickleDepth levels of nesting (counted as
// objects are built), kMaxPickleObjects objects. Every error is kInvalidInput and reads
// "<source>: byte <offset>: <what>", the offset being the opcode's.
//
// Writing: a PickleValue tree serialized as protocol 2 (the PROTO 2 header, EMPTY_DICT /
// SETITEMS, EMPTY_LIST / APPENDS, EMPTY_TUPLE / TUPLE1-3 / TUPLE, BININT1 / BININT2 / BININT
// / LONG1, BINFLOAT, BINUNICODE, NEWTRUE / NEWFALSE, NONE, STOP; no memo), which
// Python's pickle.load and PyTorch's tools (memory_viz, fr_trace) read.
//
//   PickleValue dump = PickleValue::Dict();
//   dump.Add("version", PickleValue::String("2.9"));
//   dump.Add("entries", PickleValue::List({PickleValue::Int(1), PickleValue::None()}));
//   std::string bytes = WritePickle(dump);
#ifndef SHARDSCOPE_BASE_PICKLE_H_
#define SHARDSCOPE_BASE_PICKLE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardscope/base/status.h"

namespace shardscope::traces {

// Nesting deeper than this is an error (PyTorch's files nest fewer than ten levels).
inline constexpr int kMaxPickleDepth = 1000;
// More objects than this is an error (a 16-GPU memory snapshot holds a few million).
inline constexpr int64_t kMaxPickleObjects = int64_t{1} << 28;

// One Python object from a pickle. Owned by its PickleDocument; pointers stay valid while it
// lives.
struct PickleObject {
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kBytes, kList, kTuple, kDict };
  Kind kind = Kind::kNone;
  bool bool_value = false;
  int64_t int_value = 0;
  double float_value = 0;
  std::string string_value;                // kString (UTF-8) and kBytes
  std::vector<const PickleObject*> items;  // kList, kTuple
  // kDict, in insertion order. A key set twice keeps its first position and its last value,
  // as in Python, for str and int keys; keys of other kinds are not compared.
  std::vector<std::pair<const PickleObject*, const PickleObject*>> entries;

  // Dict lookup by string key: the value, or nullptr when absent or when this is not a dict.
  // Linear in the number of entries.
  const PickleObject* Find(std::string_view key) const;
  // "NoneType", "bool", "int", "float", "str", "bytes", "list", "tuple", "dict": Python's
  // type names, for error messages.
  std::string_view KindName() const;
};

// A parsed pickle: the root object and the arena that owns every object.
class PickleDocument {
 public:
  PickleDocument() = default;
  PickleDocument(const PickleDocument&) = delete;
  PickleDocument& operator=(const PickleDocument&) = delete;

  const PickleObject& root() const { return *root_; }
  // Number of distinct objects built (a memo fetch does not build one).
  int64_t object_count() const { return static_cast<int64_t>(arena_.size()); }

 private:
  friend class PickleParser;
  std::deque<PickleObject> arena_;  // a deque: growing it never moves an object
  const PickleObject* root_ = nullptr;
};

// Parses `bytes` (the whole file). `source` names the file in error messages.
StatusOr<std::unique_ptr<PickleDocument>> ParsePickle(std::string_view bytes,
                                                      std::string_view source);
// Reads and parses the file at `path` (kIoError when it cannot be read).
StatusOr<std::unique_ptr<PickleDocument>> ReadPickleFile(const std::string& path);

// A value tree to write. Value semantics: copies are deep.
//   PickleValue::None(), Bool(b), Int(i), Float(d), String(s): scalars;
//   List(items), Tuple(items): sequences, extended with Append(value);
//   Dict(): an empty dict, extended with Add(key, value) (kept in call order; keys are not
//   deduplicated, so a repeated key reads back with its last value).
// Append and Add return *this, so calls chain.
class PickleValue {
 public:
  using Kind = PickleObject::Kind;

  PickleValue() = default;  // None
  static PickleValue None() { return PickleValue(); }
  static PickleValue Bool(bool value);
  static PickleValue Int(int64_t value);
  static PickleValue Float(double value);
  static PickleValue String(std::string value);
  static PickleValue List(std::vector<PickleValue> items = {});
  static PickleValue Tuple(std::vector<PickleValue> items = {});
  static PickleValue Dict();

  PickleValue& Append(PickleValue value);                 // List, Tuple
  PickleValue& Add(PickleValue key, PickleValue value);   // Dict
  PickleValue& Add(std::string key, PickleValue value) {  // Dict, str key
    return Add(String(std::move(key)), std::move(value));
  }

  Kind kind() const { return kind_; }
  bool bool_value() const { return bool_value_; }
  int64_t int_value() const { return int_value_; }
  double float_value() const { return float_value_; }
  const std::string& string_value() const { return string_value_; }
  const std::vector<PickleValue>& items() const { return items_; }
  const std::vector<std::pair<PickleValue, PickleValue>>& entries() const { return entries_; }

 private:
  Kind kind_ = Kind::kNone;
  bool bool_value_ = false;
  int64_t int_value_ = 0;
  double float_value_ = 0;
  std::string string_value_;
  std::vector<PickleValue> items_;
  std::vector<std::pair<PickleValue, PickleValue>> entries_;
};

// Serializes `value` as a protocol-2 pickle (see the top of this file).
std::string WritePickle(const PickleValue& value);

}  // namespace shardscope::traces

#endif  // SHARDSCOPE_BASE_PICKLE_H_

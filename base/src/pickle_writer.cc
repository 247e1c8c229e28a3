// The protocol-2 pickle writer (the reader is pickle.cc). Opcode choices follow CPython's
// Lib/pickle.py (_Pickler.save_*).
#include "shardscope/base/pickle.h"

#include <bit>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "pickle_opcodes.h"

namespace shardscope::traces {

PickleValue PickleValue::Bool(bool value) {
  PickleValue v;
  v.kind_ = Kind::kBool;
  v.bool_value_ = value;
  return v;
}

PickleValue PickleValue::Int(int64_t value) {
  PickleValue v;
  v.kind_ = Kind::kInt;
  v.int_value_ = value;
  return v;
}

PickleValue PickleValue::Float(double value) {
  PickleValue v;
  v.kind_ = Kind::kFloat;
  v.float_value_ = value;
  return v;
}

PickleValue PickleValue::String(std::string value) {
  PickleValue v;
  v.kind_ = Kind::kString;
  v.string_value_ = std::move(value);
  return v;
}

PickleValue PickleValue::List(std::vector<PickleValue> items) {
  PickleValue v;
  v.kind_ = Kind::kList;
  v.items_ = std::move(items);
  return v;
}

PickleValue PickleValue::Tuple(std::vector<PickleValue> items) {
  PickleValue v;
  v.kind_ = Kind::kTuple;
  v.items_ = std::move(items);
  return v;
}

PickleValue PickleValue::Dict() {
  PickleValue v;
  v.kind_ = Kind::kDict;
  return v;
}

PickleValue& PickleValue::Append(PickleValue value) {
  items_.push_back(std::move(value));
  return *this;
}

PickleValue& PickleValue::Add(PickleValue key, PickleValue value) {
  entries_.emplace_back(std::move(key), std::move(value));
  return *this;
}

namespace {

using enum pickle_internal::Opcode;

void PutLittleEndian(std::string& out, uint64_t value, int width) {
  for (int i = 0; i < width; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

// Lib/pickle.py _Pickler.save_long (protocol >= 2): BININT1, BININT2, BININT, else LONG1 with
// the shortest little-endian two's complement.
void WriteInt(std::string& out, int64_t value) {
  if (value >= 0 && value <= 0xFF) {
    out.push_back(static_cast<char>(kBinInt1));
    PutLittleEndian(out, static_cast<uint64_t>(value), 1);
  } else if (value >= 0 && value <= 0xFFFF) {
    out.push_back(static_cast<char>(kBinInt2));
    PutLittleEndian(out, static_cast<uint64_t>(value), 2);
  } else if (value >= INT32_MIN && value <= INT32_MAX) {
    out.push_back(static_cast<char>(kBinInt));
    PutLittleEndian(out, static_cast<uint64_t>(value), 4);
  } else {
    int n = 8;  // drop bytes while the next lower byte's sign bit repeats them
    const auto u = static_cast<uint64_t>(value);
    while (n > 1) {
      const uint8_t top = static_cast<uint8_t>(u >> (8 * (n - 1)));
      const bool next_sign = ((u >> (8 * (n - 2) + 7)) & 1) != 0;
      if ((top == 0x00 && !next_sign) || (top == 0xFF && next_sign)) {
        --n;
      } else {
        break;
      }
    }
    out.push_back(static_cast<char>(kLong1));
    out.push_back(static_cast<char>(n));
    PutLittleEndian(out, u, n);
  }
}

void WriteValue(std::string& out, const PickleValue& value) {
  using Kind = PickleValue::Kind;
  switch (value.kind()) {
    case Kind::kNone:
      out.push_back(static_cast<char>(kNone));
      return;
    case Kind::kBool:
      out.push_back(static_cast<char>(value.bool_value() ? kNewTrue : kNewFalse));
      return;
    case Kind::kInt:
      WriteInt(out, value.int_value());
      return;
    case Kind::kFloat: {
      out.push_back(static_cast<char>(kBinFloat));
      const auto bits = std::bit_cast<uint64_t>(value.float_value());
      for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
      return;
    }
    case Kind::kString:
    case Kind::kBytes:  // not constructible; written as str if it ever is
      out.push_back(static_cast<char>(kBinUnicode));
      PutLittleEndian(out, value.string_value().size(), 4);
      out += value.string_value();
      return;
    case Kind::kList:
      out.push_back(static_cast<char>(kEmptyList));
      if (!value.items().empty()) {
        out.push_back(static_cast<char>(kMark));
        for (const PickleValue& item : value.items()) WriteValue(out, item);
        out.push_back(static_cast<char>(kAppends));
      }
      return;
    case Kind::kTuple: {
      const size_t n = value.items().size();
      if (n == 0) {
        out.push_back(static_cast<char>(kEmptyTuple));
        return;
      }
      if (n > 3) out.push_back(static_cast<char>(kMark));
      for (const PickleValue& item : value.items()) WriteValue(out, item);
      out.push_back(static_cast<char>(n == 1 ? kTuple1 : n == 2 ? kTuple2 : n == 3 ? kTuple3 : kTuple));
      return;
    }
    case Kind::kDict:
      out.push_back(static_cast<char>(kEmptyDict));
      if (!value.entries().empty()) {
        out.push_back(static_cast<char>(kMark));
        for (const auto& [k, v] : value.entries()) {
          WriteValue(out, k);
          WriteValue(out, v);
        }
        out.push_back(static_cast<char>(kSetItems));
      }
      return;
  }
}

}  // namespace

std::string WritePickle(const PickleValue& value) {
  std::string out;
  out.push_back(static_cast<char>(kProto));
  out.push_back(2);
  WriteValue(out, value);
  out.push_back(static_cast<char>(kStop));
  return out;
}

}  // namespace shardscope::traces
// The fast scanner for event lines in ChromeTraceWriter's layout (see the header). It is a
// strict JSON lexer for one compact object: it never accepts what nlohmann's parser would
// reject, and what it accepts it reports exactly as nlohmann's SAX interface would (the same
// strings, integers, number texts and doubles), so the SAX handler's conversion applies as is.
#include "chrome_trace_fast_reader.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <system_error>

namespace shardscope::traces::trace_internal {
namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void AppendUtf8(std::string& out, uint32_t code_point) {
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else if (code_point < 0x800) {
    out += static_cast<char>(0xC0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else {  // below U+10000: surrogates are refused before this
    out += static_cast<char>(0xE0 | (code_point >> 12));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  }
}

class LineScanner {
 public:
  explicit LineScanner(std::string_view line) : s_(line) {}

  bool Event(RawEvent& event) {
    event.Clear();
    if (!Take('{')) return false;
    if (Peek() == '}') return false;  // an event without "ph": let the SAX reader say so
    std::array<bool, kFieldCount> seen{};
    bool seen_args = false;
    while (true) {
      std::string_view key;
      if (!KeyView(key) || !Take(':')) return false;
      if (key == "args") {
        if (seen_args || Peek() != '{') return false;
        seen_args = true;
        if (!Args(event)) return false;
      } else {
        size_t field = 0;
        while (field < kFieldCount && kFieldKeys[field] != key) ++field;
        RawValue value;
        // Top-level doubles are read from their text (timestamps, ids): not computed here.
        if (!Scalar(value, /*compute_double=*/false) || value.type == RawValue::Type::kNull) return false;
        if (field < kFieldCount) {
          if (seen[field]) return false;  // duplicate keys: the SAX reader's last-one-wins
          seen[field] = true;
          event.fields[field] = std::move(value);
        }
      }
      if (Take(',')) continue;
      return Take('}') && pos_ == s_.size();
    }
  }

 private:
  char Peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  bool Take(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  bool Args(RawEvent& event) {
    Take('{');
    if (Take('}')) return true;
    while (true) {
      std::string_view key;
      if (!KeyView(key) || !Take(':')) return false;
      RawValue value;
      if (!Scalar(value, /*compute_double=*/true)) return false;
      // The SAX reader drops null args (a non-finite double was written as null).
      if (value.type != RawValue::Type::kNull) event.args.emplace_back(std::string(key), std::move(value));
      if (Take(',')) continue;
      return Take('}');
    }
  }

  // A key without escapes, as a view into the line (keys we care about never need one).
  bool KeyView(std::string_view& key) {
    if (!Take('"')) return false;
    const size_t start = pos_;
    while (pos_ < s_.size()) {
      pos_ += PlainRunLength(s_.data() + pos_, s_.size() - pos_);
      if (pos_ == s_.size()) break;
      const auto c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        key = s_.substr(start, pos_ - start);
        ++pos_;
        return true;
      }
      if (c == '\\' || c < 0x20) return false;
      const size_t length = Utf8SequenceLength(s_, pos_);  // c >= 0x80
      if (length == 0) return false;
      pos_ += length;
    }
    return false;
  }

  bool String(std::string& out) {
    ++pos_;  // the opening quote
    out.clear();
    size_t run = pos_;  // start of the bytes not yet copied
    while (pos_ < s_.size()) {
      pos_ += PlainRunLength(s_.data() + pos_, s_.size() - pos_);
      if (pos_ == s_.size()) break;
      const auto c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        out.append(s_.data() + run, pos_ - run);
        ++pos_;
        return true;
      }
      if (c < 0x20) return false;
      if (c >= 0x80) {
        const size_t length = Utf8SequenceLength(s_, pos_);
        if (length == 0) return false;
        pos_ += length;
        continue;
      }
      if (c != '\\') {
        ++pos_;
        continue;
      }
      out.append(s_.data() + run, pos_ - run);
      if (pos_ + 1 >= s_.size()) return false;
      const char e = s_[pos_ + 1];
      pos_ += 2;
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          if (pos_ + 4 > s_.size()) return false;
          uint32_t code_point = 0;
          for (size_t k = 0; k < 4; ++k) {
            const int digit = HexDigit(s_[pos_ + k]);
            if (digit < 0) return false;
            code_point = code_point * 16 + static_cast<uint32_t>(digit);
          }
          // Surrogate pairs are left to the SAX reader (rare; its rules decide).
          if (code_point >= 0xD800 && code_point <= 0xDFFF) return false;
          AppendUtf8(out, code_point);
          pos_ += 4;
          break;
        }
        default:
          return false;
      }
      run = pos_;
    }
    return false;
  }

  // A JSON number (RFC 8259 section 6), as nlohmann reports it: an integer that fits int64
  // is kInt; one that does not is left to the SAX reader; anything with a fraction or an
  // exponent is kFloat with its text (and its double when asked: std::from_chars rounds
  // correctly, like the strtod nlohmann uses).
  bool Number(RawValue& value, bool compute_double) {
    const size_t start = pos_;
    Take('-');
    if (Take('0')) {
      // no further integer digits after a leading zero
    } else if (Peek() >= '1' && Peek() <= '9') {
      while (Peek() >= '0' && Peek() <= '9') ++pos_;
    } else {
      return false;
    }
    bool is_float = false;
    if (Take('.')) {
      is_float = true;
      if (!(Peek() >= '0' && Peek() <= '9')) return false;
      while (Peek() >= '0' && Peek() <= '9') ++pos_;
    }
    if (Peek() == 'e' || Peek() == 'E') {
      is_float = true;
      ++pos_;
      if (Peek() == '+' || Peek() == '-') ++pos_;
      if (!(Peek() >= '0' && Peek() <= '9')) return false;
      while (Peek() >= '0' && Peek() <= '9') ++pos_;
    }
    const char* first = s_.data() + start;
    const char* last = s_.data() + pos_;
    if (!is_float) {
      int64_t integer = 0;
      const auto [end, error] = std::from_chars(first, last, integer);
      if (error != std::errc() || end != last) return false;
      value.type = RawValue::Type::kInt;
      value.integer = integer;
      return true;
    }
    value.type = RawValue::Type::kFloat;
    value.text.assign(first, last);
    if (compute_double) {
      const auto [end, error] = std::from_chars(first, last, value.number);
      // Out of range (overflow, or an underflow strtod may treat differently): SAX decides.
      if (error != std::errc() || end != last || !std::isfinite(value.number)) return false;
    }
    return true;
  }

 public:
  // A slice line exactly as ChromeTraceWriter::OnSlice writes it, straight into `slice` with
  // the values TraceSax::ConvertSlice would give it. False at the first thing that differs
  // from the writer's key order or types (the caller then takes the general route).
  bool WriterSlice(Slice& slice) {
    using namespace std::string_view_literals;
    if (!Literal(R"({"ph":"X","cat":)"sv) || Peek() != '"' || !String(text_)) return false;
    slice.category = ParseCategory(text_);
    if (slice.category == Category::kOther) slice.raw_category = text_;
    if (!Literal(R"(,"name":)"sv) || Peek() != '"' || !String(slice.name)) return false;
    if (!Literal(R"(,"pid":)"sv) || !Int32(slice.pid)) return false;
    if (!Literal(R"(,"tid":)"sv) || !Int32(slice.tid)) return false;
    if (!Literal(R"(,"ts":)"sv) || !Micros(slice.ts_ns)) return false;
    if (!Literal(R"(,"dur":)"sv) || !Micros(slice.dur_ns)) return false;
    // A negative or overflowing span is an error: the general route words it.
    if (slice.dur_ns < 0 || slice.ts_ns > std::numeric_limits<int64_t>::max() - slice.dur_ns) return false;
    if (!Literal(R"(,"args":{)"sv)) return false;
    if (Take('}')) return Take('}') && pos_ == s_.size();
    std::string_view key;
    if (!KeyView(key) || !Take(':')) return false;
    // The keys written from fields, in the writer's order; each must have the type it is
    // read with, or the general route decides.
    if (key == "op id"sv) {
      int64_t external = 0;
      if (!Int64(slice.op_id) || slice.op_id < 0 || !Literal(R"(,"External id":)"sv) || !Int64(external) ||
          external != slice.op_id) {
        return false;
      }
      if (!NextKey(key)) return Take('}') && pos_ == s_.size();
    }
    if (key == "correlation"sv) {
      if (!Int64(slice.correlation)) return false;
      if (!NextKey(key)) return Take('}') && pos_ == s_.size();
    }
    if (key == "Collective name"sv) {
      CollectiveInfo& c = slice.collective.emplace();
      if (Peek() != '"' || !String(c.collective_name)) return false;
      if (!Literal(R"(,"Process Group Name":)"sv) || Peek() != '"' || !String(c.process_group)) return false;
      if (!Literal(R"(,"dtype":)"sv) || Peek() != '"' || !String(c.dtype)) return false;
      if (!Literal(R"(,"In msg nelems":)"sv) || !Int64(c.in_nelems)) return false;
      if (!Literal(R"(,"Out msg nelems":)"sv) || !Int64(c.out_nelems)) return false;
      if (!Literal(R"(,"Group size":)"sv) || !Int32(c.group_size)) return false;
      if (!Literal(R"(,"Seq":)"sv) || !Int64(c.seq)) return false;
      if (!Literal(R"(,"Rank":)"sv) || !Int32(c.rank)) return false;
      if (!NextKey(key)) return Take('}') && pos_ == s_.size();
    }
    // Further args, kept in order. One whose key the SAX route could read into a field (the
    // keys the writer reserves for this slice, IsReservedSliceArg) is left to that route and
    // its first-occurrence rules; the others are plain args there too.
    while (true) {
      if (key == "op id"sv || key == "correlation"sv || key == "Collective name"sv) return false;
      if (slice.op_id >= 0 && key == "External id"sv) return false;
      if (slice.collective) {
        for (std::string_view reserved : {"Process Group Name"sv, "dtype"sv, "In msg nelems"sv, "Out msg nelems"sv,
                                          "Group size"sv, "Seq"sv, "Rank"sv}) {
          if (key == reserved) return false;
        }
      }
      RawValue value;
      if (!Scalar(value, /*compute_double=*/true)) return false;
      switch (value.type) {
        case RawValue::Type::kNull: break;  // dropped, as by the SAX reader
        case RawValue::Type::kInt: slice.args.push_back(Arg{std::string(key), value.integer}); break;
        case RawValue::Type::kFloat: slice.args.push_back(Arg{std::string(key), value.number}); break;
        case RawValue::Type::kString: slice.args.push_back(Arg{std::string(key), std::move(value.text)}); break;
        case RawValue::Type::kBool: return false;
      }
      if (!NextKey(key)) return Take('}') && pos_ == s_.size();
    }
  }

 private:
  bool Literal(std::string_view text) {
    if (s_.substr(pos_, text.size()) != text) return false;
    pos_ += text.size();
    return true;
  }

  // After an arg: ',' and the next key (true), or the end of the args object (false, with
  // the '}' consumed). Anything else also gives false, with the position moved to the end of
  // the line so that the caller's final check (a closing '}') fails.
  bool NextKey(std::string_view& key) {
    if (Take(',')) {
      if (KeyView(key) && Take(':')) return true;
    } else if (Take('}')) {
      return false;
    }
    pos_ = s_.size();
    return false;
  }

  bool Int64(int64_t& out) {
    RawValue value;
    if (!Number(value, false) || value.type != RawValue::Type::kInt) return false;
    out = value.integer;
    return true;
  }
  bool Int32(int32_t& out) {
    int64_t value = 0;
    if (!Int64(value) || value < std::numeric_limits<int32_t>::min() || value > std::numeric_limits<int32_t>::max()) {
      return false;
    }
    out = static_cast<int32_t>(value);
    return true;
  }
  // "<digits>.<3 digits>" microseconds -> ns exactly (what DecimalMicrosToNanos gives for
  // these); other forms go to DecimalMicrosToNanos itself.
  bool Micros(int64_t& ns) {
    const size_t start = pos_;
    RawValue value;
    if (!Number(value, false) || value.type != RawValue::Type::kFloat) return false;
    const std::string_view text = s_.substr(start, pos_ - start);
    const size_t dot = text.find('.');
    const bool negative = text[0] == '-';
    const size_t int_digits = dot - (negative ? 1 : 0);
    if (dot != std::string_view::npos && text.size() == dot + 4 && int_digits <= kMaxFastMicrosDigits) {
      int64_t whole = 0;
      for (size_t i = negative ? 1 : 0; i < dot; ++i) whole = whole * 10 + (text[i] - '0');
      const int64_t fraction = (text[dot + 1] - '0') * 100 + (text[dot + 2] - '0') * 10 + (text[dot + 3] - '0');
      ns = negative ? -(whole * 1000 + fraction) : whole * 1000 + fraction;
      return true;
    }
    std::optional<int64_t> converted = DecimalMicrosToNanos(text);
    if (!converted) return false;
    ns = *converted;
    return true;
  }

  // 15 integer digits of microseconds stay below 2^63 ns after * 1000 + 999.
  static constexpr size_t kMaxFastMicrosDigits = 15;

  bool Scalar(RawValue& value, bool compute_double) {
    const char c = Peek();
    if (c == '"') {
      value.type = RawValue::Type::kString;
      return String(value.text);
    }
    if (c == '-' || (c >= '0' && c <= '9')) return Number(value, compute_double);
    if (s_.substr(pos_, 4) == "null") {
      pos_ += 4;
      value.type = RawValue::Type::kNull;
      return true;
    }
    return false;  // true/false, objects, arrays: not in the writer's layout
  }

  std::string_view s_;
  size_t pos_ = 0;
  std::string text_;  // scratch for the category
};

}  // namespace

bool ScanEventLine(std::string_view line, RawEvent& event) { return LineScanner(line).Event(event); }

bool ScanWriterSlice(std::string_view line, Slice& slice) { return LineScanner(line).WriterSlice(slice); }

std::optional<int64_t> DecimalMicrosToNanos(std::string_view text) {
  // Only the first 20 significant digits can matter (19 for int64 plus the rounding
  // digit), so they are kept in a fixed buffer: no allocation per timestamp.
  constexpr size_t kKeptDigits = 24;
  std::array<char, kKeptDigits> digits{};
  int64_t significant = 0;  // significant digits seen (leading zeros skipped)
  int64_t fraction_digits = 0;
  size_t i = 0;
  const bool negative = i < text.size() && text[i] == '-';
  if (negative) ++i;
  bool in_fraction = false;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '.') {
      in_fraction = true;
      continue;
    }
    if (c < '0' || c > '9') break;
    if (in_fraction) ++fraction_digits;
    if (significant == 0 && c == '0') continue;
    if (significant < static_cast<int64_t>(kKeptDigits)) digits[static_cast<size_t>(significant)] = c;
    ++significant;
  }
  int64_t exponent = 0;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    bool exponent_negative = false;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) exponent_negative = text[i++] == '-';
    for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
      // Clamped: any exponent this large already decides the result (0 or overflow).
      exponent = std::min<int64_t>(exponent * 10 + (text[i] - '0'), 1'000'000);
    }
    if (exponent_negative) exponent = -exponent;
  }
  if (i != text.size()) return std::nullopt;
  if (significant == 0) return 0;
  // value in ns = digits * 10^shift
  const int64_t shift = exponent - fraction_digits + 3;
  constexpr int64_t kMaxDigits = 19;  // 10^19 > 2^63: more integer digits always overflow
  uint64_t magnitude = 0;
  const auto accumulate = [&](int64_t k) {
    magnitude = magnitude * 10 + static_cast<uint64_t>(digits[static_cast<size_t>(k)] - '0');
  };
  if (shift >= 0) {
    if (significant + shift > kMaxDigits) return std::nullopt;
    for (int64_t k = 0; k < significant; ++k) accumulate(k);
    for (int64_t k = 0; k < shift; ++k) magnitude *= 10;
  } else {
    const int64_t keep = significant + shift;  // digits left of the ns decimal point
    if (keep > kMaxDigits) return std::nullopt;
    char round_digit = '0';
    if (keep >= 0) {
      for (int64_t k = 0; k < keep; ++k) accumulate(k);
      round_digit = digits[static_cast<size_t>(keep)];  // keep < significant: stored
    }
    if (round_digit >= '5') ++magnitude;  // half away from zero
  }
  constexpr uint64_t kMaxPositive = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (magnitude > kMaxPositive + (negative ? 1 : 0)) return std::nullopt;
  if (!negative) return static_cast<int64_t>(magnitude);
  return magnitude == kMaxPositive + 1 ? std::numeric_limits<int64_t>::min() : -static_cast<int64_t>(magnitude);
}

}  // namespace shardscope::traces::trace_internal

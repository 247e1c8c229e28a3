#include "shardscope/base/pickle.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

namespace shardscope::traces {
namespace {

using Kind = PickleObject::Kind;

// Bytes from a literal that may hold NULs.
template <size_t N>
std::string B(const char (&text)[N]) {
  return std::string(text, N - 1);
}

std::unique_ptr<PickleDocument> MustParse(const std::string& bytes) {
  auto doc = ParsePickle(bytes, "test.pkl");
  EXPECT_TRUE(doc.ok()) << doc.status().message();
  if (!doc.ok()) return nullptr;
  return std::move(doc).value();
}

std::string MustFail(const std::string& bytes) {
  auto doc = ParsePickle(bytes, "test.pkl");
  EXPECT_FALSE(doc.ok());
  if (doc.ok()) return "";
  EXPECT_EQ(doc.status().code(), StatusCode::kInvalidInput);
  return doc.status().message();
}

// A Python-repr-like rendering of an acyclic tree, to compare whole trees in one line.
std::string Repr(const PickleObject& o) {
  switch (o.kind) {
    case Kind::kNone: return "None";
    case Kind::kBool: return o.bool_value ? "True" : "False";
    case Kind::kInt: return std::to_string(o.int_value);
    case Kind::kFloat: return "f" + std::to_string(o.float_value);
    case Kind::kString: return "'" + o.string_value + "'";
    case Kind::kBytes: return "b'" + o.string_value + "'";
    case Kind::kList:
    case Kind::kTuple: {
      std::string out = o.kind == Kind::kList ? "[" : "(";
      for (size_t i = 0; i < o.items.size(); ++i) out += (i ? ", " : "") + Repr(*o.items[i]);
      if (o.kind == Kind::kTuple && o.items.size() == 1) out += ",";
      return out + (o.kind == Kind::kList ? "]" : ")");
    }
    case Kind::kDict: {
      std::string out = "{";
      for (size_t i = 0; i < o.entries.size(); ++i) {
        out += (i ? ", " : "") + Repr(*o.entries[i].first) + ": " + Repr(*o.entries[i].second);
      }
      return out + "}";
    }
  }
  return "?";
}

std::string Repr(const PickleValue& v) {
  switch (v.kind()) {
    case Kind::kNone: return "None";
    case Kind::kBool: return v.bool_value() ? "True" : "False";
    case Kind::kInt: return std::to_string(v.int_value());
    case Kind::kFloat: return "f" + std::to_string(v.float_value());
    case Kind::kString: return "'" + v.string_value() + "'";
    case Kind::kBytes: return "b'" + v.string_value() + "'";
    case Kind::kList:
    case Kind::kTuple: {
      std::string out = v.kind() == Kind::kList ? "[" : "(";
      for (size_t i = 0; i < v.items().size(); ++i) out += (i ? ", " : "") + Repr(v.items()[i]);
      if (v.kind() == Kind::kTuple && v.items().size() == 1) out += ",";
      return out + (v.kind() == Kind::kList ? "]" : ")");
    }
    case Kind::kDict: {
      std::string out = "{";
      for (size_t i = 0; i < v.entries().size(); ++i) {
        out += (i ? ", " : "") + Repr(v.entries()[i].first) + ": " + Repr(v.entries()[i].second);
      }
      return out + "}";
    }
  }
  return "?";
}

// pickle.dumps({'a': [1, -2, 70000, 2**40, -2**40, 1.5, True, None, 'é'], 'b': (1, 2),
//               'c': b'xy'}, protocol=4), as printed by CPython 3.
TEST(PickleTest, ReadsCPythonProtocol4WithFrameMemoizeAndShortForms) {
  const std::string bytes = B(
      "\x80\x04\x95L\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01" "a\x94]\x94(K\x01J\xfe\xff\xff\xffJ"
      "p\x11\x01\x00\x8a\x06\x00\x00\x00\x00\x00\x01\x8a\x06\x00\x00\x00\x00\x00\xffG?\xf8\x00\x00"
      "\x00\x00\x00\x00\x88N\x8c\x02\xc3\xa9\x94" "e\x8c\x01" "b\x94K\x01K\x02\x86\x94\x8c\x01" "c\x94" "C\x02"
      "xy\x94u.");
  auto doc = MustParse(bytes);
  ASSERT_NE(doc, nullptr);
  EXPECT_EQ(Repr(doc->root()),
            "{'a': [1, -2, 70000, 1099511627776, -1099511627776, f1.500000, True, None, 'é'], "
            "'b': (1, 2), 'c': b'xy'}");
  EXPECT_EQ(doc->root().Find("b")->KindName(), "tuple");
  EXPECT_EQ(doc->root().Find("c")->kind, Kind::kBytes);
  EXPECT_EQ(doc->root().Find("zz"), nullptr);
  EXPECT_EQ(doc->root().Find("a")->Find("a"), nullptr);  // not a dict
}

// The same object at protocol 5 differs only in the PROTO byte.
TEST(PickleTest, ReadsProtocol5) {
  std::string bytes = B("\x80\x05\x95\x0a\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x01k\x94K\x07s.");
  auto doc = MustParse(bytes);
  ASSERT_NE(doc, nullptr);
  EXPECT_EQ(Repr(doc->root()), "{'k': 7}");
}

// pickle.dumps([d, d], protocol=2) with d = {'k': 1}: BINPUT then BINGET of the same dict.
TEST(PickleTest, MemoizedObjectsAreSharedNotCopied) {
  auto doc = MustParse(B("\x80\x02]q\x00(}q\x01X\x01\x00\x00\x00kq\x02K\x01sh\x01" "e."));
  ASSERT_NE(doc, nullptr);
  const PickleObject& root = doc->root();
  ASSERT_EQ(root.items.size(), 2u);
  EXPECT_EQ(root.items[0], root.items[1]);
  EXPECT_EQ(Repr(root), "[{'k': 1}, {'k': 1}]");
  EXPECT_EQ(doc->object_count(), 4);  // list, dict, 'k', 1
}

TEST(PickleTest, LongMemoOpcodesAndDup) {
  // LONG_BINPUT 70000, LONG_BINGET 70000; DUP; TUPLE3.
  auto doc = MustParse(B("\x80\x02K\x05r\x70\x11\x01\x00j\x70\x11\x01\x00\x32\x87."));
  ASSERT_NE(doc, nullptr);
  EXPECT_EQ(Repr(doc->root()), "(5, 5, 5)");
  EXPECT_EQ(doc->root().items[0], doc->root().items[2]);
}

TEST(PickleTest, TextProtocolOpcodes) {
  // MARK INT LONG FLOAT INT(True) INT(False) PUT GET LIST; protocol 0 forms.
  auto doc = MustParse(B("(I-12\nL123456789012L\nF2.5\nI01\nI00\np7\ng7\nl."));
  ASSERT_NE(doc, nullptr);
  EXPECT_EQ(Repr(doc->root()), "[-12, 123456789012, f2.500000, True, False, False]");
}

TEST(PickleTest, DictAndSetItemForms) {
  // MARK 'a' 1 DICT, then SETITEM 'b' 2; a repeated key keeps its position and takes the last
  // value, as a Python dict does.
  auto doc = MustParse(B("\x80\x02(\x8c\x01" "aK\x01" "d\x8c\x01" "bK\x02s\x8c\x01" "aK\x03s."));
  ASSERT_NE(doc, nullptr);
  EXPECT_EQ(Repr(doc->root()), "{'a': 3, 'b': 2}");
  EXPECT_EQ(doc->root().Find("a")->int_value, 3);
}

TEST(PickleTest, TupleFormsAndStringForms) {
  // EMPTY_TUPLE, TUPLE1, TUPLE2 of (BINSTRING, SHORT_BINSTRING), MARK ... TUPLE of four,
  // BINUNICODE8, BINBYTES, BINBYTES8, EMPTY_LIST, wrapped in TUPLE.
  const std::string bytes =
      B("\x80\x02(")                                   // outer MARK
      + B(")")                                         // ()
      + B("N\x85")                                     // (None,)
      + B("T\x02\x00\x00\x00hiU\x02yo\x86")           // ('hi', 'yo')
      + B("(K\x01K\x02K\x03K\x04t")                    // (1, 2, 3, 4)
      + B("\x8d\x03\x00\x00\x00\x00\x00\x00\x00" "abc")   // 'abc'
      + B("B\x01\x00\x00\x00z")                        // b'z'
      + B("\x8e\x00\x00\x00\x00\x00\x00\x00\x00")      // b''
      + B("]")                                         // []
      + B("\x89")                                      // False
      + B("t.");
  auto doc = MustParse(bytes);
  ASSERT_NE(doc, nullptr);
  EXPECT_EQ(Repr(doc->root()),
            "((), (None,), ('hi', 'yo'), (1, 2, 3, 4), 'abc', b'z', b'', [], False)");
}

TEST(PickleTest, PopAndPopMarkDiscard) {
  // K1 K2 POP -> [1]; MARK K3 K4 POP_MARK -> nothing; APPEND onto a list.
  auto doc = MustParse(B("\x80\x02]K\x01K\x02\x30(K\x03K\x04\x31" "a."));
  ASSERT_NE(doc, nullptr);
  EXPECT_EQ(Repr(doc->root()), "[1]");
  // POP on an empty frame pops the MARK (Lib/pickle.py load_pop).
  doc = MustParse(B("\x80\x02K\x01(\x30."));
  ASSERT_NE(doc, nullptr);
  EXPECT_EQ(Repr(doc->root()), "1");
}

TEST(PickleTest, IntegerEdgesAndOverflow) {
  // LONG1 of 8 bytes: INT64_MAX and INT64_MIN; LONG1 of 0 bytes: 0; BININT -1; LONG4.
  auto doc = MustParse(
      B("\x80\x02(\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80"
        "\x8a\x00J\xff\xff\xff\xff\x8b\x02\x00\x00\x00\x00\x01l."));
  ASSERT_NE(doc, nullptr);
  ASSERT_EQ(doc->root().items.size(), 5u);
  EXPECT_EQ(doc->root().items[0]->int_value, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(doc->root().items[1]->int_value, std::numeric_limits<int64_t>::min());
  EXPECT_EQ(doc->root().items[2]->int_value, 0);
  EXPECT_EQ(doc->root().items[3]->int_value, -1);
  EXPECT_EQ(doc->root().items[4]->int_value, 256);
  // 2**64 - 1 (pickle.dumps(2**64 - 1) = LONG1 of 9 bytes, the last the sign byte 0): a C++
  // SIZE_MAX, read as its bits.
  auto wide = MustParse(B("\x80\x02\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00."));
  ASSERT_NE(wide, nullptr);
  EXPECT_EQ(wide->root().int_value, -1);
  // 2**64 as LONG1 needs 9 bytes with a non-zero top byte: refused.
  std::string message = MustFail(B("\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01."));
  EXPECT_NE(message.find("test.pkl: byte 2: LONG1 integer of 9 bytes does not fit 64 bits"),
            std::string::npos)
      << message;
  message = MustFail(B("I9223372036854775808\n."));
  EXPECT_NE(message.find("byte 0: integer 9223372036854775808 does not fit 64 bits"),
            std::string::npos)
      << message;
}

TEST(PickleTest, FloatsAreBigEndianDoubles) {
  auto doc = MustParse(B("\x80\x02G\xc0\x09\x21\xfb\x54\x44\x2d\x18."));  // -pi
  ASSERT_NE(doc, nullptr);
  EXPECT_EQ(doc->root().kind, Kind::kFloat);
  EXPECT_DOUBLE_EQ(doc->root().float_value, -3.141592653589793);
}

TEST(PickleTest, CodeExecutingOpcodesAreRejectedWithTheirOffset) {
  // What CPython writes for bytes at protocol 2: c_codecs\nencode ... R.
  std::string message = MustFail(B("\x80\x02}q\x00(X\x01\x00\x00\x00" "cq\x01" "c_codecs\nencode\n"));
  EXPECT_NE(message.find("test.pkl: byte 14: opcode GLOBAL (0x63) is not supported"),
            std::string::npos)
      << message;
  message = MustFail(B("\x80\x04\x93."));
  EXPECT_NE(message.find("byte 2: opcode STACK_GLOBAL"), std::string::npos) << message;
  message = MustFail(B("\x80\x02NN\x85R."));
  EXPECT_NE(message.find("byte 5: opcode REDUCE"), std::string::npos) << message;
  message = MustFail(B("\x80\x04\x8f."));
  EXPECT_NE(message.find("byte 2: opcode EMPTY_SET"), std::string::npos) << message;
  message = MustFail(B("\x80\x02\xff."));
  EXPECT_NE(message.find("byte 2: 0xff is not a pickle opcode"), std::string::npos) << message;
}

TEST(PickleTest, MalformedStreamsNameTheProblemAndOffset) {
  struct Case {
    std::string bytes;
    std::string expected;
  };
  const Case cases[] = {
      {B(""), "byte 0: the pickle ends without STOP"},
      {B("\x80\x02K\x01"), "byte 4: the pickle ends without STOP"},
      {B("\x80\x06N."), "byte 0: pickle protocol 6 is not supported"},
      {B("\x80\x02X\x05\x00\x00\x00" "ab."), "byte 2: BINUNICODE needs 5 bytes, 3 left"},
      {B("\x80\x02h\x03."), "byte 2: memo index 3 was never stored"},
      {B("\x80\x02K\x01K\x02."), "byte 6: STOP with 2 objects on the stack, expected 1"},
      {B("\x80\x02."), "byte 2: STOP with 0 objects on the stack"},
      {B("\x80\x02(N."), "byte 4: STOP with an unclosed MARK"},
      {B("\x80\x02Ne."), "byte 3: APPENDS without a MARK"},
      {B("\x80\x02(Ne."), "byte 4: APPENDS with no list below its MARK"},
      {B("\x80\x02N(Ne."), "byte 5: APPENDS on a NoneType, expected a list"},
      {B("\x80\x02}(Nu."), "byte 5: SETITEMS with an odd number of objects"},
      {B("\x80\x02]NNs."), "byte 5: SETITEM on a list, expected a dict"},
      {B("\x80\x02Na."), "byte 3: APPEND needs 2 objects on the stack"},
      {B("\x80\x02q\x00."), "byte 2: a memo put with nothing on the stack"},
      {B("\x80\x02\x8c\x02\xc3(."), "byte 2: SHORT_BINUNICODE holds invalid UTF-8"},
      {B("\x80\x04\x95\xff\x00\x00\x00\x00\x00\x00\x00N."), "byte 2: FRAME of 255 bytes but 2 left"},
      {B("\x80\x02\x8b\xff\xff\xff\xff."), "byte 2: LONG4 with a negative byte count"},
      {B("I12x\n."), "byte 0: '12x' is not an integer"},
      {B("F1.5"), "byte 0: FLOAT has no terminating newline"},
  };
  for (const Case& c : cases) {
    const std::string message = MustFail(c.bytes);
    EXPECT_NE(message.find(c.expected), std::string::npos) << "got: " << message;
    EXPECT_EQ(message.rfind("test.pkl: byte ", 0), 0u) << message;
  }
}

TEST(PickleTest, FarMemoIndicesAndLargeDictsStayCorrect) {
  // LONG_BINPUT 4000000000 (far beyond the puts seen: kept apart, not a 4-billion vector),
  // then MEMOIZE (index 1, the memo's size) and gets of both.
  auto doc = MustParse(B("\x80\x04K\x07r\x00\x28\x6b\xee\x30K\x08\x94\x30(j\x00\x28\x6b\xeeh\x01l."));
  ASSERT_NE(doc, nullptr);
  EXPECT_EQ(Repr(doc->root()), "[7, 8]");
  // A dict of 40 keys set twice (past the linear-scan size): 40 entries, the last values.
  std::string bytes = B("\x80\x02}(");
  for (int round = 0; round < 2; ++round) {
    for (int k = 0; k < 40; ++k) bytes += B("K") + static_cast<char>(k) + B("K") + static_cast<char>(round);
  }
  bytes += B("u.");
  doc = MustParse(bytes);
  ASSERT_NE(doc, nullptr);
  ASSERT_EQ(doc->root().entries.size(), 40u);
  EXPECT_EQ(doc->root().entries[39].first->int_value, 39);
  EXPECT_EQ(doc->root().entries[39].second->int_value, 1);
}

// l = []; l.append(l); pickle.dumps(l, 2) gives PROTO 2, EMPTY_LIST, BINPUT 0, BINGET 0, APPEND, STOP'
TEST(PickleTest, CyclesAreAcceptedAndHeldByTheArena) {
  auto doc = MustParse(B("\x80\x02]q\x00h\x00" "a."));
  ASSERT_NE(doc, nullptr);
  const PickleObject& root = doc->root();
  ASSERT_EQ(root.kind, Kind::kList);
  ASSERT_EQ(root.items.size(), 1u);
  EXPECT_EQ(root.items[0], &root);
}

TEST(PickleTest, NestingDeeperThanTheLimitIsAnError) {
  // None wrapped in kMaxPickleDepth tuples: depth kMaxPickleDepth + 1.
  std::string bytes = B("\x80\x02N") + std::string(kMaxPickleDepth, '\x85') + ".";
  const std::string message = MustFail(bytes);
  EXPECT_NE(message.find("byte 1002: objects nested deeper than 1000 levels"), std::string::npos) << message;
  // One level fewer is fine.
  bytes = B("\x80\x02N") + std::string(kMaxPickleDepth - 1, '\x85') + ".";
  EXPECT_NE(MustParse(bytes), nullptr);
}

TEST(PickleTest, WriterRoundTripsThroughTheReader) {
  PickleValue dump = PickleValue::Dict();
  dump.Add("version", PickleValue::String("2.9"))
      .Add("ints", PickleValue::List({PickleValue::Int(0), PickleValue::Int(255), PickleValue::Int(256),
                                      PickleValue::Int(65535), PickleValue::Int(65536),
                                      PickleValue::Int(-1), PickleValue::Int(INT32_MIN),
                                      PickleValue::Int(int64_t{INT32_MAX} + 1),
                                      PickleValue::Int(int64_t{INT32_MIN} - 1),
                                      PickleValue::Int(std::numeric_limits<int64_t>::max()),
                                      PickleValue::Int(std::numeric_limits<int64_t>::min())}))
      .Add("tuples", PickleValue::List({PickleValue::Tuple(), PickleValue::Tuple({PickleValue::None()}),
                                        PickleValue::Tuple({PickleValue::Bool(true), PickleValue::Bool(false)}),
                                        PickleValue::Tuple({PickleValue::Int(1), PickleValue::Int(2),
                                                            PickleValue::Int(3)}),
                                        PickleValue::Tuple({PickleValue::Int(1), PickleValue::Int(2),
                                                            PickleValue::Int(3), PickleValue::Int(4)})}))
      .Add("float", PickleValue::Float(0.1))
      .Add("empty", PickleValue::Dict())
      .Add("list", PickleValue::List().Append(PickleValue::String("é")).Append(PickleValue::List()))
      .Add(PickleValue::Int(7), PickleValue::String(""));
  const std::string bytes = WritePickle(dump);
  EXPECT_EQ(bytes.substr(0, 3), B("\x80\x02}"));
  EXPECT_EQ(bytes.back(), '.');
  auto doc = MustParse(bytes);
  ASSERT_NE(doc, nullptr);
  EXPECT_EQ(Repr(doc->root()), Repr(dump));
  EXPECT_EQ(doc->root().Find("float")->float_value, 0.1);  // bit-exact
  EXPECT_EQ(doc->root().Find("ints")->items[9]->int_value, std::numeric_limits<int64_t>::max());
}

// The writer's integer encodings are CPython's: pickle.dumps(n, 2) for each n.
TEST(PickleTest, WriterIntegerBytesMatchCPython) {
  EXPECT_EQ(WritePickle(PickleValue::Int(1)), B("\x80\x02K\x01."));
  EXPECT_EQ(WritePickle(PickleValue::Int(70000)), B("\x80\x02Jp\x11\x01\x00."));
  EXPECT_EQ(WritePickle(PickleValue::Int(-2)), B("\x80\x02J\xfe\xff\xff\xff."));
  EXPECT_EQ(WritePickle(PickleValue::Int(int64_t{1} << 40)),
            B("\x80\x02\x8a\x06\x00\x00\x00\x00\x00\x01."));
  EXPECT_EQ(WritePickle(PickleValue::Int(-(int64_t{1} << 40))),
            B("\x80\x02\x8a\x06\x00\x00\x00\x00\x00\xff."));
  EXPECT_EQ(WritePickle(PickleValue::Int(int64_t{1} << 31)),
            B("\x80\x02\x8a\x05\x00\x00\x00\x80\x00."));
  EXPECT_EQ(WritePickle(PickleValue::Float(1.5)), B("\x80\x02G?\xf8\x00\x00\x00\x00\x00\x00."));
}

}  // namespace
}  // namespace shardscope::traces

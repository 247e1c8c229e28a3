#include "shardscope/analysis/flight_recorder_analysis.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "shardscope/base/pickle.h"

namespace shardscope::traces {
namespace {

// One entry as PyTorch's FlightRecorder::dump writes it (pickle dict; FlightRecorder.hpp keys).
struct E {
  std::string pg = "0";
  std::string desc = "dp";
  int64_t seq = 1;
  std::string name = "nccl:all_reduce";
  std::vector<int64_t> in = {1024};
  std::vector<int64_t> out = {1024};
  std::string dtype = "Float";
  std::string state = "scheduled";
  int64_t created = 100;
  bool p2p = false;
  int64_t p2p_seq = 0;
};

PickleValue Sizes(const std::vector<int64_t>& shape) {
  std::vector<PickleValue> dims;
  for (int64_t d : shape) dims.push_back(PickleValue::Int(d));
  return PickleValue::List({PickleValue::List(dims)});
}

PickleValue EntryValue(const E& e, int64_t record_id) {
  PickleValue v = PickleValue::Dict();
  v.Add("record_id", PickleValue::Int(record_id))
      .Add("pg_id", PickleValue::Int(std::stoll(e.pg)))
      .Add("process_group", PickleValue::Tuple({PickleValue::String(e.pg), PickleValue::String(e.desc)}))
      .Add("collective_seq_id", PickleValue::Int(e.p2p ? 0 : e.seq))
      .Add("p2p_seq_id", PickleValue::Int(e.p2p ? e.p2p_seq : 0))
      .Add("op_id", PickleValue::Int(e.seq))
      .Add("profiling_name", PickleValue::String(e.name))
      .Add("time_created_ns", PickleValue::Int(e.created))
      .Add("input_sizes", Sizes(e.in))
      .Add("input_dtypes", PickleValue::List({PickleValue::String(e.dtype)}))
      .Add("output_sizes", Sizes(e.out))
      .Add("output_dtypes", PickleValue::List({PickleValue::String(e.dtype)}))
      .Add("state", PickleValue::String(e.state))
      .Add("time_discovered_started_ns", PickleValue::None())
      .Add("time_discovered_completed_ns", PickleValue::None())
      .Add("retired", PickleValue::Bool(false))
      .Add("timeout_ms", PickleValue::Int(600000))
      .Add("is_p2p", PickleValue::Bool(e.p2p));
  return v;
}

// A pickled dump: groups as (name, desc, ranks).
std::string DumpBytes(const std::vector<std::tuple<std::string, std::string, std::string>>& groups,
                      const std::vector<E>& entries,
                      const std::vector<std::pair<std::string, int64_t>>& completed = {}) {
  PickleValue config = PickleValue::Dict();
  for (const auto& [name, desc, ranks] : groups) {
    config.Add(name, PickleValue::Dict()
                         .Add("name", PickleValue::String(name))
                         .Add("desc", PickleValue::String(desc))
                         .Add("ranks", PickleValue::String(ranks)));
  }
  PickleValue status = PickleValue::Dict();
  for (const auto& [id, last] : completed) {
    status.Add(id, PickleValue::Dict()
                       .Add("last_enqueued_collective", PickleValue::Int(last))
                       .Add("last_started_collective", PickleValue::Int(-1))
                       .Add("last_completed_collective", PickleValue::Int(last)));
  }
  std::vector<PickleValue> list;
  for (size_t i = 0; i < entries.size(); ++i) list.push_back(EntryValue(entries[i], static_cast<int64_t>(i)));
  PickleValue dump = PickleValue::Dict();
  dump.Add("version", PickleValue::String("2.9"))
      .Add("pg_config", std::move(config))
      .Add("nccl_version", PickleValue::String("2.27.3"))
      .Add("pg_status", std::move(status))
      .Add("entries", PickleValue::List(std::move(list)));
  return WritePickle(dump);
}

FlightRecorderDump MustParse(const std::string& bytes, int32_t rank) {
  auto dump = ParseFlightRecorderDump(bytes, "dump", rank);
  EXPECT_TRUE(dump.ok()) << dump.status().message();
  return dump.ok() ? std::move(dump).value() : FlightRecorderDump{};
}

const std::tuple<std::string, std::string, std::string> kDp4 = {"0", "dp", "[0, 1, 2, 3]"};

// Four ranks of one group, each with collectives 1..last[r].
std::vector<FlightRecorderDump> Ladder(const std::vector<int64_t>& last, const E& base = E{}) {
  std::vector<FlightRecorderDump> dumps;
  for (size_t r = 0; r < last.size(); ++r) {
    std::vector<E> entries;
    for (int64_t s = 1; s <= last[r]; ++s) {
      E e = base;
      e.seq = s;
      e.created = 1000 * s + static_cast<int64_t>(r);
      e.state = "completed";
      entries.push_back(e);
    }
    if (!entries.empty()) entries.back().state = "scheduled";
    dumps.push_back(MustParse(DumpBytes({kDp4}, entries), static_cast<int32_t>(r)));
  }
  return dumps;
}

TEST(FlightRecorderTest, ReadsThePickleLayout) {
  E e;
  e.pg = "74";
  e.desc = "EXPERT_MODEL_PARALLEL_GROUP";
  e.name = "nccl:all_to_all";
  e.in = {4027, 5120};
  e.out = {4096, 5120};
  e.dtype = "BFloat16";
  e.seq = 20537;
  const FlightRecorderDump dump =
      MustParse(DumpBytes({{"74", "EXPERT_MODEL_PARALLEL_GROUP", "[12, 13, 14, 15]"}}, {e}, {{"74", 20537}}), 13);
  EXPECT_EQ(dump.rank, 13);
  EXPECT_EQ(dump.version, "2.9");
  ASSERT_EQ(dump.pg_config.size(), 1u);
  EXPECT_EQ(dump.pg_config[0].ranks, (std::vector<int32_t>{12, 13, 14, 15}));
  EXPECT_EQ(dump.pg_status.at("74").last_completed, 20537);
  ASSERT_EQ(dump.entries.size(), 1u);
  const FrEntry& x = dump.entries[0];
  EXPECT_EQ(x.pg_name, "74");
  EXPECT_EQ(x.pg_desc, "EXPERT_MODEL_PARALLEL_GROUP");
  EXPECT_EQ(x.collective_seq_id, 20537);
  EXPECT_EQ(x.input_sizes, (std::vector<std::vector<int64_t>>{{4027, 5120}}));
  EXPECT_EQ(x.input_dtypes, (std::vector<std::string>{"BFloat16"}));
  EXPECT_EQ(x.time_discovered_started_ns, -1);
  EXPECT_EQ(FrSizesText(x.input_sizes), "4027x5120");
}

TEST(FlightRecorderTest, ReadsTheJsonLayoutAndOlderVariants) {
  // JSON: process_group a list, ranks a list of ints, the pre-2.3 `seq_id`, no is_p2p (from
  // the name), the rank in the dump itself.
  const std::string json = R"({"version": "2.2", "rank": 1,
    "pg_config": {"0": {"desc": "pp", "ranks": [0, 1]}},
    "entries": [{"record_id": 0, "process_group": ["0", "pp"], "seq_id": 5,
                 "profiling_name": "nccl:send 1->0", "input_sizes": [[8]], "output_sizes": [[8]],
                 "state": "started", "time_created_ns": null}]})";
  const FlightRecorderDump dump = MustParse(json, -1);
  EXPECT_EQ(dump.rank, 1);
  EXPECT_EQ(dump.pg_config[0].ranks, (std::vector<int32_t>{0, 1}));
  ASSERT_EQ(dump.entries.size(), 1u);
  EXPECT_EQ(dump.entries[0].collective_seq_id, 5);
  EXPECT_TRUE(dump.entries[0].is_p2p);
  EXPECT_EQ(dump.entries[0].time_created_ns, -1);
}

// What FlightRecorder.cpp dump_json writes: pg_status values as strings, discovery times 0
// when unknown, no `entries` key when the buffer is empty.
TEST(FlightRecorderTest, ReadsPyTorchDumpJsonConventions) {
  FlightRecorderDump dump = MustParse(R"({"version": "2.9",
    "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
    "pg_status": {"0": {"last_enqueued_collective": "7", "last_started_collective": "-1",
                        "last_completed_collective": "6"}},
    "entries": [{"record_id": 3, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": 7,
                 "p2p_seq_id": 0, "op_id": 7, "profiling_name": "nccl:all_reduce", "time_created_ns": 5,
                 "input_sizes": [[2, 3]], "input_dtypes": ["Float"], "output_sizes": [[2, 3]],
                 "output_dtypes": ["Float"], "state": "scheduled", "time_discovered_started_ns": 0,
                 "time_discovered_completed_ns": 0, "retired": false, "timeout_ms": 600000, "is_p2p": false}]})",
                                     0);
  EXPECT_EQ(dump.pg_status.at("0").last_enqueued, 7);
  EXPECT_EQ(dump.pg_status.at("0").last_started, -1);
  ASSERT_EQ(dump.entries.size(), 1u);
  EXPECT_EQ(dump.entries[0].time_discovered_started_ns, -1);
  dump = MustParse(R"({"version": "2.9", "pg_config": {}, "pg_status": {}})", 1);
  EXPECT_TRUE(dump.entries.empty());
}

TEST(FlightRecorderTest, MalformedDumpsNameTheFileAndKeyPath) {
  struct Case {
    std::string text;
    std::string expected;
  };
  const Case cases[] = {
      {"{\"version\": \"2.9\"}", "dump: not a Flight Recorder dump: the top-level dict has no 'entries'"},
      {R"({"version": "2.9", "pg_config": {}, "pg_status": {"0": {"last_enqueued_collective": "x"}}})",
       "dump: pg_status[\"0\"].last_enqueued_collective: expected an integer, got \"x\""},
      {"{\"entries\": {}}", "dump: entries: expected a list, got object"},
      {"{\"entries\": [{\"record_id\": 0}]}", "dump: entries[0]: missing key 'process_group'"},
      {R"({"entries": [{"record_id": 0, "process_group": ["0", "x"], "collective_seq_id": 1,
          "profiling_name": "nccl:all_reduce", "input_sizes": [[1, "2"]], "output_sizes": [], "state": "completed"}]})",
       "dump: entries[0].input_sizes[0][1]: expected an integer, got string"},
      {R"({"entries": [{"record_id": 0, "process_group": ["0", "x"], "collective_seq_id": 1,
          "profiling_name": "nccl:all_reduce", "input_sizes": [], "output_sizes": [], "state": "done"}]})",
       "dump: entries[0].state: expected scheduled, started or completed, got \"done\""},
      {R"({"entries": [{"record_id": 0, "process_group": ["0"], "collective_seq_id": 1}]})",
       "dump: entries[0].process_group: expected a (name, desc) pair, got a array of 1 item(s)"},
      {R"({"pg_config": {"0": {"desc": "dp", "ranks": "[0, x]"}}, "entries": []})",
       "dump: pg_config[\"0\"].ranks: expected a rank list such as \"[0, 1]\", got \"[0, x]\""},
      {R"({"rank": 3, "entries": []})", "dump: rank: the dump says rank 3 but its file name says rank 2"},
      {"{\"entries\": [", "not valid JSON"},
      {"{\"entries\": [], \"x\": 0.01e2779}", "dump: not valid JSON: number overflow"},
      {"PK\x03\x04", "dump: neither a pickle (PyTorch's default dump) nor a JSON dump"},
      {std::string("\x80\x02K\x01.", 5), "dump: top level: expected a dict with 'entries', got int"},
      {std::string(100, '[') + "{", "dump: neither a pickle"},
      {"{" + std::string(100, '['), "dump: JSON nested deeper than 64 levels"},
  };
  for (const Case& c : cases) {
    auto dump = ParseFlightRecorderDump(c.text, "dump", 2);
    ASSERT_FALSE(dump.ok()) << c.text;
    EXPECT_EQ(dump.status().code(), StatusCode::kInvalidInput);
    EXPECT_NE(dump.status().message().find(c.expected), std::string::npos) << "got: " << dump.status().message();
  }
}

TEST(FlightRecorderTest, ARankBehindItsPeersIsMissing) {
  // Ranks 0-2 reached all_reduce #3; rank 3's newest entry of the group is #2, so the ring
  // buffer (which keeps the newest entries) proves it never enqueued #3.
  const FlightRecorderAnalysis a = AnalyzeFlightRecorder(Ladder({3, 3, 3, 2}));
  ASSERT_EQ(a.hangs.size(), 1u);
  const FrHang& h = a.hangs[0];
  EXPECT_EQ(h.pg_name, "0");
  EXPECT_EQ(h.seq, 3);
  EXPECT_EQ(h.missing_ranks, (std::vector<int32_t>{3}));
  EXPECT_EQ(h.waiting_ranks, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_FALSE(h.mismatch.has_value());
  EXPECT_EQ(h.description,
            "ranks 0-2 wait in nccl:all_reduce #3 on process group 0 (dp), 1024 Float, for rank 3, which never "
            "entered it (its last there: #2, scheduled)");
  EXPECT_EQ(h.waiting_since_ns, 3000);
}

TEST(FlightRecorderTest, NoHangWhenEveryRankAgrees) {
  EXPECT_TRUE(AnalyzeFlightRecorder(Ladder({3, 3, 3, 3})).hangs.empty());
}

TEST(FlightRecorderTest, AnAbsentDumpIsNotCalledMissing) {
  std::vector<FlightRecorderDump> dumps = Ladder({3, 3, 3, 3});
  dumps.pop_back();  // rank 3's file is absent
  const FlightRecorderAnalysis a = AnalyzeFlightRecorder(dumps);
  ASSERT_EQ(a.hangs.size(), 1u);
  EXPECT_TRUE(a.hangs[0].missing_ranks.empty());
  EXPECT_EQ(a.hangs[0].no_dump_ranks, (std::vector<int32_t>{3}));
  EXPECT_EQ(a.hangs[0].seq, 3);  // #1 and #2 completed on the ranks that did dump
  EXPECT_NE(a.hangs[0].description.find("no dump from rank 3, which may never have entered it"), std::string::npos);
}

TEST(FlightRecorderTest, ABufferThatStartsLaterIsNotMissing) {
  // Rank 3 holds only #3..#4 (its older entries were overwritten); all four reached #4.
  std::vector<FlightRecorderDump> dumps = Ladder({4, 4, 4, 4});
  dumps[3].entries.erase(dumps[3].entries.begin(), dumps[3].entries.begin() + 2);
  EXPECT_TRUE(AnalyzeFlightRecorder(dumps).hangs.empty());
}

TEST(FlightRecorderTest, PgStatusDecidesForARankWithNoEntryOfTheGroup) {
  // Rank 3 enqueued nothing on the group (pg_status last_enqueued_collective 0): missing.
  std::vector<FlightRecorderDump> dumps = Ladder({1, 1, 1, 0});
  dumps[3] = MustParse(DumpBytes({kDp4}, {}, {{"0", 0}}), 3);
  const FlightRecorderAnalysis a = AnalyzeFlightRecorder(dumps);
  ASSERT_EQ(a.hangs.size(), 1u);
  EXPECT_EQ(a.hangs[0].missing_ranks, (std::vector<int32_t>{3}));
  EXPECT_EQ(a.hangs[0].rank_states[3].last_enqueued, 0);
}

std::vector<FlightRecorderDump> OneCollective(const std::vector<E>& per_rank, const std::string& ranks = "[0, 1, 2, 3]") {
  std::vector<FlightRecorderDump> dumps;
  for (size_t r = 0; r < per_rank.size(); ++r) {
    dumps.push_back(MustParse(DumpBytes({{"0", "dp", ranks}}, {per_rank[r]}), static_cast<int32_t>(r)));
  }
  return dumps;
}

TEST(FlightRecorderTest, TypeMismatchNamesTheOddRankOut) {
  E all_reduce;
  E all_gather;
  all_gather.name = "nccl:all_gather";
  all_gather.out = {4096};
  const FlightRecorderAnalysis a = AnalyzeFlightRecorder(OneCollective({all_reduce, all_reduce, all_gather, all_reduce}));
  ASSERT_EQ(a.hangs.size(), 1u);
  ASSERT_TRUE(a.hangs[0].mismatch.has_value());
  EXPECT_EQ(a.hangs[0].mismatch->kind, "COLLECTIVE_TYPE_MISMATCH");
  EXPECT_EQ(a.hangs[0].mismatch->ranks, (std::vector<int32_t>{2}));
  EXPECT_EQ(a.hangs[0].description.rfind("rank 2 is in nccl:all_gather #1 on process group 0 (dp) (1024 Float, "
                                         "scheduled) while ranks 0-1,3 are in nccl:all_reduce #1",
                                         0),
            0u)
      << a.hangs[0].description;
}

TEST(FlightRecorderTest, AllGatherOutputMustBeInputTimesGroupSize) {
  // types.py Op.match: numel(output) == numel(input) * pg size (4 here).
  E good;
  good.name = "nccl:_all_gather_base";
  good.in = {16};
  good.out = {64};
  EXPECT_TRUE(AnalyzeFlightRecorder(OneCollective({good, good, good, good})).hangs.empty());
  E bad = good;
  bad.out = {48};
  const FlightRecorderAnalysis a = AnalyzeFlightRecorder(OneCollective({bad, bad, bad, bad}));
  ASSERT_EQ(a.hangs.size(), 1u);
  EXPECT_EQ(a.hangs[0].mismatch->kind, "SIZE_OR_SYNTAX_MISMATCH");
  EXPECT_NE(a.hangs[0].mismatch->text.find("output 48 elements, expected input 16 x group size 4"), std::string::npos);
}

TEST(FlightRecorderTest, ReduceScatterInputMustBeOutputTimesGroupSize) {
  E rs;
  rs.name = "nccl:_reduce_scatter_base";
  rs.in = {8192, 1, 5120};
  rs.out = {4096, 1, 5120};
  EXPECT_TRUE(AnalyzeFlightRecorder(OneCollective({rs, rs}, "[0, 1]")).hangs.empty());
  EXPECT_FALSE(AnalyzeFlightRecorder(OneCollective({rs, rs, rs, rs})).hangs.empty());  // 4 ranks: 2x is wrong
}

TEST(FlightRecorderTest, DtypeAndStateMismatch) {
  E fp32;
  E bf16 = fp32;
  bf16.dtype = "BFloat16";
  auto a = AnalyzeFlightRecorder(OneCollective({fp32, fp32, fp32, bf16}));
  ASSERT_EQ(a.hangs.size(), 1u);
  EXPECT_EQ(a.hangs[0].mismatch->kind, "COLLECTIVE_DTYPE_MISMATCH");
  EXPECT_EQ(a.hangs[0].mismatch->ranks, (std::vector<int32_t>{3}));
  E started = fp32;
  started.state = "started";
  a = AnalyzeFlightRecorder(OneCollective({started, started, fp32, started}));
  ASSERT_EQ(a.hangs.size(), 1u);
  EXPECT_EQ(a.hangs[0].mismatch->kind, "COLLECTIVE_STATE_MISMATCH");
  EXPECT_EQ(a.hangs[0].mismatch->ranks, (std::vector<int32_t>{2}));
}

TEST(FlightRecorderTest, AllToAllIsCheckedOnTotals) {
  // Uneven splits are fine while the totals agree (utils.py check_size_alltoall).
  auto a2a = [](int64_t in, int64_t out) {
    E e;
    e.name = "nccl:all_to_all";
    e.in = {in, 8};
    e.out = {out, 8};
    return e;
  };
  EXPECT_TRUE(AnalyzeFlightRecorder(OneCollective({a2a(10, 12), a2a(14, 12), a2a(12, 12), a2a(12, 12)})).hangs.empty());
  const auto a = AnalyzeFlightRecorder(OneCollective({a2a(10, 12), a2a(14, 12), a2a(12, 12), a2a(13, 12)}));
  ASSERT_EQ(a.hangs.size(), 1u);
  EXPECT_EQ(a.hangs[0].mismatch->kind, "SIZE_OR_SYNTAX_MISMATCH");
  EXPECT_NE(a.hangs[0].description.find("392 input elements in all, 384 output elements"), std::string::npos)
      << a.hangs[0].description;
}

TEST(FlightRecorderTest, P2pOnATwoRankGroupMatchesByP2pSeqId) {
  auto op = [](const std::string& name, int64_t seq) {
    E e;
    e.pg = "5";
    e.desc = "pp";
    e.name = name;
    e.p2p = true;
    e.p2p_seq = seq;
    return e;
  };
  const std::tuple<std::string, std::string, std::string> pp = {"5", "pp", "[0, 1]"};
  std::vector<FlightRecorderDump> dumps = {
      MustParse(DumpBytes({pp}, {op("nccl:send 0->1", 1), op("nccl:send 0->1", 2)}), 0),
      MustParse(DumpBytes({pp}, {op("nccl:recv 1<-0", 1)}), 1)};
  auto a = AnalyzeFlightRecorder(dumps);
  ASSERT_EQ(a.hangs.size(), 1u);
  EXPECT_TRUE(a.hangs[0].p2p);
  EXPECT_EQ(a.hangs[0].seq, 2);
  EXPECT_EQ(a.hangs[0].missing_ranks, (std::vector<int32_t>{1}));
  // A send paired with a send is a syntax mismatch.
  dumps[1] = MustParse(DumpBytes({pp}, {op("nccl:send 1->0", 1)}), 1);
  dumps[0] = MustParse(DumpBytes({pp}, {op("nccl:send 0->1", 1)}), 0);
  a = AnalyzeFlightRecorder(dumps);
  ASSERT_EQ(a.hangs.size(), 1u);
  EXPECT_EQ(a.hangs[0].mismatch->kind, "SIZE_OR_SYNTAX_MISMATCH");
}

TEST(FlightRecorderTest, HangsAreOrderedLongestWaitingFirst) {
  // Group "1" (ranks 0-1) hangs at a collective created at 50, group "0" at one created at 3000.
  std::vector<FlightRecorderDump> dumps;
  for (int32_t r = 0; r < 4; ++r) {
    std::vector<E> entries;
    for (int64_t s = 1; s <= (r == 3 ? 2 : 3); ++s) {
      E e;
      e.seq = s;
      e.created = 1000 * s;
      entries.push_back(e);
    }
    if (r == 0) {
      E e;
      e.pg = "1";
      e.desc = "tp";
      e.created = 50;
      entries.insert(entries.begin(), e);
    }
    // Rank 1 never enqueued anything on "1" (its pg_status says so).
    dumps.push_back(MustParse(DumpBytes({kDp4, {"1", "tp", "[0, 1]"}}, entries, {{"1", r == 1 ? 0 : 1}}), r));
  }
  const FlightRecorderAnalysis a = AnalyzeFlightRecorder(dumps);
  ASSERT_EQ(a.hangs.size(), 2u);
  EXPECT_EQ(a.hangs[0].pg_name, "1");
  EXPECT_EQ(a.hangs[0].missing_ranks, (std::vector<int32_t>{1}));
  EXPECT_EQ(a.hangs[1].pg_name, "0");
}

TEST(FlightRecorderTest, DirectoryRulesPrefixAndRank) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "shardscope-fr-dir-test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir / name, std::ios::binary) << bytes;
  };
  write("nccl_trace_rank_1", DumpBytes({kDp4}, {E{}}));
  write("nccl_trace_rank_0", DumpBytes({kDp4}, {E{}}));
  write("report.json", "{}");                 // no rank digits: not a dump candidate
  write("memory_snapshot_rank0.json", "{}");  // another prefix: the known dump prefix wins
  auto dumps = ReadFlightRecorderDir(dir.string(), {});
  ASSERT_TRUE(dumps.ok()) << dumps.status().message();
  ASSERT_EQ(dumps->size(), 2u);
  EXPECT_EQ((*dumps)[0].rank, 0);
  EXPECT_EQ((*dumps)[1].rank, 1);
  // An unknown second prefix makes the choice ambiguous.
  write("other_3", DumpBytes({kDp4}, {E{}}));
  fs::remove(dir / "memory_snapshot_rank0.json");
  write("zzz_4", "x");
  auto ambiguous = ReadFlightRecorderDir(dir.string(), {});
  ASSERT_TRUE(ambiguous.ok()) << "the known prefix still wins";
  FlightRecorderDirOptions options;
  options.prefix = "zzz_";
  auto bad = ReadFlightRecorderDir(dir.string(), options);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("zzz_4: neither a pickle"), std::string::npos) << bad.status().message();
  fs::remove_all(dir);
  auto missing = ReadFlightRecorderDir(dir.string(), {});
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidInput);
}

// The shared 16-rank fixture (NVIDIA/nvidia-resiliency-ext tests/attribution/unit/fr_traces/
// gpu_error_1st): its tests assert the stuck collective is process group 74
// (EXPERT_MODEL_PARALLEL_GROUP), nccl:all_to_all of 4027x5120 BFloat16, missing ranks {12}.
TEST(FlightRecorderTest, RealSixteenRankDumps) {
  const std::string dir =
      std::string(SHARDSCOPE_SOURCE_DIR) + "/tests/fixtures/real/flight-recorder/moe-16-ranks-gpu-error";
  auto dumps = ReadFlightRecorderDir(dir, {});
  ASSERT_TRUE(dumps.ok()) << dumps.status().message();
  ASSERT_EQ(dumps->size(), 16u);
  EXPECT_EQ((*dumps)[12].version, "2.9");
  const FlightRecorderAnalysis a = AnalyzeFlightRecorder(*dumps);
  ASSERT_FALSE(a.hangs.empty());
  const FrHang& h = a.hangs[0];
  EXPECT_EQ(h.pg_name, "74");
  EXPECT_EQ(h.pg_desc, "EXPERT_MODEL_PARALLEL_GROUP");
  EXPECT_EQ(h.collective, "nccl:all_to_all");
  EXPECT_EQ(FrSizesText(h.input_sizes), "4027x5120");
  EXPECT_EQ(h.dtype, "BFloat16");
  EXPECT_EQ(h.missing_ranks, (std::vector<int32_t>{12}));
  for (const FrHang& other : a.hangs) EXPECT_EQ(other.missing_ranks, (std::vector<int32_t>{12})) << other.description;
}

}  // namespace
}  // namespace shardscope::traces

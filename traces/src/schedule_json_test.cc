#include "shardscope/traces/schedule_json.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace shardscope::traces {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::StartsWith;

// Two ranks, two programs, every op kind and every compute descriptor, an explicit
// binding and a program whose names table is not the canonical one.
Schedule MakeEverything() {
  Schedule schedule;
  schedule.metadata = {{"cluster.preset", "h100-dgx"}, {"plan", "fsdp \"x\".yaml"}};
  schedule.communicators = {{"dp", {0, 1}}, {"pair", {1, 0}}, {"world", {0, 1}}};

  Program first;
  first.name = "first";
  first.streams = {{"compute", 0}, {"ag", -1}, {"rs", -2}};
  first.events = {"ag done", "compute done"};
  first.tensors = {"params", "grads"};
  first.comm_slots = {"dp", "pp"};
  auto add = [&first](int64_t id, OpPayload payload, std::string_view name = "",
                      std::string_view module = "", Phase phase = Phase::kNone,
                      int32_t micro_batch = -1) {
    Op op;
    op.id = id;
    if (!name.empty()) op.name = first.InternName(name);
    if (!module.empty()) op.tags.module = first.InternName(module);
    op.tags.phase = phase;
    op.tags.micro_batch = micro_batch;
    op.payload = std::move(payload);
    first.ops.push_back(std::move(op));
  };
  add(0, AllocateOp{.tensor = 0, .bytes = 1 << 20, .stream = 1}, "alloc params");
  add(1,
      CollectiveOp{.type = CollectiveType::kAllGather,
                   .comm = 0,
                   .stream = 1,
                   .bytes = 1 << 20,
                   .dtype = DType::kBFloat16},
      "", "layers.0", Phase::kForward);
  add(2, EventRecordOp{.event = 0, .stream = 1});
  add(3, StreamWaitEventOp{.stream = 0, .event = 0});
  add(4,
      KernelOp{.stream = 0,
               .compute =
                   GemmDesc{.m = 128, .n = 256, .k = 64, .batch = 2, .dtype = DType::kFloat8E4M3}},
      "gemm qkv", "layers.0", Phase::kForward, 0);
  add(5,
      KernelOp{.stream = 0,
               .compute = AttentionDesc{.batch = 2,
                                        .heads = 16,
                                        .kv_heads = 4,
                                        .seq_q = 512,
                                        .seq_kv = 1024,
                                        .head_dim = 64,
                                        .causal = false,
                                        .backward = true,
                                        .dtype = DType::kFloat16}},
      "flash bwd", "layers.0", Phase::kBackward, 3);
  add(6, KernelOp{.stream = 0, .compute = MemoryBoundDesc{.bytes_read = 100, .bytes_written = 50}},
      "adam", "", Phase::kOptimizer);
  add(7, KernelOp{.stream = 0, .compute = FixedDurationDesc{.duration_ns = 1234}}, "spin", "",
      Phase::kCheckpoint);
  add(8, MemcpyOp{.kind = MemcpyKind::kDeviceToHost, .stream = 0, .bytes = 4096});
  add(9, MemcpyOp{.kind = MemcpyKind::kHostToDevice, .stream = 1, .bytes = 8});
  add(10, HostWorkOp{.duration_ns = 5000}, "python");
  add(11, StreamSynchronizeOp{.stream = 0});
  add(12, EventRecordOp{.event = 1, .stream = 0});
  add(13, EventSynchronizeOp{.event = 1});
  add(14, DeviceSynchronizeOp{});
  add(15, CollectiveOp{.type = CollectiveType::kReduceScatter,
                       .comm = 0,
                       .stream = 2,
                       .bytes = 2048,
                       .dtype = DType::kFloat32});
  add(16, CollectiveOp{.type = CollectiveType::kAllReduce, .comm = 0, .stream = 2, .bytes = 16});
  add(17, CollectiveOp{
              .type = CollectiveType::kBroadcast, .comm = 0, .stream = 2, .bytes = 16, .peer = 1});
  add(18, CollectiveOp{
              .type = CollectiveType::kReduce, .comm = 0, .stream = 2, .bytes = 16, .peer = 0});
  add(19, CollectiveOp{.type = CollectiveType::kAllToAll,
                       .comm = 0,
                       .stream = 2,
                       .bytes = 64,
                       .dtype = DType::kInt64});
  add(20, CollectiveOp{.type = CollectiveType::kSend,
                       .comm = 1,
                       .stream = 2,
                       .bytes = 32,
                       .dtype = DType::kInt8,
                       .peer = 1});
  add(21, FreeOp{.tensor = 0});
  add(42, AllocateOp{.tensor = 1, .bytes = 0, .stream = 2});
  add(43, RecordStreamOp{.tensor = 1, .stream = 1});
  add(-7, FreeOp{.tensor = 1});
  schedule.programs.push_back(std::move(first));

  Program second;
  second.name = "second";
  second.streams = {{"only", 3}};
  second.comm_slots = {"p2p"};
  second.names = {"unused", "recv"};  // not canonical: the writer must emit "names"
  Op recv;
  recv.id = 0;
  recv.name = 1;
  recv.payload = CollectiveOp{.type = CollectiveType::kRecv,
                              .comm = 0,
                              .stream = 0,
                              .bytes = 32,
                              .dtype = DType::kInt8,
                              .peer = 0};
  second.ops.push_back(recv);
  schedule.programs.push_back(std::move(second));

  schedule.ranks = {{0, {0, 1}}, {1, {1}}};
  return schedule;
}

StatusOr<Schedule> Parse(const std::string& text) { return ParseScheduleJson(text, "test.json"); }

std::string ErrorOf(const std::string& text) {
  StatusOr<Schedule> schedule = Parse(text);
  EXPECT_FALSE(schedule.ok());
  if (schedule.ok()) return "";
  EXPECT_EQ(schedule.status().code(), StatusCode::kInvalidInput);
  return schedule.status().message();
}

// A small valid schedule; tests replace one fragment to introduce one error.
constexpr std::string_view kSmall = R"({
  "version": 1,
  "communicators": [{"name": "dp", "ranks": [0, 1]}],
  "programs": [{
    "name": "main",
    "streams": [{"name": "compute"}, {"name": "comm", "priority": -1}],
    "events": ["e0"],
    "tensors": ["t0"],
    "comm_slots": ["dp"],
    "ops": [
      {"id": 0, "op": "allocate", "tensor": "t0", "bytes": 64, "stream": "comm"},
      {"id": 1, "op": "collective", "type": "all_gather", "comm": "dp", "stream": "comm", "bytes": 1024},
      {"id": 2, "op": "event_record", "event": "e0", "stream": "comm"},
      {"id": 3, "op": "stream_wait_event", "stream": "compute", "event": "e0"},
      {"id": 4, "op": "kernel", "stream": "compute", "gemm": {"m": 8, "n": 8, "k": 8}},
      {"id": 5, "op": "free", "tensor": "t0"}
    ]
  }],
  "ranks": [{"rank": 0, "program": "main"}, {"rank": 1, "program": "main"}]
})";

std::string SmallWith(std::string_view from, std::string_view to) {
  std::string text(kSmall);
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

TEST(ScheduleJsonTest, RoundTripsEveryOpKindAndDescriptor) {
  const Schedule original = MakeEverything();
  ASSERT_TRUE(ValidateSchedule(original).ok()) << ValidateSchedule(original).message();
  const std::string json = ScheduleToJson(original);
  EXPECT_THAT(json, HasSubstr("\"names\": [\"unused\", \"recv\"]"));
  EXPECT_THAT(json, HasSubstr("\"bind\": {\"pp\": \"pair\"}"));
  StatusOr<Schedule> parsed = Parse(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message() << "\n" << json;
  EXPECT_TRUE(*parsed == original) << json << "\n----\n" << ScheduleToJson(*parsed);
  EXPECT_EQ(ScheduleToJson(*parsed), json);  // deterministic
}

// An OOM-flag agreement point round-trips; without one no "oom_sync" key is written, so
// schedules from before the field stay byte-identical.
TEST(ScheduleJsonTest, RoundTripsOomSyncAndOmitsItWhenFalse) {
  Schedule original = MakeEverything();
  EXPECT_THAT(ScheduleToJson(original), ::testing::Not(HasSubstr("oom_sync")));
  int32_t marked = 0;
  for (Op& op : original.programs[0].ops) {
    auto* collective = std::get_if<CollectiveOp>(&op.payload);
    if (collective != nullptr && collective->type == CollectiveType::kAllReduce) {
      collective->oom_sync = true;
      ++marked;
    }
  }
  ASSERT_EQ(marked, 1);
  ASSERT_TRUE(ValidateSchedule(original).ok()) << ValidateSchedule(original).message();
  const std::string json = ScheduleToJson(original);
  const size_t at = json.find("\"oom_sync\": true");
  ASSERT_NE(at, std::string::npos) << json;
  EXPECT_EQ(json.find("\"oom_sync\"", at + 1), std::string::npos);  // only on that op
  StatusOr<Schedule> parsed = Parse(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_TRUE(*parsed == original);
  EXPECT_EQ(ScheduleToJson(*parsed), json);

  // "oom_sync": false reads as the default.
  std::string with_false = json;
  with_false.replace(at, std::string_view("\"oom_sync\": true").size(), "\"oom_sync\": false");
  StatusOr<Schedule> explicit_false = Parse(with_false);
  ASSERT_TRUE(explicit_false.ok()) << explicit_false.status().message();
  EXPECT_TRUE(*explicit_false == MakeEverything());

  // A send / recv cannot be an agreement point.
  Schedule p2p = MakeEverything();
  for (Op& op : p2p.programs[0].ops) {
    auto* collective = std::get_if<CollectiveOp>(&op.payload);
    if (collective != nullptr && collective->type == CollectiveType::kSend) collective->oom_sync = true;
  }
  const Status invalid = ValidateSchedule(p2p);
  ASSERT_FALSE(invalid.ok());
  EXPECT_THAT(invalid.message(), HasSubstr("cannot be an oom_sync point"));
}

TEST(ScheduleJsonTest, RoundTripsThroughAFile) {
  const std::string path =
      ::testing::TempDir() + "/schedule_json_test_" + std::to_string(::getpid()) + ".json";
  const Schedule original = MakeEverything();
  ASSERT_TRUE(WriteScheduleFile(original, path).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp." + std::to_string(::getpid())));
  StatusOr<Schedule> read = ReadScheduleFile(path);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_TRUE(*read == original);
  std::filesystem::remove(path);

  StatusOr<Schedule> missing = ReadScheduleFile(path);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kIoError);
  EXPECT_EQ(WriteScheduleFile(original, "/nonexistent-dir/x.json").code(), StatusCode::kIoError);
}

TEST(ScheduleJsonTest, ParsesTheHeaderExample) {
  // The example documented in schedule_json.h.
  StatusOr<Schedule> schedule = Parse(R"({
    "version": 1,
    "metadata": {"cluster.preset": "h100-dgx", "plan": "fsdp.yaml"},
    "communicators": [{"name": "dp", "ranks": [0, 1]}],
    "programs": [{
      "name": "main",
      "streams": [{"name": "compute", "priority": 0}, {"name": "ag", "priority": -1}],
      "events": ["ag0"],
      "tensors": ["params0"],
      "comm_slots": ["dp"],
      "ops": [
        {"id": 0, "op": "allocate", "tensor": "params0", "bytes": 8388608, "stream": "ag"},
        {"id": 1, "op": "collective", "type": "all_gather", "comm": "dp", "stream": "ag",
         "bytes": 8388608, "dtype": "bf16", "module": "layers.0", "phase": "forward"},
        {"id": 2, "op": "event_record", "event": "ag0", "stream": "ag"},
        {"id": 3, "op": "stream_wait_event", "stream": "compute", "event": "ag0"},
        {"id": 4, "op": "kernel", "name": "gemm qkv", "stream": "compute",
         "gemm": {"m": 4096, "n": 3072, "k": 1024, "batch": 1, "dtype": "bf16"},
         "module": "layers.0", "phase": "forward", "micro_batch": 0},
        {"id": 5, "op": "free", "tensor": "params0"},
        {"id": 6, "op": "device_synchronize"}
      ]
    }],
    "ranks": [{"rank": 0, "program": "main"}, {"rank": 1, "program": "main", "bind": {"dp": "dp"}}]
  })");
  ASSERT_TRUE(schedule.ok()) << schedule.status().message();
  EXPECT_EQ(schedule->world_size(), 2);
  EXPECT_EQ(schedule->metadata.at("plan"), "fsdp.yaml");
  const Program& program = schedule->ProgramOf(1);
  ASSERT_EQ(program.ops.size(), 7u);
  const Op& gemm = program.ops[4];
  EXPECT_EQ(program.NameOf(gemm.name), "gemm qkv");
  EXPECT_EQ(program.NameOf(gemm.tags.module), "layers.0");
  EXPECT_EQ(gemm.tags.phase, Phase::kForward);
  EXPECT_EQ(gemm.tags.micro_batch, 0);
  EXPECT_EQ(std::get<GemmDesc>(std::get<KernelOp>(gemm.payload).compute).n, 3072);
  const auto& gather = std::get<CollectiveOp>(program.ops[1].payload);
  EXPECT_EQ(gather.stream, 1);
  EXPECT_EQ(schedule->CommunicatorOf(1, gather.comm), 0);
}

TEST(ScheduleJsonTest, AppliesDefaultsAndAcceptsAnyKeyOrderAndComments) {
  StatusOr<Schedule> schedule = Parse(R"({
    // ops may come before the declarations they use
    "ranks": [{"rank": 0, "program": "p"}],
    "programs": [{
      "ops": [
        {"op": "kernel", "id": 9, "stream": "s", "attention": {"batch": 1, "heads": 8, "seq_q": 128, "head_dim": 64}},
        {"op": "kernel", "id": 10, "stream": "s", "memory": {"bytes_read": 5}}
      ],
      /* streams after ops */
      "streams": [{"name": "s"}],
      "name": "p"
    }],
    "version": 1
  })");
  ASSERT_TRUE(schedule.ok()) << schedule.status().message();
  const auto& attention =
      std::get<AttentionDesc>(std::get<KernelOp>(schedule->programs[0].ops[0].payload).compute);
  EXPECT_EQ(attention.kv_heads, 8);
  EXPECT_EQ(attention.seq_kv, 128);
  EXPECT_TRUE(attention.causal);
  EXPECT_FALSE(attention.backward);
  EXPECT_EQ(attention.dtype, DType::kBFloat16);
  const auto& memory =
      std::get<MemoryBoundDesc>(std::get<KernelOp>(schedule->programs[0].ops[1].payload).compute);
  EXPECT_EQ(memory.bytes_read, 5);
  EXPECT_EQ(memory.bytes_written, 0);
}

TEST(ScheduleJsonTest, SmallFixtureIsValid) {
  StatusOr<Schedule> schedule = Parse(std::string(kSmall));
  ASSERT_TRUE(schedule.ok()) << schedule.status().message();
}

TEST(ScheduleJsonTest, UnknownStreamNameNamesPathAndOpId) {
  EXPECT_EQ(ErrorOf(SmallWith(R"("stream": "compute", "event": "e0")",
                              R"("stream": "comms", "event": "e0")")),
            "test.json: /programs/0/ops/3/stream (op id 3): expected a stream name declared in "
            "/programs/0/streams, got \"comms\"");
}

TEST(ScheduleJsonTest, UnknownEventTensorAndSlotNames) {
  EXPECT_THAT(ErrorOf(SmallWith(R"("event": "e0", "stream": "comm")",
                                R"("event": "e1", "stream": "comm")")),
              HasSubstr("/programs/0/ops/2/event (op id 2): expected an event name declared in "
                        "/programs/0/events, got \"e1\""));
  EXPECT_THAT(
      ErrorOf(SmallWith(R"("op": "free", "tensor": "t0")", R"("op": "free", "tensor": "x")")),
      HasSubstr("/programs/0/ops/5/tensor (op id 5): expected a tensor name"));
  EXPECT_THAT(ErrorOf(SmallWith(R"("comm": "dp")", R"("comm": "tp")")),
              HasSubstr("/programs/0/ops/1/comm (op id 1): expected a communicator slot name "
                        "declared in /programs/0/comm_slots, got \"tp\""));
}

TEST(ScheduleJsonTest, WaitOnNeverRecordedEvent) {
  EXPECT_EQ(ErrorOf(SmallWith(
                R"({"id": 2, "op": "event_record", "event": "e0", "stream": "comm"},)", "")),
            "test.json: rank 0, op id 3 (stream_wait_event): event 'e0' is not recorded by any "
            "earlier op");
}

TEST(ScheduleJsonTest, NegativeBytes) {
  EXPECT_EQ(ErrorOf(SmallWith(R"("bytes": 1024)", R"("bytes": -1024)")),
            "test.json: /programs/0/ops/1/bytes (op id 1): expected an integer in [0, 1125899906842624], got -1024");
}

// Every number a schedule JSON gives is bounded above (schedule.h's limits), at its path:
// the inputs of issue 17, which once reached the engine or the models as they were.
TEST(ScheduleJsonTest, NumbersPastTheLimitsNameTheirPath) {
  // collective bytes 2^62 (once a 9.6e9 ms step): the limit is 2^50 = 1125899906842624.
  EXPECT_EQ(ErrorOf(SmallWith(R"("bytes": 1024)", R"("bytes": 4611686018427387904)")),
            "test.json: /programs/0/ops/1/bytes (op id 1): expected an integer in [0, 1125899906842624], got "
            "4611686018427387904");
  EXPECT_TRUE(Parse(SmallWith(R"("bytes": 1024)", R"("bytes": 1125899906842624)")).ok());  // the limit itself
  // allocate.bytes 2^63-1 (once a negative memory breakdown and exit 0).
  EXPECT_EQ(ErrorOf(SmallWith(R"("bytes": 64)", R"("bytes": 9223372036854775807)")),
            "test.json: /programs/0/ops/0/bytes (op id 0): expected an integer in [0, 1125899906842624], got "
            "9223372036854775807");
  // host_work.duration_ns 2^63-1 (once "event at -9223372036854196409 ns"): the limit is one
  // hour, 3,600,000,000,000 ns.
  EXPECT_EQ(ErrorOf(SmallWith(R"({"id": 5, "op": "free", "tensor": "t0"})",
                              R"({"id": 5, "op": "free", "tensor": "t0"},
                                 {"id": 6, "op": "host_work", "duration_ns": 9223372036854775807})")),
            "test.json: /programs/0/ops/6/duration_ns (op id 6): expected an integer in [0, 3600000000000], got "
            "9223372036854775807");
  EXPECT_EQ(ErrorOf(SmallWith(R"("gemm": {"m": 8, "n": 8, "k": 8})", R"("fixed": {"duration_ns": 3600000000001})")),
            "test.json: /programs/0/ops/4/fixed/duration_ns (op id 4): expected an integer in [0, 3600000000000], "
            "got 3600000000001");
  EXPECT_THAT(ErrorOf(SmallWith(R"("gemm": {"m": 8, "n": 8, "k": 8})",
                                R"("memory": {"bytes_read": 1125899906842625})")),
              HasSubstr("/programs/0/ops/4/memory/bytes_read (op id 4): expected an integer in [0, 1125899906842624]"));
  // A GEMM of m = n = k = 2^30 (once undefined behaviour in the GEMM model): each field is at
  // most 2^24 = 16777216.
  EXPECT_EQ(ErrorOf(SmallWith(R"("m": 8)", R"("m": 1073741824)")),
            "test.json: /programs/0/ops/4/gemm/m (op id 4): expected an integer in [1, 16777216], got 1073741824");
  // Every field within 2^24, but operand A = batch x m x k = 2^24 x 2^24 x 8 = 2^51 elements,
  // more than 2^48.
  EXPECT_EQ(ErrorOf(SmallWith(R"("gemm": {"m": 8, "n": 8, "k": 8})",
                              R"("gemm": {"m": 16777216, "n": 8, "k": 8, "batch": 16777216})")),
            "test.json: /programs/0/ops/4/gemm (op id 4): gemm operand A (batch x m x k) has 2.252e+15 elements, "
            "more than the limit of 281474976710656 (2^48)");
  // Attention Q = batch x heads x seq_q x head_dim = 2^10 x 2^10 x 2^20 x 2^8 = 2^48 is the limit; one more
  // head is past it.
  const std::string attention = R"("attention": {"batch": 1024, "heads": HEADS, "kv_heads": 1, "seq_q": 1048576,
                                                   "head_dim": 256})";
  const auto with_heads = [&](std::string_view heads) {
    std::string text = attention;
    text.replace(text.find("HEADS"), 5, heads);
    return SmallWith(R"("gemm": {"m": 8, "n": 8, "k": 8})", text);
  };
  EXPECT_TRUE(Parse(with_heads("1024")).ok()) << Parse(with_heads("1024")).status().message();
  EXPECT_EQ(ErrorOf(with_heads("1025")),
            "test.json: /programs/0/ops/4/attention (op id 4): attention operand Q (batch x heads x seq_q x "
            "head_dim) has 2.817e+14 elements, more than the limit of 281474976710656 (2^48)");
}

// Each duration is within an hour, but a program's sum is bounded too (2^58 ns), so a host
// clock cannot overflow adding them up: checked by ValidateSchedule on the whole program.
TEST(ScheduleJsonTest, AProgramsDeclaredDurationsAreBoundedInAll) {
  Schedule schedule;
  schedule.communicators = {{"world", {0}}};
  Program program;
  program.name = "main";
  program.streams = {{"s", 0}};
  // 2^58 / 3.6e12 = 80,063.99: 80,063 hour-long ops fit, the 80,064th (op id 80063) passes.
  constexpr int64_t kHour = kMaxOpDurationNs;
  const int64_t fits = kMaxProgramDurationNs / kHour;
  ASSERT_EQ(fits, 80063);
  for (int64_t i = 0; i <= fits; ++i) {
    Op op;
    op.id = i;
    op.payload = HostWorkOp{.duration_ns = kHour};
    program.ops.push_back(op);
  }
  schedule.programs = {program};
  schedule.ranks = {RankBinding{0, {}}};
  EXPECT_EQ(ValidateSchedule(schedule).message(),
            "rank 0, op id 80063 (host_work): the program's host_work and fixed-kernel durations add up to more than "
            "288230376151711744 ns (the limit)");
  schedule.programs[0].ops.pop_back();
  EXPECT_TRUE(ValidateSchedule(schedule).ok());
}

TEST(ScheduleJsonTest, CollectiveOnCommunicatorWithoutTheRank) {
  EXPECT_EQ(ErrorOf(SmallWith(R"("ranks": [0, 1])", R"("ranks": [0])")),
            "test.json: rank 1, op id 1 (collective): communicator 'dp' (slot 'dp') does not "
            "contain rank 1");
}

TEST(ScheduleJsonTest, FreeOfUnallocatedTensor) {
  EXPECT_EQ(
      ErrorOf(SmallWith(
          R"({"id": 0, "op": "allocate", "tensor": "t0", "bytes": 64, "stream": "comm"},)", "")),
      "test.json: rank 0, op id 5 (free): tensor 't0' is not allocated (no earlier allocate)");
}

TEST(ScheduleJsonTest, DuplicateOpId) {
  EXPECT_EQ(
      ErrorOf(SmallWith(R"("id": 4)", R"("id": 2)")),
      "test.json: rank 0, op id 2 (kernel): duplicate op id (ops #2 and #4 of program 'main')");
}

TEST(ScheduleJsonTest, BadVersion) {
  EXPECT_EQ(ErrorOf(SmallWith(R"("version": 1)", R"("version": 2)")),
            "test.json: /version: unsupported schedule version 2 (this build reads version 1)");
  EXPECT_EQ(ErrorOf(SmallWith(R"("version": 1,)", "")),
            "test.json: /: missing required key \"version\"");
}

TEST(ScheduleJsonTest, UnknownKeysListTheExpectedOnes) {
  EXPECT_EQ(ErrorOf(SmallWith(R"("op": "free", "tensor": "t0")",
                              R"("op": "free", "tensor": "t0", "strem": 1)")),
            "test.json: /programs/0/ops/5/strem (op id 5): unknown key \"strem\" in a free op "
            "(expected: id, op, name, module, phase, micro_batch, tensor)");
  EXPECT_THAT(ErrorOf(SmallWith(R"("version": 1,)", R"("version": 1, "extra": {},)")),
              HasSubstr("/extra: unknown key \"extra\" in the schedule (expected: version, "
                        "metadata, communicators, programs, ranks)"));
  EXPECT_THAT(ErrorOf(SmallWith(R"("m": 8,)", R"("m": 8, "q": 1,)")),
              HasSubstr("/programs/0/ops/4/gemm/q (op id 4): unknown key \"q\" in gemm"));
  EXPECT_THAT(ErrorOf(SmallWith(R"({"name": "compute"})", R"({"name": "compute", "prio": 1})")),
              HasSubstr("/programs/0/streams/0/prio: unknown key \"prio\" in a stream"));
}

TEST(ScheduleJsonTest, WrongTypes) {
  EXPECT_EQ(ErrorOf(SmallWith(R"("bytes": 1024)", R"("bytes": "1024")")),
            "test.json: /programs/0/ops/1/bytes (op id 1): expected an integer, got \"1024\"");
  EXPECT_EQ(ErrorOf(SmallWith(R"("bytes": 1024)", R"("bytes": 1024.0)")),
            "test.json: /programs/0/ops/1/bytes (op id 1): expected an integer, got 1024.0");
  EXPECT_THAT(ErrorOf(SmallWith(R"("bytes": 1024)", R"("bytes": 18446744073709551615)")),
              HasSubstr("/programs/0/ops/1/bytes (op id 1): expected an integer in"));
  EXPECT_THAT(ErrorOf(SmallWith(R"("ranks": [0, 1])", R"("ranks": [0, "1"])")),
              HasSubstr("/communicators/0/ranks/1: expected an integer"));
  EXPECT_THAT(ErrorOf(SmallWith(R"("events": ["e0"])", R"("events": "e0")")),
              HasSubstr("/programs/0/events: expected an array, got \"e0\""));
  EXPECT_THAT(ErrorOf(SmallWith(R"({"id": 5, "op": "free", "tensor": "t0"})", "17")),
              HasSubstr("/programs/0/ops/5: expected an object, got 17"));
  EXPECT_THAT(ErrorOf("[]"), HasSubstr("test.json: /: expected an object, got an array"));
}

TEST(ScheduleJsonTest, StructuralErrors) {
  EXPECT_THAT(
      ErrorOf(SmallWith(R"({"rank": 1, "program": "main"})", R"({"rank": 2, "program": "main"})")),
      HasSubstr("/ranks/1/rank: expected 1 (ranks are listed 0..N-1 in order), got 2"));
  EXPECT_THAT(
      ErrorOf(SmallWith(R"({"rank": 1, "program": "main"})", R"({"rank": 1, "program": "x"})")),
      HasSubstr("/ranks/1/program: expected a program name declared in /programs"));
  EXPECT_THAT(ErrorOf(SmallWith(R"({"rank": 1, "program": "main"})",
                                R"({"rank": 1, "program": "main", "bind": {"tp": "dp"}})")),
              HasSubstr("/ranks/1/bind/tp: program \"main\" declares no communicator slot \"tp\""));
  EXPECT_THAT(
      ErrorOf(SmallWith(R"({"rank": 1, "program": "main"})",
                        R"({"rank": 1, "program": "main", "bind": {"dp": "nope"}})")),
      HasSubstr("/ranks/1/bind/dp: expected a communicator name declared in /communicators"));
  EXPECT_THAT(ErrorOf(SmallWith(R"("comm_slots": ["dp"])", R"("comm_slots": ["dp", "tp"])")),
              HasSubstr("test.json: rank 0: communicator slot 'tp' of program 'main' is bound to "
                        "no communicator"));
  EXPECT_THAT(ErrorOf(SmallWith(R"("tensors": ["t0"])", R"("tensors": ["t0", "t0"])")),
              HasSubstr("/programs/0/tensors/1: tensor \"t0\" declared twice"));
  EXPECT_THAT(ErrorOf(SmallWith(R"("m": 8,)", R"("m": 8, "m": 9,)")),
              HasSubstr("/programs/0/ops/4/gemm/m: duplicate key \"m\""));
  EXPECT_THAT(
      ErrorOf(SmallWith(R"("gemm": {"m": 8, "n": 8, "k": 8})",
                        R"("gemm": {"m": 8, "n": 8, "k": 8}, "fixed": {"duration_ns": 1})")),
      HasSubstr("(op id 4): a kernel op needs exactly one of gemm, attention, memory, "
                "fixed; got gemm, fixed"));
  EXPECT_THAT(
      ErrorOf(SmallWith(R"("type": "all_gather",)", R"("type": "all_gather", "peer": 1,)")),
      HasSubstr("/programs/0/ops/1/peer (op id 1): a all_gather collective takes no \"peer\""));
  EXPECT_THAT(ErrorOf(SmallWith(R"("type": "all_gather",)", R"("type": "broadcast",)")),
              HasSubstr("/programs/0/ops/1 (op id 1): missing required key \"root\""));
  EXPECT_THAT(ErrorOf(SmallWith(R"("type": "all_gather",)", R"("type": "allgather",)")),
              HasSubstr("/programs/0/ops/1/type (op id 1): unknown collective type \"allgather\""));
  EXPECT_THAT(ErrorOf(SmallWith(R"("op": "free")", R"("op": "release")")),
              HasSubstr("/programs/0/ops/5/op (op id 5): unknown op kind \"release\" (expected: "
                        "kernel, collective, memcpy,"));
  EXPECT_THAT(ErrorOf(SmallWith(R"({"id": 5, "op": "free", "tensor": "t0"})",
                                R"({"op": "free", "tensor": "t0"})")),
              HasSubstr("/programs/0/ops/5: missing required key \"id\""));
  std::string deep =
      SmallWith(R"("version": 1,)", R"("version": 1, "metadata": )" + std::string(100, '[') +
                                        std::string(100, ']') + ",");
  EXPECT_THAT(ErrorOf(deep), HasSubstr("nested deeper than 64 levels"));
}

TEST(ScheduleJsonTest, SyntaxErrorsGiveLineAndColumn) {
  EXPECT_THAT(ErrorOf("{\n  \"version\": 1,\n  \"programs\": tru"),
              MatchesRegex("test\\.json:3:[0-9]+: invalid JSON: .*"));
  EXPECT_THAT(ErrorOf("{\"version\": 1,,}"), StartsWith("test.json:1:15: invalid JSON: "));
  EXPECT_THAT(ErrorOf(""), StartsWith("test.json:1:1: invalid JSON: "));
  EXPECT_THAT(ErrorOf("{\"version\": 1e999}"), StartsWith("test.json:1:"));
  EXPECT_THAT(ErrorOf("{\"a\": \"\xff\"}"), StartsWith("test.json:1:"));
}

TEST(ScheduleJsonTest, EveryTruncationIsAnErrorNeverACrash) {
  const std::string text = ScheduleToJson(MakeEverything());
  for (size_t length = 0; length < text.size(); length += 7) {
    StatusOr<Schedule> schedule = Parse(text.substr(0, length));
    ASSERT_FALSE(schedule.ok()) << length;
    EXPECT_EQ(schedule.status().code(), StatusCode::kInvalidInput);
    EXPECT_THAT(schedule.status().message(),
                MatchesRegex("test\\.json:[0-9]+:[0-9]+: invalid JSON: .*"));
  }
  const std::string garbage("\x00\x01{[\"\\u12", 9);
  EXPECT_EQ(Parse(garbage).status().code(), StatusCode::kInvalidInput);
}

TEST(ScheduleJsonTest, ReadFileReportsLineAndColumn) {
  const std::string path =
      ::testing::TempDir() + "/schedule_json_bad_" + std::to_string(::getpid()) + ".json";
  {
    std::ofstream out(path);
    out << "{\n\n  \"version\": ?\n}";
  }
  StatusOr<Schedule> schedule = ReadScheduleFile(path);
  ASSERT_FALSE(schedule.ok());
  EXPECT_THAT(schedule.status().message(), StartsWith(path + ":3:14: invalid JSON: "));
  std::filesystem::remove(path);
}

// The fuzzers' seeds are valid inputs; inputs that once crashed a reader must now give a
// result or InvalidInput.
TEST(ScheduleJsonTest, FuzzSeedsParseAndRegressionsDoNotCrash) {
  const std::filesystem::path root(SHARDSCOPE_SOURCE_DIR);
  size_t seeds = 0;
  for (const auto& entry : std::filesystem::directory_iterator(root / "fuzz/corpus/schedule")) {
    StatusOr<Schedule> read = ReadScheduleFile(entry.path().string());
    EXPECT_TRUE(read.ok()) << read.status().message();
    ++seeds;
  }
  EXPECT_GE(seeds, 2u);
  for (const auto& entry :
       std::filesystem::directory_iterator(root / "tests/regressions/schedule")) {
    if (entry.path().filename() == "README.md") continue;
    StatusOr<Schedule> read = ReadScheduleFile(entry.path().string());
    if (!read.ok()) {
      EXPECT_EQ(read.status().code(), StatusCode::kInvalidInput) << entry.path();
    }
  }
}

}  // namespace
}  // namespace shardscope::traces

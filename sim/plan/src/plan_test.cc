// Tests for plan files as a whole: a full plan, the defaults of omitted sections, the bundled
// examples, and that every kind of mistake the parser catches in any section (unknown and
// duplicate keys, wrong types, out-of-range numbers, YAML errors, a section for another
// strategy) is reported with the file, line, column and key path. Each section's own tests are
// in plan_<section>_test.cc.
#include "shardscope/sim/plan/plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "plan_test_support.h"

namespace shardscope::sim {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(PlanTest, FullValidPlan) {
  const Plan plan = ParseOk(Lines({
      "model: llama3-8b",
      "cluster:",
      "  preset: dgx-a100",
      "  nodes: 8",
      "  contention: {compute_slowdown: 0.25, comm_slowdown: 0.5}",
      "strategy: fsdp2",
      "training:",
      "  seq_len: 8192",
      "  micro_batch_size: 2",
      "  grad_accum_steps: 4",
      "  activation_checkpointing: full",
      "  dtype: bf16",
      "fsdp2:",
      "  reshard_after_forward: false",
      "host:",
      "  launch_overhead_us: 4.5",
      "  hook_overhead_us: 30",
      "  python_op_overhead_us: 0",
  }));
  EXPECT_EQ(plan.source, kSource);
  const StatusOr<ModelSpec> llama = FindModelPreset("llama3-8b");
  ASSERT_TRUE(llama.ok()) << llama.status().message();
  EXPECT_EQ(plan.model.name, "llama3-8b");
  EXPECT_EQ(plan.model.layers, llama->layers);
  EXPECT_EQ(plan.model.hidden, llama->hidden);
  const StatusOr<ClusterSpec> a100 = FindClusterPreset("dgx-a100", 8);
  ASSERT_TRUE(a100.ok()) << a100.status().message();
  EXPECT_EQ(plan.cluster.nodes, 8);
  EXPECT_EQ(plan.cluster.world_size(), 8 * a100->gpus_per_node);
  EXPECT_EQ(plan.cluster.gpu.name, a100->gpu.name);
  EXPECT_EQ(plan.strategy, Strategy::kFsdp2);
  EXPECT_EQ(plan.training.seq_len, 8192);
  EXPECT_EQ(plan.training.micro_batch_size, 2);
  EXPECT_EQ(plan.training.grad_accum_steps, 4);
  EXPECT_EQ(plan.training.activation_checkpointing, ActivationCheckpointing::kFull);
  EXPECT_EQ(plan.training.dtype, traces::DType::kBFloat16);
  EXPECT_EQ(plan.fsdp2.reshard_after_forward, ReshardAfterForward::kFalse);
  EXPECT_DOUBLE_EQ(plan.contention.compute_slowdown, 0.25);
  EXPECT_DOUBLE_EQ(plan.contention.comm_slowdown, 0.5);
  EXPECT_EQ(plan.host.launch_overhead_ns, 4'500);
  EXPECT_EQ(plan.host.hook_overhead_ns, 30'000);
  EXPECT_EQ(plan.host.python_op_overhead_ns, 0);
}

TEST(PlanTest, OmittedSectionsTakeDefaults) {
  const Plan plan = ParseOk(Lines({"model: llama3-8b", "cluster: dgx-a100", "strategy: fsdp2"}));
  EXPECT_EQ(plan.cluster.nodes, 1);
  EXPECT_EQ(plan.training.seq_len, TrainingConfig{}.seq_len);
  EXPECT_EQ(plan.training.dtype, traces::DType::kBFloat16);
  EXPECT_EQ(plan.fsdp2.reshard_after_forward, ReshardAfterForward::kTrue);
  EXPECT_EQ(plan.host.launch_overhead_ns, DefaultHostConfig().launch_overhead_ns);
  EXPECT_EQ(plan.host.hook_overhead_ns, DefaultHostConfig().hook_overhead_ns);
  EXPECT_EQ(plan.host.python_op_overhead_ns, DefaultHostConfig().python_op_overhead_ns);
  EXPECT_DOUBLE_EQ(plan.contention.compute_slowdown, DefaultContentionConfig().compute_slowdown);
  EXPECT_DOUBLE_EQ(plan.contention.comm_slowdown, DefaultContentionConfig().comm_slowdown);
}

TEST(PlanTest, DefaultsAreSourcedNonZeroValues) {
  const HostConfig host = DefaultHostConfig();
  EXPECT_GT(host.launch_overhead_ns, 0);
  EXPECT_GT(host.hook_overhead_ns, 0);
  EXPECT_GT(host.python_op_overhead_ns, 0);
  const ContentionConfig contention = DefaultContentionConfig();
  EXPECT_GT(contention.compute_slowdown, 0);
  EXPECT_GT(contention.comm_slowdown, 0);
}

TEST(PlanTest, StrategyNames) {
  EXPECT_EQ(StrategyName(Strategy::kFsdp2), "fsdp2");
  EXPECT_EQ(StrategyName(Strategy::kDdp), "ddp");
  EXPECT_EQ(StrategyName(Strategy::kFsdp1), "fsdp1");
  EXPECT_EQ(StrategyName(Strategy::kZero1), "zero1");
  EXPECT_EQ(StrategyName(Strategy::kZero2), "zero2");
  EXPECT_EQ(StrategyName(Strategy::kZero3), "zero3");
}

TEST(PlanTest, BundledExamplesLoad) {
  for (const char* name :
       {"llama3-8b-fsdp2-64xa100.yaml", "llama3-8b-ddp-8xa100.yaml", "tiny-fsdp2-2gpu.yaml"}) {
    const std::string path = std::string(SHARDSCOPE_SOURCE_DIR) + "/examples/" + name;
    StatusOr<Plan> plan = LoadPlanFile(path);
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    EXPECT_EQ(plan->source, path);
  }
  StatusOr<Plan> main_example =
      LoadPlanFile(std::string(SHARDSCOPE_SOURCE_DIR) + "/examples/llama3-8b-fsdp2-64xa100.yaml");
  ASSERT_TRUE(main_example.ok());
  EXPECT_EQ(main_example->cluster.world_size(), 64);
  EXPECT_EQ(main_example->training.seq_len, 8192);
  StatusOr<Plan> tiny =
      LoadPlanFile(std::string(SHARDSCOPE_SOURCE_DIR) + "/examples/tiny-fsdp2-2gpu.yaml");
  ASSERT_TRUE(tiny.ok());
  EXPECT_EQ(tiny->cluster.world_size(), 2);
  EXPECT_EQ(tiny->model.layers, 2);
  EXPECT_EQ(tiny->training.seq_len, 128);
}

TEST(PlanTest, RegressionInputsNeverCrash) {
  // Inputs the fuzzer once found; each must come back as a Status.
  const std::filesystem::path dir =
      std::filesystem::path(SHARDSCOPE_SOURCE_DIR) / "tests/regressions/plan";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no regression inputs";
  for (const auto& file : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(file.path(), std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    StatusOr<Plan> plan = ParsePlan(text, file.path().filename().string());
    if (!plan.ok()) {
      EXPECT_FALSE(plan.status().message().empty()) << file.path();
    }
  }
}

TEST(PlanErrorTest, UnknownTopLevelKey) {
  const std::string message = ParseError(BasePlan() + "optimizer: adam\n");
  EXPECT_THAT(message, AllOf(HasSubstr("test.yaml:10:1: optimizer: "),
                             HasSubstr("one of the keys model, cluster, strategy"),
                             HasSubstr("unknown key 'optimizer'")));
}

TEST(PlanErrorTest, UnknownNestedKey) {
  const std::string message = ParseError(Lines({
      "model: llama3-8b",
      "cluster: dgx-a100",
      "strategy: fsdp2",
      "training:",
      "  seq_len: 8192",
      "  sequence_length: 8192",
  }));
  EXPECT_THAT(message, AllOf(HasSubstr("test.yaml:6:3: training.sequence_length: "),
                             HasSubstr("seq_len, micro_batch_size, grad_accum_steps")));
}

TEST(PlanErrorTest, UnknownKeyTwoLevelsDown) {
  const std::string message = ParseError(Lines({
      "model: llama3-8b",
      "cluster:",
      "  preset: dgx-a100",
      "  contention:",
      "    compute_slowdown: 0.1",
      "    network_slowdown: 0.1",
      "strategy: fsdp2",
  }));
  EXPECT_THAT(message, AllOf(HasSubstr("test.yaml:6:5: cluster.contention.network_slowdown: "),
                             HasSubstr("compute_slowdown, comm_slowdown")));
}

TEST(PlanErrorTest, DuplicateKey) {
  const std::string message = ParseError(Lines({
      "model: llama3-8b",
      "cluster: dgx-a100",
      "strategy: fsdp2",
      "training:",
      "  seq_len: 8192",
      "  seq_len: 4096",
  }));
  EXPECT_THAT(message, AllOf(HasSubstr("test.yaml:6:3: training.seq_len: "),
                             HasSubstr("duplicate (first at line 5)")));
}

TEST(PlanErrorTest, MissingRequiredKey) {
  const std::string message = ParseError(Lines({"model: llama3-8b", "cluster: dgx-a100"}));
  EXPECT_THAT(message, AllOf(HasSubstr("test.yaml:1:1: strategy: "),
                             HasSubstr("fsdp2, fsdp1, zero1, zero2, zero3, ddp"),
                             HasSubstr("the key is missing")));
}

TEST(PlanErrorTest, WrongTypeSequenceForInt) {
  std::string text = BasePlan();
  text.replace(text.find("seq_len: 8192"), 13, "seq_len: [1, 2]");
  EXPECT_THAT(ParseError(text),
              AllOf(HasSubstr("test.yaml:5:12: training.seq_len: expected a positive integer"),
                    HasSubstr("got a sequence")));
}

TEST(PlanErrorTest, WrongTypeScalarForSection) {
  const std::string message = ParseError(
      Lines({"model: llama3-8b", "cluster: dgx-a100", "strategy: fsdp2", "training: 8192"}));
  EXPECT_THAT(message, AllOf(HasSubstr("test.yaml:4:11: training: expected a mapping with keys "
                                       "seq_len"),
                             HasSubstr("got '8192'")));
}

TEST(PlanErrorTest, QuotedNumberIsAString) {
  std::string text = BasePlan();
  text.replace(text.find("seq_len: 8192"), 13, "seq_len: \"8192\"");
  EXPECT_THAT(ParseError(text), AllOf(HasSubstr("test.yaml:5:12: training.seq_len: "),
                                      HasSubstr("got the string '8192'")));
}

TEST(PlanErrorTest, NegativeSize) {
  std::string text = BasePlan();
  text.replace(text.find("micro_batch_size: 1"), 19, "micro_batch_size: -2");
  EXPECT_THAT(ParseError(text),
              AllOf(HasSubstr("test.yaml:6:21: training.micro_batch_size: expected a positive "
                              "integer"),
                    HasSubstr("got '-2'")));
}

TEST(PlanErrorTest, ZeroSize) {
  std::string text = BasePlan();
  text.replace(text.find("seq_len: 8192"), 13, "seq_len: 0");
  EXPECT_THAT(ParseError(text), HasSubstr("test.yaml:5:12: training.seq_len: expected a "
                                          "positive integer"));
}

TEST(PlanErrorTest, FloatForInt) {
  std::string text = BasePlan();
  text.replace(text.find("seq_len: 8192"), 13, "seq_len: 8192.5");
  EXPECT_THAT(ParseError(text), AllOf(HasSubstr("test.yaml:5:12: training.seq_len: "),
                                      HasSubstr("got '8192.5' (not an integer)")));
  text = BasePlan();
  text.replace(text.find("seq_len: 8192"), 13, "seq_len: 1e4");
  EXPECT_THAT(ParseError(text), HasSubstr("got '1e4' (not an integer)"));
}

TEST(PlanErrorTest, HugeNumber) {
  std::string text = BasePlan();
  text.replace(text.find("seq_len: 8192"), 13, "seq_len: 99999999999999999999999999");
  EXPECT_THAT(ParseError(text), AllOf(HasSubstr("test.yaml:5:12: training.seq_len: expected a "
                                                "positive integer <= "),
                                      HasSubstr("got '99999999999999999999999999'")));
  // Fits int64 but not the int32 field.
  const std::string nodes = ParseError(Lines(
      {"model: llama3-8b", "cluster: {preset: dgx-a100, nodes: 4294967296}", "strategy: fsdp2"}));
  EXPECT_THAT(nodes,
              AllOf(HasSubstr("test.yaml:2:36: cluster.nodes: "), HasSubstr("got '4294967296'")));
}

TEST(PlanErrorTest, NanAndInfinity) {
  for (const char* bad : {".nan", "nan", ".inf", "inf", "-1", "0"}) {
    const std::string message = ParseError(Lines({
        "model: llama3-8b",
        "cluster: dgx-a100",
        "strategy: ddp",
        std::string("ddp: {bucket_cap_mb: ") + bad + "}",
    }));
    EXPECT_THAT(message,
                AllOf(HasSubstr("test.yaml:4:22: ddp.bucket_cap_mb: expected a number > 0"),
                      HasSubstr(std::string("got '") + bad + "'")))
        << bad;
  }
}

TEST(PlanErrorTest, NullValue) {
  std::string text = BasePlan();
  text.replace(text.find("seq_len: 8192"), 13, "seq_len:");
  // Located at the key: yaml-cpp marks an empty value where the next token starts.
  EXPECT_THAT(ParseError(text),
              AllOf(HasSubstr("test.yaml:5:3: training.seq_len: "), HasSubstr("got null")));
}

TEST(PlanErrorTest, BadEnumListsAllowedValues) {
  std::string text = BasePlan();
  text.replace(text.find("dtype: bf16"), 11, "dtype: int8");
  EXPECT_THAT(ParseError(text), HasSubstr("test.yaml:7:10: training.dtype: expected one of bf16, "
                                          "fp16, fp32, fp8, got 'int8'"));
  const std::string mlp = ParseError(
      Lines({"model: {preset: llama3-8b, mlp: relu}", "cluster: dgx-a100", "strategy: fsdp2"}));
  EXPECT_THAT(mlp,
              HasSubstr("test.yaml:1:33: model.mlp: expected one of swiglu, gelu, got 'relu'"));
}

TEST(PlanErrorTest, BadBoolean) {
  std::string text = BasePlan();
  text.replace(text.find("reshard_after_forward: true"), 27, "reshard_after_backward: yes");
  EXPECT_THAT(ParseError(text), HasSubstr("test.yaml:9:27: fsdp2.reshard_after_backward: expected "
                                          "true or false, got 'yes'"));
}

TEST(PlanErrorTest, UnknownPresets) {
  EXPECT_THAT(ParseError(Lines({"model: llama9-1t", "cluster: dgx-a100", "strategy: fsdp2"})),
              AllOf(HasSubstr("test.yaml:1:8: model: expected a model preset ("),
                    HasSubstr("llama3-8b"), HasSubstr("got 'llama9-1t'")));
  EXPECT_THAT(
      ParseError(Lines({"model: llama3-8b", "cluster: {preset: dgx-z900}", "strategy: fsdp2"})),
      AllOf(HasSubstr("test.yaml:2:19: cluster.preset: expected a cluster preset ("),
            HasSubstr("dgx-a100"), HasSubstr("got 'dgx-z900'")));
  EXPECT_THAT(ParseError(Lines({"model: llama3-8b", "cluster: {preset: dgx-a100, gpu: tpu-v5}",
                                "strategy: fsdp2"})),
              AllOf(HasSubstr("test.yaml:2:34: cluster.gpu: expected a GPU preset ("),
                    HasSubstr("got 'tpu-v5'")));
}

TEST(PlanErrorTest, SectionForOtherStrategy) {
  const std::string message = ParseError(BasePlan() + "ddp:\n  bucket_cap_mb: 25\n");
  EXPECT_THAT(message, AllOf(HasSubstr("test.yaml:10:1: ddp: "),
                             HasSubstr("section 'ddp' given but strategy is fsdp2")));
}

TEST(PlanErrorTest, HsdpIsNotAStrategy) {
  std::string text = BasePlan();
  text.replace(text.find("strategy: fsdp2"), 15, "strategy: hsdp");
  EXPECT_THAT(ParseError(text),
              AllOf(HasSubstr("test.yaml:3:11: strategy: expected one of fsdp2, fsdp1, zero1, "
                              "zero2, zero3, ddp, got 'hsdp' (HSDP is not a strategy of its own"),
                    HasSubstr("fsdp2 with fsdp2.mesh.replicate > 1"),
                    HasSubstr("fsdp1 with fsdp1.sharding_strategy HYBRID_SHARD")));
}

TEST(PlanErrorTest, UnknownStrategy) {
  std::string text = BasePlan();
  text.replace(text.find("strategy: fsdp2"), 15, "strategy: megatron");
  EXPECT_THAT(ParseError(text),
              HasSubstr("test.yaml:3:11: strategy: expected one of fsdp2, fsdp1, zero1, zero2, "
                        "zero3, ddp, got 'megatron'"));
}

TEST(PlanErrorTest, YamlSyntaxError) {
  const std::string message = ParseError(Lines({
      "model: llama3-8b",
      "cluster: dgx-a100",
      "strategy: fsdp2",
      "training: {seq_len: 8192",
      "host: {}",
  }));
  EXPECT_THAT(message, AllOf(HasSubstr("test.yaml:5:"), HasSubstr("invalid YAML")));
}

TEST(PlanErrorTest, EmptyFile) {
  EXPECT_THAT(ParseError(""), AllOf(HasSubstr("test.yaml:1:1:"), HasSubstr("empty file")));
  EXPECT_THAT(ParseError("# nothing but a comment\n"), HasSubstr("empty file"));
}

TEST(PlanErrorTest, TopLevelNotAMapping) {
  EXPECT_THAT(ParseError("- model\n- cluster\n"),
              HasSubstr("test.yaml:1:1: (top level): expected a mapping with keys model, "
                        "cluster, strategy, training, fsdp2, fsdp1, zero, ddp, moe, checkpoint, "
                        "host, allocator, oom, divergence, expect, got a sequence"));
  EXPECT_THAT(ParseError("fsdp2\n"), HasSubstr("got 'fsdp2'"));
}

TEST(PlanErrorTest, SeveralDocuments) {
  EXPECT_THAT(ParseError(BasePlan() + "---\n" + BasePlan()),
              AllOf(HasSubstr("test.yaml:10:"),
                    HasSubstr("expected one YAML document, got more than one")));
}

TEST(PlanErrorTest, MalformedTagDoesNotHang) {
  // yaml-cpp 0.7's LoadAll never returns on this input (found by fuzz/plan_loader_fuzz).
  EXPECT_THAT(ParseError("!a,b!"), HasSubstr("test.yaml:1:3: (top level): "));
}

TEST(PlanErrorTest, BinaryGarbageIsQuotedSafely) {
  const std::string message =
      ParseError("model: \"a\\x01b\"\ncluster: dgx-a100\nstrategy: fsdp2\n");
  EXPECT_THAT(message, HasSubstr("'a\\x01b'"));
}

TEST(PlanErrorTest, SectionForOtherFsdpVersion) {
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp1", {"fsdp2: {wrap: root}"})),
              HasSubstr("test.yaml:4:1: fsdp2: expected only the 'fsdp1' section, got section "
                        "'fsdp2' given but strategy is fsdp1"));
}

TEST(PlanFileTest, MissingFile) {
  StatusOr<Plan> plan = LoadPlanFile("/nonexistent/x.yaml");
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kIoError);
  EXPECT_EQ(plan.status().message(),
            "cannot read plan '/nonexistent/x.yaml': No such file or directory");
}

TEST(PlanFileTest, DirectoryIsNotAPlan) {
  StatusOr<Plan> plan = LoadPlanFile(std::filesystem::temp_directory_path().string());
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kIoError);
  EXPECT_THAT(plan.status().message(), HasSubstr("Is a directory"));
}

TEST(PlanFileTest, ErrorsNameTheFile) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / "shardscope_plan_test_bad.yaml";
  {
    std::ofstream out(path);
    out << "model: llama3-8b\ncluster: dgx-a100\nstrategy: hsdp\n";
  }
  StatusOr<Plan> plan = LoadPlanFile(path.string());
  std::filesystem::remove(path);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(plan.status().message(),
              HasSubstr(path.string() + ":3:11: strategy: expected one of"));
}

}  // namespace
}  // namespace shardscope::sim

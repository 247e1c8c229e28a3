// Tests for plan files: the schema, presets with overrides, and that every kind of mistake
// is reported with the file, line, column and key path.
#include "shardscope/sim/plan/plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

namespace shardscope::sim {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kSource[] = "test.yaml";

// Joins lines with '\n' so a test can say which line (1-based) an error must point at.
std::string Lines(std::initializer_list<std::string_view> lines) {
  std::string text;
  for (std::string_view line : lines) {
    text += line;
    text += '\n';
  }
  return text;
}

Plan ParseOk(const std::string& text) {
  StatusOr<Plan> plan = ParsePlan(text, kSource);
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return plan.ok() ? std::move(plan).value() : Plan{};
}

// Parses `text`, expects kInvalidInput, returns the message.
std::string ParseError(const std::string& text) {
  StatusOr<Plan> plan = ParsePlan(text, kSource);
  EXPECT_FALSE(plan.ok()) << "parsed without error:\n" << text;
  if (plan.ok()) return "";
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidInput) << plan.status().message();
  return plan.status().message();
}

// The valid plan most error tests start from; line numbers matter.
std::string BasePlan() {
  return Lines({
      "model: llama3-8b",                       // 1
      "cluster: {preset: dgx-a100, nodes: 8}",  // 2
      "strategy: fsdp2",                        // 3
      "training:",                              // 4
      "  seq_len: 8192",                        // 5
      "  micro_batch_size: 1",                  // 6
      "  dtype: bf16",                          // 7
      "fsdp2:",                                 // 8
      "  reshard_after_forward: true",          // 9
  });
}

// The name of the first GPU preset of `arch`, or "" when there is none.
std::string GpuPresetOfArch(GpuArch arch) {
  for (const std::string& name : GpuPresetNames()) {
    StatusOr<GpuSpec> gpu = FindGpuPreset(name);
    if (gpu.ok() && gpu->arch == arch) return name;
  }
  return "";
}

// ---- valid plans ----------------------------------------------------------------------------

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

TEST(PlanTest, PresetModelWithOverrides) {
  const Plan plan = ParseOk(Lines({
      "model: {preset: llama3-8b, layers: 4, max_positions: 4096}",
      "cluster: dgx-a100",
      "strategy: fsdp2",
  }));
  const StatusOr<ModelSpec> llama = FindModelPreset("llama3-8b");
  ASSERT_TRUE(llama.ok());
  EXPECT_EQ(plan.model.layers, 4);
  EXPECT_EQ(plan.model.max_positions, 4096);
  EXPECT_EQ(plan.model.hidden, llama->hidden);
  EXPECT_EQ(plan.model.heads, llama->heads);
  EXPECT_EQ(plan.model.kv_heads, llama->kv_heads);
  // A changed preset is not reported under the preset's own name.
  EXPECT_EQ(plan.model.name, "llama3-8b (modified)");
}

TEST(PlanTest, PresetModelRenamed) {
  const Plan plan = ParseOk(Lines({
      "model: {preset: llama3-8b, layers: 2, name: llama-2l}",
      "cluster: dgx-a100",
      "strategy: fsdp2",
  }));
  EXPECT_EQ(plan.model.name, "llama-2l");
  EXPECT_EQ(plan.model.layers, 2);
}

TEST(PlanTest, CustomModelMapping) {
  const Plan plan = ParseOk(Lines({
      "model:",
      "  layers: 2",
      "  hidden: 256",
      "  heads: 4",
      "  ffn: 1024",
      "  vocab: 1000",
      "  max_positions: 512",
      "  learned_positions: true",
      "  tied_embeddings: true",
      "  bias: true",
      "  mlp: gelu",
      "  norm: layernorm",
      "  attention: bidirectional",
      "cluster: dgx-a100",
      "strategy: ddp",
      "training: {seq_len: 512}",
  }));
  EXPECT_EQ(plan.model.name, "custom");
  EXPECT_EQ(plan.model.layers, 2);
  EXPECT_EQ(plan.model.hidden, 256);
  EXPECT_EQ(plan.model.heads, 4);
  EXPECT_EQ(plan.model.kv_heads, 4);  // no grouped-query attention unless asked
  EXPECT_EQ(plan.model.ffn, 1024);
  EXPECT_EQ(plan.model.vocab, 1000);
  EXPECT_EQ(plan.model.max_positions, 512);
  EXPECT_TRUE(plan.model.learned_positions);
  EXPECT_TRUE(plan.model.tied_embeddings);
  EXPECT_TRUE(plan.model.bias);
  EXPECT_EQ(plan.model.mlp, MlpKind::kGelu);
  EXPECT_EQ(plan.model.norm, NormKind::kLayerNorm);
  EXPECT_EQ(plan.model.attention, AttentionKind::kBidirectional);
  EXPECT_EQ(plan.strategy, Strategy::kDdp);
}

TEST(PlanTest, CustomMoeModel) {
  const Plan plan = ParseOk(Lines({
      "model: {layers: 2, hidden: 256, heads: 4, kv_heads: 2, ffn: 512, vocab: 1000,",
      "        experts: 8, experts_per_token: 2}",
      "cluster: dgx-a100",
      "strategy: fsdp2",
  }));
  EXPECT_EQ(plan.model.kv_heads, 2);
  EXPECT_EQ(plan.model.experts, 8);
  EXPECT_EQ(plan.model.experts_per_token, 2);
}

TEST(PlanTest, GpuMemoryOverrideReproducesPreset) {
  const Plan plan = ParseOk(Lines({
      "model: llama3-8b",
      "cluster: {preset: dgx-a100, gpu_memory_gb: 80}",
      "strategy: fsdp2",
  }));
  const StatusOr<ClusterSpec> a100 = FindClusterPreset("dgx-a100", 1);
  ASSERT_TRUE(a100.ok());
  EXPECT_EQ(plan.cluster.gpu.hbm_bytes, a100->gpu.hbm_bytes);
}

TEST(PlanTest, ArchitectureDetailKeys) {
  const Plan plan = ParseOk(Lines({
      "model:",
      "  layers: 2",
      "  hidden: 256",
      "  heads: 4",
      "  ffn: 1024",
      "  vocab: 1000",
      "  max_positions: 512",
      "  learned_positions: true",
      "  reserved_position_rows: 2",
      "  token_types: 1",
      "  embedding_norm: true",
      "  post_norm: true",
      "  lm_head_transform: true",
      "  norm: layernorm",
      "  norm_bias: true",
      "cluster: dgx-a100",
      "strategy: fsdp2",
      "training: {seq_len: 512}",
  }));
  EXPECT_EQ(plan.model.reserved_position_rows, 2);
  EXPECT_EQ(plan.model.token_types, 1);
  EXPECT_TRUE(plan.model.embedding_norm);
  EXPECT_TRUE(plan.model.post_norm);
  EXPECT_TRUE(plan.model.lm_head_transform);
  EXPECT_TRUE(plan.model.norm_bias);
  EXPECT_FALSE(plan.model.alibi);
}

TEST(PlanTest, DdpPlan) {
  const Plan plan = ParseOk(Lines({
      "model: llama3-8b",
      "cluster: {preset: dgx-a100, nodes: 1}",
      "strategy: ddp",
      "ddp: {bucket_cap_mb: 50.5}",
  }));
  EXPECT_EQ(plan.strategy, Strategy::kDdp);
  EXPECT_DOUBLE_EQ(plan.ddp.bucket_cap_mb, 50.5);
  // An explicit bucket_cap_mb caps the first bucket too (DistributedDataParallel.__init__:
  // the 1 MiB first bucket only with bucket_cap_mb=None).
  EXPECT_DOUBLE_EQ(plan.ddp.first_bucket_mb, 50.5);
  const Plan defaults = ParseOk(Lines({
      "model: llama3-8b",
      "cluster: {preset: dgx-a100, nodes: 1}",
      "strategy: ddp",
  }));
  EXPECT_DOUBLE_EQ(defaults.ddp.first_bucket_mb, 1);
  EXPECT_DOUBLE_EQ(defaults.ddp.bucket_cap_mb, 25);
}

TEST(PlanTest, ClusterOverridesConvertUnits) {
  const std::string hopper = GpuPresetOfArch(GpuArch::kHopper);
  ASSERT_FALSE(hopper.empty()) << "no Hopper GPU preset";
  const Plan plan = ParseOk(Lines({
      "model: llama3-8b",
      "cluster:",
      "  preset: dgx-a100",
      "  nodes: 2",
      "  gpu: " + hopper,
      "  gpus_per_node: 4",
      "  intra_node_bandwidth_gbps: 450",
      "  inter_node_bandwidth_gbps: 12.5",
      "  gpu_memory_gb: 96",
      "strategy: fsdp2",
      "training: {dtype: fp8}",
  }));
  EXPECT_EQ(plan.cluster.gpu.name, hopper);
  EXPECT_EQ(plan.cluster.gpu.arch, GpuArch::kHopper);
  EXPECT_EQ(plan.cluster.world_size(), 8);
  EXPECT_DOUBLE_EQ(plan.cluster.intra_node_bandwidth, 450e9);
  EXPECT_DOUBLE_EQ(plan.cluster.inter_node_bandwidth, 12.5e9);
  // Memory "GB" is GiB, as GPU presets use it; bandwidth GB/s is decimal.
  EXPECT_EQ(plan.cluster.gpu.hbm_bytes, int64_t{96} << 30);
  EXPECT_EQ(plan.training.dtype, traces::DType::kFloat8E4M3);
}

TEST(PlanTest, CustomCluster) {
  const std::string hopper = GpuPresetOfArch(GpuArch::kHopper);
  ASSERT_FALSE(hopper.empty());
  const Plan plan = ParseOk(Lines({
      "model: llama3-8b",
      "cluster: {gpu: " + hopper + ", gpus_per_node: 4, intra_node_bandwidth_gbps: 300}",
      "strategy: fsdp2",
  }));
  EXPECT_EQ(plan.cluster.name, "custom");
  EXPECT_EQ(plan.cluster.world_size(), 4);
  EXPECT_DOUBLE_EQ(plan.cluster.intra_node_bandwidth, 300e9);
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

// ---- errors: keys ---------------------------------------------------------------------------

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

TEST(PlanErrorTest, UnknownModelKey) {
  const std::string message = ParseError(
      Lines({"model: {preset: llama3-8b, depth: 4}", "cluster: dgx-a100", "strategy: fsdp2"}));
  EXPECT_THAT(message,
              AllOf(HasSubstr("test.yaml:1:28: model.depth: "), HasSubstr("unknown key 'depth'")));
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

TEST(PlanErrorTest, CustomModelMissingDimension) {
  const std::string message = ParseError(Lines({
      "model:",
      "  layers: 2",
      "  hidden: 256",
      "  heads: 4",
      "  vocab: 1000",
      "cluster: dgx-a100",
      "strategy: fsdp2",
  }));
  EXPECT_THAT(message, AllOf(HasSubstr("test.yaml:2:3: model.ffn: "), HasSubstr("missing")));
}

// ---- errors: values -------------------------------------------------------------------------

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

TEST(PlanErrorTest, WorldSizeTooLarge) {
  const std::string message = ParseError(Lines({
      "model: llama3-8b",
      "cluster: {preset: dgx-a100, nodes: 65536, gpus_per_node: 65536}",
      "strategy: fsdp2",
  }));
  EXPECT_THAT(message, AllOf(HasSubstr("test.yaml:2:"), HasSubstr("cluster: expected a world size"),
                             HasSubstr("1048576"), HasSubstr("65536 x 65536")));
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

TEST(PlanErrorTest, InvalidModelDimensions) {
  // 4 heads do not divide hidden 250: ValidateModel's message, located at the model.
  const std::string message = ParseError(Lines({
      "strategy: fsdp2",
      "cluster: dgx-a100",
      "model: {layers: 2, hidden: 250, heads: 4, ffn: 512, vocab: 1000}",
  }));
  EXPECT_THAT(message, HasSubstr("test.yaml:3:8: model: "));
}

TEST(PlanErrorTest, SeqLenBeyondLearnedPositions) {
  const std::string message = ParseError(Lines({
      "model: {preset: llama3-8b, learned_positions: true, max_positions: 2048}",
      "cluster: dgx-a100",
      "strategy: fsdp2",
      "training:",
      "  seq_len: 4096",
  }));
  EXPECT_THAT(message, AllOf(HasSubstr("test.yaml:5:12: training.seq_len: "),
                             HasSubstr("max_positions (2048)")));
}

TEST(PlanErrorTest, ModelTooLarge) {
  const std::string message = ParseError(Lines({
      "model: {layers: 16384, hidden: 1048576, heads: 8, ffn: 1048576, vocab: 1000}",
      "cluster: dgx-a100",
      "strategy: fsdp2",
  }));
  EXPECT_THAT(message, AllOf(HasSubstr("test.yaml:1:8: model: expected at most 2^50 parameters")));
}

TEST(PlanErrorTest, Fp8NeedsHardwareSupport) {
  std::string text = BasePlan();
  text.replace(text.find("dtype: bf16"), 11, "dtype: fp8");
  // dgx-a100: Ampere has no fp8 tensor cores.
  EXPECT_THAT(ParseError(text), AllOf(HasSubstr("test.yaml:7:10: training.dtype: expected a dtype "
                                                "the GPU "),
                                      HasSubstr("got 'fp8'")));
}

TEST(PlanErrorTest, DefaultDtypeNeedsHardwareSupport) {
  const std::string volta = GpuPresetOfArch(GpuArch::kVolta);
  if (volta.empty()) GTEST_SKIP() << "no Volta GPU preset";
  StatusOr<GpuSpec> gpu = FindGpuPreset(volta);
  ASSERT_TRUE(gpu.ok());
  if (PeakFlops(*gpu, traces::DType::kBFloat16) > 0) GTEST_SKIP() << "preset claims bf16";
  const std::string message = ParseError(Lines({
      "model: llama3-8b",
      "cluster: {preset: dgx-a100, gpu: " + volta + "}",
      "strategy: fsdp2",
  }));
  EXPECT_THAT(message, AllOf(HasSubstr("training.dtype: expected a dtype the GPU"),
                             HasSubstr("got the default 'bf16'")));
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

// ---- errors: the file as a whole ------------------------------------------------------------

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
                        "host, allocator, oom, divergence, got a sequence"));
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

// ---- strategy knobs (issue 3) ---------------------------------------------------------------

// A 4-block model on 16 GPUs (2 nodes of 8); `rest` starts at line 4.
constexpr char kDense4[] = "model: {preset: llama3-8b, layers: 4}";
constexpr char kMoe4[] = "model: {preset: mixtral-8x7b, layers: 4}";  // 8 experts

std::string Plan16(std::string_view model, std::string_view strategy,
                   std::initializer_list<std::string_view> rest) {
  std::string text = Lines({model, "cluster: {preset: dgx-a100, nodes: 2}",
                            std::string("strategy: ") + std::string(strategy)});
  for (std::string_view line : rest) {
    text += line;
    text += '\n';
  }
  return text;
}

TEST(PlanTrainingTest, SelectiveCheckpointingAndClipping) {
  const Plan plan = ParseOk(Plan16(kDense4, "fsdp2",
                                   {"training:", "  activation_checkpointing: selective",
                                    "  selective_ac_every: 3", "  max_grad_norm: 0.5"}));
  EXPECT_EQ(plan.training.activation_checkpointing, ActivationCheckpointing::kSelective);
  EXPECT_EQ(plan.training.selective_ac_every, 3);
  EXPECT_DOUBLE_EQ(plan.training.max_grad_norm, 0.5);
  // Defaults: torchtitan's selective_ac_option "2" and max_norm 1.0.
  const Plan defaults = ParseOk(Plan16(kDense4, "fsdp2", {}));
  EXPECT_EQ(defaults.training.selective_ac_every, 2);
  EXPECT_DOUBLE_EQ(defaults.training.max_grad_norm, 1.0);
  EXPECT_DOUBLE_EQ(ParseOk(Plan16(kDense4, "fsdp2", {"training: {max_grad_norm: 0}"}))
                       .training.max_grad_norm,
                   0.0);
}

TEST(PlanTrainingTest, SelectiveAcEveryOnlyWithSelective) {
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2",
                                {"training:", "  activation_checkpointing: full",
                                 "  selective_ac_every: 3"})),
              HasSubstr("test.yaml:6:3: training.selective_ac_every: expected no "
                        "selective_ac_every unless activation_checkpointing is selective, got "
                        "selective_ac_every with activation_checkpointing full"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2", {"training:", "  selective_ac_every: 2"})),
              HasSubstr("with activation_checkpointing none"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2",
                                {"training:", "  activation_checkpointing: selective",
                                 "  selective_ac_every: 0"})),
              HasSubstr("test.yaml:6:23: training.selective_ac_every: expected a positive"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2", {"training:", "  max_grad_norm: -1"})),
              HasSubstr("test.yaml:5:18: training.max_grad_norm: expected a number >= 0"));
}

TEST(PlanFsdp2Test, DefaultsResolved) {
  const Plan plan = ParseOk(Plan16(kDense4, "fsdp2", {}));
  const Fsdp2Config& f = plan.fsdp2;
  EXPECT_EQ(f.reshard_after_forward, ReshardAfterForward::kTrue);
  EXPECT_EQ(f.mesh.replicate, 1);
  EXPECT_EQ(f.mesh.shard, 16);  // 2 nodes x 8
  EXPECT_EQ(f.param_dtype, traces::DType::kBFloat16);
  EXPECT_EQ(f.reduce_dtype, traces::DType::kFloat32);
  EXPECT_EQ(f.forward_prefetch, 0);
  EXPECT_EQ(f.backward_prefetch, 1);
  EXPECT_TRUE(f.forward_prefetch_units.empty());
  EXPECT_TRUE(f.backward_prefetch_units.empty());
  EXPECT_EQ(f.requires_gradient_sync, GradientSync::kEveryMicroBatch);
  EXPECT_EQ(f.gradient_sync_every_k_blocks, 0);
  EXPECT_TRUE(f.requires_all_reduce);
  EXPECT_TRUE(f.reshard_after_backward);
  EXPECT_EQ(f.blocks_per_unit, 1);
  EXPECT_FALSE(f.root_only);
}

TEST(PlanFsdp2Test, EveryKnob) {
  const Plan plan = ParseOk(Plan16(kDense4, "fsdp2",
                                   {
                                       "training: {grad_accum_steps: 4}",
                                       "fsdp2:",
                                       "  mesh: {replicate: 2}",
                                       "  reshard_after_forward: 4",
                                       "  blocks_per_unit: 2",
                                       "  forward_prefetch: 2",
                                       "  backward_prefetch:",
                                       "    layers.2: [layers.0]",
                                       "    head: [layers.2, embed]",
                                       "  mixed_precision: {param_dtype: fp16, reduce_dtype: null}",
                                       "  requires_gradient_sync: last_micro_batch",
                                       "  gradient_sync_every_k_blocks: 2",
                                       "  requires_all_reduce: false",
                                       "  reshard_after_backward: false",
                                       "  wrap: block",
                                   }));
  const Fsdp2Config& f = plan.fsdp2;
  EXPECT_EQ(f.mesh.replicate, 2);
  EXPECT_EQ(f.mesh.shard, 8);  // 16 / 2
  EXPECT_EQ(f.reshard_after_forward, ReshardAfterForward::kInt);
  EXPECT_EQ(f.reshard_after_forward_size, 4);
  EXPECT_EQ(f.blocks_per_unit, 2);
  EXPECT_EQ(f.forward_prefetch, 2);
  EXPECT_EQ(f.backward_prefetch, 1);  // the mapping leaves the count at its default
  const std::map<std::string, std::vector<std::string>> expected_backward = {
      {"layers.2", {"layers.0"}}, {"head", {"layers.2", "embed"}}};
  EXPECT_EQ(f.backward_prefetch_units, expected_backward);
  EXPECT_EQ(f.param_dtype, traces::DType::kFloat16);
  EXPECT_EQ(f.reduce_dtype, traces::DType::kFloat16);  // null: the param dtype
  EXPECT_EQ(f.requires_gradient_sync, GradientSync::kLastMicroBatch);
  EXPECT_EQ(f.gradient_sync_every_k_blocks, 2);
  EXPECT_FALSE(f.requires_all_reduce);
  EXPECT_FALSE(f.reshard_after_backward);
  EXPECT_FALSE(f.root_only);
}

TEST(PlanFsdp2Test, ReshardAfterForwardForms) {
  auto parse = [](std::string_view value) {
    return ParseOk(Plan16(kDense4, "fsdp2",
                          {std::string("fsdp2: {reshard_after_forward: ") + std::string(value) +
                           "}"}))
        .fsdp2;
  };
  EXPECT_EQ(parse("true").reshard_after_forward, ReshardAfterForward::kTrue);
  EXPECT_EQ(parse("false").reshard_after_forward, ReshardAfterForward::kFalse);
  EXPECT_EQ(parse("null").reshard_after_forward, ReshardAfterForward::kNone);
  EXPECT_EQ(parse("~").reshard_after_forward, ReshardAfterForward::kNone);
  // _get_post_forward_mesh_info: 1 behaves as False, the shard size (16) as True.
  EXPECT_EQ(parse("1").reshard_after_forward, ReshardAfterForward::kFalse);
  EXPECT_EQ(parse("16").reshard_after_forward, ReshardAfterForward::kTrue);
  const Fsdp2Config eight = parse("8");
  EXPECT_EQ(eight.reshard_after_forward, ReshardAfterForward::kInt);
  EXPECT_EQ(eight.reshard_after_forward_size, 8);
}

TEST(PlanFsdp2Test, ReshardAfterForwardMustBeAFactorOfTheShardSize) {
  // Line 5: "  reshard_after_forward: 3" -> the value at column 26.
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2", {"fsdp2:", "  reshard_after_forward: 3"})),
              AllOf(HasSubstr("test.yaml:5:26: fsdp2.reshard_after_forward: expected true, "
                              "false, null or an int that is a factor of the shard mesh size 16"),
                    HasSubstr("got '3'")));
  // HSDP: the shard mesh is 8, so 16 is too large even though it divides the world.
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2",
                                {"fsdp2:", "  mesh: {replicate: 2}",
                                 "  reshard_after_forward: 16"})),
              AllOf(HasSubstr("test.yaml:6:26: fsdp2.reshard_after_forward: "),
                    HasSubstr("factor of the shard mesh size 8"), HasSubstr("got '16'")));
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2", {"fsdp2:", "  reshard_after_forward: 0"})),
              HasSubstr("got '0'"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2", {"fsdp2:", "  reshard_after_forward: yes"})),
              HasSubstr("got 'yes'"));
}

TEST(PlanFsdp2Test, MixedPrecisionResolution) {
  auto parse = [](std::string_view cluster, std::string_view dtype, std::string_view mp) {
    std::string text = Lines({"model: {preset: llama3-8b, layers: 4}", cluster,
                              "strategy: fsdp2",
                              std::string("training: {dtype: ") + std::string(dtype) + "}"});
    if (!mp.empty()) text += std::string("fsdp2: {mixed_precision: ") + std::string(mp) + "}\n";
    return ParseOk(text).fsdp2;
  };
  const std::string a100 = "cluster: dgx-a100";
  const std::string h100 = "cluster: {preset: dgx-a100, gpu: " +
                           GpuPresetOfArch(GpuArch::kHopper) + "}";
  // Defaults: param = training dtype (fp8 -> bf16), reduce = fp32.
  Fsdp2Config f = parse(a100, "fp32", "");
  EXPECT_EQ(f.param_dtype, traces::DType::kFloat32);
  EXPECT_EQ(f.reduce_dtype, traces::DType::kFloat32);
  f = parse(a100, "fp16", "");
  EXPECT_EQ(f.param_dtype, traces::DType::kFloat16);
  EXPECT_EQ(f.reduce_dtype, traces::DType::kFloat32);
  f = parse(h100, "fp8", "");
  EXPECT_EQ(f.param_dtype, traces::DType::kBFloat16);
  EXPECT_EQ(f.reduce_dtype, traces::DType::kFloat32);
  // null param_dtype: no cast (fp32); null reduce_dtype: the resolved param dtype.
  f = parse(a100, "bf16", "{param_dtype: null}");
  EXPECT_EQ(f.param_dtype, traces::DType::kFloat32);
  EXPECT_EQ(f.reduce_dtype, traces::DType::kFloat32);
  f = parse(a100, "bf16", "{param_dtype: null, reduce_dtype: null}");
  EXPECT_EQ(f.param_dtype, traces::DType::kFloat32);
  EXPECT_EQ(f.reduce_dtype, traces::DType::kFloat32);
  f = parse(a100, "bf16", "{reduce_dtype: null}");
  EXPECT_EQ(f.param_dtype, traces::DType::kBFloat16);
  EXPECT_EQ(f.reduce_dtype, traces::DType::kBFloat16);
  f = parse(a100, "fp32", "{param_dtype: bf16, reduce_dtype: bf16}");
  EXPECT_EQ(f.param_dtype, traces::DType::kBFloat16);
  EXPECT_EQ(f.reduce_dtype, traces::DType::kBFloat16);
}

TEST(PlanFsdp2Test, MixedPrecisionErrors) {
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2",
                                {"fsdp2:", "  mixed_precision:", "    param_dtype: fp8"})),
              HasSubstr("test.yaml:6:18: fsdp2.mixed_precision.param_dtype: expected one of "
                        "bf16, fp16, fp32 or null, got 'fp8'"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2",
                                {"fsdp2:", "  mixed_precision:", "    cast: true"})),
              HasSubstr("test.yaml:6:5: fsdp2.mixed_precision.cast: expected one of the keys "
                        "param_dtype, reduce_dtype"));
}

TEST(PlanFsdp2Test, Mesh) {
  Plan plan = ParseOk(Plan16(kDense4, "fsdp2", {"fsdp2: {mesh: {shard: 4}}"}));
  EXPECT_EQ(plan.fsdp2.mesh.replicate, 4);
  EXPECT_EQ(plan.fsdp2.mesh.shard, 4);
  plan = ParseOk(Plan16(kDense4, "fsdp2", {"fsdp2: {mesh: {replicate: 8, shard: 2}}"}));
  EXPECT_EQ(plan.fsdp2.mesh.replicate, 8);
  EXPECT_EQ(plan.fsdp2.mesh.shard, 2);
  // Line 6: "    replicate: 3" -> value at column 16.
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2", {"fsdp2:", "  mesh:", "    replicate: 3"})),
              HasSubstr("test.yaml:6:16: fsdp2.mesh.replicate: expected a divisor of the world "
                        "size 16 (nodes x gpus_per_node), got '3'"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2", {"fsdp2:", "  mesh:", "    shard: 5"})),
              HasSubstr("test.yaml:6:12: fsdp2.mesh.shard: expected a divisor of the world size "
                        "16"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2",
                                {"fsdp2:", "  mesh: {replicate: 2, shard: 4}"})),
              HasSubstr("test.yaml:5:9: fsdp2.mesh: expected replicate x shard = the world size "
                        "16 (nodes x gpus_per_node), got 2 x 4 = 8"));
}

TEST(PlanFsdp2Test, PrefetchUnitsMustExist) {
  // blocks_per_unit 2 on 4 blocks: units embed, layers.0, layers.2, head.
  const std::string message = ParseError(Plan16(kDense4, "fsdp2",
                                                {"fsdp2:", "  blocks_per_unit: 2",
                                                 "  forward_prefetch:",
                                                 "    layers.0: [layers.1]"}));
  EXPECT_THAT(message,
              AllOf(HasSubstr("test.yaml:7:16: fsdp2.forward_prefetch.layers.0: expected a unit "
                              "name (embed, layers.0, layers.2, head); "
                              "set_modules_to_forward_prefetch takes only modules fully_shard was "
                              "applied to"),
                    HasSubstr("got unknown unit 'layers.1'")));
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2",
                                {"fsdp2:", "  backward_prefetch:", "    layers.4: [layers.3]"})),
              AllOf(HasSubstr("test.yaml:6:5: fsdp2.backward_prefetch: expected a unit name "
                              "(embed, layers.0, layers.1, layers.2, layers.3, head); "
                              "set_modules_to_backward_prefetch"),
                    HasSubstr("got unknown unit 'layers.4'")));
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2",
                                {"fsdp2:", "  backward_prefetch:", "    layers.01: []"})),
              HasSubstr("got unknown unit 'layers.01'"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2",
                                {"fsdp2:", "  backward_prefetch:", "    output: []"})),
              HasSubstr("got unknown unit 'output'"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2",
                                {"fsdp2:", "  forward_prefetch:", "    embed: layers.0"})),
              HasSubstr("test.yaml:6:12: fsdp2.forward_prefetch.embed: expected a list of unit "
                        "names to prefetch, got 'layers.0'"));
  // wrap: root leaves no unit to name.
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2",
                                {"fsdp2:", "  wrap: root", "  forward_prefetch:",
                                 "    embed: []"})),
              AllOf(HasSubstr("test.yaml:7:5: fsdp2.forward_prefetch: "),
                    HasSubstr("with wrap: root the root is the only FSDP module")));
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2", {"fsdp2:", "  forward_prefetch: -1"})),
              HasSubstr("test.yaml:5:21: fsdp2.forward_prefetch: expected a count of units to "
                        "prefetch"));
}

TEST(PlanFsdp2Test, UnitNamesOfALongModelAreElided) {
  EXPECT_THAT(ParseError(Lines({"model: llama3-8b", "cluster: dgx-a100", "strategy: fsdp2",
                                "fsdp2: {blocks_per_unit: 4, forward_prefetch: {layers.1: []}}"})),
              HasSubstr("(embed, layers.0, layers.4, ..., layers.28, head)"));
}

TEST(PlanFsdp2Test, GradientSyncAndAllReduce) {
  EXPECT_EQ(ParseOk(Plan16(kDense4, "fsdp2", {"fsdp2: {requires_gradient_sync: false}"}))
                .fsdp2.requires_gradient_sync,
            GradientSync::kLastMicroBatch);
  EXPECT_EQ(ParseOk(Plan16(kDense4, "fsdp2", {"fsdp2: {requires_gradient_sync: true}"}))
                .fsdp2.requires_gradient_sync,
            GradientSync::kEveryMicroBatch);
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2", {"fsdp2:", "  requires_gradient_sync: never"})),
              HasSubstr("test.yaml:5:27: fsdp2.requires_gradient_sync: expected one of "
                        "every_micro_batch, last_micro_batch, true"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2", {"fsdp2:", "  gradient_sync_every_k_blocks: 2"})),
              HasSubstr("test.yaml:5:3: fsdp2.gradient_sync_every_k_blocks: expected no "
                        "gradient_sync_every_k_blocks unless requires_gradient_sync is "
                        "last_micro_batch"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2", {"fsdp2:", "  requires_all_reduce: false"})),
              HasSubstr("test.yaml:5:24: fsdp2.requires_all_reduce: expected true unless the "
                        "mesh is HSDP (fsdp2.mesh.replicate > 1)"));
}

TEST(PlanFsdp2Test, WrapGranularity) {
  const Plan root = ParseOk(Plan16(kDense4, "fsdp2", {"fsdp2: {wrap: root}"}));
  EXPECT_TRUE(root.fsdp2.root_only);
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2", {"fsdp2:", "  wrap: root",
                                                   "  blocks_per_unit: 2"})),
              HasSubstr("test.yaml:6:3: fsdp2.blocks_per_unit: expected no blocks_per_unit with "
                        "wrap: root"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2", {"fsdp2:", "  blocks_per_unit: 5"})),
              HasSubstr("test.yaml:5:20: fsdp2.blocks_per_unit: expected a positive integer <= "
                        "4, got '5'"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2", {"fsdp2:", "  wrap: layer"})),
              HasSubstr("test.yaml:5:9: fsdp2.wrap: expected one of block, root, got 'layer'"));
}

TEST(PlanFsdp1Test, DefaultsResolved) {
  const Plan plan = ParseOk(Plan16(kDense4, "fsdp1", {}));
  const Fsdp1Config& f = plan.fsdp1;
  EXPECT_EQ(plan.strategy, Strategy::kFsdp1);
  EXPECT_EQ(f.sharding_strategy, Fsdp1ShardingStrategy::kFullShard);
  EXPECT_EQ(f.backward_prefetch, Fsdp1BackwardPrefetch::kBackwardPre);
  EXPECT_FALSE(f.forward_prefetch);
  EXPECT_TRUE(f.limit_all_gathers);
  EXPECT_FALSE(f.no_sync);
  EXPECT_EQ(f.implementation, Fsdp1Implementation::kTorch);
  EXPECT_FALSE(f.optimize_backward_concat);
  EXPECT_EQ(f.mesh.replicate, 1);
  EXPECT_EQ(f.mesh.shard, 16);
  EXPECT_EQ(f.param_dtype, traces::DType::kBFloat16);
  EXPECT_EQ(f.reduce_dtype, traces::DType::kFloat32);
}

TEST(PlanFsdp1Test, EveryTorchKnob) {
  const Plan plan = ParseOk(Plan16(kDense4, "fsdp1",
                                   {"fsdp1:", "  sharding_strategy: SHARD_GRAD_OP",
                                    "  backward_prefetch: null", "  forward_prefetch: true",
                                    "  limit_all_gathers: false", "  no_sync: true",
                                    "  mixed_precision: {param_dtype: null}",
                                    "  implementation: torch"}));
  const Fsdp1Config& f = plan.fsdp1;
  EXPECT_EQ(f.sharding_strategy, Fsdp1ShardingStrategy::kShardGradOp);
  EXPECT_EQ(f.backward_prefetch, Fsdp1BackwardPrefetch::kNone);
  EXPECT_TRUE(f.forward_prefetch);
  EXPECT_FALSE(f.limit_all_gathers);
  EXPECT_TRUE(f.no_sync);
  EXPECT_EQ(f.param_dtype, traces::DType::kFloat32);
  EXPECT_EQ(f.reduce_dtype, traces::DType::kFloat32);
  EXPECT_EQ(ParseOk(Plan16(kDense4, "fsdp1", {"fsdp1: {backward_prefetch: BACKWARD_POST}"}))
                .fsdp1.backward_prefetch,
            Fsdp1BackwardPrefetch::kBackwardPost);
  EXPECT_EQ(ParseOk(Plan16(kDense4, "fsdp1", {"fsdp1: {sharding_strategy: NO_SHARD}"}))
                .fsdp1.sharding_strategy,
            Fsdp1ShardingStrategy::kNoShard);
}

TEST(PlanFsdp1Test, HybridMesh) {
  // Default: shard within a node (8 GPUs), replicate across the 2 nodes.
  Plan plan = ParseOk(Plan16(kDense4, "fsdp1", {"fsdp1: {sharding_strategy: HYBRID_SHARD}"}));
  EXPECT_EQ(plan.fsdp1.sharding_strategy, Fsdp1ShardingStrategy::kHybridShard);
  EXPECT_EQ(plan.fsdp1.mesh.replicate, 2);
  EXPECT_EQ(plan.fsdp1.mesh.shard, 8);
  plan = ParseOk(Plan16(kDense4, "fsdp1",
                        {"fsdp1: {sharding_strategy: _HYBRID_SHARD_ZERO2, mesh: {shard: 4}}"}));
  EXPECT_EQ(plan.fsdp1.sharding_strategy, Fsdp1ShardingStrategy::kHybridShardZero2);
  EXPECT_EQ(plan.fsdp1.mesh.replicate, 4);
  EXPECT_EQ(plan.fsdp1.mesh.shard, 4);
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp1",
                                {"fsdp1:", "  sharding_strategy: HYBRID_SHARD", "  mesh:",
                                 "    shard: 3"})),
              HasSubstr("test.yaml:7:12: fsdp1.mesh.shard: expected a divisor of the world size "
                        "16 (nodes x gpus_per_node), got '3'"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp1",
                                {"fsdp1:", "  sharding_strategy: FULL_SHARD",
                                 "  mesh: {replicate: 2}"})),
              HasSubstr("test.yaml:6:3: fsdp1.mesh: expected a mesh only with sharding_strategy "
                        "HYBRID_SHARD or _HYBRID_SHARD_ZERO2 (other strategies shard over every "
                        "rank), got a mesh with sharding_strategy FULL_SHARD"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp1", {"fsdp1:", "  sharding_strategy: full_shard"})),
              HasSubstr("test.yaml:5:22: fsdp1.sharding_strategy: expected one of FULL_SHARD, "
                        "SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, _HYBRID_SHARD_ZERO2, got "
                        "'full_shard'"));
}

TEST(PlanFsdp1Test, Fairscale) {
  const Plan plan = ParseOk(Plan16(kDense4, "fsdp1",
                                   {"fsdp1:", "  implementation: fairscale",
                                    "  reshard_after_forward: false",
                                    "  optimize_backward_concat: true", "  no_sync: true"}));
  EXPECT_EQ(plan.fsdp1.implementation, Fsdp1Implementation::kFairscale);
  EXPECT_EQ(plan.fsdp1.sharding_strategy, Fsdp1ShardingStrategy::kShardGradOp);
  EXPECT_TRUE(plan.fsdp1.optimize_backward_concat);
  EXPECT_TRUE(plan.fsdp1.no_sync);
  // FULL_SHARD / SHARD_GRAD_OP are fairscale's reshard_after_forward true / false.
  EXPECT_EQ(ParseOk(Plan16(kDense4, "fsdp1",
                           {"fsdp1: {implementation: fairscale,",
                            "        sharding_strategy: SHARD_GRAD_OP}"}))
                .fsdp1.sharding_strategy,
            Fsdp1ShardingStrategy::kShardGradOp);
}

TEST(PlanFsdp1Test, FairscaleRejectsTorchOnlyKnobs) {
  for (const char* knob :
       {"backward_prefetch: BACKWARD_PRE", "forward_prefetch: true", "limit_all_gathers: true"}) {
    const std::string message = ParseError(Plan16(
        kDense4, "fsdp1", {"fsdp1:", "  implementation: fairscale", std::string("  ") + knob}));
    const std::string key = std::string(knob).substr(0, std::string(knob).find(':'));
    EXPECT_THAT(message, AllOf(HasSubstr("test.yaml:6:3: fsdp1." + key + ": expected no " + key +
                                         " with implementation fairscale"),
                               HasSubstr("its own knobs are reshard_after_forward")))
        << knob;
  }
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp1",
                                {"fsdp1:", "  implementation: fairscale",
                                 "  sharding_strategy: HYBRID_SHARD"})),
              AllOf(HasSubstr("test.yaml:6:22: fsdp1.sharding_strategy: expected FULL_SHARD or "
                              "SHARD_GRAD_OP with implementation fairscale"),
                    HasSubstr("its own knob is reshard_after_forward"),
                    HasSubstr("got 'HYBRID_SHARD'")));
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp1", {"fsdp1:", "  optimize_backward_concat: true"})),
              HasSubstr("test.yaml:5:3: fsdp1.optimize_backward_concat: expected no "
                        "optimize_backward_concat with implementation torch"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp1", {"fsdp1:", "  reshard_after_forward: true"})),
              HasSubstr("test.yaml:5:3: fsdp1.reshard_after_forward: expected no "
                        "reshard_after_forward with implementation torch"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp1",
                                {"fsdp1:", "  implementation: fairscale",
                                 "  sharding_strategy: FULL_SHARD",
                                 "  reshard_after_forward: true"})),
              HasSubstr("test.yaml:7:3: fsdp1.reshard_after_forward: expected either "
                        "sharding_strategy or fairscale's reshard_after_forward, got both"));
}

TEST(PlanZeroTest, DefaultsAndOverlapComm) {
  for (const char* stage : {"zero1", "zero2", "zero3"}) {
    const Plan plan = ParseOk(Plan16(kDense4, stage, {}));
    EXPECT_EQ(StrategyName(plan.strategy), stage);
    // DeepSpeedZeroConfig.overlap_comm_valid: true for stage 3 only.
    EXPECT_EQ(plan.zero.overlap_comm, std::string(stage) == "zero3") << stage;
    EXPECT_EQ(plan.zero.reduce_bucket_size, 500'000'000);
    EXPECT_EQ(plan.zero.allgather_bucket_size, 500'000'000);
    EXPECT_TRUE(plan.zero.contiguous_gradients);
    EXPECT_EQ(plan.zero.stage3_prefetch_bucket_size, 50'000'000);
    EXPECT_EQ(plan.zero.stage3_max_live_parameters, 1'000'000'000);
    EXPECT_EQ(plan.zero.stage3_max_reuse_distance, 1'000'000'000);
    EXPECT_EQ(plan.zero.stage3_param_persistence_threshold, 100'000);
  }
  EXPECT_TRUE(ParseOk(Plan16(kDense4, "zero2", {"zero: {overlap_comm: true}"})).zero.overlap_comm);
  EXPECT_FALSE(
      ParseOk(Plan16(kDense4, "zero3", {"zero: {overlap_comm: false}"})).zero.overlap_comm);
}

TEST(PlanZeroTest, Stage3Knobs) {
  const Plan plan = ParseOk(Plan16(kDense4, "zero3",
                                   {"training: {dtype: fp32}", "zero:",
                                    "  reduce_bucket_size: 2e8",
                                    "  stage3_prefetch_bucket_size: 5.0e7",
                                    "  stage3_max_live_parameters: 300000000",
                                    "  stage3_max_reuse_distance: 0",
                                    "  stage3_param_persistence_threshold: 1e4",
                                    "  contiguous_gradients: false",
                                    "  legacy_prefetch_off_by_one: true",
                                    "  legacy_stream_sync_in_fetch_release: true",
                                    "  legacy_debug_norm_sync: true"}));
  EXPECT_EQ(plan.training.dtype, traces::DType::kFloat32);  // fp32 with ZeRO is fine
  EXPECT_EQ(plan.zero.reduce_bucket_size, 200'000'000);
  EXPECT_EQ(plan.zero.stage3_prefetch_bucket_size, 50'000'000);
  EXPECT_EQ(plan.zero.stage3_max_live_parameters, 300'000'000);
  EXPECT_EQ(plan.zero.stage3_max_reuse_distance, 0);
  EXPECT_EQ(plan.zero.stage3_param_persistence_threshold, 10'000);
  EXPECT_FALSE(plan.zero.contiguous_gradients);
  EXPECT_TRUE(plan.zero.legacy_prefetch_off_by_one);
  EXPECT_TRUE(plan.zero.legacy_stream_sync_in_fetch_release);
  EXPECT_TRUE(plan.zero.legacy_debug_norm_sync);
  EXPECT_EQ(ParseOk(Plan16(kDense4, "zero1", {"zero: {allgather_bucket_size: 1.5e8}"}))
                .zero.allgather_bucket_size,
            150'000'000);
}

TEST(PlanZeroTest, Errors) {
  EXPECT_THAT(ParseError(Plan16(kDense4, "zero2", {"zero:", "  reduce_bucket_size: 1.5"})),
              HasSubstr("test.yaml:5:23: zero.reduce_bucket_size: expected a whole number of "
                        "elements in [0, 2^50] (an integer, or a float such as 5e8), got '1.5' "
                        "(not a whole number)"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "zero2", {"zero:", "  reduce_bucket_size: -1"})),
              HasSubstr("got '-1'"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "zero2", {"zero:", "  reduce_bucket_size: 1e300"})),
              HasSubstr("got '1e300'"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "zero2", {"zero:", "  stage3_max_live_parameters: 1e9"})),
              HasSubstr("test.yaml:5:3: zero.stage3_max_live_parameters: expected "
                        "stage3_max_live_parameters only with strategy zero3 (it only applies "
                        "to ZeRO stage 3), got stage3_max_live_parameters with strategy zero2"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "zero1", {"zero:", "  legacy_debug_norm_sync: true"})),
              HasSubstr("test.yaml:5:3: zero.legacy_debug_norm_sync: expected "
                        "legacy_debug_norm_sync only with strategy zero3"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "zero3", {"zero:", "  allgather_bucket_size: 5e8"})),
              HasSubstr("test.yaml:5:3: zero.allgather_bucket_size: expected "
                        "allgather_bucket_size only with zero1 or zero2"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "zero3", {"fsdp2: {reshard_after_forward: true}"})),
              HasSubstr("test.yaml:4:1: fsdp2: expected only the 'zero' section, got section "
                        "'fsdp2' given but strategy is zero3"));
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2", {"zero: {overlap_comm: true}"})),
              HasSubstr("test.yaml:4:1: zero: expected only the 'fsdp2' section, got section "
                        "'zero' given but strategy is fsdp2"));
}

TEST(PlanZeroTest, Fp8IsNotADeepSpeedPrecision) {
  const std::string hopper = GpuPresetOfArch(GpuArch::kHopper);
  ASSERT_FALSE(hopper.empty());
  const std::string message =
      ParseError(Lines({"model: llama3-8b", "cluster: {preset: dgx-a100, gpu: " + hopper + "}",
                        "strategy: zero3", "training:", "  dtype: fp8"}));
  EXPECT_THAT(message, HasSubstr("test.yaml:5:10: training.dtype: expected bf16, fp16 or fp32 "
                                 "with strategy zero3 (DeepSpeed ZeRO has no fp8 precision"));
  // The same dtype is fine under FSDP2.
  ParseOk(Lines({"model: llama3-8b", "cluster: {preset: dgx-a100, gpu: " + hopper + "}",
                 "strategy: fsdp2", "training:", "  dtype: fp8"}));
}

TEST(PlanTrainingTest, PureBf16NeedsBf16AndAStrategyThatShardsABf16Model) {
  const Plan plan = ParseOk(Lines({"model: llama3-8b", "cluster: {preset: dgx-a100}", "strategy: fsdp2",
                                   "training:", "  precision: pure_bf16"}));
  EXPECT_EQ(plan.training.precision, Precision::kPureBf16);
  EXPECT_EQ(plan.fsdp2.reduce_dtype, traces::DType::kBFloat16);  // no MixedPrecisionPolicy
  EXPECT_THAT(ParseError(Lines({"model: llama3-8b", "cluster: {preset: dgx-a100}", "strategy: fsdp2",
                                "training:", "  precision: pure_bf16", "  dtype: fp16"})),
              HasSubstr("test.yaml:5:14: training.precision: expected mixed, or training.dtype bf16"));
  EXPECT_THAT(ParseError(Lines({"model: llama3-8b", "cluster: {preset: dgx-a100}", "strategy: zero3",
                                "training:", "  precision: pure_bf16"})),
              HasSubstr("test.yaml:5:14: training.precision: expected mixed with strategy zero3 "
                        "(pure_bf16 is modelled for fsdp2 and ddp"));
}

TEST(PlanDdpTest, NoSync) {
  const Plan plan =
      ParseOk(Plan16(kDense4, "ddp", {"training: {grad_accum_steps: 4}", "ddp: {no_sync: true}"}));
  EXPECT_TRUE(plan.ddp.no_sync);
  EXPECT_FALSE(ParseOk(Plan16(kDense4, "ddp", {})).ddp.no_sync);
}

TEST(PlanMoeTest, ExpertParallel) {
  EXPECT_EQ(ParseOk(Plan16(kMoe4, "fsdp2", {})).moe.expert_parallel, 1);
  EXPECT_EQ(ParseOk(Plan16(kMoe4, "fsdp2", {"moe: {expert_parallel: 8}"})).moe.expert_parallel, 8);
  EXPECT_EQ(ParseOk(Plan16(kMoe4, "fsdp1", {"moe: {expert_parallel: 4}"})).moe.expert_parallel, 4);
  // HSDP 2 x 8: 8 divides the shard group.
  EXPECT_EQ(ParseOk(Plan16(kMoe4, "fsdp2",
                           {"fsdp2: {mesh: {replicate: 2}}", "moe: {expert_parallel: 8}"}))
                .moe.expert_parallel,
            8);
  // A dense model may say 1.
  EXPECT_EQ(
      ParseOk(Plan16(kDense4, "zero3", {"moe: {expert_parallel: 1}"})).moe.expert_parallel, 1);
}

TEST(PlanMoeTest, Errors) {
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2", {"moe:", "  expert_parallel: 2"})),
              HasSubstr("test.yaml:5:20: moe.expert_parallel: expected 1 for a dense model "
                        "(model.experts is 1)"));
  EXPECT_THAT(ParseError(Plan16(kMoe4, "zero3", {"moe:", "  expert_parallel: 2"})),
              HasSubstr("test.yaml:5:20: moe.expert_parallel: expected 1 with this strategy "
                        "(expert parallelism is simulated with fsdp2 and fsdp1), got '2' with "
                        "strategy zero3"));
  EXPECT_THAT(ParseError(Plan16(kMoe4, "fsdp2", {"moe:", "  expert_parallel: 3"})),
              HasSubstr("test.yaml:5:20: moe.expert_parallel: expected a divisor of the model's 8 "
                        "experts"));
  EXPECT_THAT(ParseError(Plan16(kMoe4, "fsdp2", {"moe:", "  expert_parallel: 16"})),
              HasSubstr("a divisor of the model's 8 experts"));
  EXPECT_THAT(ParseError(Lines({kMoe4, "cluster: {preset: dgx-a100, gpus_per_node: 6}",
                                "strategy: fsdp2", "moe:", "  expert_parallel: 4"})),
              HasSubstr("test.yaml:5:20: moe.expert_parallel: expected a divisor of the world "
                        "size 6, got '4'"));
  // HSDP 4 x 4: 8 divides the world (16) and the experts (8) but not the shard group (4).
  EXPECT_THAT(ParseError(Plan16(kMoe4, "fsdp2",
                                {"fsdp2: {mesh: {replicate: 4}}", "moe:", "  expert_parallel: 8"})),
              HasSubstr("test.yaml:6:20: moe.expert_parallel: expected a divisor of the HSDP "
                        "shard group size 4"));
}

TEST(PlanCheckpointTest, Consolidation) {
  Plan plan =
      ParseOk(Plan16(kDense4, "fsdp1", {"checkpoint: {consolidate_optimizer_state: true}"}));
  EXPECT_TRUE(plan.checkpoint.consolidate_optimizer_state);
  EXPECT_FALSE(plan.checkpoint.no_broadcast_optim_state);
  plan = ParseOk(Plan16(kMoe4, "fsdp1",
                        {"fsdp1: {implementation: fairscale}", "moe: {expert_parallel: 8}",
                         "checkpoint: {consolidate_optimizer_state: true, "
                         "no_broadcast_optim_state: true}"}));
  EXPECT_TRUE(plan.checkpoint.consolidate_optimizer_state);
  EXPECT_TRUE(plan.checkpoint.no_broadcast_optim_state);
}

TEST(PlanCheckpointTest, Errors) {
  EXPECT_THAT(ParseError(Plan16(kDense4, "fsdp2", {"checkpoint:",
                                                   "  consolidate_optimizer_state: true"})),
              HasSubstr("test.yaml:4:1: checkpoint: expected a checkpoint section only with "
                        "strategy fsdp1"));
  EXPECT_THAT(ParseError(Plan16(kMoe4, "fsdp1",
                                {"moe: {expert_parallel: 8}", "checkpoint:",
                                 "  consolidate_optimizer_state: true",
                                 "  no_broadcast_optim_state: true"})),
              HasSubstr("test.yaml:7:3: checkpoint.no_broadcast_optim_state: expected "
                        "no_broadcast_optim_state only with fsdp1.implementation fairscale"));
  EXPECT_THAT(ParseError(Plan16(kMoe4, "fsdp1",
                                {"fsdp1: {implementation: fairscale}", "checkpoint:",
                                 "  consolidate_optimizer_state: true",
                                 "  no_broadcast_optim_state: true"})),
              HasSubstr("expected no_broadcast_optim_state only for an MoE model with "
                        "moe.expert_parallel > 1 (it keeps expert state on the rank that owns "
                        "it), got model.experts 8 and moe.expert_parallel 1"));
  EXPECT_THAT(ParseError(Plan16(kMoe4, "fsdp1",
                                {"fsdp1: {implementation: fairscale}", "moe: {expert_parallel: 8}",
                                 "checkpoint:", "  no_broadcast_optim_state: true"})),
              HasSubstr("test.yaml:7:3: checkpoint.no_broadcast_optim_state: expected "
                        "no_broadcast_optim_state only with consolidate_optimizer_state: true"));
  // no_broadcast_optim_state: false is always fine.
  ParseOk(Plan16(kDense4, "fsdp1", {"checkpoint: {no_broadcast_optim_state: false}"}));
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


// ---- oom ------------------------------------------------------------------------------------

std::string Fsdp1Plan(std::string_view oom_line) {
  return Lines({"model: llama3-8b", "cluster: {preset: dgx-a100, nodes: 1}", "strategy: fsdp1",
                oom_line});
}

TEST(PlanOomTest, DefaultIsRaiseWithoutHooks) {
  const Plan plan = ParseOk(Fsdp1Plan(""));
  EXPECT_EQ(plan.oom.policy, OomPolicy::kRaise);
  EXPECT_FALSE(plan.oom.sync_hooks);
}

TEST(PlanOomTest, CatchAndSyncWithAndWithoutHooks) {
  const Plan caught = ParseOk(Fsdp1Plan("oom: {policy: catch_and_sync}"));
  EXPECT_EQ(caught.oom.policy, OomPolicy::kCatchAndSync);
  EXPECT_FALSE(caught.oom.sync_hooks);
  const Plan hooked = ParseOk(Fsdp1Plan("oom: {policy: catch_and_sync, sync_hooks: true}"));
  EXPECT_EQ(hooked.oom.policy, OomPolicy::kCatchAndSync);
  EXPECT_TRUE(hooked.oom.sync_hooks);
  EXPECT_EQ(ParseOk(Fsdp1Plan("oom: {policy: raise, sync_hooks: false}")).oom.policy, OomPolicy::kRaise);
}

TEST(PlanOomTest, RejectsOtherStrategiesHooksWithoutCatchAndBadValues) {
  const std::string fsdp2 = ParseError(BasePlan() + "oom: {policy: catch_and_sync}\n");
  EXPECT_THAT(fsdp2, HasSubstr("test.yaml:10:"));
  EXPECT_THAT(fsdp2, HasSubstr("oom.policy"));
  EXPECT_THAT(fsdp2, HasSubstr("only with strategy fsdp1"));
  EXPECT_THAT(fsdp2, HasSubstr("strategy fsdp2"));
  EXPECT_THAT(ParseError(Fsdp1Plan("oom: {policy: raise, sync_hooks: true}")),
              HasSubstr("sync_hooks only with policy catch_and_sync"));
  EXPECT_THAT(ParseError(Fsdp1Plan("oom: {sync_hooks: true}")),
              HasSubstr("sync_hooks only with policy catch_and_sync"));
  EXPECT_THAT(ParseError(Fsdp1Plan("oom: {policy: retry}")), HasSubstr("oom.policy"));
  EXPECT_THAT(ParseError(Fsdp1Plan("oom: {policy: raise, hooks: true}")), HasSubstr("sync_hooks"));
  EXPECT_THAT(ParseError(Lines({"model: llama3-8b", "cluster: {preset: dgx-a100, nodes: 1}",
                                "strategy: fsdp1", "fsdp1: {implementation: fairscale}",
                                "oom: {policy: catch_and_sync}"})),
              HasSubstr("implementation fairscale"));
}

}  // namespace
}  // namespace shardscope::sim

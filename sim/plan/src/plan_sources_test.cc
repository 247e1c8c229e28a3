// Plans that take values from framework config files (plan_sources.h): a Hugging Face
// config.json, a DeepSpeed JSON config and a torchtitan TOML job config. Expected values are
// the files' own (or the frameworks' documented defaults and rules), worked out by hand.
#include "plan_sources.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "shardscope/sim/lowering/lowering.h"
#include "shardscope/sim/plan/plan.h"
#include "shardscope/traces/schedule_json.h"

namespace shardscope::sim {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A folder of config files and a plan beside them (paths in a plan are relative to it).
class ConfigDir {
 public:
  ConfigDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           (std::string("shardscope_sources_") + info->name() + "_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  ~ConfigDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  void Write(const std::string& name, const std::string& text) const {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  std::string PlanPath() const { return (dir_ / "plan.yaml").string(); }
  StatusOr<Plan> Parse(const std::string& plan_text) const {
    return ParsePlan(plan_text, PlanPath());
  }
  Plan ParseOk(const std::string& plan_text) const {
    StatusOr<Plan> plan = Parse(plan_text);
    EXPECT_TRUE(plan.ok()) << plan.status().message();
    return plan.ok() ? std::move(plan).value() : Plan{};
  }
  std::string ParseError(const std::string& plan_text) const {
    StatusOr<Plan> plan = Parse(plan_text);
    EXPECT_FALSE(plan.ok()) << "parsed without error:\n" << plan_text;
    if (plan.ok()) return "";
    EXPECT_EQ(plan.status().code(), StatusCode::kInvalidInput) << plan.status().message();
    return plan.status().message();
  }

 private:
  std::filesystem::path dir_;
};

// ---- Hugging Face config.json -----------------------------------------------------------------

// A Llama-3.2-1B-shaped config (its published config.json values): tied embeddings, GQA.
constexpr char kLlama1b[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "hidden_size": 2048,
  "intermediate_size": 8192,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "vocab_size": 128256
})";

constexpr char kFsdp2Plan[] =
    "model: {hf_config: config.json}\n"
    "cluster: {preset: dgx-a100, nodes: 1}\n"
    "strategy: fsdp2\n";

TEST(HfConfigTest, ResolvesTheModelFromTheFile) {
  ConfigDir dir;
  dir.Write("config.json", kLlama1b);
  const Plan plan = dir.ParseOk(kFsdp2Plan);
  EXPECT_EQ(plan.model.layers, 16);
  EXPECT_EQ(plan.model.hidden, 2048);
  EXPECT_EQ(plan.model.heads, 32);
  EXPECT_EQ(plan.model.kv_heads, 8);
  EXPECT_EQ(plan.model.ffn, 8192);
  EXPECT_EQ(plan.model.vocab, 128256);
  EXPECT_TRUE(plan.model.tied_embeddings);
  EXPECT_FALSE(plan.model.bias);
  EXPECT_EQ(plan.model.mlp, MlpKind::kSwiGlu);
  EXPECT_EQ(plan.model.experts, 1);
}

TEST(HfConfigTest, AbsentKeysTakeTheConfigClassDefaults) {
  ConfigDir dir;
  // LlamaConfig: num_key_value_heads None -> num_attention_heads; intermediate_size 11008.
  dir.Write("config.json", R"({"model_type": "llama", "hidden_size": 1024,
                               "num_attention_heads": 16, "num_hidden_layers": 4})");
  Plan plan = dir.ParseOk(kFsdp2Plan);
  EXPECT_EQ(plan.model.kv_heads, 16);
  EXPECT_EQ(plan.model.ffn, 11008);
  EXPECT_EQ(plan.model.vocab, 32000);
  EXPECT_FALSE(plan.model.tied_embeddings);
  // MixtralConfig: num_local_experts 8, num_experts_per_tok 2, num_key_value_heads 8.
  dir.Write("config.json", R"({"model_type": "mixtral", "num_hidden_layers": 2})");
  plan = dir.ParseOk(kFsdp2Plan);
  EXPECT_EQ(plan.model.experts, 8);
  EXPECT_EQ(plan.model.experts_per_token, 2);
  EXPECT_EQ(plan.model.kv_heads, 8);
  EXPECT_EQ(plan.model.ffn, 14336);
}

TEST(HfConfigTest, ThePlansOwnModelKeysOverrideTheFile) {
  ConfigDir dir;
  dir.Write("config.json", kLlama1b);
  const Plan plan = dir.ParseOk(
      "model: {hf_config: config.json, layers: 2, name: tiny}\n"
      "cluster: {preset: dgx-a100, nodes: 1}\n"
      "strategy: fsdp2\n");
  EXPECT_EQ(plan.model.layers, 2);
  EXPECT_EQ(plan.model.name, "tiny");
  EXPECT_EQ(plan.model.hidden, 2048);
}

TEST(HfConfigTest, UnknownKeyNamesFileLineAndKey) {
  ConfigDir dir;
  dir.Write("config.json", "{\n  \"model_type\": \"llama\",\n  \"hiden_size\": 4096\n}\n");
  EXPECT_THAT(dir.ParseError(kFsdp2Plan),
              AllOf(HasSubstr("config.json:3:3"), HasSubstr("hiden_size"),
                    HasSubstr("unknown key")));
}

TEST(HfConfigTest, UnsupportedKeyNamesFileLineAndKey) {
  ConfigDir dir;
  dir.Write("config.json", "{\n  \"model_type\": \"llama\",\n  \"attention_bias\": true\n}\n");
  EXPECT_THAT(dir.ParseError(kFsdp2Plan),
              AllOf(HasSubstr("config.json:3:3"), HasSubstr("attention_bias"),
                    HasSubstr("unsupported")));
  dir.Write("config.json", "{\"model_type\": \"qwen2\"}");
  EXPECT_THAT(dir.ParseError(kFsdp2Plan),
              AllOf(HasSubstr("config.json:1:2"), HasSubstr("model_type"), HasSubstr("qwen2")));
}

TEST(HfConfigTest, SlidingWindowBeyondTheSequenceIsRefused) {
  ConfigDir dir;
  // MistralConfig's sliding_window defaults to 4096: fine at seq_len 4096, not at 8192.
  dir.Write("config.json", R"({"model_type": "mistral", "num_hidden_layers": 2})");
  dir.ParseOk(std::string(kFsdp2Plan) + "training: {seq_len: 4096}\n");
  EXPECT_THAT(dir.ParseError(std::string(kFsdp2Plan) + "training: {seq_len: 8192}\n"),
              AllOf(HasSubstr("config.json"), HasSubstr("sliding_window"), HasSubstr("8192")));
}

TEST(HfConfigTest, NotJsonIsRefused) {
  ConfigDir dir;
  dir.Write("config.json", "{\"model_type\": llama}");
  EXPECT_THAT(dir.ParseError(kFsdp2Plan), AllOf(HasSubstr("config.json:1:2"), HasSubstr("JSON")));
  dir.Write("config.json", "{\"model_type\": \"llama\"} {}");
  EXPECT_THAT(dir.ParseError(kFsdp2Plan), HasSubstr("one JSON object"));
  dir.Write("config.json", "{\"model_type\": \"llama\", \"model_type\": \"llama\"}");
  EXPECT_THAT(dir.ParseError(kFsdp2Plan), HasSubstr("duplicate"));
}

// ---- DeepSpeed ---------------------------------------------------------------------------------

constexpr char kDsPlan[] =
    "model: llama3-8b\n"
    "cluster: {preset: dgx-a100, nodes: 1}\n"
    "zero: {deepspeed_config: ds.json}\n";

TEST(DeepSpeedConfigTest, ResolvesStageSizesPrecisionClippingAndBatch) {
  ConfigDir dir;
  dir.Write("ds.json", R"({
    "train_batch_size": 64,
    "train_micro_batch_size_per_gpu": 2,
    "gradient_clipping": 0.5,
    "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 16},
    "zero_optimization": {"stage": 2, "reduce_bucket_size": 2e8, "allgather_bucket_size": 3e8,
                          "contiguous_gradients": false,
                          "stage3_prefetch_bucket_size": 1e7},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}
  })");
  const Plan plan = dir.ParseOk(kDsPlan);
  EXPECT_EQ(plan.strategy, Strategy::kZero2);
  EXPECT_EQ(plan.zero.reduce_bucket_size, 200'000'000);
  EXPECT_EQ(plan.zero.allgather_bucket_size, 300'000'000);
  EXPECT_FALSE(plan.zero.contiguous_gradients);
  EXPECT_FALSE(plan.zero.overlap_comm);  // DeepSpeed: unset -> stage == 3
  // A stage-3 size at stage 2 is ignored, as DeepSpeed ignores it: the default stays.
  EXPECT_EQ(plan.zero.stage3_prefetch_bucket_size, 50'000'000);
  EXPECT_EQ(plan.training.dtype, traces::DType::kFloat16);
  EXPECT_EQ(plan.training.max_grad_norm, 0.5);
  // _set_batch_related_parameters: grad_acc = 64 // 2 // 8 = 4.
  EXPECT_EQ(plan.training.micro_batch_size, 2);
  EXPECT_EQ(plan.training.grad_accum_steps, 4);
}

TEST(DeepSpeedConfigTest, DeepSpeedDefaultsWhereTheFileIsSilent) {
  ConfigDir dir;
  dir.Write("ds.json", R"({"train_batch_size": 8, "zero_optimization": {"stage": 3}})");
  const Plan plan = dir.ParseOk(kDsPlan);
  EXPECT_EQ(plan.strategy, Strategy::kZero3);
  EXPECT_TRUE(plan.zero.overlap_comm);
  EXPECT_EQ(plan.training.dtype, traces::DType::kFloat32);  // neither fp16 nor bf16
  EXPECT_EQ(plan.training.max_grad_norm, 0);               // gradient_clipping 0.0
  EXPECT_EQ(plan.training.micro_batch_size, 1);            // 8 // 8
  EXPECT_EQ(plan.training.grad_accum_steps, 1);
}

TEST(DeepSpeedConfigTest, AutoValuesResolveFromThePlanAsTheHfTrainerDoes) {
  ConfigDir dir;
  dir.Write("ds.json", R"({
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
    "bf16": {"enabled": "auto"},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
                          "stage3_prefetch_bucket_size": "auto",
                          "stage3_param_persistence_threshold": "auto"}})");
  const Plan plan = dir.ParseOk(std::string(kDsPlan) +
                                "training: {micro_batch_size: 2, grad_accum_steps: 3, dtype: bf16}\n");
  EXPECT_EQ(plan.training.micro_batch_size, 2);
  EXPECT_EQ(plan.training.grad_accum_steps, 3);
  EXPECT_EQ(plan.training.max_grad_norm, 1.0);
  // llama3-8b: hidden 4096. h^2, int(0.9 h^2), 10 h.
  EXPECT_EQ(plan.zero.reduce_bucket_size, 4096 * 4096);
  EXPECT_EQ(plan.zero.stage3_prefetch_bucket_size, 15'099'494);
  EXPECT_EQ(plan.zero.stage3_param_persistence_threshold, 40'960);
}

TEST(DeepSpeedConfigTest, AutoWithoutThePlansValueNamesFileLineAndKey) {
  ConfigDir dir;
  dir.Write("ds.json",
            "{\n  \"train_micro_batch_size_per_gpu\": \"auto\",\n"
            "  \"zero_optimization\": {\"stage\": 1}\n}\n");
  EXPECT_THAT(dir.ParseError(kDsPlan),
              AllOf(HasSubstr("ds.json:2:3"), HasSubstr("train_micro_batch_size_per_gpu"),
                    HasSubstr("auto")));
}

TEST(DeepSpeedConfigTest, InconsistentBatchNamesFileLineAndKey) {
  ConfigDir dir;
  // 1 x 2 x 8 = 16, not 32 (DeepSpeedConfig._batch_assertion).
  dir.Write("ds.json",
            "{\n  \"train_batch_size\": 32,\n  \"train_micro_batch_size_per_gpu\": 1,\n"
            "  \"gradient_accumulation_steps\": 2,\n  \"zero_optimization\": {\"stage\": 3}\n}\n");
  EXPECT_THAT(dir.ParseError(kDsPlan),
              AllOf(HasSubstr("ds.json:2:3"), HasSubstr("train_batch_size"),
                    HasSubstr("1 x 2 x 8"), HasSubstr("got 32")));
}

TEST(DeepSpeedConfigTest, ConflictingPlanValueNamesBothPlaces) {
  ConfigDir dir;
  dir.Write("ds.json",
            "{\n  \"train_micro_batch_size_per_gpu\": 1,\n"
            "  \"zero_optimization\": {\"stage\": 3}\n}\n");
  EXPECT_THAT(dir.ParseError(std::string(kDsPlan) + "training: {micro_batch_size: 2}\n"),
              AllOf(HasSubstr("plan.yaml:4:30"), HasSubstr("training.micro_batch_size"),
                    HasSubstr("ds.json:2:3"), HasSubstr("train_micro_batch_size_per_gpu")));
  // The strategy too: the file says stage 3.
  EXPECT_THAT(dir.ParseError(std::string(kDsPlan) + "strategy: zero2\n"),
              AllOf(HasSubstr("plan.yaml:4:11"), HasSubstr("strategy"),
                    HasSubstr("ds.json:3:25")));
}

TEST(DeepSpeedConfigTest, UnsupportedAndUnknownKeysNameFileLineAndKey) {
  ConfigDir dir;
  dir.Write("ds.json",
            "{\n  \"train_batch_size\": 8,\n  \"zero_optimization\": {\n    \"stage\": 3,\n"
            "    \"offload_param\": {\"device\": \"cpu\"}\n  }\n}\n");
  EXPECT_THAT(dir.ParseError(kDsPlan),
              AllOf(HasSubstr("ds.json:5:23"), HasSubstr("offload_param.device"),
                    HasSubstr("unsupported")));
  dir.Write("ds.json",
            "{\n  \"train_batch_size\": 8,\n  \"zero_optimization\": {\n    \"stage\": 3,\n"
            "    \"zero_quantized_weights\": true\n  }\n}\n");
  EXPECT_THAT(dir.ParseError(kDsPlan),
              AllOf(HasSubstr("ds.json:5:5"), HasSubstr("zero_quantized_weights"),
                    HasSubstr("unsupported")));
  dir.Write("ds.json", "{\n  \"train_batch_size\": 8,\n  \"zero_optimisation\": {}\n}\n");
  EXPECT_THAT(dir.ParseError(kDsPlan),
              AllOf(HasSubstr("ds.json:3:3"), HasSubstr("zero_optimisation"),
                    HasSubstr("unknown key")));
}

// ---- torchtitan ------------------------------------------------------------------------------

constexpr char kTitanPlan[] =
    "torchtitan: {job_config: job.toml}\n"
    "cluster: {preset: dgx-a100, nodes: 2}\n";

TEST(TorchtitanConfigTest, ResolvesModelMeshShapeAndCheckpointing) {
  ConfigDir dir;
  dir.Write("job.toml",
            "[model]\nname = \"llama3\"\nflavor = \"8B\"\n"
            "[training]\nlocal_batch_size = 2\nglobal_batch_size = 64\nseq_len = 4096\n"
            "max_norm = 0.5\nmixed_precision_reduce = \"float32\"\n"
            "[parallelism]\ndata_parallel_replicate_degree = 2\n"
            "fsdp_reshard_after_forward = \"never\"\n"
            "[activation_checkpoint]\nmode = \"selective\"\nselective_ac_option = \"3\"\n"
            "[compile]\nenable = true\ncomponents = [\"model\", \"loss\"]\n");
  const Plan plan = dir.ParseOk(kTitanPlan);
  EXPECT_EQ(plan.model.name, "llama3-8b");
  EXPECT_EQ(plan.strategy, Strategy::kFsdp2);
  EXPECT_EQ(plan.fsdp2.mesh.replicate, 2);
  EXPECT_EQ(plan.fsdp2.mesh.shard, 8);  // data_parallel_shard_degree -1: 16 / 2
  EXPECT_EQ(plan.fsdp2.reshard_after_forward, ReshardAfterForward::kFalse);
  EXPECT_EQ(plan.fsdp2.param_dtype, traces::DType::kBFloat16);
  EXPECT_EQ(plan.fsdp2.reduce_dtype, traces::DType::kFloat32);
  EXPECT_EQ(plan.training.seq_len, 4096);
  EXPECT_EQ(plan.training.micro_batch_size, 2);
  EXPECT_EQ(plan.training.grad_accum_steps, 2);  // 64 / (2 x 16)
  EXPECT_EQ(plan.training.max_grad_norm, 0.5);
  EXPECT_EQ(plan.training.activation_checkpointing, ActivationCheckpointing::kSelective);
  EXPECT_EQ(plan.training.selective_ac_every, 3);
  EXPECT_TRUE(plan.training.compile);
}

TEST(TorchtitanConfigTest, TorchtitanDefaultsWhereTheFileIsSilent) {
  ConfigDir dir;
  dir.Write("job.toml", "[model]\nname = \"llama3\"\nflavor = \"8B\"\n");
  const Plan plan = dir.ParseOk(kTitanPlan);
  EXPECT_EQ(plan.training.micro_batch_size, 8);  // local_batch_size 8
  EXPECT_EQ(plan.training.seq_len, 2048);
  EXPECT_EQ(plan.training.grad_accum_steps, 1);  // global_batch_size -1
  EXPECT_EQ(plan.training.activation_checkpointing, ActivationCheckpointing::kSelective);
  EXPECT_EQ(plan.training.selective_ac_every, 2);
  EXPECT_EQ(plan.fsdp2.mesh.shard, 16);
  EXPECT_EQ(plan.fsdp2.reshard_after_forward, ReshardAfterForward::kTrue);
}

TEST(TorchtitanConfigTest, FlavorWithoutPresetNeedsThePlansModel) {
  ConfigDir dir;
  dir.Write("job.toml", "[model]\nname = \"llama3\"\nflavor = \"debugmodel\"\n");
  EXPECT_THAT(dir.ParseError(kTitanPlan),
              AllOf(HasSubstr("job.toml:3:1"), HasSubstr("llama3 debugmodel")));
  const Plan plan = dir.ParseOk(std::string(kTitanPlan) +
                                "model: {layers: 2, hidden: 256, heads: 16, ffn: 768, vocab: 2000}\n");
  EXPECT_EQ(plan.model.layers, 2);
}

TEST(TorchtitanConfigTest, ErrorsNameFileLineAndKey) {
  ConfigDir dir;
  dir.Write("job.toml", "[model]\nname = \"llama3\"\nflavor = \"8B\"\n[parallelism]\n"
                        "tensor_parallel_degree = 2\n");
  EXPECT_THAT(dir.ParseError(kTitanPlan),
              AllOf(HasSubstr("job.toml:5:1"), HasSubstr("parallelism.tensor_parallel_degree"),
                    HasSubstr("unsupported")));
  dir.Write("job.toml", "[model]\nname = \"llama3\"\nflavor = \"8B\"\n[training]\nbatchsize = 2\n");
  EXPECT_THAT(dir.ParseError(kTitanPlan),
              AllOf(HasSubstr("job.toml:5:1"), HasSubstr("training.batchsize"),
                    HasSubstr("unknown key")));
  // torchtitan's Trainer: global_batch_size must be a multiple of local x dp (1 x 16).
  dir.Write("job.toml", "[model]\nname = \"llama3\"\nflavor = \"8B\"\n[training]\n"
                        "local_batch_size = 1\nglobal_batch_size = 24\n");
  EXPECT_THAT(dir.ParseError(kTitanPlan),
              AllOf(HasSubstr("job.toml:6:1"), HasSubstr("global_batch_size"), HasSubstr("got 24")));
  dir.Write("job.toml", "[model]\nname = \"llama3\"\nflavor = \"8B\"\n[training]\nseq_len = 4096\n");
  EXPECT_THAT(dir.ParseError(std::string(kTitanPlan) + "training: {seq_len: 8192}\n"),
              AllOf(HasSubstr("plan.yaml:3:21"), HasSubstr("training.seq_len"),
                    HasSubstr("job.toml:5:1")));
  dir.Write("job.toml", "[model\nname = 1\n");
  EXPECT_THAT(dir.ParseError(kTitanPlan), AllOf(HasSubstr("job.toml:1:"), HasSubstr("TOML")));
}

// ---- plumbing: the bundled examples lower exactly like the hand-written plans --------------

std::string LoweredJson(Plan plan) {
  // The model's display name and the plan's path are labels, not the job.
  plan.model.name = "model";
  plan.source = "plan.yaml";
  StatusOr<traces::Schedule> schedule = LowerPlan(plan);
  EXPECT_TRUE(schedule.ok()) << schedule.status().message();
  return schedule.ok() ? traces::ScheduleToJson(*schedule) : std::string();
}

Plan LoadExample(const std::string& name) {
  StatusOr<Plan> plan =
      LoadPlanFile(std::string(SHARDSCOPE_SOURCE_DIR) + "/examples/from-configs/" + name);
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return plan.ok() ? std::move(plan).value() : Plan{};
}

Plan ParseHandWritten(const std::string& text) {
  StatusOr<Plan> plan = ParsePlan(text, "hand-written.yaml");
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return plan.ok() ? std::move(plan).value() : Plan{};
}

TEST(PlanSourcesPlumbingTest, HfConfigExampleLowersLikeThePreset) {
  const std::string from_config = LoweredJson(LoadExample("hf-llama3-8b-fsdp2.yaml"));
  const std::string hand_written = LoweredJson(ParseHandWritten(
      "model: llama3-8b\n"
      "cluster: {preset: dgx-a100, nodes: 1}\n"
      "strategy: fsdp2\n"
      "training: {seq_len: 8192, micro_batch_size: 1, activation_checkpointing: full, "
      "dtype: bf16}\n"));
  EXPECT_FALSE(from_config.empty());
  EXPECT_TRUE(from_config == hand_written);
}

TEST(PlanSourcesPlumbingTest, DeepSpeedExampleLowersLikeTheHandWrittenPlan) {
  const std::string from_config = LoweredJson(LoadExample("deepspeed-zero3.yaml"));
  const std::string hand_written = LoweredJson(ParseHandWritten(
      "model: llama3-8b\n"
      "cluster: {preset: dgx-a100, nodes: 1}\n"
      "strategy: zero3\n"
      "training: {seq_len: 4096, micro_batch_size: 1, grad_accum_steps: 2, "
      "activation_checkpointing: full, dtype: bf16, max_grad_norm: 1.0}\n"
      "zero: {overlap_comm: true, contiguous_gradients: true, reduce_bucket_size: 5e8, "
      "stage3_prefetch_bucket_size: 5e7, stage3_param_persistence_threshold: 1e5, "
      "stage3_max_live_parameters: 1e9, stage3_max_reuse_distance: 1e9}\n"));
  EXPECT_FALSE(from_config.empty());
  EXPECT_TRUE(from_config == hand_written);
}

TEST(PlanSourcesPlumbingTest, TorchtitanExampleLowersLikeTheHandWrittenPlan) {
  const std::string from_config = LoweredJson(LoadExample("torchtitan-llama3-8b.yaml"));
  const std::string hand_written = LoweredJson(ParseHandWritten(
      "model: llama3-8b\n"
      "cluster: {preset: dgx-a100, nodes: 8}\n"
      "strategy: fsdp2\n"
      "training: {seq_len: 8192, micro_batch_size: 1, grad_accum_steps: 1, "
      "activation_checkpointing: selective_op, dtype: bf16, max_grad_norm: 1.0, "
      "implementation: torchtitan}\n"
      "fsdp2: {reshard_after_forward: true, mixed_precision: {param_dtype: bf16, "
      "reduce_dtype: fp32}}\n"));
  EXPECT_FALSE(from_config.empty());
  EXPECT_TRUE(from_config == hand_written);
}

}  // namespace
}  // namespace shardscope::sim

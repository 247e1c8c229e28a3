// Tests for the model: section: presets with overrides, models from their dimensions, and the
// errors about a model.
#include "shardscope/sim/plan/plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "plan_test_support.h"

namespace shardscope::sim {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

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

TEST(PlanErrorTest, UnknownModelKey) {
  const std::string message = ParseError(
      Lines({"model: {preset: llama3-8b, depth: 4}", "cluster: dgx-a100", "strategy: fsdp2"}));
  EXPECT_THAT(message,
              AllOf(HasSubstr("test.yaml:1:28: model.depth: "), HasSubstr("unknown key 'depth'")));
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

TEST(PlanErrorTest, InvalidModelDimensions) {
  // 4 heads do not divide hidden 250: ValidateModel's message, located at the model.
  const std::string message = ParseError(Lines({
      "strategy: fsdp2",
      "cluster: dgx-a100",
      "model: {layers: 2, hidden: 250, heads: 4, ffn: 512, vocab: 1000}",
  }));
  EXPECT_THAT(message, HasSubstr("test.yaml:3:8: model: "));
}

TEST(PlanErrorTest, ModelTooLarge) {
  const std::string message = ParseError(Lines({
      "model: {layers: 16384, hidden: 1048576, heads: 8, ffn: 1048576, vocab: 1000}",
      "cluster: dgx-a100",
      "strategy: fsdp2",
  }));
  EXPECT_THAT(message, AllOf(HasSubstr("test.yaml:1:8: model: expected at most 2^50 parameters")));
}

}  // namespace
}  // namespace shardscope::sim

// Tests for the fsdp2: and fsdp1: sections: every knob, the defaults resolved from the mesh
// and the training dtype, the HSDP meshes, and fairscale's FSDP.
#include "shardscope/sim/plan/plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "plan_test_support.h"

namespace shardscope::sim {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

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

}  // namespace
}  // namespace shardscope::sim

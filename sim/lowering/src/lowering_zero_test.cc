// DeepSpeed ZeRO-1/2 lowering (lowering_zero12.cc): closed-form communication and
// model-state bytes per rank, gradient-accumulation behaviour, the 2021 stage-2 reduces,
// overlap_comm, the gradient hooks' order against DeepSpeed's sources; every schedule
// validates and simulates to completion. ZeRO-3: lowering_zero3_test.cc.
#include <gtest/gtest.h>

#include "lowering_zero_test_support.h"

// In the helpers' namespace, so the tests call them unqualified.
namespace shardscope::sim::zero_test {
namespace {

TEST(ZeroLowering, Stage1And2CommunicateTwoPsiPerStep) {
  for (Strategy strategy : {Strategy::kZero1, Strategy::kZero2}) {
    Plan plan = ToyPlan(strategy);
    plan.zero.reduce_bucket_size = 200'000;  // several IPG buckets
    const Schedule schedule = MustLower(plan);
    const int64_t psi = Psi(plan);
    // Gradient reduction: every gradient element goes through one all_reduce of its bucket
    // (bf16): Ψ x 2 bytes; then the parameters: one all_gather of the padded flat group.
    EXPECT_EQ(CollectiveBytes(schedule, "ZeRO::allreduce_bucket", CollectiveType::kAllReduce), psi * kBf16);
    EXPECT_GT(CountOps(schedule, "ZeRO::allreduce_bucket"), 1);
    EXPECT_EQ(CollectiveBytes(schedule, "ZeRO::all_gather_dp_groups", CollectiveType::kAllGather),
              FlatNumel(plan) * kBf16);
    // No reduce-scatter: DeepSpeed all-reduces the bucket and keeps its slice.
    EXPECT_EQ(CountOps(schedule, "ZeRO::reduce_scatter_coalesced"), 0);
    // get_grad_norm_direct (stage_1_and_2.py, current main): the norm is one fp32 scalar
    // (.square().sum().float()) all-reduced over the world.
    EXPECT_EQ(CollectiveBytes(schedule, "ZeRO::get_grad_norm_direct.all_reduce", CollectiveType::kAllReduce), 4);
    MustSimulate(schedule);
  }
}

TEST(ZeroLowering, Stage1ModelStatesAreFourPsiPlusTwelvePsiOverN) {
  const Plan plan = ToyPlan(Strategy::kZero1);
  const Schedule schedule = MustLower(plan);
  const int64_t psi = Psi(plan);
  const int64_t partition = FlatNumel(plan) / kWorld;
  // Sums: the replicated bf16 flat parameters, the full bf16 gradients autograd allocates
  // (grad.<module>, micro-batch 0), the fp32 master partition and the two fp32 moments.
  const int64_t params = Allocated(schedule, "unsharded.bit16_groups_flat").first;
  const int64_t grads = Allocated(schedule, "grad.", 0).first;
  const int64_t optimizer = Allocated(schedule, "param_shard.fp32_partition").first +
                            Allocated(schedule, "exp_avg.").first + Allocated(schedule, "exp_avg_sq.").first;
  EXPECT_EQ(params, 2 * FlatNumel(plan));
  EXPECT_EQ(grads, 2 * psi);
  EXPECT_EQ(optimizer, 12 * partition);
  // 4Ψ + 12Ψ/N up to the alignment padding (< 2N elements).
  EXPECT_NEAR(static_cast<double>(params + grads + optimizer), 4.0 * psi + 12.0 * psi / kWorld, 4.0 * 2 * kWorld);
}

TEST(ZeroLowering, Stage2ModelStatesAreTwoPsiPlusFourteenPsiOverN) {
  const Plan plan = ToyPlan(Strategy::kZero2);
  const Schedule schedule = MustLower(plan);
  const int64_t psi = Psi(plan);
  const int64_t partition = FlatNumel(plan) / kWorld;
  // Sums: the replicated bf16 parameters, the bf16 gradient partition (grads_in_partition,
  // one per backward: one micro-step here) and the fp32 master partition with its two
  // moments. The full gradients are transient (copied into the IPG buffer as they become
  // ready). grads_in_partition holds straddling parameters whole, so it exceeds Ψ/N by at
  // most the two parameters that straddle the partition's ends (previously encoded as
  // exactly Ψ/N, which DeepSpeed does not allocate).
  const int64_t grads = GradsInPartitionNumel(plan);
  int64_t largest = 0;
  for (const ParamTensor& p : Params(plan)) largest = std::max(largest, p.numel);
  EXPECT_GE(grads, partition - 2 * kWorld);
  EXPECT_LE(grads, partition + 2 * largest);
  const int64_t total = Allocated(schedule, "unsharded.bit16_groups_flat").first +
                        Allocated(schedule, "grad_shard.grads_in_partition").first +
                        Allocated(schedule, "param_shard.fp32_partition").first +
                        Allocated(schedule, "exp_avg.").first + Allocated(schedule, "exp_avg_sq.").first;
  EXPECT_EQ(total, 2 * FlatNumel(plan) + 12 * partition + 2 * grads);
  EXPECT_NEAR(static_cast<double>(total), 2.0 * psi + 14.0 * psi / kWorld, 16.0 * 2 * kWorld + 4.0 * largest);
}

TEST(ZeroLowering, Stage1ReducesOncePerStepStage2EveryMicroStep) {
  constexpr int32_t kAccum = 4;
  for (Strategy strategy : {Strategy::kZero1, Strategy::kZero2}) {
    const Plan plan = ToyPlan(strategy, kAccum);
    const Schedule schedule = MustLower(plan);
    const int64_t reductions = strategy == Strategy::kZero1 ? 1 : kAccum;
    EXPECT_EQ(CollectiveBytes(schedule, "ZeRO::allreduce_bucket", CollectiveType::kAllReduce),
              reductions * Psi(plan) * kBf16)
        << StrategyName(strategy);
    // The parameters are gathered once, after the step.
    EXPECT_EQ(CountOps(schedule, "ZeRO::all_gather_dp_groups"), 1);
    MustSimulate(schedule);
  }
}

// The 2021 stage 2 average_tensor: each run of a bucket owned by one rank is reduced to that
// rank (dist.reduce), so one step moves Ψ in reduces — never the 2Ψ of an all-reduce — after a
// device synchronize per bucket.
TEST(ZeroLowering, Stage2LegacyReducesEachRanksSliceToIt) {
  Plan plan = ToyPlan(Strategy::kZero2);
  plan.zero.overlap_comm = true;
  plan.zero.legacy_reduce_per_rank = true;
  plan.zero.reduce_bucket_size = 100'000;  // several buckets
  const Schedule schedule = MustLower(plan);
  EXPECT_EQ(CollectiveBytes(schedule, "ZeRO::allreduce_bucket", CollectiveType::kAllReduce), 0);
  EXPECT_EQ(CollectiveBytes(schedule, "ZeRO::reduce", CollectiveType::kReduce), Psi(plan) * kBf16);
  const int64_t buckets = CountOps(schedule, "ZeRO::legacy.average_tensor.synchronize");
  EXPECT_GT(buckets, 1);
  // At least one reduce per bucket and at most one per rank and bucket.
  EXPECT_GE(CountOps(schedule, "ZeRO::reduce"), buckets);
  EXPECT_LE(CountOps(schedule, "ZeRO::reduce"), buckets * kWorld);
  // Every root is a rank of the group.
  const traces::Program& program = schedule.ProgramOf(0);
  for (const traces::Op& op : program.ops) {
    const auto* c = std::get_if<CollectiveOp>(&op.payload);
    if (c != nullptr && c->type == CollectiveType::kReduce) {
      EXPECT_GE(c->peer, 0);
      EXPECT_LT(c->peer, kWorld);
    }
  }
  MustSimulate(schedule);
}

TEST(ZeroLowering, OverlapCommDoubleBuffersAndSynchronizesInTheEpilogue) {
  Plan plan = ToyPlan(Strategy::kZero2);
  plan.zero.overlap_comm = true;
  const Schedule with = MustLower(plan);
  EXPECT_EQ(Allocated(with, "bucket.ipg.").second, 2);
  EXPECT_EQ(CountOps(with, "ZeRO::ipg_epilogue.synchronize"), 1);
  MustSimulate(with);
  plan.zero.overlap_comm = false;
  const Schedule without = MustLower(plan);
  EXPECT_EQ(Allocated(without, "bucket.ipg.").second, 1);
  EXPECT_EQ(CountOps(without, "ZeRO::ipg_epilogue.synchronize"), 0);
}

// stage_1_and_2.py: copy_grads_in_partition allocates grads_in_partition lazily in every
// backward, _release_ipg_buffers drops it at the end of every epilogue; the first
// micro-step's storage lives on (all_grad_tensors, then averaged_gradients) until the step.
TEST(ZeroLowering, Stage2GradsInPartitionIsReallocatedEveryBackward) {
  constexpr int32_t kAccum = 3;
  const Plan plan = ToyPlan(Strategy::kZero2, kAccum);
  const Schedule schedule = MustLower(plan);
  EXPECT_EQ(Allocated(schedule, "grad_shard.grads_in_partition"),
            (std::pair<int64_t, int64_t>{kAccum * GradsInPartitionNumel(plan) * kBf16, kAccum}));
  const OpIndex index(schedule);
  std::map<std::string, traces::OpTags> allocated, freed;
  for (const traces::Op& op : index.program.ops) {
    const std::string* tensor = index.Tensor(op);
    if (tensor == nullptr || tensor->rfind("grad_shard.grads_in_partition", 0) != 0) continue;
    (std::holds_alternative<traces::AllocateOp>(op.payload) ? allocated : freed)[*tensor] = op.tags;
  }
  ASSERT_EQ(freed.size(), static_cast<size_t>(kAccum));
  for (const auto& [tensor, tags] : allocated) {
    EXPECT_EQ(tags.phase, traces::Phase::kBackward) << tensor;
    if (tags.micro_batch == 0) {
      EXPECT_EQ(freed.at(tensor).phase, traces::Phase::kOptimizer) << tensor;
    } else {
      EXPECT_EQ(freed.at(tensor).phase, traces::Phase::kBackward) << tensor;
      EXPECT_EQ(freed.at(tensor).micro_batch, tags.micro_batch) << tensor;
    }
  }
  // Later micro-steps add their gradients into the first one's (all_grad_tensors add_).
  EXPECT_EQ(CountOps(schedule, "ZeRO::accumulate_all_grad_tensors"), kAccum - 1);
  MustSimulate(schedule);
}

// create_gradient_handling_hooks / register_grad_hook: one hook per parameter, run as soon as
// its gradient is ready — interleaved with the module's backward kernels, so reductions
// start before the block's backward ends and gradients are allocated per leaf module.
TEST(ZeroLowering, Stage2HooksInterleaveWithTheBackwardKernels) {
  Plan plan = ToyPlan(Strategy::kZero2);
  plan.zero.reduce_bucket_size = 200'000;
  const Schedule schedule = MustLower(plan);
  const OpIndex index(schedule);
  size_t first_reduce = 0, last_kernel = 0;
  for (size_t i = 0; i < index.program.ops.size(); ++i) {
    const traces::Op& op = index.program.ops[i];
    if (op.tags.phase != traces::Phase::kBackward || index.Module(op) != "layers.1") continue;
    if (index.Name(op) == "ZeRO::allreduce_bucket" && first_reduce == 0) first_reduce = i;
    const auto* kernel = std::get_if<traces::KernelOp>(&op.payload);
    if (kernel != nullptr && std::holds_alternative<traces::GemmDesc>(kernel->compute)) last_kernel = i;
  }
  EXPECT_GT(first_reduce, 0u);
  EXPECT_LT(first_reduce, last_kernel);
  // The gradient of feed_forward.w2 (hidden 256 x ffn 688) is its own allocation.
  EXPECT_EQ(Allocated(schedule, "grad.layers.1.feed_forward.w2"), (std::pair<int64_t, int64_t>{176'128 * kBf16, 1}));
  EXPECT_EQ(Allocated(schedule, "grad.layers.1.").first, (4 * 65'536 + 3 * 176'128 + 2 * 256) * kBf16);
  MustSimulate(schedule);
}

// process_gradients reduces only if partition_gradients or overlap_comm: ZeRO-1 with
// overlap_comm false (the default) reduces nothing in backward; at the boundary
// reduce_gradients walks the parameters in forward order after backward, then the epilogue.
TEST(ZeroLowering, Stage1WithoutOverlapReducesAfterBackwardInForwardOrder) {
  Plan plan = ToyPlan(Strategy::kZero1);
  plan.zero.reduce_bucket_size = 200'000;
  ASSERT_FALSE(plan.zero.overlap_comm);
  const Schedule schedule = MustLower(plan);
  const OpIndex index(schedule);
  std::vector<int64_t> bucket_bytes;
  for (const traces::Op& op : index.program.ops) {
    const auto* c = std::get_if<CollectiveOp>(&op.payload);
    if (c == nullptr || index.Name(op) != "ZeRO::allreduce_bucket") continue;
    EXPECT_EQ(index.Module(op), "") << "reduced inside a module's backward";
    bucket_bytes.push_back(c->bytes);
  }
  // Forward order, 200,000-element buckets: the embedding (256,000: larger than a bucket,
  // reduced alone), then layers.0's attention_norm + wq + wk + wv (256 + 3 x 65,536 =
  // 196,864; wo would overflow the bucket), ... In reverse order the first buckets would be
  // the output projection (256,000) and then the final norm with feed_forward.w2.
  ASSERT_GE(bucket_bytes.size(), 2u);
  EXPECT_EQ(bucket_bytes[0], 256'000 * kBf16);
  EXPECT_EQ(bucket_bytes[1], (256 + 3 * 65'536) * kBf16);
  MustSimulate(schedule);
  // With overlap_comm the hooks reduce during the backward.
  plan.zero.overlap_comm = true;
  const Schedule overlapped = MustLower(plan);
  const OpIndex overlapped_index(overlapped);
  int64_t in_modules = 0;
  for (const traces::Op& op : overlapped_index.program.ops) {
    in_modules += overlapped_index.Name(op) == "ZeRO::allreduce_bucket" && overlapped_index.Module(op) != "" ? 1 : 0;
  }
  EXPECT_GT(in_modules, 0);
}

// Autograd makes one gradient tensor per parameter, and the caching allocator sees one block
// per parameter: the gradients each micro-step allocates are the parameter list's numels x 2 B
// (bf16), one each, whatever leaf module or submodule holds them. Toy: embedding and output
// 1000 x 256 = 256,000, norms 256, wq/wk/wv/wo 65,536, w1/w2/w3 256 x 688 = 176,128.
TEST(ZeroLowering, GradientsAreOneBlockPerParameter) {
  for (Strategy strategy : {Strategy::kZero1, Strategy::kZero2, Strategy::kZero3}) {
    const Plan plan = ToyPlan(strategy);
    const Schedule schedule = MustLower(plan);
    const traces::Program& p = schedule.ProgramOf(0);
    std::vector<int64_t> grads;
    for (const traces::Op& op : p.ops) {
      const auto* a = std::get_if<traces::AllocateOp>(&op.payload);
      if (a != nullptr && p.tensors[static_cast<size_t>(a->tensor)].rfind("grad.", 0) == 0) grads.push_back(a->bytes);
    }
    std::vector<int64_t> expected;
    for (const ParamTensor& param : Params(plan)) expected.push_back(param.numel * kBf16);
    std::sort(grads.begin(), grads.end());
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(grads, expected) << StrategyName(strategy);
    MustSimulate(schedule);
  }
}

}  // namespace
}  // namespace shardscope::sim::zero_test

// The CUDA backend's CPU-side decisions (cuda/proxy_math.h), checked against numbers worked
// out by hand from the CUDA / cuBLASLt conventions the header cites. No GPU, no toolkit.
#include "cuda/proxy_math.h"

#include <map>
#include <string>

#include <gtest/gtest.h>

#include "shardscope/runtime/cuda_backend.h"

namespace shardscope::runtime::cuda {
namespace {

using traces::AttentionDesc;
using traces::DType;
using traces::GemmDesc;

constexpr ComputeCapability kH100{9, 0};
constexpr ComputeCapability kA100{8, 0};

// ---- Stream priorities

TEST(CudaStreamPriorityTest, PyTorchPrioritiesKeepTheirValuesOnAHopperRange) {
  // H100: cudaDeviceGetStreamPriorityRange gives least 0, greatest -5.
  const PriorityRange h100{0, -5};
  EXPECT_EQ(MapStreamPriorities({0, -1, 0}, h100), (std::vector<int32_t>{0, -1, 0}));
}

TEST(CudaStreamPriorityTest, OrderIsKeptWhateverTheNumbers) {
  const PriorityRange h100{0, -5};
  // Levels 5 (lowest), 1, -3 (highest): 0, -1, -2.
  EXPECT_EQ(MapStreamPriorities({5, -3, 1}, h100), (std::vector<int32_t>{0, -2, -1}));
  // A single level is the default priority.
  EXPECT_EQ(MapStreamPriorities({7, 7}, h100), (std::vector<int32_t>{0, 0}));
}

TEST(CudaStreamPriorityTest, LevelsBeyondTheRangeShareTheHighest) {
  const PriorityRange narrow{0, -1};
  // Four levels on a two-level device: the lowest stays 0, the three above all get -1.
  EXPECT_EQ(MapStreamPriorities({0, -1, -2, -3}, narrow), (std::vector<int32_t>{0, -1, -1, -1}));
  const PriorityRange flat{0, 0};  // no priorities at all
  EXPECT_EQ(MapStreamPriorities({0, -1}, flat), (std::vector<int32_t>{0, 0}));
}

// ---- GEMM problems

TEST(CudaGemmProblemTest, Bf16RowMajorBecomesSwappedColumnMajor) {
  // Row-major C[64][32] = A[64][16] x B[16][32]: cuBLAS computes C^T (32 x 64) = B^T A^T.
  const LtProblem p = GemmProblem(GemmDesc{64, 32, 16, 1, DType::kBFloat16}, kH100);
  EXPECT_EQ(p.m, 32);
  EXPECT_EQ(p.n, 64);
  EXPECT_EQ(p.k, 16);
  EXPECT_EQ(p.batch, 1);
  EXPECT_FALSE(p.transpose_a);
  EXPECT_FALSE(p.transpose_b);
  EXPECT_EQ(p.lda, 32);  // B's rows are n = 32 long
  EXPECT_EQ(p.ldb, 16);  // A's rows are k = 16 long
  EXPECT_EQ(p.ldc, 32);  // C's rows are n = 32 long
  EXPECT_EQ(p.a_type, LtDataType::kBF16);
  EXPECT_EQ(p.c_type, LtDataType::kBF16);
  EXPECT_EQ(p.compute, LtComputeType::k32F);
  EXPECT_EQ(p.scale_type, LtDataType::kF32);
  EXPECT_EQ(p.a_bytes(), 16 * 32 * 2);
  EXPECT_EQ(p.b_bytes(), 64 * 16 * 2);
  EXPECT_EQ(p.c_bytes(), 64 * 32 * 2);
  EXPECT_DOUBLE_EQ(p.flops(), 2.0 * 64 * 32 * 16);
  EXPECT_TRUE(p.note.empty());
}

TEST(CudaGemmProblemTest, BatchedStridesCoverOneMatrixEach) {
  const LtProblem p = GemmProblem(GemmDesc{8, 24, 40, 3, DType::kFloat16}, kH100);
  EXPECT_EQ(p.batch, 3);
  EXPECT_EQ(p.stride_a, 24 * 40);
  EXPECT_EQ(p.stride_b, 40 * 8);
  EXPECT_EQ(p.stride_c, 24 * 8);
  EXPECT_EQ(p.a_type, LtDataType::kF16);
  EXPECT_EQ(p.c_bytes(), 3 * 24 * 8 * 2);
}

TEST(CudaGemmProblemTest, ComputeAndScaleTypesPerDtype) {
  struct Expect {
    LtDataType a, c;
    LtComputeType compute;
    LtDataType scale;
  };
  const std::map<DType, Expect> expected = {
      {DType::kFloat32, {LtDataType::kF32, LtDataType::kF32, LtComputeType::k32F, LtDataType::kF32}},
      {DType::kTFloat32, {LtDataType::kF32, LtDataType::kF32, LtComputeType::k32FFastTF32, LtDataType::kF32}},
      {DType::kBFloat16, {LtDataType::kBF16, LtDataType::kBF16, LtComputeType::k32F, LtDataType::kF32}},
      {DType::kFloat16, {LtDataType::kF16, LtDataType::kF16, LtComputeType::k32F, LtDataType::kF32}},
      {DType::kFloat8E4M3, {LtDataType::kF8E4M3, LtDataType::kBF16, LtComputeType::k32F, LtDataType::kF32}},
      {DType::kFloat64, {LtDataType::kF64, LtDataType::kF64, LtComputeType::k64F, LtDataType::kF64}},
      {DType::kInt8, {LtDataType::kI8, LtDataType::kI32, LtComputeType::k32I, LtDataType::kI32}},
  };
  for (const auto& [dtype, e] : expected) {
    const LtProblem p = GemmProblem(GemmDesc{128, 128, 128, 1, dtype}, kH100);
    EXPECT_EQ(p.a_type, e.a) << traces::DTypeName(dtype);
    EXPECT_EQ(p.c_type, e.c) << traces::DTypeName(dtype);
    EXPECT_EQ(p.d_type, e.c) << traces::DTypeName(dtype);
    EXPECT_EQ(p.compute, e.compute) << traces::DTypeName(dtype);
    EXPECT_EQ(p.scale_type, e.scale) << traces::DTypeName(dtype);
  }
}

TEST(CudaGemmProblemTest, Fp8UsesTheTnLayoutOnHopper) {
  const LtProblem p = GemmProblem(GemmDesc{64, 32, 16, 1, DType::kFloat8E4M3}, kH100);
  EXPECT_TRUE(p.transpose_a);
  EXPECT_FALSE(p.transpose_b);
  EXPECT_EQ(p.m, 32);
  EXPECT_EQ(p.n, 64);
  EXPECT_EQ(p.lda, 16);  // A' stored k x m'
  EXPECT_EQ(p.ldb, 16);  // B' stored k x n'
  EXPECT_EQ(p.ldc, 32);
  EXPECT_EQ(p.a_bytes(), 16 * 32 * 1);
  EXPECT_EQ(p.c_bytes(), 32 * 64 * 2);  // bf16 output
  EXPECT_TRUE(p.note.empty());
}

TEST(CudaGemmProblemTest, Fp8RoundsDimensionsToSixteen) {
  const LtProblem p = GemmProblem(GemmDesc{100, 30, 17, 1, DType::kFloat8E4M3}, kH100);
  EXPECT_EQ(p.m, 32);   // n = 30 -> 32
  EXPECT_EQ(p.n, 112);  // m = 100 -> 112
  EXPECT_EQ(p.k, 32);   // 17 -> 32
  EXPECT_NE(p.note.find("rounded up to multiples of 16"), std::string::npos) << p.note;
}

TEST(CudaGemmProblemTest, Fp8BelowAdaRunsAsBf16WithANote) {
  const LtProblem p = GemmProblem(GemmDesc{64, 64, 64, 1, DType::kFloat8E4M3}, kA100);
  EXPECT_EQ(p.a_type, LtDataType::kBF16);
  EXPECT_FALSE(p.transpose_a);
  EXPECT_NE(p.note.find("8.0"), std::string::npos) << p.note;
  // Ada (8.9) has fp8.
  EXPECT_EQ(GemmProblem(GemmDesc{64, 64, 64, 1, DType::kFloat8E4M3}, ComputeCapability{8, 9}).a_type,
            LtDataType::kF8E4M3);
}

TEST(CudaGemmProblemTest, Fp8E5m2PairsWithE4m3) {
  const LtProblem p = GemmProblem(GemmDesc{64, 64, 64, 1, DType::kFloat8E5M2}, kH100);
  EXPECT_EQ(p.a_type, LtDataType::kF8E5M2);
  EXPECT_EQ(p.b_type, LtDataType::kF8E4M3);
  EXPECT_FALSE(p.note.empty());
}

TEST(CudaGemmProblemTest, IntegerTypesThatAreNotGemmTypesRunAsFp32) {
  const LtProblem p = GemmProblem(GemmDesc{16, 16, 16, 1, DType::kInt64}, kH100);
  EXPECT_EQ(p.a_type, LtDataType::kF32);
  EXPECT_NE(p.note.find("int64"), std::string::npos) << p.note;
}

// ---- Attention

TEST(CudaAttentionProblemTest, ForwardIsTwoBatchedGemmsAndAMemoryPass) {
  // batch 2, heads 4, seq 128 x 128, head_dim 64, bf16, not causal.
  const AttentionDesc a{2, 4, 4, 128, 128, 64, false, false, DType::kBFloat16};
  const AttentionProxy p = AttentionProblem(a, kH100);
  EXPECT_EQ(p.total_batch, 8);
  EXPECT_EQ(p.batch_chunk, 8);  // S is 128 x 128 x 2 B = 32 KiB per head: all in one call
  EXPECT_EQ(p.calls_per_gemm(), 1);
  // QK^T: row-major m = 128 (seq_q), n = 128 (seq_kv), k = 64 -> cuBLAS m' = 128, n' = 128.
  EXPECT_EQ(p.qk.m, 128);
  EXPECT_EQ(p.qk.n, 128);
  EXPECT_EQ(p.qk.k, 64);
  EXPECT_EQ(p.qk.batch, 8);
  // PV: row-major m = 128, n = 64 (head_dim), k = 128 -> cuBLAS m' = 64, n' = 128.
  EXPECT_EQ(p.pv.m, 64);
  EXPECT_EQ(p.pv.n, 128);
  EXPECT_EQ(p.pv.k, 128);
  EXPECT_EQ(p.qk_repeats, 1);
  EXPECT_EQ(p.pv_repeats, 1);
  // FlashAttention accounting: 4 x b x h x sq x skv x d.
  EXPECT_DOUBLE_EQ(p.flops(), 4.0 * 2 * 4 * 128 * 128 * 64);
  // Q = 2 x 4 x 128 x 64 x 2 B = 131072 B; K and V the same. Reads Q, K, V; writes O.
  EXPECT_EQ(p.memory_read_bytes, 3 * 131072);
  EXPECT_EQ(p.memory_write_bytes, 131072);
}

TEST(CudaAttentionProblemTest, CausalHalvesTheKeyLength) {
  const AttentionDesc a{1, 2, 2, 256, 256, 64, true, false, DType::kBFloat16};
  const AttentionProxy p = AttentionProblem(a, kH100);
  EXPECT_EQ(p.qk.m, 128);  // n of QK^T = seq_kv / 2
  EXPECT_EQ(p.pv.k, 128);  // k of PV = seq_kv / 2
  EXPECT_DOUBLE_EQ(p.flops(), 0.5 * 4.0 * 1 * 2 * 256 * 256 * 64);
  EXPECT_NE(p.qk.note.find("causal"), std::string::npos);
}

TEST(CudaAttentionProblemTest, BackwardIsFiveGemmsWithGroupedQueryBytes) {
  // 8 query heads sharing 2 KV heads.
  const AttentionDesc a{1, 8, 2, 64, 64, 32, false, true, DType::kFloat16};
  const AttentionProxy p = AttentionProblem(a, kH100);
  EXPECT_EQ(p.qk_repeats, 2);
  EXPECT_EQ(p.pv_repeats, 3);
  EXPECT_DOUBLE_EQ(p.flops(), 2.5 * 4.0 * 1 * 8 * 64 * 64 * 32);
  const int64_t q = 1 * 8 * 64 * 32 * 2;   // Q (and O, dO, dQ)
  const int64_t kv = 1 * 2 * 64 * 32 * 2;  // K (and V, dK, dV)
  EXPECT_EQ(p.memory_read_bytes, 3 * q + 2 * kv);
  EXPECT_EQ(p.memory_write_bytes, q + 2 * kv);
}

TEST(CudaAttentionProblemTest, LongSequencesAreChunkedUnderTheScoreBufferLimit) {
  // seq 8192: S is 8192 x 8192 x 2 B = 128 MiB per head; 256 MiB holds 2 heads per call.
  const AttentionDesc a{1, 32, 8, 8192, 8192, 128, false, false, DType::kBFloat16};
  const AttentionProxy p = AttentionProblem(a, kH100);
  EXPECT_EQ(p.batch_chunk, 2);
  EXPECT_EQ(p.calls_per_gemm(), 16);
  EXPECT_LE(p.qk.c_bytes(), kMaxScoreBufferBytes);
}

// ---- Memory-bound geometry

TEST(CudaMemoryBoundGeometryTest, VectorsAndBlocks) {
  // 1 MiB read, 1 MiB written: 65536 vectors of 16 B; 256 blocks of 256 threads, under the cap
  // of 132 SMs x 4.
  CopyGeometry g = MemoryBoundGeometry(1 << 20, 1 << 20, 132);
  EXPECT_EQ(g.read_vectors, 65536);
  EXPECT_EQ(g.write_vectors, 65536);
  EXPECT_EQ(g.threads_per_block, 256);
  EXPECT_EQ(g.blocks, 256);
  EXPECT_EQ(g.moved_bytes(), 2 << 20);
  // 1 GiB: 2^26 vectors would need 262144 blocks; capped at 132 x 4 = 528 (grid-stride).
  g = MemoryBoundGeometry(int64_t{1} << 30, 0, 132);
  EXPECT_EQ(g.blocks, 528);
  EXPECT_EQ(g.write_vectors, 0);
}

TEST(CudaMemoryBoundGeometryTest, OddBytesRoundUpAndNothingMeansNoLaunch) {
  const CopyGeometry g = MemoryBoundGeometry(17, 1, 8);
  EXPECT_EQ(g.read_vectors, 2);
  EXPECT_EQ(g.write_vectors, 1);
  EXPECT_EQ(g.blocks, 1);
  EXPECT_EQ(MemoryBoundGeometry(0, 0, 8).blocks, 0);
}

// ---- Spin calibration

TEST(CudaSpinCalibrationTest, FitsSlopeAndOffsetExactly) {
  // measured = 1.02 x requested + 3000 ns, exactly (x / 50 = 0.02 x is an integer here).
  std::vector<std::pair<int64_t, int64_t>> samples;
  for (int64_t x : {1000, 10000, 50000, 200000}) samples.emplace_back(x, x + x / 50 + 3000);
  const SpinCalibration c = FitSpinCalibration(samples);
  EXPECT_NEAR(c.slope, 1.02, 1e-9);
  EXPECT_NEAR(c.offset_ns, 3000, 1e-6);
  // To measure 105000 ns, ask for (105000 - 3000) / 1.02 = 100000.
  EXPECT_EQ(SpinRequestFor(c, 105000), 100000);
  // Below the fixed cost: the shortest spin.
  EXPECT_EQ(SpinRequestFor(c, 2000), 0);
  EXPECT_EQ(SpinRequestFor(c, 0), 0);
}

TEST(CudaSpinCalibrationTest, DegenerateSamplesGiveTheIdentity) {
  EXPECT_EQ(SpinRequestFor(FitSpinCalibration({}), 5000), 5000);
  EXPECT_EQ(SpinRequestFor(FitSpinCalibration({{100, 900}, {100, 1100}}), 5000), 5000);
  // A negative slope (noise) is not trusted.
  EXPECT_EQ(SpinRequestFor(FitSpinCalibration({{100, 900}, {200, 100}}), 5000), 5000);
}

// ---- Buffers

TEST(CudaOperandBytesTest, WorkspaceAndLargestOperandsPerStream) {
  EXPECT_EQ(CublasWorkspaceBytes(kH100), 32 << 20);
  EXPECT_EQ(CublasWorkspaceBytes(kA100), 4 << 20);
  traces::Program program;
  program.streams = {{"compute", 0}, {"comm", -1}};
  auto kernel = [](int32_t stream, traces::ComputeDesc d) {
    traces::Op op;
    op.payload = traces::KernelOp{stream, d};
    return op;
  };
  program.ops.push_back(kernel(0, GemmDesc{64, 32, 16, 1, DType::kBFloat16}));
  program.ops.push_back(kernel(0, GemmDesc{8, 8, 100, 1, DType::kBFloat16}));
  program.ops.push_back(kernel(1, traces::MemoryBoundDesc{1000, 0}));
  traces::Op copy;
  copy.payload = traces::MemcpyOp{traces::MemcpyKind::kHostToDevice, 1, 5000};
  program.ops.push_back(copy);
  const std::vector<StreamOperands> s = OperandBytes(program, kH100);
  ASSERT_EQ(s.size(), 2u);
  // Stream 0: A' (B) max(16*32, 100*8) x 2 = 1600 -> 2048; B' (A) max(64*16, 8*100) x 2 =
  // 2048; C max(64*32, 64) x 2 = 4096; the Hopper workspace.
  EXPECT_EQ(s[0].a_bytes, 2048);
  EXPECT_EQ(s[0].b_bytes, 2048);
  EXPECT_EQ(s[0].c_bytes, 4096);
  EXPECT_EQ(s[0].workspace_bytes, 32 << 20);
  EXPECT_EQ(s[0].src_bytes, 0);
  // Stream 1: reads 1000 B (-> 1024), the H2D copy writes 5000 B (-> 5120); no GEMM.
  EXPECT_EQ(s[1].src_bytes, 1024);
  EXPECT_EQ(s[1].dst_bytes, 5120);
  EXPECT_EQ(s[1].workspace_bytes, 0);
  EXPECT_EQ(s[1].total(), 1024 + 5120);
}

// ---- Devices

const char* FakeEnv(const char* name) {
  static const std::map<std::string, std::string> env = {{"MPI_LOCALRANKID", "3"}, {"SLURM_LOCALID", "5"}};
  auto it = env.find(name);
  return it == env.end() ? nullptr : it->second.c_str();
}
const char* OpenMpiEnv(const char* name) { return std::string(name) == "OMPI_COMM_WORLD_LOCAL_RANK" ? "1" : nullptr; }
const char* BadEnv(const char* name) { return std::string(name) == "OMPI_COMM_WORLD_LOCAL_RANK" ? "x1" : nullptr; }
const char* NoEnv(const char*) { return nullptr; }

TEST(CudaDeviceSelectionTest, LocalRankFromTheLauncher) {
  EXPECT_EQ(LocalRankFromEnvironment(&OpenMpiEnv), 1);
  EXPECT_EQ(LocalRankFromEnvironment(&FakeEnv), 3);  // MPICH's before Slurm's
  EXPECT_EQ(LocalRankFromEnvironment(&BadEnv), std::nullopt);
  EXPECT_EQ(LocalRankFromEnvironment(&NoEnv), std::nullopt);
}

TEST(CudaDeviceSelectionTest, OneProcessPerGpuUsesTheLocalRank) {
  StatusOr<DeviceAssignment> a = AssignDevices(8, 8, 3, 8);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_FALSE(a->one_process_drives_all);
  EXPECT_EQ(a->devices, (std::vector<int32_t>{3}));
  // Two nodes of 4: local rank 3 of node 1 (global rank 7) is device 3.
  EXPECT_EQ(AssignDevices(8, 8, 3, 4)->devices, (std::vector<int32_t>{3}));
  // A world of one on one GPU.
  EXPECT_EQ(AssignDevices(1, 1, 0, 1)->devices, (std::vector<int32_t>{0}));
}

TEST(CudaDeviceSelectionTest, OneProcessDrivesEveryLocalGpuWithoutMpirun) {
  StatusOr<DeviceAssignment> a = AssignDevices(4, 1, 0, 8);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->one_process_drives_all);
  EXPECT_EQ(a->devices, (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(CudaDeviceSelectionTest, MismatchesAreInputErrorsThatSayWhatToDo) {
  StatusOr<DeviceAssignment> a = AssignDevices(8, 1, 0, 2);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(a.status().message().find("schedule has 8 ranks, the job has 1 process and this node 2"),
            std::string::npos)
      << a.status().message();
  EXPECT_NE(a.status().message().find("mpirun -np 8"), std::string::npos);
  a = AssignDevices(8, 4, 0, 8);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("schedule has 8 ranks, the job has 4"), std::string::npos);
  a = AssignDevices(8, 8, 4, 4);  // 8 processes on one node of 4 GPUs
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("local rank 4 but its node shows 4"), std::string::npos)
      << a.status().message();
}

// ---- The "no CUDA device" path, for real: this test runs on machines without a GPU (CI),
// where cudaGetDeviceCount fails, and on GPU machines, where it counts them.
TEST(CudaDeviceCountTest, NoDeviceIsAClearInputErrorNeverACrash) {
  EXPECT_EQ(NoDeviceMessage("CUDA driver version is insufficient for CUDA runtime version"),
            "no CUDA device: CUDA driver version is insufficient for CUDA runtime version");
  const StatusOr<int32_t> count = CudaDeviceCount();
  if (!CudaBackendBuilt()) {
    ASSERT_FALSE(count.ok());
    EXPECT_NE(count.status().message().find("this build has no CUDA backend"), std::string::npos);
    return;
  }
  if (count.ok()) {
    EXPECT_GT(*count, 0);
    GTEST_SKIP() << "this machine has " << *count << " CUDA device(s); the no-device path runs without a GPU";
  }
  EXPECT_EQ(count.status().code(), StatusCode::kInvalidInput);
  EXPECT_EQ(count.status().message().rfind("no CUDA device: ", 0), 0u) << count.status().message();
}

}  // namespace
}  // namespace shardscope::runtime::cuda

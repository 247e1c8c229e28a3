// Tests for NCCL releases, PyTorch's NCCL pins and NCCL_ALGO / NCCL_PROTO parsing
// (nccl_env.h): each expectation restates NCCL's parseList rules or a pin cited in nccl_env.cc.
#include "shardscope/sim/presets/nccl_env.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace shardscope::sim {
namespace {

using ::testing::HasSubstr;

constexpr int kTree = static_cast<int>(NcclAlgorithm::kTree);
constexpr int kRing = static_cast<int>(NcclAlgorithm::kRing);
constexpr int kNvls = static_cast<int>(NcclAlgorithm::kNvls);
constexpr int kNvlsTree = static_cast<int>(NcclAlgorithm::kNvlsTree);
constexpr int kPat = static_cast<int>(NcclAlgorithm::kPat);
constexpr NcclVersion k2_21{2, 21, 5};
constexpr NcclVersion k2_28{2, 28, 9};

TEST(NcclEnvTest, Versions) {
  EXPECT_EQ(ParseNcclVersion("2.21.5"), (NcclVersion{2, 21, 5}));
  EXPECT_EQ(ParseNcclVersion("2.21"), (NcclVersion{2, 21, 0}));
  EXPECT_EQ(ParseNcclVersion("2.7.8")->ToString(), "2.7.8");
  for (const char* bad : {"", "2", "3.1.0", "2.x", "2.21.5.1", "2.21.", "-2.1", "2.100.0"}) {
    EXPECT_FALSE(ParseNcclVersion(bad).has_value()) << bad;
  }
  // NCCL_VERSION_CODE order: 2.9.8 < 2.10.3 < 2.18.1.
  EXPECT_LT((NcclVersion{2, 9, 8}), (NcclVersion{2, 10, 3}));
  EXPECT_LT((NcclVersion{2, 10, 3}), (NcclVersion{2, 18, 1}));
}

TEST(NcclEnvTest, PytorchPins) {
  EXPECT_EQ(NcclForPytorch(1, 8), (NcclVersion{2, 7, 8}));
  EXPECT_EQ(NcclForPytorch(1, 9), (NcclVersion{2, 9, 8}));
  EXPECT_EQ(NcclForPytorch(1, 12), (NcclVersion{2, 10, 3}));
  EXPECT_EQ(NcclForPytorch(2, 0), (NcclVersion{2, 14, 3}));
  EXPECT_EQ(NcclForPytorch(2, 1), (NcclVersion{2, 18, 1}));
  EXPECT_EQ(NcclForPytorch(2, 2), (NcclVersion{2, 19, 3}));
  EXPECT_EQ(NcclForPytorch(2, 4), (NcclVersion{2, 20, 5}));
  EXPECT_EQ(NcclForPytorch(2, 6), (NcclVersion{2, 21, 5}));
  EXPECT_EQ(NcclForPytorch(2, 7), (NcclVersion{2, 26, 2}));
  EXPECT_EQ(NcclForPytorch(2, 8), (NcclVersion{2, 27, 3}));
  EXPECT_EQ(NcclForPytorch(2, 10), (NcclVersion{2, 27, 5}));
  EXPECT_EQ(NcclForPytorch(2, 11), (NcclVersion{2, 28, 9}));
  EXPECT_EQ(NcclForPytorch(2, 12), (NcclVersion{2, 29, 3}));
  EXPECT_EQ(NcclForPytorch(3, 0), (NcclVersion{2, 29, 3}));  // after the last pin: the last
  // NcclEnv's default is PyTorch's default release's (plan.h: pytorch_version 2.11).
  EXPECT_EQ(NcclEnv{}.version, NcclForPytorch(2, 11));
  EXPECT_EQ(NcclEnv{}.buffsize, 4 << 20);
}

TEST(NcclEnvTest, AlgoListsInNcclsSyntax) {
  // "Ring,Tree": those only (case-insensitive), for every function in a single-list release.
  NcclEnableMask m = ParseNcclAlgoList("ring,TREE", k2_21).value();
  for (int f = 0; f < kNumNcclFunctions; ++f) {
    EXPECT_EQ(m.bits[f], (1 << kTree) | (1 << kRing));
  }
  // "^NVLS,NVLSTree": everything else.
  m = ParseNcclAlgoList("^NVLS,NVLSTree", k2_21).value();
  EXPECT_TRUE(m.Has(NcclFunction::kAllReduce, kRing));
  EXPECT_FALSE(m.Has(NcclFunction::kAllReduce, kNvls));
  EXPECT_FALSE(m.Has(NcclFunction::kAllGather, kNvlsTree));
  // The per-function form of 2.23+: first entry for all, later ones per function.
  m = ParseNcclAlgoList("ring;allreduce:nvls,ring;AllGather:^ring", k2_28).value();
  EXPECT_EQ(m.bits[static_cast<int>(NcclFunction::kBroadcast)], 1 << kRing);
  EXPECT_EQ(m.bits[static_cast<int>(NcclFunction::kAllReduce)], (1 << kNvls) | (1 << kRing));
  EXPECT_FALSE(m.Has(NcclFunction::kAllGather, kRing));
  EXPECT_TRUE(m.Has(NcclFunction::kAllGather, kPat));
  // Protocols.
  m = ParseNcclProtoList("^LL128", k2_21).value();
  EXPECT_TRUE(m.Has(NcclFunction::kAllGather, static_cast<int>(NcclProtocol::kSimple)));
  EXPECT_FALSE(m.Has(NcclFunction::kAllGather, static_cast<int>(NcclProtocol::kLL128)));
}

TEST(NcclEnvTest, AlgoListErrorsNameWhatTheReleaseKnows) {
  auto bad = ParseNcclAlgoList("Ring,Rign", k2_21);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("\"Rign\" is not one"));
  EXPECT_THAT(bad.status().message(), HasSubstr("Tree, Ring, CollNetDirect, CollNetChain, NVLS, NVLSTree"));
  // PAT exists from 2.23, NVLS from 2.17, "CollNet" only before the split.
  EXPECT_FALSE(ParseNcclAlgoList("PAT", k2_21).ok());
  EXPECT_TRUE(ParseNcclAlgoList("PAT", k2_28).ok());
  EXPECT_FALSE(ParseNcclAlgoList("NVLS", NcclVersion{2, 14, 3}).ok());
  EXPECT_TRUE(ParseNcclAlgoList("CollNet", NcclVersion{2, 7, 8}).ok());
  EXPECT_FALSE(ParseNcclAlgoList("CollNet", k2_28).ok());
  // The per-function form before 2.23, an unprefixed later entry, an unknown function.
  bad = ParseNcclAlgoList("ring;allreduce:tree", k2_21);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("exists from NCCL 2.23.0"));
  EXPECT_FALSE(ParseNcclAlgoList("ring;tree", k2_28).ok());
  bad = ParseNcclAlgoList("alltoall:ring", k2_28);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("\"alltoall\" is not one"));
  EXPECT_FALSE(ParseNcclAlgoList("", k2_28).ok());
  EXPECT_FALSE(ParseNcclAlgoList("^", k2_28).ok());
  EXPECT_FALSE(ParseNcclProtoList("LL256", k2_28).ok());
}

}  // namespace
}  // namespace shardscope::sim

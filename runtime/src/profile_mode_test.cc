#include "shardscope/runtime/profile_mode.h"

#include <gtest/gtest.h>

namespace shardscope::runtime {
namespace {

const Status kNoDriver = Status::IoError("CUPTI capture unavailable: no NVIDIA driver");

TEST(ProfileModeTest, OffWithoutProfileWhateverTheProbeSays) {
  EXPECT_EQ(DecideProfileMode(false, true, 1, Status::Ok()).mode, ProfileMode::kOff);
  EXPECT_EQ(DecideProfileMode(false, false, 1, kNoDriver).mode, ProfileMode::kOff);
}

TEST(ProfileModeTest, HostBackendMeasuresItsHostTimelineAndNeverWarns) {
  // No CUPTI on the host backend: the probe's failure is irrelevant there.
  const ProfileDecision d = DecideProfileMode(true, false, 1, kNoDriver);
  EXPECT_EQ(d.mode, ProfileMode::kHostTimeline);
  EXPECT_TRUE(d.reason.ok());
}

TEST(ProfileModeTest, CudaBackendCapturesWhenTheProbeSucceeds) {
  const ProfileDecision d = DecideProfileMode(true, true, 1, Status::Ok());
  EXPECT_EQ(d.mode, ProfileMode::kCupti);
  EXPECT_TRUE(d.reason.ok());
}

TEST(ProfileModeTest, CudaBackendFallsBackWithTheProbesReason) {
  const ProfileDecision d = DecideProfileMode(true, true, 1, kNoDriver);
  EXPECT_EQ(d.mode, ProfileMode::kCuptiUnavailable);
  EXPECT_EQ(d.reason.message(), kNoDriver.message());
}

TEST(ProfileModeTest, OneProcessDrivingSeveralRanksFallsBackEvenWithCupti) {
  const ProfileDecision d = DecideProfileMode(true, true, 4, Status::Ok());
  EXPECT_EQ(d.mode, ProfileMode::kCuptiUnavailable);
  EXPECT_NE(d.reason.message().find("drives 4 ranks"), std::string::npos) << d.reason.message();
}

}  // namespace
}  // namespace shardscope::runtime

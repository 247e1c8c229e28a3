#include "shardscope/base/output_dir.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "shardscope/base/file_io.h"

namespace shardscope {
namespace {

namespace fs = std::filesystem;

const OutputSpec kSpec{{"trace.json", "report.json", "dump_rank*.json"}, "report.json"};

std::set<std::string> Listing(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename().string());
  return names;
}

std::string Read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class OutputDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / fmt_name();
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  static std::string fmt_name() {
    return "shardscope-output-dir-test-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  fs::path root_;
};

TEST_F(OutputDirTest, ANewFolderAppearsWholeByOneRename) {
  const fs::path out = root_ / "out";
  auto dir = OutputDir::Create(out.string(), kSpec);
  ASSERT_TRUE(dir.ok()) << dir.status().message();
  ASSERT_TRUE(traces::WriteFileAtomically((*dir)->StagingPath("trace.json"), "T").ok());
  ASSERT_TRUE(traces::WriteFileAtomically((*dir)->StagingPath("report.json"), "R").ok());
  EXPECT_FALSE(fs::exists(out));  // nothing visible before the commit
  ASSERT_TRUE((*dir)->Commit().ok());
  EXPECT_EQ(Listing(out), (std::set<std::string>{"report.json", "trace.json"}));
  EXPECT_EQ(Listing(root_), std::set<std::string>{"out"});  // no staging folder left beside it
  EXPECT_EQ((*dir)->FinalPath("report.json"), (out / "report.json").string());
}

TEST_F(OutputDirTest, ASecondRunReplacesTheOwnedSetAndLeavesOtherFilesAlone) {
  const fs::path out = root_ / "out";
  fs::create_directories(out);
  for (const char* name : {"trace.json", "report.json", "dump_rank3.json", "dump_rank9.json", "notes.txt"}) {
    std::ofstream(out / name) << "old " << name;
  }
  fs::create_directories(out / "dump_rank_folder.json");  // owned name, but a folder: not ours to remove
  auto dir = OutputDir::Create(out.string(), kSpec);
  ASSERT_TRUE(dir.ok());
  ASSERT_TRUE(traces::WriteFileAtomically((*dir)->StagingPath("trace.json"), "new trace").ok());
  ASSERT_TRUE(traces::WriteFileAtomically((*dir)->StagingPath("dump_rank3.json"), "new dump").ok());
  ASSERT_TRUE(traces::WriteFileAtomically((*dir)->StagingPath("report.json"), "new report").ok());
  ASSERT_TRUE((*dir)->Commit().ok());
  // dump_rank9.json was the first run's: it must not survive beside the second run's report.
  EXPECT_EQ(Listing(out), (std::set<std::string>{"trace.json", "report.json", "dump_rank3.json", "notes.txt",
                                                 "dump_rank_folder.json"}));
  EXPECT_EQ(Read(out / "report.json"), "new report");
  EXPECT_EQ(Read(out / "dump_rank3.json"), "new dump");
  EXPECT_EQ(Read(out / "notes.txt"), "old notes.txt");
}

TEST_F(OutputDirTest, WithoutACommitTheFolderIsAsItWas) {
  const fs::path out = root_ / "out";
  fs::create_directories(out);
  std::ofstream(out / "report.json") << "old";
  {
    auto dir = OutputDir::Create(out.string(), kSpec);
    ASSERT_TRUE(dir.ok());
    ASSERT_TRUE(traces::WriteFileAtomically((*dir)->StagingPath("trace.json"), "half a run").ok());
    // An error on the way: the command returns without committing.
  }
  EXPECT_EQ(Listing(out), std::set<std::string>{"report.json"});
  EXPECT_EQ(Read(out / "report.json"), "old");
  {
    auto fresh = OutputDir::Create((root_ / "fresh").string(), kSpec);
    ASSERT_TRUE(fresh.ok());
  }
  EXPECT_FALSE(fs::exists(root_ / "fresh"));
  EXPECT_EQ(Listing(root_), std::set<std::string>{"out"});
}

TEST_F(OutputDirTest, AFileNotOwnedCannotBeCommitted) {
  auto dir = OutputDir::Create((root_ / "out").string(), kSpec);
  ASSERT_TRUE(dir.ok());
  ASSERT_TRUE(traces::WriteFileAtomically((*dir)->StagingPath("stray.bin"), "x").ok());
  EXPECT_EQ((*dir)->Commit().code(), StatusCode::kInternal);
}

TEST_F(OutputDirTest, AFileInTheWayIsAnIoError) {
  std::ofstream(root_ / "out") << "a file, not a folder";
  auto dir = OutputDir::Create((root_ / "out").string(), kSpec);
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.status().code(), StatusCode::kIoError);
  EXPECT_NE(dir.status().message().find("not a folder"), std::string::npos);
}

TEST(OutputDirMatchTest, OneStarStandsForAnyRun) {
  const std::vector<std::string> patterns = {"report.json", "flight_recorder_rank*.json"};
  EXPECT_TRUE(OutputDir::Matches(patterns, "report.json"));
  EXPECT_TRUE(OutputDir::Matches(patterns, "flight_recorder_rank12.json"));
  EXPECT_TRUE(OutputDir::Matches(patterns, "flight_recorder_rank.json"));
  EXPECT_FALSE(OutputDir::Matches(patterns, "flight_recorder_rank12.json.bak"));
  EXPECT_FALSE(OutputDir::Matches(patterns, "report.json.tmp.12"));
  EXPECT_FALSE(OutputDir::Matches(patterns, "x_flight_recorder_rank1.json"));
}

}  // namespace
}  // namespace shardscope

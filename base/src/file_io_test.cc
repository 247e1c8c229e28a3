#include "shardscope/base/file_io.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace shardscope::traces {
namespace {

TEST(FileIoTest, WritesTheWholeTextAndLeavesNoTemporaryFile) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "shardscope-file-io-test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "out.json").string();
  ASSERT_TRUE(WriteFileAtomically(path, "first").ok());
  ASSERT_TRUE(WriteFileAtomically(path, std::string("second\0text", 11)).ok());
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), std::string("second\0text", 11));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()), 1);
  std::filesystem::remove_all(dir);
}

TEST(FileIoTest, AMissingFolderIsAnIoErrorNamingTheFile) {
  const Status status = WriteFileAtomically("/nonexistent-shardscope-dir/out.json", "x");
  EXPECT_EQ(status.code(), StatusCode::kIoError);
  EXPECT_NE(status.message().find("/nonexistent-shardscope-dir/out.json"), std::string::npos) << status.message();
}

}  // namespace
}  // namespace shardscope::traces

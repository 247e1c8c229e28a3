#include "shardscope/base/output_dir.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace shardscope {
namespace fs = std::filesystem;

namespace {

bool MatchesOne(std::string_view pattern, std::string_view name) {
  const size_t star = pattern.find('*');
  if (star == std::string_view::npos) return pattern == name;
  const std::string_view head = pattern.substr(0, star), tail = pattern.substr(star + 1);
  return name.size() >= head.size() + tail.size() && name.substr(0, head.size()) == head &&
         name.substr(name.size() - tail.size()) == tail;
}

}  // namespace

bool OutputDir::Matches(const std::vector<std::string>& patterns, std::string_view name) {
  return std::any_of(patterns.begin(), patterns.end(),
                     [&](const std::string& pattern) { return MatchesOne(pattern, name); });
}

OutputDir::OutputDir(std::string dir, std::string staging, bool dir_existed, OutputSpec spec)
    : dir_(std::move(dir)), staging_(std::move(staging)), dir_existed_(dir_existed), spec_(std::move(spec)) {}

StatusOr<std::unique_ptr<OutputDir>> OutputDir::Create(const std::string& dir, OutputSpec spec) {
  std::error_code ec;
  fs::path path = fs::path(dir).lexically_normal();
  if (!path.has_filename() && path.has_parent_path()) path = path.parent_path();  // "out/" -> "out"
  const fs::file_status status = fs::status(path, ec);
  const bool exists = !ec && fs::exists(status);
  if (exists && !fs::is_directory(status)) {
    return Status::IoError(fmt::format("cannot write into '{}': it is not a folder", dir));
  }
  const long pid = static_cast<long>(::getpid());
  fs::path staging;
  if (exists) {
    staging = path / fmt::format(".shardscope-staging-{}", pid);
  } else {
    const fs::path parent = path.has_parent_path() ? path.parent_path() : fs::path(".");
    fs::create_directories(parent, ec);
    if (ec) return Status::IoError(fmt::format("cannot create '{}': {}", parent.string(), ec.message()));
    staging = parent / fmt::format(".{}.shardscope-staging-{}", path.filename().string(), pid);
  }
  fs::remove_all(staging, ec);  // a leftover of a killed run with the same pid
  if (!fs::create_directory(staging, ec) || ec) {
    return Status::IoError(fmt::format("cannot create '{}': {}", staging.string(),
                                       ec ? ec.message() : std::string("it exists")));
  }
  return std::unique_ptr<OutputDir>(new OutputDir(path.string(), staging.string(), exists, std::move(spec)));
}

OutputDir::~OutputDir() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(staging_, ec);  // best effort: never throws
}

std::string OutputDir::StagingPath(std::string_view name) const { return (fs::path(staging_) / name).string(); }

std::string OutputDir::FinalPath(std::string_view name) const { return (fs::path(dir_) / name).string(); }

Status OutputDir::Commit() {
  std::error_code ec;
  std::vector<std::string> staged;
  for (const fs::directory_entry& entry : fs::directory_iterator(staging_, ec)) {
    staged.push_back(entry.path().filename().string());
  }
  if (ec) return Status::IoError(fmt::format("cannot list '{}': {}", staging_, ec.message()));
  for (const std::string& name : staged) {
    if (!Matches(spec_.owned, name)) {
      return Status::Internal(fmt::format("'{}' was written but is not among the files the command owns", name));
    }
  }
  if (!dir_existed_ && !fs::exists(dir_, ec)) {
    fs::rename(staging_, dir_, ec);
    if (ec) return Status::IoError(fmt::format("cannot rename '{}' to '{}': {}", staging_, dir_, ec.message()));
    committed_ = true;
    return Status::Ok();
  }
  // DIR exists (or appeared meanwhile): stale owned files out, the new set in, `last` last.
  const std::string staging_name = fs::path(staging_).filename().string();
  for (const fs::directory_entry& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == staging_name || !Matches(spec_.owned, name)) continue;
    if (std::find(staged.begin(), staged.end(), name) != staged.end()) continue;  // replaced below
    std::error_code type_ec;
    if (!entry.is_regular_file(type_ec)) continue;  // only plain files are ours to remove
    fs::remove(entry.path(), ec);
    if (ec) return Status::IoError(fmt::format("cannot remove the stale '{}': {}", entry.path().string(), ec.message()));
  }
  if (ec) return Status::IoError(fmt::format("cannot list '{}': {}", dir_, ec.message()));
  std::stable_partition(staged.begin(), staged.end(), [&](const std::string& name) { return name != spec_.last; });
  for (const std::string& name : staged) {
    fs::rename(fs::path(staging_) / name, fs::path(dir_) / name, ec);
    if (ec) {
      return Status::IoError(
          fmt::format("cannot move '{}' into '{}': {}", (fs::path(staging_) / name).string(), dir_, ec.message()));
    }
  }
  committed_ = true;
  fs::remove_all(staging_, ec);
  return Status::Ok();
}

}  // namespace shardscope

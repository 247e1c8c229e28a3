#include "shardscope/base/file_io.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

namespace shardscope::traces {

Status WriteFileAtomically(const std::string& path, std::string_view contents) {
  // The pid keeps two processes writing the same path (mpirun ranks) off each other's file.
  const std::string temp_path = fmt::format("{}.tmp.{}", path, static_cast<long>(::getpid()));
  {
    std::ofstream out(temp_path, std::ios::binary | std::ios::trunc);
    if (!out.is_open()) {
      return Status::IoError(fmt::format("cannot create '{}': {}", temp_path, std::strerror(errno)));
    }
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    out.close();
    if (out.fail()) {
      std::remove(temp_path.c_str());
      return Status::IoError(fmt::format("writing '{}' failed (disk full?)", temp_path));
    }
  }
  if (std::rename(temp_path.c_str(), path.c_str()) != 0) {
    const int error = errno;
    std::remove(temp_path.c_str());
    return Status::IoError(fmt::format("cannot rename '{}' to '{}': {}", temp_path, path, std::strerror(error)));
  }
  return Status::Ok();
}

}  // namespace shardscope::traces

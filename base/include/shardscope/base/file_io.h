// Whole-file output that never leaves a half-written file under the final name: the text is
// written to "<path>.tmp.<pid>" and renamed over `path` only when every byte is on disk
// (rename is atomic within a file system). On failure the temporary file is removed.
#ifndef SHARDSCOPE_BASE_FILE_IO_H_
#define SHARDSCOPE_BASE_FILE_IO_H_

#include <string>
#include <string_view>

#include "shardscope/base/status.h"

namespace shardscope::traces {

Status WriteFileAtomically(const std::string& path, std::string_view contents);

}  // namespace shardscope::traces

#endif  // SHARDSCOPE_BASE_FILE_IO_H_

// A command's output folder, replaced as one set: `simulate -o DIR` writes trace.json,
// report.json, Flight Recorder dumps and memory snapshots, and a second run into the same DIR
// must leave exactly the second run's set there (no dump of the first run beside the second
// run's report), nothing half-written when a write fails (a full disk), and every file the
// command does not write untouched.
//
// The files are written into a staging folder first; Commit() puts them in place:
//  - DIR absent: the staging folder was created beside it (".DIR.shardscope-staging-<pid>" in
//    DIR's parent) and is renamed to DIR: one atomic rename.
//  - DIR present: the staging folder is inside DIR (".shardscope-staging-<pid>", so on DIR's
//    file system); Commit removes every file of DIR the command owns (OutputSpec::owned) that
//    the new set does not hold, renames the new files in, the `last` one (the report that
//    names the others) after all the rest, and removes the staging folder. Renames in one
//    folder do not fail for space, so a full disk fails while writing into the staging
//    folder, before DIR changes.
// Without Commit (an error on the way, a destruction), the staging folder is removed and DIR
// is as it was.
#ifndef SHARDSCOPE_BASE_OUTPUT_DIR_H_
#define SHARDSCOPE_BASE_OUTPUT_DIR_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardscope/base/status.h"

namespace shardscope {

struct OutputSpec {
  // File names the command writes into DIR; each may hold one '*' standing for any run of
  // characters ("flight_recorder_rank*.json"). Only plain files are ever removed.
  std::vector<std::string> owned;
  // The file renamed in last (e.g. "report.json"); empty: no order.
  std::string last;
};

class OutputDir {
 public:
  // Creates the staging folder (and DIR's parent folders). IoError when it cannot.
  static StatusOr<std::unique_ptr<OutputDir>> Create(const std::string& dir, OutputSpec spec);
  ~OutputDir();  // removes the staging folder unless committed; never throws
  OutputDir(const OutputDir&) = delete;
  OutputDir& operator=(const OutputDir&) = delete;

  // Where to write the file `name` now (in the staging folder).
  std::string StagingPath(std::string_view name) const;
  // Where `name` will be after Commit (for messages).
  std::string FinalPath(std::string_view name) const;
  // Puts the staged set in place (see above). Every name staged must be owned.
  Status Commit();

  // Whether `name` matches one of `patterns` (at most one '*' each).
  static bool Matches(const std::vector<std::string>& patterns, std::string_view name);

 private:
  OutputDir(std::string dir, std::string staging, bool dir_existed, OutputSpec spec);
  std::string dir_;
  std::string staging_;
  bool dir_existed_;
  OutputSpec spec_;
  bool committed_ = false;
};

}  // namespace shardscope

#endif  // SHARDSCOPE_BASE_OUTPUT_DIR_H_

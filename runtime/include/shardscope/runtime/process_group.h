// The processes of a job a launcher started (`mpirun -np K shardscope tune ...`), for work that
// is split across processes outside `run`: each takes its share and every process learns the
// others' results. MPI stays out of this header.
//
//   SHARDSCOPE_ASSIGN_OR_RETURN(auto group, ProcessGroup::Join());
//   SHARDSCOPE_ASSIGN_OR_RETURN(std::vector<std::string> all, group->AllGather(mine));
#ifndef SHARDSCOPE_RUNTIME_PROCESS_GROUP_H_
#define SHARDSCOPE_RUNTIME_PROCESS_GROUP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardscope/base/status.h"

namespace shardscope::runtime {

// MPI for the lifetime of the object (MPI_Init, MPI_Finalize in the destructor, which never
// throws); MPI_COMM_WORLD is the group. Without a launcher MPI starts as a singleton: one
// process. One per process, and not beside `run`'s MpiSession.
class ProcessGroup {
 public:
  static StatusOr<std::unique_ptr<ProcessGroup>> Join();
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int32_t rank() const { return rank_; }
  int32_t size() const { return size_; }
  // Collective: every process passes its text and gets every process's, in rank order.
  StatusOr<std::vector<std::string>> AllGather(const std::string& mine) const;

 private:
  ProcessGroup(int32_t rank, int32_t size) : rank_(rank), size_(size) {}
  int32_t rank_ = 0;
  int32_t size_ = 1;
};

}  // namespace shardscope::runtime

#endif  // SHARDSCOPE_RUNTIME_PROCESS_GROUP_H_

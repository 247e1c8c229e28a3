#include "shardscope/traces/collective_counts.h"

#include <algorithm>

namespace shardscope::traces {

CollectiveCounts CountsOf(CollectiveType type, DType dtype, int64_t bytes, int32_t group_size) {
  CollectiveCounts c;
  c.element_bytes = DTypeSize(dtype);
  c.elements = bytes / std::max<int64_t>(1, c.element_bytes);
  const int64_t n = std::max<int32_t>(1, group_size);
  c.in_elements = c.elements;
  c.out_elements = c.elements;
  switch (type) {
    case CollectiveType::kAllGather:
      c.send_elements = c.elements / n;
      c.recv_elements = c.send_elements * n;
      c.in_elements = c.elements / n;
      break;
    case CollectiveType::kReduceScatter:
      c.recv_elements = c.elements / n;
      c.send_elements = c.recv_elements * n;
      c.out_elements = c.elements / n;
      break;
    case CollectiveType::kAllToAll:
      // n equal parts per rank (ProcessGroupNCCL::alltoall_base sends count / n to each peer).
      c.send_elements = c.elements / n * n;
      c.recv_elements = c.send_elements;
      break;
    case CollectiveType::kSend:
      c.send_elements = c.elements;
      break;
    case CollectiveType::kRecv:
      c.recv_elements = c.elements;
      break;
    case CollectiveType::kAllReduce:
    case CollectiveType::kBroadcast:
    case CollectiveType::kReduce:
      c.send_elements = c.elements;
      c.recv_elements = c.elements;
      break;
  }
  return c;
}

}  // namespace shardscope::traces

#include "program_builder.h"

namespace shardscope::sim {

traces::StreamIndex ProgramBuilder::Stream(const std::string& name, int32_t priority) {
  auto it = streams_.find(name);
  if (it != streams_.end()) return it->second;
  const auto index = static_cast<traces::StreamIndex>(program_.streams.size());
  program_.streams.push_back({name, priority});
  streams_.emplace(name, index);
  return index;
}

void ProgramBuilder::Collective(traces::StreamIndex stream, std::string_view name,
                                traces::CollectiveType type, traces::CommSlot comm, int64_t bytes,
                                traces::DType dtype, int32_t root) {
  traces::CollectiveOp op;
  op.type = type;
  op.comm = comm;
  op.stream = stream;
  op.bytes = bytes;
  op.dtype = dtype;
  op.peer = root;
  Append(name, op);
}

void ProgramBuilder::OomSyncAllReduce(traces::StreamIndex stream, std::string_view name, traces::CommSlot comm,
                                      int64_t bytes, traces::DType dtype) {
  traces::CollectiveOp op;
  op.type = traces::CollectiveType::kAllReduce;
  op.comm = comm;
  op.stream = stream;
  op.bytes = bytes;
  op.dtype = dtype;
  op.oom_sync = true;
  Append(name, op);
}

void ProgramBuilder::Append(std::string_view name, traces::OpPayload payload) {
  traces::Op op;
  op.id = static_cast<int64_t>(program_.ops.size());
  op.name = name.empty() ? traces::kNoName : Name(name);
  op.tags = tags_;
  op.payload = std::move(payload);
  program_.ops.push_back(std::move(op));
}

traces::NameIndex ProgramBuilder::Name(std::string_view name) {
  return Index(names_, program_.names, std::string(name));
}

int32_t ProgramBuilder::Index(std::unordered_map<std::string, int32_t>& map,
                              std::vector<std::string>& table, const std::string& name) {
  auto it = map.find(name);
  if (it != map.end()) return it->second;
  const auto index = static_cast<int32_t>(table.size());
  table.push_back(name);
  map.emplace(name, index);
  return index;
}

}  // namespace shardscope::sim

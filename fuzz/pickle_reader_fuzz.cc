// Fuzzes ParsePickle: any input must give a document or an InvalidInput status, never a
// crash, hang or unbounded allocation. A parsed document is walked once (each object visited
// once, so shared and cyclic graphs stay linear) to touch every pointer it holds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "shardscope/base/pickle.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardscope::traces;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto doc = ParsePickle(bytes, "fuzz");
  if (!doc.ok()) {
    if (doc.status().code() != shardscope::StatusCode::kInvalidInput) std::abort();
    return 0;
  }
  std::unordered_set<const PickleObject*> seen;
  std::vector<const PickleObject*> pending = {&(*doc)->root()};
  size_t total = 0;
  while (!pending.empty()) {
    const PickleObject* object = pending.back();
    pending.pop_back();
    if (!seen.insert(object).second) continue;
    total += object->KindName().size() + object->string_value.size();
    for (const PickleObject* item : object->items) pending.push_back(item);
    for (const auto& [key, value] : object->entries) {
      pending.push_back(key);
      pending.push_back(value);
    }
    if (object->Find("entries") != nullptr) ++total;
  }
  if (static_cast<int64_t>(seen.size()) > (*doc)->object_count()) std::abort();
  return total == SIZE_MAX ? 1 : 0;
}

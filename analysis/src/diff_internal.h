// The steps of the diff (diff.h), private to traces/: building the flat event tables of a
// side, matching, HTA metrics and the critical path. Each step reads and fills DiffResult's
// SideAnalysis vectors; nothing here owns a pointer into another step's data.
#ifndef SHARDSCOPE_TRACES_DIFF_INTERNAL_H_
#define SHARDSCOPE_TRACES_DIFF_INTERNAL_H_

#include <cstdint>
#include <compare>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "shardscope/analysis/diff.h"

namespace shardscope::traces::diff_internal {

// Beyond this many edits a stretch between anchors is split in proportional halves (see
// diff.h). 256 edits cost at most 256 · (n + m) steps per stretch.
inline constexpr int32_t kMaxAlignmentEdits = 256;

// Strings to dense ids, first come first numbered. Views point into `storage_`, whose
// elements never move (std::deque).
class Interner {
 public:
  explicit Interner(std::vector<std::string>& names) : names_(names) {}
  int32_t Intern(std::string_view text);

 private:
  std::vector<std::string>& names_;
  std::deque<std::string> storage_;
  std::unordered_map<std::string_view, int32_t> ids_;
};

// Raw slice name -> normalized name id, so each distinct raw name is normalized once. The
// views point into the sides' Timelines, which outlive the diff.
class NameCache {
 public:
  explicit NameCache(Interner& interner) : interner_(interner) {}
  int32_t IdOf(const Slice& slice);

 private:
  Interner& interner_;
  std::unordered_map<std::string_view, int32_t> raw_ids_;
};

inline const Slice& SliceOf(const DiffSide& side, const DiffEvent& event) {
  return side.files[event.file].slices[event.slice];
}
int32_t RankOf(const DiffSide& side, size_t file, int32_t pid);

// Fills out.tracks and out.events (sorted, parents, classes, names, groups) for the ranks
// selected (`only_rank` < 0: all).
void BuildSide(const DiffSide& side, int32_t only_rank, NameCache& names, Interner& groups, SideAnalysis& out);

// What an op is (rules in diff_metrics.cc).
OpClass ClassifySlice(const Slice& slice, bool device);

// ClassifySlice with the name rules evaluated once per distinct raw name (they lowercase and
// search the name). The views point into the sides' Timelines, which outlive the cache.
class ClassCache {
 public:
  OpClass Classify(const Slice& slice, bool device);

 private:
  struct Entry {
    Category category = Category::kOther;
    bool device = false;
    std::optional<OpClass> by_name;  // nullopt: the slice's args decide
  };
  std::unordered_map<std::string_view, Entry> by_name_;
};
bool IsDeviceCategory(Category category);

// Fills diff.predicted.match, diff.measured.match and the match counters.
void MatchSides(const DiffSide& predicted, const DiffSide& measured, DiffResult& diff);

// The args key of a collective's member ranks in PyTorch-profiler traces, a string such as
// "[0, 1, 2, 3]" (Kineto copies it onto the kernel from record_param_comms:
// torch/csrc/profiler/util.cpp saveNcclMeta, kProcessGroupRanks).
inline constexpr std::string_view kProcessGroupRanksArg = "Process Group Ranks";

// What makes two collectives of the two sides the same one: their process group, known by
// its member ranks rather than its name (the simulator names groups after the plan,
// "dp_shard.3"; PyTorch numbers them, "0", "1"), and k, the collective's position among its
// rank's collectives of that group (not Seq: ours count from 0, PyTorch's from 1).
struct AnchorKey {
  int32_t group = -1;  // identity shared by both sides; -1: no anchor
  int64_t k = 0;
  auto operator<=>(const AnchorKey&) const = default;
};

// A group's members: its "Process Group Ranks" when an event carries it, else the ranks whose
// events name the group; compared within the ranks both sides have events for, together with
// the group size. Groups of one side that look alike anchor nothing. Fills one key per event.
void CollectiveAnchors(const DiffSide& a_side, const SideAnalysis& a, const DiffSide& b_side, const SideAnalysis& b,
                       std::vector<AnchorKey>& a_keys, std::vector<AnchorKey>& b_keys);

// "[0, 1, 2]" -> {0, 1, 2} (sorted, unique); nullopt when it is not such a list.
std::optional<std::vector<int32_t>> ParseRankList(std::string_view text);

// HTA metrics per rank, in rank order.
std::vector<RankMetrics> ComputeRankMetrics(const DiffSide& side, const SideAnalysis& analysis,
                                            const DiffOptions& options);

// The longest path of the side's dependency graph; fills `on_path_ns` per event.
StatusOr<CriticalPath> ComputeCriticalPath(const SideAnalysis& analysis, std::vector<int64_t>& on_path_ns);

// Index of the first event of each rank's range in `events` (sorted by rank), as
// (rank, begin, end) triples.
struct RankRange {
  int32_t rank = 0;
  size_t begin = 0;
  size_t end = 0;
};
std::vector<RankRange> RankRanges(const std::vector<DiffEvent>& events);

}  // namespace shardscope::traces::diff_internal

#endif  // SHARDSCOPE_TRACES_DIFF_INTERNAL_H_

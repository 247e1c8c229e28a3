// The steps of the diff (diff.h), private to traces/: building the flat event tables of a
// side, matching, HTA metrics and the critical path. Each step reads and fills DiffResult's
// SideAnalysis vectors; nothing here owns a pointer into another step's data.
#ifndef SHARDSCOPE_TRACES_DIFF_INTERNAL_H_
#define SHARDSCOPE_TRACES_DIFF_INTERNAL_H_

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "shardscope/traces/diff.h"

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
bool IsDeviceCategory(Category category);

// Fills diff.predicted.match, diff.measured.match and the match counters.
void MatchSides(DiffResult& diff);

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

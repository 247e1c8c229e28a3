// Matching the slices of two timelines: by op id, then by aligning normalized names per pair
// of tracks between collective anchors (see diff.h for the rules).
#include <algorithm>
#include <cctype>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "diff_internal.h"

namespace shardscope::traces {

namespace {

bool IsHex(char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsWordChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }

}  // namespace

std::string NormalizeKernelName(std::string_view name) {
  if (name.rfind("void ", 0) == 0) name.remove_prefix(5);
  // 1. Drop template arguments and parameter lists (balanced; an unbalanced closer is kept).
  std::string stripped;
  stripped.reserve(name.size());
  int angle = 0;
  int paren = 0;
  for (char c : name) {
    if (c == '<') {
      ++angle;
      continue;
    }
    if (c == '>' && angle > 0) {
      --angle;
      continue;
    }
    if (c == '(') {
      ++paren;
      continue;
    }
    if (c == ')' && paren > 0) {
      --paren;
      continue;
    }
    if (angle == 0 && paren == 0) stripped.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  // 2. Hashes: a word-bounded run of >= 16 hex digits (a 64-bit hash) holding a decimal
  // digit; shorter runs are often words ("bf16bf16").
  // 3. Every other run of decimal digits -> '#'. 4. Whitespace squeezed and trimmed.
  std::string out;
  out.reserve(stripped.size());
  size_t i = 0;
  while (i < stripped.size()) {
    const char c = stripped[i];
    const bool word_start = i == 0 || !IsWordChar(stripped[i - 1]);
    if (word_start && IsHex(c)) {
      size_t j = i;
      bool has_digit = false;
      while (j < stripped.size() && IsHex(stripped[j])) has_digit |= IsDigit(stripped[j++]);
      if (j - i >= 16 && has_digit && (j == stripped.size() || !IsWordChar(stripped[j]))) {
        out.push_back('#');
        i = j;
        continue;
      }
    }
    if (IsDigit(c)) {
      while (i < stripped.size() && IsDigit(stripped[i])) ++i;
      out.push_back('#');
      continue;
    }
    if (std::isspace(static_cast<unsigned char>(c)) != 0) {
      while (i < stripped.size() && std::isspace(static_cast<unsigned char>(stripped[i])) != 0) ++i;
      if (!out.empty()) out.push_back(' ');
      continue;
    }
    out.push_back(c);
    ++i;
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

namespace diff_internal {

std::optional<std::vector<int32_t>> ParseRankList(std::string_view text) {
  std::vector<int32_t> ranks;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c >= '0' && c <= '9') {
      int64_t value = 0;
      while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
        value = value * 10 + (text[i++] - '0');
        if (value > std::numeric_limits<int32_t>::max()) return std::nullopt;
      }
      ranks.push_back(static_cast<int32_t>(value));
      continue;
    }
    if (c != '[' && c != ']' && c != ',' && c != ' ') return std::nullopt;
    ++i;
  }
  if (ranks.empty()) return std::nullopt;
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks;
}

void CollectiveAnchors(const DiffSide& a_side, const SideAnalysis& a, const DiffSide& b_side, const SideAnalysis& b,
                       std::vector<AnchorKey>& a_keys, std::vector<AnchorKey>& b_keys) {
  // Ranks with events on both sides: a group's members are compared within them, so that a
  // measurement of a few ranks still meets the prediction of all.
  std::set<int32_t> a_ranks;
  std::set<int32_t> b_ranks;
  for (const DiffEvent& e : a.events) a_ranks.insert(e.rank);
  for (const DiffEvent& e : b.events) b_ranks.insert(e.rank);
  std::vector<int32_t> common;
  std::set_intersection(a_ranks.begin(), a_ranks.end(), b_ranks.begin(), b_ranks.end(), std::back_inserter(common));

  // Per side: process group (DiffResult::process_groups id) -> identity (size, members).
  using Identity = std::pair<int32_t, std::vector<int32_t>>;
  std::map<Identity, int32_t> identity_ids;
  const auto identities = [&](const DiffSide& side, const SideAnalysis& analysis) {
    struct Group {
      int32_t size = 0;
      std::optional<std::vector<int32_t>> listed;  // "Process Group Ranks"
      std::set<int32_t> seen_on;                   // ranks whose events carry it
    };
    std::map<int32_t, Group> groups;
    for (const DiffEvent& e : analysis.events) {
      if (e.process_group < 0) continue;
      Group& group = groups[e.process_group];
      const Slice& slice = SliceOf(side, e);
      group.size = std::max(group.size, slice.collective->group_size);
      group.seen_on.insert(e.rank);
      if (!group.listed) {
        for (const Arg& arg : slice.args) {
          const auto* text = std::get_if<std::string>(&arg.value);
          if (arg.key == kProcessGroupRanksArg && text != nullptr) group.listed = ParseRankList(*text);
        }
      }
    }
    std::map<int32_t, int32_t> identity_of;  // process group -> identity id, -1: ambiguous
    std::map<int32_t, int32_t> groups_per_identity;
    for (const auto& [id, group] : groups) {
      std::vector<int32_t> members;
      const std::vector<int32_t> all = group.listed ? *group.listed
                                                    : std::vector<int32_t>(group.seen_on.begin(), group.seen_on.end());
      std::set_intersection(all.begin(), all.end(), common.begin(), common.end(), std::back_inserter(members));
      if (members.empty()) continue;
      const int32_t size = group.size > 0 ? group.size : static_cast<int32_t>(all.size());
      auto [it, inserted] = identity_ids.try_emplace(Identity{size, std::move(members)},
                                                     static_cast<int32_t>(identity_ids.size()));
      identity_of[id] = it->second;
      ++groups_per_identity[it->second];
    }
    // Two groups of one side that look alike (within the common ranks) anchor nothing.
    for (auto& [id, identity] : identity_of) {
      if (groups_per_identity[identity] > 1) identity = -1;
    }
    return identity_of;
  };
  const std::map<int32_t, int32_t> a_identity = identities(a_side, a);
  const std::map<int32_t, int32_t> b_identity = identities(b_side, b);

  // k: the position of a collective among its rank's collectives of the same group (host and
  // device apart), ordered by Seq when every one has it (ours count from 0, PyTorch's from
  // 1: only the order matters), else by start time.
  const auto number = [](const SideAnalysis& analysis, const std::map<int32_t, int32_t>& identity_of,
                         std::vector<AnchorKey>& keys) {
    keys.assign(analysis.events.size(), AnchorKey{});
    std::map<std::tuple<int32_t, bool, int32_t>, std::vector<int32_t>> sequences;
    for (size_t i = 0; i < analysis.events.size(); ++i) {
      const DiffEvent& e = analysis.events[i];
      if (e.process_group < 0) continue;
      auto it = identity_of.find(e.process_group);
      if (it == identity_of.end() || it->second < 0) continue;
      sequences[{e.rank, e.device, it->second}].push_back(static_cast<int32_t>(i));
    }
    for (auto& [key, indices] : sequences) {
      const auto event = [&](int32_t i) -> const DiffEvent& { return analysis.events[static_cast<size_t>(i)]; };
      const bool by_seq = std::all_of(indices.begin(), indices.end(), [&](int32_t i) { return event(i).seq >= 0; });
      std::sort(indices.begin(), indices.end(), [&](int32_t x, int32_t y) {
        const DiffEvent& ex = event(x);
        const DiffEvent& ey = event(y);
        if (by_seq && ex.seq != ey.seq) return ex.seq < ey.seq;
        if (ex.ts_ns != ey.ts_ns) return ex.ts_ns < ey.ts_ns;
        return x < y;
      });
      for (size_t k = 0; k < indices.size(); ++k) {
        keys[static_cast<size_t>(indices[k])] = AnchorKey{std::get<2>(key), static_cast<int64_t>(k)};
      }
    }
  };
  number(a, a_identity, a_keys);
  number(b, b_identity, b_keys);
}

namespace {

enum class MatchKind : uint8_t { kOpId, kAnchor, kName };

struct Matcher {
  DiffResult& diff;
  std::vector<DiffEvent>& a_events;
  std::vector<DiffEvent>& b_events;
  std::vector<int32_t>& a_match;
  std::vector<int32_t>& b_match;
  const std::vector<AnchorKey>& a_anchor;  // per event (CollectiveAnchors)
  const std::vector<AnchorKey>& b_anchor;

  void Pair(int32_t a, int32_t b, MatchKind kind) {
    a_match[static_cast<size_t>(a)] = b;
    b_match[static_cast<size_t>(b)] = a;
    switch (kind) {
      case MatchKind::kOpId: ++diff.matched_by_op_id; break;
      case MatchKind::kAnchor: ++diff.matched_by_anchor; break;
      case MatchKind::kName: ++diff.matched_by_name; break;
    }
  }

  // Pass 1: (rank, host|device, op id, occurrence).
  void MatchByOpId() {
    struct Key {
      int32_t rank;
      bool device;
      int64_t op_id;
      int64_t ts;
      int32_t index;
    };
    const auto collect = [](const std::vector<DiffEvent>& events) {
      std::vector<Key> keys;
      for (size_t i = 0; i < events.size(); ++i) {
        const DiffEvent& e = events[i];
        if (e.op_id >= 0) keys.push_back({e.rank, e.device, e.op_id, e.ts_ns, static_cast<int32_t>(i)});
      }
      std::sort(keys.begin(), keys.end(), [](const Key& x, const Key& y) {
        return std::tie(x.rank, x.device, x.op_id, x.ts, x.index) < std::tie(y.rank, y.device, y.op_id, y.ts, y.index);
      });
      return keys;
    };
    const std::vector<Key> a = collect(a_events);
    const std::vector<Key> b = collect(b_events);
    const auto group = [](const Key& k) { return std::tie(k.rank, k.device, k.op_id); };
    size_t i = 0;
    size_t j = 0;
    while (i < a.size() && j < b.size()) {
      if (group(a[i]) < group(b[j])) {
        ++i;
      } else if (group(b[j]) < group(a[i])) {
        ++j;
      } else {
        // Same op: the k-th occurrence pairs with the k-th.
        size_t ie = i;
        size_t je = j;
        while (ie < a.size() && group(a[ie]) == group(a[i])) ++ie;
        while (je < b.size() && group(b[je]) == group(b[j])) ++je;
        for (size_t k = 0; k < std::min(ie - i, je - j); ++k) Pair(a[i + k].index, b[j + k].index, MatchKind::kOpId);
        i = ie;
        j = je;
      }
    }
  }

  // Myers' O((n+m)·D) greedy alignment of a[ab..ae) with b[bb..be) (name ids); pairs the
  // common subsequence it finds. Returns false when more than `max_edits` edits are needed.
  bool Myers(const std::vector<int32_t>& a, size_t ab, size_t ae, const std::vector<int32_t>& b, size_t bb, size_t be,
             int32_t max_edits) {
    const auto n = static_cast<int64_t>(ae - ab);
    const auto m = static_cast<int64_t>(be - bb);
    const auto name_a = [&](int64_t x) { return a_events[static_cast<size_t>(a[ab + static_cast<size_t>(x)])].name_id; };
    const auto name_b = [&](int64_t y) { return b_events[static_cast<size_t>(b[bb + static_cast<size_t>(y)])].name_id; };
    const int64_t limit = std::min<int64_t>(max_edits, n + m);
    // trace_[d] holds V after step d for diagonals -d..d, at trace_offset_[d].
    trace_.clear();
    trace_offset_.clear();
    std::vector<int64_t> v(static_cast<size_t>(2 * limit + 3), 0);
    const int64_t origin = limit + 1;
    int64_t found = -1;
    for (int64_t d = 0; d <= limit && found < 0; ++d) {
      for (int64_t k = -d; k <= d; k += 2) {
        int64_t x = (k == -d || (k != d && v[static_cast<size_t>(origin + k - 1)] < v[static_cast<size_t>(origin + k + 1)]))
                        ? v[static_cast<size_t>(origin + k + 1)]
                        : v[static_cast<size_t>(origin + k - 1)] + 1;
        int64_t y = x - k;
        while (x < n && y < m && name_a(x) == name_b(y)) {
          ++x;
          ++y;
        }
        v[static_cast<size_t>(origin + k)] = x;
        if (x >= n && y >= m && found < 0) found = d;
      }
      trace_offset_.push_back(trace_.size());
      for (int64_t k = -d; k <= d; ++k) trace_.push_back(v[static_cast<size_t>(origin + k)]);
    }
    if (found < 0) return false;
    const auto prev_v = [&](int64_t d, int64_t k) {  // V after step d at diagonal k
      return trace_[trace_offset_[static_cast<size_t>(d)] + static_cast<size_t>(k + d)];
    };
    int64_t x = n;
    int64_t y = m;
    std::vector<std::pair<int64_t, int64_t>> pairs;
    for (int64_t d = found; d > 0; --d) {
      const int64_t k = x - y;
      const bool down = k == -d || (k != d && prev_v(d - 1, k - 1) < prev_v(d - 1, k + 1));
      const int64_t prev_k = down ? k + 1 : k - 1;
      const int64_t prev_x = prev_v(d - 1, prev_k);
      const int64_t prev_y = prev_x - prev_k;
      while (x > prev_x && y > prev_y) {
        --x;
        --y;
        pairs.emplace_back(x, y);
      }
      x = prev_x;
      y = prev_y;
    }
    while (x > 0 && y > 0) {
      --x;
      --y;
      pairs.emplace_back(x, y);
    }
    for (auto it = pairs.rbegin(); it != pairs.rend(); ++it) {
      Pair(a[ab + static_cast<size_t>(it->first)], b[bb + static_cast<size_t>(it->second)], MatchKind::kName);
    }
    return true;
  }

  void Align(const std::vector<int32_t>& a, size_t ab, size_t ae, const std::vector<int32_t>& b, size_t bb, size_t be) {
    // Common prefix and suffix first: the usual case (few differences) costs O(n).
    while (ab < ae && bb < be && a_events[static_cast<size_t>(a[ab])].name_id == b_events[static_cast<size_t>(b[bb])].name_id) {
      Pair(a[ab++], b[bb++], MatchKind::kName);
    }
    while (ab < ae && bb < be &&
           a_events[static_cast<size_t>(a[ae - 1])].name_id == b_events[static_cast<size_t>(b[be - 1])].name_id) {
      Pair(a[--ae], b[--be], MatchKind::kName);
    }
    if (ab == ae || bb == be) return;
    if (Myers(a, ab, ae, b, bb, be, kMaxAlignmentEdits)) return;
    // Too different: align proportional halves (approximate, bounded work).
    const size_t am = ab + (ae - ab) / 2;
    const size_t bm = bb + (be - bb) / 2;
    Align(a, ab, am, b, bb, bm);
    Align(a, am, ae, b, bm, be);
  }

  // Anchors: collectives with the same anchor key (group by member ranks, k-th collective of
  // that group on the rank) in both sequences, kept in order (longest increasing subsequence
  // of their positions); then Align between them.
  void AlignTracks(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    const auto positions = [](const std::vector<int32_t>& indices, const std::vector<AnchorKey>& keys) {
      std::map<AnchorKey, int64_t> pos;  // key -> position, -1 if repeated
      for (size_t i = 0; i < indices.size(); ++i) {
        const AnchorKey& key = keys[static_cast<size_t>(indices[i])];
        if (key.group < 0) continue;
        auto [it, inserted] = pos.emplace(key, static_cast<int64_t>(i));
        if (!inserted) it->second = -1;
      }
      return pos;
    };
    const std::map<AnchorKey, int64_t> a_pos = positions(a, a_anchor);
    const std::map<AnchorKey, int64_t> b_pos = positions(b, b_anchor);
    std::vector<std::pair<int64_t, int64_t>> candidates;  // (pos in a, pos in b)
    for (const auto& [key, pa] : a_pos) {
      auto it = b_pos.find(key);
      if (pa >= 0 && it != b_pos.end() && it->second >= 0) candidates.emplace_back(pa, it->second);
    }
    std::sort(candidates.begin(), candidates.end());
    // Longest strictly increasing subsequence in b positions (patience sorting).
    std::vector<size_t> tails;
    std::vector<int64_t> previous(candidates.size(), -1);
    for (size_t c = 0; c < candidates.size(); ++c) {
      auto it = std::lower_bound(tails.begin(), tails.end(), candidates[c].second,
                                 [&](size_t t, int64_t value) { return candidates[t].second < value; });
      if (it != tails.begin()) previous[c] = static_cast<int64_t>(*(it - 1));
      if (it == tails.end()) {
        tails.push_back(c);
      } else {
        *it = c;
      }
    }
    std::vector<std::pair<int64_t, int64_t>> anchors;
    for (int64_t c = tails.empty() ? -1 : static_cast<int64_t>(tails.back()); c >= 0; c = previous[static_cast<size_t>(c)]) {
      anchors.push_back(candidates[static_cast<size_t>(c)]);
    }
    std::reverse(anchors.begin(), anchors.end());
    size_t ab = 0;
    size_t bb = 0;
    for (const auto& [pa, pb] : anchors) {
      Align(a, ab, static_cast<size_t>(pa), b, bb, static_cast<size_t>(pb));
      Pair(a[static_cast<size_t>(pa)], b[static_cast<size_t>(pb)], MatchKind::kAnchor);
      ab = static_cast<size_t>(pa) + 1;
      bb = static_cast<size_t>(pb) + 1;
    }
    Align(a, ab, a.size(), b, bb, b.size());
  }

  // Pass 2: pair tracks of each rank by shared names, then align each pair.
  void MatchByName() {
    const std::vector<RankRange> a_ranks = RankRanges(a_events);
    const std::vector<RankRange> b_ranks = RankRanges(b_events);
    size_t bi = 0;
    for (const RankRange& ar : a_ranks) {
      while (bi < b_ranks.size() && b_ranks[bi].rank < ar.rank) ++bi;
      if (bi == b_ranks.size() || b_ranks[bi].rank != ar.rank) continue;
      const RankRange& br = b_ranks[bi];
      // Unmatched events per track, in time order (events are sorted by track, ts).
      const auto leftovers = [](const std::vector<DiffEvent>& events, const std::vector<int32_t>& match,
                                const RankRange& range) {
        std::map<int32_t, std::vector<int32_t>> by_track;
        for (size_t i = range.begin; i < range.end; ++i) {
          if (match[i] < 0) by_track[events[i].track].push_back(static_cast<int32_t>(i));
        }
        return by_track;
      };
      const auto a_tracks = leftovers(a_events, a_match, ar);
      const auto b_tracks = leftovers(b_events, b_match, br);
      if (a_tracks.empty() || b_tracks.empty()) continue;
      // Score = sum over names of min(count in a, count in b); greedy best pairs first.
      const auto name_counts = [](const std::vector<DiffEvent>& events, const std::vector<int32_t>& indices) {
        std::vector<int32_t> ids;
        ids.reserve(indices.size());
        for (int32_t i : indices) ids.push_back(events[static_cast<size_t>(i)].name_id);
        std::sort(ids.begin(), ids.end());
        return ids;
      };
      struct Candidate {
        int64_t score;
        int32_t a_track;
        int32_t b_track;
      };
      std::vector<Candidate> candidates;
      std::map<int32_t, std::vector<int32_t>> b_names;
      for (const auto& [bt, indices] : b_tracks) b_names[bt] = name_counts(b_events, indices);
      for (const auto& [at, a_indices] : a_tracks) {
        const std::vector<int32_t> an = name_counts(a_events, a_indices);
        const bool a_device = a_events[static_cast<size_t>(a_indices.front())].device;
        for (const auto& [bt, bn] : b_names) {
          if (b_events[static_cast<size_t>(b_tracks.at(bt).front())].device != a_device) continue;
          int64_t score = 0;
          size_t x = 0;
          size_t y = 0;
          while (x < an.size() && y < bn.size()) {
            if (an[x] < bn[y]) {
              ++x;
            } else if (bn[y] < an[x]) {
              ++y;
            } else {
              ++score;
              ++x;
              ++y;
            }
          }
          if (score > 0) candidates.push_back({score, at, bt});
        }
      }
      std::sort(candidates.begin(), candidates.end(), [](const Candidate& x, const Candidate& y) {
        if (x.score != y.score) return x.score > y.score;
        return std::tie(x.a_track, x.b_track) < std::tie(y.a_track, y.b_track);
      });
      std::map<int32_t, bool> a_used;
      std::map<int32_t, bool> b_used;
      for (const Candidate& c : candidates) {
        if (a_used[c.a_track] || b_used[c.b_track]) continue;
        a_used[c.a_track] = b_used[c.b_track] = true;
        AlignTracks(a_tracks.at(c.a_track), b_tracks.at(c.b_track));
      }
    }
  }

  std::vector<int64_t> trace_;
  std::vector<size_t> trace_offset_;
};

}  // namespace

void MatchSides(const DiffSide& predicted, const DiffSide& measured, DiffResult& diff) {
  diff.predicted.match.assign(diff.predicted.events.size(), -1);
  diff.measured.match.assign(diff.measured.events.size(), -1);
  std::vector<AnchorKey> predicted_anchors;
  std::vector<AnchorKey> measured_anchors;
  CollectiveAnchors(predicted, diff.predicted, measured, diff.measured, predicted_anchors, measured_anchors);
  Matcher matcher{diff,
                  diff.predicted.events,
                  diff.measured.events,
                  diff.predicted.match,
                  diff.measured.match,
                  predicted_anchors,
                  measured_anchors,
                  {},
                  {}};
  matcher.MatchByOpId();
  matcher.MatchByName();
}

}  // namespace diff_internal
}  // namespace shardscope::traces

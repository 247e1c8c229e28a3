// Cross-rank analysis of Flight Recorder dumps: which collectives are stuck, which ranks are
// missing from them, and what differs between the ranks that entered them.
//
// The rules are PyTorch's analyzer's (torch/distributed/flight_recorder/components/), cited
// beside each; where it is greedy (build_collectives pops entries rank by rank after
// align_trace_from_beginning drops every record_id below the largest first one, which
// compares per-rank counters across ranks), this file decides per sequence number instead:
//   - Groups: a process group is its name and its member ranks, as builder.py
//     build_groups_memberships keys it (pg_guid = name + hash(ranks), for split_group), each
//     rank's entries mapped through its own pg_config.
//   - Matching: per group, collectives by collective_seq_id (check_current_entry_match:
//     e["collective_seq_id"] == entry_state.collective_seq_id, p2p entries left out); p2p ops
//     by p2p_seq_id only on two-rank groups, because p2p_seq_id counts a rank's own sends and
//     recvs on the group (the 16-rank fixture's pipeline group: rank 0 at 11981-11986 while
//     rank 4 is at 13696-13698), so it lines up across ranks only when both sides of every
//     op are the same two ranks.
//   - Missing: a member with no entry at sequence number s is missing when its own buffer
//     proves it never got there: its newest entry of the group is older than s (the ring
//     buffer keeps the newest entries, so an entry for s would still be there), or, with no
//     entry of the group left, its pg_status says its last enqueued collective is below s.
//     A member whose dump is absent is "no dump" (utils.py error_analysis: "we missed FR
//     dumps from ranks ... so we don't have enough information"), one whose buffer starts
//     after s is "not in buffer"; neither is called missing.
//   - Mismatch: types.py Op.match, against the lowest rank that entered (the reference, as
//     build_collectives takes the first rank's entry): type, then sizes (all_to_all and
//     scatter skip input sizes, all_to_all and gather output sizes; all_reduce in == out;
//     all_gather out = in x group size; reduce_scatter in = out x group size), dtypes
//     (dtype_mismatch), state; all_to_all then totals input and output elements over the
//     group (utils.py check_size_alltoall, skipped before version 2.4 as error_analysis does).
//   - Hang: the first sequence number of a group with a missing rank, a mismatch, or (the
//     partial case of error_analysis) a rank without a dump while no rank that entered has
//     completed it; a difference of state alone counts only when the group shows nothing
//     else. Later sequence numbers of the group are its consequences.
#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "shardscope/base/rank_ranges.h"
#include "shardscope/analysis/flight_recorder_analysis.h"

namespace shardscope::traces {
namespace {

using GroupKey = std::pair<std::string, std::vector<int32_t>>;

bool IsDigits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string RanksPhrase(const std::vector<int32_t>& ranks) {
  std::set<int32_t> unique(ranks.begin(), ranks.end());
  return fmt::format("{} {}", unique.size() == 1 ? "rank" : "ranks", CompressRanks(ranks));
}

std::string RanksVerb(const std::vector<int32_t>& ranks, std::string_view one, std::string_view many) {
  std::set<int32_t> unique(ranks.begin(), ranks.end());
  return fmt::format("{} {}", RanksPhrase(ranks), unique.size() == 1 ? one : many);
}

// The op type of a profiling name: "nccl:send 0->1" -> "send" (types.py Op.__init__).
std::string OpType(const std::string& profiling_name) {
  const size_t colon = profiling_name.find(':');
  std::string rest = colon == std::string::npos ? profiling_name : profiling_name.substr(colon + 1);
  const size_t space = rest.find(' ');
  return space == std::string::npos ? rest : rest.substr(0, space);
}

// "nccl:send 0->1": (src, dst) in group ranks; "nccl:recv 1<-0": (src 0, dst 1). (-1, -1)
// when the name has no peers (types.py Op.__init__ splits meta on "->" / "<-").
std::pair<int64_t, int64_t> P2pEnds(const std::string& profiling_name) {
  const size_t space = profiling_name.find(' ');
  if (space == std::string::npos) return {-1, -1};
  const std::string meta = profiling_name.substr(space + 1);
  auto number = [](const std::string& s) -> int64_t {
    if (s.size() > 9 || !IsDigits(s)) return -1;
    return std::stoll(s);
  };
  if (size_t arrow = meta.find("->"); arrow != std::string::npos) {
    return {number(meta.substr(0, arrow)), number(meta.substr(arrow + 2))};
  }
  if (size_t arrow = meta.find("<-"); arrow != std::string::npos) {
    return {number(meta.substr(arrow + 2)), number(meta.substr(0, arrow))};
  }
  return {-1, -1};
}

// Product of the dimensions; nullopt on overflow (a hostile dump) or no tensor.
std::optional<int64_t> Numel(const std::vector<std::vector<int64_t>>& sizes) {
  if (sizes.empty()) return std::nullopt;
  int64_t n = 1;
  for (int64_t d : sizes.front()) {
    if (__builtin_mul_overflow(n, d, &n)) return std::nullopt;
  }
  return n;
}

std::string Join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? std::string(sep) : "") + items[i];
  return out;
}

std::string DtypeText(const FrEntry& e) {
  std::vector<std::string> unique;
  for (const std::string& d : e.input_dtypes) {
    if (std::find(unique.begin(), unique.end(), d) == unique.end()) unique.push_back(d);
  }
  if (unique.empty()) {
    for (const std::string& d : e.output_dtypes) {
      if (std::find(unique.begin(), unique.end(), d) == unique.end()) unique.push_back(d);
    }
  }
  return Join(unique, ",");
}

// "4027x5120 BFloat16".
std::string WhatText(const FrEntry& e) {
  std::string sizes = FrSizesText(e.input_sizes);
  const std::string dtype = DtypeText(e);
  if (sizes.empty()) sizes = "no tensor";
  return dtype.empty() ? sizes : sizes + " " + dtype;
}

std::set<std::string> AsSet(const std::vector<std::string>& v) { return {v.begin(), v.end()}; }

// types.py Op.dtype_mismatch.
bool DtypeMismatch(const FrEntry& a, const FrEntry& b, const std::string& type) {
  const bool a_in = !a.input_sizes.empty() && !a.input_sizes.front().empty();
  const bool a_out = !a.output_sizes.empty() && !a.output_sizes.front().empty();
  const bool b_in = !b.input_sizes.empty() && !b.input_sizes.front().empty();
  const bool b_out = !b.output_sizes.empty() && !b.output_sizes.front().empty();
  if (type != "scatter" && type != "gather" && type != "broadcast" &&
      AsSet(a.input_dtypes) != AsSet(a.output_dtypes) && a_in && a_out) {
    return true;
  }
  if (type != "scatter" && type != "broadcast" && AsSet(a.input_dtypes) != AsSet(b.input_dtypes) && a_in && b_in) {
    return true;
  }
  return type != "gather" && AsSet(a.output_dtypes) != AsSet(b.output_dtypes) && a_out && b_out;
}

struct MatchResult {
  std::string kind;  // empty: matched
  std::string detail;
};

// types.py Op.match(self=reference, other). `p2p`: the two entries are the two sides of one
// send / recv.
MatchResult Match(const FrEntry& ref, const FrEntry& other, int64_t group_size, bool p2p) {
  const std::string type = OpType(ref.profiling_name);
  const std::string other_type = OpType(other.profiling_name);
  if (p2p) {
    // Op.match for send / recv: the other side is the complementary op between the same ends
    // with the same sizes (a send's input is the recv's output).
    const bool complementary = (type == "send" && other_type == "recv") || (type == "recv" && other_type == "send");
    const auto ends = P2pEnds(ref.profiling_name), other_ends = P2pEnds(other.profiling_name);
    const bool ends_known = ends.first >= 0 && other_ends.first >= 0;
    const auto& ref_data = type == "send" ? ref.input_sizes : ref.output_sizes;
    const auto& other_data = other_type == "send" ? other.input_sizes : other.output_sizes;
    if (!complementary || (ends_known && ends != other_ends) || ref_data != other_data) {
      return {"SIZE_OR_SYNTAX_MISMATCH",
              fmt::format("'{}' ({}) does not pair with '{}' ({})", ref.profiling_name, FrSizesText(ref_data),
                          other.profiling_name, FrSizesText(other_data))};
    }
    return {};
  }
  if (type != other_type) {
    return {"COLLECTIVE_TYPE_MISMATCH", fmt::format("'{}' against '{}'", type, other_type)};
  }
  if (type != "all_to_all" && type != "scatter" && ref.input_sizes != other.input_sizes) {
    return {"SIZE_OR_SYNTAX_MISMATCH", fmt::format("input sizes {} against {}", FrSizesText(ref.input_sizes),
                                                   FrSizesText(other.input_sizes))};
  }
  if (type != "all_to_all" && type != "gather" && ref.output_sizes != other.output_sizes) {
    return {"SIZE_OR_SYNTAX_MISMATCH", fmt::format("output sizes {} against {}", FrSizesText(ref.output_sizes),
                                                   FrSizesText(other.output_sizes))};
  }
  if ((type == "all_reduce" || type == "allreduce_coalesced") && ref.input_sizes != other.output_sizes) {
    return {"SIZE_OR_SYNTAX_MISMATCH", fmt::format("input sizes {} against output sizes {}",
                                                   FrSizesText(ref.input_sizes), FrSizesText(other.output_sizes))};
  }
  // The gathered output is the input times the group size; types.py lists "all_gather",
  // "all_gather_base" and "all_gather_into_tensor_coalesced" (and "_reduce_scatter_base" on
  // the other side); the underscored "_all_gather_base" PyTorch actually records is added.
  static const std::set<std::string> kGathers = {"all_gather", "_all_gather_base", "all_gather_base",
                                                 "all_gather_into_tensor_coalesced"};
  static const std::set<std::string> kScatters = {"reduce_scatter", "_reduce_scatter_base",
                                                  "reduce_scatter_tensor_coalesced"};
  if (kGathers.count(type)) {
    const auto in = Numel(ref.input_sizes), out = Numel(other.output_sizes);
    int64_t expected = 0;
    if (in && out && (__builtin_mul_overflow(*in, group_size, &expected) || *out != expected)) {
      return {"SIZE_OR_SYNTAX_MISMATCH",
              fmt::format("output {} elements, expected input {} x group size {}", *out, *in, group_size)};
    }
  }
  if (kScatters.count(type)) {
    const auto in = Numel(other.input_sizes), out = Numel(ref.output_sizes);
    int64_t expected = 0;
    if (in && out && (__builtin_mul_overflow(*out, group_size, &expected) || *in != expected)) {
      return {"SIZE_OR_SYNTAX_MISMATCH",
              fmt::format("input {} elements, expected output {} x group size {}", *in, *out, group_size)};
    }
  }
  if (DtypeMismatch(ref, other, type)) {
    return {"COLLECTIVE_DTYPE_MISMATCH", fmt::format("dtypes {} against {}", DtypeText(ref), DtypeText(other))};
  }
  if (ref.state != other.state) {
    return {"COLLECTIVE_STATE_MISMATCH", fmt::format("state {} against {}", ref.state, other.state)};
  }
  return {};
}

std::string KindWords(const std::string& kind) {
  if (kind == "COLLECTIVE_TYPE_MISMATCH") return "collective type mismatch";
  if (kind == "SIZE_OR_SYNTAX_MISMATCH") return "size mismatch";
  if (kind == "COLLECTIVE_DTYPE_MISMATCH") return "dtype mismatch";
  return "state mismatch";
}

// utils.py get_version_detail: "2.9" -> (2, 9); (0, 0) when unreadable.
std::pair<int, int> VersionOf(const std::string& version) {
  const size_t dot = version.find('.');
  if (dot == std::string::npos) return {0, 0};
  try {
    return {std::stoi(version.substr(0, dot)), std::stoi(version.substr(dot + 1))};
  } catch (const std::exception&) {
    return {0, 0};
  }
}

// One rank's entries of one group, by sequence number.
using BySeq = std::map<int64_t, std::vector<const FrEntry*>>;

class GroupAnalyzer {
 public:
  GroupAnalyzer(const GroupKey& key, std::string desc, const std::map<int32_t, const FlightRecorderDump*>& dumps,
                std::pair<int, int> version)
      : key_(key), desc_(std::move(desc)), dumps_(dumps), version_(version) {}

  void Add(int32_t rank, const FrEntry* e) { (e->is_p2p ? p2p_[rank] : coll_[rank])[e->is_p2p ? e->p2p_seq_id : e->collective_seq_id].push_back(e); }

  void Run(std::vector<FrHang>& hangs) const {
    if (auto h = Check(coll_, false)) hangs.push_back(std::move(*h));
    if (key_.second.size() == 2) {
      if (auto h = Check(p2p_, true)) hangs.push_back(std::move(*h));
    }
  }

 private:
  // The pg_status of `rank` for this group, when it can be found (see the file comment).
  const std::optional<FrPgStatus>& StatusOf(int32_t rank) const {
    auto cached = status_cache_.find(rank);
    if (cached == status_cache_.end()) cached = status_cache_.emplace(rank, FindStatus(rank)).first;
    return cached->second;
  }

  std::optional<FrPgStatus> FindStatus(int32_t rank) const {
    const FlightRecorderDump& dump = *dumps_.at(rank);
    std::optional<int64_t> pg_id;
    bool names_are_ids = true;  // our dumps (and PyTorch's default group) name PGs by their id
    for (const FrEntry& e : dump.entries) {
      if (e.pg_name == key_.first) pg_id = e.pg_id;
      if (std::to_string(e.pg_id) != e.pg_name) names_are_ids = false;
    }
    std::string status_key;
    if (pg_id) {
      status_key = std::to_string(*pg_id);
    } else if (names_are_ids) {
      status_key = key_.first;
    } else {
      return std::nullopt;
    }
    auto it = dump.pg_status.find(status_key);
    if (it == dump.pg_status.end()) return std::nullopt;
    return it->second;
  }

  std::optional<FrHang> Check(const std::map<int32_t, BySeq>& by_rank, bool p2p) const {
    std::set<int64_t> seqs;
    for (const auto& [rank, m] : by_rank) {
      for (const auto& [seq, entries] : m) seqs.insert(seq);
    }
    const std::vector<int32_t>& members = key_.second;
    std::optional<FrHang> state_candidate;
    for (int64_t seq : seqs) {
      FrHang h;
      h.pg_name = key_.first;
      h.pg_desc = desc_;
      h.group_ranks = members;
      h.p2p = p2p;
      h.seq = seq;
      std::vector<std::pair<int32_t, const FrEntry*>> entered;
      // Statuses first, cheaply; the per-rank details are copied only for a hang.
      struct Light {
        int32_t rank;
        FrRankStatus status;
        const FrEntry* entry;
        int64_t last_enqueued;
      };
      std::vector<Light> states;
      states.reserve(members.size());
      for (int32_t r : members) {
        Light st{r, FrRankStatus::kNotInBuffer, nullptr, -1};
        if (!dumps_.count(r)) {
          st.status = FrRankStatus::kNoDump;
          h.no_dump_ranks.push_back(r);
          states.push_back(st);
          continue;
        }
        auto mine = by_rank.find(r);
        const BySeq* m = mine == by_rank.end() ? nullptr : &mine->second;
        auto at = m != nullptr ? m->find(seq) : BySeq::const_iterator();
        if (m != nullptr && at != m->end()) {
          st.status = FrRankStatus::kEntered;
          st.entry = at->second.front();
          entered.emplace_back(r, st.entry);
          h.waiting_ranks.push_back(r);
        } else if (m != nullptr && !m->empty() && m->rbegin()->first < seq) {
          st.status = FrRankStatus::kNeverEntered;
          st.entry = m->rbegin()->second.back();
          h.missing_ranks.push_back(r);
        } else if ((m == nullptr || m->empty()) && !p2p) {
          const std::optional<FrPgStatus>& status = StatusOf(r);
          if (status && status->last_enqueued >= 0 && status->last_enqueued < seq) {
            st.status = FrRankStatus::kNeverEntered;
            st.last_enqueued = status->last_enqueued;
            h.missing_ranks.push_back(r);
          } else {
            h.not_in_buffer_ranks.push_back(r);
          }
        } else {
          h.not_in_buffer_ranks.push_back(r);
        }
        states.push_back(st);
      }
      if (entered.empty()) continue;
      const FrEntry& ref = *entered.front().second;
      h.collective = ref.profiling_name;
      h.input_sizes = ref.input_sizes;
      h.output_sizes = ref.output_sizes;
      h.dtype = DtypeText(ref);
      for (const auto& [r, e] : entered) {
        if (e->time_created_ns >= 0 && (h.waiting_since_ns < 0 || e->time_created_ns < h.waiting_since_ns)) {
          h.waiting_since_ns = e->time_created_ns;
        }
      }
      h.mismatch = CompareEntered(entered, p2p, h);
      bool any_completed = false;
      for (const auto& [r, e] : entered) any_completed = any_completed || e->state == "completed";
      const bool partial = !h.no_dump_ranks.empty() && !any_completed;
      if (h.missing_ranks.empty() && !h.mismatch && !partial) continue;
      if (!p2p) h.oldest_incomplete_seq = OldestIncompleteBeforeBuffers(by_rank, *seqs.begin());
      for (const Light& light : states) {
        FrRankState st;
        st.rank = light.rank;
        st.status = light.status;
        st.last_enqueued = light.last_enqueued;
        if (light.entry != nullptr) st.entry = *light.entry;
        if (light.status != FrRankStatus::kNoDump && !dumps_.at(light.rank)->entries.empty()) {
          st.last_entry = dumps_.at(light.rank)->entries.back();
        }
        h.rank_states.push_back(std::move(st));
      }
      h.description = Describe(h, entered);
      // A difference of state alone (completed on some ranks, not on others) is also how a
      // rank whose GPU stopped looks while its peers went on (the 16-rank fixture's rank 12
      // shows as scheduled what ranks 13 and 15 completed): it is the group's hang only when
      // the group shows nothing else.
      const bool state_only = h.missing_ranks.empty() && !partial && h.mismatch &&
                              h.mismatch->kind == "COLLECTIVE_STATE_MISMATCH";
      if (!state_only) return h;
      if (!state_candidate) state_candidate = std::move(h);
    }
    return state_candidate;
  }

  // The smallest last_completed_collective + 1 over the dumped members whose pg_status is
  // known, when it is below `first_seq` (the oldest sequence number any buffer holds).
  int64_t OldestIncompleteBeforeBuffers(const std::map<int32_t, BySeq>& by_rank, int64_t first_seq) const {
    int64_t oldest = -1;
    for (int32_t r : key_.second) {
      if (!dumps_.count(r)) continue;
      const std::optional<FrPgStatus>& status = StatusOf(r);
      if (!status || status->last_completed < 0) continue;
      auto mine = by_rank.find(r);
      // A rank that enqueued nothing past its last completion is not waiting in this group.
      if (status->last_enqueued >= 0 && status->last_enqueued <= status->last_completed) continue;
      if (mine == by_rank.end() || mine->second.empty()) continue;
      const int64_t next = status->last_completed + 1;
      if (oldest < 0 || next < oldest) oldest = next;
    }
    return oldest >= 0 && oldest < first_seq ? oldest : -1;
  }

  std::optional<FrMismatch> CompareEntered(const std::vector<std::pair<int32_t, const FrEntry*>>& entered, bool p2p,
                                           const FrHang& h) const {
    const auto group_size = static_cast<int64_t>(key_.second.size());
    const FrEntry& ref = *entered.front().second;
    std::string kind, detail;
    std::vector<int32_t> same = {entered.front().first}, differ;
    for (size_t i = 1; i < entered.size(); ++i) {
      const MatchResult m = Match(ref, *entered[i].second, group_size, p2p);
      if (m.kind.empty() || (!kind.empty() && m.kind != kind)) {
        (m.kind.empty() ? same : differ).push_back(entered[i].first);
        continue;
      }
      if (kind.empty()) {
        kind = m.kind;
        detail = m.detail;
      }
      differ.push_back(entered[i].first);
    }
    if (!kind.empty()) {
      FrMismatch mm;
      mm.kind = kind;
      // The smaller side is the odd one out (sim/hangs/src/hang.cc groups arrivals the same way).
      const bool ref_side_odd = same.size() < differ.size();
      mm.ranks = ref_side_odd ? same : differ;
      const std::vector<int32_t>& odd = mm.ranks;
      const std::vector<int32_t>& rest = ref_side_odd ? differ : same;
      const FrEntry& odd_entry = ref_side_odd ? ref : *std::find_if(entered.begin(), entered.end(), [&](const auto& p) {
                                                        return p.first == odd.front();
                                                      })->second;
      const FrEntry& rest_entry = ref_side_odd ? *std::find_if(entered.begin(), entered.end(), [&](const auto& p) {
                                                   return p.first == rest.front();
                                                 })->second
                                               : ref;
      auto side = [&](const std::vector<int32_t>& ranks, const FrEntry& e) {
        return fmt::format("{} in {} ({}, {})", RanksVerb(ranks, "is", "are"), Name(e, h), WhatText(e), e.state);
      };
      mm.text = fmt::format("{} while {}: {} ({}; {})", side(odd, odd_entry), side(rest, rest_entry),
                            KindWords(kind), kind, detail);
      return mm;
    }
    // utils.py error_analysis, case two: an all_to_all matched pairwise (Op.match: UNDECIDED)
    // is checked on the totals over the group, once every member is in (not before 2.4).
    if (!p2p && OpType(ref.profiling_name) == "all_to_all" && entered.size() == key_.second.size() &&
        !(version_.first < 2 || (version_.first == 2 && version_.second <= 3))) {
      int64_t in = 0, out = 0;
      for (const auto& [r, e] : entered) {
        const auto i = Numel(e->input_sizes), o = Numel(e->output_sizes);
        if (!i || !o || __builtin_add_overflow(in, *i, &in) || __builtin_add_overflow(out, *o, &out)) return std::nullopt;
      }
      if (in != out) {
        FrMismatch mm;
        mm.kind = "SIZE_OR_SYNTAX_MISMATCH";
        for (const auto& [r, e] : entered) mm.ranks.push_back(r);
        mm.text = fmt::format("{} are in {}: size mismatch (SIZE_OR_SYNTAX_MISMATCH; {} input elements in all, "
                              "{} output elements)",
                              RanksPhrase(mm.ranks), Name(ref, h), in, out);
        return mm;
      }
    }
    return std::nullopt;
  }

  // "nccl:all_to_all #20537 on process group 74 (EXPERT_MODEL_PARALLEL_GROUP)".
  std::string Name(const FrEntry& e, const FrHang& h) const {
    const std::string group = h.pg_desc.empty() || h.pg_desc == "undefined"
                                  ? fmt::format("process group {}", h.pg_name)
                                  : fmt::format("process group {} ({})", h.pg_name, h.pg_desc);
    if (h.p2p) return fmt::format("{} (p2p_seq_id {}) on {}", e.profiling_name, h.seq, group);
    return fmt::format("{} #{} on {}", e.profiling_name, h.seq, group);
  }

  std::string Describe(const FrHang& h, const std::vector<std::pair<int32_t, const FrEntry*>>& entered) const {
    const FrEntry& ref = *entered.front().second;
    std::string text;
    if (h.mismatch) {
      text = h.mismatch->text;
      if (!h.missing_ranks.empty()) text += fmt::format("; never entered it: {}", RanksPhrase(h.missing_ranks));
    } else if (!h.missing_ranks.empty()) {
      // "ranks 13-15 wait in X for rank 12, which never entered it (its last there: #20536,
      // scheduled)", as simulate says "ranks 0-2 wait in all_gather #2 on 'dp' for rank 3".
      std::map<std::string, std::vector<int32_t>> lasts;
      for (const FrRankState& st : h.rank_states) {
        if (st.status != FrRankStatus::kNeverEntered) continue;
        const std::string last =
            st.entry ? fmt::format("{}{}, {}", h.p2p ? "p2p_seq_id " : "#",
                                   h.p2p ? st.entry->p2p_seq_id : st.entry->collective_seq_id, st.entry->state)
                     : fmt::format("none in its buffer, last enqueued {} by its pg_status", st.last_enqueued);
        lasts[last].push_back(st.rank);
      }
      std::string why;
      if (lasts.size() == 1) {
        why = fmt::format("{} last there: {}", h.missing_ranks.size() == 1 ? "its" : "their", lasts.begin()->first);
      } else {
        std::vector<std::string> parts;
        for (const auto& [last, ranks] : lasts) parts.push_back(fmt::format("{}: {}", RanksPhrase(ranks), last));
        why = "last there: " + Join(parts, "; ");
      }
      text = fmt::format("{} in {}, {}, for {}, which never entered it ({})", RanksVerb(h.waiting_ranks, "waits", "wait"),
                         Name(ref, h), WhatText(ref), RanksPhrase(h.missing_ranks), why);
    } else {
      text = fmt::format("{} in {}, {}, not completed", RanksVerb(h.waiting_ranks, "waits", "wait"), Name(ref, h),
                         WhatText(ref));
    }
    if (h.oldest_incomplete_seq >= 0) {
      text += fmt::format("; the oldest collective there not completed is #{} (pg_status), older than every "
                          "rank's buffer: the stuck collective itself is no longer in the dumps",
                          h.oldest_incomplete_seq);
    }
    if (!h.no_dump_ranks.empty()) {
      text += fmt::format("; no dump from {}{}", RanksPhrase(h.no_dump_ranks),
                          h.missing_ranks.empty() && !h.mismatch ? ", which may never have entered it" : "");
    }
    return text;
  }

  GroupKey key_;
  std::string desc_;
  const std::map<int32_t, const FlightRecorderDump*>& dumps_;
  std::pair<int, int> version_;
  std::map<int32_t, BySeq> coll_, p2p_;
  mutable std::map<int32_t, std::optional<FrPgStatus>> status_cache_;  // StatusOf, per rank
};

bool NameLess(const std::string& a, const std::string& b) {
  const bool an = a.size() < 19 && IsDigits(a);
  const bool bn = b.size() < 19 && IsDigits(b);
  if (an && bn) return std::stoll(a) < std::stoll(b);
  if (an != bn) return an;
  return a < b;
}

nlohmann::ordered_json SizesJson(const std::vector<std::vector<int64_t>>& sizes) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& s : sizes) out.push_back(s);
  return out;
}

std::string_view StatusName(FrRankStatus s) {
  switch (s) {
    case FrRankStatus::kEntered: return "entered";
    case FrRankStatus::kNeverEntered: return "never_entered";
    case FrRankStatus::kNoDump: return "no_dump";
    case FrRankStatus::kNotInBuffer: return "not_in_buffer";
  }
  return "?";
}

nlohmann::ordered_json EntryJson(const FrEntry& e) {
  nlohmann::ordered_json j;
  j["profiling_name"] = e.profiling_name;
  j["collective_seq_id"] = e.collective_seq_id;
  j["p2p_seq_id"] = e.p2p_seq_id;
  j["state"] = e.state;
  j["input_sizes"] = SizesJson(e.input_sizes);
  j["output_sizes"] = SizesJson(e.output_sizes);
  j["input_dtypes"] = e.input_dtypes;
  j["time_created_ns"] = e.time_created_ns >= 0 ? nlohmann::ordered_json(e.time_created_ns) : nlohmann::ordered_json();
  return j;
}

}  // namespace

std::string FrSizesText(const std::vector<std::vector<int64_t>>& sizes) {
  std::vector<std::string> parts;
  for (const auto& shape : sizes) {
    std::vector<std::string> dims;
    for (int64_t d : shape) dims.push_back(std::to_string(d));
    parts.push_back(dims.empty() ? std::string("scalar") : Join(dims, "x"));
  }
  return Join(parts, ", ");
}

FlightRecorderAnalysis AnalyzeFlightRecorder(const std::vector<FlightRecorderDump>& dumps) {
  FlightRecorderAnalysis analysis;
  std::map<int32_t, const FlightRecorderDump*> by_rank;
  for (const FlightRecorderDump& d : dumps) by_rank.emplace(d.rank, &d);
  for (const auto& [rank, d] : by_rank) analysis.dumped_ranks.push_back(rank);
  if (!dumps.empty()) analysis.version = dumps.front().version;
  // Groups: (name, sorted ranks) from every rank's pg_config (builder.py
  // build_groups_memberships); the first desc seen wins.
  std::map<GroupKey, std::string> desc_of;
  std::map<std::pair<int32_t, std::string>, GroupKey> group_of;  // (rank, PG name) -> group
  for (const auto& [rank, d] : by_rank) {
    for (const FrGroupConfig& g : d->pg_config) {
      std::vector<int32_t> ranks = g.ranks;
      std::sort(ranks.begin(), ranks.end());
      ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
      GroupKey key{g.name, ranks};
      desc_of.emplace(key, g.desc);
      group_of.emplace(std::make_pair(rank, g.name), key);
    }
  }
  // A PG missing from its rank's pg_config: its members are the ranks whose entries name it.
  std::map<std::string, std::vector<int32_t>> unconfigured;
  for (const auto& [rank, d] : by_rank) {
    for (const FrEntry& e : d->entries) {
      if (group_of.count({rank, e.pg_name})) continue;
      auto& ranks = unconfigured[e.pg_name];
      if (ranks.empty() || ranks.back() != rank) ranks.push_back(rank);
    }
  }
  for (auto& [name, ranks] : unconfigured) {
    GroupKey key{name, ranks};
    for (int32_t r : ranks) group_of.emplace(std::make_pair(r, name), key);
  }
  const std::pair<int, int> version = VersionOf(analysis.version);
  std::map<GroupKey, GroupAnalyzer> analyzers;
  for (const auto& [rank, d] : by_rank) {
    for (const FrEntry& e : d->entries) {
      const GroupKey& key = group_of.at({rank, e.pg_name});
      auto it = analyzers.find(key);
      if (it == analyzers.end()) {
        std::string desc = desc_of.count(key) ? desc_of.at(key) : e.pg_desc;
        it = analyzers.emplace(key, GroupAnalyzer(key, desc, by_rank, version)).first;
      }
      it->second.Add(rank, &e);
    }
  }
  analysis.groups = static_cast<int64_t>(analyzers.size());
  for (const auto& [key, analyzer] : analyzers) analyzer.Run(analysis.hangs);
  std::stable_sort(analysis.hangs.begin(), analysis.hangs.end(), [](const FrHang& a, const FrHang& b) {
    const bool ak = a.waiting_since_ns >= 0, bk = b.waiting_since_ns >= 0;
    if (ak != bk) return ak;
    if (a.waiting_since_ns != b.waiting_since_ns) return a.waiting_since_ns < b.waiting_since_ns;
    if (a.pg_name != b.pg_name) return NameLess(a.pg_name, b.pg_name);
    if (a.p2p != b.p2p) return !a.p2p;
    return a.seq < b.seq;
  });
  return analysis;
}

std::string FlightRecorderText(const FlightRecorderAnalysis& analysis) {
  std::string out = fmt::format("flight-recorder: {} dump(s) (ranks {}), version {}, {} process group(s) with entries\n",
                                analysis.dumped_ranks.size(), CompressRanks(analysis.dumped_ranks),
                                analysis.version.empty() ? "unknown" : analysis.version, analysis.groups);
  if (analysis.hangs.empty()) {
    out += "no hang found: at every sequence number each process group's ranks agree and none is missing\n";
    return out;
  }
  out += fmt::format("{} hang(s), longest waiting first:\n", analysis.hangs.size());
  // Which ranks the hangs wait for, over all groups: the one to look at first.
  std::map<int32_t, int> missing_in;
  for (const FrHang& h : analysis.hangs) {
    for (int32_t r : h.missing_ranks) ++missing_in[r];
  }
  if (!missing_in.empty()) {
    std::vector<std::string> parts;
    for (const auto& [rank, count] : missing_in) parts.push_back(fmt::format("{} (from {} of them)", rank, count));
    out += fmt::format("ranks missing: {}\n", Join(parts, ", "));
  }
  for (size_t i = 0; i < analysis.hangs.size(); ++i) {
    const FrHang& h = analysis.hangs[i];
    out += fmt::format("HANG {}: {}\n", i + 1, h.description);
    out += fmt::format("  process group {}{}, ranks {}, {} {}\n", h.pg_name,
                       h.pg_desc.empty() ? "" : fmt::format(" ({})", h.pg_desc), CompressRanks(h.group_ranks),
                       h.p2p ? "p2p_seq_id" : "collective_seq_id", h.seq);
    out += fmt::format("  {} {} -> {} {}\n", h.collective, FrSizesText(h.input_sizes), FrSizesText(h.output_sizes),
                       h.dtype);
    out += fmt::format("  missing ranks: {}\n", h.missing_ranks.empty() ? "none" : CompressRanks(h.missing_ranks));
    if (!h.no_dump_ranks.empty()) out += fmt::format("  no dump: {}\n", CompressRanks(h.no_dump_ranks));
    if (h.mismatch) out += fmt::format("  mismatch: {} (ranks {})\n", h.mismatch->kind, CompressRanks(h.mismatch->ranks));
    for (const FrRankState& st : h.rank_states) {
      std::string line = fmt::format("    rank {}: ", st.rank);
      switch (st.status) {
        case FrRankStatus::kEntered:
          line += fmt::format("in it, {}, {} -> {} {}", st.entry->state, FrSizesText(st.entry->input_sizes),
                              FrSizesText(st.entry->output_sizes), DtypeText(*st.entry));
          break;
        case FrRankStatus::kNeverEntered:
          line += st.entry ? fmt::format("never entered; its last there is {} {}{} ({})", st.entry->profiling_name,
                                         h.p2p ? "p2p_seq_id " : "#",
                                         h.p2p ? st.entry->p2p_seq_id : st.entry->collective_seq_id, st.entry->state)
                           : fmt::format("never entered; no entry of the group in its buffer and its pg_status "
                                         "says its last enqueued collective there is #{}",
                                         st.last_enqueued);
          break;
        case FrRankStatus::kNoDump:
          line += "no dump";
          break;
        case FrRankStatus::kNotInBuffer:
          line += "not in its buffer (it holds newer entries of the group, or none to decide by)";
          break;
      }
      if (st.status != FrRankStatus::kNoDump && st.last_entry) {
        line += fmt::format("; newest entry {} on {} ({})", st.last_entry->profiling_name, st.last_entry->pg_name,
                            st.last_entry->state);
      }
      out += line + "\n";
    }
  }
  return out;
}

std::string FlightRecorderJsonReport(const FlightRecorderAnalysis& analysis) {
  nlohmann::ordered_json j;
  j["dumps"] = analysis.dumped_ranks.size();
  j["ranks"] = CompressRanks(analysis.dumped_ranks);
  j["version"] = analysis.version;
  j["process_groups"] = analysis.groups;
  nlohmann::ordered_json hangs = nlohmann::ordered_json::array();
  for (const FrHang& h : analysis.hangs) {
    nlohmann::ordered_json x;
    x["process_group"] = h.pg_name;
    x["process_group_desc"] = h.pg_desc;
    x["description"] = h.description;
    x["collective"] = h.collective;
    x["seq"] = h.seq;
    x["seq_kind"] = h.p2p ? "p2p_seq_id" : "collective_seq_id";
    x["sizes"] = SizesJson(h.input_sizes);
    x["output_sizes"] = SizesJson(h.output_sizes);
    x["dtype"] = h.dtype;
    x["group_ranks"] = h.group_ranks;
    x["waiting_ranks"] = h.waiting_ranks;
    x["missing_ranks"] = h.missing_ranks;
    x["no_dump_ranks"] = h.no_dump_ranks;
    x["not_in_buffer_ranks"] = h.not_in_buffer_ranks;
    if (h.mismatch) {
      x["mismatch"] = {{"kind", h.mismatch->kind}, {"ranks", h.mismatch->ranks}, {"text", h.mismatch->text}};
    } else {
      x["mismatch"] = nullptr;
    }
    x["oldest_incomplete_seq"] =
        h.oldest_incomplete_seq >= 0 ? nlohmann::ordered_json(h.oldest_incomplete_seq) : nlohmann::ordered_json();
    x["waiting_since_ns"] = h.waiting_since_ns >= 0 ? nlohmann::ordered_json(h.waiting_since_ns) : nlohmann::ordered_json();
    nlohmann::ordered_json states = nlohmann::ordered_json::array();
    for (const FrRankState& st : h.rank_states) {
      nlohmann::ordered_json s;
      s["rank"] = st.rank;
      s["status"] = StatusName(st.status);
      s["entry"] = st.entry ? EntryJson(*st.entry) : nlohmann::ordered_json();
      s["newest_entry"] = st.last_entry ? EntryJson(*st.last_entry) : nlohmann::ordered_json();
      states.push_back(std::move(s));
    }
    x["rank_states"] = std::move(states);
    hangs.push_back(std::move(x));
  }
  j["hangs"] = std::move(hangs);
  return j.dump(2) + "\n";
}

}  // namespace shardscope::traces

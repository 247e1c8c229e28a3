// The conversion of a finished Chrome-trace event into timeline entries (slices, instants,
// counters, process and thread metadata, flows): the second half of TraceSax (see
// chrome_trace_sax.h).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "chrome_trace_sax.h"

namespace shardscope::traces::trace_internal {

using namespace std::string_view_literals;
using enum Field;

std::optional<int32_t> TraceSax::ToInt32(const RawValue& value) {
  if (value.type != RawValue::Type::kInt || value.integer < std::numeric_limits<int32_t>::min() ||
      value.integer > std::numeric_limits<int32_t>::max()) {
    return std::nullopt;
  }
  return static_cast<int32_t>(value.integer);
}

// pid / tid: an int32, or any other value mapped to a synthetic negative id.
int32_t TraceSax::TrackId(Field field) {
  const std::optional<RawValue>& value = event_.fields[field];
  if (!value || value->type == RawValue::Type::kNull) return 0;
  if (std::optional<int32_t> number = ToInt32(*value)) return *number;
  // The type prefix keeps the string "7" apart from an out-of-range number 7...
  std::string key =
      value->type == RawValue::Type::kString ? "s:" + value->text : "n:" + Describe(*value);
  auto [it, inserted] = synthetic_ids_.try_emplace(
      std::move(key), -static_cast<int32_t>(synthetic_ids_.size()) - 1);
  return it->second;
}

// A required or optional time field, in ns.
bool TraceSax::Time(Field field, bool required, int64_t& out) {
  const std::optional<RawValue>& value = event_.fields[field];
  if (!value) {
    if (required) return Fail(Path(), fmt::format("missing \"{}\"", kFieldKeys[field]));
    out = 0;
    return true;
  }
  std::optional<int64_t> ns;
  if (value->type == RawValue::Type::kInt) {
    int64_t product = 0;
    if (!__builtin_mul_overflow(value->integer, int64_t{1000}, &product)) ns = product;
  } else if (value->type == RawValue::Type::kFloat) {
    ns = DecimalMicrosToNanos(value->text);
  } else {
    return Fail(FieldPath(field),
                fmt::format("expected a number (microseconds), got {}", Describe(*value)));
  }
  if (!ns) {
    return Fail(FieldPath(field),
                fmt::format("{} us does not fit in int64 nanoseconds", Describe(*value)));
  }
  out = *ns;
  return true;
}

// An optional string field ("" when absent).
bool TraceSax::Text(Field field, std::string& out) {
  std::optional<RawValue>& value = event_.fields[field];
  if (!value || value->type == RawValue::Type::kNull) {
    out.clear();
    return true;
  }
  if (value->type != RawValue::Type::kString) {
    return Fail(FieldPath(field), fmt::format("expected a string, got {}", Describe(*value)));
  }
  out = std::move(value->text);
  return true;
}

bool TraceSax::ConvertEvent() {
  const std::optional<RawValue>& ph = event_.fields[kPh];
  if (!ph) return Fail(Path(), "missing \"ph\"");
  if (ph->type != RawValue::Type::kString) {
    return Fail(FieldPath(kPh), fmt::format("expected a string, got {}", Describe(*ph)));
  }
  const std::string& phase = ph->text;
  if (phase == "X"sv) return ConvertSlice();
  if (phase == "i"sv || phase == "I"sv) return ConvertInstant();
  if (phase == "C"sv) return ConvertCounter();
  if (phase == "M"sv) return ConvertMetadata();
  if (phase == "s"sv || phase == "f"sv || phase == "t"sv) return ConvertFlow(phase == "s"sv);
  return true;  // "B"/"E", async and object events: not part of the timeline model
}

bool TraceSax::ConvertSlice() {
  Slice slice;
  slice.pid = TrackId(kPid);
  slice.tid = TrackId(kTid);
  std::string category;
  if (!Time(kTs, true, slice.ts_ns) || !Time(kDur, false, slice.dur_ns) ||
      !Text(kName, slice.name) || !Text(kCat, category)) {
    return false;
  }
  // A span ends after it starts, at a time int64 nanoseconds can hold: every consumer
  // (metrics, diff, step cut) computes ts + dur.
  if (slice.dur_ns < 0) {
    return Fail(FieldPath(kDur), fmt::format("expected a duration >= 0 us, got {}", Describe(*event_.fields[kDur])));
  }
  if (slice.ts_ns > std::numeric_limits<int64_t>::max() - slice.dur_ns) {
    return Fail(FieldPath(kDur), "ts + dur does not fit in int64 nanoseconds");
  }
  slice.category = ParseCategory(category);
  if (slice.category == Category::kOther) slice.raw_category = std::move(category);

  // Pass 1: the keys that decide how others are read.
  auto& args = event_.args;
  std::optional<size_t> op_id_index, collective_index;
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& [key, value] = args[i];
    if (!op_id_index && key == "op id"sv && value.type == RawValue::Type::kInt) op_id_index = i;
    if (!collective_index && key == "Collective name"sv && value.type == RawValue::Type::kString) {
      collective_index = i;
    }
  }
  if (op_id_index) slice.op_id = args[*op_id_index].second.integer;
  if (collective_index) {
    slice.collective.emplace();
    slice.collective->collective_name = args[*collective_index].second.text;
  }
  // Pass 2: consume the known keys (first occurrence, right type), keep the rest in order.
  bool have_correlation = false, have_external_id = false;
  std::array<bool, 7> have_collective_field{};
  for (size_t i = 0; i < args.size(); ++i) {
    auto& [key, value] = args[i];
    if (i == op_id_index || i == collective_index) continue;
    if (ConsumeSliceArg(slice, key, value, have_correlation, have_external_id,
                        have_collective_field)) {
      continue;
    }
    if (auto arg = ToArgValue(std::move(value))) slice.args.push_back(Arg{key, std::move(*arg)});
  }
  timeline_.slices.push_back(std::move(slice));
  return true;
}

// Reads `key` into a field of `slice` if it is one of the keys derived from fields.
bool TraceSax::ConsumeSliceArg(Slice& slice, const std::string& key, RawValue& value,
                            bool& have_correlation, bool& have_external_id,
                            std::array<bool, 7>& have_collective_field) {
  const bool is_int = value.type == RawValue::Type::kInt;
  if (key == "correlation"sv && is_int && !have_correlation) {
    have_correlation = true;
    slice.correlation = value.integer;
    return true;
  }
  // Our writer repeats the op id as "External id"; a PyTorch External id is kept.
  if (key == "External id"sv && is_int && !have_external_id && slice.op_id >= 0 &&
      value.integer == slice.op_id) {
    have_external_id = true;
    return true;
  }
  if (!slice.collective) return false;
  CollectiveInfo& c = *slice.collective;
  const auto take_string = [&](size_t slot, std::string& field) {
    if (have_collective_field[slot] || value.type != RawValue::Type::kString) return false;
    have_collective_field[slot] = true;
    field = std::move(value.text);
    return true;
  };
  const auto take_int64 = [&](size_t slot, int64_t& field) {
    if (have_collective_field[slot] || !is_int) return false;
    have_collective_field[slot] = true;
    field = value.integer;
    return true;
  };
  const auto take_int32 = [&](size_t slot, int32_t& field) {
    std::optional<int32_t> number = ToInt32(value);
    if (have_collective_field[slot] || !number) return false;
    have_collective_field[slot] = true;
    field = *number;
    return true;
  };
  if (key == "Process Group Name"sv) return take_string(0, c.process_group);
  if (key == "dtype"sv) return take_string(1, c.dtype);
  if (key == "In msg nelems"sv) return take_int64(2, c.in_nelems);
  if (key == "Out msg nelems"sv) return take_int64(3, c.out_nelems);
  if (key == "Group size"sv) return take_int32(4, c.group_size);
  if (key == "Seq"sv) return take_int64(5, c.seq);
  if (key == "Rank"sv) return take_int32(6, c.rank);
  return false;
}

bool TraceSax::ConvertInstant() {
  Instant instant;
  instant.pid = TrackId(kPid);
  instant.tid = TrackId(kTid);
  if (!Time(kTs, true, instant.ts_ns) || !Text(kName, instant.name) ||
      !Text(kCat, instant.category)) {
    return false;
  }
  std::string scope;
  if (!Text(kScope, scope)) return false;
  if (scope.size() == 1) instant.scope = scope[0];
  for (auto& [key, value] : event_.args) {
    if (auto arg = ToArgValue(std::move(value)))
      instant.args.push_back(Arg{key, std::move(*arg)});
  }
  timeline_.instants.push_back(std::move(instant));
  return true;
}

bool TraceSax::ConvertCounter() {
  CounterSample sample;
  sample.pid = TrackId(kPid);
  if (!Time(kTs, true, sample.ts_ns) || !Text(kName, sample.name)) return false;
  for (auto& [key, value] : event_.args) {
    if (value.type == RawValue::Type::kInt) {
      sample.values.emplace_back(key, static_cast<double>(value.integer));
    } else if (value.type == RawValue::Type::kFloat) {
      sample.values.emplace_back(key, value.number);
    }
  }
  timeline_.counters.push_back(std::move(sample));
  return true;
}

// process_name and process_sort_index arrive as separate events; both update the same
// ProcessInfo (likewise for threads), created where the first of them appears.
bool TraceSax::ConvertMetadata() {
  std::string name;
  if (!Text(kName, name)) return false;
  const bool process = name == "process_name"sv || name == "process_sort_index"sv;
  const bool thread = name == "thread_name"sv || name == "thread_sort_index"sv;
  if (!process && !thread) return true;  // process_labels, ...: not modelled
  const bool is_name = name == "process_name"sv || name == "thread_name"sv;
  const std::string_view arg_key = is_name ? "name" : "sort_index";
  RawValue* arg = nullptr;
  for (auto& [key, value] : event_.args) {
    if (key == arg_key) {
      arg = &value;
      break;
    }
  }
  const int32_t pid = TrackId(kPid);
  if (process) {
    auto [it, inserted] = process_index_.try_emplace(pid, timeline_.processes.size());
    if (inserted) {
      timeline_.processes.emplace_back();
      timeline_.processes.back().pid = pid;
    }
    return SetMetadata(timeline_.processes[it->second].name,
                       timeline_.processes[it->second].sort_index, is_name, arg);
  }
  const int32_t tid = TrackId(kTid);
  auto [it, inserted] = thread_index_.try_emplace({pid, tid}, timeline_.threads.size());
  if (inserted) {
    timeline_.threads.emplace_back();
    timeline_.threads.back().pid = pid;
    timeline_.threads.back().tid = tid;
  }
  return SetMetadata(timeline_.threads[it->second].name, timeline_.threads[it->second].sort_index,
                     is_name, arg);
}

bool TraceSax::SetMetadata(std::string& name, int32_t& sort_index, bool is_name, RawValue* arg) {
  if (arg == nullptr) return true;
  if (is_name) {
    if (arg->type != RawValue::Type::kString) {
      return Fail(Path() + "/args/name",
                  fmt::format("expected a string, got {}", Describe(*arg)));
    }
    name = std::move(arg->text);
    return true;
  }
  std::optional<int32_t> number = ToInt32(*arg);
  if (!number) {
    return Fail(Path() + "/args/sort_index",
                fmt::format("expected a 32-bit integer, got {}", Describe(*arg)));
  }
  sort_index = *number;
  return true;
}

bool TraceSax::ConvertFlow(bool is_start) {
  const std::optional<RawValue>& id = event_.fields[kId];
  // Chrome also allows string ids; flows are decoration, so those are skipped.
  if (!id || id->type != RawValue::Type::kInt) return true;
  std::string category;
  FlowPoint point;
  point.pid = TrackId(kPid);
  point.tid = TrackId(kTid);
  if (!Time(kTs, true, point.ts_ns) || !Text(kName, point.name) || !Text(kCat, category)) {
    return false;
  }
  auto key = std::make_pair(std::move(category), id->integer);
  auto& partners = is_start ? pending_ends_ : pending_starts_;
  auto it = partners.find(key);
  if (it == partners.end() || it->second.empty()) {
    (is_start ? pending_starts_ : pending_ends_)[std::move(key)].push_back(std::move(point));
    return true;
  }
  FlowPoint partner = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) partners.erase(it);
  const FlowPoint& from = is_start ? point : partner;
  const FlowPoint& to = is_start ? partner : point;
  Flow flow;
  flow.id = key.second;
  flow.category = key.first;
  flow.name = from.name;
  flow.from_pid = from.pid;
  flow.from_tid = from.tid;
  flow.from_ts_ns = from.ts_ns;
  flow.to_pid = to.pid;
  flow.to_tid = to.tid;
  flow.to_ts_ns = to.ts_ns;
  timeline_.flows.push_back(std::move(flow));
  return true;
}

}  // namespace shardscope::traces::trace_internal

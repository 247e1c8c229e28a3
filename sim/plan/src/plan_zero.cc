// The zero: section: DeepSpeed ZeRO stages 1-3 (DeepSpeedZeroConfig's bucket sizes and
// switches, and the legacy behaviours of older DeepSpeed releases).
#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>

#include "plan_parser.h"

namespace shardscope::sim::plan_internal {

Status PlanParser::ReadElementCount(const Entry& entry, std::string_view path, int64_t min,
                                    int64_t* out) const {
  const std::string expected = fmt::format(
      "a whole number of elements in [{}, 2^50] (an integer, or a float such as 5e8)", min);
  if (!entry.value.IsScalar() || IsQuoted(entry.value)) return Error(entry, path, expected);
  std::string_view text = entry.value.Scalar();
  if (text.size() > 1 && text[0] == '+' && text[1] >= '0' && text[1] <= '9') text.remove_prefix(1);
  int64_t integer = 0;
  const auto [iend, iec] = std::from_chars(text.data(), text.data() + text.size(), integer);
  if (iec == std::errc() && iend == text.data() + text.size()) {
    if (integer < min || integer > kMaxZeroElements) return Error(entry, path, expected);
    *out = integer;
    return Status::Ok();
  }
  double value = 0;
  const auto [dend, dec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (dec != std::errc() || dend != text.data() + text.size() || !std::isfinite(value) ||
      value < static_cast<double>(min) || value > static_cast<double>(kMaxZeroElements)) {
    return Error(entry, path, expected);
  }
  if (std::floor(value) != value) {
    return Error(MarkOf(entry), path, expected,
                 fmt::format("{} (not a whole number)", Describe(entry.value)));
  }
  *out = static_cast<int64_t>(value);
  return Status::Ok();
}

Status PlanParser::ReadZero(const Entry* entry, const Plan& plan, ZeroConfig* out) const {
  SHARDSCOPE_ASSIGN_OR_RETURN(Fields fields, SectionFields(entry, "zero", kZeroKeys));
  const bool stage3 = plan.strategy == Strategy::kZero3;
  // DeepSpeedZeroConfig.overlap_comm_valid (deepspeed/runtime/zero/config.py): overlap_comm
  // left unset becomes `stage == ZeroStageEnum.weights`, i.e. true for stage 3 only.
  out->overlap_comm = stage3;
  for (const Entry& e : fields.entries) {
    const std::string path = JoinPath("zero", e.key);
    const std::string_view key = e.key;
    const bool stage3_key =
        key.rfind("stage3_", 0) == 0 || (key.rfind("legacy_", 0) == 0 && key != "legacy_reduce_per_rank");
    // engine._configure_zero_optimizer passes the stage3_* sizes to
    // DeepSpeedZeroOptimizer_Stage3 only and allgather_bucket_size to the stage 1/2
    // DeepSpeedZeroOptimizer only; DeepSpeed ignores them elsewhere, the plan refuses them.
    if (stage3_key && !stage3) {
      return KeyError(e, path,
                      fmt::format("{} only with strategy zero3 (it only applies to ZeRO stage 3)",
                                  key),
                      fmt::format("{} with strategy {}", key, StrategyName(plan.strategy)));
    }
    if (key == "legacy_reduce_per_rank" && stage3) {
      return KeyError(e, path,
                      "legacy_reduce_per_rank only with zero1 or zero2 (the 2021 stage 1/2 "
                      "reduction; stage 3's is legacy_per_parameter_path)",
                      "legacy_reduce_per_rank with strategy zero3");
    }
    if (key == "allgather_bucket_size" && stage3) {
      return KeyError(e, path,
                      "allgather_bucket_size only with zero1 or zero2 (it only applies to ZeRO "
                      "stages 1 and 2; stage 3 fetches parameters by "
                      "stage3_prefetch_bucket_size)",
                      "allgather_bucket_size with strategy zero3");
    }
    // Sizes: pydantic Field(ge=0) in DeepSpeedZeroConfig for every one of them.
    if (key == "reduce_bucket_size") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadElementCount(e, path, 0, &out->reduce_bucket_size));
    } else if (key == "allgather_bucket_size") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadElementCount(e, path, 0, &out->allgather_bucket_size));
    } else if (key == "stage3_prefetch_bucket_size") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadElementCount(e, path, 0, &out->stage3_prefetch_bucket_size));
    } else if (key == "stage3_max_live_parameters") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadElementCount(e, path, 0, &out->stage3_max_live_parameters));
    } else if (key == "stage3_max_reuse_distance") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadElementCount(e, path, 0, &out->stage3_max_reuse_distance));
    } else if (key == "stage3_param_persistence_threshold") {
      SHARDSCOPE_RETURN_IF_ERROR(
          ReadElementCount(e, path, 0, &out->stage3_param_persistence_threshold));
    } else if (key == "overlap_comm") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(e, path, &out->overlap_comm));
    } else if (key == "contiguous_gradients") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(e, path, &out->contiguous_gradients));
    } else if (key == "legacy_prefetch_off_by_one") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(e, path, &out->legacy_prefetch_off_by_one));
    } else if (key == "legacy_stream_sync_in_fetch_release") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(e, path, &out->legacy_stream_sync_in_fetch_release));
    } else if (key == "legacy_debug_norm_sync") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(e, path, &out->legacy_debug_norm_sync));
    } else if (key == "legacy_reduce_per_rank") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(e, path, &out->legacy_reduce_per_rank));
    } else if (key == "legacy_per_parameter_path") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(e, path, &out->legacy_per_parameter_path));
    } else if (key == "zero_init") {
      // deepspeed.zero.Init partitions parameters as modules are built: a stage 3 feature
      // (runtime/zero/partition_parameters.py); stages 1 and 2 keep full parameters.
      if (!stage3) {
        return KeyError(e, path, "zero_init only with strategy zero3 (deepspeed.zero.Init partitions parameters, "
                                 "which only ZeRO stage 3 does)",
                        fmt::format("zero_init with strategy {}", StrategyName(plan.strategy)));
      }
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(e, path, &out->zero_init));
    }
  }
  return Status::Ok();
}

}  // namespace shardscope::sim::plan_internal

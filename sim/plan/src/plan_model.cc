// The model: section: a model preset, a preset with some dimensions or architecture details
// changed, or a model from its dimensions; and the parameter count that keeps the byte
// arithmetic built on it inside int64_t.
#include <fmt/format.h>

#include <string>
#include <string_view>
#include <utility>

#include "plan_parser.h"

namespace shardscope::sim::plan_internal {

Status PlanParser::ReadModel(const Entry& entry, ModelSpec* out) const {
  const std::string presets = JoinNames(ModelPresetNames());
  if (entry.value.IsScalar()) {
    auto preset = FindModelPreset(entry.value.Scalar());
    if (!preset.ok()) {
      return Error(entry, "model", fmt::format("a model preset ({}) or a mapping", presets));
    }
    *out = std::move(preset).value();
    return Status::Ok();
  }
  SHARDSCOPE_ASSIGN_OR_RETURN(Fields fields,
                              ReadMapping(entry.value, MarkOf(entry), "model", kModelKeys));
  ModelSpec model;
  bool from_preset = false;
  if (const Entry* preset_entry = fields.Find("preset"); preset_entry != nullptr) {
    const std::string expected = fmt::format("a model preset ({})", presets);
    std::string name;
    SHARDSCOPE_RETURN_IF_ERROR(ReadString(*preset_entry, "model.preset", expected, &name));
    auto preset = FindModelPreset(name);
    if (!preset.ok()) return Error(*preset_entry, "model.preset", expected);
    model = std::move(preset).value();
    from_preset = true;
  } else {
    // A model from scratch needs its shape; everything else has a default.
    for (std::string_view key : {"layers", "hidden", "heads", "ffn", "vocab"}) {
      SHARDSCOPE_RETURN_IF_ERROR(
          Require(fields, "model", key,
                  "a positive integer (a model without 'preset' must give layers, hidden, "
                  "heads, ffn and vocab)"));
    }
    model.name = "custom";
  }
  bool modified = false;
  SHARDSCOPE_RETURN_IF_ERROR(ReadModelFields(fields, &model, &modified));
  if (!from_preset && fields.Find("kv_heads") == nullptr) model.kv_heads = model.heads;
  // A changed preset must not be reported under the preset's own name.
  if (from_preset && modified && fields.Find("name") == nullptr) model.name += " (modified)";

  if (Status status = ValidateModel(model); !status.ok()) {
    return Status::InvalidInput(
        fmt::format("{}: model: {}", Where(MarkOf(entry)), status.message()));
  }
  // Keeps ParameterCount and the byte arithmetic built on it inside int64_t.
  const double h = static_cast<double>(model.hidden);
  const double per_layer = 4 * h * h + 3 * h * static_cast<double>(model.ffn) * model.experts +
                           h * model.experts + 8 * h;
  const double parameters = model.layers * per_layer + 2 * static_cast<double>(model.vocab) * h +
                            static_cast<double>(model.max_positions) * h;
  if (parameters > kMaxParameters) {
    return Error(MarkOf(entry), "model", "at most 2^50 parameters",
                 fmt::format("about {:.3g} parameters", parameters));
  }
  *out = std::move(model);
  return Status::Ok();
}

Status PlanParser::ReadModelFields(const Fields& fields, ModelSpec* model, bool* modified) const {
  for (const Entry& entry : fields.entries) {
    const std::string path = JoinPath("model", entry.key);
    const std::string_view key = entry.key;
    if (key == "preset") continue;
    if (key != "name") *modified = true;
    if (key == "name") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadString(entry, path, "a non-empty name", &model->name));
    } else if (key == "layers") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadInt32(entry, path, 1, kMaxLayers, &model->layers));
    } else if (key == "hidden") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadInt(entry, path, 1, kMaxHidden, &model->hidden));
    } else if (key == "heads") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadInt32(entry, path, 1, kMaxHeads, &model->heads));
    } else if (key == "kv_heads") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadInt32(entry, path, 1, kMaxHeads, &model->kv_heads));
    } else if (key == "ffn") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadInt(entry, path, 1, kMaxFfn, &model->ffn));
    } else if (key == "vocab") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadInt(entry, path, 1, kMaxVocab, &model->vocab));
    } else if (key == "max_positions") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadInt(entry, path, 0, kMaxPositions, &model->max_positions));
    } else if (key == "learned_positions") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(entry, path, &model->learned_positions));
    } else if (key == "tied_embeddings") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(entry, path, &model->tied_embeddings));
    } else if (key == "bias") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(entry, path, &model->bias));
    } else if (key == "mlp") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadEnum(entry, path, kMlpKinds, &model->mlp));
    } else if (key == "norm") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadEnum(entry, path, kNormKinds, &model->norm));
    } else if (key == "attention") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadEnum(entry, path, kAttentionKinds, &model->attention));
    } else if (key == "experts") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadInt32(entry, path, 1, kMaxExperts, &model->experts));
    } else if (key == "experts_per_token") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadInt32(entry, path, 1, kMaxExperts, &model->experts_per_token));
    } else if (key == "alibi") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(entry, path, &model->alibi));
    } else if (key == "norm_bias") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(entry, path, &model->norm_bias));
    } else if (key == "reserved_position_rows") {
      SHARDSCOPE_RETURN_IF_ERROR(
          ReadInt(entry, path, 0, kMaxPositions, &model->reserved_position_rows));
    } else if (key == "token_types") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadInt(entry, path, 0, kMaxTokenTypes, &model->token_types));
    } else if (key == "embedding_norm") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(entry, path, &model->embedding_norm));
    } else if (key == "post_norm") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(entry, path, &model->post_norm));
    } else if (key == "lm_head_transform") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(entry, path, &model->lm_head_transform));
    } else if (key == "fused_qkv") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadBool(entry, path, &model->fused_qkv));
    } else if (key == "dropout") {
      SHARDSCOPE_RETURN_IF_ERROR(ReadNumber(entry, path, 0, false, kMaxDropout, &model->dropout));
      if (!(model->dropout < 1)) return Error(entry, path, "a dropout probability in [0, 1)");
    }
  }
  return Status::Ok();
}

}  // namespace shardscope::sim::plan_internal

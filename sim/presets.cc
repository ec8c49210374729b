#include "sim/presets.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace entrokv::sim {
namespace {

// Public model cards; `mha-7b` and `mqa-7b` are the r = 1 and G = 1 extremes of a 7B shape.
const std::vector<ModelPreset>& Presets() {
  static const auto* const presets = new std::vector<ModelPreset>{
      {"qwen2.5-1.5b", 28, 12, 2, 128},
      {"llama3.1-8b", 32, 32, 8, 128},
      {"llama3-70b", 80, 64, 8, 128},
      {"mistral-7b", 32, 32, 8, 128},
      {"mha-7b", 32, 32, 32, 128},
      {"mqa-7b", 32, 32, 1, 128},
      {"tiny", 2, 4, 2, 16},
  };
  return *presets;
}

}  // namespace

absl::StatusOr<ModelPreset> FindPreset(absl::string_view name) {
  for (const ModelPreset& preset : Presets()) {
    if (preset.name == name) return preset;
  }
  return absl::NotFoundError(
      absl::StrCat("model: '", name, "' is not one of ", absl::StrJoin(PresetNames(), ", ")));
}

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const ModelPreset& preset : Presets()) names.push_back(preset.name);
  return names;
}

absl::Status ValidatePreset(const ModelPreset& preset) {
  if (preset.layers <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("layers: must be positive, got ", preset.layers));
  }
  if (preset.query_heads <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("query_heads: must be positive, got ", preset.query_heads));
  }
  if (preset.kv_groups <= 0 || preset.query_heads % preset.kv_groups != 0) {
    return absl::InvalidArgumentError(absl::StrCat("kv_groups: ", preset.kv_groups,
                                                   " must be positive and divide query_heads ",
                                                   preset.query_heads));
  }
  if (preset.head_dim < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_dim: must be >= 0, got ", preset.head_dim));
  }
  return absl::OkStatus();
}

}  // namespace entrokv::sim

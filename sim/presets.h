// Model geometries the simulator and the evaluation report know by name.
#ifndef ENTROKV_SIM_PRESETS_H_
#define ENTROKV_SIM_PRESETS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace entrokv::sim {

// The attention geometry of a decoder: query heads are split into kv_groups contiguous groups
// of r = query_heads / kv_groups heads (like repeat_kv).
struct ModelPreset {
  std::string name;
  int layers = 0;
  int query_heads = 0;  // H_Q
  int kv_groups = 0;    // G = H_KV
  int head_dim = 0;

  [[nodiscard]] int group_size() const { return query_heads / kv_groups; }  // r
};

// NOT_FOUND listing the known names.
[[nodiscard]] absl::StatusOr<ModelPreset> FindPreset(absl::string_view name);
// Every preset name, in a stable order.
[[nodiscard]] std::vector<std::string> PresetNames();

// INVALID_ARGUMENT naming the field: non-positive sizes, H_Q not a multiple of G.
[[nodiscard]] absl::Status ValidatePreset(const ModelPreset& preset);

}  // namespace entrokv::sim

#endif  // ENTROKV_SIM_PRESETS_H_

// The budget planner (ARCHITECTURE §3.8): a budget in token slots (tokens x KV heads) becomes
// one page quota K_l per layer, shared by every group of that layer, by largest remainder.
#ifndef ENTROKV_CORE_SCORING_BUDGET_H_
#define ENTROKV_CORE_SCORING_BUDGET_H_

#include <cstdint>
#include <optional>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace entrokv {

enum class LayerAllocator : uint8_t {
  kUniform,  // every layer the same share
  kPyramid,  // linearly more pages in lower layers (PyramidKV's shape)
};
[[nodiscard]] absl::StatusOr<LayerAllocator> ParseLayerAllocator(absl::string_view name);

struct BudgetRequest {
  int layers = 0;
  int kv_groups = 0;
  int page_size = 16;
  int64_t tokens = 0;  // sequence length T; needed for `fraction`
  // Exactly one of the two.
  std::optional<int64_t> token_slots;  // S: tokens x KV heads over the whole model
  std::optional<double> fraction;      // F: share of the sequence, P = floor(F * T * L / B)
  LayerAllocator allocator = LayerAllocator::kUniform;
};

struct BudgetPlan {
  std::vector<int64_t> pages_per_layer;  // K_l, the quota of every group of layer l
  int64_t layer_pages = 0;               // P = sum_l K_l
  int64_t planned_slots = 0;             // P * G * B
  int64_t residual_slots = 0;            // asked for but not page-aligned, < G * B for slots
};

// INVALID_ARGUMENT when the geometry is not positive, both or neither of token_slots and
// fraction are given, or the budget is below one page per layer.
[[nodiscard]] absl::StatusOr<BudgetPlan> PlanBudget(const BudgetRequest& request);

}  // namespace entrokv

#endif  // ENTROKV_CORE_SCORING_BUDGET_H_

// The budget planner (docs/architecture.md §3.8): a budget in token slots (tokens x KV heads)
// becomes one page quota K_l per layer, shared by every group of that layer, by largest remainder.
#ifndef ENTROKV_CORE_SCORING_BUDGET_H_
#define ENTROKV_CORE_SCORING_BUDGET_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace entrokv {

enum class LayerAllocator : uint8_t {
  kUniform,  // every layer the same share
  kPyramid,  // linearly more pages in lower layers (PyramidKV's shape)
  // Planned as uniform; the decision then moves the layers' pages to where they keep the most
  // of each group's score mass (layer_quotas.h), the same total.
  kMass,
};
[[nodiscard]] absl::StatusOr<LayerAllocator> ParseLayerAllocator(absl::string_view name);

// The ranges PlanBudget accepts (INVALID_ARGUMENT naming the field beyond them): wide enough
// for any model, narrow enough that no arithmetic of the plan can overflow.
inline constexpr int64_t kMaxBudgetLayers = int64_t{1} << 16;
inline constexpr int64_t kMaxBudgetGroups = int64_t{1} << 16;
inline constexpr int64_t kMaxBudgetPageSize = int64_t{1} << 20;
inline constexpr int64_t kMaxBudgetTokens = int64_t{1} << 40;
inline constexpr int64_t kMaxBudgetTokenSlots = int64_t{1} << 62;

struct BudgetRequest {
  int layers = 0;
  int kv_groups = 0;
  int page_size = 16;
  // Sequence length T: needed for `fraction`; when > 0 it also caps every K_l at n = ceil(T/B).
  int64_t tokens = 0;
  // Exactly one of the two.
  std::optional<int64_t> token_slots;  // S: tokens x KV heads over the whole model
  // F: share of the sequence, P = floor(F * T * L / B), computed exactly for F read as the
  // shortest decimal that gives the same double (0.03 is 3/100), at most 18 places.
  std::optional<double> fraction;
  LayerAllocator allocator = LayerAllocator::kUniform;
};

// A budget of the share `fraction` of a sequence of `tokens` tokens, for a model of `layers`
// layers and `kv_groups` KV heads in pages of `page_size` tokens (the uniform allocator).
[[nodiscard]] BudgetRequest FractionBudget(int layers, int kv_groups, int page_size, int64_t tokens,
                                           double fraction);
// The same model and sequence with a budget of `token_slots` token slots.
[[nodiscard]] BudgetRequest TokenSlotBudget(int layers, int kv_groups, int page_size,
                                            int64_t tokens, int64_t token_slots);

// A budget fraction is in (0, 1]: INVALID_ARGUMENT "<field>: must be in (0, 1], got F" (NaN
// included) otherwise. PlanBudget checks it; callers that take a fraction from their own input
// check it with this too, so every path refuses the same values.
[[nodiscard]] absl::Status ValidateBudgetFraction(absl::string_view field, double fraction);

struct BudgetPlan {
  std::vector<int64_t> pages_per_layer;  // K_l, the quota of every group of layer l, <= n
  int64_t layer_pages = 0;               // sum_l K_l: the P the budget buys, or L * n if less
  int64_t planned_slots = 0;             // layer_pages * G * B, the slots the plan keeps
  // Asked for but not planned: < G * B (not page-aligned) unless the budget exceeds the
  // sequence (P > L * n: every layer keeps its n pages and the rest is reported here).
  int64_t residual_slots = 0;
};

// Spreads P over the layers by largest remainder in exact integer arithmetic, at least one page
// and (when `tokens` is known) at most n pages per layer: a layer whose share exceeds n gets n
// and the excess goes to the others by the same rule, so sum_l K_l == P whenever P <= L * n.
// INVALID_ARGUMENT naming the field when the geometry is not positive or beyond the kMaxBudget
// ranges, both or neither of token_slots and fraction are given, or the budget is below one page
// per layer.
[[nodiscard]] absl::StatusOr<BudgetPlan> PlanBudget(const BudgetRequest& request);

}  // namespace entrokv

#endif  // ENTROKV_CORE_SCORING_BUDGET_H_

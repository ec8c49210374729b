#include "core/scoring/budget.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace entrokv {
namespace {

// Hamilton's method: floors of the exact shares, then +1 to the largest remainders, ties to
// the lower layer. `shares` sum to `seats` (up to rounding).
std::vector<int64_t> LargestRemainder(const std::vector<double>& shares, int64_t seats) {
  std::vector<int64_t> quotas(shares.size());
  std::vector<double> remainders(shares.size());
  int64_t given = 0;
  for (size_t l = 0; l < shares.size(); ++l) {
    quotas[l] = static_cast<int64_t>(std::floor(shares[l]));
    remainders[l] = shares[l] - static_cast<double>(quotas[l]);
    given += quotas[l];
  }
  std::vector<size_t> order(shares.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return remainders[a] > remainders[b]; });
  for (size_t i = 0; given < seats; i = (i + 1) % order.size(), ++given) ++quotas[order[i]];
  return quotas;
}

}  // namespace

absl::StatusOr<LayerAllocator> ParseLayerAllocator(absl::string_view name) {
  if (name == "uniform") return LayerAllocator::kUniform;
  if (name == "pyramid") return LayerAllocator::kPyramid;
  return absl::InvalidArgumentError(
      absl::StrCat("allocator: '", name, "' is not one of uniform, pyramid"));
}

absl::StatusOr<BudgetPlan> PlanBudget(const BudgetRequest& request) {
  if (request.layers <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("layers: must be positive, got ", request.layers));
  }
  if (request.kv_groups <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_groups: must be positive, got ", request.kv_groups));
  }
  if (request.page_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size: must be positive, got ", request.page_size));
  }
  if (request.token_slots.has_value() == request.fraction.has_value()) {
    return absl::InvalidArgumentError("budget: give exactly one of token_slots and fraction");
  }
  const int64_t slots_per_layer_page = static_cast<int64_t>(request.kv_groups) * request.page_size;
  int64_t layer_pages;
  double asked_slots;
  if (request.token_slots.has_value()) {
    if (*request.token_slots < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("token_slots: must be >= 0, got ", *request.token_slots));
    }
    layer_pages = *request.token_slots / slots_per_layer_page;
    asked_slots = static_cast<double>(*request.token_slots);
  } else {
    const double fraction = *request.fraction;
    if (!(fraction > 0.0 && fraction <= 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("fraction: must be in (0, 1], got ", fraction));
    }
    if (request.tokens <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokens: must be positive with a fraction budget, got ", request.tokens));
    }
    const double exact_pages =
        fraction * static_cast<double>(request.tokens) * request.layers / request.page_size;
    layer_pages = static_cast<int64_t>(std::floor(exact_pages));
    asked_slots = exact_pages * static_cast<double>(slots_per_layer_page);
  }
  if (layer_pages < request.layers) {
    return absl::InvalidArgumentError(absl::StrCat("budget: ", layer_pages,
                                                   " layer-pages is below one page per layer (",
                                                   request.layers, "); raise the budget"));
  }

  // One page per layer first (the floor every cell needs), the rest by the allocator's shares.
  const int64_t spare = layer_pages - request.layers;
  std::vector<double> weights(static_cast<size_t>(request.layers), 1.0);
  if (request.allocator == LayerAllocator::kPyramid) {
    for (int l = 0; l < request.layers; ++l) weights[static_cast<size_t>(l)] = request.layers - l;
  }
  const double weight_sum = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::vector<double> shares(weights.size());
  for (size_t l = 0; l < weights.size(); ++l) {
    shares[l] = static_cast<double>(spare) * weights[l] / weight_sum;
  }
  BudgetPlan plan;
  plan.pages_per_layer = LargestRemainder(shares, spare);
  for (int64_t& quota : plan.pages_per_layer) ++quota;
  plan.layer_pages = layer_pages;
  plan.planned_slots = layer_pages * slots_per_layer_page;
  plan.residual_slots = static_cast<int64_t>(std::llround(asked_slots)) - plan.planned_slots;
  return plan;
}

}  // namespace entrokv

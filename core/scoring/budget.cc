#include "core/scoring/budget.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "core/scoring/pages.h"

namespace entrokv {
namespace {

using Wide = __int128;

// A fraction as the decimal it was written as: F = numerator / 10^decimals, from the shortest
// decimal that reads back as the same double (so `0.03` is 3 / 100, not the double's binary
// value 0.0299999...). Fails when that decimal needs more than 18 places.
struct DecimalFraction {
  int64_t numerator = 0;
  int64_t denominator = 1;  // 10^decimals
};

bool ToDecimal(double fraction, DecimalFraction* decimal) {
  char text[64];
  const auto [end, error] =
      std::to_chars(text, text + sizeof(text), fraction, std::chars_format::fixed);
  if (error != std::errc()) return false;
  const std::string_view digits(text, static_cast<size_t>(end - text));
  const size_t point = digits.find('.');
  const std::string_view places =
      point == std::string_view::npos ? std::string_view() : digits.substr(point + 1);
  if (places.size() > 18) return false;
  int64_t numerator = 0;
  int64_t denominator = 1;
  for (const char c : digits) {
    if (c == '.') continue;
    numerator = numerator * 10 + (c - '0');  // F <= 1 and <= 18 places: below 2^63
  }
  for (size_t i = 0; i < places.size(); ++i) denominator *= 10;
  decimal->numerator = numerator;
  decimal->denominator = denominator;
  return true;
}

// Hamilton's method with caps, in exact integer arithmetic: `seats` spread over the layers in
// proportion to `weights` (positive integers), each layer getting at most caps[l]. A layer whose
// exact share exceeds its cap gets the cap and leaves; the others share what remains, again in
// proportion to their weights, until every share fits. Then floors, and +1 to the largest
// remainders, ties to the lower layer (a +1 never passes a cap: a layer whose share fits its cap
// with a remainder has floor < cap). When the caps sum to less than `seats`, every layer gets its
// cap and the rest is not given.
std::vector<int64_t> LargestRemainder(const std::vector<int64_t>& weights,
                                      const std::vector<int64_t>& caps, int64_t seats) {
  const size_t layers = weights.size();
  std::vector<int64_t> quotas(layers, 0);
  std::vector<bool> capped(layers, false);
  Wide left = seats;
  for (;;) {
    Wide weight_sum = 0;
    for (size_t l = 0; l < layers; ++l) {
      if (!capped[l]) weight_sum += weights[l];
    }
    if (weight_sum == 0 || left == 0) return quotas;
    bool capped_any = false;
    for (size_t l = 0; l < layers; ++l) {
      // share = left * w / W > cap, exactly.
      if (!capped[l] && left * weights[l] > Wide{caps[l]} * weight_sum) {
        capped[l] = true;
        quotas[l] = caps[l];
        left -= caps[l];
        capped_any = true;
      }
    }
    if (capped_any) continue;
    std::vector<Wide> remainders(layers, -1);
    Wide given = 0;
    for (size_t l = 0; l < layers; ++l) {
      if (capped[l]) continue;
      const Wide share = left * weights[l];
      quotas[l] = static_cast<int64_t>(share / weight_sum);
      remainders[l] = share % weight_sum;
      given += quotas[l];
    }
    std::vector<size_t> order(layers);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return remainders[a] > remainders[b]; });
    for (size_t i = 0; given < left; ++i, ++given) ++quotas[order[i]];
    return quotas;
  }
}

absl::Status CheckRange(absl::string_view field, int64_t value, int64_t low, int64_t high) {
  if (value < low || value > high) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": must be in [", low, ", ", high, "], got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

BudgetRequest FractionBudget(int layers, int kv_groups, int page_size, int64_t tokens,
                             double fraction) {
  BudgetRequest request;
  request.layers = layers;
  request.kv_groups = kv_groups;
  request.page_size = page_size;
  request.tokens = tokens;
  request.fraction = fraction;
  return request;
}

BudgetRequest TokenSlotBudget(int layers, int kv_groups, int page_size, int64_t tokens,
                              int64_t token_slots) {
  BudgetRequest request;
  request.layers = layers;
  request.kv_groups = kv_groups;
  request.page_size = page_size;
  request.tokens = tokens;
  request.token_slots = token_slots;
  return request;
}

absl::Status ValidateBudgetFraction(absl::string_view field, double fraction) {
  if (fraction > 0.0 && fraction <= 1.0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": must be in (0, 1], got ", fraction));
}

absl::StatusOr<LayerAllocator> ParseLayerAllocator(absl::string_view name) {
  if (name == "uniform") return LayerAllocator::kUniform;
  if (name == "pyramid") return LayerAllocator::kPyramid;
  if (name == "mass") return LayerAllocator::kMass;
  return absl::InvalidArgumentError(
      absl::StrCat("allocator: '", name, "' is not one of uniform, pyramid, mass"));
}

absl::StatusOr<BudgetPlan> PlanBudget(const BudgetRequest& request) {
  // The ranges keep every product below in 128-bit integers and every result in int64.
  if (absl::Status s = CheckRange("layers", request.layers, 1, kMaxBudgetLayers); !s.ok()) return s;
  if (absl::Status s = CheckRange("kv_groups", request.kv_groups, 1, kMaxBudgetGroups); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckRange("page_size", request.page_size, 1, kMaxBudgetPageSize); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckRange("tokens", request.tokens, 0, kMaxBudgetTokens); !s.ok()) return s;
  if (request.token_slots.has_value() == request.fraction.has_value()) {
    return absl::InvalidArgumentError("budget: give exactly one of token_slots and fraction");
  }
  const int64_t slots_per_layer_page = static_cast<int64_t>(request.kv_groups) * request.page_size;
  int64_t layer_pages;
  Wide asked_slots;  // rounded to the nearest slot
  if (request.token_slots.has_value()) {
    if (absl::Status s = CheckRange("token_slots", *request.token_slots, 0, kMaxBudgetTokenSlots);
        !s.ok()) {
      return s;
    }
    layer_pages = *request.token_slots / slots_per_layer_page;
    asked_slots = *request.token_slots;
  } else {
    const double fraction = *request.fraction;
    if (absl::Status s = ValidateBudgetFraction("fraction", fraction); !s.ok()) return s;
    if (request.tokens <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokens: must be positive with a fraction budget, got ", request.tokens));
    }
    DecimalFraction decimal;
    if (!ToDecimal(fraction, &decimal)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fraction: ", fraction, " needs more than 18 decimal places; give a shorter decimal"));
    }
    // P = floor(F * T * L / B) and the slots F * T * L * G, exactly.
    const Wide sequence_slots = Wide{request.tokens} * request.layers * decimal.numerator;
    const Wide denominator = Wide{decimal.denominator} * request.page_size;
    layer_pages = static_cast<int64_t>(sequence_slots / denominator);
    const Wide rest = sequence_slots % denominator * slots_per_layer_page;  // < 2^(60+16+20)
    asked_slots =
        Wide{layer_pages} * slots_per_layer_page + (2 * rest + denominator) / (2 * denominator);
    // The plan's slots are int64: a fraction budget is bounded as a token_slots one is.
    if (asked_slots > kMaxBudgetTokenSlots) {
      return absl::InvalidArgumentError(
          absl::StrCat("fraction: ", fraction, " of tokens ", request.tokens, " x layers ",
                       request.layers, " x kv_groups ", request.kv_groups, " is more than ",
                       kMaxBudgetTokenSlots, " token slots"));
    }
  }
  if (layer_pages < request.layers) {
    return absl::InvalidArgumentError(absl::StrCat("budget: ", layer_pages,
                                                   " layer-pages is below one page per layer (",
                                                   request.layers, "); raise the budget"));
  }

  // One page per layer first (the floor every cell needs), the rest by the allocator's shares,
  // none above the n pages a layer has (when the sequence length is known).
  const auto layers = static_cast<size_t>(request.layers);
  std::vector<int64_t> weights(layers, 1);
  if (request.allocator == LayerAllocator::kPyramid) {
    for (size_t l = 0; l < layers; ++l) weights[l] = request.layers - static_cast<int64_t>(l);
  }
  const int64_t pages =
      request.tokens > 0 ? PageCount(request.tokens, request.page_size) : kMaxBudgetTokenSlots;
  const std::vector<int64_t> caps(layers, pages - 1);
  BudgetPlan plan;
  plan.pages_per_layer = LargestRemainder(weights, caps, layer_pages - request.layers);
  for (int64_t& quota : plan.pages_per_layer) ++quota;
  plan.layer_pages =
      std::accumulate(plan.pages_per_layer.begin(), plan.pages_per_layer.end(), int64_t{0});
  plan.planned_slots = plan.layer_pages * slots_per_layer_page;
  plan.residual_slots = static_cast<int64_t>(asked_slots - plan.planned_slots);
  return plan;
}

}  // namespace entrokv

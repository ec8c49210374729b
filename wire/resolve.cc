#include "wire/resolve.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/pool/geometry_bounds.h"
#include "core/pool/pressure.h"
#include "core/scoring/budget.h"
#include "core/scoring/layer_quotas.h"
#include "core/util/page_count.h"
#include "core/util/status_macros.h"
#include "wire/checks.h"
#include "wire/convert.h"

namespace entrokv::wire {

absl::StatusOr<CacheOptions> ResolvePool(const v1::RegisterModelRequest& request,
                                         const Defaults& defaults) {
  RETURN_IF_ERROR(ValidateId("model_id", request.model_id()));
  if (!request.has_geometry()) return InvalidField("geometry", "must be set");
  CacheOptions options;
  options.limits = defaults.limits;
  options.geometry = ToGeometry(request.geometry());
  RETURN_IF_ERROR(ValidateGeometry(options.geometry));
  RETURN_IF_ERROR(ValidateGeometryBounds(options.geometry));
  if (request.frame_layout() == v1::FRAME_LAYOUT_UNSPECIFIED) {
    options.layout = defaults.frame_layout;
  } else {
    ASSIGN_OR_RETURN(options.layout, ToFrameLayout("frame_layout", request.frame_layout()));
  }
  if (request.backend() == v1::BACKEND_UNSPECIFIED) {
    options.backend = defaults.backend;
  } else {
    ASSIGN_OR_RETURN(options.backend, ToBackend("backend", request.backend()));
  }
  constexpr int kMaxRanks = 64;
  const int ranks = request.tensor_parallel_size() == 0 ? 1 : request.tensor_parallel_size();
  if (ranks < 1 || ranks > kMaxRanks) {
    return InvalidField("tensor_parallel_size",
                        absl::StrCat("must be in [1, ", kMaxRanks, "], got ", ranks));
  }
  if (request.devices().empty()) {
    options.devices.resize(static_cast<size_t>(ranks));
    for (int rank = 0; rank < ranks; ++rank) options.devices[static_cast<size_t>(rank)] = rank;
  } else if (request.devices_size() != ranks) {
    return InvalidField("devices", absl::StrCat(request.devices_size(), " devices for ", ranks,
                                                " ranks (tensor_parallel_size): one per rank"));
  } else {
    options.devices.assign(request.devices().begin(), request.devices().end());
  }
  RETURN_IF_ERROR(CheckRanks(options.geometry, options.devices));
  if (options.backend == Backend::kHost) {
    for (int rank = 0; rank < ranks; ++rank) {
      const int device = options.devices[static_cast<size_t>(rank)];
      if (device >= defaults.host_devices) {
        return InvalidField(
            absl::StrCat("devices[", rank, "]"),
            absl::StrCat("device ", device, " does not exist: host arenas stand in for ",
                         defaults.host_devices, " device", defaults.host_devices == 1 ? "" : "s",
                         " (--host_devices)"));
      }
    }
  }
  const uint64_t asked = request.capacity_bytes() == 0
                             ? static_cast<uint64_t>(defaults.pool_capacity_bytes)
                             : request.capacity_bytes();
  if (asked > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return InvalidField("capacity_bytes", "too large");
  }
  const int64_t frame_bytes = FrameBytes(options.geometry, options.layout);
  // Reserve whole frames only, so the daemon's capacity accounting matches the arena.
  options.capacity_bytes = static_cast<int64_t>(asked) / frame_bytes * frame_bytes;
  if (options.capacity_bytes == 0) {
    return InvalidField("capacity_bytes",
                        absl::StrCat(asked, " bytes hold no frame of ", frame_bytes, " bytes"));
  }
  options.name = request.model_id();
  return options;
}

absl::StatusOr<ResolvedPolicy> ResolvePolicy(const v1::PolicyParams& params,
                                             const Defaults& defaults, int page_size) {
  ResolvedPolicy resolved;
  const std::string& name = params.name().empty() ? defaults.policy : params.name();
  absl::StatusOr<const Policy*> policy = FindPolicy(name);
  if (!policy.ok()) {
    return InvalidField("policy.name", absl::StrCat("'", EchoInput(name), "' is not one of ",
                                                    absl::StrJoin(PolicyNames(), ", ")));
  }
  resolved.policy = *policy;
  resolved.options = defaults.policy_options;
  resolved.options.page_size = page_size;
  if (params.has_tau()) {
    if (!(params.tau() > 0) || !std::isfinite(params.tau())) {
      return InvalidField("policy.tau", absl::StrCat("must be finite and > 0, got ", params.tau()));
    }
    resolved.options.tau = params.tau();
  }
  if (params.has_alpha()) {
    if (!(params.alpha() > 0)) {
      return InvalidField("policy.alpha", absl::StrCat("must be > 0, got ", params.alpha()));
    }
    resolved.options.alpha = params.alpha();
  }
  if (params.has_sink_tokens()) {
    if (params.sink_tokens() < 0) {
      return InvalidField("policy.sink_tokens",
                          absl::StrCat("must be >= 0, got ", params.sink_tokens()));
    }
    resolved.options.sink_tokens = params.sink_tokens();
  }
  if (params.has_protect_tail_page()) {
    resolved.options.protections.tail_page = params.protect_tail_page();
  }
  if (params.has_protect_sink_pages()) {
    resolved.options.protections.sink_pages = params.protect_sink_pages();
  }
  if (params.has_protect_recent_pages()) {
    if (params.protect_recent_pages() < 0) {
      return InvalidField("policy.protect_recent_pages",
                          absl::StrCat("must be >= 0, got ", params.protect_recent_pages()));
    }
    resolved.options.protections.recent_pages = params.protect_recent_pages();
  }
  if (params.has_neighbourhood_kernel()) {
    RETURN_IF_ERROR(
        ValidateNeighbourhoodKernel("policy.neighbourhood_kernel", params.neighbourhood_kernel()));
    resolved.options.neighbourhood_kernel = params.neighbourhood_kernel();
  }
  switch (params.neighbourhood_pooling()) {
    case v1::NEIGHBOURHOOD_POOLING_UNSPECIFIED:
      break;
    case v1::NEIGHBOURHOOD_POOLING_MAX:
      resolved.options.neighbourhood = NeighbourhoodKind::kMax;
      break;
    case v1::NEIGHBOURHOOD_POOLING_MEAN:
      resolved.options.neighbourhood = NeighbourhoodKind::kMean;
      break;
    default:
      return InvalidField("policy.neighbourhood_pooling",
                          absl::StrCat("unknown value ", params.neighbourhood_pooling()));
  }
  if (params.has_group_floor()) {
    RETURN_IF_ERROR(ValidateGroupFloor("policy.group_floor", params.group_floor()));
    resolved.options.group_floor = params.group_floor();
  }
  RETURN_IF_ERROR(Annotate(ValidatePolicyOptions(resolved.options), "policy"));
  return resolved;
}

absl::StatusOr<SelectionScope> ResolveScope(v1::SelectionScope scope, const Defaults& defaults,
                                            FrameLayout layout) {
  if (scope != v1::SELECTION_SCOPE_UNSPECIFIED) return ToSelectionScope("policy.scope", scope);
  if (defaults.selection_scope.has_value()) return *defaults.selection_scope;
  return layout == FrameLayout::kLayer ? SelectionScope::kLayer : SelectionScope::kGroup;
}

absl::StatusOr<ResolvedBudget> ResolveBudget(const v1::Budget& budget, bool has_budget,
                                             const ModelGeometry& geometry, int64_t tokens) {
  if (!has_budget || budget.kind_case() == v1::Budget::KIND_NOT_SET) {
    return InvalidField("budget",
                        "one of pages_per_group, fraction, token_slots, auto_budget must be set");
  }
  const bool planned =
      budget.kind_case() == v1::Budget::kFraction || budget.kind_case() == v1::Budget::kTokenSlots;
  LayerAllocator allocator = LayerAllocator::kUniform;
  if (!budget.allocator().empty()) {
    if (!planned) {
      return InvalidField("budget.allocator",
                          "only with fraction or token_slots (it spreads them over the layers)");
    }
    // Parsed as echoed: a name cut by EchoInput is never an allocator's, and the message then
    // repeats at most kMaxEchoedChars of it.
    absl::StatusOr<LayerAllocator> parsed = ParseLayerAllocator(EchoInput(budget.allocator()));
    if (!parsed.ok()) return InvalidField("budget.allocator", parsed.status().message());
    allocator = *parsed;
  }
  if (budget.has_layer_floor()) {
    RETURN_IF_ERROR(ValidateLayerFloor("budget.layer_floor", budget.layer_floor()));
    if (allocator != LayerAllocator::kMass) {
      return InvalidField("budget.layer_floor", "only with allocator \"mass\"");
    }
  }
  ResolvedBudget resolved;
  if (budget.kind_case() == v1::Budget::kAutoBudget) {
    RETURN_IF_ERROR(
        ValidateFloor("budget.auto_budget.floor_fraction", budget.auto_budget().floor_fraction()));
    // Every page is a candidate: the scorer ranks them all, the pool's quota decides.
    resolved.pages_per_layer.assign(geometry.layers,
                                    std::max<int64_t>(1, PageCount(tokens, geometry.page_size)));
    resolved.auto_floor = budget.auto_budget().floor_fraction();
    return resolved;
  }
  if (budget.kind_case() == v1::Budget::kPagesPerGroup) {
    if (budget.pages_per_group() < 1) {
      return InvalidField("budget.pages_per_group",
                          absl::StrCat("must be >= 1, got ", budget.pages_per_group()));
    }
    resolved.pages_per_layer.assign(geometry.layers, budget.pages_per_group());
    return resolved;
  }
  BudgetRequest request;
  if (budget.kind_case() == v1::Budget::kFraction) {
    RETURN_IF_ERROR(ValidateBudgetFraction("budget.fraction", budget.fraction()));
    request = FractionBudget(geometry.layers, geometry.kv_groups, geometry.page_size, tokens,
                             budget.fraction());
  } else {
    if (budget.token_slots() < 1) {
      return InvalidField("budget.token_slots",
                          absl::StrCat("must be >= 1, got ", budget.token_slots()));
    }
    request = TokenSlotBudget(geometry.layers, geometry.kv_groups, geometry.page_size, tokens,
                              budget.token_slots());
  }
  request.allocator = allocator;
  absl::StatusOr<BudgetPlan> plan = PlanBudget(request);
  if (!plan.ok()) return Annotate(plan.status(), "budget");
  resolved.pages_per_layer = std::move(plan->pages_per_layer);
  if (allocator == LayerAllocator::kMass) {
    resolved.mass_floor = budget.has_layer_floor() ? budget.layer_floor() : kDefaultLayerFloor;
  }
  return resolved;
}

}  // namespace entrokv::wire

// Request resolution: what a request asks for, with the daemon's defaults filled in where it
// leaves a field unset, as the core takes it. Checked before any state changes; every error is
// INVALID_ARGUMENT naming the offending field (checks.h).
#ifndef ENTROKV_WIRE_RESOLVE_H_
#define ENTROKV_WIRE_RESOLVE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/pool/cache_state.h"
#include "core/pool/geometry.h"
#include "core/scoring/layer_scope.h"
#include "core/scoring/policy.h"
#include "entrokv/v1/cache_manager.pb.h"

namespace entrokv::wire {

// What a request falls back on where it leaves a field unset. entrokvd fills every field from
// its flags, once, at start-up (service::WireDefaults, service/options.h).
struct Defaults {
  std::string policy;            // a request naming no policy gets this one
  PolicyOptions policy_options;  // its parameters; page_size is the pool's, set per request
  // The scope of a request that leaves it unspecified; nullopt ("auto"): the pool's frame layout
  // decides (layer scope for a LAYER-layout pool, group scope otherwise).
  std::optional<SelectionScope> selection_scope;
  FrameLayout frame_layout = FrameLayout::kGroup;  // of a RegisterModel leaving it unspecified
  Backend backend = Backend::kHost;                // likewise
  int64_t pool_capacity_bytes = 0;                 // of a RegisterModel asking for 0 bytes
  int host_devices = 1;  // the devices host arenas stand in for: a device number is below it
  CacheLimits limits;    // the bookkeeping bounds of every model
};

// The pool a RegisterModel asks for: model_id, geometry (ValidateGeometry and the bookkeeping
// bounds of core/pool/geometry_bounds.h), layout, backend, the ranks and their devices
// (CheckRanks; a host device below host_devices; a cuda device is checked when its arena is
// made), and the capacity rounded down to whole frames; the defaults and limits filled in.
[[nodiscard]] absl::StatusOr<CacheOptions> ResolvePool(const v1::RegisterModelRequest& request,
                                                       const Defaults& defaults);

// The policy and its options for one request: the defaults overridden by `params`, on a pool
// of `page_size`. Fields named "policy.<name>".
struct ResolvedPolicy {
  const Policy* policy = nullptr;
  PolicyOptions options;
};
[[nodiscard]] absl::StatusOr<ResolvedPolicy> ResolvePolicy(const v1::PolicyParams& params,
                                                           const Defaults& defaults, int page_size);

// The scope of one decision: `scope` when set, else defaults.selection_scope, else the pool's
// own (layer for the LAYER layout, group otherwise). INVALID_ARGUMENT naming policy.scope for a
// value the contract does not define.
[[nodiscard]] absl::StatusOr<SelectionScope> ResolveScope(v1::SelectionScope scope,
                                                          const Defaults& defaults,
                                                          FrameLayout layout);

// Page quotas for every layer of a model, for a sequence of `tokens` tokens: pages_per_group
// as given, a fraction or token_slots planned by the core's PlanBudget. Fields named
// "budget.<name>".
struct ResolvedBudget {
  std::vector<int64_t> pages_per_layer;  // K_l, indexed by layer (every page for auto_budget)
  // budget.auto_budget: the daemon chooses (pool pressure), with this floor.
  std::optional<double> auto_floor;
  // allocator "mass": the decision moves pages_per_layer's pages between the layers it decides,
  // each keeping at least this share of their mean (budget.layer_floor, default 0.5).
  std::optional<double> mass_floor;
};
[[nodiscard]] absl::StatusOr<ResolvedBudget> ResolveBudget(const v1::Budget& budget,
                                                           bool has_budget,
                                                           const ModelGeometry& geometry,
                                                           int64_t tokens);

}  // namespace entrokv::wire

#endif  // ENTROKV_WIRE_RESOLVE_H_

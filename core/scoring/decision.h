// One layer's eviction decision: validate, run the policy on every group, measure it.
#ifndef ENTROKV_CORE_SCORING_DECISION_H_
#define ENTROKV_CORE_SCORING_DECISION_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "core/scoring/layer_scope.h"
#include "core/scoring/policy.h"
#include "core/scoring/statistic.h"

namespace entrokv {

struct LayerRequest {
  std::optional<StatisticView> statistic;  // [H_Q, T]; may be absent for streaming
  int query_heads = 0;                     // H_Q
  int kv_groups = 0;                       // G; H_Q % G == 0
  int64_t tokens = 0;                      // T; must equal the statistic's
  int64_t quota_pages = 0;                 // K per group, >= 1; K > n keeps every page
  std::span<const double> cached_weights;  // H_Q weights from prefill, or empty
  // The pages each group still holds, 1 = held, for decisions after earlier evictions: empty
  // (every page held), n entries (shared by every group) or G * n (group-major). Evicted pages
  // are never kept; each group keeps exactly min(K, its live pages), protections included. In
  // layer scope the candidates are the pages every group still holds.
  std::span<const uint8_t> live_pages;
  bool measure = true;  // compute the shadow UOR, disagreement, mass
  // Fill GroupDecision::page_scores (the daemon keeps them for server-chosen budgets).
  bool page_scores = false;
  // One page set per (layer, group), or one per layer shared by every group
  // (docs/architecture.md §3.9).
  SelectionScope scope = SelectionScope::kGroup;
  LayerCombine combine = kDefaultLayerCombine;  // how layer scope combines the groups' scores
  // Polled before each group is scored (empty: never): once it returns true the decision stops
  // and returns CANCELLED, so a caller that gave up frees the thread within one group's work.
  // Called on the scoring thread; must be cheap and thread-safe.
  std::function<bool()> cancelled;
};

// A request over `statistic` (absent for a policy that needs none) for `query_heads` heads in
// `kv_groups` groups and a sequence of `tokens` tokens, keeping `quota_pages` pages per group;
// every other field at its default (every page held, no cached weights, measured, group scope).
[[nodiscard]] LayerRequest LayerRequestFor(std::optional<StatisticView> statistic, int query_heads,
                                           int kv_groups, int64_t tokens, int64_t quota_pages);

// CANCELLED naming how far scoring got, when request.cancelled says so; OK otherwise.
[[nodiscard]] absl::Status CheckCancelled(const LayerRequest& request, int groups_scored);

// The live mask of group g of a layer of `pages` pages (empty when every page is held).
// REQUIRES: request validated.
[[nodiscard]] std::span<const uint8_t> GroupLivePages(const LayerRequest& request, int64_t pages,
                                                      int group);

// The pages every group of the layer still holds (the intersection of the groups' masks), the
// candidates of layer scope; empty when every page is held. REQUIRES: request validated.
[[nodiscard]] std::vector<uint8_t> LayerLivePages(const LayerRequest& request, int64_t pages);

struct GroupDecision {
  std::vector<int32_t> kept_pages;  // ascending logical page indices
  std::vector<double> weights;      // per head of the group (pooling policies)
  std::vector<double> entropies;    // per head, when computed by this call
  // Head-independent shadow at the same K (needs the statistic and `measure`).
  std::optional<double> shadow_uor;
  std::optional<double> disagreement;   // mean pairwise Jaccard disagreement of the shadow
  std::optional<double> retained_mass;  // share of the group's mean statistic kept
  // With LayerRequest::page_scores: I_g[b], the pooled page scores the group's pages were
  // ranked by, one per page (evicted ones included); empty for policies that rank none
  // (head_independent, streaming). The same values on both paths (DecideLayer, FusedScorer).
  std::vector<float> page_scores;
};

struct LayerDecision {
  int64_t page_count = 0;   // n = ceil(T / B)
  int64_t quota_pages = 0;  // K as asked
  std::vector<GroupDecision> groups;
  SelectionScope scope = SelectionScope::kGroup;
  // Distinct pages kept over the groups: the frames the layer keeps in the LAYER layout.
  int64_t union_pages = 0;
  // What group scope keeps (or would have kept, in layer scope): the distinct pages of the
  // per-group selections. union_pages in group scope; the shadow layer scope is compared with.
  int64_t group_scope_union_pages = 0;
  std::vector<double> combine_weights;  // layer scope: v_g of a weighted combine, else empty
};

// Validates everything before computing: CANCELLED once request.cancelled says so (polled
// between groups); INVALID_ARGUMENT naming the field for a bad shape,
// H_Q not a multiple of G, non-finite or negative values, a bad option, quota_pages < 1;
// FAILED_PRECONDITION when the statistic's token count is not `tokens`, cached weights do not
// match the heads or live_pages does not match the pages (n or G * n entries).
[[nodiscard]] absl::StatusOr<LayerDecision> DecideLayer(const Policy& policy,
                                                        const PolicyOptions& options,
                                                        const LayerRequest& request);

// DecideLayer's checks, in its order, so that other paths (the fused scorer) return the same
// status. With check_values = false the statistic's values are not read: the caller checks them
// in its own pass over the data and reports them with StatisticView::ValidateValues.
[[nodiscard]] absl::Status ValidateLayerRequest(const Policy& policy, const PolicyOptions& options,
                                                const LayerRequest& request,
                                                bool check_values = true);

// True when the layer's page sets are chosen from every group's page scores once all are
// known: layer scope, or group quotas that move (group_quotas.h).
[[nodiscard]] bool SelectsPerLayer(const PolicyOptions& options, const LayerRequest& request);

// That choice, after every group's own selection: the layer scope's one set (ApplyLayerScope;
// `group_scores` empty for a policy without page scores), or the moved quotas' sets
// (ApplyGroupQuotas) and their union. Both CPU paths call it on the same page scores.
// Measurements are left to the caller. REQUIRES: SelectsPerLayer(options, request).
void SelectPerLayer(std::span<const std::span<const float>> group_scores,
                    const PolicyOptions& options, const LayerRequest& request,
                    LayerDecision* decision);

// Fills decision->shadow_uor, disagreement and retained_mass from the group's rows and the
// decision's kept pages. REQUIRES: rows non-empty, all of the same length.
void MeasureGroup(std::span<const std::span<const float>> rows, const PolicyOptions& options,
                  int64_t quota_pages, GroupDecision* decision);

}  // namespace entrokv

#endif  // ENTROKV_CORE_SCORING_DECISION_H_

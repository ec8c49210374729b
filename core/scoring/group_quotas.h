// Group quotas that move between the KV groups of one layer (docs/architecture.md §3.8), as
// AdaKV moves budget between heads: a group whose attention is spread over many pages keeps
// more of them, one whose attention sits on a few keeps fewer, and the layer keeps exactly what
// fixed quotas would (the sum over groups of min(K, pages the group holds)), so the frames of the
// GROUP layout stay exactly the budget's.
#ifndef ENTROKV_CORE_SCORING_GROUP_QUOTAS_H_
#define ENTROKV_CORE_SCORING_GROUP_QUOTAS_H_

#include <span>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/scoring/decision.h"
#include "core/scoring/policy.h"

namespace entrokv {

// True when the request's decision moves quotas between groups: options.group_floor < 1 (group
// scope and a page-ranking policy, which ValidateLayerRequest checks).
[[nodiscard]] bool MovesGroupQuotas(const PolicyOptions& options);

// Whether the options' group_floor can move quotas in this decision, errors naming `field` (a
// flag, a wire field): OK when quotas stay fixed (group_floor 1), INVALID_ARGUMENT in layer scope
// (one set for every group) and for a policy that ranks no pages (head_independent, streaming).
[[nodiscard]] absl::Status ValidateGroupQuotas(absl::string_view field, const Policy& policy,
                                               const PolicyOptions& options, SelectionScope scope);

// Replaces every group's kept pages. Group g holds L_g live pages and has the fixed quota
// q_g = min(K, L_g); the layer keeps sum_g q_g pages. Each group first keeps its protected pages
// and its best pages up to f_g = max(protected, ceil(group_floor * q_g), min(1, q_g)) (a group
// that holds a page keeps one, as with fixed quotas); the rest of the layer's
// pages go to the remaining live pages of highest normalised score s_g[b] / sum of g's live
// scores (ties: the lower group, then the lower page). Evicted pages are never kept.
// `group_scores` holds one span of n page scores per group (the policy's I_g). Measurements are
// left to the caller (retained mass changes with the sets; the shadow stays at K).
// REQUIRES: the request validated; group_scores.size() == G, each of decision->page_count.
void ApplyGroupQuotas(std::span<const std::span<const float>> group_scores,
                      const PolicyOptions& options, const LayerRequest& request,
                      LayerDecision* decision);

}  // namespace entrokv

#endif  // ENTROKV_CORE_SCORING_GROUP_QUOTAS_H_

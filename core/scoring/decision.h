// One layer's eviction decision: validate, run the policy on every group, measure it.
#ifndef ENTROKV_CORE_SCORING_DECISION_H_
#define ENTROKV_CORE_SCORING_DECISION_H_

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
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
  bool measure = true;                     // compute the shadow UOR, disagreement, mass
};

struct GroupDecision {
  std::vector<int32_t> kept_pages;  // ascending logical page indices
  std::vector<double> weights;      // per head of the group (pooling policies)
  std::vector<double> entropies;    // per head, when computed by this call
  // Head-independent shadow at the same K (needs the statistic and `measure`).
  std::optional<double> shadow_uor;
  std::optional<double> disagreement;  // mean pairwise Jaccard disagreement of the shadow
  std::optional<double> retained_mass;  // share of the group's mean statistic kept
};

struct LayerDecision {
  int64_t page_count = 0;   // n = ceil(T / B)
  int64_t quota_pages = 0;  // K as asked
  std::vector<GroupDecision> groups;
};

// Validates everything before computing: INVALID_ARGUMENT naming the field for a bad shape,
// H_Q not a multiple of G, non-finite or negative values, a bad option, quota_pages < 1;
// FAILED_PRECONDITION when the statistic's token count is not `tokens` or cached weights do not
// match the heads.
[[nodiscard]] absl::StatusOr<LayerDecision> DecideLayer(const Policy& policy,
                                                        const PolicyOptions& options,
                                                        const LayerRequest& request);

}  // namespace entrokv

#endif  // ENTROKV_CORE_SCORING_DECISION_H_

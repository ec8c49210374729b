// The page-level half of a fused decision, shared by the fused CPU path (fused_scorer.h) and the
// CUDA scorer (core/cuda/scorer.h): from the scores one pass over a group's statistic yields
// (pooled page maxima and, to measure, each head's page maxima and the head-mean row's page
// sums), the selection with its protections, live pages and exact quota, the shadow
// measurements, and the layer scope. Whichever path computed the scores, the same bits in give
// the same decision out.
#ifndef ENTROKV_CORE_SCORING_GROUP_FINISH_H_
#define ENTROKV_CORE_SCORING_GROUP_FINISH_H_

#include <cstdint>
#include <span>
#include <vector>

#include "core/scoring/decision.h"
#include "core/scoring/policy.h"

namespace entrokv {

// What the pass over one (layer, group) of n pages yields.
struct GroupScores {
  std::span<const float> page_max;    // n pooled page maxima, I_g[b]
  std::span<const float> head_max;    // r * n, head-major (request.measure only)
  std::span<const double> page_sums;  // n PageSums of the head-mean row (request.measure only)
};

// Owns the selection's scratch; not thread-safe (one per scorer).
class GroupFinisher {
 public:
  // Fills decision->kept_pages (and page_scores, and the measurements with request.measure) of
  // group `group` with r heads. REQUIRES: the request validated; scores of the group's pages.
  void Finish(const PolicyOptions& options, const LayerRequest& request, int group, int r,
              const GroupScores& scores, GroupDecision* decision);

  // After every group is finished: the union (group scope), or the layer scope's one set (or
  // the moved group quotas' sets, group_quotas.h) from the groups' page maxima `layer_scores`
  // (G * n, group-major) with the retained mass re-measured from `layer_page_sums` (G * n,
  // request.measure only).
  static void FinishLayer(const PolicyOptions& options, const LayerRequest& request,
                          std::span<const float> layer_scores,
                          std::span<const double> layer_page_sums, LayerDecision* decision);

 private:
  void Measure(std::span<const float> head_max, int r, int64_t pages, int64_t quota,
               std::span<const double> page_sums, GroupDecision* decision);

  std::vector<uint32_t> keys_;                   // one per page, then as many of work
  std::vector<std::vector<int32_t>> head_kept_;  // the head-independent shadow's pages
};

}  // namespace entrokv

#endif  // ENTROKV_CORE_SCORING_GROUP_FINISH_H_

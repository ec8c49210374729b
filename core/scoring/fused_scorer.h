// The fused CPU path of one layer's decision (docs/architecture.md §3, §7; docs/performance.md):
// the same decisions as DecideLayer (decision.h), bit for bit, from two reads of the statistic per
// group (one for the entropy sums, one for the pooled page maxima, which also validates the values)
// and a linear selection, with scratch memory reused across calls.
#ifndef ENTROKV_CORE_SCORING_FUSED_SCORER_H_
#define ENTROKV_CORE_SCORING_FUSED_SCORER_H_

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "core/scoring/decision.h"
#include "core/scoring/entropy.h"
#include "core/scoring/group_finish.h"
#include "core/scoring/policy.h"

namespace entrokv {

// True for the policies the fused path computes itself, by their Policy::pooling() (entropy-
// weighted, mean, max: page_entrokv, raw_entropy, mean, h2o, max); the others go through
// DecideLayer unchanged.
[[nodiscard]] bool IsFusedPolicy(const Policy& policy);

// Owns its scratch buffers (they grow to the largest layer seen and are then reused, so a
// steady stream of layers allocates only the returned decisions). Not thread-safe: use one per
// thread. Keeps no reference to the options, the policy or the statistic after a call.
class FusedScorer {
 public:
  explicit FusedScorer(const PolicyOptions& options) : options_(options) {}

  // Same contract, errors and result as DecideLayer(policy, options, request); the decisions,
  // weights, entropies and, with `measure`, the shadow UOR, disagreement and retained mass are
  // identical. The measurement's inputs (per-head page maxima, page sums of the head-mean row)
  // come from the same pass over the statistic as the pooled page maxima.
  [[nodiscard]] absl::StatusOr<LayerDecision> DecideLayer(const Policy& policy,
                                                          const LayerRequest& request);

 private:
  // One (layer, group); REQUIRES: request validated except for the values. Returns false when
  // a value of the group's rows is negative or not finite (the caller reports it).
  bool DecideGroup(const Policy& policy, const LayerRequest& request, int group,
                   GroupDecision* decision);
  // Loads `count` tokens of `head` from `first` as float32: a view for float32, widened into
  // `buffer` otherwise.
  const float* Tokens(const LayerRequest& request, int head, int64_t first, int64_t count,
                      float* buffer) const;

  PolicyOptions options_;
  GroupFinisher finisher_;                  // selection and measurement from the pass's page scores
  std::vector<float> widened_;              // chunk buffers for half-precision rows
  std::vector<const float*> row_pointers_;  // the group's rows at the current chunk
  std::vector<EntropyLanes> lanes_;         // one per head of the group
  std::vector<float> pooled_;               // one chunk of the pooled row
  // neighbourhood pooling only: each head's pooled chunk, and pointers to them
  std::vector<float> neighbourhood_;
  std::vector<const float*> neighbourhood_pointers_;
  std::vector<float> page_max_;  // I_g[b] for the current group
  // measure = true only:
  std::vector<float> head_max_;    // [r][n] page maxima of each head of the group
  std::vector<float> mean_;        // one chunk of the head-mean row
  std::vector<double> page_sums_;  // PageSums of the head-mean row
  // layer scope only: [G][n] page scores and (measure) page sums of every group of the layer
  std::vector<float> layer_scores_;
  std::vector<double> layer_page_sums_;
};

// Every layer of a model: requests[l] decided with its own quota. `threads` workers take whole
// layers from a shared counter (threads <= 1 runs on the caller's thread); the result is the
// same for every thread count. The first error in layer order is returned.
[[nodiscard]] absl::StatusOr<std::vector<LayerDecision>> DecideModel(
    const Policy& policy, const PolicyOptions& options, std::span<const LayerRequest> requests,
    int threads);

// Every layer's decision of `results` (each one set), moved out in layer order; the first error
// in layer order instead when a layer has one. DecideModel's answer, and the CUDA scorer's.
[[nodiscard]] absl::StatusOr<std::vector<LayerDecision>> InLayerOrder(
    std::vector<std::optional<absl::StatusOr<LayerDecision>>>& results);

}  // namespace entrokv

#endif  // ENTROKV_CORE_SCORING_FUSED_SCORER_H_

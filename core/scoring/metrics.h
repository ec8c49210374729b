// Quality metrics of a decision (docs/architecture.md §3.11) and the method's closed forms: the
// union-overhead certificates, the page-union ratio and the needle bound (docs/method.md).
#ifndef ENTROKV_CORE_SCORING_METRICS_H_
#define ENTROKV_CORE_SCORING_METRICS_H_

#include <cstdint>
#include <span>
#include <vector>

namespace entrokv {

// |union of the sets| / k. Sets hold ascending, distinct indices. REQUIRES: k > 0.
[[nodiscard]] double UnionOverheadRatio(std::span<const std::vector<int32_t>> sets, int64_t k);

// Pairwise Jaccard similarities of the sets: mean over i < j, and the max.
struct JaccardSummary {
  double mean_similarity = 1.0;  // J-bar; 1 for fewer than two sets
  double max_similarity = 1.0;
  [[nodiscard]] double disagreement() const { return 1.0 - mean_similarity; }  // D
};
[[nodiscard]] JaccardSummary PairwiseJaccard(std::span<const std::vector<int32_t>> sets);

// Bonferroni certificate: UOR >= max(1, r - r(r-1) J-bar).
[[nodiscard]] double BonferroniLowerBound(int r, double mean_similarity);
// Sandwich theorem (r >= 2): lower r / (1 + 2(r-1) J/(1+J)), upper min(r, r - max 2J/(1+J)).
struct UorBounds {
  double lower;
  double upper;
};
[[nodiscard]] UorBounds SandwichBounds(int r, double mean_similarity, double max_similarity);

// Page-union ratio for the LAYER frame layout: |union over groups| / k.
[[nodiscard]] inline double PageUnionRatio(std::span<const std::vector<int32_t>> kept_per_group,
                                           int64_t k) {
  return UnionOverheadRatio(kept_per_group, k);
}

// Share of sum(values) that lies inside the kept pages; 1 when the values sum to 0. The sums
// are taken page by page (PageSums), then over the pages in ascending order
// (RetainedMassFromPageSums), so that a path that streams the values chunk by chunk (the fused
// scorer) gets the same bits.
[[nodiscard]] double RetainedMass(std::span<const float> values, int page_size,
                                  std::span<const int32_t> kept_pages);

// sums[b] = the double sum of values over page b, from 0 in token order; the partial last page
// counts with its real tokens. REQUIRES: sums.size() == PageCount(values.size(), page_size).
void PageSums(std::span<const float> values, int page_size, std::span<double> sums);

// RetainedMass from the page sums: (sum of the kept pages' sums) / (sum of all), each in
// ascending page order; 1 when the total is not > 0. kept_pages: ascending, distinct.
[[nodiscard]] double RetainedMassFromPageSums(std::span<const double> page_sums,
                                              std::span<const int32_t> kept_pages);

// The method's finite-context needle bound (docs/method.md, claim C10) with c_j = 0, that is
// r - 1 near-uniform siblings:
//   Delta(T) = (1 - eps) D / (C + D),  C = exp(-eta / tau),  D = (r - 1) (T - s)^(-1/tau).
[[nodiscard]] double NeedleBoundDelta(int64_t tokens, int r, double tau, double eta_ret,
                                      double needle_mass, int sink_tokens);
// How far float32 rounding can move a pooled score from its value on the exact inputs: each
// float32 input is off by at most 2^-24 of itself (round to nearest) and the pooled score is
// rounded to float32 once more, so with weights summing to 1 the score moves by at most
// 2 * 2^-24 * (largest input). The tolerance of the needle-bound checks: a fixed 1e-6 would
// exceed Delta(T) itself for T >= 4K and let the check pass whatever the score.
[[nodiscard]] inline double Float32PoolingTolerance(double largest_input) {
  return 2.0 * 0x1p-24 * largest_input;
}

// Mean pooling at the needle with uniform siblings: ((1 - eps) + (r - 1) / T) / r.
[[nodiscard]] double MeanPooledNeedle(int64_t tokens, int r, double needle_mass);

}  // namespace entrokv

#endif  // ENTROKV_CORE_SCORING_METRICS_H_

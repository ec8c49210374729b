// Sink-isolated Renyi entropy of one attention row (docs/architecture.md §3.2-3.3).
#ifndef ENTROKV_CORE_SCORING_ENTROPY_H_
#define ENTROKV_CORE_SCORING_ENTROPY_H_

#include <cstdint>
#include <limits>
#include <span>

namespace entrokv {

// Added inside the logarithm only, never inside the power: (p + eps)^2 would break the
// normalisation of p.
inline constexpr double kEntropyLogGuard = 1e-12;
inline constexpr double kAlphaInfinity = std::numeric_limits<double>::infinity();

// The first min(sink_tokens, T) positions are left out and the rest renormalised. A row whose
// non-sink mass is 0 is degenerate and gets the maximal entropy ln(max(T - s, 1)).
// alpha = 1 is Shannon, alpha = +inf min-entropy, other alpha > 0 the general order.
// REQUIRES: entries finite and >= 0; alpha > 0; sink_tokens >= 0.
[[nodiscard]] double SinkIsolatedEntropy(std::span<const float> row, int sink_tokens, double alpha);

// Sufficient statistics of a non-sink row for the orders that need one pass (1, 2, inf):
// total = sum x, and power = sum x^2 (alpha 2), sum x ln x (alpha 1) or max x (alpha inf).
// The plain and the fused paths both accumulate these and call EntropyFromSums, so they give
// the same bits.
struct EntropySums {
  double total = 0.0;
  double power = 0.0;
};
[[nodiscard]] bool IsOnePassOrder(double alpha);
void AccumulateEntropySums(std::span<const float> values, double alpha, EntropySums* sums);
// REQUIRES: IsOnePassOrder(alpha). `support` = T - s, used for the degenerate case.
[[nodiscard]] double EntropyFromSums(const EntropySums& sums, double alpha, int64_t support);

}  // namespace entrokv

#endif  // ENTROKV_CORE_SCORING_ENTROPY_H_

// Sink-isolated Renyi entropy of one attention row (docs/architecture.md §3.2-3.3).
#ifndef ENTROKV_CORE_SCORING_ENTROPY_H_
#define ENTROKV_CORE_SCORING_ENTROPY_H_

#include <array>
#include <cstdint>
#include <limits>
#include <span>

#include "core/scoring/portable_math.h"

namespace entrokv {

// Added inside the logarithm only, never inside the power: (p + eps)^2 would break the
// normalisation of p.
using portable::kEntropyLogGuard;
inline constexpr double kAlphaInfinity = std::numeric_limits<double>::infinity();

// The first min(sink_tokens, T) positions are left out and the rest renormalised. A row whose
// non-sink mass is 0 is degenerate and gets the maximal entropy ln(max(T - s, 1)).
// alpha = 1 is Shannon, alpha = +inf min-entropy, other alpha > 0 the general order.
// REQUIRES: entries finite and >= 0; alpha > 0; sink_tokens >= 0.
[[nodiscard]] double SinkIsolatedEntropy(std::span<const float> row, int sink_tokens, double alpha);

// Sufficient statistics of a non-sink row for the orders that need one pass (1, 2, inf):
// total = sum x, and power = sum x^2 (alpha 2), sum x ln x (alpha 1) or max x (alpha inf).
struct EntropySums {
  double total = 0.0;
  double power = 0.0;
};
[[nodiscard]] bool IsOnePassOrder(double alpha);

// The one order in which those sums are taken, shared by the plain path, the fused CPU path and
// the CUDA scorer so that all give the same bits: lane k of kEntropyLanes adds, in double and
// from +0, the values j = k, k + kEntropyLanes, k + 2 kEntropyLanes, ... of the non-sink row in
// that order; then the lanes fold pairwise, lane k += lane k + w for w = kEntropyLanes / 2, ...,
// 1 (max instead of + for alpha inf's power), and lane 0 holds the sums. Striped lanes let a GPU
// block give one thread per lane with coalesced reads, and the CPU vectorise along tokens.
inline constexpr int kEntropyLanes = 256;
struct EntropyLanes {
  std::array<double, kEntropyLanes> total{};
  std::array<double, kEntropyLanes> power{};
  int64_t count = 0;  // values added so far: the next goes to lane count % kEntropyLanes
};
// Adds `values`, the row's next count values, continuing from `lanes`. REQUIRES: IsOnePassOrder.
void AccumulateEntropyLanes(std::span<const float> values, double alpha, EntropyLanes* lanes);
[[nodiscard]] EntropySums FoldEntropyLanes(const EntropyLanes& lanes, double alpha);
// Both: the sums of a whole non-sink row.
[[nodiscard]] EntropySums EntropySumsOf(std::span<const float> values, double alpha);
// REQUIRES: IsOnePassOrder(alpha). `support` = T - s, used for the degenerate case.
[[nodiscard]] double EntropyFromSums(const EntropySums& sums, double alpha, int64_t support);

}  // namespace entrokv

#endif  // ENTROKV_CORE_SCORING_ENTROPY_H_

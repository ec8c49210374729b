// Head weights inside one KV group and the pooled group row (docs/architecture.md §3.4-3.5).
#ifndef ENTROKV_CORE_SCORING_WEIGHTS_H_
#define ENTROKV_CORE_SCORING_WEIGHTS_H_

#include <cstdint>
#include <span>
#include <vector>

namespace entrokv {

// w_h = softmax_h(-(H_h - min H) / tau): lower entropy, more weight; the weights sum to 1.
// REQUIRES: tau > 0, entropies non-empty and finite.
[[nodiscard]] std::vector<double> EntropyWeights(std::span<const double> entropies, double tau);

// out[t] = float(sum_h weights[h] * rows[h][t]) over the raw rows (sinks included), the
// products and the sum in double (docs/architecture.md §3.1), head by head from +0, rounded once.
// REQUIRES: rows.size() == weights.size(); every row and `out` have the same length.
void PoolRows(std::span<const std::span<const float>> rows, std::span<const double> weights,
              std::span<float> out);

// The group mean: out[t] = float((sum_h rows[h][t]) * (1.0 / r)), the sum in double from +0,
// scaled and rounded once. Scaling after summing makes equal values in any head order give the
// same float (the double sum of float32 values is exact while they span less than about
// 2^(29 - log2 r) in magnitude; beyond that the order can move only the last double bit), so
// ties between pages are broken by the page index, not by rounding. REQUIRES: rows non-empty,
// every row and `out` of the same length.
void MeanRows(std::span<const std::span<const float>> rows, std::span<float> out);

// The scale of MeanRows: 1.0 / r.
[[nodiscard]] inline double MeanScale(size_t rows) { return 1.0 / static_cast<double>(rows); }

// Neighbourhood pooling along a row (PolicyOptions::neighbourhood_kernel): token t of a row of
// `tokens` gets the max, or the mean, of the row over [t - k/2, t + k/2] clipped to [0, tokens).
// The max starts from the window's first value and takes x > m ? x : m; the mean sums the
// window in double from +0 in token order, divides by its length and rounds once to float.
enum class NeighbourhoodKind : uint8_t { kMax, kMean };
inline constexpr int kMaxNeighbourhoodKernel = 63;
// out[i] = the pooled value of token first + i, for i in [0, out.size()), from `slice`, the row's
// tokens [slice_first, slice_first + slice.size()), which must hold every window asked (the
// whole row, or a chunk with kernel / 2 tokens either side where the row has them).
void NeighbourhoodPool(std::span<const float> slice, int64_t slice_first, int64_t tokens,
                       int64_t first, int kernel, NeighbourhoodKind kind, std::span<float> out);

// A group's rows as a policy with a neighbourhood pools them: each whole row pooled by
// NeighbourhoodPool over `kernel` tokens, or the rows themselves when kernel <= 1. rows() refers
// to this object (and, unpooled, to `rows`): neither may go first.
class NeighbourhoodRows {
 public:
  NeighbourhoodRows(std::span<const std::span<const float>> rows, int64_t tokens, int kernel,
                    NeighbourhoodKind kind);
  NeighbourhoodRows(const NeighbourhoodRows&) = delete;
  NeighbourhoodRows& operator=(const NeighbourhoodRows&) = delete;
  [[nodiscard]] std::span<const std::span<const float>> rows() const { return rows_; }

 private:
  std::vector<std::vector<float>> pooled_;
  std::vector<std::span<const float>> spans_;
  std::span<const std::span<const float>> rows_;
};

}  // namespace entrokv

#endif  // ENTROKV_CORE_SCORING_WEIGHTS_H_

// Head weights inside one KV group and the pooled group row (ARCHITECTURE §3.4-3.5).
#ifndef ENTROKV_CORE_SCORING_WEIGHTS_H_
#define ENTROKV_CORE_SCORING_WEIGHTS_H_

#include <span>
#include <vector>

namespace entrokv {

// w_h = softmax_h(-(H_h - min H) / tau): lower entropy, more weight; the weights sum to 1.
// REQUIRES: tau > 0, entropies non-empty and finite.
[[nodiscard]] std::vector<double> EntropyWeights(std::span<const double> entropies, double tau);

// out[t] = sum_h weights[h] * rows[h][t] over the raw rows (sinks included).
// REQUIRES: rows.size() == weights.size(); every row and `out` have the same length.
void PoolRows(std::span<const std::span<const float>> rows, std::span<const double> weights,
              std::span<float> out);

}  // namespace entrokv

#endif  // ENTROKV_CORE_SCORING_WEIGHTS_H_

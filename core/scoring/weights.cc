#include "core/scoring/weights.h"

#include <algorithm>
#include <cmath>

namespace entrokv {

std::vector<double> EntropyWeights(std::span<const double> entropies, double tau) {
  const double minimum = *std::min_element(entropies.begin(), entropies.end());
  std::vector<double> weights(entropies.size());
  double sum = 0.0;
  for (size_t h = 0; h < entropies.size(); ++h) {
    weights[h] = std::exp(-(entropies[h] - minimum) / tau);  // the minimum gets exp(0) = 1
    sum += weights[h];
  }
  for (double& weight : weights) weight /= sum;
  return weights;
}

void PoolRows(std::span<const std::span<const float>> rows, std::span<const double> weights,
              std::span<float> out) {
  std::fill(out.begin(), out.end(), 0.0f);
  for (size_t h = 0; h < rows.size(); ++h) {
    const auto weight = static_cast<float>(weights[h]);
    const std::span<const float> row = rows[h];
    for (size_t t = 0; t < out.size(); ++t) out[t] += weight * row[t];
  }
}

}  // namespace entrokv

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
  for (size_t t = 0; t < out.size(); ++t) {
    double sum = 0.0;
    for (size_t h = 0; h < rows.size(); ++h) sum += weights[h] * static_cast<double>(rows[h][t]);
    out[t] = static_cast<float>(sum);
  }
}

void MeanRows(std::span<const std::span<const float>> rows, std::span<float> out) {
  const double scale = MeanScale(rows.size());
  for (size_t t = 0; t < out.size(); ++t) {
    double sum = 0.0;
    for (const std::span<const float> row : rows) sum += static_cast<double>(row[t]);
    out[t] = static_cast<float>(sum * scale);
  }
}

}  // namespace entrokv

#include "core/scoring/weights.h"

#include <algorithm>
#include <cmath>

#include "core/scoring/portable_math.h"

namespace entrokv {

std::vector<double> EntropyWeights(std::span<const double> entropies, double tau) {
  // The CUDA scorer computes the same function on the device (portable_math.h).
  std::vector<double> weights(entropies.size());
  portable::SoftminWeights<portable::HostArithmetic>(
      entropies.data(), static_cast<int>(entropies.size()), tau, weights.data());
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

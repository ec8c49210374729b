#include "core/scoring/entropy.h"

#include <algorithm>
#include <cmath>

namespace entrokv {
namespace {

double DegenerateEntropy(int64_t support) {
  return std::log(static_cast<double>(std::max<int64_t>(support, 1)));
}

}  // namespace

bool IsOnePassOrder(double alpha) { return alpha == 2.0 || alpha == 1.0 || std::isinf(alpha); }

void AccumulateEntropySums(std::span<const float> values, double alpha, EntropySums* sums) {
  double total = sums->total;
  double power = sums->power;
  if (alpha == 2.0) {
    for (const float value : values) {
      const double x = value;
      total += x;
      power += x * x;
    }
  } else if (alpha == 1.0) {
    for (const float value : values) {
      const double x = value;
      total += x;
      if (x > 0.0) power += x * std::log(x);
    }
  } else {
    for (const float value : values) {
      total += value;
      power = std::max(power, static_cast<double>(value));
    }
  }
  sums->total = total;
  sums->power = power;
}

double EntropyFromSums(const EntropySums& sums, double alpha, int64_t support) {
  if (!(sums.total > 0.0)) return DegenerateEntropy(support);
  if (alpha == 2.0) {
    // sum p^2 = power / total^2, in (0, 1].
    return -std::log(sums.power / (sums.total * sums.total) + kEntropyLogGuard);
  }
  if (alpha == 1.0) {
    // With p = x / total: -sum p ln p = ln(total) - sum(x ln x) / total.
    return std::log(sums.total) - sums.power / sums.total;
  }
  return -std::log(sums.power / sums.total + kEntropyLogGuard);  // alpha = inf
}

double SinkIsolatedEntropy(std::span<const float> row, int sink_tokens, double alpha) {
  const size_t sinks = std::min(static_cast<size_t>(std::max(sink_tokens, 0)), row.size());
  const std::span<const float> rest = row.subspan(sinks);
  const auto support = static_cast<int64_t>(rest.size());
  if (IsOnePassOrder(alpha)) {
    EntropySums sums;
    AccumulateEntropySums(rest, alpha, &sums);
    return EntropyFromSums(sums, alpha, support);
  }
  // General order: normalise first so that x^alpha can neither overflow nor underflow as a
  // whole (rows of accumulated statistics may sum far above 1).
  double total = 0.0;
  for (const float value : rest) total += value;
  if (!(total > 0.0)) return DegenerateEntropy(support);
  double power_sum = 0.0;
  for (const float value : rest) {
    if (value > 0.0f) power_sum += std::pow(value / total, alpha);
  }
  return std::log(power_sum + kEntropyLogGuard) / (1.0 - alpha);
}

}  // namespace entrokv

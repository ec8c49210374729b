#include "core/scoring/key_scores.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace entrokv {
namespace {

// Eight running sums, added in a fixed order at the end: the compiler vectorizes the loop
// (one float sum would be a serial chain: it may not reorder float additions), and the result
// is the same on every run.
constexpr int kLanes = 8;

float Dot(const float* a, const float* b, int head_dim) {
  float lanes[kLanes] = {};
  int d = 0;
  for (; d + kLanes <= head_dim; d += kLanes) {
    for (int j = 0; j < kLanes; ++j) lanes[j] += a[d + j] * b[d + j];
  }
  float sum = 0.0F;
  for (; d < head_dim; ++d) sum += a[d] * b[d];
  for (const float lane : lanes) sum += lane;
  return sum;
}

// A key's norm: its squares summed in float (a head_dim of at most a few hundred).
float Norm(const float* key, int head_dim) { return std::sqrt(Dot(key, key, head_dim)); }

}  // namespace

absl::StatusOr<KeyScore> ParseKeyScore(absl::string_view name) {
  if (name == "keydiff") return KeyScore::kKeyDiff;
  if (name == "norm") return KeyScore::kNorm;
  return absl::InvalidArgumentError(
      absl::StrCat("key score: unknown \"", name, "\", expected \"keydiff\" or \"norm\""));
}

absl::string_view KeyScoreName(KeyScore score) {
  return score == KeyScore::kKeyDiff ? "keydiff" : "norm";
}

void ScoreKeys(KeyScore score, std::span<const float> keys, int head_dim,
               std::span<const uint8_t> present, std::span<float> out) {
  const size_t tokens = out.size();
  if (score == KeyScore::kNorm) {
    for (size_t t = 0; t < tokens; ++t) {
      out[t] = present[t] != 0 ? 1.0F / (1.0F + Norm(&keys[t * head_dim], head_dim)) : 0.0F;
    }
    return;
  }
  // The anchor: the mean unit key of the tokens present (its scale does not change a cosine),
  // summed in double over the tokens.
  std::vector<double> anchor(static_cast<size_t>(head_dim), 0.0);
  std::vector<float> norms(tokens, 0.0F);
  for (size_t t = 0; t < tokens; ++t) {
    if (present[t] == 0) continue;
    const float* key = &keys[t * head_dim];
    norms[t] = Norm(key, head_dim);
    if (norms[t] == 0.0F) continue;
    const double inverse = 1.0 / norms[t];
    for (int d = 0; d < head_dim; ++d) anchor[static_cast<size_t>(d)] += key[d] * inverse;
  }
  double anchor_norm = 0.0;
  for (const double value : anchor) anchor_norm += value * value;
  anchor_norm = std::sqrt(anchor_norm);
  // The unit anchor in float: each token's cosine is then one float dot product.
  std::vector<float> unit(static_cast<size_t>(head_dim), 0.0F);
  if (anchor_norm > 0.0) {
    for (int d = 0; d < head_dim; ++d) {
      unit[static_cast<size_t>(d)] =
          static_cast<float>(anchor[static_cast<size_t>(d)] / anchor_norm);
    }
  }
  for (size_t t = 0; t < tokens; ++t) {
    if (present[t] == 0) {
      out[t] = 0.0F;
      continue;
    }
    if (norms[t] == 0.0F || anchor_norm == 0.0) {
      out[t] = 1.0F;
      continue;
    }
    const float cosine = Dot(&keys[t * head_dim], unit.data(), head_dim) / norms[t];
    out[t] = 1.0F - std::clamp(cosine, -1.0F, 1.0F);
  }
}

void ScoreExpectedAttention(std::span<const float> keys, int head_dim,
                            std::span<const uint8_t> present, std::span<const float> mean,
                            std::span<const float> covariance, std::span<float> out,
                            int factor_rank) {
  const size_t tokens = out.size();
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  const double half_variance = 0.5 / static_cast<double>(head_dim);
  std::vector<double> exponents(tokens, 0.0);
  // S k, or F k for a factor: one dot product per row of the matrix sent.
  const int rows = factor_rank > 0 ? factor_rank : head_dim;
  std::vector<float> projected(static_cast<size_t>(rows));
  double largest = -INFINITY;
  for (size_t t = 0; t < tokens; ++t) {
    if (present[t] == 0) continue;
    const float* key = &keys[t * static_cast<size_t>(head_dim)];
    double exponent = scale * Dot(mean.data(), key, head_dim);
    if (!covariance.empty()) {
      for (int i = 0; i < rows; ++i) {
        projected[static_cast<size_t>(i)] =
            Dot(&covariance[static_cast<size_t>(i) * static_cast<size_t>(head_dim)], key, head_dim);
      }
      exponent += half_variance * (factor_rank > 0 ? Dot(projected.data(), projected.data(), rows)
                                                   : Dot(key, projected.data(), head_dim));
    }
    exponents[t] = exponent;
    largest = std::max(largest, exponent);
  }
  double total = 0.0;
  for (size_t t = 0; t < tokens; ++t) {
    if (present[t] != 0) total += std::exp(exponents[t] - largest);
  }
  for (size_t t = 0; t < tokens; ++t) {
    out[t] = present[t] != 0 ? static_cast<float>(std::exp(exponents[t] - largest) / total) : 0.0F;
  }
}

}  // namespace entrokv

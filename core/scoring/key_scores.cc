#include "core/scoring/key_scores.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace entrokv {
namespace {

double Norm(const float* key, int head_dim) {
  double squares = 0.0;
  for (int d = 0; d < head_dim; ++d) squares += static_cast<double>(key[d]) * key[d];
  return std::sqrt(squares);
}

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
      out[t] = present[t] != 0
                   ? static_cast<float>(1.0 / (1.0 + Norm(&keys[t * head_dim], head_dim)))
                   : 0.0F;
    }
    return;
  }
  // The anchor: the mean unit key of the tokens present (its scale does not change a cosine).
  std::vector<double> anchor(static_cast<size_t>(head_dim), 0.0);
  std::vector<double> norms(tokens, 0.0);
  for (size_t t = 0; t < tokens; ++t) {
    if (present[t] == 0) continue;
    const float* key = &keys[t * head_dim];
    norms[t] = Norm(key, head_dim);
    if (norms[t] == 0.0) continue;
    for (int d = 0; d < head_dim; ++d) anchor[static_cast<size_t>(d)] += key[d] / norms[t];
  }
  double anchor_norm = 0.0;
  for (const double value : anchor) anchor_norm += value * value;
  anchor_norm = std::sqrt(anchor_norm);
  for (size_t t = 0; t < tokens; ++t) {
    if (present[t] == 0) {
      out[t] = 0.0F;
      continue;
    }
    if (norms[t] == 0.0 || anchor_norm == 0.0) {
      out[t] = 1.0F;
      continue;
    }
    const float* key = &keys[t * head_dim];
    double dot = 0.0;
    for (int d = 0; d < head_dim; ++d) dot += key[d] * anchor[static_cast<size_t>(d)];
    const double cosine = dot / (norms[t] * anchor_norm);
    out[t] = static_cast<float>(1.0 - std::clamp(cosine, -1.0, 1.0));
  }
}

}  // namespace entrokv

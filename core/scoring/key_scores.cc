#include "core/scoring/key_scores.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/scoring/fused_kernels.h"

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

// The quadratic term of kBlock tokens at once: k'Mk (M: head_dim x head_dim, upper
// triangular) or |F k|^2 (F: rows x head_dim, `factor`). `block` holds the tokens' keys transposed,
// [head_dim][kBlock], so the tokens lie across the lanes of one vector: every entry of the matrix
// is loaded once per block and multiplies all eight keys in one operation (one AVX2 operation, or
// two SSE ones), and no sum crosses lanes. Each token's sums run over the rows in order and over
// head_dim in order, so its result does not depend on the block it is in, and both builds below (no
// fused multiply-add in either) give the same bits.
constexpr int kBlock = 8;
using Lanes = float __attribute__((vector_size(kBlock * sizeof(float))));

// Four rows of the matrix at a time: four independent sums per key load, so the additions
// do not wait on each other (one sum at a time is bound by the latency of an add).
constexpr int kRowsAtOnce = 4;

inline void QuadraticBlockBody(const float* block, int head_dim, const float* matrix, int rows,
                               bool factor, float* forms) {
  Lanes total = {};
  Lanes keys;  // loaded by memcpy: `block` need not be aligned to a vector
  const auto width = static_cast<size_t>(head_dim);
  // Adds rows [i, i + count)'s products (M k)_i, or (F k)_i, into `total`, in row order.
  const auto add_rows = [&](int i, int count) {
    Lanes product[kRowsAtOnce] = {};
    const float* row = matrix + static_cast<size_t>(i) * width;
    // An upper-triangular M is zero left of row i's diagonal.
    for (size_t d = factor ? 0 : static_cast<size_t>(i); d < width; ++d) {
      std::memcpy(&keys, block + d * kBlock, sizeof(keys));
      for (int r = 0; r < count; ++r) product[r] += row[static_cast<size_t>(r) * width + d] * keys;
    }
    for (int r = 0; r < count; ++r) {
      if (!factor) std::memcpy(&keys, block + static_cast<size_t>(i + r) * kBlock, sizeof(keys));
      total += (factor ? product[r] : keys) * product[r];
    }
  };
  int i = 0;
  for (; i + kRowsAtOnce <= rows; i += kRowsAtOnce) add_rows(i, kRowsAtOnce);
  if (i < rows) add_rows(i, rows - i);
  std::memcpy(forms, &total, sizeof(total));
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) void QuadraticBlockAvx2(const float* block, int head_dim,
                                                        const float* matrix, int rows, bool factor,
                                                        float* forms) {
  QuadraticBlockBody(block, head_dim, matrix, rows, factor, forms);
}
#endif

void QuadraticBlock(const float* block, int head_dim, const float* matrix, int rows, bool factor,
                    float* forms) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (fused::HaveAvx2()) {
    QuadraticBlockAvx2(block, head_dim, matrix, rows, factor, forms);
    return;
  }
#endif
  QuadraticBlockBody(block, head_dim, matrix, rows, factor, forms);
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
  const auto width = static_cast<size_t>(head_dim);
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  const double half_variance = 0.5 / static_cast<double>(head_dim);
  std::vector<double> exponents(tokens, 0.0);
  // k'Sk, or |F k|^2 for a factor, kBlock tokens at a time. k'Sk depends on S's symmetric part
  // alone, so it is taken as k'Uk with U upper triangular (U_ii = S_ii, U_ij = S_ij + S_ji):
  // half the products.
  const int rows = factor_rank > 0 ? factor_rank : head_dim;
  std::vector<float> upper;
  std::span<const float> matrix = covariance;
  if (factor_rank == 0 && !covariance.empty()) {
    upper.assign(width * width, 0.0F);
    for (size_t i = 0; i < width; ++i) {
      upper[i * width + i] = covariance[i * width + i];
      for (size_t j = i + 1; j < width; ++j) {
        upper[i * width + j] = covariance[i * width + j] + covariance[j * width + i];
      }
    }
    matrix = upper;
  }
  std::vector<float> block(width * kBlock);
  float forms[kBlock] = {};
  double largest = -INFINITY;
  for (size_t first = 0; first < tokens; first += kBlock) {
    const size_t count = std::min<size_t>(kBlock, tokens - first);
    if (!covariance.empty()) {
      std::fill(block.begin(), block.end(), 0.0F);
      for (size_t j = 0; j < count; ++j) {
        if (present[first + j] == 0) continue;  // its lane stays 0
        const float* key = &keys[(first + j) * width];
        for (size_t d = 0; d < width; ++d) block[d * kBlock + j] = key[d];
      }
      QuadraticBlock(block.data(), head_dim, matrix.data(), rows, factor_rank > 0, forms);
    }
    for (size_t j = 0; j < count; ++j) {
      const size_t t = first + j;
      if (present[t] == 0) continue;
      double exponent = scale * Dot(mean.data(), &keys[t * width], head_dim);
      if (!covariance.empty()) exponent += half_variance * forms[j];
      exponents[t] = exponent;
      largest = std::max(largest, exponent);
    }
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

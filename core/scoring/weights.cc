#include "core/scoring/weights.h"

#include <algorithm>
#include <cmath>

#include "core/scoring/portable_math.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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

namespace {

// One token's window, clipped at the row's ends, as the header says.
float PoolWindow(std::span<const float> slice, int64_t slice_first, int64_t tokens, int64_t t,
                 int64_t half, NeighbourhoodKind kind) {
  const int64_t begin = std::max<int64_t>(t - half, 0) - slice_first;
  const int64_t end = std::min<int64_t>(t + half + 1, tokens) - slice_first;
  if (kind == NeighbourhoodKind::kMax) {
    float m = slice[static_cast<size_t>(begin)];
    for (int64_t j = begin + 1; j < end; ++j) {
      const float x = slice[static_cast<size_t>(j)];
      m = x > m ? x : m;
    }
    return m;
  }
  double sum = 0.0;
  for (int64_t j = begin; j < end; ++j) sum += static_cast<double>(slice[static_cast<size_t>(j)]);
  return static_cast<float>(sum / static_cast<double>(end - begin));
}

}  // namespace

void NeighbourhoodPool(std::span<const float> slice, int64_t slice_first, int64_t tokens,
                       int64_t first, int kernel, NeighbourhoodKind kind, std::span<float> out) {
  const int64_t half = kernel / 2;
  const int64_t end = first + static_cast<int64_t>(out.size());
  // Tokens [inner, outer) have their whole window inside the row. There each token's window is
  // taken offset by offset, the same operations in the same order as PoolWindow's, with the
  // loop over tokens innermost so that it vectorises.
  const int64_t inner = std::clamp(half, first, end);
  const int64_t outer = std::clamp(tokens - half, inner, end);
  for (int64_t t = first; t < inner; ++t) {
    out[static_cast<size_t>(t - first)] = PoolWindow(slice, slice_first, tokens, t, half, kind);
  }
  constexpr int64_t kBlock = 256;
  for (int64_t block = inner; block < outer; block += kBlock) {
    const int64_t count = std::min(kBlock, outer - block);
    const float* x = slice.data() + (block - slice_first);  // x[i + d]: token block + i + d
    float* o = out.data() + (block - first);
    if (kind == NeighbourhoodKind::kMax) {
      float maxima[kBlock];  // a local block: the compiler then knows `out` does not alias `x`
      for (int64_t i = 0; i < count; ++i) maxima[i] = x[i - half];
      for (int64_t d = -half + 1; d <= half; ++d) {
        int64_t i = 0;
#if defined(__SSE2__)
        // maxps(a, b) is a > b ? a : b, the same select (NaN and equal zeros give b).
        for (; i + 4 <= count; i += 4) {
          _mm_storeu_ps(maxima + i, _mm_max_ps(_mm_loadu_ps(x + i + d), _mm_loadu_ps(maxima + i)));
        }
#endif
        for (; i < count; ++i) maxima[i] = x[i + d] > maxima[i] ? x[i + d] : maxima[i];
      }
      std::copy(maxima, maxima + count, o);
    } else {
      double sums[kBlock] = {};
      for (int64_t d = -half; d <= half; ++d) {
        for (int64_t i = 0; i < count; ++i) sums[i] += static_cast<double>(x[i + d]);
      }
      for (int64_t i = 0; i < count; ++i) {
        o[i] = static_cast<float>(sums[i] / static_cast<double>(kernel));
      }
    }
  }
  for (int64_t t = outer; t < end; ++t) {
    out[static_cast<size_t>(t - first)] = PoolWindow(slice, slice_first, tokens, t, half, kind);
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

NeighbourhoodRows::NeighbourhoodRows(std::span<const std::span<const float>> rows, int64_t tokens,
                                     int kernel, NeighbourhoodKind kind) {
  if (kernel <= 1) {
    rows_ = rows;
    return;
  }
  pooled_.resize(rows.size());
  for (size_t h = 0; h < rows.size(); ++h) {
    pooled_[h].resize(static_cast<size_t>(tokens));
    NeighbourhoodPool(rows[h], 0, tokens, 0, kernel, kind, pooled_[h]);
    spans_.emplace_back(pooled_[h]);
  }
  rows_ = spans_;
}

}  // namespace entrokv

#include "core/scoring/fused_kernels.h"

#include <algorithm>
#include <cmath>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace entrokv::fused {

// The AVX2 kernels are compiled for that target only and chosen at run time, so the build
// stays baseline x86-64 and both kernel sets give the same bits (tests compare against the
// reference on whichever this machine runs).
bool HaveAvx2() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool have = __builtin_cpu_supports("avx2");
  return have;
#else
  return false;
#endif
}

namespace {

// Whether every x is finite and >= 0, the reference's test !(x >= 0 && x < inf) (so -0 passes).
// The pooling kernels fold it into their pass and report whether all values passed.
inline bool ValueOk(float x) { return x >= 0.0f && x < INFINITY; }

// One chunk, tokens [begin, count). With kMeanRow, also mean[t] = the MeanRows value of the
// same loads (the head-mean row of MeasureGroup; for kMean the pooled row is that row already,
// so kMeanRow is never asked with it). Returns whether every value passed ValueOk.
template <PoolOp kOp, bool kMeanRow>
bool PoolChunk(const float* const* rows, const double* weights, int count_rows, int64_t begin,
               int64_t count, float* pooled, double scale, float* mean) {
  static_assert(!(kOp == PoolOp::kMean && kMeanRow));
  int64_t t = begin;
  bool ok = true;
#if defined(__SSE2__)
  const __m128 zero = _mm_setzero_ps();
  const __m128 inf = _mm_set1_ps(INFINITY);
  const __m128d scale2 = _mm_set1_pd(scale);
  __m128 all_ok = _mm_castsi128_ps(_mm_set1_epi32(-1));
  for (; t + 4 <= count; t += 4) {
    __m128 max_acc = zero;
    __m128d acc_low = _mm_setzero_pd();
    __m128d acc_high = _mm_setzero_pd();
    __m128d sum_low = _mm_setzero_pd();
    __m128d sum_high = _mm_setzero_pd();
    for (int i = 0; i < count_rows; ++i) {
      const __m128 v = _mm_loadu_ps(rows[i] + t);
      all_ok = _mm_and_ps(all_ok, _mm_and_ps(_mm_cmpge_ps(v, zero), _mm_cmplt_ps(v, inf)));
      if (kOp == PoolOp::kMax) {
        max_acc = _mm_max_ps(v, max_acc);  // v > acc ? v : acc, which is std::max(acc, v)
        if (!kMeanRow) continue;
      }
      const __m128d low = _mm_cvtps_pd(v);
      const __m128d high = _mm_cvtps_pd(_mm_movehl_ps(v, v));
      if (kOp == PoolOp::kWeighted) {
        const __m128d w = _mm_set1_pd(weights[i]);
        acc_low = _mm_add_pd(acc_low, _mm_mul_pd(w, low));
        acc_high = _mm_add_pd(acc_high, _mm_mul_pd(w, high));
      }
      if (kOp == PoolOp::kMean || kMeanRow) {
        sum_low = _mm_add_pd(sum_low, low);
        sum_high = _mm_add_pd(sum_high, high);
      }
    }
    const __m128 mean_row = _mm_movelh_ps(_mm_cvtpd_ps(_mm_mul_pd(sum_low, scale2)),
                                          _mm_cvtpd_ps(_mm_mul_pd(sum_high, scale2)));
    if (kOp == PoolOp::kMax) {
      _mm_storeu_ps(pooled + t, max_acc);
    } else if (kOp == PoolOp::kWeighted) {
      _mm_storeu_ps(pooled + t, _mm_movelh_ps(_mm_cvtpd_ps(acc_low), _mm_cvtpd_ps(acc_high)));
    } else {
      _mm_storeu_ps(pooled + t, mean_row);
    }
    if (kMeanRow) _mm_storeu_ps(mean + t, mean_row);
  }
  ok = _mm_movemask_ps(all_ok) == 0xf;
#endif
  for (; t < count; ++t) {
    float max_acc = 0.0f;
    double acc = 0.0;
    double sum = 0.0;
    for (int i = 0; i < count_rows; ++i) {
      const float x = rows[i][t];
      ok &= ValueOk(x);
      if (kOp == PoolOp::kMax) max_acc = std::max(max_acc, x);
      if (kOp == PoolOp::kWeighted) acc += weights[i] * static_cast<double>(x);
      if (kOp == PoolOp::kMean || kMeanRow) sum += static_cast<double>(x);
    }
    const auto mean_row = static_cast<float>(sum * scale);
    pooled[t] = kOp == PoolOp::kMax        ? max_acc
                : kOp == PoolOp::kWeighted ? static_cast<float>(acc)
                                           : mean_row;
    if (kMeanRow) mean[t] = mean_row;
  }
  return ok;
}

#if defined(__x86_64__) && defined(__GNUC__)
// Eight floats from two registers of four doubles, each rounded as static_cast<float> does.
__attribute__((target("avx2"))) inline __m256 ToFloats(__m256d low, __m256d high) {
  return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm256_cvtpd_ps(low)), _mm256_cvtpd_ps(high),
                              1);
}

// Lanes of `sum` that are not finite, as a mask of all ones.
__attribute__((target("avx2"))) inline __m256d NotFinite(__m256d sum) {
  const __m256d magnitude = _mm256_andnot_pd(_mm256_set1_pd(-0.0), sum);
  return _mm256_cmp_pd(magnitude, _mm256_set1_pd(INFINITY), _CMP_NLT_UQ);
}

// PoolChunk eight tokens at a time, as two registers of four doubles; the same per-lane
// operations (VEX encodings of the same IEEE conversions, multiply, add and max; no FMA is
// enabled, so nothing is contracted). Validation costs one min per value when a double sum is
// formed: a negative value (not -0) drives the running min below 0, and a NaN or an infinity
// makes the sum non-finite (the weights are finite, so w * x is finite for finite x; 0 * inf is
// NaN). The plain max keeps the two compares of ValueOk, as a max can drop a NaN.
template <PoolOp kOp, bool kMeanRow>
__attribute__((target("avx2"))) bool PoolChunkAvx2(const float* const* rows, const double* weights,
                                                   int count_rows, int64_t count, float* pooled,
                                                   double scale, float* mean) {
  constexpr bool kHasSum = kOp != PoolOp::kMax || kMeanRow;
  const __m256 zero = _mm256_setzero_ps();
  const __m256 inf = _mm256_set1_ps(INFINITY);
  const __m256d scale4 = _mm256_set1_pd(scale);
  __m256 all_ok = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  __m256 minimum = zero;
  __m256d not_finite = _mm256_setzero_pd();
  int64_t t = 0;
  for (; t + 8 <= count; t += 8) {
    __m256 max_acc = zero;
    __m256d acc_low = _mm256_setzero_pd();
    __m256d acc_high = _mm256_setzero_pd();
    __m256d sum_low = _mm256_setzero_pd();
    __m256d sum_high = _mm256_setzero_pd();
    for (int i = 0; i < count_rows; ++i) {
      const __m256 v = _mm256_loadu_ps(rows[i] + t);
      if (kHasSum) {
        minimum = _mm256_min_ps(minimum, v);
      } else {
        all_ok = _mm256_and_ps(all_ok, _mm256_and_ps(_mm256_cmp_ps(v, zero, _CMP_GE_OQ),
                                                     _mm256_cmp_ps(v, inf, _CMP_LT_OQ)));
      }
      if (kOp == PoolOp::kMax) {
        max_acc = _mm256_max_ps(v, max_acc);  // v > acc ? v : acc, which is std::max(acc, v)
        if (!kMeanRow) continue;
      }
      // Converting from memory again costs no shuffle (the loads hit L1).
      const __m256d low = _mm256_cvtps_pd(_mm_loadu_ps(rows[i] + t));
      const __m256d high = _mm256_cvtps_pd(_mm_loadu_ps(rows[i] + t + 4));
      if (kOp == PoolOp::kWeighted) {
        const __m256d w = _mm256_broadcast_sd(weights + i);
        acc_low = _mm256_add_pd(acc_low, _mm256_mul_pd(w, low));
        acc_high = _mm256_add_pd(acc_high, _mm256_mul_pd(w, high));
      }
      if (kOp == PoolOp::kMean || kMeanRow) {
        sum_low = _mm256_add_pd(sum_low, low);
        sum_high = _mm256_add_pd(sum_high, high);
      }
    }
    const __m256 mean_row =
        ToFloats(_mm256_mul_pd(sum_low, scale4), _mm256_mul_pd(sum_high, scale4));
    if (kOp == PoolOp::kMax) {
      _mm256_storeu_ps(pooled + t, max_acc);
    } else if (kOp == PoolOp::kWeighted) {
      _mm256_storeu_ps(pooled + t, ToFloats(acc_low, acc_high));
    } else {
      _mm256_storeu_ps(pooled + t, mean_row);
    }
    if (kMeanRow) _mm256_storeu_ps(mean + t, mean_row);
    if (kHasSum) {
      const __m256d low = kOp == PoolOp::kWeighted ? acc_low : sum_low;
      const __m256d high = kOp == PoolOp::kWeighted ? acc_high : sum_high;
      not_finite = _mm256_or_pd(not_finite, _mm256_or_pd(NotFinite(low), NotFinite(high)));
    }
  }
  const bool ok = _mm256_movemask_ps(all_ok) == 0xff &&
                  _mm256_movemask_ps(_mm256_cmp_ps(minimum, zero, _CMP_LT_OQ)) == 0 &&
                  _mm256_movemask_pd(not_finite) == 0;
  return PoolChunk<kOp, kMeanRow>(rows, weights, count_rows, t, count, pooled, scale, mean) && ok;
}

#else
template <PoolOp kOp, bool kMeanRow>
bool PoolChunkAvx2(const float* const* rows, const double* weights, int count_rows, int64_t count,
                   float* pooled, double scale, float* mean) {
  return PoolChunk<kOp, kMeanRow>(rows, weights, count_rows, 0, count, pooled, scale, mean);
}
#endif

// PoolChunkAvx2's validation needs finite weights, which EntropyWeights and the daemon's cached
// weights are; other weights take the kernel that checks every value.
template <PoolOp kOp, bool kMeanRow>
bool PoolAnyChunk(const float* const* rows, const double* weights, int count_rows, int64_t count,
                  float* pooled, double scale, float* mean) {
  const bool finite_weights =
      kOp != PoolOp::kWeighted ||
      std::all_of(weights, weights + count_rows, [](double w) { return std::isfinite(w); });
  return HaveAvx2() && finite_weights
             ? PoolChunkAvx2<kOp, kMeanRow>(rows, weights, count_rows, count, pooled, scale, mean)
             : PoolChunk<kOp, kMeanRow>(rows, weights, count_rows, 0, count, pooled, scale, mean);
}

// Max of values[0, count); REQUIRES count >= 1, no NaN.
inline float MaxOf(const float* values, int64_t count) {
  int64_t t = 0;
  float best = values[0];
#if defined(__SSE2__)
  if (count >= 4) {
    __m128 lanes = _mm_loadu_ps(values);
    for (t = 4; t + 4 <= count; t += 4) lanes = _mm_max_ps(lanes, _mm_loadu_ps(values + t));
    lanes = _mm_max_ps(lanes, _mm_movehl_ps(lanes, lanes));
    lanes = _mm_max_ss(lanes, _mm_shuffle_ps(lanes, lanes, 1));
    best = _mm_cvtss_f32(lanes);
  }
#endif
  for (; t < count; ++t) best = std::max(best, values[t]);
  return best;
}

#if defined(__x86_64__) && defined(__GNUC__)
// Page maxima of eight whole pages of `page_size` (a multiple of 8) floats: each page folds to
// one register of eight lanes, then three transposing steps fold the eight registers to one
// register holding the eight pages' maxima in page order.
__attribute__((target("avx2"))) void EightPageMaximaAvx2(const float* values, int page_size,
                                                         float* maxima) {
  __m256 page[8];
  for (int p = 0; p < 8; ++p) {
    const float* first = values + static_cast<int64_t>(p) * page_size;
    __m256 lanes = _mm256_loadu_ps(first);
    for (int t = 8; t < page_size; t += 8) lanes = _mm256_max_ps(lanes, _mm256_loadu_ps(first + t));
    page[p] = lanes;
  }
  __m256 pairs[4];  // per 128-bit half: [m_2q(0,2), m_2q+1(0,2), m_2q(1,3), m_2q+1(1,3)]
  for (int q = 0; q < 4; ++q) {
    pairs[q] = _mm256_max_ps(_mm256_unpacklo_ps(page[2 * q], page[2 * q + 1]),
                             _mm256_unpackhi_ps(page[2 * q], page[2 * q + 1]));
  }
  __m256 quads[2];  // per 128-bit half: the maxima of pages 4h..4h+3 over that half
  for (int h = 0; h < 2; ++h) {
    quads[h] =
        _mm256_max_ps(_mm256_shuffle_ps(pairs[2 * h], pairs[2 * h + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                      _mm256_shuffle_ps(pairs[2 * h], pairs[2 * h + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  _mm256_storeu_ps(maxima, _mm256_max_ps(_mm256_permute2f128_ps(quads[0], quads[1], 0x20),
                                         _mm256_permute2f128_ps(quads[0], quads[1], 0x31)));
}
#endif

}  // namespace

bool PoolRowsChunk(PoolOp op, const float* const* rows, const double* weights, int count_rows,
                   int64_t count, float* pooled, double scale, float* mean) {
  const bool mean_row = mean != nullptr;
  switch (op) {
    case PoolOp::kMax:
      return mean_row ? PoolAnyChunk<PoolOp::kMax, true>(rows, weights, count_rows, count, pooled,
                                                         scale, mean)
                      : PoolAnyChunk<PoolOp::kMax, false>(rows, weights, count_rows, count, pooled,
                                                          scale, nullptr);
    case PoolOp::kWeighted:
      return mean_row ? PoolAnyChunk<PoolOp::kWeighted, true>(rows, weights, count_rows, count,
                                                              pooled, scale, mean)
                      : PoolAnyChunk<PoolOp::kWeighted, false>(rows, weights, count_rows, count,
                                                               pooled, scale, nullptr);
    case PoolOp::kMean:
      break;
  }
  return PoolAnyChunk<PoolOp::kMean, false>(rows, weights, count_rows, count, pooled, scale,
                                            nullptr);
}

void PageMaximaOf(const float* values, int64_t count, int page_size, float* maxima) {
  int64_t page = 0;
#if defined(__x86_64__) && defined(__GNUC__)
  if (page_size % 8 == 0 && HaveAvx2()) {
    const int64_t whole_pages = count / page_size;
    for (; page + 8 <= whole_pages; page += 8) {
      EightPageMaximaAvx2(values + page * page_size, page_size, maxima + page);
    }
  }
#endif
  for (int64_t t = page * page_size; t < count; t += page_size, ++page) {
    maxima[page] = MaxOf(values + t, std::min<int64_t>(page_size, count - t));
  }
}

}  // namespace entrokv::fused

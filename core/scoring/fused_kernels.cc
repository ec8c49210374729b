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

// AccumulateEntropySums for kRows rows side by side: per row the same operations in the same
// token order, so the same bits; the rows' chains are independent and overlap in the core.
template <int kRows>
void AccumulateRows(const float* const* rows, int64_t count, double alpha, EntropySums* sums) {
  double total[kRows];
  double power[kRows];
  for (int i = 0; i < kRows; ++i) {
    total[i] = sums[i].total;
    power[i] = sums[i].power;
  }
  if (alpha == 2.0) {
    for (int64_t t = 0; t < count; ++t) {
      for (int i = 0; i < kRows; ++i) {
        const double x = rows[i][t];
        total[i] += x;
        power[i] += x * x;
      }
    }
  } else if (alpha == 1.0) {
    for (int64_t t = 0; t < count; ++t) {
      for (int i = 0; i < kRows; ++i) {
        const double x = rows[i][t];
        total[i] += x;
        if (x > 0.0) power[i] += x * std::log(x);
      }
    }
  } else {
    for (int64_t t = 0; t < count; ++t) {
      for (int i = 0; i < kRows; ++i) {
        const float value = rows[i][t];
        total[i] += value;
        power[i] = std::max(power[i], static_cast<double>(value));
      }
    }
  }
  for (int i = 0; i < kRows; ++i) {
    sums[i].total = total[i];
    sums[i].power = power[i];
  }
}

#if defined(__SSE2__)
// Alpha 2 or inf for kPairs pairs of rows: rows 2p and 2p+1 share one register of two doubles,
// lane by lane the same operations as AccumulateEntropySums (cvtps2pd is exact, addpd, mulpd
// and maxpd round per lane as the scalar ones do). Pairs are interleaved so that their chains
// overlap; within a lane the order stays the token order.
template <int kPairs, bool kSquares>
void AccumulatePairs(const float* const* rows, int64_t count, EntropySums* sums) {
  __m128d total[kPairs];
  __m128d power[kPairs];
  for (int p = 0; p < kPairs; ++p) {
    total[p] = _mm_set_pd(sums[2 * p + 1].total, sums[2 * p].total);
    power[p] = _mm_set_pd(sums[2 * p + 1].power, sums[2 * p].power);
  }
  auto step = [&](int p, __m128d x) {
    total[p] = _mm_add_pd(total[p], x);
    // maxpd(x, power) = x > power ? x : power, which is std::max(power, x).
    power[p] = kSquares ? _mm_add_pd(power[p], _mm_mul_pd(x, x)) : _mm_max_pd(x, power[p]);
  };
  int64_t t = 0;
  for (; t + 4 <= count; t += 4) {
    for (int p = 0; p < kPairs; ++p) {
      const __m128 a = _mm_loadu_ps(rows[2 * p] + t);
      const __m128 b = _mm_loadu_ps(rows[2 * p + 1] + t);
      const __m128 low = _mm_unpacklo_ps(a, b);   // a0 b0 a1 b1
      const __m128 high = _mm_unpackhi_ps(a, b);  // a2 b2 a3 b3
      step(p, _mm_cvtps_pd(low));
      step(p, _mm_cvtps_pd(_mm_movehl_ps(low, low)));
      step(p, _mm_cvtps_pd(high));
      step(p, _mm_cvtps_pd(_mm_movehl_ps(high, high)));
    }
  }
  for (; t < count; ++t) {
    for (int p = 0; p < kPairs; ++p) {
      step(p, _mm_set_pd(rows[2 * p + 1][t], rows[2 * p][t]));
    }
  }
  for (int p = 0; p < kPairs; ++p) {
    _mm_storel_pd(&sums[2 * p].total, total[p]);
    _mm_storeh_pd(&sums[2 * p + 1].total, total[p]);
    _mm_storel_pd(&sums[2 * p].power, power[p]);
    _mm_storeh_pd(&sums[2 * p + 1].power, power[p]);
  }
}

template <bool kSquares>
void AccumulatePairBlocks(const float* const* rows, int pairs, int64_t count, EntropySums* sums) {
  while (pairs > 0) {
    const int block = std::min(pairs, 4);
    switch (block) {
      case 4:
        AccumulatePairs<4, kSquares>(rows, count, sums);
        break;
      case 3:
        AccumulatePairs<3, kSquares>(rows, count, sums);
        break;
      case 2:
        AccumulatePairs<2, kSquares>(rows, count, sums);
        break;
      default:
        AccumulatePairs<1, kSquares>(rows, count, sums);
        break;
    }
    rows += 2 * block;
    sums += 2 * block;
    pairs -= block;
  }
}
#endif

#if defined(__x86_64__) && defined(__GNUC__)
// The AVX2 form of AccumulatePairs: kQuads groups of four rows share one register of four
// doubles (a 4x4 transpose puts token t of the four rows side by side), plus kPairs (0 or 1)
// pairs as in AccumulatePairs. Same per-lane operations in token order, so the same bits.
template <int kQuads, int kPairs, bool kSquares>
__attribute__((target("avx2"))) void AccumulateQuads(const float* const* rows, int64_t count,
                                                     EntropySums* sums) {
  __m256d total[kQuads + 1];
  __m256d power[kQuads + 1];
  __m128d pair_total = _mm_setzero_pd();
  __m128d pair_power = _mm_setzero_pd();
  for (int q = 0; q < kQuads; ++q) {
    const EntropySums* s = sums + 4 * q;
    total[q] = _mm256_set_pd(s[3].total, s[2].total, s[1].total, s[0].total);
    power[q] = _mm256_set_pd(s[3].power, s[2].power, s[1].power, s[0].power);
  }
  const float* const* pair_rows = rows + 4 * kQuads;
  EntropySums* pair_sums = sums + 4 * kQuads;
  if (kPairs == 1) {
    pair_total = _mm_set_pd(pair_sums[1].total, pair_sums[0].total);
    pair_power = _mm_set_pd(pair_sums[1].power, pair_sums[0].power);
  }
#define ENTROKV_QUAD_STEP(q, x)                                                \
  do {                                                                         \
    const __m256d value = (x);                                                 \
    total[q] = _mm256_add_pd(total[q], value);                                 \
    power[q] = kSquares ? _mm256_add_pd(power[q], _mm256_mul_pd(value, value)) \
                        : _mm256_max_pd(value, power[q]);                      \
  } while (0)
#define ENTROKV_PAIR_STEP(x)                                                 \
  do {                                                                       \
    const __m128d value = (x);                                               \
    pair_total = _mm_add_pd(pair_total, value);                              \
    pair_power = kSquares ? _mm_add_pd(pair_power, _mm_mul_pd(value, value)) \
                          : _mm_max_pd(value, pair_power);                   \
  } while (0)
  int64_t t = 0;
  for (; t + 4 <= count; t += 4) {
    for (int q = 0; q < kQuads; ++q) {
      __m128 a = _mm_loadu_ps(rows[4 * q] + t);
      __m128 b = _mm_loadu_ps(rows[4 * q + 1] + t);
      __m128 c = _mm_loadu_ps(rows[4 * q + 2] + t);
      __m128 d = _mm_loadu_ps(rows[4 * q + 3] + t);
      _MM_TRANSPOSE4_PS(a, b, c, d);  // a = token t of the four rows, b = token t + 1, ...
      ENTROKV_QUAD_STEP(q, _mm256_cvtps_pd(a));
      ENTROKV_QUAD_STEP(q, _mm256_cvtps_pd(b));
      ENTROKV_QUAD_STEP(q, _mm256_cvtps_pd(c));
      ENTROKV_QUAD_STEP(q, _mm256_cvtps_pd(d));
    }
    if (kPairs == 1) {
      const __m128 a = _mm_loadu_ps(pair_rows[0] + t);
      const __m128 b = _mm_loadu_ps(pair_rows[1] + t);
      const __m128 low = _mm_unpacklo_ps(a, b);
      const __m128 high = _mm_unpackhi_ps(a, b);
      ENTROKV_PAIR_STEP(_mm_cvtps_pd(low));
      ENTROKV_PAIR_STEP(_mm_cvtps_pd(_mm_movehl_ps(low, low)));
      ENTROKV_PAIR_STEP(_mm_cvtps_pd(high));
      ENTROKV_PAIR_STEP(_mm_cvtps_pd(_mm_movehl_ps(high, high)));
    }
  }
  for (; t < count; ++t) {
    for (int q = 0; q < kQuads; ++q) {
      ENTROKV_QUAD_STEP(q, _mm256_set_pd(rows[4 * q + 3][t], rows[4 * q + 2][t], rows[4 * q + 1][t],
                                         rows[4 * q][t]));
    }
    if (kPairs == 1) ENTROKV_PAIR_STEP(_mm_set_pd(pair_rows[1][t], pair_rows[0][t]));
  }
  for (int q = 0; q < kQuads; ++q) {
    alignas(32) double lanes[4];
    _mm256_store_pd(lanes, total[q]);
    for (int i = 0; i < 4; ++i) sums[4 * q + i].total = lanes[i];
    _mm256_store_pd(lanes, power[q]);
    for (int i = 0; i < 4; ++i) sums[4 * q + i].power = lanes[i];
  }
  if (kPairs == 1) {
    _mm_storel_pd(&pair_sums[0].total, pair_total);
    _mm_storeh_pd(&pair_sums[1].total, pair_total);
    _mm_storel_pd(&pair_sums[0].power, pair_power);
    _mm_storeh_pd(&pair_sums[1].power, pair_power);
  }
#undef ENTROKV_QUAD_STEP
#undef ENTROKV_PAIR_STEP
}

// Rows in blocks of up to three quads (plus a pair for the block that ends the group); returns
// how many rows it consumed (a last odd row is left to the scalar code).
template <bool kSquares>
int AccumulateQuadBlocks(const float* const* rows, int count_rows, int64_t count,
                         EntropySums* sums) {
  int done = 0;
  while (count_rows - done >= 2) {
    const int left = count_rows - done;
    const int quads = std::min(left / 4, 3);
    const int pairs = quads < 3 && (left - 4 * quads) >= 2 ? 1 : 0;
    switch (quads * 2 + pairs) {
      case 7:
        AccumulateQuads<3, 1, kSquares>(rows + done, count, sums + done);
        break;
      case 6:
        AccumulateQuads<3, 0, kSquares>(rows + done, count, sums + done);
        break;
      case 5:
        AccumulateQuads<2, 1, kSquares>(rows + done, count, sums + done);
        break;
      case 4:
        AccumulateQuads<2, 0, kSquares>(rows + done, count, sums + done);
        break;
      case 3:
        AccumulateQuads<1, 1, kSquares>(rows + done, count, sums + done);
        break;
      case 2:
        AccumulateQuads<1, 0, kSquares>(rows + done, count, sums + done);
        break;
      default:
        AccumulateQuads<0, 1, kSquares>(rows + done, count, sums + done);
        break;
    }
    done += 4 * quads + 2 * pairs;
  }
  return done;
}
#endif

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

void AccumulateRowBlock(const float* const* rows, int count_rows, int64_t count, double alpha,
                        EntropySums* sums) {
#if defined(__x86_64__) && defined(__GNUC__)
  if ((alpha == 2.0 || std::isinf(alpha)) && HaveAvx2()) {
    const int done = alpha == 2.0 ? AccumulateQuadBlocks<true>(rows, count_rows, count, sums)
                                  : AccumulateQuadBlocks<false>(rows, count_rows, count, sums);
    rows += done;
    sums += done;
    count_rows -= done;
  }
#endif
#if defined(__SSE2__)
  if (alpha == 2.0 || std::isinf(alpha)) {
    const int pairs = count_rows / 2;
    if (alpha == 2.0) {
      AccumulatePairBlocks<true>(rows, pairs, count, sums);
    } else {
      AccumulatePairBlocks<false>(rows, pairs, count, sums);
    }
    rows += 2 * pairs;
    sums += 2 * pairs;
    count_rows -= 2 * pairs;
  }
#endif
  while (count_rows > 0) {
    const int block = std::min(count_rows, 4);
    switch (block) {
      case 4:
        AccumulateRows<4>(rows, count, alpha, sums);
        break;
      case 3:
        AccumulateRows<3>(rows, count, alpha, sums);
        break;
      case 2:
        AccumulateRows<2>(rows, count, alpha, sums);
        break;
      default:
        AccumulateRows<1>(rows, count, alpha, sums);
        break;
    }
    rows += block;
    sums += block;
    count_rows -= block;
  }
}

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

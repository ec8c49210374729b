// Why the fused path gives the reference's bits:
//  - Entropy sums: every head's total and power are accumulated in double in token order with
//    the same operations as AccumulateEntropySums; several heads run side by side only so that
//    their independent dependency chains overlap. EntropyFromSums and EntropyWeights are shared.
//  - Pooling: each token's pooled value starts at 0.0f and adds float(w_h) * x_h head by head in
//    head order, as PoolRows does; only the loop order over tokens changes (chunk by chunk,
//    the pooled chunk stays in L1), never the operations on one token.
//  - Page maxima: the pooled values hold no NaN and no -0 (validated inputs, sums from +0), so
//    the maximum is the same value whatever the order in which it is taken.
//  - Selection: a page's key is its score's bits (ordered as the scores, which are >= 0), with
//    bit 31 set for protected pages; the protected pages and then the pages the reference order
//    (score desc, index asc) ranks first are the pages above the K-th key plus the first pages
//    in page order equal to it. A radix select finds the K-th key and how many of its equals
//    are kept; one scan in page order emits the kept pages already ascending.
//  - Measure: each head's page maxima are taken from the rows pass 2 reads (order-independent;
//    a row may hold -0, but a page maximum of -0 or +0 gives the same key); the shadow is the same
//    key selection without protections; the head-mean row is computed beside the pooled row from
//    the same loads with MeasureGroup's operations per token (float(1 / r) * x added head by head
//    from 0); its page sums and the retained mass use the shared PageSums and
//    RetainedMassFromPageSums (metrics.h).
#include "core/scoring/fused_scorer.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <functional>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/scoring/entropy.h"
#include "core/scoring/layer_scope.h"
#include "core/scoring/metrics.h"
#include "core/scoring/pages.h"
#include "core/scoring/selection.h"
#include "core/scoring/weights.h"
#include "core/util/status_macros.h"

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace entrokv {
namespace {

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

enum class Pooling : uint8_t { kNone, kEntropy, kRawEntropy, kMean, kMax };

Pooling PoolingOf(const Policy& policy) {
  const absl::string_view name = policy.name();
  if (name == "page_entrokv") return Pooling::kEntropy;
  if (name == "raw_entropy") return Pooling::kRawEntropy;
  if (name == "mean" || name == "h2o") return Pooling::kMean;
  if (name == "max") return Pooling::kMax;
  return Pooling::kNone;
}

// Tokens per chunk of the pooled row: whole pages, about 8 KiB of floats.
int64_t ChunkTokens(int page_size) {
  return static_cast<int64_t>(page_size) * std::max<int64_t>(1, 2048 / page_size);
}

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

// The entropy sums of count_rows rows over `count` tokens, continuing `sums`.
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

// Whether every x is finite and >= 0, the reference's test !(x >= 0 && x < inf) (so -0 passes).
// The pooling kernels fold it into their pass and report whether all values passed.
inline bool ValueOk(float x) { return x >= 0.0f && x < INFINITY; }

// pooled[t] = ((0 + w_0 x_0[t]) + w_1 x_1[t]) + ..., head by head in head order, one IEEE
// multiply and add per head as in PoolRows, but with the running value kept in a register and
// every row read once. With `kMax`, pooled[t] = max(...max(0, x_0[t])..., x_r-1[t]) as
// MaxPolicy computes it. With `kMean`, also mean[t] = ((0 + m x_0[t]) + m x_1[t]) + ..., the
// head-mean row of MeasureGroup (m = float(1 / r)), from the same loads. Returns whether every
// value passed ValueOk.
template <bool kMax, bool kMean>
bool PoolChunk(const float* const* rows, const float* weights, int count_rows, int64_t begin,
               int64_t count, float* pooled, float mean_weight, float* mean) {
  int64_t t = begin;
  bool ok = true;
#if defined(__SSE2__)
  const __m128 zero = _mm_setzero_ps();
  const __m128 inf = _mm_set1_ps(INFINITY);
  const __m128 m = _mm_set1_ps(mean_weight);
  __m128 all_ok = _mm_castsi128_ps(_mm_set1_epi32(-1));
  for (; t + 4 <= count; t += 4) {
    __m128 acc = _mm_setzero_ps();
    __m128 mean_acc = _mm_setzero_ps();
    for (int i = 0; i < count_rows; ++i) {
      const __m128 v = _mm_loadu_ps(rows[i] + t);
      // maxps(v, acc) = v > acc ? v : acc, which is std::max(acc, v).
      acc = kMax ? _mm_max_ps(v, acc) : _mm_add_ps(acc, _mm_mul_ps(_mm_set1_ps(weights[i]), v));
      if (kMean) mean_acc = _mm_add_ps(mean_acc, _mm_mul_ps(m, v));
      all_ok = _mm_and_ps(all_ok, _mm_and_ps(_mm_cmpge_ps(v, zero), _mm_cmplt_ps(v, inf)));
    }
    _mm_storeu_ps(pooled + t, acc);
    if (kMean) _mm_storeu_ps(mean + t, mean_acc);
  }
  ok = _mm_movemask_ps(all_ok) == 0xf;
#endif
  for (; t < count; ++t) {
    float acc = 0.0f;
    float mean_acc = 0.0f;
    for (int i = 0; i < count_rows; ++i) {
      const float x = rows[i][t];
      acc = kMax ? std::max(acc, x) : acc + weights[i] * x;
      if (kMean) mean_acc = mean_acc + mean_weight * x;
      ok &= ValueOk(x);
    }
    pooled[t] = acc;
    if (kMean) mean[t] = mean_acc;
  }
  return ok;
}

#if defined(__x86_64__) && defined(__GNUC__)
// PoolChunk eight tokens at a time; the same per-lane operations (VEX encodings of the same
// IEEE multiply, add and max; no FMA is enabled, so nothing is contracted).
template <bool kMax, bool kMean>
__attribute__((target("avx2"))) bool PoolChunkAvx2(const float* const* rows, const float* weights,
                                                   int count_rows, int64_t count, float* pooled,
                                                   float mean_weight, float* mean) {
  const __m256 zero = _mm256_setzero_ps();
  const __m256 inf = _mm256_set1_ps(INFINITY);
  const __m256 m = _mm256_set1_ps(mean_weight);
  __m256 all_ok = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  int64_t t = 0;
  for (; t + 8 <= count; t += 8) {
    __m256 acc = zero;
    __m256 mean_acc = zero;
    for (int i = 0; i < count_rows; ++i) {
      const __m256 v = _mm256_loadu_ps(rows[i] + t);
      acc = kMax ? _mm256_max_ps(v, acc)
                 : _mm256_add_ps(acc, _mm256_mul_ps(_mm256_broadcast_ss(weights + i), v));
      if (kMean) mean_acc = _mm256_add_ps(mean_acc, _mm256_mul_ps(m, v));
      all_ok = _mm256_and_ps(all_ok, _mm256_and_ps(_mm256_cmp_ps(v, zero, _CMP_GE_OQ),
                                                   _mm256_cmp_ps(v, inf, _CMP_LT_OQ)));
    }
    _mm256_storeu_ps(pooled + t, acc);
    if (kMean) _mm256_storeu_ps(mean + t, mean_acc);
  }
  const bool ok = _mm256_movemask_ps(all_ok) == 0xff;
  return PoolChunk<kMax, kMean>(rows, weights, count_rows, t, count, pooled, mean_weight, mean) &&
         ok;
}

#else
template <bool kMax, bool kMean>
bool PoolChunkAvx2(const float* const* rows, const float* weights, int count_rows, int64_t count,
                   float* pooled, float mean_weight, float* mean) {
  return PoolChunk<kMax, kMean>(rows, weights, count_rows, 0, count, pooled, mean_weight, mean);
}
#endif

template <bool kMax, bool kMean>
bool PoolAnyChunk(const float* const* rows, const float* weights, int count_rows, int64_t count,
                  float* pooled, float mean_weight, float* mean) {
  return HaveAvx2() ? PoolChunkAvx2<kMax, kMean>(rows, weights, count_rows, count, pooled,
                                                 mean_weight, mean)
                    : PoolChunk<kMax, kMean>(rows, weights, count_rows, 0, count, pooled,
                                             mean_weight, mean);
}

// The pooled chunk (and, when `mean` is not null, the head-mean chunk) of count_rows rows.
bool PoolRowsChunk(bool max, const float* const* rows, const float* weights, int count_rows,
                   int64_t count, float* pooled, float mean_weight, float* mean) {
  if (max) {
    return mean != nullptr
               ? PoolAnyChunk<true, true>(rows, weights, count_rows, count, pooled, mean_weight,
                                          mean)
               : PoolAnyChunk<true, false>(rows, weights, count_rows, count, pooled, 0.0f, nullptr);
  }
  return mean != nullptr
             ? PoolAnyChunk<false, true>(rows, weights, count_rows, count, pooled, mean_weight,
                                         mean)
             : PoolAnyChunk<false, false>(rows, weights, count_rows, count, pooled, 0.0f, nullptr);
}

// Page keys want the same bits for +0 and -0 (the reference compares them equal).
inline uint32_t ScoreBits(float value) {
  return value == 0.0f ? 0u : std::bit_cast<uint32_t>(value);
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

// maxima[b] = the max of values over page b of [0, count); the partial last page counts with
// its real tokens. REQUIRES: no NaN (so the max is order-independent; -0 and +0 may swap).
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

// keys[b] = the score's bits (+0 for -0); scores are >= 0, so bit 31 is free for protected
// pages. A larger key ranks first; equal keys rank by page index, lower first.
void FillKeys(const float* scores, int64_t pages, uint32_t* keys) {
  for (int64_t page = 0; page < pages; ++page) keys[page] = ScoreBits(scores[page]);
}

// The quota-th largest key, counting repeats, and how many of the keys equal to it are kept
// (the first ones in page order).
struct Boundary {
  uint32_t key;
  int64_t equal_kept;
  int64_t equal_total;  // keys equal to `key`
};

// Boundary of keys[0, pages) by an MSD radix select: the digits are 11-bit slices from the
// highest bit in which the keys differ (so the first level spreads them even when the scores
// share their exponent), and each level keeps the candidates whose digit is the boundary one.
// A few candidates left are ranked by nth_element. Linear, with no data-dependent branch in the
// passes over all the keys. `work` holds `pages` keys. REQUIRES: 1 <= quota <= pages.
Boundary FindBoundary(const uint32_t* keys, int64_t pages, int64_t quota, uint32_t* work) {
  constexpr int kDigitBits = 11;
  constexpr int64_t kFewCandidates = 64;
  uint32_t differing = 0;
  for (int64_t i = 0; i < pages; ++i) differing |= keys[i] ^ keys[0];
  // Four histograms, key i counted in histogram i % 4: keys that share a digit (scores of one
  // binade) then do not serialize on one counter in memory.
  uint32_t histogram[4][1 << kDigitBits];
  const uint32_t* candidates = keys;
  int64_t count = pages;
  int64_t rank = quota;  // among the candidates, 1 = the largest
  int high = differing == 0 ? -1 : std::bit_width(differing) - 1;
  for (; high >= 0 && count > kFewCandidates; high -= kDigitBits) {
    const int low = std::max(high - kDigitBits + 1, 0);
    const uint32_t mask = (uint32_t{1} << (high - low + 1)) - 1;
    for (auto& part : histogram) std::fill(part, part + mask + 1, 0u);
    int64_t i = 0;
    for (; i + 4 <= count; i += 4) {
      for (int part = 0; part < 4; ++part) ++histogram[part][(candidates[i + part] >> low) & mask];
    }
    for (; i < count; ++i) ++histogram[0][(candidates[i] >> low) & mask];
    auto in_digit = [&](uint32_t digit) {
      return int64_t{histogram[0][digit]} + histogram[1][digit] + histogram[2][digit] +
             histogram[3][digit];
    };
    uint32_t digit = mask;
    while (rank > in_digit(digit)) rank -= in_digit(digit--);
    // The candidates share every bit above `high`, so the boundary digit's keys are the range
    // [base, base + 2^low).
    const uint32_t prefix = high >= 31 ? 0 : (candidates[0] >> (high + 1)) << (high + 1);
    const uint32_t base = prefix | (digit << low);
    const uint32_t width_minus_one = (uint32_t{1} << low) - 1;
    int64_t kept = 0;
    for (int64_t j = 0; j < count; ++j) {  // in place when candidates == work: kept <= j
      const uint32_t key = candidates[j];
      work[kept] = key;
      kept += key - base <= width_minus_one ? 1 : 0;
    }
    candidates = work;
    count = kept;
  }
  if (high < 0) return {candidates[0], rank, count};  // every candidate is the same key
  if (candidates != work) std::copy(candidates, candidates + count, work);
  std::nth_element(work, work + rank - 1, work + count, std::greater<uint32_t>());
  const uint32_t key = work[rank - 1];
  int64_t greater = 0;
  int64_t equal = 0;
  for (int64_t j = 0; j < count; ++j) {
    greater += work[j] > key ? 1 : 0;
    equal += work[j] == key ? 1 : 0;
  }
  return {key, rank - greater, equal};
}

// The `quota` first pages in (key desc, index asc) order, in page order, into *kept. `work`
// holds `pages` keys. REQUIRES: 1 <= quota < pages.
void KeepLargestKeys(const uint32_t* keys, int64_t pages, int64_t quota, uint32_t* work,
                     std::vector<int32_t>* kept) {
  const Boundary boundary = FindBoundary(keys, pages, quota, work);
  // Exactly `quota` pages pass; the extra slot takes the unconditional store after the last.
  kept->resize(static_cast<size_t>(quota) + 1);
  int32_t* out = kept->data();
  int64_t emitted = 0;
  if (boundary.equal_kept == boundary.equal_total) {  // no tie cut at the boundary
    for (int64_t page = 0; page < pages; ++page) {
      out[emitted] = static_cast<int32_t>(page);
      emitted += keys[page] >= boundary.key ? 1 : 0;
    }
    kept->resize(static_cast<size_t>(quota));
    return;
  }
  int64_t equal_left = boundary.equal_kept;
  for (int64_t page = 0; page < pages; ++page) {
    const uint32_t key = keys[page];
    const bool equal = key == boundary.key;
    out[emitted] = static_cast<int32_t>(page);
    emitted += (key > boundary.key) | (equal & (equal_left > 0)) ? 1 : 0;
    equal_left -= equal ? 1 : 0;
  }
  kept->resize(static_cast<size_t>(quota));
}

void KeepAllPages(int64_t pages, std::vector<int32_t>* kept) {
  kept->resize(static_cast<size_t>(pages));
  for (int64_t page = 0; page < pages; ++page)
    (*kept)[static_cast<size_t>(page)] = static_cast<int32_t>(page);
}

}  // namespace

bool IsFusedPolicy(const Policy& policy) { return PoolingOf(policy) != Pooling::kNone; }

const float* FusedScorer::Tokens(const LayerRequest& request, int head, int64_t first,
                                 int64_t count, float* buffer) const {
  const StatisticView& statistic = *request.statistic;
  const int64_t offset = static_cast<int64_t>(head) * statistic.tokens() + first;
  if (statistic.dtype() == DType::kFloat32) {
    return static_cast<const float*>(statistic.data()) + offset;
  }
  WidenToFloat(static_cast<const uint16_t*>(statistic.data()) + offset, statistic.dtype(), count,
               buffer);
  return buffer;
}

bool FusedScorer::DecideGroup(const Policy& policy, const LayerRequest& request, int group,
                              GroupDecision* decision) {
  const Pooling pooling = PoolingOf(policy);
  const int r = request.query_heads / request.kv_groups;
  const int first_head = group * r;
  const int64_t tokens = request.tokens;
  const int page_size = options_.page_size;
  const int64_t chunk = ChunkTokens(page_size);
  const bool widen = request.statistic->dtype() != DType::kFloat32;
  if (widen) widened_.resize(static_cast<size_t>(chunk) * static_cast<size_t>(r));
  auto buffer = [&](int i) {
    return widen ? widened_.data() + static_cast<size_t>(i) * static_cast<size_t>(chunk) : nullptr;
  };

  // Weights (pass 1 for the entropy policies).
  std::vector<double>& weights = decision->weights;
  if (pooling == Pooling::kMean) {
    weights.assign(static_cast<size_t>(r), 1.0 / static_cast<double>(r));
  } else if (pooling == Pooling::kEntropy || pooling == Pooling::kRawEntropy) {
    if (!request.cached_weights.empty()) {
      const auto cached =
          request.cached_weights.subspan(static_cast<size_t>(first_head), static_cast<size_t>(r));
      weights.assign(cached.begin(), cached.end());
    } else {
      const int64_t sinks =
          std::min<int64_t>(pooling == Pooling::kEntropy ? options_.sink_tokens : 0, tokens);
      decision->entropies.resize(static_cast<size_t>(r));
      if (IsOnePassOrder(options_.alpha)) {
        std::vector<EntropySums> sums(static_cast<size_t>(r));
        row_pointers_.resize(static_cast<size_t>(r));
        const float** rows = row_pointers_.data();
        for (int64_t first = sinks; first < tokens; first += chunk) {
          const int64_t count = std::min(chunk, tokens - first);
          for (int i = 0; i < r; ++i) {
            rows[i] = Tokens(request, first_head + i, first, count, buffer(i));
          }
          AccumulateRowBlock(rows, r, count, options_.alpha, sums.data());
        }
        for (int i = 0; i < r; ++i) {
          decision->entropies[static_cast<size_t>(i)] =
              EntropyFromSums(sums[static_cast<size_t>(i)], options_.alpha, tokens - sinks);
        }
      } else {
        // The general order reads each row twice (normalise, then powers): the shared function.
        std::vector<float> row_buffer;
        for (int i = 0; i < r; ++i) {
          const std::span<const float> row = request.statistic->Row(first_head + i, &row_buffer);
          decision->entropies[static_cast<size_t>(i)] =
              SinkIsolatedEntropy(row, static_cast<int>(sinks), options_.alpha);
        }
      }
      weights = EntropyWeights(decision->entropies, options_.tau);
    }
  }

  // Pass 2: pooled page maxima, chunk by chunk, validating every value on the way.
  const int64_t pages = PageCount(tokens, page_size);
  page_max_.resize(static_cast<size_t>(pages));
  pooled_.resize(static_cast<size_t>(chunk));
  float_weights_.resize(static_cast<size_t>(r));
  for (int i = 0; i < r && !weights.empty(); ++i) {
    float_weights_[static_cast<size_t>(i)] = static_cast<float>(weights[static_cast<size_t>(i)]);
  }
  row_pointers_.resize(static_cast<size_t>(r));
  // With `measure`, the same pass also gives each head's page maxima and the page sums of the
  // head-mean row, which MeasureGroup builds as mean[t] = ((0 + w x_0[t]) + w x_1[t]) + ... with
  // w = float(1 / r), computed by the pooling kernel from the same loads.
  const bool measure = request.measure;
  const bool mean_is_pooled = pooling == Pooling::kMean;
  if (measure) {
    head_max_.resize(static_cast<size_t>(r) * static_cast<size_t>(pages));
    page_sums_.resize(static_cast<size_t>(pages));
    if (!mean_is_pooled) mean_.resize(static_cast<size_t>(chunk));
  }
  const auto mean_weight = static_cast<float>(1.0 / static_cast<double>(r));
  bool ok = true;
  // Backwards, chunk by chunk: the end of the rows, read last by pass 1, is still in L2. Each
  // chunk holds whole pages and each token's arithmetic is the same in any chunk order.
  const int64_t last_chunk_first = (tokens - 1) / chunk * chunk;
  for (int64_t first = last_chunk_first; first >= 0; first -= chunk) {
    const int64_t count = std::min(chunk, tokens - first);
    float* pooled = pooled_.data();
    for (int i = 0; i < r; ++i) {
      row_pointers_[static_cast<size_t>(i)] =
          Tokens(request, first_head + i, first, count, buffer(i));
    }
    // For mean and h2o the pooled row is the head-mean row already.
    float* mean = measure && !mean_is_pooled ? mean_.data() : nullptr;
    ok &= PoolRowsChunk(pooling == Pooling::kMax, row_pointers_.data(), float_weights_.data(), r,
                        count, pooled, mean_weight, mean);
    const int64_t first_page = first / page_size;
    PageMaximaOf(pooled, count, page_size, page_max_.data() + first_page);
    if (measure) {
      const int64_t chunk_pages = PageCount(count, page_size);
      for (int i = 0; i < r; ++i) {
        const float* row = row_pointers_[static_cast<size_t>(i)];
        float* maxima =
            head_max_.data() + static_cast<size_t>(i) * static_cast<size_t>(pages) + first_page;
        PageMaximaOf(row, count, page_size, maxima);
      }
      const float* mean = mean_is_pooled ? pooled : mean_.data();
      PageSums(std::span<const float>(mean, static_cast<size_t>(count)), page_size,
               std::span<double>(page_sums_.data() + first_page, static_cast<size_t>(chunk_pages)));
    }
  }
  if (!ok) return false;

  // Selection.
  const int64_t quota = std::min(request.quota_pages, pages);
  std::vector<int32_t>& kept = decision->kept_pages;
  keys_.resize(static_cast<size_t>(pages) * 2);
  uint32_t* keys = keys_.data();
  if (quota == pages) {
    KeepAllPages(pages, &kept);
  } else {
    FillKeys(page_max_.data(), pages, keys);
    // Protections in the reference's order, each counted inside the quota.
    const Protections protections = EffectiveProtections(options_);
    int64_t protected_count = 0;
    auto protect = [&](int64_t page) {
      if (page < 0 || page >= pages || (keys[page] >> 31) != 0 || protected_count >= quota) {
        return;
      }
      keys[page] |= uint32_t{1} << 31;
      ++protected_count;
    };
    if (protections.tail_page) protect(pages - 1);
    if (protections.sink_pages) {
      const int64_t sink_pages =
          (protections.sink_tokens + protections.page_size - 1) / protections.page_size;
      for (int64_t page = 0; page < sink_pages; ++page) protect(page);
    }
    for (int64_t i = 0; i < protections.recent_pages; ++i) protect(pages - 1 - i);
    KeepLargestKeys(keys, pages, quota, keys + pages, &kept);
  }
  if (request.measure) Measure(r, pages, quota, decision);
  return true;
}

void FusedScorer::Measure(int r, int64_t pages, int64_t quota, GroupDecision* decision) {
  // The head-independent shadow: each head's own top-K of its page maxima, no protections, as
  // MeasureGroup selects them.
  head_kept_.resize(static_cast<size_t>(r));
  uint32_t* keys = keys_.data();
  for (int i = 0; i < r; ++i) {
    std::vector<int32_t>& kept = head_kept_[static_cast<size_t>(i)];
    if (quota == pages) {
      KeepAllPages(pages, &kept);
      continue;
    }
    FillKeys(head_max_.data() + static_cast<size_t>(i) * static_cast<size_t>(pages), pages, keys);
    KeepLargestKeys(keys, pages, quota, keys + pages, &kept);
  }
  const std::span<const std::vector<int32_t>> sets(head_kept_.data(), static_cast<size_t>(r));
  decision->shadow_uor = UnionOverheadRatio(sets, quota);
  decision->disagreement = PairwiseJaccard(sets).disagreement();
  decision->retained_mass = RetainedMassFromPageSums(
      std::span<const double>(page_sums_.data(), static_cast<size_t>(pages)), decision->kept_pages);
}

absl::StatusOr<LayerDecision> FusedScorer::DecideLayer(const Policy& policy,
                                                       const LayerRequest& request) {
  if (!IsFusedPolicy(policy)) return entrokv::DecideLayer(policy, options_, request);
  RETURN_IF_ERROR(ValidateLayerRequest(policy, options_, request, /*check_values=*/false));
  LayerDecision decision;
  decision.page_count = PageCount(request.tokens, options_.page_size);
  decision.quota_pages = request.quota_pages;
  decision.groups.resize(static_cast<size_t>(request.kv_groups));
  const bool layer_scope = request.scope == SelectionScope::kLayer;
  const auto pages = static_cast<size_t>(decision.page_count);
  const auto groups = static_cast<size_t>(request.kv_groups);
  if (layer_scope) {
    layer_scores_.resize(groups * pages);
    if (request.measure) layer_page_sums_.resize(groups * pages);
  }
  for (int g = 0; g < request.kv_groups; ++g) {
    if (!DecideGroup(policy, request, g, &decision.groups[static_cast<size_t>(g)])) {
      RETURN_IF_ERROR(request.statistic->ValidateValues());
      return absl::InternalError("statistic: fused validation disagrees with ValidateValues");
    }
    if (layer_scope) {  // the group's page scores (and page sums) outlive the next group
      const size_t at = static_cast<size_t>(g) * pages;
      std::copy(page_max_.begin(), page_max_.begin() + static_cast<ptrdiff_t>(pages),
                layer_scores_.begin() + static_cast<ptrdiff_t>(at));
      if (request.measure) {
        std::copy(page_sums_.begin(), page_sums_.begin() + static_cast<ptrdiff_t>(pages),
                  layer_page_sums_.begin() + static_cast<ptrdiff_t>(at));
      }
    }
  }
  if (!layer_scope) {
    FinishGroupScope(&decision);
    return decision;
  }
  std::vector<std::span<const float>> scores(groups);
  for (size_t g = 0; g < groups; ++g) {
    scores[g] = std::span<const float>(layer_scores_.data() + g * pages, pages);
  }
  ApplyLayerScope(scores, request.combine, options_, &decision);
  if (request.measure) {  // retained mass against the layer's set, as MeasureGroup takes it
    for (size_t g = 0; g < groups; ++g) {
      GroupDecision& group = decision.groups[g];
      group.retained_mass = RetainedMassFromPageSums(
          std::span<const double>(layer_page_sums_.data() + g * pages, pages), group.kept_pages);
    }
  }
  return decision;
}

absl::StatusOr<std::vector<LayerDecision>> DecideModel(const Policy& policy,
                                                       const PolicyOptions& options,
                                                       std::span<const LayerRequest> requests,
                                                       int threads) {
  std::vector<std::optional<absl::StatusOr<LayerDecision>>> results(requests.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    FusedScorer scorer(options);
    for (size_t l = next.fetch_add(1); l < requests.size(); l = next.fetch_add(1)) {
      results[l] = scorer.DecideLayer(policy, requests[l]);
    }
  };
  const int workers = static_cast<int>(
      std::min<size_t>(static_cast<size_t>(std::max(threads, 1)), requests.size()));
  if (workers <= 1) {
    work();
  } else {
    std::vector<std::thread> pool;
    pool.reserve(static_cast<size_t>(workers));
    for (int i = 0; i < workers; ++i) pool.emplace_back(work);
    for (std::thread& thread : pool) thread.join();
  }
  std::vector<LayerDecision> decisions;
  decisions.reserve(requests.size());
  for (auto& result : results) {
    if (!result->ok()) return result->status();
    decisions.push_back(*std::move(*result));
  }
  return decisions;
}

}  // namespace entrokv

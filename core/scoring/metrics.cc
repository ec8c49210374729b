#include "core/scoring/metrics.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <iterator>

#include "core/scoring/pages.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace entrokv {

namespace {

// The sets as bitmaps over [0, largest index], set i in bits[i * words, (i + 1) * words), when
// that is small (at most about 16 bytes per element) and the sets hold what the interface
// documents: no negative and no repeated index. Otherwise returns false and the callers merge
// sorted sets instead. Both give the same counts, so the same results; the bitmaps are linear
// and branch-free, which matters because the fused scorer measures every decision.
bool MapSets(std::span<const std::vector<int32_t>> sets, size_t* words,
             std::vector<uint64_t>* bits) {
  int64_t largest = -1;
  size_t elements = 0;
  for (const auto& set : sets) {
    elements += set.size();
    for (const int32_t index : set) {
      if (index < 0) return false;
      largest = std::max<int64_t>(largest, index);
    }
  }
  *words = static_cast<size_t>(largest / 64 + 1);
  if (*words * sets.size() > 2 * elements + 4096) return false;
  bits->assign(*words * sets.size(), 0);
  for (size_t i = 0; i < sets.size(); ++i) {
    uint64_t* map = bits->data() + i * *words;
    uint64_t repeated = 0;
    for (const int32_t index : sets[i]) {
      const uint64_t bit = uint64_t{1} << (index & 63);
      repeated |= map[index >> 6] & bit;
      map[index >> 6] |= bit;
    }
    if (repeated != 0) return false;
  }
  return true;
}

// |a & b| over `words` words.
int64_t CommonBits(const uint64_t* a, const uint64_t* b, size_t words) {
  int64_t count = 0;
  for (size_t w = 0; w < words; ++w) count += std::popcount(a[w] & b[w]);
  return count;
}

#if defined(__SSE2__)
// PageSums of eight whole pages, two pages per register (page 2q in the low lane, 2q + 1 in the
// high one): each lane adds its page's tokens, widened exactly, in token order from 0, the
// scalar loop's operations, so the same bits; the four registers' add chains overlap.
void EightPageSums(const float* values, int page_size, double* sums) {
  __m128d total[4];
  const float* first[8];
  for (int p = 0; p < 8; ++p) first[p] = values + static_cast<int64_t>(p) * page_size;
  for (int q = 0; q < 4; ++q) total[q] = _mm_setzero_pd();
  int t = 0;
  for (; t + 4 <= page_size; t += 4) {
    for (int q = 0; q < 4; ++q) {
      const __m128 a = _mm_loadu_ps(first[2 * q] + t);
      const __m128 b = _mm_loadu_ps(first[2 * q + 1] + t);
      const __m128 low = _mm_unpacklo_ps(a, b);   // a0 b0 a1 b1
      const __m128 high = _mm_unpackhi_ps(a, b);  // a2 b2 a3 b3
      total[q] = _mm_add_pd(total[q], _mm_cvtps_pd(low));
      total[q] = _mm_add_pd(total[q], _mm_cvtps_pd(_mm_movehl_ps(low, low)));
      total[q] = _mm_add_pd(total[q], _mm_cvtps_pd(high));
      total[q] = _mm_add_pd(total[q], _mm_cvtps_pd(_mm_movehl_ps(high, high)));
    }
  }
  for (; t < page_size; ++t) {
    for (int q = 0; q < 4; ++q) {
      total[q] = _mm_add_pd(total[q], _mm_set_pd(first[2 * q + 1][t], first[2 * q][t]));
    }
  }
  for (int q = 0; q < 4; ++q) _mm_storeu_pd(sums + 2 * q, total[q]);
}
#endif

}  // namespace

double UnionOverheadRatio(std::span<const std::vector<int32_t>> sets, int64_t k) {
  size_t words = 0;
  std::vector<uint64_t> bits;
  int64_t distinct = 0;
  if (MapSets(sets, &words, &bits)) {
    for (size_t w = 0; w < words; ++w) {
      uint64_t any = 0;
      for (size_t i = 0; i < sets.size(); ++i) any |= bits[i * words + w];
      distinct += std::popcount(any);
    }
  } else {
    std::vector<int32_t> all;
    for (const auto& set : sets) all.insert(all.end(), set.begin(), set.end());
    std::sort(all.begin(), all.end());
    distinct = std::unique(all.begin(), all.end()) - all.begin();
  }
  return static_cast<double>(distinct) / static_cast<double>(k);
}

JaccardSummary PairwiseJaccard(std::span<const std::vector<int32_t>> sets) {
  JaccardSummary summary;
  if (sets.size() < 2) return summary;
  size_t words = 0;
  std::vector<uint64_t> bits;
  const bool mapped = MapSets(sets, &words, &bits);
  double sum = 0.0;
  double max_similarity = 0.0;
  int pairs = 0;
  std::vector<int32_t> common;
  for (size_t i = 0; i < sets.size(); ++i) {
    for (size_t j = i + 1; j < sets.size(); ++j) {
      int64_t common_count = 0;
      if (mapped) {
        common_count = CommonBits(bits.data() + i * words, bits.data() + j * words, words);
      } else {
        common.clear();
        std::set_intersection(sets[i].begin(), sets[i].end(), sets[j].begin(), sets[j].end(),
                              std::back_inserter(common));
        common_count = static_cast<int64_t>(common.size());
      }
      const double both = static_cast<double>(common_count);
      const double either = static_cast<double>(sets[i].size() + sets[j].size()) - both;
      const double similarity = either > 0.0 ? both / either : 1.0;
      sum += similarity;
      max_similarity = std::max(max_similarity, similarity);
      ++pairs;
    }
  }
  summary.mean_similarity = sum / pairs;
  summary.max_similarity = max_similarity;
  return summary;
}

double BonferroniLowerBound(int r, double mean_similarity) {
  return std::max(1.0, r - static_cast<double>(r) * (r - 1) * mean_similarity);
}

UorBounds SandwichBounds(int r, double mean_similarity, double max_similarity) {
  const double lower = r / (1.0 + 2.0 * (r - 1) * mean_similarity / (1.0 + mean_similarity));
  const double upper =
      std::min(static_cast<double>(r), r - 2.0 * max_similarity / (1.0 + max_similarity));
  return {lower, upper};
}

void PageSums(std::span<const float> values, int page_size, std::span<double> sums) {
  const auto tokens = static_cast<int64_t>(values.size());
  const float* data = values.data();
  size_t page = 0;
#if defined(__SSE2__)
  for (const size_t whole_pages = static_cast<size_t>(tokens / page_size);
       page + 8 <= whole_pages && page + 8 <= sums.size(); page += 8) {
    EightPageSums(data + static_cast<int64_t>(page) * page_size, page_size, sums.data() + page);
  }
#endif
  for (; page < sums.size(); ++page) {
    const int64_t begin = static_cast<int64_t>(page) * page_size;
    const int64_t end = std::min<int64_t>(begin + page_size, tokens);
    double sum = 0.0;
    for (int64_t t = begin; t < end; ++t) sum += data[t];
    sums[page] = sum;
  }
}

double RetainedMassFromPageSums(std::span<const double> page_sums,
                                std::span<const int32_t> kept_pages) {
  double total = 0.0;
  for (const double sum : page_sums) total += sum;
  if (!(total > 0.0)) return 1.0;
  double kept = 0.0;
  for (const int32_t page : kept_pages) kept += page_sums[static_cast<size_t>(page)];
  return kept / total;
}

double RetainedMass(std::span<const float> values, int page_size,
                    std::span<const int32_t> kept_pages) {
  std::vector<double> sums(
      static_cast<size_t>(PageCount(static_cast<int64_t>(values.size()), page_size)));
  PageSums(values, page_size, sums);
  return RetainedMassFromPageSums(sums, kept_pages);
}

double NeedleBoundDelta(int64_t tokens, int r, double tau, double eta_ret, double needle_mass,
                        int sink_tokens) {
  const double c_ret = std::exp(-eta_ret / tau);
  const double d = (r - 1) * std::pow(static_cast<double>(tokens - sink_tokens), -1.0 / tau);
  return needle_mass * d / (c_ret + d);
}

double MeanPooledNeedle(int64_t tokens, int r, double needle_mass) {
  return (needle_mass + static_cast<double>(r - 1) / static_cast<double>(tokens)) / r;
}

}  // namespace entrokv

#include "core/scoring/radix_select.h"

#include <algorithm>
#include <bit>
#include <functional>

namespace entrokv {
namespace {

// Page keys want the same bits for +0 and -0 (the reference compares them equal).
inline uint32_t ScoreBits(float value) {
  return value == 0.0f ? 0u : std::bit_cast<uint32_t>(value);
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

}  // namespace

void FillKeys(const float* scores, int64_t pages, uint32_t* keys) {
  for (int64_t page = 0; page < pages; ++page) keys[page] = ScoreBits(scores[page]);
}

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

}  // namespace entrokv

// Exact top-K of page keys by an MSD radix select (the fused scorer's selection): a page's key
// is its score's bits, so keys order as the scores do; the kept pages are the `quota` first in
// (key desc, index asc) order, the reference order of selection.h, emitted ascending.
#ifndef ENTROKV_CORE_SCORING_RADIX_SELECT_H_
#define ENTROKV_CORE_SCORING_RADIX_SELECT_H_

#include <cstdint>
#include <vector>

namespace entrokv {

// keys[b] = the bits of scores[b] (+0 for -0): for scores >= 0 a larger key is a larger score,
// and bit 31 stays free (the fused scorer sets it on protected pages).
void FillKeys(const float* scores, int64_t pages, uint32_t* keys);

// The `quota` first pages in (key desc, index asc) order, in page order, into *kept. `work`
// holds `pages` keys. Linear in `pages`. REQUIRES: 1 <= quota < pages.
void KeepLargestKeys(const uint32_t* keys, int64_t pages, int64_t quota, uint32_t* work,
                     std::vector<int32_t>* kept);

// *kept = 0, 1, ..., pages - 1.
void KeepAllPages(int64_t pages, std::vector<int32_t>* kept);

}  // namespace entrokv

#endif  // ENTROKV_CORE_SCORING_RADIX_SELECT_H_

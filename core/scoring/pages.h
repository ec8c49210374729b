// Token-to-page projection (ARCHITECTURE §3.6): page b covers tokens [bB, min((b+1)B, T)).
#ifndef ENTROKV_CORE_SCORING_PAGES_H_
#define ENTROKV_CORE_SCORING_PAGES_H_

#include <cstdint>
#include <span>
#include <vector>

namespace entrokv {

// ceil(tokens / page_size). REQUIRES: page_size > 0, tokens >= 0.
[[nodiscard]] constexpr int64_t PageCount(int64_t tokens, int64_t page_size) {
  return (tokens + page_size - 1) / page_size;
}

// The max of `row` over each page; the partial last page counts with its real tokens.
[[nodiscard]] std::vector<float> PageMaxima(std::span<const float> row, int page_size);

}  // namespace entrokv

#endif  // ENTROKV_CORE_SCORING_PAGES_H_

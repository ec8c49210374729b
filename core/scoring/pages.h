// Token-to-page projection (docs/architecture.md §3.6): page b covers tokens [bB, min((b+1)B, T)).
#ifndef ENTROKV_CORE_SCORING_PAGES_H_
#define ENTROKV_CORE_SCORING_PAGES_H_

#include <cstdint>
#include <span>
#include <vector>

#include "core/util/page_count.h"  // PageCount, which the pool needs too

namespace entrokv {

// The max of `row` over each page; the partial last page counts with its real tokens.
[[nodiscard]] std::vector<float> PageMaxima(std::span<const float> row, int page_size);

}  // namespace entrokv

#endif  // ENTROKV_CORE_SCORING_PAGES_H_

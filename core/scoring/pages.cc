#include "core/scoring/pages.h"

#include <algorithm>

namespace entrokv {

std::vector<float> PageMaxima(std::span<const float> row, int page_size) {
  const auto tokens = static_cast<int64_t>(row.size());
  std::vector<float> maxima(static_cast<size_t>(PageCount(tokens, page_size)));
  for (size_t page = 0; page < maxima.size(); ++page) {
    const auto begin = row.begin() + static_cast<int64_t>(page) * page_size;
    const auto end = row.begin() + std::min<int64_t>((page + 1) * page_size, tokens);
    maxima[page] = *std::max_element(begin, end);
  }
  return maxima;
}

}  // namespace entrokv
